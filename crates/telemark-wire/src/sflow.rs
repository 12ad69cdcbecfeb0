//! sFlow version 5 datagrams: flow samples (compact and expanded) with their flow records,
//! counter samples (compact and expanded) with generic interface counters, and discarded
//! packet events.
//!
//! References: sFlow.org, *sFlow Version 5* (2004): §5 "sFlow Datagram Format" (the XDR
//! definitions `sample_datagram_v5`, `flow_sample`, `flow_sample_expanded`, `counters_sample`,
//! `counters_sample_expanded`, `sampled_header`, `sampled_ipv4`, `sampled_ipv6`,
//! `extended_switch`, `if_counters`); sFlow.org, *sFlow Dropped Packet Notification
//! Structures* (2020): `discarded_packet` (sample format 5).
//!
//! ```text
//! datagram: version=5 | agent address (type, 4 or 16 bytes) | sub-agent | sequence | uptime
//!           | samples: [enterprise:20 format:12 | length | body] …
//! flow sample body: … | flow records: [enterprise:20 format:12 | length | body] …
//! ```
//! XDR: every field is a big-endian 32-bit word or a multiple of 4 bytes; opaque data is padded
//! to 4 bytes. Records of formats this module does not read come as [`FlowData::Other`] and
//! [`CounterData::Other`], their bytes kept.

use crate::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The datagram version.
pub const VERSION: u32 = 5;
/// The collector port sFlow agents send to by default.
pub const PORT: u16 = 6343;

const LAYER: &str = "sflow";

/// A datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The agent's address.
    pub agent: IpAddr,
    /// The sub-agent within it.
    pub sub_agent: u32,
    /// Datagrams this sub-agent sent before this one.
    pub sequence: u32,
    /// Milliseconds since the agent booted.
    pub uptime_ms: u32,
    /// The samples.
    pub samples: Vec<Sample<'a>>,
}

/// Where a sample was taken: the data source's class and index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Source {
    /// 0 ifIndex, 1 VLAN, 2 physical entity, 3 logical entity.
    pub class: u32,
    /// Its index.
    pub index: u32,
}

/// One sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sample<'a> {
    /// A sampled packet (formats 1 and 3).
    Flow(FlowSample<'a>),
    /// A counter poll (formats 2 and 4).
    Counters(CounterSample<'a>),
    /// A discarded packet (format 5).
    Discard(DiscardSample<'a>),
    /// A sample of another enterprise or format.
    Other {
        /// Enterprise.
        enterprise: u32,
        /// Format.
        format: u32,
        /// Its body.
        body: &'a [u8],
    },
}

/// A flow sample: one packet in `sampling_rate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowSample<'a> {
    /// Flow samples this source took before this one.
    pub sequence: u32,
    /// Where.
    pub source: Source,
    /// 1 in this many packets is sampled.
    pub sampling_rate: u32,
    /// Packets that could have been sampled.
    pub sample_pool: u32,
    /// Samples the agent lost for lack of resources.
    pub drops: u32,
    /// Input interface (ifIndex; 0 unknown).
    pub input: u32,
    /// Where the packet went.
    pub output: Output,
    /// Its flow records.
    pub records: Vec<FlowData<'a>>,
}

/// Where a sampled packet went: sFlow v5's `interface` (the top two bits of the compact form,
/// the format word of the expanded form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Out of this ifIndex (0 unknown, 0x3fffffff the agent itself).
    Interface(u32),
    /// Discarded, for this reason code.
    Discarded(u32),
    /// Out of this many interfaces (0: unknown how many).
    Multiple(u32),
}

impl Output {
    fn from_format(format: u32, value: u32) -> Output {
        match format {
            1 => Output::Discarded(value),
            2 => Output::Multiple(value),
            _ => Output::Interface(value),
        }
    }

    /// The compact form: format in the top two bits.
    fn compact(word: u32) -> Output {
        Output::from_format(word >> 30, word & 0x3fff_ffff)
    }
}

