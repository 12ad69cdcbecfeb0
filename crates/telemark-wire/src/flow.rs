//! Flow keys: walk a frame through VLAN tags and tunnels to the innermost IP header.
//!
//! The key is the innermost 5-tuple, so a VXLAN, Geneve, GRE/ERSPAN, IP-in-IP or MPLS-over-UDP
//! packet is keyed by the tenant flow it carries, plus the NSH service path (SPI) and service
//! index (SI) when an NSH is on the way (SFCMon's NSH-aware keys). The color bit is read from and
//! written to the DSCP of that same innermost IP header, the one the tenant flow owns.
//!
//! If a tunnel's payload cannot be read (cut by snaplen, an unknown inner protocol), the key
//! falls back to the tunnel's own 5-tuple rather than losing the packet.

use crate::ethernet::{self, EtherType};
use crate::ipv4::{self, Protocol};
use crate::link::{self, LinkError, NetworkStart};
use crate::{geneve, gre, ipv6, nsh, tcp, udp, vlan, vxlan, Error};
use core::fmt;
use core::net::{IpAddr, Ipv4Addr};

/// UDP port of MPLS over UDP (RFC 7510).
pub const MPLS_UDP_PORT: u16 = 6635;
/// How many VLAN tags and tunnel layers are walked before giving up.
pub const MAX_DEPTH: usize = 8;

/// A flow: the 5-tuple plus the NSH service path when present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port (0 when the protocol has none).
    pub sport: u16,
    /// Destination port (0 when the protocol has none).
    pub dport: u16,
    /// IP protocol number.
    pub proto: u8,
    /// NSH service path identifier.
    pub spi: Option<u32>,
    /// NSH service index.
    pub si: Option<u8>,
}

impl Default for FlowKey {
    fn default() -> Self {
        FlowKey {
            src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            sport: 0,
            dport: 0,
            proto: 0,
            spi: None,
            si: None,
        }
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.proto {
            6 => "tcp".to_string(),
            17 => "udp".to_string(),
            1 => "icmp".to_string(),
            58 => "icmp6".to_string(),
            p => format!("proto{p}"),
        };
        let ep = |a: IpAddr, p: u16| match a {
            IpAddr::V4(a) => format!("{a}:{p}"),
            IpAddr::V6(a) => format!("[{a}]:{p}"),
        };
        write!(f, "{name} {} > {}", ep(self.src, self.sport), ep(self.dst, self.dport))?;
        if let (Some(spi), Some(si)) = (self.spi, self.si) {
            write!(f, " spi {spi} si {si}")?;
        }
        Ok(())
    }
}

pub use crate::link::LinkType;

/// Why a frame yields no flow key. Counted per reason by every stage that skips.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// A header is cut short.
    Truncated,
    /// Not IP (ARP, LLDP, an unknown EtherType).
    NotIp,
    /// A header field makes no sense (bad version, bad length).
    Malformed,
    /// More VLAN tags or tunnels than [`MAX_DEPTH`].
    TooDeep,
}

impl SkipReason {
    /// Every reason, in counter order.
    pub const ALL: [SkipReason; 4] =
        [SkipReason::Truncated, SkipReason::NotIp, SkipReason::Malformed, SkipReason::TooDeep];

    /// Index into a per-reason counter array.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Stable name for counters and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            SkipReason::Truncated => "truncated",
            SkipReason::NotIp => "not_ip",
            SkipReason::Malformed => "malformed",
            SkipReason::TooDeep => "too_deep",
        }
    }
}

