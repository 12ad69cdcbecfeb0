//! The record schema shared by every output (DESIGN.md, "Records"): agent export, SQLite, HTTP
//! API and `--json`. Times are nanoseconds since the Unix epoch.

use serde::{Deserialize, Serialize};
use telemark_wire::FlowKey;

/// Whether `s` may name an agent (the name every record carries, and a token's holder): 1 to
/// 64 ASCII letters, digits and `-_.:`. The agent's config and the collector check it alike.
pub fn valid_agent_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// A flow key as it appears in records.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Flow {
    /// Source address.
    pub src: String,
    /// Destination address.
    pub dst: String,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
    /// NSH service path identifier.
    pub spi: Option<u32>,
    /// NSH service index.
    pub si: Option<u8>,
}

impl From<&FlowKey> for Flow {
    fn from(k: &FlowKey) -> Flow {
        Flow {
            src: k.src.to_string(),
            dst: k.dst.to_string(),
            sport: k.sport,
            dport: k.dport,
            proto: k.proto,
            spi: k.spi,
            si: k.si,
        }
    }
}

impl TryFrom<&Flow> for FlowKey {
    type Error = core::net::AddrParseError;
    /// The flow key back from a record (fails only on an address that does not parse).
    fn try_from(f: &Flow) -> Result<FlowKey, Self::Error> {
        Ok(FlowKey {
            src: f.src.parse()?,
            dst: f.dst.parse()?,
            sport: f.sport,
            dport: f.dport,
            proto: f.proto,
            spi: f.spi,
            si: f.si,
        })
    }
}

/// One batch at one observation point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossRecord {
    /// Agent (switch) name.
    pub agent: String,
    /// Port the point observes.
    pub port: String,
    /// Point name: `ingress`, `egress`, or a name given on the command line.
    pub point: String,
    /// The point the expected count came from: a point of this agent (`ingress`), or for a
    /// [`Scope::Path`] record the other agent's point named in the configuration
    /// (`sw-b/egress`), if any.
    pub upstream: Option<String>,
    /// Which stretch of the path `lost` and `uncertain` cover.
    #[serde(default)]
    pub scope: Scope,
    /// The flow.
    pub flow: Flow,
    /// Color of the batch.
    pub color: u8,
    /// Batch number, the same at every point (taken from the most upstream point that saw it).
    /// With [`LossRecord::period_ns`], the marking period's number k: the batch is the packets
    /// the marker sent in `[kT, (k+1)T)` of Unix time.
    pub batch: u64,
    /// The marking period T when batches are periods of time numbered from the Unix epoch (the
    /// eBPF datapath, RFC 9341 §3.2): two points' batches with the same `batch` are the same
    /// packets, whatever their clocks say of `first_ns`. Absent: `batch` is a point's own
    /// running number, and batches are lined up across agents by time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_ns: Option<u64>,
    /// First packet at this point.
    pub first_ns: u64,
    /// Last in-time packet at this point.
    pub last_ns: u64,
    /// Packets expected: the upstream point's count, or B where this batch was marked.
    pub expected: Option<u64>,
    /// Packets counted in time.
    pub observed: u64,
    /// Packets lost on the segment ending here: expected − observed − late, unless the batch
    /// is uncertain (then they are in `uncertain`).
    pub lost: u64,
    /// Packets that arrived after the batch closed (reordering), counted separately.
    pub late: u64,
    /// Packets missing here whose loss cannot be told (see [`LossCounts::uncertain`]); they
    /// are not in `lost`.
    #[serde(default)]
    pub uncertain: u64,
    /// The batch was closed by a flush or an idle timeout, not by the next color: the point
    /// ended its watch of the flow with it (nothing of the flow follows until it starts again).
    #[serde(default, skip_serializing_if = "is_false")]
    pub tail: bool,
    /// The point may have missed some of the batch: events about it were lost between the
    /// datapath and the aggregation (a full event ring; on the eBPF datapath also a period the
    /// kernel overwrote before it was read). Its counts are no measurement: its shortfall is
    /// `uncertain` here, and the collector does not line it up with another agent's.
    #[serde(default, skip_serializing_if = "is_false")]
    pub incomplete: bool,
    /// The IPv4 TTL (IPv6 hop limit) the flow's packets had at this point (the eBPF datapath):
    /// each routed hop takes one off, so the collector tells hosts along a routed path apart
    /// by it where what they counted is alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u8>,
    /// Packets of the flow its sender sent with the colour bit already set, which the marker
    /// left as they were and did not measure (the eBPF datapath's `[ebpf] own_colour = "keep"`;
    /// docs/ebpf.md). Only in a record of the marker's point, whose counts are then 0 and
    /// `incomplete`: the flow is not measured while its sender sets the bit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub own_colour: u64,
    /// Why the kernel said it dropped packets of this flow here, per drop reason
    /// (`skb:kfree_skb`, on the eBPF datapath): the drops the agent saw since the flow's last
    /// lossy record at its points. Empty where the datapath cannot tell.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drops: Vec<DropCount>,
}

