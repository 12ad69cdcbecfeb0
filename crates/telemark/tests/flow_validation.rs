//! CESNET FlowTest's validation suite (`../shared/testdata/flow/cesnet-flowtest/`) run through
//! Telemark's IPFIX export: each trace is exported by `telemark export` (the agent's flow
//! meter) to a UDP socket, tshark decodes the messages (an independent IPFIX decoder), and
//! the flows it reads are held against the trace's validation file: every annotated flow, in
//! each direction (`field@rev` is the reverse flow, Telemark exports uniflows), with its
//! packets and bytes, and the fields Telemark exports (TCP flags, ToS, VLAN id, IP version).
//! Fields Telemark does not export (TTL, MAC addresses, MPLS labels, ICMP type, TCP options,
//! DNS, VXLAN id, outer bytes) are listed, not checked. Needs tshark.

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{tshark_fields, write_udp_pcap};

fn suite() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/flow/cesnet-flowtest")
}

/// One validation file: its trace, key fields, and each flow's fields as written.
struct Validation {
    name: String,
    pcap: String,
    key: Vec<String>,
    flows: Vec<BTreeMap<String, String>>,
}

/// Reads the parts of a validation file this test uses (top-level `pcap` and `key`, and each
/// flow's scalar fields; nested values such as DNS records are skipped).
fn read_validation(path: &Path) -> Validation {
    let text = std::fs::read_to_string(path).unwrap();
    let mut v = Validation {
        name: path.file_stem().unwrap().to_string_lossy().into_owned(),
        pcap: String::new(),
        key: ["src_ip", "dst_ip", "protocol", "src_port", "dst_port"].map(String::from).to_vec(),
        flows: Vec::new(),
    };
    let mut in_flows = false;
    for line in text.lines() {
        let field = |s: &str| -> Option<(String, String)> {
            let (k, val) = s.split_once(':')?;
            Some((k.trim().to_string(), val.trim().trim_matches('"').to_string()))
        };
        if let Some(rest) = line.strip_prefix("pcap:") {
            v.pcap = rest.trim().to_string();
        } else if let Some(rest) = line.strip_prefix("key:") {
            v.key = rest
                .trim()
                .trim_matches(['[', ']'])
                .split(',')
                .map(|s| s.trim().to_string())
                .collect();
        } else if line.starts_with("flows:") {
            in_flows = true;
        } else if in_flows {
            if let Some(rest) = line.strip_prefix("  - ") {
                v.flows.push(BTreeMap::new());
                if let (Some((k, val)), Some(f)) = (field(rest), v.flows.last_mut()) {
                    f.insert(k, val);
                }
            } else if line.starts_with("    ") && !line.starts_with("     ") {
                if let (Some((k, val)), Some(f)) = (field(line), v.flows.last_mut()) {
                    if !val.is_empty() {
                        f.insert(k, val);
                    }
                }
            } else if !line.starts_with(' ') && !line.is_empty() {
                in_flows = false;
            }
        }
    }
    v
}

/// A number as validation files write it (decimal or 0x hex).
fn number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// One exported flow as tshark reads it.
type Exported = BTreeMap<&'static str, String>;

const TSHARK_FIELDS: [(&str, &str); 15] = [
    ("src_ip", "cflow.srcaddr"),
    ("src_ip6", "cflow.srcaddrv6"),
    ("dst_ip", "cflow.dstaddr"),
    ("dst_ip6", "cflow.dstaddrv6"),
    ("protocol", "cflow.protocol"),
    ("src_port", "cflow.srcport"),
    ("dst_port", "cflow.dstport"),
    ("packets", "cflow.packets"),
    ("bytes", "cflow.octets"),
    ("tcp_flags", "cflow.tcpflags"),
    ("tos", "cflow.tos"),
    ("vlan_id", "cflow.vlanid"),
    ("icmp_type_code", "cflow.icmp_type_code_ipv4"),
    ("icmp6_type", "cflow.icmp_ipv6_type"),
    ("icmp6_code", "cflow.icmp_ipv6_code"),
];

