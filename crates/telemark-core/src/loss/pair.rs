//! Both observation points of one switch (ingress and egress), kept in the switch's own flow
//! table instead of in two tables of their own.
//!
//! A switch already finds every packet's flow to forward it (OvS's exact-match cache, and the
//! per-flow `used`/packet/byte statistics it updates for every packet). The loss paper's
//! prototype looks the flow up twice more, once per point, in tables of its own. Here the hot
//! state of both points ([`PairHot`]: 40 bytes with 8- or 16-bit counters) lives in the
//! forwarding entry the lookup found, in the same cache line, and the switch hands it to
//! [`PairTable`] with the entry's slot. What only the step and the late window's end touch is
//! kept here, indexed by that slot. No hashing, no tag compare, no line the forwarding lookup
//! did not already bring in, and no flow the switch forwards is refused for lack of room.
//!
//! The per-flow logic is the same as the stand-alone [`ColorTable`](super::ColorTable)'s
//! (module `point`); only the storage differs.

use super::point::{self, Cold, Hot, Params, Tail, USED};
use super::slots::Counter;
use super::{EventSink, LossConfig, PointStats, Refusal, RefusedSet};
use telemark_wire::FlowKey;

/// The hot loss state of one flow at ingress and egress, held by the switch in the flow's
/// forwarding entry: 32 bytes with 8-bit counters, 40 with 16-bit ones, 48 with 32-bit ones.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct PairHot<C: Counter> {
    pts: [Hot<C>; 2],
}

impl<C: Counter> PairHot<C> {
    /// The flow's last packet at either point.
    fn seen_ns(&self) -> u64 {
        self.pts.iter().map(Hot::last).max().unwrap_or(0)
    }
}

/// Both points' cold state of one flow, in a line of its own: the packet that visits the slow
/// path at ingress usually does at egress too.
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct ColdPair([Cold; 2]);

/// The loss state of a switch's two points besides the hot state: the cold state, indexed by
/// the switch's flow-table slot, and each point's constants and counters.
#[derive(Clone)]
pub struct PairTable<C: Counter> {
    cold: Vec<ColdPair>,
    params: [Params; 2],
    idle_ns: u64,
    refused: RefusedSet,
    /// Counters of the ingress (`[0]`) and egress (`[1]`) points.
    pub stats: [PointStats; 2],
    counters: core::marker::PhantomData<C>,
}

impl<C: Counter> PairTable<C> {
    /// State for a flow table of `slots` slots; `points` numbers ingress and egress for the
    /// aggregator.
    pub fn new(cfg: &LossConfig, slots: usize, points: (u8, u8)) -> Self {
        PairTable {
            cold: vec![ColdPair::default(); slots],
            params: [Params::new(cfg, points.0), Params::new(cfg, points.1)],
            idle_ns: cfg.idle_ns,
            refused: RefusedSet::default(),
            stats: [PointStats::default(); 2],
            counters: core::marker::PhantomData,
        }
    }

