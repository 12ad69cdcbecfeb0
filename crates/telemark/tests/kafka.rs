//! Telemark's records on a real Apache Kafka broker (KRaft, one node, from the Maven Central
//! jars `bash testbed/kafka/fetch.sh` puts in testbed/kafka/libs; `bash .ci/run` does), started
//! and stopped by the tests, and read back with Kafka's own console consumer.
//!
//! Needs Java 17 and the jars; the live test needs root (the demo's namespace testbed).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

fn libs() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testbed/kafka");
    let libs = dir.join("libs");
    assert!(
        libs.join(".complete").exists(),
        "the Kafka jars are missing: run `bash testbed/kafka/fetch.sh` (bash .ci/run does)"
    );
    libs
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn java(libs: &Path) -> Command {
    let mut c = Command::new("java");
    c.arg("-Xmx512m").arg("-cp").arg(format!("{}/*", libs.display()));
    c.arg(format!("-Dlog4j2.configurationFile={}", libs.join("../log4j2.properties").display()));
    c
}

/// A one-node broker in a temporary directory; killed when dropped.
pub struct Broker {
    libs: PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
}

impl Broker {
    /// Formats and starts one.
    pub fn start() -> Broker {
        let mut b = Broker::formatted();
        b.run();
        b
    }

    /// Formats and starts one that creates no topic by itself (as production brokers are
    /// often set).
    pub fn start_without_auto_create() -> Broker {
        let mut b = Broker::formatted_with(false);
        b.run();
        b
    }

    /// Formats one's storage and chooses its port, without starting it.
    pub fn formatted() -> Broker {
        Broker::formatted_with(true)
    }

    fn formatted_with(auto_create: bool) -> Broker {
        let libs = libs();
        let dir = tempfile::tempdir().unwrap();
        // Two ports, distinct (the OS may hand the same free port out twice in a row).
        let port = free_port();
        let controller = std::iter::repeat_with(free_port).find(|c| *c != port).unwrap();
        let props = format!(
            "process.roles=broker,controller\nnode.id=1\n\
             controller.quorum.voters=1@127.0.0.1:{controller}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
             controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n\
             log.dirs={}\nnum.partitions=4\noffsets.topic.replication.factor=1\n\
             transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n\
             group.initial.rebalance.delay.ms=0\nauto.create.topics.enable={auto_create}\n",
            dir.path().join("data").display()
        );
        std::fs::write(dir.path().join("server.properties"), props).unwrap();
        let out = java(&libs)
            .args(["kafka.tools.StorageTool", "format", "-t", "tmkafkatestcluster0001", "-c"])
            .arg(dir.path().join("server.properties"))
            .args(["--standalone"])
            .output()
            .unwrap();
        if !out.status.success() {
            // Older StorageTool: without --standalone.
            let out = java(&libs)
                .args(["kafka.tools.StorageTool", "format", "-t", "tmkafkatestcluster0001", "-c"])
                .arg(dir.path().join("server.properties"))
                .output()
                .unwrap();
            assert!(out.status.success(), "format: {}", String::from_utf8_lossy(&out.stderr));
        }
        Broker { libs, dir, port, child: None }
    }

