//! The paper's per-flow step detector at one observation point (loss paper, IV-A.2 "Packet
//! counting" and IV-A.3 "Batch closing"): the reference, every rule written once.
//!
//! A point counts each flow's packets by color. The batch it is counting is the **open**
//! batch. Packets of the other color are the **next** batch's early packets (reordering puts
//! some ahead of the open batch's last ones), until as many as the step threshold (`close_at`
//! = threshold × B, or a share of the period when periods are timed) have arrived: the
//! **step**. The open batch is then closed and reported, and the next one opens in its
//! **late window**, where packets of the old color are the closed batch's **late** packets,
//! reported apart. The window ends once the new batch holds `late_limit` packets (half a
//! period with timed periods).
//!
//! Rules the paper does not have, each one function here:
//! - [`Detector::resumed`]: packets of the open color after the next batch began are counted
//!   apart; a few are the open batch's stragglers, folded back at the step, but as many as the
//!   threshold mean the next batch lost so many packets that the one after it has begun: a
//!   double step.
//! - [`Detector::late_step`]: as many "late" packets as the threshold are the batch after
//!   the open one, which lost so many packets that it ended inside the late window.
//! - Armed admission ([`Watch::Armed`]): a flow that active flow selection admits mid-flow is
//!   counted but not reported until [`ARM_BATCHES`] steps have passed.
//!
//! The switch runs this on a compact encoding of the same state ([`super::fast`]), which lets
//! most packets through without this code; the property tests there and in `pair` run both on
//! the same packets and require the same events.

use super::slots::Counter;
use super::{BatchEvent, BatchEventKind, EventSink, LossConfig, PointStats};
use telemark_wire::FlowKey;

/// Steps an armed flow waits before its open batch is reported. One step would do without
/// reordering (the batch after the first color change the point sees is whole); with it, the
/// packet that armed the flow may be a straggler of the batch before the open one, so the
/// batch after that first change may have begun before the flow was armed. After two steps
/// the open batch began after the arming packet by at least a batch.
pub(crate) const ARM_BATCHES: u32 = 2;

/// Where a flow's detector is in the cycle of a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Phase {
    /// No packet yet: the next one opens the first batch.
    #[default]
    Free,
    /// Counting the open batch, which began at the last step; packets of the other color are
    /// late packets of the batch closed then.
    LateWindow,
    /// Counting the open batch; packets of the other color are the next batch's early ones.
    Open,
}

/// Whether the flow's batches are reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Watch {
    /// Every batch, from the first.
    #[default]
    Reporting,
    /// Admitted mid-flow by active flow selection: counting, reporting nothing until
    /// [`ARM_BATCHES`] steps have passed (its batches so far are partial here).
    Armed,
    /// The open batch is the first reported after an armed admission: upstream batches
    /// before it were not watched here (its event says `head`).
    Head,
}

/// How a batch ends when it is reported by [`Detector::retire`] rather than by a step.
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

/// A point's constants, derived once from the [`LossConfig`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    /// The point's number in events.
    pub point: u8,
    /// The step threshold in packets (count-based periods).
    pub close_at: u32,
    /// Packets of the open batch that end its late window (count-based periods).
    pub late_limit: u32,
    /// Timed periods: their length.
    pub period_ns: Option<u64>,
    /// Timed periods: how long after the next batch's first packet the step is taken.
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

/// One flow's detector at one point.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Detector<C: Counter> {
    pub phase: Phase,
    pub watch: Watch,
    /// Color of the open batch.
    pub open_color: u8,
    /// Packets of the open batch.
    pub open: C,
    /// Early packets of the next batch.
    pub next: C,
    /// Late packets of the batch closed at the last step (in its late window only).
    pub late: C,
    /// Packets of the open color after the next batch began (outside the late window only).
    pub resumed: C,
    /// Time of the last packet, late ones aside (also the flow's last-seen time).
    pub last_ns: u64,
    /// Running number of the open batch.
    pub ordinal: u32,
    /// The open batch's first packet.
    pub first_ns: u64,
    /// The next batch's first packet.
    pub next_first_ns: u64,
    /// The open batch's last packet, kept once the next batch has begun.
    pub open_last_ns: u64,
}

impl<C: Counter> Detector<C> {
    /// A flow admitted mid-flow (see [`Watch::Armed`]); its next packet opens its first batch.
    pub fn armed() -> Self {
        Detector { watch: Watch::Armed, ..Detector::default() }
    }

