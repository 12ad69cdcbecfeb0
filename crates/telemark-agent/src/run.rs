//! The running agent: one fast-path thread that owns the ports and the switches, one
//! aggregator thread that owns the aggregator and the exporter (DESIGN.md, "Data flow").
//!
//! ```text
//!  RX ring ─► copy into burst ─► Switch (mark, ingress point, forward, egress point) ─► Egress
//!                                   │ batch events (SPSC ring; full: counted, never waited on)
//!                                   ▼
//!                               aggregator ─► loss / summary / cost records ─► Exporter ─► collector
//! ```
//!
//! Egress (egress.rs) puts frames onto the output port's TX ring, through the port's rate-
//! limited queue where one is configured and the flow's INT role where `[int]` is; INT events
//! reach the aggregator thread through their own ring and leave as `event` records.
//!
//! With `[sflow]` or `[ipfix]`, the fast path's flow meter samples and caches what the switch
//! forwarded, and a third thread (flow_export.rs) encodes and sends it, the aggregator's loss
//! records as IPFIX too.
//!
//! With `[heavy_hitters]`, SFCMon's pipeline counts every packet a port receives; at each
//! window's end the fast path lists it and the aggregator turns its heavy flows into `flow`
//! records.
//!
//! The fast path sleeps in `poll` only when every RX ring is empty; it never waits on the
//! aggregator or the collector. What it cannot hand over (a full event ring, a full TX ring, a
//! full RX ring in the kernel) is counted and exported as the agent's health.

use crate::config::{AgentConfig, IntRules, MarkSide};
use crate::egress::{Egress, IntStage, IntStats, RuledEvent};
use crate::flow_export::{self, FlowExportStats, PortInfo};
use crate::kafka_out::KafkaOut;
use crate::metrics::AgentMetrics;
use serde::Serialize;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use telemark_core::flow_hash;
use telemark_core::int::Detectors;
use telemark_core::loss::{color_of, Aggregator, AnyColorTable, BatchEvent, PointSpec, PointStats};
use telemark_core::records::{
    CostRecord, FlowRecord, HealthRecord, HhWindowHealth, PointHealth, Record,
};
use telemark_core::spsc::{self, Consumer};
use telemark_datapath::afpacket::{self, RingConfig, RxRing};
use telemark_datapath::events::RingSink;
use telemark_datapath::flow_meter::{FlowMeter, MeterStats, PortCounters};
use telemark_datapath::heavy_hitters::{HeavyHitters, HhStats, PortWindow};
use telemark_datapath::int_roles::IntRoles;
use telemark_datapath::queue::{EgressQueue, QueueStats};
use telemark_datapath::switch::{Action, Switch, SwitchConfig, SwitchStats, Tx, BURST};
use telemark_datapath::Pkt;
use telemark_transport::exporter::Exporter;
use telemark_transport::now_ns;
use telemark_transport::server::{Limits, Server, ServerConfig, ServerStats};
use telemark_wire::flow::{self, LinkType};
use telemark_wire::int_frame;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A port could not be opened.
    #[error("{0}")]
    Port(std::io::Error),
    /// A thread could not be started.
    #[error("cannot start thread: {0}")]
    Thread(std::io::Error),
    /// The `/metrics` listener could not start.
    #[error("metrics listener: {0}")]
    Metrics(telemark_transport::server::ServerError),
    /// The INT report socket could not be opened.
    #[error("int.report_to: {0}")]
    Report(std::io::Error),
}

/// Counters of the fast path, published by it ten times a second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PathStats {
    /// Frames read from all RX rings.
    pub rx: u64,
    /// Frames queued on TX rings.
    pub tx: u64,
    /// Frames the kernel dropped because an RX ring was full.
    pub rx_ring_drops: u64,
    /// Frames not sent because a TX ring was full (or too big, or refused by the kernel).
    pub tx_drops: u64,
    /// Frames cut short by an RX ring.
    pub rx_truncated: u64,
    /// Packets the switches skipped (no flow key: not IP, fragments, malformed).
    pub skipped: u64,
    /// Packets of flows outside the watch rules.
    pub unwatched: u64,
    /// Flows learned.
    pub learned: u64,
    /// Learned flows retired when idle.
    pub unlearned: u64,
    /// Batch events lost because the event ring was full.
    pub event_drops: u64,
    /// Nanoseconds the fast path spent on packets (not waiting).
    pub busy_ns: u64,
    /// Of `rx_ring_drops`, each port's (ports in configuration order).
    #[serde(skip)]
    pub rx_ring_drops_by_port: Vec<u64>,
    /// Each observation point's table: point number, counters, flows held, capacity.
    #[serde(skip)]
    pub points: Vec<(u8, PointStats, u64, u64)>,
    /// The INT stage's counters, when INT is configured.
    #[serde(skip)]
    pub int: Option<IntStats>,
    /// Each egress queue's port number and counters.
    #[serde(skip)]
    pub queues: Vec<(usize, QueueStats)>,
    /// The flow meter's counters, with `[sflow]` or `[ipfix]`.
    #[serde(skip)]
    pub meter: Option<MeterStats>,
    /// The heavy-hitter stage's counters, with `[heavy_hitters]`.
    #[serde(skip)]
    pub hh: Option<HhStats>,
}

impl PathStats {
    /// The fast path's busy time so far per stage, in nanoseconds: the flow meter's (with
    /// `[sflow]` or `[ipfix]`) and the heavy hitters' (with `[heavy_hitters]`) are stages of
    /// their own, timed per burst; `switch` is the rest. The `cost` records and `/metrics`
    /// both report these.
    pub fn stages(&self) -> Vec<(&'static str, u64)> {
        let meter = self.meter.as_ref().map(|m| m.busy_ns.min(self.busy_ns));
        let rest = self.busy_ns - meter.unwrap_or(0);
        let hh = self.hh.as_ref().map(|h| h.busy_ns.min(rest));
        let mut v = vec![("switch", rest - hh.unwrap_or(0))];
        v.extend(meter.map(|ns| ("flow_meter", ns)));
        v.extend(hh.map(|ns| ("heavy_hitters", ns)));
        v
    }
}