    /// Starts it and waits until it answers.
    pub fn run(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("broker.log")).unwrap();
        let child = java(&self.libs)
            .arg("kafka.Kafka")
            .arg(self.dir.path().join("server.properties"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(60);
        // Ready when it answers a metadata request for a topic it creates.
        loop {
            let probe = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            if probe && self.topics().is_some() {
                return;
            }
            assert!(Instant::now() < until, "broker not up: {}", self.log());
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }

    /// The topics (None while the broker does not answer).
    pub fn topics(&self) -> Option<Vec<String>> {
        let out = java(&self.libs)
            .args(["org.apache.kafka.tools.TopicCommand", "--bootstrap-server", &self.brokers()])
            .arg("--list")
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
    }

    /// `topic`'s partition count as Kafka's own TopicCommand describes it (None: no topic).
    pub fn partitions(&self, topic: &str) -> Option<u32> {
        let out = java(&self.libs)
            .args(["org.apache.kafka.tools.TopicCommand", "--bootstrap-server", &self.brokers()])
            .args(["--describe", "--topic", topic])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .skip_while(|w| *w != "PartitionCount:")
            .nth(1)
            .and_then(|n| n.parse().ok())
    }

    /// Kills the broker (SIGKILL) and starts it again on the same data and port.
    pub fn kill_and_restart(&mut self, down: Duration) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::thread::sleep(down);
        self.run();
    }

    /// Every message of `topic` from the start, read by Kafka's console consumer: (headers,
    /// key, value) per message. Stops after `idle` without a new message.
    ///
    /// The console consumer gives up after `idle` without a message, which on a loaded
    /// machine can come before it has read every partition; so its count is held against
    /// what the log holds (the partitions' end offsets, GetOffsetShell) and it reads again,
    /// with more patience, while it got fewer. Records missing from the log itself stay
    /// missing: the callers' assertions see them.
    ///
    /// Where the log's count is known, the consumer stops once it has read that many (a topic
    /// whose log is empty is not read at all), rather than wait out `idle` after the last.
    pub fn console_consume(&self, topic: &str, idle: Duration) -> Vec<Message> {
        let held = self.records_in(topic);
        if held == Some(0) {
            return Vec::new();
        }
        let mut msgs = self.console_consume_once(topic, idle, held);
        for patience in [2, 4] {
            if held.is_none_or(|n| msgs.len() as u64 >= n) {
                break;
            }
            println!(
                "{topic}: the console consumer read {} of the {held:?} in the log; again",
                msgs.len()
            );
            msgs = self.console_consume_once(topic, idle * patience, held);
        }
        msgs
    }

    /// Records in `topic`'s log: the sum of its partitions' end offsets (None: not known).
    fn records_in(&self, topic: &str) -> Option<u64> {
        let out = java(&self.libs)
            .args(["org.apache.kafka.tools.GetOffsetShell", "--bootstrap-server"])
            .arg(self.brokers())
            .args(["--topic", topic])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        // `topic:partition:offset` per partition.
        let ends: Option<Vec<u64>> =
            text.lines().map(|l| l.rsplit(':').next()?.trim().parse().ok()).collect();
        out.status.success().then_some(ends?.iter().sum())
    }

    fn console_consume_once(&self, topic: &str, idle: Duration, most: Option<u64>) -> Vec<Message> {
        let mut c = java(&self.libs);
        c.args(["org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server"])
            .arg(self.brokers())
            .args(["--topic", topic, "--from-beginning"])
            .args(["--timeout-ms", &idle.as_millis().to_string()]);
        if let Some(n) = most {
            c.args(["--max-messages", &n.to_string()]);
        }
        let mut c = c
            .args(["--property", "print.key=true", "--property", "print.headers=true"])
            .args(["--property", "key.separator=\t"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(c.stdout.take().unwrap());
        let mut msgs = Vec::new();
        for line in out.lines() {
            let line = line.unwrap();
            let mut parts = line.splitn(3, '\t');
            let (h, k, v) = (parts.next(), parts.next(), parts.next());
            let (Some(h), Some(k), Some(v)) = (h, k, v) else { continue };
            // The formatter's defaults: `name:value` pairs separated by commas.
            let headers = h
                .split(',')
                .filter_map(|kv| kv.split_once(':'))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            msgs.push(Message { headers, key: k.to_string(), value: v.to_string() });
        }
        let _ = c.wait();
        msgs
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One message as the console consumer printed it.
#[derive(Debug, Clone)]
pub struct Message {
    pub headers: BTreeMap<String, String>,
    pub key: String,
    pub value: String,
}

impl Message {
    fn origin(&self) -> (String, u64, u64) {
        let h = |k: &str| self.headers.get(k).cloned().unwrap_or_default();
        (
            h("telemark-agent"),
            h("telemark-boot").parse().unwrap(),
            h("telemark-seq").parse().unwrap(),
        )
    }
}

/// Every record the collector stored, by (agent, boot, seq): its kind and JSON (loss records
/// rebuilt from their columns by the collector's own API would use the code under test, so
/// they are compared field by field with the columns instead).
fn stored(db: &Path) -> BTreeMap<(String, u64, u64), (String, serde_json::Value)> {
    let out = Command::new("sqlite3")
        .arg("-json")
        .arg(db)
        .arg(
            "SELECT agent, boot, seq, kind, json FROM other UNION ALL \
             SELECT agent, boot, seq, 'loss', json_object('flow', json_object('src', src, 'dst', \
             dst, 'sport', sport, 'dport', dport, 'proto', proto), 'point', point, 'batch', \
             batch, 'lost', lost, 'observed', observed, 'first_ns', first_ns) FROM loss",
        )
        .output()
        .expect("sqlite3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    rows.into_iter()
        .map(|r| {
            let key = (
                r["agent"].as_str().unwrap().to_string(),
                r["boot"].as_u64().unwrap(),
                r["seq"].as_u64().unwrap(),
            );
            let json = serde_json::from_str(r["json"].as_str().unwrap()).unwrap();
            (key, (r["kind"].as_str().unwrap().to_string(), json))
        })
        .collect()
}

fn outbox_left(db: &Path) -> String {
    let out = Command::new("sqlite3").arg(db).arg("SELECT kind, COUNT(*), MIN(id), MAX(id), MIN(seq), MAX(seq), agent FROM outbox GROUP BY kind, agent").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs `telemark demo` (root: namespaces, agents on AF_PACKET, congestion) with `extra`
/// flags, its collector publishing to `broker` under topic prefix `prefix`; returns its
/// database.
fn demo_publishing(broker: &Broker, dir: &Path, prefix: &str, extra: &[&str]) -> PathBuf {
    let kafka = dir.join(format!("{prefix}kafka.toml"));
    std::fs::write(
        &kafka,
        format!(
            "[kafka]\nbrokers = \"{}\"\ntopic_prefix = \"{prefix}\"\nlinger_ms = 20\n[publish]\n",
            broker.brokers()
        ),
    )
    .unwrap();
    let db = dir.join(format!("{prefix}db"));
    let out = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["demo", "--no-wait", "--listen", "127.0.0.1:19911", "--db"])
        .arg(&db)
        .arg("--kafka")
        .arg(&kafka)
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "demo: {}", String::from_utf8_lossy(&out.stderr));
    for line in String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.contains("kafka")) {
        println!("demo: {line}");
    }
    db
}

/// Every record stored in `db` is on its kind's topic under `prefix` (Kafka's console
/// consumer reads them), keyed by flow or agent, with its origin in the headers, equal to
/// what was stored, once; and nothing else is there. `required`: kinds the run must have
/// stored. Returns how many records of each kind.
fn assert_topics_hold_what_was_stored(
    broker: &Broker,
    db: &Path,
    prefix: &str,
    required: &[&str],
) -> BTreeMap<String, usize> {
    let stored = stored(db);
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for (kind, _) in stored.values() {
        *kinds.entry(kind.clone()).or_default() += 1;
    }
    for kind in required {
        assert!(kinds.contains_key(*kind), "the demo stored no {kind} record: {kinds:?}");
    }
    let mut seen = BTreeMap::new();
    let every_kind = ["loss", "summary", "flow_loss", "flow", "cost", "capture", "health", "event"];
    for kind in every_kind {
        let topic = format!("{prefix}{kind}.v1");
        let msgs = if kinds.contains_key(kind) {
            broker.console_consume(&topic, Duration::from_secs(5))
        } else {
            Vec::new()
        };
        println!("{topic}: {} messages", msgs.len());
        for m in msgs {
            assert_eq!(m.headers.get("telemark-kind").map(String::as_str), Some(kind), "{m:?}");
            assert_eq!(m.headers.get("telemark-schema").map(String::as_str), Some("1"));
            let v: serde_json::Value = serde_json::from_str(&m.value).unwrap();
            assert_eq!(v["kind"], kind, "{m:?}");
            let origin = m.origin();
            assert!(
                seen.insert(origin.clone(), (kind.to_string(), v, m.key)).is_none(),
                "twice: {origin:?}"
            );
        }
    }
    // A kind the collector did not store must not be on Kafka either.
    let topics = broker.topics().unwrap_or_default();
    for kind in every_kind.iter().filter(|k| !kinds.contains_key(**k)) {
        let topic = format!("{prefix}{kind}.v1");
        if topics.contains(&topic) {
            assert!(broker.console_consume(&topic, Duration::from_secs(3)).is_empty(), "{topic}");
        }
    }
    let missing: Vec<_> = stored.iter().filter(|(o, _)| !seen.contains_key(*o)).collect();
    let extra: Vec<_> = seen.keys().filter(|o| !stored.contains_key(*o)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the topics hold exactly the records stored: {} of {} missing (first {:?}), {} extra \
         (first {:?}); outbox left: {}",
        missing.len(),
        stored.len(),
        missing.first(),
        extra.len(),
        extra.first(),
        outbox_left(db)
    );
    for (origin, (kind, want)) in &stored {
        let (k, got, key) = &seen[origin];
        assert_eq!(k, kind);
        let flow_key = |f: &serde_json::Value| {
            format!(
                "{}/{}/{}/{}/{}",
                f["proto"],
                f["src"].as_str().unwrap(),
                f["sport"],
                f["dst"].as_str().unwrap(),
                f["dport"]
            )
        };
        if kind == "loss" {
            for field in ["point", "batch", "lost", "observed", "first_ns"] {
                assert_eq!(got[field], want[field], "{origin:?} {field}");
            }
            assert_eq!(&got["flow"]["src"], &want["flow"]["src"]);
            assert_eq!(&got["flow"]["dport"], &want["flow"]["dport"]);
            assert_eq!(key, &flow_key(&want["flow"]), "loss records are keyed by their flow");
        } else {
            assert_eq!(got, want, "{origin:?}");
            if kind == "event" {
                // INT events name the flow whose packet fired them.
                assert_eq!(key, &flow_key(&want["flow"]), "events are keyed by their flow");
            } else if kind != "flow" && kind != "flow_loss" {
                assert_eq!(key, &origin.0, "{kind} records are keyed by their agent");
            }
        }
    }
    kinds
}

/// The live demos with their collector publishing to a real broker: the loss demo (loss,
/// summary, cost, health, flow records) and the INT demo (INT events) each put every record
/// their collector stored on its kind's topic, as Kafka's own console consumer reads it.
#[test]
fn every_stored_record_is_on_its_topic_as_kafkas_console_consumer_reads_it() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let short = ["--before", "2s", "--background", "3s", "--after", "2s"];
    let db = demo_publishing(&broker, dir.path(), "telemark.", &short);
    let loss = assert_topics_hold_what_was_stored(
        &broker,
        &db,
        "telemark.",
        &["loss", "summary", "health"],
    );
    println!("loss demo: {loss:?}");
    assert!(loss.values().sum::<usize>() > 50, "only {loss:?} stored");
    let db = demo_publishing(&broker, dir.path(), "tmint.", &[&["--int"][..], &short].concat());
    let int = assert_topics_hold_what_was_stored(&broker, &db, "tmint.", &["event", "health"]);
    println!("INT demo: {int:?}");
}

/// A `telemark collector` process; killed when dropped.
struct Collector {
    child: Child,
    base: String,
    db: PathBuf,
}

impl Collector {
    fn start(db: &Path, kafka: Option<&Path>) -> Collector {
        Collector::start_with(db, kafka, &[])
    }

    fn start_with(db: &Path, kafka: Option<&Path>, extra: &[&str]) -> Collector {
        let k = kafka.map(|k| k.to_string_lossy().into_owned());
        let mut args: Vec<&str> = k.as_deref().map_or(vec![], |k| vec!["--kafka", k]);
        args.extend_from_slice(extra);
        let (child, base) = common::spawn_collector(db, &args);
        Collector { child, base, db: db.to_path_buf() }
    }

    fn metric(&self, name: &str) -> u64 {
        let text = ureq::get(&format!("{}/metrics", self.base))
            .call()
            .map(|r| r.into_string().unwrap_or_default())
            .unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()))
            .map_or(0, |v| v as u64)
    }

    /// Registers `agent` (run 1) and stores `n` loss records numbered from `seq`.
    fn ingest(&self, agent: &str, seq: u64, n: u64) {
        ingest(&self.base, agent, seq, n);
    }

    /// The (agent, boot, seq) of every loss record in its database, read by sqlite3.
    fn loss_keys(&self) -> Vec<(String, u64, u64)> {
        let out = Command::new("sqlite3")
            .arg(&self.db)
            .arg("SELECT agent || ' ' || boot || ' ' || seq FROM loss")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let mut p = l.split(' ');
                let a = p.next().unwrap().to_string();
                (a, p.next().unwrap().parse().unwrap(), p.next().unwrap().parse().unwrap())
            })
            .collect()
    }

    /// SIGTERM, and wait: a clean stop (it leaves its consumer group).
    fn stop(mut self) {
        kill(self.child.id(), "TERM");
        let _ = self.child.wait();
    }
}

