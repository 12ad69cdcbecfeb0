//! Flow export ingest: NetFlow v5, NetFlow v9, IPFIX and sFlow v5 datagrams from any exporter,
//! turned into [`ExportedFlow`]s (docs/flows.md).
//!
//! What a collector of these formats must remember, per exporter address and observation
//! domain (RFC 7011 §8, RFC 3954 §5):
//! - **Templates**, defined, redefined and withdrawn in wire order ([`ipfix::Templates`]).
//! - **Data that came before its template** (UDP reorders, a collector restarts): kept, up
//!   to [`Decoder::new`]'s bound, and decoded when the template comes; what the bound does not
//!   hold is dropped and counted.
//! - **Sampling**, from options data: a sampler's id and its interval (RFC 7270 samplerId and
//!   samplerRandomInterval, RFC 5477 samplingPacketInterval, v9's FLOW_SAMPLER_*), applied to
//!   the flows that name the sampler, or to every flow of the domain when the options record
//!   names none. A rate in the data record itself wins.
//! - **Sequence numbers**, turned into records the exporter sent and this collector never got:
//!   IPFIX counts data records, v9 packets, v5 flows, sFlow datagrams per sub-agent.
//!
//! sFlow flow samples are read with Telemark's own packet parser ([`telemark_wire::flow`]),
//! so tunnels, VLAN stacks and NSH give the same flow key as in the switch.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use telemark_core::records::Direction;
use telemark_wire::flow::{extract, FlowKey, Fragment};
use telemark_wire::ipfix::{self, Message, SetKind, Template, TemplateRecord, Templates, Value};
use telemark_wire::link::LinkType;
use telemark_wire::{netflow5, sflow};

/// Which protocol carried a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// NetFlow v5.
    NetflowV5,
    /// NetFlow v9.
    NetflowV9,
    /// IPFIX.
    Ipfix,
    /// sFlow v5.
    Sflow,
}

impl Protocol {
    /// Its name in records and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::NetflowV5 => "netflow5",
            Protocol::NetflowV9 => "netflow9",
            Protocol::Ipfix => "ipfix",
            Protocol::Sflow => "sflow",
        }
    }
}

/// A flow as an exporter reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedFlow {
    /// The exporter: the address the datagram came from (for sFlow too; the agent address
    /// inside an sFlow datagram is only a claim, kept in `agent`).
    pub exporter: IpAddr,
    /// sFlow: the agent address the datagram claims (not checked: anyone may claim any).
    pub agent: Option<IpAddr>,
    /// Observation domain (IPFIX), source id (v9), engine (v5), sub-agent (sFlow).
    pub domain: u32,
    /// The protocol.
    pub protocol: Protocol,
    /// The flow key.
    pub key: FlowKey,
    /// Input interface index (0 unknown).
    pub in_if: u32,
    /// Output interface index (0 unknown).
    pub out_if: u32,
    /// Packets the exporter counted (sampled packets when sampled).
    pub packets: u64,
    /// Bytes the exporter counted.
    pub bytes: u64,
    /// One packet in this many was sampled (1: every packet).
    pub sampling_rate: u32,
    /// First packet, ns since the epoch (0 unknown).
    pub start_ns: u64,
    /// Last packet, ns since the epoch (0 unknown).
    pub end_ns: u64,
    /// TCP flags seen.
    pub tcp_flags: u8,
    /// IP TOS / traffic class.
    pub tos: u8,
    /// VLAN, when reported.
    pub vlan: Option<u16>,
    /// The packet was dropped (sFlow discard events, an IPFIX forwarding status of dropped).
    pub dropped: bool,
    /// Where the exporter observed the flow (flowDirection, IE 61), when it means ingress or
    /// egress by it ([`Domain::flow_record`] says when it does not).
    pub direction: Option<Direction>,
}

impl ExportedFlow {
    /// Packets on the wire the flow stands for: its count scaled by the sampling rate.
    pub fn packets_estimated(&self) -> u64 {
        self.packets.saturating_mul(u64::from(self.sampling_rate.max(1)))
    }

    /// Bytes on the wire it stands for.
    pub fn bytes_estimated(&self) -> u64 {
        self.bytes.saturating_mul(u64::from(self.sampling_rate.max(1)))
    }
}

/// Why a datagram, or part of one, was not decoded: each has a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// Not a version this decoder reads.
    Version,
    /// A header, set or record that does not parse.
    Malformed,
    /// Data held for a template that did not come before a bound was reached (the held sets'
    /// count per decoder, or their bytes across all of them).
    PendingDropped,
    /// A new session's domain past [`MAX_DOMAINS`] while every one was in use this datagram
    /// (spoofed sources must not grow memory); see also [`DecodeStats::domains_evicted`].
    TooManyDomains,
    /// A template with more fields than [`Limits::max_template_fields`], or whose records
    /// would take fewer bytes than [`Limits::min_record_len`]: its data is not read.
    TemplateRefused,
    /// A new template past [`Limits::max_templates_per_domain`] in its domain.
    TooManyTemplates,
    /// A new template past the templates' memory shared by all decoders
    /// ([`Budget::new`]'s `template_fields`).
    TemplateMemory,
    /// The rest of a datagram whose records would take more than [`Limits::max_work`] field
    /// reads.
    WorkBudget,
}

impl Refusal {
    /// Every reason, in metrics order.
    pub const ALL: [Refusal; 8] = [
        Refusal::Version,
        Refusal::Malformed,
        Refusal::PendingDropped,
        Refusal::TooManyDomains,
        Refusal::TemplateRefused,
        Refusal::TooManyTemplates,
        Refusal::TemplateMemory,
        Refusal::WorkBudget,
    ];

    /// Its label in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Version => "version",
            Refusal::Malformed => "malformed",
            Refusal::PendingDropped => "pending_dropped",
            Refusal::TooManyDomains => "too_many_domains",
            Refusal::TemplateRefused => "template_refused",
            Refusal::TooManyTemplates => "too_many_templates",
            Refusal::TemplateMemory => "template_memory",
            Refusal::WorkBudget => "work_budget",
        }
    }
}

/// What the decoder did, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Datagrams read.
    pub datagrams: u64,
    /// Flows decoded.
    pub flows: u64,
    /// Templates defined (including redefinitions).
    pub templates: u64,
    /// Data sets waiting for their template now.
    pub pending: u64,
    /// Bytes of the data sets waiting now.
    pub pending_bytes: u64,
    /// Data sets decoded late, when their template came.
    pub pending_decoded: u64,
    /// Records the exporters' sequence numbers say were sent and never arrived.
    pub sequence_lost: u64,
    /// Sequence numbers that jumped further than [`Limits::max_sequence_gap`] (forwards, or
    /// backwards beyond reordering): a restart or a forgery, not counted as lost.
    pub sequence_resets: u64,
    /// Field reads spent on data records (the work [`Limits::max_work`] bounds).
    pub work: u64,
    /// Sessions' state forgotten to make room for new ones ([`MAX_DOMAINS`]).
    pub domains_evicted: u64,
    /// sFlow counter samples read.
    pub counter_samples: u64,
    /// Refusals by reason.
    pub refused: std::collections::BTreeMap<Refusal, u64>,
}