    /// One packet of `color` at `now` (IV-A.2 and IV-A.3).
    #[allow(clippy::too_many_arguments)]
    pub fn packet<S: EventSink>(
        &mut self,
        key: &FlowKey,
        p: &Params,
        stats: &mut PointStats,
        color: u8,
        now: u64,
        sink: &mut S,
    ) {
        let color = color & 1;
        if self.phase == Phase::Free {
            // The flow's first packet opens its first batch.
            let watch = if self.watch == Watch::Armed { Watch::Armed } else { Watch::Reporting };
            *self = Detector {
                phase: Phase::Open,
                watch,
                open_color: color,
                first_ns: now,
                ..Detector::default()
            };
            stats.admitted += 1;
        }
        if self.phase == Phase::LateWindow && !self.in_late_window(p, now) {
            self.end_late_window(key, p.point, stats, sink);
        }
        let counted = p.period_ns.is_none();
        if color == self.open_color {
            if counted && self.phase == Phase::Open && self.next.get() != 0 {
                self.resumed(key, p, stats, now, sink);
            } else {
                self.open.inc();
                self.last_ns = now;
            }
            return;
        }
        if self.phase == Phase::LateWindow {
            self.late.inc();
            if counted && self.late.get() >= p.close_at {
                self.late_step(key, p, stats, now, sink);
            }
            return;
        }
        // An early packet of the next batch.
        if self.next.get() == 0 {
            self.next_first_ns = now;
            self.open_last_ns = self.last_ns;
        }
        self.next.inc();
        self.last_ns = now;
        let step = match p.period_ns {
            None => self.next.get() >= p.close_at,
            Some(_) => now.saturating_sub(self.next_first_ns) >= p.close_after_ns,
        };
        if step {
            self.step(key, p, stats, now, sink);
        }
    }

    /// The step: the open batch (its resumed packets folded back in) is reported, and the
    /// next one opens in its late window, with its early packets; `now` is the time of its
    /// last packet so far.
    pub fn step<S: EventSink>(
        &mut self,
        key: &FlowKey,
        p: &Params,
        stats: &mut PointStats,
        now: u64,
        sink: &mut S,
    ) {
        self.fold_resumed();
        self.report(stats, sink, self.closed(key, p.point, false, Tail::No));
        let (color, count, first) = (self.open_color ^ 1, self.next, self.next_first_ns);
        self.open_batch(color, count, 1, first, now);
    }

    /// As many "late" packets as the step threshold: no reordering the detector is built for
    /// makes that many (DESIGN: depth below threshold × B), so they are the batch after the
    /// open one, which lost so many packets that it ended inside its late window. Close it,
    /// and open the next with these packets. Without this rule, a batch that keeps fewer than
    /// (1 + threshold)/2 · B packets would have the whole next batch read as late and the
    /// one after merged into it.
    fn late_step<S: EventSink>(
        &mut self,
        key: &FlowKey,
        p: &Params,
        stats: &mut PointStats,
        now: u64,
        sink: &mut S,
    ) {
        let n = self.late;
        // Nothing was late for the batch before after all.
        self.late = C::default();
        self.end_late_window(key, p.point, stats, sink);
        self.report(stats, sink, self.closed(key, p.point, false, Tail::No));
        self.open_batch(self.open_color ^ 1, n, 1, now, now);
    }

    /// A packet of the open color after early packets of the next batch (count-based
    /// periods). Counted apart: a few are the open batch's late packets, reordered behind the
    /// next batch's first ones, and join it at the step. But when as many as the step
    /// threshold arrive before the next batch reaches its step, the next batch lost so many
    /// packets that the one after it has begun (the two batches of the open color would
    /// otherwise merge into one, and the loss of three batches be read as one batch's): close
    /// the open batch and the next one, and open the one after with these packets.
    fn resumed<S: EventSink>(
        &mut self,
        key: &FlowKey,
        p: &Params,
        stats: &mut PointStats,
        now: u64,
        sink: &mut S,
    ) {
        self.resumed.inc();
        if self.resumed.get() < p.close_at {
            return;
        }
        // The open batch's resumed packets move no time: its last time is that before the
        // next batch began.
        self.report(stats, sink, self.closed(key, p.point, false, Tail::No));
        self.report(stats, sink, self.closed(key, p.point, true, Tail::No));
        // Stragglers of the batch just closed count as its late packets.
        self.open_batch(self.open_color, self.resumed, 2, now, now);
    }

