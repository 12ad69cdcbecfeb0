//! The collector exposed: tokens decide who writes as which agent and who reads; records that
//! make no sense are refused before they are stored; the page renders what records bring as
//! text (in headless Chromium, when it is installed: CI installs it).

use std::net::SocketAddr;
use telemark_collector::auth::Auth;
use telemark_collector::{now_ns, Collector, Config, StartError};
use telemark_core::records::{Flow, LossRecord, Record, Scope};
use telemark_transport::exporter::Exporter;

const SW_B: &str = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0";
const SW_F: &str = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0";
const OPS: &str = "0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e";

fn tokens() -> Auth {
    Auth::parse(&format!(
        "[agents]\nsw-b = \"{SW_B}\"\nsw-f = \"{SW_F}\"\n[readers]\nops = \"{OPS}\"\n"
    ))
    .unwrap()
}

fn start(dir: &std::path::Path, auth: Option<Auth>) -> Collector {
    let cfg = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: dir.join("t.db"),
        workers: 2,
        auth,
        ..Config::default()
    };
    Collector::start(&cfg).unwrap()
}

fn loss(agent: &str, batch: u64, lost: u64) -> Record {
    let t = now_ns() - 60_000_000_000 + batch * 10_000_000;
    Record::Loss(LossRecord {
        agent: agent.into(),
        port: "p1".into(),
        point: "egress".into(),
        upstream: Some("ingress".into()),
        scope: Scope::Segment,
        flow: Flow {
            src: "10.0.0.1".into(),
            dst: "10.0.0.7".into(),
            sport: 40000,
            dport: 5201,
            proto: 17,
            spi: None,
            si: None,
        },
        color: (batch % 2) as u8,
        batch,
        period_ns: None,
        first_ns: t,
        last_ns: t + 9_000_000,
        expected: Some(100),
        observed: 100 - lost,
        lost,
        late: 0,
        uncertain: 0,
        tail: false,
        incomplete: false,
        drops: Vec::new(),
        ttl: None,
        own_colour: 0,
    })
}

/// Status and body; `token` as a bearer token.
fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut r = ureq::request(method, &format!("http://{addr}{path}"));
    if let Some(t) = token {
        r = r.set("Authorization", &format!("Bearer {t}"));
    }
    match r.send_string(body) {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap()),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

fn metric(addr: SocketAddr, prefix: &str) -> u64 {
    let (_, m) = send(addr, "GET", "/metrics", Some(OPS), "");
    m.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The attack that worked before: another agent's token (or none) cannot write under sw-b's
/// name, so sw-b's real records are all stored; readers read, agents only write.
#[test]
fn each_token_writes_only_as_its_agent_and_readers_read() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), Some(tokens()));
    let a = c.addr;
    let url = format!("http://{a}");
    // sw-b, with its token, registers and sends.
    let mut b = Exporter::new(&url, "sw-b", 7, 1000).with_token(Some(SW_B));
    for n in 0..50 {
        b.push(loss("sw-b", n, 1));
    }
    assert_eq!(b.flush().unwrap(), 50);
    // Records under sw-b's name, with sw-f's token, no token, or a reader's: refused.
    let fake = serde_json::json!({
        "agent": "sw-b", "boot": 7, "seq": 50,
        "records": (50..60).map(|n| loss("sw-b", n, 99)).collect::<Vec<_>>()
    })
    .to_string();
    let reg = r#"{"agent":"sw-b","version":"x","boot":8}"#;
    assert_eq!(send(a, "POST", "/api/v1/ingest", Some(SW_F), &fake).0, 403);
    assert_eq!(send(a, "POST", "/api/v1/agents", Some(SW_F), reg).0, 403);
    assert_eq!(send(a, "POST", "/api/v1/ingest", None, &fake).0, 401);
    assert_eq!(send(a, "POST", "/api/v1/ingest", Some(OPS), &fake).0, 403);
    assert_eq!(send(a, "POST", "/api/v1/ingest", Some(&SW_B[1..]), &fake).0, 401);
    assert_eq!(metric(a, "telemark_collector_errors_total{reason=\"forbidden\"}"), 3);
    assert_eq!(metric(a, "telemark_collector_errors_total{reason=\"unauthenticated\"}"), 2);
    // sw-f may not hide records of sw-b's inside its own request either.
    let mixed = serde_json::json!({
        "agent": "sw-f", "boot": 1, "seq": 0, "records": [loss("sw-f", 1, 1), loss("sw-b", 2, 1)]
    })
    .to_string();
    send(a, "POST", "/api/v1/agents", Some(SW_F), r#"{"agent":"sw-f","version":"x","boot":1}"#);
    let (s, e) = send(a, "POST", "/api/v1/ingest", Some(SW_F), &mixed);
    assert_eq!(s, 400, "{e}");
    assert!(e.contains("record 1") && e.contains("sw-b"), "{e}");
    // sw-b goes on: nothing of its run was taken as a duplicate, every record is stored.
    for n in 50..60 {
        b.push(loss("sw-b", n, 1));
    }
    assert_eq!(b.flush().unwrap(), 10);
    assert_eq!(b.duplicates, 0);
    assert_eq!(c.api.store().counts().unwrap().0, 60);
    // Reading: a reader's token only.
    assert_eq!(send(a, "GET", "/api/v1/flows", None, "").0, 401);
    assert_eq!(send(a, "GET", "/metrics", Some(SW_B), "").0, 403);
    let (s, flows) = send(a, "GET", "/api/v1/flows", Some(OPS), "");
    assert_eq!(s, 200);
    let v: serde_json::Value = serde_json::from_str(&flows).unwrap();
    assert_eq!(v[0]["lost"], 60);
    // The page itself holds no data.
    assert_eq!(send(a, "GET", "/", None, "").0, 200);
}

