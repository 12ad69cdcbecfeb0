//! GRE (RFC 2784, key and sequence from RFC 2890; enhanced GRE version 1 of PPTP, RFC 2637)
//! and the ERSPAN headers it may carry.

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
/// Acknowledgment-number present (enhanced GRE, version 1).
const FLAG_A: u16 = 0x0080;
/// EtherType of PPP, carried by enhanced GRE.
pub const PPP: u16 = 0x880b;

/// A view of a GRE header.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer holding the header and its optional fields; version 0 (GRE) or 1
    /// (enhanced GRE).
    pub fn new_checked(buffer: T) -> Result<Self> {
        Error::check_len("gre", MIN_HEADER_LEN, buffer.as_ref().len())?;
        let p = Packet { buffer };
        if p.version() > 1 {
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
    /// Version: 0 for GRE, 1 for enhanced GRE (PPTP).
    pub fn version(&self) -> u16 {
        self.flags() & 0x0007
    }
    /// Header length with the checksum, key and sequence (and, in version 1, acknowledgment)
    /// fields present.
    pub fn header_len(&self) -> usize {
        let f = self.flags();
        let ack = self.version() == 1 && f & FLAG_A != 0;
        MIN_HEADER_LEN
            + if f & FLAG_C != 0 { 4 } else { 0 }
            + if f & FLAG_K != 0 { 4 } else { 0 }
            + if f & FLAG_S != 0 { 4 } else { 0 }
            + if ack { 4 } else { 0 }
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

/// Length of a PPP header (RFC 1661, address/control possibly compressed away, RFC 1662 §3.2)
/// and whether it carries IPv4 (`Some(4)`) or IPv6 (`Some(6)`).
pub fn ppp_header(payload: &[u8]) -> Result<(usize, Option<u8>)> {
    let mut o = 0;
    if payload.get(0..2) == Some(&[0xff, 0x03]) {
        o = 2;
    }
    let first = *payload.get(o).ok_or(Error::Truncated {
        layer: "ppp",
        need: o + 1,
        have: payload.len(),
    })?;
    // An odd first byte is a compressed one-byte protocol field (RFC 1661 §6.5).
    let (proto, len) = if first & 1 == 1 {
        (u16::from(first), 1)
    } else {
        let b = payload.get(o..o + 2).ok_or(Error::Truncated {
            layer: "ppp",
            need: o + 2,
            have: payload.len(),
        })?;
        (u16::from_be_bytes([b[0], b[1]]), 2)
    };
    let ip = match proto {
        0x0021 => Some(4),
        0x0057 => Some(6),
        _ => None,
    };
    Ok((o + len, ip))
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
        if p.flags() & FLAG_C != 0 || p.version() != 0 {
            return Err(Error::Malformed {
                layer: "gre",
                field: "checksum flag or version 1 (not emitted)",
            });
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

    #[test]
    fn enhanced_gre_ppp() {
        // Version 1, K, S and A set: 4 + 4 (length, call id) + 4 (seq) + 4 (ack).
        let b = [
            0x30, 0x81, 0x88, 0x0b, 0, 10, 0, 1, 0, 0, 0, 6, 0, 0, 0, 5, 0xff, 0x03, 0x00, 0x21,
            0x45,
        ];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.version(), p.header_len()), (1, 16));
        assert_eq!(ppp_header(p.payload()).unwrap(), (4, Some(4)));
        assert_eq!(ppp_header(&[0x21, 0x45]).unwrap(), (1, Some(4)));
        assert!(ppp_header(&[0xff, 0x03]).is_err());
        assert!(Repr::parse(&p).is_err());
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
