//! Network Service Header (RFC 8300), MD types 1 and 2.

use crate::{Error, Result};

/// Base header + service path header.
pub const MIN_HEADER_LEN: usize = 8;
/// Total length of an MD type 1 header (RFC 8300 §2.4: Length = 0x6).
pub const MD1_HEADER_LEN: usize = 24;

/// What follows the NSH (RFC 8300 §11.2.5).
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
    /// 5.
    Mpls,
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
            5 => NextProtocol::Mpls,
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
            NextProtocol::Mpls => 5,
            NextProtocol::Unknown(o) => o,
        }
    }
}

/// A view of an NSH.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer after checking version 0, the MD type, and that the whole header
    /// (`Length` words) is present. MD type 1 must have Length 6; MD type 2 at least 2.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        Error::check_len("nsh", MIN_HEADER_LEN, b.len())?;
        let p = Packet { buffer };
        if p.version() != 0 {
            return Err(Error::Malformed { layer: "nsh", field: "version" });
        }
        let hl = p.header_len();
        match p.md_type() {
            1 if hl != MD1_HEADER_LEN => {
                return Err(Error::BadLength {
                    layer: "nsh",
                    field: "length (md type 1)",
                    value: hl,
                })
            }
            2 if hl < MIN_HEADER_LEN => {
                return Err(Error::BadLength { layer: "nsh", field: "length", value: hl })
            }
            1 | 2 => {}
            _ => return Err(Error::Malformed { layer: "nsh", field: "md type" }),
        }
        Error::check_len("nsh", hl, p.buffer.as_ref().len())?;
        Ok(p)
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Version (2 bits).
    pub fn version(&self) -> u8 {
        self.b()[0] >> 6
    }
    /// O (OAM) bit.
    pub fn oam(&self) -> bool {
        self.b()[0] & 0x20 != 0
    }
    /// TTL (6 bits).
    pub fn ttl(&self) -> u8 {
        ((self.b()[0] & 0x0f) << 2) | (self.b()[1] >> 6)
    }
    /// Header length in bytes (Length field × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[1] & 0x3f) * 4
    }
    /// Metadata type (1 fixed, 2 variable).
    pub fn md_type(&self) -> u8 {
        self.b()[2] & 0x0f
    }
    /// Next protocol.
    pub fn next_protocol(&self) -> NextProtocol {
        NextProtocol::from(self.b()[3])
    }
    /// Service path identifier (24 bits).
    pub fn spi(&self) -> u32 {
        let b = self.b();
        u32::from_be_bytes([0, b[4], b[5], b[6]])
    }
    /// Service index.
    pub fn si(&self) -> u8 {
        self.b()[7]
    }
    /// Context headers (MD type 1) or variable-length metadata (MD type 2).
    pub fn metadata(&self) -> &[u8] {
        &self.b()[MIN_HEADER_LEN..self.header_len()]
    }
    /// Bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the service index (a service function decrements it, RFC 8300 §2.3).
    pub fn set_si(&mut self, si: u8) {
        self.buffer.as_mut()[7] = si;
    }
}

/// Owned NSH. MD type 2 metadata up to 64 bytes is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// OAM bit.
    pub oam: bool,
    /// TTL (6 bits).
    pub ttl: u8,
    /// MD type, 1 or 2.
    pub md_type: u8,
    /// Next protocol.
    pub next_protocol: NextProtocol,
    /// Service path identifier.
    pub spi: u32,
    /// Service index.
    pub si: u8,
    /// Metadata bytes (16 for MD type 1; a multiple of 4 for type 2).
    pub metadata: [u8; 64],
    /// Metadata bytes used.
    pub metadata_len: usize,
}

impl Repr {
    /// Reads a checked header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        let m = p.metadata();
        if m.len() > 64 {
            return Err(Error::BadLength { layer: "nsh", field: "metadata", value: m.len() });
        }
        let mut metadata = [0u8; 64];
        metadata[..m.len()].copy_from_slice(m);
        Ok(Repr {
            oam: p.oam(),
            ttl: p.ttl(),
            md_type: p.md_type(),
            next_protocol: p.next_protocol(),
            spi: p.spi(),
            si: p.si(),
            metadata,
            metadata_len: m.len(),
        })
    }
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        MIN_HEADER_LEN + self.metadata_len
    }
    /// Writes the header into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let ok = match self.md_type {
            1 => self.metadata_len == 16,
            2 => self.metadata_len.is_multiple_of(4) && self.metadata_len <= 64,
            _ => false,
        };
        if !ok {
            return Err(Error::BadLength {
                layer: "nsh",
                field: "metadata",
                value: self.metadata_len,
            });
        }
        let hl = self.buffer_len();
        let Some(h) = buf.get_mut(..hl) else {
            return Err(Error::Truncated { layer: "nsh", need: hl, have: 0 });
        };
        let ttl = self.ttl & 0x3f;
        h[0] = (u8::from(self.oam) << 5) | (ttl >> 2);
        h[1] = ((ttl & 3) << 6) | (hl / 4) as u8;
        h[2] = self.md_type & 0x0f;
        h[3] = self.next_protocol.into();
        h[4..7].copy_from_slice(&self.spi.to_be_bytes()[1..]);
        h[7] = self.si;
        h[8..].copy_from_slice(&self.metadata[..self.metadata_len]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md1() {
        // TTL 63, length 6, MD type 1, next IPv4, SPI 0x000102, SI 255, 16 bytes context.
        let mut b = vec![0x0f, 0xc6, 0x01, 0x01, 0x00, 0x01, 0x02, 0xff];
        b.extend_from_slice(&[0x11; 16]);
        b.extend_from_slice(&[0x45]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.ttl(), p.md_type(), p.spi(), p.si()), (63, 1, 0x102, 255));
        assert_eq!(p.next_protocol(), NextProtocol::Ipv4);
        assert_eq!(p.payload(), &[0x45]);
        let mut out = vec![0u8; 24];
        Repr::parse(&p).unwrap().emit(&mut out).unwrap();
        assert_eq!(out[..], b[..24]);
    }

    #[test]
    fn md2_and_errors() {
        // MD type 2 with one 8-byte TLV, length 4 words.
        let b = [0x00, 0x04, 0x02, 0x03, 0, 0, 7, 3, 0x01, 0x02, 0x03, 0x01, 0xaa, 0, 0, 0];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.md_type(), p.spi(), p.si(), p.metadata().len()), (2, 7, 3, 8));
        assert!(Packet::new_checked(&b[..15]).is_err());
        let mut v = b;
        v[0] = 0x40; // version 1
        assert!(Packet::new_checked(&v[..]).is_err());
        let mut m1 = b;
        m1[2] = 1; // MD type 1 with length 4 words
        assert!(Packet::new_checked(&m1[..]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn roundtrip(oam: bool, ttl in 0u8..64, md2: bool, np: u8, spi in 0u32..(1 << 24), si: u8,
                     words in 0usize..=16, fill: u8) {
            let metadata_len = if md2 { words * 4 } else { 16 };
            let mut metadata = [0u8; 64];
            metadata[..metadata_len].fill(fill);
            let repr = Repr { oam, ttl, md_type: if md2 { 2 } else { 1 }, next_protocol: np.into(),
                spi, si, metadata, metadata_len };
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buf).unwrap();
            proptest::prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(), repr);
        }
    }
}
