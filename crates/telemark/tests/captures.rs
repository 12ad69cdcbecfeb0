//! Captures as field engineers take them, replayed end to end and checked against tshark:
//! cut by a snapshot length (`editcap -s 96`, as `tcpdump -s 96` writes), damaged at the end,
//! and much larger than memory should hold.
//!
//! Needs `tshark` and `editcap` (`apt-get install tshark`; `.ci/run` installs it). Without them
//! the tests fail: they are never skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary, run from the checkout's root as a user would (so `../shared/testdata`, beside
/// the checkout, is where it looks for the flow-size distribution).
fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_telemark"));
    c.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    c
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("telemark-cap-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run_ok(c: &mut Command) -> String {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// (source, destination, sport, dport) as tshark prints them.
type Tuple = (String, String, u16, u16);

/// Per frame, as tshark dissects it: wire length, captured length and the outer 5-tuple.
/// tshark's exit status is not checked: on a damaged file it prints the frames before the
/// damage and fails.
fn tshark_frames(path: &Path) -> Vec<(u64, u64, Option<Tuple>)> {
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(path)
        .args(["-T", "fields", "-E", "separator=\t", "-E", "occurrence=f"])
        .args(["-e", "frame.len", "-e", "frame.cap_len", "-e", "ip.src", "-e", "ip.dst"])
        .args(["-e", "ipv6.src", "-e", "ipv6.dst", "-e", "tcp.srcport", "-e", "tcp.dstport"])
        .args(["-e", "udp.srcport", "-e", "udp.dstport"])
        .output()
        .expect("tshark must be installed for this test (apt-get install tshark)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let g = |i: usize| f.get(i).copied().unwrap_or("");
            let src = if g(2).is_empty() { g(4) } else { g(2) };
            let dst = if g(3).is_empty() { g(5) } else { g(3) };
            let port = |a: usize, b: usize| {
                let s = if g(a).is_empty() { g(b) } else { g(a) };
                s.parse::<u16>().unwrap_or(0)
            };
            let key = (!src.is_empty())
                .then(|| (src.to_string(), dst.to_string(), port(6, 8), port(7, 9)));
            (g(0).parse().unwrap(), g(1).parse().unwrap(), key)
        })
        .collect()
}

fn json_lines(s: &str) -> Vec<serde_json::Value> {
    s.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// A capture cut to 96 bytes a packet replays completely: tshark's packet count, every
/// frame's cut counted, and each listed flow's bytes are its packets' wire lengths as tshark
/// gives them, not the captured bytes.
#[test]
fn a_snaplen_cut_capture_replays_every_packet_at_wire_bytes() {
    let dir = tmpdir("snaplen");
    let full = dir.join("full.pcap");
    let cut = dir.join("cut.pcap");
    run_ok(bin().args(["gen", "--flows", "80", "--seed", "11", "-o"]).arg(&full));
    run_ok(Command::new("editcap").args(["-s", "96"]).arg(&full).arg(&cut));
    let frames = tshark_frames(&cut);
    let n_cut = frames.iter().filter(|(len, cap, _)| len > cap).count() as u64;
    assert!(n_cut > frames.len() as u64 / 2, "the capture should be mostly cut: {n_cut}");
    let mut truth: HashMap<Tuple, (u64, u64)> = HashMap::new();
    for (len, _, key) in &frames {
        let t = truth.entry(key.clone().expect("every generated frame is IP")).or_default();
        t.0 += 1;
        t.1 += len;
    }
    let out = run_ok(
        bin().args(["replay", "--json", "--top-flows", "100000", "--hh-window", "1000s"]).arg(&cut),
    );
    let recs = json_lines(&out);
    let cap = recs.iter().find(|r| r["kind"] == "capture").expect("a capture record");
    assert_eq!(cap["packets"].as_u64(), Some(frames.len() as u64));
    assert_eq!(cap["cut"].as_u64(), Some(n_cut));
    assert_eq!(cap["complete"], true);
    assert!(cap["skipped"].as_object().unwrap().is_empty(), "{cap}");
    let mut listed = 0;
    for r in recs.iter().filter(|r| r["kind"] == "flow") {
        let f = &r["flow"];
        let key = (
            f["src"].as_str().unwrap().to_string(),
            f["dst"].as_str().unwrap().to_string(),
            f["sport"].as_u64().unwrap() as u16,
            f["dport"].as_u64().unwrap() as u16,
        );
        let (pkts, bytes) = truth[&key];
        assert_eq!(r["truth_packets"].as_u64(), Some(pkts), "{r}");
        assert_eq!(r["truth_bytes"].as_u64(), Some(bytes), "{r}");
        if r["exact"] == true {
            assert_eq!(r["bytes"].as_u64(), Some(bytes), "{r}");
        }
        listed += 1;
    }
    assert!(listed >= 5, "only {listed} flows listed");
    std::fs::remove_dir_all(&dir).ok();
}

/// A capture whose last record is cut in the middle: what came before is replayed (as many
/// packets as tshark reads), and the JSON output and the exit status (3) say the file is
/// damaged and where.
#[test]
fn a_damaged_capture_says_so_in_the_output_and_the_exit_status() {
    let dir = tmpdir("damaged");
    let full = dir.join("full.pcap");
    run_ok(bin().args(["gen", "--flows", "30", "--seed", "4", "-o"]).arg(&full));
    let bytes = std::fs::read(&full).unwrap();
    let broken = dir.join("broken.pcap");
    std::fs::write(&broken, &bytes[..bytes.len() - 700]).unwrap();
    let tshark = tshark_frames(&broken).len() as u64;
    let o = bin().args(["replay", "--json"]).arg(&broken).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));
    let recs = json_lines(&String::from_utf8_lossy(&o.stdout));
    let cap = &recs[0];
    assert_eq!(cap["kind"], "capture");
    assert_eq!(cap["complete"], false);
    assert_eq!(cap["packets"].as_u64(), Some(tshark));
    assert!(cap["damaged"].as_str().unwrap().contains("at byte"), "{cap}");
    assert!(recs.iter().any(|r| r["kind"] == "summary"), "results for what was read");
    assert!(String::from_utf8_lossy(&o.stderr).contains("damaged record"));
    // The text output too.
    let o = bin().args(["replay"]).arg(&broken).output().unwrap();
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("{tshark} packets")));
    std::fs::remove_dir_all(&dir).ok();
}

