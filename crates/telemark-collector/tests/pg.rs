//! The shared store on a real PostgreSQL 15 server (Debian's `postgresql`), started by the
//! test as the `postgres` user on its own port and socket directory, and read back with
//! `psql`, not through Telemark. Needs root (to run the server as `postgres`).

use std::net::SocketAddr;
use telemark_collector::pg::PgStore;
use telemark_collector::{Collector, Config};
use telemark_core::records::{Flow, HealthRecord, LossRecord, Record, Scope};
use telemark_transport::exporter::Exporter;

#[path = "../../telemark/tests/common/pg.rs"]
mod pg_server;
use pg_server::Server;

fn loss(agent: &str, sport: u16, b: u64, lost: u64) -> Record {
    Record::Loss(LossRecord {
        agent: agent.into(),
        port: "p".into(),
        point: "ingress".into(),
        upstream: None,
        flow: Flow {
            src: "10.0.0.1".into(),
            dst: "10.0.0.2".into(),
            sport,
            dport: 80,
            proto: 17,
            spi: None,
            si: None,
        },
        color: (b % 2) as u8,
        batch: b,
        period_ns: None,
        // Over three days, so that records land in three partitions.
        first_ns: 1_790_000_000_000_000_000 + b * 60_000_000_000,
        last_ns: 1_790_000_000_000_000_000 + b * 60_000_000_000 + 1,
        expected: Some(100),
        observed: 100 - lost,
        lost,
        late: 0,
        uncertain: 0,
        scope: Scope::Segment,
        tail: false,
        incomplete: false,
        drops: Vec::new(),
        ttl: None,
        own_colour: 0,
    })
}

