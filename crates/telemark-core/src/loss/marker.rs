//! The first hop: colors each watched flow's packets in alternating batches.

use super::slots::{self, find_or_admit, Lookup, Slot};
use super::{BatchEvent, BatchEventKind, EventSink, LossConfig, PointStats};
use telemark_wire::FlowKey;

#[repr(C, align(32))]
#[derive(Clone, Copy, Default)]
struct MarkEntry {
    tag: u32,
    /// Packets marked in the current batch.
    count: u32,
    ordinal: u32,
    color: u8,
    first_ns: u64,
    seen_ns: u64,
}

impl Slot for MarkEntry {
    fn tag(&self) -> u32 {
        self.tag
    }
    fn seen_ns(&self) -> u64 {
        self.seen_ns
    }
}

/// Count-based (B packets per color, the loss paper) or time-based (period T, RFC 9341)
/// marker. It reports each batch it marked as a closed batch of its own point, so the
/// aggregator knows exactly how many packets each batch started with.
#[derive(Clone)]
pub struct Marker {
    slots: Vec<MarkEntry>,
    keys: Vec<FlowKey>,
    bucket_mask: usize,
    point: u8,
    batch: u32,
    period_ns: Option<u64>,
    idle_ns: u64,
    /// Counters of the marker (packets marked, flows refused).
    pub stats: PointStats,
}

impl Marker {
    /// A marker reporting as point number `point`.
    pub fn new(cfg: &LossConfig, point: u8) -> Self {
        let n = cfg.table_size.max(2).next_power_of_two();
        Marker {
            slots: vec![MarkEntry::default(); n],
            keys: vec![FlowKey::default(); n],
            bucket_mask: n / 2 - 1,
            point,
            batch: cfg.batch.max(1),
            period_ns: cfg.period_ns,
            idle_ns: cfg.idle_ns,
            stats: PointStats::default(),
        }
    }

    /// Hints the CPU to fetch the flow's bucket.
    #[inline(always)]
    pub fn prefetch(&self, hash: u64) {
        slots::prefetch(&self.slots, self.bucket_mask, hash);
    }

    /// The color for this packet of `key` and the number of the batch it belongs to, or `None`
    /// if the marker has no room for the flow (it then passes unmarked).
    #[inline]
    pub fn mark<S: EventSink>(
        &mut self,
        key: &FlowKey,
        hash: u64,
        now: u64,
        sink: &mut S,
    ) -> Option<(u8, u32)> {
        let i = match find_or_admit(&self.slots, self.bucket_mask, hash, now, self.idle_ns) {
            Lookup::Hit(i) => i,
            Lookup::New(i) => {
                self.admit(i, key, hash, now);
                i
            }
            Lookup::Evict(i) => {
                self.retire(i, sink);
                self.stats.evicted += 1;
                self.admit(i, key, hash, now);
                i
            }
            Lookup::Full => {
                self.stats.refused += 1;
                return None;
            }
        };
        let (point, batch, period) = (self.point, self.batch, self.period_ns);
        let e = self.slots.get_mut(i)?;
        e.seen_ns = now;
        let turn = match period {
            None => e.count >= batch,
            Some(t) => e.count > 0 && now / t != e.first_ns / t,
        };
        if turn {
            emit(e, key, point, false, sink);
            self.stats.batches += 1;
            e.ordinal = e.ordinal.wrapping_add(1);
            e.color ^= 1;
            e.count = 0;
            e.first_ns = now;
            if let Some(t) = period {
                // Time-based colors follow the clock, so all first hops agree (RFC 9341 §3.1).
                e.color = ((now / t) & 1) as u8;
            }
        }
        e.count += 1;
        Some((e.color, e.ordinal))
    }

    fn admit(&mut self, i: usize, key: &FlowKey, hash: u64, now: u64) {
        if let (Some(e), Some(k)) = (self.slots.get_mut(i), self.keys.get_mut(i)) {
            let color = self.period_ns.map_or(0, |t| ((now / t) & 1) as u8);
            *e = MarkEntry {
                tag: slots::tag_of(hash),
                color,
                first_ns: now,
                ..MarkEntry::default()
            };
            *k = *key;
            self.stats.admitted += 1;
        }
    }

    fn retire<S: EventSink>(&mut self, i: usize, sink: &mut S) {
        if let (Some(e), Some(k)) = (self.slots.get_mut(i), self.keys.get(i)) {
            if e.tag != 0 && e.count > 0 {
                emit(e, k, self.point, true, sink);
                self.stats.batches += 1;
            }
            *e = MarkEntry::default();
        }
    }

    /// Reports every partly marked batch (end of capture, shutdown).
    pub fn flush<S: EventSink>(&mut self, sink: &mut S) {
        for i in 0..self.slots.len() {
            self.retire(i, sink);
        }
    }

    /// Retires flows idle at `now`.
    pub fn expire<S: EventSink>(&mut self, now: u64, sink: &mut S) -> usize {
        let mut n = 0;
        for i in 0..self.slots.len() {
            if self
                .slots
                .get(i)
                .is_some_and(|e| e.tag != 0 && now.saturating_sub(e.seen_ns) > self.idle_ns)
            {
                self.retire(i, sink);
                self.stats.evicted += 1;
                n += 1;
            }
        }
        n
    }
}

fn emit<S: EventSink>(e: &MarkEntry, key: &FlowKey, point: u8, tail: bool, sink: &mut S) {
    sink.emit(BatchEvent {
        key: *key,
        point,
        kind: BatchEventKind::Closed,
        color: e.color,
        ordinal: e.ordinal,
        count: e.count,
        first_ns: e.first_ns,
        last_ns: e.seen_ns,
        tail,
        head: false,
        cut: false,
        ttl: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::{IpAddr, Ipv4Addr};

    #[test]
    fn count_based_alternates_every_b() {
        let cfg = LossConfig { batch: 3, ..LossConfig::default() };
        let mut m = Marker::new(&cfg, 0);
        let k = FlowKey { src: IpAddr::V4(Ipv4Addr::LOCALHOST), ..FlowKey::default() };
        let h = crate::flow_hash(&k);
        let mut ev = Vec::new();
        let colors: Vec<u8> = (0..8).map(|i| m.mark(&k, h, i, &mut ev).unwrap().0).collect();
        assert_eq!(colors, vec![0, 0, 0, 1, 1, 1, 0, 0]);
        m.flush(&mut ev);
        let counts: Vec<(u8, u32)> = ev.iter().map(|e| (e.color, e.count)).collect();
        assert_eq!(counts, vec![(0, 3), (1, 3), (0, 2)]);
    }

    #[test]
    fn time_based_follows_clock() {
        let cfg = LossConfig { period_ns: Some(100), ..LossConfig::default() };
        let mut m = Marker::new(&cfg, 0);
        let k = FlowKey::default();
        let h = crate::flow_hash(&k);
        let mut ev = Vec::new();
        let colors: Vec<u8> =
            [150u64, 160, 210, 420].iter().map(|t| m.mark(&k, h, *t, &mut ev).unwrap().0).collect();
        assert_eq!(colors, vec![1, 1, 0, 0]);
        assert_eq!(ev.len(), 2);
    }
}
