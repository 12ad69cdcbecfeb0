//! Live ports on AF_PACKET with memory-mapped rings (Linux `packet(7)`, TPACKET_V2).
//!
//! One socket per interface, with an RX ring of frames (the kernel writes each frame into the
//! next slot and flips its status word; the fast path reads every slot whose status says it is
//! ours, one status check instead of a syscall per packet, and gives it straight back) and a TX
//! ring of frames (the fast path writes frames and status words, then one `sendto` per burst
//! asks the kernel to send everything marked). Packets the fast path sends itself are not read
//! back (`PACKET_IGNORE_OUTGOING`). What the kernel could not put in a full RX ring is counted
//! by the kernel and read with `PACKET_STATISTICS`; a full TX ring is counted here. Nothing in
//! the per-packet path allocates or blocks.
//!
//! Why TPACKET_V2 and not V3's blocks: V3 hands a block of frames over only when it is full or
//! when its retire timer (at least 1 ms, 2 ms here before) fires, so at low and moderate rates
//! every frame waited up to that long in a block nobody could read: 2 ms per hop of round-trip
//! time that a kernel bridge does not add (issue 31, item 13). A V2 frame is readable the moment
//! the kernel has written it, and a burst still costs one status word per frame.
//!
//! A port may live in another network namespace: the socket is opened inside it (by name under
//! `/run/netns`, as `ip netns` creates them) and the thread returns to its own namespace, so one
//! agent process serves switches in namespaces and still talks to a collector on the host.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

const SOL_PACKET: libc::c_int = 263;
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_TX_RING: libc::c_int = 13;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const TPACKET_V2: libc::c_int = 1;
const ETH_P_ALL: u16 = 0x0003;

const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
const TP_STATUS_AVAILABLE: u32 = 0;
const TP_STATUS_SEND_REQUEST: u32 = 1;
const TP_STATUS_WRONG_FORMAT: u32 = 4;

/// `TPACKET_ALIGN(sizeof(struct tpacket2_hdr))`: where the frame starts in a TX slot (the
/// kernel reads it at `TPACKET2_HDRLEN - sizeof(struct sockaddr_ll)`, the same place).
const TPACKET2_HDR: usize = 32;

// Offsets in `struct tpacket2_hdr`.
const PKT_STATUS: usize = 0;
const PKT_LEN: usize = 4;
const PKT_SNAPLEN: usize = 8;
const PKT_MAC: usize = 12; // u16, with tp_net in the upper half of the word
const PKT_SEC: usize = 16;
const PKT_NSEC: usize = 20;

/// Most frames one [`RxRing::rx_ready`] call reads, so one busy port cannot starve the others.
const RX_READ_MAX: usize = 256;

/// `struct tpacket_req`, the ring geometry of TPACKET_V1 and V2.
#[repr(C)]
struct TpacketReq {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
}

#[repr(C)]
#[derive(Default)]
struct TpacketStats {
    packets: u32,
    drops: u32,
    freeze_q_cnt: u32,
}

/// Ring geometry.
#[derive(Debug, Clone, Copy)]
pub struct RingConfig {
    /// Bytes per RX block (a power of two, multiple of the page size): the unit the kernel
    /// allocates the ring in, holding `rx_block / frame` frames.
    pub rx_block: u32,
    /// RX blocks.
    pub rx_blocks: u32,
    /// Bytes per RX and TX frame slot: the largest frame that can be received whole or sent,
    /// plus the slot's header (32 bytes on TX, up to 80 on RX).
    pub tx_frame: u32,
    /// TX frames.
    pub tx_frames: u32,
    /// Send without the interface's qdisc (`PACKET_QDISC_BYPASS`).
    pub qdisc_bypass: bool,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            rx_block: 1 << 18,
            rx_blocks: 32,
            tx_frame: 2048,
            tx_frames: 1024,
            qdisc_bypass: false,
        }
    }
}

/// Counters of one port's RX ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxStats {
    /// Frames read from the RX ring.
    pub rx: u64,
    /// Frames cut short by the ring (longer than what fitted); passed on as they were cut.
    pub rx_truncated: u64,
    /// Frames the kernel dropped because the RX ring was full (`PACKET_STATISTICS`).
    pub rx_ring_drops: u64,
}