/// Exports `pcap` with `telemark export` and returns the flow records tshark decodes.
fn export(pcap: &Path) -> Vec<Exported> {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let port = sock.local_addr().unwrap().port();
    let out = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["export", "--read"])
        .arg(pcap)
        .args([
            "--ipfix",
            &format!("127.0.0.1:{port}"),
            "--idle-timeout",
            "1h",
            "--active-timeout",
            "1h",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "telemark export: {}", String::from_utf8_lossy(&out.stderr));
    let mut datagrams = Vec::new();
    let mut buf = vec![0u8; 65_536];
    while let Ok(n) = sock.recv(&mut buf) {
        datagrams.push(buf[..n].to_vec());
    }
    assert!(!datagrams.is_empty(), "{}: nothing exported", pcap.display());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ipfix.pcap");
    let payloads: Vec<(u16, Vec<u8>)> = datagrams.into_iter().map(|d| (port, d)).collect();
    write_udp_pcap(&file, &payloads);
    let fields: Vec<&str> = TSHARK_FIELDS.iter().map(|f| f.1).collect();
    let out = tshark_fields(&file, &[format!("udp.port=={port},cflow")], "", &fields);
    let mut flows = Vec::new();
    for line in out.lines() {
        let cols: Vec<Vec<&str>> = line.split('\t').map(|c| c.split(';').collect()).collect();
        // Records of the flow templates carry packets; loss and options records do not.
        let n = cols.get(7).map_or(0, |c| c.iter().filter(|s| !s.is_empty()).count());
        for i in 0..n {
            let mut f = Exported::new();
            for (j, (name, _)) in TSHARK_FIELDS.iter().enumerate() {
                if let Some(v) = cols.get(j).and_then(|c| c.get(i)).filter(|v| !v.is_empty()) {
                    f.insert(name, v.to_string());
                }
            }
            for (v6, name) in [("src_ip6", "src_ip"), ("dst_ip6", "dst_ip")] {
                if let Some(a) = f.remove(v6) {
                    f.insert(name, a);
                }
            }
            // tshark shows icmpTypeCodeIPv6 as type and code.
            if let (Some(t), Some(c)) = (f.remove("icmp6_type"), f.remove("icmp6_code")) {
                let tc = number(&t).unwrap_or(0) * 256 + number(&c).unwrap_or(0);
                f.insert("icmp_type_code", tc.to_string());
            }
            flows.push(f);
        }
    }
    flows
}

/// Compares one annotated direction with the exported flows; the mismatches.
fn check(
    v: &Validation,
    ann: &BTreeMap<String, String>,
    rev: bool,
    got: &[Exported],
) -> Vec<String> {
    let field = |name: &str| -> Option<&String> {
        if rev {
            let swapped = match name {
                "src_ip" => "dst_ip",
                "dst_ip" => "src_ip",
                "src_port" => "dst_port",
                "dst_port" => "src_port",
                n if ["protocol", "ip_version"].contains(&n) => n,
                n => return ann.get(&format!("{n}@rev")),
            };
            ann.get(swapped)
        } else {
            ann.get(name)
        }
    };
    // A reverse direction is annotated only when its counters are.
    if rev && field("packets").is_none() {
        return Vec::new();
    }
    let same = |f: &Exported, k: &str, want: &str| match (f.get(k), number(want)) {
        (Some(g), Some(w)) if !want.contains('.') && !want.contains(':') => number(g) == Some(w),
        (Some(g), _) => g.parse::<std::net::IpAddr>().ok() == want.parse().ok() || g == want,
        (None, _) => false,
    };
    // ICMP messages of different types are different flows (as the suite's probes key them).
    let key = v.key.iter().map(String::as_str).chain(["icmp_type_code"]);
    let matching: Vec<&Exported> = got
        .iter()
        .filter(|f| key.clone().all(|k| field(k).is_none_or(|want| same(f, k, want))))
        .collect();
    let dir = if rev { "reverse" } else { "forward" };
    if matching.is_empty() {
        return vec![format!("{}: {dir} flow {:?} not exported", v.name, field("src_ip"))];
    }
    let mut bad = Vec::new();
    let sum =
        |k: &str| matching.iter().filter_map(|f| f.get(k).and_then(|s| number(s))).sum::<u64>();
    for k in ["packets", "bytes"] {
        if let Some(want) = field(k).and_then(|s| number(s)) {
            if sum(k) != want {
                bad.push(format!("{}: {dir} {k}: exported {}, expected {want}", v.name, sum(k)));
            }
        }
    }
    if let Some(want) = field("tcp_flags").and_then(|s| number(s)) {
        let or = matching
            .iter()
            .filter_map(|f| f.get("tcp_flags").and_then(|s| number(s)))
            .fold(0, |a, b| a | b);
        if or != want {
            bad.push(format!("{}: {dir} tcp_flags: exported {or:#x}, expected {want:#x}", v.name));
        }
    }
    for k in ["vlan_id", "icmp_type_code"] {
        if let Some(want) = field(k).and_then(|s| number(s)) {
            if !matching.iter().all(|f| f.get(k).and_then(|s| number(s)) == Some(want)) {
                let got: Vec<_> = matching.iter().map(|f| f.get(k)).collect();
                bad.push(format!("{}: {dir} {k}: exported {got:?}, expected {want}", v.name));
            }
        }
    }
    if let Some(want) = field("tos").and_then(|s| number(s)) {
        if !matching.iter().all(|f| f.get("tos").and_then(|s| number(s)) == Some(want)) {
            bad.push(format!("{}: {dir} tos: expected {want:#x}", v.name));
        }
    }
    bad
}

#[test]
fn every_cesnet_trace_exported_as_ipfix_matches_its_validation_file() {
    let dir = suite().join("validation");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 20, "the suite's 20 validation files");
    let mut bad = Vec::new();
    let (mut flows, mut directions) = (0, 0);
    for f in &files {
        let v = read_validation(f);
        let got = export(&suite().join("pcap").join(&v.pcap));
        for ann in &v.flows {
            flows += 1;
            for rev in [false, true] {
                let b = check(&v, ann, rev, &got);
                directions += usize::from(!rev || ann.contains_key("packets@rev"));
                bad.extend(b);
            }
        }
    }
    println!("{} validation files, {flows} flows, {directions} directions checked", files.len());
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}
