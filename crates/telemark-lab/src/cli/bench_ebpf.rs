//! `telemark bench-ebpf`: what the eBPF datapath (docs/ebpf.md) costs a host, measured the way
//! the cost paper asks (the measurement against the host's own forwarding, in one run):
//!
//! ```text
//!  tme-s: s0 ──veth── w0 [tme-w: Linux bridge br0] w1 ──veth── k0 :tme-k
//! ```
//!
//! - **Per-packet cost by the kernel's own statistics** (`run_time_ns` / `run_cnt`, enabled for
//!   the run): Telemark's programs next to the reference programs (`bpf/reference.bpf.c`: the
//!   same parser, key and map type, counting packets per flow and nothing else) attached alone
//!   at the same hooks, in interleaved rounds under the same load. Telemark's once with w0 a
//!   marker and w1 the domain's exit (the ingress program marks, the egress one unmarks), once
//!   with both plain counting points.
//! - **Throughput and CPU** of TCP bulk (iperf3, one flow) and 64-byte UDP frames (the lab's
//!   AF_PACKET sender, `--pps`; k0 counts them though they are not addressed to it) through the bridge
//!   with nothing attached, with Telemark's programs on both ports (marker and exit, the
//!   heaviest case), with a libpcap flow meter on both ports (softflowd `-i`, pmacctd `-i`), and
//!   through Telemark's AF_PACKET switch in place of the bridge (checksum, segmentation and
//!   receive offloads off on every veth, as an AF_PACKET switch needs, next to the bridge with
//!   the same offloads off). CPU is the whole machine's busy time (/proc/stat), so it
//!   includes the meters' processes and every softirq, divided by the packets k0 received
//!   (for TCP, by its bytes over 1,514: full-size frames). TCP runs with every veth's receive
//!   steered to the CPU iperf3's sender runs on, its receiver on another, so that no segment
//!   is reordered between two CPUs' backlogs (`Bed::steer`); the share of segments
//!   retransmitted is reported.
//!
//! Every mode runs `--rounds` times, interleaved; medians are reported, and a ratio of two
//! modes is the median of their ratios within each round.

use crate::traffic::{self, FlowSpec};
use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use telemark_agent::{Agent, FileConfig};
use telemark_datapath::ebpf::{self, Reference, RunCost, Target};

/// `telemark bench-ebpf` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Seconds of traffic per round, mode and load.
    #[arg(long, default_value_t = 4)]
    pub seconds: u64,
    /// Rounds (each mode and load once per round): with 3, the ratios moved by about ±0.05
    /// from run to run on a 2-core machine.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Offered load of the UDP test, 64-byte frames per second.
    #[arg(long, default_value_t = 1_000_000)]
    pub pps: u64,
    /// Only these modes (repeatable), in this order (the first is what "vs none" compares
    /// with): bridge, reference, ebpf, ebpf-count, softflowd, pmacctd, bridge-no-offload, switch.
    #[arg(long = "mode")]
    pub modes: Vec<String>,
}

const MODES: [(&str, &str); 8] = [
    ("bridge", "Linux bridge, nothing attached"),
    ("reference", "bridge + reference programs (count per flow only)"),
    ("ebpf", "bridge + Telemark eBPF: w0 marker, w1 exit"),
    ("ebpf-count", "bridge + Telemark eBPF: counting points only"),
    ("softflowd", "bridge + softflowd -i w0, -i w1"),
    ("pmacctd", "bridge + pmacctd -i w0, -i w1"),
    ("bridge-no-offload", "Linux bridge, offloads off (as the switch needs)"),
    ("switch", "Telemark AF_PACKET switch (loss measured), offloads off"),
];

const LOADS: [&str; 2] = ["tcp", "udp64"];

const NS: [&str; 3] = ["tme-s", "tme-w", "tme-k"];
const RECEIVER: &str = "10.77.0.2";
/// The bed's veths and their namespaces.
const VETHS: [(&str, &str); 4] =
    [("tme-s", "s0"), ("tme-w", "w0"), ("tme-w", "w1"), ("tme-k", "k0")];

