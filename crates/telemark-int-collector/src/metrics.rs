//! The collector's listener: Prometheus `/metrics` of everything the workers and the exporter
//! saw, and the control API (`/api/v1/detectors`) when a control token is configured.

use crate::control::{Control, Refused};
use crate::service::{Shared, WorkerStats};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use telemark_core::int::collect::Refusal;
use telemark_core::int::sequence::NodeSeq;
use telemark_transport::http::{Handler, Request, Response};
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
            ("GET", "/metrics") => Response::text("text/plain; version=0.0.4", self.render()),
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

    fn render(&self) -> String {
        let ws = self.shared.workers.lock().map(|w| w.clone()).unwrap_or_default();
        let mut o = String::new();
        let c = |f: &dyn Fn(&WorkerStats) -> u64| ws.iter().map(f).sum::<u64>();
        let l = format!("collector=\"{}\"", self.name);
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(o, "{name}{{{l}{labels}}} {v}");
            }
        };
        let one = |v: u64| vec![(String::new(), v)];
        let by_path = |p: &str| ws.iter().filter(|w| w.path == p).map(|w| w.counts.datagrams).sum();
        family(
            "telemark_int_datagrams_total",
            "counter",
            "Report datagrams received, by receive path (udp socket or AF_XDP).",
            vec![
                (",path=\"udp\"".into(), by_path("udp")),
                (",path=\"xdp\"".into(), by_path("xdp")),
            ],
        );
        family(
            "telemark_int_reports_total",
            "counter",
            "Individual reports read.",
            one(c(&|w| w.counts.reports)),
        );
        family(
            "telemark_int_refused_total",
            "counter",
            "Datagrams or reports not read, by reason.",
            Refusal::ALL
                .iter()
                .map(|r| {
                    (format!(",reason=\"{}\"", r.name()), c(&|w| w.counts.refused[*r as usize]))
                })
                .collect(),
        );
        family(
            "telemark_int_deviations_total",
            "counter",
            "Reports read although they break a rule of the specifications, by rule.",
            Deviation::ALL
                .iter()
                .map(|d| {
                    (format!(",rule=\"{}\"", d.name()), c(&|w| w.counts.deviations[*d as usize]))
                })
                .collect(),
        );
        family(
            "telemark_int_events_total",
            "counter",
            "Events handed to the export queue.",
            one(c(&|w| w.counts.events)),
        );
        family(
            "telemark_int_quiet_total",
            "counter",
            "Reports whose flow's detector did not fire.",
            one(c(&|w| w.counts.quiet)),
        );
        let per_node = |f: &dyn Fn(&NodeSeq) -> u64| -> Vec<(String, u64)> {
            match self.shared.sequences.lock() {
                Ok(seqs) => seqs
                    .nodes()
                    .map(|((node, hw), n)| (format!(",node=\"{node}\",hw_id=\"{hw}\""), f(n)))
                    .collect(),
                Err(_) => Vec::new(),
            }
        };
        family("telemark_int_reports_lost_total", "counter", "Report datagrams lost between a node and this collector: sequence numbers the 1,024-wide window moved past unseen (a node's gap is counted here only after 1,024 later numbers arrive; until then it is in telemark_int_reports_missing).", per_node(&|n| n.lost));
        family(
            "telemark_int_reports_missing",
            "gauge",
            "Sequence numbers inside the window not arrived yet (lost unless they still come).",
            per_node(&NodeSeq::missing),
        );
        family(
            "telemark_int_node_datagrams_total",
            "counter",
            "Report datagrams received per reporting node (each sequence number once).",
            per_node(&|n| n.received),
        );
        family(
            "telemark_int_duplicates_total",
            "counter",
            "Datagrams whose sequence number was seen already.",
            per_node(&|n| n.duplicates),
        );
        family(
            "telemark_int_late_total",
            "counter",
            "Datagrams that came after their sequence number was counted lost.",
            per_node(&|n| n.late),
        );
        family(
            "telemark_int_sequence_restarts_total",
            "counter",
            "Times a node started counting again (a restart).",
            per_node(&|n| n.restarts),
        );
        family(
            "telemark_int_sequence_jumps_total",
            "counter",
            "Jumps ahead of more than max_seq_gap numbers: not counted as lost reports, the window starts again.",
            per_node(&|n| n.jumps),
        );
        let (nodes, refused, evicted) = match self.shared.sequences.lock() {
            Ok(s) => (s.nodes().count() as u64, s.untracked, s.evicted),
            Err(_) => (0, 0, 0),
        };
        family(
            "telemark_int_nodes",
            "gauge",
            "(node, hardware ID) pairs whose sequence numbers are followed (at most max_nodes).",
            one(nodes),
        );
        family(
            "telemark_int_nodes_refused_total",
            "counter",
            "Datagrams of new nodes not followed: the node table was full and no node in it idle for node_idle.",
            one(refused),
        );
        family(
            "telemark_int_nodes_evicted_total",
            "counter",
            "Nodes dropped from a full table for a new one, after being silent for node_idle.",
            one(evicted),
        );
        family(
            "telemark_int_socket_drops_total",
            "counter",
            "Datagrams the kernel dropped for a full socket buffer (SO_RXQ_OVFL).",
            one(c(&|w| w.kernel_drops)),
        );
        family(
            "telemark_int_truncated_total",
            "counter",
            "Datagrams longer than 9216 bytes, cut.",
            one(c(&|w| w.truncated)),
        );
        family("telemark_int_flows", "gauge", "Flows with detector state.", one(c(&|w| w.flows)));
        family(
            "telemark_int_detector_states",
            "gauge",
            "Detector states held, one per flow and rule that covers it.",
            one(c(&|w| w.states)),
        );
        family(
            "telemark_int_flows_evicted_total",
            "counter",
            "Detector states (a flow's, for one rule) pushed out of a full table.",
            one(c(&|w| w.evicted)),
        );
        let s = &self.shared;
        family(
            "telemark_int_queue_dropped_total",
            "counter",
            "Events dropped because a worker's export ring was full.",
            one(s.ring_dropped.load(Ordering::Relaxed)),
        );
        family(
            "telemark_int_exported_total",
            "counter",
            "Events the collector acknowledged.",
            one(s.exported.load(Ordering::Relaxed)),
        );
        family(
            "telemark_int_export_dropped_total",
            "counter",
            "Events dropped because the export buffer was full (collector away).",
            one(s.export_dropped.load(Ordering::Relaxed)),
        );
        family(
            "telemark_int_export_failures_total",
            "counter",
            "Failed deliveries to the collector (retried).",
            one(s.export_failures.load(Ordering::Relaxed)),
        );
        family(
            "telemark_int_export_pending",
            "gauge",
            "Events waiting for the collector.",
            one(s.export_pending.load(Ordering::Relaxed)),
        );
        let ctl = &self.control;
        family(
            "telemark_int_detector_rules",
            "gauge",
            "Detector rules in force.",
            one(ctl.rule_count() as u64),
        );
        family(
            "telemark_int_detector_changes_total",
            "counter",
            "Times the control API replaced the detector rules (every flow's state started again).",
            one(ctl.changes()),
        );
        family(
            "telemark_int_detector_changes_refused_total",
            "counter",
            "PUT /api/v1/detectors refused, by reason: no or a wrong control token, or a body that does not check (nothing changed).",
            Refused::ALL.iter().map(|r| (format!(",reason=\"{}\"", r.name()), ctl.refused(*r))).collect(),
        );
        self.transport.render("telemark_int", &mut o);
        o
    }
}
