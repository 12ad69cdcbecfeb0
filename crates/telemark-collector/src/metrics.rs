//! The collector's own counters, and the agents' health, in Prometheus text exposition format.

use crate::store::{Agent, Stored};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use telemark_core::records::Record;

/// Counters (a mutex around small maps: requests are few per second, not per packet).
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, u16), u64>,
    records: BTreeMap<&'static str, u64>,
    duplicates: u64,
    lossy_batches: u64,
    lost_packets: u64,
    errors: BTreeMap<&'static str, u64>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// One answered request.
    pub fn request(&self, route: &str, status: u16) {
        self.with(|m| *m.requests.entry((route.to_string(), status)).or_default() += 1);
    }

    /// One rejected request or failure, by reason.
    pub fn count_error(&self, reason: &'static str) {
        self.with(|m| *m.errors.entry(reason).or_default() += 1);
    }

    /// Records of one acknowledged ingest.
    pub fn ingested(&self, records: &[Record], s: Stored) {
        self.with(|m| {
            for r in records {
                let kind = match r {
                    Record::Loss(l) => {
                        m.lossy_batches += u64::from(l.lost > 0);
                        m.lost_packets += l.lost;
                        "loss"
                    }
                    Record::Summary(_) => "summary",
                    Record::FlowLoss(_) => "flow_loss",
                    Record::Flow(_) => "flow",
                    Record::Cost(_) => "cost",
                    Record::Capture(_) => "capture",
                    Record::Health(_) => "health",
                };
                *m.records.entry(kind).or_default() += 1;
            }
            m.duplicates += s.duplicates;
        });
    }

    /// The exposition page.
    pub fn render(&self, agents: &[Agent], stored: (u64, u64)) -> String {
        let mut o = String::new();
        self.with(|m| {
            let _ = writeln!(o, "# HELP telemark_collector_requests_total HTTP requests answered, by route and status.\n# TYPE telemark_collector_requests_total counter");
            for ((route, status), n) in &m.requests {
                let _ = writeln!(o, "telemark_collector_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}");
            }
            let _ = writeln!(o, "# HELP telemark_collector_records_total Records received in acknowledged requests, by kind (retries included).\n# TYPE telemark_collector_records_total counter");
            for (k, n) in &m.records {
                let _ = writeln!(o, "telemark_collector_records_total{{kind=\"{k}\"}} {n}");
            }
            let _ = writeln!(o, "# HELP telemark_collector_duplicates_total Records received again after a retry and not stored twice.\n# TYPE telemark_collector_duplicates_total counter\ntelemark_collector_duplicates_total {}", m.duplicates);
            let _ = writeln!(o, "# HELP telemark_collector_lossy_batches_total Lossy batches received.\n# TYPE telemark_collector_lossy_batches_total counter\ntelemark_collector_lossy_batches_total {}", m.lossy_batches);
            let _ = writeln!(o, "# HELP telemark_collector_lost_packets_total Lost packets in received loss records.\n# TYPE telemark_collector_lost_packets_total counter\ntelemark_collector_lost_packets_total {}", m.lost_packets);
            let _ = writeln!(o, "# HELP telemark_collector_errors_total Rejected requests and failures, by reason.\n# TYPE telemark_collector_errors_total counter");
            for (k, n) in &m.errors {
                let _ = writeln!(o, "telemark_collector_errors_total{{reason=\"{k}\"}} {n}");
            }
        });
        let _ = writeln!(o, "# HELP telemark_collector_stored_records Records in the database, by table.\n# TYPE telemark_collector_stored_records gauge\ntelemark_collector_stored_records{{table=\"loss\"}} {}\ntelemark_collector_stored_records{{table=\"other\"}} {}", stored.0, stored.1);
        let _ = writeln!(o, "# HELP telemark_agent_records_total Records stored from each agent.\n# TYPE telemark_agent_records_total counter");
        for a in agents {
            let _ =
                writeln!(o, "telemark_agent_records_total{{agent=\"{}\"}} {}", a.agent, a.records);
        }
        let _ = writeln!(o, "# HELP telemark_agent_export_dropped Records each agent reported having dropped because its export buffer was full.\n# TYPE telemark_agent_export_dropped gauge");
        for a in agents {
            let _ = writeln!(
                o,
                "telemark_agent_export_dropped{{agent=\"{}\"}} {}",
                a.agent, a.export_dropped
            );
        }
        let _ = writeln!(o, "# HELP telemark_agent_last_seen_seconds When each agent was last heard from (Unix time).\n# TYPE telemark_agent_last_seen_seconds gauge");
        for a in agents {
            let _ = writeln!(
                o,
                "telemark_agent_last_seen_seconds{{agent=\"{}\"}} {:.3}",
                a.agent,
                a.last_seen_ns as f64 / 1e9
            );
        }
        o
    }
}
