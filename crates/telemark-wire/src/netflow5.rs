//! NetFlow v5 export packets: a 24-byte header and up to 30 fixed 48-byte flow records.
//!
//! Reference: Cisco, *NetFlow Export Datagram Format*, "Version 5 Header Format" and "Version 5
//! Flow Record Format" (the format has no RFC; RFC 3954 §1 describes it as v9's predecessor).
//!
//! ```text
//! header: version=5 | count | sysUptime | unix_secs | unix_nsecs | flow_sequence
//!         | engine_type | engine_id | sampling (2 bits mode, 14 bits interval)
//! record: srcaddr dstaddr nexthop | input output | dPkts dOctets | First Last
//!         | srcport dstport | pad tcp_flags prot tos | src_as dst_as | src_mask dst_mask | pad
//! ```

use crate::{Error, Result};
use std::net::Ipv4Addr;

/// The version number.
pub const VERSION: u16 = 5;
/// Header length.
pub const HEADER_LEN: usize = 24;
/// Flow record length.
pub const RECORD_LEN: usize = 48;
/// Most records in one packet.
pub const MAX_RECORDS: usize = 30;

const LAYER: &str = "netflow5";

/// The packet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Records in the packet.
    pub count: u16,
    /// Milliseconds since the exporter booted.
    pub sys_uptime_ms: u32,
    /// Export time: seconds and nanoseconds since the Unix epoch.
    pub unix_secs: u32,
    /// Nanoseconds part of the export time.
    pub unix_nsecs: u32,
    /// Flows exported before this packet.
    pub flow_sequence: u32,
    /// Type of the flow-switching engine.
    pub engine_type: u8,
    /// Slot of the flow-switching engine.
    pub engine_id: u8,
    /// Sampling mode (the top 2 bits of the sampling field).
    pub sampling_mode: u8,
    /// Sampling interval (its low 14 bits): 1 in N packets; 0 unsampled.
    pub sampling_interval: u16,
}

/// One flow record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Next hop.
    pub next_hop: Ipv4Addr,
    /// Input interface (SNMP index).
    pub input: u16,
    /// Output interface.
    pub output: u16,
    /// Packets.
    pub packets: u32,
    /// Layer-3 bytes.
    pub octets: u32,
    /// sysUptime at the flow's first packet, ms.
    pub first_ms: u32,
    /// sysUptime at its last packet, ms.
    pub last_ms: u32,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// TCP flags seen (OR).
    pub tcp_flags: u8,
    /// IP protocol.
    pub proto: u8,
    /// IP type of service.
    pub tos: u8,
    /// Source AS.
    pub src_as: u16,
    /// Destination AS.
    pub dst_as: u16,
    /// Source prefix length.
    pub src_mask: u8,
    /// Destination prefix length.
    pub dst_mask: u8,
}

/// Reads a packet: its header and records. The packet must hold exactly the records its
/// count says (at most 30); trailing bytes beyond them are tolerated.
pub fn parse(buf: &[u8]) -> Result<(Header, Vec<Record>)> {
    Error::check_len(LAYER, HEADER_LEN, buf.len())?;
    if be16(buf, 0) != VERSION {
        return Err(Error::Malformed { layer: LAYER, field: "version" });
    }
    let count = be16(buf, 2);
    let n = usize::from(count);
    if n == 0 || n > MAX_RECORDS {
        return Err(Error::BadLength { layer: LAYER, field: "count", value: n });
    }
    let need = HEADER_LEN + n * RECORD_LEN;
    Error::check_len(LAYER, need, buf.len())?;
    let sampling = be16(buf, 22);
    let header = Header {
        count,
        sys_uptime_ms: be32(buf, 4),
        unix_secs: be32(buf, 8),
        unix_nsecs: be32(buf, 12),
        flow_sequence: be32(buf, 16),
        engine_type: buf[20],
        engine_id: buf[21],
        sampling_mode: (sampling >> 14) as u8,
        sampling_interval: sampling & 0x3fff,
    };
    let records = buf[HEADER_LEN..need]
        .chunks_exact(RECORD_LEN)
        .map(|r| Record {
            src: Ipv4Addr::from(be32(r, 0)),
            dst: Ipv4Addr::from(be32(r, 4)),
            next_hop: Ipv4Addr::from(be32(r, 8)),
            input: be16(r, 12),
            output: be16(r, 14),
            packets: be32(r, 16),
            octets: be32(r, 20),
            first_ms: be32(r, 24),
            last_ms: be32(r, 28),
            sport: be16(r, 32),
            dport: be16(r, 34),
            tcp_flags: r[37],
            proto: r[38],
            tos: r[39],
            src_as: be16(r, 40),
            dst_as: be16(r, 42),
            src_mask: r[44],
            dst_mask: r[45],
        })
        .collect();
    Ok((header, records))
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
