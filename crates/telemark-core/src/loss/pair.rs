//! Both observation points of one switch (ingress and egress), kept in the switch's own flow
//! table instead of in two tables of their own.
//!
//! A switch already finds every packet's flow to forward it (OvS's exact-match cache, and the
//! per-flow `used`/packet/byte statistics it updates for every packet). The loss paper's
//! prototype looks the flow up twice more, once per point, in tables of its own. Here the hot
//! state of both points ([`PairState`]: 28 bytes with 8-bit counters, 40 with 16-bit) lives in
//! the forwarding entry the lookup found, in the same cache line, and the switch hands it to
//! [`PairTable`] with the entry's slot, once per packet for both points. What only the slow
//! path touches is kept here, indexed by that slot. No hashing, no tag compare, no line the forwarding lookup
//! did not already bring in, and no flow the switch forwards is refused for lack of room.
//!
//! The per-flow logic is the reference detector's (module `detector`), through the compact
//! encoding of module `fast`; only the storage differs: the two points' hot states are kept as
//! lanes ([`Counter::Lanes`]) of one integer per color.

use super::detector::{Params, Tail};
use super::fast::{self, join, split, FastState, SlowState, THIRD};
use super::slots::Counter;
use super::{BatchEvent, BatchEventKind, EventSink, LossConfig, PointStats, Refusal, RefusedSet};
use telemark_wire::FlowKey;

/// The hot loss state of one flow at ingress and egress, held by the switch in the flow's
/// forwarding entry: 28 bytes with 8-bit counters, 40 with 16-bit ones, 64 with 32-bit ones.
/// Both points side by side: for each color, both points' budgets and counters are lanes of
/// one integer ([`Counter::Lanes`]), so that a packet that crosses the switch spends both
/// budgets and bumps both counters in one add.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PairState<C: Counter> {
    state: [u8; 2],
    /// Each point's third counter (late or resumed, `FastState::c[THIRD]`), which only the slow path
    /// touches.
    late: [C; 2],
    /// `lanes[color]`: both points' budgets and counters of that color.
    lanes: [C::Lanes; 2],
    /// Ingress's last time (`[0]`) and egress's (`[1]`), each as two 32-bit halves. Egress's
    /// is [`SAME`] while it is ingress's, so that the hot path, whose packets reach both
    /// points, stores one time. A packet only ingress saw (dropped inside the switch) sets
    /// egress's apart, and holds the flow until a packet that reaches both (`visit_points`).
    last: [[u32; 2]; 2],
}

/// One packet of a flow the switch measures, as its two points see it.
#[derive(Clone, Copy)]
pub struct PairPacket<'a> {
    /// The flow's slot in the switch's table (which indexes its cold state).
    pub slot: usize,
    pub key: &'a FlowKey,
    /// Its color bit.
    pub color: u8,
    pub now: u64,
    /// The switch let it out: egress saw it too.
    pub forwarded: bool,
}

/// Egress's last time when it is ingress's (no real time is `u64::MAX`).
const SAME: [u32; 2] = [u32::MAX; 2];

impl<C: Counter> Default for PairState<C> {
    fn default() -> Self {
        PairState {
            state: [0; 2],
            late: [C::default(); 2],
            lanes: [C::EMPTY; 2],
            last: [[0; 2], SAME],
        }
    }
}

impl<C: Counter> PairState<C> {
    /// Both points' hot path (see `FastState::count`): counts a packet the switch `forwarded` at
    /// ingress and at egress, if its color has budget left at both; true if it did. False,
    /// having changed nothing, when either point needs the slow path ([`PairTable::visit`]),
    /// and for a packet the switch dropped: only ingress saw that one, and drops inside a
    /// switch are rare enough that the slow path may count it. Left to the hot path, it cost
    /// every packet a choice between two increments and between two times (docs/overhead.md).
    #[inline(always)]
    pub fn count(&mut self, color: u8, now: u64, forwarded: bool) -> bool {
        if !forwarded {
            return false;
        }
        let Some(lanes) = self.lanes.get_mut(usize::from(color & 1)) else { return false };
        let Some(next) = C::spend(*lanes) else { return false };
        *lanes = next;
        // Egress's time is ingress's: a flow whose times are apart has no budget.
        self.last[0] = split(now);
        true
    }

