//! The per-flow state machine of one observation point, shared by the stand-alone
//! [`ColorTable`](super::ColorTable) (one point, the paper's 2-way layout) and the
//! [`PairTable`](super::PairTable) (both points of a switch, beside its flow table).
//!
//! A flow's state at a point is split in two: [`Hot`], what almost every packet reads and
//! writes (state bits, each color's budget, the counters, the last packet's time), and
//! [`Cold`], what only the step and the first packet of the next batch touch. The hot part of
//! both points of a switch fits in a cache line beside the forwarding entry's key.
//!
//! A packet takes the hot path ([`fast`]) when it changes nothing but its counter and the
//! time; which packets do is worked out by the slow path when it last looked at the flow, and
//! left as a per-color budget ([`rearm`]). So the hot path does not classify packets: it
//! spends. Every other packet goes through [`slow`], the state machine proper.

use super::slots::Counter;
use super::{BatchEvent, BatchEventKind, EventSink, LossConfig, PointStats};
use telemark_wire::FlowKey;

pub(crate) const USED: u8 = 1;
pub(crate) const OPEN_COLOR: u8 = 2;
pub(crate) const LATE_WINDOW: u8 = 4;
/// Admitted mid-flow by active flow selection: counting, but reporting nothing, until
/// [`ARM_BATCHES`] steps have passed (see [`arm`]).
pub(crate) const ARMED: u8 = 8;
/// The open batch is the first one reported after an armed admission.
pub(crate) const HEAD: u8 = 16;
/// The open batch's counter reached its largest value (a batch longer than the counters hold:
/// traffic not marked as configured). It restarts from zero, so that the hot path may go on
/// counting without ever wrapping, and the slow path reads it as the largest value.
pub(crate) const SATURATED: u8 = 32;
/// Steps an armed flow waits before its open batch is reported. One step would do without
/// reordering (the batch after the first color change the point sees is whole); with it, the
/// packet that armed the flow may be a straggler of the batch before the open one, so the
/// batch after that first change may have begun before the flow was armed. After two steps
/// the open batch began after the arming packet by at least a batch.
pub(crate) const ARM_BATCHES: u32 = 2;
/// Index of the late counter in [`Hot::c`].
pub(crate) const LATE: usize = 2;

/// What nearly every packet touches: 16 bytes with 8-bit counters, 20 with 16-bit ones (the
/// time is kept as two 32-bit halves so that nothing aligns the state to 8 bytes), so that
/// both points fit beside a forwarding key in one cache line.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Hot<C: Counter> {
    pub state: u8,
    /// Packets of each color [`fast`] may still take (see [`rearm`]).
    pub left: [u8; 2],
    /// `c[open]`: the open batch; `c[other]`: early packets of the next batch; `c[LATE]`: late
    /// packets of the batch closed last.
    pub c: [C; 3],
    /// [`Hot::last`], low half first.
    last: [u32; 2],
}

impl<C: Counter> Hot<C> {
    /// Time of the point's last packet, late ones aside: the open batch's last until the next
    /// batch's first packet, then that batch's (the open batch's is kept in [`Cold`]). It is
    /// also the flow's last-seen time for idle timeouts.
    #[inline(always)]
    pub fn last(&self) -> u64 {
        join(self.last)
    }

    #[inline(always)]
    pub fn set_last(&mut self, t: u64) {
        self.last = split(t);
    }
}

/// A time as two 32-bit halves, low first: the hot state keeps times so, to stay 4-aligned.
#[inline(always)]
pub(crate) fn split(t: u64) -> [u32; 2] {
    [t as u32, (t >> 32) as u32]
}

/// The time [`split`] made the halves of.
#[inline(always)]
pub(crate) fn join(h: [u32; 2]) -> u64 {
    u64::from(h[0]) | u64::from(h[1]) << 32
}

/// What only the slow path touches.
#[derive(Clone, Copy, Default)]
pub(crate) struct Cold {
    /// Running number of the open batch.
    pub ordinal: u32,
    pub first_ns: u64,
    pub next_first_ns: u64,
    /// Time of the open batch's last packet, kept once the next batch has begun.
    pub open_last_ns: u64,
}