/// A discarded packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscardSample<'a> {
    /// Discard events this source reported before this one.
    pub sequence: u32,
    /// Where.
    pub source: Source,
    /// Discard events the agent could not report.
    pub drops: u32,
    /// Input interface (0 unknown).
    pub input: u32,
    /// Output interface (0 unknown).
    pub output: u32,
    /// Why it was discarded (the drop reason codes of the 2020 structures).
    pub reason: u32,
    /// Flow records describing the packet.
    pub records: Vec<FlowData<'a>>,
}

/// A counter sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSample<'a> {
    /// Counter samples this source sent before this one.
    pub sequence: u32,
    /// Where.
    pub source: Source,
    /// Its counter records.
    pub records: Vec<CounterData<'a>>,
}

/// A flow record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowData<'a> {
    /// The packet's first bytes (format 1).
    Header(SampledHeader<'a>),
    /// IPv4 fields (format 3).
    Ipv4(SampledIp),
    /// IPv6 fields (format 4).
    Ipv6(SampledIp),
    /// VLANs and priorities (format 1001).
    Switch(ExtendedSwitch),
    /// Another record.
    Other {
        /// Enterprise.
        enterprise: u32,
        /// Format.
        format: u32,
        /// Its body.
        body: &'a [u8],
    },
}

/// The first bytes of a sampled packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampledHeader<'a> {
    /// What the bytes start with: 1 Ethernet, 11 IPv4, 12 IPv6, … (`header_protocol`).
    pub protocol: u32,
    /// The packet's length on the wire.
    pub frame_length: u32,
    /// Bytes removed from it before sampling (the FCS, usually 4).
    pub stripped: u32,
    /// The bytes.
    pub header: &'a [u8],
}

/// A sampled packet's IP fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampledIp {
    /// The IP packet's length.
    pub length: u32,
    /// IP protocol.
    pub protocol: u32,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub sport: u32,
    /// Destination port.
    pub dport: u32,
    /// TCP flags.
    pub tcp_flags: u32,
    /// IPv4 TOS or IPv6 priority.
    pub tos: u32,
}

/// The extended switch record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedSwitch {
    /// 802.1Q VLAN of the incoming frame.
    pub src_vlan: u32,
    /// Its 802.1p priority.
    pub src_priority: u32,
    /// VLAN of the outgoing frame.
    pub dst_vlan: u32,
    /// Its priority.
    pub dst_priority: u32,
}

/// A counter record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CounterData<'a> {
    /// Generic interface counters (format 1).
    Interface(IfCounters),
    /// Another record.
    Other {
        /// Enterprise.
        enterprise: u32,
        /// Format.
        format: u32,
        /// Its body.
        body: &'a [u8],
    },
}

/// Generic interface counters (RFC 2233's ifTable and ifXTable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IfCounters {
    /// ifIndex.
    pub index: u32,
    /// ifType.
    pub if_type: u32,
    /// ifSpeed, bits/s.
    pub speed: u64,
    /// 0 unknown, 1 full duplex, 2 half, 3 in, 4 out.
    pub direction: u32,
    /// Bit 0 admin up, bit 1 oper up.
    pub status: u32,
    /// ifInOctets.
    pub in_octets: u64,
    /// ifInUcastPkts.
    pub in_unicast: u32,
    /// ifInMulticastPkts.
    pub in_multicast: u32,
    /// ifInBroadcastPkts.
    pub in_broadcast: u32,
    /// ifInDiscards.
    pub in_discards: u32,
    /// ifInErrors.
    pub in_errors: u32,
    /// ifInUnknownProtos.
    pub in_unknown_protos: u32,
    /// ifOutOctets.
    pub out_octets: u64,
    /// ifOutUcastPkts.
    pub out_unicast: u32,
    /// ifOutMulticastPkts.
    pub out_multicast: u32,
    /// ifOutBroadcastPkts.
    pub out_broadcast: u32,
    /// ifOutDiscards.
    pub out_discards: u32,
    /// ifOutErrors.
    pub out_errors: u32,
    /// ifPromiscuousMode.
    pub promiscuous: u32,
}

/// A cursor over XDR words.
struct Xdr<'a> {
    buf: &'a [u8],
}

impl<'a> Xdr<'a> {
    fn u32(&mut self) -> Result<u32> {
        Error::check_len(LAYER, 4, self.buf.len())?;
        let v = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        self.buf = &self.buf[4..];
        Ok(v)
    }

