//! Capture files: pcap (µs and ns) and pcapng in, pcap (ns) out.
//!
//! The `pcap-file` crate does the container parsing. On top of it this module maps link types,
//! fixes pcapng timestamps to the interface's `if_tsresol` (pcap-file 2.0 hands the raw
//! timestamp units back as nanoseconds), and turns a truncated or corrupt file tail into a
//! counted stop instead of an error that loses what was read.

use crate::Pkt;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, TsResolution};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;
use telemark_wire::flow::LinkType;

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
        /// What the parser said.
        reason: String,
    },
    /// Writing failed.
    #[error("{path}: cannot write capture: {reason}")]
    Write {
        /// File.
        path: PathBuf,
        /// Cause.
        reason: String,
    },
}

/// A packet as read from a capture.
#[derive(Debug, Clone)]
pub struct RawPacket {
    /// Timestamp, ns since the epoch.
    pub ts_ns: u64,
    /// Link type of the interface it was captured on; `None` if Telemark cannot read it.
    pub link: Option<LinkType>,
    /// Captured bytes.
    pub data: Vec<u8>,
}

fn link_of(dl: DataLink) -> Option<LinkType> {
    match dl {
        DataLink::ETHERNET => Some(LinkType::Ethernet),
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => Some(LinkType::RawIp),
        DataLink::LINUX_SLL => Some(LinkType::LinuxSll),
        _ => match u32::from(dl) {
            // LINKTYPE_RAW as written by some BSDs (DLT 12 / 14).
            12 | 14 => Some(LinkType::RawIp),
            _ => None,
        },
    }
}

enum Inner {
    Pcap(PcapReader<BufReader<File>>, Option<LinkType>),
    PcapNg(Box<PcapNgReader<BufReader<File>>>),
}

/// Reads pcap or pcapng, whichever the file is.
pub struct CaptureReader {
    inner: Inner,
    path: PathBuf,
    /// Set when the file ended in a damaged record; reading stopped there.
    pub damaged_tail: Option<String>,
    /// Packets on interfaces with a link type Telemark does not read.
    pub unknown_link: u64,
}

