//! `telemark int-collector` as a process: Telemetry Reports in over UDP, events stored by a
//! collector, reports lost counted from sequence gaps. Ground truth: the test's own reference
//! evaluation of the values it sends, and an nftables rule's counter for the datagrams it drops
//! (needs root and nftables; CI has both).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use telemark_collector::{Collector, Config};
use telemark_datapath::afpacket::in_netns;
use telemark_wire::int::{Field, Hop, Instructions};
use telemark_wire::report::{Flags, InType, Writer};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A collector on loopback storing into `dir`.
fn collector(dir: &std::path::Path) -> Collector {
    let cfg = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: dir.join("c.db"),
        ..Config::default()
    };
    Collector::start(&cfg).unwrap()
}

/// `telemark int-collector ARGS` with /metrics on `mport`, once that answers; and its URL.
fn int_collector(args: &[&str], mport: u16) -> (Killed, String) {
    let p = Killed(
        Command::new(env!("CARGO_BIN_EXE_telemark"))
            .arg("int-collector")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let murl = format!("http://127.0.0.1:{mport}/metrics");
    wait_for("int-collector metrics", || ureq::get(&murl).call().is_ok());
    (p, murl)
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A v2.0 report datagram from node `node` with sequence `seq`: the node's hop latency in its
/// baseline metadata, and an IPv4/UDP inner packet of flow 10.9.0.1:5000 → 10.9.1.1:dport.
fn report(node: u32, seq: u32, latency: u64, dport: u16) -> Vec<u8> {
    let mut inner = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 9, 0, 1, 10, 9, 1, 1];
    inner.extend_from_slice(&5000u16.to_be_bytes());
    inner.extend_from_slice(&dport.to_be_bytes());
    inner.extend_from_slice(&[0, 8, 0, 0]);
    let mut md = Hop::default();
    md.set(Field::HopLatency, latency);
    let mut buf = [0u8; 128];
    let mut w = Writer::new(&mut buf, 0, seq, node).unwrap();
    let bits = Instructions::of(&[Field::HopLatency]);
    let flags = Flags { tracked_flow: true, ..Flags::default() };
    w.push(InType::Ipv4, flags, bits, &md, &inner).unwrap();
    let n = w.len();
    buf[..n].to_vec()
}

fn metrics(url: &str) -> BTreeMap<String, u64> {
    let body = ureq::get(url).call().unwrap().into_string().unwrap();
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
        .collect()
}

fn sum(m: &BTreeMap<String, u64>, name: &str) -> u64 {
    m.iter().filter(|(k, _)| k.starts_with(name)).map(|(_, v)| v).sum()
}

/// Reports lost so far and missing in the window (lost unless they still come: in these
/// tests they never do).
fn lost(m: &BTreeMap<String, u64>) -> u64 {
    sum(m, "telemark_int_reports_lost_total") + sum(m, "telemark_int_reports_missing")
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn nft(args: &str) -> String {
    let out = Command::new("nft").args(args.split(' ')).output().expect("nft runs");
    assert!(out.status.success(), "nft {args}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn events_match_a_reference_evaluation_and_lost_reports_match_nftables() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(dir.path());
    let port = free_port();
    let mport = tcp_port();
    const THRESHOLD: u64 = 10_000;
    // A second rule covering the same flow, with state of its own: per-flow change of the
    // path's hop latency (one hop: the report's) past 25 us.
    const FLOW_THRESHOLD: u64 = 25_000;
    let config = dir.path().join("int.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"intc\"\nlisten = \"127.0.0.1:{port}\"\nworkers = 2\n\
             [export]\ncollector = \"http://{}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{mport}\"\n\
             [[detect]]\nflows = \"dport=7001\"\ndetector = \"per_hop\"\n\
             metric = \"hop_latency\"\nthreshold = \"10us\"\n\
             [[detect]]\nflows = \"proto=udp,dport=7001\"\ndetector = \"per_flow\"\n\
             metric = \"hop_latency\"\nthreshold = \"25us\"\n",
            c.addr
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let (_p, murl) = int_collector(&["--config", config], mport);
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = format!("127.0.0.1:{port}");

    // Phase 1, nothing dropped: flow dport 7001 runs per-hop and per-flow detection at the
    // collector, both rules on every report; dport 7002 has no rule (its switch filtered) and
    // every report of it is an event.
    let mut state = 0u64;
    let mut expected = Vec::new();
    let (mut flow_state, mut flow_expected) = (0u64, Vec::new());
    let mut seq = 0u32;
    for i in 0..400u64 {
        // A latency that wanders, with jumps: unique values so events can be told apart.
        let latency = 1_000 + (i * 7919) % 30_000 + i;
        if latency.abs_diff(state) > THRESHOLD {
            state = latency;
            expected.push(latency);
        }
        if latency.abs_diff(flow_state) > FLOW_THRESHOLD {
            flow_state = latency;
            flow_expected.push(latency);
        }
        tx.send_to(&report(5, seq, latency, 7001), &to).unwrap();
        seq += 1;
        if i % 40 == 0 {
            tx.send_to(&report(5, seq, 77_000 + i, 7002), &to).unwrap();
            seq += 1;
        }
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let switch_events = 10;
    let events_url = format!("http://{}/api/v1/events?limit=10000", c.addr);
    let mut got: Vec<serde_json::Value> = Vec::new();
    wait_for("events stored", || {
        let v: serde_json::Value = ureq::get(&events_url).call().unwrap().into_json().unwrap();
        got = v["events"].as_array().unwrap().clone();
        got.len() >= expected.len() + flow_expected.len() + switch_events
    });
    let mut fired: Vec<u64> = got
        .iter()
        .filter(|e| e["detector"] == "per_hop")
        .map(|e| {
            assert_eq!(e["metric"], "hop_latency");
            assert_eq!(e["switch_id"], 5);
            assert_eq!(e["flow"]["dport"], 7001);
            e["value"].as_u64().unwrap()
        })
        .collect();
    fired.sort_unstable();
    let mut want = expected.clone();
    want.sort_unstable();
    assert_eq!(fired, want, "per-hop events differ from the reference evaluation");
    // The second rule fired on its own state, and each of its events names it.
    let mut fired: Vec<u64> = got
        .iter()
        .filter(|e| e["detector"] == "per_flow")
        .map(|e| {
            assert_eq!((&e["metric"], &e["threshold"]), (&"hop_latency".into(), &25_000.into()));
            assert_eq!(e["flow"]["dport"], 7001);
            e["value"].as_u64().unwrap()
        })
        .collect();
    fired.sort_unstable();
    flow_expected.sort_unstable();
    assert!(!flow_expected.is_empty() && flow_expected.len() < expected.len());
    assert_eq!(fired, flow_expected, "per-flow events differ from the reference evaluation");
    assert_eq!(got.len(), expected.len() + flow_expected.len() + switch_events);
    assert_eq!(got.iter().filter(|e| e["detector"] == "switch").count(), switch_events);
    let m = metrics(&murl);
    assert_eq!(lost(&m), 0);

    // Phase 2: nftables drops about 5 % of the datagrams to the collector's port, and
    // counts them; the collector must count exactly as many lost.
    let table = format!("tmint{}", std::process::id());
    nft(&format!("add table inet {table}"));
    let _cleanup = Cleanup(table.clone());
    nft(&format!("add chain inet {table} input {{ type filter hook input priority -10 ; }}"));
    nft(&format!(
        "add rule inet {table} input udp dport {port} numgen random mod 100 < 5 counter drop"
    ));
    for i in 0..20_000u64 {
        tx.send_to(&report(5, seq, 1_000 + i % 100, 7001), &to).unwrap();
        seq += 1;
        if i % 200 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let listing = nft(&format!("list chain inet {table} input"));
    let dropped: u64 = listing
        .split("packets ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("the rule's counter");
    nft(&format!("delete table inet {table}"));
    // A tail that arrives, so a drop at the very end shows as a gap too.
    for _ in 0..5 {
        tx.send_to(&report(5, seq, 1_000, 7001), &to).unwrap();
        seq += 1;
    }
    let total = u64::from(seq);
    let until = Instant::now() + Duration::from_secs(20);
    let m = loop {
        let m = metrics(&murl);
        if sum(&m, "telemark_int_node_datagrams_total") + lost(&m) >= total {
            break m;
        }
        assert!(Instant::now() < until, "not every datagram accounted for: {m:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let socket_drops = sum(&m, "telemark_int_socket_drops_total");
    assert!(dropped > 500, "nftables dropped only {dropped}");
    assert_eq!(
        lost(&m),
        dropped + socket_drops,
        "lost reports differ from nftables' count {dropped} (+ {socket_drops} socket drops)"
    );
    assert_eq!(sum(&m, "telemark_int_node_datagrams_total"), total - dropped - socket_drops);
}

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("nft").args(["delete", "table", "inet", &self.0]).output();
    }
}

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The same over AF_XDP: a sender in a namespace behind a veth pair, nftables dropping about
/// 5 % on the sender's way out; every report reaches the XDP socket or is counted lost, and
/// the count equals the rule's.
#[test]
fn over_af_xdp_lost_reports_match_nftables() {
    let ns = format!("tmix{}", std::process::id() % 100_000);
    let host = format!("{ns}h");
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    sh(&["ip", "netns", "add", &ns]);
    let _ns = Netns(ns.clone());
    sh(&["ip", "link", "add", &host, "type", "veth", "peer", "name", "p0", "netns", &ns]);
    sh(&["ip", "addr", "add", "10.235.0.1/30", "dev", &host]);
    sh(&["ip", "link", "set", &host, "up"]);
    sh(&["ip", "-n", &ns, "addr", "add", "10.235.0.2/30", "dev", "p0"]);
    sh(&["ip", "-n", &ns, "link", "set", "p0", "up"]);
    let nft_ns = |args: &str| {
        let mut a = vec!["netns", "exec", ns.as_str(), "nft"];
        a.extend(args.split(' '));
        let out = Command::new("ip").args(&a).output().unwrap();
        assert!(out.status.success(), "nft {args}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let dir = tempfile::tempdir().unwrap();
    let c = collector(dir.path());
    let mport = tcp_port();
    let url = format!("http://{}", c.addr);
    let metrics_at = format!("127.0.0.1:{mport}");
    let args = [
        "--listen",
        "10.235.0.1:32766",
        "--allow",
        "10.235.0.2",
        "--xdp",
        &host,
        "--collector",
        &url,
    ];
    let (_p, murl) = int_collector(&[&args[..], &["--metrics", &metrics_at]].concat(), mport);
    let tx = in_netns(Some(&ns), || UdpSocket::bind("10.235.0.2:0")).unwrap();
    // The first number a collector sees starts its window: nothing before it can count as
    // lost. Sequence number 0 goes out (again, until it arrives) before anything is dropped.
    let mut first_sends = 0u64;
    wait_for("the first datagram", || {
        tx.send_to(&report(9, 0, 1_000, 7002), "10.235.0.1:32766").unwrap();
        first_sends += 1;
        sum(&metrics(&murl), "telemark_int_node_datagrams_total") > 0
    });
    nft_ns("add table inet tmdrop");
    nft_ns("add chain inet tmdrop out { type filter hook output priority 0 ; }");
    nft_ns("add rule inet tmdrop out udp dport 32766 numgen random mod 100 < 5 counter drop");
    let total = 10_000u32;
    let ns2 = ns.clone();
    std::thread::spawn(move || {
        let tx = in_netns(Some(&ns2), || UdpSocket::bind("10.235.0.2:0")).unwrap();
        for seq in 1..total {
            // A datagram nftables drops on the way out fails with EPERM: that is the point.
            let _ = tx.send_to(&report(9, seq, 1_000 + u64::from(seq), 7002), "10.235.0.1:32766");
            if seq % 200 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    })
    .join()
    .unwrap();
    let listing = nft_ns("list chain inet tmdrop out");
    let dropped: u64 = listing
        .split("packets ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("the rule's counter");
    // A datagram must arrive after the last drop for that drop to show as a gap: with the
    // rule gone, trailing datagrams go out (one more each round) until one has arrived.
    nft_ns("delete table inet tmdrop");
    let mut sent = total;
    let mut m = BTreeMap::new();
    wait_for("every datagram accounted for", || {
        m = metrics(&murl);
        let received = sum(&m, "telemark_int_node_datagrams_total");
        // The workers publish their own counters ten times a second: wait for those too.
        let done = received + lost(&m) > u64::from(total)
            && sum(&m, "telemark_int_datagrams_total")
                >= received + sum(&m, "telemark_int_duplicates_total");
        if !done {
            tx.send_to(&report(9, sent, 1_000, 7002), "10.235.0.1:32766").unwrap();
            sent += 1;
        }
        done
    });
    std::thread::sleep(Duration::from_millis(300));
    m = metrics(&murl);
    let received = sum(&m, "telemark_int_node_datagrams_total");
    // Datagrams the AF_XDP ring had no room for (a loaded machine) are lost too, and counted
    // apart: lost less those is the network's loss, nftables' count.
    let ring = sum(&m, "telemark_int_socket_drops_total");
    assert!(dropped > 200, "nftables dropped only {dropped}");
    assert_eq!(lost(&m) - ring, dropped, "{m:?}");
    assert_eq!(received, u64::from(sent) - dropped - ring);
    // They came through XDP, not the kernel's UDP socket. Sequence number 0 may have gone
    // out more than once before the collector's metrics showed it: those copies arrive as
    // duplicates, counted per path but not per node.
    let duplicates = sum(&m, "telemark_int_duplicates_total");
    assert!(duplicates < first_sends, "{duplicates} duplicates from {first_sends} sends of 0");
    assert_eq!(
        m.get("telemark_int_datagrams_total{collector=\"int-collector\",path=\"xdp\"}"),
        Some(&(received + duplicates))
    );
    assert_eq!(
        m.get("telemark_int_datagrams_total{collector=\"int-collector\",path=\"udp\"}"),
        Some(&0)
    );
    let events_url = format!("http://{}/api/v1/events?limit=10", c.addr);
    wait_for("events stored", || {
        let v: serde_json::Value = ureq::get(&events_url).call().unwrap().into_json().unwrap();
        v["events"].as_array().is_some_and(|e| !e.is_empty())
    });
}

/// The forgeries of issue 31 item 7, each against what the test sent: reports from a sender
/// outside `--allow` (4,238 of them were stored as events), one datagram whose sequence number
/// jumps 2,096,125 ahead (it was counted as that many lost), and 4,200 made-up node IDs
/// filling the 4,096-entry node table (a real node then had no metrics).
#[test]
fn forged_reports_are_refused_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let c = collector(dir.path());
    let port = free_port();
    let mport = tcp_port();
    let url = format!("http://{}", c.addr);
    let (listen, metrics_at) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{mport}"));
    let args = [
        "--listen",
        &listen,
        "--allow",
        "127.0.0.1/32",
        "--collector",
        &url,
        "--metrics",
        &metrics_at,
    ];
    let (_p, murl) = int_collector(&args, mport);
    let real = UdpSocket::bind("127.0.0.1:0").unwrap();
    // 127.0.0.2 is loopback too, but not allowed.
    let forger = UdpSocket::bind("127.0.0.2:0").unwrap();
    let node = |m: &BTreeMap<String, u64>, family: &str, n: u32| -> Option<u64> {
        m.get(&format!("{family}{{collector=\"int-collector\",node=\"{n}\",hw_id=\"0\"}}")).copied()
    };
    // The real node 7: 100 reports, each an event (no rule: its switch filtered).
    for seq in 0..100 {
        real.send_to(&report(7, seq, 1_000, 7002), &listen).unwrap();
    }
    // 4,238 forged reports of node 7 from an address not allowed.
    const FORGED: u64 = 4_238;
    for i in 0..FORGED {
        forger.send_to(&report(7, 5_000 + i as u32, 9_999, 6666), &listen).unwrap();
        if i % 500 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    wait_for("forged datagrams counted", || {
        let m = metrics(&murl);
        sum(&m, "telemark_int_datagrams_total") >= 100 + FORGED
    });
    let m = metrics(&murl);
    assert_eq!(
        m["telemark_int_refused_total{collector=\"int-collector\",reason=\"not_allowed\"}"],
        FORGED
    );
    assert_eq!(node(&m, "telemark_int_node_datagrams_total", 7), Some(100));
    let events_url = format!("http://{}/api/v1/events?limit=10000", c.addr);
    let mut got = Vec::new();
    wait_for("events stored", || {
        let v: serde_json::Value = ureq::get(&events_url).call().unwrap().into_json().unwrap();
        got = v["events"].as_array().unwrap().clone();
        got.len() >= 100
    });
    std::thread::sleep(Duration::from_millis(500));
    let v: serde_json::Value = ureq::get(&events_url).call().unwrap().into_json().unwrap();
    let got = v["events"].as_array().unwrap();
    assert_eq!(got.len(), 100, "only the allowed sender's reports are events");
    assert!(got.iter().all(|e| e["flow"]["dport"] == 7002));
    // The events of one int-collector (or agent), by name.
    let count = |agent: &str| {
        let u = format!("http://{}/api/v1/events?limit=10000&agent={agent}", c.addr);
        let v: serde_json::Value = ureq::get(&u).call().unwrap().into_json().unwrap();
        v["events"].as_array().unwrap().len()
    };
    assert_eq!((count("int-collector"), count("someone-else")), (100, 0));

    // From an allowed address, one datagram 2,096,125 numbers ahead: a jump, not loss.
    real.send_to(&report(7, 99 + 2_096_126, 1_000, 7002), &listen).unwrap();
    real.send_to(&report(7, 99 + 2_096_127, 1_000, 7002), &listen).unwrap();
    wait_for("the jump", || {
        node(&metrics(&murl), "telemark_int_node_datagrams_total", 7) == Some(102)
    });
    let m = metrics(&murl);
    assert_eq!(node(&m, "telemark_int_reports_lost_total", 7), Some(0));
    assert_eq!(node(&m, "telemark_int_reports_missing", 7), Some(0));
    assert_eq!(node(&m, "telemark_int_sequence_jumps_total", 7), Some(1));

    // 4,200 made-up node IDs from the allowed address: 4,095 fit beside node 7, the other
    // 105 are refused and counted; node 7 keeps its window and counters.
    for n in 0..4_200u32 {
        real.send_to(&report(1_000_000 + n, 0, 1, 7002), &listen).unwrap();
        if n % 500 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    real.send_to(&report(7, 99 + 2_096_128, 1_000, 7002), &listen).unwrap();
    wait_for("node 7 after the flood", || {
        node(&metrics(&murl), "telemark_int_node_datagrams_total", 7) == Some(103)
    });
    let m = metrics(&murl);
    assert_eq!(sum(&m, "telemark_int_nodes{"), 4_096);
    assert_eq!(sum(&m, "telemark_int_nodes_refused_total"), 4_200 - 4_095);
    assert_eq!(sum(&m, "telemark_int_nodes_evicted_total"), 0, "nobody idle for 10 minutes");
    assert_eq!(sum(&m, "telemark_int_socket_drops_total"), 0);
}

/// A non-loopback listener without an allow-list does not start.
#[test]
fn a_public_listener_needs_an_allow_list() {
    let out = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["int-collector", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow"), "{err}");
}

/// A request to the control API with an optional bearer token and body: its status and body.
fn call(method: &str, url: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    let mut r = ureq::request(method, url);
    if let Some(t) = token {
        r = r.set("Authorization", &format!("Bearer {t}"));
    }
    let res = match body {
        Some(b) => r.set("Content-Type", "application/json").send_string(b),
        None => r.call(),
    };
    match res {
        Ok(resp) => (resp.status(), resp.into_string().unwrap()),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap_or_default()),
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

/// The per-hop detector of one switch as the INT paper defines it (§III-C): the stored value
/// starts at zero; a value fires when it moved more than `threshold` from the stored one,
/// which it then replaces. The values that fire, in order.
fn per_hop(state: &mut u64, threshold: u64, values: &[u64]) -> Vec<u64> {
    let mut fired = Vec::new();
    for &v in values {
        if v.abs_diff(*state) > threshold {
            *state = v;
            fired.push(v);
        }
    }
    fired
}

/// `n` hop latencies from `start`, wandering over `spread` ns by `step`.
fn wander(start: u64, n: u64, spread: u64, step: u64) -> Vec<u64> {
    (0..n).map(|i| start + (i * step) % spread + i).collect()
}

/// Every event the collector stored: (time, detector's threshold, value).
fn stored(c: &Collector) -> Vec<(u64, u64, u64)> {
    let url = format!("http://{}/api/v1/events?limit=10000", c.addr);
    let v: serde_json::Value = ureq::get(&url).call().unwrap().into_json().unwrap();
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!((&e["detector"], &e["metric"]), (&"per_hop".into(), &"hop_latency".into()));
            assert_eq!((&e["switch_id"], &e["flow"]["dport"]), (&5.into(), &7001.into()));
            let n = |k: &str| e[k].as_u64().unwrap();
            (n("time_ns"), n("threshold"), n("value"))
        })
        .collect()
}

/// Waits until the collector stored `n` events, then a moment more for any extra.
fn stored_n(c: &Collector, n: usize) -> Vec<(u64, u64, u64)> {
    wait_for(&format!("{n} events stored"), || stored(c).len() >= n);
    std::thread::sleep(Duration::from_millis(500));
    stored(c)
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

/// Issue 31 item 12: the detectors of a running int-collector change through `PUT
/// /api/v1/detectors`. Requests without the control token, or with a wrong one, and bodies
/// that do not check are refused and change nothing: the rules shown and the events raised
/// stay the file's, each flow keeping its state. A lower threshold then raises, from the
/// first report after the answer, the events the reports' values give under it, with each
/// flow's state starting again, where the old rule would raise none.
#[test]
fn detector_rules_change_at_run_time_through_the_control_api() {
    const CONTROL: &str = "5c0ffee5c0ffee5c0ffee5c0ffee5c0f";
    const OLD: u64 = 50_000;
    const NEW: u64 = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let c = collector(dir.path());
    let port = free_port();
    let mport = tcp_port();
    let token_file = dir.path().join("control.token");
    std::fs::write(&token_file, format!("{CONTROL}\n")).unwrap();
    let config = dir.path().join("int.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nworkers = 2\n\
             [export]\ncollector = \"http://{}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{mport}\"\ncontrol_token_file = {:?}\n\
             [[detect]]\nflows = \"dport=7001\"\ndetector = \"per_hop\"\n\
             metric = \"hop_latency\"\nthreshold = \"50us\"\n",
            c.addr,
            token_file.to_str().unwrap()
        ),
    )
    .unwrap();
    let (_p, murl) = int_collector(&["--config", config.to_str().unwrap()], mport);
    let api = format!("http://127.0.0.1:{mport}/api/v1/detectors");
    let file_rules = serde_json::json!({"detect": [{"flows": "dport=7001", "detector": "per_hop",
        "metric": "hop_latency", "threshold": "50us"}]});
    let rules_shown = || {
        let (status, body) = call("GET", &api, Some(CONTROL), None);
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    assert_eq!(rules_shown(), file_rules);
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = format!("127.0.0.1:{port}");
    let mut seq = 0u32;
    let mut send = |values: &[u64]| {
        for &v in values {
            tx.send_to(&report(5, seq, v, 7001), &to).unwrap();
            seq += 1;
        }
    };

    // Phase A, the file's rule.
    let mut state = 0u64;
    let a = wander(100_000, 80, 150_000, 7919);
    let mut want_old = per_hop(&mut state, OLD, &a);
    send(&a);
    assert_eq!(
        sorted(stored_n(&c, want_old.len()).iter().map(|e| e.2).collect()),
        sorted(want_old.clone())
    );

    // Refused: no token, a wrong one (401); bodies that do not check (400, naming the
    // problem); a body over the bound (413).
    let lower = r#"{"detect": [{"flows": "dport=7001", "detector": "per_hop", "metric": "hop_latency", "threshold": "5us"}]}"#;
    assert_eq!(call("PUT", &api, None, Some(lower)).0, 401);
    assert_eq!(call("PUT", &api, Some("5c0ffee5c0ffee5c0ffee5c0ffee5c0e"), Some(lower)).0, 401);
    assert_eq!(call("GET", &api, Some("wrong"), None).0, 401);
    for (body, names) in [
        (r#"{"detect": [{"flows": "dport=7001", "detector": "per_hop""#, "EOF"),
        (
            r#"{"detect": [{"detector": "per_hop", "metric": "hop_latncy", "threshold": "5us"}]}"#,
            "hop_latncy",
        ),
        // The first rule alone would lower the threshold: the second's fault refuses both.
        (
            r#"{"detect": [{"flows": "dport=7001", "detector": "per_hop", "metric": "hop_latency", "threshold": "5us"},
                        {"detector": "per_hop", "metric": "hop_latency"}]}"#,
            "rule 2: detector per_hop needs a threshold",
        ),
        (
            r#"{"detect": [{"detector": "per_hop", "metric": "hop_latency", "threshold": "-5us"}]}"#,
            "negative",
        ),
        (r#"{"rules": []}"#, "unknown field `rules`"),
    ] {
        let (status, answer) = call("PUT", &api, Some(CONTROL), Some(body));
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(names), "{body}: {answer}");
    }
    // Only the head: its declared length is refused before a byte of the body is read.
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", mport)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let head = format!(
        "PUT /api/v1/detectors HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CONTROL}\r\n\
         Content-Length: {}\r\n\r\n",
        70 * 1024
    );
    conn.write_all(head.as_bytes()).unwrap();
    let mut status = [0u8; 12];
    conn.read_exact(&mut status).unwrap();
    assert_eq!(&status[9..], b"413");
    assert_eq!(rules_shown(), file_rules);
    let m = metrics(&murl);
    assert_eq!(sum(&m, "telemark_int_detector_changes_total"), 0);
    let refused = |m: &BTreeMap<String, u64>, why: &str| {
        m[&format!(
            "telemark_int_detector_changes_refused_total{{collector=\"int-collector\",reason=\"{why}\"}}"
        )]
    };
    assert_eq!((refused(&m, "unauthenticated"), refused(&m, "invalid")), (2, 5));
    assert_eq!(m["telemark_int_http_refused_total{reason=\"body_too_large\"}"], 1);

    // Phase B: still the file's rule, and the flow's state kept: the first value is within
    // the threshold of the stored one (from zero it would fire).
    let b = wander(state + 20_000, 80, 150_000, 7919);
    want_old.extend(per_hop(&mut state, OLD, &b));
    assert!(!want_old.contains(&b[0]));
    send(&b);
    let before = stored_n(&c, want_old.len());
    assert_eq!(sorted(before.iter().map(|e| e.2).collect()), sorted(want_old.clone()));
    assert!(before.iter().all(|e| e.1 == OLD));

    // The change: answered once every worker has its new table.
    let (status, answer) = call("PUT", &api, Some(CONTROL), Some(lower));
    assert_eq!(status, 200, "{answer}");
    let lowered: serde_json::Value = serde_json::from_str(lower).unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&answer).unwrap(), lowered);
    assert_eq!(rules_shown(), lowered);

    // Phase C: values within 32 µs of the stored one, which the old rule never fires on, in
    // steps of 3 µs (some fire under 5 µs, some do not); the first is 2 µs from the stored
    // one, which fires only because the flow starts again from zero.
    let c_values = wander(state + 2_000, 80, 30_000, 3_001);
    let old_would = per_hop(&mut state.clone(), OLD, &c_values);
    let mut fresh = 0u64;
    let want_new = per_hop(&mut fresh, NEW, &c_values);
    assert!(old_would.is_empty(), "{old_would:?}");
    assert!((20..60).contains(&want_new.len()), "{} new", want_new.len());
    assert_eq!(want_new[0], c_values[0]);
    send(&c_values);
    let after = stored_n(&c, want_old.len() + want_new.len());
    let new: Vec<_> = after.iter().filter(|e| !before.contains(e)).collect();
    assert_eq!(sorted(new.iter().map(|e| e.2).collect()), sorted(want_new));
    assert!(new.iter().all(|e| e.1 == NEW), "events carry the rule they fired under");
    eprintln!(
        "{} events under the file's 50 us before the change ({} reports), {} under 5 us after \
         it ({} reports; the old rule: {})",
        want_old.len(),
        a.len() + b.len(),
        new.len(),
        c_values.len(),
        old_would.len()
    );
    let m = metrics(&murl);
    assert_eq!(sum(&m, "telemark_int_detector_changes_total"), 1);
    assert_eq!(sum(&m, "telemark_int_detector_rules"), 1);
    assert_eq!((refused(&m, "unauthenticated"), refused(&m, "invalid")), (2, 5));
    // The same rules again: answered, not applied again.
    assert_eq!(call("PUT", &api, Some(CONTROL), Some(lower)).0, 200);
    assert_eq!(sum(&metrics(&murl), "telemark_int_detector_changes_total"), 1);
}

/// Without a control token the control API is off (404, as the agent's), whatever the
/// request; and a control token is served on loopback only.
#[test]
fn the_control_api_is_off_without_a_token_and_on_loopback_only() {
    let port = free_port();
    let mport = tcp_port();
    let (listen, metrics_at) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{mport}"));
    let (_p, _) = int_collector(&["--listen", &listen, "--metrics", &metrics_at], mport);
    let api = format!("http://{metrics_at}/api/v1/detectors");
    assert_eq!(call("GET", &api, None, None).0, 404);
    let (status, body) = call("PUT", &api, Some("anything"), Some(r#"{"detect": []}"#));
    assert_eq!(status, 404);
    assert!(body.contains("control_token_file"), "{body}");

    let dir = tempfile::tempdir().unwrap();
    for (name, token) in [("read.token", "r0r0r0r0r0r0r0r0"), ("control.token", "c0c0c0c0c0c0c0c0")]
    {
        std::fs::write(dir.path().join(name), token).unwrap();
    }
    let config = dir.path().join("int.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\n[metrics]\nlisten = \"0.0.0.0:{mport}\"\n\
             token_file = {:?}\ncontrol_token_file = {:?}\n",
            dir.path().join("read.token"),
            dir.path().join("control.token")
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["int-collector", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loopback only"), "{err}");
}

/// Its token goes to a collector on another host only inside TLS, as the agent's does: an
/// `http://` collector off this host with a token is refused at start, naming the opt-in;
/// with `insecure_token = true` it starts (and says so); loopback needs no opt-in.
#[test]
fn its_token_crosses_the_network_in_clear_text_only_when_the_operator_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("export.token");
    std::fs::write(&token, "export-token-0123456789abcdef").unwrap();
    let run = |collector: &str, extra: &str| {
        let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = dir.path().join("int.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\n[export]\ncollector = \"{collector}\"\n\
                 token_file = {token:?}\n{extra}"
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_telemark"))
            .args(["int-collector", "--config", config.to_str().unwrap()])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Refused at start, or still running a second later.
        std::thread::sleep(Duration::from_secs(1));
        let running = child.try_wait().unwrap().is_none();
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        (running, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (running, err) = run("http://192.0.2.9:9900", "");
    assert!(!running, "started with its token in clear text to another host");
    assert!(err.contains("clear text") && err.contains("insecure_token"), "{err}");
    let (running, err) = run("http://192.0.2.9:9900", "insecure_token = true\n");
    assert!(running, "{err}");
    assert!(err.contains("clear text"), "a warning: {err}");
    let (running, err) = run("http://127.0.0.1:9900", "");
    assert!(running, "{err}");
}