    /// Sends every later packet of the flow to the slow path until it has been there: for a
    /// caller that puts off a slow-path visit, so that the flow's packets still reach each
    /// point in their order.
    #[inline(always)]
    pub fn hold_until_visit(&mut self) {
        for l in &mut self.lanes {
            *l = C::without_budget(*l);
        }
    }

    /// Point `at`'s state as the per-point logic reads it.
    #[inline]
    fn point(&self, at: usize) -> FastState<C> {
        let at = at & 1;
        let (mut budget, mut c) = ([0; 2], [C::default(); 3]);
        for (color, lanes) in self.lanes.iter().enumerate() {
            (budget[color], c[color]) = C::lane(*lanes, at);
        }
        c[THIRD] = self.late[at];
        FastState::from_parts(self.state[at], budget, c, join(self.last_at(at)))
    }

    /// Point `at`'s last time.
    #[inline]
    fn last_at(&self, at: usize) -> [u32; 2] {
        match self.last {
            [_, e] if at & 1 == 1 && e != SAME => e,
            [i, _] => i,
        }
    }

    /// Stores point `at`'s state back.
    #[inline]
    fn set_point(&mut self, at: usize, h: &FastState<C>) {
        let at = at & 1;
        self.state[at] = h.state();
        for (color, lanes) in self.lanes.iter_mut().enumerate() {
            C::set_lane(lanes, at, h.budget[color], h.c[color]);
        }
        self.late[at] = h.c[THIRD];
        let t = split(h.last());
        let [i, e] = &mut self.last;
        if at == 0 {
            // Egress keeps its own time, unless it is the new one.
            if *e == SAME {
                *e = *i;
            }
            *i = t;
            if *e == t {
                *e = SAME;
            }
        } else {
            *e = if t == *i { SAME } else { t };
        }
    }

    /// The flow's last packet at either point.
    fn seen_ns(&self) -> u64 {
        join(self.last_at(0)).max(join(self.last_at(1)))
    }
}

/// Color `y`'s lanes and the other color's, both mutable.
#[inline(always)]
fn split_lanes<L>(lanes: &mut [L; 2], y: usize) -> (&mut L, &mut L) {
    let [a, b] = lanes;
    if y == 0 {
        (a, b)
    } else {
        (b, a)
    }
}

/// Both points' cold state of one flow, in a line of its own: the packet that visits the slow
/// path at ingress usually does at egress too.
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct SlowPair([SlowState; 2]);

/// The loss state of a switch's two points besides the hot state: the cold state, indexed by
/// the switch's flow-table slot, and each point's constants and counters.
#[derive(Clone)]
pub struct PairTable<C: Counter> {
    cold: Vec<SlowPair>,
    params: [Params; 2],
    idle_ns: u64,
    refused: RefusedSet,
    /// Count-based periods with a threshold of more than one packet (and less than the
    /// counters hold): what [`Self::steady`] handles.
    counted: bool,
    /// Counters of the ingress (`[0]`) and egress (`[1]`) points.
    pub stats: [PointStats; 2],
    counters: core::marker::PhantomData<C>,
}

impl<C: Counter> PairTable<C> {
    /// State for a flow table of `slots` slots; `points` numbers ingress and egress for the
    /// aggregator.
    pub fn new(cfg: &LossConfig, slots: usize, points: (u8, u8)) -> Self {
        PairTable {
            cold: vec![SlowPair::default(); slots],
            params: [Params::new(cfg, points.0), Params::new(cfg, points.1)],
            counted: cfg.period_ns.is_none() && (2..C::MAX).contains(&cfg.close_at()),
            idle_ns: cfg.idle_ns,
            refused: RefusedSet::new(cfg.idle_ns),
            stats: [PointStats::default(); 2],
            counters: core::marker::PhantomData,
        }
    }

