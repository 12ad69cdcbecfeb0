//! The collector over real HTTP on loopback: durable, deduplicated ingest across a restart;
//! clear 4xx errors and counters for bad input; loss series and localisation from what agents
//! sent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use telemark_collector::{Collector, Config};
use telemark_core::records::{Flow, LossRecord, Record, Scope};
use telemark_transport::exporter::Exporter;
use telemark_transport::server::Limits;

fn flow(sport: u16) -> Flow {
    Flow {
        src: "10.0.0.1".into(),
        dst: "10.0.0.7".into(),
        sport,
        dport: 5201,
        proto: 17,
        spi: None,
        si: None,
    }
}

fn loss(agent: &str, point: &str, upstream: Option<&str>, batch: u64, lost: u64) -> Record {
    Record::Loss(LossRecord {
        agent: agent.into(),
        port: "p1".into(),
        point: point.into(),
        upstream: upstream.map(str::to_string),
        flow: flow(40000),
        color: (batch % 2) as u8,
        batch,
        period_ns: None,
        first_ns: base_ns() + batch * 10_000_000,
        last_ns: base_ns() + batch * 10_000_000 + 9_000_000,
        expected: Some(100),
        observed: 100 - lost,
        lost,
        late: 0,
        uncertain: 0,
        // A point with no upstream in its agent measures against B, from the marking.
        scope: if upstream.is_some() { Scope::Segment } else { Scope::Path },
        tail: false,
        incomplete: false,
        drops: Vec::new(),
        ttl: None,
        own_colour: 0,
    })
}

/// A minute ago, on a whole second (inside the default retention, as live records are).
fn base_ns() -> u64 {
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| (telemark_collector::now_ns() / 1_000_000_000 - 60) * 1_000_000_000)
}

fn start(db: &std::path::Path, listen: SocketAddr) -> Collector {
    let cfg = Config { listen, db: db.to_path_buf(), workers: 2, ..Config::default() };
    Collector::start(&cfg).expect("collector starts")
}

/// Status and body of a request, error statuses included.
fn send(method: &str, addr: SocketAddr, path: &str, body: &[u8]) -> (u16, String) {
    let r = ureq::request(method, &format!("http://{addr}{path}"))
        .set("Content-Type", "application/json")
        .send_bytes(body);
    match r {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap()),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// The status line's code of the answer to `bytes` sent raw (as much of them as the server
/// reads before it answers).
fn raw_status(addr: SocketAddr, bytes: &[u8]) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    String::from_utf8_lossy(&head[9..12]).parse().unwrap_or(0)
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    send("GET", addr, path, b"")
}