/// A point's constants, derived once from the [`LossConfig`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub point: u8,
    pub close_at: u32,
    pub late_limit: u32,
    pub period_ns: Option<u64>,
    pub close_after_ns: u64,
}

impl Params {
    pub fn new(cfg: &LossConfig, point: u8) -> Self {
        Params {
            point,
            close_at: cfg.close_at(),
            late_limit: cfg.late_limit(),
            period_ns: cfg.period_ns,
            close_after_ns: cfg.period_ns.map_or(0, |t| (cfg.threshold * t as f64) as u64),
        }
    }
}

/// The hot path of a count-based point: a packet of the open batch, or an early packet of the
/// next batch short of the step, neither of which emits an event. Anything else (first
/// packet, the first packet of the next batch, the step, late packets, time-based periods)
/// returns true (go to [`slow`]) before changing anything.
///
/// It does not look at the state: a packet here counts for its own color and moves the time,
/// as long as its color has budget left. Flows in steady state take the open batch's packets
/// and the next batch's early packets in turn, and telling the two apart packet by packet
/// (with the late window, a third kind) was a branch taken at random across interleaved flows,
/// and often mispredicted (docs/overhead.md).
#[inline(always)]
pub(crate) fn fast<C: Counter>(h: &mut Hot<C>, color: u8, now: u64) -> bool {
    let k = usize::from(color & 1);
    let Some(left) = h.left.get_mut(k) else { return true };
    if *left == 0 {
        return true;
    }
    *left -= 1;
    if let Some(c) = h.c.get_mut(k) {
        c.bump();
    }
    h.set_last(now);
    false
}

/// Gives a saturated open batch's counter back its largest value (see [`SATURATED`]): the
/// first thing the slow path does.
#[inline]
pub(crate) fn settle<C: Counter>(h: &mut Hot<C>) {
    if h.state & SATURATED != 0 {
        let o = usize::from((h.state & OPEN_COLOR) / OPEN_COLOR);
        h.c[o] = C::from_u32(C::MAX);
        h.state &= !SATURATED;
    }
}

/// Sets the budgets [`fast`] spends: for each color, how many more of its packets change
/// nothing but their counter and the time, so that the packet after them is the first the
/// slow path must see. Each flow's events are those of the state machine run packet by packet
/// (the equivalence test in this module runs both):
/// - not in use, or time-based periods: none (every packet needs the clock);
/// - in the late window: the open color without limit ([`Counter::BUDGET`] at a time); the
///   other none. A late packet (only reordering makes one) is counted by the slow path, and
///   the first packet of the other color after the window's end ends the window there: the
///   window needs no visit of its own, and its `Late` event goes out with that packet, before
///   any other event of the flow at this point;
/// - outside it, before any early packet: the open color without limit; the other none, as
///   its first packet opens the next batch;
/// - after early packets: the open color none (a resumed batch, or the step's first late
///   packet); the other without limit, past the step. The step changes nothing a packet of
///   the next color does (it counts, and moves the time, before and after), so it needs no
///   visit when it happens: the flow's next visit takes it first ([`catch_up`]), with the
///   events the state machine emitted at the step.
///
/// Per batch, the slow path sees one packet: the batch's first. It takes the step the batch
/// before it passed (reporting the batch before that) and ends the late window that followed.
#[inline]
pub(crate) fn rearm<C: Counter>(h: &mut Hot<C>, p: &Params) {
    if h.state & USED == 0 || p.period_ns.is_some() {
        h.left = [0; 2];
        return;
    }
    let o = usize::from((h.state & OPEN_COLOR) / OPEN_COLOR);
    // A counter at its largest value is marked saturated and restarts from zero, to be read
    // as its largest value again by the slow path (`settle`): so the open color runs on, and
    // no hot-path increment ever wraps.
    if h.c[o].get() == C::MAX {
        h.state |= SATURATED;
        h.c[o] = C::default();
    }
    let (open, next) = (h.c[o].get(), h.c[o ^ 1].get());
    let (for_open, for_next) = if h.state & LATE_WINDOW != 0 || next == 0 {
        (room::<C>(open), 0)
    } else {
        (0, room::<C>(next))
    };
    h.left = if o == 0 { [for_open, for_next] } else { [for_next, for_open] };
}

