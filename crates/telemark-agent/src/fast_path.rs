//! The AF_PACKET datapath: one thread owns the ports and the switches. It reads each RX ring
//! in bursts through the port's switch direction (mark, ingress point, forward, egress point)
//! or tap, then the flow meter and the heavy-hitter stage, then out by Egress (egress.rs);
//! batch events go to the aggregation through an SPSC ring (full: counted, never waited on).
//! It sleeps in `poll` only when every RX ring is empty; it never waits on the aggregation or
//! the collector.

use crate::config::AgentConfig;
use crate::datapath::{Datapath, PortPoints, Started};
use crate::doorbell::RING_EVERY;
use crate::egress::{Egress, IntStage, RuledEvent};
use crate::error::AgentError;
use crate::flow_export::PortInfo;
use crate::shared::{PathStats, PointTable, Shared};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use telemark_core::flow_hash;
use telemark_core::loss::{color_of, AnyColorTable, BatchEvent};
use telemark_core::spsc;
use telemark_datapath::afpacket::{self, RingConfig, RxRing};
use telemark_datapath::events::RingSink;
use telemark_datapath::flow_meter::FlowMeter;
use telemark_datapath::heavy_hitters::HeavyHitters;
use telemark_datapath::int_roles::IntRoles;
use telemark_datapath::queue::EgressQueue;
use telemark_datapath::switch::{Action, Points, Switch, SwitchConfig, SwitchStats, Tx, BURST};
use telemark_datapath::Pkt;
use telemark_transport::now_ns;
use telemark_wire::flow::{self, LinkType};
use telemark_wire::int_frame;

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

/// Opens every port of `cfg` (pair ports in order, then taps; `per_port` gives each input
/// port's points) and builds the switch or tap behind each, the egress queues and INT stage,
/// the flow meter and the heavy-hitter stage: the AF_PACKET datapath, ready to run.
pub(crate) fn open(cfg: &AgentConfig, per_port: &[PortPoints]) -> Result<Started, AgentError> {
    let ring = RingConfig::default();
    let names = cfg.port_names();
    let mut rxs = Vec::new();
    let mut txs = Vec::new();
    for n in &names {
        let (r, t) = afpacket::open(n, cfg.netns.as_deref(), ring).map_err(AgentError::Port)?;
        rxs.push(r);
        txs.push(t);
    }
    let ports: Vec<PortInfo> =
        rxs.iter().map(|r: &RxRing| PortInfo { ifindex: r.ifindex() }).collect();
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
                    points: Points { marker: pp.marker.unwrap_or(0), ingress: pp.ingress, egress },
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
    let (prod, events) = spsc::channel::<BatchEvent>(1 << 16);
    let (int_prod, int_events) = spsc::channel::<RuledEvent>(1 << 12);
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
    let (meter, meter_rings) = if cfg.sflow.is_some() || cfg.ipfix.is_some() {
        let (meter, rings) = FlowMeter::new(
            names.len(),
            cfg.sflow.as_ref().map(|s| s.settings),
            cfg.ipfix.as_ref().map(|i| i.settings),
            now_ns(),
        );
        (Some(meter), Some(rings))
    } else {
        (None, None)
    };
    let (hh, hh_windows) = match &cfg.heavy_hitters {
        Some(h) => {
            let (stage, cons) = HeavyHitters::new(&h.hh, names.len(), h.window_ns, now_ns());
            (Some(stage), Some(cons))
        }
        None => (None, None),
    };
    let stages = Stages {
        sink: RingSink::new(prod),
        egress: Egress::new(txs, queues, int),
        watch: cfg.watch.clone(),
        meter,
        hh,
    };
    let path = FastPath {
        points: per_port.to_vec(),
        rxs,
        procs,
        stages,
        idle_check_ns: (cfg.loss.idle_ns / 4).clamp(10_000_000, 1_000_000_000),
    };
    Ok(Started { path: Box::new(path), ports, events, int_events, hh_windows, meter_rings })
}

struct FastPath {
    /// Each input port's points.
    points: Vec<PortPoints>,
    rxs: Vec<RxRing>,
    /// What processes each port's packets (by port number).
    procs: Vec<Proc>,
    stages: Stages,
    idle_check_ns: u64,
}

/// What every burst passes through besides its port's processor.
struct Stages {
    /// Batch events, to the aggregation.
    sink: RingSink,
    /// Out: queues, the INT stage, TX rings.
    egress: Egress,
    /// The flows a tap measures (a switch direction has its own copy).
    watch: telemark_core::watch::Watch,
    /// sFlow sampling and the IPFIX cache, when configured.
    meter: Option<FlowMeter>,
    /// The heavy-hitter pipelines, when configured.
    hh: Option<HeavyHitters>,
}

impl Datapath for FastPath {
    fn run(self: Box<Self>, stop: &AtomicBool, done: &AtomicBool, shared: &Shared) {
        (*self).run_until(stop, done, shared)
    }
}