/// A data set that came before its template.
struct Pending {
    key: DomainKey,
    template: u16,
    body: Vec<u8>,
    clock: Clock,
}

impl Pending {
    /// What it costs the shared held-bytes budget.
    fn cost(&self) -> usize {
        self.body.len() + 64
    }
}

/// What times in a message are relative to.
#[derive(Debug, Clone, Copy)]
struct Clock {
    /// Export time, ms since the epoch.
    export_ms: u64,
    /// The exporter's uptime at export, ms (v9).
    uptime_ms: Option<u64>,
}

/// One observation domain of one transport session: what its templates, options data and
/// sequence numbers said.
#[derive(Default)]
struct Domain {
    templates: Templates,
    /// Template id → what this decoder charged the shared budget for it (templates restored
    /// at start were charged once, by whoever restored them, and are not here).
    charged: HashMap<u16, usize>,
    /// Template ids refused ([`Refusal::TemplateRefused`]): their data is dropped, not held.
    refused: std::collections::HashSet<u16>,
    /// Sampler id → 1-in-N.
    samplers: HashMap<u64, u32>,
    /// A rate for flows that name no sampler.
    default_rate: Option<u32>,
    /// The sequence number the next message should carry.
    next_sequence: Option<u32>,
    /// The sequence number of the last message, as sent.
    last_sequence: Option<u32>,
    /// The exporter counts a message's own records in its sequence number (a quirk).
    counts_own_records: bool,
    /// The exporter's boot time, ms since the epoch (IPFIX systemInitTimeMilliseconds).
    boot_ms: Option<u64>,
    /// The decoder's datagram count when this domain was last used (least recently used
    /// goes first).
    used: u64,
}

/// The most domains (of sessions) a decoder remembers; past it the least recently used one
/// is forgotten (counted), so spoofed sources cannot grow memory and cannot lock real
/// exporters out either.
pub const MAX_DOMAINS: usize = 10_000;

/// A template id's refusals remembered per domain, at most.
const MAX_REFUSED_IDS: usize = 256;

/// Who sent a message and in which of its observation domains: the key of templates,
/// options data and sequence numbers. RFC 7011 §10.3.6 and §8: a UDP transport session is
/// the exporter's address and port (with the collector's), and templates and sequence
/// numbers live per session and observation domain; two exporting processes on one host
/// (two softflowd, or v9 and IPFIX) are two sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DomainKey {
    /// The exporter's address and port (port 0 when the caller does not know it).
    pub session: SocketAddr,
    /// NetFlow v5, v9, IPFIX or sFlow: each numbers and defines its own.
    pub protocol: Protocol,
    /// Observation domain (IPFIX), source id (v9), engine (v5), sub-agent (sFlow).
    pub domain: u32,
    /// sFlow: the agent address the datagram claims (one sender may relay several agents).
    pub agent: Option<IpAddr>,
}

/// What one decoder may spend; every limit has a counter (docs/flows.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Data sets held for templates not seen yet, in this decoder.
    pub pending_sets: usize,
    /// Fields a template may have (RFC 7011 allows 65,535; Open vSwitch sends 67).
    pub max_template_fields: usize,
    /// Bytes a template's record must take at least: a template of empty fields would make
    /// every byte a record.
    pub min_record_len: usize,
    /// Templates one domain may define.
    pub max_templates_per_domain: usize,
    /// Field reads (records × fields) one datagram may cost, data held for it included.
    pub max_work: u64,
    /// A sequence number further ahead than this (records for IPFIX and v5, datagrams for
    /// v9 and sFlow) is a reset, not loss.
    pub max_sequence_gap: u32,
}

impl Limits {
    /// Whether a template's shape is within the limits (fields, bytes per record).
    pub fn admits(&self, t: &Template) -> bool {
        t.fields.len() <= self.max_template_fields && t.min_record_len() >= self.min_record_len
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            pending_sets: 10_000,
            max_template_fields: 512,
            min_record_len: 4,
            max_templates_per_domain: 1024,
            max_work: 1 << 18,
            max_sequence_gap: 1 << 20,
        }
    }
}

/// Memory shared by every decoder of a listener (UDP workers and TCP sessions): held data
/// sets' bytes and templates' fields, each bounded across all of them.
#[derive(Debug)]
pub struct Budget {
    held_bytes: AtomicUsize,
    held_max: usize,
    template_fields: AtomicUsize,
    template_fields_max: usize,
}

impl Budget {
    /// At most `held_max` bytes of data held for templates, and templates of at most
    /// `template_fields_max` fields (each template counted as its fields plus 16), across
    /// every decoder that shares it.
    pub fn new(held_max: usize, template_fields_max: usize) -> Budget {
        Budget {
            held_bytes: AtomicUsize::new(0),
            held_max,
            template_fields: AtomicUsize::new(0),
            template_fields_max,
        }
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// Template fields held now.
    pub fn template_fields(&self) -> usize {
        self.template_fields.load(Ordering::Relaxed)
    }

    fn take(counter: &AtomicUsize, max: usize, n: usize) -> bool {
        counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                c.checked_add(n).filter(|&t| t <= max)
            })
            .is_ok()
    }

    /// Takes `n` template fields' worth if there is room.
    pub fn take_template(&self, n: usize) -> bool {
        Budget::take(&self.template_fields, self.template_fields_max, n)
    }

    fn give_template(&self, n: usize) {
        self.template_fields.fetch_sub(n, Ordering::Relaxed);
    }

    fn take_held(&self, n: usize) -> bool {
        Budget::take(&self.held_bytes, self.held_max, n)
    }

    fn give_held(&self, n: usize) {
        self.held_bytes.fetch_sub(n, Ordering::Relaxed);
    }
}

impl Default for Budget {
    /// 64 MiB of held data; 4 Mi template fields (about 32 MiB).
    fn default() -> Budget {
        Budget::new(64 << 20, 4 << 20)
    }
}

/// What a template costs the shared budget: its fields, plus 16 for the rest of it.
pub fn template_cost(t: &Template) -> usize {
    t.fields.len() + 16
}