/// Registers `agent` (run 1) at the collector at `base` and stores `n` loss records numbered
/// from `seq`.
fn ingest(base: &str, agent: &str, seq: u64, n: u64) {
    let reg = serde_json::json!({"agent": agent, "version": "test", "boot": 1});
    ureq::post(&format!("{}/api/v1/agents", base)).send_json(reg).unwrap();
    let hour_ago = telemark_collector::now_ns() - 3_600_000_000_000;
    for chunk in (seq..seq + n).collect::<Vec<_>>().chunks(1000) {
        let records: Vec<serde_json::Value> = chunk
            .iter()
            .map(|&b| {
                serde_json::json!({
                    "kind": "loss", "agent": agent, "port": "p1", "point": "ingress",
                    "flow": {"src": "10.0.0.1", "dst": "10.0.0.7", "sport": 40000 + b % 64,
                             "dport": 5201, "proto": 17},
                    "color": b % 2, "batch": b, "first_ns": hour_ago + b,
                    "last_ns": hour_ago + 1 + b, "expected": 100, "observed": 99,
                    "lost": 1, "late": 0,
                })
            })
            .collect();
        let body =
            serde_json::json!({"agent": agent, "boot": 1, "seq": chunk[0], "records": records});
        let r = ureq::post(&format!("{}/api/v1/ingest", base)).send_json(body).unwrap();
        assert_eq!(r.status(), 200);
    }
}

