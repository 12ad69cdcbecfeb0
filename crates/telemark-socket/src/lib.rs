//! Telemark's socket plumbing, written once for every listener and port: the one
//! `setsockopt(2)` wrapper ([`setsockopt`]), conversions between [`SocketAddr`] and the
//! kernel's `sockaddr` ([`sockaddr`], [`peer`]), and the one UDP batch receiver ([`udp::UdpRx`]:
//! `recvmmsg`, sender addresses, the kernel's overflow counter, truncation, EINTR) that the
//! collector's flow listener, the INT collector and the tests read datagrams with; and the
//! address prefixes their allow-lists are written in ([`Prefix`]).

pub mod udp;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;

/// `setsockopt(2)` with a value of any type; the error names the option.
pub fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a live value of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (v as *const T).cast::<libc::c_void>(),
            core::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `getsockopt(2)` into `v`: the kernel writes what it has of the option, at most
/// `size_of::<T>()` bytes (a newer struct's tail keeps what `v` held); how many it wrote.
///
/// # Safety
/// `T` must be a plain C struct or integer the option's value is laid out as: every bit
/// pattern the kernel may write must be a valid `T`.
pub unsafe fn getsockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: &mut T,
) -> io::Result<usize> {
    let mut len = core::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` is live and `len` bytes long; the caller vouches for T's bit patterns.
    let r = unsafe { libc::getsockopt(fd, level, name, (v as *mut T).cast(), &mut len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(len as usize)
}

/// `getsockopt(2)` of a `c_int` option.
pub fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    // SAFETY: every bit pattern is a valid c_int.
    unsafe { getsockopt(fd, level, name, &mut v) }?;
    Ok(v)
}

/// `addr` as the kernel takes it, with its length.
pub fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut s: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { core::ptr::write((&mut s as *mut libc::sockaddr_storage).cast(), sin) };
            core::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6 and suitably aligned.
            unsafe { core::ptr::write((&mut s as *mut libc::sockaddr_storage).cast(), sin6) };
            core::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (s, len as libc::socklen_t)
}

/// The sender in a `sockaddr` the kernel filled; an IPv4-mapped IPv6 address (a dual-stack
/// socket's IPv4 sender) as the IPv4 address it is, so allow-lists and exporter names read
/// one form. `None` for a family that is neither.
pub fn peer(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in for an AF_INET sender.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::from((ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 for an AF_INET6 sender.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let v6 = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
            Some(SocketAddr::new(ip, u16::from_be(a.sin6_port)))
        }
        _ => None,
    }
}

/// An address prefix, `192.0.2.0/24` or `2001:db8::/32` (a bare address is its /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    addr: IpAddr,
    len: u8,
}

impl std::str::FromStr for Prefix {
    type Err = String;

    fn from_str(s: &str) -> Result<Prefix, String> {
        let (a, l) = s.split_once('/').map_or((s, None), |(a, l)| (a, Some(l)));
        let addr: IpAddr = a.parse().map_err(|_| format!("{s:?}: not an address or prefix"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => max,
            Some(l) => l
                .parse()
                .ok()
                .filter(|l| *l <= max)
                .ok_or(format!("{s:?}: prefix length 0-{max}"))?,
        };
        Ok(Prefix { addr, len })
    }
}

impl Prefix {
    /// Whether `ip` is in it.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |ip: IpAddr| match ip {
            IpAddr::V4(a) => (u128::from(u32::from(a)) << 96, 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        };
        let ((p, pmax), (x, xmax)) = (bits(self.addr), bits(ip));
        if pmax != xmax {
            return false;
        }
        let mask = if self.len == 0 { 0 } else { u128::MAX << (128 - u32::from(self.len)) };
        p & mask == x & mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_parse_and_contain_what_they_say() {
        let p: Prefix = "192.0.2.0/24".parse().unwrap();
        assert!(p.contains("192.0.2.200".parse().unwrap()));
        assert!(!p.contains("192.0.3.1".parse().unwrap()));
        // An IPv4 prefix never holds an IPv6 address, even a mapped one (the receiver gives
        // those as IPv4 already).
        assert!(!p.contains("::ffff:192.0.2.1".parse().unwrap()));
        let host: Prefix = "2001:db8::7".parse().unwrap();
        assert!(host.contains("2001:db8::7".parse().unwrap()));
        assert!(!host.contains("2001:db8::8".parse().unwrap()));
        let all: Prefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        for bad in ["192.0.2.0/33", "2001:db8::/129", "host", "10.0.0.0/x", ""] {
            assert!(bad.parse::<Prefix>().is_err(), "{bad:?}");
        }
    }
}
