//! IPv4 (RFC 791), options included; DSCP/ECN (RFC 2474, RFC 3168).

use crate::checksum;
use crate::{Error, Result};
use core::net::Ipv4Addr;

mod field {
    use core::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

/// Length of a header without options.
pub const MIN_HEADER_LEN: usize = 20;

/// IP protocol numbers (shared by IPv4 and IPv6 next-header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// 0: IPv6 hop-by-hop options.
    HopByHop,
    /// 1.
    Icmp,
    /// 4: IPv4 in IP.
    IpIp,
    /// 6.
    Tcp,
    /// 17.
    Udp,
    /// 41: IPv6 in IP.
    Ipv6,
    /// 43: IPv6 routing header.
    Ipv6Route,
    /// 44: IPv6 fragment header.
    Ipv6Frag,
    /// 47: GRE.
    Gre,
    /// 50: ESP.
    Esp,
    /// 51: AH.
    Ah,
    /// 58.
    Icmpv6,
    /// 59: no next header.
    Ipv6NoNxt,
    /// 60: IPv6 destination options.
    Ipv6Opts,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for Protocol {
    fn from(v: u8) -> Self {
        match v {
            0 => Protocol::HopByHop,
            1 => Protocol::Icmp,
            4 => Protocol::IpIp,
            6 => Protocol::Tcp,
            17 => Protocol::Udp,
            41 => Protocol::Ipv6,
            43 => Protocol::Ipv6Route,
            44 => Protocol::Ipv6Frag,
            47 => Protocol::Gre,
            50 => Protocol::Esp,
            51 => Protocol::Ah,
            58 => Protocol::Icmpv6,
            59 => Protocol::Ipv6NoNxt,
            60 => Protocol::Ipv6Opts,
            other => Protocol::Unknown(other),
        }
    }
}

impl From<Protocol> for u8 {
    fn from(v: Protocol) -> u8 {
        match v {
            Protocol::HopByHop => 0,
            Protocol::Icmp => 1,
            Protocol::IpIp => 4,
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Ipv6 => 41,
            Protocol::Ipv6Route => 43,
            Protocol::Ipv6Frag => 44,
            Protocol::Gre => 47,
            Protocol::Esp => 50,
            Protocol::Ah => 51,
            Protocol::Icmpv6 => 58,
            Protocol::Ipv6NoNxt => 59,
            Protocol::Ipv6Opts => 60,
            Protocol::Unknown(v) => v,
        }
    }
}

/// A read/write view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
    /// Bytes of the packet present in the buffer: `total_len`, or less when cut by snaplen.
    present: usize,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer holding a whole packet: header with options and `total_len` bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_lenient(buffer)?;
        if p.present < usize::from(p.total_len()) {
            return Err(Error::BadLength {
                layer: "ipv4",
                field: "total length",
                value: usize::from(p.total_len()),
            });
        }
        Ok(p)
    }

    /// Like [`new_checked`](Self::new_checked), but accepts a payload cut short by a capture's
    /// snaplen: the header (with options) must be whole, `total_len` may exceed the buffer.
    pub fn new_lenient(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        Error::check_len("ipv4", MIN_HEADER_LEN, b.len())?;
        let (vihl, total) = match (b.get(field::VER_IHL), b.get(field::LENGTH)) {
            (Some(v), Some(l)) => (*v, usize::from(u16::from_be_bytes([l[0], l[1]]))),
            _ => return Err(Error::Truncated { layer: "ipv4", need: MIN_HEADER_LEN, have: 0 }),
        };
        if vihl >> 4 != 4 {
            return Err(Error::Malformed { layer: "ipv4", field: "version" });
        }
        let hl = usize::from(vihl & 0x0f) * 4;
        if hl < MIN_HEADER_LEN {
            return Err(Error::BadLength { layer: "ipv4", field: "header length", value: hl });
        }
        Error::check_len("ipv4", hl, b.len())?;
        if total < hl {
            return Err(Error::BadLength { layer: "ipv4", field: "total length", value: total });
        }
        let present = total.min(b.len());
        Ok(Packet { buffer, present })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let s = &self.b()[r];
        u16::from_be_bytes([s[0], s[1]])
    }

    /// Header length in bytes, options included.
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[field::VER_IHL] & 0x0f) * 4
    }
    /// Differentiated services code point (6 bits).
    pub fn dscp(&self) -> u8 {
        self.b()[field::TOS] >> 2
    }
    /// ECN bits.
    pub fn ecn(&self) -> u8 {
        self.b()[field::TOS] & 3
    }
    /// Total length field.
    pub fn total_len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }
    /// Identification.
    pub fn ident(&self) -> u16 {
        self.u16_at(field::IDENT)
    }
    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        self.u16_at(field::FLG_OFF) & 0x4000 != 0
    }
    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        self.u16_at(field::FLG_OFF) & 0x2000 != 0
    }
    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (self.u16_at(field::FLG_OFF) & 0x1fff) * 8
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.b()[field::TTL]
    }
    /// Payload protocol.
    pub fn protocol(&self) -> Protocol {
        Protocol::from(self.b()[field::PROTOCOL])
    }
    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }
    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        let s = &self.b()[field::SRC];
        Ipv4Addr::new(s[0], s[1], s[2], s[3])
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        let s = &self.b()[field::DST];
        Ipv4Addr::new(s[0], s[1], s[2], s[3])
    }
    /// Option bytes.
    pub fn options(&self) -> &[u8] {
        &self.b()[MIN_HEADER_LEN..self.header_len()]
    }
    /// Whether the header checksum verifies (always true under `cfg(fuzzing)`).
    pub fn verify_checksum(&self) -> bool {
        cfg!(fuzzing) || checksum::sum(&self.b()[..self.header_len()]) == 0xffff
    }
    /// Whether the payload is cut short by the capture.
    pub fn is_truncated(&self) -> bool {
        self.present < usize::from(self.total_len())
    }
    /// The payload present in the buffer (up to `total_len`).
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..self.present]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_u16(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the version and header length (in bytes, a multiple of 4).
    pub fn set_ver_hl(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }
    /// Sets the whole TOS byte without touching the checksum.
    pub fn set_tos(&mut self, dscp: u8, ecn: u8) {
        self.buffer.as_mut()[field::TOS] = (dscp << 2) | (ecn & 3);
    }
    /// Sets the DSCP and updates the header checksum incrementally (RFC 1624).
    pub fn set_dscp_update_checksum(&mut self, dscp: u8) {
        let old = self.u16_at(0..2);
        self.buffer.as_mut()[field::TOS] = (dscp << 2) | self.ecn();
        let new = self.u16_at(0..2);
        let c = checksum::update(self.checksum(), old, new);
        self.set_u16(field::CHECKSUM, c);
    }
    /// Decrements the TTL and updates the checksum incrementally; returns the new TTL.
    pub fn dec_ttl_update_checksum(&mut self) -> u8 {
        let old = self.u16_at(8..10);
        let ttl = self.ttl().saturating_sub(1);
        self.buffer.as_mut()[field::TTL] = ttl;
        let new = self.u16_at(8..10);
        let c = checksum::update(self.checksum(), old, new);
        self.set_u16(field::CHECKSUM, c);
        ttl
    }
    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        self.set_u16(field::LENGTH, v);
    }
    /// Sets identification.
    pub fn set_ident(&mut self, v: u16) {
        self.set_u16(field::IDENT, v);
    }
    /// Sets flags (DF, MF) and fragment offset in bytes.
    pub fn set_frag(&mut self, df: bool, mf: bool, offset: u16) {
        let v = (u16::from(df) << 14) | (u16::from(mf) << 13) | ((offset / 8) & 0x1fff);
        self.set_u16(field::FLG_OFF, v);
    }
    /// Sets the TTL without touching the checksum.
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }
    /// Sets the protocol.
    pub fn set_protocol(&mut self, v: Protocol) {
        self.buffer.as_mut()[field::PROTOCOL] = v.into();
    }
    /// Sets the source address.
    pub fn set_src(&mut self, v: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&v.octets());
    }
    /// Sets the destination address.
    pub fn set_dst(&mut self, v: Ipv4Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&v.octets());
    }
    /// Recomputes the header checksum from scratch.
    pub fn fill_checksum(&mut self) {
        self.set_u16(field::CHECKSUM, 0);
        let hl = self.header_len();
        let c = checksum::checksum(&self.b()[..hl]);
        self.set_u16(field::CHECKSUM, c);
    }
    /// Mutable option bytes.
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[MIN_HEADER_LEN..hl]
    }
    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (hl, end) = (self.header_len(), self.present);
        &mut self.buffer.as_mut()[hl..end]
    }
}

