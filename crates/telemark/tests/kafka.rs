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
    pub fn start() -> Broker {
        let libs = libs();
        let dir = tempfile::tempdir().unwrap();
        let (port, controller) = (free_port(), free_port());
        let props = format!(
            "process.roles=broker,controller\nnode.id=1\n\
             controller.quorum.voters=1@127.0.0.1:{controller}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
             controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n\
             log.dirs={}\nnum.partitions=4\noffsets.topic.replication.factor=1\n\
             transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n\
             group.initial.rebalance.delay.ms=0\nauto.create.topics.enable=true\n",
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
        let mut b = Broker { libs, dir, port, child: None };
        b.run();
        b
    }

    fn run(&mut self) {
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
    pub fn console_consume(&self, topic: &str, idle: Duration) -> Vec<Message> {
        let mut c = java(&self.libs)
            .args(["org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server"])
            .arg(self.brokers())
            .args(["--topic", topic, "--from-beginning"])
            .args(["--timeout-ms", &idle.as_millis().to_string()])
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

/// The live loss demo (root: namespaces, agents on AF_PACKET, congestion) with its collector
/// publishing to a real broker: every record the collector stored is on its kind's topic,
/// keyed by flow or agent, with its origin in the headers, equal to what was stored, once.
#[test]
fn every_stored_record_is_on_its_topic_as_kafkas_console_consumer_reads_it() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let kafka = dir.path().join("kafka.toml");
    std::fs::write(
        &kafka,
        format!("[kafka]\nbrokers = \"{}\"\nlinger_ms = 20\n[publish]\n", broker.brokers()),
    )
    .unwrap();
    let db = dir.path().join("demo.db");
    let out = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["demo", "--no-wait", "--listen", "127.0.0.1:19911", "--db"])
        .arg(&db)
        .arg("--kafka")
        .arg(&kafka)
        .args(["--before", "2s", "--background", "3s", "--after", "2s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "demo: {}", String::from_utf8_lossy(&out.stderr));
    for line in String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.contains("kafka")) {
        println!("demo: {line}");
    }
    let stored = stored(&db);
    assert!(stored.len() > 50, "only {} records stored", stored.len());
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for (kind, _) in stored.values() {
        *kinds.entry(kind.clone()).or_default() += 1;
    }
    for kind in ["loss", "summary", "health"] {
        assert!(kinds.contains_key(kind), "the demo stored no {kind} record: {kinds:?}");
    }
    let mut seen = BTreeMap::new();
    for kind in kinds.keys() {
        let topic = format!("telemark.{kind}.v1");
        let msgs = broker.console_consume(&topic, Duration::from_secs(5));
        println!("{topic}: {} messages", msgs.len());
        for m in msgs {
            assert_eq!(m.headers.get("telemark-kind"), Some(kind), "{m:?}");
            assert_eq!(m.headers.get("telemark-schema").map(String::as_str), Some("1"));
            let v: serde_json::Value = serde_json::from_str(&m.value).unwrap();
            assert_eq!(v["kind"], kind.as_str(), "{m:?}");
            let origin = m.origin();
            assert!(
                seen.insert(origin.clone(), (kind.clone(), v, m.key)).is_none(),
                "twice: {origin:?}"
            );
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
        outbox_left(&db)
    );
    for (origin, (kind, want)) in &stored {
        let (k, got, key) = &seen[origin];
        assert_eq!(k, kind);
        if kind == "loss" {
            for field in ["point", "batch", "lost", "observed", "first_ns"] {
                assert_eq!(got[field], want[field], "{origin:?} {field}");
            }
            let f = &want["flow"];
            assert_eq!(&got["flow"]["src"], &f["src"]);
            assert_eq!(&got["flow"]["dport"], &f["dport"]);
            let flow_key = format!(
                "{}/{}/{}/{}/{}",
                f["proto"],
                f["src"].as_str().unwrap(),
                f["sport"],
                f["dst"].as_str().unwrap(),
                f["dport"]
            );
            assert_eq!(key, &flow_key, "loss records are keyed by their flow");
        } else {
            assert_eq!(got, want, "{origin:?}");
            if kind != "flow" && kind != "event" && kind != "flow_loss" {
                assert_eq!(key, &origin.0, "{kind} records are keyed by their agent");
            }
        }
    }
}