/// Without tokens the collector serves only loopback.
#[test]
fn an_exposed_address_needs_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        listen: "0.0.0.0:0".parse().unwrap(),
        db: dir.path().join("t.db"),
        ..Config::default()
    };
    match Collector::start(&cfg) {
        Err(e @ StartError::Exposed { .. }) => assert!(e.to_string().contains("--auth")),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("listened on 0.0.0.0 without tokens"),
    }
    let c = Collector::start(&Config { auth: Some(tokens()), ..cfg }).unwrap();
    assert_ne!(c.addr.port(), 0);
}

/// Records that once broke every query for the retention period, or made no sense, are
/// refused with the reason and a counter; what was stored before still answers.
#[test]
fn records_that_make_no_sense_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), None);
    let a = c.addr;
    send(a, "POST", "/api/v1/agents", None, r#"{"agent":"sw-b","version":"x","boot":1}"#);
    let good =
        serde_json::json!({"agent": "sw-b", "boot": 1, "seq": 0, "records": [loss("sw-b", 1, 3)]});
    assert_eq!(send(a, "POST", "/api/v1/ingest", None, &good.to_string()).0, 200);
    let mut huge = serde_json::to_value(loss("sw-b", 2, 1)).unwrap();
    huge["lost"] = serde_json::json!(u64::MAX);
    huge["expected"] = serde_json::json!(u64::MAX);
    let mut evil = serde_json::to_value(loss("sw-b", 3, 1)).unwrap();
    evil["flow"]["src"] = serde_json::json!("<img src=x onerror=alert(1)>");
    let mut extra = serde_json::to_value(loss("sw-b", 4, 1)).unwrap();
    extra["flow"]["shell"] = serde_json::json!("rm -rf /");
    let mut old = serde_json::to_value(loss("sw-b", 5, 1)).unwrap();
    (old["first_ns"], old["last_ns"]) = (serde_json::json!(1), serde_json::json!(2));
    for (n, (r, says)) in [
        (huge, "more than one record can carry"),
        (evil, "not an IP address"),
        (extra, "unknown field flow.shell"),
        (old, "400 days"),
    ]
    .into_iter()
    .enumerate()
    {
        let body = serde_json::json!({"agent": "sw-b", "boot": 1, "seq": 10 + n, "records": [r]});
        let (s, e) = send(a, "POST", "/api/v1/ingest", None, &body.to_string());
        assert_eq!(s, 400, "{e}");
        assert!(e.contains(says), "{e}");
    }
    assert_eq!(metric(a, "telemark_collector_errors_total{reason=\"bad_record\"}"), 4);
    let q = "src=10.0.0.1&dst=10.0.0.7&sport=40000&dport=5201&proto=17";
    for path in
        ["/api/v1/flows".to_string(), format!("/api/v1/localise?{q}"), format!("/api/v1/loss?{q}")]
    {
        let (s, body) = send(a, "GET", &path, None, "");
        assert_eq!(s, 200, "{path}: {body}");
    }
    assert_eq!(c.api.store().counts().unwrap().0, 1);
}

