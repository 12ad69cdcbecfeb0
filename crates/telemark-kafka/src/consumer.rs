//! A consumer group member that commits a record's offset only after the caller stored it:
//! a collector that stops (or crashes) between the two is given the records again, and the
//! (agent, boot, seq) key stores them once.

use crate::config::KafkaConfig;
use crate::message::{decode, DecodeError, Kind, Origin};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message as _};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use telemark_core::records::Record;

/// Notes the partitions a rebalance takes away, for [`Consumer::poll`] to drop what it read
/// of them and not yet handed out.
#[derive(Default)]
struct Context {
    revoked: Mutex<Vec<(String, i32)>>,
}

impl ClientContext for Context {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!("kafka consumer: {error}: {reason}");
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            if let Ok(mut r) = self.revoked.lock() {
                r.extend(tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())));
            }
        }
    }
}

/// Records read, and where to commit once they are stored.
#[derive(Debug, Default)]
pub struct Batch {
    /// Records, with their origin.
    pub records: Vec<(Origin, Record)>,
    /// The partition each record came from.
    from: Vec<(String, i32)>,
    /// Messages that are not Telemark records, with why (their offsets are committed too:
    /// reading them again would not make them records).
    pub refused: Vec<DecodeError>,
    /// Per (topic, partition), the offset after the last message read.
    next: BTreeMap<(String, i32), i64>,
}

impl Batch {
    /// Whether nothing was read.
    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }
}

/// One member of a consumer group reading Telemark's topics.
pub struct Consumer {
    inner: BaseConsumer<Context>,
}

impl Consumer {
    /// Joins `group`, reading the topics of `kinds` from their start when the group has no
    /// offsets yet.
    pub fn new(cfg: &KafkaConfig, group: &str, kinds: &[Kind]) -> Result<Consumer, String> {
        cfg.validate()?;
        if group.trim().is_empty() {
            return Err("kafka consumer group is empty".into());
        }
        let mut c = ClientConfig::new();
        for (k, v) in cfg.client_properties()? {
            c.set(k, v);
        }
        c.set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            .set("max.poll.interval.ms", "300000");
        let inner: BaseConsumer<Context> = c
            .create_with_context(Context::default())
            .map_err(|e| format!("kafka consumer: {e}"))?;
        let topics: Vec<String> = kinds.iter().map(|k| k.topic(&cfg.topic_prefix)).collect();
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        inner.subscribe(&topics).map_err(|e| format!("kafka subscribe: {e}"))?;
        Ok(Consumer { inner })
    }

    /// Up to `max` messages, waiting at most `wait` for the first.
    pub fn poll(&self, max: usize, wait: Duration) -> Result<Batch, String> {
        let mut b = Batch::default();
        let until = Instant::now() + wait;
        while b.records.len() + b.refused.len() < max {
            let left = until.saturating_duration_since(Instant::now());
            let timeout = if b.is_empty() { left } else { Duration::ZERO };
            let Some(m) = self.inner.poll(timeout) else { break };
            let m = match m {
                Ok(m) => m,
                // Transient (a broker away, a rebalance): librdkafka recovers by itself.
                Err(e) => {
                    tracing::debug!("kafka consumer: {e}");
                    if b.is_empty() && Instant::now() < until {
                        continue;
                    }
                    break;
                }
            };
            let header = |name: &str| {
                m.headers().and_then(|h| h.iter().find(|x| x.key == name).and_then(|x| x.value))
            };
            let part = (m.topic().to_string(), m.partition());
            match decode(header, m.payload().unwrap_or_default()) {
                Ok(r) => {
                    b.records.push(r);
                    b.from.push(part.clone());
                }
                Err(e) => b.refused.push(e),
            }
            b.next.insert(part, m.offset() + 1);
            if self.drop_revoked(&mut b) {
                break;
            }
        }
        self.drop_revoked(&mut b);
        Ok(b)
    }

    /// Drops what `b` holds of partitions a rebalance took away during the poll: their new
    /// owner reads them from the last commit, so storing them here too would store them twice
    /// across the group. Whether there were any.
    fn drop_revoked(&self, b: &mut Batch) -> bool {
        let revoked = match self.inner.context().revoked.lock() {
            Ok(mut r) => std::mem::take(&mut *r),
            Err(_) => return false,
        };
        if revoked.is_empty() {
            return false;
        }
        let mut keep = b.from.iter().map(|p| !revoked.contains(p));
        b.records.retain(|_| keep.next().unwrap_or(true));
        b.from.retain(|p| !revoked.contains(p));
        b.next.retain(|p, _| !revoked.contains(p));
        true
    }

    /// Commits `batch`'s offsets, synchronously: call once its records are stored. Offsets
    /// of partitions this member no longer owns are not committed (their new owner reads
    /// those records again, and stores them once).
    pub fn commit(&self, batch: &Batch) -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        let owned = self.inner.assignment().map_err(|e| e.to_string())?;
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in &batch.next {
            if owned.find_partition(topic, *partition).is_some() {
                tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
                    .map_err(|e| e.to_string())?;
            }
        }
        if tpl.count() == 0 {
            return Ok(());
        }
        self.inner.commit(&tpl, CommitMode::Sync).map_err(|e| format!("kafka commit: {e}"))
    }

    /// Partitions this member owns now.
    pub fn partitions(&self) -> usize {
        self.inner.assignment().map_or(0, |a| a.count())
    }

    /// Records on the partitions this member owns that it has not read yet (the group's lag
    /// as this member sees it), asking the brokers for at most `timeout` per partition.
    pub fn lag(&self, timeout: Duration) -> Option<u64> {
        let position = self.inner.position().ok()?;
        let mut lag = 0u64;
        for e in position.elements() {
            let (low, high) =
                self.inner.fetch_watermarks(e.topic(), e.partition(), timeout).ok()?;
            // Before the first read of a partition the position is unknown: all of it is due.
            let at = match e.offset() {
                Offset::Offset(o) => o.max(low),
                _ => low,
            };
            lag += u64::try_from(high - at).unwrap_or(0);
        }
        Some(lag)
    }
}
