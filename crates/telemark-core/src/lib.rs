//! Telemark's sans-IO core. Nothing here reads a clock, touches a socket or spawns a thread:
//! callers pass `now` (nanoseconds since the Unix epoch) and bytes, and take results back. The
//! same code runs in capture replay, in the live agent, in benchmarks and in tests.

pub mod hash;
pub mod loss;
pub mod records;
pub mod spsc;

pub use hash::flow_hash;
pub use telemark_wire::FlowKey;