fn sh(cmd: &str) -> Result<String> {
    crate::cli::opts::output(Command::new("sh").args(["-c", cmd]), &format!("`{cmd}`"))
}

/// The bed, with the two CPUs TCP's sender (and every packet, steered) and receiver run on.
struct Bed {
    sender_cpu: usize,
    receiver_cpu: usize,
}

impl Bed {
    fn up() -> Result<Bed> {
        Bed::down();
        let [sender_cpu, receiver_cpu] = two_cpus()?;
        let bed = Bed { sender_cpu, receiver_cpu };
        for n in NS {
            sh(&format!("ip netns add {n}"))?;
            sh(&format!("ip netns exec {n} sysctl -qw net.ipv6.conf.all.disable_ipv6=1"))?;
            sh(&format!("ip -n {n} link set lo up"))?;
        }
        sh("ip link add s0 netns tme-s type veth peer name w0 netns tme-w")?;
        sh("ip link add w1 netns tme-w type veth peer name k0 netns tme-k")?;
        sh("ip -n tme-s addr add 10.77.0.1/24 dev s0")?;
        sh(&format!("ip -n tme-k addr add {RECEIVER}/24 dev k0"))?;
        for (n, d) in VETHS {
            sh(&format!("ip -n {n} link set {d} up"))?;
        }
        Ok(bed)
    }
    /// For TCP (`on`), every packet of the bed processed on the sender's CPU (TCP's receiver
    /// runs on another): receive packet steering on every veth, as a NIC's receive-side
    /// scaling keeps a flow on one CPU. Without it a veth hands a packet to the backlog of
    /// whichever CPU sent it, and TCP, which sends from its sender's thread and from ACK
    /// processing on the receiver's CPU, has segments reordered and spuriously retransmitted
    /// through the bare bridge, at a rate a hook's timing moves more than its cost does.
    /// Steering by flow hash to any CPU would make a round's rate depend on the CPU the
    /// connection's hash picks. The UDP load, sent by one thread, is not reordered and runs
    /// unsteered: handing its frames to another CPU's backlog lengthens every program's run
    /// at w0 by the hand-off, not by what the program does (docs/ebpf.md, "Cost").
    fn steer(&self, on: bool) -> Result<()> {
        let mask = if on { cpu_mask(self.sender_cpu) } else { "0".into() };
        for (n, d) in VETHS {
            let file = format!("/sys/class/net/{d}/queues/rx-0/rps_cpus");
            if sh(&format!("ip netns exec {n} test -e {file}")).is_err() {
                if on {
                    bail!("{n}:{d} has no {file}: this kernel has no receive packet steering (CONFIG_RPS)");
                }
                continue;
            }
            sh(&format!("ip netns exec {n} sh -c 'echo {mask} > {file}'"))?;
        }
        Ok(())
    }
    fn down() {
        for n in NS {
            let _ = sh(&format!("ip netns del {n} 2>/dev/null"));
        }
    }
    /// br0 joining w0 and w1, made afresh (`on`) or removed.
    fn bridge(on: bool) -> Result<()> {
        let _ = sh("ip -n tme-w link del br0 2>/dev/null");
        if on {
            sh("ip -n tme-w link add br0 type bridge && ip -n tme-w link set br0 up")?;
            sh("ip -n tme-w link set w0 master br0 && ip -n tme-w link set w1 master br0")?;
        }
        Ok(())
    }
    /// Checksum, segmentation and receive offloads on every veth: on as a host has them, or
    /// off, as an AF_PACKET switch needs (MTU-sized frames with their checksums filled in).
    fn offloads(on: bool) -> Result<()> {
        let v = if on { "on" } else { "off" };
        for (n, d) in VETHS {
            sh(&format!("ip netns exec {n} ethtool -K {d} tx {v} gro {v} gso {v} tso {v}"))?;
        }
        Ok(())
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        Bed::down();
    }
}