fn metric(addr: SocketAddr, line_prefix: &str) -> u64 {
    let (_, m) = get(addr, "/metrics");
    m.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The agent's view is the ground truth: every record it pushed (and the collector did not
/// refuse) is stored exactly once, across a collector restart in the middle of the run and a
/// batch sent twice.
#[test]
fn restart_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let c = start(&db, "127.0.0.1:0".parse().unwrap());
    let addr = c.addr;
    let mut ex = Exporter::new(&format!("http://{addr}"), "sw-b", 42, 100_000);
    let mut sent: BTreeMap<u64, u64> = BTreeMap::new();
    for b in 0..500 {
        assert!(ex.push(loss("sw-b", "egress", Some("ingress"), b, b % 7)));
        sent.insert(b, b % 7);
    }
    assert_eq!(ex.flush().unwrap(), 500);
    // The collector dies; the agent keeps closing batches, and its flushes fail.
    c.stop();
    for b in 500..800 {
        ex.push(loss("sw-b", "egress", Some("ingress"), b, b % 5));
        sent.insert(b, b % 5);
    }
    assert!(ex.flush().is_err());
    assert_eq!(ex.pending(), 300);
    // Back on the same address and database.
    let c = start(&db, addr);
    assert_eq!(ex.flush().unwrap(), 300);
    assert_eq!((ex.pending(), ex.dropped), (0, 0));
    // A batch whose acknowledgement was lost comes again: stored once.
    let again = serde_json::json!({
        "agent": "sw-b", "boot": 42, "seq": 10,
        "records": [loss("sw-b", "egress", Some("ingress"), 10, 10 % 7)],
    });
    let (s, body) = send("POST", addr, "/api/v1/ingest", again.to_string().as_bytes());
    assert_eq!(s, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((v["accepted"].as_u64(), v["duplicates"].as_u64()), (Some(0), Some(1)));
    // What is stored is what was sent, once each.
    let (stored_loss, _) = c.api.store().counts().unwrap();
    assert_eq!(stored_loss, 800);
    let q = "src=10.0.0.1&dst=10.0.0.7&sport=40000&dport=5201&proto=17&bucket_ns=1000000000000";
    let (s, body) = get(addr, &format!("/api/v1/loss?{q}"));
    assert_eq!(s, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let lost: u64 =
        v["series"].as_array().unwrap().iter().map(|p| p["lost"].as_u64().unwrap()).sum();
    assert_eq!(lost, sent.values().sum::<u64>());
    assert_eq!(metric(addr, "telemark_collector_duplicates_total"), 1);
}

/// A full buffer drops new records, counts them, and tells the collector.
#[test]
fn full_buffer_drops_are_counted_and_visible() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(&dir.path().join("t.db"), "127.0.0.1:0".parse().unwrap());
    let mut ex = Exporter::new(&format!("http://{}", c.addr), "sw-f", 1, 10);
    let accepted = (0..25).filter(|b| ex.push(loss("sw-f", "ingress", None, *b, 1))).count();
    assert_eq!((accepted, ex.dropped), (10, 15));
    ex.flush().unwrap();
    assert_eq!(
        metric(c.addr, "telemark_collector_agent_export_dropped_records_total{agent=\"sw-f\"}"),
        15
    );
    let (_, agents) = get(c.addr, "/api/v1/agents");
    let v: serde_json::Value = serde_json::from_str(&agents).unwrap();
    assert_eq!(v[0]["agent"]["export_dropped"], 15);
    assert_eq!(v[0]["healthy"], true);
}

/// Bad input of every kind: a clear 4xx with a JSON error, a counter, no crash, and the
/// collector goes on storing good records.
#[test]
fn bad_input_gets_clear_errors_and_counters() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: dir.path().join("t.db"),
        limits: Limits { max_body: 64 * 1024, ..Limits::default() },
        workers: 2,
        ..Config::default()
    };
    let c = Collector::start(&cfg).unwrap();
    let a = c.addr;
    let cases: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        ("POST", "/api/v1/ingest", b"{not json".to_vec(), 400, "bad ingest request"),
        ("POST", "/api/v1/ingest", vec![0xff, 0xfe, 0x00], 400, "bad ingest request"),
        (
            "POST",
            "/api/v1/ingest",
            br#"{"agent":"x","boot":1,"seq":0,"records":[{"kind":"loss"}]}"#.to_vec(),
            400,
            "missing field",
        ),
        (
            "POST",
            "/api/v1/ingest",
            br#"{"agent":"ghost","boot":1,"seq":0,"records":[]}"#.to_vec(),
            409,
            "unknown agent",
        ),
        (
            "POST",
            "/api/v1/agents",
            br#"{"agent":"a\"b","version":"1","boot":1}"#.to_vec(),
            400,
            "agent names",
        ),
        (
            "POST",
            "/api/v1/agents",
            br#"{"agent":"ok","version":"1","boot":1,"extra":1}"#.to_vec(),
            400,
            "unknown field",
        ),
        ("DELETE", "/api/v1/flows", vec![], 405, "not allowed"),
        ("GET", "/api/v1/nope", vec![], 404, "no such endpoint"),
        ("GET", "/api/v1/loss?src=10.0.0.1", vec![], 400, "missing dst"),
        ("GET", "/api/v1/events?sport=5301", vec![], 400, "missing src"),
        (
            "GET",
            "/api/v1/loss?src=banana&dst=1.1.1.1&sport=1&dport=2&proto=6",
            vec![],
            400,
            "bad src",
        ),
        ("GET", "/api/v1/localise?src=%zz", vec![], 400, "percent"),
        ("GET", "/api/v1/flows?limit=-3", vec![], 400, "limit"),
        (
            "GET",
            "/api/v1/link?src=10.0.0.1&dst=10.0.0.7&sport=1&dport=2&proto=17&down=sw-f/ingress",
            vec![],
            400,
            "missing up",
        ),
        (
            "GET",
            "/api/v1/link?src=10.0.0.1&dst=10.0.0.7&sport=1&dport=2&proto=17&up=sw-b&down=a/b",
            vec![],
            400,
            "bad up",
        ),
    ];
    for (method, path, body, status, msg) in &cases {
        let (s, text) = send(method, a, path, body);
        assert_eq!(s, *status, "{method} {path}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON error body");
        assert!(v["error"].as_str().unwrap().contains(msg), "{method} {path}: {text}");
    }
    assert_eq!(metric(a, "telemark_collector_errors_total{reason=\"unknown_agent\"}"), 1);
    assert_eq!(metric(a, "telemark_collector_errors_total{reason=\"bad_json\"}"), 3);
    // A request that parses, with a record that does not.
    assert_eq!(metric(a, "telemark_collector_errors_total{reason=\"bad_record\"}"), 1);
    // Too large: refused on its Content-Length before a byte of the body is read, or, without
    // one, once the chunks pass the limit.
    let head = |extra: &str| {
        format!("POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}\r\n")
    };
    assert_eq!(raw_status(a, head("Content-Length: 102400\r\n").as_bytes()), 413);
    let mut chunked = head("Transfer-Encoding: chunked\r\n").into_bytes();
    for _ in 0..100 {
        chunked.extend_from_slice(b"400\r\n");
        chunked.extend_from_slice(&[b' '; 1024]);
        chunked.extend_from_slice(b"\r\n");
    }
    assert_eq!(raw_status(a, &chunked), 413);
    assert_eq!(metric(a, "telemark_collector_http_refused_total{reason=\"body_too_large\"}"), 2);
    // Still serving, and storing.
    let mut ex = Exporter::new(&format!("http://{a}"), "good", 1, 10);
    ex.push(loss("good", "ingress", None, 1, 3));
    assert_eq!(ex.flush().unwrap(), 1);
    assert_eq!(c.api.store().counts().unwrap().0, 1);
    // The page is served, and draws from the API.
    let (s, page) = get(a, "/");
    assert_eq!(s, 200);
    assert!(page.contains(r#"<script src="/console.js">"#));
    let (s, page) = get(a, "/console.js");
    assert_eq!(s, 200);
    for endpoint in ["/api/v1/flows", "/api/v1/overview", "/api/v1/localise", "/api/v1/agents"] {
        assert!(page.contains(endpoint), "the page does not use {endpoint}");
    }
}

/// Loss reported at two switches: localisation names the segment that lost the packets, and
/// counts what the downstream switch measured from the marking once.
#[test]
fn localisation_names_the_lossy_segment() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(&dir.path().join("t.db"), "127.0.0.1:0".parse().unwrap());
    let mut b = Exporter::new(&format!("http://{}", c.addr), "sw-b", 1, 1000);
    let mut f = Exporter::new(&format!("http://{}", c.addr), "sw-f", 1, 1000);
    for n in 0..40 {
        // A little loss inside switch B, a lot on the link into switch F, whose ingress
        // counts against B what was lost since the marking: B's loss too.
        let inside_b = u64::from(n % 10 == 0);
        if inside_b > 0 {
            b.push(loss("sw-b", "egress", Some("ingress"), n, inside_b));
        }
        // It sees each batch 300 µs after sw-b: the collector finds sw-b upstream by that.
        let mut r = loss("sw-f", "ingress", None, n, 5 + n % 3 + inside_b);
        if let Record::Loss(l) = &mut r {
            (l.first_ns, l.last_ns) = (l.first_ns + 300_000, l.last_ns + 300_000);
        }
        f.push(r);
    }
    b.flush().unwrap();
    f.flush().unwrap();
    let (s, body) =
        get(c.addr, "/api/v1/localise?src=10.0.0.1&dst=10.0.0.7&sport=40000&dport=5201&proto=17");
    assert_eq!(s, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let truth_f: u64 = (0..40).map(|n| 5 + n % 3).sum();
    assert_eq!(v["lost"].as_u64().unwrap(), truth_f + 4);
    assert_eq!(v["verdict"]["agent"], "sw-f");
    assert_eq!(v["verdict"]["point"], "ingress");
    assert_eq!(v["verdict"]["lost"].as_u64().unwrap(), truth_f);
    let (_, flows) = get(c.addr, "/api/v1/flows");
    let fl: serde_json::Value = serde_json::from_str(&flows).unwrap();
    assert_eq!(fl[0]["lost"].as_u64().unwrap(), truth_f + 4);
    assert!(v["verdict"]["caveat"].is_null(), "no ring drops, no caveat: {v}");
    // sw-f reports that its own receive ring dropped frames: the verdict says its loss may
    // be the switch's, and sw-b's ring drops do not concern it.
    let health = |agent: &str, drops: u64| {
        Record::Health(telemark_core::records::HealthRecord {
            agent: agent.into(),
            interval_start_ns: base_ns(),
            interval_end_ns: base_ns() + 1_000_000_000,
            rx: 1000,
            rx_ring_drops: drops,
            ..Default::default()
        })
    };
    b.push(health("sw-b", 900));
    f.push(health("sw-f", 37));
    f.push(health("sw-f", 0));
    b.flush().unwrap();
    f.flush().unwrap();
    let (_, body) =
        get(c.addr, "/api/v1/localise?src=10.0.0.1&dst=10.0.0.7&sport=40000&dport=5201&proto=17");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let caveat = v["verdict"]["caveat"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(caveat.contains("sw-f dropped 37 frames"), "{caveat}");
}

/// Retention deletes what is older than the configured age, and nothing younger.
#[test]
fn retention_deletes_old_records_only() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: dir.path().join("t.db"),
        // The periodic pass is off here so that it cannot race the test; it calls the same
        // `expire` once a minute.
        retention: Duration::ZERO,
        ..Config::default()
    };
    let c = Collector::start(&cfg).unwrap();
    let mut ex = Exporter::new(&format!("http://{}", c.addr), "sw-b", 1, 1000);
    let mut old = loss("sw-b", "ingress", None, 0, 1);
    if let Record::Loss(l) = &mut old {
        l.first_ns -= 3_600_000_000_000;
    }
    ex.push(old);
    ex.push(loss("sw-b", "ingress", None, 1, 1));
    ex.flush().unwrap();
    let cut = base_ns() - 1_000_000_000;
    let removed = c.api.store().expire(cut).unwrap();
    assert_eq!(removed, 1);
    assert_eq!(c.api.store().counts().unwrap().0, 1);
}