    /// Counts one packet of the flow whose hot state is `hot`: at ingress, and at egress too
    /// when the switch forwarded it ([`PairState::count`], else [`Self::visit`]).
    #[inline(always)]
    pub fn observe<S: EventSink>(
        &mut self,
        hot: &mut PairState<C>,
        pkt: PairPacket<'_>,
        sink: &mut S,
    ) {
        if !hot.count(pkt.color, pkt.now, pkt.forwarded) {
            self.visit(hot, pkt, sink);
        }
    }

    /// The packet [`PairState::count`] left: the one visit of a steady flow is done here on
    /// the lanes ([`Self::steady`]); anything else goes through each point's state machine.
    #[inline]
    pub fn visit<S: EventSink>(
        &mut self,
        hot: &mut PairState<C>,
        pkt: PairPacket<'_>,
        sink: &mut S,
    ) {
        if !self.steady(hot, pkt, sink) {
            self.visit_points(hot, pkt, sink);
        }
    }

    /// Each point the packet reached takes its hot path if it can, or the slow path.
    #[cold]
    #[inline(never)]
    fn visit_points<S: EventSink>(
        &mut self,
        hot: &mut PairState<C>,
        pkt: PairPacket<'_>,
        sink: &mut S,
    ) {
        let PairPacket { slot, key, color, now, forwarded } = pkt;
        for at in 0..1 + usize::from(forwarded) {
            let mut h = hot.point(at);
            if !h.count(color, now) {
                if let Some((c, p, st)) = self.point_mut(at, slot) {
                    fast::slow(&mut h, c, key, p, st, color, now, sink);
                }
            }
            hot.set_point(at, &h);
        }
        if hot.last[1] != SAME {
            // Egress's time is apart (ingress saw a packet it did not): the hot path, which
            // stores one time for both, waits for a packet that reaches both.
            hot.hold_until_visit();
        }
    }

    /// The one visit a batch brings a steady flow, done on the lanes directly for both points
    /// at once: the first packet of the batch after next. It takes the step the hot path let
    /// pass ([`Detector::step`](super::detector::Detector::step): the open batch is reported,
    /// and the next, all its early packets in it, opens), ends that batch's late window
    /// (nothing was late), and counts the packet as the first early packet of the batch after,
    /// as `fast::slow` would. Only for a forwarded packet of a flow whose
    /// two points are alike (state, counts, nothing late or resumed: every packet since the
    /// last difference crossed the switch), so that one decision and one write of each color's
    /// lanes serve both. True if it was done; false, having changed nothing, when a point needs
    /// the state machine (points apart, armed, saturated, time-based, late or resumed packets,
    /// a next batch still inside its late window, a threshold of one packet), so that the
    /// caller runs it. Each point ends exactly where `fast::slow` would leave it (the property
    /// test `both_points_in_lanes_change_no_event` runs both against the state machine alone).
    #[inline(always)]
    fn steady<S: EventSink>(
        &mut self,
        hot: &mut PairState<C>,
        pkt: PairPacket<'_>,
        sink: &mut S,
    ) -> bool {
        let PairPacket { slot, key, color, now, forwarded } = pkt;
        let y = usize::from(color & 1);
        let x = y ^ 1;
        let (Some(&ly), Some(&lx)) = (hot.lanes.get(y), hot.lanes.get(x)) else { return false };
        let (cy, cx) = (C::lane(ly, 0).1, C::lane(lx, 0).1);
        let s = hot.state[0];
        let alike = forwarded
            && self.counted
            && s == hot.state[1]
            && C::lane(ly, 1).1.get() == cy.get()
            && C::lane(lx, 1).1.get() == cx.get()
            && hot.late[0].get() == 0
            && hot.late[1].get() == 0
            && hot.last[1] == SAME;
        let (cy, cx) = (cy.get(), cx.get());
        // The packet is of the open color (`y`), the next batch's early packets (`x`) are past
        // the step and the late window that would follow it.
        if !alike
            || cx >= C::MAX
            || cx < self.params[0].late_limit
            || !FastState::<C>::plainly_open(s, y as u8)
        {
            return false;
        }
        let Some(cold) = self.cold.get_mut(slot) else { return false };
        for ((p, st), c) in self.params.iter().zip(&mut self.stats).zip(&mut cold.0) {
            sink.emit(BatchEvent {
                key: *key,
                point: p.point,
                kind: BatchEventKind::Closed,
                color: y as u8,
                ordinal: c.ordinal,
                count: cy,
                first_ns: c.first_ns,
                last_ns: c.open_last_ns,
                tail: false,
                head: FastState::<C>::head(s),
                cut: false,
                ttl: None,
            });
            st.batches += 1;
            c.ordinal = c.ordinal.wrapping_add(1);
            c.first_ns = c.next_first_ns;
            c.next_first_ns = now;
            c.open_last_ns = join(hot.last[0]);
        }
        // The batch of `x` is open, its window over; this packet is the first of the next.
        hot.state = [FastState::<C>::open_state(x as u8); 2];
        let (wy, wx) = split_lanes(&mut hot.lanes, y);
        *wy = C::both_points(fast::budget_for::<C>(1), C::from_u32(1));
        *wx = C::both_points(0, C::from_u32(cx));
        hot.last[0] = split(now);
        true
    }

