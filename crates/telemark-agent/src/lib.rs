//! The Telemark agent: the loss monitor on live ports (AF_PACKET, TPACKET_V2), an off-path
//! aggregator, and export to the collector. See docs/agent.md.
pub mod config;
mod egress;
pub mod flow_export;
pub mod kafka_out;
mod metrics;
pub mod run;

pub use config::{AgentConfig, FileConfig};
pub use run::{Agent, AgentStats, ExportStats, PathStats};