/// The sender's TCP segments sent and retransmitted so far (/proc/net/snmp in tme-s).
fn tcp_segments() -> Result<(u64, u64)> {
    let snmp = sh("ip netns exec tme-s cat /proc/net/snmp")?;
    let mut rows = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (Some(names), Some(values)) = (rows.next(), rows.next()) else {
        bail!("no Tcp rows in tme-s's /proc/net/snmp");
    };
    let field = |name: &str| -> Result<u64> {
        let i = names.split_whitespace().position(|n| n == name);
        i.and_then(|i| values.split_whitespace().nth(i))
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {name} in tme-s's /proc/net/snmp"))
    };
    Ok((field("OutSegs")?, field("RetransSegs")?))
}

/// k0's received (packets, bytes), the kernel's count.
fn rx_k0() -> Result<(u64, u64)> {
    let read = |f: &str| -> Result<u64> {
        Ok(sh(&format!("ip netns exec tme-k cat /sys/class/net/k0/statistics/{f}"))?
            .trim()
            .parse()?)
    };
    Ok((read("rx_packets")?, read("rx_bytes")?))
}

/// (busy, total) jiffies of all CPUs from /proc/stat.
fn cpu_jiffies() -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("/proc/stat is empty")?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Ok((total - idle, total))
}

/// What watches the traffic in one mode, kept alive for the round.
enum Meter {
    None,
    Agent(Box<Agent>),
    Reference(Reference),
    Processes(Vec<Child>),
}

impl Meter {
    fn stop(self) {
        match self {
            Meter::None => {}
            Meter::Agent(a) => {
                a.stop();
            }
            Meter::Reference(r) => drop(r),
            Meter::Processes(ps) => {
                for mut p in ps {
                    // The whole group (spawn_in_w made the meter its leader).
                    if let Ok(pgid) = i32::try_from(p.id()) {
                        // SAFETY: kill(2) on a process group this bench created.
                        unsafe { libc::kill(-pgid, libc::SIGKILL) };
                    }
                    let _ = p.kill();
                    let _ = p.wait();
                }
            }
        }
    }
}

fn agent(text: &str) -> Result<Agent> {
    let mut cfg = FileConfig::parse(text)?.validate()?;
    cfg.quiet = true;
    Ok(Agent::start(cfg)?)
}

fn ebpf_agent(edge: bool) -> Result<Agent> {
    let (m, u) = if edge { ("mark = true\n", "unmark = true\n") } else { ("", "") };
    agent(&format!(
        "agent = \"bench\"\n[ebpf]\nperiod = \"100ms\"\n\
         [[port]]\ninterface = \"w0\"\nnetns = \"tme-w\"\n{m}\
         [[port]]\ninterface = \"w1\"\nnetns = \"tme-w\"\n{u}"
    ))
}

/// Starts a meter in namespace tme-w, in a process group of its own, so that stopping it
/// stops the processes it forks too (pmacctd's plugins outlive a killed core process).
fn spawn_in_w(args: &[&str]) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    Command::new("ip")
        .args(["netns", "exec", "tme-w"])
        .args(args)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", args[0]))
}

/// Starts mode `mode`'s meter.
fn start(mode: &str) -> Result<Meter> {
    let switch = mode == "switch";
    Bed::bridge(!switch)?;
    Bed::offloads(!matches!(mode, "switch" | "bridge-no-offload"))?;
    let meter = match mode {
        "bridge" | "bridge-no-offload" => Meter::None,
        "reference" => {
            let mut r = Reference::load(ebpf::Hook::for_this_kernel())?;
            for iface in ["w0", "w1"] {
                r.attach(&Target { netns: Some("tme-w".into()), iface: iface.into() })?;
            }
            Meter::Reference(r)
        }
        "ebpf" => Meter::Agent(Box::new(ebpf_agent(true)?)),
        "ebpf-count" => Meter::Agent(Box::new(ebpf_agent(false)?)),
        "softflowd" => {
            let mut ps = Vec::new();
            for d in ["w0", "w1"] {
                let ctl = format!("/tmp/tme-softflowd-{d}.ctl");
                let pid = format!("/tmp/tme-softflowd-{d}.pid");
                ps.push(spawn_in_w(&[
                    "softflowd",
                    "-d",
                    "-i",
                    d,
                    "-n",
                    "127.0.0.1:9",
                    "-v",
                    "10",
                    "-c",
                    &ctl,
                    "-p",
                    &pid,
                ])?);
            }
            Meter::Processes(ps)
        }
        "pmacctd" => {
            let mut ps = Vec::new();
            for d in ["w0", "w1"] {
                ps.push(spawn_in_w(&[
                    "pmacctd",
                    "-i",
                    d,
                    "-P",
                    "print",
                    "-r",
                    "3600",
                    "-c",
                    "src_host,dst_host,src_port,dst_port,proto",
                ])?);
            }
            Meter::Processes(ps)
        }
        "switch" => Meter::Agent(Box::new(agent(
            "agent = \"bench\"\nnetns = \"tme-w\"\nmeasure = true\n\
             [[pair]]\na = \"w0\"\nb = \"w1\"\nmark = \"a\"\n",
        )?)),
        other => bail!("unknown mode {other}"),
    };
    // Let meters open their sockets and attach before traffic starts.
    std::thread::sleep(Duration::from_millis(700));
    Ok(meter)
}

