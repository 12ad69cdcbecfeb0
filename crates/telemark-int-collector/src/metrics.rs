//! The collector's listener: Prometheus `/metrics` of everything the workers and the exporter
//! saw, and the control API (`/api/v1/detectors`) when a control token is configured.

use crate::control::{Control, Refused};
use crate::stats::{Shared, WorkerStats};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use telemark_core::int::collect::Refusal;
use telemark_core::int::sequence::NodeSeq;
use telemark_transport::http::{Handler, Request, Response};
use telemark_transport::metrics::Exposition;
use telemark_transport::server::ServerStats;
use telemark_wire::dialect::Deviation;

/// The listener: `/metrics`, and the control API (`/api/v1/detectors`) when a control token
/// is configured.
pub(crate) struct Listener {
    pub(crate) name: String,
    pub(crate) shared: Arc<Shared>,
    /// The token scrapers must send, when set.
    pub(crate) token: Option<String>,
    /// The token a controller must send; `None`: no control API.
    pub(crate) control_token: Option<String>,
    pub(crate) control: Arc<Control>,
    pub(crate) transport: Arc<ServerStats>,
}

/// The control API's one path.
const DETECTORS: &str = "/api/v1/detectors";

impl Handler for Listener {
    fn handle(&self, req: &Request<'_>, _now: u64) -> Response {
        if let Err(r) = self.access(req.method, req.path(), req.token) {
            return r;
        }
        match (req.method, req.path()) {
            ("GET", "/metrics") => self.render(),
            ("GET", DETECTORS) => Response::json(200, &self.control.in_force()),
            ("PUT", DETECTORS) => match self.control.put(req.body) {
                Ok(rules) => Response::json(200, &rules),
                Err(e) => Response::error(400, e),
            },
            _ => Response::error(405, "GET /metrics, GET or PUT /api/v1/detectors"),
        }
    }

    fn admit(&self, method: &str, path: &str, token: Option<&str>) -> Option<Response> {
        let refused = self.access(method, path, token).err()?;
        if method == "PUT" && path == DETECTORS && refused.status == 401 {
            self.control.refuse(Refused::Unauthenticated);
        }
        Some(refused)
    }

    fn route(&self, path: &str) -> &'static str {
        match path {
            "/metrics" => "/metrics",
            DETECTORS => DETECTORS,
            _ => "other",
        }
    }
}

impl Listener {
    /// Whether a request may be made, from its method, path and token alone: the listener's
    /// access rules, all here, as the agent's. The server asks this before it reads a body
    /// (so nobody without the control token can hold the listener's body budget), and
    /// [`Handler::handle`] asks again.
    fn access(&self, method: &str, path: &str, token: Option<&str>) -> Result<(), Response> {
        let valid = |want: &str| token.is_some_and(|t| telemark_transport::http::token_eq(want, t));
        match (method, path) {
            (_, "/metrics") if !self.token.as_deref().is_none_or(valid) => {
                Err(Response::unauthenticated())
            }
            ("GET", "/metrics") => Ok(()),
            (_, "/metrics") => Err(Response::error(405, "only GET is allowed on /metrics")),
            (_, DETECTORS) => {
                let Some(want) = &self.control_token else {
                    return Err(Response::error(
                        404,
                        "the control API is off: set metrics.control_token_file \
                         (--control-token-file)",
                    ));
                };
                if !valid(want) {
                    return Err(Response::unauthenticated());
                }
                match method {
                    "GET" | "PUT" => Ok(()),
                    _ => Err(Response::error(405, "GET or PUT /api/v1/detectors")),
                }
            }
            (_, p) => Err(Response::error(
                404,
                format!("no such endpoint: {p} (this serves /metrics and {DETECTORS})"),
            )),
        }
    }

