//! `telemark bench-int`: the INT report collector's capacity on one core (the INT paper's
//! Fig. 3): Telemetry Reports per second against hops × metadata items per hop, in memory
//! (parse + find the flow + per-hop detection + the fixed-size event the export ring
//! carries) and, as root, end to end over a veth pair through a UDP socket and through
//! AF_XDP; and the cost
//! of complex (CNF) detection against the fast detectors per report.

use crate::bench::median;
use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use std::hint::black_box;
use std::io::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use telemark_core::int::collect::Collector;
use telemark_core::int::{DetectRule, Detectors};
use telemark_datapath::afpacket::in_netns;
use telemark_datapath::xdp::{udp_payload, XdpMode, XdpProgram};
use telemark_socket::udp::{RxOptions, UdpRx};
use telemark_wire::dialect::Mode;
use telemark_wire::int::{
    Field, HeaderType, Hop, Instructions, Layout, MdHeader, NextProtocol, ShimRepr, Version,
};
use telemark_wire::report::{Flags, InType, Writer};

/// `telemark bench-int` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Hop counts.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 3, 4, 6])]
    pub hops: Vec<usize>,
    /// Metadata items per hop (instruction bits set).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 6, 8])]
    pub items: Vec<usize>,
    /// Reports per timed pass (in memory).
    #[arg(long, default_value_t = 2_000_000)]
    pub reports: usize,
    /// Passes per cell; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Also measure end to end over a veth pair (root): seconds per cell.
    #[arg(long)]
    pub udp_seconds: Option<u64>,
    /// Write the table as CSV here too.
    #[arg(long)]
    pub csv: Option<std::path::PathBuf>,
    /// The paper's Figs. 4/5 instead: traces of `telemark gen --bursts MODEL` (repeat the flag
    /// for each); reports the sink sends and the collector's capacity per threshold.
    #[arg(long, value_name = "TRACE")]
    pub prefilter: Vec<std::path::PathBuf>,
    /// With --prefilter: a DSCP that marks INT in the traces (repeatable, decimal or 0x..;
    /// default 0x17, the spec's example value).
    #[arg(long = "int-dscp", value_name = "DSCP", value_parser = parse_dscp)]
    pub int_dscp: Vec<u8>,
    /// With --prefilter: a UDP destination port that marks INT (INT v2.1 §5.7.2, NPT 1;
    /// repeatable). Given alone, no DSCP is tried.
    #[arg(long = "int-port", value_name = "PORT")]
    pub int_port: Vec<u16>,
    /// With --prefilter: the EWMA detector's alpha (0 < alpha <= 1).
    #[arg(long, default_value_t = 0.25)]
    pub alpha: f64,
}

/// A DSCP, decimal or hexadecimal (`0x17`), 0 to 63.
fn parse_dscp(s: &str) -> Result<u8, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u8::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.ok().filter(|d| *d <= 0x3f).ok_or(format!("{s:?}: a DSCP is 0 to 63 (or 0x00 to 0x3f)"))
}

/// Instruction bits in the order items are added: hop latency first (what the detectors
/// watch), node ID second, then the rest.
const ITEM_ORDER: [Field; 8] = [
    Field::HopLatency,
    Field::NodeId,
    Field::QueueOccupancy,
    Field::L1IngressIf,
    Field::TxUtilization,
    Field::IngressTs,
    Field::EgressTs,
    Field::L2IngressIf,
];

