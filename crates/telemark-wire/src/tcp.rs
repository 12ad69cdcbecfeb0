//! TCP (RFC 9293) header: ports, sequence numbers, flags, options.

use crate::{Error, Result};

mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ: Range<usize> = 4..8;
    pub const ACK: Range<usize> = 8..12;
    pub const OFF_FLAGS: Range<usize> = 12..14;
    pub const WINDOW: Range<usize> = 14..16;
    pub const CHECKSUM: Range<usize> = 16..18;
    pub const URGENT: Range<usize> = 18..20;
}

/// Length of a header without options.
pub const MIN_HEADER_LEN: usize = 20;

/// A read/write view of a TCP segment.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer holding the whole header, options included.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        Error::check_len("tcp", MIN_HEADER_LEN, b.len())?;
        let p = Packet { buffer };
        let hl = p.header_len();
        if hl < MIN_HEADER_LEN {
            return Err(Error::BadLength { layer: "tcp", field: "data offset", value: hl });
        }
        Error::check_len("tcp", hl, p.buffer.as_ref().len())?;
        Ok(p)
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let s = &self.b()[r];
        u16::from_be_bytes([s[0], s[1]])
    }
    fn u32_at(&self, r: core::ops::Range<usize>) -> u32 {
        let s = &self.b()[r];
        u32::from_be_bytes([s[0], s[1], s[2], s[3]])
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }
    /// Sequence number.
    pub fn seq(&self) -> u32 {
        self.u32_at(field::SEQ)
    }
    /// Acknowledgment number.
    pub fn ack(&self) -> u32 {
        self.u32_at(field::ACK)
    }
    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[field::OFF_FLAGS.start] >> 4) * 4
    }
    /// The nine flag bits (NS..FIN).
    pub fn flags(&self) -> u16 {
        self.u16_at(field::OFF_FLAGS) & 0x01ff
    }
    /// Receive window.
    pub fn window(&self) -> u16 {
        self.u16_at(field::WINDOW)
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }
    /// Urgent pointer.
    pub fn urgent(&self) -> u16 {
        self.u16_at(field::URGENT)
    }
    /// Option bytes.
    pub fn options(&self) -> &[u8] {
        &self.b()[MIN_HEADER_LEN..self.header_len()]
    }
    /// Payload present in the buffer.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }
}

/// TCP flag bits.
pub mod flags {
    /// FIN.
    pub const FIN: u16 = 0x001;
    /// SYN.
    pub const SYN: u16 = 0x002;
    /// RST.
    pub const RST: u16 = 0x004;
    /// PSH.
    pub const PSH: u16 = 0x008;
    /// ACK.
    pub const ACK: u16 = 0x010;
}

/// Owned TCP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Flag bits.
    pub flags: u16,
    /// Window.
    pub window: u16,
    /// Option bytes, `options_len` used (a multiple of 4, at most 40).
    pub options: [u8; 40],
    /// Option bytes used.
    pub options_len: usize,
}

impl Repr {
    /// Reads a checked segment.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        let o = p.options();
        let mut options = [0u8; 40];
        options[..o.len()].copy_from_slice(o);
        Ok(Repr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq: p.seq(),
            ack: p.ack(),
            flags: p.flags(),
            window: p.window(),
            options,
            options_len: o.len(),
        })
    }
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        MIN_HEADER_LEN + self.options_len
    }
    /// Writes the header with a zero checksum into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if !self.options_len.is_multiple_of(4) || self.options_len > 40 {
            return Err(Error::BadLength {
                layer: "tcp",
                field: "options",
                value: self.options_len,
            });
        }
        let hl = self.buffer_len();
        let Some(h) = buf.get_mut(..hl) else {
            return Err(Error::Truncated { layer: "tcp", need: hl, have: 0 });
        };
        h[field::SRC_PORT].copy_from_slice(&self.src_port.to_be_bytes());
        h[field::DST_PORT].copy_from_slice(&self.dst_port.to_be_bytes());
        h[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        h[field::ACK].copy_from_slice(&self.ack.to_be_bytes());
        let off_flags = ((hl as u16 / 4) << 12) | (self.flags & 0x01ff);
        h[field::OFF_FLAGS].copy_from_slice(&off_flags.to_be_bytes());
        h[field::WINDOW].copy_from_slice(&self.window.to_be_bytes());
        h[field::CHECKSUM].copy_from_slice(&[0, 0]);
        h[field::URGENT].copy_from_slice(&[0, 0]);
        h[MIN_HEADER_LEN..].copy_from_slice(&self.options[..self.options_len]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_syn() {
        // SYN from port 40000 to 80 with an MSS option (data offset 6).
        let b = [
            0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x60, 0x02,
            0xfa, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4,
        ];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.seq()), (40000, 80, 1));
        assert_eq!(p.flags(), flags::SYN);
        assert_eq!(p.options(), &[2, 4, 5, 0xb4]);
        let mut out = [0u8; 24];
        Repr::parse(&p).unwrap().emit(&mut out).unwrap();
        assert_eq!(out, b);
        assert!(Packet::new_checked(&b[..22]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn roundtrip(sp: u16, dp: u16, seq: u32, ack: u32, fl in 0u16..0x200, win: u16, ow in 0usize..=10) {
            let mut options = [0u8; 40];
            options[..ow * 4].fill(1);
            let repr = Repr { src_port: sp, dst_port: dp, seq, ack, flags: fl, window: win, options, options_len: ow * 4 };
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buf).unwrap();
            proptest::prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(), repr);
        }
    }
}
