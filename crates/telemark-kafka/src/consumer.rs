//! A consumer group member that commits a record's offset only after the caller stored it:
//! a collector that stops (or crashes) between the two is given the records again, and the
//! (agent, boot, seq) key stores them once.
//!
//! A commit that fails (the group coordinator away after a broker restart) is not given up:
//! the offsets stay pending and go with the next commit, and a partition a rebalance takes
//! away has its pending offsets committed in the rebalance itself, before its new owner reads
//! from the last commit. What still comes twice (a commit that could not reach the
//! coordinator before the partition moved) is caught by the store's keys.

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

/// Where the next read of a partition starts, once what was read before it is stored.
type Offsets = BTreeMap<(String, i32), i64>;

/// Notes the partitions a rebalance takes away, for [`Consumer::poll`] to drop what it read
/// of them and not yet handed out, and commits their stored, uncommitted offsets first.
#[derive(Default)]
struct Context {
    revoked: Mutex<Vec<(String, i32)>>,
    /// Offsets of stored records not committed yet (a commit failed).
    pending: Mutex<Offsets>,
}

impl ClientContext for Context {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!("kafka consumer: {error}: {reason}");
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let parts: Vec<(String, i32)> =
                tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
            // The last chance to commit what was stored of them: still this member's.
            if let Ok(mut pending) = self.pending.lock() {
                let leaving: Offsets = pending
                    .iter()
                    .filter(|(p, _)| parts.contains(p))
                    .map(|(p, o)| (p.clone(), *o))
                    .collect();
                if !leaving.is_empty() {
                    match offsets_list(&leaving).and_then(|l| {
                        consumer.commit(&l, CommitMode::Sync).map_err(|e| e.to_string())
                    }) {
                        Ok(()) => {}
                        Err(e) => tracing::warn!(
                            "kafka commit of partitions leaving this member failed ({e}): their \
                             new owner reads those records again, and the store keeps them once"
                        ),
                    }
                    pending.retain(|p, _| !parts.contains(p));
                }
            }
            if let Ok(mut r) = self.revoked.lock() {
                r.extend(parts);
            }
        }
    }
}

fn offsets_list(offsets: &Offsets) -> Result<TopicPartitionList, String> {
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), next) in offsets {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
            .map_err(|e| e.to_string())?;
    }
    Ok(tpl)
}

/// Properties that would break the guarantee above, which `[kafka.properties]` may not set
/// for a consumer: offsets are committed by Telemark once records are stored, and the group
/// is `[consume] group`.
pub const CONSUMER_OWNED: [&str; 3] =
    ["group.id", "enable.auto.commit", "enable.auto.offset.store"];

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
    next: Offsets,
    /// Per (topic, partition), the offset of the first message read.
    first: Offsets,
}

impl Batch {
    /// Whether nothing was read.
    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }
}

/// A group member's librdkafka settings: Telemark's defaults, then every property of the
/// user's (the session timeout included), then the ones commit-after-store depends on.
fn client_config(cfg: &KafkaConfig, group: &str) -> Result<ClientConfig, String> {
    if let Some(k) = cfg.properties.keys().find(|k| CONSUMER_OWNED.contains(&k.as_str())) {
        return Err(format!(
            "kafka.properties.{k}: a collector sets it itself (offsets are committed once \
             records are stored; the group is [consume] group): remove it"
        ));
    }
    let mut c = ClientConfig::new();
    // Defaults first: every other property, the session timeout included, is the user's.
    c.set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .set("max.poll.interval.ms", "300000");
    for (k, v) in cfg.client_properties()? {
        c.set(k, v);
    }
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    Ok(c)
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
        let c = client_config(cfg, group)?;
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
            b.first.entry(part.clone()).or_insert(m.offset());
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
        b.first.retain(|p, _| !revoked.contains(p));
        true
    }

    /// Commits `batch`'s offsets, and any a failed commit left pending, synchronously: call
    /// once its records are stored. Offsets of partitions this member no longer owns are not
    /// committed (their new owner reads those records again, and stores them once). On an
    /// error the offsets stay pending for the next commit (or the rebalance that moves their
    /// partition).
    pub fn commit(&self, batch: &Batch) -> Result<(), String> {
        let mut pending = self.inner.context().pending.lock().map_err(|e| e.to_string())?;
        for (p, next) in &batch.next {
            let at = pending.entry(p.clone()).or_insert(*next);
            *at = (*at).max(*next);
        }
        if pending.is_empty() {
            return Ok(());
        }
        let owned = self.inner.assignment().map_err(|e| e.to_string())?;
        pending.retain(|(topic, partition), _| owned.find_partition(topic, *partition).is_some());
        if pending.is_empty() {
            return Ok(());
        }
        let tpl = offsets_list(&pending)?;
        drop(pending);
        self.inner
            .commit(&tpl, CommitMode::Sync)
            .map_err(|e| format!("kafka commit: {e} (the offsets go with the next commit)"))?;
        // Committed: what was pending up to these offsets is done (a rebalance may have
        // cleared some meanwhile).
        let mut pending = self.inner.context().pending.lock().map_err(|e| e.to_string())?;
        for e in tpl.elements() {
            let key = (e.topic().to_string(), e.partition());
            if let (Some(at), Offset::Offset(done)) = (pending.get(&key), e.offset()) {
                if *at <= done {
                    pending.remove(&key);
                }
            }
        }
        Ok(())
    }

    /// Reads `batch` again: its partitions go back to its first offsets (call when storing
    /// it failed, so that the next poll does not read past it and a later commit skip it).
    pub fn rewind(&self, batch: &Batch) -> Result<(), String> {
        for ((topic, partition), first) in &batch.first {
            self.inner
                .seek(topic, *partition, Offset::Offset(*first), Duration::from_secs(5))
                .map_err(|e| format!("kafka seek {topic}/{partition} to {first}: {e}"))?;
        }
        Ok(())
    }

    /// Stored records whose offsets are not committed yet, per partition count.
    pub fn pending_commits(&self) -> usize {
        self.inner.context().pending.lock().map_or(0, |p| p.len())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The user's properties come after Telemark's defaults (a session timeout of 45 s is
    /// kept), and those commit-after-store needs are refused by name.
    #[test]
    fn the_user_sets_every_property_but_the_commit_ones() {
        let mut cfg = KafkaConfig::new("127.0.0.1:9092");
        cfg.properties.insert("session.timeout.ms".into(), "45000".into());
        let c = client_config(&cfg, "g").unwrap();
        assert_eq!(c.get("session.timeout.ms"), Some("45000"));
        assert_eq!(c.get("heartbeat.interval.ms"), Some("1000"));
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("group.id"), Some("g"));
        for owned in CONSUMER_OWNED {
            let mut bad = cfg.clone();
            bad.properties.insert(owned.into(), "x".into());
            let e = client_config(&bad, "g").err().unwrap();
            assert!(e.contains(owned), "{e}");
        }
    }
}
