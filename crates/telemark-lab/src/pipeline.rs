//! Capture replay through the paper's evaluation path (V-B):
//!
//! ```text
//! capture ─► marker ─► [reorderer, dropper@ingress] ─► switch: ingress point ─► [dropper@switch]
//!        ─► egress point ─► [dropper@egress] ─► next-hop point
//! ```
//!
//! Every point sends batch events through one SPSC ring to the aggregator; the droppers keep
//! the ground truth. With `mark: false` the capture is taken as already colored.
//!
//! With [`ReplayConfig::heavy`], the SFCMon heavy-hitter pipeline watches what reaches the
//! switch, window by window (next to an exact count of every flow, the ground truth), and can
//! choose which flows the loss monitor watches: the top flows of each window (active flow
//! selection, [`Switch::select`]).

use crate::dropper::{DropModel, Dropper, Placement};
use crate::reorder::Reorderer;
use std::collections::HashMap;
use telemark_core::hash::FlowTableHasher;
use telemark_core::loss::{
    color_of, with_color, Aggregator, AnyColorTable, BatchEvent, LossConfig, Marker, PointSpec,
    Selection,
};
use telemark_core::sketch::sfcmon::{ExactFlows, HhConfig, HhWindow, Sfcmon};
use telemark_core::{flow_hash, FlowKey};
use telemark_datapath::switch::{Action, Points, Switch, SwitchConfig, SwitchStats, Tx, BURST};
use telemark_datapath::Pkt;
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

/// Flows the replay's marker (the senders) has room for at least.
pub const MARKER_FLOWS: usize = 1 << 16;

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
    /// Heavy hitters per window at the switch's ingress, and active flow selection.
    pub heavy: Option<HeavyConfig>,
}

impl Default for ReplayConfig {
    /// Marking at the first hop with the default loss monitor; no dropper, no reordering, only
    /// lossy batches reported, no heavy hitters.
    fn default() -> Self {
        ReplayConfig {
            loss: LossConfig::default(),
            mark: true,
            drops: Vec::new(),
            reorder: 0,
            seed: 1,
            agent: "sw".into(),
            report_all: false,
            heavy: None,
        }
    }
}

/// Heavy hitters per window in the replay.
#[derive(Debug, Clone)]
pub struct HeavyConfig {
    /// The SFCMon pipeline's settings.
    pub hh: HhConfig,
    /// Window length (packet time).
    pub window_ns: u64,
    /// Active flow selection: from the end of the first window on, the loss monitor watches
    /// only the `N` flows with the most packets in the last window (`None`: first come first
    /// served).
    pub select_top: Option<usize>,
    /// Exact counts of the top flows kept per window (ground truth next to the sketch's).
    pub exact_top: usize,
}

/// One window of the heavy-hitter pipeline, next to the exact counts.
#[derive(Debug, Clone)]
pub struct WindowReport {
    /// Time of the window's start.
    pub start_ns: u64,
    /// Time of its end.
    pub end_ns: u64,
    /// What the pipeline listed.
    pub hh: HhWindow,
    /// Exact packets and bytes of every flow listed, and of the window's top flows.
    pub exact: HashMap<FlowKey, (u64, u64), FlowTableHasher>,
    /// The window's heaviest flows by exact packets (`HeavyConfig::exact_top` of them).
    pub exact_top: Vec<FlowKey>,
    /// Flows the loss monitor watches in the next window (active flow selection).
    pub selected: Option<usize>,
}

struct Heavy {
    cfg: HeavyConfig,
    sfcmon: Sfcmon,
    exact: ExactFlows,
    start_ns: Option<u64>,
    windows: Vec<WindowReport>,
}