/// Decodes datagrams; remembers what each session's domains defined.
pub struct Decoder {
    domains: HashMap<DomainKey, Domain>,
    /// Data sets waiting for their templates, oldest first.
    pending: VecDeque<Pending>,
    limits: Limits,
    budget: Arc<Budget>,
    /// Field reads left for the datagram being decoded.
    work_left: u64,
    /// Counters.
    pub stats: DecodeStats,
    /// What was learnt since [`Decoder::take_changes`] last took it.
    changes: Vec<Remembered>,
}

/// What a decoder learns that a restart must not forget: kept by the collector (its
/// database) and given back with [`Decoder::restore`], so the first data after a restart
/// decodes without waiting for templates and options data to come again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remembered {
    /// A template record (definition or withdrawal) of a session's domain.
    Template(DomainKey, TemplateRecord),
    /// A sampler's rate (no sampler: the domain's own rate).
    Sampler(DomainKey, Option<u64>, u32),
}

/// IANA element ids the decoder reads (RFC 7012 names).
mod ie {
    pub const OCTET_DELTA_COUNT: u16 = 1;
    pub const PACKET_DELTA_COUNT: u16 = 2;
    pub const PROTOCOL: u16 = 4;
    pub const CLASS_OF_SERVICE: u16 = 5;
    pub const TCP_FLAGS: u16 = 6;
    pub const SRC_PORT: u16 = 7;
    pub const SRC_V4: u16 = 8;
    pub const INGRESS_INTERFACE: u16 = 10;
    pub const DST_PORT: u16 = 11;
    pub const DST_V4: u16 = 12;
    pub const EGRESS_INTERFACE: u16 = 14;
    pub const FLOW_END_SYS_UP_TIME: u16 = 21;
    pub const FLOW_START_SYS_UP_TIME: u16 = 22;
    pub const SRC_V6: u16 = 27;
    pub const DST_V6: u16 = 28;
    pub const SAMPLING_INTERVAL: u16 = 34;
    pub const SAMPLER_ID: u16 = 48;
    pub const SAMPLER_RANDOM_INTERVAL: u16 = 50;
    pub const VLAN_ID: u16 = 58;
    pub const FORWARDING_STATUS: u16 = 89;
    pub const OCTET_TOTAL_COUNT: u16 = 85;
    pub const PACKET_TOTAL_COUNT: u16 = 86;
    pub const FLOW_START_SECONDS: u16 = 150;
    pub const FLOW_END_SECONDS: u16 = 151;
    pub const FLOW_START_MILLISECONDS: u16 = 152;
    pub const FLOW_END_MILLISECONDS: u16 = 153;
    pub const FLOW_START_MICROSECONDS: u16 = 154;
    pub const FLOW_END_MICROSECONDS: u16 = 155;
    pub const FLOW_START_NANOSECONDS: u16 = 156;
    pub const FLOW_END_NANOSECONDS: u16 = 157;
    pub const FLOW_START_DELTA_MICROSECONDS: u16 = 158;
    pub const FLOW_END_DELTA_MICROSECONDS: u16 = 159;
    pub const FLOW_DIRECTION: u16 = 61;
    pub const ICMP_TYPE_CODE_V4: u16 = 32;
    pub const ICMP_TYPE_CODE_V6: u16 = 139;
    pub const ICMP_TYPE_V4: u16 = 176;
    pub const ICMP_CODE_V4: u16 = 177;
    pub const ICMP_TYPE_V6: u16 = 178;
    pub const ICMP_CODE_V6: u16 = 179;
    pub const SYSTEM_INIT_TIME_MILLISECONDS: u16 = 160;
    pub const INGRESS_PHYSICAL_INTERFACE: u16 = 252;
    pub const EGRESS_PHYSICAL_INTERFACE: u16 = 253;
    pub const SELECTOR_ID: u16 = 302;
    pub const SAMPLING_PACKET_INTERVAL: u16 = 305;
    pub const SAMPLING_PACKET_SPACE: u16 = 306;
    pub const DATA_LINK_FRAME_SECTION: u16 = 315;
}

impl Decoder {
    /// A decoder that holds at most `pending_max` data sets waiting for their templates, with
    /// the other limits at their defaults and a budget of its own.
    pub fn new(pending_max: usize) -> Decoder {
        let limits = Limits { pending_sets: pending_max, ..Limits::default() };
        Decoder::with_limits(limits, Arc::new(Budget::default()))
    }

    /// A decoder with these limits, sharing `budget` with other decoders.
    pub fn with_limits(limits: Limits, budget: Arc<Budget>) -> Decoder {
        Decoder {
            domains: HashMap::new(),
            pending: VecDeque::new(),
            limits,
            budget,
            work_left: 0,
            stats: DecodeStats::default(),
            changes: Vec::new(),
        }
    }

