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
use std::net::IpAddr;
use telemark_core::records::Direction;
use telemark_wire::flow::{extract, FlowKey};
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
    /// The exporter (for sFlow, the agent address in the datagram).
    pub exporter: IpAddr,
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
    /// Data held for a template that did not come before the bound was reached.
    PendingDropped,
    /// A new exporter or domain past [`MAX_DOMAINS`] (spoofed sources must not grow memory).
    TooManyDomains,
}

impl Refusal {
    /// Its label in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Version => "version",
            Refusal::Malformed => "malformed",
            Refusal::PendingDropped => "pending_dropped",
            Refusal::TooManyDomains => "too_many_domains",
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
    /// Data sets decoded late, when their template came.
    pub pending_decoded: u64,
    /// Records the exporters' sequence numbers say were sent and never arrived.
    pub sequence_lost: u64,
    /// sFlow counter samples read.
    pub counter_samples: u64,
    /// Refusals by reason.
    pub refused: std::collections::BTreeMap<Refusal, u64>,
}

/// A data set that came before its template.
struct Pending {
    template: u16,
    body: Vec<u8>,
    clock: Clock,
}

/// What times in a message are relative to.
#[derive(Debug, Clone, Copy)]
struct Clock {
    /// Export time, ms since the epoch.
    export_ms: u64,
    /// The exporter's uptime at export, ms (v9).
    uptime_ms: Option<u64>,
}

/// One exporter's observation domain.
#[derive(Default)]
struct Domain {
    templates: Templates,
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
    pending: VecDeque<Pending>,
    /// The exporter's boot time, ms since the epoch (IPFIX systemInitTimeMilliseconds).
    boot_ms: Option<u64>,
}

/// The most (exporter, domain) pairs a decoder remembers; datagrams of new ones past it are
/// refused.
pub const MAX_DOMAINS: usize = 10_000;

/// Decodes datagrams; remembers what each exporter's domain defined.
pub struct Decoder {
    domains: HashMap<(IpAddr, u32), Domain>,
    /// sFlow: the next datagram sequence per (agent, sub-agent).
    sflow_next: HashMap<(IpAddr, u32), Option<u32>>,
    pending_max: usize,
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
    /// A template record (definition or withdrawal) of an (exporter, domain).
    Template((IpAddr, u32), TemplateRecord),
    /// A sampler's rate (no sampler: the domain's own rate).
    Sampler((IpAddr, u32), Option<u64>, u32),
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
    /// A decoder that holds at most `pending_max` data sets waiting for their templates,
    /// across all exporters.
    pub fn new(pending_max: usize) -> Decoder {
        Decoder {
            domains: HashMap::new(),
            sflow_next: HashMap::new(),
            pending_max,
            stats: DecodeStats::default(),
            changes: Vec::new(),
        }
    }