/// `n` different report datagrams: a sink's v2.0 report carrying an Ethernet/IPv4/UDP packet
/// with an INT-MD stack of `hops` hops of `items` items, over 1,000 flows.
pub fn reports(hops: usize, items: usize, n: usize) -> Vec<Vec<u8>> {
    let ins = Instructions::of(&ITEM_ORDER[..items.clamp(1, 8)]);
    let layout = Layout::new(ins, Version::V2_1);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    (0..n)
        .map(|i| {
            let int_len = 4 + 12 + hops * layout.hop_len();
            let mut pkt = vec![0u8; 14 + 20 + 8 + int_len + 16];
            pkt[12..14].copy_from_slice(&[0x08, 0x00]);
            let ip_len = (pkt.len() - 14) as u16;
            pkt[14..34].copy_from_slice(&[
                0x45,
                0x17 << 2,
                0,
                0,
                0,
                0,
                0,
                0,
                64,
                17,
                0,
                0,
                10,
                1,
                0,
                1,
                10,
                2,
                0,
                1,
            ]);
            pkt[16..18].copy_from_slice(&ip_len.to_be_bytes());
            pkt[34..36].copy_from_slice(&40000u16.to_be_bytes());
            pkt[36..38].copy_from_slice(&(5000 + (i % 1000) as u16).to_be_bytes());
            pkt[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
            let shim = ShimRepr {
                version: Version::V2_1,
                header_type: HeaderType::Md,
                next_protocol: NextProtocol::Dscp(0),
                length_words: ((int_len - 4) / 4) as u8,
            };
            let _ = shim.emit(&mut pkt[42..]);
            let h = MdHeader {
                version: 2,
                discard: false,
                hop_count_exceeded: false,
                mtu_exceeded: false,
                hop_ml: (layout.hop_len() / 4) as u8,
                remaining_hop_cnt: 8,
                instructions: ins,
                domain_id: 0,
                ds_instructions: 0,
                ds_flags: 0,
            };
            let _ = h.emit(Version::V2_1, HeaderType::Md, &mut pkt[46..]);
            for k in 0..hops {
                let mut hop = Hop::default();
                for f in Field::ALL {
                    hop.set(f, next() % 1000);
                }
                hop.set(Field::NodeId, k as u64 + 1);
                hop.set(Field::HopLatency, 1_000 + next() % 50_000);
                let _ = layout.write(&hop, &mut pkt[58 + k * layout.hop_len()..]);
            }
            let mut buf = vec![0u8; pkt.len() + 64];
            let Ok(mut w) = Writer::new(&mut buf, 0, i as u32, 99) else { return Vec::new() };
            let own = Hop::default();
            let flags = Flags { tracked_flow: true, ..Flags::default() };
            let _ = w.push(InType::Ethernet, flags, Instructions(0), &own, &pkt);
            let len = w.len();
            buf.truncate(len);
            buf
        })
        .collect()
}

fn collector(rules: Vec<DetectRule>) -> Collector {
    Collector::new(Detectors::new(rules, 65_536), Mode::Tolerant)
}

fn per_hop() -> DetectRule {
    DetectRule::from_config("*", "per_hop", Some("hop_latency"), Some("20us"), None, None)
        .expect("rule")
}

/// Reports per second through `c` over `pool`, median of `rounds` passes of `n` reports. Each
/// datagram gets the next sequence number (22 bits) as it goes, as a sender would number it.
fn in_memory(c: &mut Collector, pool: &[Vec<u8>], n: usize, rounds: usize) -> (f64, f64) {
    let mut pool = pool.to_vec();
    let len = pool.len();
    let mut rates = Vec::new();
    let mut events = 0u64;
    let mut seq = 0u32;
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        for i in 0..n {
            let d = &mut pool[i % len];
            let w0 = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) & !0x3f_ffff;
            d[..4].copy_from_slice(&(w0 | (seq & 0x3f_ffff)).to_be_bytes());
            seq = seq.wrapping_add(1);
            c.datagram(d, i as u64, |e| {
                events += 1;
                black_box(e);
            });
        }
        rates.push(n as f64 / t.elapsed().as_secs_f64());
    }
    let fired = events as f64 / (n * rounds.max(1)) as f64;
    (median(&mut rates), fired)
}

/// Pre-filtering thresholds of the paper's Figs. 4/5, µs (0: no filtering).
const THRESHOLDS_US: [u64; 9] = [0, 25, 50, 75, 100, 125, 150, 175, 200];

/// What a sink sends when it pre-filters a trace with `rule` (the same detector table the
/// agent's sink runs): reports per packet.
fn sink_reports(paths: &[(telemark_wire::FlowKey, Hop)], rule: DetectRule) -> f64 {
    let mut d = Detectors::new(vec![rule], 64);
    let fired = paths
        .iter()
        .enumerate()
        .filter(|(i, (flow, hop))| {
            let out = d.detect(flow, std::slice::from_ref(hop), *i as u64, |_, _| {});
            matches!(out, telemark_core::int::Outcome::Fired(_))
        })
        .count();
    fired as f64 / paths.len().max(1) as f64
}

