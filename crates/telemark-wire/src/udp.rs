//! UDP (RFC 768).

use crate::{Error, Result};

mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;

/// A read/write view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer holding the header; the length field must be at least 8. A length beyond
    /// the buffer (snaplen) is allowed: [`payload`](Self::payload) gives what is present.
    pub fn new_checked(buffer: T) -> Result<Self> {
        Error::check_len("udp", HEADER_LEN, buffer.as_ref().len())?;
        let p = Packet { buffer };
        if usize::from(p.len()) < HEADER_LEN {
            return Err(Error::BadLength {
                layer: "udp",
                field: "length",
                value: usize::from(p.len()),
            });
        }
        Ok(p)
    }
    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let s = &self.buffer.as_ref()[r];
        u16::from_be_bytes([s[0], s[1]])
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }
    /// Length field (header included).
    pub fn len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }
    /// Whether the length field says the datagram has no payload.
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) == HEADER_LEN
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }
    /// Payload present in the buffer, bounded by the length field.
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = usize::from(self.len()).min(b.len());
        &b[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_u16(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        self.set_u16(field::SRC_PORT, v);
    }
    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        self.set_u16(field::DST_PORT, v);
    }
    /// Sets the length field.
    pub fn set_len(&mut self, v: u16) {
        self.set_u16(field::LENGTH, v);
    }
    /// Sets the checksum field (0 means "none" over IPv4).
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16(field::CHECKSUM, v);
    }
}

/// Owned UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length.
    pub payload_len: usize,
}

impl Repr {
    /// Reads a checked datagram.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        Ok(Repr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload_len: usize::from(p.len()) - HEADER_LEN,
        })
    }
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header with a zero checksum (allowed over IPv4, RFC 768).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let total = HEADER_LEN + self.payload_len;
        if total > usize::from(u16::MAX) {
            return Err(Error::BadLength { layer: "udp", field: "length", value: total });
        }
        Error::check_len("udp", HEADER_LEN, buf.len())?;
        let mut p = Packet { buffer: buf };
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(total as u16);
        p.set_checksum(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let b = [0xbf, 0x00, 0x00, 0x35, 0x00, 0x0c, 0x00, 0x00, 0xaa, 0x00, 0x00, 0xff];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.len()), (48896, 53, 12));
        assert_eq!(p.payload(), &[0xaa, 0, 0, 0xff]);
        let mut out = [0u8; 12];
        Repr::parse(&p).unwrap().emit(&mut out).unwrap();
        assert_eq!(out[..8], b[..8]);
        let mut bad = b;
        bad[5] = 4;
        assert!(Packet::new_checked(&bad[..]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn roundtrip(sp: u16, dp: u16, plen in 0usize..2000) {
            let repr = Repr { src_port: sp, dst_port: dp, payload_len: plen };
            let mut buf = vec![0u8; HEADER_LEN + plen];
            repr.emit(&mut buf).unwrap();
            proptest::prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(), repr);
        }
    }
}
