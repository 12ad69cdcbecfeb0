//! The collector under a flood: agents posting as fast as they can, with full-size valid batches,
//! maximal garbage bodies and lying Content-Lengths mixed in. The collector runs as its own
//! process so the kernel's view of its memory (VmRSS in /proc) is the ground truth: it must level
//! off while the data posted keeps growing, every good record must be stored, and the collector
//! must keep answering.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FLOODERS: usize = 4;
const RECORDS_PER_BATCH: u64 = 5_000;
const MAX_BODY: usize = 8 << 20;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `telemark collector` on a free loopback port; returns it and its address.
fn start_collector(db: &std::path::Path) -> (Proc, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["collector", "--listen", "127.0.0.1:0", "--retention", "0", "--workers", "4"])
        .arg("--db")
        .arg(db)
        .stderr(Stdio::piped())
        .spawn()
        .expect("collector starts");
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (Proc(child), addr)
}

/// Resident memory of a process in bytes, from /proc.
fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn post(agent: &ureq::Agent, url: &str, body: &[u8]) -> u16 {
    match agent.post(url).set("Content-Type", "application/json").send_bytes(body) {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("POST {url}: {e}"),
    }
}

/// One ingest body of `RECORDS_PER_BATCH` loss records starting at `seq`, dated an hour ago (the
/// collector refuses records from long ago or the future).
fn batch(name: &str, seq: u64) -> Vec<u8> {
    let hour_ago =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64
            - 3_600_000_000_000;
    let records: Vec<serde_json::Value> = (seq..seq + RECORDS_PER_BATCH)
        .map(|b| {
            serde_json::json!({
                "kind": "loss", "agent": name, "port": "p1", "point": "ingress",
                "flow": {"src": "10.0.0.1", "dst": "10.0.0.7", "sport": 40000 + b % 1000,
                         "dport": 5201, "proto": 17},
                "color": b % 2, "batch": b, "first_ns": hour_ago + b, "last_ns": hour_ago + 1 + b,
                "expected": 100, "observed": 99, "lost": 1, "late": 0,
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "agent": name, "boot": 1, "seq": seq, "records": records,
    }))
    .unwrap()
}

/// A request announcing a 1 GiB body and sending none of it: must be refused at once.
fn lying_length(addr: SocketAddr) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: 1073741824\r\n\r\n"
    )
    .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    String::from_utf8_lossy(&head[9..12]).parse().unwrap_or(0)
}

#[derive(Default)]
struct Tally {
    posted_bytes: AtomicU64,
    acked_records: AtomicU64,
    ok: AtomicU64,
    rejected: AtomicU64,
    unexpected: AtomicU64,
}

#[test]
fn collector_memory_stays_bounded_under_a_flood() {
    let dir = tempfile::tempdir().unwrap();
    let (proc, addr) = start_collector(&dir.path().join("flood.db"));
    let pid = proc.0.id();
    let base = format!("http://{addr}");
    let idle_rss = rss(pid);

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let garbage = Arc::new(vec![b'['; MAX_BODY]);
    let mut threads = Vec::new();
    for t in 0..FLOODERS {
        let (stop, tally, garbage, base) =
            (stop.clone(), tally.clone(), garbage.clone(), base.clone());
        threads.push(std::thread::spawn(move || {
            let http = ureq::AgentBuilder::new().timeout(Duration::from_secs(60)).build();
            let name = format!("flood-{t}");
            let reg = serde_json::json!({"agent": name, "version": "test", "boot": 1}).to_string();
            assert_eq!(post(&http, &format!("{base}/api/v1/agents"), reg.as_bytes()), 200);
            let ingest = format!("{base}/api/v1/ingest");
            let (mut seq, mut i) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let (body, want) =
                    if i % 3 == 0 { (garbage.to_vec(), 400) } else { (batch(&name, seq), 200) };
                let status = post(&http, &ingest, &body);
                tally.posted_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                if status == want && want == 200 {
                    seq += RECORDS_PER_BATCH;
                    tally.acked_records.fetch_add(RECORDS_PER_BATCH, Ordering::Relaxed);
                    tally.ok.fetch_add(1, Ordering::Relaxed);
                } else if status == want {
                    tally.rejected.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.unexpected.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    // Sample the collector's memory while the flood runs; check it still answers queries and
    // refuses a lying Content-Length at once.
    let started = Instant::now();
    let run = Duration::from_secs(12);
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let mut liars = Vec::new();
    while started.elapsed() < run {
        std::thread::sleep(Duration::from_millis(250));
        samples.push((started.elapsed().as_secs_f64(), rss(pid)));
        if samples.len().is_multiple_of(8) {
            liars.push(lying_length(addr));
            let r = ureq::get(&format!("{base}/api/v1/agents")).call().expect("answers queries");
            assert_eq!(r.status(), 200);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("flooder");
    }

    let posted = tally.posted_bytes.load(Ordering::Relaxed);
    let acked = tally.acked_records.load(Ordering::Relaxed);
    let (ok, rejected) = (tally.ok.load(Ordering::Relaxed), tally.rejected.load(Ordering::Relaxed));
    let half = samples.len() / 2;
    let peak_first = samples[..half].iter().map(|s| s.1).max().unwrap();
    let peak_second = samples[half..].iter().map(|s| s.1).max().unwrap();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "flood: {:.0} MiB posted in {ok} good and {rejected} garbage requests, {acked} records \
         acknowledged; collector RSS idle {:.1} MiB, peak first half {:.1} MiB, second half {:.1} MiB",
        mib(posted),
        mib(idle_rss),
        mib(peak_first),
        mib(peak_second)
    );
    assert_eq!(tally.unexpected.load(Ordering::Relaxed), 0, "every request answered as expected");
    assert!(liars.iter().all(|s| *s == 413), "lying Content-Length refused: {liars:?}");
    assert!(ok >= 8 && rejected >= 4, "the flood was a flood: {ok} good, {rejected} garbage");

    // Bounded: the second half of the flood does not grow the collector beyond what the first
    // half reached (allowing 16 MiB of allocator noise), and the peak stays within what the
    // configured bounds allow: 4 workers each holding one 8 MiB body and its parsed records.
    assert!(
        peak_second <= peak_first + (16 << 20),
        "collector memory grew under the flood: {:.1} → {:.1} MiB",
        mib(peak_first),
        mib(peak_second)
    );
    assert!(peak_second < 256 << 20, "collector peak {:.1} MiB", mib(peak_second));
    assert!(posted > 2 * peak_second, "posted {:.0} MiB", mib(posted));

    // Nothing acknowledged was lost: the database holds every acknowledged record.
    let m = ureq::get(&format!("{base}/metrics")).call().unwrap().into_string().unwrap();
    let stored: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("telemark_collector_stored_records{table=\"loss\"} "))
        .and_then(|v| v.parse().ok())
        .expect("stored_records metric");
    assert_eq!(stored, acked, "acknowledged records stored");
}