/// Counters of the aggregator and exporter.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExportStats {
    /// Loss records the aggregator produced.
    pub records: u64,
    /// Records the collector acknowledged.
    pub exported: u64,
    /// Records dropped because the export buffer was full.
    pub export_drops: u64,
    /// Records waiting for an acknowledgement.
    pub export_pending: u64,
    /// Failed export attempts.
    pub export_failures: u64,
}

/// Counters of the running agent (one flat JSON object).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AgentStats {
    /// The fast path's.
    #[serde(flatten)]
    pub path: PathStats,
    /// The aggregator's and exporter's.
    #[serde(flatten)]
    pub export: ExportStats,
    /// The sFlow and IPFIX exporter's.
    #[serde(flatten)]
    pub flow_export: FlowExportStats,
}

/// Where each thread publishes its counters; each writes only its own.
#[derive(Default)]
pub(crate) struct Shared {
    path: Mutex<PathStats>,
    export: Mutex<ExportStats>,
    /// Watch rules a reload gave, for the fast path to take (it looks ten times a second).
    new_watch: Mutex<Option<telemark_core::watch::Watch>>,
    /// Export settings a reload gave, for the aggregator thread to take.
    new_export: Mutex<Option<AgentConfig>>,
    /// The INT rules: in force, and new ones for the fast path to take.
    int: Mutex<IntMailbox>,
    /// The flow-export thread's counters.
    pub(crate) flow_export: Mutex<FlowExportStats>,
}

/// INT rules in force (what `GET /api/v1/int` shows) and those the fast path is to take next,
/// with their detector table built already (off the fast path: it may be megabytes), under
/// one lock so that the two never disagree.
#[derive(Default)]
struct IntMailbox {
    in_force: Option<IntRules>,
    pending: Option<(IntRules, Detectors)>,
    /// Flows the detector table holds.
    flows: usize,
}

impl Shared {
    /// Puts new INT rules in force (the fast path takes them within 100 ms); whether they
    /// differ from those in force (rules that do not are not applied again).
    pub(crate) fn set_int_rules(&self, rules: IntRules) -> bool {
        let lock = || self.int.lock().unwrap_or_else(|p| p.into_inner());
        let flows = {
            let m = lock();
            if m.in_force.as_ref() == Some(&rules) {
                return false;
            }
            m.flows
        };
        let table = Detectors::new(rules.detect.clone(), flows);
        let mut m = lock();
        m.in_force = Some(rules.clone());
        m.pending = Some((rules, table));
        true
    }

    /// The INT rules in force.
    pub(crate) fn int_rules(&self) -> Option<IntRules> {
        self.int.lock().unwrap_or_else(|p| p.into_inner()).in_force.clone()
    }

    /// Every thread's counters as last published.
    pub(crate) fn snapshot(&self) -> AgentStats {
        AgentStats {
            path: self.path.lock().map(|s| s.clone()).unwrap_or_default(),
            export: self.export.lock().map(|s| s.clone()).unwrap_or_default(),
            flow_export: self.flow_export.lock().map(|s| s.clone()).unwrap_or_default(),
        }
    }

    /// Each port's counters as the flow meter last published them.
    pub(crate) fn meter_ports(&self) -> Vec<PortCounters> {
        let p = self.path.lock().unwrap_or_else(|p| p.into_inner());
        p.meter.as_ref().map(|m| m.ports.clone()).unwrap_or_default()
    }
}

/// What processes packets arriving on one port.
enum Proc {
    /// A switch direction: forwards to the paired port.
    Switch(Box<Switch>),
    /// A tap: observes only.
    Tap(Box<AnyColorTable>, TapKeys),
}

/// How a tap reads a packet's color and key (a switch direction has them in its config).
#[derive(Clone, Copy)]
struct TapKeys {
    /// The loss monitor's DSCP bit.
    color_bit: u8,
    /// The UDP port that signals INT, if one does (`int_frame::key_as_sourced`).
    int_port: Option<u16>,
}

/// Packets a switch chose to send: (output port, index in burst).
struct Outbox(Vec<(u16, usize)>);

impl Tx for Outbox {
    fn send(&mut self, port: u16, idx: usize) -> bool {
        self.0.push((port, idx));
        true
    }
}

/// A running agent.
pub struct Agent {
    stop: Arc<AtomicBool>,
    stats: Arc<Shared>,
    metrics: Option<Server>,
    /// The configuration running now (a reload replaces what it may change).
    running: Mutex<AgentConfig>,
    fast: Option<JoinHandle<()>>,
    agg: Option<JoinHandle<()>>,
    flow_export: Option<JoinHandle<()>>,
}

/// An input port's observation points, as numbered in the aggregator.
#[derive(Debug, Clone, Copy)]
struct PortPoints {
    /// Where this agent colours the port's arriving traffic; `None`: it does not mark it.
    marker: Option<u8>,
    /// Where the port's arriving traffic is counted in (a tap's one point).
    ingress: u8,
    /// Where it is counted out, at the pair's other port; `None` for a tap.
    egress: Option<u8>,
}