impl FastPath {
    fn run_until(mut self, stop: &AtomicBool, done: &AtomicBool, shared: &Shared) {
        let mut burst: Vec<Pkt> =
            (0..BURST).map(|_| Pkt { data: Vec::with_capacity(2048), ..Pkt::default() }).collect();
        let mut out = Outbox(Vec::with_capacity(BURST));
        let fds: Vec<i32> = self.rxs.iter().map(|r| r.fd()).collect();
        let mut busy_ns = 0u64;
        let mut last_pub = Instant::now();
        let mut next_idle = now_ns() + self.idle_check_ns;
        let mut next_ring = 0u64;
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
            self.stages.egress.drain_due(now);
            self.stages.egress.kick();
            if got > 0 {
                busy_ns += t0.elapsed().as_nanos() as u64;
                // Frames close batches: events for the aggregation, which may sleep.
                if now >= next_ring {
                    next_ring = now + RING_EVERY.as_nanos() as u64;
                    shared.aggregation_bell.ring();
                }
            } else {
                // Asleep until a frame arrives or the next queued one is due (10 ms at most).
                let wait_ms = self
                    .stages
                    .egress
                    .next_due_ns()
                    .map_or(10, |due| due.saturating_sub(now).div_ceil(1_000_000).min(10));
                afpacket::wait_readable(&fds, wait_ms as i32);
            }
            let now = now_ns();
            if let Some(h) = &mut self.stages.hh {
                h.tick(now);
            }
            if now >= next_idle {
                next_idle = now + self.idle_check_ns;
                self.expire(now);
                shared.aggregation_bell.ring();
            }
            if last_pub.elapsed() >= Duration::from_millis(100) {
                last_pub = Instant::now();
                if let Some(m) = &mut self.stages.meter {
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
                    if let Some(int) = &mut self.stages.egress.int {
                        int.set_rules(&r, table);
                    }
                }
            }
        }
        // Shutdown: what is queued leaves when its time comes, for up to a second (the rest is
        // dropped and counted); then close every open batch, upstream first, so nothing
        // counted is lost.
        let deadline = now_ns() + 1_000_000_000;
        while let Some(due) = self.stages.egress.next_due_ns() {
            if due > deadline {
                self.stages.egress.drop_queued();
                break;
            }
            std::thread::sleep(Duration::from_nanos(due.saturating_sub(now_ns()).min(10_000_000)));
            self.stages.egress.drain_due(now_ns());
            self.stages.egress.kick();
        }
        for p in &mut self.procs {
            match p {
                Proc::Switch(sw) => sw.flush(&mut self.stages.sink, |_| {}),
                Proc::Tap(t, _) => t.flush(&mut self.stages.sink),
            }
        }
        if let Some(m) = &mut self.stages.meter {
            m.flush();
        }
        if let Some(h) = &mut self.stages.hh {
            h.flush(now_ns());
        }
        self.publish(&shared.path, busy_ns);
        done.store(true, Ordering::Release);
        shared.aggregation_bell.ring();
    }

    /// Reads one RX block of port `pi` in bursts through its processor; frames read.
    fn read_block(&mut self, pi: usize, burst: &mut [Pkt], out: &mut Outbox) -> usize {
        let (rxs, procs, stages) = (&mut self.rxs, &mut self.procs, &mut self.stages);
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
                run_burst(proc, pi as u16, &mut burst[..n], out, stages);
                n = 0;
            }
        });
        if n > 0 {
            run_burst(proc, pi as u16, &mut burst[..n], out, stages);
        }
        got
    }

    fn expire(&mut self, now: u64) {
        for p in &mut self.procs {
            match p {
                Proc::Switch(sw) => sw.expire(now, &mut self.stages.sink),
                Proc::Tap(t, _) => {
                    t.expire(now, &mut self.stages.sink);
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
        self.stages.watch = w;
    }

    fn publish(&mut self, shared: &Mutex<PathStats>, busy_ns: u64) {
        self.stages.sink.send_gap();
        let mut s =
            PathStats { busy_ns, event_drops: self.stages.sink.dropped, ..Default::default() };
        for r in &mut self.rxs {
            let st = r.stats();
            s.rx += st.rx;
            s.rx_ring_drops += st.rx_ring_drops;
            s.rx_ring_drops_by_port.push(st.rx_ring_drops);
            s.rx_truncated += st.rx_truncated;
        }
        for t in &self.stages.egress.txs {
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
                    let (flows, capacity) = (sw.routes() as u64, sw.capacity() as u64);
                    if let (Some([i, e]), Some(eg)) = (sw.point_stats(), pp.egress) {
                        s.points.push(PointTable { point: pp.ingress, stats: i, flows, capacity });
                        s.points.push(PointTable { point: eg, stats: e, flows, capacity });
                    }
                }
                Proc::Tap(t, _) => {
                    let (flows, capacity) = (t.occupancy() as u64, t.capacity() as u64);
                    s.points.push(PointTable {
                        point: pp.ingress,
                        stats: t.stats(),
                        flows,
                        capacity,
                    });
                }
            }
        }
        s.int = self.stages.egress.int.as_ref().map(IntStage::stats);
        s.meter = self.stages.meter.as_ref().map(FlowMeter::stats);
        s.hh = self.stages.hh.as_ref().map(HeavyHitters::stats);
        s.queues = self.stages.egress.queue_stats();
        // Never wait for the lock: the aggregator holds it only to copy.
        if let Ok(mut g) = shared.try_lock() {
            *g = s;
        }
    }
}

/// One burst, arrived on port `in_port`, through a switch direction (then the flow meter and
/// the heavy-hitter stage, then out by Egress) or a tap (then the same two stages).
#[inline]
fn run_burst(
    proc: &mut Proc,
    in_port: u16,
    pkts: &mut [Pkt],
    out: &mut Outbox,
    stages: &mut Stages,
) {
    let Stages { sink, egress, watch, meter, hh } = stages;
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
