//! Capture replay through the paper's evaluation path (V-B):
//!
//! ```text
//! capture ─► marker ─► [reorderer, dropper@ingress] ─► switch: ingress point ─► [dropper@switch]
//!        ─► egress point ─► [dropper@egress] ─► next-hop point
//! ```
//!
//! Every point sends batch events through one SPSC ring to the aggregator; the droppers keep
//! the ground truth. With `mark: false` the capture is taken as already colored.

use crate::dropper::{DropModel, Dropper, Placement};
use crate::reorder::Reorderer;
use crate::switch::{Action, Switch, SwitchConfig, SwitchStats, Tx, BURST};
use crate::Pkt;
use telemark_core::loss::{
    color_of, with_color, Aggregator, AnyColorTable, BatchEvent, EventSink, LossConfig, Marker,
    PointSpec,
};
use telemark_core::spsc::{self, Consumer, Producer};
use telemark_core::{flow_hash, FlowKey};
use telemark_wire::flow::{self, LinkType};

/// Point numbers in the replay pipeline.
pub mod points {
    /// The marker (what was sent).
    pub const MARKER: u8 = 0;
    /// The switch's ingress.
    pub const INGRESS: u8 = 1;
    /// The switch's egress.
    pub const EGRESS: u8 = 2;
    /// The next hop's ingress.
    pub const NEXT_HOP: u8 = 3;
}

/// What the replay should do.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    /// Loss-monitor parameters.
    pub loss: LossConfig,
    /// Color packets at the first hop (false: the capture is already marked).
    pub mark: bool,
    /// Droppers and where they sit.
    pub drops: Vec<(Placement, DropModel)>,
    /// Reordering depth on the ingress link (0: none).
    pub reorder: u64,
    /// Seed of droppers and reorderer.
    pub seed: u64,
    /// Agent name in records.
    pub agent: String,
    /// Emit a loss record for every batch, not only lossy ones.
    pub report_all: bool,
}

/// Event sink feeding the SPSC ring, counting what did not fit.
pub struct RingSink {
    prod: Producer<BatchEvent>,
    /// Events lost because the ring was full.
    pub dropped: u64,
}

impl RingSink {
    /// A sink feeding `prod`.
    pub fn new(prod: Producer<BatchEvent>) -> Self {
        RingSink { prod, dropped: 0 }
    }
}

impl EventSink for RingSink {
    #[inline]
    fn emit(&mut self, ev: BatchEvent) {
        if self.prod.push(ev).is_err() {
            self.dropped += 1;
        }
    }
}

struct Forwarded(Vec<usize>);
impl Tx for Forwarded {
    fn send(&mut self, _port: u16, idx: usize) -> bool {
        self.0.push(idx);
        true
    }
}

/// The replay pipeline and everything it learned.
pub struct Replay {
    cfg: ReplayConfig,
    marker: Option<Marker>,
    reorder: Option<Reorderer<Pkt>>,
    droppers: Vec<(Placement, Dropper)>,
    /// The switch under test.
    pub switch: Switch,
    next_hop: AnyColorTable,
    sink: RingSink,
    cons: Consumer<BatchEvent>,
    /// The aggregator with every resolved batch.
    pub agg: Aggregator,
    burst: Vec<Pkt>,
    held: Vec<Pkt>,
    fwd: Forwarded,
    link: LinkType,
    /// Packets read.
    pub packets: u64,
    /// Packets without a flow key, per reason (see `SkipReason::ALL`).
    pub skipped: [u64; 4],
}

impl Replay {
    /// A pipeline for packets of link type `link`.
    pub fn new(cfg: ReplayConfig, link: LinkType) -> Self {
        let loss = cfg.loss;
        let (prod, cons) = spsc::channel(1 << 14);
        let spec = |name: &str, upstream, marker| PointSpec {
            name: name.into(),
            agent: cfg.agent.clone(),
            port: match name {
                "ingress" => "in".into(),
                "egress" | "next-hop" => "out".into(),
                _ => "-".into(),
            },
            upstream,
            marker,
            skew_ns: 0,
            upstream_label: None,
        };
        let pts = vec![
            spec("marker", None, true),
            spec("ingress", cfg.mark.then_some(points::MARKER), false),
            spec("egress", Some(points::INGRESS), false),
            spec("next-hop", Some(points::EGRESS), false),
        ];
        let agg = Aggregator::new(pts, Some(loss.batch).filter(|_| loss.period_ns.is_none()), 0)
            .report_all(cfg.report_all);
        let switch = Switch::new(
            SwitchConfig {
                link,
                action: Action::NoAction,
                loss: Some(loss),
                mark: false,
                default_port: 1,
                learn: true,
                points: (points::MARKER, points::INGRESS, points::EGRESS),
            },
            loss.table_size,
        );
        let droppers = cfg
            .drops
            .iter()
            .enumerate()
            .map(|(i, (pl, m))| {
                (*pl, Dropper::new(*m, cfg.seed.wrapping_mul(31).wrapping_add(i as u64 + 1)))
            })
            .collect();
        Replay {
            marker: cfg.mark.then(|| Marker::new(&loss, points::MARKER)),
            reorder: (cfg.reorder > 0).then(|| Reorderer::new(cfg.reorder, cfg.seed ^ 0xabcdef)),
            droppers,
            switch,
            next_hop: AnyColorTable::new(&loss, points::NEXT_HOP),
            sink: RingSink { prod, dropped: 0 },
            cons,
            agg,
            burst: Vec::with_capacity(BURST),
            held: Vec::new(),
            fwd: Forwarded(Vec::with_capacity(BURST)),
            link,
            packets: 0,
            skipped: [0; 4],
            cfg,
        }
    }

