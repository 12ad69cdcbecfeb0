//! One observation point: per-flow, per-color counters and the reorder-robust step detector,
//! in the paper's 2-way layout (see [`slots`]), with the per-flow logic of [`detector`]
//! in the compact encoding of [`fast`].

use super::detector::{Params, Tail};
use super::fast::{self, FastState, SlowState};
use super::slots::{self, find_or_admit, Counter, Lookup, Slot};
use super::{BatchEvent, EventSink, LossConfig, Refusal, RefusedSet, Selection};
use telemark_wire::FlowKey;

/// One flow at one point: exactly one cache line (64 B) for every counter width.
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct Entry<C: Counter> {
    tag: u32,
    hot: FastState<C>,
    cold: SlowState,
}

impl<C: Counter> Slot for Entry<C> {
    fn tag(&self) -> u32 {
        self.tag
    }
    fn seen_ns(&self) -> u64 {
        self.hot.last()
    }
}

/// What one point counted, for its own cost and health (exported as metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PointStats {
    /// Packets of flows the table had no room for (first come, first served).
    pub refused: u64,
    /// Flows admitted.
    pub admitted: u64,
    /// Flows retired for idleness (their batches closed and reported).
    pub evicted: u64,
    /// Batches closed.
    pub batches: u64,
    /// Packets that arrived after their batch closed (added when the batch's late window
    /// ends).
    pub late: u64,
    /// Packets of flows that active flow selection left out (not counted in `refused`).
    pub unselected: u64,
    /// Flows that active flow selection stopped watching (their open batches cut).
    pub deselected: u64,
}

/// One observation point's color counter table with counters of type `C`.
pub struct ColorTable<C: Counter> {
    slots: Vec<Entry<C>>,
    keys: Vec<FlowKey>,
    bucket_mask: usize,
    params: Params,
    idle_ns: u64,
    refused: RefusedSet,
    /// Active flow selection: only these flows are admitted (`None`: first come first served).
    selection: Option<Selection>,
    /// Counters of this point.
    pub stats: PointStats,
}

impl<C: Counter> ColorTable<C> {
    /// A table for point number `point` (as the aggregator numbers them).
    pub fn new(cfg: &LossConfig, point: u8) -> Self {
        let n = cfg.table_size.max(2).next_power_of_two();
        ColorTable {
            slots: vec![Entry::default(); n],
            keys: vec![FlowKey::default(); n],
            bucket_mask: n / 2 - 1,
            params: Params::new(cfg, point),
            idle_ns: cfg.idle_ns,
            refused: RefusedSet::new(cfg.idle_ns),
            selection: None,
            stats: PointStats::default(),
        }
    }

    /// Active flow selection: from now on the table admits only the flows in `selection`
    /// (`None`: every flow, first come first served). Flows it holds that are not selected
    /// any more are retired at once, their open batches reported as cut; flows selected anew
    /// are admitted armed on their next packet (see `Detector::armed`), so that the first batch
    /// they report is whole. Off the per-packet path: call it at window boundaries.
    pub fn select<S: EventSink>(&mut self, selection: Option<Selection>, sink: &mut S) {
        if let Some(sel) = &selection {
            for i in 0..self.slots.len() {
                let held = self.slots.get(i).is_some_and(|e| e.tag != 0);
                if held && self.keys.get(i).is_some_and(|k| !sel.contains(k)) {
                    self.retire(i, Tail::Cut, sink);
                    self.stats.deselected += 1;
                }
            }
        }
        self.selection = selection;
    }

    /// Hints the CPU to bring the flow's bucket into cache before [`observe`](Self::observe).
    #[inline(always)]
    pub fn prefetch(&self, hash: u64) {
        slots::prefetch(&self.slots, self.bucket_mask, hash);
    }

