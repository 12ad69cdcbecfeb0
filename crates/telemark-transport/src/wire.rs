//! What an agent sends the collector, as JSON (docs/collector.md, "Ingest"):
//!
//! - `POST /api/v1/agents` with a [`Register`];
//! - `POST /api/v1/ingest` with an [`Ingest`]: records numbered from `seq` within the agent's
//!   run `boot`; the collector stores each (agent, boot, seq) once and answers an [`Ack`].

use serde::{Deserialize, Serialize};

/// An agent announcing itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Register {
    /// Its name.
    pub agent: String,
    /// Its version.
    pub version: String,
    /// This run (the start time in ns).
    pub boot: u64,
}

/// Records, numbered. `R` is the record (the collector reads each as a JSON value first, so it
/// can say which field of which record it refuses).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ingest<R> {
    /// The sending agent.
    pub agent: String,
    /// Its run.
    pub boot: u64,
    /// The sequence number of the first record.
    pub seq: u64,
    /// Records the agent dropped so far because its buffer was full.
    #[serde(default)]
    pub export_dropped: u64,
    /// The records.
    pub records: Vec<R>,
}

/// The collector's answer to an [`Ingest`], sent once every record is stored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Ack {
    /// Records stored now.
    pub accepted: u64,
    /// Records it already had (a retry).
    pub duplicates: u64,
    /// The next sequence number it expects.
    pub next_seq: u64,
}