    fn dropped_at(&mut self, at: Placement, key: &FlowKey, batch: Option<u32>) -> bool {
        let mut drop = false;
        for (pl, d) in self.droppers.iter_mut() {
            if *pl == at && d.drop_packet(key, batch) {
                drop = true;
            }
        }
        drop
    }

    /// Feeds one packet from the capture.
    pub fn push(&mut self, mut pkt: Pkt) {
        self.packets += 1;
        let parsed = match flow::extract(&pkt.data, self.link) {
            Ok(p) => p,
            Err(r) => {
                if let Some(c) = self.skipped.get_mut(r.index()) {
                    *c += 1;
                }
                return;
            }
        };
        if let Some(m) = self.marker.as_mut() {
            let h = flow_hash(&parsed.key);
            if let Some((c, ord)) = m.mark(&parsed.key, h, pkt.ts_ns, &mut self.sink) {
                let d = with_color(parsed.dscp, self.cfg.loss.color_bit, c);
                // An unwritable header was already rejected by extract.
                let _ = flow::set_dscp(&mut pkt.data, &parsed, d);
                pkt.batch = Some(ord);
            }
        }
        match self.reorder.as_mut() {
            Some(r) => {
                r.push(pkt, &mut self.held);
                let held = std::mem::take(&mut self.held);
                for p in held {
                    self.link_stage(p);
                }
            }
            None => self.link_stage(pkt),
        }
        self.drain();
    }

    fn link_stage(&mut self, pkt: Pkt) {
        if let Ok(parsed) = flow::extract(&pkt.data, self.link) {
            if self.dropped_at(Placement::Ingress, &parsed.key, pkt.batch) {
                return;
            }
        }
        self.burst.push(pkt);
        if self.burst.len() == BURST {
            self.run_burst();
        }
    }

    fn run_burst(&mut self) {
        let mut burst = std::mem::take(&mut self.burst);
        self.fwd.0.clear();
        let droppers = &mut self.droppers;
        self.switch.process(&mut burst, &mut self.sink, &mut self.fwd, |key, p| {
            let mut drop = false;
            for (pl, d) in droppers.iter_mut() {
                if *pl == Placement::Switch && d.drop_packet(key, p.batch) {
                    drop = true;
                }
            }
            drop
        });
        let fwd = std::mem::take(&mut self.fwd.0);
        for &i in &fwd {
            let Some(p) = burst.get(i) else { continue };
            let Ok(parsed) = flow::extract(&p.data, self.link) else { continue };
            let batch = p.batch;
            if self.dropped_at(Placement::Egress, &parsed.key, batch) {
                continue;
            }
            let color = color_of(parsed.dscp, self.cfg.loss.color_bit);
            let h = flow_hash(&parsed.key);
            self.next_hop.observe(&parsed.key, h, color, p.ts_ns, &mut self.sink);
        }
        self.fwd.0 = fwd;
        burst.clear();
        self.burst = burst;
        self.drain();
    }

    fn drain(&mut self) {
        let agg = &mut self.agg;
        self.cons.drain(|ev| agg.handle(ev));
    }

    /// Ends the capture: releases held packets, closes every batch, resolves everything.
    pub fn finish(&mut self) {
        if let Some(r) = self.reorder.as_mut() {
            r.flush(&mut self.held);
            let held = std::mem::take(&mut self.held);
            for p in held {
                self.link_stage(p);
            }
        }
        if !self.burst.is_empty() {
            self.run_burst();
        }
        if let Some(m) = self.marker.as_mut() {
            m.flush(&mut self.sink);
        }
        self.drain();
        let (agg, cons) = (&mut self.agg, &mut self.cons);
        self.switch.flush(&mut self.sink, |_| {
            cons.drain(|ev| agg.handle(ev));
        });
        self.next_hop.flush(&mut self.sink);
        self.drain();
        self.agg.flush();
    }

    /// The dropper at `at`, if one was configured there (the first one).
    pub fn dropper(&self, at: Placement) -> Option<&Dropper> {
        self.droppers.iter().find(|(p, _)| *p == at).map(|(_, d)| d)
    }

    /// Ground truth: drops of `key` at `at`, in marker batch `batch` (or all batches).
    pub fn truth(&self, at: Placement, key: &FlowKey, batch: Option<u32>) -> u64 {
        self.droppers
            .iter()
            .filter(|(p, _)| *p == at)
            .map(|(_, d)| match batch {
                Some(b) => d.truth.get(&(*key, b)).copied().unwrap_or(0),
                None => d.flow_drops(key),
            })
            .sum()
    }

    /// Counters of the first-hop marker, when this pipeline marks.
    pub fn marker_stats(&self) -> Option<telemark_core::loss::PointStats> {
        self.marker.as_ref().map(|m| m.stats)
    }

    /// Counters of the switch.
    pub fn switch_stats(&self) -> SwitchStats {
        self.switch.stats()
    }

    /// Telemetry events lost to a full ring.
    pub fn ring_drops(&self) -> u64 {
        self.sink.dropped
    }

    /// Which dropper placement a point's loss corresponds to (the segment just upstream of it).
    pub fn placement_of_point(point: u8) -> Option<Placement> {
        match point {
            points::INGRESS => Some(Placement::Ingress),
            points::EGRESS => Some(Placement::Switch),
            points::NEXT_HOP => Some(Placement::Egress),
            _ => None,
        }
    }
}