    /// What was learnt since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<Remembered> {
        std::mem::take(&mut self.changes)
    }

    /// Takes back what an earlier run learnt (templates within this decoder's limits, charged
    /// to its budget).
    pub fn restore(&mut self, r: Remembered) {
        match r {
            Remembered::Template(key, TemplateRecord::Define(t)) => {
                if self.admit(key) {
                    self.define(key, t);
                }
            }
            Remembered::Template(..) => {}
            Remembered::Sampler(key, sampler, rate) => {
                if self.admit(key) {
                    self.domains.entry(key).or_default().remember_rate(sampler, rate)
                }
            }
        }
    }

    /// Takes back a template an earlier run learnt, shared with other decoders and charged
    /// to the budget once by the caller ([`Budget::take_template`]).
    pub fn restore_shared(&mut self, key: DomainKey, t: Arc<Template>) {
        if self.admit(key) {
            let d = self.domains.entry(key).or_default();
            if let Some(old) = d.charged.remove(&t.id) {
                self.budget.give_template(old);
            }
            d.templates.insert(t);
        }
    }

    fn refuse(&mut self, why: Refusal) {
        *self.stats.refused.entry(why).or_default() += 1;
    }

    /// Decodes one datagram from `from` (its address only: every sender is one session)
    /// into `out`.
    pub fn datagram(&mut self, from: IpAddr, buf: &[u8], out: &mut Vec<ExportedFlow>) {
        self.receive(SocketAddr::new(from, 0), buf, out)
    }

    /// Decodes one datagram from the transport session whose far end is `from` into `out`.
    pub fn receive(&mut self, from: SocketAddr, buf: &[u8], out: &mut Vec<ExportedFlow>) {
        self.stats.datagrams += 1;
        self.work_left = self.limits.max_work;
        let before = out.len();
        match buf.get(..4) {
            Some([0, 5, ..]) => self.netflow5(from, buf, out),
            Some([0, 9, ..]) | Some([0, 10, ..]) => self.ipfix(from, buf, out),
            Some([0, 0, 0, 5]) => self.sflow(from, buf, out),
            _ => self.refuse(Refusal::Version),
        }
        self.stats.flows += (out.len() - before) as u64;
    }

    /// Makes room for `key`'s state: known already, or a new one (forgetting the least
    /// recently used domain when [`MAX_DOMAINS`] are known). Marks it used.
    fn admit(&mut self, key: DomainKey) -> bool {
        let now = self.stats.datagrams;
        if let Some(d) = self.domains.get_mut(&key) {
            d.used = now;
            return true;
        }
        if self.domains.len() >= MAX_DOMAINS {
            let oldest = self.domains.iter().min_by_key(|(_, d)| d.used).map(|(k, d)| (*k, d.used));
            match oldest {
                // Everything was used by this very datagram: nothing to forget.
                Some((_, used)) if used == now => {
                    self.refuse(Refusal::TooManyDomains);
                    return false;
                }
                Some((k, _)) => self.forget(k),
                None => {}
            }
        }
        self.domains.insert(key, Domain { used: now, ..Domain::default() });
        true
    }

    /// Forgets a domain: its templates' charges and its held data go.
    fn forget(&mut self, key: DomainKey) {
        if let Some(d) = self.domains.remove(&key) {
            self.budget.give_template(d.charged.values().sum());
        }
        let (gone, kept): (Vec<Pending>, Vec<Pending>) =
            self.pending.drain(..).partition(|p| p.key == key);
        self.pending = kept.into();
        for p in gone {
            self.budget.give_held(p.cost());
            self.stats.pending_bytes -= p.body.len() as u64;
            self.drop_pending_counted();
        }
        self.stats.domains_evicted += 1;
    }

    /// Counts one held set dropped (its bytes already given back).
    fn drop_pending_counted(&mut self) {
        self.stats.pending = self.stats.pending.saturating_sub(1);
        self.refuse(Refusal::PendingDropped);
    }

    /// Defines template `t` in `key`'s domain, within the limits (each refusal counted);
    /// returns whether it was taken.
    fn define(&mut self, key: DomainKey, t: Template) -> bool {
        let Some(d) = self.domains.get_mut(&key) else { return false };
        let id = t.id;
        let refusal = if !self.limits.admits(&t) {
            Some(Refusal::TemplateRefused)
        } else if d.templates.get(id).is_none()
            && d.templates.len() >= self.limits.max_templates_per_domain
        {
            Some(Refusal::TooManyTemplates)
        } else {
            None
        };
        let cost = template_cost(&t);
        let refusal = refusal.or_else(|| {
            let old = d.charged.get(&id).copied().unwrap_or(0);
            if cost <= old || self.budget.take_template(cost - old) {
                if cost < old {
                    self.budget.give_template(old - cost);
                }
                None
            } else {
                Some(Refusal::TemplateMemory)
            }
        });
        match refusal {
            None => {
                d.charged.insert(id, cost);
                d.refused.remove(&id);
                d.templates.insert(Arc::new(t));
                true
            }
            Some(why) => {
                // The template this one meant to replace no longer says how its data reads.
                if let Some(old) = d.charged.remove(&id) {
                    self.budget.give_template(old);
                }
                d.templates.apply(TemplateRecord::Withdraw(id));
                if why == Refusal::TemplateRefused && d.refused.len() < MAX_REFUSED_IDS {
                    d.refused.insert(id);
                }
                self.refuse(why);
                false
            }
        }
    }

    /// Applies a withdrawal (RFC 7011 §8.1) in `key`'s domain, giving the charges back.
    fn withdraw(&mut self, key: DomainKey, r: TemplateRecord) {
        let Some(d) = self.domains.get_mut(&key) else { return };
        for t in d.templates.apply_replacing(r) {
            if let Some(c) = d.charged.remove(&t.id) {
                self.budget.give_template(c);
            }
        }
    }

    fn netflow5(&mut self, session: SocketAddr, buf: &[u8], out: &mut Vec<ExportedFlow>) {
        let Ok((h, records)) = netflow5::parse(buf) else { return self.refuse(Refusal::Malformed) };
        let domain = (u32::from(h.engine_type) << 8) | u32::from(h.engine_id);
        let key = DomainKey { session, protocol: Protocol::NetflowV5, domain, agent: None };
        if !self.admit(key) {
            return;
        }
        let from = session.ip();
        let d = self.domains.entry(key).or_default();
        let g = gap(
            &mut d.next_sequence,
            h.flow_sequence,
            records.len() as u32,
            self.limits.max_sequence_gap,
        );
        self.stats.count_gap(g);
        let export_ms = u64::from(h.unix_secs) * 1000 + u64::from(h.unix_nsecs) / 1_000_000;
        // A flow's age against the header's 32-bit uptime (which wraps every 49.7 days, and
        // is behind the flow's times when softflowd reads a capture older than its start).
        let at = |up: u32| {
            let age = i64::from(h.sys_uptime_ms.wrapping_sub(up) as i32);
            let export = i64::try_from(export_ms).unwrap_or(i64::MAX);
            u64::try_from(export.saturating_sub(age)).unwrap_or(0).saturating_mul(1_000_000)
        };
        for r in records {
            out.push(ExportedFlow {
                exporter: from,
                agent: None,
                domain,
                protocol: Protocol::NetflowV5,
                key: FlowKey {
                    src: IpAddr::V4(r.src),
                    dst: IpAddr::V4(r.dst),
                    sport: r.sport,
                    dport: r.dport,
                    proto: r.proto,
                    spi: None,
                    si: None,
                },
                in_if: r.input.into(),
                out_if: r.output.into(),
                packets: r.packets.into(),
                bytes: r.octets.into(),
                sampling_rate: u32::from(h.sampling_interval).max(1),
                start_ns: at(r.first_ms),
                end_ns: at(r.last_ms),
                tcp_flags: r.tcp_flags,
                tos: r.tos,
                vlan: None,
                dropped: false,
                direction: None,
            });
        }
    }

    fn ipfix(&mut self, session: SocketAddr, buf: &[u8], out: &mut Vec<ExportedFlow>) {
        let Ok(m) = Message::parse(buf) else { return self.refuse(Refusal::Malformed) };
        let h = m.header;
        let protocol = match h.version {
            ipfix::Version::Ipfix => Protocol::Ipfix,
            ipfix::Version::NetflowV9 => Protocol::NetflowV9,
        };
        let clock = Clock {
            export_ms: u64::from(h.export_time) * 1000,
            uptime_ms: h.sys_uptime_ms.map(u64::from),
        };
        let key = DomainKey { session, protocol, domain: h.domain, agent: None };
        if !self.admit(key) {
            return;
        }
        let mut data_records = 0u32;
        let mut malformed = false;
        for set in m.sets() {
            let Ok(set) = set else {
                malformed = true;
                break;
            };
            match set.kind {
                SetKind::Template | SetKind::OptionsTemplate => {
                    for r in set.templates() {
                        let Ok(r) = r else {
                            malformed = true;
                            break;
                        };
                        let TemplateRecord::Define(t) = r else {
                            self.changes.push(Remembered::Template(key, r.clone()));
                            self.withdraw(key, r);
                            continue;
                        };
                        let id = t.id;
                        // A template sent again as it was (UDP exporters repeat theirs,
                        // RFC 7011 §8.4) changes nothing and is not kept again.
                        let same =
                            self.domains.get(&key).and_then(|d| d.templates.get(id)) == Some(&t);
                        self.stats.templates += 1;
                        if same {
                            self.decode_pending(key, id, protocol, out);
                        } else if self.define(key, t.clone()) {
                            self.changes.push(Remembered::Template(key, TemplateRecord::Define(t)));
                            self.decode_pending(key, id, protocol, out);
                        } else {
                            self.drop_held_for(key, id);
                        }
                    }
                }
                SetKind::Data(id) => {
                    let Some(d) = self.domains.get(&key) else { break };
                    match d.templates.get_shared(id) {
                        Some(t) => match self.data_set(key, protocol, &t, set.body, clock, out) {
                            Some(n) => data_records += n,
                            None => break,
                        },
                        // Its template was refused: there is nothing to wait for.
                        None if d.refused.contains(&id) => self.refuse(Refusal::TemplateRefused),
                        None => {
                            self.hold(Pending { key, template: id, body: set.body.to_vec(), clock })
                        }
                    }
                }
                SetKind::Reserved(_) => {}
            }
        }
        if malformed {
            self.refuse(Refusal::Malformed);
        }
        let max_gap = self.limits.max_sequence_gap;
        let Some(d) = self.domains.get_mut(&key) else { return };
        // IPFIX numbers data records, v9 numbers packets.
        let sent = match protocol {
            Protocol::Ipfix => data_records,
            _ => 1,
        };
        // An exporter whose numbers count this message's own records too (softflowd): its
        // message k + 1 says seq_k + n_(k+1) where RFC 7011 says seq_k + n_k. Seen once, the
        // domain is read that way from then on.
        let seq = match (protocol, d.next_sequence, d.last_sequence) {
            (Protocol::Ipfix, Some(next), Some(last))
                if !d.counts_own_records
                    && h.sequence != next
                    && h.sequence.wrapping_sub(sent) == last =>
            {
                d.counts_own_records = true;
                // What was expected was read the other way: start again from this one.
                d.next_sequence = None;
                h.sequence
            }
            _ => h.sequence,
        };
        d.last_sequence = Some(seq);
        let seq = if d.counts_own_records { seq.wrapping_sub(sent) } else { seq };
        let g = gap(&mut d.next_sequence, seq, sent, max_gap);
        self.stats.count_gap(g);
    }

    /// Holds a data set until its template comes, within the held sets' count (this decoder)
    /// and bytes (all decoders): the oldest of this decoder's go first; a set that still
    /// does not fit is dropped. Each set dropped is counted.
    fn hold(&mut self, p: Pending) {
        let cost = p.cost();
        while self.pending.len() >= self.limits.pending_sets.max(1) || !self.budget.take_held(cost)
        {
            let Some(old) = self.pending.pop_front() else {
                self.refuse(Refusal::PendingDropped);
                return;
            };
            self.budget.give_held(old.cost());
            self.stats.pending_bytes -= old.body.len() as u64;
            self.drop_pending_counted();
            if self.limits.pending_sets == 0 {
                self.refuse(Refusal::PendingDropped);
                return;
            }
        }
        self.stats.pending += 1;
        self.stats.pending_bytes += p.body.len() as u64;
        self.pending.push_back(p);
    }

    /// Drops the data held for template `id` of `key`'s domain (its template was refused).
    fn drop_held_for(&mut self, key: DomainKey, id: u16) {
        for p in self.take_held(key, id) {
            self.budget.give_held(p.cost());
            self.stats.pending_bytes -= p.body.len() as u64;
            self.drop_pending_counted();
        }
    }

    /// Takes the sets held for template `id` of `key`'s domain out of the queue (their
    /// bytes still charged).
    fn take_held(&mut self, key: DomainKey, id: u16) -> Vec<Pending> {
        if !self.pending.iter().any(|p| p.key == key && p.template == id) {
            return Vec::new();
        }
        let (ready, waiting): (Vec<Pending>, Vec<Pending>) =
            self.pending.drain(..).partition(|p| p.key == key && p.template == id);
        self.pending = waiting.into();
        ready
    }

    /// Decodes what waited for template `id` of domain `key`, within the datagram's work.
    fn decode_pending(
        &mut self,
        key: DomainKey,
        id: u16,
        protocol: Protocol,
        out: &mut Vec<ExportedFlow>,
    ) {
        let ready = self.take_held(key, id);
        if ready.is_empty() {
            return;
        }
        let t = self.domains.get(&key).and_then(|d| d.templates.get_shared(id));
        for p in ready {
            self.budget.give_held(p.cost());
            self.stats.pending = self.stats.pending.saturating_sub(1);
            self.stats.pending_bytes -= p.body.len() as u64;
            match &t {
                Some(t) if self.work_left > 0 => {
                    self.stats.pending_decoded += 1;
                    self.data_set(key, protocol, t, &p.body, p.clock, out);
                }
                _ => {
                    self.stats.pending = self.stats.pending.saturating_add(1);
                    self.drop_pending_counted();
                }
            }
        }
    }

    /// Decodes one data set with its template; returns how many records it held, or `None`
    /// when the datagram's work ran out (the rest of the datagram is not read).
    fn data_set(
        &mut self,
        key: DomainKey,
        protocol: Protocol,
        t: &Template,
        body: &[u8],
        clock: Clock,
        out: &mut Vec<ExportedFlow>,
    ) -> Option<u32> {
        let (mut n, mut malformed, mut spent) = (0, false, false);
        // Each record costs a read of each of its fields (twice, in truth: once to measure
        // it, once to read it).
        let per_record = t.fields.len() as u64 + 1;
        let Some(d) = self.domains.get_mut(&key) else { return Some(0) };
        for rec in ipfix::DataRecords::new(body, t) {
            if self.work_left < per_record {
                spent = true;
                break;
            }
            self.work_left -= per_record;
            self.stats.work += per_record;
            let Ok(rec) = rec else {
                malformed = true;
                break;
            };
            n += 1;
            if t.options {
                if let Some(learnt) = d.options_record(&rec) {
                    self.changes.push(Remembered::Sampler(key, learnt.0, learnt.1));
                }
            } else if let Some(f) = d.flow_record(key, protocol, &rec, clock) {
                out.push(f);
            }
        }
        if malformed {
            self.refuse(Refusal::Malformed);
        }
        if spent {
            self.work_left = 0;
            self.refuse(Refusal::WorkBudget);
            return None;
        }
        Some(n)
    }

    fn sflow(&mut self, session: SocketAddr, buf: &[u8], out: &mut Vec<ExportedFlow>) {
        let Ok(dg) = sflow::parse(buf) else { return self.refuse(Refusal::Malformed) };
        // The agent address is what the datagram claims: the flows are the sender's, and the
        // claim keys only the sequence numbers (one sender may relay several agents).
        let key = DomainKey {
            session,
            protocol: Protocol::Sflow,
            domain: dg.sub_agent,
            agent: Some(dg.agent),
        };
        if !self.admit(key) {
            return;
        }
        // sFlow numbers datagrams: the records of the ones that never came are lost.
        let max_gap = self.limits.max_sequence_gap;
        if let Some(d) = self.domains.get_mut(&key) {
            let g = gap(&mut d.next_sequence, dg.sequence, 1, max_gap);
            self.stats.count_gap(g);
        }
        let from = session.ip();
        for s in &dg.samples {
            match s {
                sflow::Sample::Flow(f) => {
                    let (out_if, dropped) = match f.output {
                        sflow::Output::Interface(i) => (i, false),
                        sflow::Output::Discarded(_) => (0, true),
                        sflow::Output::Multiple(_) => (0, false),
                    };
                    let at = (f.input, out_if, f.sampling_rate, dropped);
                    if let Some(flow) = sflow_flow(from, &dg, at, &f.records) {
                        out.push(flow);
                    }
                }
                sflow::Sample::Discard(f) => {
                    let at = (f.input, f.output, 1, true);
                    if let Some(flow) = sflow_flow(from, &dg, at, &f.records) {
                        out.push(flow);
                    }
                }
                sflow::Sample::Counters(_) => self.stats.counter_samples += 1,
                sflow::Sample::Other { .. } => {}
            }
        }
    }
}