/// The loss counters come from what is stored: a request posted three times (retries) counts
/// once, per span (agent, point, where it is measured from).
#[test]
fn loss_metrics_count_stored_records_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(&dir.path().join("t.db"), "127.0.0.1:0".parse().unwrap());
    let a = c.addr;
    let (s, _) = send("POST", a, "/api/v1/agents", br#"{"agent":"sw-f","version":"1","boot":1}"#);
    assert_eq!(s, 200);
    let records: Vec<Record> = (0..10).map(|b| loss("sw-f", "ingress", None, b, 3)).collect();
    let body = serde_json::json!({"agent": "sw-f", "boot": 1, "seq": 0, "records": records});
    for _ in 0..3 {
        let (s, text) = send("POST", a, "/api/v1/ingest", body.to_string().as_bytes());
        assert_eq!(s, 200, "{text}");
    }
    let span = "{agent=\"sw-f\",point=\"ingress\",from=\"marker\"}";
    assert_eq!(metric(a, &format!("telemark_loss_lost_packets_total{span}")), 30);
    assert_eq!(metric(a, &format!("telemark_loss_expected_packets_total{span}")), 1000);
    assert_eq!(metric(a, &format!("telemark_loss_lossy_batches_total{span}")), 10);
    assert_eq!(metric(a, "telemark_collector_duplicates_total"), 20);
    // What the store holds, summed independently of the metrics.
    let stored: u64 = c
        .api
        .store()
        .points(&flow(40000), 0)
        .unwrap()
        .iter()
        .flat_map(|p| p.batches.iter().map(|b| b.observed))
        .sum();
    assert_eq!(stored, 970);
}