    /// Counts one packet of `key` (hash `hash`) with color `color` seen at `now`. Returns false
    /// when the table refused the flow.
    #[inline(always)]
    pub fn observe<S: EventSink>(
        &mut self,
        key: &FlowKey,
        hash: u64,
        color: u8,
        now: u64,
        sink: &mut S,
    ) -> bool {
        // FastState path: a known flow whose packet needs no event. This is the paper's
        // `pkt_loss_chk`: one tag compare and one counter increment in a line the switch
        // prefetched a burst earlier.
        let tag = slots::tag_of(hash);
        let (a, b) = slots::slot_pair(hash, self.bucket_mask);
        let hit = match (self.slots.get(a), self.slots.get(b)) {
            (Some(x), _) if x.tag == tag => Some(a),
            (_, Some(y)) if y.tag == tag => Some(b),
            _ => None,
        };
        if let Some(e) = hit.and_then(|i| self.slots.get_mut(i)) {
            if e.hot.count(color, now) {
                return true;
            }
        }
        self.observe_slow(hit, key, hash, color, now, sink)
    }

    /// Admission, eviction, and every packet the hot path left alone.
    #[cold]
    #[inline(never)]
    fn observe_slow<S: EventSink>(
        &mut self,
        hit: Option<usize>,
        key: &FlowKey,
        hash: u64,
        color: u8,
        now: u64,
        sink: &mut S,
    ) -> bool {
        if hit.is_none() && self.selection.as_ref().is_some_and(|s| !s.contains(key)) {
            self.refuse(Refusal::NotSelected, (key, hash, now), sink);
            return false;
        }
        let lookup = match hit {
            Some(i) => Lookup::Hit(i),
            None => find_or_admit(&self.slots, self.bucket_mask, hash, now, self.idle_ns),
        };
        let i = match lookup {
            Lookup::Hit(i) => i,
            Lookup::New(i) => {
                self.admit(i, key, hash, now, sink);
                i
            }
            Lookup::Evict(i) => {
                self.retire(i, Tail::End, sink);
                self.stats.evicted += 1;
                self.admit(i, key, hash, now, sink);
                i
            }
            Lookup::Full => {
                self.refuse(Refusal::Full, (key, hash, now), sink);
                return false;
            }
        };
        let Some(e) = self.slots.get_mut(i) else { return false };
        fast::slow(&mut e.hot, &mut e.cold, key, &self.params, &mut self.stats, color, now, sink);
        true
    }

    fn refuse<S: EventSink>(&mut self, why: Refusal, flow: (&FlowKey, u64, u64), sink: &mut S) {
        let mut pts = [(self.params.point, &mut self.stats)];
        self.refused.refuse(why, flow, &mut pts, sink);
    }

    fn admit<S: EventSink>(&mut self, i: usize, key: &FlowKey, hash: u64, now: u64, sink: &mut S) {
        let joins = self.refused.admitted(hash, now);
        if let (Some(e), Some(k)) = (self.slots.get_mut(i), self.keys.get_mut(i)) {
            *e = Entry { tag: slots::tag_of(hash), ..Entry::default() };
            if self.selection.is_some() || joins {
                // Selected flows, and flows admitted after a refusal, join mid-flow.
                fast::arm(&mut e.hot);
            }
            *k = *key;
        }
        if joins {
            // Not measured here until its first whole batch: what upstream saw of it before
            // is not this point's to report, as for a refused flow.
            sink.emit(BatchEvent::refused(key, self.params.point));
        }
    }

    /// Closes and reports everything slot `i` holds, then frees it.
    fn retire<S: EventSink>(&mut self, i: usize, how: Tail, sink: &mut S) {
        let (Some(e), Some(key)) = (self.slots.get_mut(i), self.keys.get(i)) else { return };
        let (p, st) = (&self.params, &mut self.stats);
        fast::retire(&e.hot, &e.cold, key, p, st, how, sink);
        *e = Entry::default();
    }

    /// Retires flows idle for longer than the idle timeout at `now`. Off the per-packet path:
    /// call it every so often (the pipeline does so once per interval).
    pub fn expire<S: EventSink>(&mut self, now: u64, sink: &mut S) -> usize {
        let mut n = 0;
        for i in 0..self.slots.len() {
            let idle = self
                .slots
                .get(i)
                .is_some_and(|e| e.tag != 0 && now.saturating_sub(e.hot.last()) > self.idle_ns);
            if idle {
                self.retire(i, Tail::End, sink);
                self.stats.evicted += 1;
                n += 1;
            }
        }
        n
    }

