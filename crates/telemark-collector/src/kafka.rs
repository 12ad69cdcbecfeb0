//! The collector and Kafka (docs/kafka.md): publishing what it stored, from the outbox, and
//! storing what it reads from Kafka as a member of a consumer group.
//!
//! - **Publishing.** Ingest puts each record it stores into the outbox, in the same
//!   transaction. The publisher sends the outbox in order with the idempotent producer and
//!   removes a row once Kafka acknowledged it; a row whose delivery failed is sent again, from
//!   the oldest, once nothing is in flight. A collector that stops or crashes publishes the
//!   rows left at its next start: what Kafka acknowledged is not sent again (a crash between
//!   Kafka's acknowledgement and the row's removal excepted: a duplicate, which consumers drop
//!   by its (agent, boot, seq) headers).
//! - **Consuming.** Records are stored in one transaction per poll, and the offsets committed
//!   only after it: a crash or a rebalance gives records again, never loses them, and the
//!   (agent, boot, seq) key stores each once. A failed commit is retried with the next one,
//!   and a partition leaving this collector gets its stored offsets committed as it leaves.
//!
//! Neither ever holds up ingest: the outbox is bounded (`outbox_max`; past it records are
//! stored, not published, and counted), and the producer's queue is librdkafka's own.

use crate::ingest::Ingest;
use crate::store::{Outbox, Publishing};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use telemark_kafka::{
    Consumer, KafkaConfig, Kind, Message, Origin, Producer, SendError, TopicProbe,
};
use telemark_transport::metrics::Exposition;

/// The collector's Kafka file (`telemark collector --kafka FILE`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaFile {
    /// Brokers and client settings.
    pub kafka: KafkaConfig,
    /// Publish what is stored.
    #[serde(default)]
    pub publish: Option<PublishConfig>,
    /// Store what is read.
    #[serde(default)]
    pub consume: Option<ConsumeConfig>,
}

/// `[publish]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishConfig {
    /// Most records waiting in the outbox.
    #[serde(default = "default_outbox_max")]
    pub outbox_max: u64,
    /// Flow records go to this topic in goflow2's encoding (`flowpb.FlowMessage`,
    /// length-delimited) instead of `telemark.flow.v1` in JSON.
    #[serde(default)]
    pub goflow2_topic: Option<String>,
}

/// `[consume]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumeConfig {
    /// Consumer group: collectors in one group share the topics' partitions.
    pub group: String,
    /// Record kinds to read (default: all).
    #[serde(default)]
    pub kinds: Option<Vec<String>>,
}

fn default_outbox_max() -> u64 {
    10_000_000
}

impl KafkaFile {
    /// Reads and checks `path`.
    pub fn load(path: &std::path::Path) -> Result<KafkaFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let f: KafkaFile = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        f.kafka.validate().map_err(|e| format!("{}: {e}", path.display()))?;
        if f.publish.is_none() && f.consume.is_none() {
            return Err(format!("{}: neither [publish] nor [consume]", path.display()));
        }
        if let Some(c) = &f.consume {
            c.kinds().map_err(|e| format!("{}: {e}", path.display()))?;
            if c.group.trim().is_empty() {
                return Err(format!("{}: consume.group is empty", path.display()));
            }
        }
        Ok(f)
    }
}

impl ConsumeConfig {
    /// The kinds to read.
    pub fn kinds(&self) -> Result<Vec<Kind>, String> {
        match &self.kinds {
            None => Ok(Kind::ALL.to_vec()),
            Some(names) => names
                .iter()
                .map(|n| {
                    Kind::from_name(n).ok_or_else(|| {
                        let all: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                        format!("consume.kinds: unknown kind {n:?} ({})", all.join(", "))
                    })
                })
                .collect(),
        }
    }
}