    /// What was learnt since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<Remembered> {
        std::mem::take(&mut self.changes)
    }

    /// Takes back what an earlier run learnt.
    pub fn restore(&mut self, r: Remembered) {
        match r {
            Remembered::Template(key, t) => self.domains.entry(key).or_default().templates.apply(t),
            Remembered::Sampler(key, sampler, rate) => {
                self.domains.entry(key).or_default().remember_rate(sampler, rate)
            }
        }
    }

    fn refuse(&mut self, why: Refusal) {
        *self.stats.refused.entry(why).or_default() += 1;
    }

    /// Decodes one datagram from `from` into `out`.
    pub fn datagram(&mut self, from: IpAddr, buf: &[u8], out: &mut Vec<ExportedFlow>) {
        self.stats.datagrams += 1;
        let before = out.len();
        match buf.get(..4) {
            Some([0, 5, ..]) => self.netflow5(from, buf, out),
            Some([0, 9, ..]) | Some([0, 10, ..]) => self.ipfix(from, buf, out),
            Some([0, 0, 0, 5]) => self.sflow(buf, out),
            _ => self.refuse(Refusal::Version),
        }
        self.stats.flows += (out.len() - before) as u64;
    }

    /// Whether `key`'s state may be kept: known already, or room for one more.
    fn admit(&mut self, key: (IpAddr, u32)) -> bool {
        if self.domains.contains_key(&key) || self.domains.len() < MAX_DOMAINS {
            return true;
        }
        self.refuse(Refusal::TooManyDomains);
        false
    }

    fn netflow5(&mut self, from: IpAddr, buf: &[u8], out: &mut Vec<ExportedFlow>) {
        let Ok((h, records)) = netflow5::parse(buf) else { return self.refuse(Refusal::Malformed) };
        let domain = (u32::from(h.engine_type) << 8) | u32::from(h.engine_id);
        if !self.admit((from, domain)) {
            return;
        }
        let d = self.domains.entry((from, domain)).or_default();
        self.stats.sequence_lost +=
            gap(&mut d.next_sequence, h.flow_sequence, records.len() as u32);
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

    fn ipfix(&mut self, from: IpAddr, buf: &[u8], out: &mut Vec<ExportedFlow>) {
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
        let key = (from, h.domain);
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
                        let id = match &r {
                            TemplateRecord::Define(t) => Some(t.id),
                            _ => None,
                        };
                        self.changes.push(Remembered::Template(key, r.clone()));
                        self.domains.entry(key).or_default().templates.apply(r);
                        if let Some(id) = id {
                            self.stats.templates += 1;
                            self.decode_pending(key, id, protocol, out);
                        }
                    }
                }
                SetKind::Data(id) => {
                    let d = self.domains.entry(key).or_default();
                    match d.templates.get(id).cloned() {
                        Some(t) => {
                            data_records += self.data_set(key, protocol, &t, set.body, clock, out);
                        }
                        None => {
                            let body = set.body.to_vec();
                            d.pending.push_back(Pending { template: id, body, clock });
                            self.stats.pending += 1;
                            self.bound_pending();
                        }
                    }
                }
                SetKind::Reserved(_) => {}
            }
        }
        if malformed {
            self.refuse(Refusal::Malformed);
        }
        let d = self.domains.entry(key).or_default();
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
                h.sequence
            }
            _ => h.sequence,
        };
        d.last_sequence = Some(seq);
        let seq = if d.counts_own_records { seq.wrapping_sub(sent) } else { seq };
        self.stats.sequence_lost += gap(&mut d.next_sequence, seq, sent);
    }

    /// Drops the oldest waiting data sets past the bound.
    fn bound_pending(&mut self) {
        while self.stats.pending as usize > self.pending_max {
            let Some(d) = self.domains.values_mut().find(|d| !d.pending.is_empty()) else { break };
            d.pending.pop_front();
            self.stats.pending -= 1;
            self.refuse(Refusal::PendingDropped);
        }
    }

    /// Decodes what waited for template `id` of domain `key`.
    fn decode_pending(
        &mut self,
        key: (IpAddr, u32),
        id: u16,
        protocol: Protocol,
        out: &mut Vec<ExportedFlow>,
    ) {
        let Some(d) = self.domains.get_mut(&key) else { return };
        if !d.pending.iter().any(|p| p.template == id) {
            return;
        }
        let Some(t) = d.templates.get(id).cloned() else { return };
        let (ready, waiting): (Vec<Pending>, Vec<Pending>) =
            d.pending.drain(..).partition(|p| p.template == id);
        d.pending = waiting.into();
        for p in ready {
            self.stats.pending -= 1;
            self.stats.pending_decoded += 1;
            self.data_set(key, protocol, &t, &p.body, p.clock, out);
        }
    }

    /// Decodes one data set with its template; returns how many records it held.
    fn data_set(
        &mut self,
        key: (IpAddr, u32),
        protocol: Protocol,
        t: &Template,
        body: &[u8],
        clock: Clock,
        out: &mut Vec<ExportedFlow>,
    ) -> u32 {
        let (mut n, mut malformed) = (0, false);
        let d = self.domains.entry(key).or_default();
        for rec in ipfix::DataRecords::new(body, t) {
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
        n
    }

    fn sflow(&mut self, buf: &[u8], out: &mut Vec<ExportedFlow>) {
        let Ok(dg) = sflow::parse(buf) else { return self.refuse(Refusal::Malformed) };
        let key = (dg.agent, dg.sub_agent);
        if !self.sflow_next.contains_key(&key) && self.sflow_next.len() >= MAX_DOMAINS {
            return self.refuse(Refusal::TooManyDomains);
        }
        // sFlow numbers datagrams: the records of the ones that never came are lost.
        let next = self.sflow_next.entry(key).or_default();
        self.stats.sequence_lost += gap(next, dg.sequence, 1);
        for s in &dg.samples {
            match s {
                sflow::Sample::Flow(f) => {
                    let (out_if, dropped) = match f.output {
                        sflow::Output::Interface(i) => (i, false),
                        sflow::Output::Discarded(_) => (0, true),
                        sflow::Output::Multiple(_) => (0, false),
                    };
                    let at = (f.input, out_if, f.sampling_rate, dropped);
                    if let Some(flow) = sflow_flow(&dg, at, &f.records) {
                        out.push(flow);
                    }
                }
                sflow::Sample::Discard(f) => {
                    if let Some(flow) = sflow_flow(&dg, (f.input, f.output, 1, true), &f.records) {
                        out.push(flow);
                    }
                }
                sflow::Sample::Counters(_) => self.stats.counter_samples += 1,
                sflow::Sample::Other { .. } => {}
            }
        }
    }
}

/// Moves the expected sequence number on by `sent`; returns how many were skipped.
fn gap(next: &mut Option<u32>, seq: u32, sent: u32) -> u64 {
    let lost = match *next {
        // Ahead by less than half the space: that many lost. Behind: reordered or restarted.
        Some(want) => {
            let d = seq.wrapping_sub(want);
            if d < 1 << 31 {
                u64::from(d)
            } else {
                0
            }
        }
        None => 0,
    };
    *next = Some(seq.wrapping_add(sent));
    lost
}

/// A flow from an sFlow sample's records: the sampled header read by Telemark's packet
/// parser, or the sampled IPv4/IPv6 record.
/// `at`: input and output interfaces, sampling rate, whether the packet was dropped.
fn sflow_flow(
    dg: &sflow::Datagram,
    at: (u32, u32, u32, bool),
    records: &[sflow::FlowData],
) -> Option<ExportedFlow> {
    let (input, output, rate, dropped) = at;
    let mut f = ExportedFlow {
        exporter: dg.agent,
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
        key: (IpAddr, u32),
        protocol: Protocol,
        rec: &ipfix::DataRecord,
        clock: Clock,
    ) -> Option<ExportedFlow> {
        let mut f = ExportedFlow {
            exporter: key.0,
            domain: key.1,
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
        // ICMP keyed as NetFlow v5 keys it (and softflowd's v9): type × 256 + code in the
        // destination port, so one flow has one key in every format.
        if matches!(f.key.proto, 1 | 58) {
            let split = icmp_type.map(|t| u16::from(t) << 8 | u16::from(icmp_code.unwrap_or(0)));
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