    fn render(&self) -> Response {
        let ws = self.shared.workers.lock().map(|w| w.clone()).unwrap_or_default();
        let mut o = Exposition::default();
        o.with_label("collector", &self.name);
        let c = |f: &dyn Fn(&WorkerStats) -> u64| ws.iter().map(f).sum::<u64>();
        let by_path =
            |p: &str| ws.iter().filter(|w| w.path == p).map(|w| w.counts.datagrams).sum::<u64>();
        o.counter(
            "telemark_int_datagrams_total",
            "Report datagrams received, by receive path (udp socket or AF_XDP).",
            &["path"],
        )
        .samples([(["udp"], by_path("udp")), (["xdp"], by_path("xdp"))]);
        o.counter("telemark_int_reports_total", "Individual reports read.", &[])
            .value(c(&|w| w.counts.reports));
        o.counter(
            "telemark_int_refused_total",
            "Datagrams or reports not read, by reason.",
            &["reason"],
        )
        .samples(Refusal::ALL.iter().map(|r| ([r.name()], c(&|w| w.counts.refused[*r as usize]))));
        o.counter(
            "telemark_int_deviations_total",
            "Reports read although they break a rule of the specifications, by rule.",
            &["rule"],
        )
        .samples(
            Deviation::ALL.iter().map(|d| ([d.name()], c(&|w| w.counts.deviations[*d as usize]))),
        );
        o.counter("telemark_int_events_total", "Events handed to the export queue.", &[])
            .value(c(&|w| w.counts.events));
        o.counter("telemark_int_quiet_total", "Reports whose flow's detector did not fire.", &[])
            .value(c(&|w| w.counts.quiet));
        let per_node = |f: &dyn Fn(&NodeSeq) -> u64| -> Vec<([String; 2], u64)> {
            match self.shared.sequences.lock() {
                Ok(seqs) => seqs
                    .nodes()
                    .map(|((node, hw), n)| ([node.to_string(), hw.to_string()], f(n)))
                    .collect(),
                Err(_) => Vec::new(),
            }
        };
        o.counter("telemark_int_reports_lost_total", "Report datagrams lost between a node and this collector: sequence numbers the 1,024-wide window moved past unseen (a node's gap is counted here only after 1,024 later numbers arrive; until then it is in telemark_int_reports_missing).", &["node", "hw_id"]).samples(per_node(&|n| n.lost));
        o.gauge(
            "telemark_int_reports_missing",
            "Sequence numbers inside the window not arrived yet (lost unless they still come).",
            &["node", "hw_id"],
        )
        .samples(per_node(&NodeSeq::missing));
        o.counter(
            "telemark_int_node_datagrams_total",
            "Report datagrams received per reporting node (each sequence number once).",
            &["node", "hw_id"],
        )
        .samples(per_node(&|n| n.received));
        o.counter(
            "telemark_int_duplicates_total",
            "Datagrams whose sequence number was seen already.",
            &["node", "hw_id"],
        )
        .samples(per_node(&|n| n.duplicates));
        o.counter(
            "telemark_int_late_total",
            "Datagrams that came after their sequence number was counted lost.",
            &["node", "hw_id"],
        )
        .samples(per_node(&|n| n.late));
        o.counter(
            "telemark_int_sequence_restarts_total",
            "Times a node started counting again (a restart).",
            &["node", "hw_id"],
        )
        .samples(per_node(&|n| n.restarts));
        o.counter("telemark_int_sequence_jumps_total", "Jumps ahead of more than max_seq_gap numbers: not counted as lost reports, the window starts again.", &["node", "hw_id"]).samples(per_node(&|n| n.jumps));
        let (nodes, refused, evicted) = match self.shared.sequences.lock() {
            Ok(s) => (s.nodes().count() as u64, s.untracked, s.evicted),
            Err(_) => (0, 0, 0),
        };
        o.gauge(
            "telemark_int_nodes",
            "(node, hardware ID) pairs whose sequence numbers are followed (at most max_nodes).",
            &[],
        )
        .value(nodes);
        o.counter("telemark_int_nodes_refused_total", "Datagrams of new nodes not followed: the node table was full and no node in it idle for node_idle.", &[]).value(refused);
        o.counter(
            "telemark_int_nodes_evicted_total",
            "Nodes dropped from a full table for a new one, after being silent for node_idle.",
            &[],
        )
        .value(evicted);
        o.counter(
            "telemark_int_socket_drops_total",
            "Datagrams the kernel dropped for a full socket buffer (SO_RXQ_OVFL).",
            &[],
        )
        .value(c(&|w| w.kernel_drops));
        o.counter("telemark_int_truncated_total", "Datagrams longer than 9216 bytes, cut.", &[])
            .value(c(&|w| w.truncated));
        o.gauge("telemark_int_flows", "Flows with detector state.", &[]).value(c(&|w| w.flows));
        o.gauge(
            "telemark_int_detector_states",
            "Detector states held, one per flow and rule that covers it.",
            &[],
        )
        .value(c(&|w| w.states));
        o.counter(
            "telemark_int_flows_evicted_total",
            "Detector states (a flow's, for one rule) pushed out of a full table.",
            &[],
        )
        .value(c(&|w| w.evicted));
        let s = &self.shared;
        o.counter(
            "telemark_int_queue_dropped_total",
            "Events dropped because a worker's export ring was full.",
            &[],
        )
        .value(s.ring_dropped.load(Ordering::Relaxed));
        o.counter("telemark_int_exported_total", "Events the collector acknowledged.", &[])
            .value(s.exported.load(Ordering::Relaxed));
        o.counter(
            "telemark_int_export_dropped_total",
            "Events dropped because the export buffer was full (collector away).",
            &[],
        )
        .value(s.export_dropped.load(Ordering::Relaxed));
        o.counter(
            "telemark_int_export_failures_total",
            "Failed deliveries to the collector (retried).",
            &[],
        )
        .value(s.export_failures.load(Ordering::Relaxed));
        o.gauge("telemark_int_export_pending", "Events waiting for the collector.", &[])
            .value(s.export_pending.load(Ordering::Relaxed));
        let ctl = &self.control;
        o.gauge("telemark_int_detector_rules", "Detector rules in force.", &[])
            .value(ctl.rule_count() as u64);
        o.counter(
            "telemark_int_detector_changes_total",
            "Times the control API replaced the detector rules (every flow's state started again).",
            &[],
        )
        .value(ctl.changes());
        o.counter("telemark_int_detector_changes_refused_total", "PUT /api/v1/detectors refused, by reason: no or a wrong control token, or a body that does not check (nothing changed).", &["reason"]).samples(Refused::ALL.iter().map(|r| ([r.name()], ctl.refused(*r))));
        self.transport.render("telemark_int", &mut o);
        o.response()
    }
}
