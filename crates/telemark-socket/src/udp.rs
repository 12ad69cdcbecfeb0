//! Receiving telemetry datagrams fast, the one receiver every UDP listener uses (the
//! collector's flow listener, the INT collector): one UDP socket per worker on a shared port
//! (`SO_REUSEPORT`: the kernel spreads senders over the workers by their address), batches of
//! datagrams per system call (`recvmmsg`), each with its sender (for allow-lists) and whether it
//! was cut, and the kernel's own count of datagrams it dropped because the socket's buffer was
//! full (`SO_RXQ_OVFL`), so a collector can tell loss in the network (sequence gaps) from its
//! own. A read interrupted by a signal, or timed out, returns an empty batch.

use crate::{getsockopt_int, peer, setsockopt, sockaddr};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// Largest datagram kept whole by default (a jumbo frame's payload); longer ones are cut and
/// counted. See [`RxOptions::max_datagram`].
pub const MAX_DATAGRAM: usize = 9216;

/// Space for one `SO_RXQ_OVFL` control message.
const CONTROL_LEN: usize = 64;

/// A receiving socket with its batch buffers.
pub struct UdpRx {
    fd: OwnedFd,
    bufs: Vec<u8>,
    lens: Vec<usize>,
    truncated: Vec<bool>,
    /// Control-message space, 8-byte aligned as `cmsghdr` must be.
    control: Vec<u64>,
    /// One I/O vector per slot of `bufs`, and one message header per slot (pointing at its
    /// vector and its slot of `control`): built once, so a read allocates nothing.
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    /// One sender address per slot (`msg_name`), for allow-lists.
    names: Vec<libc::sockaddr_storage>,
    /// The kernel's drop counter as last read (cumulative for the socket).
    kernel_drops: u32,
    batch: usize,
    /// Bytes per slot of `bufs`.
    slot: usize,
}

// SAFETY: the raw pointers in `iov` and `msgs` point into this value's own heap buffers
// (`bufs`, `control`, `iov`), which move with it and are never reallocated.
unsafe impl Send for UdpRx {}

/// Socket options.
#[derive(Debug, Clone, Copy)]
pub struct RxOptions {
    /// Datagrams read per system call.
    pub batch: usize,
    /// Receive buffer asked for, in bytes (root may exceed `net.core.rmem_max`).
    pub rcvbuf: usize,
    /// How long a read waits before returning nothing (so a worker can see it should stop).
    pub timeout: Duration,
    /// Largest datagram kept whole, bytes (at most 65,535); longer ones are cut.
    pub max_datagram: usize,
}

impl Default for RxOptions {
    fn default() -> Self {
        RxOptions {
            batch: 64,
            rcvbuf: 8 << 20,
            timeout: Duration::from_millis(100),
            max_datagram: MAX_DATAGRAM,
        }
    }
}

fn check(r: libc::c_int, what: &str) -> io::Result<()> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

fn ctx(what: &'static str) -> impl Fn(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn set_opt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
    setsockopt(fd.as_raw_fd(), level, name, v)
}

