//! The link layers captures and ports deliver, and where the network layer starts in each.
//!
//! Capture files name their link layer with a LINKTYPE number (tcpdump.org "Link-layer header
//! types"); [`LinkType::from_linktype`] maps the numbers Telemark reads, and [`network_start`]
//! finds the first network-layer header behind each: an EtherType to follow, or raw IP.
//!
//! - Ethernet (1): 14-byte Ethernet II header.
//! - Raw IP (101, 228 IPv4, 229 IPv6, and 12/14 as some BSDs wrote LINKTYPE_RAW): no header.
//! - Linux cooked capture v1 (113, `tcpdump -i any` before libpcap 1.10): 16 bytes, the
//!   protocol (an EtherType) in the last two.
//! - Linux cooked capture v2 (276, `tcpdump -i any` since libpcap 1.10): 20 bytes, the
//!   protocol first.
//! - NULL (0, BSD and macOS loopback): a 4-byte address family in the byte order of the host
//!   that captured; LOOP (108, OpenBSD): the same in network byte order.
//! - NFLOG (239, Linux netfilter log): a 4-byte header, then type-length-value records in the
//!   host's byte order; record type 9 (NFULA_PAYLOAD) holds the IP packet.
//! - PPP (9, and 50 in HDLC framing): address and control bytes when present (0xff 0x03),
//!   then a PPP protocol number (RFC 1661; 0x0021 IPv4, 0x0057 IPv6, RFC 1332 and 5072).
//! - Cisco HDLC (104): address, control, then an EtherType.

use crate::ethernet::EtherType;

/// The link layer a capture or port delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    /// Ethernet II frames (LINKTYPE_ETHERNET).
    Ethernet,
    /// Bare IPv4 or IPv6 packets (LINKTYPE_RAW, IPV4, IPV6).
    RawIp,
    /// Linux cooked capture v1 (LINKTYPE_LINUX_SLL).
    LinuxSll,
    /// Linux cooked capture v2 (LINKTYPE_LINUX_SLL2).
    LinuxSll2,
    /// BSD loopback, address family in the capturing host's byte order (LINKTYPE_NULL).
    Null,
    /// OpenBSD loopback, address family in network byte order (LINKTYPE_LOOP).
    Loop,
    /// Linux netfilter log messages (LINKTYPE_NFLOG).
    Nflog,
    /// PPP, with or without HDLC framing (LINKTYPE_PPP, PPP_HDLC).
    Ppp,
    /// Cisco HDLC (LINKTYPE_C_HDLC).
    CiscoHdlc,
}

/// The LINKTYPE numbers Telemark reads, with their names (for messages).
pub const READABLE: &str = "Ethernet (1), raw IP (101, 228, 229), Linux cooked v1 (113) and \
                            v2 (276), NULL/loopback (0, 108), NFLOG (239), PPP (9, 50), Cisco \
                            HDLC (104)";

impl LinkType {
    /// The link type a capture's LINKTYPE number names, if Telemark reads it.
    pub const fn from_linktype(n: u32) -> Option<LinkType> {
        Some(match n {
            1 => LinkType::Ethernet,
            // LINKTYPE_RAW, and DLT_RAW's values on some BSDs written as the link type.
            101 | 12 | 14 | 228 | 229 => LinkType::RawIp,
            113 => LinkType::LinuxSll,
            276 => LinkType::LinuxSll2,
            0 => LinkType::Null,
            108 => LinkType::Loop,
            239 => LinkType::Nflog,
            9 | 50 => LinkType::Ppp,
            104 => LinkType::CiscoHdlc,
            _ => return None,
        })
    }

    /// The LINKTYPE number written for this link type.
    pub const fn linktype(self) -> u32 {
        match self {
            LinkType::Ethernet => 1,
            LinkType::RawIp => 101,
            LinkType::LinuxSll => 113,
            LinkType::LinuxSll2 => 276,
            LinkType::Null => 0,
            LinkType::Loop => 108,
            LinkType::Nflog => 239,
            LinkType::Ppp => 9,
            LinkType::CiscoHdlc => 104,
        }
    }
}

/// A common name of a LINKTYPE number, for messages ("LINKTYPE 127" when not known here).
pub fn linktype_name(n: u32) -> String {
    let name = match n {
        0 => "NULL/loopback",
        1 => "Ethernet",
        8 => "SLIP",
        9 => "PPP",
        50 => "PPP in HDLC framing",
        104 => "Cisco HDLC",
        107 => "Frame Relay",
        108 => "OpenBSD loopback",
        101 => "raw IP",
        105 => "IEEE 802.11",
        113 => "Linux cooked v1",
        127 => "IEEE 802.11 radiotap",
        147..=162 => "user-defined (DLT_USER)",
        192 => "PPI",
        195 => "IEEE 802.15.4",
        220 => "USB Linux mmapped",
        239 => "NFLOG",
        276 => "Linux cooked v2",
        _ => "",
    };
    if name.is_empty() {
        format!("LINKTYPE {n}")
    } else {
        format!("{name} (LINKTYPE {n})")
    }
}