    /// Counts one packet of the flow in slot `slot`, whose hot state is `hot`, at point `at`
    /// (0 ingress, 1 egress).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn observe<S: EventSink>(
        &mut self,
        at: usize,
        hot: &mut PairHot<C>,
        slot: usize,
        key: &FlowKey,
        color: u8,
        now: u64,
        sink: &mut S,
    ) {
        let Some(h) = hot.pts.get_mut(at) else { return };
        if point::fast(h, color, now) {
            self.observe_slow(at, hot, slot, key, color, now, sink);
        }
    }

    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn observe_slow<S: EventSink>(
        &mut self,
        at: usize,
        hot: &mut PairHot<C>,
        slot: usize,
        key: &FlowKey,
        color: u8,
        now: u64,
        sink: &mut S,
    ) {
        if let Some((h, c, p, st)) = self.point_mut(at, hot, slot) {
            point::slow(h, c, key, p, st, color, now, sink);
        }
    }

    /// Point `at` of the flow in slot `slot`: its hot and cold state, its constants and
    /// counters.
    #[allow(clippy::type_complexity)]
    fn point_mut<'a>(
        &'a mut self,
        at: usize,
        hot: &'a mut PairHot<C>,
        slot: usize,
    ) -> Option<(&'a mut Hot<C>, &'a mut Cold, &'a Params, &'a mut PointStats)> {
        Some((
            hot.pts.get_mut(at)?,
            self.cold.get_mut(slot)?.0.get_mut(at)?,
            self.params.get(at)?,
            self.stats.get_mut(at)?,
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
    pub fn arm(&mut self, hot: &mut PairHot<C>, slot: usize) {
        self.clear(hot, slot);
        for h in &mut hot.pts {
            point::arm(h);
        }
    }

    /// Stops watching slot `slot`'s flow (active flow selection): its open batches at both
    /// points are reported cut, at the same moment, and the slot is freed.
    pub fn cut<S: EventSink>(
        &mut self,
        hot: &mut PairHot<C>,
        slot: usize,
        key: &FlowKey,
        sink: &mut S,
    ) {
        for at in 0..2 {
            if let (true, Some(st)) =
                (self.close(at, hot, slot, key, Tail::Cut, sink), self.stats.get_mut(at))
            {
                st.deselected += 1;
            }
        }
        self.clear(hot, slot);
    }

    /// Whether `hot` holds a flow idle for longer than the idle timeout at `now`.
    pub fn is_idle(&self, hot: &PairHot<C>, now: u64) -> bool {
        hot.pts.iter().any(|h| h.state & USED != 0)
            && now.saturating_sub(hot.seen_ns()) > self.idle_ns
    }

    /// Closes and reports what slot `slot` holds at point `at` (0, 1) and frees that point.
    pub fn retire_point<S: EventSink>(
        &mut self,
        at: usize,
        hot: &mut PairHot<C>,
        slot: usize,
        key: &FlowKey,
        sink: &mut S,
    ) {
        self.close(at, hot, slot, key, Tail::End, sink);
    }

    /// Closes and reports point `at` of slot `slot` as `tail` says and frees that point; false
    /// if there is no such point.
    fn close<S: EventSink>(
        &mut self,
        at: usize,
        hot: &mut PairHot<C>,
        slot: usize,
        key: &FlowKey,
        tail: Tail,
        sink: &mut S,
    ) -> bool {
        let Some((h, c, p, st)) = self.point_mut(at, hot, slot) else { return false };
        point::retire(h, c, key, p, st, tail, sink);
        *h = Hot::default();
        true
    }

    /// Retires slot `slot` at both points, ingress first, counting it as evicted.
    pub fn evict<S: EventSink>(
        &mut self,
        hot: &mut PairHot<C>,
        slot: usize,
        key: &FlowKey,
        sink: &mut S,
    ) {
        for at in 0..2 {
            if let (true, Some(st)) =
                (self.close(at, hot, slot, key, Tail::End, sink), self.stats.get_mut(at))
            {
                st.evicted += 1;
            }
        }
        self.clear(hot, slot);
    }

    /// Moves slot `from`'s cold state to `to` (the flow table moved the flow, its hot state
    /// with it) and clears `from`.
    pub fn move_slot(&mut self, from: usize, to: usize) {
        if let Some(c) = self.cold.get(from).copied() {
            if let Some(dc) = self.cold.get_mut(to) {
                *dc = c;
            }
        }
        if let Some(c) = self.cold.get_mut(from) {
            *c = ColdPair::default();
        }
    }

    /// Frees slot `slot` without reporting (its flow left the table).
    pub fn clear(&mut self, hot: &mut PairHot<C>, slot: usize) {
        *hot = PairHot::default();
        if let Some(c) = self.cold.get_mut(slot) {
            *c = ColdPair::default();
        }
    }

    /// Slots.
    pub fn len(&self) -> usize {
        self.cold.len()
    }

    /// Whether the table has no slots.
    pub fn is_empty(&self) -> bool {
        self.cold.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::{test_key as key, BatchEventKind};

    #[test]
    fn hot_state_of_both_points_leaves_room_for_a_forwarding_key_in_one_line() {
        assert_eq!(core::mem::size_of::<PairHot<u8>>(), 32);
        assert_eq!(core::mem::size_of::<PairHot<u16>>(), 40);
        assert_eq!(core::mem::size_of::<PairHot<u32>>(), 48);
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
        let mut hot = [PairHot::<u8>::default(); 8];
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
                pair.observe(0, &mut hot[slot], slot, &k, color, now, &mut ev);
                truth[0][f][batch as usize] += 1;
                if next() % 100 != 0 {
                    pair.observe(1, &mut hot[slot], slot, &k, color, now, &mut ev);
                    truth[1][f][batch as usize] += 1;
                }
            }
        }
        for at in 0..2 {
            for f in 0..3u8 {
                let slot = usize::from(f) * 2;
                pair.retire_point(at, &mut hot[slot], slot, &key(f), &mut ev);
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
