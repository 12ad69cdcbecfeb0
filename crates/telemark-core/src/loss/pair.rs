//! Both observation points of one switch (ingress and egress), kept beside the switch's own
//! flow table instead of in two tables of their own.
//!
//! A switch already finds every packet's flow to forward it (OvS's exact-match cache, and the
//! per-flow `used`/packet/byte statistics it updates for every packet). The loss paper's
//! prototype looks the flow up twice more, once per point, in tables of its own; here the
//! switch passes the slot its lookup found, and the loss state of both points sits at the same
//! index of a parallel array: one 64-byte line holding the hot state of ingress and egress,
//! and a second, cold line touched once per batch. No hashing, no tag compare, no second miss,
//! and no flow the switch forwards is refused for lack of room in a loss table.
//!
//! The per-flow logic is the same as the stand-alone [`ColorTable`](super::ColorTable)'s
//! (module `point`); only the storage differs.

use super::point::{self, Cold, Hot, Params, Tail, USED};
use super::slots::Counter;
use super::{EventSink, LossConfig, PointStats, Refusal, RefusedSet};
use telemark_wire::FlowKey;

/// Ingress and egress of one flow: one cache line for every counter width.
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct PairHot<C: Counter> {
    seen_ns: u64,
    pts: [Hot<C>; 2],
}

/// The loss state of a switch's two points, indexed by the switch's flow-table slot.
pub struct PairTable<C: Counter> {
    hot: Vec<PairHot<C>>,
    cold: Vec<[Cold; 2]>,
    params: [Params; 2],
    idle_ns: u64,
    refused: RefusedSet,
    /// Counters of the ingress (`[0]`) and egress (`[1]`) points.
    pub stats: [PointStats; 2],
}

impl<C: Counter> PairTable<C> {
    /// State for a flow table of `slots` slots; `points` numbers ingress and egress for the
    /// aggregator.
    pub fn new(cfg: &LossConfig, slots: usize, points: (u8, u8)) -> Self {
        PairTable {
            hot: vec![PairHot::default(); slots],
            cold: vec![[Cold::default(); 2]; slots],
            params: [Params::new(cfg, points.0), Params::new(cfg, points.1)],
            idle_ns: cfg.idle_ns,
            refused: RefusedSet::default(),
            stats: [PointStats::default(); 2],
        }
    }