/// What a record brings is text on the page, never markup or script, whatever reached the
/// store (here written to it directly, past the ingest checks), in a real browser.
#[test]
fn the_page_shows_record_text_as_text_in_chromium() {
    let Some(chromium) = ["chromium", "chromium-browser"].into_iter().find(|b| {
        std::process::Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success())
    }) else {
        panic!("chromium is not installed (apt-get install chromium; .ci/run installs it)");
    };
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), None);
    // One flow's address, and another flow's point name (that flow, losing more, is the one
    // the page charts: its point names go into the chart's legend and SVG).
    let payload = |id: &str| {
        format!("<b id={id}>x</b><img src=x onerror=document.body.setAttribute('data-pwned',1)>")
    };
    let mut by_address = loss("sw-b", 1, 5);
    if let Record::Loss(l) = &mut by_address {
        l.flow.src = payload("in-address");
    }
    let mut by_point = loss("sw-b", 2, 50);
    if let Record::Loss(l) = &mut by_point {
        l.flow.sport = 40001;
        l.point = payload("in-point");
    }
    {
        let mut st = c.api.store();
        st.register("sw-b", "x", 1, now_ns()).unwrap();
        st.ingest("sw-b", 1, 0, &[by_address, by_point], 0, now_ns()).unwrap();
    }
    let out = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("http://{}/", c.addr))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    // The page ran (both flows are listed, one charted), each payload is shown as text, and
    // none of it became markup or ran.
    for id in ["in-address", "in-point"] {
        assert!(dom.contains(&format!("&lt;b id={id}&gt;")), "{id} not shown as text:\n{dom}");
        assert!(!dom.contains(&format!("id=\"{id}\"")), "{id} became markup:\n{dom}");
    }
    assert!(!dom.contains("data-pwned=\"1\""), "payload ran:\n{dom}");
    assert!(!dom.contains("<img"), "payload became markup:\n{dom}");
}