/// The aggregator's points for the configuration, and each input port's points (pair ports
/// first, then taps).
fn layout(cfg: &AgentConfig) -> (Vec<PointSpec>, Vec<PortPoints>) {
    let mut pts: Vec<PointSpec> = Vec::new();
    let add = |pts: &mut Vec<PointSpec>, name: &str, port: &str, up, marker, label| {
        pts.push(PointSpec {
            name: name.into(),
            agent: cfg.agent.clone(),
            port: port.into(),
            upstream: up,
            marker,
            skew_ns: 0,
            upstream_label: label,
        });
        (pts.len() - 1) as u8
    };
    let mut per_port = Vec::new();
    for p in &cfg.pairs {
        for (inp, out, mark, label) in [
            (&p.a, &p.b, matches!(p.mark, MarkSide::A | MarkSide::Both), &p.upstream_a),
            (&p.b, &p.a, matches!(p.mark, MarkSide::B | MarkSide::Both), &p.upstream_b),
        ] {
            let m = mark.then(|| add(&mut pts, "marker", inp, None, true, None));
            let i = add(&mut pts, "ingress", inp, m, false, label.clone().filter(|_| !mark));
            let e = add(&mut pts, "egress", out, Some(i), false, None);
            per_port.push(PortPoints { marker: m, ingress: i, egress: Some(e) });
        }
    }
    for t in &cfg.taps {
        let i = add(&mut pts, "tap", &t.port, None, false, t.upstream.clone());
        per_port.push(PortPoints { marker: None, ingress: i, egress: None });
    }
    (pts, per_port)
}

impl Agent {
    /// Opens every port and starts the threads.
    pub fn start(cfg: AgentConfig) -> Result<Agent, AgentError> {
        let ring = RingConfig::default();
        // Ports in the order pair a, pair b, …, taps; a pair's ports are 2i and 2i+1.
        let names: Vec<&String> = cfg
            .pairs
            .iter()
            .flat_map(|p| [&p.a, &p.b])
            .chain(cfg.taps.iter().map(|t| &t.port))
            .collect();
        let mut rxs = Vec::new();
        let mut txs = Vec::new();
        for n in &names {
            let (r, t) = afpacket::open(n, cfg.netns.as_deref(), ring).map_err(AgentError::Port)?;
            rxs.push(r);
            txs.push(t);
        }
        let port_info: Vec<PortInfo> =
            rxs.iter().map(|r: &RxRing| PortInfo { ifindex: r.ifindex() }).collect();
        let (points, per_port) = layout(&cfg);
        let stats = Arc::new(Shared::default());
        if let Some(i) = &cfg.int {
            let mut m = stats.int.lock().unwrap_or_else(|p| p.into_inner());
            (m.in_force, m.flows) = (Some(i.rules.clone()), i.flows);
        }
        let metrics = match &cfg.metrics {
            None => None,
            Some((listen, token)) => {
                let transport = Arc::new(ServerStats::default());
                let handler = Arc::new(AgentMetrics {
                    agent: cfg.agent.clone(),
                    shared: stats.clone(),
                    points: points.clone(),
                    ports: names.iter().map(|n| n.to_string()).collect(),
                    token: token.clone(),
                    control_token: cfg.control_token.clone(),
                    transport: transport.clone(),
                });
                let max_body = if cfg.control_token.is_some() { 64 * 1024 } else { 0 };
                let scfg = ServerConfig {
                    listen: *listen,
                    tls: None,
                    limits: Limits { max_body, max_connections: 64, ..Limits::default() },
                    workers: 1,
                };
                Some(Server::start(scfg, handler, transport).map_err(AgentError::Metrics)?)
            }
        };
        let mut procs = Vec::new();
        let int_port = cfg.int.as_ref().and_then(|i| i.cfg.signal.udp_port);
        for (i, pp) in per_port.iter().enumerate() {
            if let Some(egress) = pp.egress {
                let sw = Switch::new(
                    SwitchConfig {
                        link: LinkType::Ethernet,
                        action: Action::NoAction,
                        loss: Some(cfg.loss).filter(|_| cfg.measure),
                        mark: pp.marker.is_some(),
                        default_port: (i ^ 1) as u16,
                        learn: true,
                        points: (pp.marker.unwrap_or(0), pp.ingress, egress),
                        int_port,
                    },
                    cfg.loss.table_size,
                )
                .with_watch(cfg.watch.clone());
                procs.push(Proc::Switch(Box::new(sw)));
            } else {
                procs.push(Proc::Tap(
                    Box::new(AnyColorTable::new(&cfg.loss, pp.ingress)),
                    TapKeys { color_bit: cfg.loss.color_bit, int_port },
                ));
            }
        }
        let (prod, cons) = spsc::channel::<BatchEvent>(1 << 16);
        let (int_prod, int_cons) = spsc::channel::<RuledEvent>(1 << 12);
        let int = match &cfg.int {
            None => None,
            Some(i) => {
                let report = match i.report_to {
                    None => None,
                    Some(to) => {
                        let bind: std::net::SocketAddr = if to.is_ipv4() {
                            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
                        } else {
                            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                        };
                        let s = std::net::UdpSocket::bind(bind).map_err(AgentError::Report)?;
                        s.connect(to).map_err(AgentError::Report)?;
                        s.set_nonblocking(true).map_err(AgentError::Report)?;
                        Some(s)
                    }
                };
                let roles =
                    IntRoles::new(i.cfg, i.rules.roles.clone(), i.rules.detect.clone(), i.flows);
                Some(IntStage::new(roles, int_prod, report))
            }
        };
        let queues = names
            .iter()
            .map(|n| {
                let q = cfg.queues.iter().find(|q| &&q.port == n)?;
                Some(EgressQueue::new(q.rate_bps, q.limit_bytes))
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let fast_done = Arc::new(AtomicBool::new(false));
        let (meter, flow_export, loss_tx) = if cfg.sflow.is_some() || cfg.ipfix.is_some() {
            let (meter, rings) = FlowMeter::new(
                names.len(),
                cfg.sflow.as_ref().map(|s| s.settings),
                cfg.ipfix.as_ref().map(|i| i.settings),
                now_ns(),
            );
            let (h, loss_tx) = flow_export::start(
                cfg.sflow.as_ref(),
                cfg.ipfix.as_ref(),
                rings,
                port_info,
                stats.clone(),
                fast_done.clone(),
            )
            .map_err(AgentError::Report)?;
            (Some(meter), Some(h), loss_tx)
        } else {
            (None, None, None)
        };
        let (hh, hh_windows) = match &cfg.heavy_hitters {
            Some(h) => {
                let (stage, cons) = HeavyHitters::new(&h.hh, names.len(), h.window_ns, now_ns());
                (Some(stage), Some(cons))
            }
            None => (None, None),
        };
        let fast = FastPath {
            meter,
            hh,
            points: per_port.clone(),
            rxs,
            egress: Egress::new(txs, queues, int),
            procs,
            watch: cfg.watch.clone(),
            sink: RingSink::new(prod),
            idle_check_ns: (cfg.loss.idle_ns / 4).clamp(10_000_000, 1_000_000_000),
        };
        let (s1, d1, st1) = (stop.clone(), fast_done.clone(), stats.clone());
        let fast = std::thread::Builder::new()
            .name("tm-fastpath".into())
            .spawn(move || fast.run(&s1, &d1, &st1))
            .map_err(AgentError::Thread)?;
        let batch = Some(cfg.loss.batch).filter(|_| cfg.loss.period_ns.is_none());
        let agg = Aggregator::new(points, batch, 0).report_all(cfg.report_all);
        let running = Mutex::new(cfg.clone());
        let slow = Slow {
            cfg,
            agg,
            cons,
            int_events: int_cons,
            hh_windows,
            hh_health: Vec::new(),
            last_export_dropped: 0,
            loss_tx,
        };
        let st2 = stats.clone();
        let agg = std::thread::Builder::new()
            .name("tm-aggregator".into())
            .spawn(move || slow.run(&fast_done, &st2))
            .map_err(AgentError::Thread)?;
        Ok(Agent { stop, stats, metrics, running, fast: Some(fast), agg: Some(agg), flow_export })
    }

    /// The flag that stops the agent (for a signal handler).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Current counters.
    pub fn stats(&self) -> AgentStats {
        self.stats.snapshot()
    }

    /// Takes what `new` changes of the watch rules, the export settings and the INT rules,
    /// without stopping
    /// (SIGHUP; docs/agent.md, "Reload"); returns what changed. Anything else changed (ports,
    /// loss parameters, name, the metrics listener) needs a restart, and nothing is applied.
    pub fn reload(&self, new: AgentConfig) -> Result<Vec<&'static str>, String> {
        let mut cur = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let fixed = [
            ("agent", cur.agent == new.agent),
            ("netns", cur.netns == new.netns),
            ("pair", cur.pairs == new.pairs),
            ("tap", cur.taps == new.taps),
            ("loss", cur.loss == new.loss),
            ("measure", cur.measure == new.measure),
            ("metrics", cur.metrics == new.metrics && cur.control_token == new.control_token),
            ("queue", cur.queues == new.queues),
            ("sflow", cur.sflow == new.sflow),
            ("ipfix", cur.ipfix == new.ipfix),
            ("heavy_hitters", cur.heavy_hitters == new.heavy_hitters),
            (
                "int (anything but its rules)",
                match (&cur.int, &new.int) {
                    (None, None) => true,
                    (Some(a), Some(b)) => a.same_but_rules(b),
                    _ => false,
                },
            ),
            (
                "export.collector (added or removed)",
                cur.collector.is_some() == new.collector.is_some(),
            ),
        ];
        let needs_restart: Vec<&str> = fixed.iter().filter(|f| !f.1).map(|f| f.0).collect();
        if !needs_restart.is_empty() {
            return Err(format!(
                "{} changed: restart the agent for that",
                needs_restart.join(", ")
            ));
        }
        let mut changed = Vec::new();
        if let Some(i) = &new.int {
            if self.stats.set_int_rules(i.rules.clone()) {
                changed.push("int rules");
            }
        }
        if cur.watch != new.watch {
            changed.push("watch");
            *self.stats.new_watch.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(new.watch.clone());
        }
        let tls_changed = match (&cur.tls, &new.tls) {
            (None, None) => false,
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
            _ => true,
        };
        if cur.collector != new.collector
            || cur.token != new.token
            || tls_changed
            || cur.export_interval_ns != new.export_interval_ns
            || cur.summary_interval_ns != new.summary_interval_ns
            || cur.buffer != new.buffer
            || cur.report_all != new.report_all
        {
            changed.push("export");
            *self.stats.new_export.lock().unwrap_or_else(|p| p.into_inner()) = Some(new.clone());
        }
        *cur = new;
        Ok(changed)
    }

    /// Where `/metrics` is served, when it is.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(|s| s.addr)
    }