/// Two collectors store the same records at once, in different orders and chunks, each
/// chunk twice: psql finds every record once, the per-flow loss sums equal the truth, and
/// each record was counted new by exactly one of them. A third collector connecting finds
/// the schema applied and applies nothing again.
#[test]
fn two_collectors_store_each_record_once() {
    let server = Server::start();
    let agents = ["h1", "h2"];
    let mut truth_lost = 0u64;
    let mut records: Vec<(&str, u64, Record)> = Vec::new();
    for agent in agents {
        for b in 0..3000u64 {
            let lost = u64::from(b % 11 == 0) * (b % 5 + 1);
            truth_lost += lost;
            let mut r = loss(agent, 4000 + (b % 20) as u16, b, lost);
            // Every seventh a marking period of the eBPF datapath, every 21st incomplete.
            if let Record::Loss(l) = &mut r {
                l.period_ns = (b % 7 == 0).then_some(100_000_000);
                l.incomplete = b % 21 == 0;
            }
            records.push((agent, b, r));
        }
    }
    let total = records.len() as u64;
    let run = |rev: bool, chunk: usize| {
        let mut s = PgStore::connect(&server.url(), None).unwrap();
        let mut mine: Vec<&(&str, u64, Record)> = records.iter().collect();
        if rev {
            mine.reverse();
        }
        let mut accepted = 0;
        for c in mine.chunks(chunk) {
            for _ in 0..2 {
                for agent in agents {
                    let batch: Vec<(u64, &Record)> =
                        c.iter().filter(|r| r.0 == agent).map(|r| (r.1, &r.2)).collect();
                    if !batch.is_empty() {
                        accepted += s.store(agent, 1, &batch, "kafka", None, 1).unwrap().accepted;
                    }
                }
            }
        }
        accepted
    };
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(|| run(false, 97));
        let b = sc.spawn(|| run(true, 131));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a + b, total, "each record new at exactly one collector ({a} + {b})");
    assert_eq!(server.psql("telemark", "SELECT COUNT(*) FROM loss"), total.to_string());
    assert_eq!(
        server.psql(
            "telemark",
            "SELECT COUNT(*) FROM (SELECT 1 FROM loss GROUP BY agent, boot, seq HAVING COUNT(*) > 1) d"
        ),
        "0"
    );
    assert_eq!(server.psql("telemark", "SELECT SUM(lost) FROM loss"), truth_lost.to_string());
    assert_eq!(
        server.psql("telemark", "SELECT SUM(lost), SUM(batches) FROM flow_hours"),
        format!("{truth_lost}|{total}")
    );
    for sums in ["flow_days", "segment_hours"] {
        assert_eq!(
            server.psql("telemark", &format!("SELECT SUM(lost), SUM(batches) FROM {sums}")),
            format!("{truth_lost}|{total}"),
            "{sums}"
        );
    }
    let parts = server
        .psql("telemark", "SELECT COUNT(*) FROM pg_inherits WHERE inhparent = 'loss'::regclass");
    assert_eq!(parts, "3", "one partition a day");
    let mut third = PgStore::connect(&server.url(), None).unwrap();
    // Each migration applied once (six so far), whoever connected first.
    assert_eq!(server.psql("telemark", "SELECT COUNT(*) FROM telemark_migrations"), "6");
    // Stored as sent, read back by psql: 429 of 3,000 a period each agent, 143 incomplete.
    assert_eq!(
        server.psql(
            "telemark",
            "SELECT COUNT(*) FILTER (WHERE period_ns = 100000000 AND batch % 7 = 0), \
             COUNT(*) FILTER (WHERE period_ns IS NOT NULL), COUNT(*) FILTER (WHERE incomplete) \
             FROM loss"
        ),
        "858|858|286"
    );
    // The fourth added the marking period to every day's partition.
    assert_eq!(
        server.psql(
            "telemark",
            "SELECT COUNT(*) FROM information_schema.columns WHERE column_name = 'period_ns' \
             AND table_name LIKE 'loss%'"
        ),
        "4",
        "loss and its three partitions"
    );

    // Retention drops whole days: everything before the second day's start goes, nothing
    // after it.
    const DAY: u64 = 86_400_000_000_000;
    let second_day = (1_790_000_000_000_000_000 / DAY + 1) * DAY;
    let keep = server
        .psql("telemark", &format!("SELECT COUNT(*) FROM loss WHERE first_ns >= {second_day}"));
    let gone = third.expire(second_day).unwrap();
    assert_eq!(server.psql("telemark", "SELECT COUNT(*) FROM loss"), keep);
    assert_eq!(gone, total - keep.parse::<u64>().unwrap());
    assert_eq!(
        server.psql(
            "telemark",
            "SELECT COUNT(*) FROM pg_inherits WHERE inhparent = 'loss'::regclass"
        ),
        "2"
    );

    // The server restarts under connected stores: the next calls connect again (the first
    // may fail, finding the connection gone). A day that a collector's retention dropped
    // after another one saw it is made again for a record of it.
    server.restart();
    let agents = (0..20).find_map(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        third.agents().ok()
    });
    assert_eq!(agents.map(|a| a.len()), Some(2));
    let first_day_record = [(0, &records[0].2)];
    let mut fourth = PgStore::connect(&server.url(), None).unwrap();
    assert_eq!(fourth.store("h1", 2, &first_day_record, "kafka", None, 1).unwrap().accepted, 1);
    // The first day again, gone now (third knew it when it made it above).
    third.expire(second_day).unwrap();
    let st = (0..3).find_map(|_| fourth.store("h1", 3, &first_day_record, "kafka", None, 1).ok());
    assert_eq!(st.map(|s| s.accepted), Some(1));
}

fn get(addr: SocketAddr, path: &str) -> serde_json::Value {
    let r = ureq::get(&format!("http://{addr}{path}")).call().unwrap();
    serde_json::from_str(&r.into_string().unwrap()).unwrap()
}

/// A minute ago, on a whole second.
fn base_ns() -> u64 {
    (telemark_collector::now_ns() / 1_000_000_000 - 60) * 1_000_000_000
}