/// A capture of a link type Telemark does not read is an error that names it.
#[test]
fn an_unreadable_link_type_is_named() {
    let dir = tmpdir("linktype");
    let p = dir.join("radiotap.pcap");
    let mut f = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    f.extend_from_slice(&65535u32.to_le_bytes());
    f.extend_from_slice(&127u32.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&4u32.to_le_bytes());
    f.extend_from_slice(&4u32.to_le_bytes());
    f.extend_from_slice(&[0, 0, 4, 0]);
    std::fs::write(&p, &f).unwrap();
    let o = bin().args(["replay", "--json"]).arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("radiotap (LINKTYPE 127)") && e.contains("it reads"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Peak resident memory of a replay does not grow with the capture: a capture of 400 MB
/// replays in well under 200 MB (the agent-sized tables and one record at a time).
#[test]
fn replay_streams_a_large_capture_in_bounded_memory() {
    use telemark_datapath::capture::CaptureWriter;
    let dir = tmpdir("large");
    let p = dir.join("large.pcap");
    let small = dir.join("small.pcap");
    run_ok(
        bin()
            .args(["gen", "--flows", "200", "--seed", "2", "--max-packets", "400", "-o"])
            .arg(&small),
    );
    let (pkts, _) = telemark_datapath::capture::read_all(&small).unwrap();
    // The generated packets over and over, later each time, to 400 MB.
    let mut w = CaptureWriter::create(&p).unwrap();
    let (mut written, mut round) = (0u64, 0u64);
    while written < 400 << 20 {
        for (_, pk) in &pkts {
            w.write(pk.ts_ns + round * 2_000_000_000, &pk.data).unwrap();
            written += 16 + pk.data.len() as u64;
        }
        round += 1;
    }
    w.finish().unwrap();
    // The child's high-water mark of resident memory (VmHWM), read until it exits; its JSON
    // output goes to a file, read afterwards.
    let out = dir.join("out.json");
    let mut child = bin()
        .args(["replay", "--json"])
        .arg(&p)
        .stdout(std::fs::File::create(&out).unwrap())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        if let Ok(s) = std::fs::read_to_string(&status) {
            if let Some(kb) = s.lines().find_map(|l| l.strip_prefix("VmHWM:")) {
                let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                peak = peak.max(kb * 1024);
            }
        }
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The memory was measured, and the whole file was replayed.
    assert!(peak > 1 << 20, "no resident memory read for the replay: {peak}");
    assert!(peak < 200 << 20, "peak RSS {} MB replaying {} MB", peak >> 20, written >> 20);
    let text = std::fs::read_to_string(&out).unwrap();
    let cap: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(cap["packets"].as_u64(), Some(round * pkts.len() as u64), "{cap}");
    assert_eq!(cap["complete"], true);
    std::fs::remove_dir_all(&dir).ok();
}