impl UdpRx {
    /// Binds `addr` with `SO_REUSEPORT` (so several workers can bind it) and the options.
    pub fn bind(addr: SocketAddr, opts: RxOptions) -> io::Result<UdpRx> {
        let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
        // SAFETY: plain socket(2); the result is checked before use.
        let raw = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        check(raw, "socket")?;
        // SAFETY: `raw` is a new descriptor this function owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let one: libc::c_int = 1;
        set_opt(&fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, &one).map_err(ctx("SO_REUSEPORT"))?;
        set_opt(&fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, &one).map_err(ctx("SO_RXQ_OVFL"))?;
        let size = libc::c_int::try_from(opts.rcvbuf).unwrap_or(libc::c_int::MAX);
        // Root may go past rmem_max; anyone else gets what the limit allows.
        if set_opt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &size).is_err() {
            let _ = set_opt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &size);
        }
        let tv = libc::timeval {
            tv_sec: opts.timeout.as_secs() as libc::time_t,
            tv_usec: opts.timeout.subsec_micros() as libc::suseconds_t,
        };
        set_opt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv).map_err(ctx("SO_RCVTIMEO"))?;
        let (storage, len) = sockaddr(addr);
        // SAFETY: `storage` holds a sockaddr of `len` bytes for this family.
        let r = unsafe {
            libc::bind(fd.as_raw_fd(), (&storage as *const libc::sockaddr_storage).cast(), len)
        };
        check(r, &format!("bind {addr}"))?;
        let batch = opts.batch.clamp(1, 1024);
        let slot = opts.max_datagram.clamp(1, 65_535);
        Ok(UdpRx {
            fd,
            bufs: vec![0; batch * slot],
            lens: vec![0; batch],
            truncated: vec![false; batch],
            control: vec![0; batch * CONTROL_LEN / 8],
            iov: Vec::new(),
            msgs: Vec::new(),
            // SAFETY: an all-zero sockaddr_storage is valid.
            names: vec![unsafe { core::mem::zeroed() }; batch],
            kernel_drops: 0,
            batch,
            slot,
        }
        .with_headers())
    }

    /// Points one I/O vector at each buffer slot and one message header at each vector and
    /// control slot (one base pointer per buffer, offsets from it).
    fn with_headers(mut self) -> UdpRx {
        let (bufs, slot) = (self.bufs.as_mut_ptr(), self.slot);
        self.iov = (0..self.batch)
            .map(|i| libc::iovec {
                // SAFETY: `bufs` holds `batch` slots of `slot` bytes.
                iov_base: unsafe { bufs.add(i * slot) }.cast(),
                iov_len: slot,
            })
            .collect();
        let iov = self.iov.as_mut_ptr();
        let control = self.control.as_mut_ptr().cast::<u8>();
        let names = self.names.as_mut_ptr();
        self.msgs = (0..self.batch)
            .map(|i| {
                // SAFETY: an all-zero msghdr is valid; the fields used are set below.
                let mut h: libc::msghdr = unsafe { core::mem::zeroed() };
                // SAFETY: `iov` has `batch` entries, `control` `batch` slots of CONTROL_LEN.
                unsafe {
                    h.msg_iov = iov.add(i);
                    h.msg_control = control.add(i * CONTROL_LEN).cast();
                    h.msg_name = names.add(i).cast();
                }
                h.msg_namelen = core::mem::size_of::<libc::sockaddr_storage>() as _;
                h.msg_iovlen = 1;
                libc::mmsghdr { msg_hdr: h, msg_len: 0 }
            })
            .collect();
        self
    }

    /// The address bound (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let dup = self.fd.try_clone()?;
        std::net::UdpSocket::from(dup).local_addr()
    }

    /// The receive buffer the kernel granted, in bytes.
    pub fn rcvbuf(&self) -> usize {
        getsockopt_int(self.fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF)
            .map_or(0, |v| v.max(0) as usize)
    }

    /// Datagrams the kernel dropped for this socket (its buffer full), as of the last read.
    pub fn kernel_drops(&self) -> u64 {
        u64::from(self.kernel_drops)
    }

    /// Reads a batch: waits up to the timeout for the first datagram, then takes what is
    /// queued, up to the batch size. Returns how many (0 on timeout); read them with
    /// [`datagram`](Self::datagram).
    pub fn recv(&mut self) -> io::Result<usize> {
        let batch = self.batch;
        for m in &mut self.msgs {
            // The kernel shrinks these to what it wrote: give each slot its full space back.
            m.msg_hdr.msg_controllen = CONTROL_LEN as _;
            m.msg_hdr.msg_flags = 0;
            m.msg_hdr.msg_namelen = core::mem::size_of::<libc::sockaddr_storage>() as _;
        }
        // SAFETY: `msgs` has `batch` entries whose buffers live across the call.
        let n = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                self.msgs.as_mut_ptr(),
                batch as libc::c_uint,
                libc::MSG_WAITFORONE,
                core::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let n = n as usize;
        for (i, m) in self.msgs.iter().take(n).enumerate() {
            self.lens[i] = (m.msg_len as usize).min(self.slot);
            self.truncated[i] = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            // SAFETY: the kernel filled `msg_controllen` bytes of this slot's control buffer.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SO_RXQ_OVFL {
                        self.kernel_drops =
                            core::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<u32>());
                    }
                    c = libc::CMSG_NXTHDR(&m.msg_hdr, c);
                }
            }
        }
        Ok(n)
    }

    /// Datagram `i` of the last batch, and whether it was longer than
    /// [`RxOptions::max_datagram`] (cut).
    pub fn datagram(&self, i: usize) -> (&[u8], bool) {
        let start = i * self.slot;
        (&self.bufs[start..start + self.lens[i]], self.truncated[i])
    }

    /// The sender of datagram `i` of the last batch (an IPv4-mapped address as IPv4).
    pub fn source(&self, i: usize) -> Option<SocketAddr> {
        peer(self.names.get(i)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_from_a_shared_port() {
        let opts = RxOptions { timeout: Duration::from_millis(50), ..RxOptions::default() };
        let mut a = UdpRx::bind("127.0.0.1:0".parse().unwrap(), opts).unwrap();
        let addr = a.local_addr().unwrap();
        // A second socket can bind the same port.
        let b = UdpRx::bind(addr, opts).unwrap();
        drop(b);
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..10u8 {
            tx.send_to(&[i; 100], addr).unwrap();
        }
        let mut got = Vec::new();
        while got.len() < 10 {
            let n = a.recv().unwrap();
            assert!(n > 0, "timed out with {} datagrams", got.len());
            for i in 0..n {
                let (d, cut) = a.datagram(i);
                assert!(!cut);
                assert_eq!(a.source(i), Some(tx.local_addr().unwrap()));
                got.push(d.to_vec());
            }
        }
        assert_eq!(got[3], vec![3u8; 100]);
        assert_eq!(a.recv().unwrap(), 0, "nothing more: a timeout");
        assert!(a.rcvbuf() > 0);
    }
}
