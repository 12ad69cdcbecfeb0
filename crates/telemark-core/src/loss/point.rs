//! The per-flow state machine of one observation point, shared by the stand-alone
//! [`ColorTable`](super::ColorTable) (one point, the paper's 2-way layout) and the
//! [`PairTable`](super::PairTable) (both points of a switch, beside its flow table).
//!
//! A flow's state at a point is split in two: [`Hot`], what almost every packet reads and
//! writes (state bits, the two color counters, the late counter, the last packet's time), and
//! [`Cold`], what only the step, the late window's end and the first early packet touch. The
//! hot part of both points of a switch fits in one cache line with room to spare.

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
/// Steps an armed flow waits before its open batch is reported. One step would do without
/// reordering (the batch after the first color change the point sees is whole); with it, the
/// packet that armed the flow may be a straggler of the batch before the open one, so the
/// batch after that first change may have begun before the flow was armed. After two steps
/// the open batch began after the arming packet by at least a batch.
pub(crate) const ARM_BATCHES: u32 = 2;
/// Index of the late counter in [`Hot::c`].
pub(crate) const LATE: usize = 2;

/// What nearly every packet touches.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Hot<C: Counter> {
    pub state: u8,
    /// `c[open]`: the open batch; `c[other]`: early packets of the next batch; `c[LATE]`: late
    /// packets of the batch closed last.
    pub c: [C; 3],
    /// Time of the open batch's last packet.
    pub last_ns: u64,
}

/// What only the slow path touches.
#[derive(Clone, Copy, Default)]
pub(crate) struct Cold {
    /// Running number of the open batch.
    pub ordinal: u32,
    pub first_ns: u64,
    pub next_first_ns: u64,
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

/// The hot path of a count-based point: a packet of the open batch, a late packet, or an
/// early packet of the next batch short of the step, none of which emits an event. Anything
/// else (first packet, the step, the late window's end, time-based periods) returns true (go
/// to [`slow`]) before changing anything. Late packets are added to the point's statistics
/// when their window ends, so this path touches nothing but the flow's own line.
#[inline(always)]
pub(crate) fn fast<C: Counter>(h: &mut Hot<C>, p: &Params, color: u8, now: u64) -> bool {
    let s = h.state;
    if s & USED == 0 || p.period_ns.is_some() {
        return true;
    }
    let open = (s & OPEN_COLOR) / OPEN_COLOR;
    let o = usize::from(open);
    let in_window = s & LATE_WINDOW != 0;
    if color & 1 == open {
        if in_window {
            if h.c[o].get() + 1 >= p.late_limit {
                return true;
            }
        } else if h.c[o ^ 1].get() != 0 {
            // The open color again after early packets of the next batch: late packets, or a
            // batch after the next one (see `resumed`).
            return true;
        }
        h.c[o].inc();
        h.last_ns = now;
        return false;
    }
    if in_window {
        if h.c[o].get() < p.late_limit && h.c[LATE].get() + 1 < p.close_at {
            h.c[LATE].inc();
            return false;
        }
        return true;
    }
    let x = o ^ 1;
    let next = h.c[x].get();
    if next != 0 && next + 1 < p.close_at {
        h.c[x].inc();
        return false;
    }
    true
}

/// Every case of one packet at one point, the step included.
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
    let color = color & 1;
    if h.state & USED == 0 {
        // First packet of the flow: it opens the first batch (reported, or armed).
        let armed = h.state & ARMED;
        *h = Hot { state: USED | armed | (color * OPEN_COLOR), ..Hot::default() };
        *c = Cold { first_ns: now, ..Cold::default() };
        stats.admitted += 1;
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
        h.last_ns = now;
        if h.state & LATE_WINDOW != 0 && !in_late_window(h, c, p, now) {
            end_late_window(h, c, key, p.point, stats, sink);
        }
        return;
    }
    if h.state & LATE_WINDOW != 0 {
        if in_late_window(h, c, p, now) {
            h.c[LATE].inc();
            if p.period_ns.is_none() && h.c[LATE].get() >= p.close_at {
                late_step(h, c, key, p, stats, now, sink);
            }
            return;
        }
        end_late_window(h, c, key, p.point, stats, sink);
    }
    // An early packet of the next batch.
    let x = o ^ 1;
    if h.c[x].get() == 0 {
        c.next_first_ns = now;
    }
    h.c[x].inc();
    let step = match p.period_ns {
        None => h.c[x].get() >= p.close_at,
        Some(_) => now.saturating_sub(c.next_first_ns) >= p.close_after_ns,
    };
    if step {
        // Packets of the open color that came between the early ones were its late packets.
        fold_resumed(h, o);
        report(h, stats, sink, closed(h, c, key, p.point, false, Tail::No, now));
        let first = c.next_first_ns;
        open_batch(h, c, color, h.c[x], 1, first, now);
    }
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
    h.last_ns = now;
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
    report(h, stats, sink, closed(h, c, key, p.point, false, Tail::No, now));
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
    // Times are those of the packet that made the step (the entry has no room for the first
    // resumed packet's): within the threshold's worth of packets of the truth.
    report(h, stats, sink, closed(h, c, key, p.point, false, Tail::No, now));
    report(h, stats, sink, closed(h, c, key, p.point, true, Tail::No, now));
    // Stragglers of the batch just closed count as its late packets.
    open_batch(h, c, open, h.c[LATE], 2, now, now);
}

/// Closes and reports everything a flow holds at a point (flush, idle timeout, eviction:
/// [`Tail::End`]; deselection: [`Tail::Cut`]); `seen_ns` is the flow's last packet. The
/// caller frees the state.
#[allow(clippy::too_many_arguments)]
pub(crate) fn retire<C: Counter, S: EventSink>(
    h: &mut Hot<C>,
    c: &Cold,
    key: &FlowKey,
    p: &Params,
    stats: &mut PointStats,
    seen_ns: u64,
    how: Tail,
    sink: &mut S,
) {
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
        report(h, stats, sink, closed(h, c, key, p.point, false, how, seen_ns));
    }
    if h.c[o ^ 1].get() > 0 {
        // Early packets of a batch that never reached the step: report them as that batch so
        // the totals add up.
        report(h, stats, sink, closed(h, c, key, p.point, true, how, seen_ns));
    }
}

/// The `Closed` event of the open batch, or (`next`) of the early packets of the next one,
/// whose last packet is taken to be `seen_ns`.
fn closed<C: Counter>(
    h: &Hot<C>,
    c: &Cold,
    key: &FlowKey,
    point: u8,
    next: bool,
    tail: Tail,
    seen_ns: u64,
) -> BatchEvent {
    let open = (h.state & OPEN_COLOR) / OPEN_COLOR;
    let (color, ordinal, first_ns, last_ns) = if next {
        (open ^ 1, c.ordinal.wrapping_add(1), c.next_first_ns, seen_ns)
    } else {
        (open, c.ordinal, c.first_ns, h.last_ns)
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
    // Sent even when nothing was late: it tells the aggregator the batch is final now, rather
    // than one batch later. Not for the batch before a flow's first reported one (never
    // reported itself).
    let reported = h.state & (ARMED | HEAD) == 0;
    h.state &= !LATE_WINDOW;
    if !reported {
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
