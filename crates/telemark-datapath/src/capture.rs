//! Capture files: pcap (µs and ns, either byte order) and pcapng in, streamed one record at a
//! time; pcap (ns) out.
//!
//! Telemark reads captures itself rather than through a crate, because what field engineers'
//! captures need is leniency in exactly the places the crates are strict, and that leniency is
//! a few lines here:
//! - a record longer than the file's snapshot length (`incl_len > snaplen`) is cut to the
//!   snapshot length, as libpcap and tshark do, not refused; a packet cut by the snapshot
//!   length (`orig_len > incl_len`, every `tcpdump -s 96` capture) is the normal case, and its
//!   wire length is kept (pcap-file 2.0 refused both);
//! - pcapng options without the end-of-options marker end with their block (pcap-file 2.0
//!   refused those);
//! - a truncated or corrupt record stops reading with its byte offset and reason, keeping
//!   everything before it, and the caller says so (no error that loses what was read).
//!
//! Formats: the libpcap file format (draft-ietf-opsawg-pcap) and pcapng
//! (draft-ietf-opsawg-pcapng): section header, interface description (link type, snapshot
//! length, `if_tsresol`, `if_tsoffset`), enhanced, simple and obsolete packet blocks; other
//! blocks are skipped. Memory is one record, whatever the file's size.

use crate::Pkt;
use std::fs::File;
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use telemark_wire::link::LinkType;

/// The largest record accepted: libpcap's largest snapshot length (262,144 for most link
/// types), with room for link types it allows more. A longer record is damage, not a packet.
const MAX_RECORD: u32 = 1 << 20;
/// The largest pcapng block accepted (a packet block's data plus options).
const MAX_BLOCK: u32 = MAX_RECORD + 64 * 1024;

/// Why a capture cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Open or read failed.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file does not start like a pcap or pcapng file.
    #[error("{path}: not a pcap or pcapng capture (starts with {magic})")]
    NotCapture {
        /// File.
        path: PathBuf,
        /// First bytes, hex.
        magic: String,
    },
    /// The file header is unreadable.
    #[error("{path}: bad capture header: {reason}")]
    BadHeader {
        /// File.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Writing failed.
    #[error("{path}: cannot write capture: {source}")]
    Write {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

/// Where and why reading stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Byte offset of the record that could not be read.
    pub offset: u64,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.reason, self.offset)
    }
}

/// A packet as read from a capture.
#[derive(Debug, Clone)]
pub struct RawPacket {
    /// Timestamp, ns since the epoch.
    pub ts_ns: u64,
    /// The LINKTYPE number of the interface it was captured on.
    pub linktype: u32,
    /// That link type, if Telemark reads it.
    pub link: Option<LinkType>,
    /// Captured bytes (possibly fewer than the packet had: see `wire_len`).
    pub data: Vec<u8>,
    /// Length of the packet on the wire (the record's `orig_len`).
    pub wire_len: u32,
}

impl RawPacket {
    /// The packet for the pipelines.
    pub fn into_pkt(self) -> Pkt {
        Pkt { ts_ns: self.ts_ns, wire_len: self.wire_len, data: self.data }
    }
}

/// Byte order of a file or section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Little,
    Big,
}

impl Order {
    fn u16(self, b: &[u8], at: usize) -> u16 {
        let x = [b.get(at).copied().unwrap_or(0), b.get(at + 1).copied().unwrap_or(0)];
        match self {
            Order::Little => u16::from_le_bytes(x),
            Order::Big => u16::from_be_bytes(x),
        }
    }
    fn u32(self, b: &[u8], at: usize) -> u32 {
        let mut x = [0u8; 4];
        for (i, v) in x.iter_mut().enumerate() {
            *v = b.get(at + i).copied().unwrap_or(0);
        }
        match self {
            Order::Little => u32::from_le_bytes(x),
            Order::Big => u32::from_be_bytes(x),
        }
    }
}

/// One pcapng interface (interface description block).
#[derive(Debug, Clone, Copy)]
struct Interface {
    linktype: u32,
    snaplen: u32,
    /// `if_tsresol`: MSB clear, 10^-v s; set, 2^-v s (default 6: microseconds).
    tsresol: u8,
    /// `if_tsoffset`: seconds added to every timestamp.
    tsoffset: i64,
}

enum Format {
    Pcap { order: Order, nanos: bool, linktype: u32, snaplen: u32 },
    PcapNg { order: Order, interfaces: Vec<Interface> },
}

