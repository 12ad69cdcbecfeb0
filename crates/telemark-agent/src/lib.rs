//! The Telemark agent: the loss monitor on live ports, an off-path aggregation, and export to
//! the collector. See docs/agent.md. Its rooms:
//!
//! - [`agent`]: start-up, reload and stop; which thread owns what.
//! - `datapath`: the seam a datapath plugs into; `fast_path`: the AF_PACKET switch and taps
//!   (with `egress`: output queues and the INT stage).
//! - `aggregation`: the aggregator thread (records every interval); `output`: where records go
//!   (the collector, [`kafka_out`], stdout); [`flow_export`]: sFlow and IPFIX.
//! - `metrics`: the `/metrics` page, and the listener that serves it with `control`, the
//!   control API (`GET`/`PUT /api/v1/int`).
//! - `shared`: each thread's counters and the rules mailboxes, read by the others.
//! - [`config`]: the TOML file and flags, checked.

pub mod agent;
mod aggregation;
pub mod config;
mod control;
mod datapath;
mod doorbell;
mod ebpf_flows;
mod ebpf_path;
mod egress;
mod error;
mod fast_path;
pub mod flow_export;
pub mod kafka_out;
mod metrics;
mod output;
mod shared;

pub use agent::{Agent, AgentError};
pub use config::{AgentConfig, FileConfig};
pub use shared::{AgentStats, ExportStats, FlowExportStats, PathStats, PointTable};