    /// Hints the CPU to fetch slot `slot`'s cold state, ahead of a [`Self::visit`].
    #[inline(always)]
    pub fn prefetch(&self, slot: usize) {
        if let Some(c) = self.cold.get(slot) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch is a hint and never faults; this one is a live element.
            unsafe {
                use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch((c as *const SlowPair).cast::<i8>(), _MM_HINT_T0);
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = c;
        }
    }

    /// Point `at`'s cold state for slot `slot`, its constants and counters.
    fn point_mut(
        &mut self,
        at: usize,
        slot: usize,
    ) -> Option<(&mut SlowState, &Params, &mut PointStats)> {
        Some((
            self.cold.get_mut(slot)?.0.get_mut(at)?,
            self.params.get(at)?,
            self.stats.get_mut(at)?,
        ))
    }

    /// The switch admitted flow `hash` (learned it) at `now`: a later refusal of it is reported
    /// again. Returns whether the flow joins mid-flow ([`Self::arm`] it): the switch refused it
    /// before, or its table is refusing flows.
    pub fn admitted(&mut self, hash: u64, now: u64) -> bool {
        self.refused.admitted(hash, now)
    }

    /// A packet of a flow the switch does not measure (its table is full, or selection left
    /// the flow out): counted at both points, and reported (about once per flow) so nobody
    /// mistakes its absence for loss.
    #[cold]
    pub fn refuse<S: EventSink>(
        &mut self,
        why: Refusal,
        (key, hash, now): (&FlowKey, u64, u64),
        sink: &mut S,
    ) {
        let [i, e] = &mut self.stats;
        let mut pts = [(self.params[0].point, i), (self.params[1].point, e)];
        self.refused.refuse(why, (key, hash, now), &mut pts, sink);
    }

    /// Starts watching the flow just installed in slot `slot` mid-flow: armed at both points
    /// (see `Detector::armed`).
    pub fn arm(&mut self, hot: &mut PairState<C>, slot: usize) {
        self.clear(hot, slot);
        for at in 0..2 {
            let mut h = hot.point(at);
            fast::arm(&mut h);
            hot.set_point(at, &h);
        }
    }

    /// Starts watching, armed, flow `key` just installed in slot `slot` after a refusal or while
    /// the table refuses flows ([`Self::admitted`]): until its first whole batch neither point
    /// measures it, and the aggregator hears so as for a refusal.
    pub fn join<S: EventSink>(
        &mut self,
        hot: &mut PairState<C>,
        slot: usize,
        key: &FlowKey,
        sink: &mut S,
    ) {
        self.arm(hot, slot);
        for p in &self.params {
            sink.emit(BatchEvent::refused(key, p.point));
        }
    }