/// A color's budget with `n` of its packets counted: what its counter has room for.
#[inline(always)]
pub(crate) fn room<C: Counter>(n: u32) -> u8 {
    C::MAX.saturating_sub(n).min(u32::from(C::BUDGET)) as u8
}

/// Every case of one packet at one point, the step included; then the budgets for what comes
/// next.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn slow<C: Counter, S: EventSink>(
    h: &mut Hot<C>,
    c: &mut Cold,
    key: &FlowKey,
    p: &Params,
    stats: &mut PointStats,
    color: u8,
    now: u64,
    sink: &mut S,
) {
    settle(h);
    catch_up(h, c, key, p, stats, sink);
    advance(h, c, key, p, stats, color, now, sink);
    rearm(h, p);
}

/// One packet through the state machine alone: what [`slow`] runs, and, with no budgets and
/// no hot path, the reference the tables' tests compare against.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn advance<C: Counter, S: EventSink>(
    h: &mut Hot<C>,
    c: &mut Cold,
    key: &FlowKey,
    p: &Params,
    stats: &mut PointStats,
    color: u8,
    now: u64,
    sink: &mut S,
) {
    let color = color & 1;
    if h.state & USED == 0 {
        // First packet of the flow: it opens the first batch (reported, or armed).
        let armed = h.state & ARMED;
        *h = Hot { state: USED | armed | (color * OPEN_COLOR), ..Hot::default() };
        *c = Cold { first_ns: now, ..Cold::default() };
        stats.admitted += 1;
    }
    // The late window ends once the open batch holds `late_limit` packets (count-based), or
    // half a period in (time-based). The hot path lets the open color run past that point, so
    // this packet may be the first to find the window over.
    if h.state & LATE_WINDOW != 0 && !in_late_window(h, c, p, now) {
        end_late_window(h, c, key, p.point, stats, sink);
    }
    let open = (h.state & OPEN_COLOR) / OPEN_COLOR;
    let o = usize::from(open);
    if color == open && p.period_ns.is_none() && h.state & LATE_WINDOW == 0 && h.c[o ^ 1].get() != 0
    {
        resumed(h, c, key, p, stats, now, sink);
        return;
    }
    if color == open {
        h.c[o].inc();
        h.set_last(now);
        return;
    }
    if h.state & LATE_WINDOW != 0 {
        // Inside the window (it was ended above otherwise): a late packet.
        h.c[LATE].inc();
        if p.period_ns.is_none() && h.c[LATE].get() >= p.close_at {
            late_step(h, c, key, p, stats, now, sink);
        }
        return;
    }
    // An early packet of the next batch.
    let x = o ^ 1;
    if h.c[x].get() == 0 {
        c.next_first_ns = now;
        c.open_last_ns = h.last();
    }
    h.c[x].inc();
    h.set_last(now);
    let step = match p.period_ns {
        None => h.c[x].get() >= p.close_at,
        Some(_) => now.saturating_sub(c.next_first_ns) >= p.close_after_ns,
    };
    if step {
        // Packets of the open color that came between the early ones were its late packets.
        fold_resumed(h, o);
        report(h, stats, sink, closed(h, c, key, p.point, false, Tail::No));
        let first = c.next_first_ns;
        open_batch(h, c, color, h.c[x], 1, first, now);
    }
}

