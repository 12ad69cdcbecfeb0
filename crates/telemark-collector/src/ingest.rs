//! The collector's ingest layer: the store's writer and the counters that every source of
//! records writes through (agents over HTTP in api.rs, Kafka in kafka.rs, flow exporters in
//! flow_listen.rs). It sits below all three, so none of them imports another.

use crate::metrics::Metrics;
use crate::store::Store;
use std::sync::{Mutex, MutexGuard};

/// Where records are stored and counted.
pub struct Ingest {
    /// The writer's connection: writes, and the probes' and `/metrics`' few quick reads.
    /// Queries never take it (unless the database is in memory): they use the API's readers.
    writer: Mutex<Store>,
    /// What was stored and refused, and why.
    pub metrics: Metrics,
}

impl Ingest {
    /// The layer over `store`, its counters at zero.
    pub fn new(store: Store) -> Ingest {
        Ingest { writer: Mutex::new(store), metrics: Metrics::default() }
    }

    /// The writer's connection (a panic while it was held leaves it usable: SQLite rolled the
    /// transaction back).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The writer's lock itself, for the readers that fall back to it (an in-memory database).
    pub fn writer(&self) -> &Mutex<Store> {
        &self.writer
    }
}
