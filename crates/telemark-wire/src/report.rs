//! Telemetry Reports: what an INT sink (or an INT-MX hop) sends to a collector.
//!
//! References: P4.org *Telemetry Report Format Specification* v2.0 (2020): §3.2 "Telemetry
//! Report Group Header", §3.3 "Individual Report Header", §3.3.1 INT main contents; v1.0 §3.2
//! (the 16-byte header INTCollector reads) and v0.5 §3.2 (fixed header with drop and
//! switch-local headers, ONOS and fabric.p4). The first nibble of a datagram is its version.
//!
//! ```text
//! v2.0: group header (8) | report header (4) | main: 8 fixed + MD Length words | inner | report …
//! v1.0: header (16 + optional metadata, Len words) | inner Ethernet / IPv4 / IPv6
//! v0.5: fixed header (12) | [drop header (12) or switch-local header (16)] | inner Ethernet
//! ```

use crate::dialect::{tolerate, Deviation, Deviations, Mode};
use crate::int::{Field, Format, Hop, Instructions, Layout};
use crate::{Error, Result};

/// UDP port collectors conventionally listen on for Telemetry Reports (ONOS, bmv2 examples).
pub const PORT: u16 = 32766;
/// v2.0 report group header length.
pub const GROUP_HEADER_LEN: usize = 8;
/// v2.0 individual report header length.
pub const INDIVIDUAL_HEADER_LEN: usize = 4;
/// v2.0 fixed part of the INT main contents (RepMdBits, Domain Specific ID, DSMdBits,
/// DSMdStatus).
pub const MAIN_FIXED_LEN: usize = 8;
/// v1.0 fixed header length.
pub const V1_HEADER_LEN: usize = 16;
/// v0.5 fixed header length.
pub const V05_HEADER_LEN: usize = 12;
/// v0.5 drop header length.
pub const DROP_HEADER_LEN: usize = 12;
/// v0.5 switch-local header length.
pub const LOCAL_HEADER_LEN: usize = 16;
/// CableLabs' domain-specific drop contents (InType 2): timestamp, count, 16-byte key.
const CABLELABS_DROP_LEN: usize = 32;
/// CableLabs' INT main contents: the fixed part and one 4-byte word, whatever RepMdBits says.
const CABLELABS_MAIN_LEN: usize = MAIN_FIXED_LEN + 4;

/// Telemetry Report specification version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReportVersion {
    /// v0.5.
    V0_5,
    /// v1.0.
    V1_0,
    /// v2.0.
    V2_0,
}

/// What produced an individual report (v2.0 RepType).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RepType {
    /// 0.
    None,
    /// 1: INT.
    Int,
    /// Anything else.
    Unknown(u8),
}

/// What the report carries after its metadata (v2.0 InType; v0.5/v1.0 NProto mapped onto it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InType {
    /// 0: nothing.
    None,
    /// 1: TLV.
    Tlv,
    /// 2: domain-specific extension data.
    DomainSpecific,
    /// 3: an Ethernet frame.
    Ethernet,
    /// 4: an IPv4 packet.
    Ipv4,
    /// 5: an IPv6 packet.
    Ipv6,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for InType {
    fn from(v: u8) -> Self {
        match v {
            0 => InType::None,
            1 => InType::Tlv,
            2 => InType::DomainSpecific,
            3 => InType::Ethernet,
            4 => InType::Ipv4,
            5 => InType::Ipv6,
            o => InType::Unknown(o),
        }
    }
}

/// Why a report was sent: the D, Q, F and I flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags {
    /// D: the packet was dropped.
    pub dropped: bool,
    /// Q: a queue crossed its congestion threshold.
    pub congested: bool,
    /// F: the packet belongs to a tracked flow (INT sink or postcard).
    pub tracked_flow: bool,
    /// I: an intermediate hop sent this report (v2.0).
    pub intermediate: bool,
}