    /// Stops the fast path, closes every open batch, exports what is left (trying for a few
    /// seconds), and returns the final counters.
    pub fn stop(mut self) -> AgentStats {
        self.stop.store(true, Ordering::Release);
        self.join();
        self.stats()
    }

    /// Waits until the stop flag is set (by [`Agent::stop_flag`]), then stops.
    pub fn wait(self) -> AgentStats {
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop()
    }

    fn join(&mut self) {
        if let Some(h) = self.fast.take() {
            let _ = h.join();
        }
        if let Some(h) = self.agg.take() {
            let _ = h.join();
        }
        if let Some(h) = self.flow_export.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.join();
    }
}

struct FastPath {
    /// Each input port's points.
    points: Vec<PortPoints>,
    rxs: Vec<RxRing>,
    egress: Egress,
    procs: Vec<Proc>,
    watch: telemark_core::watch::Watch,
    sink: RingSink,
    idle_check_ns: u64,
    /// sFlow sampling and the IPFIX cache, when configured.
    meter: Option<FlowMeter>,
    /// The heavy-hitter pipelines, when configured.
    hh: Option<HeavyHitters>,
}

impl FastPath {
    fn run(mut self, stop: &AtomicBool, done: &AtomicBool, shared: &Shared) {
        let mut burst: Vec<Pkt> =
            (0..BURST).map(|_| Pkt { data: Vec::with_capacity(2048), ..Pkt::default() }).collect();
        let mut out = Outbox(Vec::with_capacity(BURST));
        let fds: Vec<i32> = self.rxs.iter().map(|r| r.fd()).collect();
        let mut busy_ns = 0u64;
        let mut last_pub = Instant::now();
        let mut next_idle = now_ns() + self.idle_check_ns;
        while !stop.load(Ordering::Relaxed) {
            let t0 = Instant::now();
            let mut got = 0;
            for pi in 0..self.rxs.len() {
                // At most a few blocks per port per round, so no port starves the others.
                for _ in 0..4 {
                    let n = self.read_block(pi, &mut burst, &mut out);
                    got += n;
                    if n == 0 {
                        break;
                    }
                }
            }
            let now = now_ns();
            self.egress.drain_due(now);
            self.egress.kick();
            if got > 0 {
                busy_ns += t0.elapsed().as_nanos() as u64;
            } else {
                // Asleep until a frame arrives or the next queued one is due (10 ms at most).
                let wait_ms = self
                    .egress
                    .next_due_ns()
                    .map_or(10, |due| due.saturating_sub(now).div_ceil(1_000_000).min(10));
                afpacket::wait_readable(&fds, wait_ms as i32);
            }
            let now = now_ns();
            if let Some(h) = &mut self.hh {
                h.tick(now);
            }
            if now >= next_idle {
                next_idle = now + self.idle_check_ns;
                self.expire(now);
            }
            if last_pub.elapsed() >= Duration::from_millis(100) {
                last_pub = Instant::now();
                if let Some(m) = &mut self.meter {
                    // The whole cache every second.
                    m.sweep(now, m.cache_capacity() / 10 + 1);
                }
                self.publish(&shared.path, busy_ns);
                if let Some(w) = shared.new_watch.lock().ok().and_then(|mut w| w.take()) {
                    self.set_watch(w);
                }
                // Never wait: a handler may hold the lock while it builds a table.
                if let Some((r, table)) =
                    shared.int.try_lock().ok().and_then(|mut m| m.pending.take())
                {
                    if let Some(int) = &mut self.egress.int {
                        int.set_rules(&r, table);
                    }
                }
            }
        }
        // Shutdown: what is queued leaves when its time comes, for up to a second (the rest is
        // dropped and counted); then close every open batch, upstream first, so nothing
        // counted is lost.
        let deadline = now_ns() + 1_000_000_000;
        while let Some(due) = self.egress.next_due_ns() {
            if due > deadline {
                self.egress.drop_queued();
                break;
            }
            std::thread::sleep(Duration::from_nanos(due.saturating_sub(now_ns()).min(10_000_000)));
            self.egress.drain_due(now_ns());
            self.egress.kick();
        }
        for p in &mut self.procs {
            match p {
                Proc::Switch(sw) => sw.flush(&mut self.sink, |_| {}),
                Proc::Tap(t, _) => t.flush(&mut self.sink),
            }
        }
        if let Some(m) = &mut self.meter {
            m.flush();
        }
        if let Some(h) = &mut self.hh {
            h.flush(now_ns());
        }
        self.publish(&shared.path, busy_ns);
        done.store(true, Ordering::Release);
    }