/// Where the network layer begins in a frame of link type `link`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkStart {
    /// An Ethernet header at offset 0.
    Ethernet,
    /// The payload at `offset` is of this EtherType.
    EtherType(EtherType, usize),
    /// An IP packet (version in its first nibble) at `offset`.
    Ip(usize),
    /// The frame carries no network-layer packet (an NFLOG message without payload, an
    /// address family other than IP).
    None,
}

/// Why [`network_start`] could not read a link-layer header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkError {
    /// The frame ends inside the link-layer header.
    Truncated,
    /// A length in the header makes no sense.
    Malformed,
}

/// Finds the network layer behind the link-layer header of `frame`.
pub fn network_start(frame: &[u8], link: LinkType) -> Result<NetworkStart, LinkError> {
    let be16 = |at: usize| {
        frame.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]])).ok_or(LinkError::Truncated)
    };
    Ok(match link {
        LinkType::Ethernet => NetworkStart::Ethernet,
        LinkType::RawIp => NetworkStart::Ip(0),
        LinkType::LinuxSll => NetworkStart::EtherType(EtherType::from(be16(14)?), 16),
        LinkType::LinuxSll2 => {
            if frame.len() < 20 {
                return Err(LinkError::Truncated);
            }
            NetworkStart::EtherType(EtherType::from(be16(0)?), 20)
        }
        LinkType::Null | LinkType::Loop => {
            let b = frame.get(0..4).ok_or(LinkError::Truncated)?;
            let (be, le) = (
                u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            );
            // NULL is in the capturing host's byte order, unknown here: an address family is
            // small, so the reading under 256 is the right one.
            let family = if link == LinkType::Loop || be < 256 { be } else { le };
            match family {
                // AF_INET everywhere; AF_INET6 on Linux, the BSDs, FreeBSD and macOS.
                2 | 10 | 24 | 28 | 30 => NetworkStart::Ip(4),
                _ => NetworkStart::None,
            }
        }
        LinkType::Nflog => nflog_payload(frame)?,
        LinkType::Ppp => {
            let off = if frame.first() == Some(&0xff) { 2 } else { 0 };
            // The protocol field may be compressed to one byte (odd values, RFC 1661 §6.5).
            let first = *frame.get(off).ok_or(LinkError::Truncated)?;
            let (proto, len) = if first & 1 == 1 { (u16::from(first), 1) } else { (be16(off)?, 2) };
            match proto {
                0x0021 | 0x0057 => NetworkStart::Ip(off + len),
                _ => NetworkStart::None,
            }
        }
        LinkType::CiscoHdlc => NetworkStart::EtherType(EtherType::from(be16(2)?), 4),
    })
}