/// What the collector's Kafka threads count, for `/metrics`.
#[derive(Debug, Default)]
pub struct KafkaStats {
    /// Publishing is on.
    pub publishing: AtomicBool,
    /// Records Kafka acknowledged.
    pub published: AtomicU64,
    /// Deliveries that failed (the record is sent again).
    pub delivery_errors: AtomicU64,
    /// Records sent, not yet acknowledged.
    pub in_flight: AtomicU64,
    /// Outbox rows (stored, not yet acknowledged: the publishing lag).
    pub outbox: AtomicU64,
    /// Records stored but not published because the outbox was full.
    pub outbox_skipped: AtomicU64,
    /// Consuming is on.
    pub consuming: AtomicBool,
    /// Records read from Kafka and stored now.
    pub consumed: AtomicU64,
    /// Records read again that were stored already.
    pub consumed_duplicates: AtomicU64,
    /// Messages that were not valid records, by reason.
    pub refused: std::sync::Mutex<BTreeMap<&'static str, u64>>,
    /// Records in owned partitions not read yet (the consumer lag).
    pub consumer_lag: AtomicU64,
    /// Partitions this collector owns in its group.
    pub partitions: AtomicU64,
    /// Polls, stores or commits that failed.
    pub consumer_errors: AtomicU64,
}

impl KafkaStats {
    fn refuse(&self, reason: &'static str) {
        if let Ok(mut m) = self.refused.lock() {
            *m.entry(reason).or_default() += 1;
        }
    }

    /// The exposition lines.
    pub fn render(&self, o: &mut Exposition) {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut family = |name: &str, kind: &str, help: &str, value: u64| {
            let name = format!("telemark_collector_kafka_{name}");
            match kind {
                "counter" => o.counter(&name, help, &[]),
                _ => o.gauge(&name, help, &[]),
            }
            .value(value);
        };
        if self.publishing.load(Ordering::Relaxed) {
            family("published_total", "counter", "Records Kafka acknowledged.", g(&self.published));
            family(
                "delivery_errors_total",
                "counter",
                "Deliveries that failed after the client's retries (the record is sent again).",
                g(&self.delivery_errors),
            );
            family(
                "in_flight",
                "gauge",
                "Records sent and not yet acknowledged.",
                g(&self.in_flight),
            );
            family(
                "outbox_records",
                "gauge",
                "Records stored and not yet acknowledged by Kafka (the producer lag).",
                g(&self.outbox),
            );
            family(
                "outbox_skipped_total",
                "counter",
                "Records stored but not published because the outbox was full.",
                g(&self.outbox_skipped),
            );
        }
        if self.consuming.load(Ordering::Relaxed) {
            family(
                "consumed_total",
                "counter",
                "Records read from Kafka and stored.",
                g(&self.consumed),
            );
            family(
                "consumed_duplicates_total",
                "counter",
                "Records read from Kafka that were stored already.",
                g(&self.consumed_duplicates),
            );
            family(
                "consumer_lag",
                "gauge",
                "Records in this collector's partitions not read yet.",
                g(&self.consumer_lag),
            );
            family(
                "partitions",
                "gauge",
                "Partitions this collector owns in its consumer group.",
                g(&self.partitions),
            );
            family(
                "consumer_errors_total",
                "counter",
                "Failed polls, stores and commits.",
                g(&self.consumer_errors),
            );
            let refused = o.counter(
                "telemark_collector_kafka_refused_total",
                "Messages that were not Telemark records, by reason.",
                &["reason"],
            );
            if let Ok(m) = self.refused.lock() {
                refused.samples(m.iter().map(|(reason, n)| ([reason], *n)));
            }
        }
    }
}

/// A stored flow record's JSON in goflow2's encoding (an unreadable row: an empty message,
/// which goflow2's readers skip).
fn goflow2(json: &str) -> Vec<u8> {
    match serde_json::from_str::<telemark_core::records::Record>(json) {
        Ok(telemark_core::records::Record::Flow(f)) => {
            telemark_kafka::goflow2::FlowMessage::of(&f, crate::now_ns()).to_delimited()
        }
        _ => Vec::new(),
    }
}