/// Reads pcap or pcapng, whichever the file is, one packet at a time.
pub struct CaptureReader<R: Read = BufReader<File>> {
    file: R,
    format: Format,
    path: PathBuf,
    /// Byte offset of the next record.
    offset: u64,
    /// Set when reading stopped at a damaged record (everything before it was read).
    pub damage: Option<Damage>,
    /// Packets read.
    pub packets: u64,
    /// Packets cut by the snapshot length (fewer bytes captured than were on the wire).
    pub cut: u64,
}

/// What went wrong reading one record.
enum Stop {
    End,
    Damaged(String),
    Io(std::io::Error),
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == ErrorKind::UnexpectedEof {
            Stop::Damaged("the file ends inside a record".into())
        } else {
            Stop::Io(e)
        }
    }
}

impl CaptureReader {
    /// Opens `path`, sniffing the format from its magic number.
    pub fn open(path: &Path) -> Result<Self, CaptureError> {
        let io = |source| CaptureError::Io { path: path.to_owned(), source };
        let file = BufReader::with_capacity(256 * 1024, File::open(path).map_err(io)?);
        CaptureReader::from_reader(file, path)
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads a capture from `file`; `path` names it in messages.
    pub fn from_reader(mut file: R, path: &Path) -> Result<Self, CaptureError> {
        let io = |source| CaptureError::Io { path: path.to_owned(), source };
        let mut head = [0u8; 24];
        let got = read_up_to(&mut file, &mut head).map_err(io)?;
        let bad =
            |reason: &str| CaptureError::BadHeader { path: path.to_owned(), reason: reason.into() };
        let (format, offset) = match head[..4] {
            [0xd4, 0xc3, 0xb2, 0xa1]
            | [0x4d, 0x3c, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0xc3, 0xd4]
            | [0xa1, 0xb2, 0x3c, 0x4d]
                if got >= 4 =>
            {
                if got < 24 {
                    return Err(bad("the file ends inside the 24-byte pcap header"));
                }
                let order = if head[0] == 0xa1 { Order::Big } else { Order::Little };
                let nanos =
                    matches!(head[..4], [0x4d, 0x3c, 0xb2, 0xa1] | [0xa1, 0xb2, 0x3c, 0x4d]);
                // The link type's low 16 bits; the upper bits carry FCS information
                // (draft-ietf-opsawg-pcap, LinkType and additional information).
                let linktype = order.u32(&head, 20) & 0xffff;
                let snaplen = order.u32(&head, 16);
                (Format::Pcap { order, nanos, linktype, snaplen }, 24)
            }
            [0x0a, 0x0d, 0x0d, 0x0a] if got >= 12 => {
                let order = match head[8..12] {
                    [0x4d, 0x3c, 0x2b, 0x1a] => Order::Little,
                    [0x1a, 0x2b, 0x3c, 0x4d] => Order::Big,
                    _ => return Err(bad("pcapng section header without a byte-order magic")),
                };
                let len = order.u32(&head, 4);
                if len < 28 || len % 4 != 0 || len > MAX_BLOCK {
                    return Err(bad(&format!("pcapng section header of {len} bytes")));
                }
                // The rest of the section header (version, length, options) tells nothing
                // a packet needs.
                skip(&mut file, u64::from(len) - got as u64)
                    .map_err(|_| bad("the file ends inside the section header"))?;
                (Format::PcapNg { order, interfaces: Vec::new() }, u64::from(len))
            }
            _ => {
                let magic = head[..got.min(4)]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                let magic = if magic.is_empty() { "nothing: empty file".into() } else { magic };
                return Err(CaptureError::NotCapture { path: path.to_owned(), magic });
            }
        };
        Ok(CaptureReader {
            file,
            format,
            path: path.to_owned(),
            offset,
            damage: None,
            packets: 0,
            cut: 0,
        })
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next packet, or `None` at the end of the file or at a damaged record
    /// ([`CaptureReader::damage`] then says which).
    pub fn next_packet(&mut self) -> Option<RawPacket> {
        if self.damage.is_some() {
            return None;
        }
        let at = self.offset;
        let r = match self.format {
            Format::Pcap { .. } => self.pcap_record(),
            Format::PcapNg { .. } => self.pcapng_packet(),
        };
        match r {
            Ok(p) => {
                self.packets += 1;
                self.cut += u64::from(p.wire_len as usize > p.data.len());
                Some(p)
            }
            Err(Stop::End) => None,
            Err(Stop::Damaged(reason)) => {
                self.damage = Some(Damage { offset: at, reason });
                None
            }
            Err(Stop::Io(e)) => {
                self.damage = Some(Damage { offset: at, reason: format!("read error: {e}") });
                None
            }
        }
    }

    /// One pcap record.
    fn pcap_record(&mut self) -> Result<RawPacket, Stop> {
        let Format::Pcap { order, nanos, linktype, snaplen } = self.format else {
            return Err(Stop::End);
        };
        let mut h = [0u8; 16];
        match read_up_to(&mut self.file, &mut h)? {
            0 => return Err(Stop::End),
            16 => {}
            n => {
                return Err(Stop::Damaged(format!(
                    "the file ends inside a record header ({n} of 16 bytes)"
                )))
            }
        }
        let (sec, frac) = (order.u32(&h, 0), order.u32(&h, 4));
        let (incl, orig) = (order.u32(&h, 8), order.u32(&h, 12));
        if incl > MAX_RECORD {
            return Err(Stop::Damaged(format!(
                "record of {incl} captured bytes (more than {MAX_RECORD})"
            )));
        }
        let mut data = vec![0u8; incl as usize];
        self.file.read_exact(&mut data)?;
        self.offset += 16 + u64::from(incl);
        // libpcap keeps at most the snapshot length of a longer record (a snaplen of 0 means
        // none was set).
        if snaplen > 0 && incl > snaplen {
            data.truncate(snaplen as usize);
        }
        let ts_ns = u64::from(sec) * 1_000_000_000
            + if nanos { u64::from(frac) } else { u64::from(frac) * 1_000 };
        Ok(RawPacket {
            ts_ns,
            linktype,
            link: LinkType::from_linktype(linktype),
            wire_len: orig.max(incl),
            data,
        })
    }

    /// Blocks up to the next packet block.
    fn pcapng_packet(&mut self) -> Result<RawPacket, Stop> {
        loop {
            let Format::PcapNg { order, .. } = self.format else { return Err(Stop::End) };
            let mut h = [0u8; 8];
            match read_up_to(&mut self.file, &mut h)? {
                0 => return Err(Stop::End),
                8 => {}
                n => {
                    return Err(Stop::Damaged(format!(
                        "the file ends inside a block header ({n} of 8 bytes)"
                    )))
                }
            }
            let kind = order.u32(&h, 0);
            if kind == 0x0a0d_0d0a {
                self.section(&h)?;
                continue;
            }
            let len = order.u32(&h, 4);
            if !(12..=MAX_BLOCK).contains(&len) {
                return Err(Stop::Damaged(format!("block of type {kind:#x} with length {len}")));
            }
            // The body, then the trailing copy of the length (not checked: readers that
            // matter do not either). Blocks should be padded to 4 bytes; read what is said.
            let mut body = vec![0u8; len as usize - 8];
            self.file.read_exact(&mut body)?;
            self.offset += u64::from(len);
            body.truncate(body.len() - 4);
            match kind {
                1 => self.interface(&body)?,
                6 | 3 | 2 => return self.packet_block(kind, body),
                _ => {}
            }
        }
    }

    /// A new section: its byte order, and no interfaces yet.
    fn section(&mut self, h: &[u8; 8]) -> Result<(), Stop> {
        let mut m = [0u8; 4];
        self.file.read_exact(&mut m)?;
        let order = match m {
            [0x4d, 0x3c, 0x2b, 0x1a] => Order::Little,
            [0x1a, 0x2b, 0x3c, 0x4d] => Order::Big,
            _ => return Err(Stop::Damaged("section header without a byte-order magic".into())),
        };
        let len = order.u32(h, 4);
        if !(28..=MAX_BLOCK).contains(&len) {
            return Err(Stop::Damaged(format!("section header of {len} bytes")));
        }
        skip(&mut self.file, u64::from(len) - 12)?;
        self.offset += u64::from(len);
        self.format = Format::PcapNg { order, interfaces: Vec::new() };
        Ok(())
    }

    /// An interface description block.
    fn interface(&mut self, body: &[u8]) -> Result<(), Stop> {
        let Format::PcapNg { order, interfaces } = &mut self.format else { return Ok(()) };
        if body.len() < 8 {
            return Err(Stop::Damaged(format!("interface description of {} bytes", body.len())));
        }
        let mut ifc = Interface {
            linktype: u32::from(order.u16(body, 0)),
            snaplen: order.u32(body, 4),
            tsresol: 6,
            tsoffset: 0,
        };
        for (code, value) in options(*order, body.get(8..).unwrap_or(&[])) {
            match (code, value.len()) {
                (9, 1..) => ifc.tsresol = value[0],
                (14, 8..) => {
                    let (lo, hi) = (order.u32(value, 0), order.u32(value, 4));
                    let raw = if *order == Order::Little {
                        u64::from(lo) | u64::from(hi) << 32
                    } else {
                        u64::from(hi) | u64::from(lo) << 32
                    };
                    ifc.tsoffset = raw as i64;
                }
                _ => {}
            }
        }
        interfaces.push(ifc);
        Ok(())
    }

    /// An enhanced (6), simple (3) or obsolete (2) packet block.
    fn packet_block(&mut self, kind: u32, body: Vec<u8>) -> Result<RawPacket, Stop> {
        let Format::PcapNg { order, interfaces } = &self.format else { return Err(Stop::End) };
        let order = *order;
        let (iface, ts_raw, incl, orig, start) = match kind {
            6 => {
                if body.len() < 20 {
                    return Err(Stop::Damaged(format!(
                        "enhanced packet block of {} bytes",
                        body.len()
                    )));
                }
                let ts = u64::from(order.u32(&body, 4)) << 32 | u64::from(order.u32(&body, 8));
                (order.u32(&body, 0), Some(ts), order.u32(&body, 12), order.u32(&body, 16), 20)
            }
            2 => {
                if body.len() < 20 {
                    return Err(Stop::Damaged(format!("packet block of {} bytes", body.len())));
                }
                let ts = u64::from(order.u32(&body, 4)) << 32 | u64::from(order.u32(&body, 8));
                (
                    u32::from(order.u16(&body, 0)),
                    Some(ts),
                    order.u32(&body, 12),
                    order.u32(&body, 16),
                    20,
                )
            }
            _ => {
                if body.len() < 4 {
                    return Err(Stop::Damaged(format!(
                        "simple packet block of {} bytes",
                        body.len()
                    )));
                }
                // The captured length is what the block holds, up to the interface's snapshot
                // length (pcapng, Simple Packet Block).
                let orig = order.u32(&body, 0);
                let snap = interfaces.first().map_or(0, |i| i.snaplen);
                let room = (body.len() - 4) as u32;
                let incl = if snap > 0 { orig.min(snap).min(room) } else { orig.min(room) };
                (0, None, incl, orig, 4)
            }
        };
        let Some(ifc) = interfaces.get(iface as usize).copied() else {
            return Err(Stop::Damaged(format!(
                "packet on interface {iface}, which was never described"
            )));
        };
        let end = start + incl as usize;
        if end > body.len() {
            let n = body.len();
            return Err(Stop::Damaged(format!("packet of {incl} bytes in a block of {n}")));
        }
        // The block's own buffer becomes the packet's: cut to the data, no second copy.
        let mut data = body;
        data.truncate(end);
        data.drain(..start);
        if ifc.snaplen > 0 && incl > ifc.snaplen {
            data.truncate(ifc.snaplen as usize);
        }
        let ts_ns = ts_raw.map_or(0, |t| {
            let ns = scale_ts(t, ifc.tsresol);
            ns.saturating_add_signed(ifc.tsoffset.saturating_mul(1_000_000_000))
        });
        Ok(RawPacket {
            ts_ns,
            linktype: ifc.linktype,
            link: LinkType::from_linktype(ifc.linktype),
            wire_len: orig.max(incl),
            data,
        })
    }
}

/// The options of a pcapng block as (code, value): up to `opt_endofopt`, or to the end of the
/// block when a writer left the marker out, or up to an option that overruns the block.
fn options(order: Order, mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let (code, len) = (order.u16(b, 0), usize::from(order.u16(b, 2)));
        if code == 0 {
            return None;
        }
        let value = b.get(4..4 + len)?;
        b = b.get(4 + ((len + 3) & !3)..).unwrap_or(&[]);
        Some((code, value))
    })
}