/// Takes the step the hot path let pass: with count-based periods, the next batch's early
/// packets run on past the threshold without a visit (see [`rearm`]), so a flow may come to
/// the slow path with the step behind it. This does what [`advance`] did at the threshold's
/// packet: the open batch (its resumed packets folded in) is reported, and the next opens in
/// its late window with all its packets so far. Nothing the hot path counted since differs
/// between the two: a packet of the next color counts and moves the time either way, and one
/// of the open color, which would have been late, was not let through.
#[inline]
pub(crate) fn catch_up<C: Counter, S: EventSink>(
    h: &mut Hot<C>,
    c: &mut Cold,
    key: &FlowKey,
    p: &Params,
    stats: &mut PointStats,
    sink: &mut S,
) {
    let o = usize::from((h.state & OPEN_COLOR) / OPEN_COLOR);
    let next = h.c[o ^ 1];
    if h.state & (USED | LATE_WINDOW) != USED || p.period_ns.is_some() || next.get() < p.close_at {
        return;
    }
    fold_resumed(h, o);
    report(h, stats, sink, closed(h, c, key, p.point, false, Tail::No));
    let (first, last) = (c.next_first_ns, h.last());
    open_batch(h, c, (o ^ 1) as u8, next, 1, first, last);
}

/// Adds the open color's packets counted apart by [`resumed`] back to the open batch.
fn fold_resumed<C: Counter>(h: &mut Hot<C>, o: usize) {
    for _ in 0..h.c[LATE].get() {
        h.c[o].inc();
    }
    h.c[LATE] = C::default();
}

/// Opens the batch of `color`, `advance` batches after the one open so far, with `count`
/// packets already in it and its first at `first_ns`; it starts in its late window, and every
/// other counter starts at zero.
fn open_batch<C: Counter>(
    h: &mut Hot<C>,
    c: &mut Cold,
    color: u8,
    count: C,
    advance: u32,
    first_ns: u64,
    now: u64,
) {
    h.c = [C::default(); 3];
    h.c[usize::from(color)] = count;
    c.ordinal = c.ordinal.wrapping_add(advance);
    c.first_ns = first_ns;
    h.set_last(now);
    // An armed flow's ordinals count its steps from admission.
    let was_armed = h.state & ARMED != 0;
    let armed = if was_armed && c.ordinal < ARM_BATCHES { ARMED } else { 0 };
    let head = if was_armed && armed == 0 { HEAD } else { 0 };
    h.state = USED | (color * OPEN_COLOR) | LATE_WINDOW | armed | head;
}

/// Admits a flow armed (active flow selection): it joins mid-flow, so the batch it joins in
/// is partial here and must not be compared with the whole batch upstream. It counts like any
/// flow, but reports nothing until [`ARM_BATCHES`] steps have passed; the first batch it
/// reports is marked `head`, telling the aggregator that upstream batches before it were not
/// watched here. The caller has cleared the state; the next packet opens the first batch.
pub(crate) fn arm<C: Counter>(h: &mut Hot<C>) {
    *h = Hot { state: ARMED, ..Hot::default() };
}

/// How a batch ends when it is reported by [`retire`] rather than by a step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Tail {
    /// Closed by a step.
    No,
    /// The flow ended (flush, idle timeout, eviction): the batch holds all it will get.
    End,
    /// Active flow selection stopped watching the flow mid-batch: the batch is partial at
    /// every point cut at the same moment, and only comparable between such points.
    Cut,
}

/// Sends a closed batch to the aggregator, unless the flow is armed (its batches are partial).
#[inline]
fn report<C: Counter, S: EventSink>(
    h: &Hot<C>,
    stats: &mut PointStats,
    sink: &mut S,
    ev: BatchEvent,
) {
    if h.state & ARMED == 0 {
        sink.emit(ev);
        stats.batches += 1;
    }
}