/// The database file removed or replaced under a running collector: writes are refused with
/// 503 (the agent keeps its records and retries), /readyz and the metric say so; a damaged
/// file is refused at start with a message that says what to do.
#[test]
fn storage_failures_are_seen_not_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let c = start(&db, "127.0.0.1:0".parse().unwrap());
    let url = format!("http://{}", c.addr);
    let mut ex = Exporter::new(&url, "sw-b", 1, 100);
    ex.push(loss("sw-b", "ingress", None, 0, 1));
    assert_eq!(ex.flush().unwrap(), 1);
    assert_eq!(get(c.addr, "/readyz").0, 200);
    assert_eq!(get(c.addr, "/healthz").0, 200);
    for f in ["t.db", "t.db-wal", "t.db-shm"] {
        let _ = std::fs::remove_file(dir.path().join(f));
    }
    ex.push(loss("sw-b", "ingress", None, 1, 1));
    match ex.flush() {
        Err(telemark_transport::exporter::ExportError::Rejected { status: 503, body }) => {
            assert!(body.contains("removed or replaced"), "{body}")
        }
        other => panic!("a write to a removed database was answered {other:?}"),
    }
    assert_eq!(ex.pending(), 1, "the agent keeps the record");
    let (s, body) = get(c.addr, "/readyz");
    assert_eq!(s, 503, "{body}");
    assert_eq!(get(c.addr, "/healthz").0, 200, "the process itself is alive");
    assert_eq!(metric(c.addr, "telemark_collector_storage_ready"), 0);
    assert_eq!(
        metric(c.addr, "telemark_collector_errors_total{reason=\"database_unavailable\"}"),
        1
    );
    drop(c);

    // Replaced: another file moved over the path.
    let db2 = dir.path().join("u.db");
    let c = start(&db2, "127.0.0.1:0".parse().unwrap());
    std::fs::write(dir.path().join("other"), b"x").unwrap();
    std::fs::rename(dir.path().join("other"), &db2).unwrap();
    let mut ex = Exporter::new(&format!("http://{}", c.addr), "sw-b", 1, 100);
    ex.push(loss("sw-b", "ingress", None, 0, 1));
    assert!(matches!(
        ex.flush(),
        Err(telemark_transport::exporter::ExportError::Rejected { status: 503, .. })
    ));
    drop(c);

    // Damaged: a page of a real database overwritten; and a file that is no database at all.
    let db3 = dir.path().join("v.db");
    let c = start(&db3, "127.0.0.1:0".parse().unwrap());
    let mut ex = Exporter::new(&format!("http://{}", c.addr), "sw-b", 1, 10_000);
    for b in 0..3000 {
        ex.push(loss("sw-b", "ingress", None, b, 1));
    }
    ex.flush().unwrap();
    c.stop();
    let mut bytes = std::fs::read(&db3).unwrap();
    assert!(bytes.len() > 3 * 4096, "{} bytes", bytes.len());
    bytes[2 * 4096..3 * 4096].iter_mut().enumerate().for_each(|(n, b)| *b = (n * 7) as u8);
    std::fs::write(&db3, &bytes).unwrap();
    let cfg = |db: &std::path::Path| Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: db.to_path_buf(),
        ..Config::default()
    };
    let e = Collector::start(&cfg(&db3)).err().expect("a damaged database is refused").to_string();
    assert!(e.contains("damaged") && e.contains("backup"), "{e}");
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![0x42u8; 8192]).unwrap();
    let e = Collector::start(&cfg(&junk))
        .err()
        .expect("a file that is no database is refused")
        .to_string();
    assert!(e.contains("damaged"), "{e}");
}