impl Drop for Decoder {
    /// Gives back what it held of the shared budget (a TCP session's decoder ends with it).
    fn drop(&mut self) {
        let held: usize = self.pending.iter().map(Pending::cost).sum();
        self.budget.give_held(held);
        let fields: usize = self.domains.values().map(|d| d.charged.values().sum::<usize>()).sum();
        self.budget.give_template(fields);
    }
}

/// What a sequence number said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gap {
    /// As expected, or this many skipped.
    Lost(u64),
    /// A little behind (reordered): nothing.
    Behind,
    /// Ahead by more than the bound, or far behind: a restart or a forgery.
    Reset,
}

impl DecodeStats {
    fn count_gap(&mut self, g: Gap) {
        match g {
            Gap::Lost(n) => self.sequence_lost += n,
            Gap::Behind => {}
            Gap::Reset => self.sequence_resets += 1,
        }
    }
}

/// Moves the expected sequence number on by `sent`; says how many were skipped. A jump
/// ahead of more than `max_gap` is not loss: the exporter restarted, or someone forged the
/// number (these protocols carry no authentication), and the count starts again from it.
/// A number a little behind (by at most `max_gap`) is a reordered datagram, or an exporter
/// that counts fewer records than it sends (softflowd leaves options records out): nothing is
/// lost, and the count goes on from it.
fn gap(next: &mut Option<u32>, seq: u32, sent: u32, max_gap: u32) -> Gap {
    let Some(want) = *next else {
        *next = Some(seq.wrapping_add(sent));
        return Gap::Lost(0);
    };
    let ahead = seq.wrapping_sub(want);
    let behind = want.wrapping_sub(seq);
    if ahead <= max_gap {
        *next = Some(seq.wrapping_add(sent));
        Gap::Lost(u64::from(ahead))
    } else if behind <= max_gap {
        *next = Some(seq.wrapping_add(sent));
        Gap::Behind
    } else {
        *next = Some(seq.wrapping_add(sent));
        Gap::Reset
    }
}

