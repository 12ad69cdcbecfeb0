//! Flow export from the switch's fast path: what the standard baselines of *On the Cost of
//! Measuring Traffic in a Virtualized Environment* (`../shared/papers/cost-of-measuring-
//! sflow-ipfix.txt`) do per packet, written so that the cost is what `telemark bench` says.
//!
//! - [`sampler`]: §IV "Measuring with sFlow": one packet in N picked at random, its header
//!   copied out; nothing else happens per packet.
//! - [`cache`]: §V "Measuring with IPFIX", B. "Introducing cache and flow aggregation": a flow
//!   table that sums packets and octets per flow and hands finished flows out on active and
//!   idle timeouts, at the end of a TCP connection, or when the table is full;
//!   [`fragments`] gives later IP fragments their first fragment's ports.
//!
//! Both are sans-IO: the agent's fast path owns them and hands what they produce to an
//! exporting thread through a ring (nothing here blocks or allocates per packet).

pub mod cache;
pub mod fragments;
pub mod sampler;

pub use cache::{CacheConfig, CacheStats, EndReason, FlowCache, FlowEntry, Observation};
pub use fragments::FragmentPorts;
pub use sampler::Sampler;