/// Queries for programs: time windows in ns or RFC 3339, unknown parameters refused,
/// protocol names, 64-bit integers as strings on request, pages linked (RFC 8288).
#[test]
fn queries_take_windows_names_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(&dir.path().join("t.db"), "127.0.0.1:0".parse().unwrap());
    let a = c.addr;
    let mut ex = Exporter::new(&format!("http://{a}"), "sw-f", 1, 1000);
    // Five flows, flow n losing n packets in each of its 4 batches (10 ms apart).
    for sport in 40001..=40005u16 {
        for b in 0..4 {
            let mut r = loss("sw-f", "ingress", None, b, u64::from(sport - 40000));
            if let Record::Loss(l) = &mut r {
                l.flow = flow(sport);
            }
            ex.push(r);
        }
    }
    ex.flush().unwrap();
    let flows = |q: &str| {
        let r = ureq::get(&format!("http://{a}/api/v1/flows{q}")).call().unwrap();
        let link = r.header("Link").map(str::to_string);
        (r.into_json::<serde_json::Value>().unwrap(), link)
    };
    let (all, link) = flows("");
    assert_eq!(all.as_array().unwrap().len(), 5);
    assert_eq!(all[0]["flow"]["sport"], 40005, "most lost first");
    assert_eq!(all[0]["lost"], 20);
    assert_eq!(all[0]["packets"], 400);
    assert_eq!(all[0]["ratio"], 0.05);
    assert!(link.is_none());
    // Pages of two, each linking the next.
    let (p1, link) = flows("?limit=2");
    let sports = |v: &serde_json::Value| -> Vec<u64> {
        v.as_array().unwrap().iter().map(|f| f["flow"]["sport"].as_u64().unwrap()).collect()
    };
    assert_eq!(sports(&p1), [40005, 40004]);
    let next = link.expect("a Link to the next page");
    let next = next.trim_start_matches('<').split('>').next().unwrap();
    let (p2, _) = flows(&next["/api/v1/flows".len()..]);
    assert_eq!(sports(&p2), [40003, 40002]);
    // A window: RFC 3339 and ns agree; a window before the batches holds nothing.
    let t0 = base_ns();
    let rfc = |ns: u64| {
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ns))
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let (w, _) = flows(&format!("?from={}&to={}", rfc(t0), rfc(t0 + 15_000_000)));
    assert_eq!(w[0]["packets"], 200, "two of four batches start in the window: {w}");
    let (w, _) = flows(&format!("?from={t0}&to={}", t0 + 15_000_000));
    assert_eq!(w[0]["packets"], 200);
    let (w, _) = flows(&format!("?from={}&to={t0}", t0 - 1_000_000_000));
    assert!(w.as_array().unwrap().is_empty());
    // Protocol names, and integers beyond 2^53 as strings.
    let q = "src=10.0.0.1&dst=10.0.0.7&sport=40005&dport=5201";
    let (s, body) = get(a, &format!("/api/v1/loss?{q}&proto=udp&ints=string"));
    assert_eq!(s, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let t = &v["series"][0]["t_ns"];
    assert!(t.is_string() && t.as_str().unwrap().parse::<u64>().unwrap() >= t0, "{v}");
    assert_eq!(v["series"][0]["lost"], 20, "small integers stay numbers");
    // Refused, with the reason.
    for (q, says) in [
        ("/api/v1/flows?limt=5", "unknown parameter"),
        ("/api/v1/flows?from=yesterday", "RFC 3339"),
        ("/api/v1/flows?from=20&to=10", "must be before"),
        (&format!("/api/v1/loss?{q}&proto=carrier-pigeon"), "bad protocol"),
    ] {
        let (s, body) = get(a, q);
        assert_eq!(s, 400, "{q}: {body}");
        assert!(body.contains(says), "{q}: {body}");
    }
}

/// Two agents given one name: the newer run keeps the name, the older is refused and told why
/// (before, both were stored under the name, their sequence numbers colliding); an agent that
/// restarts (a newer run) is taken at once.
#[test]
fn two_agents_with_one_name_do_not_both_write() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(&dir.path().join("t.db"), "127.0.0.1:0".parse().unwrap());
    let url = format!("http://{}", c.addr);
    let mut older = Exporter::new(&url, "sw-x", 100, 10);
    older.push(loss("sw-x", "ingress", None, 0, 1));
    assert_eq!(older.flush().unwrap(), 1);
    let mut newer = Exporter::new(&url, "sw-x", 200, 10);
    newer.push(loss("sw-x", "ingress", None, 1, 1));
    assert_eq!(newer.flush().unwrap(), 1);
    older.push(loss("sw-x", "ingress", None, 2, 1));
    match older.flush() {
        Err(telemark_transport::exporter::ExportError::Rejected { status: 409, body }) => {
            assert!(body.contains("in use by a newer run"), "{body}")
        }
        other => panic!("the older run wrote on: {other:?}"),
    }
    assert_eq!(older.pending(), 1, "its record is kept, not lost");
    assert_eq!(c.api.store().counts().unwrap().0, 2);
    assert_eq!(metric(c.addr, "telemark_collector_errors_total{reason=\"name_in_use\"}"), 1);
    // A restart is a newer run: taken at once.
    let mut restarted = Exporter::new(&url, "sw-x", 300, 10);
    restarted.push(loss("sw-x", "ingress", None, 3, 1));
    assert_eq!(restarted.flush().unwrap(), 1);
    let (_, agents) = get(c.addr, "/api/v1/agents");
    assert!(agents.contains("\"boot\":300"), "{agents}");
}

/// A flow record of `packets` (and as many bytes) from agent `sw-c`.
fn flow_record(sport: u16, packets: u64) -> serde_json::Value {
    serde_json::to_value(Record::Flow(telemark_core::records::FlowRecord {
        agent: "sw-c".into(),
        port: "p1".into(),
        point: "ingress".into(),
        flow: flow(sport),
        window_start_ns: base_ns(),
        window_end_ns: base_ns() + 1_000_000_000,
        packets,
        bytes: packets,
        exact: true,
        error_bound: 0,
        truth_packets: None,
        truth_bytes: None,
        exported: Default::default(),
        heavy: Default::default(),
    }))
    .unwrap()
}