/// One round's figures.
#[derive(Clone, Copy, Default)]
struct Figures {
    gbps: f64,
    pps: f64,
    cpu_ns_per_pkt: f64,
    /// ns per run of the eBPF programs attached (Telemark's or the reference), at ingress and
    /// egress; NaN where none are.
    ns_in: f64,
    ns_out: f64,
    /// Of the sender's TCP segments, the share retransmitted (NaN for UDP).
    retrans: f64,
}

/// 64-byte UDP frames of one flow sent from s0 by the lab's packet sender (iperf3's UDP
/// sender cannot fill the path: one system call a packet).
fn udp64(a: &Args) -> Result<()> {
    let spec = FlowSpec::constant_udp(
        ("10.77.0.1".parse().context("addr")?, RECEIVER.parse().context("addr")?),
        ([2, 0, 0, 0, 77, 1], [2, 0, 0, 0, 77, 2]),
        22,
        a.pps,
    );
    let stop = AtomicBool::new(false);
    traffic::send(Some("tme-s"), "s0", &spec, Duration::from_secs(a.seconds), &stop)?;
    Ok(())
}

/// The first two CPUs this process may run on.
fn two_cpus() -> Result<[usize; 2]> {
    match crate::cli::opts::allowed_cpus()?[..] {
        [a, b, ..] => Ok([a, b]),
        _ => bail!("bench-ebpf needs two CPUs (TCP's sender and receiver on their own)"),
    }
}

/// The mask sysfs' `rps_cpus` takes for one CPU: hex words of 32 CPUs, highest first, joined
/// by commas (a single word of more than 32 bits is refused).
fn cpu_mask(cpu: usize) -> String {
    let mut words = vec![0u32; cpu / 32 + 1];
    words[cpu / 32] = 1 << (cpu % 32);
    words.iter().rev().map(|w| format!("{w:x}")).collect::<Vec<_>>().join(",")
}