/// As many "late" packets as the step threshold: no reordering the detector is built for
/// makes that many (DESIGN: depth below threshold × B), so they are the batch after the open
/// one, which lost so many packets that it ended inside its late window. Close it, and open
/// the next with these packets. Without this rule, a batch that keeps fewer than
/// (1 + threshold)/2 · B packets would have the whole next batch read as late and the one
/// after merged into it.
#[cold]
#[inline(never)]
fn late_step<C: Counter, S: EventSink>(
    h: &mut Hot<C>,
    c: &mut Cold,
    key: &FlowKey,
    p: &Params,
    stats: &mut PointStats,
    now: u64,
    sink: &mut S,
) {
    let n = h.c[LATE];
    // Nothing was late for the batch before after all.
    h.c[LATE] = C::default();
    end_late_window(h, c, key, p.point, stats, sink);
    report(h, stats, sink, closed(h, c, key, p.point, false, Tail::No));
    let open = (h.state & OPEN_COLOR) / OPEN_COLOR;
    open_batch(h, c, open ^ 1, n, 1, now, now);
}

/// A packet of the open color after early packets of the next batch (count-based periods,
/// outside the late window). Counted apart, in the late counter (unused outside the window):
/// a few are the open batch's late packets, reordered behind the next batch's first ones, and
/// join it at the step. But when as many as the step threshold arrive before the next batch
/// reaches its step, the next batch lost so many packets that the one after it has begun
/// (the two batches of the open color would otherwise merge into one, and the loss of three
/// batches would be read as one batch's): close the open batch and the next one, and open the
/// one after with these packets. The paper's detector has no such rule; it undercounts loss
/// when a batch loses more than 1 − threshold of its packets.
#[cold]
#[inline(never)]
fn resumed<C: Counter, S: EventSink>(
    h: &mut Hot<C>,
    c: &mut Cold,
    key: &FlowKey,
    p: &Params,
    stats: &mut PointStats,
    now: u64,
    sink: &mut S,
) {
    let open = (h.state & OPEN_COLOR) / OPEN_COLOR;
    h.c[LATE].inc();
    if h.c[LATE].get() < p.close_at {
        return;
    }
    // The open batch's resumed packets move no time (the entry has no room for them): its
    // last time is that before the next batch began.
    report(h, stats, sink, closed(h, c, key, p.point, false, Tail::No));
    report(h, stats, sink, closed(h, c, key, p.point, true, Tail::No));
    // Stragglers of the batch just closed count as its late packets.
    open_batch(h, c, open, h.c[LATE], 2, now, now);
}

/// Closes and reports everything a flow holds at a point (flush, idle timeout, eviction:
/// [`Tail::End`]; deselection: [`Tail::Cut`]). The caller frees the state.
pub(crate) fn retire<C: Counter, S: EventSink>(
    h: &mut Hot<C>,
    c: &mut Cold,
    key: &FlowKey,
    p: &Params,
    stats: &mut PointStats,
    how: Tail,
    sink: &mut S,
) {
    settle(h);
    catch_up(h, c, key, p, stats, sink);
    if h.state & USED == 0 || h.state & ARMED != 0 {
        return;
    }
    if h.state & LATE_WINDOW != 0 {
        end_late_window(h, c, key, p.point, stats, sink);
    }
    let o = usize::from((h.state & OPEN_COLOR) / OPEN_COLOR);
    // Resumed packets short of a double step: taken as the open batch's.
    fold_resumed(h, o);
    if h.c[o].get() > 0 {
        report(h, stats, sink, closed(h, c, key, p.point, false, how));
    }
    if h.c[o ^ 1].get() > 0 {
        // Early packets of a batch that never reached the step: report them as that batch so
        // the totals add up.
        report(h, stats, sink, closed(h, c, key, p.point, true, how));
    }
}

/// The `Closed` event of the open batch, or (`next`) of the early packets of the next one.
fn closed<C: Counter>(
    h: &Hot<C>,
    c: &Cold,
    key: &FlowKey,
    point: u8,
    next: bool,
    tail: Tail,
) -> BatchEvent {
    let open = (h.state & OPEN_COLOR) / OPEN_COLOR;
    // Once the next batch has begun, the time in the hot state is its last packet's.
    let began = h.c[usize::from(open ^ 1)].get() > 0;
    let (color, ordinal, first_ns, last_ns) = if next {
        (open ^ 1, c.ordinal.wrapping_add(1), c.next_first_ns, h.last())
    } else {
        (open, c.ordinal, c.first_ns, if began { c.open_last_ns } else { h.last() })
    };
    BatchEvent {
        key: *key,
        point,
        kind: BatchEventKind::Closed,
        color,
        ordinal,
        count: h.c[usize::from(color)].get(),
        first_ns,
        last_ns,
        tail: tail != Tail::No,
        head: !next && h.state & HEAD != 0,
        cut: tail == Tail::Cut,
    }
}