/// Every count of every record kind is held to one rule, at most 2^53 - 1 (issue 31, item 5):
/// before, two `flow` records of 2^63 - 1 and 5 packets were stored and then every
/// `/api/v1/flows/top` over them answered 500 ("integer overflow"), and two `health` records
/// of rx 2^64 - 1 summed to 18446744073709551614 (wrapped).
#[test]
fn counts_no_reader_can_hold_are_refused_and_sums_do_not_fail() {
    let c = start(std::path::Path::new(":memory:"), "127.0.0.1:0".parse().unwrap());
    let reg = br#"{"agent":"sw-c","version":"1","boot":1}"#;
    assert_eq!(send("POST", c.addr, "/api/v1/agents", reg).0, 200);
    let ingest = |seq: u64, records: Vec<serde_json::Value>| {
        let body = serde_json::json!({"agent": "sw-c", "boot": 1, "seq": seq, "records": records});
        send("POST", c.addr, "/api/v1/ingest", body.to_string().as_bytes())
    };
    let (status, body) = ingest(0, vec![flow_record(1, i64::MAX as u64), flow_record(1, 5)]);
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("record 0: packets 9223372036854775807 is more than one record can carry"),
        "{body}"
    );
    let health = |rx: u64| {
        serde_json::json!({"kind": "health", "agent": "sw-c", "interval_start_ns": base_ns(),
                           "interval_end_ns": base_ns() + 1, "rx": rx, "points": []})
    };
    let (status, body) = ingest(0, vec![health(u64::MAX), health(u64::MAX)]);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("rx 18446744073709551615 is more than one record can carry"), "{body}");
    let point = serde_json::json!({"point": "ingress", "port": "p1", "packets_refused": u64::MAX});
    let mut h = health(1);
    h["points"] = serde_json::json!([point]);
    let (status, body) = ingest(0, vec![h]);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("packets_refused"), "{body}");
    let cost = serde_json::json!({"kind": "cost", "agent": "sw-c", "stage": "parse",
                                  "packets": 1, "cycles": u64::MAX, "interval_ns": 1});
    let (status, body) = ingest(0, vec![cost]);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("cycles"), "{body}");
    assert_eq!(metric(c.addr, "telemark_collector_errors_total{reason=\"bad_record\"}"), 4);
    let (status, body) = get(c.addr, "/api/v1/flows/top?from=0");
    assert_eq!(status, 200, "{body}");
    // The largest count there is, twice, and five: the sum is above 2^53 and exact (as a
    // string for JavaScript with ints=string).
    let (status, body) = ingest(0, vec![flow_record(2, (1 << 53) - 1), flow_record(2, 5)]);
    assert_eq!(status, 200, "{body}");
    let (status, body) = ingest(2, vec![health(u64::pow(2, 53) - 1), health(1)]);
    assert_eq!(status, 200, "{body}");
    let (status, body) = get(c.addr, "/api/v1/flows/top?from=0&ints=string");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""packets":"9007199254740996""#), "{body}");
    let (status, body) = get(c.addr, "/api/v1/health?from=0");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""rx":9007199254740992"#), "{body}");
}

/// An IPFIX record whose packetDeltaCount is 2^64 - 1 (issue 31, item 5): before, it was
/// stored and every `/api/v1/flows/top` over its window answered 500 ("Invalid column type
/// Real"). Now it is refused and counted; the other record of the datagram is stored.
#[test]
fn an_exporter_count_no_reader_can_hold_is_refused_and_the_rest_stored() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut cfg = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: ":memory:".into(),
        workers: 2,
        ..Config::default()
    };
    cfg.flows.listen = vec![port];
    let c = Collector::start(&cfg).expect("collector starts");
    // RFC 7011: a message header, a template set (id 2) of template 256, a data set of two
    // records: addresses, ports, protocol, packetDeltaCount (IE 2) and octetDeltaCount (IE 1).
    let fields: [(u16, u16); 7] = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (2, 8), (1, 8)];
    let mut tmpl = vec![0, 2, 0, 0, 1, 0, 0, 7];
    for (ie, len) in fields {
        tmpl.extend(ie.to_be_bytes());
        tmpl.extend(len.to_be_bytes());
    }
    let n = tmpl.len() as u16;
    tmpl[2..4].copy_from_slice(&n.to_be_bytes());
    let mut data = vec![1, 0, 0, 0];
    for (sport, packets) in [(1u16, u64::MAX), (2, 7)] {
        data.extend([10, 0, 0, 1, 10, 0, 0, 7]);
        data.extend(sport.to_be_bytes());
        data.extend(5201u16.to_be_bytes());
        data.push(17);
        data.extend(packets.to_be_bytes());
        data.extend((packets.saturating_mul(100)).to_be_bytes());
    }
    let n = data.len() as u16;
    data[2..4].copy_from_slice(&n.to_be_bytes());
    let now = (telemark_collector::now_ns() / 1_000_000_000) as u32;
    let mut msg = vec![0, 10, 0, 0];
    msg.extend(now.to_be_bytes());
    msg.extend(0u32.to_be_bytes());
    msg.extend(0u32.to_be_bytes());
    msg.extend(tmpl);
    msg.extend(data);
    let n = msg.len() as u16;
    msg[2..4].copy_from_slice(&n.to_be_bytes());
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(&msg, port).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (status, body) = get(c.addr, "/api/v1/flows/top?from=0");
        assert_eq!(status, 200, "{body}");
        if body.contains("\"sport\":2") || std::time::Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let flows = v["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 1, "{body}");
    assert_eq!(flows[0]["flow"]["sport"], 2);
    assert_eq!(flows[0]["packets"], 7);
    assert_eq!(
        metric(c.addr, "telemark_collector_errors_total{reason=\"exporter_count_too_large\"}"),
        1
    );
}

