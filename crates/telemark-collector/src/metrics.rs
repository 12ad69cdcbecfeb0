//! The collector's own counters, and the agents' health, for its `/metrics` page (written by
//! `telemark_transport::metrics`).

use crate::store::{Agent, Stored};
use std::collections::BTreeMap;
use std::sync::Mutex;
use telemark_core::records::Record;
use telemark_transport::metrics::Exposition;

/// Counters (a mutex around small maps: requests are few per second, not per packet).
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    storage: Mutex<StorageState>,
}

/// Whether the last write failed for want of storage (disk full, I/O error, read-only), and
/// when that was last logged.
#[derive(Default)]
struct StorageState {
    failing: bool,
    unlogged: u64,
    logged_at: Option<std::time::Instant>,
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, u16), u64>,
    records: BTreeMap<&'static str, u64>,
    duplicates: u64,
    /// Per measured span (agent, point, where it is measured from), from stored records only.
    loss: BTreeMap<Span, LossCounts>,
    /// INT events stored, per (agent, detector).
    events: BTreeMap<(String, String), u64>,
    errors: BTreeMap<&'static str, u64>,
}

/// What a loss record measures: from `from` to `agent`'s `point`. `from` is the agent's own
/// upstream point (`agent/point`: a segment inside the switch) or `marker` (the whole path
/// from the marking switch, for a switch's first point downstream of another).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Span {
    agent: String,
    point: String,
    from: String,
}

#[derive(Debug, Clone, Copy, Default)]
struct LossCounts {
    expected: u64,
    lost: u64,
    uncertain: u64,
    batches: u64,
    lossy_batches: u64,
}

