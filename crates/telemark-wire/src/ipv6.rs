//! IPv6 (RFC 8200): fixed header, extension-header skipping, traffic class (DSCP/ECN).

use crate::ipv4::Protocol;
use crate::{Error, Result};
use core::net::Ipv6Addr;

mod field {
    use core::ops::Range;
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: Range<usize> = 8..24;
    pub const DST: Range<usize> = 24..40;
}

/// Length of the fixed header.
pub const HEADER_LEN: usize = 40;

/// How many extension headers [`Packet::upper_layer`] walks before giving up.
pub const MAX_EXT_HEADERS: usize = 8;

/// A read/write view of an IPv6 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
    present: usize,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer holding the fixed header and the whole payload.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_lenient(buffer)?;
        let want = HEADER_LEN + usize::from(p.payload_len());
        if p.present < want {
            return Err(Error::BadLength { layer: "ipv6", field: "payload length", value: want });
        }
        Ok(p)
    }

    /// Accepts a payload cut short by a capture's snaplen.
    pub fn new_lenient(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        Error::check_len("ipv6", HEADER_LEN, b.len())?;
        if b.first().map(|v| v >> 4) != Some(6) {
            return Err(Error::Malformed { layer: "ipv6", field: "version" });
        }
        let plen =
            b.get(field::LENGTH).map_or(0, |l| usize::from(u16::from_be_bytes([l[0], l[1]])));
        let present = (HEADER_LEN + plen).min(b.len());
        Ok(Packet { buffer, present })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    fn word0(&self) -> u32 {
        let s = &self.b()[field::VER_TC_FLOW];
        u32::from_be_bytes([s[0], s[1], s[2], s[3]])
    }
    /// Traffic class byte (DSCP << 2 | ECN).
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }
    /// DSCP (6 bits).
    pub fn dscp(&self) -> u8 {
        self.traffic_class() >> 2
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000f_ffff
    }
    /// Payload length field (extension headers included).
    pub fn payload_len(&self) -> u16 {
        let s = &self.b()[field::LENGTH];
        u16::from_be_bytes([s[0], s[1]])
    }
    /// Next header after the fixed header.
    pub fn next_header(&self) -> Protocol {
        Protocol::from(self.b()[field::NXT_HDR])
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.b()[field::HOP_LIMIT]
    }
    /// Source address.
    pub fn src(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[field::SRC]);
        Ipv6Addr::from(a)
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[field::DST]);
        Ipv6Addr::from(a)
    }
    /// Payload present in the buffer, extension headers included.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..self.present]
    }
    /// Whether the payload is cut short by the capture.
    pub fn is_truncated(&self) -> bool {
        self.present < HEADER_LEN + usize::from(self.payload_len())
    }

    /// Skips extension headers (hop-by-hop, routing, destination options, fragment, AH) and
    /// returns the upper-layer protocol and its offset within [`payload`](Self::payload).
    ///
    /// A non-first fragment has no upper-layer header: it is reported as `Ipv6Frag`.
    pub fn upper_layer(&self) -> Result<(Protocol, usize)> {
        self.upper_layer_and_fragment().map(|(proto, off, _)| (proto, off))
    }

    /// [`upper_layer`](Self::upper_layer), and the fragment header's identification when the
    /// packet is a fragment (RFC 8200 §4.5).
    pub fn upper_layer_and_fragment(&self) -> Result<(Protocol, usize, Option<u32>)> {
        let p = self.payload();
        let mut fragment = None;
        let mut nh = self.next_header();
        let mut off = 0usize;
        for _ in 0..MAX_EXT_HEADERS {
            let len = match nh {
                Protocol::HopByHop | Protocol::Ipv6Route | Protocol::Ipv6Opts => {
                    let l = p.get(off + 1).ok_or(Error::Truncated {
                        layer: "ipv6 extension",
                        need: off + 2,
                        have: p.len(),
                    })?;
                    (usize::from(*l) + 1) * 8
                }
                Protocol::Ipv6Frag => {
                    let fo = p.get(off + 2..off + 4).ok_or(Error::Truncated {
                        layer: "ipv6 fragment",
                        need: off + 8,
                        have: p.len(),
                    })?;
                    let id = p.get(off + 4..off + 8).ok_or(Error::Truncated {
                        layer: "ipv6 fragment",
                        need: off + 8,
                        have: p.len(),
                    })?;
                    fragment = Some(u32::from_be_bytes([id[0], id[1], id[2], id[3]]));
                    if u16::from_be_bytes([fo[0], fo[1]]) & 0xfff8 != 0 {
                        return Ok((Protocol::Ipv6Frag, off, fragment));
                    }
                    8
                }
                Protocol::Ah => {
                    let l = p.get(off + 1).ok_or(Error::Truncated {
                        layer: "ipv6 ah",
                        need: off + 2,
                        have: p.len(),
                    })?;
                    (usize::from(*l) + 2) * 4
                }
                other => return Ok((other, off, fragment)),
            };
            let next = *p.get(off).ok_or(Error::Truncated {
                layer: "ipv6 extension",
                need: off + 1,
                have: p.len(),
            })?;
            if off + len > p.len() {
                return Err(Error::Truncated {
                    layer: "ipv6 extension",
                    need: off + len,
                    have: p.len(),
                });
            }
            nh = Protocol::from(next);
            off += len;
        }
        Err(Error::Malformed { layer: "ipv6", field: "extension header chain" })
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_word0(&mut self, v: u32) {
        self.buffer.as_mut()[field::VER_TC_FLOW].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the traffic class byte. IPv6 has no header checksum and TCP/UDP pseudo-headers do
    /// not cover the traffic class, so nothing else changes.
    pub fn set_traffic_class(&mut self, tc: u8) {
        let w = (self.word0() & 0xf00f_ffff) | (u32::from(tc) << 20);
        self.set_word0(w);
    }
    /// Sets the DSCP, keeping ECN.
    pub fn set_dscp(&mut self, dscp: u8) {
        let tc = (dscp << 2) | (self.traffic_class() & 3);
        self.set_traffic_class(tc);
    }
    /// Sets version 6, traffic class and flow label.
    pub fn set_first_word(&mut self, tc: u8, flow_label: u32) {
        self.set_word0((6 << 28) | (u32::from(tc) << 20) | (flow_label & 0x000f_ffff));
    }
    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the next header.
    pub fn set_next_header(&mut self, v: Protocol) {
        self.buffer.as_mut()[field::NXT_HDR] = v.into();
    }
    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v;
    }
    /// Decrements the hop limit (no checksum in IPv6); returns the new value.
    pub fn dec_hop_limit(&mut self) -> u8 {
        let h = self.hop_limit().saturating_sub(1);
        self.set_hop_limit(h);
        h
    }
    /// Sets the source.
    pub fn set_src(&mut self, v: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&v.octets());
    }
    /// Sets the destination.
    pub fn set_dst(&mut self, v: Ipv6Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&v.octets());
    }
}

