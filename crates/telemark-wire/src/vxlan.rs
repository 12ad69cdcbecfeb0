//! VXLAN (RFC 7348) and VXLAN-GPE (draft-ietf-nvo3-vxlan-gpe) headers.

use crate::{Error, Result};

/// UDP port of VXLAN.
pub const PORT: u16 = 4789;
/// UDP port of VXLAN-GPE.
pub const GPE_PORT: u16 = 4790;
/// Header length.
pub const HEADER_LEN: usize = 8;

const FLAG_I: u8 = 0x08;
const FLAG_P: u8 = 0x04;

/// What a VXLAN-GPE header says follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NextProtocol {
    /// 1.
    Ipv4,
    /// 2.
    Ipv6,
    /// 3.
    Ethernet,
    /// 4.
    Nsh,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for NextProtocol {
    fn from(v: u8) -> Self {
        match v {
            1 => NextProtocol::Ipv4,
            2 => NextProtocol::Ipv6,
            3 => NextProtocol::Ethernet,
            4 => NextProtocol::Nsh,
            o => NextProtocol::Unknown(o),
        }
    }
}

impl From<NextProtocol> for u8 {
    fn from(v: NextProtocol) -> u8 {
        match v {
            NextProtocol::Ipv4 => 1,
            NextProtocol::Ipv6 => 2,
            NextProtocol::Ethernet => 3,
            NextProtocol::Nsh => 4,
            NextProtocol::Unknown(o) => o,
        }
    }
}

/// A view of a VXLAN or VXLAN-GPE header.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer holding the 8-byte header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        Error::check_len("vxlan", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Packet { buffer })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Flags byte.
    pub fn flags(&self) -> u8 {
        self.b()[0]
    }
    /// Whether the VNI is valid (I flag).
    pub fn vni_valid(&self) -> bool {
        self.flags() & FLAG_I != 0
    }
    /// VXLAN network identifier (24 bits).
    pub fn vni(&self) -> u32 {
        let b = self.b();
        u32::from_be_bytes([0, b[4], b[5], b[6]])
    }
    /// The GPE next protocol when the P flag is set (VXLAN-GPE), else `None` (plain VXLAN
    /// carries Ethernet).
    pub fn next_protocol(&self) -> Option<NextProtocol> {
        (self.flags() & FLAG_P != 0).then(|| NextProtocol::from(self.b()[3]))
    }
    /// Bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..]
    }
}

/// Owned VXLAN / VXLAN-GPE header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// VNI.
    pub vni: u32,
    /// `Some` for VXLAN-GPE.
    pub next_protocol: Option<NextProtocol>,
}

impl Repr {
    /// Reads a header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        if !p.vni_valid() {
            return Err(Error::Malformed { layer: "vxlan", field: "I flag" });
        }
        Ok(Repr { vni: p.vni(), next_protocol: p.next_protocol() })
    }
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let Some(h) = buf.get_mut(..HEADER_LEN) else {
            return Err(Error::Truncated { layer: "vxlan", need: HEADER_LEN, have: 0 });
        };
        h.fill(0);
        h[0] = FLAG_I;
        if let Some(np) = self.next_protocol {
            h[0] |= FLAG_P;
            h[3] = np.into();
        }
        h[4..7].copy_from_slice(&self.vni.to_be_bytes()[1..]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct() {
        let plain = [0x08, 0, 0, 0, 0x00, 0x01, 0x23, 0x00];
        let p = Packet::new_checked(&plain[..]).unwrap();
        assert_eq!(p.vni(), 0x123);
        assert_eq!(p.next_protocol(), None);
        let gpe = [0x0c, 0, 0, 0x04, 0x00, 0x00, 0x2a, 0x00];
        let g = Packet::new_checked(&gpe[..]).unwrap();
        assert_eq!(g.next_protocol(), Some(NextProtocol::Nsh));
        let mut out = [0u8; 8];
        Repr::parse(&g).unwrap().emit(&mut out).unwrap();
        assert_eq!(out, gpe);
        assert!(Packet::new_checked(&gpe[..7]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn roundtrip(vni in 0u32..(1 << 24), np: Option<u8>) {
            let repr = Repr { vni, next_protocol: np.map(NextProtocol::from) };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut buf).unwrap();
            proptest::prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(), repr);
        }
    }
}