/// At most this many spans are counted (each a handful of series); records of further spans
/// are stored and served, not counted in /metrics (counted as an error instead).
const MAX_SPANS: usize = 10_000;

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// One answered request.
    pub fn request(&self, route: &str, status: u16) {
        self.with(|m| *m.requests.entry((route.to_string(), status)).or_default() += 1);
    }

    /// A write failed because the storage could not take it (`why`): not ready until a write
    /// succeeds again (`/readyz` 503, `storage_ready` 0). Logged at most once per 10 s.
    pub fn storage_failed(&self, why: &dyn std::fmt::Display) {
        let mut s = self.storage.lock().unwrap_or_else(|p| p.into_inner());
        s.failing = true;
        s.unlogged += 1;
        if s.logged_at.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(10)) {
            tracing::error!(
                "{} write(s) failed, not acknowledged (agents retry): {why}; not ready until a \
                 write succeeds",
                s.unlogged
            );
            (s.logged_at, s.unlogged) = (Some(std::time::Instant::now()), 0);
        }
    }

    /// A write succeeded: the storage takes writes again.
    pub fn storage_ok(&self) {
        let mut s = self.storage.lock().unwrap_or_else(|p| p.into_inner());
        if std::mem::take(&mut s.failing) {
            tracing::info!("writes succeed again: ready");
            (s.logged_at, s.unlogged) = (None, 0);
        }
    }

    /// Whether the last write failed for want of storage.
    pub fn storage_failing(&self) -> bool {
        self.storage.lock().unwrap_or_else(|p| p.into_inner()).failing
    }

    /// One rejected request or failure, by reason.
    pub fn count_error(&self, reason: &'static str) {
        self.with(|m| *m.errors.entry(reason).or_default() += 1);
    }

    /// Records of one acknowledged ingest; the loss counters take only those stored now
    /// (`s.new`), so a retried request counts once.
    pub fn ingested(&self, records: &[Record], s: &Stored) {
        self.with(|m| {
            for (n, r) in records.iter().enumerate() {
                let kind = match r {
                    Record::Loss(l) => {
                        if s.new.get(n).copied().unwrap_or(false) {
                            let from = match (&l.scope, &l.upstream) {
                                (telemark_core::records::Scope::Segment, Some(u)) => {
                                    format!("{}/{u}", l.agent)
                                }
                                _ => "marker".to_string(),
                            };
                            let span =
                                Span { agent: l.agent.clone(), point: l.point.clone(), from };
                            if m.loss.len() < MAX_SPANS || m.loss.contains_key(&span) {
                                let c = m.loss.entry(span).or_default();
                                c.expected = c.expected.saturating_add(l.expected.unwrap_or(0));
                                c.lost = c.lost.saturating_add(l.lost);
                                c.uncertain = c.uncertain.saturating_add(l.uncertain);
                                c.batches += 1;
                                c.lossy_batches += u64::from(l.lost > 0);
                            } else {
                                *m.errors.entry("metric_spans_full").or_default() += 1;
                            }
                        }
                        "loss"
                    }
                    Record::Summary(_) => "summary",
                    Record::FlowLoss(_) => "flow_loss",
                    Record::Flow(_) => "flow",
                    Record::Cost(_) => "cost",
                    Record::Capture(_) => "capture",
                    Record::Health(_) => "health",
                    Record::Event(e) => {
                        if s.new.get(n).copied().unwrap_or(false) {
                            let key = (e.agent.clone(), e.detector.clone());
                            if m.events.len() < MAX_SPANS || m.events.contains_key(&key) {
                                *m.events.entry(key).or_default() += 1;
                            }
                        }
                        "event"
                    }
                };
                *m.records.entry(kind).or_default() += 1;
            }
            m.duplicates += s.duplicates;
        });
    }

    /// The collector's own families on its `/metrics` page.
    pub fn render(&self, o: &mut Exposition, agents: &[Agent], stored: (u64, u64)) {
        self.with(|m| {
            o.counter(
                "telemark_collector_requests_total",
                "HTTP requests answered, by route and status.",
                &["route", "status"],
            )
            .samples(
                m.requests
                    .iter()
                    .map(|((route, status), n)| ([route.clone(), status.to_string()], *n)),
            );
            o.counter(
                "telemark_collector_records_total",
                "Records received in acknowledged requests, by kind (retries included).",
                &["kind"],
            )
            .samples(m.records.iter().map(|(k, n)| ([k], *n)));
            o.counter(
                "telemark_collector_duplicates_total",
                "Records received again after a retry and not stored twice.",
                &[],
            )
            .value(m.duplicates);
            render_loss(o, &m.loss);
            o.counter(
                "telemark_int_events_total",
                "INT events stored, by the agent that detected them and detector.",
                &["agent", "detector"],
            )
            .samples(m.events.iter().map(|((agent, detector), n)| ([agent, detector], *n)));
            o.counter(
                "telemark_collector_errors_total",
                "Rejected requests and failures, by reason.",
                &["reason"],
            )
            .samples(m.errors.iter().map(|(k, n)| ([k], *n)));
        });
        o.gauge(
            "telemark_collector_stored_records",
            "Records in the database, by table.",
            &["table"],
        )
        .sample(&["loss"], stored.0)
        .sample(&["other"], stored.1);
        o.gauge("telemark_collector_build_info", "The collector's version.", &["version"])
            .sample(&[env!("CARGO_PKG_VERSION")], 1u64);
        o.counter(
            "telemark_collector_agent_records_total",
            "Records stored from each agent.",
            &["agent"],
        )
        .samples(agents.iter().map(|a| ([&a.agent], a.records)));
        o.counter(
            "telemark_collector_agent_export_dropped_records_total",
            "Records each agent reported dropped because its export buffer was full (since the \
             agent started).",
            &["agent"],
        )
        .samples(agents.iter().map(|a| ([&a.agent], a.export_dropped)));
        // To the millisecond, as before.
        o.gauge(
            "telemark_collector_agent_last_seen_seconds",
            "When each agent was last heard from (Unix time).",
            &["agent"],
        )
        .samples(agents.iter().map(|a| ([&a.agent], (a.last_seen_ns / 1_000_000) as f64 / 1e3)));
    }
}

/// The loss counters per span: expected, lost and uncertain packets, batches and lossy batches.
/// `rate(lost) / rate(expected)` by span is the loss ratio there (docs/collector.md, "Metrics").
fn render_loss(o: &mut Exposition, loss: &BTreeMap<Span, LossCounts>) {
    type Field = fn(&LossCounts) -> u64;
    let families: [(&str, &str, Field); 5] = [
        ("expected_packets", "Packets the span's upstream counted into it.", |c| c.expected),
        ("lost_packets", "Packets lost on the span.", |c| c.lost),
        (
            "uncertain_packets",
            "Packets whose fate is unknown (a batch cut short, events lost).",
            |c| c.uncertain,
        ),
        ("batches", "Batches measured.", |c| c.batches),
        ("lossy_batches", "Batches that lost packets.", |c| c.lossy_batches),
    ];
    for (name, help, f) in families {
        o.counter(
            &format!("telemark_loss_{name}_total"),
            &format!("{help} From stored records (a retry counts once)."),
            &["agent", "point", "from"],
        )
        .samples(loss.iter().map(|(s, c)| ([&s.agent, &s.point, &s.from], f(c))));
    }
}