/// The NFULA_PAYLOAD record of an NFLOG message (tcpdump.org LINKTYPE_NFLOG).
fn nflog_payload(frame: &[u8]) -> Result<NetworkStart, LinkError> {
    const HEADER: usize = 4;
    const TLV_HEADER: usize = 4;
    const NFULA_PAYLOAD: u16 = 9;
    if frame.len() < HEADER {
        return Err(LinkError::Truncated);
    }
    // The records' lengths and types are in the capturing host's byte order: try
    // little-endian (nearly every Linux host), then big-endian, and keep the one whose
    // records tile the message.
    for little in [true, false] {
        let rd = |b: &[u8]| {
            if little {
                u16::from_le_bytes([b[0], b[1]])
            } else {
                u16::from_be_bytes([b[0], b[1]])
            }
        };
        let mut off = HEADER;
        let mut found = None;
        let mut tiles = true;
        while off < frame.len() {
            let Some(h) = frame.get(off..off + TLV_HEADER) else {
                tiles = false;
                break;
            };
            let len = usize::from(rd(&h[0..2]));
            let ty = rd(&h[2..4]) & 0x7fff;
            if len < TLV_HEADER || off + len > frame.len() {
                // A payload record cut by the snapshot length still carries its header.
                if ty == NFULA_PAYLOAD && len >= TLV_HEADER && found.is_none() {
                    found = Some(off + TLV_HEADER);
                    break;
                }
                tiles = false;
                break;
            }
            if ty == NFULA_PAYLOAD && found.is_none() {
                found = Some(off + TLV_HEADER);
            }
            // Records are padded to 4 bytes.
            off += (len + 3) & !3;
        }
        if let (true, Some(at)) = (tiles || found.is_some(), found) {
            return Ok(NetworkStart::Ip(at));
        }
        if tiles {
            return Ok(NetworkStart::None);
        }
    }
    Err(LinkError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip() {
        for l in [
            LinkType::Ethernet,
            LinkType::RawIp,
            LinkType::LinuxSll,
            LinkType::LinuxSll2,
            LinkType::Null,
            LinkType::Loop,
            LinkType::Nflog,
            LinkType::Ppp,
            LinkType::CiscoHdlc,
        ] {
            assert_eq!(LinkType::from_linktype(l.linktype()), Some(l));
        }
        assert_eq!(LinkType::from_linktype(127), None);
        assert_eq!(linktype_name(127), "IEEE 802.11 radiotap (LINKTYPE 127)");
        assert_eq!(linktype_name(4000), "LINKTYPE 4000");
    }

    #[test]
    fn cooked_headers() {
        // SLL v1: packet type, ARPHRD, address length, 8 address bytes, protocol 0x0800.
        let mut sll = vec![0, 0, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0, 0x08, 0x00];
        sll.extend_from_slice(&[0x45; 20]);
        assert_eq!(
            network_start(&sll, LinkType::LinuxSll),
            Ok(NetworkStart::EtherType(EtherType::Ipv4, 16))
        );
        // SLL v2: protocol 0x86dd first.
        let mut sll2 = vec![0x86, 0xdd, 0, 0, 0, 0, 0, 2, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0];
        sll2.push(0x60);
        assert_eq!(
            network_start(&sll2, LinkType::LinuxSll2),
            Ok(NetworkStart::EtherType(EtherType::Ipv6, 20))
        );
        assert_eq!(network_start(&sll2[..10], LinkType::LinuxSll2), Err(LinkError::Truncated));
    }

    #[test]
    fn ppp_and_cisco_hdlc() {
        assert_eq!(
            network_start(&[0xff, 0x03, 0x00, 0x21, 0x45], LinkType::Ppp),
            Ok(NetworkStart::Ip(4))
        );
        assert_eq!(network_start(&[0x00, 0x57, 0x60], LinkType::Ppp), Ok(NetworkStart::Ip(2)));
        assert_eq!(network_start(&[0x21, 0x45], LinkType::Ppp), Ok(NetworkStart::Ip(1)));
        assert_eq!(network_start(&[0xc0, 0x21, 1], LinkType::Ppp), Ok(NetworkStart::None));
        assert_eq!(
            network_start(&[0x0f, 0x00, 0x08, 0x00, 0x45], LinkType::CiscoHdlc),
            Ok(NetworkStart::EtherType(EtherType::Ipv4, 4))
        );
    }

    #[test]
    fn loopback_families_in_either_byte_order() {
        assert_eq!(network_start(&[2, 0, 0, 0, 0x45], LinkType::Null), Ok(NetworkStart::Ip(4)));
        assert_eq!(network_start(&[0, 0, 0, 30, 0x60], LinkType::Null), Ok(NetworkStart::Ip(4)));
        assert_eq!(network_start(&[0, 0, 0, 24, 0x60], LinkType::Loop), Ok(NetworkStart::Ip(4)));
        assert_eq!(network_start(&[7, 0, 0, 0], LinkType::Null), Ok(NetworkStart::None));
        assert_eq!(network_start(&[2, 0], LinkType::Null), Err(LinkError::Truncated));
    }

    #[test]
    fn nflog_finds_the_payload_record() {
        // Header (AF_INET, version 0, group 5), a prefix record "ab\0" padded to 8, then the
        // payload record holding 4 bytes of IP.
        let mut m = vec![2, 0, 0, 5];
        m.extend_from_slice(&[7, 0, 10, 0, b'a', b'b', 0, 0]);
        m.extend_from_slice(&[8, 0, 9, 0, 0x45, 0, 0, 20]);
        assert_eq!(network_start(&m, LinkType::Nflog), Ok(NetworkStart::Ip(16)));
        // The same in big-endian.
        let mut b = vec![2, 0, 0, 5];
        b.extend_from_slice(&[0, 7, 0, 10, b'a', b'b', 0, 0]);
        b.extend_from_slice(&[0, 8, 0, 9, 0x45, 0, 0, 20]);
        assert_eq!(network_start(&b, LinkType::Nflog), Ok(NetworkStart::Ip(16)));
        // Cut inside the payload record (snaplen): its start is still found.
        assert_eq!(network_start(&m[..18], LinkType::Nflog), Ok(NetworkStart::Ip(16)));
        // No payload record.
        assert_eq!(network_start(&m[..12], LinkType::Nflog), Ok(NetworkStart::None));
    }
}