/// The attack that worked before (issue 31, item 1): 16 sockets without a token, each
/// announcing an 8 MiB `POST /api/v1/ingest` and sending one byte every 2 s, took the whole
/// body budget (2 x workers x max-body) while their bodies trickled in, and authenticated
/// ingest with the agent's 5 s timeout failed 13 times in 14. Now a request is refused from
/// its head (401, counted) before its body is read: every authenticated flush during the
/// attack succeeds, promptly.
#[test]
fn unauthenticated_slow_bodies_do_not_stall_ingest() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    // Two workers: a budget of 4 bodies of 8 MiB, which 16 attackers filled four times over.
    let c = start(dir.path(), Some(tokens()));
    let a = c.addr;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = (0..16)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(a).unwrap();
                let head = format!(
                    "POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\n\r\n",
                    8 << 20
                );
                s.write_all(head.as_bytes()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    if s.write_all(b"[").is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_secs(2));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut b = Exporter::new(&format!("http://{a}"), "sw-b", 7, 1000).with_token(Some(SW_B));
    let (mut took, mut failed) = (Vec::new(), 0);
    let t = Instant::now();
    let mut n = 0;
    while t.elapsed() < Duration::from_secs(12) {
        b.push(loss("sw-b", n, 1));
        n += 1;
        let f = Instant::now();
        match b.flush() {
            Ok(_) => took.push(f.elapsed()),
            Err(e) => {
                failed += 1;
                eprintln!("flush failed after {:?}: {e}", f.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    stop.store(true, Ordering::Relaxed);
    took.sort();
    let p = |q: f64| took[((took.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    eprintln!(
        "during the attack: {} flushes ok, {failed} failed; latency p50 {:.2} ms, p99 {:.2} ms, \
         max {:.2} ms",
        took.len(),
        p(0.5),
        p(0.99),
        p(1.0)
    );
    assert_eq!(failed, 0);
    assert!(p(0.99) < 1000.0, "p99 {} ms", p(0.99));
    assert_eq!(c.api.store().counts().unwrap().0, n);
    // Every attacker counted, by the API and by the transport.
    assert_eq!(metric(a, "telemark_collector_errors_total{reason=\"unauthenticated\"}"), 16);
    assert_eq!(metric(a, "telemark_collector_http_refused_total{reason=\"unauthenticated\"}"), 16);
    for h in attackers {
        h.join().unwrap();
    }
}

/// The requests a stand-in agent took: (method, path, body).
type Requests = std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>;

/// A stand-in for an agent's control API (the real one is driven in
/// crates/telemark/tests/console.rs): it wants its control token, answers `GET` with the
/// rules it holds and `PUT` by taking the body, refusing (400) rules with a field it does not
/// know. Each request it took, as (method, path, body).
fn fake_agent(token: &'static str) -> (u16, Requests) {
    use std::io::{BufRead, BufReader, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        let mut rules = String::from("[]");
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let (mut len, mut auth) = (0usize, String::new());
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                if h.trim().is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap();
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => len = v.trim().parse().unwrap(),
                    "authorization" => auth = v.trim().to_string(),
                    _ => {}
                }
            }
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            let body = String::from_utf8(body).unwrap();
            let mut parts = line.split_whitespace();
            let (method, path) =
                (parts.next().unwrap().to_string(), parts.next().unwrap().to_string());
            log.lock().unwrap().push((method.clone(), path, body.clone()));
            let (status, answer) = if auth != format!("Bearer {token}") {
                (401, r#"{"error":"unauthenticated"}"#.to_string())
            } else if method == "PUT" && body.contains("colour") {
                (400, r#"{"error":"[[watch]] #1: unknown field colour"}"#.to_string())
            } else {
                if method == "PUT" {
                    rules = body;
                }
                (200, rules.clone())
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (port, seen)
}

/// Steering: a reader sees each agent's rules but may not change them (403, and nothing
/// reaches the agent); an operator's change reaches the agent with the agent's control token
/// and comes back as the agent answered it; an agent's refusal comes back as a 400 with its
/// reason, an agent that is not there as a 502 naming it; every change is kept with who made it.
#[test]
fn only_operators_change_the_agents_rules_and_every_change_is_kept() {
    const OPERATOR: &str = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
    const CONTROL: &str = "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0";
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = fake_agent(CONTROL);
    let token = dir.path().join("sw-b.control");
    std::fs::write(&token, CONTROL).unwrap();
    let file = dir.path().join("control.toml");
    std::fs::write(
        &file,
        format!(
            "[agents.sw-b]\nurl = \"http://127.0.0.1:{port}\"\ntoken_file = {token:?}\n\
             [agents.gone]\nurl = \"http://127.0.0.1:1\"\ntoken_file = {token:?}\n"
        ),
    )
    .unwrap();
    let auth = Auth::parse(&format!(
        "[agents]\nsw-b = \"{SW_B}\"\n[readers]\nops = \"{OPS}\"\n[operators]\nalice = \"{OPERATOR}\"\n"
    ))
    .unwrap();
    let steering = telemark_collector::steer::Steering::load(&file).unwrap();
    let cfg = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: dir.path().join("t.db"),
        workers: 2,
        auth: Some(auth),
        control: Some(std::sync::Arc::new(steering)),
        ..Config::default()
    };
    let c = Collector::start(&cfg).unwrap();
    let a = c.addr;
    let rules = r#"[{"dst":"10.0.3.0/24"},{"sport":4050}]"#;

    let (s, body) = send(a, "GET", "/api/v1/control", Some(OPS), "");
    assert_eq!(s, 200, "{body}");
    assert!(body.contains("\"sw-b\"") && body.contains("\"gone\""), "{body}");
    for who in [Some(OPS), Some(SW_B), None] {
        let (s, body) = send(a, "PUT", "/api/v1/control/watch?agent=sw-b", who, rules);
        assert_eq!(s, if who.is_none() { 401 } else { 403 }, "{body}");
    }
    let (s, _) = send(a, "POST", "/api/v1/control/heaviest?n=3", Some(OPS), "");
    assert_eq!(s, 403);
    assert!(seen.lock().unwrap().is_empty(), "a refused change reached the agent");

    let (s, body) = send(a, "PUT", "/api/v1/control/watch?agent=sw-b", Some(OPERATOR), rules);
    assert_eq!(s, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        serde_json::from_str::<serde_json::Value>(rules).unwrap()
    );
    let (s, body) = send(a, "GET", "/api/v1/control?agent=sw-b", Some(OPS), "");
    assert_eq!(s, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["watch"], serde_json::from_str::<serde_json::Value>(rules).unwrap());
    assert_eq!(
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(m, _, _)| m == "PUT")
            .map(|(_, p, _)| p.as_str())
            .collect::<Vec<_>>(),
        ["/api/v1/watch"]
    );
    // The agent's refusal, an agent away, an agent unknown, rules that are not JSON.
    let (s, body) =
        send(a, "PUT", "/api/v1/control/watch?agent=sw-b", Some(OPERATOR), r#"[{"colour":1}]"#);
    assert_eq!(s, 400);
    assert!(body.contains("unknown field colour"), "{body}");
    let (s, body) = send(a, "PUT", "/api/v1/control/int?agent=gone", Some(OPERATOR), "{}");
    assert_eq!(s, 502);
    assert!(body.contains("gone at http://127.0.0.1:1"), "{body}");
    let (s, _) = send(a, "PUT", "/api/v1/control/watch?agent=nobody", Some(OPERATOR), "[]");
    assert_eq!(s, 404);
    let (s, _) = send(a, "PUT", "/api/v1/control/watch?agent=sw-b", Some(OPERATOR), "[{");
    assert_eq!(s, 400);
    // More than an agent takes: refused here, not relayed.
    let huge = format!("[{{\"dst\":\"{}\"}}]", "1".repeat(70_000));
    let (s, body) = send(a, "PUT", "/api/v1/control/watch?agent=sw-b", Some(OPERATOR), &huge);
    assert_eq!(s, 413, "{body}");
    // No flow records: nothing to choose the heaviest from.
    let (s, body) = send(a, "POST", "/api/v1/control/heaviest?n=3", Some(OPERATOR), "");
    assert_eq!(s, 409, "{body}");

    // Kept, newest first, with who made each.
    let (_, body) = send(a, "GET", "/api/v1/control", Some(OPS), "");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let changes: Vec<(String, String, String)> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["who"].as_str().unwrap().into(),
                c["agent"].as_str().unwrap().into(),
                c["rules"].as_str().unwrap().into(),
            )
        })
        .collect();
    // (The unknown agent's change is not kept: there was no agent to change.)
    let want = [("alice", "gone", "int"), ("alice", "sw-b", "watch"), ("alice", "sw-b", "watch")];
    assert_eq!(
        changes.iter().map(|(w, a, r)| (w.as_str(), a.as_str(), r.as_str())).collect::<Vec<_>>(),
        want
    );
    assert_eq!(v["changes"][2]["result"], "ok");
    assert_eq!(seen.lock().unwrap().iter().filter(|(m, _, _)| m == "PUT").count(), 2);
    drop(c);

    // Without a token file, everyone may read, and no one may steer (a web page the user
    // opens could send the POST).
    let open = Collector::start(&Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: dir.path().join("open.db"),
        control: Some(std::sync::Arc::new(
            telemark_collector::steer::Steering::load(&file).unwrap(),
        )),
        ..Config::default()
    })
    .unwrap();
    let (s, _) = send(open.addr, "GET", "/api/v1/control", None, "");
    assert_eq!(s, 200);
    let (s, body) = send(open.addr, "POST", "/api/v1/control/heaviest?n=3", None, "");
    assert_eq!(s, 403, "{body}");
    assert!(body.contains("[operators]"), "{body}");
}