    /// Stops watching slot `slot`'s flow (active flow selection): its open batches at both
    /// points are reported cut, at the same moment, and the slot is freed.
    pub fn cut<S: EventSink>(
        &mut self,
        hot: &mut PairState<C>,
        slot: usize,
        key: &FlowKey,
        sink: &mut S,
    ) {
        self.retire_both(hot, (slot, key), Tail::Cut, sink, |st| st.deselected += 1);
    }

    /// Whether `hot` holds a flow idle for longer than the idle timeout at `now`.
    pub fn is_idle(&self, hot: &PairState<C>, now: u64) -> bool {
        (0..2).any(|at| hot.point(at).used()) && now.saturating_sub(hot.seen_ns()) > self.idle_ns
    }

    /// Closes and reports what slot `slot` holds at point `at` (0, 1) and frees that point.
    pub fn retire_point<S: EventSink>(
        &mut self,
        at: usize,
        hot: &mut PairState<C>,
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
        hot: &mut PairState<C>,
        slot: usize,
        key: &FlowKey,
        tail: Tail,
        sink: &mut S,
    ) -> bool {
        let Some((c, p, st)) = self.point_mut(at, slot) else { return false };
        let h = hot.point(at);
        fast::retire(&h, c, key, p, st, tail, sink);
        hot.set_point(at, &FastState::default());
        true
    }

    /// Retires slot `slot` at both points, ingress first, counting it as evicted.
    pub fn evict<S: EventSink>(
        &mut self,
        hot: &mut PairState<C>,
        slot: usize,
        key: &FlowKey,
        sink: &mut S,
    ) {
        self.retire_both(hot, (slot, key), Tail::End, sink, |st| st.evicted += 1);
    }