    /// Reads one RX block of port `pi` in bursts through its processor; frames read.
    fn read_block(&mut self, pi: usize, burst: &mut [Pkt], out: &mut Outbox) -> usize {
        let (rxs, procs, egress, sink, watch, meter, hh) = (
            &mut self.rxs,
            &mut self.procs,
            &mut self.egress,
            &mut self.sink,
            &self.watch,
            &mut self.meter,
            &mut self.hh,
        );
        let Some(rx) = rxs.get_mut(pi) else { return 0 };
        let Some(proc) = procs.get_mut(pi) else { return 0 };
        let mut n = 0;
        let got = rx.rx_ready(|frame, ts| {
            if let Some(p) = burst.get_mut(n) {
                p.data.clear();
                p.data.extend_from_slice(frame);
                p.ts_ns = ts;
                n += 1;
            }
            if n == BURST {
                run_burst(proc, pi as u16, &mut burst[..n], sink, out, egress, watch, meter, hh);
                n = 0;
            }
        });
        if n > 0 {
            run_burst(proc, pi as u16, &mut burst[..n], sink, out, egress, watch, meter, hh);
        }
        got
    }

    fn expire(&mut self, now: u64) {
        for p in &mut self.procs {
            match p {
                Proc::Switch(sw) => sw.expire(now, &mut self.sink),
                Proc::Tap(t, _) => {
                    t.expire(now, &mut self.sink);
                }
            }
        }
    }

    /// New watch rules, for flows learned from now on (docs/agent.md, "Reload").
    fn set_watch(&mut self, w: telemark_core::watch::Watch) {
        for p in &mut self.procs {
            if let Proc::Switch(sw) = p {
                sw.set_watch(w.clone());
            }
        }
        self.watch = w;
    }

