//! `telemark int-replay`: captures of Telemetry Reports through the INT report collector's own
//! code. Ground truth: the independently decoded vectors in /work/shared/testdata/int (bmv2's
//! reports with the README's hand-checked decode, CableLabs' vectors with their expected.json),
//! the spec-only generator testdata-gen/int_vectors.py (needs python3 and scapy, as the
//! datapath's spec-vector test), and the sequence numbers this test leaves out; and the live
//! `int-collector` given the same datagrams.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use telemark_wire::int::{Field, Hop, Instructions};
use telemark_wire::report::{Flags, InType, Writer};

const TESTDATA: &str = "/work/shared/testdata/int";

/// `telemark int-replay --json ARGS`: the event records and the summary.
fn replay(args: &[&str]) -> (Vec<Value>, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .arg("int-replay")
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "int-replay failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let summary = lines.pop().expect("a summary line")["int_replay"].clone();
    assert!(lines.iter().all(|e| e["kind"] == "event"));
    (lines, summary)
}

/// (node, hw_id) -> (datagrams, lost + missing) from a summary.
fn nodes(summary: &Value) -> BTreeMap<(u64, u64), (u64, u64)> {
    summary["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let g = |k: &str| n[k].as_u64().unwrap();
            ((g("node"), g("hw_id")), (g("datagrams"), g("lost") + g("missing")))
        })
        .collect()
}

fn testdata(rel: &str) -> Option<PathBuf> {
    let p = Path::new(TESTDATA).join(rel);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipped: {} not here", p.display());
        None
    }
}

#[test]
fn bmv2_reports_decode_as_the_readme_says() {
    // README: one INT-MX report per hop, node_id 1/2/3, inner UDP 10.0.1.1:64057 -> 10.0.3.3:8080.
    for node in 1..=3u64 {
        let Some(p) = testdata(&format!("laofan13-bmv2-int-mx/s{node}-cpu-eth0_out.pcap")) else {
            return;
        };
        let (events, summary) = replay(&[p.to_str().unwrap()]);
        assert_eq!(events.len(), 1);
        let f = &events[0]["flow"];
        assert_eq!(
            (f["src"].as_str(), f["dst"].as_str(), &f["sport"], &f["dport"], &f["proto"]),
            (Some("10.0.1.1"), Some("10.0.3.3"), &64057.into(), &8080.into(), &17.into())
        );
        // Group header 0x10400000: hw_id 1, seq 0.
        assert_eq!(nodes(&summary), BTreeMap::from([((node, 1), (1, 0))]));
    }
}

#[test]
fn cablelabs_vectors_decode_as_their_tests_expect() {
    let Some(p) = testdata("cablelabs-trpt-v2/cablelabs-trpt-v2-vectors.pcap") else { return };
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(TESTDATA).join("cablelabs-trpt-v2/expected.json"))
            .unwrap(),
    )
    .unwrap();
    let (events, summary) = replay(&[p.to_str().unwrap()]);
    let frames = expected["frames"].as_array().unwrap();
    assert_eq!(summary["datagrams"], frames.len());
    // Every (node, hw_id) of their report headers is followed, and nothing else.
    let want: BTreeSet<(u64, u64)> = frames
        .iter()
        .map(|f| (f["report"]["node_id"].as_u64().unwrap(), f["report"]["hw_id"].as_u64().unwrap()))
        .collect();
    assert_eq!(nodes(&summary).keys().copied().collect::<BTreeSet<_>>(), want);
    // The IPv4 frames' events: their inner flow, and both hops' node IDs on the path.
    for f in frames.iter().filter(|f| f["inner_ip"]["ver"] == 4) {
        let ip = &f["inner_ip"];
        let e = events
            .iter()
            .find(|e| e["flow"]["src"] == ip["src"] && e["flow"]["dst"] == ip["dst"])
            .unwrap_or_else(|| panic!("no event for {}", f["name"]));
        assert_eq!(e["flow"]["sport"], f["l4"]["sport"]);
        assert_eq!(e["flow"]["dport"], f["l4"]["dport"]);
        let ids: BTreeSet<u64> =
            e["path"].as_array().unwrap().iter().filter_map(|h| h["switch_id"].as_u64()).collect();
        for id in f["int_md"]["hop_node_ids_contains"].as_array().unwrap() {
            assert!(ids.contains(&id.as_u64().unwrap()), "{} path {ids:?}", f["name"]);
        }
    }
}

#[test]
fn spec_generated_reports_are_all_accounted_for() {
    let dir = tempfile::tempdir().unwrap();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata-gen/int_vectors.py");
    let out = Command::new("python3").arg(&script).arg(dir.path()).output().expect("python3");
    assert!(out.status.success(), "generator: {}", String::from_utf8_lossy(&out.stderr));
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("trpt_v2.json")).unwrap())
            .unwrap();
    let frames = truth["frames"].as_array().unwrap();
    let (events, summary) = replay(&[dir.path().join("trpt_v2.pcap").to_str().unwrap()]);
    assert_eq!(summary["datagrams"], frames.len());
    // Per (node, hw_id): its datagrams, and the gaps in its sequence numbers.
    let mut seqs: BTreeMap<(u64, u64), BTreeSet<u64>> = BTreeMap::new();
    for f in frames {
        let g = &f["group"];
        seqs.entry((g["node_id"].as_u64().unwrap(), g["hw_id"].as_u64().unwrap()))
            .or_default()
            .insert(g["sequence_number"].as_u64().unwrap());
    }
    let want: BTreeMap<(u64, u64), (u64, u64)> = seqs
        .iter()
        .map(|(k, s)| {
            let span = s.last().unwrap() - s.first().unwrap() + 1;
            (*k, (s.len() as u64, span - s.len() as u64))
        })
        .collect();
    assert_eq!(nodes(&summary), want);
    // Every individual report is either an event or refused, by reason.
    let reports: u64 = frames.iter().map(|f| f["reports"].as_array().unwrap().len() as u64).sum();
    let refused: u64 =
        summary["refused"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(events.len() as u64 + refused, reports, "{summary}");
    assert_eq!(summary["events"], events.len());
}