impl CaptureReader {
    /// Opens `path`, sniffing the format from its magic number.
    pub fn open(path: &Path) -> Result<Self, CaptureError> {
        let io = |source| CaptureError::Io { path: path.to_owned(), source };
        let mut f = File::open(path).map_err(io)?;
        let mut magic = [0u8; 4];
        let got = read_up_to(&mut f, &mut magic).map_err(io)?;
        let f = File::open(path).map_err(io)?;
        let bad = |e: pcap_file::PcapError| CaptureError::BadHeader {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        let inner = match magic {
            [0xd4, 0xc3, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0xc3, 0xd4]
            | [0x4d, 0x3c, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0x3c, 0x4d] => {
                let r = PcapReader::new(BufReader::new(f)).map_err(bad)?;
                let link = link_of(r.header().datalink);
                Inner::Pcap(r, link)
            }
            [0x0a, 0x0d, 0x0d, 0x0a] => {
                Inner::PcapNg(Box::new(PcapNgReader::new(BufReader::new(f)).map_err(bad)?))
            }
            _ => {
                let magic =
                    magic[..got].iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
                let magic = if magic.is_empty() { "nothing: empty file".into() } else { magic };
                return Err(CaptureError::NotCapture { path: path.to_owned(), magic });
            }
        };
        Ok(CaptureReader { inner, path: path.to_owned(), damaged_tail: None, unknown_link: 0 })
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next packet, or `None` at the end (or at a damaged tail, see `damaged_tail`).
    pub fn next_packet(&mut self) -> Option<RawPacket> {
        if self.damaged_tail.is_some() {
            return None;
        }
        match &mut self.inner {
            Inner::Pcap(r, link) => match r.next_packet()? {
                Ok(p) => Some(RawPacket {
                    ts_ns: p.timestamp.as_nanos() as u64,
                    link: *link,
                    data: p.data.into_owned(),
                }),
                Err(e) => {
                    self.damaged_tail = Some(e.to_string());
                    None
                }
            },
            Inner::PcapNg(r) => loop {
                let block = match r.next_block()? {
                    Ok(b) => b,
                    Err(e) => {
                        self.damaged_tail = Some(e.to_string());
                        return None;
                    }
                };
                let (iface, raw_ts, data) = match block {
                    Block::EnhancedPacket(p) => {
                        (Some(p.interface_id), p.timestamp.as_nanos() as u64, p.data.into_owned())
                    }
                    Block::SimplePacket(p) => (Some(0), 0, p.data.into_owned()),
                    Block::Packet(p) => {
                        (Some(u32::from(p.interface_id)), p.timestamp, p.data.into_owned())
                    }
                    _ => continue,
                };
                let idb = iface.and_then(|i| r.interfaces().get(i as usize));
                let link = idb.and_then(|d| link_of(d.linktype));
                let resol = idb
                    .and_then(|d| {
                        d.options.iter().find_map(|o| match o {
                            InterfaceDescriptionOption::IfTsResol(v) => Some(*v),
                            _ => None,
                        })
                    })
                    .unwrap_or(6);
                return Some(RawPacket { ts_ns: scale_ts(raw_ts, resol), link, data });
            },
        }
    }
}

/// Converts a pcapng timestamp in `if_tsresol` units to nanoseconds (pcapng,
/// draft-ietf-opsawg-pcapng, if_tsresol option: MSB clear is 10^-v seconds, MSB set is 2^-v).
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

fn read_up_to(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Packets of a capture with the link type of each.
pub type Packets = Vec<(Option<LinkType>, Pkt)>;

/// Reads a whole capture into packets (for replay and tests).
pub fn read_all(path: &Path) -> Result<(Packets, CaptureReader), CaptureError> {
    let mut r = CaptureReader::open(path)?;
    let mut v = Vec::new();
    while let Some(p) = r.next_packet() {
        let seq = v.len() as u64;
        v.push((p.link, Pkt { ts_ns: p.ts_ns, data: p.data, seq, batch: None }));
    }
    Ok((v, r))
}

/// Writes an Ethernet pcap with nanosecond timestamps.
pub struct CaptureWriter {
    w: PcapWriter<BufWriter<File>>,
    path: PathBuf,
}

impl CaptureWriter {
    /// Creates `path`.
    pub fn create(path: &Path) -> Result<Self, CaptureError> {
        let f = File::create(path)
            .map_err(|source| CaptureError::Io { path: path.to_owned(), source })?;
        let header = PcapHeader {
            ts_resolution: TsResolution::NanoSecond,
            datalink: DataLink::ETHERNET,
            ..Default::default()
        };
        let w = PcapWriter::with_header(BufWriter::new(f), header)
            .map_err(|e| CaptureError::Write { path: path.to_owned(), reason: e.to_string() })?;
        Ok(CaptureWriter { w, path: path.to_owned() })
    }

    /// Appends one frame.
    pub fn write(&mut self, ts_ns: u64, data: &[u8]) -> Result<(), CaptureError> {
        let p = PcapPacket::new(Duration::from_nanos(ts_ns), data.len() as u32, data);
        self.w
            .write_packet(&p)
            .map_err(|e| CaptureError::Write { path: self.path.clone(), reason: e.to_string() })?;
        Ok(())
    }

    /// Flushes to disk.
    pub fn finish(self) -> Result<(), CaptureError> {
        let path = self.path;
        self.w
            .into_writer()
            .flush()
            .map_err(|e| CaptureError::Write { path, reason: e.to_string() })
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

    #[test]
    fn roundtrip_and_errors() {
        let dir = std::env::temp_dir().join(format!("tm-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.pcap");
        let mut w = CaptureWriter::create(&p).unwrap();
        w.write(1_700_000_000_123_456_789, &[1, 2, 3]).unwrap();
        w.write(1_700_000_000_123_456_790, &[4; 60]).unwrap();
        w.finish().unwrap();
        let (pk, r) = read_all(&p).unwrap();
        assert_eq!(pk.len(), 2);
        assert_eq!(pk[0].1.ts_ns, 1_700_000_000_123_456_789);
        assert_eq!(pk[1].1.data, vec![4; 60]);
        assert!(r.damaged_tail.is_none());

        // cut the file in the middle of the second record: first packet kept, tail counted
        let bytes = std::fs::read(&p).unwrap();
        let cut = dir.join("cut.pcap");
        std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
        let (pk, r) = read_all(&cut).unwrap();
        assert_eq!(pk.len(), 1);
        assert!(r.damaged_tail.is_some());

        let junk = dir.join("junk.txt");
        std::fs::write(&junk, b"hello world").unwrap();
        let e = read_all(&junk).err().unwrap().to_string();
        assert!(e.contains("not a pcap"), "{e}");
        assert!(read_all(&dir.join("missing.pcap")).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