impl Heavy {
    /// Closes the window ending at `end_ns`; returns the next window's selection when asked.
    fn end_window(&mut self, end_ns: u64) -> Option<Selection> {
        let hh = self.sfcmon.end_window();
        let all = self.exact.flows();
        let mut top: Vec<(&FlowKey, &(u64, u64))> = all.iter().collect();
        let n = self.cfg.exact_top.min(top.len());
        if n > 0 && n < top.len() {
            top.select_nth_unstable_by(n - 1, |a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(b.0)));
        }
        top.truncate(n);
        top.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(b.0)));
        let mut exact: HashMap<FlowKey, (u64, u64), FlowTableHasher> =
            top.iter().map(|(k, v)| (**k, **v)).collect();
        for f in &hh.flows {
            exact.insert(f.key, all.get(&f.key).copied().unwrap_or_default());
        }
        let exact_top = top.iter().map(|(k, _)| **k).collect();
        // The heavy flows come most packets first.
        let selection: Option<Selection> =
            self.cfg.select_top.map(|n| hh.flows.iter().take(n).map(|f| f.key).collect());
        self.windows.push(WindowReport {
            start_ns: self.start_ns.unwrap_or(end_ns),
            end_ns,
            hh,
            exact,
            exact_top,
            selected: selection.as_ref().map(|s| s.len()),
        });
        self.exact.clear();
        self.start_ns = Some(end_ns);
        selection
    }
}

struct Forwarded(Vec<usize>);

/// A packet with the batch the pipeline's marker put it in: the droppers' ground truth, kept
/// beside the packet (the switch never sees it).
struct Marked {
    pkt: Pkt,
    batch: Option<u32>,
}
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
    reorder: Option<Reorderer<Marked>>,
    droppers: Vec<(Placement, Dropper)>,
    /// The switch under test.
    pub switch: Switch,
    next_hop: AnyColorTable,
    /// Events on their way to the aggregator: replay has time to wait, so it never drops
    /// one (a live agent's ring may; see `RingSink`).
    sink: Vec<BatchEvent>,
    /// The aggregator with every resolved batch.
    pub agg: Aggregator,
    burst: Vec<Pkt>,
    /// The marker's batch of each packet of `burst`, by index (ground truth for droppers).
    batches: Vec<Option<u32>>,
    held: Vec<Marked>,
    fwd: Forwarded,
    link: LinkType,
    /// Packets read.
    pub packets: u64,
    /// Packets without a flow key, per reason (see `SkipReason::ALL`).
    pub skipped: [u64; 4],
    heavy: Option<Heavy>,
}