impl From<Error> for SkipReason {
    fn from(e: Error) -> Self {
        match e {
            Error::Truncated { .. } => SkipReason::Truncated,
            _ => SkipReason::Malformed,
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`extract`] learned about a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parsed {
    /// The flow key.
    pub key: FlowKey,
    /// Offset of the IP header the key came from (the one carrying the color).
    pub ip_offset: usize,
    /// 4 or 6.
    pub ip_version: u8,
    /// DSCP of that header.
    pub dscp: u8,
    /// Tunnel layers walked through.
    pub tunnels: u8,
    /// Offset of the transport header after that IP header (its extension headers skipped).
    pub l4_offset: usize,
    /// Whether the packet is a fragment of a larger one.
    pub fragment: Fragment,
}

/// Where a packet stands in IP fragmentation (RFC 791 §3.2, RFC 8200 §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fragment {
    /// A whole packet.
    #[default]
    Whole,
    /// The first fragment (it has the transport header) of the packet with this
    /// identification.
    First(u32),
    /// A later fragment (no transport header: no ports) of the packet with this
    /// identification.
    Later(u32),
}

#[derive(Clone, Copy)]
enum Next {
    Ether,
    EtherType(EtherType),
    Ip4,
    Ip6,
    Nsh,
    Mpls,
    /// First nibble decides (raw IP, MPLS payload).
    IpGuess,
}

/// Walks `frame` and returns the innermost flow key. Never panics; see [`SkipReason`].
pub fn extract(frame: &[u8], link: LinkType) -> Result<Parsed, SkipReason> {
    let (mut next, mut off) = match link::network_start(frame, link) {
        Ok(NetworkStart::Ethernet) => (Next::Ether, 0usize),
        Ok(NetworkStart::EtherType(et, off)) => (Next::EtherType(et), off),
        Ok(NetworkStart::Ip(off)) => (Next::IpGuess, off),
        Ok(NetworkStart::None) => return Err(SkipReason::NotIp),
        Err(LinkError::Truncated) => return Err(SkipReason::Truncated),
        Err(LinkError::Malformed) => return Err(SkipReason::Malformed),
    };
    let mut best: Option<Parsed> = None;
    let mut nsh_path: Option<(u32, u8)> = None;
    let mut tunnels = 0u8;
    for _ in 0..MAX_DEPTH * 2 {
        let rest = frame.get(off..).unwrap_or(&[]);
        let step = walk(next, rest, off, &mut nsh_path, &mut tunnels, &mut best);
        match step {
            Ok(Some((n, o))) => {
                next = n;
                off = o;
            }
            Ok(None) => {
                return best.ok_or(SkipReason::NotIp);
            }
            Err(e) => return best.ok_or(e),
        }
    }
    best.ok_or(SkipReason::TooDeep)
}

/// One layer. Returns the next layer and its absolute offset, or `None` when done.
fn walk(
    next: Next,
    rest: &[u8],
    off: usize,
    nsh_path: &mut Option<(u32, u8)>,
    tunnels: &mut u8,
    best: &mut Option<Parsed>,
) -> Result<Option<(Next, usize)>, SkipReason> {
    Ok(match next {
        Next::Ether => {
            let f = ethernet::Frame::new_checked(rest)?;
            Some((Next::EtherType(f.ethertype()), off + ethernet::HEADER_LEN))
        }
        Next::EtherType(et) => match et {
            EtherType::Ipv4 => Some((Next::Ip4, off)),
            EtherType::Ipv6 => Some((Next::Ip6, off)),
            EtherType::Vlan | EtherType::QinQ => {
                let t = vlan::Tag::new_checked(rest)?;
                Some((Next::EtherType(t.ethertype()), off + vlan::HEADER_LEN))
            }
            EtherType::Nsh => Some((Next::Nsh, off)),
            EtherType::Mpls => Some((Next::Mpls, off)),
            _ => {
                if best.is_none() {
                    return Err(SkipReason::NotIp);
                }
                None
            }
        },
        Next::IpGuess => match rest.first().map(|b| b >> 4) {
            Some(4) => Some((Next::Ip4, off)),
            Some(6) => Some((Next::Ip6, off)),
            Some(_) => return Err(SkipReason::NotIp),
            None => return Err(SkipReason::Truncated),
        },
        Next::Ip4 => {
            let p = ipv4::Packet::new_lenient(rest)?;
            let non_first = p.frag_offset() != 0;
            let fragment = match (non_first, p.more_frags()) {
                (true, _) => Fragment::Later(u32::from(p.ident())),
                (false, true) => Fragment::First(u32::from(p.ident())),
                (false, false) => Fragment::Whole,
            };
            let l4 = p.payload();
            let hl = p.header_len();
            let proto = p.protocol();
            let key = FlowKey {
                src: p.src().into(),
                dst: p.dst().into(),
                proto: proto.into(),
                ..FlowKey::default()
            };
            ip_layer(key, proto, l4, off, off + hl, 4, p.dscp(), fragment, nsh_path, tunnels, best)?
        }
        Next::Ip6 => {
            let p = ipv6::Packet::new_lenient(rest)?;
            let (proto, ext, id) = p.upper_layer_and_fragment()?;
            let non_first = proto == Protocol::Ipv6Frag;
            let fragment = match (id, non_first) {
                (None, _) => Fragment::Whole,
                (Some(id), false) => Fragment::First(id),
                (Some(id), true) => Fragment::Later(id),
            };
            let payload = p.payload();
            let l4 = payload.get(ext..).unwrap_or(&[]);
            let key = FlowKey {
                src: p.src().into(),
                dst: p.dst().into(),
                // A non-first fragment's real protocol is in the fragment header.
                proto: if non_first {
                    payload.get(ext).copied().unwrap_or(44)
                } else {
                    proto.into()
                },
                ..FlowKey::default()
            };
            let l4_off = off + ipv6::HEADER_LEN + ext;
            ip_layer(key, proto, l4, off, l4_off, 6, p.dscp(), fragment, nsh_path, tunnels, best)?
        }
        Next::Nsh => {
            let p = nsh::Packet::new_checked(rest)?;
            *nsh_path = Some((p.spi(), p.si()));
            if let Some(b) = best.as_mut() {
                b.key.spi = Some(p.spi());
                b.key.si = Some(p.si());
            }
            *tunnels += 1;
            let o = off + p.header_len();
            match p.next_protocol() {
                nsh::NextProtocol::Ipv4 => Some((Next::Ip4, o)),
                nsh::NextProtocol::Ipv6 => Some((Next::Ip6, o)),
                nsh::NextProtocol::Ethernet => Some((Next::Ether, o)),
                nsh::NextProtocol::Nsh => Some((Next::Nsh, o)),
                nsh::NextProtocol::Mpls => Some((Next::Mpls, o)),
                nsh::NextProtocol::Unknown(_) => None,
            }
        }
        Next::Mpls => {
            // Label stack entries of 4 bytes until the bottom-of-stack bit (RFC 3032).
            let mut o = 0usize;
            loop {
                let e = rest.get(o..o + 4).ok_or(SkipReason::Truncated)?;
                o += 4;
                if e[2] & 1 != 0 {
                    break;
                }
                if o >= 4 * MAX_DEPTH {
                    return Err(SkipReason::TooDeep);
                }
            }
            Some((Next::IpGuess, off + o))
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn ip_layer(
    mut key: FlowKey,
    proto: Protocol,
    l4: &[u8],
    ip_off: usize,
    l4_off: usize,
    ip_version: u8,
    dscp: u8,
    fragment: Fragment,
    nsh_path: &mut Option<(u32, u8)>,
    tunnels: &mut u8,
    best: &mut Option<Parsed>,
) -> Result<Option<(Next, usize)>, SkipReason> {
    if let Some((spi, si)) = *nsh_path {
        key.spi = Some(spi);
        key.si = Some(si);
    }
    let non_first_fragment = matches!(fragment, Fragment::Later(_));
    let has_ports = !non_first_fragment && matches!(u8::from(proto), 6 | 17 | 132 | 136);
    if has_ports {
        if let Some(p) = l4.get(0..4) {
            key.sport = u16::from_be_bytes([p[0], p[1]]);
            key.dport = u16::from_be_bytes([p[2], p[3]]);
        } else if best.is_none() {
            return Err(SkipReason::Truncated);
        } else {
            return Ok(None);
        }
    }
    *best = Some(Parsed {
        key,
        ip_offset: ip_off,
        ip_version,
        dscp,
        tunnels: *tunnels,
        l4_offset: l4_off,
        fragment,
    });
    if non_first_fragment {
        return Ok(None);
    }
    // Tunnels: IP-in-IP, GRE, and the UDP encapsulations by destination port.
    let tunnel = match proto {
        Protocol::IpIp => Some((Next::Ip4, l4_off)),
        Protocol::Ipv6 => Some((Next::Ip6, l4_off)),
        Protocol::Gre => {
            let g = gre::Packet::new_checked(l4)?;
            let inner = l4_off + g.header_len();
            match g.protocol() {
                EtherType::Ipv4 => Some((Next::Ip4, inner)),
                EtherType::Ipv6 => Some((Next::Ip6, inner)),
                EtherType::TransparentEthernet => Some((Next::Ether, inner)),
                EtherType::Mpls => Some((Next::Mpls, inner)),
                EtherType::Nsh => Some((Next::Nsh, inner)),
                p @ (EtherType::ErspanII | EtherType::ErspanIII) => {
                    let e = gre::erspan_header_len(p, g.has_seq(), g.payload())?;
                    Some((Next::Ether, inner + e))
                }
                EtherType::Unknown(gre::PPP) => match gre::ppp_header(g.payload())? {
                    (len, Some(4)) => Some((Next::Ip4, inner + len)),
                    (len, Some(_)) => Some((Next::Ip6, inner + len)),
                    (_, None) => None,
                },
                _ => None,
            }
        }
        Protocol::Udp => {
            let payload = l4.get(8..).unwrap_or(&[]);
            let inner = l4_off + 8;
            match key.dport {
                vxlan::PORT => {
                    let v = vxlan::Packet::new_checked(payload)?;
                    Some((Next::Ether, inner + vxlan::HEADER_LEN)).filter(|_| v.vni_valid())
                }
                vxlan::GPE_PORT => {
                    let v = vxlan::Packet::new_checked(payload)?;
                    let o = inner + vxlan::HEADER_LEN;
                    match v.next_protocol() {
                        None | Some(vxlan::NextProtocol::Ethernet) => Some((Next::Ether, o)),
                        Some(vxlan::NextProtocol::Ipv4) => Some((Next::Ip4, o)),
                        Some(vxlan::NextProtocol::Ipv6) => Some((Next::Ip6, o)),
                        Some(vxlan::NextProtocol::Nsh) => Some((Next::Nsh, o)),
                        Some(vxlan::NextProtocol::Unknown(_)) => None,
                    }
                }
                geneve::PORT => {
                    let g = geneve::Packet::new_checked(payload)?;
                    let o = inner + g.header_len();
                    match g.protocol() {
                        EtherType::TransparentEthernet => Some((Next::Ether, o)),
                        EtherType::Ipv4 => Some((Next::Ip4, o)),
                        EtherType::Ipv6 => Some((Next::Ip6, o)),
                        _ => None,
                    }
                }
                MPLS_UDP_PORT => Some((Next::Mpls, inner)),
                _ => None,
            }
        }
        _ => None,
    };
    if tunnel.is_some() {
        *tunnels += 1;
        // A new tunnel starts a new service path context only if it carries its own NSH.
        *nsh_path = None;
    }
    Ok(tunnel)
}

/// Writes `dscp` into the IP header [`extract`] found, fixing the IPv4 checksum incrementally.
///
/// Only the IP header checksum changes: TCP and UDP checksums do not cover the DSCP. An outer
/// UDP checksum of a tunnel (zero for VXLAN in practice, RFC 7348 §5) is not updated.
pub fn set_dscp(frame: &mut [u8], parsed: &Parsed, dscp: u8) -> Result<(), SkipReason> {
    let ip = frame.get_mut(parsed.ip_offset..).ok_or(SkipReason::Truncated)?;
    match parsed.ip_version {
        4 => ipv4::Packet::new_lenient(ip)?.set_dscp_update_checksum(dscp),
        _ => ipv6::Packet::new_lenient(ip)?.set_dscp(dscp),
    }
    Ok(())
}

/// Builds one Ethernet frame of `key` (IPv4 or IPv6, TCP or UDP) with `payload` zero bytes of
/// payload, the given DSCP and TTL: the inverse of [`extract`] for test traffic, generators and
/// probes. Locally administered MAC addresses; checksums left zero.
pub fn build_frame(key: &FlowKey, payload: usize, dscp: u8, ttl: u8) -> Vec<u8> {
    let l4 = if key.proto == 6 { tcp::MIN_HEADER_LEN } else { udp::HEADER_LEN };
    let ip_len = match key.src {
        IpAddr::V4(_) => ipv4::MIN_HEADER_LEN,
        IpAddr::V6(_) => ipv6::HEADER_LEN,
    };
    let mut f = vec![0u8; 14 + ip_len + l4 + payload];
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    let body = l4 + payload;
    match (key.src, key.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            let r = ipv4::Repr {
                src: s,
                dst: d,
                protocol: key.proto.into(),
                dscp,
                ecn: 0,
                ident: 0,
                dont_frag: true,
                ttl,
                payload_len: body,
                options: [0; 40],
                options_len: 0,
            };
            let _ = r.emit(&mut f[14..]);
        }
        (s, d) => {
            f[12..14].copy_from_slice(&[0x86, 0xdd]);
            let v6 = |a: IpAddr| match a {
                IpAddr::V6(a) => a,
                IpAddr::V4(a) => a.to_ipv6_mapped(),
            };
            let r = ipv6::Repr {
                src: v6(s),
                dst: v6(d),
                next_header: key.proto.into(),
                traffic_class: dscp << 2,
                flow_label: 0,
                hop_limit: ttl,
                payload_len: body,
            };
            let _ = r.emit(&mut f[14..]);
        }
    }
    let l4o = 14 + ip_len;
    if key.proto == 6 {
        let r = tcp::Repr {
            src_port: key.sport,
            dst_port: key.dport,
            seq: 1,
            ack: 0,
            flags: tcp::flags::ACK,
            window: 65535,
            options: [0; 40],
            options_len: 0,
        };
        let _ = r.emit(&mut f[l4o..]);
    } else {
        let _ = udp::Repr { src_port: key.sport, dst_port: key.dport, payload_len: payload }
            .emit(&mut f[l4o..]);
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv6Addr;

    fn eth(et: u16) -> Vec<u8> {
        let mut v = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
        v.extend_from_slice(&et.to_be_bytes());
        v
    }

    fn ip4_udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; 28];
        let r = ipv4::Repr {
            src: src.into(),
            dst: dst.into(),
            protocol: Protocol::Udp,
            dscp: 0,
            ecn: 0,
            ident: 1,
            dont_frag: true,
            ttl: 64,
            payload_len: 8 + payload.len(),
            options: [0; 40],
            options_len: 0,
        };
        r.emit(&mut v).unwrap();
        crate::udp::Repr { src_port: sport, dst_port: dport, payload_len: payload.len() }
            .emit(&mut v[20..])
            .unwrap();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn plain_and_stacked_vlan() {
        let mut f = eth(0x88a8);
        f.extend_from_slice(&[0, 10, 0x81, 0x00, 0, 20, 0x08, 0x00]);
        f.extend(ip4_udp([10, 0, 0, 1], [10, 0, 0, 2], 1000, 53, b"hi"));
        let p = extract(&f, LinkType::Ethernet).unwrap();
        assert_eq!(p.key.src, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!((p.key.sport, p.key.dport, p.key.proto), (1000, 53, 17));
        assert_eq!(p.ip_offset, 22);
    }

    #[test]
    fn vxlan_inner_key_and_marking() {
        let mut inner = eth(0x0800);
        inner.extend(ip4_udp([192, 168, 0, 1], [192, 168, 0, 2], 5000, 6000, b"x"));
        let mut vx = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
        vx.extend(inner);
        let mut f = eth(0x0800);
        f.extend(ip4_udp([10, 0, 0, 1], [10, 0, 0, 2], 33333, 4789, &vx));
        let p = extract(&f, LinkType::Ethernet).unwrap();
        assert_eq!(p.key.dst, IpAddr::V4(Ipv4Addr::new(192, 168, 0, 2)));
        assert_eq!((p.key.sport, p.key.dport), (5000, 6000));
        assert_eq!(p.tunnels, 1);
        set_dscp(&mut f, &p, 1).unwrap();
        let q = extract(&f, LinkType::Ethernet).unwrap();
        assert_eq!(q.dscp, 1);
        assert!(ipv4::Packet::new_checked(&f[q.ip_offset..]).unwrap().verify_checksum());
    }

    #[test]
    fn nsh_sets_spi_si() {
        let mut f = eth(0x894f);
        let mut nshb = vec![0x0f, 0xc6, 0x01, 0x01, 0x00, 0x00, 0x2a, 0xfe];
        nshb.extend_from_slice(&[0; 16]);
        f.extend(nshb);
        f.extend(ip4_udp([1, 1, 1, 1], [2, 2, 2, 2], 1, 2, b""));
        let p = extract(&f, LinkType::Ethernet).unwrap();
        assert_eq!((p.key.spi, p.key.si), (Some(42), Some(254)));
        assert_eq!(p.key.sport, 1);
    }

    #[test]
    fn ipv6_raw_and_skips() {
        let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        v6.extend_from_slice(&[0, 7, 0, 9, 0, 8, 0, 0]);
        let p = extract(&v6, LinkType::RawIp).unwrap();
        assert_eq!((p.key.sport, p.key.dport, p.ip_version), (7, 9, 6));
        assert_eq!(extract(&eth(0x0806), LinkType::Ethernet), Err(SkipReason::NotIp));
        assert_eq!(extract(&v6[..30], LinkType::RawIp), Err(SkipReason::Truncated));
        assert_eq!(extract(&[0x10, 0, 0], LinkType::RawIp), Err(SkipReason::NotIp));
        assert_eq!(extract(&[], LinkType::Ethernet), Err(SkipReason::Truncated));
    }

    #[test]
    fn truncated_tunnel_falls_back_to_outer() {
        let mut f = eth(0x0800);
        f.extend(ip4_udp(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            33333,
            4789,
            &[0x08, 0, 0, 0, 0, 0, 1, 0, 2],
        ));
        let p = extract(&f, LinkType::Ethernet).unwrap();
        assert_eq!(p.key.dport, 4789);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(data: Vec<u8>, raw: bool) {
            let link = if raw { LinkType::RawIp } else { LinkType::Ethernet };
            let _ = extract(&data, link);
        }
    }
}
