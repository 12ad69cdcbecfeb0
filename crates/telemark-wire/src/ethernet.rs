//! Ethernet II frames (IEEE 802.3).

use crate::{Error, Result};

/// An EtherType; unknown values are data, not errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    /// IPv4, 0x0800.
    Ipv4,
    /// IPv6, 0x86DD.
    Ipv6,
    /// ARP, 0x0806.
    Arp,
    /// Customer VLAN tag (802.1Q), 0x8100.
    Vlan,
    /// Service VLAN tag (802.1ad), 0x88A8.
    QinQ,
    /// Network Service Header (RFC 8300), 0x894F.
    Nsh,
    /// Transparent Ethernet bridging (inside GRE and Geneve), 0x6558.
    TransparentEthernet,
    /// ERSPAN type II, 0x88BE.
    ErspanII,
    /// ERSPAN type III, 0x22EB.
    ErspanIII,
    /// MPLS unicast, 0x8847.
    Mpls,
    /// Anything else.
    Unknown(u16),
}

impl From<u16> for EtherType {
    fn from(v: u16) -> Self {
        match v {
            0x0800 => EtherType::Ipv4,
            0x86dd => EtherType::Ipv6,
            0x0806 => EtherType::Arp,
            0x8100 => EtherType::Vlan,
            0x88a8 => EtherType::QinQ,
            0x894f => EtherType::Nsh,
            0x6558 => EtherType::TransparentEthernet,
            0x88be => EtherType::ErspanII,
            0x22eb => EtherType::ErspanIII,
            0x8847 => EtherType::Mpls,
            other => EtherType::Unknown(other),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(v: EtherType) -> u16 {
        match v {
            EtherType::Ipv4 => 0x0800,
            EtherType::Ipv6 => 0x86dd,
            EtherType::Arp => 0x0806,
            EtherType::Vlan => 0x8100,
            EtherType::QinQ => 0x88a8,
            EtherType::Nsh => 0x894f,
            EtherType::TransparentEthernet => 0x6558,
            EtherType::ErspanII => 0x88be,
            EtherType::ErspanIII => 0x22eb,
            EtherType::Mpls => 0x8847,
            EtherType::Unknown(v) => v,
        }
    }
}

mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const PAYLOAD: usize = 14;
}

/// Length of an untagged Ethernet header.
pub const HEADER_LEN: usize = field::PAYLOAD;

/// A read/write view of an Ethernet frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer after checking it holds a whole header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        Error::check_len("ethernet", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Frame { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn arr<const N: usize>(&self, r: core::ops::Range<usize>) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.b()[r]);
        out
    }

    /// Destination MAC address.
    pub fn dst(&self) -> [u8; 6] {
        self.arr(field::DST)
    }
    /// Source MAC address.
    pub fn src(&self) -> [u8; 6] {
        self.arr(field::SRC)
    }
    /// EtherType of the payload (or of the first VLAN tag).
    pub fn ethertype(&self) -> EtherType {
        EtherType::from(u16::from_be_bytes(self.arr(field::ETHERTYPE)))
    }
    /// Everything after the 14-byte header.
    pub fn payload(&self) -> &[u8] {
        &self.b()[field::PAYLOAD..]
    }
    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the destination MAC.
    pub fn set_dst(&mut self, v: [u8; 6]) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&v);
    }
    /// Sets the source MAC.
    pub fn set_src(&mut self, v: [u8; 6]) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&v);
    }
    /// Sets the EtherType.
    pub fn set_ethertype(&mut self, v: EtherType) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&u16::from(v).to_be_bytes());
    }
}

/// Owned Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source MAC.
    pub src: [u8; 6],
    /// Destination MAC.
    pub dst: [u8; 6],
    /// EtherType.
    pub ethertype: EtherType,
}

impl Repr {
    /// Reads the header of a checked frame.
    pub fn parse<T: AsRef<[u8]>>(f: &Frame<T>) -> Result<Repr> {
        Ok(Repr { src: f.src(), dst: f.dst(), ethertype: f.ethertype() })
    }
    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header into a checked frame.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, f: &mut Frame<T>) {
        f.set_dst(self.dst);
        f.set_src(self.src);
        f.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 16] = [
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x08, 0x00, 0xaa,
        0xbb,
    ];

    #[test]
    fn deconstruct() {
        let f = Frame::new_checked(&BYTES[..]).unwrap();
        assert_eq!(f.dst(), [1, 2, 3, 4, 5, 6]);
        assert_eq!(f.src(), [0x11, 0x12, 0x13, 0x14, 0x15, 0x16]);
        assert_eq!(f.ethertype(), EtherType::Ipv4);
        assert_eq!(f.payload(), &[0xaa, 0xbb]);
    }

    #[test]
    fn construct() {
        let repr = Repr::parse(&Frame::new_checked(&BYTES[..]).unwrap()).unwrap();
        let mut buf = [0u8; 16];
        buf[14] = 0xaa;
        buf[15] = 0xbb;
        repr.emit(&mut Frame::new_checked(&mut buf[..]).unwrap());
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        assert!(matches!(Frame::new_checked(&BYTES[..13]), Err(Error::Truncated { need: 14, .. })));
    }

    #[test]
    fn unknown_ethertype_is_kept() {
        assert_eq!(u16::from(EtherType::from(0x1234)), 0x1234);
    }

    proptest::proptest! {
        #[test]
        fn roundtrip(src: [u8; 6], dst: [u8; 6], et: u16) {
            let repr = Repr { src, dst, ethertype: EtherType::from(et) };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Frame::new_checked(&mut buf[..]).unwrap());
            proptest::prop_assert_eq!(Repr::parse(&Frame::new_checked(&buf[..]).unwrap()).unwrap(), repr);
        }
    }
}
