//! The agent's shared state: each thread's counters, published where the others read them
//! (each thread writes only its own), and the mailboxes through which a reload or the control
//! API hands new rules to the datapath. Every other module of the agent may read this one; it
//! reads none of them but the stage counters' types.

use crate::config::{AgentConfig, IntRules};
use crate::egress::IntStats;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use telemark_core::int::Detectors;
use telemark_core::loss::PointStats;
use telemark_datapath::flow_meter::{MeterStats, PortCounters};
use telemark_datapath::heavy_hitters::HhStats;
use telemark_datapath::queue::QueueStats;
use telemark_wire::FlowKey;

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
    /// Each observation point's table.
    #[serde(skip)]
    pub points: Vec<PointTable>,
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
    /// The eBPF datapath's own, with `[[port]]`.
    #[serde(skip)]
    pub ebpf: Option<EbpfStats>,
}

/// What the eBPF datapath adds to its counters: the kernel programs' own.
#[derive(Debug, Clone, Default)]
pub struct EbpfStats {
    /// The programs' counters (map "stats", summed over CPUs), by name.
    pub kernel: Vec<(&'static str, u64)>,
    /// Each program's runs and time in them, when the kernel keeps them
    /// (`kernel.bpf_stats_enabled`; otherwise 0).
    pub programs: Vec<telemark_datapath::ebpf::RunCost>,
    /// Its points by number, as (name, port): they are added as interfaces appear.
    pub points: Vec<(String, String)>,
    /// Interfaces attached now.
    pub attached: u64,
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

/// One observation point's table, as the fast path publishes it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PointTable {
    /// The point's number (its place in the aggregation's points).
    pub point: u8,
    /// The point's counters.
    pub stats: PointStats,
    /// Flows the table holds now.
    pub flows: u64,
    /// Flows the table can hold.
    pub capacity: u64,
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
    pub(crate) path: Mutex<PathStats>,
    pub(crate) export: Mutex<ExportStats>,
    /// Watch rules a reload or the control API gave, for the fast path to take (it looks ten
    /// times a second).
    pub(crate) new_watch: Mutex<Option<telemark_core::watch::Watch>>,
    /// The watch rules in force (or about to be: the fast path takes them within 100 ms).
    pub(crate) watch: Mutex<telemark_core::watch::Watch>,
    /// Export settings a reload gave, for the aggregator thread to take.
    pub(crate) new_export: Mutex<Option<AgentConfig>>,
    /// The INT rules: in force, and new ones for the fast path to take.
    pub(crate) int: Mutex<IntMailbox>,
    /// The flow-export thread's counters.
    pub(crate) flow_export: Mutex<FlowExportStats>,
    /// Points a datapath added (the eBPF datapath, as it attaches interfaces and sees paths),
    /// in order, for the aggregation to add before it reads events that name them.
    pub(crate) new_points: Mutex<Vec<telemark_core::loss::PointSpec>>,
    /// The kernel's drops of measured flows per reason (eBPF datapath), not yet named in a
    /// loss record: the aggregation attaches a flow's to its next lossy record.
    pub(crate) pending_drops: Mutex<HashMap<FlowKey, BTreeMap<String, u64>>>,
    /// Batch events the aggregation has taken from the datapath and turned into the records
    /// they give so far (the eBPF datapath forgets a departed flow's unnamed drops after its
    /// tail events).
    pub(crate) events_handled: std::sync::atomic::AtomicU64,
    /// All drops the kernel reported since start, per reason, watched flows or not (eBPF).
    pub(crate) kernel_drops: Mutex<Vec<(String, u64)>>,
    /// The ports as sFlow and IPFIX name them, when a datapath changed them (the eBPF
    /// datapath, as it attaches interfaces), for the flow-export thread to take.
    pub(crate) new_ports: Mutex<Option<Vec<crate::flow_export::PortInfo>>>,
    /// `[[port]]`s a reload gave, for the eBPF datapath to take (it looks every half period).
    pub(crate) new_ebpf_ports: Mutex<Option<Vec<crate::config::EbpfPortConfig>>>,
    /// The eBPF datapath's ports by number, as its points name them (`ns:interface`).
    pub(crate) port_labels: Mutex<Vec<String>>,
    /// Rung by the datapath as it hands events to the aggregation thread (the switch while
    /// frames come, the eBPF datapath after each sweep), which waits on it while idle.
    pub(crate) aggregation_bell: crate::doorbell::Doorbell,
}

/// INT rules in force (what `GET /api/v1/int` shows) and those the fast path is to take next,
/// with their detector table built already (off the fast path: it may be megabytes), under
/// one lock so that the two never disagree.
#[derive(Default)]
pub(crate) struct IntMailbox {
    pub(crate) in_force: Option<IntRules>,
    pub(crate) pending: Option<(IntRules, Detectors)>,
    /// Flows the detector table holds.
    pub(crate) flows: usize,
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

    /// Puts new watch rules in force; whether they differ from those in force.
    pub(crate) fn set_watch(&self, w: telemark_core::watch::Watch) -> bool {
        let mut cur = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        if *cur == w {
            return false;
        }
        *cur = w.clone();
        *self.new_watch.lock().unwrap_or_else(|p| p.into_inner()) = Some(w);
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

/// The thread's counters (the agent's `/metrics`, `telemark_agent_sflow_*` and
/// `telemark_agent_ipfix_*`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct FlowExportStats {
    /// sFlow datagrams sent (each collector's counted).
    pub sflow_datagrams: u64,
    /// Flow samples in them.
    pub sflow_flow_samples: u64,
    /// Counter samples in them.
    pub sflow_counter_samples: u64,
    /// IPFIX messages sent.
    pub ipfix_messages: u64,
    /// IPFIX flow records sent.
    pub ipfix_flow_records: u64,
    /// IPFIX loss records sent.
    pub ipfix_loss_records: u64,
    /// Records not sent: a collector unreachable, a send failing.
    pub ipfix_not_sent: u64,
    /// Loss records not handed to this thread: its queue was full (counted by the aggregator
    /// thread, which hands them over).
    pub ipfix_loss_queue_full: u64,
    /// Datagrams or messages whose send failed.
    pub flow_send_errors: u64,
}
