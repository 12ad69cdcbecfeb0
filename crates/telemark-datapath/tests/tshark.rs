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

/// Compares every frame of `path` with tshark's dissection: frames compared, mismatches.
fn compare(path: &PathBuf, tunnels: &mut HashMap<String, u64>) -> (u64, Vec<String>) {
    let mut compared = 0;
    let mut mismatches = Vec::new();
    let (pkts, reader) = read_all(path).unwrap_or_else(|e| panic!("{e}"));
    assert!(reader.damage.is_none(), "{}: {:?}", path.display(), reader.damage);
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
                if gk.src != *s || gk.dst != *d || gk.sport != *sp || gk.dport != *dp || !nsh_ok {
                    mismatches.push(format!(
                        "{name} frame {}: telemark {gk} vs tshark {s}:{sp} > {d}:{dp} {nsh:?}",
                        i + 1
                    ));
                }
            }
            (Err(SkipReason::NotIp), None) => {}
            (Err(e), Some(_)) => mismatches
                .push(format!("{name} frame {}: telemark skipped ({e}), tshark sees IP", i + 1)),
            (Ok(g), None) => mismatches.push(format!(
                "{name} frame {}: telemark {} but tshark sees no IP",
                i + 1,
                g.key
            )),
            (Err(e), None) => mismatches
                .push(format!("{name} frame {}: telemark error {e} on a non-IP frame", i + 1)),
        }
    }
    (compared, mismatches)
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
        let (n, m) = compare(path, &mut tunnels);
        compared += n;
        mismatches.extend(m);
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

/// The link layers captures carry besides Ethernet: the IP packets of a real capture (the
/// CAIDA trace, IPv4, and the IPv6 VXLAN one with its Ethernet header removed) behind each
/// link-layer header, written with that LINKTYPE and some cut to 64 bytes; Telemark's flow
/// key of every frame is tshark's.
#[test]
fn every_readable_link_type_matches_tshark() {
    use telemark_datapath::capture::CaptureWriter;
    use telemark_wire::link::LinkType;
    let mut ip: Vec<Vec<u8>> = Vec::new();
    let (caida, _) = read_all(&captures_dir().join("caida-equinix-nyc-2018-10k.pcap")).unwrap();
    ip.extend(caida.iter().take(300).map(|(_, p)| p.data.clone()));
    let (v6, _) = read_all(&captures_dir().join("deepflow_ip6-vxlan.pcap")).unwrap();
    ip.extend(v6.iter().take(50).map(|(_, p)| p.data[14..].to_vec()));
    let dir = std::env::temp_dir().join(format!("tm-links-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let v4 = |d: &[u8]| d.first().is_some_and(|b| b >> 4 == 4);
    // A link type, its file name, and its header for an IP packet (v4 or not).
    type Header = (LinkType, &'static str, fn(&[u8], bool) -> Vec<u8>);
    let headers: [Header; 7] = [
        (LinkType::LinuxSll, "sll", |_, v4| {
            let et: [u8; 2] = if v4 { [0x08, 0] } else { [0x86, 0xdd] };
            vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, et[0], et[1]]
        }),
        (LinkType::LinuxSll2, "sll2", |_, v4| {
            let et: [u8; 2] = if v4 { [0x08, 0] } else { [0x86, 0xdd] };
            vec![et[0], et[1], 0, 0, 0, 0, 0, 3, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0]
        }),
        (LinkType::Null, "null", |_, v4| {
            let af: u32 = if v4 { 2 } else { 30 };
            af.to_le_bytes().to_vec()
        }),
        (LinkType::Loop, "loop", |_, v4| {
            let af: u32 = if v4 { 2 } else { 24 };
            af.to_be_bytes().to_vec()
        }),
        (LinkType::Nflog, "nflog", |d, v4| {
            let mut h = vec![if v4 { 2 } else { 10 }, 0, 0, 1];
            // NFULA_PREFIX "x", then NFULA_PAYLOAD holding the packet.
            h.extend_from_slice(&[6, 0, 10, 0, b'x', 0, 0, 0]);
            h.extend_from_slice(&((4 + d.len()) as u16).to_le_bytes());
            h.extend_from_slice(&9u16.to_le_bytes());
            h
        }),
        (LinkType::Ppp, "ppp", |_, v4| vec![0xff, 0x03, 0, if v4 { 0x21 } else { 0x57 }]),
        (LinkType::CiscoHdlc, "chdlc", |_, v4| {
            let et: [u8; 2] = if v4 { [0x08, 0] } else { [0x86, 0xdd] };
            vec![0x0f, 0, et[0], et[1]]
        }),
    ];
    let mut tunnels = HashMap::new();
    let mut compared = 0;
    let mut mismatches = Vec::new();
    for (link, name, header) in headers {
        let path = dir.join(format!("{name}.pcap"));
        let mut w = CaptureWriter::create_with(&path, link, 65_535).unwrap();
        for (i, d) in ip.iter().enumerate() {
            let mut f = header(d, v4(d));
            f.extend_from_slice(d);
            // Every fifth frame cut to 64 bytes, as a snapshot length would (enough for the
            // ports behind the longest header, as a key needs). Not NFLOG: tshark does not
            // dissect a cut NFLOG payload record, where Telemark reads the IP header in it.
            let keep =
                if i % 5 == 0 && link != LinkType::Nflog { f.len().min(64) } else { f.len() };
            w.write_cut(i as u64 * 1_000, &f[..keep], f.len() as u32).unwrap();
        }
        w.finish().unwrap();
        let (n, m) = compare(&path, &mut tunnels);
        assert!(n >= 250, "{name}: only {n} frames compared");
        compared += n;
        mismatches.extend(m);
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
    assert!(compared > 2_000);
}
