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
    /// Events handed to the ring, gaps included.
    pub handed: u64,
}

impl RingSink {
    /// A sink feeding `prod`.
    pub fn new(prod: Producer<BatchEvent>) -> Self {
        RingSink { prod, dropped: 0, gap: false, handed: 0 }
    }

    /// Events were lost before they reached the sink (the eBPF datapath: a period the kernel
    /// overwrote before it was read): a gap goes before the next event.
    pub fn owe_gap(&mut self) {
        self.gap = true;
        self.send_gap();
    }

    /// The ring's size.
    pub fn capacity(&self) -> usize {
        self.prod.capacity()
    }

    /// Sends the gap event owed for lost events now, if there is room, rather than with the
    /// next event (call it now and then: a quiet fast path may send nothing for long).
    pub fn send_gap(&mut self) {
        if self.gap && self.prod.push(BatchEvent::gap()).is_ok() {
            self.gap = false;
            self.handed += 1;
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
        } else {
            self.handed += 1;
        }
    }

    #[inline(always)]
    fn prefetch(&mut self) {
        self.prod.prefetch(EVENTS_AHEAD);
    }
}

/// Ring slots a [`RingSink`] fetches ahead: the events of two steps at both points of a switch.
pub const EVENTS_AHEAD: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use telemark_core::loss::BatchEventKind;

    fn kinds(cons: &telemark_core::spsc::Consumer<BatchEvent>) -> Vec<BatchEventKind> {
        let mut v = Vec::new();
        cons.drain(|e| v.push(e.kind));
        v
    }

    /// A full ring: the event that did not fit is counted, and a gap goes before the next
    /// one, whichever way the loss came (the ring, or `owe_gap` for events lost before it).
    #[test]
    fn every_loss_is_told_before_the_events_after_it() {
        let (prod, cons) = telemark_core::spsc::channel::<BatchEvent>(2);
        let mut sink = RingSink::new(prod);
        let ev = BatchEvent { kind: BatchEventKind::Closed, ..BatchEvent::gap() };
        let cap = sink.capacity();
        for _ in 0..cap + 1 {
            sink.emit(ev);
        }
        assert_eq!((sink.dropped, sink.handed), (1, cap as u64));
        // Still full: the gap cannot go, so neither may what follows it.
        sink.emit(ev);
        assert_eq!(sink.dropped, 2);
        assert_eq!(kinds(&cons).len(), cap);
        sink.emit(ev);
        assert_eq!(kinds(&cons), vec![BatchEventKind::Gap, BatchEventKind::Closed]);
        sink.owe_gap();
        sink.emit(ev);
        assert_eq!(kinds(&cons), vec![BatchEventKind::Gap, BatchEventKind::Closed]);
        assert_eq!(sink.handed, cap as u64 + 4);
    }
}