/// One flow through two switches, whose agents send to two collectors on one database: sw-b
/// (a little loss inside it) to the first, sw-f (a lot on the link into it) to the second.
/// Each collector's `/api/v1/localise` names the same, right segment with the truth's count,
/// `/api/v1/flows` gives the same whole-path loss from both, and a ring-drop caveat that sw-f's
/// health records (sent to the second) give shows on the first.
#[test]
fn a_flows_points_at_two_collectors_give_one_answer() {
    let server = Server::start();
    let start = || {
        let cfg = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            db: server.url().into(),
            workers: 2,
            ..Config::default()
        };
        Collector::start(&cfg).expect("collector starts on PostgreSQL")
    };
    let (c1, c2) = (start(), start());
    let base = base_ns();
    let loss =
        |agent: &str, point: &str, upstream: Option<&str>, batch: u64, lost: u64, skew: u64| {
            Record::Loss(LossRecord {
                agent: agent.into(),
                port: "p1".into(),
                point: point.into(),
                upstream: upstream.map(str::to_string),
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
                first_ns: base + batch * 10_000_000 + skew,
                last_ns: base + batch * 10_000_000 + 9_000_000 + skew,
                expected: Some(100),
                observed: 100 - lost,
                lost,
                late: 0,
                uncertain: 0,
                scope: if upstream.is_some() { Scope::Segment } else { Scope::Path },
                tail: false,
                incomplete: false,
                drops: Vec::new(),
                ttl: None,
                own_colour: 0,
            })
        };
    let mut b = Exporter::new(&format!("http://{}", c1.addr), "sw-b", 1, 1000);
    let mut f = Exporter::new(&format!("http://{}", c2.addr), "sw-f", 1, 1000);
    for n in 0..40 {
        let inside_b = u64::from(n % 10 == 0);
        if inside_b > 0 {
            b.push(loss("sw-b", "egress", Some("ingress"), n, inside_b, 0));
        }
        // 300 µs after sw-b: the collector finds sw-b upstream by that.
        f.push(loss("sw-f", "ingress", None, n, 5 + n % 3 + inside_b, 300_000));
    }
    f.push(Record::Health(HealthRecord {
        agent: "sw-f".into(),
        interval_start_ns: base,
        interval_end_ns: base + 1_000_000_000,
        rx: 1000,
        rx_ring_drops: 37,
        ..Default::default()
    }));
    b.flush().unwrap();
    f.flush().unwrap();
    let truth_f: u64 = (0..40).map(|n| 5 + n % 3).sum();
    let q = "/api/v1/localise?src=10.0.0.1&dst=10.0.0.7&sport=40000&dport=5201&proto=17";
    let answers: Vec<serde_json::Value> = [&c1, &c2].iter().map(|c| get(c.addr, q)).collect();
    for v in &answers {
        assert_eq!(v["lost"].as_u64(), Some(truth_f + 4), "{v}");
        assert_eq!(v["verdict"]["agent"], "sw-f", "{v}");
        assert_eq!(v["verdict"]["point"], "ingress", "{v}");
        assert_eq!(v["verdict"]["lost"].as_u64(), Some(truth_f), "{v}");
        let caveat = v["verdict"]["caveat"].as_str().unwrap_or_default();
        assert!(caveat.contains("sw-f dropped 37 frames"), "{v}");
    }
    assert_eq!(answers[0], answers[1]);
    for c in [&c1, &c2] {
        let flows = get(c.addr, "/api/v1/flows");
        assert_eq!(flows[0]["lost"].as_u64(), Some(truth_f + 4), "{flows}");
        let agents = get(c.addr, "/api/v1/agents");
        assert_eq!(agents.as_array().map(Vec::len), Some(2), "{agents}");
        // The console's overview, from the records and from the hourly sums: every stored
        // packet lost, as psql sums them.
        let all = server.psql("telemark", "SELECT SUM(lost) FROM loss");
        for bucket in ["1000000000", "3600000000000"] {
            let o = get(
                c.addr,
                &format!(
                    "/api/v1/overview?from={}&to={}&bucket_ns={bucket}",
                    base - 3_600_000_000_000,
                    base + 3_600_000_000_000
                ),
            );
            assert_eq!(o["total"]["lost"].to_string(), all, "{o}");
            assert_eq!(o["segments"][0]["agent"], "sw-f", "{o}");
        }
    }
    assert_eq!(server.psql("telemark", "SELECT COUNT(*) FROM loss"), "44");
}