fn kill(pid: u32, sig: &str) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One collector publishes; two others in one consumer group store what they read. Every
/// record is stored exactly once across the two (sqlite3 reads both databases), and when one
/// leaves the group the other takes its partitions and stores what follows, nothing lost.
#[test]
fn two_collectors_in_a_group_store_each_record_once_and_hand_over_on_leaving() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let publish = dir.path().join("publish.toml");
    std::fs::write(&publish, format!("[kafka]\nbrokers = \"{}\"\n[publish]\n", broker.brokers()))
        .unwrap();
    let consume = dir.path().join("consume.toml");
    std::fs::write(
        &consume,
        format!("[kafka]\nbrokers = \"{}\"\n[consume]\ngroup = \"tm-test\"\n", broker.brokers()),
    )
    .unwrap();
    let p = Collector::start(&dir.path().join("p.db"), Some(&publish));
    let c1 = Collector::start(&dir.path().join("c1.db"), Some(&consume));
    let c2 = Collector::start(&dir.path().join("c2.db"), Some(&consume));
    // Once the group has settled (each member owns partitions), records come.
    p.ingest("sw-a", 0, 1);
    wait_for("both members own partitions", 90, || {
        let (a, b) = (
            c1.metric("telemark_collector_kafka_partitions"),
            c2.metric("telemark_collector_kafka_partitions"),
        );
        a > 0 && b > 0
    });
    p.ingest("sw-a", 1, 5999);
    let consumed = |a: &Collector, b: &Collector| {
        a.metric("telemark_collector_kafka_consumed_total")
            + b.metric("telemark_collector_kafka_consumed_total")
    };
    wait_for("6,000 records stored by the group", 90, || consumed(&c1, &c2) >= 6000);
    std::thread::sleep(Duration::from_secs(1));
    let (k1, k2) = (c1.loss_keys(), c2.loss_keys());
    assert_eq!(
        k1.len() + k2.len(),
        6000,
        "stored once across the two: {} + {}",
        k1.len(),
        k2.len()
    );
    assert!(
        !k1.is_empty() && !k2.is_empty(),
        "both share the stream: {} and {}",
        k1.len(),
        k2.len()
    );
    let mut all: Vec<_> = k1.into_iter().chain(k2).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 6000);
    // c1 leaves; c2 takes every partition and stores what comes next.
    c1.stop();
    p.ingest("sw-a", 6000, 4000);
    wait_for("the rest stored by c2", 90, || {
        c2.loss_keys().iter().filter(|k| k.2 >= 6000).count() >= 4000
    });
    let k2 = c2.loss_keys();
    let later: Vec<_> = k2.iter().filter(|k| k.2 >= 6000).collect();
    assert_eq!(later.len(), 4000, "c2 stored every record after c1 left");
    assert_eq!(p.metric("telemark_collector_kafka_published_total"), 10_000);
}

/// The origins of every message on `topic` (Kafka's console consumer), with how many times
/// each is there.
fn origins(broker: &Broker, topic: &str) -> BTreeMap<(String, u64, u64), usize> {
    let mut m = BTreeMap::new();
    for msg in broker.console_consume(topic, Duration::from_secs(5)) {
        *m.entry(msg.origin()).or_default() += 1;
    }
    m
}

/// A publishing collector killed with SIGKILL while it publishes: after its restart the outbox
/// publishes the rest. Every stored record is on Kafka; a record is there twice only if it was
/// in flight at the kill (sent, its acknowledgement not yet recorded).
#[test]
fn a_collector_killed_mid_publish_publishes_the_rest_after_restart() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let publish = dir.path().join("publish.toml");
    // Small batches and a short linger: the kill lands mid-stream.
    std::fs::write(
        &publish,
        format!(
            "[kafka]\nbrokers = \"{}\"\nlinger_ms = 50\nbatch_records = 200\nbuffer_records = 2000\n\
             [publish]\n",
            broker.brokers()
        ),
    )
    .unwrap();
    let db = dir.path().join("p.db");
    let p = Collector::start(&db, Some(&publish));
    p.ingest("sw-k", 0, 30_000);
    let published_before = p.metric("telemark_collector_kafka_published_total");
    let in_flight = p.metric("telemark_collector_kafka_in_flight");
    kill(p.child.id(), "KILL");
    drop(p);
    let left: u64 = {
        let out =
            Command::new("sqlite3").arg(&db).arg("SELECT COUNT(*) FROM outbox").output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    assert!(left > 0, "killed after everything was published ({published_before}): kill sooner");
    let p = Collector::start(&db, Some(&publish));
    wait_for("the outbox published after the restart", 90, || {
        p.metric("telemark_collector_kafka_published_total") > 0
            && p.metric("telemark_collector_kafka_outbox_records") == 0
    });
    let on_kafka = origins(&broker, "telemark.loss.v1");
    let missing =
        (0..30_000u64).filter(|s| !on_kafka.contains_key(&("sw-k".into(), 1, *s))).count();
    let twice: usize = on_kafka.values().map(|n| n - 1).sum();
    println!(
        "killed with {left} records in the outbox ({published_before} published, {in_flight} in \
         flight at the last scrape); after restart: {} on Kafka, {twice} twice",
        on_kafka.len()
    );
    assert_eq!(missing, 0, "every stored record is on Kafka");
    assert_eq!(on_kafka.len(), 30_000);
    // Only records sent before the kill and not yet removed from the outbox can be there
    // twice: at most the producer's buffer.
    assert!(twice <= 2000, "{twice} duplicates");
}

