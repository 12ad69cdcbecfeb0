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
//! - [`PairTable`]: the same for both points of a switch, beside the switch's flow table.
//! - [`Aggregator`]: off the fast path; lines batches up across points, emits loss records.

mod aggregator;
mod config;
mod detector;
mod fast;
mod marker;
mod pair;
mod slots;
mod table;

pub use aggregator::{Aggregator, PointSpec};
pub use config::{ConfigError, LossConfig};
pub use marker::Marker;
pub use pair::{PairPacket, PairState, PairTable};
pub use slots::{Counter, Lookup};
pub use table::{AnyColorTable, ColorTable, PointStats};

use telemark_wire::FlowKey;

/// The flows active flow selection watches (the heavy-hitter pipeline's top flows of the last
/// window): see [`ColorTable::select`] and the switch's `select`.
pub type Selection = std::collections::HashSet<FlowKey, crate::hash::FlowTableHasher>;

/// What a point tells the aggregator about a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEventKind {
    /// The batch closed with `count` packets.
    Closed,
    /// `count` packets of an already closed batch arrived late; no more will be counted.
    Late,
    /// The point had no room for the flow and does not measure it: whatever the flow lost
    /// there is unknown, not lost (sent once per flow, give or take, not per packet).
    Refused,
    /// Events before this one were lost (a full event ring): any flow at any point may be
    /// missing some, so what they would have said is uncertain, never loss. Carries no flow.
    Gap,
    /// A marker left `count` packets of the flow as they were, in the marking period
    /// `ordinal` (with `first_ns`, its start): their sender had set the colour bit, so they are
    /// not measured (the eBPF datapath's `[ebpf] own_colour = "keep"`).
    OwnColour,
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
    /// The first batch reported after the point began watching the flow mid-flow (active flow
    /// selection): upstream batches before it were not watched here, not lost.
    pub head: bool,
    /// Closed because the point stopped watching the flow mid-batch (active flow selection):
    /// partial, comparable only with an upstream batch cut at the same moment.
    pub cut: bool,
    /// The IPv4 TTL (IPv6 hop limit) the flow's packets had at this point, where the datapath
    /// reads it (the eBPF datapath): fewer at points further down a routed path.
    pub ttl: Option<u8>,
}

/// Where a point sends its batch events. Implemented by the ring producer in the pipeline and
/// by `Vec` in tests.
pub trait EventSink {
    /// Takes one event. Must not block.
    fn emit(&mut self, ev: BatchEvent);

    /// Events may follow soon: a sink writing to memory may start fetching where they will
    /// go (the switch calls this once per burst).
    #[inline(always)]
    fn prefetch(&mut self) {}
}

impl EventSink for Vec<BatchEvent> {
    fn emit(&mut self, ev: BatchEvent) {
        self.push(ev);
    }
}

/// Tells the aggregator, about once per flow, that a point refused the flow, and tells the point
/// when a flow it admits may join mid-flow. Remembers the last refused flows in a direct-mapped
/// set, so a refused flow's every packet does not become an event, and the last time the table
/// had no room. A flow admitted after a refusal (an idle flow left and made room) lacks, in the
/// batch open at its admission, the packets refused: the point starts it armed (see
/// `Detector::armed`) instead of reporting a partial batch as if it were whole. So does every
/// flow admitted while the table is refusing flows (one refused within the idle timeout): the
/// set may have forgotten the flow's refusal (another refused flow took its place), and under
/// that pressure a whole first batch cannot be told from a partial one. (The aggregator's rule
/// for batches that began before the point saw them covers what is left: lost events.)
#[derive(Clone)]
pub(crate) struct RefusedSet {
    tags: Box<[u32; REFUSED_SLOTS]>,
    /// When the table last had no room for a flow.
    last_full_ns: Option<u64>,
    /// How long after that admissions still join mid-flow (the idle timeout).
    window_ns: u64,
}

/// Flows a point remembers having refused (16 KiB of tags).
const REFUSED_SLOTS: usize = 4096;

impl RefusedSet {
    /// A set for a table whose flows idle out after `idle_ns`.
    pub(crate) fn new(idle_ns: u64) -> Self {
        RefusedSet { tags: Box::new([0; REFUSED_SLOTS]), last_full_ns: None, window_ns: idle_ns }
    }

    fn slot(&mut self, hash: u64) -> (Option<&mut u32>, u32) {
        let tag = ((hash >> 32) as u32) | 1;
        (self.tags.get_mut((hash as usize >> 8) % REFUSED_SLOTS), tag)
    }

    /// Forgets that flow `hash` was refused, as it is admitted at `now` (its next refusal,
    /// after an eviction, is news to the aggregator again); returns whether it joins
    /// mid-flow: it was refused before, or the table is refusing flows.
    pub(crate) fn admitted(&mut self, hash: u64, now: u64) -> bool {
        let pressed = self.last_full_ns.is_some_and(|t| now.saturating_sub(t) <= self.window_ns);
        match self.slot(hash) {
            (Some(t), tag) if *t == tag => {
                *t = 0;
                true
            }
            _ => pressed,
        }
    }

    /// Whether flow `hash` was not among the flows refused last (and remembers it).
    pub(crate) fn first(&mut self, hash: u64) -> bool {
        let (Some(t), tag) = self.slot(hash) else { return false };
        let new = *t != tag;
        *t = tag;
        new
    }
}

/// Why a point does not watch a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No room in the table (first come, first served).
    Full,
    /// Active flow selection left the flow out.
    NotSelected,
}

impl Refusal {
    /// Counts one packet of a flow refused for this reason.
    fn count(self, st: &mut PointStats) {
        match self {
            Refusal::Full => st.refused += 1,
            Refusal::NotSelected => st.unselected += 1,
        }
    }
}

impl RefusedSet {
    /// Counts a packet of a flow point `point` does not watch, and tells the aggregator (about
    /// once per flow) so its absence is not read as loss.
    pub(crate) fn refuse<S: EventSink>(
        &mut self,
        why: Refusal,
        (key, hash, now): (&FlowKey, u64, u64),
        points: &mut [(u8, &mut PointStats)],
        sink: &mut S,
    ) {
        if why == Refusal::Full {
            self.last_full_ns = Some(now);
        }
        let first = self.first(hash);
        for (point, st) in points.iter_mut() {
            why.count(st);
            if first {
                sink.emit(BatchEvent::refused(key, *point));
            }
        }
    }
}

impl BatchEvent {
    /// The [`BatchEventKind::Refused`] event of `key` at `point`.
    pub fn refused(key: &FlowKey, point: u8) -> Self {
        BatchEvent { key: *key, point, kind: BatchEventKind::Refused, ..BatchEvent::gap() }
    }

    /// The [`BatchEventKind::Gap`] event: events before it were lost.
    pub fn gap() -> Self {
        BatchEvent {
            key: FlowKey::default(),
            point: 0,
            kind: BatchEventKind::Gap,
            color: 0,
            ordinal: 0,
            count: 0,
            first_ns: 0,
            last_ns: 0,
            tail: false,
            head: false,
            cut: false,
            ttl: None,
        }
    }
}

/// Flow `i` of the unit tests: 10.0.0.i → 10.0.1.1, UDP 1 → 2.
#[cfg(test)]
pub(crate) fn test_key(i: u8) -> FlowKey {
    use core::net::{IpAddr, Ipv4Addr};
    FlowKey {
        src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)),
        dst: IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)),
        sport: 1,
        dport: 2,
        proto: 17,
        spi: None,
        si: None,
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