    fn publish(&mut self, shared: &Mutex<PathStats>, busy_ns: u64) {
        self.sink.send_gap();
        let mut s = PathStats { busy_ns, event_drops: self.sink.dropped, ..Default::default() };
        for r in &mut self.rxs {
            let st = r.stats();
            s.rx += st.rx;
            s.rx_ring_drops += st.rx_ring_drops;
            s.rx_ring_drops_by_port.push(st.rx_ring_drops);
            s.rx_truncated += st.rx_truncated;
        }
        for t in &self.egress.txs {
            let st = t.stats();
            s.tx += st.tx;
            s.tx_drops += st.tx_full + st.tx_too_big + st.tx_errors;
        }
        for (p, pp) in self.procs.iter().zip(&self.points) {
            match p {
                Proc::Switch(sw) => {
                    let st: SwitchStats = sw.stats();
                    s.skipped += st.skipped.iter().sum::<u64>();
                    s.unwatched += st.unwatched;
                    s.learned += st.learned;
                    s.unlearned += st.unlearned;
                    // Both points share the switch's flow table.
                    let (held, cap) = (sw.routes() as u64, sw.capacity() as u64);
                    if let (Some([i, e]), Some(eg)) = (sw.point_stats(), pp.egress) {
                        s.points.push((pp.ingress, i, held, cap));
                        s.points.push((eg, e, held, cap));
                    }
                }
                Proc::Tap(t, _) => {
                    let (held, cap) = (t.occupancy() as u64, t.capacity() as u64);
                    s.points.push((pp.ingress, t.stats(), held, cap));
                }
            }
        }
        s.int = self.egress.int.as_ref().map(IntStage::stats);
        s.meter = self.meter.as_ref().map(FlowMeter::stats);
        s.hh = self.hh.as_ref().map(HeavyHitters::stats);
        s.queues = self.egress.queue_stats();
        // Never wait for the lock: the aggregator holds it only to copy.
        if let Ok(mut g) = shared.try_lock() {
            *g = s;
        }
    }
}

/// One burst, arrived on port `in_port`, through a switch direction (then the flow meter and
/// the heavy-hitter stage, then out by Egress) or a tap (then the same two stages).
#[inline]
#[allow(clippy::too_many_arguments)]
fn run_burst(
    proc: &mut Proc,
    in_port: u16,
    pkts: &mut [Pkt],
    sink: &mut RingSink,
    out: &mut Outbox,
    egress: &mut Egress,
    watch: &telemark_core::watch::Watch,
    meter: &mut Option<FlowMeter>,
    hh: &mut Option<HeavyHitters>,
) {
    match proc {
        Proc::Switch(sw) => {
            out.0.clear();
            sw.process(pkts, sink, out);
            // The flow meter first (before egress may change a frame), timed per burst: its
            // own `cost` stage.
            if let Some(m) = meter.as_mut() {
                let t = Instant::now();
                for &(port, idx) in &out.0 {
                    if let Some(p) = pkts.get(idx) {
                        let len = p.bytes_on_wire() as u32;
                        m.packet(in_port, port, &p.data, len, sw.parsed(idx), p.ts_ns);
                    }
                }
                m.add_busy_ns(t.elapsed().as_nanos() as u64);
            }
            // Heavy hitters among every packet that arrived on this port, timed apart.
            if let Some(h) = hh.as_mut() {
                let t = Instant::now();
                for (idx, p) in pkts.iter().enumerate() {
                    if let Some((parsed, _)) = sw.parsed(idx) {
                        h.packet(in_port, &parsed.key, p.bytes_on_wire() as u32);
                    }
                }
                h.add_busy_ns(t.elapsed().as_nanos() as u64);
            }
            let now = now_ns();
            for &(port, idx) in &out.0 {
                if let Some(p) = pkts.get_mut(idx) {
                    egress.send(in_port, port, &mut p.data, p.ts_ns, now);
                }
            }
            egress.kick();
        }
        Proc::Tap(t, keys) => {
            for p in pkts.iter() {
                let mut parsed = flow::extract(&p.data, LinkType::Ethernet).ok();
                if let (Some(x), Some(port)) = (parsed.as_mut(), keys.int_port) {
                    int_frame::key_as_sourced(&p.data, x, port);
                }
                let watched = parsed.as_ref().is_some_and(|x| watch.matches(&x.key));
                // The hash, once, for whichever of the two needs it.
                let h = parsed
                    .as_ref()
                    .filter(|_| watched || meter.is_some())
                    .map(|x| flow_hash(&x.key));
                if let Some(m) = meter.as_mut() {
                    let len = p.bytes_on_wire() as u32;
                    m.packet(in_port, u16::MAX, &p.data, len, parsed.as_ref().zip(h), p.ts_ns);
                }
                if let (Some(stage), Some(parsed)) = (hh.as_mut(), parsed.as_ref()) {
                    stage.packet(in_port, &parsed.key, p.bytes_on_wire() as u32);
                }
                let (Some(parsed), Some(h), true) = (parsed, h, watched) else { continue };
                t.observe(&parsed.key, h, color_of(parsed.dscp, keys.color_bit), p.ts_ns, sink);
            }
        }
    }
}

/// Where records go.
enum Out {
    Collector(Box<Exporter>),
    Kafka(Box<KafkaOut>),
    Stdout,
    Discard,
}

impl Out {
    /// Records lost on the way out so far: no room to hold them, or (Kafka) failed.
    fn dropped(&self) -> u64 {
        match self {
            Out::Collector(e) => e.dropped,
            Out::Kafka(k) => k.lost(),
            Out::Stdout | Out::Discard => 0,
        }
    }
}

struct Slow {
    cfg: AgentConfig,
    agg: Aggregator,
    cons: Consumer<BatchEvent>,
    /// INT sink events.
    int_events: Consumer<RuledEvent>,
    /// Heavy-hitter windows (with `[heavy_hitters]`).
    hh_windows: Option<Consumer<PortWindow>>,
    /// Heavy-hitter windows closed since the last health record.
    hh_health: Vec<HhWindowHealth>,
    /// Export drops reported in the last health record.
    last_export_dropped: u64,
    /// Where loss records go as IPFIX too (`[ipfix] loss`).
    loss_tx: Option<std::sync::mpsc::SyncSender<telemark_core::records::LossRecord>>,
}

