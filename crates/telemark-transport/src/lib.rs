//! How Telemark's services talk: the HTTP server both the collector and the agent listen with
//! ([`server`]), requests and responses as plain values for their pure handlers ([`http`]), the
//! JSON an agent sends ([`wire`]), the agent's acknowledged exporter ([`exporter`]) and TLS
//! ([`tls`]). The agent depends on this crate, not on the collector, so it links neither SQLite
//! nor the collector's store.

pub mod exporter;
pub mod http;
pub mod metrics;
pub mod server;
pub mod tls;
pub mod wire;

use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}
