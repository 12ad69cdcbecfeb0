//! Helpers shared by the integration tests that run `telemark collector` as a process, hand
//! exported datagrams to tshark, or build testbeds of network namespaces as root (the eBPF
//! tests). Each test binary uses some of them.
#![allow(dead_code)]

pub mod chain;
pub mod pg;

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A child process, killed (SIGKILL) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `telemark collector` storing in `db`, its flow listener on a free loopback UDP port, with
/// `extra` flags: the process, its HTTP base URL, and the flow port.
pub fn collector(db: &Path, extra: &[&str]) -> (Proc, String, u16) {
    let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let args: Vec<&str> =
        ["--flows-listen", listen.as_str()].into_iter().chain(extra.iter().copied()).collect();
    let (child, base) = spawn_collector(db, &args);
    (Proc(child), base, port)
}

/// `telemark collector` on a free loopback HTTP port, storing in `db`, with `extra` flags: the
/// process and its HTTP base URL, once it said where it listens.
pub fn spawn_collector(db: &Path, extra: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["collector", "--listen", "127.0.0.1:0", "--retention", "0", "--db"])
        .arg(db)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("collector starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let base = loop {
        let line = lines.next().expect("collector says where it listens").unwrap();
        if let Some(rest) = line.split("http://").nth(1) {
            break format!("http://{}", rest.split_whitespace().next().unwrap());
        }
    };
    // Keep reading its log so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, base)
}