    /// Hints the CPU to bring slot `slot`'s hot line into cache.
    #[inline(always)]
    pub fn prefetch(&self, slot: usize) {
        #[cfg(target_arch = "x86_64")]
        if let Some(e) = self.hot.get(slot) {
            // SAFETY: a prefetch hint on a live element never faults.
            unsafe {
                core::arch::x86_64::_mm_prefetch(
                    e as *const PairHot<C> as *const i8,
                    core::arch::x86_64::_MM_HINT_T0,
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }

    /// Counts one packet of the flow in slot `slot` at point `at` (0 ingress, 1 egress).
    #[inline(always)]
    pub fn observe<S: EventSink>(
        &mut self,
        at: usize,
        slot: usize,
        key: &FlowKey,
        color: u8,
        now: u64,
        sink: &mut S,
    ) {
        let (Some(e), Some(p)) = (self.hot.get_mut(slot), self.params.get(at)) else { return };
        e.seen_ns = now;
        let Some(h) = e.pts.get_mut(at) else { return };
        if point::fast(h, p, color, now) {
            self.observe_slow(at, slot, key, color, now, sink);
        }
    }

    #[cold]
    #[inline(never)]
    fn observe_slow<S: EventSink>(
        &mut self,
        at: usize,
        slot: usize,
        key: &FlowKey,
        color: u8,
        now: u64,
        sink: &mut S,
    ) {
        if let Some((h, c, p, st, _)) = self.point_mut(at, slot) {
            point::slow(h, c, key, p, st, color, now, sink);
        }
    }

    /// Point `at` of slot `slot`: its hot and cold state, its constants and counters, and the
    /// flow's last-seen time.
    #[allow(clippy::type_complexity)]
    fn point_mut(
        &mut self,
        at: usize,
        slot: usize,
    ) -> Option<(&mut Hot<C>, &mut Cold, &Params, &mut PointStats, u64)> {
        let e = self.hot.get_mut(slot)?;
        let seen = e.seen_ns;
        Some((
            e.pts.get_mut(at)?,
            self.cold.get_mut(slot)?.get_mut(at)?,
            self.params.get(at)?,
            self.stats.get_mut(at)?,
            seen,
        ))
    }

    /// A packet of a flow the switch does not measure (its table is full, or selection left
    /// the flow out): counted at both points, and reported (about once per flow) so nobody
    /// mistakes its absence for loss.
    #[cold]
    pub fn refuse<S: EventSink>(&mut self, why: Refusal, key: &FlowKey, hash: u64, sink: &mut S) {
        let [i, e] = &mut self.stats;
        let mut pts = [(self.params[0].point, i), (self.params[1].point, e)];
        self.refused.refuse(why, key, hash, &mut pts, sink);
    }

    /// Starts watching the flow just installed in slot `slot` mid-flow: armed at both points
    /// (see `point::arm`).
    pub fn arm(&mut self, slot: usize) {
        self.clear(slot);
        if let Some(e) = self.hot.get_mut(slot) {
            for h in &mut e.pts {
                point::arm(h);
            }
        }
    }

    /// Stops watching slot `slot`'s flow (active flow selection): its open batches at both
    /// points are reported cut, at the same moment, and the slot is freed.
    pub fn cut<S: EventSink>(&mut self, slot: usize, key: &FlowKey, sink: &mut S) {
        for at in 0..2 {
            if let Some((h, c, p, st, seen)) = self.point_mut(at, slot) {
                point::retire(h, c, key, p, st, seen, Tail::Cut, sink);
                st.deselected += 1;
            }
        }
        self.clear(slot);
    }

    /// Whether slot `slot` holds a flow idle for longer than the idle timeout at `now`.
    pub fn is_idle(&self, slot: usize, now: u64) -> bool {
        self.hot.get(slot).is_some_and(|e| {
            e.pts.iter().any(|h| h.state & USED != 0)
                && now.saturating_sub(e.seen_ns) > self.idle_ns
        })
    }

    /// Closes and reports what slot `slot` holds at point `at` (0, 1) and frees that point.
    pub fn retire_point<S: EventSink>(
        &mut self,
        at: usize,
        slot: usize,
        key: &FlowKey,
        sink: &mut S,
    ) {
        if let Some((h, c, p, st, seen)) = self.point_mut(at, slot) {
            point::retire(h, c, key, p, st, seen, Tail::End, sink);
            *h = Hot::default();
        }
    }

    /// Retires slot `slot` at both points, ingress first, counting it as evicted.
    pub fn evict<S: EventSink>(&mut self, slot: usize, key: &FlowKey, sink: &mut S) {
        for at in 0..2 {
            self.retire_point(at, slot, key, sink);
            if let Some(s) = self.stats.get_mut(at) {
                s.evicted += 1;
            }
        }
        self.clear(slot);
    }

    /// Moves slot `from`'s state to `to` (the flow table moved the flow) and clears `from`.
    pub fn move_slot(&mut self, from: usize, to: usize) {
        if let (Some(h), Some(c)) = (self.hot.get(from).copied(), self.cold.get(from).copied()) {
            if let (Some(dh), Some(dc)) = (self.hot.get_mut(to), self.cold.get_mut(to)) {
                *dh = h;
                *dc = c;
            }
        }
        self.clear(from);
    }

    /// Frees slot `slot` without reporting (its flow left the table).
    pub fn clear(&mut self, slot: usize) {
        if let (Some(h), Some(c)) = (self.hot.get_mut(slot), self.cold.get_mut(slot)) {
            *h = PairHot::default();
            *c = [Cold::default(); 2];
        }
    }

    /// Slots.
    pub fn len(&self) -> usize {
        self.hot.len()
    }

    /// Whether the table has no slots.
    pub fn is_empty(&self) -> bool {
        self.hot.is_empty()
    }

    /// Bytes of hot state per slot (for the prefetch decision).
    pub const HOT_BYTES: usize = core::mem::size_of::<PairHot<C>>();
}

/// A [`PairTable`] whose counter width is chosen at run time (`--counter-bits`).
pub enum AnyPairTable {
    /// 8-bit counters (the paper's; B ≤ 255).
    U8(PairTable<u8>),
    /// 16-bit counters.
    U16(PairTable<u16>),
    /// 32-bit counters.
    U32(PairTable<u32>),
}

impl AnyPairTable {
    /// A table as `cfg.counter_bits` asks.
    pub fn new(cfg: &LossConfig, slots: usize, points: (u8, u8)) -> Self {
        match cfg.counter_bits {
            8 => AnyPairTable::U8(PairTable::new(cfg, slots, points)),
            16 => AnyPairTable::U16(PairTable::new(cfg, slots, points)),
            _ => AnyPairTable::U32(PairTable::new(cfg, slots, points)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::{test_key as key, BatchEventKind};

    #[test]
    fn hot_state_of_both_points_is_one_cache_line() {
        assert_eq!(core::mem::size_of::<PairHot<u8>>(), 64);
        assert_eq!(core::mem::size_of::<PairHot<u32>>(), 64);
    }

    /// Against the generator's and the dropper's record: 3 interleaved flows of 12 batches of
    /// 100, one packet in ten delayed by up to a third of a batch (past the next batch's step),
    /// 1 % dropped between ingress and egress. At each point every batch's in-time and late
    /// packets add up to the packets of that batch that reached the point.
    #[test]
    fn batch_counts_at_both_points_equal_what_arrived() {
        const B: u32 = 100;
        // An early step (after 10 packets of the next batch) so that delayed packets do land
        // after it, in the late window (which lasts until packet 56).
        let cfg = LossConfig { threshold: 0.1, ..LossConfig::default() };
        assert_eq!((cfg.close_at(), cfg.late_limit()), (10, 56));
        let mut pair = PairTable::<u8>::new(&cfg, 8, (1, 2));
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Each flow's packets by true batch number; one in ten is delayed by up to 33 places
        // (a third of a batch, the documented bound), so some arrive after the next batch's step.
        let streams: Vec<Vec<u32>> = (0..3)
            .map(|_| {
                let mut order: Vec<(u64, u32)> = (0..12 * B)
                    .map(|i| {
                        let delay = if next() % 10 == 0 { next() % 34 } else { 0 };
                        (u64::from(i) + delay, i / B)
                    })
                    .collect();
                order.sort_by_key(|&(at, _)| at);
                order.into_iter().map(|(_, batch)| batch).collect()
            })
            .collect();
        // truth[point][flow][batch]: packets that reached the point.
        let mut truth = vec![vec![vec![0u32; 12]; 3]; 2];
        let mut ev = Vec::new();
        let mut pos = [0usize; 3];
        let mut now = 0;
        while pos.iter().zip(&streams).any(|(p, s)| *p < s.len()) {
            for f in 0..3 {
                let Some(&batch) = streams[f].get(pos[f]) else { continue };
                pos[f] += 1;
                now += 1;
                let (k, slot, color) = (key(f as u8), f * 2, (batch % 2) as u8);
                pair.observe(0, slot, &k, color, now, &mut ev);
                truth[0][f][batch as usize] += 1;
                if next() % 100 != 0 {
                    pair.observe(1, slot, &k, color, now, &mut ev);
                    truth[1][f][batch as usize] += 1;
                }
            }
        }
        for at in 0..2 {
            for f in 0..3u8 {
                pair.retire_point(at, usize::from(f) * 2, &key(f), &mut ev);
            }
        }
        let late = ev.iter().filter(|e| e.kind == BatchEventKind::Late && e.count > 0).count();
        assert!(late > 0, "the reordering made no late packets: the test shows nothing");
        for (at, point) in [(0usize, 1u8), (1, 2)] {
            for f in 0..3u8 {
                let mut got = vec![0u32; 12];
                for e in ev.iter().filter(|e| e.point == point && e.key == key(f)) {
                    got[e.ordinal as usize] += e.count;
                }
                assert_eq!(got, truth[at][usize::from(f)], "point {point}, flow {f}");
            }
        }
        assert_eq!(pair.stats[1].batches, 36);
    }
}