/// The paper's Figs. 4 and 5 (§IV): the INT sink pre-filters each trace with the per-hop
/// (= per-flow: one hop, one flow) and EWMA detectors on its hop latency (the queueing delay)
/// at each threshold. The collector's capacity is its measured rate on every report (threshold
/// 0, no filtering) over the share of packets the sink still reports, as the paper computes it.
fn prefilter(a: &Args) -> Result<()> {
    use telemark_datapath::capture::CaptureReader;
    use telemark_wire::int_frame::{find, Signal};
    // The collector's rate on the reports such a sink sends: 1 hop, 3 items.
    let mut m = Collector::new(Detectors::new(Vec::new(), 65_536), Mode::Tolerant);
    let (monitor, _) = in_memory(&mut m, &reports(1, 3, 4096), a.reports, a.rounds);
    println!(
        "INT pre-filtering at the sink (paper Figs. 4/5): collector capacity per core, M reports/s \
         (unfiltered: {:.2} M/s measured here, 3.43 in the paper)",
        monitor / 1e6
    );
    if !(a.alpha > 0.0 && a.alpha <= 1.0) {
        bail!("--alpha {}: more than 0, at most 1", a.alpha);
    }
    // Every configured way INT may be signalled: each DSCP, each UDP port.
    let mut signals: Vec<Signal> =
        a.int_dscp.iter().map(|d| Signal { dscp: Some(*d), ..Signal::default() }).collect();
    signals.extend(a.int_port.iter().map(|p| Signal {
        dscp: None,
        udp_port: Some(*p),
        ..Signal::default()
    }));
    if signals.is_empty() {
        signals.push(Signal::default());
    }
    let mut csv = String::from("trace,detector,threshold_us,reports_per_packet,capacity_mpps\n");
    for path in &a.prefilter {
        let mut r = CaptureReader::open(path)?;
        let mut paths = Vec::new();
        let mut hops = [Hop::default(); 1];
        while let Some(p) = r.next_packet() {
            let Some(f) =
                signals.iter().find_map(|s| find(&p.data, s, Mode::Tolerant).ok().flatten())
            else {
                continue;
            };
            if f.int.read_hops(&mut hops) == 1 {
                paths.push((f.flow, hops[0]));
            }
        }
        if paths.is_empty() {
            bail!("{}: no INT packets (make one with telemark gen --bursts MODEL)", path.display());
        }
        let name = path.file_stem().map_or("?".into(), |s| s.to_string_lossy().into_owned());
        println!("\n{name} ({} packets)", paths.len());
        let ewma = format!("EWMA (alpha {})", a.alpha);
        println!("{:>14} {:>22} {:>22}", "threshold", "per-hop / per-flow", ewma);
        for t in THRESHOLDS_US {
            let mut cells = Vec::new();
            for detector in ["per_hop", "ewma"] {
                let share = if t == 0 {
                    1.0
                } else {
                    let rule = DetectRule::from_config(
                        "*",
                        detector,
                        Some("hop_latency"),
                        Some(&format!("{t}us")),
                        Some(a.alpha),
                        None,
                    )
                    .map_err(anyhow::Error::msg)?;
                    sink_reports(&paths, rule)
                };
                let capacity = if share > 0.0 { monitor / share / 1e6 } else { f64::INFINITY };
                csv.push_str(&format!("{name},{detector},{t},{share:.6},{capacity:.2}\n"));
                cells.push(if share > 0.0 {
                    format!("{:>7.3}% {:>9.2} M", share * 100.0, capacity)
                } else {
                    format!("{:>22}", "no events")
                });
            }
            let label = if t == 0 { "0 (none)".to_string() } else { format!("{t} us") };
            println!("{label:>14} {:>22} {:>22}", cells[0], cells[1]);
        }
    }
    if let Some(p) = &a.csv {
        std::fs::File::create(p)?.write_all(csv.as_bytes())?;
    }
    Ok(())
}