/// A flow from an sFlow sample's records: the sampled header read by Telemark's packet
/// parser, or the sampled IPv4/IPv6 record.
/// `at`: input and output interfaces, sampling rate, whether the packet was dropped.
/// ICMP's type and code as a flow key's destination port, as NetFlow v5 keys them (and
/// softflowd's v9): type × 256 + code, so that one flow has one key in every format.
fn icmp_port(icmp_type: u8, code: u8) -> u16 {
    u16::from(icmp_type) << 8 | u16::from(code)
}

fn sflow_flow(
    from: IpAddr,
    dg: &sflow::Datagram,
    at: (u32, u32, u32, bool),
    records: &[sflow::FlowData],
) -> Option<ExportedFlow> {
    let (input, output, rate, dropped) = at;
    let mut f = ExportedFlow {
        exporter: from,
        agent: Some(dg.agent),
        domain: dg.sub_agent,
        protocol: Protocol::Sflow,
        key: FlowKey::default(),
        in_if: input,
        out_if: output,
        packets: 1,
        bytes: 0,
        sampling_rate: rate.max(1),
        start_ns: 0,
        end_ns: 0,
        tcp_flags: 0,
        tos: 0,
        vlan: None,
        dropped,
        direction: None,
    };
    let mut found = false;
    for r in records {
        match r {
            sflow::FlowData::Header(h) => {
                let link = match h.protocol {
                    1 => LinkType::Ethernet,
                    11 | 12 => LinkType::RawIp,
                    _ => continue,
                };
                let wire = h.frame_length.saturating_sub(h.stripped);
                if let Ok(p) = extract(h.header, link) {
                    f.key = p.key;
                    f.tos = p.dscp << 2;
                    // Bytes as NetFlow counts them: from the IP header on (the outer one
                    // of a tunnel: what crossed this link).
                    let link_len = match (p.tunnels, link) {
                        (0, _) => p.ip_offset,
                        (_, LinkType::Ethernet) => outer_ip_offset(h.header),
                        _ => 0,
                    };
                    f.bytes = ip_length(h.header, link_len)
                        .unwrap_or(u64::from(wire).saturating_sub(link_len as u64));
                    // The transport header, where the sampled bytes hold it (a later fragment
                    // has none): ICMP's type and code, TCP's flags (RFC 9293 §3.1, byte 13).
                    let l4 = match p.fragment {
                        Fragment::Later(_) => None,
                        _ => h.header.get(p.l4_offset..),
                    };
                    match (p.key.proto, l4) {
                        (1 | 58, Some([icmp_type, code, ..])) => {
                            f.key.dport = icmp_port(*icmp_type, *code);
                        }
                        (6, Some(tcp)) if tcp.len() > 13 => f.tcp_flags = tcp[13],
                        _ => {}
                    }
                    found = true;
                }
            }
            sflow::FlowData::Ipv4(ip) | sflow::FlowData::Ipv6(ip) if !found => {
                f.key = FlowKey {
                    src: ip.src,
                    dst: ip.dst,
                    sport: ip.sport as u16,
                    dport: ip.dport as u16,
                    proto: ip.protocol as u8,
                    spi: None,
                    si: None,
                };
                f.bytes = u64::from(ip.length);
                f.tcp_flags = ip.tcp_flags as u8;
                f.tos = ip.tos as u8;
                found = true;
            }
            sflow::FlowData::Switch(s) if s.src_vlan != 0 => f.vlan = Some(s.src_vlan as u16),
            _ => {}
        }
    }
    found.then_some(f)
}