    fn u64(&mut self) -> Result<u64> {
        Ok((u64::from(self.u32()?) << 32) | u64::from(self.u32()?))
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        Error::check_len(LAYER, n, self.buf.len())?;
        let (v, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(v)
    }

    /// Opaque data: a length word, the bytes, padding to 4.
    fn opaque(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > self.buf.len() {
            return Err(Error::BadLength { layer: LAYER, field: "opaque length", value: n });
        }
        let v = self.bytes(n)?;
        // Padding to 4; an agent that leaves it off at the very end is tolerated.
        let pad = ((4 - n % 4) % 4).min(self.buf.len());
        self.bytes(pad)?;
        Ok(v)
    }

    fn addr(&mut self) -> Result<IpAddr> {
        match self.u32()? {
            1 => Ok(IpAddr::V4(self.v4()?)),
            2 => Ok(IpAddr::V6(self.v6()?)),
            _ => Err(Error::Malformed { layer: LAYER, field: "address type" }),
        }
    }

    fn v4(&mut self) -> Result<Ipv4Addr> {
        Ok(Ipv4Addr::from(self.u32()?))
    }

    fn v6(&mut self) -> Result<Ipv6Addr> {
        let b = self.bytes(16)?;
        let mut a = [0; 16];
        a.copy_from_slice(b);
        Ok(Ipv6Addr::from(a))
    }

    /// A count word, bounded by what the rest could hold (`min` bytes each), so that a lying
    /// count cannot make a reader allocate.
    fn count(&mut self, min: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n > self.buf.len() / min {
            return Err(Error::BadLength { layer: LAYER, field: "record count", value: n });
        }
        Ok(n)
    }

    /// An (enterprise, format, body) record, the data format word split.
    fn record(&mut self) -> Result<(u32, u32, &'a [u8])> {
        let format = self.u32()?;
        let body = self.opaque()?;
        Ok((format >> 12, format & 0xfff, body))
    }
}

/// Reads a datagram.
pub fn parse(buf: &[u8]) -> Result<Datagram<'_>> {
    let mut x = Xdr { buf };
    if x.u32()? != VERSION {
        return Err(Error::Malformed { layer: LAYER, field: "version" });
    }
    let agent = x.addr()?;
    let sub_agent = x.u32()?;
    let sequence = x.u32()?;
    let uptime_ms = x.u32()?;
    let n = x.count(8)?;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let (enterprise, format, body) = x.record()?;
        samples.push(sample(enterprise, format, body)?);
    }
    Ok(Datagram { agent, sub_agent, sequence, uptime_ms, samples })
}

/// A compact source id: class in the top 8 bits, index in the low 24.
fn compact(word: u32) -> Source {
    Source { class: word >> 24, index: word & 0x00ff_ffff }
}

fn sample(enterprise: u32, format: u32, body: &[u8]) -> Result<Sample<'_>> {
    let mut x = Xdr { buf: body };
    Ok(match (enterprise, format) {
        (0, 1) | (0, 3) => {
            let expanded = format == 3;
            let sequence = x.u32()?;
            let source = if expanded {
                Source { class: x.u32()?, index: x.u32()? }
            } else {
                compact(x.u32()?)
            };
            let (sampling_rate, sample_pool, drops) = (x.u32()?, x.u32()?, x.u32()?);
            let (input, output) = if expanded {
                // interface_expanded: a format word, then the value.
                let (_, i, of, o) = (x.u32()?, x.u32()?, x.u32()?, x.u32()?);
                (i, Output::from_format(of, o))
            } else {
                (x.u32()? & 0x3fff_ffff, Output::compact(x.u32()?))
            };
            let records = flow_records(&mut x)?;
            Sample::Flow(FlowSample {
                sequence,
                source,
                sampling_rate,
                sample_pool,
                drops,
                input,
                output,
                records,
            })
        }
        (0, 2) | (0, 4) => {
            let sequence = x.u32()?;
            let source = if format == 4 {
                Source { class: x.u32()?, index: x.u32()? }
            } else {
                compact(x.u32()?)
            };
            let n = x.count(8)?;
            let mut records = Vec::with_capacity(n);
            for _ in 0..n {
                let (enterprise, format, body) = x.record()?;
                records.push(match (enterprise, format) {
                    (0, 1) => CounterData::Interface(if_counters(body)?),
                    _ => CounterData::Other { enterprise, format, body },
                });
            }
            Sample::Counters(CounterSample { sequence, source, records })
        }
        (0, 5) => {
            let sequence = x.u32()?;
            let source = Source { class: x.u32()?, index: x.u32()? };
            let (drops, input, output, reason) = (x.u32()?, x.u32()?, x.u32()?, x.u32()?);
            let records = flow_records(&mut x)?;
            Sample::Discard(DiscardSample {
                sequence,
                source,
                drops,
                input,
                output,
                reason,
                records,
            })
        }
        _ => Sample::Other { enterprise, format, body },
    })
}

