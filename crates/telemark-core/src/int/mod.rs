//! In-band Network Telemetry event detection (Vestin et al., "Programmable Event Detection
//! for In-Band Network Telemetry", §III-C): which detector each flow runs, the detectors
//! themselves ([`detector`]: per-hop, per-flow, moving average, noop) and complex detection
//! over CNF expressions ([`expr`]), and the per-flow state table ([`table`]).
//!
//! Sans-IO like the rest of the core: callers pass the hops of one packet (as
//! `telemark_wire::int` reads them) and get back whether, and why, it is an event.

pub mod collect;
pub mod detector;
pub mod expr;
pub mod sequence;
pub mod table;

pub use detector::{Detection, Detector, FlowState};
pub use expr::{Expr, ExprError};
pub use table::{DetectRule, DetectSection, Detectors, Event, Outcome, TableCounts};
pub use telemark_wire::int::{Field, Hop};
