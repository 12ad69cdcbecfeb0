//! Telemark's INT report collector (docs/int.md): Telemetry Reports in over UDP or AF_XDP (one
//! worker per core on a shared port, batches per system call), the INT paper's event detection
//! run per flow on the worker that received it, events out to the collector's store over the
//! agents' acknowledged transport behind a bounded queue whose drops are counted, Prometheus
//! `/metrics` of everything it saw and, on the same listener, the control API that replaces the
//! detector rules at run time. `telemark int-collector` is a thin shell over [`run`].

pub mod config;
pub mod control;
mod metrics;
mod service;
mod stats;

pub use config::{offline, sender_allowed, Args, Offline};
pub use service::run;
