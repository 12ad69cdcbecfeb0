//! GRE (RFC 2784, key and sequence from RFC 2890) and the ERSPAN headers it may carry.

use crate::ethernet::EtherType;
use crate::{Error, Result};

/// Fixed header length.
pub const MIN_HEADER_LEN: usize = 4;
/// ERSPAN type II header length.
pub const ERSPAN2_HEADER_LEN: usize = 8;
/// ERSPAN type III header length without the platform-specific subheader.
pub const ERSPAN3_HEADER_LEN: usize = 12;

const FLAG_C: u16 = 0x8000;
const FLAG_K: u16 = 0x2000;
const FLAG_S: u16 = 0x1000;

/// A view of a GRE header.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer holding the header and its optional fields; version must be 0.
    pub fn new_checked(buffer: T) -> Result<Self> {
        Error::check_len("gre", MIN_HEADER_LEN, buffer.as_ref().len())?;
        let p = Packet { buffer };
        if p.flags() & 0x0007 != 0 {
            return Err(Error::Malformed { layer: "gre", field: "version" });
        }
        Error::check_len("gre", p.header_len(), p.b().len())?;
        Ok(p)
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    fn flags(&self) -> u16 {
        u16::from_be_bytes([self.b()[0], self.b()[1]])
    }
    /// Header length with the checksum, key and sequence fields present.
    pub fn header_len(&self) -> usize {
        let f = self.flags();
        MIN_HEADER_LEN
            + if f & FLAG_C != 0 { 4 } else { 0 }
            + if f & FLAG_K != 0 { 4 } else { 0 }
            + if f & FLAG_S != 0 { 4 } else { 0 }
    }
    /// Whether a sequence number is present (ERSPAN type II and III set it).
    pub fn has_seq(&self) -> bool {
        self.flags() & FLAG_S != 0
    }
    /// Payload protocol type.
    pub fn protocol(&self) -> EtherType {
        EtherType::from(u16::from_be_bytes([self.b()[2], self.b()[3]]))
    }
    /// Key, when the K flag is set.
    pub fn key(&self) -> Option<u32> {
        let f = self.flags();
        (f & FLAG_K != 0).then(|| {
            let o = MIN_HEADER_LEN + if f & FLAG_C != 0 { 4 } else { 0 };
            let b = &self.b()[o..o + 4];
            u32::from_be_bytes([b[0], b[1], b[2], b[3]])
        })
    }
    /// Bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }
}

/// Length of the ERSPAN header in front of the mirrored frame, for a GRE payload of protocol
/// `proto`: type I (0x88BE without sequence) has none, type II has 8 bytes, type III 12 plus an
/// optional 8-byte platform-specific subheader (O flag, the last bit of the header).
pub fn erspan_header_len(proto: EtherType, gre_has_seq: bool, payload: &[u8]) -> Result<usize> {
    match proto {
        EtherType::ErspanII if !gre_has_seq => Ok(0),
        EtherType::ErspanII => {
            Error::check_len("erspan", ERSPAN2_HEADER_LEN, payload.len())?;
            Ok(ERSPAN2_HEADER_LEN)
        }
        EtherType::ErspanIII => {
            Error::check_len("erspan", ERSPAN3_HEADER_LEN, payload.len())?;
            let o = payload.get(11).is_some_and(|b| b & 1 != 0);
            let hl = ERSPAN3_HEADER_LEN + if o { 8 } else { 0 };
            Error::check_len("erspan", hl, payload.len())?;
            Ok(hl)
        }
        _ => Err(Error::Malformed { layer: "erspan", field: "protocol" }),
    }
}

/// Owned GRE header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Payload protocol.
    pub protocol: EtherType,
    /// Optional key.
    pub key: Option<u32>,
    /// Optional sequence number.
    pub seq: Option<u32>,
}

impl Repr {
    /// Reads a checked header (a checksum field, if present, is not verified here).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        let seq = p.has_seq().then(|| {
            let o = p.header_len() - 4;
            let b = &p.b()[o..o + 4];
            u32::from_be_bytes([b[0], b[1], b[2], b[3]])
        });
        if p.flags() & FLAG_C != 0 {
            return Err(Error::Malformed { layer: "gre", field: "checksum flag (not emitted)" });
        }
        Ok(Repr { protocol: p.protocol(), key: p.key(), seq })
    }
    /// Header length.
    pub fn buffer_len(&self) -> usize {
        MIN_HEADER_LEN + 4 * (usize::from(self.key.is_some()) + usize::from(self.seq.is_some()))
    }
    /// Writes the header into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let hl = self.buffer_len();
        let Some(h) = buf.get_mut(..hl) else {
            return Err(Error::Truncated { layer: "gre", need: hl, have: 0 });
        };
        let mut flags = 0u16;
        let mut o = MIN_HEADER_LEN;
        if let Some(k) = self.key {
            flags |= FLAG_K;
            h[o..o + 4].copy_from_slice(&k.to_be_bytes());
            o += 4;
        }
        if let Some(s) = self.seq {
            flags |= FLAG_S;
            h[o..o + 4].copy_from_slice(&s.to_be_bytes());
        }
        h[0..2].copy_from_slice(&flags.to_be_bytes());
        h[2..4].copy_from_slice(&u16::from(self.protocol).to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct() {
        // K and S set, protocol ERSPAN II, key 7, seq 1, then an 8-byte ERSPAN II header.
        let b = [0x30, 0x00, 0x88, 0xbe, 0, 0, 0, 7, 0, 0, 0, 1, 0x10, 0, 0, 1, 0, 0, 0, 0, 0xaa];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.header_len(), 12);
        assert_eq!(p.key(), Some(7));
        assert_eq!(p.protocol(), EtherType::ErspanII);
        assert_eq!(erspan_header_len(p.protocol(), p.has_seq(), p.payload()).unwrap(), 8);
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r.seq, Some(1));
        let mut out = [0u8; 12];
        r.emit(&mut out).unwrap();
        assert_eq!(out, b[..12]);
        assert!(Packet::new_checked(&b[..10]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn roundtrip(proto: u16, key: Option<u32>, seq: Option<u32>) {
            let repr = Repr { protocol: proto.into(), key, seq };
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buf).unwrap();
            proptest::prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(), repr);
        }
    }
}
