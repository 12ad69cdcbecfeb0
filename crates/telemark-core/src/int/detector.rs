//! The paper's event detectors (Vestin et al., §III-C "P4 based Event Pre-filtering"), run per
//! flow on the metadata of each INT packet at the sink, or at the collector on each report.
//!
//! - **per-hop**: for each switch ID on the path, the change of the metric since the value
//!   last stored for that switch; past the threshold the new value is stored and the packet is
//!   an event.
//! - **per-flow**: the same on the sum of the metric over all hops.
//! - **moving average** (EWMA): the sum smoothed as `avg += α (sum − avg)`; an event when the
//!   average moved more than the threshold from the value last stored.
//! - **noop**: every packet is an event.
//! - **complex**: a CNF expression ([`super::expr`]).
//!
//! "Change" is the absolute difference: a queue that drains is as much news as one that
//! fills. State starts at zero, as the switch's registers do, so a flow's first value fires
//! when it is itself past the threshold.

use super::expr::{Expr, ExprState};
use telemark_wire::int::{Field, Hop};

/// Most hops whose values a per-hop detector remembers per flow (INT paths are short); when
/// a path changes and more switches show up, a new one takes a slot in turn.
pub const MAX_HOPS: usize = 8;

/// EWMA weights are fixed-point with this many fractional bits.
const ALPHA_SHIFT: u32 = 16;

/// Which detector a flow runs, with its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detector {
    /// Per-hop change of `metric`.
    PerHop {
        /// The metadata watched.
        metric: Field,
        /// Smallest change that is an event.
        threshold: u64,
    },
    /// Change of the path's sum of `metric`.
    PerFlow {
        /// The metadata watched.
        metric: Field,
        /// Smallest change that is an event.
        threshold: u64,
    },
    /// Change of the moving average of the path's sum of `metric`.
    Ewma {
        /// The metadata watched.
        metric: Field,
        /// Smallest change that is an event.
        threshold: u64,
        /// Weight of a new value, in 1/65536ths (use [`Detector::ewma`]).
        alpha: u32,
    },
    /// Every packet.
    Noop,
    /// A CNF expression over the metadata.
    Complex(Box<Expr>),
}

impl Detector {
    /// An EWMA detector with weight `alpha` in (0, 1].
    pub fn ewma(metric: Field, threshold: u64, alpha: f64) -> Result<Detector, String> {
        if !(alpha > 0.0 && alpha <= 1.0) {
            return Err(format!("alpha {alpha} is not in (0, 1]"));
        }
        let alpha = ((alpha * f64::from(1u32 << ALPHA_SHIFT)).round() as u32).max(1);
        Ok(Detector::Ewma { metric, threshold, alpha })
    }

