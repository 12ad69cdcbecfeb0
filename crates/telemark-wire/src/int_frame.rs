//! INT in a whole frame: finding it, and the three edits of the INT roles (INT v2.1 §3 "INT
//! node roles", §5.7.2 "INT over TCP/UDP"):
//!
//! - [`insert`] (source): put a shim, an INT-MD header and this switch's metadata after the
//!   TCP/UDP header, signal INT by DSCP (NPT 0, original DSCP kept in the shim) or by UDP
//!   destination port (NPT 1, original port kept in the shim);
//! - [`push`] (transit): add this switch's metadata on top of the stack, or set E when the
//!   remaining hop count is spent, or M when the frame would outgrow the MTU;
//! - [`strip`] (sink): remove INT and give the packet back as the source received it: DSCP,
//!   port or protocol restored, lengths and checksums as they were.
//!
//! Lengths (IPv4 total length, IPv6 payload length, UDP length) move by the bytes added or
//! removed; the IPv4 header checksum and the TCP/UDP checksum are recomputed (a UDP checksum
//! of 0 over IPv4, "none", stays 0). Frames are Ethernet with up to two VLAN tags.

use crate::checksum;
use crate::dialect::Mode;
use crate::int::{
    HeaderType, Hop, Instructions, Int, Layout, MdHeader, NextProtocol, ShimRepr, Version,
    MD_HEADER_LEN, SHIM_LEN,
};
use crate::{Error, FlowKey, Result};
use core::net::IpAddr;

/// How this INT domain signals that a packet carries INT (INT v2.1 §5.7.2 leaves the values
/// to the deployment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal {
    /// A DSCP value (NPT 0). The spec's examples use 0x17.
    pub dscp: Option<u8>,
    /// A UDP destination port (NPT 1 for UDP packets; NPT 2 packets carry it too).
    pub udp_port: Option<u16>,
    /// The DSCP bit that alternate marking owns in this domain (RFC 9341 §3: the loss
    /// monitor's color), if one does. INT signalled by DSCP leaves that bit alone, so one flow
    /// can carry both: the bit is not compared when INT is looked for, the source writes
    /// `dscp` around it, and the sink restores the original DSCP around it.
    pub color_bit: Option<u8>,
}

impl Default for Signal {
    fn default() -> Self {
        Signal { dscp: Some(0x17), udp_port: None, color_bit: None }
    }
}

impl Signal {
    /// The DSCP bits INT owns: all six but the color bit.
    fn int_bits(&self) -> u8 {
        0x3f & !self.color_bit.map_or(0, |b| 1 << b)
    }

    /// Whether DSCP `on_wire` signals INT.
    #[inline]
    pub fn by_dscp(&self, on_wire: u8) -> bool {
        self.dscp.is_some_and(|d| (d ^ on_wire) & self.int_bits() == 0)
    }

    /// INT's bits from `from`, the color as it is `on_wire`: what a source writes (`from`:
    /// the signal) and what a sink gives back (`from`: the DSCP the source kept in the shim;
    /// the color may have been set by a marker inside the domain since).
    fn with_color_on_wire(&self, from: u8, on_wire: u8) -> u8 {
        (from & self.int_bits()) | (on_wire & !self.int_bits() & 0x3f)
    }
}

/// Where the layers of a frame start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layers {
    /// Offset of the IP header.
    pub ip: usize,
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// Offset of the TCP/UDP header.
    pub l4: usize,
    /// IP protocol on the wire (17 or 6).
    pub proto: u8,
    /// Offset of the byte after the TCP/UDP header: where INT is, or would go.
    pub after_l4: usize,
    /// DSCP on the wire.
    pub dscp: u8,
}

/// INT found in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found<'a> {
    /// The layers.
    pub layers: Layers,
    /// The INT headers and stack.
    pub int: Int<'a>,
    /// The flow as the source saw it: original protocol and ports.
    pub flow: FlowKey,
}