/// The broker killed (SIGKILL) and restarted while a collector publishes and another consumes:
/// no record the collector stored is lost, and the consuming collector stores each once.
#[test]
fn a_broker_killed_and_restarted_loses_nothing_acknowledged() {
    let mut broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let publish = dir.path().join("publish.toml");
    std::fs::write(
        &publish,
        format!(
            "[kafka]\nbrokers = \"{}\"\ndelivery_timeout_ms = 10000\n[publish]\n",
            broker.brokers()
        ),
    )
    .unwrap();
    let consume = dir.path().join("consume.toml");
    std::fs::write(
        &consume,
        format!("[kafka]\nbrokers = \"{}\"\n[consume]\ngroup = \"tm-restart\"\n", broker.brokers()),
    )
    .unwrap();
    let p = Collector::start(&dir.path().join("p.db"), Some(&publish));
    let c = Collector::start(&dir.path().join("c.db"), Some(&consume));
    p.ingest("sw-r", 0, 5000);
    wait_for("the first records consumed", 60, || {
        c.metric("telemark_collector_kafka_consumed_total") > 0
    });
    // Down for 6 s while ingest goes on: the outbox holds what Kafka cannot take.
    let feeder = {
        let base = p.base.clone();
        std::thread::spawn(move || ingest(&base, "sw-r", 5000, 5000))
    };
    broker.kill_and_restart(Duration::from_secs(6));
    feeder.join().unwrap();
    wait_for("the outbox drained after the broker came back", 120, || {
        p.metric("telemark_collector_kafka_outbox_records") == 0
            && p.metric("telemark_collector_kafka_published_total") >= 10_000
    });
    wait_for("every record consumed", 120, || c.loss_keys().len() >= 10_000);
    std::thread::sleep(Duration::from_secs(1));
    let keys = c.loss_keys();
    assert_eq!(keys.len(), 10_000, "the consuming collector stored each record once");
    let on_kafka = origins(&broker, "telemark.loss.v1");
    assert_eq!(on_kafka.len(), 10_000, "every stored record is on Kafka");
    let twice: usize = on_kafka.values().map(|n| n - 1).sum();
    println!(
        "broker restart: {twice} records on Kafka twice; delivery errors {}",
        p.metric("telemark_collector_kafka_delivery_errors_total")
    );
}

/// An agent publishing to Kafka directly (root: it taps `lo` with AF_PACKET). Every record it
/// numbered is on Kafka once: its run's sequence numbers, across every topic, are 0, 1, 2, …
/// with no gap and no duplicate, and its last health record counts no export drop.
#[test]
fn an_agent_publishes_directly_every_record_once() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "agent = \"k-agent\"\n[[tap]]\nport = \"lo\"\n\
             [export]\ninterval = \"200ms\"\nsummary_interval = \"300ms\"\nreport_all = true\n\
             [kafka]\nbrokers = \"{}\"\nlinger_ms = 10\n",
            broker.brokers()
        ),
    )
    .unwrap();
    let mut agent = spawn_agent(&cfg);
    // Traffic on lo for the tap to see.
    traffic_on_lo(3);
    kill(agent.id(), "TERM");
    assert!(agent.wait().unwrap().success(), "the agent stops cleanly");
    let mut seqs = Vec::new();
    let mut health = Vec::new();
    for kind in ["loss", "summary", "cost", "health", "flow"] {
        for m in broker.console_consume(&format!("telemark.{kind}.v1"), Duration::from_secs(4)) {
            let (agent, _, seq) = m.origin();
            assert_eq!(agent, "k-agent");
            seqs.push(seq);
            if kind == "health" {
                health.push((seq, serde_json::from_str::<serde_json::Value>(&m.value).unwrap()));
            }
        }
    }
    seqs.sort_unstable();
    health.sort_by_key(|(s, _)| *s);
    if let Some((_, last)) = health.last() {
        println!("last health record: {last}");
    }
    assert!(seqs.len() > 10, "only {} records on Kafka", seqs.len());
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "every number once, no gap");
    let last = &health.last().expect("health records").1;
    assert_eq!(last["export_dropped"], 0, "{last}");
}

/// The value of `name` (summed over its label sets) on the `/metrics` page at `url`.
fn scrape(url: &str, name: &str) -> u64 {
    let text =
        ureq::get(url).call().map(|r| r.into_string().unwrap_or_default()).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// `telemark agent --config cfg`, its log drained.
fn spawn_agent(cfg: &Path) -> Child {
    let mut agent = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["agent", "--config"])
        .arg(cfg)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(agent.stderr.take().unwrap()).lines();
    // Its warnings are shown with a failing test's output.
    std::thread::spawn(move || {
        lines
            .map_while(Result::ok)
            .filter(|l| !l.contains("INFO"))
            .for_each(|l| println!("agent: {l}"))
    });
    agent
}