/// A drop as v0.5/v1.0 drop headers or CableLabs' domain-specific contents describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Drop {
    /// Drop reason code (v0.5/v1.0).
    pub reason: u8,
    /// Packets dropped (CableLabs).
    pub count: u64,
    /// Seconds timestamp (CableLabs).
    pub timestamp: u32,
    /// Dropped flow's hashed key (CableLabs).
    pub key: [u8; 16],
}

/// One individual report, whatever the version it came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report<'a> {
    /// Specification version of the datagram.
    pub version: ReportVersion,
    /// Hardware ID (6 bits).
    pub hw_id: u8,
    /// Sequence number of the datagram.
    pub seq: u32,
    /// Width of `seq` in bits, where it wraps: 22 in v2.0, 16 in CableLabs' dialect, 32 in
    /// v0.5 and v1.0.
    pub seq_bits: u8,
    /// Reporting node (v2.0 group, v1.0 header, v0.5 drop/local header).
    pub node_id: Option<u32>,
    /// Ingress timestamp in the fixed header (v0.5/v1.0).
    pub ingress_ts: Option<u32>,
    /// RepType (v2.0; INT for the older versions).
    pub rep_type: RepType,
    /// What `inner` is.
    pub in_type: InType,
    /// D/Q/F/I.
    pub flags: Flags,
    /// RepMdBits (v2.0) or the v1.0 header's.
    pub md_bits: Instructions,
    /// Domain-specific ID (v2.0).
    pub domain_id: u16,
    /// DSMdBits (v2.0).
    pub ds_md_bits: u16,
    /// DSMdStatus (v2.0).
    pub ds_md_status: u16,
    /// The reporting node's own metadata as on the wire (read it with
    /// [`metadata`](Self::metadata)): v2.0's variable optional baseline metadata, v1.0's
    /// optional metadata, or a v0.5 drop or switch-local header.
    pub md: &'a [u8],
    /// Drop details when the report is about a drop.
    pub drop: Option<Drop>,
    /// The inner contents (a frame or packet per `in_type`).
    pub inner: &'a [u8],
    /// Rules broken and accepted in tolerant mode.
    pub deviations: Deviations,
}

impl<'a> Report<'a> {
    /// The reporting node's own metadata (empty when the report carries none).
    pub fn metadata(&self) -> Hop {
        let mut h = Hop::default();
        match self.version {
            ReportVersion::V2_0 => {
                let _ = Layout::new(self.md_bits, Format::ReportV2_0).read_into(self.md, 0, &mut h);
            }
            ReportVersion::V1_0 => {
                let _ = Layout::new(self.md_bits, Format::ReportV1_0).read_into(self.md, 0, &mut h);
            }
            // v0.5 drop (§3.2.2) and switch-local (§3.2.3) headers share their first 9 bytes.
            ReportVersion::V0_5 if self.md.len() >= DROP_HEADER_LEN => {
                let b = self.md;
                h.set(Field::NodeId, u64::from(be32(b, 0)));
                h.set(Field::L1IngressIf, u64::from(be16(b, 4)));
                h.set(Field::L1EgressIf, u64::from(be16(b, 6)));
                h.set(Field::QueueId, u64::from(b[8]));
                if b.len() == DROP_HEADER_LEN {
                    h.set(Field::DropReason, u64::from(b[9]));
                } else if b.len() >= LOCAL_HEADER_LEN {
                    h.set(
                        Field::QueueOccupancy,
                        u64::from(u32::from_be_bytes([0, b[9], b[10], b[11]])),
                    );
                    h.set(Field::EgressTs, u64::from(be32(b, 12)));
                }
            }
            ReportVersion::V0_5 => {}
        }
        h
    }

