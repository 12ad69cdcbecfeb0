//! The real captures in shared/testdata parse, and their flow keys match tshark's dissection:
//! innermost IP addresses, the transport ports that follow it, and NSH SPI/SI.
//!
//! Needs `tshark` (`.ci/run` installs it). Without it the test fails: it is never skipped.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use telemark_datapath::capture::read_all;
use telemark_wire::flow::{extract, SkipReason};

fn captures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/captures")
}

/// Source, destination, ports and NSH (SPI, SI) of a frame's innermost flow.
type TsharkKey = (IpAddr, IpAddr, u16, u16, Option<(u32, u8)>);

/// What tshark says the innermost flow of each frame is; `None` when it sees no IP.
fn tshark_keys(path: &PathBuf) -> Vec<Option<TsharkKey>> {
    let out = Command::new("timeout")
        .arg("60")
        .arg("tshark")
        .args(["-n", "-r"])
        .arg(path)
        .args(["-T", "fields", "-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=|"])
        .args([
            "-e",
            "frame.protocols",
            "-e",
            "ip.src",
            "-e",
            "ip.dst",
            "-e",
            "ipv6.src",
            "-e",
            "ipv6.dst",
        ])
        .args(["-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "udp.srcport", "-e", "udp.dstport"])
        .args(["-e", "nsh.spi", "-e", "nsh.si"])
        .output()
        .expect("tshark must be installed for this test (apt-get install tshark; .ci/run does it)");
    assert!(
        out.status.success(),
        "tshark failed on {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            let get = |i: usize| -> Vec<&str> {
                f.get(i)
                    .map(|s| s.split('|').filter(|x| !x.is_empty()).collect())
                    .unwrap_or_default()
            };
            let protos: Vec<&str> = f.first().copied().unwrap_or("").split(':').collect();
            // Headers quoted inside ICMP errors are not the packet's own.
            let protos: Vec<&str> =
                protos.iter().copied().take_while(|p| *p != "icmp" && *p != "icmpv6").collect();
            let last_ip = protos.iter().rposition(|p| *p == "ip" || *p == "ipv6")?;
            let is_v6 = protos[last_ip] == "ipv6";
            let nth = protos[..=last_ip].iter().filter(|p| **p == protos[last_ip]).count() - 1;
            let (s, d) = if is_v6 { (get(3), get(4)) } else { (get(1), get(2)) };
            let src: IpAddr = s.get(nth)?.parse().ok()?;
            let dst: IpAddr = d.get(nth)?.parse().ok()?;
            let l4 = protos[last_ip + 1..].iter().find(|p| !p.starts_with("ipv6."));
            let ports = match l4 {
                Some(&t @ ("tcp" | "udp")) => {
                    let n = protos[..=last_ip].iter().filter(|p| **p == t).count();
                    let (a, b) = if t == "tcp" { (get(5), get(6)) } else { (get(7), get(8)) };
                    (
                        a.get(n).and_then(|v| v.parse().ok()).unwrap_or(0),
                        b.get(n).and_then(|v| v.parse().ok()).unwrap_or(0),
                    )
                }
                _ => (0, 0),
            };
            let nsh = protos[..last_ip].contains(&"nsh").then(|| {
                (
                    get(9).last().and_then(|v| v.parse().ok()).unwrap_or(0),
                    get(10).last().and_then(|v| v.parse().ok()).unwrap_or(0),
                )
            });
            Some((src, dst, ports.0, ports.1, nsh))
        })
        .collect()
}

#[test]
fn real_captures_match_tshark() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(captures_dir())
        .expect("shared/testdata/captures beside the checkout")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap" || e == "pcapng"))
        .collect();
    files.sort();
    assert!(files.len() >= 15, "expected the shared captures, found {}", files.len());
    let mut compared = 0;
    let mut mismatches = Vec::new();
    let mut tunnels: HashMap<String, u64> = HashMap::new();
    for path in &files {
        let (pkts, reader) = read_all(path).unwrap_or_else(|e| panic!("{e}"));
        assert!(reader.damaged_tail.is_none(), "{}: {:?}", path.display(), reader.damaged_tail);
        let want = tshark_keys(path);
        assert_eq!(want.len(), pkts.len(), "{}: frame count", path.display());
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        for (i, ((link, p), w)) in pkts.iter().zip(&want).enumerate() {
            let link = link.unwrap_or_else(|| panic!("{name}: unreadable link type"));
            let got = extract(&p.data, link);
            match (got, w) {
                (Ok(g), Some((s, d, sp, dp, nsh))) => {
                    compared += 1;
                    *tunnels.entry(name.clone()).or_default() += u64::from(g.tunnels > 0);
                    let gk = &g.key;
                    let nsh_ok = match nsh {
                        Some((spi, si)) => gk.spi == Some(*spi) && gk.si == Some(*si),
                        None => gk.spi.is_none(),
                    };
                    if gk.src != *s || gk.dst != *d || gk.sport != *sp || gk.dport != *dp || !nsh_ok
                    {
                        mismatches.push(format!(
                            "{name} frame {}: telemark {gk} vs tshark {s}:{sp} > {d}:{dp} {nsh:?}",
                            i + 1
                        ));
                    }
                }
                (Err(SkipReason::NotIp), None) => {}
                (Err(e), Some(_)) => mismatches.push(format!(
                    "{name} frame {}: telemark skipped ({e}), tshark sees IP",
                    i + 1
                )),
                (Ok(g), None) => mismatches.push(format!(
                    "{name} frame {}: telemark {} but tshark sees no IP",
                    i + 1,
                    g.key
                )),
                (Err(e), None) => mismatches
                    .push(format!("{name} frame {}: telemark error {e} on a non-IP frame", i + 1)),
            }
        }
    }
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
    assert!(compared > 11_000, "compared {compared} frames");
    // The tunnelled captures were really seen through.
    for f in [
        "vxlan.pcap",
        "deepflow_vxlan-nsh.pcap",
        "deepflow_geneve.pcap",
        "deepflow_decapsulate_erspan1.pcap",
        "nsh.pcap",
    ] {
        assert!(tunnels.get(f).copied().unwrap_or(0) > 0, "{f}: no tunnel decapsulated");
    }
}