/// Sends `secs` seconds of small UDP datagrams to the discard port on `lo`; returns how many.
fn traffic_on_lo(secs: u64) -> u64 {
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let until = Instant::now() + Duration::from_secs(secs);
    let mut sent = 0;
    while Instant::now() < until {
        for _ in 0..50 {
            if tx.send_to(&[0u8; 64], "127.0.0.1:9").is_ok() {
                sent += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    sent
}

/// An agent whose broker is away (root: it taps `lo`). Its fast path goes on (its frame
/// counter covers every datagram sent, which it could not if export blocked it), records
/// beyond its bounded queue are dropped and counted in `/metrics` and in its health records,
/// and once the broker is up, what it queued and what follows reach Kafka: sequence numbers
/// 0, 1, 2, … with no gap (dropped records were never numbered) and no duplicate.
#[test]
fn an_agent_whose_broker_is_away_counts_drops_and_never_blocks() {
    let mut broker = Broker::formatted();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    let metrics = free_port();
    std::fs::write(
        &cfg,
        format!(
            "agent = \"away-agent\"\n[[tap]]\nport = \"lo\"\n\
             [export]\ninterval = \"100ms\"\nsummary_interval = \"200ms\"\nreport_all = true\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\
             [kafka]\nbrokers = \"{}\"\nlinger_ms = 10\nbuffer_records = 50\n\
             delivery_timeout_ms = 120000\n",
            broker.brokers()
        ),
    )
    .unwrap();
    let mut agent = spawn_agent(&cfg);
    let url = format!("http://127.0.0.1:{metrics}/metrics");
    wait_for("the agent's /metrics", 30, || ureq::get(&url).call().is_ok());
    let frames_before = scrape(&url, "telemark_agent_rx_frames_total");
    let sent = traffic_on_lo(4);
    std::thread::sleep(Duration::from_millis(500));
    let frames = scrape(&url, "telemark_agent_rx_frames_total") - frames_before;
    let dropped = scrape(&url, "telemark_agent_export_dropped_records_total");
    let pending = scrape(&url, "telemark_agent_export_pending_records");
    println!("broker away: {sent} datagrams sent, {frames} frames seen, {dropped} records dropped, {pending} pending");
    assert!(frames >= sent, "the fast path saw every datagram: {frames} of {sent}");
    assert!(dropped > 0, "records beyond the queue are dropped and counted");
    assert!(pending <= 50, "the queue is bounded: {pending}");
    // The broker comes; what was queued and what follows is delivered.
    broker.run();
    traffic_on_lo(3);
    wait_for("the queue delivered", 60, || {
        scrape(&url, "telemark_agent_export_pending_records") == 0
            && scrape(&url, "telemark_agent_export_acked_records_total") > 50
    });
    let acked = scrape(&url, "telemark_agent_export_acked_records_total");
    let stopping = Instant::now();
    kill(agent.id(), "TERM");
    assert!(agent.wait().unwrap().success(), "the agent stops cleanly");
    assert!(stopping.elapsed() < Duration::from_secs(10), "and promptly");
    let mut seqs = Vec::new();
    let mut health = Vec::new();
    for kind in ["loss", "summary", "cost", "health", "flow"] {
        for m in broker.console_consume(&format!("telemark.{kind}.v1"), Duration::from_secs(4)) {
            seqs.push(m.origin().2);
            if kind == "health" {
                let v: serde_json::Value = serde_json::from_str(&m.value).unwrap();
                health.push((m.origin().2, v["export_dropped"].as_u64().unwrap()));
            }
        }
    }
    seqs.sort_unstable();
    assert!(seqs.len() as u64 >= acked, "{} on Kafka, {acked} acknowledged", seqs.len());
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "every number once, no gap");
    // Each health record counts the drops since the last one that got out, so those on Kafka
    // add up to every drop before the last of them.
    let counted: u64 = health.iter().map(|h| h.1).sum();
    assert!(!health.is_empty(), "health records reach Kafka");
    assert!(counted >= dropped, "the health records count the drops: {counted} of {dropped}");
}

/// Flow records published in goflow2's encoding (`[publish] goflow2_topic`): the CAIDA trace
/// exported as IPFIX into the collector comes out on the topic as one length-delimited
/// `flowpb.FlowMessage` per stored flow, which `protoc --decode_raw` (no schema, no code of
/// Telemark's) reads as goflow2's field numbers say: type 4 (IPFIX), sampling rate 1, and
/// packets (field 10) adding up to the trace's 10,000. Needs protoc (Debian
/// protobuf-compiler).
#[test]
fn flows_reach_kafka_in_goflow2_encoding() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message as _;
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let kafka = dir.path().join("kafka.toml");
    std::fs::write(
        &kafka,
        format!(
            "[kafka]\nbrokers = \"{}\"\nlinger_ms = 20\n[publish]\ngoflow2_topic = \"flows\"\n",
            broker.brokers()
        ),
    )
    .unwrap();
    let flow_port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let db = dir.path().join("db");
    let c = Collector::start_with(
        &db,
        Some(&kafka),
        &["--flows-listen", &format!("127.0.0.1:{flow_port}")],
    );
    let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/testdata/captures/caida-equinix-nyc-2018-10k.pcap");
    let st = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["export", "--read"])
        .arg(&trace)
        .args(["--ipfix", &format!("127.0.0.1:{flow_port}")])
        .status()
        .unwrap();
    assert!(st.success());
    let stored = || {
        let out = Command::new("sqlite3")
            .arg(&db)
            .arg("SELECT COUNT(*) FROM other WHERE kind = 'flow'")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap_or(0)
    };
    wait_for("flows stored and published", 60, || {
        let n = stored();
        n > 3000 && c.metric("telemark_collector_kafka_published_total") >= n
    });
    let n = stored();
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker.brokers())
        .set("group.id", "goflow2-test")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&["flows"]).unwrap();
    let mut values: Vec<Vec<u8>> = Vec::new();
    let until = Instant::now() + Duration::from_secs(60);
    while (values.len() as u64) < n && Instant::now() < until {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) {
            values.push(m.payload().unwrap_or_default().to_vec());
        }
    }
    assert_eq!(values.len() as u64, n, "one message per stored flow");
    let (mut packets, mut bad) = (0u64, Vec::new());
    for v in &values {
        // protodelim: a varint length, then the message.
        let (mut len, mut at) = (0usize, 0usize);
        while at < v.len() {
            len |= usize::from(v[at] & 0x7f) << (7 * at);
            at += 1;
            if v[at - 1] & 0x80 == 0 {
                break;
            }
        }
        assert_eq!(v.len() - at, len, "length prefix");
        let mut p = Command::new("protoc")
            .arg("--decode_raw")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("protoc runs (Debian package protobuf-compiler)");
        std::io::Write::write_all(p.stdin.as_mut().unwrap(), &v[at..]).unwrap();
        drop(p.stdin.take());
        let out = p.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        // Top-level fields only; bytes that happen to parse as a message print as `N {`.
        let field = |n: u32| -> Option<String> {
            text.lines().find_map(|l| {
                let v = l.strip_prefix(&format!("{n}: ")).map(str::to_string);
                v.or_else(|| (l == format!("{n} {{")).then(|| "{…}".to_string()))
            })
        };
        packets += field(10).and_then(|s| s.parse().ok()).unwrap_or(0);
        let ok = field(1).as_deref() == Some("4")
            && field(3).as_deref() == Some("1")
            && field(6).is_some()
            && field(9).is_some()
            && field(11).is_some()
            && matches!(field(30).as_deref(), Some("2048") | Some("34525"));
        if !ok {
            bad.push(text);
        }
    }
    assert!(bad.is_empty(), "{} messages not as goflow2's schema says, e.g. {}", bad.len(), bad[0]);
    assert_eq!(packets, 10_000, "every packet of the trace");
}