    fn new(version: ReportVersion) -> Report<'a> {
        Report {
            version,
            hw_id: 0,
            seq: 0,
            seq_bits: match version {
                ReportVersion::V2_0 => 22,
                ReportVersion::V0_5 | ReportVersion::V1_0 => 32,
            },
            node_id: None,
            ingress_ts: None,
            rep_type: RepType::Int,
            in_type: InType::Ethernet,
            flags: Flags::default(),
            md_bits: Instructions(0),
            domain_id: 0,
            ds_md_bits: 0,
            ds_md_status: 0,
            md: &[],
            drop: None,
            inner: &[],
            deviations: Deviations::NONE,
        }
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The reports of one datagram, in wire order.
#[derive(Debug, Clone)]
pub struct Reports<'a> {
    rest: &'a [u8],
    head: Report<'a>,
    mode: Mode,
    /// Set once a v0.5/v1.0 datagram's only report was yielded, or an error ended the walk.
    done: bool,
}

/// Reads a Telemetry Report datagram (the UDP payload).
pub fn parse(datagram: &[u8], mode: Mode) -> Result<Reports<'_>> {
    Error::check_len("telemetry report", 4, datagram.len())?;
    match datagram[0] >> 4 {
        0 => Ok(Reports::single(parse_legacy(datagram, ReportVersion::V0_5, mode)?, mode)),
        1 if !looks_like_v2_group(datagram) => {
            Ok(Reports::single(parse_legacy(datagram, ReportVersion::V1_0, mode)?, mode))
        }
        1 | 2 => parse_group(datagram, mode),
        _ => Err(Error::Malformed { layer: "telemetry report", field: "version" }),
    }
}

/// bmv2 writes version 1 into a v2.0 group header. A v1.0 header has Len ≥ 4 words in its
/// second nibble; a v2.0 group has hw_id there and an individual report header with RepType 1
/// at byte 8.
fn looks_like_v2_group(b: &[u8]) -> bool {
    let v1_len = b[0] & 0x0f;
    v1_len < 4 && b.len() > GROUP_HEADER_LEN && b[GROUP_HEADER_LEN] >> 4 == 1
}

fn parse_group(b: &[u8], mode: Mode) -> Result<Reports<'_>> {
    Error::check_len("telemetry report", GROUP_HEADER_LEN, b.len())?;
    let mut head = Report::new(ReportVersion::V2_0);
    if b[0] >> 4 == 1 {
        let bad = Error::Malformed { layer: "telemetry report", field: "version" };
        tolerate(mode, &mut head.deviations, Deviation::GroupVersionOne, bad)?;
    }
    let w0 = be32(b, 0);
    head.hw_id = ((w0 >> 22) & 0x3f) as u8;
    head.seq = w0 & 0x3f_ffff;
    head.node_id = Some(be32(b, 4));
    if b.len() == GROUP_HEADER_LEN && mode == Mode::Strict {
        // TR v2.0 §3.3: a report packet holds one or more individual reports. Tolerantly
        // the group is returned with no report (its sequence number still tells it arrived).
        return Err(Error::Malformed { layer: "telemetry report", field: "group without reports" });
    }
    Ok(Reports { rest: &b[GROUP_HEADER_LEN..], head, mode, done: false })
}

impl<'a> Reports<'a> {
    fn single(r: Report<'a>, mode: Mode) -> Reports<'a> {
        Reports { rest: &[], head: r, mode, done: false }
    }

    /// The group-level fields (version, hardware ID, sequence number, node).
    pub fn group(&self) -> &Report<'a> {
        &self.head
    }

