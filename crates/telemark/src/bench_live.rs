//! `telemark bench-live`: packets per second through one Telemark switch on AF_PACKET, with and
//! without measurement, and through a Linux bridge on the same veth pair, in one run (the cost
//! paper's discipline: measure what measuring costs, against the system's own forwarding).
//!
//! ```text
//!  tmb-s: s0 ──veth── w0 [tmb-w: Telemark switch | Linux bridge] w1 ──veth── k0 :tmb-k
//! ```
//! A sender blasts 64-byte UDP frames of one flow into s0 for `--seconds`; what arrives
//! is read from the kernel's counter of k0. Every mode runs `--rounds` times, interleaved, and
//! the medians are reported.

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use telemark_agent::traffic::{self, FlowSpec};
use telemark_agent::{Agent, FileConfig};

/// `telemark bench-live` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Seconds of traffic per round and mode.
    #[arg(long, default_value_t = 3)]
    pub seconds: u64,
    /// Rounds (each mode once per round).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Offered load, packets per second.
    #[arg(long, default_value_t = 3_000_000)]
    pub pps: u64,
}

fn sh(cmd: &str) -> Result<String> {
    crate::opts::output(Command::new("sh").args(["-c", cmd]), &format!("`{cmd}`"))
}

struct Bed;

impl Bed {
    fn up() -> Result<Bed> {
        Bed::down();
        let bed = Bed;
        for n in ["tmb-s", "tmb-w", "tmb-k"] {
            sh(&format!("ip netns add {n}"))?;
            sh(&format!("ip netns exec {n} sysctl -qw net.ipv6.conf.all.disable_ipv6=1"))?;
        }
        sh("ip link add s0 netns tmb-s type veth peer name w0 netns tmb-w")?;
        sh("ip link add w1 netns tmb-w type veth peer name k0 netns tmb-k")?;
        for (n, d) in [("tmb-s", "s0"), ("tmb-w", "w0"), ("tmb-w", "w1"), ("tmb-k", "k0")] {
            sh(&format!("ip -n {n} link set {d} up"))?;
        }
        Ok(bed)
    }
    fn down() {
        for n in ["tmb-s", "tmb-w", "tmb-k"] {
            let _ = sh(&format!("ip netns del {n} 2>/dev/null"));
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        Bed::down();
    }
}

fn rx_k0() -> Result<u64> {
    Ok(sh("ip netns exec tmb-k cat /sys/class/net/k0/statistics/rx_packets")?.trim().parse()?)
}

/// One round of one mode: (sent, received) packets per second, and the switch's busy
/// nanoseconds per packet (NaN for the bridge).
fn round(mode: &str, a: &Args) -> Result<(f64, f64, f64)> {
    let agent = match mode {
        "bridge" => {
            sh("ip -n tmb-w link add br0 type bridge && ip -n tmb-w link set br0 up")?;
            sh("ip -n tmb-w link set w0 master br0 && ip -n tmb-w link set w1 master br0")?;
            None
        }
        _ => {
            let measure = mode == "telemark+loss";
            let text = format!(
                "agent = \"bench\"\nnetns = \"tmb-w\"\nmeasure = {measure}\n\
                 [[pair]]\na = \"w0\"\nb = \"w1\"\nmark = \"a\"\n\
                 [export]\nsummary_interval = \"1h\"\n"
            );
            let mut cfg = FileConfig::parse(&text)?.validate()?;
            cfg.quiet = true;
            Some(Agent::start(cfg)?)
        }
    };
    let before = rx_k0()?;
    let stop = AtomicBool::new(false);
    let spec = FlowSpec {
        key: telemark_wire::FlowKey {
            src: "10.9.0.1".parse().context("addr")?,
            dst: "10.9.0.2".parse().context("addr")?,
            sport: 1000,
            dport: 2000,
            proto: 17,
            spi: None,
            si: None,
        },
        src_mac: [2, 0, 0, 0, 9, 1],
        dst_mac: [2, 0, 0, 0, 9, 2],
        payload: 18,
        pps: a.pps,
        catch_up: traffic::catch_up(a.pps),
        churn: false,
    };
    let sent =
        traffic::send(Some("tmb-s"), "s0", &spec, Duration::from_secs(a.seconds), &stop)?.sent;
    std::thread::sleep(Duration::from_millis(100));
    let got = rx_k0()? - before;
    let ns = match agent {
        Some(ag) => {
            let st = ag.stop();
            st.path.busy_ns as f64 / st.path.rx.max(1) as f64
        }
        None => {
            sh("ip -n tmb-w link del br0")?;
            f64::NAN
        }
    };
    let d = a.seconds as f64;
    Ok((sent as f64 / d, got as f64 / d, ns))
}

/// Runs the benchmark.
pub fn run(a: Args) -> Result<()> {
    // SAFETY: plain syscall without arguments.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench-live builds network namespaces: run it as root");
    }
    let _bed = Bed::up()?;
    let modes = ["bridge", "telemark", "telemark+loss"];
    let mut res: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); modes.len()];
    for r in 0..a.rounds {
        for (i, m) in modes.iter().enumerate() {
            let x = round(m, &a)?;
            eprintln!(
                "round {r}: {m:<14} offered {:>9.0} pps, forwarded {:>9.0} pps, {:>6.1} ns/pkt busy",
                x.0, x.1, x.2
            );
            res[i].push(x);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let col = |i: usize| -> Vec<f64> {
        res.iter()
            .map(|r| {
                let mut v: Vec<f64> = r
                    .iter()
                    .map(|x| match i {
                        0 => x.0,
                        1 => x.1,
                        _ => x.2,
                    })
                    .collect();
                median(&mut v)
            })
            .collect()
    };
    let (off, fwd, ns) = (col(0), col(1), col(2));
    println!("64-byte frames, one veth pair, medians of {} rounds of {} s", a.rounds, a.seconds);
    println!(
        "{:<16} {:>12} {:>12} {:>10} {:>14}",
        "path", "offered pps", "fwd pps", "vs bridge", "busy ns/pkt"
    );
    for (i, m) in modes.iter().enumerate() {
        println!(
            "{m:<16} {:>12.0} {:>12.0} {:>10.2} {:>14.1}",
            off[i],
            fwd[i],
            fwd[i] / fwd[0].max(1.0),
            ns[i]
        );
    }
    println!(
        "with / without measurement: forwarded {:.3}, busy time per packet {:.3}",
        fwd[2] / fwd[1].max(1.0),
        ns[2] / ns[1]
    );
    println!("(offered = forwarded means the sender, sharing the 2 cores, was the limit)");
    Ok(())
}