fn iperf3(seconds: u64, bed: &Bed) -> Result<()> {
    let receiver_cpu = bed.receiver_cpu.to_string();
    let mut server = Command::new("ip")
        .args(["netns", "exec", "tme-k", "iperf3", "-s", "-1", "-A", &receiver_cpu])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -s (apt-get install iperf3)")?;
    std::thread::sleep(Duration::from_millis(300));
    let t = seconds.to_string();
    let sender_cpu = bed.sender_cpu.to_string();
    let args = ["netns", "exec", "tme-s", "iperf3", "-c", RECEIVER, "-t", &t, "-A", &sender_cpu];
    let out = Command::new("ip").args(args).output().context("running iperf3 -c")?;
    let _ = server.kill();
    let _ = server.wait();
    if !out.status.success() {
        bail!("iperf3 -c: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The mode's eBPF programs (ingress, egress), if it has any.
fn programs(mode: &str) -> Option<[&'static str; 2]> {
    match mode {
        "reference" => Some(ebpf::REFERENCE_PROGRAMS),
        "ebpf" | "ebpf-count" => Some([ebpf::INGRESS_PROGRAM, ebpf::EGRESS_PROGRAM]),
        _ => None,
    }
}

fn costs(mode: &str) -> Option<[RunCost; 2]> {
    programs(mode).map(|p| p.map(ebpf::loaded_cost))
}

fn round(mode: &str, load: &str, a: &Args, bed: &Bed) -> Result<Figures> {
    let tcp = load == "tcp";
    bed.steer(tcp)?;
    let meter = start(mode)?;
    let before = costs(mode);
    let (p0, b0) = rx_k0()?;
    let segs0 = if tcp { tcp_segments()? } else { (0, 0) };
    let (busy0, _) = cpu_jiffies()?;
    let t0 = std::time::Instant::now();
    let traffic = if tcp { iperf3(a.seconds, bed) } else { udp64(a) };
    let secs = t0.elapsed().as_secs_f64();
    let (busy1, _) = cpu_jiffies()?;
    let (p1, b1) = rx_k0()?;
    let segs1 = if tcp { tcp_segments()? } else { (0, 0) };
    let after = costs(mode);
    meter.stop();
    traffic?;
    // SAFETY: sysconf has no preconditions.
    let tick_ns = 1e9 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (packets, bytes) = ((p1 - p0) as f64, (b1 - b0) as f64);
    let wire = if tcp { bytes / 1514.0 } else { packets };
    let per_run = |i: usize| match (&before, &after) {
        (Some(b), Some(a)) => a[i].ns_per_run_since(&b[i]),
        _ => f64::NAN,
    };
    Ok(Figures {
        gbps: bytes * 8.0 / secs / 1e9,
        pps: wire / secs,
        cpu_ns_per_pkt: (busy1 - busy0) as f64 * tick_ns / wire.max(1.0),
        ns_in: per_run(0),
        ns_out: per_run(1),
        retrans: if tcp {
            (segs1.1 - segs0.1) as f64 / (segs1.0 - segs0.0).max(1) as f64
        } else {
            f64::NAN
        },
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs the benchmark.
pub fn run(a: Args) -> Result<()> {
    // SAFETY: plain syscall without arguments.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench-ebpf builds network namespaces and loads eBPF programs: run it as root");
    }
    for tool in ["iperf3", "ethtool", "softflowd", "pmacctd"] {
        if sh(&format!("command -v {tool}")).is_err() {
            bail!("bench-ebpf needs {tool} (apt-get install iperf3 ethtool softflowd pmacct)");
        }
    }
    // The modes asked for, in the order asked (the first is the "vs none" base), or all.
    let modes: Vec<(&str, &str)> = if a.modes.is_empty() {
        MODES.to_vec()
    } else {
        a.modes
            .iter()
            .map(|x| match MODES.iter().find(|(m, _)| m == x) {
                Some(m) => Ok(*m),
                None => bail!("--mode {x}: there is no such mode; one of {:?}", MODES.map(|m| m.0)),
            })
            .collect::<Result<_>>()?
    };
    let _stats = ebpf::enable_run_stats()?;
    let bed = Bed::up()?;
    let mut res: Vec<Vec<Vec<Figures>>> = vec![vec![Vec::new(); LOADS.len()]; modes.len()];
    for r in 0..a.rounds {
        for (li, load) in LOADS.iter().enumerate() {
            for (mi, (m, _)) in modes.iter().enumerate() {
                let f = round(m, load, &a, &bed).with_context(|| format!("mode {m}, {load}"))?;
                let retrans = if f.retrans.is_nan() {
                    String::new()
                } else {
                    format!(" | retransmitted {:.3} %", f.retrans * 100.0)
                };
                eprintln!(
                    "round {r}: {load:<5} {m:<15} {:>6.2} Gbit/s {:>9.0} pkt/s {:>7.0} cpu ns/pkt \
                     | ns/run in {:>5.0} out {:>5.0}{retrans}",
                    f.gbps, f.pps, f.cpu_ns_per_pkt, f.ns_in, f.ns_out
                );
                res[mi][li].push(f);
            }
        }
    }
    let med = |mi: usize, li: usize, f: fn(&Figures) -> f64| -> f64 {
        median(res[mi][li].iter().map(f).collect())
    };
    // A ratio of two modes: the median of their ratios round by round. A round runs every
    // mode back to back, so each ratio compares like with like on a machine whose speed
    // drifts over a run (a shared host's neighbours come and go).
    let ratio = |mi: usize, mj: usize, li: usize, f: fn(&Figures) -> f64| -> f64 {
        let pairs = res[mi][li].iter().zip(&res[mj][li]);
        median(pairs.map(|(x, y)| f(x) / f(y)).filter(|r| !r.is_nan()).collect())
    };
    println!(
        "tme-s ─ w0 [tme-w] w1 ─ tme-k; medians of {} rounds of {} s; CPU = whole machine \
         ({} cores) per packet received",
        a.rounds,
        a.seconds,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for (li, load) in LOADS.iter().enumerate() {
        let what = if *load == "tcp" {
            "TCP bulk (iperf3, one flow; packets = bytes / 1514)"
        } else {
            "64-byte UDP frames, one flow, offered at --pps"
        };
        println!("\n{what}");
        println!(
            "| {:<54} | {:>7} | {:>9} | {:>7} | {:>10} | {:>6} | {:>6} | {:>9} |",
            "path", "Gbit/s", "kpkt/s", "vs none", "CPU ns/pkt", "in ns", "out ns", "retrans %"
        );
        println!("|:---|{}|", ["---:"; 7].join("|"));
        // A figure to `d` decimals, or a dash where the mode has none (no programs).
        let shown =
            |v: f64, d: usize| if v.is_nan() { "–".to_string() } else { format!("{v:.d$}") };
        let ns = |v: f64| shown(v, 0);
        let two = |v: f64| shown(v, 2);
        for (mi, (_, label)) in modes.iter().enumerate() {
            let g = med(mi, li, |f| f.gbps);
            println!(
                "| {label:<54} | {g:>7.2} | {:>9.1} | {:>7.3} | {:>10.0} | {:>6} | {:>6} | {:>9} |",
                med(mi, li, |f| f.pps) / 1e3,
                ratio(mi, 0, li, |f| f.gbps),
                med(mi, li, |f| f.cpu_ns_per_pkt),
                ns(med(mi, li, |f| f.ns_in)),
                ns(med(mi, li, |f| f.ns_out)),
                shown(med(mi, li, |f| f.retrans * 100.0), 3),
            );
        }
        // Telemark's programs against the reference at the same hooks.
        let of = |m: &str| modes.iter().position(|(x, _)| *x == m);
        if let Some(r) = of("reference") {
            if let Some(c) = of("ebpf-count") {
                println!(
                    "counting points / reference: ingress {}, egress {}",
                    two(ratio(c, r, li, |f| f.ns_in)),
                    two(ratio(c, r, li, |f| f.ns_out))
                );
            }
            if let Some(e) = of("ebpf") {
                println!(
                    "marker (w0 ingress) / reference {}; exit (w1 egress, unmarking) / \
                     reference {}",
                    two(ratio(e, r, li, |f| f.ns_in)),
                    two(ratio(e, r, li, |f| f.ns_out))
                );
            }
        }
    }
    println!(
        "\n(\"vs none\" is throughput against the first mode, and the ratios to the reference \
         ns/run: medians of each round's ratio; ns/run from the kernel's run_time_ns / run_cnt \
         with statistics on, which add about 20 ns a run to every program)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::cpu_mask;

    /// The kernel's bitmap format (lib/bitmap-str.c: 32-bit hex words, comma-separated).
    #[test]
    fn a_cpu_mask_is_in_32_bit_words() {
        assert_eq!(cpu_mask(0), "1");
        assert_eq!(cpu_mask(5), "20");
        assert_eq!(cpu_mask(31), "80000000");
        assert_eq!(cpu_mask(32), "1,0");
        assert_eq!(cpu_mask(65), "2,0,0");
    }
}
