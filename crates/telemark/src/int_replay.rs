//! `telemark int-replay`: a capture of Telemetry Report datagrams through the INT report
//! collector's own code (`telemark_core::int::collect::Collector`, as each `int-collector`
//! worker runs it), driven by the capture's timestamps: the events it would store and the
//! reports it would count lost, per reporting node.

use crate::input::Input;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use telemark_collector::flow_listen::Prefix;
use telemark_core::int::collect::{Collector, Refusal};
use telemark_core::int::Detectors;
use telemark_core::records::Record;
use telemark_wire::dialect::Deviation;
use telemark_wire::link::{network_start, LinkType, NetworkStart};

/// `telemark int-replay` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Capture of Telemetry Report datagrams (pcap or pcapng; Ethernet, Linux cooked, raw IP).
    #[arg(value_name = "CAPTURE")]
    pub capture: PathBuf,
    /// Only UDP datagrams to this port (default: every UDP datagram in the capture).
    #[arg(long)]
    pub port: Option<u16>,
    /// The int-collector's config file: its [[detect]] rules, mode, flows, allow and limits.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Refuse reports that break the specifications instead of reading known dialects.
    #[arg(long)]
    pub strict: bool,
    /// Senders whose reports are read (as int-collector's --allow); default: every sender.
    #[arg(long = "allow", value_name = "PREFIX")]
    pub allow: Vec<Prefix>,
    /// Name events carry (the collector's `agent`).
    #[arg(long, default_value = "int-replay")]
    pub name: String,
    /// Print events as JSON lines (the records int-collector sends), then one summary line.
    #[arg(long)]
    pub json: bool,
}

/// The outer IP source, UDP destination port and UDP payload of a frame; `None` when it is
/// not a UDP datagram (IPv4 without fragments, or IPv6 with UDP as its first next header).
fn udp_datagram(frame: &[u8], link: LinkType) -> Option<(IpAddr, u16, &[u8])> {
    let mut off = match network_start(frame, link).ok()? {
        NetworkStart::Ethernet => 14,
        NetworkStart::EtherType(_, off) | NetworkStart::Ip(off) => off,
        NetworkStart::None => return None,
    };
    if matches!(link, LinkType::Ethernet) {
        // 802.1Q / 802.1ad tags.
        let mut et = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
        while et == 0x8100 || et == 0x88a8 {
            et = u16::from_be_bytes([*frame.get(off + 2)?, *frame.get(off + 3)?]);
            off += 4;
        }
    }
    let ip = frame.get(off..)?;
    let (src, l4) = match ip.first()? >> 4 {
        4 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]) & 0x3fff;
            if *ip.get(9)? != 17 || ihl < 20 || frag != 0 {
                return None;
            }
            let a = ip.get(12..16)?;
            (IpAddr::from([a[0], a[1], a[2], a[3]]), ip.get(ihl..)?)
        }
        6 => {
            if *ip.get(6)? != 17 {
                return None;
            }
            let a: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            (IpAddr::from(a), ip.get(40..)?)
        }
        _ => return None,
    };
    let dport = u16::from_be_bytes([*l4.get(2)?, *l4.get(3)?]);
    let len = usize::from(u16::from_be_bytes([*l4.get(4)?, *l4.get(5)?]));
    // The UDP length when it fits the capture; what was captured when the frame was cut.
    let end = len.clamp(8, l4.len().max(8)).min(l4.len());
    Some((src, dport, l4.get(8..end)?))
}

