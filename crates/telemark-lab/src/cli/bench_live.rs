//! `telemark bench-live`: packets per second through one Telemark switch on AF_PACKET, with and
//! without measurement, and through a Linux bridge on the same veth pair, in one run (the cost
//! paper's discipline: measure what measuring costs, against the system's own forwarding).
//!
//! ```text
//!  tmb-s: s0 ──veth── w0 [tmb-w: Telemark switch | Linux bridge] w1 ──veth── k0 :tmb-k
//! ```
//! A sender blasts 64-byte UDP frames of one flow into s0 for `--seconds`; what arrives
//! is read from the kernel's counter of k0. Every mode runs `--rounds` times, interleaved, and
//! the medians are reported. With `--kafka BROKERS` a fourth mode runs the measuring switch with
//! its records published to Kafka (docs/kafka.md): the fast path's cost must not change.

use crate::traffic::{self, FlowSpec};
use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
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
    /// Also run the measuring switch exporting to these Kafka brokers.
    #[arg(long)]
    pub kafka: Option<String>,
}

fn sh(cmd: &str) -> Result<String> {
    crate::cli::opts::output(Command::new("sh").args(["-c", cmd]), &format!("`{cmd}`"))
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

/// CPU time the thread of this process named `name` has used (user and system, from
/// /proc/self/task/*/stat), in nanoseconds. Unlike busy time it leaves out the time the
/// thread waited for a core while others (a broker, the sender) ran.
fn thread_cpu_ns(name: &str) -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
        let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks = rest.get(11)?.parse::<f64>().ok()? + rest.get(12)?.parse::<f64>().ok()?;
        return Some(ticks / tick * 1e9);
    }
    None
}

/// One round of one mode: (sent, received) packets per second, the switch's busy
/// nanoseconds per packet and its fast-path thread's CPU nanoseconds per packet (NaN for the
/// bridge).
fn round(mode: &str, a: &Args) -> Result<(f64, f64, f64, f64)> {
    let agent = match mode {
        "bridge" => {
            sh("ip -n tmb-w link add br0 type bridge && ip -n tmb-w link set br0 up")?;
            sh("ip -n tmb-w link set w0 master br0 && ip -n tmb-w link set w1 master br0")?;
            None
        }
        _ => {
            let measure = mode != "telemark";
            // Every batch reported (not only lossy ones): the export side's heaviest case.
            let mut text = format!(
                "agent = \"bench\"\nnetns = \"tmb-w\"\nmeasure = {measure}\n\
                 [[pair]]\na = \"w0\"\nb = \"w1\"\nmark = \"a\"\n\
                 [export]\nsummary_interval = \"1s\"\nreport_all = true\n"
            );
            if mode == "telemark+loss+kafka" {
                let brokers = a.kafka.as_deref().context("--kafka")?;
                text.push_str(&format!(
                    "[kafka]\nbrokers = \"{brokers}\"\ntopic_prefix = \"bench-live.\"\n"
                ));
            }
            let mut cfg = FileConfig::parse(&text)?.validate()?;
            cfg.quiet = true;
            Some(Agent::start(cfg)?)
        }
    };
    let before = rx_k0()?;
    let stop = AtomicBool::new(false);
    let spec = FlowSpec::constant_udp(
        ("10.9.0.1".parse().context("addr")?, "10.9.0.2".parse().context("addr")?),
        ([2, 0, 0, 0, 9, 1], [2, 0, 0, 0, 9, 2]),
        18,
        a.pps,
    );
    let sent =
        traffic::send(Some("tmb-s"), "s0", &spec, Duration::from_secs(a.seconds), &stop)?.sent;
    std::thread::sleep(Duration::from_millis(100));
    let got = rx_k0()? - before;
    let (ns, cpu) = match agent {
        Some(ag) => {
            let cpu = thread_cpu_ns("tm-fastpath").unwrap_or(f64::NAN);
            let st = ag.stop();
            if mode == "telemark+loss+kafka" {
                println!(
                    "{mode}: {} records published to Kafka and acknowledged in {} s, {} \
                     dropped, {} failed",
                    st.export.exported,
                    a.seconds,
                    st.export.export_drops,
                    st.export.export_failures
                );
            }
            let rx = st.path.rx.max(1) as f64;
            (st.path.busy_ns as f64 / rx, cpu / rx)
        }
        None => {
            sh("ip -n tmb-w link del br0")?;
            (f64::NAN, f64::NAN)
        }
    };
    let d = a.seconds as f64;
    Ok((sent as f64 / d, got as f64 / d, ns, cpu))
}

/// Runs the benchmark.
pub fn run(a: Args) -> Result<()> {
    // SAFETY: plain syscall without arguments.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench-live builds network namespaces: run it as root");
    }
    let _bed = Bed::up()?;
    let mut modes = vec!["bridge", "telemark", "telemark+loss"];
    if a.kafka.is_some() {
        modes.push("telemark+loss+kafka");
    }
    let mut res: Vec<Vec<[f64; 4]>> = vec![Vec::new(); modes.len()];
    for r in 0..a.rounds {
        for (i, m) in modes.iter().enumerate() {
            let (off, fwd, busy, cpu) = round(m, &a)?;
            eprintln!(
                "round {r}: {m:<20} offered {off:>9.0} pps, forwarded {fwd:>9.0} pps, \
                 {busy:>6.1} ns/pkt busy, {cpu:>6.1} ns/pkt cpu"
            );
            res[i].push([off, fwd, busy, cpu]);
        }
    }
    // Each column's median per mode.
    let col = |c: usize| -> Vec<f64> {
        res.iter()
            .map(|rounds| {
                let mut v: Vec<f64> = rounds.iter().map(|x| x[c]).collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            })
            .collect()
    };
    let (off, fwd, ns, cpu) = (col(0), col(1), col(2), col(3));
    println!("64-byte frames, one veth pair, medians of {} rounds of {} s", a.rounds, a.seconds);
    println!(
        "{:<20} {:>12} {:>12} {:>10} {:>12} {:>12}",
        "path", "offered pps", "fwd pps", "vs bridge", "busy ns/pkt", "cpu ns/pkt"
    );
    for (i, m) in modes.iter().enumerate() {
        println!(
            "{m:<20} {:>12.0} {:>12.0} {:>10.2} {:>12.1} {:>12.1}",
            off[i],
            fwd[i],
            fwd[i] / fwd[0].max(1.0),
            ns[i],
            cpu[i]
        );
    }
    println!(
        "with / without measurement: forwarded {:.3}, busy time per packet {:.3}, cpu time per \
         packet {:.3}",
        fwd[2] / fwd[1].max(1.0),
        ns[2] / ns[1],
        cpu[2] / cpu[1]
    );
    if a.kafka.is_some() {
        println!(
            "with / without Kafka export: forwarded {:.3}, busy time per packet {:.3}, cpu time \
             per packet {:.3}",
            fwd[3] / fwd[2].max(1.0),
            ns[3] / ns[2],
            cpu[3] / cpu[2]
        );
        println!(
            "(busy time counts time the fast path waited for a core the broker, on this host, \
             held; cpu time does not)"
        );
    }
    println!("(offered = forwarded means the sender, sharing the 2 cores, was the limit)");
    Ok(())
}