/// A v2.0 report from `node` with sequence number `seq`: an IPv4/UDP inner packet.
fn report(node: u32, seq: u32) -> Vec<u8> {
    let mut inner = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 9, 0, 1, 10, 9, 1, 1];
    inner.extend_from_slice(&[0x13, 0x88, 0x1b, 0x5a, 0, 8, 0, 0]);
    let mut md = Hop::default();
    md.set(Field::HopLatency, 1_000);
    let mut buf = [0u8; 128];
    let mut w = Writer::new(&mut buf, 0, seq, node).unwrap();
    w.push(InType::Ipv4, Flags::default(), Instructions::of(&[Field::HopLatency]), &md, &inner)
        .unwrap();
    let n = w.len();
    buf[..n].to_vec()
}

/// A pcap (raw IP) of these UDP payloads from 127.0.0.1 to port 32766, 1 ms apart.
fn pcap(datagrams: &[Vec<u8>]) -> Vec<u8> {
    let mut f = Vec::new();
    for v in [0xa1b2_c3d4u32.to_le_bytes(), [2, 0, 4, 0], [0; 4], [0; 4], 65535u32.to_le_bytes()] {
        f.extend_from_slice(&v);
    }
    f.extend_from_slice(&101u32.to_le_bytes());
    for (i, d) in datagrams.iter().enumerate() {
        let len = 28 + d.len();
        let (sec, usec) = (1_700_000_000 + i as u32 / 1000, (i as u32 % 1000) * 1000);
        for v in [sec, usec, len as u32, len as u32] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.extend_from_slice(&[0x45, 0, (len >> 8) as u8, len as u8, 0, 0, 0, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&[127, 0, 0, 1, 127, 0, 0, 1, 0x9c, 0x40, 0x7f, 0xfe]);
        f.extend_from_slice(&[((len - 20) >> 8) as u8, (len - 20) as u8, 0, 0]);
        f.extend_from_slice(d);
    }
    f
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn metrics(url: &str) -> BTreeMap<String, u64> {
    let body = ureq::get(url).call().unwrap().into_string().unwrap();
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
        .collect()
}

#[test]
fn replay_counts_what_the_live_collector_counts() {
    // Node 9 sends 0..3000 but the test leaves out every number ending in 3 (300 of them);
    // one datagram holds a group header only (TR v2.0 §3.3 wants a report: refused, its
    // number still arrived); one jumps 2,096,125 ahead (a jump, not loss).
    let mut sent = Vec::new();
    for seq in (0..3000u32).filter(|s| s % 10 != 3) {
        sent.push(if seq == 1500 {
            vec![0x20, 0, (seq >> 8) as u8, seq as u8, 0, 0, 0, 9]
        } else {
            report(9, seq)
        });
    }
    sent.push(report(9, 2999 + 2_096_125));
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("reports.pcap");
    std::fs::write(&cap, pcap(&sent)).unwrap();
    let (events, summary) = replay(&[cap.to_str().unwrap(), "--port", "32766"]);
    assert_eq!(nodes(&summary), BTreeMap::from([((9, 0), (2701, 300))]), "{summary}");
    assert_eq!(summary["nodes"][0]["jumps"], 1);
    assert_eq!(summary["refused"]["no_reports"], 1);
    assert_eq!(events.len(), 2700);
    // The live collector, given the same datagrams, says the same.
    let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mport = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let _p = Killed(
        Command::new(env!("CARGO_BIN_EXE_telemark"))
            .args(["int-collector", "--listen", &listen, "--metrics"])
            .arg(format!("127.0.0.1:{mport}"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let murl = format!("http://127.0.0.1:{mport}/metrics");
    let until = Instant::now() + Duration::from_secs(20);
    while ureq::get(&murl).call().is_err() {
        assert!(Instant::now() < until, "int-collector did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    for (i, d) in sent.iter().enumerate() {
        tx.send_to(d, &listen).unwrap();
        if i % 200 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let key = |f: &str| format!("{f}{{collector=\"int-collector\",node=\"9\",hw_id=\"0\"}}");
    let m = loop {
        let m = metrics(&murl);
        // Sequence windows are shared at once, the workers' counters every 100 ms.
        let read: u64 = m
            .iter()
            .filter(|(k, _)| k.starts_with("telemark_int_datagrams_total"))
            .map(|(_, v)| v)
            .sum();
        if m.get(&key("telemark_int_sequence_jumps_total")) == Some(&1) && read == 2701 {
            break m;
        }
        assert!(Instant::now() < until, "live collector: {m:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let live = (
        m[&key("telemark_int_node_datagrams_total")],
        m[&key("telemark_int_reports_lost_total")] + m[&key("telemark_int_reports_missing")],
    );
    assert_eq!(live, (2701, 300));
    assert_eq!(
        m["telemark_int_refused_total{collector=\"int-collector\",reason=\"no_reports\"}"],
        1
    );
    assert_eq!(m["telemark_int_events_total{collector=\"int-collector\"}"], 2700);
}
