//! AF_XDP receive on a veth pair (needs root; CI runs as root): datagrams to the chosen port
//! arrive on the XDP socket byte for byte, other traffic still reaches the kernel's sockets,
//! and the program detaches when dropped.

use std::net::UdpSocket;
use std::process::Command;
use std::time::{Duration, Instant};
use telemark_datapath::xdp::{udp_payload, XdpMode, XdpProgram};

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A namespace `ns` whose veth peer is 10.234.x.2, with this side 10.234.x.1 on `host`.
fn veth(tag: &str, net: u8) -> (Netns, String) {
    let ns = format!("tmx{tag}{}", std::process::id() % 100_000);
    let host = format!("{ns}h");
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    sh(&["ip", "netns", "add", &ns]);
    let guard = Netns(ns.clone());
    sh(&["ip", "link", "add", &host, "type", "veth", "peer", "name", "p0", "netns", &ns]);
    sh(&["ip", "addr", "add", &format!("10.234.{net}.1/30"), "dev", &host]);
    sh(&["ip", "link", "set", &host, "up"]);
    sh(&["ip", "-n", &ns, "addr", "add", &format!("10.234.{net}.2/30"), "dev", "p0"]);
    sh(&["ip", "-n", &ns, "link", "set", "p0", "up"]);
    (guard, host)
}

/// Sends `count` datagrams of `len` bytes from the namespace to `to`, numbered in byte 0..4.
fn send_from(ns: &str, to: &str, count: u32, len: usize) {
    let script = format!(
        "import socket,struct\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         for i in range({count}):\n    s.sendto(struct.pack('!I',i)+bytes([i%251])*{},('{}',{}))\n",
        len - 4,
        to.split(':').next().unwrap(),
        to.split(':').nth(1).unwrap()
    );
    let out =
        Command::new("ip").args(["netns", "exec", ns, "python3", "-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn datagrams_to_the_port_arrive_on_the_xdp_socket_and_the_rest_passes() {
    let (ns, host) = veth("a", 1);
    let port = 32700;
    let prog = XdpProgram::attach(&host, port, XdpMode::Generic).unwrap();
    let mut xsk = prog.socket(0).unwrap();
    // A kernel socket on another port: XDP must leave its traffic alone.
    let other = UdpSocket::bind("10.234.1.1:32701").unwrap();
    other.set_read_timeout(Some(Duration::from_secs(5))).unwrap();

    send_from(&ns.0, &format!("10.234.1.1:{port}"), 500, 300);
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while got.len() < 500 && Instant::now() < until {
        let n = xsk.recv(100).unwrap();
        for i in 0..n {
            let payload = udp_payload(xsk.frame(i)).expect("an IPv4/UDP frame").to_vec();
            got.push(payload);
        }
        xsk.release();
    }
    assert_eq!(got.len(), 500, "the XDP socket received {} of 500", got.len());
    for (i, p) in got.iter().enumerate() {
        assert_eq!(p.len(), 300);
        let n = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
        assert_eq!(n as usize, i, "in order, none missing");
        assert!(p[4..].iter().all(|&b| b == (n % 251) as u8), "payload intact");
    }
    assert_eq!(xsk.stats().rx_ring_full, 0);

    send_from(&ns.0, "10.234.1.1:32701", 1, 50);
    let mut buf = [0u8; 100];
    let (n, _) = other.recv_from(&mut buf).expect("the kernel socket still receives");
    assert_eq!(n, 50);

    // Detached with the program: the port's datagrams reach a kernel socket again.
    drop(xsk);
    drop(prog);
    let s = UdpSocket::bind(format!("10.234.1.1:{port}")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    send_from(&ns.0, &format!("10.234.1.1:{port}"), 1, 40);
    assert_eq!(s.recv_from(&mut buf).expect("after detach").0, 40);
}