/// Brokers that create no topics: a consuming collector names the missing topics once, with
/// the command that creates them; `telemark kafka-topics` creates every topic of the config
/// with the partitions asked for (Kafka's own TopicCommand reads them back), says which were
/// there, grows them on request; the collector then says the topics are there. A property
/// that would break commit-after-store is refused at start.
#[test]
fn kafka_topics_creates_the_topics_a_collector_names_missing() {
    let broker = Broker::start_without_auto_create();
    let dir = tempfile::tempdir().unwrap();
    let kafka = dir.path().join("kafka.toml");
    let conf = format!(
        "[kafka]\nbrokers = \"{}\"\ntopic_prefix = \"kt.\"\n[consume]\ngroup = \"kt\"\n",
        broker.brokers()
    );
    std::fs::write(&kafka, &conf).unwrap();
    let all: Vec<String> = telemark_kafka::Kind::ALL.iter().map(|k| k.topic("kt.")).collect();

    // A property the collector owns: refused, by name, before anything starts.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, format!("{conf}[kafka.properties]\n\"enable.auto.commit\" = \"true\"\n"))
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["collector", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("bad.db"))
        .arg("--kafka")
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("enable.auto.commit"), "{err}");

    let log_path = dir.path().join("collector.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["collector", "--listen", "127.0.0.1:0", "--retention", "0", "--db"])
        .arg(dir.path().join("c.db"))
        .arg("--kafka")
        .arg(&kafka)
        .stderr(log)
        .spawn()
        .unwrap();
    let missing_lines = || {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("reads nothing of these topics"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    wait_for("the missing topics named", 30, || !missing_lines().is_empty());
    // Another round of asking (every 10 s): still said once.
    std::thread::sleep(Duration::from_secs(11));
    let said = missing_lines();
    assert_eq!(said.len(), 1, "{said:?}");
    for t in &all {
        assert!(said[0].contains(t.as_str()), "{t} not named: {}", said[0]);
    }
    assert!(said[0].contains("telemark kafka-topics"), "{}", said[0]);
    assert!(broker.topics().unwrap_or_default().iter().all(|t| !t.starts_with("kt.")));

    let topics = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_telemark"))
            .args(["kafka-topics", "--config"])
            .arg(&kafka)
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        println!("{text}");
        text
    };
    let text = topics(&["--partitions", "3"]);
    for t in &all {
        assert_eq!(broker.partitions(t), Some(3), "{t}");
        assert!(text.lines().any(|l| l.starts_with(t.as_str()) && l.contains("created")), "{t}");
    }
    let text = topics(&["--partitions", "5"]);
    assert_eq!(text.lines().filter(|l| l.contains("fewer than 5")).count(), all.len(), "{text}");
    assert_eq!(broker.partitions(&all[0]), Some(3));
    let text = topics(&["--partitions", "5", "--grow"]);
    for t in &all {
        assert_eq!(broker.partitions(t), Some(5), "{t}");
    }
    assert_eq!(text.lines().filter(|l| l.contains("grown from 3 to 5")).count(), all.len());

    wait_for("the collector to see its topics", 30, || {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("every topic this collector reads is on the brokers now")
    });
    let _ = child.kill();
    let _ = child.wait();
}

/// A fleet's records for the fault test: `flows` flows through two switches, sw-b (a packet
/// lost inside it now and then: a segment inside a host) and sw-f downstream (loss on the link
/// into it in every batch), as their agents would post them: per agent, its records in order
/// with their sequence numbers. Returns the two agents' records and, per flow (its source
/// port), the truth: (lost on the link into sw-f, lost inside sw-b).
type Fleet = (Vec<(&'static str, u64, serde_json::Value)>, BTreeMap<u16, (u64, u64)>);

fn fleet_records(flows: u16, batches: u64, base: u64) -> Fleet {
    let mut out = Vec::new();
    let mut truth = BTreeMap::new();
    let mut seq = BTreeMap::from([("sw-b", 0u64), ("sw-f", 0u64)]);
    for f in 0..flows {
        let sport = 40000 + f;
        let (mut link, mut inside) = (0, 0);
        for n in 0..batches {
            let inside_b = u64::from((n + u64::from(f)) % 10 == 0);
            let on_link = 1 + (n + u64::from(f)) % 3;
            let (link_b, inside_n) = (on_link, inside_b);
            link += link_b;
            inside += inside_n;
            let mut rec = |agent: &'static str, point: &str, upstream: Option<&str>, lost, skew| {
                let first = base + n * 10_000_000 + skew;
                let r = serde_json::json!({
                    "kind": "loss", "agent": agent, "port": "p1", "point": point,
                    "upstream": upstream,
                    "flow": {"src": "10.0.0.1", "dst": "10.0.0.7", "sport": sport,
                             "dport": 5201, "proto": 17},
                    "color": n % 2, "batch": n, "first_ns": first, "last_ns": first + 9_000_000,
                    "expected": 100, "observed": 100 - lost, "lost": lost, "late": 0,
                    "scope": if upstream.is_some() { "segment" } else { "path" },
                });
                let s = seq.get_mut(agent).unwrap();
                out.push((agent, *s, r));
                *s += 1;
            };
            if inside_n > 0 {
                rec("sw-b", "egress", Some("ingress"), inside_n, 0);
            }
            // 300 µs after sw-b: the collector finds sw-b upstream by that.
            rec("sw-f", "ingress", None, link_b + inside_n, 300_000);
        }
        truth.insert(sport, (link, inside));
    }
    (out, truth)
}

/// Registers the agent of `records` (one agent's, in sequence order, run 1) at the collector
/// at `base` and posts them in bodies of `chunk`, pausing `pause` between bodies.
fn post_records(
    base: &str,
    records: &[(&str, u64, serde_json::Value)],
    chunk: usize,
    pause: Duration,
) {
    if let Some((agent, ..)) = records.first() {
        let reg = serde_json::json!({"agent": agent, "version": "test", "boot": 1});
        ureq::post(&format!("{base}/api/v1/agents")).send_json(reg).unwrap();
    }
    for c in records.chunks(chunk) {
        let agent = c[0].0;
        let recs: Vec<&serde_json::Value> = c.iter().map(|r| &r.2).collect();
        let body = serde_json::json!({"agent": agent, "boot": 1, "seq": c[0].1, "records": recs});
        let r = ureq::post(&format!("{base}/api/v1/ingest")).send_json(body).unwrap();
        assert_eq!(r.status(), 200);
        std::thread::sleep(pause);
    }
}

/// The issue-34 fault test (root: the PostgreSQL server runs as `postgres`). A collector
/// publishes two switches' records of 900 flows to Kafka as they come; three collectors in one
/// consumer group store them into one PostgreSQL database. Meanwhile the broker is SIGKILLed
/// and restarted twice and one consuming collector is SIGKILLed and restarted. Then:
/// - psql (not Telemark) finds every record stored exactly once, each key once in `seen`, both
///   agents registered, and the loss sums per flow and switch equal to the truth;
/// - every collector's `/api/v1/localise` gives, for every flow, the link into sw-f and the
///   segment inside sw-b with the truth's counts, and `/api/v1/flows` the flow's whole loss.
#[test]
fn three_collectors_on_one_database_answer_every_flow_through_kills() {
    let server = common::pg::Server::start();
    let mut broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let publish = dir.path().join("publish.toml");
    std::fs::write(
        &publish,
        format!(
            "[kafka]\nbrokers = \"{}\"\ndelivery_timeout_ms = 10000\nlinger_ms = 20\n[publish]\n",
            broker.brokers()
        ),
    )
    .unwrap();
    let consume = dir.path().join("consume.toml");
    std::fs::write(
        &consume,
        format!(
            "[kafka]\nbrokers = \"{}\"\n[consume]\ngroup = \"tm-fleet\"\n\
             [kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n",
            broker.brokers()
        ),
    )
    .unwrap();
    let url = server.url();
    let db = Path::new(&url);
    let p = Collector::start(&dir.path().join("p.db"), Some(&publish));
    let start = || Collector::start(db, Some(&consume));
    let mut group = [start(), start(), start()];
    let base_ns = (telemark_collector::now_ns() / 1_000_000_000 - 600) * 1_000_000_000;
    let (records, truth) = fleet_records(900, 20, base_ns);
    let total = records.len();
    // The topics exist once the first record is published; then the group settles.
    let (b, f): (Vec<_>, Vec<_>) = records.into_iter().partition(|r| r.0 == "sw-b");
    post_records(&p.base, &f[..1], 1, Duration::ZERO);
    wait_for("every member owns partitions", 90, || {
        group.iter().all(|c| c.metric("telemark_collector_kafka_partitions") > 0)
    });
    // About 30 s of ingest, while the broker and a collector are killed.
    let feeder = {
        let base = p.base.clone();
        std::thread::spawn(move || {
            post_records(&base, &b, 200, Duration::from_millis(100));
            post_records(&base, &f[1..], 400, Duration::from_millis(600));
        })
    };
    std::thread::sleep(Duration::from_secs(4));
    broker.kill_and_restart(Duration::from_secs(4));
    std::thread::sleep(Duration::from_secs(3));
    kill(group[1].child.id(), "KILL");
    group[1] = start();
    std::thread::sleep(Duration::from_secs(3));
    broker.kill_and_restart(Duration::from_secs(4));
    feeder.join().unwrap();

    let stored = || server.psql("telemark", "SELECT COUNT(*) FROM loss").parse::<usize>().unwrap();
    wait_for("every record stored", 240, || stored() >= total);
    std::thread::sleep(Duration::from_secs(3));
    let counts = server.psql(
        "telemark",
        "SELECT COUNT(*), COUNT(DISTINCT (agent, boot, seq)), SUM(lost) FROM loss",
    );
    let link: u64 = truth.values().map(|t| t.0).sum();
    let inside: u64 = truth.values().map(|t| t.1).sum();
    assert_eq!(counts, format!("{total}|{total}|{}", link + 2 * inside), "stored once, in all");
    // Per flow and switch, psql's sums are the truth's.
    let sums = server.psql(
        "telemark",
        "SELECT sport, agent, SUM(lost) FROM loss GROUP BY sport, agent ORDER BY sport, agent",
    );
    let want: Vec<String> = truth
        .iter()
        .flat_map(|(sport, (link, inside))| {
            let b = (*inside > 0).then(|| format!("{sport}|sw-b|{inside}"));
            b.into_iter().chain([format!("{sport}|sw-f|{}", link + inside)])
        })
        .collect();
    assert_eq!(sums, want.join("\n"), "per-flow sums");
    assert_eq!(server.psql("telemark", "SELECT COUNT(*) FROM seen"), total.to_string());
    assert_eq!(
        server.psql("telemark", "SELECT string_agg(agent, ',' ORDER BY agent) FROM agents"),
        "sw-b,sw-f"
    );
    let on_kafka = origins(&broker, "telemark.loss.v1");
    let twice: usize = on_kafka.values().map(|n| n - 1).sum();
    let redelivered: u64 =
        group.iter().map(|c| c.metric("telemark_collector_kafka_consumed_duplicates_total")).sum();
    println!(
        "fleet: {total} records, {} on Kafka ({twice} twice); the group read {redelivered} \
         again (the restarted member's count since its restart), the database holds {total}",
        on_kafka.len()
    );
    assert_eq!(on_kafka.len(), total, "every record is on Kafka");

    // Every collector answers every flow whole.
    let q =
        |sport: u16| format!("src=10.0.0.1&dst=10.0.0.7&sport={sport}&dport=5201&proto=17&from=0");
    for (i, c) in group.iter().enumerate() {
        let flows: serde_json::Value =
            ureq::get(&format!("{}/api/v1/flows?limit=2000&from=0", c.base))
                .call()
                .unwrap()
                .into_json()
                .unwrap();
        let listed: BTreeMap<u64, u64> = flows
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["flow"]["sport"].as_u64().unwrap(), f["lost"].as_u64().unwrap()))
            .collect();
        assert_eq!(listed.len(), truth.len(), "collector {i} lists every flow");
        let mut wrong = Vec::new();
        for (&sport, &(link, inside)) in &truth {
            if listed.get(&u64::from(sport)) != Some(&(link + inside)) {
                wrong.push(format!(
                    "{sport}: /flows {:?} for {}",
                    listed.get(&u64::from(sport)),
                    link + inside
                ));
            }
            let v: serde_json::Value =
                ureq::get(&format!("{}/api/v1/localise?{}", c.base, q(sport)))
                    .call()
                    .unwrap()
                    .into_json()
                    .unwrap();
            let seg = |agent: &str, point: &str| {
                v["segments"].as_array().and_then(|s| {
                    s.iter()
                        .find(|s| s["agent"] == agent && s["point"] == point)
                        .and_then(|s| s["lost"].as_u64())
                })
            };
            let got = (seg("sw-f", "ingress"), seg("sw-b", "egress"), v["lost"].as_u64());
            if got != (Some(link), Some(inside), Some(link + inside)) {
                wrong.push(format!("{sport}: localise {got:?} for ({link}, {inside}): {v}"));
            }
        }
        assert!(
            wrong.is_empty(),
            "collector {i}: {} flows wrong: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(3)]
        );
    }
}