    /// The name used in configs and `event` records.
    pub fn name(&self) -> &'static str {
        match self {
            Detector::PerHop { .. } => "per_hop",
            Detector::PerFlow { .. } => "per_flow",
            Detector::Ewma { .. } => "ewma",
            Detector::Noop => "noop",
            Detector::Complex(_) => "complex",
        }
    }

    /// Runs the detector on one packet's hops (newest first, as on the wire) and updates the
    /// flow's state. Returns the event, if the packet is one.
    pub fn detect(&self, hops: &[Hop], state: &mut FlowState) -> Option<Detection> {
        match self {
            Detector::Noop => Some(Detection::path(0)),
            Detector::PerHop { metric, threshold } => per_hop(hops, *metric, *threshold, state),
            Detector::PerFlow { metric, threshold } => {
                let sum = path_sum(hops, *metric);
                state.changed(sum, *threshold).then(|| Detection::path(sum))
            }
            Detector::Ewma { metric, threshold, alpha } => {
                let sum = path_sum(hops, *metric);
                let avg = state.smooth(sum, *alpha);
                state.changed(avg, *threshold).then(|| Detection::path(avg))
            }
            Detector::Complex(e) => e.eval(hops, &mut state.expr).then(|| Detection::path(0)),
        }
    }

    /// The metric watched (`None` for noop and complex detection).
    pub fn metric(&self) -> Option<Field> {
        match self {
            Detector::PerHop { metric, .. }
            | Detector::PerFlow { metric, .. }
            | Detector::Ewma { metric, .. } => Some(*metric),
            Detector::Noop | Detector::Complex(_) => None,
        }
    }

    /// The fields the detector reads, as a mask of `1 << field as u8`.
    pub fn fields(&self) -> u32 {
        match self {
            // A hop is known by its node ID.
            Detector::PerHop { metric, .. } => 1 << *metric as u8 | 1 << Field::NodeId as u8,
            Detector::PerFlow { metric, .. } | Detector::Ewma { metric, .. } => 1 << *metric as u8,
            Detector::Noop => 0,
            Detector::Complex(e) => e.fields().fold(0, |m, f| m | 1 << f as u8),
        }
    }

    /// The threshold (`None` for noop and complex detection).
    pub fn threshold(&self) -> Option<u64> {
        match self {
            Detector::PerHop { threshold, .. }
            | Detector::PerFlow { threshold, .. }
            | Detector::Ewma { threshold, .. } => Some(*threshold),
            Detector::Noop | Detector::Complex(_) => None,
        }
    }
}

/// What fired: the value that crossed, and for per-hop detection where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detection {
    /// The new value (per-hop: the hop's; per-flow: the sum; EWMA: the average).
    pub value: u64,
    /// For per-hop detection: position on the path (0 = the newest hop) and switch ID.
    pub hop: Option<(u8, u32)>,
}

impl Detection {
    fn path(value: u64) -> Detection {
        Detection { value, hop: None }
    }
}

/// One flow's detector state. In C order, what per-hop detection reads first (the flow
/// table keeps it in the cache line after the flow's key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct FlowState {
    hop_count: u8,
    /// Per-hop, all slots taken: the slot a new switch replaces next (round robin).
    next_victim: u8,
    /// Per-hop: the switch IDs seen, and the value last stored for each.
    ids: [u32; MAX_HOPS],
    values: [u64; MAX_HOPS],
    /// Per-flow and EWMA: the value last stored.
    stored: u64,
    /// EWMA: the running average in 1/65536ths.
    avg: u128,
    expr: ExprState,
}

impl FlowState {
    /// A flow's state before its first packet.
    pub const EMPTY: FlowState = FlowState {
        hop_count: 0,
        next_victim: 0,
        ids: [0; MAX_HOPS],
        values: [0; MAX_HOPS],
        stored: 0,
        avg: 0,
        expr: ExprState::EMPTY,
    };

    /// Whether `value` moved more than `threshold` from the stored value (storing it if so).
    fn changed(&mut self, value: u64, threshold: u64) -> bool {
        let moved = value.abs_diff(self.stored) > threshold;
        if moved {
            self.stored = value;
        }
        moved
    }

    /// Folds `value` into the average, `avg += α (value − avg)`, and returns it.
    fn smooth(&mut self, value: u64, alpha: u32) -> u64 {
        let one = 1u128 << ALPHA_SHIFT;
        let x = u128::from(value) << ALPHA_SHIFT;
        self.avg = (self.avg * (one - u128::from(alpha)) + x * u128::from(alpha)) >> ALPHA_SHIFT;
        (self.avg >> ALPHA_SHIFT).min(u128::from(u64::MAX)) as u64
    }
}

fn path_sum(hops: &[Hop], metric: Field) -> u64 {
    hops.iter().filter_map(|h| h.available(metric)).fold(0u64, u64::saturating_add)
}