    /// Closes and reports everything the flow holds (flush, idle timeout, eviction:
    /// [`Tail::End`]; deselection: [`Tail::Cut`]). The caller frees the state.
    pub fn retire<S: EventSink>(
        &mut self,
        key: &FlowKey,
        p: &Params,
        stats: &mut PointStats,
        how: Tail,
        sink: &mut S,
    ) {
        if self.phase == Phase::Free || self.watch == Watch::Armed {
            return;
        }
        if self.phase == Phase::LateWindow {
            self.end_late_window(key, p.point, stats, sink);
        }
        // Resumed packets short of a double step: taken as the open batch's.
        self.fold_resumed();
        if self.open.get() > 0 {
            self.report(stats, sink, self.closed(key, p.point, false, how));
        }
        if self.next.get() > 0 {
            // Early packets of a batch that never reached the step: reported as that batch
            // so the totals add up.
            self.report(stats, sink, self.closed(key, p.point, true, how));
        }
    }

    /// Whether the late window is still open at `now`.
    fn in_late_window(&self, p: &Params, now: u64) -> bool {
        match p.period_ns {
            // Timed: RFC 9341 §3.1 reads a period's counters half a period into the next one.
            Some(t) => now.saturating_sub(self.first_ns) < t / 2,
            None => self.open.get() < p.late_limit,
        }
    }

    /// Ends the late window, reporting the late packets of the batch before, if any. An empty
    /// report would tell the aggregator the batch is final a batch earlier than the next
    /// batch's `Closed` event does, and every event costs the fast path a record written to
    /// the ring. Nothing is sent for a batch that was never reported itself.
    fn end_late_window<S: EventSink>(
        &mut self,
        key: &FlowKey,
        point: u8,
        stats: &mut PointStats,
        sink: &mut S,
    ) {
        self.phase = Phase::Open;
        let late = core::mem::take(&mut self.late).get();
        if self.watch != Watch::Reporting || late == 0 {
            return;
        }
        stats.late += u64::from(late);
        sink.emit(BatchEvent {
            key: *key,
            point,
            kind: BatchEventKind::Late,
            color: self.open_color ^ 1,
            ordinal: self.ordinal.wrapping_sub(1),
            count: late,
            first_ns: 0,
            last_ns: 0,
            tail: false,
            head: false,
            cut: false,
            ttl: None,
        });
    }

    /// Adds the open color's resumed packets back to the open batch.
    fn fold_resumed(&mut self) {
        let r = core::mem::take(&mut self.resumed).get();
        self.open = C::from_u32(self.open.get().saturating_add(r));
    }

    /// Opens the batch of `color`, `advance` batches after the one open so far, with `count`
    /// packets already in it and its first at `first_ns`, in its late window.
    fn open_batch(&mut self, color: u8, count: C, advance: u32, first_ns: u64, now: u64) {
        self.open_color = color;
        (self.open, self.next, self.late, self.resumed) =
            (count, C::default(), C::default(), C::default());
        self.ordinal = self.ordinal.wrapping_add(advance);
        self.first_ns = first_ns;
        self.last_ns = now;
        self.phase = Phase::LateWindow;
        // An armed flow's ordinals count its steps from admission.
        self.watch = match self.watch {
            Watch::Armed if self.ordinal < ARM_BATCHES => Watch::Armed,
            Watch::Armed => Watch::Head,
            _ => Watch::Reporting,
        };
    }

    /// Sends a closed batch to the aggregator, unless the flow is armed.
    fn report<S: EventSink>(&self, stats: &mut PointStats, sink: &mut S, ev: BatchEvent) {
        if self.watch != Watch::Armed {
            sink.emit(ev);
            stats.batches += 1;
        }
    }

    /// The `Closed` event of the open batch, or (`next`) of the next batch's early packets.
    fn closed(&self, key: &FlowKey, point: u8, next: bool, tail: Tail) -> BatchEvent {
        let began = self.next.get() > 0;
        let (color, ordinal, count, first_ns, last_ns) = if next {
            let n = self.ordinal.wrapping_add(1);
            (self.open_color ^ 1, n, self.next, self.next_first_ns, self.last_ns)
        } else {
            let last = if began { self.open_last_ns } else { self.last_ns };
            (self.open_color, self.ordinal, self.open, self.first_ns, last)
        };
        BatchEvent {
            key: *key,
            point,
            kind: BatchEventKind::Closed,
            color,
            ordinal,
            count: count.get(),
            first_ns,
            last_ns,
            tail: tail != Tail::No,
            head: !next && self.watch == Watch::Head,
            cut: tail == Tail::Cut,
            ttl: None,
        }
    }
}