/// A classic pcap of `payloads`, each (destination port, bytes) in a raw IPv4/UDP packet from
/// 127.0.0.1:40000 to 127.0.0.1, for tshark.
pub fn write_udp_pcap(path: &Path, payloads: &[(u16, Vec<u8>)]) {
    let mut f = Vec::new();
    for v in [0xa1b2_c3d4u32.to_le_bytes(), [2, 0, 4, 0], [0; 4], [0; 4]] {
        f.extend_from_slice(&v);
    }
    f.extend_from_slice(&65_535u32.to_le_bytes());
    f.extend_from_slice(&101u32.to_le_bytes()); // LINKTYPE_RAW
    for (i, (port, p)) in payloads.iter().enumerate() {
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&((28 + p.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&(i as u16).to_be_bytes());
        ip.extend_from_slice(&[0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1]);
        let mut sum: u32 = ip.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        let mut fr = ip;
        fr.extend_from_slice(&40000u16.to_be_bytes());
        fr.extend_from_slice(&port.to_be_bytes());
        fr.extend_from_slice(&((8 + p.len()) as u16).to_be_bytes());
        fr.extend_from_slice(&[0, 0]);
        fr.extend_from_slice(p);
        for v in [i as u32, 0, fr.len() as u32, fr.len() as u32] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.extend_from_slice(&fr);
    }
    std::fs::write(path, f).unwrap();
}

/// The IP packets tshark counts in a capture.
pub fn tshark_ip_packets(capture: &Path) -> u64 {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(capture)
        .args(["-Y", "ip or ipv6", "-T", "fields", "-e", "frame.number"])
        .stderr(Stdio::null())
        .output()
        .expect("tshark runs");
    String::from_utf8_lossy(&out.stdout).lines().count() as u64
}

/// tshark's fields `fields` of the packets of `pcap` that match `filter`, one line per packet,
/// fields separated by tabs and a field's occurrences by `;`. `decode`: `-d` rules such as
/// `udp.port==4739,cflow`. Open vSwitch's templates have up to 67 fields, beyond tshark's
/// default of 60.
pub fn tshark_fields(pcap: &Path, decode: &[String], filter: &str, fields: &[&str]) -> String {
    let mut c = Command::new("timeout");
    c.args(["60", "tshark", "-r"]).arg(pcap).args(["-o", "cflow.max_template_fields:200"]);
    for d in decode {
        c.args(["-d", d]);
    }
    if !filter.is_empty() {
        c.args(["-Y", filter]);
    }
    c.args(["-T", "fields", "-E", "occurrence=a", "-E", "aggregator=;"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let out = c.output().expect("tshark runs (Debian package tshark)");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const OVS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/ovs.sh");

/// An Open vSwitch bridge (userspace datapath, testbed/ovs.sh) between two namespaces.
pub struct Ovs {
    /// The names' prefix (`ovs.sh PREFIX …`).
    pub prefix: String,
}

impl Ovs {
    /// Runs `ovs.sh PREFIX ARGS…` (OVS_DATAPATH=dummy), asserting it succeeded.
    pub fn run(&self, args: &[&str]) {
        let out = Command::new("timeout")
            .args(["60", "bash", OVS, &self.prefix])
            .args(args)
            .env("OVS_DATAPATH", "dummy")
            .output()
            .expect("bash runs");
        assert!(out.status.success(), "ovs.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Ovs {
    fn drop(&mut self) {
        let _ = Command::new("timeout")
            .args(["60", "bash", OVS, &self.prefix, "down"])
            .env("OVS_DATAPATH", "dummy")
            .output();
    }
}

/// Runs `cmd` with `sh -c`, asserting it succeeded; its standard output.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed (this test needs root, iproute2, nftables, bpftool): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `f` on a thread inside namespace `ns`.
pub fn in_ns<R: Send>(ns: &str, f: impl FnOnce() -> R + Send) -> R {
    telemark_datapath::ebpf::in_netns(Some(ns), f).expect("enter the namespace")
}

/// Telemark's programs still loaded, once the kernel has had up to 3 s to free those of an
/// exited agent (a program is freed after its last reference, asynchronously).
pub fn our_programs() -> usize {
    let mut n = 0;
    for _ in 0..30 {
        n = sh("bpftool prog show").matches("name tm_").count();
        if n == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    n
}

/// The segment names `reason` for the kernel's `count` drops ([`named_of`]).
pub fn named(segment: &serde_json::Value, reason: &str, count: u64) {
    let n = segment["drops"][reason].as_u64().unwrap_or(0);
    named_of(reason, n, count, segment);
}

/// `n` drops named for `reason` against the `count` the rule that dropped counted: never
/// more, and within 3 %. The agent names every drop of a measured flow its program was
/// handed; on Linux 6.18 the kernel handed tracing programs up to 4 in 160 fewer
/// `kfree_skb` events than its own trace buffer recorded (docs/ebpf.md, "Limits").
pub fn named_of(reason: &str, n: u64, count: u64, context: impl std::fmt::Display) {
    assert!(
        n <= count && (count - n) * 100 <= count * 3,
        "{reason}: {n} named of {count}: {context}"
    );
}

/// Of the `queue_all` packets a router's queue (tbf) dropped, the test's: those of the `sent`
/// that the receiver's count and the other droppers' (`accounted`) leave. tbf also drops the
/// router's own packets now and then (an ARP request, an IPv6 neighbour solicitation); at
/// most 2 are allowed for.
pub fn test_queue_drops(queue_all: u64, sent: u64, accounted: u64) -> u64 {
    let queue = sent
        .checked_sub(accounted)
        .unwrap_or_else(|| panic!("received and dropped elsewhere {accounted} > sent {sent}"));
    assert!(queue_all >= queue && queue_all - queue <= 2, "tbf {queue_all}, the test's {queue}");
    queue
}

/// Counter `what` ("packets " of nftables, "dropped " of tc) of a listing.
pub fn counter(listing: &str, what: &str) -> u64 {
    listing
        .split(what)
        .nth(1)
        .and_then(|s| s.split([',', ' ']).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no {what:?} in {listing}"))
}

/// Telemark's collector in this process, storing in `dir`/collector.db, listening on a free
/// loopback port: it and its base URL.
pub fn collector_in_process(dir: &Path) -> (telemark_collector::Collector, String) {
    let cfg = telemark_collector::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: dir.join("collector.db"),
        ..telemark_collector::Config::default()
    };
    let c = telemark_collector::Collector::start(&cfg).unwrap();
    let url = format!("http://{}", c.addr);
    (c, url)
}

/// A classic pcap (Ethernet) of `frames` at their times (ns since the epoch).
pub fn write_ethernet_pcap(path: &Path, frames: &[(u64, Vec<u8>)]) {
    let mut f = Vec::new();
    for v in [0xa1b2_c3d4u32.to_le_bytes(), [2, 0, 4, 0], [0; 4], [0; 4]] {
        f.extend_from_slice(&v);
    }
    f.extend_from_slice(&65_535u32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes());
    for (t, fr) in frames {
        let (s, us) = ((t / 1_000_000_000) as u32, ((t % 1_000_000_000) / 1000) as u32);
        for v in [s, us, fr.len() as u32, fr.len() as u32] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.extend_from_slice(fr);
    }
    std::fs::write(path, f).unwrap();
}

/// Sets socket option `name` at `level` to `v`.
pub fn set_int(sock: &UdpSocket, level: i32, name: i32, v: i32) {
    // SAFETY: a valid socket and a c_int option value.
    let rc =
        unsafe { libc::setsockopt(sock.as_raw_fd(), level, name, (&v as *const i32).cast(), 4) };
    assert_eq!(rc, 0, "setsockopt");
}

/// One datagram's source port and TOS byte (IP_RECVTOS); `None` at the timeout.
pub fn recv_port_tos(sock: &UdpSocket) -> Option<(u16, u8)> {
    let mut buf = [0u8; 2048];
    let mut ctl = [0u64; 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr pointing at live buffers; recvmsg fills them.
    unsafe {
        let mut from: libc::sockaddr_in = std::mem::zeroed();
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_name = (&mut from as *mut libc::sockaddr_in).cast();
        m.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.as_mut_ptr().cast();
        m.msg_controllen = std::mem::size_of_val(&ctl);
        if libc::recvmsg(sock.as_raw_fd(), &mut m, 0) < 0 {
            return None;
        }
        let c = libc::CMSG_FIRSTHDR(&m);
        assert!(!c.is_null() && (*c).cmsg_type == libc::IP_TOS, "no IP_TOS control message");
        Some((u16::from_be(from.sin_port), *libc::CMSG_DATA(c)))
    }
}