#[inline(always)]
fn in_late_window<C: Counter>(h: &Hot<C>, c: &Cold, p: &Params, now: u64) -> bool {
    match p.period_ns {
        // Time-based: RFC 9341 §3.1 reads a period's counters half a period into the next one.
        Some(t) => now.saturating_sub(c.first_ns) < t / 2,
        None => h.c[usize::from((h.state & OPEN_COLOR) / OPEN_COLOR)].get() < p.late_limit,
    }
}

#[cold]
#[inline(never)]
fn end_late_window<C: Counter, S: EventSink>(
    h: &mut Hot<C>,
    c: &Cold,
    key: &FlowKey,
    point: u8,
    stats: &mut PointStats,
    sink: &mut S,
) {
    // Sent only when something was late. An empty one would tell the aggregator the batch is
    // final a batch earlier than the next batch's `Closed` event does (that comes when the
    // batch after it begins, see `rearm`). Every event costs the fast path a record written
    // to the ring; empty ones were half of them. Nor is one sent for the batch before a flow's
    // first reported one (never reported itself).
    let reported = h.state & (ARMED | HEAD) == 0;
    h.state &= !LATE_WINDOW;
    if !reported || h.c[LATE].get() == 0 {
        h.c[LATE] = C::default();
        return;
    }
    stats.late += u64::from(h.c[LATE].get());
    sink.emit(BatchEvent {
        key: *key,
        point,
        kind: BatchEventKind::Late,
        color: ((h.state & OPEN_COLOR) / OPEN_COLOR) ^ 1,
        ordinal: c.ordinal.wrapping_sub(1),
        count: h.c[LATE].get(),
        first_ns: 0,
        last_ns: 0,
        tail: false,
        head: false,
        cut: false,
    });
    h.c[LATE] = C::default();
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One flow's packets (colors, 10 ns apart) through one point, then a flush: every event,
    /// and the point's counters. `budgeted`: as the tables run it, the hot path first;
    /// otherwise the reference, every packet through the state machine.
    fn run<C: Counter>(
        cfg: &LossConfig,
        colors: &[u8],
        armed: bool,
        budgeted: bool,
    ) -> (Vec<BatchEvent>, PointStats) {
        let p = Params::new(cfg, 3);
        let (mut h, mut c) = (Hot::<C>::default(), Cold::default());
        if armed {
            arm(&mut h);
        }
        let (mut stats, mut ev) = (PointStats::default(), Vec::new());
        let key = FlowKey::default();
        for (i, &color) in colors.iter().enumerate() {
            let now = 1_000 + 10 * i as u64;
            if !budgeted {
                // The state machine alone: no budgets, no hot path.
                advance(&mut h, &mut c, &key, &p, &mut stats, color, now, &mut ev);
            } else if fast(&mut h, color, now) {
                slow(&mut h, &mut c, &key, &p, &mut stats, color, now, &mut ev);
            }
        }
        retire(&mut h, &mut c, &key, &p, &mut stats, Tail::End, &mut ev);
        (ev, stats)
    }

    /// B-packet batches of alternating colors, each packet dropped with probability `drop`
    /// (in runs, when `bursty`), then moved back by up to `depth` places.
    fn marked(seed: u64, n: usize, b: u32, drop: f64, bursty: bool, depth: usize) -> Vec<u8> {
        let mut r = seed | 1;
        let mut rand = move || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            (r >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut out = Vec::with_capacity(n);
        let mut burst = 0;
        for i in 0..n {
            if burst > 0 {
                burst -= 1;
                continue;
            }
            if rand() < drop {
                burst = if bursty { (rand() * 8.0) as usize } else { 0 };
                continue;
            }
            out.push(((i as u32 / b.max(1)) & 1) as u8);
        }
        for i in 1..out.len() {
            let back = (rand() * (depth + 1) as f64) as usize;
            out[i.saturating_sub(back)..=i].rotate_right(1);
        }
        out
    }

    fn cfg(batch: u32, threshold: f64, period: bool) -> LossConfig {
        LossConfig {
            batch,
            threshold,
            period_ns: period.then_some(batch as u64 * 10),
            ..LossConfig::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// The budgets let through exactly the packets the state machine would only count:
        /// every event and counter is the same on marked traffic with loss and reordering, and
        /// the events account for every packet.
        #[test]
        fn budgets_change_no_event_on_marked_traffic(
            seed in any::<u64>(),
            b in 1u32..=255,
            threshold in prop::sample::select(vec![0.05, 0.3, 0.5, 0.95]),
            drop in prop::sample::select(vec![0.0, 0.01, 0.2, 0.7]),
            bursty in any::<bool>(),
            depth in 0usize..40,
            armed in any::<bool>(),
            period in prop::bool::weighted(0.1),
        ) {
            let colors = marked(seed, 2_000, b, drop, bursty, depth);
            let c = cfg(b, threshold, period);
            let (ev, _) = run::<u32>(&c, &colors, armed, true);
            if !armed {
                // Against the packets themselves: each is counted once, in a batch or late.
                // (With 32-bit counters: reordering beyond the late window can merge batches
                // past what 8 bits hold, and a saturated counter loses the rest.)
                prop_assert_eq!(ev.iter().map(|e| e.count as usize).sum::<usize>(), colors.len());
            }
            prop_assert!(run::<u8>(&c, &colors, armed, true) == run::<u8>(&c, &colors, armed, false));
            prop_assert!(run::<u32>(&c, &colors, armed, true) == run::<u32>(&c, &colors, armed, false));
        }

        /// And on any sequence of colors at all, with batches too long for 8-bit counters.
        #[test]
        fn budgets_change_no_event_on_any_colors(
            colors in prop::collection::vec(0u8..4, 0..3_000),
            b in prop::sample::select(vec![1u32, 2, 3, 10, 100, 255, 600, 1_000]),
            threshold in prop::sample::select(vec![0.05, 0.3, 0.95]),
            armed in any::<bool>(),
        ) {
            let c = cfg(b, threshold, false);
            let (ev, _) = run::<u16>(&c, &colors, armed, true);
            if !armed {
                prop_assert_eq!(ev.iter().map(|e| e.count as usize).sum::<usize>(), colors.len());
            }
            prop_assert!(run::<u16>(&c, &colors, armed, true) == run::<u16>(&c, &colors, armed, false));
            if b <= 255 {
                prop_assert!(run::<u8>(&c, &colors, armed, true) == run::<u8>(&c, &colors, armed, false));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]

        /// Traffic marked with batches longer than the configured B, and than 8-bit counters
        /// hold: the saturated counter, restarted on the hot path, reads as saturated.
        #[test]
        fn budgets_change_no_event_when_batches_overflow_the_counters(
            seed in any::<u64>(),
            marked_b in 200u32..1_000,
            drop in prop::sample::select(vec![0.0, 0.05]),
            depth in 0usize..5,
        ) {
            let colors = marked(seed, 4_000, marked_b, drop, false, depth);
            let c = cfg(100, 0.3, false);
            prop_assert!(run::<u8>(&c, &colors, false, true) == run::<u8>(&c, &colors, false, false));
        }
    }

    #[test]
    fn the_hot_state_keeps_its_size() {
        assert_eq!(core::mem::size_of::<Hot<u8>>(), 16);
        assert_eq!(core::mem::size_of::<Hot<u16>>(), 20);
        assert_eq!(core::mem::size_of::<Hot<u32>>(), 24);
    }
}