/// Packets the kernel dropped for one reason (its `enum skb_drop_reason` name without the
/// `SKB_DROP_REASON_` prefix: `NETFILTER_DROP`, `QDISC_DROP`, …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropCount {
    /// The reason.
    pub reason: String,
    /// Packets.
    pub packets: u64,
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// Which stretch of a flow's path a point's loss figures cover.
///
/// A point's loss is measured against a count of the same batch taken upstream. Inside one
/// agent that is the point just upstream (a segment); a point whose upstream is in another
/// agent has only the batch size B the marking switch used, so its figures cover the whole
/// path from the marking. The collector turns those into segments by lining the points up
/// (docs/collector.md, "Segments").
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// From the point named in `upstream`, in the same agent, to this one.
    #[default]
    Segment,
    /// From the switch that marked the flow to this point: everything lost on the way.
    Path,
}

impl Scope {
    /// The name in records and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Segment => "segment",
            Scope::Path => "path",
        }
    }
}

/// Loss counts over a span of batches at one point (an interval, a flow's run): the one set of
/// counters the aggregator keeps and the `summary` and `flow_loss` records carry.
///
/// Every packet expected at the point ends in exactly one of `observed`, `late`, `lost` and
/// `uncertain` (and `excess` counts packets beyond what was expected).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LossCounts {
    /// Batches resolved.
    pub batches: u64,
    /// Batches that lost packets.
    pub lossy_batches: u64,
    /// Packets expected (over batches whose expectation was known).
    pub expected: u64,
    /// Packets observed in time.
    pub observed: u64,
    /// Packets that arrived after their batch closed (reordering), counted with it.
    pub late: u64,
    /// Packets lost on the segment ending at this point.
    pub lost: u64,
    /// Packets missing at this point whose loss cannot be told apart from the monitor's own
    /// limits: reordering deeper than the step threshold absorbs, telemetry events the agent
    /// could not hand off, or whole batches at the edge of the span the point watched the flow
    /// (see docs/loss.md, "What is lost and what is uncertain").
    pub uncertain: u64,
    /// Batches with uncertain packets.
    pub uncertain_batches: u64,
    /// Packets observed beyond what was expected (duplicates, or deep reordering).
    pub excess: u64,
    /// Batches with no upstream batch to compare with.
    pub unmatched: u64,
}

impl LossCounts {
    /// Adds `o` to these counts.
    pub fn add(&mut self, o: &LossCounts) {
        self.batches += o.batches;
        self.lossy_batches += o.lossy_batches;
        self.expected += o.expected;
        self.observed += o.observed;
        self.late += o.late;
        self.lost += o.lost;
        self.uncertain += o.uncertain;
        self.uncertain_batches += o.uncertain_batches;
        self.excess += o.excess;
        self.unmatched += o.unmatched;
    }
}

/// Per-point summary over one reporting interval.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SummaryRecord {
    /// Agent name.
    pub agent: String,
    /// Point name.
    pub point: String,
    /// Start of the interval.
    pub interval_start_ns: u64,
    /// End of the interval.
    pub interval_end_ns: u64,
    /// Which stretch of the path the counts cover.
    #[serde(default)]
    pub scope: Scope,
    /// The batches resolved in the interval.
    #[serde(flatten)]
    pub counts: LossCounts,
    /// Frames the agent's own receive ring dropped on this point's port in the interval: loss
    /// this point reports may then be the agent's, not the link's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rx_ring_drops: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A flow's loss totals at one point over a whole run (`replay` prints these).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowLossRecord {
    /// Agent name.
    pub agent: String,
    /// Point name.
    pub point: String,
    /// The flow.
    pub flow: Flow,
    /// Which stretch of the path the counts cover.
    #[serde(default)]
    pub scope: Scope,
    /// The flow's batches at this point.
    #[serde(flatten)]
    pub counts: LossCounts,
    /// Packets lost on this segment according to the dropper's record (replay only).
    pub truth_lost: Option<u64>,
}