/// The console's overview: every flow's loss records summed per segment and time bucket, the
/// segments that lost most first and the rest as "other", filtered by agent and protocol, from
/// the records or from the hourly sums; each figure against the sums of what was sent.
#[test]
fn the_overview_sums_every_flow_per_segment_and_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(&dir.path().join("t.db"), "127.0.0.1:0".parse().unwrap());
    let a = c.addr;
    // Three segments: sw-b's ingress → egress, sw-f's ingress from the marking, sw-f's egress;
    // five UDP flows and one TCP flow, a batch every 30 ms for 3 s.
    let segments = [
        ("sw-b", "egress", Some("ingress")),
        ("sw-f", "ingress", None),
        ("sw-f", "egress", Some("ingress")),
    ];
    // (agent, point, second) → (batches, lossy, expected, lost); and the TCP flow's lost.
    let mut truth: BTreeMap<(String, String, u64), [u64; 4]> = BTreeMap::new();
    let mut tcp_lost = 0;
    for (agent, point, upstream) in segments {
        let mut records = Vec::new();
        for sport in 40000..40006u16 {
            for b in 0..100u64 {
                let lost = match (agent, point) {
                    ("sw-f", "ingress") => (b + u64::from(sport)) % 7,
                    ("sw-b", "egress") => u64::from(b % 25 == 0),
                    _ => 0,
                };
                let mut r = loss(agent, point, upstream, b, lost);
                if let Record::Loss(l) = &mut r {
                    l.flow.sport = sport;
                    if sport == 40005 {
                        l.flow.proto = 6;
                        tcp_lost += lost;
                    }
                    l.first_ns = base_ns() + b * 30_000_000;
                    l.last_ns = l.first_ns + 20_000_000;
                }
                let t = truth.entry((agent.into(), point.into(), b * 30 / 1000)).or_default();
                t[0] += 1;
                t[1] += u64::from(lost > 0);
                t[2] += 100;
                t[3] += lost;
                records.push(r);
            }
        }
        let reg = serde_json::json!({"agent": agent, "version": "1", "boot": 1}).to_string();
        assert_eq!(send("POST", a, "/api/v1/agents", reg.as_bytes()).0, 200);
        let seq = if agent == "sw-f" && point == "egress" { 600 } else { 0 };
        let body = serde_json::json!({"agent": agent, "boot": 1, "seq": seq, "records": records});
        let (s, text) = send("POST", a, "/api/v1/ingest", body.to_string().as_bytes());
        assert_eq!(s, 200, "{text}");
    }
    let sum = |agent: &str, point: &str, i: usize| -> u64 {
        truth.iter().filter(|((a, p, _), _)| a == agent && p == point).map(|(_, v)| v[i]).sum()
    };
    let window = format!("from={}&to={}", base_ns(), base_ns() + 10_000_000_000);
    let overview = |q: &str| -> serde_json::Value {
        let (s, body) = get(a, &format!("/api/v1/overview?{window}&{q}"));
        assert_eq!(s, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };

    // One-second buckets, the top two segments: sw-f ingress (most lost), then sw-b egress.
    let o = overview("bucket_ns=1000000000&top=2");
    assert_eq!(o["source"], "batches");
    let all_lost: u64 = truth.values().map(|v| v[3]).sum();
    assert_eq!(o["total"]["lost"], all_lost);
    assert_eq!(o["total"]["batches"], 1800);
    assert_eq!(o["total"]["expected"], 180_000);
    let segs = o["segments"].as_array().unwrap();
    let names: Vec<_> =
        segs.iter().map(|s| (s["agent"].as_str().unwrap(), s["point"].as_str().unwrap())).collect();
    assert_eq!(names, [("sw-f", "ingress"), ("sw-b", "egress")]);
    assert_eq!(segs[0]["scope"], "path");
    assert_eq!(segs[1]["upstream"], "ingress");
    for s in segs {
        let (agent, point) = (s["agent"].as_str().unwrap(), s["point"].as_str().unwrap());
        assert_eq!(s["total"]["lost"], sum(agent, point, 3), "{agent} {point}");
        assert_eq!(s["total"]["lossy_batches"], sum(agent, point, 1), "{agent} {point}");
        // Per second, as the truth has it.
        for bucket in s["buckets"].as_array().unwrap() {
            let second = (bucket["t_ns"].as_u64().unwrap() - base_ns()) / 1_000_000_000;
            let t = truth[&(agent.to_string(), point.to_string(), second)];
            assert_eq!(
                [
                    &bucket["batches"],
                    &bucket["lossy_batches"],
                    &bucket["expected"],
                    &bucket["lost"]
                ],
                t.map(serde_json::Value::from).each_ref(),
                "{agent} {point} second {second}"
            );
        }
        assert_eq!(s["buckets"].as_array().unwrap().len(), 3);
    }
    assert_eq!(o["other"]["segments"], 1);
    assert_eq!(o["other"]["total"]["batches"], 600);
    assert_eq!(o["other"]["total"]["lost"], 0);

    // One agent; one protocol.
    let o = overview("bucket_ns=1000000000&agent=sw-b");
    assert_eq!(o["segments"].as_array().unwrap().len(), 1);
    assert_eq!(o["total"]["lost"], sum("sw-b", "egress", 3));
    let o = overview("bucket_ns=1000000000&proto=6");
    assert_eq!(o["total"]["lost"], tcp_lost);
    assert_eq!(o["total"]["batches"], 300);

    // Whole hours: read from the hourly sums, the same totals (the window's hours count whole).
    let (s, body) = get(
        a,
        &format!(
            "/api/v1/overview?from={}&to={}&bucket_ns=3600000000000",
            base_ns() - 3_600_000_000_000,
            base_ns() + 3_600_000_000_000
        ),
    );
    assert_eq!(s, 200, "{body}");
    let o: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(o["source"], "hourly_sums");
    assert_eq!(o["total"]["lost"], all_lost);
    assert_eq!(o["total"]["lossy_batches"], truth.values().map(|v| v[1]).sum::<u64>());
    assert_eq!(o["total"]["expected"], 180_000);

    // The hourly sums by protocol and agent too.
    for (q, want) in [("proto=6", tcp_lost), ("agent=sw-b", sum("sw-b", "egress", 3))] {
        let (s, body) = get(
            a,
            &format!(
                "/api/v1/overview?from={}&to={}&bucket_ns=3600000000000&{q}",
                base_ns() - 3_600_000_000_000,
                base_ns() + 3_600_000_000_000
            ),
        );
        assert_eq!(s, 200, "{body}");
        let o: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!((&o["source"], &o["total"]["lost"]), (&"hourly_sums".into(), &want.into()));
    }

    // More buckets than a chart can use, and bad arguments: 400, saying what to ask instead.
    let (s, body) = get(a, &format!("/api/v1/overview?{window}&bucket_ns=1000"));
    assert_eq!(s, 400);
    assert!(body.contains("longer buckets"), "{body}");
    for bad in ["bucket_ns=0", "proto=tcp", "agent=sw-b&colour=1"] {
        let (s, body) = get(a, &format!("/api/v1/overview?{window}&{bad}"));
        assert_eq!(s, 400, "{bad}: {body}");
    }
}