/// Owned IPv6 fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source.
    pub src: Ipv6Addr,
    /// Destination.
    pub dst: Ipv6Addr,
    /// Next header.
    pub next_header: Protocol,
    /// Traffic class byte.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length.
    pub payload_len: usize,
}

impl Repr {
    /// Reads a checked packet's fixed header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        Ok(Repr {
            src: p.src(),
            dst: p.dst(),
            next_header: p.next_header(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            hop_limit: p.hop_limit(),
            payload_len: usize::from(p.payload_len()),
        })
    }
    /// Bytes of the fixed header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the fixed header into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        Error::check_len("ipv6", HEADER_LEN, buf.len())?;
        if self.payload_len > usize::from(u16::MAX) {
            return Err(Error::BadLength {
                layer: "ipv6",
                field: "payload length",
                value: self.payload_len,
            });
        }
        let Some(hdr) = buf.get_mut(..HEADER_LEN) else {
            return Err(Error::Truncated { layer: "ipv6", need: HEADER_LEN, have: 0 });
        };
        let w = (6u32 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0xfffff);
        hdr[field::VER_TC_FLOW].copy_from_slice(&w.to_be_bytes());
        hdr[field::LENGTH].copy_from_slice(&(self.payload_len as u16).to_be_bytes());
        hdr[field::NXT_HDR] = self.next_header.into();
        hdr[field::HOP_LIMIT] = self.hop_limit;
        hdr[field::SRC].copy_from_slice(&self.src.octets());
        hdr[field::DST].copy_from_slice(&self.dst.octets());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn literal() -> Vec<u8> {
        // TC 0xb8 (DSCP 46), flow label 0x12345, payload 8 = hop-by-hop (8 B) then UDP.
        let mut b = vec![0x6b, 0x81, 0x23, 0x45, 0x00, 0x10, 0x00, 0x40];
        b.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        b.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        b.extend_from_slice(&[17, 0, 1, 4, 0, 0, 0, 0]); // hop-by-hop: next UDP, len 0, PadN
        b.extend_from_slice(&[0x12, 0x34, 0x00, 0x35, 0x00, 0x08, 0x00, 0x00]);
        b
    }

    #[test]
    fn deconstruct() {
        let b = literal();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.traffic_class(), 0xb8);
        assert_eq!(p.dscp(), 46);
        assert_eq!(p.flow_label(), 0x12345);
        assert_eq!(p.next_header(), Protocol::HopByHop);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.upper_layer().unwrap(), (Protocol::Udp, 8));
        assert_eq!(p.src().segments()[7], 1);
    }

    #[test]
    fn set_dscp_keeps_rest() {
        let mut b = literal();
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_dscp(1);
        assert_eq!(p.traffic_class(), 0x04);
        assert_eq!(p.flow_label(), 0x12345);
        assert_eq!(b[0] >> 4, 6);
    }

    #[test]
    fn bad_chains() {
        let mut b = literal();
        b[41] = 200; // hop-by-hop claims 1608 bytes
        assert!(Packet::new_checked(&b[..]).unwrap().upper_layer().is_err());
        let mut loops = literal();
        loops[40] = 0; // hop-by-hop after hop-by-hop, runs off the end
        assert!(Packet::new_checked(&loops[..]).unwrap().upper_layer().is_err());
        assert!(Packet::new_checked(&literal()[..50]).is_err());
        assert!(Packet::new_lenient(&literal()[..50]).unwrap().is_truncated());
    }

    #[test]
    fn later_fragment_has_no_ports() {
        let mut b = literal();
        b[6] = 44;
        b[40..48].copy_from_slice(&[17, 0, 0x00, 0x08, 0, 0, 0, 1]); // offset 1 (8 bytes)
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap().upper_layer().unwrap().0,
            Protocol::Ipv6Frag
        );
    }

    proptest::proptest! {
        #[test]
        fn roundtrip(src: [u8; 16], dst: [u8; 16], nh: u8, tc: u8, fl in 0u32..0x100000,
                     hl: u8, plen in 0usize..600) {
            let repr = Repr { src: src.into(), dst: dst.into(), next_header: nh.into(),
                traffic_class: tc, flow_label: fl, hop_limit: hl, payload_len: plen };
            let mut buf = vec![0u8; HEADER_LEN + plen];
            repr.emit(&mut buf).unwrap();
            proptest::prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(), repr);
        }

        #[test]
        fn never_panics(data: Vec<u8>) {
            if let Ok(p) = Packet::new_lenient(&data[..]) {
                let _ = (p.upper_layer(), p.payload(), p.src());
            }
        }
    }
}