/// Runs the capture through the collector and prints what it found.
pub fn run(a: Args) -> Result<()> {
    let cfg = telemark_int_collector::offline(a.config.clone(), a.strict, a.allow.clone())?;
    let mut input = Input::open(&a.capture)?;
    let link = input.link;
    let mut c = Collector::new(Detectors::new(cfg.rules.clone(), cfg.flows), cfg.mode)
        .with_sequence_limits(cfg.limits);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut events = 0u64;
    let mut err: Option<std::io::Error> = None;
    while let Some(p) = input.next_packet() {
        let Some((src, dport, payload)) = udp_datagram(&p.data, link) else {
            input.skip("not_udp", 1);
            continue;
        };
        if a.port.is_some_and(|want| want != dport) {
            input.skip("other_port", 1);
            continue;
        }
        if !telemark_int_collector::sender_allowed(&cfg.allow, src) {
            c.not_allowed();
            continue;
        }
        c.datagram(payload, p.ts_ns, |e| {
            events += 1;
            if err.is_some() {
                return;
            }
            let rec = e.record(&a.name, &cfg.rules);
            let r = if a.json {
                serde_json::to_string(&Record::Event(rec))
                    .map_err(std::io::Error::other)
                    .and_then(|s| writeln!(out, "{s}"))
            } else {
                let f = &rec.flow;
                let hop = match (rec.hop, rec.switch_id) {
                    (Some(h), Some(s)) => format!(" hop {h} (switch {s})"),
                    _ => String::new(),
                };
                // A flow runs every rule that covers it: the line says which one fired (by
                // its number in the file, as config errors count them).
                let rule = e.rule.map_or(String::new(), |r| format!(" (rule {})", r + 1));
                writeln!(
                    out,
                    "{:>20}  {} -> {} proto {}  {}{}{rule} value {}{}  path {}",
                    rec.time_ns,
                    endpoint(&f.src, f.sport),
                    endpoint(&f.dst, f.dport),
                    f.proto,
                    rec.detector,
                    rec.metric.as_deref().map_or(String::new(), |m| format!(" {m}")),
                    rec.value,
                    hop,
                    rec.path.len()
                )
            };
            if let Err(e) = r {
                err = Some(e);
            }
        });
        if let Some(e) = err.take() {
            return Err(e.into());
        }
    }
    let counts = c.counts().clone();
    let nodes: Vec<_> = c
        .sequences()
        .map(|s| s.nodes().map(|(k, n)| (*k, n.clone())).collect())
        .unwrap_or_default();
    let (refused_nodes, evicted) = c.sequences().map_or((0, 0), |s| (s.untracked, s.evicted));
    let refused: BTreeMap<&str, u64> = Refusal::ALL
        .iter()
        .map(|r| (r.name(), counts.refused[*r as usize]))
        .filter(|(_, n)| *n > 0)
        .collect();
    let deviations: BTreeMap<&str, u64> = Deviation::ALL
        .iter()
        .map(|d| (d.name(), counts.deviations[*d as usize]))
        .filter(|(_, n)| *n > 0)
        .collect();
    if a.json {
        let nodes: Vec<_> = nodes
            .iter()
            .map(|((node, hw), n)| {
                serde_json::json!({
                    "node": node, "hw_id": hw, "datagrams": n.received, "lost": n.lost,
                    "missing": n.missing(), "duplicates": n.duplicates, "late": n.late,
                    "restarts": n.restarts, "jumps": n.jumps,
                })
            })
            .collect();
        let summary = serde_json::json!({ "int_replay": {
            "capture": Record::Capture(input.record()),
            "datagrams": counts.datagrams, "reports": counts.reports, "events": counts.events,
            "quiet": counts.quiet, "refused": refused, "deviations": deviations,
            "nodes": nodes, "nodes_refused": refused_nodes, "nodes_evicted": evicted,
        }});
        writeln!(out, "{summary}")?;
    } else {
        writeln!(
            out,
            "\n{}: {} packets, {} datagrams read, {} reports, {} events, {} quiet",
            input.path().display(),
            input.packets(),
            counts.datagrams,
            counts.reports,
            counts.events,
            counts.quiet
        )?;
        for (what, m) in [("skipped", input.skipped().clone()), ("refused", str_map(&refused))] {
            if !m.is_empty() {
                let list: Vec<String> = m.iter().map(|(k, v)| format!("{k} {v}")).collect();
                writeln!(out, "{what}: {}", list.join(", "))?;
            }
        }
        if !deviations.is_empty() {
            let list: Vec<String> = deviations.iter().map(|(k, v)| format!("{k} {v}")).collect();
            writeln!(out, "read although off the specifications: {}", list.join(", "))?;
        }
        writeln!(
            out,
            "{:>10} {:>5} {:>10} {:>8} {:>8} {:>10} {:>6} {:>8} {:>6}",
            "node",
            "hw_id",
            "datagrams",
            "lost",
            "missing",
            "duplicates",
            "late",
            "restarts",
            "jumps"
        )?;
        for ((node, hw), n) in &nodes {
            writeln!(
                out,
                "{:>10} {:>5} {:>10} {:>8} {:>8} {:>10} {:>6} {:>8} {:>6}",
                node,
                hw,
                n.received,
                n.lost,
                n.missing(),
                n.duplicates,
                n.late,
                n.restarts,
                n.jumps
            )?;
        }
        if refused_nodes + evicted > 0 {
            writeln!(out, "node table full: {refused_nodes} datagrams refused, {evicted} evicted")?;
        }
        writeln!(
            out,
            "lost: sequence numbers the 1,024-wide window moved past; missing: inside the \
             window, not arrived by the capture's end"
        )?;
    }
    out.flush()?;
    input.check_complete()
}

/// `a:port`, or `[a]:port` for IPv6.
fn endpoint(a: &str, port: u16) -> String {
    if a.contains(':') {
        format!("[{a}]:{port}")
    } else {
        format!("{a}:{port}")
    }
}

fn str_map(m: &BTreeMap<&str, u64>) -> BTreeMap<String, u64> {
    m.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_of_ipv4_and_ipv6() {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 32, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&[192, 0, 2, 7, 10, 0, 0, 2]);
        f.extend_from_slice(&[0x9c, 0x40, 0x7f, 0xfe, 0, 12, 0, 0, 1, 2, 3, 4, 0xee, 0xee]);
        let (src, port, p) = udp_datagram(&f, LinkType::Ethernet).unwrap();
        assert_eq!((src, port, p), ("192.0.2.7".parse().unwrap(), 32766, &[1u8, 2, 3, 4][..]));
        // A fragment is not read.
        f[20] = 0x20;
        assert!(udp_datagram(&f, LinkType::Ethernet).is_none());
        let mut v6 = vec![0x60, 0, 0, 0, 0, 10, 17, 64];
        v6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        v6.extend_from_slice(&[0; 12]);
        v6.extend_from_slice(&[0; 16]);
        v6.extend_from_slice(&[0, 1, 0, 9, 0, 10, 0, 0, 0xaa, 0xbb]);
        let (src, port, p) = udp_datagram(&v6, LinkType::RawIp).unwrap();
        assert_eq!((src, port, p), ("2001:db8::".parse().unwrap(), 9, &[0xaa, 0xbb][..]));
    }
}