/// Runs `telemark bench-int`.
pub fn run(a: Args) -> Result<()> {
    if !a.prefilter.is_empty() {
        return prefilter(&a);
    }
    let mut csv = String::from("path,hops,items,report_bytes,reports_per_s,events_per_report\n");
    println!("INT report collector, one core: reports/s (paper, Fig. 3: 3,593 k at 1 hop x 1 item, 1,204 k at 4 hops x 8 items)");
    println!(
        "monitor: every report an event (its switch filtered); per-hop: the collector detects"
    );
    println!(
        "{:>6} {:>6} {:>8} {:>12} {:>12} {:>8}",
        "hops", "items", "bytes", "monitor", "per-hop", "events"
    );
    for &hops in &a.hops {
        for &items in &a.items {
            let pool = reports(hops, items, 4096);
            let mut m = Collector::new(Detectors::new(Vec::new(), 65_536), Mode::Tolerant);
            let (monitor, _) = in_memory(&mut m, &pool, a.reports, a.rounds);
            let mut c = collector(vec![per_hop()]);
            let (rate, fired) = in_memory(&mut c, &pool, a.reports, a.rounds);
            let bytes = pool[0].len();
            println!(
                "{hops:>6} {items:>6} {bytes:>8} {:>10.0} k {:>10.0} k {:>7.1}%",
                monitor / 1e3,
                rate / 1e3,
                fired * 100.0
            );
            csv.push_str(&format!("memory_monitor,{hops},{items},{bytes},{monitor:.0},1\n"));
            csv.push_str(&format!("memory_per_hop,{hops},{items},{bytes},{rate:.0},{fired:.4}\n"));
        }
    }
    // Complex detection against the fast detectors, per report (4 hops x 8 items).
    println!("\ndetector cost, 4 hops x 8 items, in memory:");
    let pool = reports(4, 8, 4096);
    let rules = [
        ("noop", DetectRule::from_config("*", "noop", None, None, None, None)),
        ("per_hop", Ok(per_hop())),
        ("per_flow", DetectRule::from_config("*", "per_flow", Some("hop_latency"), Some("50us"), None, None)),
        ("ewma", DetectRule::from_config("*", "ewma", Some("hop_latency"), Some("20us"), Some(0.25), None)),
        (
            "complex",
            DetectRule::from_config(
                "*",
                "complex",
                None,
                None,
                None,
                Some("(hop_latency > 40us or delta(queue_occupancy) > 500) and sum(hop_latency) > 100us"),
            ),
        ),
    ];
    let mut base = 0.0;
    // Two rules on every flow, run one after the other: what a second matching rule costs.
    let both =
        DetectRule::from_config("*", "ewma", Some("hop_latency"), Some("20us"), Some(0.25), None)
            .map(|ewma| vec![per_hop(), ewma]);
    let rules = rules.into_iter().map(|(name, r)| (name, r.map(|r| vec![r])));
    for (name, rules) in rules.chain([("per_hop+ewma", both)]) {
        let mut c = collector(rules.map_err(anyhow::Error::msg)?);
        let (rate, fired) = in_memory(&mut c, &pool, a.reports, a.rounds);
        let ns = 1e9 / rate;
        if name == "noop" {
            base = ns;
        }
        println!(
            "{name:>12} {:>10.0} k/s {ns:>7.1} ns/report ({:+.1} ns vs noop) {:>6.1}% events",
            rate / 1e3,
            ns - base,
            fired * 100.0
        );
        csv.push_str(&format!("detector_{name},4,8,{},{rate:.0},{fired:.4}\n", pool[0].len()));
    }
    if let Some(secs) = a.udp_seconds {
        println!("\nend to end over veth, one receiving core, monitor (sender: sendmmsg in a namespace):");
        println!(
            "{:>6} {:>6} {:>8} {:>12} {:>12} {:>14}",
            "hops", "items", "bytes", "UDP socket", "AF_XDP", "sent (k/s)"
        );
        let ns = Veth::up()?;
        for &hops in &a.hops {
            for &items in &a.items {
                let pool = reports(hops, items, 4096);
                let d = Duration::from_secs(secs);
                let (udp_rate, sent_udp) = udp(&ns.0, &pool, d, false)?;
                let (xdp_rate, sent_xdp) = udp(&ns.0, &pool, d, true)?;
                let bytes = pool[0].len();
                println!(
                    "{hops:>6} {items:>6} {bytes:>8} {:>10.0} k {:>10.0} k {:>7.0} / {:.0}",
                    udp_rate / 1e3,
                    xdp_rate / 1e3,
                    sent_udp / 1e3,
                    sent_xdp / 1e3
                );
                csv.push_str(&format!("veth_udp,{hops},{items},{bytes},{udp_rate:.0},\n"));
                csv.push_str(&format!("veth_af_xdp,{hops},{items},{bytes},{xdp_rate:.0},\n"));
            }
        }
    }
    if let Some(p) = &a.csv {
        std::fs::File::create(p)?.write_all(csv.as_bytes())?;
    }
    Ok(())
}

fn sh(args: &[&str]) -> Result<()> {
    let s = Command::new(args[0]).args(&args[1..]).status().with_context(|| args[0].to_string())?;
    if !s.success() {
        bail!("{} failed", args.join(" "));
    }
    Ok(())
}

/// A namespace joined to this one by a veth pair (10.233.0.1 here, .2 there), removed when
/// dropped.
struct Veth(String);