/// Host mode's wire between two hosts, settled by two collectors sharing the database: host a
/// marks a flow and counts 10 packets a period (100 ms) out of its uplink; host b counts them
/// in at its own, less 3 of period 12 and all of period 25 (the periods either side of it
/// counted). Each collector settles the segment (`settle`), but psql finds each second stored
/// once and the sums with the loss once; both collectors' overviews (from the records and the
/// hourly sums) and lossy flows list give the wire's 13, and the flows list the flow.
#[test]
fn two_collectors_settle_the_wire_between_two_hosts_once() {
    let server = Server::start();
    let start = || {
        let cfg = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            db: server.url().into(),
            workers: 2,
            ..Config::default()
        };
        Collector::start(&cfg).expect("collector starts on PostgreSQL")
    };
    let (c1, c2) = (start(), start());
    const T: u64 = 100_000_000;
    // Periods 0..40 from two periods after a whole second 3 s ago: in 5 seconds. Recent, so
    // that they are stored before the settler may judge them (10 s after they end): a fresh
    // database is settled from ten minutes back at once, and seconds already settled are not
    // judged again (records later than that are not in the sums, docs/collector.md).
    let k0 = (telemark_collector::now_ns() / 1_000_000_000 - 3) * (1_000_000_000 / T) + 2;
    let period = |agent: &str, point: &str, scope: Scope, k: u64, n: u64, at: u64| {
        Record::Loss(LossRecord {
            agent: agent.into(),
            port: "up".into(),
            point: point.into(),
            upstream: None,
            flow: Flow {
                src: "10.0.0.1".into(),
                dst: "10.0.1.1".into(),
                sport: 7777,
                dport: 7777,
                proto: 17,
                spi: None,
                si: None,
            },
            color: (k % 2) as u8,
            batch: k,
            period_ns: Some(T),
            first_ns: k * T + at,
            last_ns: k * T + at + T / 2,
            expected: None,
            observed: n,
            lost: 0,
            late: 0,
            uncertain: 0,
            scope,
            tail: false,
            incomplete: false,
            drops: Vec::new(),
            ttl: None,
            own_colour: 0,
        })
    };
    let mut a = Exporter::new(&format!("http://{}", c1.addr), "host-a", 1, 1000);
    let mut b = Exporter::new(&format!("http://{}", c2.addr), "host-b", 1, 1000);
    for k in k0..k0 + 40 {
        a.push(period("host-a", "out:up", Scope::Segment, k, 10, 1_000));
        let got = match k - k0 {
            12 => 7,
            25 => continue,
            _ => 10,
        };
        b.push(period("host-b", "in:up", Scope::Path, k, got, 2_000_000));
    }
    a.flush().unwrap();
    b.flush().unwrap();
    // Both collectors settle once the periods are 10 s old, at their next pass (every 5 s):
    // the wait ends as soon as the wire is settled.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let settled = || server.psql("telemark", "SELECT COALESCE(SUM(periods), 0) FROM link_sums");
    while settled() != "39" && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    // Each second once: 39 periods judged (the last one waits for more).
    assert_eq!(
        server.psql(
            "telemark",
            "SELECT COUNT(*), SUM(periods), SUM(lost), SUM(expected) FROM link_sums"
        ),
        "5|39|13|390"
    );
    assert_eq!(
        server.psql(
            "telemark",
            "SELECT agent, point, upstream, SUM(lost), SUM(batches) FROM segment_hours \
             WHERE scope = 'link' GROUP BY 1, 2, 3"
        ),
        "host-b|in:up|host-a/out:up|13|39"
    );
    let (from, to) = (base_ns() - 3_600_000_000_000, base_ns() + 3_600_000_000_000);
    for c in [&c1, &c2] {
        for bucket in ["1000000000", "3600000000000"] {
            let o =
                get(c.addr, &format!("/api/v1/overview?from={from}&to={to}&bucket_ns={bucket}"));
            let link = &o["segments"][0];
            assert_eq!(
                (&link["scope"], &link["agent"], &link["upstream"]),
                (&"link".into(), &"host-b".into(), &"host-a/out:up".into()),
                "{o}"
            );
            assert_eq!(link["total"]["lost"], 13, "{o}");
            assert_eq!(o["total"]["lost"], 13, "{o}");
        }
        let lossy = get(c.addr, &format!("/api/v1/flows?lossy=true&from={from}&to={to}"));
        assert_eq!(lossy.as_array().map(Vec::len), Some(1), "{lossy}");
        assert_eq!(lossy[0]["lost"], 13, "{lossy}");
    }
}
