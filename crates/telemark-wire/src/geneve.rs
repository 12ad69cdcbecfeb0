//! Geneve (RFC 8926).

use crate::ethernet::EtherType;
use crate::{Error, Result};

/// UDP port of Geneve.
pub const PORT: u16 = 6081;
/// Fixed header length.
pub const MIN_HEADER_LEN: usize = 8;

/// A view of a Geneve header.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer holding the header and its options; version must be 0.
    pub fn new_checked(buffer: T) -> Result<Self> {
        Error::check_len("geneve", MIN_HEADER_LEN, buffer.as_ref().len())?;
        let p = Packet { buffer };
        if p.b()[0] >> 6 != 0 {
            return Err(Error::Malformed { layer: "geneve", field: "version" });
        }
        Error::check_len("geneve", p.header_len(), p.b().len())?;
        Ok(p)
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Header length, options included.
    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN + usize::from(self.b()[0] & 0x3f) * 4
    }
    /// OAM flag.
    pub fn oam(&self) -> bool {
        self.b()[1] & 0x80 != 0
    }
    /// Critical-options flag.
    pub fn critical(&self) -> bool {
        self.b()[1] & 0x40 != 0
    }
    /// Protocol type of the payload.
    pub fn protocol(&self) -> EtherType {
        EtherType::from(u16::from_be_bytes([self.b()[2], self.b()[3]]))
    }
    /// Virtual network identifier.
    pub fn vni(&self) -> u32 {
        let b = self.b();
        u32::from_be_bytes([0, b[4], b[5], b[6]])
    }
    /// Option bytes.
    pub fn options(&self) -> &[u8] {
        &self.b()[MIN_HEADER_LEN..self.header_len()]
    }
    /// Bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }
}

/// Owned Geneve header (options up to 32 bytes carried).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// OAM flag.
    pub oam: bool,
    /// Critical flag.
    pub critical: bool,
    /// Payload protocol.
    pub protocol: EtherType,
    /// VNI (24 bits).
    pub vni: u32,
    /// Options, `options_len` bytes used (a multiple of 4).
    pub options: [u8; 32],
    /// Option bytes used.
    pub options_len: usize,
}

impl Repr {
    /// Reads a checked header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        let o = p.options();
        if o.len() > 32 {
            return Err(Error::BadLength { layer: "geneve", field: "options", value: o.len() });
        }
        let mut options = [0u8; 32];
        options[..o.len()].copy_from_slice(o);
        Ok(Repr {
            oam: p.oam(),
            critical: p.critical(),
            protocol: p.protocol(),
            vni: p.vni(),
            options,
            options_len: o.len(),
        })
    }
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        MIN_HEADER_LEN + self.options_len
    }
    /// Writes the header into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if !self.options_len.is_multiple_of(4) || self.options_len > 32 {
            return Err(Error::BadLength {
                layer: "geneve",
                field: "options",
                value: self.options_len,
            });
        }
        let hl = self.buffer_len();
        let Some(h) = buf.get_mut(..hl) else {
            return Err(Error::Truncated { layer: "geneve", need: hl, have: 0 });
        };
        h[0] = (self.options_len / 4) as u8;
        h[1] = (u8::from(self.oam) << 7) | (u8::from(self.critical) << 6);
        h[2..4].copy_from_slice(&u16::from(self.protocol).to_be_bytes());
        h[4..7].copy_from_slice(&self.vni.to_be_bytes()[1..]);
        h[7] = 0;
        h[8..].copy_from_slice(&self.options[..self.options_len]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct() {
        let b = [0x01, 0x00, 0x65, 0x58, 0x00, 0x00, 0x0a, 0x00, 0x01, 0x02, 0x03, 0x04, 0xee];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.header_len(), 12);
        assert_eq!(p.protocol(), EtherType::TransparentEthernet);
        assert_eq!(p.vni(), 10);
        assert_eq!(p.payload(), &[0xee]);
        assert!(Packet::new_checked(&b[..11]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn roundtrip(oam: bool, crit: bool, proto: u16, vni in 0u32..(1 << 24), ow in 0usize..=8) {
            let mut options = [0u8; 32];
            options[..ow * 4].fill(9);
            let repr = Repr { oam, critical: crit, protocol: proto.into(), vni, options, options_len: ow * 4 };
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buf).unwrap();
            proptest::prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(), repr);
        }
    }
}