impl Veth {
    fn up() -> Result<Veth> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("--udp-seconds needs root (a network namespace and a veth pair)");
        }
        let ns = format!("tmbint{}", std::process::id() % 100_000);
        let (host, peer) = (format!("{ns}h"), format!("{ns}p"));
        let v = Veth(ns.clone());
        sh(&["ip", "netns", "add", &ns])?;
        sh(&["ip", "link", "add", &host, "type", "veth", "peer", "name", &peer, "netns", &ns])?;
        sh(&["ip", "addr", "add", "10.233.0.1/30", "dev", &host])?;
        sh(&["ip", "link", "set", &host, "up"])?;
        sh(&["ip", "-n", &ns, "addr", "add", "10.233.0.2/30", "dev", &peer])?;
        sh(&["ip", "-n", &ns, "link", "set", &peer, "up"])?;
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        Ok(v)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Reports per second one receiving worker processed (through a UDP socket, or AF_XDP when
/// `xdp`), with a sender in namespace `ns` blasting `pool` over the veth pair for `d`; and
/// what the sender sent per second.
fn udp(ns: &str, pool: &[Vec<u8>], d: Duration, xdp: bool) -> Result<(f64, f64)> {
    let mut rx = UdpRx::bind("10.233.0.1:32766".parse()?, RxOptions::default())?;
    let program = match xdp {
        true => Some(XdpProgram::attach(&format!("{ns}h"), 32766, XdpMode::Generic)?),
        false => None,
    };
    let mut xsk = match &program {
        Some(p) => Some(p.socket(0)?),
        None => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let pool2: Vec<Vec<u8>> = pool.to_vec();
    let (stop2, sent2, ns2) = (stop.clone(), sent.clone(), ns.to_string());
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let s = in_netns(Some(&ns2), || std::net::UdpSocket::bind("10.233.0.2:0"))?;
        s.connect("10.233.0.1:32766")?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
        const BATCH: usize = 64;
        let mut i = 0usize;
        while !stop2.load(Ordering::Relaxed) {
            let mut iov: Vec<libc::iovec> = (0..BATCH)
                .map(|k| {
                    let d = &pool2[(i + k) % pool2.len()];
                    libc::iovec { iov_base: d.as_ptr() as *mut libc::c_void, iov_len: d.len() }
                })
                .collect();
            let mut msgs: Vec<libc::mmsghdr> = iov
                .iter_mut()
                .map(|v| {
                    // SAFETY: an all-zero msghdr is valid; the iovec is set below.
                    let mut h: libc::msghdr = unsafe { core::mem::zeroed() };
                    h.msg_iov = v;
                    h.msg_iovlen = 1;
                    libc::mmsghdr { msg_hdr: h, msg_len: 0 }
                })
                .collect();
            // SAFETY: `msgs` and the buffers they point to live across the call.
            let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), BATCH as libc::c_uint, 0) };
            if n > 0 {
                sent2.fetch_add(n as u64, Ordering::Relaxed);
                i += n as usize;
            }
        }
        Ok(())
    });
    let mut c = Collector::new(Detectors::new(Vec::new(), 65_536), Mode::Tolerant);
    let mut got = 0u64;
    let warm = Instant::now() + Duration::from_millis(300);
    let mut t0 = None;
    let mut sent0 = 0;
    loop {
        let now = Instant::now();
        if t0.is_none() && now >= warm {
            t0 = Some(now);
            got = 0;
            sent0 = sent.load(Ordering::Relaxed);
        }
        if t0.is_some_and(|t| now.duration_since(t) >= d) {
            break;
        }
        let n = match xsk.as_mut() {
            Some(x) => {
                let n = x.recv(100)?;
                for k in 0..n {
                    if let Some(d) = udp_payload(x.frame(k)) {
                        c.datagram(d, 0, |e| {
                            black_box(e);
                        });
                    }
                }
                x.release();
                n
            }
            None => {
                let n = rx.recv()?;
                for k in 0..n {
                    c.datagram(rx.datagram(k).0, 0, |e| {
                        black_box(e);
                    });
                }
                n
            }
        };
        got += n as u64;
    }
    let secs = t0.map_or(1.0, |t| t.elapsed().as_secs_f64());
    let sent_n = sent.load(Ordering::Relaxed) - sent0;
    stop.store(true, Ordering::Relaxed);
    let _ = sender.join();
    drop(xsk);
    drop(program);
    Ok((got as f64 / secs, sent_n as f64 / secs))
}