/// Sends the outbox until `stop`, then gives what is in flight up to 5 s; flow records to
/// `goflow2_topic` in goflow2's encoding when it is set.
pub fn publish(
    db: PathBuf,
    cfg: KafkaConfig,
    goflow2_topic: Option<String>,
    outbox_state: Arc<Publishing>,
    stats: Arc<KafkaStats>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, String> {
    let producer = Producer::new(&cfg, true)?;
    let probe = producer.topic_probe(goflow2_topic.as_deref())?;
    let mut outbox = Outbox::open(&db).map_err(|e| format!("outbox: {e}"))?;
    stats.publishing.store(true, Ordering::Relaxed);
    let cap = cfg.buffer_records as usize;
    Ok(std::thread::spawn(move || {
        // The outbox holds records until their topics are ready (TopicProbe says why).
        if !probe.wait(&stop) {
            return;
        }
        drop(probe);
        // The last row handed to the producer; rows after it are read next.
        let mut sent_up_to = 0i64;
        let mut in_flight = BTreeSet::new();
        let mut failed = false;
        let mut failures = 0u64;
        let mut stopping: Option<Instant> = None;
        loop {
            if stopping.is_none() && stop.load(Ordering::Relaxed) {
                stopping = Some(Instant::now());
            }
            let mut progress = false;
            if stopping.is_none() && in_flight.len() < cap {
                let want = (cap - in_flight.len()).min(2000);
                match outbox.after(sent_up_to, want) {
                    Ok(rows) => {
                        for row in rows {
                            let Some(kind) = Kind::from_name(&row.kind) else { continue };
                            let (payload, topic) = match (&goflow2_topic, kind) {
                                (Some(t), Kind::Flow) => (goflow2(&row.json), Some(t.clone())),
                                _ => (row.json.into_bytes(), None),
                            };
                            let m = Message {
                                kind,
                                key: row.key,
                                payload,
                                origin: Origin { agent: row.agent, boot: row.boot, seq: row.seq },
                                topic,
                            };
                            match producer.send(&m, row.id as u64) {
                                Ok(()) => {
                                    in_flight.insert(row.id);
                                    sent_up_to = row.id;
                                    progress = true;
                                }
                                Err(SendError::Full) => break,
                                Err(SendError::Other(e)) => {
                                    tracing::warn!("kafka: record {} not sent: {e}", row.id);
                                    stats.delivery_errors.fetch_add(1, Ordering::Relaxed);
                                    failed = true;
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!("kafka: reading the outbox: {e}"),
                }
            }
            let mut acked = Vec::new();
            for d in producer.deliveries() {
                let id = d.id as i64;
                in_flight.remove(&id);
                match d.error {
                    None => acked.push(id),
                    Some(e) => {
                        // Said once per outage (an outage fails every record in flight).
                        if failures == 0 {
                            tracing::warn!(
                                "kafka: delivery to {} failed ({e}); every record from the \
                                 first not acknowledged is sent again, in order",
                                d.topic
                            );
                        }
                        failures += 1;
                        stats.delivery_errors.fetch_add(1, Ordering::Relaxed);
                        failed = true;
                    }
                }
            }
            if failures > 0 && !acked.is_empty() {
                tracing::info!("kafka: delivering again after {failures} failed deliveries");
                failures = 0;
            }
            if !acked.is_empty() {
                progress = true;
                match outbox.remove(&acked) {
                    Ok(()) => {
                        let n = acked.len() as u64;
                        stats.published.fetch_add(n, Ordering::Relaxed);
                        let _ = outbox_state.pending.fetch_update(
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                            |p| Some(p.saturating_sub(n)),
                        );
                    }
                    // The rows stay, and go again at the next start: duplicates, not loss.
                    Err(e) => tracing::warn!("kafka: removing acknowledged rows: {e}"),
                }
            }
            // A failure: once nothing is in flight, everything left is sent again, in order.
            if failed && in_flight.is_empty() {
                failed = false;
                sent_up_to = 0;
                std::thread::sleep(Duration::from_millis(500));
            }
            stats.in_flight.store(in_flight.len() as u64, Ordering::Relaxed);
            stats.outbox.store(outbox_state.pending.load(Ordering::Relaxed), Ordering::Relaxed);
            stats
                .outbox_skipped
                .store(outbox_state.skipped.load(Ordering::Relaxed), Ordering::Relaxed);
            if let Some(t) = stopping {
                if in_flight.is_empty() || t.elapsed() > Duration::from_secs(5) {
                    break;
                }
            }
            if !progress {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }))
}

/// Reads `kinds` as a member of `group` and stores what it reads until `stop`.
pub fn consume(
    ingest: Arc<Ingest>,
    cfg: KafkaConfig,
    consume: ConsumeConfig,
    stats: Arc<KafkaStats>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, String> {
    let kinds = consume.kinds()?;
    let consumer = Consumer::new(&cfg, &consume.group, &kinds)?;
    let probe = TopicProbe::new(&cfg, kinds.iter().map(|k| k.topic(&cfg.topic_prefix)).collect())?;
    stats.consuming.store(true, Ordering::Relaxed);
    let watch = stop.clone();
    std::thread::spawn(move || {
        MissingTopics { probe, said: Vec::new() }.wait(&watch);
    });
    Ok(std::thread::spawn(move || {
        let mut last_lag = Instant::now() - Duration::from_secs(60);
        let mut failed_commits = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let batch = match consumer.poll(5000, Duration::from_millis(200)) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!("kafka consumer: {e}");
                    stats.consumer_errors.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            for e in &batch.refused {
                stats.refuse(e.reason());
            }
            if store(&ingest, &batch.records, &stats) {
                match consumer.commit(&batch) {
                    Ok(()) if failed_commits > 0 => {
                        tracing::info!(
                            "kafka: offsets committed again after {failed_commits} failed commits"
                        );
                        failed_commits = 0;
                    }
                    Ok(()) => {}
                    Err(e) => {
                        // Said once per outage: the offsets stay pending and go next time.
                        if failed_commits == 0 {
                            tracing::warn!("{e}");
                        }
                        failed_commits += 1;
                        stats.consumer_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            } else {
                // Not stored: not committed either, and read again (the consumer's position
                // is past it). If even the seek fails, the group reads it again once this
                // collector restarts or leaves, from the last commit.
                stats.consumer_errors.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = consumer.rewind(&batch) {
                    tracing::warn!("{e}");
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            stats.partitions.store(consumer.partitions() as u64, Ordering::Relaxed);
            if last_lag.elapsed() > Duration::from_secs(2) {
                last_lag = Instant::now();
                if let Some(l) = consumer.lag(Duration::from_millis(500)) {
                    stats.consumer_lag.store(l, Ordering::Relaxed);
                }
            }
        }
        // Leaving the group hands the partitions over at once (not after the session times
        // out): dropping the consumer closes it.
        drop(consumer);
    }))
}

/// Which of the topics a collector reads the brokers lack: said once per change, with the
/// command that creates them, and asked again every 10 s until all are there (on a thread of
/// its own: asking waits on the brokers).
struct MissingTopics {
    probe: TopicProbe,
    said: Vec<String>,
}

impl MissingTopics {
    fn wait(&mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let missing = self.probe.not_ready(Duration::from_secs(2));
            if missing.is_empty() {
                if !self.said.is_empty() {
                    tracing::info!("kafka: every topic this collector reads is on the brokers now");
                }
                return;
            }
            if missing != self.said {
                tracing::warn!(
                    "kafka: the group reads nothing of these topics until the brokers have \
                     them: {}. Create them with `telemark kafka-topics --config FILE \
                     --partitions N` (FILE: this collector's --kafka file; N: at least the \
                     collectors in the group)",
                    missing.join(", ")
                );
                self.said = missing;
            }
            let next = Instant::now() + Duration::from_secs(10);
            while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Stores `records` grouped by (agent, boot) (on PostgreSQL all in one transaction); false
/// when a store failed (the batch is read again; what was stored of it is found again).
fn store(
    ingest: &Ingest,
    records: &[(Origin, telemark_core::records::Record)],
    stats: &KafkaStats,
) -> bool {
    let now = crate::now_ns();
    let mut runs: BTreeMap<(&str, u64), Vec<(u64, telemark_core::records::Record)>> =
        BTreeMap::new();
    for (o, r) in records {
        if let Err(why) = crate::validate::record(r, now) {
            tracing::debug!("kafka: record refused: {why}");
            stats.refuse("invalid");
            continue;
        }
        if r.agent().is_some_and(|a| a != o.agent) {
            stats.refuse("agent_mismatch");
            continue;
        }
        runs.entry((o.agent.as_str(), o.boot)).or_default().push((o.seq, r.clone()));
    }
    let runs: Vec<crate::store::NumberedRun<'_>> =
        runs.into_iter().map(|((agent, boot), recs)| (agent, boot, recs)).collect();
    if runs.is_empty() {
        return true;
    }
    let (stored, failed) = ingest.store().ingest_numbered_runs(&runs, now);
    for ((_, _, recs), s) in runs.iter().zip(stored) {
        stats.consumed.fetch_add(s.accepted, Ordering::Relaxed);
        stats.consumed_duplicates.fetch_add(s.duplicates, Ordering::Relaxed);
        let plain: Vec<_> = recs.iter().map(|(_, r)| r.clone()).collect();
        ingest.metrics.ingested(&plain, &s);
    }
    if let Some(e) = failed {
        tracing::warn!(
            "kafka: storing {} records of {} agents' runs: {e}",
            records.len(),
            runs.len()
        );
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// deploy/kafka.toml (the fleet's collectors) loads: a consumer group over every kind,
    /// no [publish] (refused with a PostgreSQL store), the session timeout the user's.
    #[test]
    fn the_fleet_deploy_config_loads() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kafka.toml");
        let f = KafkaFile::load(&path).unwrap();
        assert!(f.publish.is_none());
        let c = f.consume.expect("[consume]");
        assert_eq!(c.kinds().unwrap(), Kind::ALL.to_vec());
        assert_eq!(f.kafka.properties.get("session.timeout.ms").map(String::as_str), Some("30000"));
    }

    /// The Kafka families keep the sample names and labels they had when written by hand (the
    /// live before/after comparison has no broker to show them).
    #[test]
    fn kafka_samples_keep_their_names() {
        let k = KafkaStats::default();
        let mut page = Exposition::default();
        k.render(&mut page);
        assert!(!page.encode().contains("kafka"), "nothing while Kafka is off");
        k.publishing.store(true, Ordering::Relaxed);
        k.consuming.store(true, Ordering::Relaxed);
        k.published.store(7, Ordering::Relaxed);
        k.consumer_lag.store(3, Ordering::Relaxed);
        k.refuse("not_json");
        let mut page = Exposition::default();
        k.render(&mut page);
        let text = page.encode();
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        let p = "telemark_collector_kafka_";
        let want: Vec<String> = [
            "published_total 7",
            "delivery_errors_total 0",
            "in_flight 0",
            "outbox_records 0",
            "outbox_skipped_total 0",
            "consumed_total 0",
            "consumed_duplicates_total 0",
            "consumer_lag 3",
            "partitions 0",
            "consumer_errors_total 0",
            "refused_total{reason=\"not_json\"} 1",
        ]
        .iter()
        .map(|s| format!("{p}{s}"))
        .collect();
        assert_eq!(samples, want);
    }
}