    fn next_individual(&mut self) -> Result<Report<'a>> {
        let b = self.rest;
        Error::check_len("individual report", INDIVIDUAL_HEADER_LEN, b.len())?;
        let mut r = self.head;
        r.rep_type = match b[0] >> 4 {
            0 => RepType::None,
            1 => RepType::Int,
            o => RepType::Unknown(o),
        };
        r.in_type = InType::from(b[0] & 0x0f);
        let report_len = usize::from(b[1]) * 4;
        let md_len = usize::from(b[2]) * 4;
        r.flags = Flags {
            dropped: b[3] & 0x80 != 0,
            congested: b[3] & 0x40 != 0,
            tracked_flow: b[3] & 0x20 != 0,
            intermediate: b[3] & 0x10 != 0,
        };
        let body_all = &b[INDIVIDUAL_HEADER_LEN..];
        // CableLabs' dialect: RepType 0, fixed 12-byte main contents, 16-bit sequence number,
        // and lengths that do not cover what follows; the rest of the datagram is this report.
        if r.rep_type == RepType::None && r.in_type != InType::None {
            let bad = Error::Malformed { layer: "individual report", field: "rep type" };
            tolerate(self.mode, &mut r.deviations, Deviation::RepTypeNone, bad)?;
            r.seq = (self.head.seq >> 6) & 0xffff;
            r.seq_bits = 16;
            self.rest = &[];
            return cablelabs_contents(r, body_all, report_len);
        }
        let body = if b[1] == 0xff {
            // Report Length 0xFF: the report runs to the end of the datagram (§3.3).
            self.rest = &[];
            body_all
        } else if report_len == 0 && !body_all.is_empty() {
            let bad = Error::BadLength { layer: "individual report", field: "length", value: 0 };
            tolerate(self.mode, &mut r.deviations, Deviation::ReportLengthZero, bad)?;
            self.rest = &[];
            body_all
        } else {
            let Some(body) = body_all.get(..report_len) else {
                return Err(Error::BadLength {
                    layer: "individual report",
                    field: "length",
                    value: report_len,
                });
            };
            self.rest = &body_all[report_len..];
            body
        };
        if r.rep_type != RepType::Int {
            r.inner = body;
            return Ok(r);
        }
        // Main contents: the fixed 8 bytes, then the baseline metadata RepMdBits asks for,
        // then domain-specific metadata; MD Length counts the last two.
        Error::check_len("individual report", MAIN_FIXED_LEN, body.len())?;
        r.md_bits = Instructions(be16(body, 0));
        r.domain_id = be16(body, 2);
        r.ds_md_bits = be16(body, 4);
        r.ds_md_status = be16(body, 6);
        let need = Layout::len_of(r.md_bits, Format::ReportV2_0);
        let main_len = MAIN_FIXED_LEN + md_len;
        let md = body.get(MAIN_FIXED_LEN..main_len).filter(|md| md.len() >= need);
        let Some(md) = md else {
            return Err(Error::BadLength {
                layer: "individual report",
                field: "md length",
                value: md_len,
            });
        };
        r.md = md;
        r.inner = &body[main_len..];
        inner_type_check(&mut r, self.mode)?;
        Ok(r)
    }
}

/// Checks that InType 4/5 contents start with an IP header; bmv2 and CableLabs send Ethernet.
fn inner_type_check(r: &mut Report<'_>, mode: Mode) -> Result<()> {
    let want = match r.in_type {
        InType::Ipv4 => 4,
        InType::Ipv6 => 6,
        _ => return Ok(()),
    };
    if r.inner.first().map(|b| b >> 4) == Some(want) {
        return Ok(());
    }
    let ethertype = r.inner.get(12..14).map(|t| u16::from_be_bytes([t[0], t[1]]));
    let eth_ok = matches!((want, ethertype), (4, Some(0x0800)) | (6, Some(0x86dd)));
    let bad = Error::Malformed { layer: "individual report", field: "inner type" };
    if !eth_ok {
        return Err(bad);
    }
    tolerate(mode, &mut r.deviations, Deviation::InnerEthernetDespiteInType, bad)?;
    r.in_type = InType::Ethernet;
    Ok(())
}