const UDP: u8 = 17;
const TCP: u8 = 6;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// What the bytes start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// An Ethernet header (a switch port, InType 3 reports).
    Ethernet,
    /// An IPv4 or IPv6 header (InType 4/5 reports).
    Ip,
}

/// Walks Ethernet, VLAN tags, IPv4/IPv6 to a TCP or UDP header. `None` for anything else
/// (other protocols, IPv4 fragments, IPv6 extension headers).
pub fn layers(frame: &[u8]) -> Option<Layers> {
    layers_from(frame, Start::Ethernet)
}

/// [`layers`] of bytes that start as `start` says.
#[inline]
pub fn layers_from(frame: &[u8], start: Start) -> Option<Layers> {
    let (ip, ethertype) = match start {
        Start::Ethernet => {
            let mut at = 12;
            let mut ethertype = be16(frame.get(..14)?, 12);
            for _ in 0..2 {
                if ethertype == 0x8100 || ethertype == 0x88a8 {
                    at += 4;
                    ethertype = be16(frame.get(..at + 2)?, at);
                }
            }
            (at + 2, ethertype)
        }
        Start::Ip => match frame.first()? >> 4 {
            4 => (0, 0x0800),
            6 => (0, 0x86dd),
            _ => return None,
        },
    };
    let (v6, proto, l4, dscp) = match ethertype {
        0x0800 => {
            let h = frame.get(ip..ip + 20)?;
            let ihl = usize::from(h[0] & 0x0f) * 4;
            let fragment = be16(h, 6) & 0x3fff != 0;
            if h[0] >> 4 != 4 || ihl < 20 || fragment {
                return None;
            }
            (false, h[9], ip + ihl, h[1] >> 2)
        }
        0x86dd => {
            let h = frame.get(ip..ip + 40)?;
            if h[0] >> 4 != 6 {
                return None;
            }
            (true, h[6], ip + 40, (be16(h, 0) >> 6) as u8 & 0x3f)
        }
        _ => return None,
    };
    let l4_len = match proto {
        UDP => 8,
        TCP => usize::from(frame.get(l4 + 12)? >> 4) * 4,
        _ => return None,
    };
    if (proto == TCP && l4_len < 20) || frame.len() < l4 + l4_len {
        return None;
    }
    Some(Layers { ip, v6, l4, proto, after_l4: l4 + l4_len, dscp })
}

#[inline(always)]
fn addrs(frame: &[u8], l: &Layers) -> (IpAddr, IpAddr) {
    if l.v6 {
        let a = |o: usize| -> [u8; 16] {
            let mut x = [0u8; 16];
            x.copy_from_slice(&frame[l.ip + o..l.ip + o + 16]);
            x
        };
        (IpAddr::from(a(8)), IpAddr::from(a(24)))
    } else {
        // Both addresses in one 8-byte load: built byte by byte, the address is stored in
        // pieces and read back whole, which stalls the copy that follows.
        let mut both = [0u8; 8];
        both.copy_from_slice(&frame[l.ip + 12..l.ip + 20]);
        let both = u64::from_be_bytes(both);
        let (src, dst) = ((both >> 32) as u32, both as u32);
        (IpAddr::V4(src.into()), IpAddr::V4(dst.into()))
    }
}

/// Finds INT in `frame` as `signal` marks it. `Ok(None)`: the frame carries no INT.
pub fn find<'a>(frame: &'a [u8], signal: &Signal, mode: Mode) -> Result<Option<Found<'a>>> {
    let Some(l) = layers(frame) else { return Ok(None) };
    let by_port = l.proto == UDP && signal.udp_port.is_some_and(|p| be16(frame, l.l4 + 2) == p);
    if !by_port && !signal.by_dscp(l.dscp) {
        return Ok(None);
    }
    let int = Int::parse(&frame[l.after_l4..], mode)?;
    Ok(Some(Found { layers: l, int, flow: original_flow(frame, &l, &int) }))
}

