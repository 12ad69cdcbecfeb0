//! Readers do not stall writers (issue 31, item 4): over a database of many flow records, a
//! top-talkers query that reads them all runs on a reader connection of its own, so ingest
//! and the probes are answered while it runs, and a query past its budget is stopped and
//! answered 503 (counted). The old collector held its one connection's lock for the whole
//! query: ingest waited for it (in the issue's run, 5 of 6 timed out).
//!
//! Not a benchmark: the test holds the order of events (ingest answered while the query is
//! still running), not a latency; the figures are in docs/collector.md, "Queries".

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use telemark_collector::store::Store;
use telemark_collector::{Collector, Config};
use telemark_core::records::{Direction, Flow, FlowExport, FlowRecord, HealthRecord, Record};

/// Flow records stored before the collector starts: enough that reading them all takes far
/// longer than an ingest.
const ROWS: u64 = 300_000;

fn fill(db: &Path) {
    let mut st = Store::open(db).unwrap();
    let now = telemark_collector::now_ns();
    let recs: Vec<(u64, Record)> = (0..ROWS)
        .map(|n| {
            let f = (n % 50_000) as u16;
            let r = FlowRecord {
                agent: "192.0.2.1".into(),
                port: "1".into(),
                point: "ipfix".into(),
                flow: Flow {
                    src: format!("10.0.{}.{}", f >> 8, f & 255),
                    dst: "10.200.0.1".into(),
                    sport: f,
                    dport: 443,
                    proto: 6,
                    spi: None,
                    si: None,
                },
                window_start_ns: now - 2_000_000_000,
                window_end_ns: now - 1_000_000_000,
                packets: 1 + n % 1000,
                bytes: 64 * (1 + n % 1000),
                exact: true,
                error_bound: 0,
                truth_packets: None,
                truth_bytes: None,
                // Half the flows seen at egress (alone): the query takes its longer form,
                // grouping per point (an egress record counts where its point reported the
                // flow nowhere else, as here).
                exported: FlowExport {
                    direction: f.is_multiple_of(2).then_some(Direction::Egress),
                    ..Default::default()
                },
                heavy: Default::default(),
            };
            (n, Record::Flow(r))
        })
        .collect();
    st.ingest_flows("192.0.2.1", 1, &recs, now).unwrap();
}

fn start(db: &Path, budget: Duration) -> Collector {
    let cfg = Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        db: db.to_path_buf(),
        workers: 4,
        retention: Duration::ZERO,
        query_budget: budget,
        ..Config::default()
    };
    Collector::start(&cfg).expect("collector starts")
}

fn send(method: &str, addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let r = ureq::request(method, &format!("http://{addr}{path}"))
        .timeout(Duration::from_secs(120))
        .set("Content-Type", "application/json")
        .send_string(body);
    match r {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap()),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

fn health(seq: u64) -> String {
    let now = telemark_collector::now_ns();
    let r = Record::Health(HealthRecord {
        agent: "sw-a".into(),
        interval_start_ns: now - 1_000_000_000,
        interval_end_ns: now,
        rx: 100,
        ..HealthRecord::default()
    });
    serde_json::json!({"agent": "sw-a", "boot": 1, "seq": seq, "records": [r]}).to_string()
}

#[test]
fn a_long_query_holds_up_neither_ingest_nor_probes_and_one_past_its_budget_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flows.db");
    fill(&db);

    let c = start(&db, Duration::from_secs(600));
    let addr = c.addr;
    let reg = r#"{"agent":"sw-a","version":"1","boot":1}"#;
    assert_eq!(send("POST", addr, "/api/v1/agents", reg).0, 200);
    let top = std::thread::spawn(move || {
        let (status, body) = send("GET", addr, "/api/v1/flows/top?from=0&limit=3", "");
        (status, body, Instant::now())
    });
    // Once the query runs, writes and probes go on beside it.
    std::thread::sleep(Duration::from_millis(100));
    let mut answered = Vec::new();
    for seq in 0..5 {
        assert_eq!(send("POST", addr, "/api/v1/ingest", &health(seq)).0, 200);
        assert_eq!(send("GET", addr, "/healthz", "").0, 200);
        assert_eq!(send("GET", addr, "/readyz", "").0, 200);
        answered.push(Instant::now());
    }
    let (status, body, top_done) = top.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    // The biggest flows: those of 999 and 1000 packets per record, 6 records each.
    assert_eq!(v["flows"][0]["packets"], 6_000, "{body}");
    let before = answered.iter().filter(|t| **t < top_done).count();
    assert!(
        before == 5,
        "only {before} of 5 ingests and probes were answered while the query ran: a reader \
         held up the writer"
    );
    assert_eq!(c.api.store().counts().unwrap(), (0, ROWS + 5));
    c.stop();

    // The same query with a budget of 1 ms: stopped, 503, counted; writes unaffected.
    let c = start(&db, Duration::from_millis(1));
    let (status, body) = send("GET", c.addr, "/api/v1/flows/top?from=0", "");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("--query-budget"), "{body}");
    let (_, metrics) = send("GET", c.addr, "/metrics", "");
    assert!(
        metrics.contains(r#"telemark_collector_errors_total{reason="query_over_budget"} 1"#),
        "{metrics}"
    );
    assert_eq!(send("POST", c.addr, "/api/v1/ingest", &health(5)).0, 200);
    c.stop();
}