fn flow_records<'a>(x: &mut Xdr<'a>) -> Result<Vec<FlowData<'a>>> {
    let n = x.count(8)?;
    let mut records = Vec::with_capacity(n);
    for _ in 0..n {
        let (enterprise, format, body) = x.record()?;
        let mut r = Xdr { buf: body };
        records.push(match (enterprise, format) {
            (0, 1) => FlowData::Header(SampledHeader {
                protocol: r.u32()?,
                frame_length: r.u32()?,
                stripped: r.u32()?,
                header: r.opaque()?,
            }),
            (0, 3) | (0, 4) => {
                let (length, protocol) = (r.u32()?, r.u32()?);
                let (src, dst) = if format == 3 {
                    (IpAddr::V4(r.v4()?), IpAddr::V4(r.v4()?))
                } else {
                    (IpAddr::V6(r.v6()?), IpAddr::V6(r.v6()?))
                };
                let ip = SampledIp {
                    length,
                    protocol,
                    src,
                    dst,
                    sport: r.u32()?,
                    dport: r.u32()?,
                    tcp_flags: r.u32()?,
                    tos: r.u32()?,
                };
                if format == 3 {
                    FlowData::Ipv4(ip)
                } else {
                    FlowData::Ipv6(ip)
                }
            }
            (0, 1001) => FlowData::Switch(ExtendedSwitch {
                src_vlan: r.u32()?,
                src_priority: r.u32()?,
                dst_vlan: r.u32()?,
                dst_priority: r.u32()?,
            }),
            _ => FlowData::Other { enterprise, format, body },
        });
    }
    Ok(records)
}

fn if_counters(body: &[u8]) -> Result<IfCounters> {
    let mut x = Xdr { buf: body };
    Ok(IfCounters {
        index: x.u32()?,
        if_type: x.u32()?,
        speed: x.u64()?,
        direction: x.u32()?,
        status: x.u32()?,
        in_octets: x.u64()?,
        in_unicast: x.u32()?,
        in_multicast: x.u32()?,
        in_broadcast: x.u32()?,
        in_discards: x.u32()?,
        in_errors: x.u32()?,
        in_unknown_protos: x.u32()?,
        out_octets: x.u64()?,
        out_unicast: x.u32()?,
        out_multicast: x.u32()?,
        out_broadcast: x.u32()?,
        out_discards: x.u32()?,
        out_errors: x.u32()?,
        promiscuous: x.u32()?,
    })
}

/// Writes sFlow v5 datagrams, the encoding [`parse`] reads: samples are added one by one so
/// an exporter can stop before a datagram outgrows its path MTU.
///
/// A flow or counter sample goes out compact (formats 1, 2) when its source index fits 24
/// bits and its interfaces 30, expanded (formats 3, 4) otherwise; a discard goes out as
/// format 5.
#[derive(Debug, Clone)]
pub struct Writer {
    buf: Vec<u8>,
    count_at: usize,
    samples: u32,
}

struct Out<'a>(&'a mut Vec<u8>);

