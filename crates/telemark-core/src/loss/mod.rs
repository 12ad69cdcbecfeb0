//! Per-flow packet loss by alternate marking.
//!
//! The method of the loss paper (`amppm-loss-monitoring-ovs-dpdk.txt`, section IV) and of
//! RFC 9341: a first hop colors each flow's packets in alternating batches (one DSCP bit); every
//! observation point counts packets per flow and color; a reorder-robust step detector closes
//! a batch once a share of the next color has arrived; the closed counts, compared against the
//! batch size or against the upstream point's count of the same batch, give the loss of that
//! batch on the segment in between.
//!
//! - [`Marker`]: the first hop; count-based (B packets per color) or time-based (period T).
//! - [`ColorTable`]: one observation point's per-flow, per-color counters and step detector.
//! - [`Aggregator`]: off the fast path; lines batches up across points, emits loss records.

mod aggregator;
mod config;
mod marker;
mod slots;
mod table;

pub use aggregator::{Aggregator, FlowTotals, PointSpec};
pub use config::{ConfigError, LossConfig};
pub use marker::Marker;
pub use slots::{Counter, Lookup};
pub use table::{AnyColorTable, ColorTable, PointStats};

use telemark_wire::FlowKey;

/// What a point tells the aggregator about a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEventKind {
    /// The batch closed with `count` packets.
    Closed,
    /// `count` packets of an already closed batch arrived late; no more will be counted.
    Late,
}

/// One message from a fast-path point to the aggregator, sent through an SPSC ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEvent {
    /// The flow.
    pub key: FlowKey,
    /// Which observation point (index into the aggregator's points).
    pub point: u8,
    /// Closed or late.
    pub kind: BatchEventKind,
    /// The batch's color, 0 or 1.
    pub color: u8,
    /// The point's own running number for this flow's batches.
    pub ordinal: u32,
    /// Packets in the batch (closed) or late packets (late).
    pub count: u32,
    /// Time of the batch's first packet at this point.
    pub first_ns: u64,
    /// Time of the batch's last in-time packet at this point.
    pub last_ns: u64,
    /// Closed by a flush or idle timeout rather than by a step: possibly a partial batch.
    pub tail: bool,
}

/// Where a point sends its batch events. Implemented by the ring producer in the pipeline and
/// by `Vec` in tests.
pub trait EventSink {
    /// Takes one event. Must not block.
    fn emit(&mut self, ev: BatchEvent);
}

impl EventSink for Vec<BatchEvent> {
    fn emit(&mut self, ev: BatchEvent) {
        self.push(ev);
    }
}

/// Reads the color bit from a DSCP value.
#[inline(always)]
pub fn color_of(dscp: u8, color_bit: u8) -> u8 {
    (dscp >> color_bit) & 1
}

/// Writes the color bit into a DSCP value.
#[inline(always)]
pub fn with_color(dscp: u8, color_bit: u8, color: u8) -> u8 {
    (dscp & !(1 << color_bit)) | ((color & 1) << color_bit)
}