    /// Closes and reports every open batch (end of a capture, shutdown).
    pub fn flush<S: EventSink>(&mut self, sink: &mut S) {
        for i in 0..self.slots.len() {
            if self.slots.get(i).is_some_and(|e| e.tag != 0) {
                self.retire(i, Tail::End, sink);
            }
        }
    }

    /// Flows currently held.
    pub fn occupancy(&self) -> usize {
        self.slots.iter().filter(|e| e.tag != 0).count()
    }

    /// Table capacity in flows.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

/// A color table whose counter width is chosen at run time (`--counter-bits`).
pub enum AnyColorTable {
    /// 8-bit counters (the paper's; B ≤ 255).
    U8(ColorTable<u8>),
    /// 16-bit counters.
    U16(ColorTable<u16>),
    /// 32-bit counters.
    U32(ColorTable<u32>),
}

macro_rules! each {
    ($self:expr, $t:ident => $e:expr) => {
        crate::each_width!(AnyColorTable, $self, $t => $e)
    };
}

impl AnyColorTable {
    /// A table as `cfg.counter_bits` asks.
    pub fn new(cfg: &LossConfig, point: u8) -> Self {
        match cfg.counter_bits {
            8 => AnyColorTable::U8(ColorTable::new(cfg, point)),
            16 => AnyColorTable::U16(ColorTable::new(cfg, point)),
            _ => AnyColorTable::U32(ColorTable::new(cfg, point)),
        }
    }
    /// See [`ColorTable::prefetch`].
    #[inline(always)]
    pub fn prefetch(&self, hash: u64) {
        each!(self, t => t.prefetch(hash))
    }
    /// See [`ColorTable::observe`].
    #[inline(always)]
    #[allow(clippy::inline_always)]
    pub fn observe<S: EventSink>(
        &mut self,
        key: &FlowKey,
        hash: u64,
        color: u8,
        now: u64,
        sink: &mut S,
    ) -> bool {
        each!(self, t => t.observe(key, hash, color, now, sink))
    }
    /// See [`ColorTable::expire`].
    pub fn expire<S: EventSink>(&mut self, now: u64, sink: &mut S) -> usize {
        each!(self, t => t.expire(now, sink))
    }
    /// See [`ColorTable::flush`].
    pub fn flush<S: EventSink>(&mut self, sink: &mut S) {
        each!(self, t => t.flush(sink))
    }
    /// See [`ColorTable::select`].
    pub fn select<S: EventSink>(&mut self, selection: Option<Selection>, sink: &mut S) {
        each!(self, t => t.select(selection, sink))
    }
    /// This point's counters.
    pub fn stats(&self) -> PointStats {
        each!(self, t => t.stats)
    }
    /// Table capacity in flows.
    pub fn capacity(&self) -> usize {
        each!(self, t => t.capacity())
    }
    /// Flows held.
    pub fn occupancy(&self) -> usize {
        each!(self, t => t.occupancy())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::{test_key as key, BatchEvent, BatchEventKind};

    /// Colors of `batches` batches of `b` packets, alternately 0 and 1.
    fn stream(b: usize, batches: usize) -> Vec<u8> {
        (0..b * batches).map(|i| ((i / b) % 2) as u8).collect()
    }

    fn run(colors: &[u8], cfg: &LossConfig) -> Vec<BatchEvent> {
        let mut t = ColorTable::<u8>::new(cfg, 1);
        let k = key(1);
        let h = crate::flow_hash(&k);
        let mut ev = Vec::new();
        for (i, c) in colors.iter().enumerate() {
            assert!(t.observe(&k, h, *c, i as u64, &mut ev));
        }
        t.flush(&mut ev);
        ev
    }

    fn closed(ev: &[BatchEvent]) -> Vec<u32> {
        ev.iter().filter(|e| e.kind == BatchEventKind::Closed).map(|e| e.count).collect()
    }

    #[test]
    fn in_order_batches_close_exactly() {
        let ev = run(&stream(100, 5), &LossConfig::default());
        assert_eq!(closed(&ev), vec![100; 5]);
        assert!(ev.iter().all(|e| e.kind == BatchEventKind::Closed || e.count == 0));
        let ords: Vec<u32> =
            ev.iter().filter(|e| e.kind == BatchEventKind::Closed).map(|e| e.ordinal).collect();
        assert_eq!(ords, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn drops_show_in_the_batch_they_hit() {
        let mut s = stream(100, 4);
        // drop 3 packets of batch 1 and the first 2 of batch 3
        for i in [150, 151, 199, 300, 301] {
            s[i] = 9;
        }
        s.retain(|c| *c != 9);
        assert_eq!(closed(&run(&s, &LossConfig::default())), vec![100, 97, 100, 98]);
    }

    /// A batch that lost more than 1 − threshold of its packets never reaches its step; the
    /// batch after it (same color as the one before) must not merge into the one before.
    #[test]
    fn a_batch_almost_wiped_out_does_not_merge_its_neighbours() {
        let s = stream(100, 5);
        // Batch 1 keeps 12 of its packets, batch 3 only 5; batch 2 loses 20.
        let keep = |i: usize| match i / 100 {
            1 => i % 100 < 12,
            2 => i % 100 >= 20,
            3 => (i % 100).is_multiple_of(20),
            _ => true,
        };
        let s: Vec<u8> = s.iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, c)| *c).collect();
        let ev = run(&s, &LossConfig::default());
        assert_eq!(closed(&ev), vec![100, 12, 80, 5, 100]);
        let ords: Vec<u32> =
            ev.iter().filter(|e| e.kind == BatchEventKind::Closed).map(|e| e.ordinal).collect();
        assert_eq!(ords, vec![0, 1, 2, 3, 4]);
        // A batch that keeps fewer packets than the late window is long (65 of 100) ends
        // inside it: the next batch's packets are not all taken as late.
        let s = stream(100, 4);
        let s: Vec<u8> = s
            .iter()
            .enumerate()
            .filter(|(i, _)| i / 100 != 1 || i % 100 < 40)
            .map(|(_, c)| *c)
            .collect();
        let ev = run(&s, &LossConfig::default());
        assert_eq!(closed(&ev), vec![100, 40, 100, 100]);
        assert!(ev.iter().all(|e| e.kind != BatchEventKind::Late || e.count == 0));
        // With reordering below the threshold instead, the open color's stragglers after the
        // next batch's first packets stay in their batch.
        let mut s = stream(100, 3);
        let moved: Vec<u8> = s.drain(80..100).collect();
        let tail = s.split_off(80 + 5);
        s.extend_from_slice(&moved);
        s.extend(tail);
        assert_eq!(closed(&run(&s, &LossConfig::default())), vec![100, 100, 100]);
    }

    #[test]
    fn reordering_is_late_not_next_batch() {
        // The last 10 packets of batch 0 arrive after 35 packets of batch 1: after the step
        // (at 30) but inside the late window, so they are late for batch 0, not early packets
        // of batch 2 (which has the same color).
        let mut s = stream(100, 3);
        let moved: Vec<u8> = s.drain(90..100).collect();
        let tail = s.split_off(90 + 35);
        s.extend_from_slice(&moved);
        s.extend(tail);
        let ev = run(&s, &LossConfig::default());
        assert_eq!(closed(&ev), vec![90, 100, 100]);
        let late: Vec<(u32, u32)> = ev
            .iter()
            .filter(|e| e.kind == BatchEventKind::Late && e.count > 0)
            .map(|e| (e.ordinal, e.count))
            .collect();
        assert_eq!(late, vec![(0, 10)]);
    }

    #[test]
    fn refuses_when_full_and_evicts_idle() {
        let cfg = LossConfig { table_size: 2, idle_ns: 10, ..LossConfig::default() };
        let mut t = ColorTable::<u8>::new(&cfg, 0);
        let mut ev = Vec::new();
        let mut ok = 0;
        for i in 0..50u8 {
            let k = key(i);
            ok += usize::from(t.observe(&k, crate::flow_hash(&k), 0, 5, &mut ev));
        }
        assert_eq!(ok, 2);
        assert_eq!(t.stats.refused, 48);
        // Each refused flow is reported.
        let refused = ev.iter().filter(|e| e.kind == BatchEventKind::Refused).count();
        assert_eq!(refused, 48);
        ev.clear();
        // Their next packets are mostly not reported again (only flows that collided in the
        // small set of recently refused flows are).
        for i in 0..50u8 {
            let k = key(i);
            t.observe(&k, crate::flow_hash(&k), 0, 6, &mut ev);
        }
        assert!(ev.len() < 12, "{} refused flows reported again", ev.len());
        ev.clear();
        // 100 ns later both are idle: a new flow takes a slot and the old flow's batch is
        // reported.
        let k = key(200);
        assert!(t.observe(&k, crate::flow_hash(&k), 0, 100, &mut ev));
        assert_eq!(t.stats.evicted, 1);
        // (it had two packets, one from each loop above)
        assert_eq!(closed(&ev), vec![2]);
        assert!(ev.iter().filter(|e| e.kind == BatchEventKind::Closed).all(|e| e.tail));
    }

    #[test]
    fn wide_counters_allow_big_batches() {
        let cfg = LossConfig { batch: 1000, counter_bits: 16, ..LossConfig::default() };
        let mut t = ColorTable::<u16>::new(&cfg, 0);
        let k = key(1);
        let mut ev = Vec::new();
        for (i, c) in stream(1000, 3).iter().enumerate() {
            t.observe(&k, crate::flow_hash(&k), *c, i as u64, &mut ev);
        }
        t.flush(&mut ev);
        assert_eq!(closed(&ev), vec![1000; 3]);
    }

    #[test]
    fn time_based_periods() {
        // Period 1000 ns, one packet every 10 ns: 100 packets per period.
        let cfg = LossConfig { period_ns: Some(1000), ..LossConfig::default() };
        let mut t = ColorTable::<u8>::new(&cfg, 0);
        let k = key(1);
        let mut ev = Vec::new();
        for i in 0..400u64 {
            let now = i * 10;
            t.observe(&k, crate::flow_hash(&k), ((now / 1000) % 2) as u8, now, &mut ev);
        }
        t.flush(&mut ev);
        assert_eq!(closed(&ev), vec![100; 4]);
    }

    /// A flow the full table refused and then admitted (an idle flow made room) joins
    /// mid-flow: armed, it reports nothing of the batch it joined, only whole batches after it,
    /// the first marked `head`.
    #[test]
    fn a_flow_admitted_after_a_refusal_joins_armed() {
        let cfg = LossConfig { table_size: 2, idle_ns: 1_000, ..LossConfig::default() };
        let mut t = ColorTable::<u8>::new(&cfg, 1);
        let keys: Vec<FlowKey> = (1..=3).map(crate::loss::test_key).collect();
        let hashes: Vec<u64> = keys.iter().map(crate::flow_hash).collect();
        let mut ev: Vec<BatchEvent> = Vec::new();
        // Flows 0 and 1 fill the table; flow 2 is refused.
        assert!(t.observe(&keys[0], hashes[0], 0, 0, &mut ev));
        assert!(t.observe(&keys[1], hashes[1], 0, 0, &mut ev));
        assert!(!t.observe(&keys[2], hashes[2], 0, 10, &mut ev));
        // Both idle out; flow 2 comes in mid-batch, then two more batches.
        t.expire(5_000, &mut ev);
        ev.clear();
        for i in 0..250u64 {
            let color = u8::from((10 + i) / 100 % 2 == 1);
            assert!(t.observe(&keys[2], hashes[2], color, 6_000 + i, &mut ev));
        }
        t.flush(&mut ev);
        let closed: Vec<(u32, bool, bool)> = ev
            .iter()
            .filter(|e| e.kind == BatchEventKind::Closed)
            .map(|e| (e.count, e.head, e.tail))
            .collect();
        assert!(!closed.is_empty() && closed[0].1, "first batch reported not head: {closed:?}");
        assert!(closed.iter().all(|c| c.0 == 100 || c.2), "a partial batch: {closed:?}");
    }

    /// A flow selected mid-flow, whose first packet here is a straggler of the batch before
    /// the one in flight (so the first color change it sees is not a batch's start), reports
    /// only whole batches, the first marked `head`, and nothing while armed.
    #[test]
    fn a_flow_selected_mid_flow_reports_only_whole_batches() {
        let cfg = LossConfig::default();
        let mut t = ColorTable::<u8>::new(&cfg, 1);
        let k = key(1);
        let h = crate::flow_hash(&k);
        let mut ev = Vec::new();
        t.select(Some([k].into_iter().collect()), &mut ev);
        // Batches of 100; the last 10 packets of batch 2 arrive after 20 of batch 3; the point
        // sees the flow from the first of them on.
        let mut s = stream(100, 8);
        let moved: Vec<u8> = s.drain(290..300).collect();
        let tail = s.split_off(310);
        s.extend_from_slice(&moved);
        s.extend(tail);
        for (i, c) in s.iter().enumerate().skip(310) {
            assert!(t.observe(&k, h, *c, i as u64, &mut ev));
            if i < 400 {
                assert!(ev.is_empty(), "armed flow reported {ev:?}");
            }
        }
        t.flush(&mut ev);
        assert_eq!(closed(&ev), vec![100; 4], "batches 4 to 7");
        let heads: Vec<bool> =
            ev.iter().filter(|e| e.kind == BatchEventKind::Closed).map(|e| e.head).collect();
        assert_eq!(heads, vec![true, false, false, false]);
        assert!(ev.iter().all(|e| !e.cut));
        assert_eq!(t.stats.admitted, 1);
    }

    /// Selection admits only selected flows (the others counted apart from `refused` and
    /// reported once as not watched), and cuts the flows it drops.
    #[test]
    fn selection_admits_selected_flows_and_cuts_the_rest() {
        let mut t = ColorTable::<u8>::new(&LossConfig::default(), 1);
        let mut ev = Vec::new();
        let (a, b) = (key(1), key(2));
        for i in 0..50u64 {
            for k in [&a, &b] {
                assert!(t.observe(k, crate::flow_hash(k), 0, i, &mut ev));
            }
        }
        assert!(ev.is_empty());
        // First come first served so far: both held. Keep `a` only.
        t.select(Some([a].into_iter().collect()), &mut ev);
        let cut: Vec<(FlowKey, u32, bool)> = ev.iter().map(|e| (e.key, e.count, e.cut)).collect();
        assert_eq!(cut, vec![(b, 50, true)]);
        ev.clear();
        assert!(!t.observe(&b, crate::flow_hash(&b), 0, 60, &mut ev));
        assert!(!t.observe(&b, crate::flow_hash(&b), 0, 61, &mut ev));
        assert_eq!((t.stats.unselected, t.stats.refused, t.stats.deselected), (2, 0, 1));
        let kinds: Vec<BatchEventKind> = ev.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, vec![BatchEventKind::Refused]);
        // `a` was held before the selection and keeps its batch.
        assert!(t.observe(&a, crate::flow_hash(&a), 0, 62, &mut ev));
        t.flush(&mut ev);
        assert_eq!(closed(&ev), vec![51]);
    }

    #[test]
    fn entry_is_one_cache_line() {
        assert_eq!(core::mem::size_of::<Entry<u8>>(), 64);
        assert_eq!(core::mem::size_of::<Entry<u32>>(), 64);
        assert_eq!(core::mem::align_of::<Entry<u16>>(), 64);
    }
}