impl Slow {
    fn run(mut self, fast_done: &AtomicBool, shared: &Shared) {
        let boot = now_ns();
        let kafka = self.cfg.kafka.as_ref().map(|k| {
            telemark_kafka::Producer::new(k, true).map(|p| (p, k.buffer_records as usize))
        });
        let mut out = match (&self.cfg.collector, kafka) {
            (_, Some(Ok((producer, bound)))) => {
                Out::Kafka(Box::new(KafkaOut::new(producer, &self.cfg.agent, boot, bound)))
            }
            (_, Some(Err(e))) => {
                tracing::error!("kafka: {e}; records are discarded");
                Out::Discard
            }
            (Some(c), None) => {
                let mut ex = Exporter::new(c, &self.cfg.agent, boot, self.cfg.buffer)
                    .with_token(self.cfg.token.as_deref());
                if let Some(tls) = &self.cfg.tls {
                    ex = ex.with_tls(tls.clone());
                }
                Out::Collector(Box::new(ex))
            }
            (None, None) if self.cfg.quiet => Out::Discard,
            (None, None) => Out::Stdout,
        };
        let mut records = 0u64;
        let mut interval_start = boot;
        let mut next_summary = boot + self.cfg.summary_interval_ns;
        let mut next_export = boot + self.cfg.export_interval_ns;
        let mut last_path = PathStats::default();
        let mut was_failing = false;
        // Per-flow state of flows silent this long is forgotten (it was reported already).
        let forget_ns = self.cfg.loss.idle_ns.saturating_mul(4).max(30_000_000_000);
        loop {
            let finished = fast_done.load(Ordering::Acquire);
            let n = self.cons.drain(|ev| self.agg.handle(ev));
            if finished && n == 0 {
                break;
            }
            while let Some(r) = self.agg.poll_record() {
                records += 1;
                self.offer_ipfix(&r, shared);
                emit(&mut out, r);
            }
            records += self.drain_int_events(&mut out);
            records += self.drain_heavy_hitters(&mut out);
            let now = now_ns();
            if now >= next_summary {
                let snap = shared.path.lock().map(|s| s.clone()).unwrap_or_default();
                self.report_interval(&mut out, &snap, &last_path, interval_start, now);
                // Each stage's time since the last cost records.
                let before = last_path.stages();
                for (stage, ns) in snap.stages() {
                    let was = before.iter().find(|b| b.0 == stage).map_or(0, |b| b.1);
                    emit(
                        &mut out,
                        Record::Cost(CostRecord {
                            agent: self.cfg.agent.clone(),
                            stage: stage.into(),
                            packets: snap.rx.saturating_sub(last_path.rx),
                            cycles: ns.saturating_sub(was),
                            interval_ns: now.saturating_sub(interval_start),
                        }),
                    );
                }
                last_path = snap;
                self.agg.book_quiet_before(now.saturating_sub(2 * self.cfg.loss.idle_ns));
                self.agg.forget_before(now.saturating_sub(forget_ns));
                interval_start = now;
                next_summary = now + self.cfg.summary_interval_ns;
            }
            if let Out::Kafka(k) = &mut out {
                k.poll();
            }
            if now >= next_export {
                next_export = now + self.cfg.export_interval_ns;
                if let Out::Collector(e) = &mut out {
                    match e.flush() {
                        Ok(_) if was_failing => {
                            tracing::info!("collector reachable again");
                            was_failing = false;
                        }
                        Ok(_) => {}
                        Err(err) if !was_failing => {
                            tracing::warn!("export failed, will retry: {err}");
                            was_failing = true;
                        }
                        Err(_) => {}
                    }
                }
            }
            if let Some(new) = shared.new_export.lock().ok().and_then(|mut e| e.take()) {
                self.set_export(new, &mut out);
                next_export = now_ns() + self.cfg.export_interval_ns;
                next_summary = next_summary.min(now_ns() + self.cfg.summary_interval_ns);
            }
            self.publish(shared, &out, records);
            if n == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        // The fast path closed every batch: resolve and export the rest.
        records += self.drain_int_events(&mut out);
        records += self.drain_heavy_hitters(&mut out);
        self.cons.drain(|ev| self.agg.handle(ev));
        self.agg.flush();
        while let Some(r) = self.agg.poll_record() {
            records += 1;
            self.offer_ipfix(&r, shared);
            emit(&mut out, r);
        }
        // The flow-export thread ends when it has sent what it holds.
        self.loss_tx = None;
        let now = now_ns();
        let snap = shared.path.lock().map(|s| s.clone()).unwrap_or_default();
        self.report_interval(&mut out, &snap, &last_path, interval_start, now);
        if let Out::Kafka(k) = &mut out {
            k.finish(Duration::from_secs(5));
            let pending = k.pending();
            if pending > 0 {
                tracing::warn!(pending, "records not acknowledged by Kafka at exit");
            }
        }
        if let Out::Collector(e) = &mut out {
            let deadline = Instant::now() + Duration::from_secs(5);
            while e.pending() > 0 && Instant::now() < deadline {
                if e.flush().is_err() {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            if e.pending() > 0 {
                tracing::warn!(
                    pending = e.pending(),
                    "records not acknowledged by the collector at exit"
                );
            }
        }
        self.publish(shared, &out, records);
    }

    /// A loss record to the IPFIX exporter too, when it takes them.
    fn offer_ipfix(&self, r: &Record, shared: &Shared) {
        if let (Some(tx), Record::Loss(l)) = (&self.loss_tx, r) {
            flow_export::offer_loss(tx, l, shared);
        }
    }

    /// INT events from the fast path, as records; how many.
    fn drain_int_events(&mut self, out: &mut Out) -> u64 {
        let mut n = 0;
        while let Some((e, rules)) = self.int_events.pop() {
            emit(out, Record::Event(e.record(&self.cfg.agent, &rules)));
            n += 1;
        }
        n
    }

    /// Heavy flows of the windows the fast path closed, as `flow` records; how many. Every
    /// window, heavy flows or not, goes into the next health record.
    fn drain_heavy_hitters(&mut self, out: &mut Out) -> u64 {
        let Some(cons) = &self.hh_windows else { return 0 };
        let mut n = 0;
        while let Some(w) = cons.pop() {
            let port = self.port_names().get(usize::from(w.port)).cloned().unwrap_or_default();
            for f in &w.hh.flows {
                let r = FlowRecord::heavy(&self.cfg.agent, &port, (w.start_ns, w.end_ns), &w.hh, f);
                emit(out, Record::Flow(r));
                n += 1;
            }
            // Bounded: a health record leaves every summary interval (windows are ≥ 100 ms).
            if self.hh_health.len() < 4096 {
                self.hh_health.push(HhWindowHealth {
                    port,
                    window_start_ns: w.start_ns,
                    window_end_ns: w.end_ns,
                    packets: w.hh.packets,
                    threshold_packets: w.hh.threshold_packets,
                    heavy_flows: w.hh.flows.len() as u64,
                    complete: w.hh.complete,
                });
            }
        }
        n
    }

    /// New export settings: the collector, token and TLS trust (records not yet acknowledged
    /// go to the new collector), intervals, buffer size, report-all.
    fn set_export(&mut self, new: AgentConfig, out: &mut Out) {
        if let (Out::Collector(e), Some(url)) = (out, &new.collector) {
            e.retarget(url, new.token.as_deref(), new.tls.clone());
            e.set_capacity(new.buffer);
        }
        self.agg.set_report_all(new.report_all);
        self.cfg.collector = new.collector;
        self.cfg.token = new.token;
        self.cfg.tls = new.tls;
        self.cfg.export_interval_ns = new.export_interval_ns;
        self.cfg.summary_interval_ns = new.summary_interval_ns;
        self.cfg.buffer = new.buffer;
        self.cfg.report_all = new.report_all;
    }

    /// The interval's per-point summaries, each ingress or tap point's marked with its port's
    /// receive-ring drops, and the agent's health record (counters since `last`).
    fn summaries_and_health(
        &mut self,
        snap: &PathStats,
        last: &PathStats,
        start_ns: u64,
        end_ns: u64,
        export_dropped: u64,
    ) -> Vec<Record> {
        let ports = self.port_names();
        let ring_drops = |port: &str| -> u64 {
            let Some(i) = ports.iter().position(|p| p == port) else { return 0 };
            let now = snap.rx_ring_drops_by_port.get(i).copied().unwrap_or(0);
            now.saturating_sub(last.rx_ring_drops_by_port.get(i).copied().unwrap_or(0))
        };
        let specs = self.agg.points().to_vec();
        let mut v = self.agg.summaries(start_ns, end_ns);
        for (r, spec) in v.iter_mut().zip(&specs) {
            if let Record::Summary(s) = r {
                if spec.name == "ingress" || spec.name == "tap" {
                    s.rx_ring_drops = ring_drops(&spec.port);
                }
            }
        }
        let before =
            |pt: u8| last.points.iter().find(|x| x.0 == pt).map(|x| x.1).unwrap_or_default();
        let points = snap
            .points
            .iter()
            .filter_map(|&(pt, st, held, cap)| {
                let spec = specs.get(usize::from(pt))?;
                let b = before(pt);
                Some(PointHealth {
                    point: spec.name.clone(),
                    port: spec.port.clone(),
                    flows_admitted: st.admitted.saturating_sub(b.admitted),
                    flows_evicted: st.evicted.saturating_sub(b.evicted),
                    packets_refused: st.refused.saturating_sub(b.refused),
                    packets_unselected: st.unselected.saturating_sub(b.unselected),
                    flows: held,
                    capacity: cap,
                })
            })
            .collect();
        v.push(Record::Health(HealthRecord {
            agent: self.cfg.agent.clone(),
            interval_start_ns: start_ns,
            interval_end_ns: end_ns,
            rx: snap.rx.saturating_sub(last.rx),
            rx_ring_drops: snap.rx_ring_drops.saturating_sub(last.rx_ring_drops),
            tx_drops: snap.tx_drops.saturating_sub(last.tx_drops),
            events_lost: snap.event_drops.saturating_sub(last.event_drops),
            export_dropped: export_dropped.saturating_sub(self.last_export_dropped),
            points,
            hh_windows: std::mem::take(&mut self.hh_health),
        }));
        v
    }

    /// Emits the interval's summaries and health record. The health record counts the export
    /// drops since the last health record that got out: one dropped itself (the collector or
    /// broker away) hands its count on to the next.
    fn report_interval(
        &mut self,
        out: &mut Out,
        snap: &PathStats,
        last: &PathStats,
        start_ns: u64,
        end_ns: u64,
    ) {
        let dropped = out.dropped();
        for r in self.summaries_and_health(snap, last, start_ns, end_ns, dropped) {
            let health = matches!(r, Record::Health(_));
            if emit(out, r) && health {
                self.last_export_dropped = dropped;
            }
        }
    }

    /// Port names in the order the fast path opened them (pairs' a, b, then taps).
    fn port_names(&self) -> Vec<String> {
        self.cfg
            .pairs
            .iter()
            .flat_map(|p| [p.a.clone(), p.b.clone()])
            .chain(self.cfg.taps.iter().map(|t| t.port.clone()))
            .collect()
    }

    fn publish(&self, shared: &Shared, out: &Out, records: u64) {
        if let Ok(mut g) = shared.export.lock() {
            g.records = records;
            match out {
                Out::Collector(e) => {
                    g.exported = e.acked;
                    g.export_drops = e.dropped;
                    g.export_pending = e.pending() as u64;
                    g.export_failures = e.failures;
                }
                Out::Kafka(k) => {
                    g.exported = k.acked;
                    g.export_drops = k.lost();
                    g.export_pending = k.pending() as u64;
                    g.export_failures = k.failed;
                }
                _ => {}
            }
        }
    }
}

/// Hands `r` on; false when it was dropped (no room).
fn emit(out: &mut Out, r: Record) -> bool {
    match out {
        Out::Collector(e) => e.push(r),
        Out::Kafka(k) => k.push(&r),
        Out::Discard => true,
        Out::Stdout => {
            if let Ok(s) = serde_json::to_string(&r) {
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{s}");
            }
            true
        }
    }
}
