//! The agent's `/metrics` (docs/agent.md, "Metrics"): its health as Prometheus counters, read
//! from what the fast path and the aggregator publish (no lock on the fast path: it publishes
//! ten times a second into a mutex only this page and the aggregator read).
//!
//! The [`Listener`] serves this page and, on the same socket, the control API
//! ([`crate::control`]).

use crate::control::{Control, INT, WATCH};
use crate::shared::{AgentStats, PointTable, Shared};
use std::sync::Arc;
use telemark_core::loss::PointSpec;
use telemark_transport::http::{Handler, Request, Response};
use telemark_transport::metrics::Exposition;
use telemark_transport::server::ServerStats;

/// The listener: `/metrics`, and the control API (`/api/v1/int`, `/api/v1/watch`) when a
/// control token is configured.
pub(crate) struct Listener {
    pub(crate) metrics: AgentMetrics,
    pub(crate) control: Control,
}

impl Handler for Listener {
    fn handle(&self, req: &Request<'_>, _now: u64) -> Response {
        if let Err(r) = self.access(req.method, req.path(), req.token) {
            return r;
        }
        match (req.method, req.path()) {
            ("GET", "/metrics") => self.metrics.render(&self.metrics.shared.snapshot()),
            (_, _) => self.control.handle(req),
        }
    }

    fn admit(&self, method: &str, path: &str, token: Option<&str>) -> Option<Response> {
        self.access(method, path, token).err()
    }

    fn route(&self, path: &str) -> &'static str {
        match path {
            "/metrics" => "/metrics",
            INT => INT,
            WATCH => WATCH,
            _ => "other",
        }
    }
}

impl Listener {
    /// Whether a request may be made, from its method, path and token alone: the listener's
    /// access rules, each path's from its owner. The server asks this before it reads a body
    /// (so a local user without the control token cannot hold the listener's body budget),
    /// and [`Handler::handle`] asks again.
    fn access(&self, method: &str, path: &str, token: Option<&str>) -> Result<(), Response> {
        match path {
            "/metrics" => self.metrics.access(method, token),
            INT | WATCH => self.control.access(method, token),
            p => Err(Response::error(
                404,
                format!("no such endpoint: {p} (the agent serves /metrics)"),
            )),
        }
    }
}

/// The `/metrics` page.
pub(crate) struct AgentMetrics {
    pub(crate) agent: String,
    pub(crate) shared: Arc<Shared>,
    pub(crate) points: Vec<PointSpec>,
    /// Port names in the fast path's order.
    pub(crate) ports: Vec<String>,
    /// The token scrapers must send, when set.
    pub(crate) token: Option<String>,
    pub(crate) transport: Arc<ServerStats>,
}

impl AgentMetrics {
    /// Whether a request to `/metrics` may be made: `GET`, with the scrape token when one is
    /// set.
    fn access(&self, method: &str, token: Option<&str>) -> Result<(), Response> {
        match method {
            _ if !self.authorised(token) => Err(Response::unauthenticated()),
            "GET" => Ok(()),
            _ => Err(Response::error(405, "only GET is allowed on /metrics")),
        }
    }

    fn authorised(&self, token: Option<&str>) -> bool {
        match (&self.token, token) {
            (None, _) => true,
            (Some(want), Some(got)) => telemark_transport::http::token_eq(want, got),
            (Some(_), None) => false,
        }
    }

    /// The eBPF datapath's kernel counters, programs and drop reasons (docs/ebpf.md,
    /// "Metrics").
    fn render_ebpf(&self, o: &mut Exposition, e: &crate::shared::EbpfStats) {
        o.counter(
            "telemark_agent_ebpf_kernel_total",
            "The eBPF programs' counters (docs/ebpf.md lists what each means).",
            &["counter"],
        )
        .samples(e.kernel.iter().map(|(name, v)| ([*name], *v)));
        o.counter(
            "telemark_agent_ebpf_program_runs_total",
            "Runs of each program (0 unless kernel.bpf_stats_enabled = 1).",
            &["program"],
        )
        .samples(e.programs.iter().map(|c| ([c.program], c.runs)));
        o.counter(
            "telemark_agent_ebpf_program_seconds_total",
            "Time in each program; divided by its runs, the cost per packet (0 unless \
             kernel.bpf_stats_enabled = 1).",
            &["program"],
        )
        .samples(e.programs.iter().map(|c| ([c.program], c.run_ns as f64 / 1e9)));
        o.gauge("telemark_agent_ebpf_interfaces", "Interfaces the programs are attached to.", &[])
            .value(e.attached);
        let drops = self.shared.kernel_drops.lock().map(|d| d.clone()).unwrap_or_default();
        o.counter(
            "telemark_agent_kernel_drops_total",
            "Packets the kernel dropped, by drop reason, on any interface (skb:kfree_skb).",
            &["reason"],
        )
        .samples(drops.iter().map(|(r, n)| ([r.as_str()], *n)));
    }