/// What a record says about sampling.
#[derive(Debug, Default)]
struct Sampling {
    /// The sampler it names (RFC 7270 samplerId, RFC 5477 selectorId).
    sampler: Option<u64>,
    /// 1 in N (samplingInterval, samplerRandomInterval).
    interval: Option<u64>,
    /// Systematic count-based sampling (RFC 5477): this many packets selected …
    packet_interval: Option<u64>,
    /// … then this many skipped.
    packet_space: Option<u64>,
}

impl Sampling {
    /// Takes element `id`'s value if it is about sampling; says whether it was.
    fn learn(&mut self, id: u16, v: u64) -> bool {
        let slot = match id {
            ie::SAMPLER_ID | ie::SELECTOR_ID => &mut self.sampler,
            ie::SAMPLING_INTERVAL | ie::SAMPLER_RANDOM_INTERVAL => &mut self.interval,
            ie::SAMPLING_PACKET_INTERVAL => &mut self.packet_interval,
            ie::SAMPLING_PACKET_SPACE => &mut self.packet_space,
            _ => return false,
        };
        *slot = Some(v);
        true
    }

    /// 1 in how many packets, if the record says.
    fn rate(&self) -> Option<u32> {
        let n = match (self.interval, self.packet_interval, self.packet_space) {
            (Some(n), _, _) => n,
            (None, Some(taken), Some(skipped)) if taken > 0 => (taken + skipped) / taken,
            _ => return None,
        };
        Some(u32::try_from(n).unwrap_or(u32::MAX).max(1))
    }
}

/// Where the first IP header of an Ethernet frame starts: after the MAC addresses and any
/// 802.1Q / 802.1ad tags.
fn outer_ip_offset(frame: &[u8]) -> usize {
    let mut off = 12;
    while let [0x81, 0x00, ..] | [0x88, 0xa8, ..] | [0x91, 0x00, ..] =
        frame.get(off..).unwrap_or(&[])
    {
        off += 4;
    }
    off + 2
}

/// The length field of the IP header at `off` (IPv4 total length, IPv6 payload length plus
/// its header): the packet without the frame's padding.
fn ip_length(frame: &[u8], off: usize) -> Option<u64> {
    let ip = frame.get(off..)?;
    match ip.first()? >> 4 {
        4 => Some(u64::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]))),
        6 => Some(40 + u64::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]))),
        _ => None,
    }
}

impl Domain {
    /// Learns sampling rates and the exporter's boot time from an options record; returns a
    /// rate it learnt that it did not know (the sampler, or none for the domain's).
    fn options_record(&mut self, rec: &ipfix::DataRecord) -> Option<(Option<u64>, u32)> {
        let mut sampling = Sampling::default();
        for (f, bytes) in rec.fields() {
            if f.enterprise != 0 {
                continue;
            }
            // systemInitTimeMilliseconds is a dateTimeMilliseconds (RFC 7012 §6.1.9).
            let v = match ipfix::value(f, bytes) {
                Value::Unsigned(v) => v,
                Value::Time(ns) => ns / 1_000_000,
                _ => continue,
            };
            if !sampling.learn(f.id, v) && f.id == ie::SYSTEM_INIT_TIME_MILLISECONDS {
                self.boot_ms = Some(v);
            }
        }
        let rate = sampling.rate()?;
        let known = match sampling.sampler {
            Some(s) => self.samplers.insert(s, rate),
            None => self.default_rate.replace(rate),
        };
        (known != Some(rate)).then_some((sampling.sampler, rate))
    }

    /// Takes back a rate learnt before a restart.
    fn remember_rate(&mut self, sampler: Option<u64>, rate: u32) {
        match sampler {
            Some(s) => {
                self.samplers.insert(s, rate);
            }
            None => self.default_rate = Some(rate),
        }
    }

