//! Receiving UDP datagrams to one port through AF_XDP, bypassing the kernel's IP and UDP stack
//! (the INT paper's report collector, §III-B).
//!
//! Three kernel objects, made with raw `bpf(2)` calls:
//! - an XSKMAP (queue index to socket);
//! - a small XDP program, [`redirect_program`]. It sends IPv4 (no options) UDP packets for
//!   the chosen port to the queue's socket and passes everything else (ARP, other traffic,
//!   IPv6) on to the kernel, so a UDP socket on the same port still receives what XDP does
//!   not take;
//! - a BPF link that attaches the program to the interface and detaches it when closed.
//!
//! Then one AF_XDP socket per queue: a UMEM of fixed frames, a fill ring that lends frames to
//! the kernel, and an RX ring that gives them back with packets in them. Copy mode works on any
//! driver (veth here). Zero-copy is asked for where the driver has it
//! ([`XdpMode::ZeroCopy`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

const AF_XDP: libc::c_int = 44;
const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_STATISTICS: libc::c_int = 7;
const XDP_COPY: u16 = 1 << 1;
const XDP_ZEROCOPY: u16 = 1 << 2;
const XDP_PGOFF_RX_RING: libc::off_t = 0;
const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// Bytes per UMEM frame.
pub const FRAME: usize = 2048;
/// Frames in a socket's UMEM (half lent to the fill ring at a time).
const FRAMES: usize = 4096;
/// Entries in each ring.
const RING: u32 = 2048;

/// How the program is attached and the socket bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// Generic XDP, copy mode: works on every interface.
    Generic,
    /// The driver's XDP, copy mode.
    Native,
    /// The driver's XDP, zero copy (drivers that have it).
    ZeroCopy,
}

#[repr(C)]
#[derive(Default)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
    flags: u32,
    tx_metadata_len: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct MmapOffsets {
    rx: RingOffset,
    tx: RingOffset,
    fr: RingOffset,
    cr: RingOffset,
}

#[repr(C)]
struct SockaddrXdp {
    family: u16,
    flags: u16,
    ifindex: u32,
    queue_id: u32,
    shared_umem_fd: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    options: u32,
}

/// The kernel's counters for one socket (`XDP_STATISTICS`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct XdpStats {
    /// Dropped for other reasons.
    pub rx_dropped: u64,
    /// Invalid RX descriptors.
    pub rx_invalid_descs: u64,
    /// Invalid TX descriptors.
    pub tx_invalid_descs: u64,
    /// Dropped because the RX ring was full: this collector fell behind.
    pub rx_ring_full: u64,
    /// Times the fill ring had no frame to give.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the TX ring was empty.
    pub tx_ring_empty_descs: u64,
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> io::Result<RawFd> {
    // SAFETY: bpf(2) with a zero-padded attribute buffer larger than every attribute used.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as RawFd)
}