/// A flow's packets and bytes in a window at one point, exact or estimated with its error
/// bound (the heavy-hitter pipeline's listing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowRecord {
    /// Agent name.
    pub agent: String,
    /// Port observed.
    pub port: String,
    /// Point name.
    pub point: String,
    /// The flow.
    pub flow: Flow,
    /// Start of the window.
    pub window_start_ns: u64,
    /// End of the window.
    pub window_end_ns: u64,
    /// Packets counted (estimated: a lower bound, the true count is at most
    /// `packets + error_bound`).
    pub packets: u64,
    /// Bytes counted (estimated: from the same packets as `packets`).
    pub bytes: u64,
    /// Whether the counts are exact.
    pub exact: bool,
    /// Packets the count may miss (0 when exact).
    pub error_bound: u64,
    /// The flow's true packets in the window (replay only: the exact count next to the
    /// sketch's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truth_packets: Option<u64>,
    /// The flow's true bytes in the window (replay only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truth_bytes: Option<u64>,
    /// What a flow exporter (NetFlow, IPFIX, sFlow) said of the flow besides its key and
    /// counts; empty in agents' heavy-hitter records and in records stored before these
    /// fields existed.
    #[serde(flatten)]
    pub exported: FlowExport,
    /// What the heavy-hitter pipeline knew of the flow and of its window besides the counts
    /// (agents' and replay's heavy flows); empty in exporters' records.
    #[serde(flatten)]
    pub heavy: HeavyContext,
}

/// A heavy flow's best estimate and its window (SFCMon; docs/sketches.md): enough to
/// recompute the threshold and to tell whether every heavy flow of the window arrived.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeavyContext {
    /// Best estimate of the flow's packets in the window: those counted since admission
    /// (`packets`) plus its source's Count-Min count when it was admitted, at most
    /// `packets + error_bound`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<u64>,
    /// Estimated bytes: `bytes` scaled by `estimate / packets`, the packets missed before
    /// admission taken at the flow's mean size (an estimate, not a bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_bytes: Option<u64>,
    /// Packets the port received in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_packets: Option<u64>,
    /// The window's bar in packets: a flow is heavy when its source reaches it (the
    /// configured threshold × `window_packets`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_packets: Option<u64>,
    /// Heavy flows the window listed (this record is one of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_flows: Option<u64>,
    /// Whether the window's list is complete (the IBLT listed every admitted flow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<bool>,
}

/// Where an exporter observed a flow: IPFIX / NetFlow v9 flowDirection (IE 61, RFC 5102).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Where packets enter the observation point (flowDirection 0).
    Ingress,
    /// Where they leave it (flowDirection 1).
    Egress,
}

impl Direction {
    /// Its name in records and queries.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// The elements of an exported flow a [`FlowRecord`] keeps (docs/flows.md): every one is
/// optional, absent when the exporter did not say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowExport {
    /// Where the exporter observed the flow; absent: unknown (the exporter did not say, or
    /// used the element for something else, as softflowd does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<Direction>,
    /// IPv4 ToS / IPv6 traffic class byte (DSCP is its top six bits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tos: Option<u8>,
    /// TCP flags seen in the flow (OR of its packets').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_flags: Option<u8>,
    /// Output interface index, as the exporter numbers them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_port: Option<String>,
    /// One packet in this many was sampled (1: every packet); `packets` and `bytes` are
    /// already scaled by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_rate: Option<u32>,
    /// Whether the window is the exporter's own first and last packet times (true) or the
    /// arrival time at the collector (false: the exporter sent none, or none believable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter_times: Option<bool>,
}

impl FlowRecord {
    /// A heavy flow the SFCMon pipeline listed in window `w` (`start_ns..end_ns`) at `agent`'s
    /// `port` (point `ingress`), without the truth.
    pub fn heavy(
        agent: &str,
        port: &str,
        (start_ns, end_ns): (u64, u64),
        w: &crate::sketch::sfcmon::HhWindow,
        f: &crate::sketch::sfcmon::HeavyFlow,
    ) -> FlowRecord {
        let estimate = f.estimate.clamp(f.packets, f.packets.saturating_add(f.error_bound));
        let estimate_bytes = match f.packets {
            0 => f.bytes,
            n => (u128::from(f.bytes) * u128::from(estimate) / u128::from(n))
                .try_into()
                .unwrap_or(u64::MAX),
        };
        FlowRecord {
            agent: agent.into(),
            port: port.into(),
            point: "ingress".into(),
            flow: Flow::from(&f.key),
            window_start_ns: start_ns,
            window_end_ns: end_ns,
            packets: f.packets,
            bytes: f.bytes,
            exact: f.error_bound == 0,
            error_bound: f.error_bound,
            truth_packets: None,
            truth_bytes: None,
            exported: FlowExport::default(),
            heavy: HeavyContext {
                estimate: Some(estimate),
                estimate_bytes: Some(estimate_bytes),
                window_packets: Some(w.packets),
                threshold_packets: Some(w.threshold_packets),
                window_flows: Some(w.flows.len() as u64),
                complete: Some(w.complete),
            },
        }
    }
}