fn per_hop(
    hops: &[Hop],
    metric: Field,
    threshold: u64,
    state: &mut FlowState,
) -> Option<Detection> {
    let mut first = None;
    for (i, hop) in hops.iter().enumerate() {
        // A hop without a node ID is known by its position, kept apart from real IDs.
        let (Some(value), switch) = (
            hop.available(metric),
            hop.get(Field::NodeId).unwrap_or(u64::from(u32::MAX) - i as u64),
        ) else {
            continue;
        };
        let switch = switch as u32;
        let known = usize::from(state.hop_count);
        let slot = match state.ids[..known].iter().position(|id| *id == switch) {
            Some(s) => s,
            None if known < MAX_HOPS => {
                // A switch seen for the first time: a change from nothing.
                (state.ids[known], state.values[known]) = (switch, 0);
                state.hop_count += 1;
                known
            }
            None => {
                // Every slot taken (the path changed): a new switch takes one in turn.
                let v = usize::from(state.next_victim) % MAX_HOPS;
                state.next_victim = ((v + 1) % MAX_HOPS) as u8;
                (state.ids[v], state.values[v]) = (switch, 0);
                v
            }
        };
        let last = &mut state.values[slot];
        if value.abs_diff(*last) > threshold {
            *last = value;
            first.get_or_insert(Detection { value, hop: Some((i as u8, switch)) });
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(values: &[(u32, u64)]) -> Vec<Hop> {
        values
            .iter()
            .map(|&(id, v)| {
                let mut h = Hop::default();
                h.set(Field::NodeId, u64::from(id));
                h.set(Field::QueueOccupancy, v);
                h
            })
            .collect()
    }

    #[test]
    fn per_hop_fires_on_the_hop_that_moved() {
        let d = Detector::PerHop { metric: Field::QueueOccupancy, threshold: 100 };
        let mut s = FlowState::default();
        assert_eq!(d.detect(&path(&[(1, 50), (2, 50)]), &mut s), None);
        let e = d.detect(&path(&[(1, 50), (2, 200)]), &mut s).unwrap();
        assert_eq!((e.value, e.hop), (200, Some((1, 2))));
        // Stored 200 at switch 2: 250 is within the threshold, 50 is not.
        assert_eq!(d.detect(&path(&[(1, 50), (2, 250)]), &mut s), None);
        assert!(d.detect(&path(&[(1, 50), (2, 50)]), &mut s).is_some());
    }

    #[test]
    fn per_flow_on_the_sum() {
        let d = Detector::PerFlow { metric: Field::QueueOccupancy, threshold: 100 };
        let mut s = FlowState::default();
        assert_eq!(d.detect(&path(&[(1, 60), (2, 60)]), &mut s).map(|e| e.value), Some(120));
        assert_eq!(d.detect(&path(&[(1, 100), (2, 100)]), &mut s), None);
        assert_eq!(d.detect(&path(&[(1, 200), (2, 100)]), &mut s).map(|e| e.value), Some(300));
    }

    #[test]
    fn ewma_smooths_a_spike() {
        let d = Detector::ewma(Field::QueueOccupancy, 100, 0.25).unwrap();
        let mut s = FlowState::default();
        assert_eq!(d.detect(&path(&[(1, 0)]), &mut s), None);
        // One spike of 300 moves the average by 75 only.
        assert_eq!(d.detect(&path(&[(1, 300)]), &mut s), None);
        // A sustained one gets there: 75 → 131.25.
        assert_eq!(d.detect(&path(&[(1, 300)]), &mut s).map(|e| e.value), Some(131));
        assert!(Detector::ewma(Field::QueueOccupancy, 1, 0.0).is_err());
    }

    #[test]
    fn noop_always_and_complex_by_expression() {
        let mut s = FlowState::default();
        assert!(Detector::Noop.detect(&[], &mut s).is_some());
        let c = Detector::Complex(Box::new(Expr::parse("queue_occupancy > 100").unwrap()));
        assert!(c.detect(&path(&[(1, 101)]), &mut s).is_some());
        assert!(c.detect(&path(&[(1, 100)]), &mut s).is_none());
    }
}
