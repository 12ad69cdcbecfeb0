//! The seam between a datapath and the rest of the agent. A datapath measures packets and
//! hands the aggregation, the outputs and `/metrics` the same things whatever it is:
//!
//! - batch events (the loss paper's per-batch counts at each point) into an SPSC ring the
//!   aggregation drains, and the INT events and heavy-hitter windows into theirs;
//! - flow-meter samples and cache exports into the flow-export thread's rings;
//! - its counters ([`PathStats`](crate::shared::PathStats)) into the shared state, ten times a
//!   second, taking new watch and INT rules from the shared mailboxes when it does;
//! - at stop, every open batch closed (upstream first) so nothing counted is lost, then `done`.
//!
//! The AF_PACKET switch and taps (fast_path.rs) are one datapath.

use crate::config::{AgentConfig, MarkSide};
use crate::egress::RuledEvent;
use crate::flow_export::PortInfo;
use crate::shared::Shared;
use std::sync::atomic::AtomicBool;
use telemark_core::loss::{BatchEvent, PointSpec};
use telemark_core::spsc::Consumer;
use telemark_datapath::flow_meter::MeterRings;
use telemark_datapath::heavy_hitters::PortWindow;

/// A datapath, run on a thread of its own.
pub(crate) trait Datapath: Send {
    /// Measures until `stop` is set; then flushes (see the module's documentation),
    /// publishes its last counters and sets `done`.
    fn run(self: Box<Self>, stop: &AtomicBool, done: &AtomicBool, shared: &Shared);
}

/// A datapath ready to run, and the ends of its rings the rest of the agent reads.
pub(crate) struct Started {
    pub(crate) path: Box<dyn Datapath>,
    /// Each port as sFlow and IPFIX name it (configuration order).
    pub(crate) ports: Vec<PortInfo>,
    pub(crate) events: Consumer<BatchEvent>,
    pub(crate) int_events: Consumer<RuledEvent>,
    /// With `[heavy_hitters]`.
    pub(crate) hh_windows: Option<Consumer<PortWindow>>,
    /// With `[sflow]` or `[ipfix]`.
    pub(crate) meter_rings: Option<MeterRings>,
}

/// An input port's observation points, as numbered in the aggregator.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortPoints {
    /// Where this agent colours the port's arriving traffic; `None`: it does not mark it.
    pub(crate) marker: Option<u8>,
    /// Where the port's arriving traffic is counted in (a tap's one point).
    pub(crate) ingress: u8,
    /// Where it is counted out, at the pair's other port; `None` for a tap.
    pub(crate) egress: Option<u8>,
}

/// The aggregator's points for the configuration, and each input port's points (pair ports
/// first, then taps).
pub(crate) fn layout(cfg: &AgentConfig) -> (Vec<PointSpec>, Vec<PortPoints>) {
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
            every_batch: false,
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
