//! IEEE 802.1Q / 802.1ad VLAN tags (stackable: a tag's EtherType may name another tag).

use crate::ethernet::EtherType;
use crate::{Error, Result};

mod field {
    use core::ops::Range;
    pub const TCI: Range<usize> = 0..2;
    pub const ETHERTYPE: Range<usize> = 2..4;
}

/// Length of one tag after the outer EtherType.
pub const HEADER_LEN: usize = 4;

/// A view of one VLAN tag (TCI and inner EtherType), starting after the tag's TPID.
#[derive(Debug, Clone)]
pub struct Tag<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Tag<T> {
    /// Wraps a buffer after checking it holds a whole tag.
    pub fn new_checked(buffer: T) -> Result<Self> {
        Error::check_len("vlan", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Tag { buffer })
    }
    fn word(&self, r: core::ops::Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }
    /// Priority code point (3 bits).
    pub fn pcp(&self) -> u8 {
        (self.word(field::TCI) >> 13) as u8
    }
    /// Drop eligible indicator.
    pub fn dei(&self) -> bool {
        self.word(field::TCI) & 0x1000 != 0
    }
    /// VLAN identifier (12 bits).
    pub fn vid(&self) -> u16 {
        self.word(field::TCI) & 0x0fff
    }
    /// EtherType of what follows the tag.
    pub fn ethertype(&self) -> EtherType {
        EtherType::from(self.word(field::ETHERTYPE))
    }
    /// Bytes after the tag.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Tag<T> {
    /// Sets PCP, DEI and VID at once.
    pub fn set_tci(&mut self, pcp: u8, dei: bool, vid: u16) {
        let tci = (u16::from(pcp & 7) << 13) | (u16::from(dei) << 12) | (vid & 0x0fff);
        self.buffer.as_mut()[field::TCI].copy_from_slice(&tci.to_be_bytes());
    }
    /// Sets the inner EtherType.
    pub fn set_ethertype(&mut self, v: EtherType) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&u16::from(v).to_be_bytes());
    }
}

/// Owned VLAN tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Priority code point.
    pub pcp: u8,
    /// Drop eligible.
    pub dei: bool,
    /// VLAN id.
    pub vid: u16,
    /// Inner EtherType.
    pub ethertype: EtherType,
}

impl Repr {
    /// Reads a checked tag.
    pub fn parse<T: AsRef<[u8]>>(t: &Tag<T>) -> Result<Repr> {
        Ok(Repr { pcp: t.pcp(), dei: t.dei(), vid: t.vid(), ethertype: t.ethertype() })
    }
    /// Bytes the tag takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the tag.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, t: &mut Tag<T>) {
        t.set_tci(self.pcp, self.dei, self.vid);
        t.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct() {
        // PCP 5, DEI 1, VID 0x123, inner IPv6.
        let b = [0xb1, 0x23, 0x86, 0xdd];
        let t = Tag::new_checked(&b[..]).unwrap();
        assert_eq!((t.pcp(), t.dei(), t.vid()), (5, true, 0x123));
        assert_eq!(t.ethertype(), EtherType::Ipv6);
        let mut out = [0u8; 4];
        Repr::parse(&t).unwrap().emit(&mut Tag::new_checked(&mut out[..]).unwrap());
        assert_eq!(out, b);
        assert!(Tag::new_checked(&b[..3]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn roundtrip(pcp in 0u8..8, dei: bool, vid in 0u16..4096, et: u16) {
            let repr = Repr { pcp, dei, vid, ethertype: EtherType::from(et) };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Tag::new_checked(&mut buf[..]).unwrap());
            proptest::prop_assert_eq!(Repr::parse(&Tag::new_checked(&buf[..]).unwrap()).unwrap(), repr);
        }
    }
}