fn cablelabs_contents<'a>(
    mut r: Report<'a>,
    body: &'a [u8],
    report_len: usize,
) -> Result<Report<'a>> {
    Error::check_len("individual report", CABLELABS_MAIN_LEN, body.len())?;
    r.md_bits = Instructions(be16(body, 0));
    r.domain_id = be16(body, 2);
    r.ds_md_bits = be16(body, 4);
    r.ds_md_status = be16(body, 6);
    let rest = &body[CABLELABS_MAIN_LEN..];
    if report_len < body.len() {
        r.deviations.insert(Deviation::ReportLengthShort);
    }
    if r.in_type == InType::DomainSpecific {
        Error::check_len("cablelabs drop", CABLELABS_DROP_LEN, rest.len())?;
        let mut key = [0u8; 16];
        key.copy_from_slice(&rest[16..32]);
        r.drop = Some(Drop {
            reason: 0,
            timestamp: be32(rest, 0),
            count: u64::from(be32(rest, 8)) << 32 | u64::from(be32(rest, 12)),
            key,
        });
        r.flags.dropped = true;
        r.inner = &rest[CABLELABS_DROP_LEN..];
        return Ok(r);
    }
    r.inner = rest;
    inner_type_check(&mut r, Mode::Tolerant)?;
    Ok(r)
}

/// v0.5 and v1.0: one report per datagram.
fn parse_legacy(b: &[u8], version: ReportVersion, _mode: Mode) -> Result<Report<'_>> {
    let mut r = Report::new(version);
    if version == ReportVersion::V1_0 {
        // Ver(4) Len(4) NProto(3) RepMdBits(6) Rsvd(6) D Q F hw_id(6) | switch id | seq |
        // ingress timestamp | optional metadata (v1.0 §3.2).
        Error::check_len("telemetry report v1.0", V1_HEADER_LEN, b.len())?;
        let len = usize::from(b[0] & 0x0f) * 4;
        if len < V1_HEADER_LEN || len > b.len() {
            return Err(Error::BadLength {
                layer: "telemetry report v1.0",
                field: "len",
                value: len,
            });
        }
        let w0 = be32(b, 0);
        r.md_bits = Instructions((((w0 >> 15) & 0x3f) as u16) << 10);
        r.flags = Flags {
            dropped: b[2] & 0x01 != 0,
            congested: b[3] & 0x80 != 0,
            tracked_flow: b[3] & 0x40 != 0,
            intermediate: false,
        };
        r.hw_id = b[3] & 0x3f;
        r.node_id = Some(be32(b, 4));
        r.seq = be32(b, 8);
        r.ingress_ts = Some(be32(b, 12));
        let layout = Layout::new(r.md_bits, Format::ReportV1_0);
        let Some(md) = b.get(V1_HEADER_LEN..len).filter(|md| md.len() >= layout.hop_len()) else {
            return Err(Error::BadLength {
                layer: "telemetry report v1.0",
                field: "len",
                value: len,
            });
        };
        r.md = md;
        if let Some(reason) = r.metadata().get(Field::DropReason) {
            r.drop = Some(Drop { reason: reason as u8, ..Drop::default() });
        }
        r.in_type = match (w0 >> 21) & 0x7 {
            0 => InType::Ethernet,
            1 => InType::Ipv4,
            2 => InType::Ipv6,
            _ => return Err(Error::Malformed { layer: "telemetry report v1.0", field: "nproto" }),
        };
        r.inner = &b[len..];
        return Ok(r);
    }
    // Ver(4) NProto(4) D Q F Reserved(15) hw_id(6) | seq | ingress timestamp (v0.5 §3.2.1).
    Error::check_len("telemetry report v0.5", V05_HEADER_LEN, b.len())?;
    r.flags = Flags {
        dropped: b[1] & 0x80 != 0,
        congested: b[1] & 0x40 != 0,
        tracked_flow: b[1] & 0x20 != 0,
        intermediate: false,
    };
    r.hw_id = b[3] & 0x3f;
    r.seq = be32(b, 4);
    r.ingress_ts = Some(be32(b, 8));
    let rest = &b[V05_HEADER_LEN..];
    // Drop (§3.2.2) and switch-local (§3.2.3) headers share their first 9 bytes.
    let local_len = match b[0] & 0x0f {
        0 => 0,
        1 => DROP_HEADER_LEN,
        2 => LOCAL_HEADER_LEN,
        _ => return Err(Error::Malformed { layer: "telemetry report v0.5", field: "nproto" }),
    };
    if local_len > 0 {
        Error::check_len("telemetry report v0.5", local_len, rest.len())?;
        r.node_id = Some(be32(rest, 0));
        r.md = &rest[..local_len];
        if local_len == DROP_HEADER_LEN {
            r.drop = Some(Drop { reason: rest[9], ..Drop::default() });
            r.flags.dropped = true;
        }
    }
    r.in_type = InType::Ethernet;
    r.inner = &rest[local_len..];
    Ok(r)
}