/// An INT event: a detector fired on one packet's (or one report's) telemetry
/// (DESIGN.md "Records"; the detectors of the INT paper, `telemark_core::int`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Who detected it: the sink agent, or the INT collector.
    pub agent: String,
    /// The flow, as the INT source saw it.
    pub flow: Flow,
    /// `per_hop`, `per_flow`, `ewma`, `noop`, `complex`, or `switch` (a report a switch
    /// already filtered, passed on as it came).
    pub detector: String,
    /// The INT field watched (`None` for noop and complex detection).
    pub metric: Option<String>,
    /// Per-hop detection: the hop's position on the path, 0 = the last switch.
    pub hop: Option<u8>,
    /// Per-hop detection: that hop's switch (node) ID.
    pub switch_id: Option<u32>,
    /// The value that crossed: the hop's, the path's sum, or the average.
    pub value: u64,
    /// The threshold crossed.
    pub threshold: Option<u64>,
    /// When the packet (or report) was seen.
    pub time_ns: u64,
    /// The expression, for complex detection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
    /// The path's metadata on that packet, newest hop first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<EventHop>,
}

/// One hop's metadata in an event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventHop {
    /// Switch (node) ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switch_id: Option<u32>,
    /// Hop latency, ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hop_latency: Option<u64>,
    /// Queue ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_id: Option<u32>,
    /// Queue occupancy (bytes in Telemark's switch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_occupancy: Option<u64>,
    /// Ingress port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_port: Option<u32>,
    /// Egress port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_port: Option<u32>,
    /// Egress timestamp, ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_ts: Option<u64>,
    /// Egress port TX utilisation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_utilization: Option<u64>,
}

/// What one fast-path stage spent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostRecord {
    /// Agent name.
    pub agent: String,
    /// Stage name.
    pub stage: String,
    /// Packets through the stage.
    pub packets: u64,
    /// CPU cycles (or nanoseconds where no cycle counter is available) spent.
    pub cycles: u64,
    /// Interval length.
    pub interval_ns: u64,
}

/// An agent's own health over one interval: what its fast path could not do, so that loss it
/// reports can be told from its own limits. Counters are the interval's; `flows` and
/// `capacity` are the tables' state at its end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthRecord {
    /// Agent name.
    pub agent: String,
    /// Start of the interval.
    pub interval_start_ns: u64,
    /// End of the interval.
    pub interval_end_ns: u64,
    /// Frames read from all receive rings.
    pub rx: u64,
    /// Frames the kernel dropped because a receive ring was full: the agent's own loss, which
    /// its points may read as loss upstream of them.
    pub rx_ring_drops: u64,
    /// Frames not sent because a transmit ring was full, too big or refused.
    pub tx_drops: u64,
    /// Telemetry events the fast path could not hand to the aggregator (the batches they
    /// concerned are reported uncertain, not lost).
    pub events_lost: u64,
    /// Records the export buffer had no room for.
    pub export_dropped: u64,
    /// Each observation point's table.
    pub points: Vec<PointHealth>,
    /// The heavy-hitter windows closed in the interval, one per port and window, those with
    /// no heavy flow too (with `[heavy_hitters]`): an empty window is told from a lost one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hh_windows: Vec<HhWindowHealth>,
}

/// One heavy-hitter window of one port (see [`HealthRecord::hh_windows`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HhWindowHealth {
    /// Input port.
    pub port: String,
    /// Start of the window.
    pub window_start_ns: u64,
    /// End of the window.
    pub window_end_ns: u64,
    /// Packets the port received in it.
    pub packets: u64,
    /// Its bar in packets (threshold × packets).
    pub threshold_packets: u64,
    /// Heavy flows it listed (each a `flow` record).
    pub heavy_flows: u64,
    /// Whether the list is complete.
    pub complete: bool,
}