/// Converts a pcapng timestamp in `if_tsresol` units to nanoseconds (pcapng, `if_tsresol`:
/// MSB clear is 10^-v seconds, MSB set is 2^-v).
fn scale_ts(raw: u64, resol: u8) -> u64 {
    if resol & 0x80 == 0 {
        let v = u32::from(resol);
        if v <= 9 {
            raw.saturating_mul(10u64.pow(9 - v))
        } else {
            raw / 10u64.saturating_pow(v - 9)
        }
    } else {
        let v = u32::from(resol & 0x7f);
        ((u128::from(raw) * 1_000_000_000u128) >> v.min(127)) as u64
    }
}

/// Reads until `buf` is full or the file ends; bytes read.
fn read_up_to(f: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Skips `n` bytes; an early end is an `UnexpectedEof`.
fn skip(f: &mut impl Read, n: u64) -> std::io::Result<()> {
    let got = std::io::copy(&mut f.take(n), &mut std::io::sink())?;
    if got < n {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Packets of a capture with the link type of each.
pub type Packets = Vec<(Option<LinkType>, Pkt)>;

/// Reads a whole capture into memory (tests and small captures; replay streams).
pub fn read_all(path: &Path) -> Result<(Packets, CaptureReader), CaptureError> {
    let mut r = CaptureReader::open(path)?;
    let mut v = Vec::new();
    while let Some(p) = r.next_packet() {
        v.push((p.link, p.into_pkt()));
    }
    Ok((v, r))
}

/// Writes a pcap with nanosecond timestamps.
pub struct CaptureWriter {
    w: BufWriter<File>,
    path: PathBuf,
}

impl CaptureWriter {
    /// Creates `path` for Ethernet frames.
    pub fn create(path: &Path) -> Result<Self, CaptureError> {
        Self::create_with(path, LinkType::Ethernet, 262_144)
    }

    /// Creates `path` for frames of `link`, with snapshot length `snaplen`.
    pub fn create_with(path: &Path, link: LinkType, snaplen: u32) -> Result<Self, CaptureError> {
        let err = |source| CaptureError::Write { path: path.to_owned(), source };
        let mut w = BufWriter::new(File::create(path).map_err(err)?);
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&[0; 8]);
        h.extend_from_slice(&snaplen.to_le_bytes());
        h.extend_from_slice(&link.linktype().to_le_bytes());
        w.write_all(&h).map_err(err)?;
        Ok(CaptureWriter { w, path: path.to_owned() })
    }

    /// Appends one whole frame.
    pub fn write(&mut self, ts_ns: u64, data: &[u8]) -> Result<(), CaptureError> {
        self.write_cut(ts_ns, data, data.len() as u32)
    }

    /// Appends the captured part `data` of a frame that was `wire_len` bytes on the wire.
    pub fn write_cut(
        &mut self,
        ts_ns: u64,
        data: &[u8],
        wire_len: u32,
    ) -> Result<(), CaptureError> {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&((ts_ns / 1_000_000_000) as u32).to_le_bytes());
        h[4..8].copy_from_slice(&((ts_ns % 1_000_000_000) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
        h[12..16].copy_from_slice(&wire_len.max(data.len() as u32).to_le_bytes());
        let err = |source| CaptureError::Write { path: self.path.clone(), source };
        self.w.write_all(&h).map_err(err)?;
        self.w.write_all(data).map_err(err)
    }

    /// Flushes to disk.
    pub fn finish(mut self) -> Result<(), CaptureError> {
        let path = self.path.clone();
        self.w.flush().map_err(|source| CaptureError::Write { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ts_resolution() {
        assert_eq!(scale_ts(5, 6), 5_000);
        assert_eq!(scale_ts(5, 9), 5);
        assert_eq!(scale_ts(1 << 10, 0x8a), 1_000_000_000);
    }

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "tm-cap-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn roundtrip_and_errors() {
        let dir = dir();
        let p = dir.join("a.pcap");
        let mut w = CaptureWriter::create(&p).unwrap();
        w.write(1_700_000_000_123_456_789, &[1, 2, 3]).unwrap();
        w.write_cut(1_700_000_000_123_456_790, &[4; 60], 1500).unwrap();
        w.finish().unwrap();
        let (pk, r) = read_all(&p).unwrap();
        assert_eq!(pk.len(), 2);
        assert_eq!(pk[0].1.ts_ns, 1_700_000_000_123_456_789);
        assert_eq!(pk[1].1.data, vec![4; 60]);
        assert_eq!((pk[0].1.wire_len, pk[1].1.wire_len), (3, 1500));
        assert!(r.damage.is_none());
        assert_eq!(r.cut, 1);

        // Cut the file in the middle of the second record: the first packet kept, and where
        // reading stopped said.
        let bytes = std::fs::read(&p).unwrap();
        let cut = dir.join("cut.pcap");
        std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
        let (pk, r) = read_all(&cut).unwrap();
        assert_eq!(pk.len(), 1);
        assert_eq!(r.damage.as_ref().map(|d| d.offset), Some(24 + 16 + 3));

        let junk = dir.join("junk.txt");
        std::fs::write(&junk, b"hello world").unwrap();
        let e = read_all(&junk).err().unwrap().to_string();
        assert!(e.contains("not a pcap"), "{e}");
        assert!(read_all(&dir.join("missing.pcap")).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A record longer than the snapshot length is cut to it (as libpcap does), not refused.
    #[test]
    fn records_longer_than_the_snapshot_are_cut() {
        let dir = dir();
        let p = dir.join("snap.pcap");
        let mut w = CaptureWriter::create_with(&p, LinkType::RawIp, 8).unwrap();
        w.write(1, &[0x45; 20]).unwrap();
        w.write(2, &[0x45; 4]).unwrap();
        w.finish().unwrap();
        let (pk, r) = read_all(&p).unwrap();
        assert!(r.damage.is_none());
        assert_eq!(
            pk.iter().map(|(_, p)| (p.data.len(), p.wire_len)).collect::<Vec<_>>(),
            [(8, 20), (4, 4)]
        );
        assert_eq!(pk[0].0, Some(LinkType::RawIp));
        std::fs::remove_dir_all(&dir).ok();
    }

    fn block(kind: u32, body: &[u8]) -> Vec<u8> {
        let len = (12 + body.len()) as u32;
        let mut b = kind.to_le_bytes().to_vec();
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(body);
        b.extend_from_slice(&len.to_le_bytes());
        b
    }

    /// pcapng with an interface whose options lack the end-of-options marker, a nanosecond
    /// resolution and an offset, an enhanced packet cut by the snapshot length, an unknown
    /// block, and a simple packet.
    #[test]
    fn pcapng_blocks_and_lenient_options() {
        let mut f = Vec::new();
        let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
        shb.extend_from_slice(&[1, 0, 0, 0]);
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        f.extend(block(0x0a0d_0d0a, &shb));
        let mut idb = vec![1, 0, 0, 0];
        idb.extend_from_slice(&64u32.to_le_bytes());
        idb.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0]); // if_tsresol = 9
        idb.extend_from_slice(&[14, 0, 8, 0]); // if_tsoffset = 10 s, and no opt_endofopt
        idb.extend_from_slice(&10u64.to_le_bytes());
        f.extend(block(1, &idb));
        let mut epb = 0u32.to_le_bytes().to_vec();
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&500u32.to_le_bytes());
        epb.extend_from_slice(&6u32.to_le_bytes());
        epb.extend_from_slice(&1514u32.to_le_bytes());
        epb.extend_from_slice(&[7, 7, 7, 7, 7, 7, 0, 0]);
        f.extend(block(6, &epb));
        f.extend(block(0x0bad, &[1, 2, 3, 4]));
        let mut spb = 3u32.to_le_bytes().to_vec();
        spb.extend_from_slice(&[5, 5, 5, 0]);
        f.extend(block(3, &spb));
        let dir = dir();
        let p = dir.join("a.pcapng");
        std::fs::write(&p, &f).unwrap();
        let (pk, r) = read_all(&p).unwrap();
        assert!(r.damage.is_none(), "{:?}", r.damage);
        assert_eq!(pk.len(), 2);
        assert_eq!(
            (pk[0].1.ts_ns, pk[0].1.data.len(), pk[0].1.wire_len),
            (10_000_000_500, 6, 1514)
        );
        assert_eq!((pk[1].1.data.clone(), pk[1].1.wire_len), (vec![5, 5, 5], 3));
        // A packet on an interface never described is damage, with its offset.
        let mut g = f.clone();
        let mut bad = epb.clone();
        bad[0] = 3;
        g.extend(block(6, &bad));
        std::fs::write(&p, &g).unwrap();
        let (pk, r) = read_all(&p).unwrap();
        assert_eq!(pk.len(), 2);
        let d = r.damage.unwrap();
        assert_eq!(d.offset, f.len() as u64);
        assert!(d.reason.contains("interface 3"), "{d}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