/// Owned IPv4 header. Options are carried as up to 40 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source.
    pub src: Ipv4Addr,
    /// Destination.
    pub dst: Ipv4Addr,
    /// Protocol of the payload.
    pub protocol: Protocol,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN (2 bits).
    pub ecn: u8,
    /// Identification.
    pub ident: u16,
    /// Don't fragment.
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// Payload length in bytes.
    pub payload_len: usize,
    /// Option bytes (a multiple of 4, at most 40), `options_len` of them used.
    pub options: [u8; 40],
    /// How many option bytes are used.
    pub options_len: usize,
}

impl Repr {
    /// Reads a checked, unfragmented packet, verifying the checksum.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        if !p.verify_checksum() {
            return Err(Error::Checksum { layer: "ipv4" });
        }
        if p.more_frags() || p.frag_offset() != 0 {
            return Err(Error::Malformed { layer: "ipv4", field: "fragment" });
        }
        let mut options = [0u8; 40];
        let o = p.options();
        options[..o.len()].copy_from_slice(o);
        Ok(Repr {
            src: p.src(),
            dst: p.dst(),
            protocol: p.protocol(),
            dscp: p.dscp(),
            ecn: p.ecn(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            ttl: p.ttl(),
            payload_len: usize::from(p.total_len()) - p.header_len(),
            options,
            options_len: o.len(),
        })
    }
    /// Header length, options included.
    pub const fn buffer_len(&self) -> usize {
        MIN_HEADER_LEN + self.options_len
    }
    /// Writes the header (and checksum) into the front of `buf`, which must be at least
    /// `buffer_len()` bytes; the payload is the caller's.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let hl = self.buffer_len();
        if !self.options_len.is_multiple_of(4) || self.options_len > 40 {
            return Err(Error::BadLength {
                layer: "ipv4",
                field: "options",
                value: self.options_len,
            });
        }
        let total = hl + self.payload_len;
        if total > usize::from(u16::MAX) {
            return Err(Error::BadLength { layer: "ipv4", field: "total length", value: total });
        }
        Error::check_len("ipv4", hl, buf.len())?;
        let Some(hdr) = buf.get_mut(..hl) else {
            return Err(Error::Truncated { layer: "ipv4", need: hl, have: 0 });
        };
        hdr[0] = 0x40 | (hl / 4) as u8;
        hdr[field::TOS] = (self.dscp << 2) | (self.ecn & 3);
        hdr[field::LENGTH].copy_from_slice(&(total as u16).to_be_bytes());
        hdr[field::IDENT].copy_from_slice(&self.ident.to_be_bytes());
        hdr[field::FLG_OFF].copy_from_slice(&(u16::from(self.dont_frag) << 14).to_be_bytes());
        hdr[field::TTL] = self.ttl;
        hdr[field::PROTOCOL] = self.protocol.into();
        hdr[field::CHECKSUM].copy_from_slice(&[0, 0]);
        hdr[field::SRC].copy_from_slice(&self.src.octets());
        hdr[field::DST].copy_from_slice(&self.dst.octets());
        hdr[MIN_HEADER_LEN..].copy_from_slice(&self.options[..self.options_len]);
        let c = checksum::checksum(hdr);
        hdr[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A UDP header: 10.0.0.1 -> 10.0.0.2, TTL 64, DSCP 0, checksum 0x26ce.
    static HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x1c, 0x00, 0x01, 0x40, 0x00, 0x40, 0x11, 0x26, 0xce, 0x0a, 0x00, 0x00,
        0x01, 0x0a, 0x00, 0x00, 0x02,
    ];

    fn packet() -> Vec<u8> {
        let mut v = HDR.to_vec();
        v.extend_from_slice(&[0u8; 8]);
        v
    }

    #[test]
    fn deconstruct() {
        let b = packet();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.total_len(), 28);
        assert_eq!(p.ttl(), 64);
        assert!(p.dont_frag());
        assert_eq!(p.protocol(), Protocol::Udp);
        assert_eq!(p.src(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(p.dst(), Ipv4Addr::new(10, 0, 0, 2));
        assert!(p.verify_checksum(), "literal header checksum must verify");
        assert_eq!(p.payload().len(), 8);
    }

    #[test]
    fn construct_matches_literal() {
        let b = packet();
        let repr = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        let mut out = vec![0u8; 28];
        repr.emit(&mut out).unwrap();
        assert_eq!(out, b);
    }

    #[test]
    fn dscp_incremental_checksum() {
        let mut b = packet();
        for dscp in [1u8, 0x2e, 0x3f, 0] {
            let mut p = Packet::new_checked(&mut b[..]).unwrap();
            p.set_dscp_update_checksum(dscp);
            assert_eq!(p.dscp(), dscp);
            assert!(p.verify_checksum(), "dscp {dscp}");
        }
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        assert_eq!(p.dec_ttl_update_checksum(), 63);
        assert!(p.verify_checksum());
    }

    #[test]
    fn options_and_lengths() {
        // IHL 6 with a 4-byte option (NOP NOP NOP EOL).
        let mut b =
            vec![0x46, 0, 0, 24, 0, 0, 0, 0, 64, 6, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 1, 1, 1, 0];
        Packet::new_checked(&mut b[..]).unwrap().fill_checksum();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.options(), &[1, 1, 1, 0]);
        assert_eq!(p.payload().len(), 0);
        // header length beyond buffer, bad IHL, bad version, total shorter than header
        assert!(Packet::new_checked(&b[..22]).is_err());
        let mut bad = b.clone();
        bad[0] = 0x44;
        assert!(Packet::new_checked(&bad[..]).is_err());
        bad[0] = 0x65;
        assert!(matches!(Packet::new_checked(&bad[..]), Err(Error::Malformed { .. })));
        let mut short = b.clone();
        short[3] = 10;
        assert!(Packet::new_checked(&short[..]).is_err());
    }

    #[test]
    fn lenient_accepts_snaplen() {
        let mut b = packet();
        b[3] = 200; // claims 200 bytes
        assert!(Packet::new_checked(&b[..]).is_err());
        let p = Packet::new_lenient(&b[..]).unwrap();
        assert!(p.is_truncated());
        assert_eq!(p.payload().len(), 8);
    }

    proptest::proptest! {
        #[test]
        fn roundtrip(src: [u8; 4], dst: [u8; 4], proto: u8, dscp in 0u8..64, ecn in 0u8..4,
                     ident: u16, df: bool, ttl: u8, payload_len in 0usize..1500,
                     opt_words in 0usize..=10, opt_byte: u8) {
            let mut options = [0u8; 40];
            options[..opt_words * 4].fill(opt_byte);
            let repr = Repr { src: src.into(), dst: dst.into(), protocol: proto.into(), dscp, ecn,
                ident, dont_frag: df, ttl, payload_len, options, options_len: opt_words * 4 };
            let mut buf = vec![0u8; repr.buffer_len() + payload_len];
            repr.emit(&mut buf).unwrap();
            let p = Packet::new_checked(&buf[..]).unwrap();
            proptest::prop_assert_eq!(Repr::parse(&p).unwrap(), repr);
        }

        #[test]
        fn never_panics(data: Vec<u8>) {
            if let Ok(p) = Packet::new_lenient(&data[..]) {
                let _ = (p.payload(), p.options(), p.src(), p.dst(), p.verify_checksum());
                let _ = Repr::parse(&p);
            }
        }
    }
}