/// The flow key as the INT source saw it, when this domain signals INT by UDP destination
/// `port` (INT v2.1 §5.7.2, NPT 1): between source and sink such a packet's destination port
/// is `port`, and its own is kept in the shim right after the UDP header. `parsed` takes that
/// port, so the loss monitor, the flow meter and the heavy hitters key the packet as they do
/// outside the INT domain. Packets without such a shim are left as they are.
#[inline]
pub fn key_as_sourced(frame: &[u8], parsed: &mut crate::Parsed, port: u16) {
    if parsed.key.proto != UDP || parsed.key.dport != port {
        return;
    }
    let Some(Ok(shim)) = frame.get(parsed.l4_offset + 8..).map(crate::int::Shim::new_checked)
    else {
        return;
    };
    if shim.version() != Version::V2_1 || matches!(shim.header_type(), HeaderType::Unknown(_)) {
        return;
    }
    if let NextProtocol::UdpPort(p) = shim.next_protocol() {
        parsed.key.dport = p;
    }
}

/// Reads INT after the TCP/UDP header of the packet inside a report, whatever marks it there
/// (the report says INT follows). `Ok(None)`: no TCP/UDP, or no INT shim after it.
pub fn find_reported<'a>(bytes: &'a [u8], start: Start, mode: Mode) -> Result<Option<Found<'a>>> {
    let Some(l) = layers_from(bytes, start) else { return Ok(None) };
    match Int::parse(&bytes[l.after_l4..], mode) {
        Ok(int) => Ok(Some(Found { layers: l, int, flow: original_flow(bytes, &l, &int) })),
        Err(_) if !looks_like_shim(&bytes[l.after_l4..]) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The flow of a packet without INT (a report's inner packet that carries none).
pub fn plain_flow(bytes: &[u8], start: Start) -> Option<FlowKey> {
    let l = layers_from(bytes, start)?;
    let (src, dst) = addrs(bytes, &l);
    let (sport, dport) = (be16(bytes, l.l4), be16(bytes, l.l4 + 2));
    Some(FlowKey { src, dst, sport, dport, proto: l.proto, spi: None, si: None })
}

/// Whether `b` starts like an INT shim of either version (type 1–3, or v1.0 type 1–2).
fn looks_like_shim(b: &[u8]) -> bool {
    matches!(b.first(), Some(1 | 2) | Some(0x10..=0x3f))
}

#[inline(always)]
pub(crate) fn original_flow(frame: &[u8], l: &Layers, int: &Int<'_>) -> FlowKey {
    let (src, dst) = addrs(frame, l);
    let mut flow = FlowKey {
        src,
        dst,
        sport: be16(frame, l.l4),
        dport: be16(frame, l.l4 + 2),
        proto: l.proto,
        spi: None,
        si: None,
    };
    match int.shim.next_protocol {
        NextProtocol::UdpPort(p) => flow.dport = p,
        NextProtocol::IpProtocol(p) => {
            let orig = l.after_l4 + int.len;
            flow.proto = p;
            let ports = frame.get(orig..orig + 4).filter(|_| p == UDP || p == TCP);
            (flow.sport, flow.dport) = ports.map_or((0, 0), |b| (be16(b, 0), be16(b, 2)));
        }
        _ => {}
    }
    flow
}

/// The IP and UDP length fields moved by `delta` bytes (the UDP one only when the edit is
/// inside that UDP datagram): computed before anything changes, so an edit that cannot be
/// made leaves the frame as it was.
#[derive(Debug, Clone, Copy)]
struct Lengths {
    ip: u16,
    udp: Option<u16>,
}

fn lengths(frame: &[u8], l: &Layers, delta: isize, udp_len_too: bool) -> Result<Lengths> {
    let add = |v: u16| -> Result<u16> {
        u16::try_from(v as isize + delta).map_err(|_| Error::BadLength {
            layer: "int",
            field: "length",
            value: v.into(),
        })
    };
    let at = if l.v6 { l.ip + 4 } else { l.ip + 2 };
    let ip = add(be16(frame, at))?;
    let udp = match udp_len_too && l.proto == UDP {
        true => Some(add(be16(frame, l.l4 + 4))?),
        false => None,
    };
    Ok(Lengths { ip, udp })
}

/// Writes `n` and recomputes the checksums (after the bytes moved).
fn set_lengths(frame: &mut [u8], l: &Layers, n: Lengths) {
    let at = if l.v6 { l.ip + 4 } else { l.ip + 2 };
    frame[at..at + 2].copy_from_slice(&n.ip.to_be_bytes());
    if let Some(u) = n.udp {
        frame[l.l4 + 4..l.l4 + 6].copy_from_slice(&u.to_be_bytes());
    }
    fix_checksums(frame, l);
}

/// Recomputes the IPv4 header checksum and the checksum of the TCP/UDP segment at `l.l4`.
fn fix_checksums(frame: &mut [u8], l: &Layers) {
    let (seg_len, pseudo) = if l.v6 {
        let len = usize::from(be16(frame, l.ip + 4)).saturating_sub(l.l4 - l.ip - 40);
        let mut acc = u32::from(checksum::sum(&frame[l.ip + 8..l.ip + 40]));
        acc += len as u32 + u32::from(l.proto);
        (len, acc)
    } else {
        let ihl = l.l4 - l.ip;
        frame[l.ip + 10..l.ip + 12].fill(0);
        let c = checksum::checksum(&frame[l.ip..l.ip + ihl]);
        frame[l.ip + 10..l.ip + 12].copy_from_slice(&c.to_be_bytes());
        let len = usize::from(be16(frame, l.ip + 2)).saturating_sub(ihl);
        let mut acc = u32::from(checksum::sum(&frame[l.ip + 12..l.ip + 20]));
        acc += len as u32 + u32::from(l.proto);
        (len, acc)
    };
    let csum_at = l.l4
        + match l.proto {
            UDP => 6,
            TCP => 16,
            // Another protocol (NPT 2 restores whatever the source saw): its bytes are its own.
            _ => return,
        };
    if csum_at + 2 > frame.len() {
        return;
    }
    if l.proto == UDP && !l.v6 && be16(frame, csum_at) == 0 {
        return;
    }
    let end = (l.l4 + seg_len).min(frame.len());
    frame[csum_at..csum_at + 2].fill(0);
    let c = !checksum::fold(pseudo + u32::from(checksum::sum(&frame[l.l4..end])));
    let c = if c == 0 && l.proto == UDP { 0xffff } else { c };
    frame[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
}

fn set_dscp(frame: &mut [u8], l: &Layers, dscp: u8) {
    if l.v6 {
        let w = be16(frame, l.ip);
        let w = (w & !(0x3f << 6)) | (u16::from(dscp & 0x3f) << 6);
        frame[l.ip..l.ip + 2].copy_from_slice(&w.to_be_bytes());
    } else {
        frame[l.ip + 1] = (dscp << 2) | (frame[l.ip + 1] & 0x03);
    }
}

/// What a source inserts.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// How INT is signalled: by DSCP, or (for UDP packets) by destination port when set.
    pub signal: Signal,
    /// The metadata to collect.
    pub instructions: Instructions,
    /// Hops that may add metadata, the source included (RemainingHopCnt before the source).
    pub max_hops: u8,
    /// Domain-specific ID.
    pub domain_id: u16,
}

/// What an edit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit {
    /// INT was added (source) or metadata pushed (transit).
    Added,
    /// Nothing to do: not TCP/UDP, or already carrying INT (source).
    Skipped,
    /// The frame would exceed the MTU: nothing added (source) or M set (transit).
    MtuExceeded,
    /// RemainingHopCnt was 0: E set, nothing added.
    HopCountExceeded,
}

/// Source: inserts INT with this switch's metadata `own`.
pub fn insert(frame: &mut Vec<u8>, src: &Source, own: &Hop, mtu: usize) -> Result<Edit> {
    let Some(l) = layers(frame) else { return Ok(Edit::Skipped) };
    if find(frame, &src.signal, Mode::Tolerant).ok().flatten().is_some() {
        return Ok(Edit::Skipped);
    }
    let layout = Layout::new(src.instructions, Version::V2_1);
    let add = SHIM_LEN + MD_HEADER_LEN + layout.hop_len();
    if frame.len() - l.ip + add > mtu {
        return Ok(Edit::MtuExceeded);
    }
    let by_port = src.signal.udp_port.filter(|_| l.proto == UDP);
    let (next_protocol, dscp_to) = match (by_port, src.signal.dscp) {
        (Some(_), _) => (NextProtocol::UdpPort(be16(frame, l.l4 + 2)), None),
        (None, Some(d)) => (NextProtocol::Dscp(l.dscp), Some(d)),
        (None, None) => return Ok(Edit::Skipped),
    };
    let mut bytes = [0u8; SHIM_LEN + MD_HEADER_LEN + 128];
    let shim = ShimRepr {
        version: Version::V2_1,
        header_type: HeaderType::Md,
        next_protocol,
        length_words: ((MD_HEADER_LEN + layout.hop_len()) / 4) as u8,
    };
    shim.emit(&mut bytes)?;
    let header = MdHeader {
        version: 2,
        discard: false,
        hop_count_exceeded: src.max_hops == 0,
        mtu_exceeded: false,
        hop_ml: (layout.hop_len() / 4) as u8,
        remaining_hop_cnt: src.max_hops.saturating_sub(1),
        instructions: src.instructions,
        domain_id: src.domain_id,
        ds_instructions: 0,
        ds_flags: 0,
    };
    header.emit(Version::V2_1, HeaderType::Md, &mut bytes[SHIM_LEN..])?;
    let mut len = SHIM_LEN + MD_HEADER_LEN;
    if src.max_hops > 0 {
        layout.write(own, &mut bytes[len..])?;
        len += layout.hop_len();
    }
    let shim = ShimRepr { length_words: ((len - SHIM_LEN) / 4) as u8, ..shim };
    shim.emit(&mut bytes)?;
    let n = lengths(frame, &l, len as isize, true)?;
    frame.splice(l.after_l4..l.after_l4, bytes[..len].iter().copied());
    if let (Some(port), NextProtocol::UdpPort(_)) = (by_port, next_protocol) {
        frame[l.l4 + 2..l.l4 + 4].copy_from_slice(&port.to_be_bytes());
    }
    if let Some(d) = dscp_to {
        set_dscp(frame, &l, src.signal.with_color_on_wire(d, l.dscp));
    }
    set_lengths(frame, &l, n);
    Ok(Edit::Added)
}

/// Transit: pushes this switch's metadata `own` onto the stack of the frame's INT.
pub fn push(frame: &mut Vec<u8>, signal: &Signal, own: &Hop, mtu: usize) -> Result<Edit> {
    let Some(found) = find(frame, signal, Mode::Strict)? else { return Ok(Edit::Skipped) };
    let (l, int) = (found.layers, found.int);
    // Telemark's transits push onto v2.1 INT-MD stacks; v1.0 and INT-MX pass untouched.
    let md = int.shim.header_type == HeaderType::Md && int.shim.version == Version::V2_1;
    let Some(h) = int.header.filter(|_| md) else {
        return Ok(Edit::Skipped);
    };
    let header_at = l.after_l4 + SHIM_LEN;
    let hop_len = usize::from(h.hop_ml) * 4;
    // The shim's Length is one byte: a stack it cannot count is as full as an MTU.
    let shim_len = frame[l.after_l4 + 1].checked_add(h.hop_ml);
    let mtu_short = frame.len() - l.ip + hop_len > mtu || shim_len.is_none();
    if h.remaining_hop_cnt == 0 || mtu_short {
        let mut h = h;
        h.hop_count_exceeded |= h.remaining_hop_cnt == 0;
        h.mtu_exceeded |= mtu_short;
        h.emit(Version::V2_1, HeaderType::Md, &mut frame[header_at..])?;
        fix_checksums(frame, &l);
        return Ok(if mtu_short { Edit::MtuExceeded } else { Edit::HopCountExceeded });
    }
    let layout = int.layout();
    let mut bytes = [0u8; 128];
    layout.write(own, &mut bytes)?;
    let stack_at = header_at + MD_HEADER_LEN;
    // INT sits inside the UDP datagram at `l.l4` whatever the NPT (NPT 2's added header).
    let n = lengths(frame, &l, hop_len as isize, true)?;
    frame.splice(stack_at..stack_at, bytes[..hop_len].iter().copied());
    let h = MdHeader { remaining_hop_cnt: h.remaining_hop_cnt - 1, ..h };
    h.emit(Version::V2_1, HeaderType::Md, &mut frame[header_at..])?;
    frame[l.after_l4 + 1] = shim_len.unwrap_or(u8::MAX);
    set_lengths(frame, &l, n);
    Ok(Edit::Added)
}

/// Most hops [`strip`] returns.
pub const MAX_HOPS: usize = 8;

/// What a sink took out of a packet.
#[derive(Debug, Clone, Copy)]
pub struct Stripped {
    /// The flow as the source saw it.
    pub flow: FlowKey,
    /// The hops, newest first (at most [`MAX_HOPS`]).
    pub hops: [Hop; MAX_HOPS],
    /// How many of `hops` are filled.
    pub hop_count: usize,
    /// Hops the stack held beyond [`MAX_HOPS`].
    pub hops_dropped: usize,
    /// The INT-MD header.
    pub header: MdHeader,
}

impl Stripped {
    /// The hops read.
    pub fn hops(&self) -> &[Hop] {
        &self.hops[..self.hop_count]
    }
}

/// Sink: reads and removes INT, restoring the packet the source received.
pub fn strip(frame: &mut Vec<u8>, signal: &Signal, mode: Mode) -> Result<Option<Stripped>> {
    let Some(found) = find(frame, signal, mode)? else { return Ok(None) };
    let (l, int) = (found.layers, found.int);
    let Some(header) = int.header else {
        return Err(Error::Malformed { layer: "int shim", field: "type" });
    };
    let mut out = Stripped {
        flow: found.flow,
        hops: [Hop::default(); MAX_HOPS],
        hop_count: 0,
        hops_dropped: int.hop_count().saturating_sub(MAX_HOPS),
        header,
    };
    out.hop_count = int.read_hops(&mut out.hops);
    let int_len = int.len;
    let next = int.shim.next_protocol;
    match next {
        NextProtocol::IpProtocol(p) => {
            // NPT 2: the source added a UDP header before INT; the original L4 header follows.
            let removed = l.after_l4 + int_len - l.l4;
            let orig = Layers { proto: p, ..l };
            let n = lengths(frame, &orig, -(removed as isize), false)?;
            frame.drain(l.l4..l.after_l4 + int_len);
            if l.v6 {
                frame[l.ip + 6] = p;
            } else {
                frame[l.ip + 9] = p;
            }
            set_lengths(frame, &orig, n);
        }
        _ => {
            let n = lengths(frame, &l, -(int_len as isize), true)?;
            frame.drain(l.after_l4..l.after_l4 + int_len);
            match next {
                NextProtocol::UdpPort(p) => {
                    frame[l.l4 + 2..l.l4 + 4].copy_from_slice(&p.to_be_bytes())
                }
                NextProtocol::Dscp(d) if signal.by_dscp(l.dscp) => {
                    set_dscp(frame, &l, signal.with_color_on_wire(d, l.dscp))
                }
                _ => {}
            }
            set_lengths(frame, &l, n);
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet / IPv4 (DSCP 0x17) / UDP headers with lengths that claim `rest` follows.
    fn frame_with(rest: &[u8], proto: u8) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let l4_len = if proto == TCP { 20 } else { 8 };
        let total = (20 + l4_len + rest.len()) as u16;
        f.extend_from_slice(&[0x45, 0x17 << 2]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        let mut l4 = vec![0u8; l4_len];
        l4[..4].copy_from_slice(&[0x13, 0x88, 0x13, 0x88]);
        if proto == TCP {
            l4[12] = 0x50;
        } else {
            l4[4..6].copy_from_slice(&((8 + rest.len()) as u16).to_be_bytes());
        }
        f.extend_from_slice(&l4);
        f.extend_from_slice(rest);
        f
    }

    /// A v2.1 INT-MD packet over UDP by DSCP with `hops` hops of `hop_ml` words and a
    /// shim Length of `len_words`.
    fn int_packet(hop_ml: u8, hops: usize, rhc: u8) -> Vec<u8> {
        let stack = usize::from(hop_ml) * 4 * hops;
        let mut int = vec![0u8; SHIM_LEN + MD_HEADER_LEN + stack];
        int[0] = 0x10;
        int[1] = ((MD_HEADER_LEN + stack) / 4) as u8;
        int[3] = 0x2e << 2;
        int[4] = 0x20;
        int[6] = hop_ml;
        int[7] = rhc;
        int[8] = 0xff; // instructions 0xff00: 44 bytes = 11 words
        frame_with(&int, UDP)
    }

    #[test]
    fn a_full_shim_length_is_an_mtu_not_an_overflow() {
        // 11-word hops, 22 of them: Length 3 + 242 = 245; one more would be 256.
        let mut f = int_packet(11, 22, 5);
        let before = f.clone();
        let sig = Signal::default();
        assert_eq!(push(&mut f, &sig, &Hop::default(), 65_535).unwrap(), Edit::MtuExceeded);
        assert_eq!(f.len(), before.len(), "nothing added");
        let found = find(&f, &sig, Mode::Strict).unwrap().unwrap();
        assert!(found.int.header.unwrap().mtu_exceeded);
        // With room, a hop goes on and Length grows by Hop ML.
        let mut g = int_packet(11, 1, 5);
        assert_eq!(push(&mut g, &sig, &Hop::default(), 9000).unwrap(), Edit::Added);
        let found = find(&g, &sig, Mode::Strict).unwrap().unwrap();
        assert_eq!(found.int.hop_count(), 2);
        assert_eq!(found.int.header.unwrap().remaining_hop_cnt, 4);
    }

    #[test]
    fn a_bad_length_leaves_the_frame_as_it_was() {
        let mut f = int_packet(11, 1, 5);
        // An IP total length too small to hold the INT it carries.
        f[16..18].copy_from_slice(&20u16.to_be_bytes());
        let before = f.clone();
        assert!(strip(&mut f, &Signal::default(), Mode::Strict).is_err());
        assert_eq!(f, before);
    }

    #[test]
    fn v1_stacks_are_not_pushed_onto() {
        let mut int = vec![0u8; 4 + 8 + 4];
        int[0] = 1; // v1.0 shim type
        int[2] = 3; // Length counts the shim: 4 words
        int[4] = 0x10; // v1.0 header
        int[6] = 1; // Hop ML 1
        int[7] = 5;
        int[8] = 0x80; // node ID
        let mut f = frame_with(&int, UDP);
        let before = f.clone();
        assert_eq!(push(&mut f, &Signal::default(), &Hop::default(), 9000).unwrap(), Edit::Skipped);
        assert_eq!(f, before);
    }

    /// Ethernet / IPv4 (DSCP `dscp`, a valid header checksum) / UDP to port 5000, payload
    /// `payload`, as a sender would send it.
    fn plain(dscp: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = frame_with(payload, UDP);
        let l = layers(&f).unwrap();
        set_dscp(&mut f, &l, dscp);
        let sum = checksum::checksum(&f[14..34]);
        f[24..26].copy_from_slice(&sum.to_be_bytes());
        f
    }

    fn source(signal: Signal) -> Source {
        let instructions = Instructions::of(&[crate::int::Field::NodeId]);
        Source { signal, instructions, max_hops: 4, domain_id: 0 }
    }

    /// Alternate marking's color in DSCP bit 0 and INT by DSCP 0x17 on one flow: packets of
    /// both colors are INT between source and sink, carry their color through, and leave the
    /// sink with the DSCP they came with; a plain packet of either color is not INT.
    #[test]
    fn int_by_dscp_leaves_the_color_bit_to_alternate_marking() {
        let signal = Signal { color_bit: Some(0), ..Signal::default() };
        for color in 0..2u8 {
            let dscp = 0x2e | color; // EF, colored
            assert!(!signal.by_dscp(dscp));
            let sent = plain(dscp, b"payload");
            let mut f = sent.clone();
            assert_eq!(
                insert(&mut f, &source(signal), &Hop::default(), 1500).unwrap(),
                Edit::Added
            );
            assert_eq!(layers(&f).unwrap().dscp, 0x16 | color, "INT's five bits, then the color");
            let found = find(&f, &signal, Mode::Strict).unwrap().expect("INT found");
            assert_eq!(found.int.shim.next_protocol, NextProtocol::Dscp(dscp), "kept whole");
            // Without the color bit set aside, a domain would miss INT on one color.
            let exact = Signal::default();
            assert_eq!(find(&f, &exact, Mode::Strict).unwrap().is_some(), color == 1);
            assert!(strip(&mut f, &signal, Mode::Strict).unwrap().is_some());
            assert_eq!(f, sent, "the packet as the source received it");
        }
        // A marker inside the domain recolored the packet after the source: the sink keeps
        // the new color and gives back the rest.
        let mut f = plain(0x2e, b"payload");
        insert(&mut f, &source(signal), &Hop::default(), 1500).unwrap();
        let l = layers(&f).unwrap();
        set_dscp(&mut f, &l, 0x17);
        strip(&mut f, &signal, Mode::Strict).unwrap().unwrap();
        assert_eq!(layers(&f).unwrap().dscp, 0x2f);
        // With the color in bit 0, a signal whose other bits are 0 is refused by the agent's
        // config; on the wire, 0x17 and 0x16 both signal and 0x15 does not.
        assert!(signal.by_dscp(0x16) && signal.by_dscp(0x17) && !signal.by_dscp(0x15));
    }

    /// INT by UDP port 5000 (NPT 1): between source and sink the packet's destination port is
    /// 5000; its key as the source saw it has the port the shim kept.
    #[test]
    fn a_port_signalled_packet_is_keyed_by_its_own_port() {
        let signal = Signal { dscp: None, udp_port: Some(5000), color_bit: None };
        let mut sent = plain(0x2e, b"payload");
        sent[36..38].copy_from_slice(&7000u16.to_be_bytes());
        let key = |f: &[u8]| {
            let mut p = crate::flow::extract(f, crate::flow::LinkType::Ethernet).unwrap();
            key_as_sourced(f, &mut p, 5000);
            p.key
        };
        let mut f = sent.clone();
        insert(&mut f, &source(signal), &Hop::default(), 1500).unwrap();
        let on_wire = crate::flow::extract(&f, crate::flow::LinkType::Ethernet).unwrap().key;
        assert_eq!(on_wire.dport, 5000);
        assert_eq!(key(&f), key(&sent));
        assert_eq!(key(&f).dport, 7000);
        // A packet to port 5000 without a shim keeps its key.
        let mut other = plain(0, &[0xff; 12]);
        other[36..38].copy_from_slice(&5000u16.to_be_bytes());
        assert_eq!(key(&other).dport, 5000);
    }

    proptest::proptest! {
        #[test]
        fn edits_never_panic(rest: Vec<u8>, tcp: bool, port: bool) {
            let signal =
                Signal { dscp: Some(0x17), udp_port: port.then_some(5000), color_bit: None };
            let frame = frame_with(&rest, if tcp { TCP } else { UDP });
            let mut f = frame.clone();
            let _ = push(&mut f, &signal, &Hop::default(), 9000);
            let mut f = frame.clone();
            let _ = strip(&mut f, &signal, Mode::Tolerant);
            let mut f = frame;
            let _ = strip(&mut f, &signal, Mode::Strict);
        }
    }
}