impl Replay {
    /// A pipeline for packets of link type `link`.
    pub fn new(cfg: ReplayConfig, link: LinkType) -> Self {
        let loss = cfg.loss;
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
            every_batch: false,
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
                points: Points {
                    marker: points::MARKER,
                    ingress: points::INGRESS,
                    egress: points::EGRESS,
                },
                int_port: None,
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
            // The marker stands for the senders' first hops, not for the switch under test:
            // it has room for a capture's worth of flows even when the switch's table is
            // kept small.
            marker: cfg.mark.then(|| {
                let senders = LossConfig { table_size: loss.table_size.max(MARKER_FLOWS), ..loss };
                Marker::new(&senders, points::MARKER)
            }),
            reorder: (cfg.reorder > 0).then(|| Reorderer::new(cfg.reorder, cfg.seed ^ 0xabcdef)),
            droppers,
            switch,
            next_hop: AnyColorTable::new(&loss, points::NEXT_HOP),
            sink: Vec::with_capacity(1 << 10),
            agg,
            burst: Vec::with_capacity(BURST),
            batches: Vec::with_capacity(BURST),
            held: Vec::new(),
            fwd: Forwarded(Vec::with_capacity(BURST)),
            link,
            packets: 0,
            skipped: [0; 4],
            heavy: cfg.heavy.clone().map(|h| Heavy {
                sfcmon: Sfcmon::new(h.hh.clone()),
                exact: ExactFlows::default(),
                cfg: h,
                start_ns: None,
                windows: Vec::new(),
            }),
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
    pub fn push(&mut self, pkt: Pkt) {
        let mut pkt = Marked { pkt, batch: None };
        self.packets += 1;
        let parsed = match flow::extract(&pkt.pkt.data, self.link) {
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
            if let Some((c, ord)) = m.mark(&parsed.key, h, pkt.pkt.ts_ns, &mut self.sink) {
                let d = with_color(parsed.dscp, self.cfg.loss.color_bit, c);
                // An unwritable header was already rejected by extract.
                let _ = flow::set_dscp(&mut pkt.pkt.data, &parsed, d);
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

    fn link_stage(&mut self, Marked { pkt, batch }: Marked) {
        if let Ok(parsed) = flow::extract(&pkt.data, self.link) {
            if self.dropped_at(Placement::Ingress, &parsed.key, batch) {
                return;
            }
            self.heavy_stage(&parsed.key, &pkt);
        }
        self.burst.push(pkt);
        self.batches.push(batch);
        if self.burst.len() == BURST {
            self.run_burst();
        }
    }

    /// The heavy-hitter pipeline at the switch's ingress; at a window's end, the selection.
    fn heavy_stage(&mut self, key: &FlowKey, pkt: &Pkt) {
        let Some(h) = self.heavy.as_mut() else { return };
        let start = *h.start_ns.get_or_insert(pkt.ts_ns);
        let w = h.cfg.window_ns.max(1);
        if pkt.ts_ns >= start.saturating_add(w) {
            let sel = h.end_window(start.saturating_add(w));
            // Windows follow each other back to back; a silence of whole windows is skipped
            // (not reported window by window: a capture's clock may jump by years).
            let skipped = (pkt.ts_ns - start) / w;
            h.start_ns = Some(start.saturating_add(skipped.saturating_mul(w)));
            if let Some(sel) = sel {
                // The packets before the boundary go through under the old selection.
                if !self.burst.is_empty() {
                    self.run_burst();
                }
                self.switch.select(Some(sel.clone()), &mut self.sink);
                self.next_hop.select(Some(sel), &mut self.sink);
                self.drain();
            }
        }
        let Some(h) = self.heavy.as_mut() else { return };
        let len = pkt.bytes_on_wire().min(u64::from(u32::MAX)) as u32;
        h.sfcmon.observe(key, len);
        h.exact.observe(key, len);
    }

    /// The heavy-hitter windows so far (the last one closes in [`finish`](Self::finish)).
    pub fn windows(&self) -> &[WindowReport] {
        self.heavy.as_ref().map_or(&[], |h| &h.windows)
    }

    fn run_burst(&mut self) {
        let mut burst = std::mem::take(&mut self.burst);
        self.fwd.0.clear();
        let (droppers, batches) = (&mut self.droppers, &self.batches);
        let mut inside = |idx: usize, key: &FlowKey, _: &Pkt| {
            let batch = batches.get(idx).copied().flatten();
            let mut drop = false;
            for (pl, d) in droppers.iter_mut() {
                if *pl == Placement::Switch && d.drop_packet(key, batch) {
                    drop = true;
                }
            }
            !drop
        };
        self.switch.process_with(&mut burst, &mut self.sink, &mut self.fwd, &mut inside);
        let fwd = std::mem::take(&mut self.fwd.0);
        for &i in &fwd {
            let Some(p) = burst.get(i) else { continue };
            let Ok(parsed) = flow::extract(&p.data, self.link) else { continue };
            let batch = self.batches.get(i).copied().flatten();
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
        self.batches.clear();
        self.drain();
    }

    fn drain(&mut self) {
        for ev in self.sink.drain(..) {
            self.agg.handle(ev);
        }
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
        if let Some(h) = self.heavy.as_mut() {
            if h.exact.packets() > 0 {
                // The last window ends with the capture.
                let end = h.start_ns.map_or(0, |s| s.saturating_add(h.cfg.window_ns));
                h.end_window(end);
            }
        }
        if let Some(m) = self.marker.as_mut() {
            m.flush(&mut self.sink);
        }
        self.drain();
        let agg = &mut self.agg;
        self.switch.flush(&mut self.sink, |events| {
            for ev in events.drain(..) {
                agg.handle(ev);
            }
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

    /// Counters of the next hop's color table.
    pub fn next_hop_stats(&self) -> telemark_core::loss::PointStats {
        self.next_hop.stats()
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