    fn render(&self, s: &AgentStats) -> Response {
        let mut o = Exposition::default();
        o.with_label("agent", &self.agent);
        o.gauge("telemark_agent_build_info", "The agent's version.", &["version"])
            .sample(&[env!("CARGO_PKG_VERSION")], 1u64);
        let p = &s.path;
        o.counter("telemark_agent_rx_frames_total", "Frames read from the receive rings.", &[])
            .value(p.rx);
        o.counter("telemark_agent_tx_frames_total", "Frames queued on the transmit rings.", &[])
            .value(p.tx);
        o.counter(
            "telemark_agent_rx_ring_drops_total",
            "Frames the kernel dropped because a receive ring was full: the host's own loss.",
            &["port"],
        )
        .samples(self.ports.iter().zip(&p.rx_ring_drops_by_port).map(|(port, v)| ([port], *v)));
        o.counter(
            "telemark_agent_tx_drops_total",
            "Frames not sent: a transmit ring full, a frame too big, or refused.",
            &[],
        )
        .value(p.tx_drops);
        o.counter(
            "telemark_agent_events_lost_total",
            "Batch events the fast path could not hand to the aggregator.",
            &[],
        )
        .value(p.event_drops);
        o.counter(
            "telemark_agent_packets_skipped_total",
            "Packets without a flow key (not IP, fragments, malformed).",
            &[],
        )
        .value(p.skipped);
        o.counter(
            "telemark_agent_packets_unwatched_total",
            "Packets of flows outside the watch rules.",
            &[],
        )
        .value(p.unwatched);
        o.counter(
            "telemark_agent_stage_busy_seconds_total",
            "Time each stage spent on packets; divided by rx_frames_total, the cost per packet.",
            &["stage"],
        )
        .samples(p.stages().into_iter().map(|(stage, ns)| ([stage], ns as f64 / 1e9)));
        let ebpf_points = p.ebpf.as_ref().map(|e| e.points.as_slice()).unwrap_or_default();
        let point = |pt: u8| {
            let i = usize::from(pt);
            match (self.points.get(i), ebpf_points.get(i)) {
                (Some(s), _) => [s.name.as_str(), s.port.as_str()],
                (None, Some((name, port))) => [name.as_str(), port.as_str()],
                (None, None) => ["?", "?"],
            }
        };
        let per_point = |f: &dyn Fn(&PointTable) -> u64| {
            p.points.iter().map(|x| (point(x.point), f(x))).collect::<Vec<_>>()
        };
        o.counter(
            "telemark_agent_point_packets_refused_total",
            "Packets of flows a point's full table had no room for (not measured there).",
            &["point", "port"],
        )
        .samples(per_point(&|x| x.stats.refused));
        o.counter(
            "telemark_agent_point_flows_admitted_total",
            "Flows a point's table admitted.",
            &["point", "port"],
        )
        .samples(per_point(&|x| x.stats.admitted));
        o.counter(
            "telemark_agent_point_flows_evicted_total",
            "Flows a point's table retired.",
            &["point", "port"],
        )
        .samples(per_point(&|x| x.stats.evicted));
        o.counter(
            "telemark_agent_point_batches_total",
            "Batches a point closed.",
            &["point", "port"],
        )
        .samples(per_point(&|x| x.stats.batches));
        o.gauge(
            "telemark_agent_point_flows",
            "Flows a point's table holds now.",
            &["point", "port"],
        )
        .samples(per_point(&|x| x.flows));
        o.gauge(
            "telemark_agent_point_flows_capacity",
            "Flows a point's table can hold.",
            &["point", "port"],
        )
        .samples(per_point(&|x| x.capacity));
        let e = &s.export;
        o.counter("telemark_agent_records_total", "Loss records the aggregator produced.", &[])
            .value(e.records);
        o.counter(
            "telemark_agent_export_acked_records_total",
            "Records the collector acknowledged.",
            &[],
        )
        .value(e.exported);
        o.counter(
            "telemark_agent_export_dropped_records_total",
            "Records the export buffer had no room for.",
            &[],
        )
        .value(e.export_drops);
        o.gauge(
            "telemark_agent_export_pending_records",
            "Records waiting for the collector's acknowledgement.",
            &[],
        )
        .value(e.export_pending);
        o.counter(
            "telemark_agent_export_failures_total",
            "Export attempts that failed (retried).",
            &[],
        )
        .value(e.export_failures);
        if let Some(i) = &p.int {
            let r = &i.roles;
            for (name, help, v) in [
                ("sourced", "Packets a source inserted INT into.", r.sourced),
                ("pushed", "Packets a transit pushed metadata onto.", r.pushed),
                ("stripped", "Packets a sink stripped INT from.", r.stripped),
                (
                    "hop_count_exceeded",
                    "INT packets with no hops left (E set).",
                    r.hop_count_exceeded,
                ),
                ("mtu_exceeded", "INT not added because of the MTU (M set).", r.mtu_exceeded),
                ("malformed", "INT that did not parse, left as it was.", r.malformed),
                ("events", "Events the sink's detectors raised.", r.events),
                ("reports", "Telemetry Reports the sink sent.", r.reports),
                ("event_drops", "Events lost to a full event ring.", i.event_drops),
                ("report_errors", "Reports the socket refused.", i.report_errors),
            ] {
                o.counter(&format!("telemark_agent_int_{name}_total"), help, &[]).value(v);
            }
        }
        if !p.queues.is_empty() {
            let per_queue = |f: &dyn Fn(&telemark_datapath::queue::QueueStats) -> u64| {
                p.queues
                    .iter()
                    .map(|(port, q)| {
                        let name = self.ports.get(*port).map_or("?", String::as_str);
                        ([name], f(q))
                    })
                    .collect::<Vec<_>>()
            };
            o.counter(
                "telemark_agent_queue_enqueued_total",
                "Frames that joined an egress queue.",
                &["port"],
            )
            .samples(per_queue(&|q| q.enqueued));
            o.counter(
                "telemark_agent_queue_dropped_total",
                "Frames an egress queue dropped because it was full (drop-tail).",
                &["port"],
            )
            .samples(per_queue(&|q| q.dropped));
            o.gauge(
                "telemark_agent_queue_backlog_bytes",
                "Bytes an egress queue holds now.",
                &["port"],
            )
            .samples(per_queue(&|q| q.backlog_bytes));
            o.gauge(
                "telemark_agent_queue_max_backlog_bytes",
                "The most bytes an egress queue has held.",
                &["port"],
            )
            .samples(per_queue(&|q| q.max_backlog_bytes));
        }
        if let Some(m) = &p.meter {
            let f = &s.flow_export;
            for (name, help, v) in [
                ("sflow_samples", "Packets sFlow sampled.", m.sflow_samples),
                (
                    "sflow_samples_dropped",
                    "Samples dropped on the way to the exporter (ring full).",
                    m.sflow_drops,
                ),
                (
                    "sflow_datagrams",
                    "sFlow datagrams sent (each collector's counted).",
                    f.sflow_datagrams,
                ),
                ("ipfix_cache_packets", "Packets the IPFIX flow cache counted.", m.cache.packets),
                ("ipfix_cache_flows_created", "Flows the IPFIX cache created.", m.cache.created),
                (
                    "ipfix_cache_evictions",
                    "Flows pushed out of a full IPFIX cache (reason lackOfResources).",
                    m.cache.evicted,
                ),
                (
                    "ipfix_cache_records_dropped",
                    "Flow records dropped on the way to the exporter (ring full).",
                    m.ipfix_drops,
                ),
                (
                    "ipfix_messages",
                    "IPFIX messages sent (each collector's counted).",
                    f.ipfix_messages,
                ),
                ("ipfix_flow_records", "IPFIX flow records sent.", f.ipfix_flow_records),
                (
                    "ipfix_loss_records",
                    "IPFIX loss records sent (Telemark's enterprise elements).",
                    f.ipfix_loss_records,
                ),
                (
                    "ipfix_records_not_sent",
                    "IPFIX records not sent: collector unreachable, send failed, queue full.",
                    f.ipfix_not_sent + f.ipfix_loss_queue_full,
                ),
                (
                    "flow_send_errors",
                    "sFlow datagrams and IPFIX messages whose send failed.",
                    f.flow_send_errors,
                ),
            ] {
                o.counter(&format!("telemark_agent_{name}_total"), help, &[]).value(v);
            }
            o.gauge("telemark_agent_ipfix_cache_flows", "Flows the IPFIX cache holds now.", &[])
                .value(m.cache_flows);
        }
        if let Some(h) = &p.hh {
            for (name, help, v) in [
                ("hh_windows", "Heavy-hitter windows closed (per port).", h.windows),
                (
                    "hh_windows_incomplete",
                    "Windows whose IBLT could not list every heavy flow.",
                    h.incomplete,
                ),
                ("hh_flows", "Heavy flows reported.", h.flows),
                (
                    "hh_windows_dropped",
                    "Windows dropped on the way to the aggregator (ring full).",
                    h.drops,
                ),
            ] {
                o.counter(&format!("telemark_agent_{name}_total"), help, &[]).value(v);
            }
        }
        if let Some(e) = &p.ebpf {
            self.render_ebpf(&mut o, e);
        }
        self.transport.render("telemark_agent", &mut o);
        o.response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::{Duration, Instant};
    use telemark_transport::server::{Limits, Server, ServerConfig};

    const CONTROL: &str = "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0";

    /// The status of one request sent whole on a new connection, and how long its answer took.
    fn request(addr: SocketAddr, head: &str, body: &str) -> (u16, Duration) {
        let t = Instant::now();
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let req =
            format!("{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        s.write_all(req.as_bytes()).unwrap();
        let mut status = [0u8; 12];
        match s.read_exact(&mut status) {
            Ok(()) => (String::from_utf8_lossy(&status[9..]).parse().unwrap_or(0), t.elapsed()),
            Err(_) => (0, t.elapsed()),
        }
    }

    /// The attack that worked before: 8 local sockets without the control token, each
    /// announcing a 64 KiB `PUT /api/v1/int` and sending a byte every 2 s, took the listener's
    /// whole body budget, and the controller's `PUT` timed out. Now they are refused (401) from
    /// their head, counted, and the controller's requests are answered at once.
    #[test]
    fn slow_bodies_without_the_control_token_do_not_hold_the_controller() {
        let transport = Arc::new(ServerStats::default());
        let shared = Arc::new(Shared::default());
        let handler = Arc::new(Listener {
            metrics: AgentMetrics {
                agent: "sw".into(),
                shared: shared.clone(),
                points: Vec::new(),
                ports: Vec::new(),
                token: None,
                transport: transport.clone(),
            },
            control: Control { shared, token: Some(CONTROL.into()), int: true, watch: true },
        });
        // As agent.rs starts it.
        let cfg = ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            tls: None,
            limits: Limits { max_body: 64 * 1024, max_connections: 64, ..Limits::default() },
            workers: 1,
        };
        let server = Server::start(cfg, handler, transport.clone()).unwrap();
        let addr = server.addr;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let slow: Vec<_> = (0..8)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    let head =
                        "PUT /api/v1/int HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n";
                    s.write_all(head.as_bytes()).unwrap();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if s.write_all(b" ").is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_secs(2));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let mut took = Vec::new();
        for _ in 0..10 {
            let head = format!(
                "PUT /api/v1/int HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CONTROL}\r\n"
            );
            let (status, t) = request(addr, &head, "{}");
            assert_eq!(status, 200, "the controller's PUT after {t:?}");
            took.push(t);
            std::thread::sleep(Duration::from_millis(300));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        took.sort();
        eprintln!(
            "8 slow 64 KiB bodies without a token: 10 authenticated PUTs, median {:.2} ms, worst \
             {:.2} ms",
            took[5].as_secs_f64() * 1e3,
            took[9].as_secs_f64() * 1e3
        );
        assert!(took[9] < Duration::from_secs(1), "worst {:?}", took[9]);
        assert_eq!(transport.refused("unauthenticated"), 8);
        for h in slow {
            h.join().unwrap();
        }
    }
}