    /// A flow from a data record.
    fn flow_record(
        &self,
        key: DomainKey,
        protocol: Protocol,
        rec: &ipfix::DataRecord,
        clock: Clock,
    ) -> Option<ExportedFlow> {
        let mut f = ExportedFlow {
            exporter: key.session.ip(),
            agent: None,
            domain: key.domain,
            protocol,
            key: FlowKey::default(),
            in_if: 0,
            out_if: 0,
            packets: 0,
            bytes: 0,
            sampling_rate: 1,
            start_ns: 0,
            end_ns: 0,
            tcp_flags: 0,
            tos: 0,
            vlan: None,
            dropped: false,
            direction: None,
        };
        // Telemark's own loss records over IPFIX (docs/flow-export.md) are not flows: the
        // agent sends them to the collector's HTTP ingest as loss records already.
        if rec.template().fields.iter().any(|f| f.enterprise == ipfix::TELEMARK_PEN) {
            return None;
        }
        let (mut sampling, mut has_addr) = (Sampling::default(), false);
        let (mut start_up, mut end_up) = (None, None);
        let (mut start_delta_us, mut end_delta_us) = (None, None);
        let (mut direction, mut has_out_if) = (None, false);
        // ICMP type and code: one element (type × 256 + code) or two.
        let (mut icmp, mut icmp_type, mut icmp_code) = (None, None, None);
        for (spec, bytes) in rec.fields() {
            if spec.enterprise != 0 {
                continue;
            }
            let v = ipfix::value(spec, bytes);
            let u = match v {
                Value::Unsigned(u) => u,
                _ => 0,
            };
            let time = match v {
                Value::Time(t) => t,
                _ => 0,
            };
            match (spec.id, v) {
                (ie::SRC_V4 | ie::SRC_V6, Value::V4(_) | Value::V6(_)) => {
                    f.key.src = addr(v)?;
                    has_addr = true;
                }
                (ie::DST_V4 | ie::DST_V6, Value::V4(_) | Value::V6(_)) => f.key.dst = addr(v)?,
                (ie::SRC_PORT, _) => f.key.sport = u as u16,
                (ie::DST_PORT, _) => f.key.dport = u as u16,
                (ie::PROTOCOL, _) => f.key.proto = u as u8,
                (ie::OCTET_DELTA_COUNT | ie::OCTET_TOTAL_COUNT, _) if f.bytes == 0 => f.bytes = u,
                (ie::PACKET_DELTA_COUNT | ie::PACKET_TOTAL_COUNT, _) if f.packets == 0 => {
                    f.packets = u
                }
                (ie::INGRESS_INTERFACE, _) => f.in_if = u as u32,
                (ie::EGRESS_INTERFACE, _) => {
                    f.out_if = u as u32;
                    has_out_if = true;
                }
                (ie::INGRESS_PHYSICAL_INTERFACE, _) if f.in_if == 0 => f.in_if = u as u32,
                (ie::EGRESS_PHYSICAL_INTERFACE, _) if f.out_if == 0 => f.out_if = u as u32,
                (ie::TCP_FLAGS, _) => f.tcp_flags = u as u8,
                (ie::CLASS_OF_SERVICE, _) => f.tos = u as u8,
                (ie::VLAN_ID, _) => f.vlan = Some(u as u16),
                // RFC 7270: status in the top two bits of the first byte, 2 = dropped.
                (ie::FORWARDING_STATUS, _) => f.dropped = (u >> 6) & 3 == 2,
                (ie::FLOW_DIRECTION, _) => direction = Some(u),
                (ie::ICMP_TYPE_CODE_V4 | ie::ICMP_TYPE_CODE_V6, _) => icmp = Some(u as u16),
                (ie::ICMP_TYPE_V4 | ie::ICMP_TYPE_V6, _) => icmp_type = Some(u as u8),
                (ie::ICMP_CODE_V4 | ie::ICMP_CODE_V6, _) => icmp_code = Some(u as u8),
                (ie::FLOW_START_DELTA_MICROSECONDS, _) => start_delta_us = Some(u),
                (ie::FLOW_END_DELTA_MICROSECONDS, _) => end_delta_us = Some(u),
                (id, Value::Unsigned(u)) if sampling.learn(id, u) => {}
                (ie::FLOW_START_SYS_UP_TIME, _) => start_up = Some(u),
                (ie::FLOW_END_SYS_UP_TIME, _) => end_up = Some(u),
                (
                    ie::FLOW_START_SECONDS
                    | ie::FLOW_START_MILLISECONDS
                    | ie::FLOW_START_MICROSECONDS
                    | ie::FLOW_START_NANOSECONDS,
                    _,
                ) => f.start_ns = time,
                (
                    ie::FLOW_END_SECONDS
                    | ie::FLOW_END_MILLISECONDS
                    | ie::FLOW_END_MICROSECONDS
                    | ie::FLOW_END_NANOSECONDS,
                    _,
                ) => f.end_ns = time,
                _ => {}
            }
        }
        if !has_addr {
            // RFC 7133: the packet's first bytes instead of its fields, read with Telemark's
            // own packet parser.
            let (_, frame) = rec
                .fields()
                .find(|(s, _)| s.enterprise == 0 && s.id == ie::DATA_LINK_FRAME_SECTION)?;
            let p = extract(frame, LinkType::Ethernet).ok()?;
            f.key = p.key;
        }
        // The record's own rate, else its sampler's, else the domain's.
        f.sampling_rate = sampling
            .rate()
            .or_else(|| sampling.sampler.and_then(|s| self.samplers.get(&s).copied()))
            .or(self.default_rate)
            .unwrap_or(1);
        // sysUpTime-relative times (ms since the exporter started, 32 bits that wrap every
        // 49.7 days): v9 against the header's uptime (RFC 3954 §5.1), IPFIX against the start
        // time options data gave (systemInitTimeMilliseconds). Of the times a value may stand
        // for, the one nearest the export time: an age of more than half the range is a time
        // just ahead, or one before the exporter started (softflowd reading an older capture).
        let export = i64::try_from(clock.export_ms).unwrap_or(i64::MAX);
        let started = match (clock.uptime_ms, self.boot_ms) {
            (Some(up), _) => Some((export.saturating_sub(up as i64), up as i64)),
            (None, Some(boot)) => {
                let boot = i64::try_from(boot).unwrap_or(i64::MAX);
                Some((boot, export.saturating_sub(boot)))
            }
            (None, None) => None,
        };
        let ms = |t: u64| t.saturating_mul(1_000_000);
        if let Some((boot, up)) = started {
            let at = |t: u64| {
                let age = i64::from((up as u32).wrapping_sub(t as u32) as i32);
                ms(u64::try_from(boot.saturating_add(up).saturating_sub(age)).unwrap_or(0))
            };
            if let Some(s) = start_up {
                f.start_ns = at(s);
            }
            if let Some(e) = end_up {
                f.end_ns = at(e);
            }
        }
        // RFC 5102 flowStart/EndDeltaMicroseconds (Open vSwitch): microseconds before the
        // message's export time.
        let export_ns = ms(clock.export_ms);
        if let Some(d) = start_delta_us {
            f.start_ns = export_ns.saturating_sub(d.saturating_mul(1000));
        }
        if let Some(d) = end_delta_us {
            f.end_ns = export_ns.saturating_sub(d.saturating_mul(1000));
        }
        if matches!(f.key.proto, 1 | 58) {
            let split = icmp_type.map(|t| icmp_port(t, icmp_code.unwrap_or(0)));
            if let Some(tc) = icmp.or(split) {
                f.key.dport = tc;
            }
        }
        // flowDirection (RFC 5102 §5.11.6): 0 ingress, 1 egress of the observation point. An
        // exporter that reports one interface as both ingress and egress does not mean that by
        // it: softflowd (ipfix.c, `flowDirection = i`) gives the address order of the two
        // halves of a bidirectional flow, and the same interface both ways.
        let same_interface = has_out_if && f.out_if == f.in_if;
        f.direction = match direction {
            Some(0) if !same_interface => Some(Direction::Ingress),
            Some(1) if !same_interface => Some(Direction::Egress),
            _ => None,
        };
        Some(f)
    }
}

fn addr(v: Value) -> Option<IpAddr> {
    match v {
        Value::V4(a) => Some(IpAddr::V4(a)),
        Value::V6(a) => Some(IpAddr::V6(a)),
        _ => None,
    }
}