impl Out<'_> {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }

    fn opaque(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self.0.resize(self.0.len() + (4 - b.len() % 4) % 4, 0);
    }

    fn addr(&mut self, a: IpAddr) {
        match a {
            IpAddr::V4(v4) => {
                self.u32(1);
                self.0.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                self.u32(2);
                self.0.extend_from_slice(&v6.octets());
            }
        }
    }

    /// A record: format word, then a length-prefixed body written by `body`.
    fn record(&mut self, enterprise: u32, format: u32, body: impl FnOnce(&mut Out)) {
        self.u32((enterprise << 12) | (format & 0xfff));
        let at = self.0.len();
        self.u32(0);
        body(self);
        let len = (self.0.len() - at - 4) as u32;
        self.0[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
}

impl Output {
    /// The format (0 interface, 1 discarded, 2 multiple) and value of `interface`.
    fn format_value(self) -> (u32, u32) {
        match self {
            Output::Interface(v) => (0, v),
            Output::Discarded(v) => (1, v),
            Output::Multiple(v) => (2, v),
        }
    }
}

impl Writer {
    /// A datagram header: `sequence` counts the datagrams this sub-agent sent before.
    pub fn new(agent: IpAddr, sub_agent: u32, sequence: u32, uptime_ms: u32) -> Writer {
        let mut buf = Vec::with_capacity(1500);
        let mut o = Out(&mut buf);
        o.u32(VERSION);
        o.addr(agent);
        o.u32(sub_agent);
        o.u32(sequence);
        o.u32(uptime_ms);
        let count_at = buf.len();
        buf.extend_from_slice(&[0; 4]);
        Writer { buf, count_at, samples: 0 }
    }

    /// Adds a sample.
    pub fn push(&mut self, s: &Sample<'_>) {
        let mut o = Out(&mut self.buf);
        match s {
            Sample::Flow(f) => {
                let (of, ov) = f.output.format_value();
                let compact = f.source.index < 1 << 24 && f.input < 1 << 30 && ov < 1 << 30;
                o.record(0, if compact { 1 } else { 3 }, |o| {
                    o.u32(f.sequence);
                    if compact {
                        o.u32((f.source.class << 24) | f.source.index);
                    } else {
                        o.u32(f.source.class);
                        o.u32(f.source.index);
                    }
                    o.u32(f.sampling_rate);
                    o.u32(f.sample_pool);
                    o.u32(f.drops);
                    if compact {
                        o.u32(f.input);
                        o.u32((of << 30) | ov);
                    } else {
                        o.u32(0);
                        o.u32(f.input);
                        o.u32(of);
                        o.u32(ov);
                    }
                    flow_records_out(o, &f.records);
                });
            }
            Sample::Counters(c) => {
                let compact = c.source.index < 1 << 24;
                o.record(0, if compact { 2 } else { 4 }, |o| {
                    o.u32(c.sequence);
                    if compact {
                        o.u32((c.source.class << 24) | c.source.index);
                    } else {
                        o.u32(c.source.class);
                        o.u32(c.source.index);
                    }
                    o.u32(c.records.len() as u32);
                    for r in &c.records {
                        match r {
                            CounterData::Interface(i) => o.record(0, 1, |o| if_counters_out(o, i)),
                            CounterData::Other { enterprise, format, body } => {
                                o.record(*enterprise, *format, |o| o.0.extend_from_slice(body))
                            }
                        }
                    }
                });
            }
            Sample::Discard(d) => o.record(0, 5, |o| {
                o.u32(d.sequence);
                o.u32(d.source.class);
                o.u32(d.source.index);
                o.u32(d.drops);
                o.u32(d.input);
                o.u32(d.output);
                o.u32(d.reason);
                flow_records_out(o, &d.records);
            }),
            Sample::Other { enterprise, format, body } => {
                o.record(*enterprise, *format, |o| o.0.extend_from_slice(body))
            }
        }
        self.samples += 1;
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether no sample was added.
    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }

    /// Samples added.
    pub fn samples(&self) -> u32 {
        self.samples
    }

    /// The datagram.
    pub fn finish(mut self) -> Vec<u8> {
        let n = self.samples.to_be_bytes();
        self.buf[self.count_at..self.count_at + 4].copy_from_slice(&n);
        self.buf
    }
}

fn flow_records_out(o: &mut Out, records: &[FlowData<'_>]) {
    o.u32(records.len() as u32);
    for r in records {
        match r {
            FlowData::Header(h) => o.record(0, 1, |o| {
                o.u32(h.protocol);
                o.u32(h.frame_length);
                o.u32(h.stripped);
                o.opaque(h.header);
            }),
            FlowData::Ipv4(ip) | FlowData::Ipv6(ip) => {
                let format = if matches!(r, FlowData::Ipv4(_)) { 3 } else { 4 };
                o.record(0, format, |o| {
                    o.u32(ip.length);
                    o.u32(ip.protocol);
                    for a in [ip.src, ip.dst] {
                        match a {
                            IpAddr::V4(v4) => o.0.extend_from_slice(&v4.octets()),
                            IpAddr::V6(v6) => o.0.extend_from_slice(&v6.octets()),
                        }
                    }
                    for v in [ip.sport, ip.dport, ip.tcp_flags, ip.tos] {
                        o.u32(v);
                    }
                })
            }
            FlowData::Switch(s) => o.record(0, 1001, |o| {
                for v in [s.src_vlan, s.src_priority, s.dst_vlan, s.dst_priority] {
                    o.u32(v);
                }
            }),
            FlowData::Other { enterprise, format, body } => {
                o.record(*enterprise, *format, |o| o.0.extend_from_slice(body))
            }
        }
    }
}

fn if_counters_out(o: &mut Out, c: &IfCounters) {
    o.u32(c.index);
    o.u32(c.if_type);
    o.u64(c.speed);
    o.u32(c.direction);
    o.u32(c.status);
    o.u64(c.in_octets);
    for v in [
        c.in_unicast,
        c.in_multicast,
        c.in_broadcast,
        c.in_discards,
        c.in_errors,
        c.in_unknown_protos,
    ] {
        o.u32(v);
    }
    o.u64(c.out_octets);
    for v in [
        c.out_unicast,
        c.out_multicast,
        c.out_broadcast,
        c.out_discards,
        c.out_errors,
        c.promiscuous,
    ] {
        o.u32(v);
    }
}

#[cfg(test)]
mod writer_tests {
    use super::*;

    /// Every kind of sample the writer knows, compact and expanded, read back by `parse`.
    #[test]
    fn what_is_written_parses_back_the_same() {
        let header = [0xaau8; 61]; // not a multiple of 4: padded
        let flow = |index, input| {
            Sample::Flow(FlowSample {
                sequence: 7,
                source: Source { class: 0, index },
                sampling_rate: 64,
                sample_pool: 6400,
                drops: 2,
                input,
                output: Output::Interface(3),
                records: vec![
                    FlowData::Header(SampledHeader {
                        protocol: 1,
                        frame_length: 1514,
                        stripped: 4,
                        header: &header,
                    }),
                    FlowData::Switch(ExtendedSwitch {
                        src_vlan: 10,
                        src_priority: 0,
                        dst_vlan: 10,
                        dst_priority: 0,
                    }),
                ],
            })
        };
        let counters = |index| {
            Sample::Counters(CounterSample {
                sequence: 1,
                source: Source { class: 0, index },
                records: vec![CounterData::Interface(IfCounters {
                    index,
                    if_type: 6,
                    speed: 10_000_000_000,
                    in_octets: 1 << 40,
                    out_unicast: 99,
                    promiscuous: 2,
                    ..IfCounters::default()
                })],
            })
        };
        let samples = vec![
            flow(5, 5),
            flow(1 << 25, 1 << 31),
            counters(5),
            counters(1 << 25),
            Sample::Discard(DiscardSample {
                sequence: 3,
                source: Source { class: 0, index: 2 },
                drops: 0,
                input: 2,
                output: 0,
                reason: 0x102,
                records: vec![],
            }),
        ];
        for agent in [IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), IpAddr::V6(Ipv6Addr::LOCALHOST)] {
            let mut w = Writer::new(agent, 1, 42, 1000);
            for s in &samples {
                w.push(s);
            }
            let bytes = w.finish();
            assert_eq!(bytes.len() % 4, 0);
            let d = parse(&bytes).unwrap();
            let want = Datagram {
                agent,
                sub_agent: 1,
                sequence: 42,
                uptime_ms: 1000,
                samples: samples.clone(),
            };
            assert_eq!(d, want);
        }
    }
}
