//! Where a live agent's fast path hands its batch events to the aggregator thread: a bounded
//! SPSC ring (`telemark_core::spsc`) it never waits on. Replay has time to wait and hands events
//! over in a `Vec` instead (`pipeline::Replay`), so it never loses one.

use telemark_core::loss::{BatchEvent, EventSink};
use telemark_core::spsc::Producer;

/// Event sink feeding the SPSC ring of a live agent. The fast path never waits: an event that
/// does not fit is counted and lost, and the next event that fits is preceded by a
/// [`BatchEvent::gap`], so the aggregator reads what the lost events concerned as uncertain,
/// never as loss.
pub struct RingSink {
    prod: Producer<BatchEvent>,
    /// Events lost because the ring was full.
    pub dropped: u64,
    /// An event was lost since the last gap event went out.
    gap: bool,
}

impl RingSink {
    /// A sink feeding `prod`.
    pub fn new(prod: Producer<BatchEvent>) -> Self {
        RingSink { prod, dropped: 0, gap: false }
    }

    /// Sends the gap event owed for lost events now, if there is room, rather than with the
    /// next event (call it now and then: a quiet fast path may send nothing for long).
    pub fn send_gap(&mut self) {
        if self.gap && self.prod.push(BatchEvent::gap()).is_ok() {
            self.gap = false;
        }
    }
}

impl EventSink for RingSink {
    #[inline]
    fn emit(&mut self, ev: BatchEvent) {
        // A gap owed goes first; while it cannot, nothing after it may.
        self.send_gap();
        if self.gap || self.prod.push(ev).is_err() {
            self.dropped += 1;
            self.gap = true;
        }
    }

    #[inline(always)]
    fn prefetch(&mut self) {
        self.prod.prefetch(EVENTS_AHEAD);
    }
}

/// Ring slots a [`RingSink`] fetches ahead: the events of two steps at both points of a switch.
pub const EVENTS_AHEAD: usize = 4;
