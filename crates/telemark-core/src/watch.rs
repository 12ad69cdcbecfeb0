//! Which flows a switch watches: all of them (first come first served, as the loss paper), or
//! those matching any of a list of rules (address prefixes, protocol, ports).
//!
//! A rule is written `key=value` pairs separated by commas, e.g.
//! `dst=10.0.0.7/32,proto=udp,dport=5201`; keys are `src`, `dst` (an address or a prefix),
//! `proto` (`tcp`, `udp`, `icmp` or a number), `sport`, `dport`. A key left out matches anything.

use core::fmt;
use core::net::IpAddr;
use core::str::FromStr;
use telemark_wire::FlowKey;

/// An address prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    addr: IpAddr,
    len: u8,
}

impl Prefix {
    /// Whether `a` is inside the prefix.
    pub fn contains(&self, a: &IpAddr) -> bool {
        match (self.addr, a) {
            (IpAddr::V4(p), IpAddr::V4(a)) => {
                let m = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                u32::from(p) & m == u32::from(*a) & m
            }
            (IpAddr::V6(p), IpAddr::V6(a)) => {
                let m = u128::MAX.checked_shl(128 - u32::from(self.len)).unwrap_or(0);
                u128::from(p) & m == u128::from(*a) & m
            }
            _ => false,
        }
    }
}

impl FromStr for Prefix {
    type Err = WatchError;
    fn from_str(s: &str) -> Result<Self, WatchError> {
        let bad = || WatchError(format!("bad address or prefix {s:?} (e.g. 10.0.0.0/24, fd00::1)"));
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            Some(l) => l.trim().parse::<u8>().ok().filter(|l| *l <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(Prefix { addr, len })
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// One rule: every field given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// Source prefix.
    pub src: Option<Prefix>,
    /// Destination prefix.
    pub dst: Option<Prefix>,
    /// IP protocol.
    pub proto: Option<u8>,
    /// Source port.
    pub sport: Option<u16>,
    /// Destination port.
    pub dport: Option<u16>,
}

/// A rule that did not parse, with what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchError(pub String);

impl fmt::Display for WatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WatchError {}

/// Parses a protocol name or number.
pub fn parse_proto(s: &str) -> Result<u8, WatchError> {
    match s.trim().to_ascii_lowercase().as_str() {
        "tcp" => Ok(6),
        "udp" => Ok(17),
        "icmp" => Ok(1),
        "icmpv6" => Ok(58),
        "sctp" => Ok(132),
        n => n
            .parse()
            .map_err(|_| WatchError(format!("bad protocol {s:?} (tcp, udp, icmp or a number)"))),
    }
}

impl Rule {
    /// Whether `k` matches.
    #[inline]
    pub fn matches(&self, k: &FlowKey) -> bool {
        self.src.is_none_or(|p| p.contains(&k.src))
            && self.dst.is_none_or(|p| p.contains(&k.dst))
            && self.proto.is_none_or(|p| p == k.proto)
            && self.sport.is_none_or(|p| p == k.sport)
            && self.dport.is_none_or(|p| p == k.dport)
    }
}

impl FromStr for Rule {
    type Err = WatchError;
    fn from_str(s: &str) -> Result<Self, WatchError> {
        let mut r = Rule::default();
        let port = |v: &str| {
            v.trim().parse::<u16>().map_err(|_| WatchError(format!("bad port {v:?} (0-65535)")))
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((k, v)) = part.split_once('=') else {
                return Err(WatchError(format!("{part:?} is not key=value")));
            };
            match k.trim() {
                "src" => r.src = Some(v.parse()?),
                "dst" => r.dst = Some(v.parse()?),
                "proto" => r.proto = Some(parse_proto(v)?),
                "sport" => r.sport = Some(port(v)?),
                "dport" => r.dport = Some(port(v)?),
                other => {
                    return Err(WatchError(format!(
                        "unknown key {other:?} in watch rule (src, dst, proto, sport, dport)"
                    )))
                }
            }
        }
        if r == Rule::default() {
            return Err(WatchError(format!("watch rule {s:?} matches everything; leave it out")));
        }
        Ok(r)
    }
}

/// The flows to watch: every flow when there are no rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watch {
    /// Rules; a flow is watched if any matches.
    pub rules: Vec<Rule>,
}

impl Watch {
    /// Whether flow `k` is watched.
    #[inline]
    pub fn matches(&self, k: &FlowKey) -> bool {
        self.rules.is_empty() || self.rules.iter().any(|r| r.matches(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    fn key(src: [u8; 4], dst: [u8; 4], proto: u8, dport: u16) -> FlowKey {
        FlowKey {
            src: IpAddr::V4(Ipv4Addr::from(src)),
            dst: IpAddr::V4(Ipv4Addr::from(dst)),
            sport: 1000,
            dport,
            proto,
            spi: None,
            si: None,
        }
    }

    #[test]
    fn rules_match_prefixes_protocols_and_ports() {
        let w = Watch {
            rules: vec![
                "dst=10.0.0.7/32,proto=udp,dport=5201".parse().unwrap(),
                "src=192.168.0.0/16".parse().unwrap(),
            ],
        };
        assert!(w.matches(&key([10, 0, 0, 1], [10, 0, 0, 7], 17, 5201)));
        assert!(!w.matches(&key([10, 0, 0, 1], [10, 0, 0, 7], 6, 5201)));
        assert!(!w.matches(&key([10, 0, 0, 1], [10, 0, 0, 7], 17, 5202)));
        assert!(!w.matches(&key([10, 0, 0, 1], [10, 0, 0, 8], 17, 5201)));
        assert!(w.matches(&key([192, 168, 200, 1], [1, 1, 1, 1], 6, 80)));
        assert!(!w.matches(&key([192, 169, 0, 1], [1, 1, 1, 1], 6, 80)));
        assert!(Watch::default().matches(&key([1, 2, 3, 4], [5, 6, 7, 8], 1, 0)));
        let p: Prefix = "0.0.0.0/0".parse().unwrap();
        assert!(p.contains(&"255.1.2.3".parse().unwrap()));
        let p6: Prefix = "fd00::/8".parse().unwrap();
        assert!(p6.contains(&"fd12::1".parse().unwrap()));
        assert!(!p6.contains(&"10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        for (s, want) in [
            ("dst=10.0.0.0/33", "bad address or prefix"),
            ("dst=ten", "bad address or prefix"),
            ("proto=foo", "bad protocol"),
            ("dport=70000", "bad port"),
            ("port=1", "unknown key"),
            ("dst", "not key=value"),
            ("", "matches everything"),
        ] {
            let e = s.parse::<Rule>().unwrap_err();
            assert!(e.0.contains(want), "{s}: {e}");
        }
    }
}