impl<'a> Iterator for Reports<'a> {
    type Item = Result<Report<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.head.version != ReportVersion::V2_0 {
            self.done = true;
            return Some(Ok(self.head));
        }
        if self.rest.is_empty() {
            self.done = true;
            return None;
        }
        let r = self.next_individual();
        if r.is_err() {
            self.done = true;
        }
        Some(r)
    }
}

/// Writes v2.0 reports: a group header, then one individual INT report per call to
/// [`push`](Self::push).
#[derive(Debug)]
pub struct Writer<'b> {
    buf: &'b mut [u8],
    len: usize,
}

impl<'b> Writer<'b> {
    /// Starts a datagram in `buf` with the group header.
    pub fn new(buf: &'b mut [u8], hw_id: u8, seq: u32, node_id: u32) -> Result<Writer<'b>> {
        Error::check_len("telemetry report", GROUP_HEADER_LEN, buf.len())?;
        let w0 = (2u32 << 28) | (u32::from(hw_id & 0x3f) << 22) | (seq & 0x3f_ffff);
        buf[..4].copy_from_slice(&w0.to_be_bytes());
        buf[4..8].copy_from_slice(&node_id.to_be_bytes());
        Ok(Writer { buf, len: GROUP_HEADER_LEN })
    }

    /// Appends an individual INT report with `metadata` for `md_bits` and the inner contents
    /// (padded to a 4-byte boundary as Report Length counts words).
    pub fn push(
        &mut self,
        in_type: InType,
        flags: Flags,
        md_bits: Instructions,
        metadata: &Hop,
        inner: &[u8],
    ) -> Result<()> {
        let layout = Layout::new(md_bits, Format::ReportV2_0);
        let main = MAIN_FIXED_LEN + layout.hop_len();
        let body = main + inner.len().next_multiple_of(4);
        let total = INDIVIDUAL_HEADER_LEN + body;
        let (md_words, body_words) = (layout.hop_len() / 4, body / 4);
        if body_words >= 255 || md_words > 255 {
            return Err(Error::BadLength {
                layer: "individual report",
                field: "length",
                value: body,
            });
        }
        let Some(out) = self.buf.get_mut(self.len..self.len + total) else {
            return Err(Error::Truncated {
                layer: "telemetry report",
                need: self.len + total,
                have: self.buf.len(),
            });
        };
        out.fill(0);
        let in_type = match in_type {
            InType::None => 0,
            InType::Tlv => 1,
            InType::DomainSpecific => 2,
            InType::Ethernet => 3,
            InType::Ipv4 => 4,
            InType::Ipv6 => 5,
            InType::Unknown(o) => o & 0x0f,
        };
        out[0] = (1 << 4) | in_type;
        out[1] = body_words as u8;
        out[2] = md_words as u8;
        out[3] = (u8::from(flags.dropped) << 7)
            | (u8::from(flags.congested) << 6)
            | (u8::from(flags.tracked_flow) << 5)
            | (u8::from(flags.intermediate) << 4);
        out[4..6].copy_from_slice(&md_bits.0.to_be_bytes());
        layout.write(metadata, &mut out[INDIVIDUAL_HEADER_LEN + MAIN_FIXED_LEN..])?;
        let at = INDIVIDUAL_HEADER_LEN + main;
        out[at..at + inner.len()].copy_from_slice(inner);
        self.len += total;
        Ok(())
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether only the group header is written.
    pub fn is_empty(&self) -> bool {
        self.len == GROUP_HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_round_trip() {
        let mut buf = [0u8; 256];
        let bits = Instructions::of(&[Field::NodeId, Field::HopLatency, Field::QueueOccupancy]);
        let mut md = Hop::default();
        md.set(Field::NodeId, 9);
        md.set(Field::HopLatency, 123_456);
        md.set(Field::QueueId, 2);
        md.set(Field::QueueOccupancy, 77);
        let inner = [0x45u8, 0, 0, 20, 1, 2, 3];
        let mut w = Writer::new(&mut buf, 5, 0x3f_fffe, 9).unwrap();
        let flags = Flags { congested: true, tracked_flow: true, ..Flags::default() };
        w.push(InType::Ipv4, flags, bits, &md, &inner).unwrap();
        w.push(InType::None, Flags::default(), Instructions(0), &Hop::default(), &[]).unwrap();
        let n = w.len();
        let reports: Vec<_> = parse(&buf[..n], Mode::Strict).unwrap().collect();
        assert_eq!(reports.len(), 2);
        let r = reports[0].unwrap();
        assert_eq!((r.hw_id, r.seq, r.node_id), (5, 0x3f_fffe, Some(9)));
        assert_eq!(r.flags, flags);
        assert_eq!(r.metadata().get(Field::HopLatency), Some(123_456));
        assert_eq!(r.metadata().get(Field::QueueOccupancy), Some(77));
        assert_eq!(&r.inner[..7], &inner);
        assert!(r.deviations.is_empty());
        assert_eq!(reports[1].unwrap().in_type, InType::None);
    }

    #[test]
    fn a_group_header_alone_holds_no_report() {
        // Group header only (TR v2.0 §3.2): version 2, hw_id 1, seq 5, node 7.
        let b = [0x20, 0x40, 0x00, 0x05, 0, 0, 0, 7];
        assert!(parse(&b, Mode::Strict).is_err(), "§3.3: one or more reports");
        let rs = parse(&b, Mode::Tolerant).unwrap();
        assert_eq!((rs.group().seq, rs.group().node_id), (5, Some(7)));
        assert_eq!(rs.count(), 0);
    }

    #[test]
    fn v05_local_report() {
        let mut b = vec![0x02, 0x40, 0x00, 0x05, 0, 0, 0, 7, 0, 0, 1, 0];
        b.extend_from_slice(&[0, 0, 0, 42, 0, 1, 0, 2, 3, 0, 1, 0, 0, 0, 0, 9]);
        b.extend_from_slice(&[0xaa; 14]);
        let r = parse(&b, Mode::Strict).unwrap().next().unwrap().unwrap();
        assert_eq!(r.version, ReportVersion::V0_5);
        assert_eq!((r.seq, r.ingress_ts, r.node_id, r.hw_id), (7, Some(256), Some(42), 5));
        assert!(r.flags.congested);
        assert_eq!(r.metadata().get(Field::QueueOccupancy), Some(256));
        assert_eq!(r.metadata().get(Field::L1EgressIf), Some(2));
        assert_eq!(r.metadata().get(Field::EgressTs), Some(9));
        assert_eq!(r.inner.len(), 14);
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(data: Vec<u8>) {
            for mode in [Mode::Strict, Mode::Tolerant] {
                if let Ok(rs) = parse(&data, mode) {
                    for r in rs.take(64) {
                        let _ = r.map(|r| r.metadata().get(Field::NodeId));
                    }
                }
            }
        }
    }
}
