//! What the receive workers and the exporter publish, read by the listener's `/metrics`:
//! written by the service, read by the metrics page, so that neither names the other's file.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use telemark_core::int::collect::Counts;
use telemark_core::int::sequence::Sequences;

/// What the workers publish for /metrics and the exporter.
#[derive(Default)]
pub(crate) struct Shared {
    /// Per worker: its collector's counters, kernel drops.
    pub(crate) workers: Mutex<Vec<WorkerStats>>,
    /// Every worker's datagrams' sequence numbers: a sender may spread its datagrams over the
    /// workers (SO_REUSEPORT and RSS hash its source port), so they are followed together.
    pub(crate) sequences: Mutex<Sequences>,
    pub(crate) ring_dropped: AtomicU64,
    pub(crate) exported: AtomicU64,
    pub(crate) export_dropped: AtomicU64,
    pub(crate) export_failures: AtomicU64,
    pub(crate) export_pending: AtomicU64,
}

#[derive(Default, Clone)]
pub(crate) struct WorkerStats {
    /// `udp` or `xdp`.
    pub(crate) path: &'static str,
    pub(crate) counts: Counts,
    pub(crate) kernel_drops: u64,
    pub(crate) truncated: u64,
    pub(crate) flows: u64,
    /// (flow, rule) detector states held.
    pub(crate) states: u64,
    pub(crate) evicted: u64,
}