/// Flows ranked over days: the whole days of the window from the daily sums, the hours around
/// them from the hourly ones, nothing of the days' hours outside the window. Each flow's loss
/// lies where a wrong split would rank it first.
#[test]
fn the_flows_list_ranks_a_window_of_days_by_its_hours() {
    const HOUR: u64 = 3_600_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let c = start(&dir.path().join("t.db"), "127.0.0.1:0".parse().unwrap());
    let a = c.addr;
    let day0 = (base_ns() / (24 * HOUR) - 4) * 24 * HOUR;
    // The window: day 0 from 20:00 to day 2 at 03:00; day 1 whole.
    let (from, to) = (day0 + 20 * HOUR, day0 + 51 * HOUR);
    // (sport, hour since day 0, lost); the loss inside the window per flow: 50, 40, 30, 10.
    let lost_at = [
        (40100, 10, 95),
        (40100, 21, 10),
        (40101, 22, 50),
        (40102, 36, 40),
        (40102, 53, 90),
        (40103, 49, 30),
    ];
    let records: Vec<Record> = lost_at
        .iter()
        .enumerate()
        .map(|(b, &(sport, hour, lost))| {
            let mut r = loss("sw-f", "ingress", None, b as u64, lost);
            if let Record::Loss(l) = &mut r {
                l.flow.sport = sport;
                l.first_ns = day0 + hour * HOUR + 60_000_000_000;
                l.last_ns = l.first_ns + 1_000_000;
            }
            r
        })
        .collect();
    let reg = br#"{"agent":"sw-f","version":"1","boot":1}"#;
    assert_eq!(send("POST", a, "/api/v1/agents", reg).0, 200);
    let body = serde_json::json!({"agent": "sw-f", "boot": 1, "seq": 0, "records": records});
    let (s, text) = send("POST", a, "/api/v1/ingest", body.to_string().as_bytes());
    assert_eq!(s, 200, "{text}");
    let list = |q: &str| -> Vec<(u64, u64)> {
        let (s, body) = get(a, &format!("/api/v1/flows?from={from}&to={to}&lossy=true&{q}"));
        assert_eq!(s, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|f| (f["flow"]["sport"].as_u64().unwrap(), f["lost"].as_u64().unwrap()))
            .collect()
    };
    assert_eq!(list("limit=10"), [(40101, 50), (40102, 40), (40103, 30), (40100, 10)]);
    assert_eq!(list("limit=1"), [(40101, 50)]);
    // The overview over the same hours, from the hourly sums per segment.
    let (s, body) =
        get(a, &format!("/api/v1/overview?from={from}&to={to}&bucket_ns={}", 24 * HOUR));
    assert_eq!(s, 200, "{body}");
    let o: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((&o["source"], &o["total"]["lost"]), (&"hourly_sums".into(), &130.into()));
}