/// One observation point's table over an interval (see [`HealthRecord`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PointHealth {
    /// Point name.
    pub point: String,
    /// Port it observes.
    pub port: String,
    /// Flows admitted.
    pub flows_admitted: u64,
    /// Flows retired to make room or for idleness.
    pub flows_evicted: u64,
    /// Packets of flows the table had no room for (not measured there).
    pub packets_refused: u64,
    /// Packets of flows active flow selection left out.
    pub packets_unselected: u64,
    /// Flows held at the end of the interval.
    pub flows: u64,
    /// Flows the table can hold.
    pub capacity: u64,
}

/// What was read of a capture file (`replay --json`): every packet, or where and why reading
/// stopped, and what was skipped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureRecord {
    /// The file.
    pub file: String,
    /// Link type of the packets replayed (LINKTYPE name and number).
    pub link: String,
    /// Packet records read.
    pub packets: u64,
    /// Of those, packets cut short by the capture's snapshot length (counted at their length
    /// on the wire).
    pub cut: u64,
    /// Packets not replayed, by reason (`unsupported_link`, `other_link`, `truncated`,
    /// `not_ip`, `malformed`, `too_deep`).
    pub skipped: std::collections::BTreeMap<String, u64>,
    /// Whether the whole file was read.
    pub complete: bool,
    /// Where and why reading stopped early (a damaged or truncated record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
}

/// Any record, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A batch (normally a lossy one).
    Loss(LossRecord),
    /// An interval summary per point.
    Summary(SummaryRecord),
    /// Per-flow totals of a run.
    FlowLoss(FlowLossRecord),
    /// A flow's packets and bytes in a window.
    Flow(FlowRecord),
    /// Fast-path cost.
    Cost(CostRecord),
    /// What was read of a capture (replay).
    Capture(CaptureRecord),
    /// An agent's own health.
    Health(HealthRecord),
    /// An INT detector fired.
    Event(EventRecord),
}

impl Record {
    /// The agent the record names (a capture's record names none).
    pub fn agent(&self) -> Option<&str> {
        match self {
            Record::Loss(r) => Some(&r.agent),
            Record::Summary(r) => Some(&r.agent),
            Record::FlowLoss(r) => Some(&r.agent),
            Record::Flow(r) => Some(&r.agent),
            Record::Cost(r) => Some(&r.agent),
            Record::Health(r) => Some(&r.agent),
            Record::Event(r) => Some(&r.agent),
            Record::Capture(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_record_matches_design_schema() {
        let r = Record::Loss(LossRecord {
            agent: "sw-b".into(),
            port: "veth1".into(),
            point: "egress".into(),
            upstream: Some("ingress".into()),
            flow: Flow {
                src: "10.0.0.1".into(),
                dst: "10.0.0.7".into(),
                sport: 40000,
                dport: 5201,
                proto: 17,
                spi: None,
                si: None,
            },
            color: 1,
            batch: 17,
            period_ns: None,
            first_ns: 1,
            last_ns: 2,
            expected: Some(100),
            observed: 97,
            lost: 3,
            late: 0,
            uncertain: 0,
            scope: Scope::Segment,
            tail: false,
            incomplete: false,
            drops: Vec::new(),
            ttl: None,
            own_colour: 0,
        });
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["scope"], "segment");
        assert_eq!(v["kind"], "loss");
        assert_eq!(v["flow"]["sport"], 40000);
        assert_eq!(v["flow"]["spi"], serde_json::Value::Null);
        for f in [
            "agent", "port", "point", "color", "batch", "first_ns", "last_ns", "expected",
            "observed", "lost", "late",
        ] {
            assert!(v.get(f).is_some(), "{f}");
        }
        let back: Record = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn flow_record_matches_design_schema() {
        let text = r#"{"kind":"flow","agent":"sw-b","port":"veth1","point":"ingress",
            "flow":{"src":"10.0.0.1","dst":"10.0.0.7","sport":40000,"dport":5201,"proto":17,
            "spi":null,"si":null},"window_start_ns":0,"window_end_ns":0,"packets":120345,
            "bytes":98000000,"exact":false,"error_bound":412}"#;
        let r: Record = serde_json::from_str(text).unwrap();
        let Record::Flow(f) = &r else { panic!("not a flow record: {r:?}") };
        assert_eq!((f.packets, f.bytes, f.exact, f.error_bound), (120345, 98000000, false, 412));
        assert_eq!(f.truth_packets, None);
        let back: serde_json::Value = serde_json::to_value(&r).unwrap();
        let want: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(back, want, "replay-only fields must not appear when unset");
    }
}