    /// Closes the flow's open batches at both points, ingress first, with `tail`; `count`
    /// is told of each point that had one; then frees the slot.
    fn retire_both<S: EventSink>(
        &mut self,
        hot: &mut PairState<C>,
        (slot, key): (usize, &FlowKey),
        tail: Tail,
        sink: &mut S,
        count: impl Fn(&mut PointStats),
    ) {
        for at in 0..2 {
            if let (true, Some(st)) =
                (self.close(at, hot, slot, key, tail, sink), self.stats.get_mut(at))
            {
                count(st);
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
            *c = SlowPair::default();
        }
    }

    /// Frees slot `slot` without reporting (its flow left the table).
    pub fn clear(&mut self, hot: &mut PairState<C>, slot: usize) {
        *hot = PairState::default();
        if let Some(c) = self.cold.get_mut(slot) {
            *c = SlowPair::default();
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
    use crate::loss::detector::{Detector, Phase};
    use crate::loss::{test_key as key, BatchEvent, BatchEventKind};
    use proptest::prelude::*;

    /// One flow's packets (color, forwarded) through both points of a [`PairTable`], then
    /// retired: each point's events, and its counters. `budgeted`: as the switch runs it (the
    /// lanes' hot path, visits for the rest); otherwise the reference, each point's packets
    /// one by one through the state machine alone.
    fn run_pair<C: Counter>(
        cfg: &LossConfig,
        pkts: &[(u8, bool)],
        budgeted: bool,
    ) -> [(Vec<BatchEvent>, PointStats); 2] {
        let mut pair = PairTable::<C>::new(cfg, 1, (1, 2));
        let mut hot = PairState::<C>::default();
        let k = key(7);
        let mut ev = Vec::new();
        let mut reference: [(Detector<C>, Vec<BatchEvent>); 2] = Default::default();
        for (i, &(color, forwarded)) in pkts.iter().enumerate() {
            let now = 1_000 + 10 * i as u64;
            if budgeted {
                let pkt = PairPacket { slot: 0, key: &k, color, now, forwarded };
                pair.observe(&mut hot, pkt, &mut ev);
                continue;
            }
            for (at, (d, out)) in reference.iter_mut().enumerate().take(1 + usize::from(forwarded))
            {
                let (p, st) = (&pair.params[at], &mut pair.stats[at]);
                d.packet(&k, p, st, color, now, out);
            }
        }
        if budgeted {
            pair.evict(&mut hot, 0, &k, &mut ev);
        } else {
            for (at, (d, out)) in reference.iter_mut().enumerate() {
                d.retire(&k, &pair.params[at], &mut pair.stats[at], Tail::End, out);
                pair.stats[at].evicted += u64::from(d.phase != Phase::Free);
            }
            ev = reference.into_iter().flat_map(|(_, out)| out).collect();
        }
        let of = |point: u8| ev.iter().filter(|e| e.point == point).copied().collect();
        [(of(1), pair.stats[0]), (of(2), pair.stats[1])]
    }

    /// B-packet batches of alternating colors, one packet in `drop_in` dropped between the
    /// points, others lost upstream (`lost_up` in 1,000) or moved back by up to `depth`.
    fn traffic(
        seed: u64,
        n: usize,
        b: u32,
        lost_up: u64,
        drop_in: u64,
        depth: usize,
    ) -> Vec<(u8, bool)> {
        let mut r = seed | 1;
        let mut next = move || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            r
        };
        let mut out = Vec::with_capacity(n);
        for i in 0..n as u32 {
            if next() % 1_000 >= lost_up {
                out.push((((i / b.max(1)) & 1) as u8, drop_in == 0 || next() % drop_in != 0));
            }
        }
        for i in 1..out.len() {
            let back = (next() % (depth as u64 + 1)) as usize;
            out[i.saturating_sub(back)..=i].rotate_right(1);
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Both points' lanes in one integer, spent by one add, change no event and no
        /// counter: marked traffic with loss upstream and inside, reordering, batches longer
        /// than a budget lane holds, and batches longer than the counters (marked with a larger
        /// B than configured, so the counters saturate).
        #[test]
        fn both_points_in_lanes_change_no_event(
            seed in any::<u64>(),
            b in prop::sample::select(vec![1u32, 2, 10, 100, 127, 128, 200, 255]),
            marked_over in prop::sample::select(vec![1u32, 1, 3]),
            threshold in prop::sample::select(vec![0.05, 0.3, 0.95]),
            lost_up in prop::sample::select(vec![0u64, 10, 300]),
            drop_in in prop::sample::select(vec![0u64, 2, 50]),
            depth in 0usize..40,
        ) {
            let pkts = traffic(seed, 3_000, b * marked_over, lost_up, drop_in, depth);
            let cfg = LossConfig { batch: b, threshold, ..LossConfig::default() };
            // Against the packets themselves (32-bit counters never saturate here): each point
            // counts every packet that reached it once, in a batch or late.
            let wide = run_pair::<u32>(&cfg, &pkts, true);
            let reached = [pkts.len(), pkts.iter().filter(|(_, fwd)| *fwd).count()];
            for ((ev, _), n) in wide.iter().zip(reached) {
                prop_assert_eq!(ev.iter().map(|e| e.count as usize).sum::<usize>(), n);
            }
            prop_assert!(run_pair::<u8>(&cfg, &pkts, true) == run_pair::<u8>(&cfg, &pkts, false));
            prop_assert!(run_pair::<u16>(&cfg, &pkts, true) == run_pair::<u16>(&cfg, &pkts, false));
            prop_assert!(run_pair::<u32>(&cfg, &pkts, true) == run_pair::<u32>(&cfg, &pkts, false));
        }
    }

    #[test]
    fn hot_state_of_both_points_leaves_room_for_a_forwarding_key_in_one_line() {
        assert_eq!(core::mem::size_of::<PairState<u8>>(), 28);
        assert_eq!(core::mem::size_of::<PairState<u16>>(), 40);
        assert_eq!(core::mem::size_of::<PairState<u32>>(), 64);
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
        let mut hot = [PairState::<u8>::default(); 8];
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
                let forwarded = next() % 100 != 0;
                let pkt = PairPacket { slot, key: &k, color, now, forwarded };
                pair.observe(&mut hot[slot], pkt, &mut ev);
                truth[0][f][batch as usize] += 1;
                if forwarded {
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