/// Counters of one port's TX ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxStats {
    /// Frames queued on the TX ring.
    pub tx: u64,
    /// Frames not sent: the TX ring was full.
    pub tx_full: u64,
    /// Frames not sent: larger than a TX frame.
    pub tx_too_big: u64,
    /// Frames the kernel refused to send (`TP_STATUS_WRONG_FORMAT`).
    pub tx_errors: u64,
    /// `sendto` calls that failed (other than "would block").
    pub tx_kick_errors: u64,
}

/// The socket and its mapped rings, shared by the port's two halves.
struct Mapping {
    fd: OwnedFd,
    map: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping lives as long as the `Mapping`; the RX half touches only RX frames and
// the TX half only TX frames, each half used by one thread at a time.
unsafe impl Send for Mapping {}
// SAFETY: as above; shared words are accessed as atomics.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn word(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.len);
        // SAFETY: `off` is inside the mapping and 4-aligned (ring structures are); the kernel
        // writes these words concurrently, so they are accessed as atomics.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU32) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `open` mapped; the fd closes after.
        unsafe { libc::munmap(self.map.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// The receiving half of a port.
pub struct RxRing {
    m: Arc<Mapping>,
    frame: usize,
    frames: u32,
    next: u32,
    name: String,
    ifindex: u32,
    stats: RxStats,
}

/// The sending half of a port.
pub struct TxRing {
    m: Arc<Mapping>,
    base: usize,
    frame: usize,
    frames: u32,
    next: u32,
    pending: bool,
    name: String,
    stats: TxStats,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn setopt<T>(fd: RawFd, name: libc::c_int, v: &T) -> io::Result<()> {
    telemark_socket::setsockopt(fd, SOL_PACKET, name, v)
}

fn err(ctx: String, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{ctx}: {e}"))
}

/// Runs `f` inside network namespace `netns` (a name under `/run/netns`), then returns the
/// calling thread to the namespace it was in.
pub fn in_netns<T>(netns: Option<&str>, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let Some(ns) = netns else { return f() };
    let own = std::fs::File::open("/proc/thread-self/ns/net")
        .map_err(|e| err("cannot open own network namespace".into(), e))?;
    let target = std::fs::File::open(format!("/run/netns/{ns}"))
        .map_err(|e| err(format!("network namespace {ns:?}"), e))?;
    // SAFETY: plain syscall on an fd we own.
    cvt(unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) })
        .map_err(|e| err(format!("cannot enter network namespace {ns:?}"), e))?;
    let r = f();
    // SAFETY: as above; returning to where we came from.
    let back = cvt(unsafe { libc::setns(own.as_raw_fd(), libc::CLONE_NEWNET) });
    if let Err(e) = back {
        // The thread is now in the wrong namespace: nothing it does next could be trusted.
        return Err(err("cannot return to own network namespace".into(), e));
    }
    r
}

/// Opens interface `ifname` (inside `netns` if given) with rings shaped by `cfg`.
pub fn open(ifname: &str, netns: Option<&str>, cfg: RingConfig) -> io::Result<(RxRing, TxRing)> {
    in_netns(netns, || open_here(ifname, cfg)).map_err(|e| err(format!("port {ifname}"), e))
}

fn open_here(ifname: &str, cfg: RingConfig) -> io::Result<(RxRing, TxRing)> {
    let page = 4096;
    if cfg.rx_block == 0
        || !cfg.rx_block.is_power_of_two()
        || cfg.rx_block < page
        || cfg.rx_blocks == 0
        || cfg.tx_frame < 256
        || !cfg.tx_frame.is_multiple_of(16)
        || !page.is_multiple_of(cfg.tx_frame) && !cfg.tx_frame.is_multiple_of(page)
        || !cfg.rx_block.is_multiple_of(cfg.tx_frame)
        || cfg.tx_frames == 0
    {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad ring geometry"));
    }
    let cname = CString::new(ifname)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad interface name"))?;
    // SAFETY: valid C string.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        return Err(err("no such interface".into(), io::Error::last_os_error()));
    }
    // SAFETY: plain syscall; the fd is owned right after.
    let raw = cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
        .map_err(|e| err("socket(AF_PACKET) (are you root?)".into(), e))?;
    // SAFETY: `raw` is a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let s = fd.as_raw_fd();
    setopt(s, PACKET_VERSION, &TPACKET_V2)?;
    setopt(s, PACKET_IGNORE_OUTGOING, &1 as &libc::c_int)?;
    if cfg.qdisc_bypass {
        setopt(s, PACKET_QDISC_BYPASS, &1 as &libc::c_int)?;
    }
    let rx = TpacketReq {
        block_size: cfg.rx_block,
        block_nr: cfg.rx_blocks,
        frame_size: cfg.tx_frame,
        frame_nr: cfg.rx_block / cfg.tx_frame * cfg.rx_blocks,
    };
    setopt(s, PACKET_RX_RING, &rx).map_err(|e| err("PACKET_RX_RING".into(), e))?;
    let tx_block = cfg.tx_frame.max(page);
    let per_block = tx_block / cfg.tx_frame;
    let tx_blocks = cfg.tx_frames.div_ceil(per_block);
    let tx = TpacketReq {
        block_size: tx_block,
        block_nr: tx_blocks,
        frame_size: cfg.tx_frame,
        frame_nr: tx_blocks * per_block,
    };
    setopt(s, PACKET_TX_RING, &tx).map_err(|e| err("PACKET_TX_RING".into(), e))?;
    let map_len = (rx.block_size as usize) * (rx.block_nr as usize)
        + (tx.block_size as usize) * (tx.block_nr as usize);
    // SAFETY: mapping the socket's rings, as packet(7) prescribes.
    let map = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            s,
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(err("mmap of the rings".into(), io::Error::last_os_error()));
    }
    let Some(map) = NonNull::new(map as *mut u8) else {
        return Err(io::Error::other("mmap returned null"));
    };
    let m = Arc::new(Mapping { fd, map, len: map_len });
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid start.
    let mut sll: libc::sockaddr_ll = unsafe { core::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETH_P_ALL.to_be();
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
    cvt(unsafe {
        libc::bind(
            s,
            &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
            core::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    })
    .map_err(|e| err("bind".into(), e))?;
    let rx_len = rx.block_size as usize * rx.block_nr as usize;
    let rxr = RxRing {
        m: m.clone(),
        frame: rx.frame_size as usize,
        frames: rx.frame_nr,
        next: 0,
        name: ifname.to_string(),
        ifindex,
        stats: RxStats::default(),
    };
    let txr = TxRing {
        m,
        base: rx_len,
        frame: tx.frame_size as usize,
        frames: tx.frame_nr,
        next: 0,
        pending: false,
        name: ifname.to_string(),
        stats: TxStats::default(),
    };
    Ok((rxr, txr))
}

impl RxRing {
    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The interface's index in its namespace (the ifIndex sFlow and IPFIX report).
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The socket, for `poll`.
    pub fn fd(&self) -> RawFd {
        self.m.fd.as_raw_fd()
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        self.m.word(off)
    }

    /// Reads the frames the kernel has written since the last call (at most 256), calling
    /// `f(frame, time_ns)` for each and giving its slot straight back. Returns the frames read.
    #[inline]
    pub fn rx_ready(&mut self, mut f: impl FnMut(&[u8], u64)) -> usize {
        let fs = self.frame;
        let mut read = 0;
        while read < RX_READ_MAX {
            let h = self.next as usize * fs;
            if self.word(h + PKT_STATUS).load(Ordering::Acquire) & TP_STATUS_USER == 0 {
                break;
            }
            let snap = self.word(h + PKT_SNAPLEN).load(Ordering::Relaxed) as usize;
            let len = self.word(h + PKT_LEN).load(Ordering::Relaxed) as usize;
            let mac = (self.word(h + PKT_MAC).load(Ordering::Relaxed) & 0xffff) as usize;
            let sec = u64::from(self.word(h + PKT_SEC).load(Ordering::Relaxed));
            let nsec = u64::from(self.word(h + PKT_NSEC).load(Ordering::Relaxed));
            // Every offset comes from the kernel; check it stays in the slot anyway.
            if mac + snap <= fs {
                // SAFETY: [h+mac, +snap) is inside this frame slot (checked above), which the
                // kernel does not touch until its status is given back below.
                let frame =
                    unsafe { core::slice::from_raw_parts(self.m.map.as_ptr().add(h + mac), snap) };
                if snap < len {
                    self.stats.rx_truncated += 1;
                }
                f(frame, sec * 1_000_000_000 + nsec);
                read += 1;
            }
            self.word(h + PKT_STATUS).store(TP_STATUS_KERNEL, Ordering::Release);
            self.next = (self.next + 1) % self.frames;
        }
        self.stats.rx += read as u64;
        read
    }

    /// Counters; adds the kernel's ring drops since the last call (`PACKET_STATISTICS` resets).
    pub fn stats(&mut self) -> RxStats {
        let mut st = TpacketStats::default();
        // SAFETY: tpacket_stats(_v3) is three u32s: any bits are valid.
        let r = unsafe {
            telemark_socket::getsockopt(self.fd(), SOL_PACKET, PACKET_STATISTICS, &mut st)
        };
        if r.is_ok() {
            self.stats.rx_ring_drops += u64::from(st.drops);
        }
        self.stats
    }
}

impl TxRing {
    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        self.m.word(off)
    }

    /// Counters.
    pub fn stats(&self) -> TxStats {
        self.stats
    }

    /// Queues one frame on the TX ring; false (counted) if the ring is full or the frame too
    /// big. Sent by the next [`Port::kick`].
    #[inline]
    pub fn tx(&mut self, frame: &[u8]) -> bool {
        let fs = self.frame;
        if frame.len() + TPACKET2_HDR > fs {
            self.stats.tx_too_big += 1;
            return false;
        }
        let slot = self.base + self.next as usize * fs;
        let s = self.word(slot + PKT_STATUS).load(Ordering::Acquire);
        if s & TP_STATUS_WRONG_FORMAT != 0 {
            self.stats.tx_errors += 1;
        } else if s != TP_STATUS_AVAILABLE {
            self.stats.tx_full += 1;
            return false;
        }
        // SAFETY: the slot's data area [slot+32, slot+32+len) is inside the TX ring (checked
        // against the frame size) and belongs to us while its status is AVAILABLE.
        unsafe {
            core::ptr::copy_nonoverlapping(
                frame.as_ptr(),
                self.m.map.as_ptr().add(slot + TPACKET2_HDR),
                frame.len(),
            );
        }
        self.word(slot + PKT_LEN).store(frame.len() as u32, Ordering::Relaxed);
        self.word(slot + PKT_SNAPLEN).store(frame.len() as u32, Ordering::Relaxed);
        self.word(slot + PKT_STATUS).store(TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.next = (self.next + 1) % self.frames;
        self.pending = true;
        self.stats.tx += 1;
        true
    }

    /// Asks the kernel to send every queued frame (one syscall per burst, never blocking).
    #[inline]
    pub fn kick(&mut self) {
        if !self.pending {
            return;
        }
        self.pending = false;
        // SAFETY: plain syscall with no buffer: the frames are in the TX ring.
        let r = unsafe {
            libc::sendto(
                self.m.fd.as_raw_fd(),
                core::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                core::ptr::null(),
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                self.stats.tx_kick_errors += 1;
            }
        }
    }
}

/// Waits until one of `fds` is readable or `timeout_ms` passed (the fast path sleeps here only
/// when every RX ring is empty).
pub fn wait_readable(fds: &[RawFd], timeout_ms: i32) {
    let mut p = [libc::pollfd { fd: -1, events: 0, revents: 0 }; 16];
    for (slot, fd) in p.iter_mut().zip(fds) {
        *slot = libc::pollfd { fd: *fd, events: libc::POLLIN | libc::POLLERR, revents: 0 };
    }
    let n = fds.len().min(p.len());
    // SAFETY: `p` holds `n` valid pollfds.
    let ready = unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
    // A port in error (its interface went down or away) makes poll return at once, forever:
    // take the error (SO_ERROR clears it) and wait out the timeout, so the caller's loop naps
    // instead of spinning.
    let broken =
        |f: &libc::pollfd| f.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0;
    let readable = p[..n].iter().any(|f| f.revents & libc::POLLIN != 0);
    if ready > 0 && !readable && p[..n].iter().any(broken) {
        for f in p[..n].iter().filter(|f| broken(f)) {
            // Reading SO_ERROR clears the pending error.
            let _ = telemark_socket::getsockopt_int(f.fd, libc::SOL_SOCKET, libc::SO_ERROR);
        }
        std::thread::sleep(std::time::Duration::from_millis(timeout_ms.max(0) as u64));
    }
}
