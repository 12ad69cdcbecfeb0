//! The running agent, started and stopped: one datapath thread (fast_path.rs: the ports and
//! the switches), one aggregation thread (aggregation.rs: the aggregator and the output), and
//! with `[sflow]` or `[ipfix]` a flow-export thread (DESIGN.md, "Data flow").
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

use crate::aggregation::Aggregation;
use crate::config::AgentConfig;
use crate::control::Control;
use crate::datapath::layout;
pub use crate::error::AgentError;
use crate::fast_path;
use crate::flow_export;
use crate::metrics::{AgentMetrics, Listener};
use crate::shared::{AgentStats, Shared};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use telemark_core::loss::Aggregator;
use telemark_transport::server::{Server, ServerConfig, ServerStats};

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

impl Agent {
    /// Opens every port and starts the threads: the datapath, the aggregation, the flow
    /// export (with `[sflow]` or `[ipfix]`) and the `/metrics` and control listener.
    pub fn start(cfg: AgentConfig) -> Result<Agent, AgentError> {
        let (points, per_port) = layout(&cfg);
        let stats = Arc::new(Shared::default());
        *stats.watch.lock().unwrap_or_else(|p| p.into_inner()) = cfg.watch.clone();
        if let Some(i) = &cfg.int {
            let mut m = stats.int.lock().unwrap_or_else(|p| p.into_inner());
            (m.in_force, m.flows) = (Some(i.rules.clone()), i.flows);
        }
        let started = match &cfg.ebpf {
            Some(eb) => crate::ebpf_path::open(&cfg, eb, stats.clone())?,
            None => fast_path::open(&cfg, &per_port)?,
        };
        let metrics = match &cfg.metrics {
            None => None,
            Some((listen, token)) => {
                let transport = Arc::new(ServerStats::default());
                let handler = Arc::new(Listener {
                    metrics: AgentMetrics {
                        agent: cfg.agent.clone(),
                        shared: stats.clone(),
                        points: points.clone(),
                        ports: cfg.port_names().iter().map(|n| n.to_string()).collect(),
                        token: token.clone(),
                        transport: transport.clone(),
                    },
                    control: Control {
                        shared: stats.clone(),
                        token: cfg.control_token.clone(),
                        int: cfg.int.is_some(),
                        watch: cfg.ebpf.is_none(),
                    },
                });
                let scfg = ServerConfig::metrics_listener(*listen, cfg.control_token.is_some());
                Some(Server::start(scfg, handler, transport).map_err(AgentError::Metrics)?)
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let path_done = Arc::new(AtomicBool::new(false));
        let (flow_export, loss_tx) = match started.meter_rings {
            Some(rings) => {
                let (h, loss_tx) = flow_export::start(
                    cfg.sflow.as_ref(),
                    cfg.ipfix.as_ref(),
                    rings,
                    started.ports,
                    stats.clone(),
                    path_done.clone(),
                )
                .map_err(AgentError::Report)?;
                (Some(h), loss_tx)
            }
            None => (None, None),
        };
        let (s1, d1, st1) = (stop.clone(), path_done.clone(), stats.clone());
        let path = started.path;
        let fast = std::thread::Builder::new()
            .name("tm-fastpath".into())
            .spawn(move || path.run(&s1, &d1, &st1))
            .map_err(AgentError::Thread)?;
        // Batches of B packets only where the switch marks by count; the eBPF datapath's
        // marking is by time, whatever `[loss]` says.
        let by_count = cfg.loss.period_ns.is_none() && cfg.ebpf.is_none();
        let batch = Some(cfg.loss.batch).filter(|_| by_count);
        // The eBPF datapath dates a batch by its first and last packet at each point: one of a
        // single packet is an instant, later downstream by the path's delay, so two points'
        // views of it may lie up to the guard apart (a switch dates both ends alike).
        let tol_ns = cfg.ebpf.as_ref().map_or(0, |e| e.guard_ns / 2);
        // The eBPF datapath's batches are the marking periods themselves, numbered by the
        // kernel: records carry the numbers, for the collector to line up across hosts.
        let agg = Aggregator::new(points, batch, tol_ns)
            .periods(cfg.ebpf.as_ref().map(|e| e.period_ns))
            .report_all(cfg.report_all);
        let running = Mutex::new(cfg.clone());
        let aggregation = Aggregation {
            cfg,
            agg,
            cons: started.events,
            int_events: started.int_events,
            hh_windows: started.hh_windows,
            hh_health: Vec::new(),
            last_export_dropped: 0,
            loss_tx,
        };
        let st2 = stats.clone();
        let agg = std::thread::Builder::new()
            .name("tm-aggregator".into())
            .spawn(move || aggregation.run(&path_done, &st2))
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

    /// Takes what `new` changes of the watch rules, the export settings, the INT rules and the
    /// eBPF datapath's `[[port]]`s, without stopping
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
                "ebpf (anything but its [[port]]s)",
                match (&cur.ebpf, &new.ebpf) {
                    (None, None) => true,
                    (Some(a), Some(b)) => a.same_but_ports(b),
                    _ => false,
                },
            ),
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
        if let (Some(a), Some(b)) = (&cur.ebpf, &new.ebpf) {
            if a.ports != b.ports {
                changed.push("port");
                *self.stats.new_ebpf_ports.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(b.ports.clone());
            }
        }
        // As the watch rules below: only when the file's rules changed, so rules a controller
        // put in force through the control API stay through a reload made for something else.
        if let Some(i) = &new.int {
            let file_changed = cur.int.as_ref().map(|c| &c.rules) != Some(&i.rules);
            if file_changed && self.stats.set_int_rules(i.rules.clone()) {
                changed.push("int rules");
            }
        }
        // Only when the file's rules changed: rules the control API put in force since stay
        // through a reload made for something else.
        if cur.watch != new.watch && self.stats.set_watch(new.watch.clone()) {
            changed.push("watch");
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