fn put32(a: &mut [u8; 128], at: usize, v: u32) {
    a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(a: &mut [u8; 128], at: usize, v: u64) {
    a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// One eBPF instruction: opcode, registers (dst low nibble, src high), offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | (u64::from(dst & 0xf | (src << 4)) << 8)
        | (u64::from(off as u16) << 16)
        | (u64::from(imm as u32) << 32)
}

/// The XDP program, as eBPF instructions: unfragmented IPv4 (IHL 5) UDP to `port` goes to the
/// XSKMAP entry of the packet's RX queue (`bpf_redirect_map`, falling back to XDP_PASS when no
/// socket is there); anything else, fragments included (the kernel reassembles them for the
/// UDP socket), is passed to the kernel.
pub fn redirect_program(port: u16, map_fd: RawFd) -> Vec<u64> {
    const XDP_PASS: i32 = 2;
    // Loads are little-endian here; the packet is big-endian.
    let be16 = |v: u16| i32::from(u16::from_le_bytes(v.to_be_bytes()));
    let pass = 22; // index of the pass branch
    let to_pass = |at: i16| pass - (at + 1);
    vec![
        insn(0x61, 2, 1, 0, 0),                     // 0: r2 = ctx->data
        insn(0x61, 3, 1, 4, 0),                     // 1: r3 = ctx->data_end
        insn(0xbf, 4, 2, 0, 0),                     // 2: r4 = r2
        insn(0x07, 4, 0, 0, 42),                    // 3: r4 += 14 + 20 + 8
        insn(0x2d, 4, 3, to_pass(4), 0),            // 4: if r4 > r3 goto pass
        insn(0x69, 5, 2, 12, 0),                    // 5: r5 = ethertype
        insn(0x55, 5, 0, to_pass(6), be16(0x0800)), // 6: if r5 != IPv4 goto pass
        insn(0x71, 5, 2, 14, 0),                    // 7: r5 = version, IHL
        insn(0x55, 5, 0, to_pass(8), 0x45),         // 8: if r5 != 0x45 goto pass
        insn(0x69, 5, 2, 20, 0),                    // 9: r5 = flags, fragment offset
        insn(0x57, 5, 0, 0, be16(0x3fff)),          // 10: r5 &= MF | offset
        insn(0x55, 5, 0, to_pass(11), 0),           // 11: a fragment: goto pass (kernel)
        insn(0x71, 5, 2, 23, 0),                    // 12: r5 = protocol
        insn(0x55, 5, 0, to_pass(13), 17),          // 13: if r5 != UDP goto pass
        insn(0x69, 5, 2, 36, 0),                    // 14: r5 = destination port
        insn(0x55, 5, 0, to_pass(15), be16(port)),  // 15: if r5 != port goto pass
        insn(0x61, 2, 1, 16, 0),                    // 16: r2 = ctx->rx_queue_index
        insn(0x18, 1, 1, 0, map_fd),                // 17: r1 = the XSKMAP (pseudo map fd)
        insn(0x00, 0, 0, 0, 0),                     // 18: (second half of the 64-bit load)
        insn(0xb7, 3, 0, 0, XDP_PASS),              // 19: r3 = fallback action
        insn(0x85, 0, 0, 0, 51),                    // 20: call bpf_redirect_map
        insn(0x95, 0, 0, 0, 0),                     // 21: exit
        insn(0xb7, 0, 0, 0, XDP_PASS),              // 22: pass: r0 = XDP_PASS
        insn(0x95, 0, 0, 0, 0),                     // 23: exit
    ]
}

/// The program attached to an interface, and its map; detached when dropped.
pub struct XdpProgram {
    map: OwnedFd,
    _prog: OwnedFd,
    _link: OwnedFd,
    ifindex: u32,
    mode: XdpMode,
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by the kernel to this process and is owned here.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

impl XdpProgram {
    /// Loads the program for UDP `port` and attaches it to interface `ifname`.
    pub fn attach(ifname: &str, port: u16, mode: XdpMode) -> io::Result<XdpProgram> {
        let c = std::ffi::CString::new(ifname).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface {ifname}")));
        }
        let mut a = [0u8; 128];
        put32(&mut a, 0, BPF_MAP_TYPE_XSKMAP);
        put32(&mut a, 4, 4);
        put32(&mut a, 8, 4);
        put32(&mut a, 12, 64);
        let map = owned(bpf(BPF_MAP_CREATE, &mut a).map_err(|e| ctx(e, "creating the XSKMAP"))?);
        let prog = redirect_program(port, map.as_raw_fd());
        let license = c"GPL";
        let mut log = vec![0u8; 64 * 1024];
        let mut a = [0u8; 128];
        put32(&mut a, 0, BPF_PROG_TYPE_XDP);
        put32(&mut a, 4, prog.len() as u32);
        put64(&mut a, 8, prog.as_ptr() as u64);
        put64(&mut a, 16, license.as_ptr() as u64);
        put32(&mut a, 24, 1);
        put32(&mut a, 28, log.len() as u32);
        put64(&mut a, 32, log.as_mut_ptr() as u64);
        a[48..48 + 10].copy_from_slice(b"tm_int_xsk");
        put32(&mut a, 68, BPF_XDP);
        let prog_fd = match bpf(BPF_PROG_LOAD, &mut a) {
            Ok(fd) => owned(fd),
            Err(e) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(0);
                let why = String::from_utf8_lossy(&log[..end]).into_owned();
                return Err(ctx(e, &format!("loading the XDP program: {why}")));
            }
        };
        let mut a = [0u8; 128];
        put32(&mut a, 0, prog_fd.as_raw_fd() as u32);
        put32(&mut a, 4, ifindex);
        put32(&mut a, 8, BPF_XDP);
        let flags = match mode {
            XdpMode::Generic => XDP_FLAGS_SKB_MODE,
            XdpMode::Native | XdpMode::ZeroCopy => XDP_FLAGS_DRV_MODE,
        };
        put32(&mut a, 12, flags);
        let link = owned(
            bpf(BPF_LINK_CREATE, &mut a)
                .map_err(|e| ctx(e, &format!("attaching XDP to {ifname}")))?,
        );
        Ok(XdpProgram { map, _prog: prog_fd, _link: link, ifindex, mode })
    }

    /// Opens an AF_XDP socket on RX queue `queue` and registers it in the map.
    pub fn socket(&self, queue: u32) -> io::Result<XskRx> {
        let rx = XskRx::open(self.ifindex, queue, self.mode)?;
        let mut a = [0u8; 128];
        let key = queue;
        let value = rx.fd.as_raw_fd() as u32;
        put32(&mut a, 0, self.map.as_raw_fd() as u32);
        put64(&mut a, 8, &key as *const u32 as u64);
        put64(&mut a, 16, &value as *const u32 as u64);
        bpf(BPF_MAP_UPDATE_ELEM, &mut a).map_err(|e| ctx(e, "registering the socket"))?;
        Ok(rx)
    }
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A ring mapped from the socket: producer and consumer indexes and the entries.
struct Ring {
    base: *mut u8,
    len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    desc: *mut u8,
    mask: u32,
}

impl Ring {
    fn map(fd: RawFd, off: RingOffset, pgoff: libc::off_t, entry: usize) -> io::Result<Ring> {
        let len = off.desc as usize + RING as usize * entry;
        // SAFETY: mapping the socket's ring at the offsets the kernel gave.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(ctx(io::Error::last_os_error(), "mapping an AF_XDP ring"));
        }
        let b = base.cast::<u8>();
        // SAFETY: the offsets are inside the mapping, and the indexes are 4-byte aligned.
        unsafe {
            Ok(Ring {
                base: b,
                len,
                producer: b.add(off.producer as usize).cast(),
                consumer: b.add(off.consumer as usize).cast(),
                desc: b.add(off.desc as usize),
                mask: RING - 1,
            })
        }
    }
    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping.
        unsafe { &*self.producer }
    }
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping.
        unsafe { &*self.consumer }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map` mapped.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The packet buffer area, unmapped when dropped.
struct Umem(*mut u8);

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: unmapping what `XskRx::open` mapped, of that size.
        unsafe { libc::munmap(self.0.cast(), FRAMES * FRAME) };
    }
}

/// One AF_XDP socket receiving on one queue. Fields drop in order: the rings' mappings, then
/// the socket (the kernel lets go of the UMEM), then the UMEM.
pub struct XskRx {
    rx: Ring,
    fill: Ring,
    _comp: Ring,
    fd: OwnedFd,
    umem: Umem,
    /// Frames taken from the RX ring in the current batch: (address, length).
    batch: Vec<(u64, u32)>,
}

// SAFETY: the socket, its mappings and its UMEM belong to this value alone; moving it to
// another thread moves all of them.
unsafe impl Send for XskRx {}

fn sockopt<T>(fd: RawFd, name: libc::c_int, v: &T) -> io::Result<()> {
    telemark_socket::setsockopt(fd, SOL_XDP, name, v)
}

impl XskRx {
    fn open(ifindex: u32, queue: u32, mode: XdpMode) -> io::Result<XskRx> {
        // SAFETY: plain socket(2).
        let raw = unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(ctx(io::Error::last_os_error(), "AF_XDP socket"));
        }
        let fd = owned(raw);
        let size = FRAMES * FRAME;
        // SAFETY: an anonymous private mapping for the UMEM.
        let umem = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(ctx(io::Error::last_os_error(), "UMEM"));
        }
        let umem = Umem(umem.cast());
        let reg = UmemReg {
            addr: umem.0 as u64,
            len: size as u64,
            chunk_size: FRAME as u32,
            ..UmemReg::default()
        };
        let raw = fd.as_raw_fd();
        sockopt(raw, XDP_UMEM_REG, &reg).map_err(|e| ctx(e, "XDP_UMEM_REG"))?;
        sockopt(raw, XDP_UMEM_FILL_RING, &RING).map_err(|e| ctx(e, "fill ring"))?;
        sockopt(raw, XDP_UMEM_COMPLETION_RING, &RING).map_err(|e| ctx(e, "completion ring"))?;
        sockopt(raw, XDP_RX_RING, &RING).map_err(|e| ctx(e, "RX ring"))?;
        let mut off = MmapOffsets::default();
        // SAFETY: xdp_mmap_offsets is u64s only: any bits are valid.
        let len = unsafe { telemark_socket::getsockopt(raw, SOL_XDP, XDP_MMAP_OFFSETS, &mut off) }
            .map_err(|e| ctx(e, "XDP_MMAP_OFFSETS"))?;
        if len != core::mem::size_of::<MmapOffsets>() {
            // Kernels before 5.4 answer without the flags words.
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "AF_XDP needs Linux 5.4 or later",
            ));
        }
        let rx = Ring::map(raw, off.rx, XDP_PGOFF_RX_RING, core::mem::size_of::<Desc>())?;
        let fill = Ring::map(raw, off.fr, XDP_UMEM_PGOFF_FILL_RING, 8)?;
        let comp = Ring::map(raw, off.cr, XDP_UMEM_PGOFF_COMPLETION_RING, 8)?;
        let sa = SockaddrXdp {
            family: AF_XDP as u16,
            flags: if mode == XdpMode::ZeroCopy { XDP_ZEROCOPY } else { XDP_COPY },
            ifindex,
            queue_id: queue,
            shared_umem_fd: 0,
        };
        // SAFETY: a sockaddr_xdp of its own size.
        let r = unsafe {
            libc::bind(
                raw,
                (&sa as *const SockaddrXdp).cast(),
                core::mem::size_of::<SockaddrXdp>() as u32,
            )
        };
        if r < 0 {
            return Err(ctx(
                io::Error::last_os_error(),
                &format!("binding AF_XDP to queue {queue}"),
            ));
        }
        let mut x = XskRx { rx, fill, _comp: comp, fd, umem, batch: Vec::with_capacity(64) };
        // Lend the first half of the frames to the kernel.
        x.refill((0..RING as u64).map(|i| i * FRAME as u64));
        Ok(x)
    }

    fn refill(&mut self, addrs: impl Iterator<Item = u64>) {
        let prod = self.fill.producer().load(Ordering::Relaxed);
        let mut n = 0u32;
        for a in addrs {
            let slot = (prod.wrapping_add(n) & self.fill.mask) as usize;
            // SAFETY: the fill ring holds RING u64 entries; this one is ours until published.
            unsafe { self.fill.desc.cast::<u64>().add(slot).write(a) };
            n += 1;
        }
        self.fill.producer().store(prod.wrapping_add(n), Ordering::Release);
    }

    /// Waits up to `timeout_ms` for packets and takes up to 64; read them with
    /// [`frame`](Self::frame), then give them back with [`release`](Self::release).
    pub fn recv(&mut self, timeout_ms: i32) -> io::Result<usize> {
        self.batch.clear();
        let mut cons = self.rx.consumer().load(Ordering::Relaxed);
        let mut prod = self.rx.producer().load(Ordering::Acquire);
        if prod == cons {
            let mut p = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one live pollfd.
            let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
            if r < 0 {
                let e = io::Error::last_os_error();
                return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
            }
            prod = self.rx.producer().load(Ordering::Acquire);
        }
        while cons != prod && self.batch.len() < 64 {
            let slot = (cons & self.rx.mask) as usize;
            // SAFETY: entries between consumer and producer are the kernel's completed ones.
            let d = unsafe { self.rx.desc.cast::<Desc>().add(slot).read() };
            self.batch.push((d.addr, d.len));
            cons = cons.wrapping_add(1);
        }
        self.rx.consumer().store(cons, Ordering::Release);
        Ok(self.batch.len())
    }

    /// Frame `i` of the last batch (the whole Ethernet frame).
    pub fn frame(&self, i: usize) -> &[u8] {
        let Some(&(addr, len)) = self.batch.get(i) else { return &[] };
        let (addr, len) = (addr as usize, (len as usize).min(FRAME));
        if addr + len > FRAMES * FRAME {
            return &[];
        }
        // SAFETY: inside the UMEM, which lives as long as `self`; the kernel does not write a
        // frame until it is given back.
        unsafe { core::slice::from_raw_parts(self.umem.0.add(addr), len) }
    }

    /// Gives the last batch's frames back to the kernel.
    pub fn release(&mut self) {
        let batch = std::mem::take(&mut self.batch);
        self.refill(batch.iter().map(|&(a, _)| a - a % FRAME as u64));
        self.batch = batch;
        self.batch.clear();
    }

    /// The kernel's counters for this socket.
    pub fn stats(&self) -> XdpStats {
        let mut s = XdpStats::default();
        // SAFETY: xdp_statistics is u64s only: any bits are valid (the kernel fills what it
        // has; an error leaves zeros).
        let _ = unsafe {
            telemark_socket::getsockopt(self.fd.as_raw_fd(), SOL_XDP, XDP_STATISTICS, &mut s)
        };
        s
    }
}

/// The UDP payload of an Ethernet / IPv4 (IHL 5) / UDP frame, as the program filters them.
pub fn udp_payload(frame: &[u8]) -> Option<&[u8]> {
    let udp_len = usize::from(u16::from_be_bytes([*frame.get(38)?, *frame.get(39)?]));
    frame.get(42..34 + udp_len.max(8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_shape() {
        let p = redirect_program(32766, 7);
        assert_eq!(p.len(), 24);
        // The 64-bit map load names the map fd as a pseudo map fd (src 1).
        assert_eq!(p[17] & 0xff, 0x18);
        assert_eq!((p[17] >> 12) & 0xf, 1);
        assert_eq!((p[17] >> 32) as u32, 7);
        // Every jump lands on the pass branch.
        for at in [4usize, 6, 8, 11, 13, 15] {
            let off = ((p[at] >> 16) & 0xffff) as i16;
            assert_eq!(at as i16 + 1 + off, 22);
        }
    }
}
