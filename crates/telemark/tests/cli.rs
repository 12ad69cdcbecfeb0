//! The `telemark` binary end to end: generated captures, two-point analysis against a known
//! set of deleted packets, and clear errors on bad input.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use telemark_core::rng::Rng;
use telemark_datapath::capture::{read_all, CaptureWriter};
use telemark_wire::flow::{extract, LinkType};
use telemark_wire::FlowKey;

/// The binary, run from the checkout's root as a user would (so `../shared/testdata`, beside
/// the checkout, is where it looks for the flow-size distribution).
fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_telemark"));
    c.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    c
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("telemark-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json_lines(s: &str) -> Vec<serde_json::Value> {
    s.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

fn flow_of(v: &serde_json::Value) -> FlowKey {
    let f = &v["flow"];
    FlowKey {
        src: f["src"].as_str().unwrap().parse().unwrap(),
        dst: f["dst"].as_str().unwrap().parse().unwrap(),
        sport: f["sport"].as_u64().unwrap() as u16,
        dport: f["dport"].as_u64().unwrap() as u16,
        proto: f["proto"].as_u64().unwrap() as u8,
        spi: f["spi"].as_u64().map(|v| v as u32),
        si: f["si"].as_u64().map(|v| v as u8),
    }
}

const JUNK: [&[u8]; 4] = [
    &[0xde, 0xad],                                                             // runt
    &[0xff; 60], // broadcast, EtherType 0xffff
    &[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00, 0x45, 0, 0, 40, 0, 0], // IPv4 cut short
    &[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1], // ARP
];

/// Writes `pkts` to `path` with junk frames sprinkled in every `junk_every` packets.
fn write_with_junk(path: &Path, pkts: &[(u64, Vec<u8>)], junk_every: usize) {
    let mut w = CaptureWriter::create(path).unwrap();
    for (i, (t, d)) in pkts.iter().enumerate() {
        if i % junk_every == 3 {
            w.write(*t, JUNK[i % JUNK.len()]).unwrap();
        }
        w.write(*t, d).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn two_point_reports_exactly_the_missing_packets() {
    let dir = tmpdir("two-point");
    let marked = dir.join("marked.pcap");
    ok(&bin()
        .args(["gen", "--flows", "120", "--seed", "5", "--mark", "-o"])
        .arg(&marked)
        .output()
        .unwrap());
    let (pkts, _) = read_all(&marked).unwrap();
    // Upstream: the capture as is, plus junk. Downstream: 40 µs later with up to 3 µs jitter,
    // every packet that a seeded coin picks (2 %, bursts of 3) deleted, plus other junk.
    let mut rng = Rng::new(99);
    let mut up = Vec::new();
    let mut down = Vec::new();
    let mut deleted: HashMap<FlowKey, u64> = HashMap::new();
    let mut burst = 0;
    for (_, p) in &pkts {
        up.push((p.ts_ns, p.data.clone()));
        if burst == 0 && rng.chance(0.02 / 3.0) {
            burst = 3;
        }
        if burst > 0 {
            burst -= 1;
            let k = extract(&p.data, LinkType::Ethernet).unwrap().key;
            *deleted.entry(k).or_default() += 1;
            continue;
        }
        down.push((p.ts_ns + 40_000 + rng.below(3_000), p.data.clone()));
    }
    assert!(deleted.values().sum::<u64>() > 50);
    let (a, b) = (dir.join("up.pcap"), dir.join("down.pcap"));
    write_with_junk(&a, &up, 97);
    write_with_junk(&b, &down, 53);
    let pa = format!("up={}", a.display());
    let pb = format!("down={}", b.display());
    let out = ok(&bin()
        .args(["replay", "--json", "--point", &pa, "--point", &pb, "--table-size", "4096"])
        .output()
        .unwrap());
    let recs = json_lines(&out);
    let mut detected: HashMap<FlowKey, u64> = HashMap::new();
    let mut batch_lost: HashMap<FlowKey, u64> = HashMap::new();
    let uncertain = &mut 0u64;
    for r in &recs {
        match r["kind"].as_str().unwrap() {
            // Deleted packets are reported lost, or uncertain where a whole batch at a flow's
            // edge is missing (the point cannot tell it from a flow it did not watch).
            "flow_loss" => {
                assert_eq!(r["point"], "down");
                let (l, u) = (r["lost"].as_u64().unwrap(), r["uncertain"].as_u64().unwrap());
                detected.insert(flow_of(r), l + u);
                *uncertain += u;
            }
            "loss" => {
                let (l, u) = (r["lost"].as_u64().unwrap(), r["uncertain"].as_u64().unwrap());
                *batch_lost.entry(flow_of(r)).or_default() += l + u;
            }
            "capture" => {
                // Every record of both files read, the junk frames among them skipped.
                let file = r["file"].as_str().unwrap();
                let (n, junk) =
                    if file.ends_with("up.pcap") { (up.len(), 97) } else { (down.len(), 53) };
                let junk_frames = (0..n).filter(|i| i % junk == 3).count() as u64;
                assert_eq!(r["packets"].as_u64(), Some(n as u64 + junk_frames), "{r}");
                assert_eq!(r["complete"], true);
                let skipped: u64 =
                    r["skipped"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
                assert_eq!(skipped, junk_frames, "{r}");
            }
            k => panic!("unexpected record kind {k}"),
        }
    }
    let flows: std::collections::HashSet<FlowKey> =
        pkts.iter().map(|(_, p)| extract(&p.data, LinkType::Ethernet).unwrap().key).collect();
    for k in &flows {
        let want = deleted.get(k).copied().unwrap_or(0);
        if detected.get(k).copied().unwrap_or(0) != want {
            for r in recs.iter().filter(|r| r["kind"] != "capture") {
                if flow_of(r) == *k {
                    eprintln!("{r}");
                }
            }
        }
        assert_eq!(detected.get(k).copied().unwrap_or(0), want, "flow {k}");
        assert_eq!(batch_lost.get(k).copied().unwrap_or(0), want, "per-batch records of {k}");
    }
    let all: u64 = deleted.values().sum();
    assert!(*uncertain * 10 < all, "{uncertain} of {all} deleted packets uncertain");
    // The text report names the junk it skipped and the total.
    let text = ok(&bin()
        .args(["replay", "--point", &pa, "--point", &pb, "--table-size", "4096"])
        .output()
        .unwrap());
    let lost = all - *uncertain;
    assert!(text.contains(&format!("{lost} of")), "{text}");
    if *uncertain > 0 {
        assert!(text.contains(&format!("{uncertain} more uncertain")), "{text}");
    }
    assert!(text.contains("truncated") && text.contains("not_ip"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn replay_of_generated_capture_matches_the_droppers() {
    let dir = tmpdir("replay");
    let cap = dir.join("plain.pcap");
    ok(&bin().args(["gen", "--flows", "150", "--seed", "3", "-o"]).arg(&cap).output().unwrap());
    let out = ok(&bin()
        .args([
            "replay",
            "--json",
            "--table-size",
            "8192",
            "--drop-at",
            "ingress=0.02",
            "--drop-at",
            "switch=0.01:5",
            "--drop-at",
            "egress=0.01",
        ])
        .arg(&cap)
        .output()
        .unwrap());
    let recs = json_lines(&out);
    let mut lost = 0;
    let mut flows = 0;
    for r in recs.iter().filter(|r| r["kind"] == "flow_loss") {
        flows += 1;
        // Every drop reported, as lost or (a whole batch at a flow's edge) uncertain; no more
        // reported lost than was dropped.
        let (l, u) = (r["lost"].as_u64().unwrap(), r["uncertain"].as_u64().unwrap());
        assert_eq!(Some(l + u), r["truth_lost"].as_u64(), "{r}");
        lost += l;
    }
    assert!(flows >= 150 && lost > 20, "flows {flows}, lost {lost}");
    assert!(recs.iter().any(|r| r["kind"] == "summary"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_input_is_one_clear_line_and_nonzero() {
    let dir = tmpdir("errors");
    let junk = dir.join("notes.txt");
    std::fs::write(&junk, "not a capture").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["replay".into(), junk.display().to_string()], "not a pcap"),
        (vec!["replay".into(), dir.join("missing.pcap").display().to_string()], "No such file"),
        (
            vec!["replay".into(), "--generate".into(), "5".into(), "--batch".into(), "300".into()],
            "--counter-bits",
        ),
        (
            vec![
                "replay".into(),
                "--generate".into(),
                "5".into(),
                "--drop-at".into(),
                "moon=0.1".into(),
            ],
            "unknown drop placement",
        ),
        (
            vec![
                "replay".into(),
                "--generate".into(),
                "5".into(),
                "--table-size".into(),
                "1000".into(),
            ],
            "power of two",
        ),
        (vec!["replay".into(), "--point".into(), "up=x.pcap".into()], "exactly two"),
        (vec!["replay".into()], "give a CAPTURE"),
        (
            vec![
                "replay".into(),
                "--generate".into(),
                "5".into(),
                "--period".into(),
                "soon".into(),
            ],
            "not a duration",
        ),
    ];
    for (args, want) in cases {
        let o = bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{args:?}: {err}");
    }
    // A capture cut mid-record keeps what came before and says so.
    let cap = dir.join("cut.pcap");
    ok(&bin().args(["gen", "--flows", "5", "-o"]).arg(&cap).output().unwrap());
    let bytes = std::fs::read(&cap).unwrap();
    std::fs::write(&cap, &bytes[..bytes.len() - 7]).unwrap();
    let o = bin().arg("replay").arg(&cap).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "results printed, but of part of the file");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(String::from_utf8_lossy(&o.stderr).contains("damaged record"));
    assert!(text.contains("stopped at a damaged record"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `replay --select-top` on the mice-then-elephants trace: each window's `flow` records bound
/// the flow's true packets (counted here from the capture) as documented, every flow with at
/// least 0.5 % of a window's packets is listed, and the elephants' loss is measured.
#[test]
fn replay_lists_heavy_flows_per_window_and_selects_them() {
    let d = tmpdir("select");
    let cap = d.join("mf.pcap");
    let gen = [
        "gen",
        "-o",
        cap.to_str().unwrap(),
        "--flows",
        "100",
        "--elephants",
        "6",
        "--duration",
        "3s",
    ];
    ok(&bin().args(gen).output().unwrap());
    let out = ok(&bin()
        .args(["replay", cap.to_str().unwrap(), "--table-size", "32", "--select-top", "10"])
        .args(["--drop-at", "switch=0.02", "--json"])
        .output()
        .unwrap());
    // Ground truth: packets and bytes per flow per 1 s window from the capture's first packet.
    let (pkts, _) = read_all(&cap).unwrap();
    let t0 = pkts.first().unwrap().1.ts_ns;
    let mut truth: HashMap<(u64, FlowKey), (u64, u64)> = HashMap::new();
    let mut per_window: HashMap<u64, u64> = HashMap::new();
    for (_, p) in &pkts {
        let k = extract(&p.data, LinkType::Ethernet).unwrap().key;
        let w = (p.ts_ns - t0) / 1_000_000_000;
        let e = truth.entry((w, k)).or_default();
        e.0 += 1;
        e.1 += p.data.len() as u64;
        *per_window.entry(w).or_default() += 1;
    }
    let recs = json_lines(&out);
    let mut listed: HashMap<(u64, FlowKey), ()> = HashMap::new();
    for v in recs.iter().filter(|v| v["kind"] == "flow") {
        let k = flow_of(v);
        let w = (v["window_start_ns"].as_u64().unwrap() - t0) / 1_000_000_000;
        let (tp, tb) = truth[&(w, k)];
        let (p, b, bound) = (
            v["packets"].as_u64().unwrap(),
            v["bytes"].as_u64().unwrap(),
            v["error_bound"].as_u64().unwrap(),
        );
        assert!(p <= tp && tp <= p + bound, "window {w} {k}: {p} + {bound} vs {tp}");
        assert!(b <= tb);
        listed.insert((w, k), ());
    }
    for ((w, k), (n, _)) in &truth {
        if *n * 200 >= per_window[w] && per_window[w] >= 16_000 {
            assert!(listed.contains_key(&(*w, *k)), "window {w}: heavy {k} ({n} packets) missed");
        }
    }
    let elephant_loss: u64 = recs
        .iter()
        .filter(|v| v["kind"] == "loss" && v["point"] == "egress")
        .filter(|v| v["flow"]["dport"] == 5201)
        .map(|v| v["lost"].as_u64().unwrap())
        .sum();
    assert!(elephant_loss > 0, "no elephant loss measured");
    let _ = std::fs::remove_dir_all(&d);
}

/// `telemark bench-sketch` prints a whole table (every sketch, both NitroSketch variants, the
/// pipeline at each flow count and its max/min) on a short run, and refuses bad parameters
/// with one line. Rates are not asserted: performance belongs to benchmarks.
#[test]
fn bench_sketch_prints_every_row() {
    let out = ok(&bin()
        .args(["bench-sketch", "--packets", "70000", "--rounds", "1", "--flows", "1,1000"])
        .output()
        .unwrap());
    for name in ["count-min", "count-sketch", "k-ary"] {
        let row = out.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{out}"));
        // vanilla, all-in-one, speedup, separate-thread fast path, overflow
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols.len(), 6, "{row}");
        for c in &cols[1..] {
            let v: f64 = c.trim_end_matches(['×', '%']).parse().unwrap_or_else(|_| panic!("{row}"));
            assert!(v.is_finite() && v >= 0.0, "{row}");
        }
    }
    assert!(
        out.lines().any(|l| l.starts_with("univmon") && l.contains("all-in-one only")),
        "{out}"
    );
    for flows in ["1", "1000"] {
        assert!(out.lines().any(|l| l.split_whitespace().next() == Some(flows)), "{out}");
    }
    assert!(out.lines().any(|l| l.trim_start().starts_with("max/min")), "{out}");
    let o = bin().args(["bench-sketch", "--p", "0"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--p in (0, 1]"), "{err}");
}

/// `gen --bursts` and `bench-int --prefilter` (the INT paper's Figs. 4/5): every threshold
/// has its row, no filtering reports every packet, and the web model's per-hop filter at
/// 100 us reports about the share of packets its bursts over 100 us give (9.7 %, two events
/// each: up and down, on half the packets).
#[test]
fn int_prefiltering_rows_for_every_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("web.pcap");
    let csv = dir.path().join("pre.csv");
    let out = ok(&bin()
        .args(["gen", "--bursts", "web", "--every", "period", "--packets", "40000", "--out"])
        .arg(&trace)
        .output()
        .unwrap());
    assert!(out.contains("40000 INT packets of the web model"), "{out}");
    ok(&bin()
        .args(["bench-int", "--reports", "20000", "--rounds", "1", "--prefilter"])
        .arg(&trace)
        .arg("--csv")
        .arg(&csv)
        .output()
        .unwrap());
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 18, "{text}");
    let share = |det: &str, t: &str| -> f64 {
        let r = rows.iter().find(|r| r[1] == det && r[2] == t).unwrap();
        r[3].parse().unwrap()
    };
    assert_eq!(share("per_hop", "0"), 1.0);
    let at_100 = share("per_hop", "100");
    assert!((0.07..0.13).contains(&at_100), "{at_100}");
    assert!(share("per_hop", "200") < at_100 && share("ewma", "100") < at_100);
    let bad = bin().args(["gen", "--bursts", "dns", "--out"]).arg(&trace).output().unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("web, cache, hadoop"), "{err}");
}

/// `telemark bench --csv` prints one row per flow count and frame size, every variant timed,
/// no flow refused, then the flow-export table, one row per `--export-flows` count with every
/// case timed; bad parameters get one line. Rates are not asserted.
#[test]
fn bench_prints_every_row() {
    let out = ok(&bin()
        .args(["bench", "--csv", "--rounds", "1", "--flows", "4,1024", "--sizes", "64,512"])
        .args(["--export-flows", "1024"])
        .output()
        .unwrap());
    let (loss, export) = out.split_once("\n\n").unwrap_or((&out, ""));
    let rows: Vec<Vec<&str>> = export.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 1, "{out}");
    assert!(export.starts_with("flows,frame_bytes,no_action_ns,pkt_loss_chk_ns,sflow_1:64_ns"));
    for r in &rows {
        assert_eq!(r.len(), 8, "{r:?}");
        for v in &r[2..] {
            let x: f64 = v.parse().unwrap_or_else(|_| panic!("{r:?}"));
            assert!(x.is_finite() && x > 0.0, "{r:?}");
        }
    }
    let rows: Vec<Vec<&str>> = loss.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4, "{out}");
    for r in &rows {
        assert_eq!(r.len(), 10, "{r:?}");
        for v in &r[2..9] {
            let x: f64 = v.parse().unwrap_or_else(|_| panic!("{r:?}"));
            assert!(x.is_finite() && x > 0.0, "{r:?}");
        }
        assert_eq!(r[9], "0", "flows refused: {r:?}");
    }
    let o = bin().args(["bench", "--flows", "0"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--flows must be"), "{err}");
}
