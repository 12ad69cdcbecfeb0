//! The eBPF programs on real interfaces (needs root, iproute2 and nftables, as CI has):
//! sender → router namespace → receiver, the programs attached inside the router namespace
//! (marker at the ingress of the link in, unmarker at the egress of the link out), nftables
//! dropping a share of the flow in the router's forward chain. Ground truth: the datagrams
//! sent, nftables' own counter of what it dropped, and what the receiver got.

use std::collections::HashMap;
use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;
use telemark_datapath::ebpf::maps::{
    Clock, EgressAction, IngressAction, OwnColour, Port, Stat, NO_POINT,
};
use telemark_datapath::ebpf::periods::{PeriodReader, Reading};
use telemark_datapath::ebpf::{self, btf, in_netns, Programs, Settings, Target};

struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("tmb-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        sh(&format!("ip netns add {name}"));
        Netns(name)
    }
    fn exec(&self, cmd: &str) {
        sh(&format!("ip netns exec {} {cmd}", self.0));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed (these tests need root, iproute2, nftables): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// sender (10.77.1.1) — r-in | router | r-out — receiver (10.77.2.2).
struct Line {
    s: Netns,
    r: Netns,
    d: Netns,
}

fn line(tag: &str) -> Line {
    let (s, r, d) = (
        Netns::new(&format!("{tag}s")),
        Netns::new(&format!("{tag}r")),
        Netns::new(&format!("{tag}d")),
    );
    let pid = std::process::id();
    sh(&format!("ip link add tmb{pid}{tag}a netns {} type veth peer name r-in netns {}", s.0, r.0));
    sh(&format!(
        "ip link add tmb{pid}{tag}b netns {} type veth peer name r-out netns {}",
        d.0, r.0
    ));
    s.exec(&format!("ip link set tmb{pid}{tag}a name s0"));
    d.exec(&format!("ip link set tmb{pid}{tag}b name d0"));
    for (ns, dev, addr, gw) in
        [(&s, "s0", "10.77.1.1/24", "10.77.1.254"), (&d, "d0", "10.77.2.2/24", "10.77.2.254")]
    {
        ns.exec(&format!("ip addr add {addr} dev {dev}"));
        ns.exec(&format!("ip link set {dev} up"));
        ns.exec("ip link set lo up");
        ns.exec(&format!("ip route add default via {gw}"));
    }
    r.exec("ip addr add 10.77.1.254/24 dev r-in");
    r.exec("ip addr add 10.77.2.254/24 dev r-out");
    r.exec("ip link set r-in up");
    r.exec("ip link set r-out up");
    r.exec("sysctl -qw net.ipv4.ip_forward=1");
    Line { s, r, d }
}

fn set_int(sock: &UdpSocket, level: i32, name: i32, v: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid socket and a c_int option value.
    let rc =
        unsafe { libc::setsockopt(sock.as_raw_fd(), level, name, (&v as *const i32).cast(), 4) };
    assert_eq!(rc, 0, "setsockopt");
}

/// One datagram's first 8 bytes (the sender's sequence number) and TOS byte, from its IP_TOS
/// control message; `None` at the timeout.
fn recv_tos(sock: &UdpSocket) -> Option<(u64, u8)> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 2048];
    let mut ctl = [0u64; 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr pointing at live buffers; recvmsg fills them.
    unsafe {
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.as_mut_ptr().cast();
        m.msg_controllen = std::mem::size_of_val(&ctl);
        if libc::recvmsg(sock.as_raw_fd(), &mut m, 0) < 0 {
            return None;
        }
        let c = libc::CMSG_FIRSTHDR(&m);
        assert!(!c.is_null() && (*c).cmsg_type == libc::IP_TOS, "no IP_TOS control message");
        let seq = u64::from_be_bytes(buf[..8].try_into().unwrap_or_default());
        Some((seq, *libc::CMSG_DATA(c)))
    }
}

/// The default: a flow whose sender set the colour bit is left as it is, and not measured.
#[test]
fn marks_counts_and_names_the_drops_of_a_flow_through_a_router() {
    through_a_router("m", OwnColour::Keep);
}

/// A domain that reserves the bit: every packet coloured, the flow's own bit given back by the
/// exit on the marker's host.
#[test]
fn a_domain_that_reserves_the_bit_colours_every_flow_and_gives_its_own_back() {
    through_a_router("o", OwnColour::Overwrite);
}

fn through_a_router(tag: &str, own_colour: OwnColour) {
    let l = line(tag);
    // Drop about 10 % of the flow in the router, counted by nftables itself.
    l.r.exec(
        "nft 'add table inet tmb; add chain inet tmb fw { type filter hook forward priority 0; }; \
         add rule inet tmb fw udp dport 7777 numgen random mod 10 == 0 counter drop'",
    );
    // Periods of 100 ms, or 16 ticks on a slower kernel: the exit counts on the tick clock (a
    // tick at most an eighth of the guard), the marker on the fine one.
    let tick = ebpf::tick_ns();
    let t = (16 * tick).max(100_000_000);
    assert_eq!(ebpf::clock_for(t, t / 2), Clock::Tick);
    let settings = Settings {
        period_ns: t,
        guard_ns: t / 2,
        colour_bit: 0,
        own_colour,
        ..Settings::default()
    };
    let mut p = Programs::load(4096, settings).expect("load the programs (root, BTF)");
    assert_eq!(p.drops_unavailable, None, "kfree_skb program");
    let ns = Some(l.r.0.clone());
    let a_in = p
        .attach(
            &Target { netns: ns.clone(), iface: "r-in".into() },
            Port {
                in_point: 0,
                out_point: NO_POINT,
                in_action: IngressAction::Mark as u8,
                out_action: EgressAction::Count as u8,
            },
        )
        .expect("attach r-in");
    let a_out = p
        .attach(
            &Target { netns: ns.clone(), iface: "r-out".into() },
            Port {
                in_point: NO_POINT,
                out_point: 1,
                in_action: IngressAction::Count as u8,
                out_action: EgressAction::Unmark as u8,
            },
        )
        .expect("attach r-out");

    // The receiver, reading each datagram's TOS (IP_RECVTOS): the DSCP it was sent with.
    let rx = |port: u16| {
        let d = l.d.0.clone();
        std::thread::spawn(move || {
            in_netns(Some(&d), || {
                let sock = UdpSocket::bind(("10.77.2.2", port)).unwrap();
                sock.set_read_timeout(Some(Duration::from_millis(800))).unwrap();
                set_int(&sock, libc::IPPROTO_IP, libc::IP_RECVTOS, 1);
                // Each TOS's count, and the datagrams in the order they came.
                let mut tos = std::collections::BTreeMap::<u8, u64>::new();
                let mut order = Vec::new();
                while let Some((seq, t)) = recv_tos(&sock) {
                    *tos.entry(t).or_default() += 1;
                    order.push((seq, t));
                }
                (tos, order)
            })
            .unwrap()
        })
    };
    let (rx_main, rx_own) = (rx(7777), rx(7778));
    std::thread::sleep(Duration::from_millis(200));
    const SENT: u64 = 3000;
    let sent_from = ebpf::now();
    // DSCP 10 (AF11, colour bit 0 clear) on the measured flow; DSCP 11 (bit 0 set) on another.
    const TOS_MAIN: u8 = 10 << 2;
    const TOS_OWN: u8 = 11 << 2;
    let sender = std::thread::spawn({
        let s = l.s.0.clone();
        move || {
            in_netns(Some(&s), || {
                let main = UdpSocket::bind("10.77.1.1:6666").unwrap();
                set_int(&main, libc::IPPROTO_IP, libc::IP_TOS, TOS_MAIN.into());
                let own = UdpSocket::bind("10.77.1.1:6667").unwrap();
                set_int(&own, libc::IPPROTO_IP, libc::IP_TOS, TOS_OWN.into());
                for i in 0..SENT {
                    main.send_to(&i.to_be_bytes(), "10.77.2.2:7777").unwrap();
                    if i % 10 == 0 {
                        own.send_to(&i.to_be_bytes(), "10.77.2.2:7778").unwrap();
                    }
                    if i % 50 == 49 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            })
            .unwrap()
        }
    });
    // Read as the agent does, twice a period: a slot holds a colour's last two periods.
    let mut reader = PeriodReader::with_settle(t, t / 2, ebpf::settle_ns(t, t / 2));
    let mut out = Vec::new();
    let mut read = |p: &mut Programs, out: &mut Vec<Reading>| {
        let now = ebpf::now();
        p.for_each_count(|k, cpus| reader.read(now, k, cpus, out)).unwrap();
        p.set_read_upto(reader.final_upto(now)).unwrap();
    };
    while !sender.is_finished() {
        read(&mut p, &mut out);
        std::thread::sleep(Duration::from_nanos(t / 2));
    }
    sender.join().unwrap();
    let sent_to = ebpf::now();
    let ((tos_main, order), (tos_own, _)) = (rx_main.join().unwrap(), rx_own.join().unwrap());
    // The receiver sees the sender's DSCP. With Keep, one exception (docs/ebpf.md): where the
    // flow's first datagram, held back from colour 1, was lost before the exit, the exit takes
    // the bit for the sender's until a datagram comes without it; then only the datagrams
    // before that one, and none after, carry it.
    let changed = order.iter().take_while(|(_, t)| *t != TOS_MAIN).count();
    let first_lost = order.first().is_some_and(|(seq, _)| *seq != 0);
    if own_colour == OwnColour::Keep && first_lost && changed > 0 {
        eprintln!("the first datagram was lost; the {changed} after it kept the bit");
        assert!(order[changed..].iter().all(|(_, t)| *t == TOS_MAIN), "{order:?}");
        assert!(changed < 1000, "{changed} datagrams kept the bit");
    } else {
        assert_eq!(
            tos_main.keys().collect::<Vec<_>>(),
            vec![&TOS_MAIN],
            "the receiver sees the sender's DSCP"
        );
    }
    assert_eq!(
        tos_own.keys().collect::<Vec<_>>(),
        vec![&TOS_OWN],
        "a flow's own colour bit is given back"
    );
    let received: u64 = tos_main.values().sum();
    let own_sent = SENT.div_ceil(10);
    assert_eq!(tos_own.values().sum::<u64>(), own_sent, "the other flow is not dropped");
    // The flow with its own bit: left as it was, each packet counted in map "own" at the
    // marker (Keep); coloured and counted like any other (Overwrite).
    let own: Vec<(u16, u8, u64)> =
        p.own_colour().unwrap().iter().map(|(k, n)| (k.sport, k.point, *n)).collect();
    let unsure: Vec<(u16, u8)> = p.unsure().unwrap().iter().map(|k| (k.sport, k.point)).collect();
    let stat = |s: Stat| p.stats().unwrap().into_iter().find(|(x, _)| *x == s).unwrap().1;
    match own_colour {
        OwnColour::Keep => {
            assert_eq!(own, vec![(6667, 0, own_sent)], "map own");
            assert_eq!(unsure, vec![(6667, 1)], "the exit left the sender's bit");
            assert_eq!(stat(Stat::OwnColour), own_sent);
        }
        OwnColour::Overwrite => {
            assert_eq!((own, unsure), (vec![], vec![]));
            assert_eq!(stat(Stat::Held), 0, "no flow held back");
        }
    }
    let nft = sh(&format!("ip netns exec {} nft list chain inet tmb fw", l.r.0));
    let dropped: u64 = nft
        .split("packets ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("nft counter");
    assert_eq!(received + dropped, SENT, "every datagram received or dropped by the rule");
    assert!(dropped > 100, "the rule dropped {dropped}");

    // The last periods: per point, packets over all periods.
    std::thread::sleep(Duration::from_nanos(2 * t));
    read(&mut p, &mut out);
    let overrun = p.stats().unwrap().into_iter().find(|(s, _)| *s == Stat::Overrun).unwrap().1;
    assert_eq!(overrun, 0, "a period was overwritten before it was read");
    let mut per_point: HashMap<u8, u64> = HashMap::new();
    let mut periods: HashMap<u8, usize> = HashMap::new();
    let mut times: HashMap<(u8, u64), (u64, u64)> = HashMap::new();
    for r in &out {
        if let Reading::Closed(c) = r {
            let f = c.key.flow();
            if f.dport == 7778 && c.key.point == 0 {
                // (Points after the marker count it: user space leaves those counts out.)
                assert_eq!(own_colour, OwnColour::Overwrite, "the marker counted a flow it left");
            }
            if f.dport == 7777 {
                assert_eq!(f.src.to_string(), "10.77.1.1");
                times.insert((c.key.point, c.period), (c.first_ns, c.last_ns));
                *per_point.entry(c.key.point).or_default() += c.packets;
                *periods.entry(c.key.point).or_default() += 1;
            }
        }
    }
    assert_eq!(per_point.get(&0), Some(&SENT), "the marker counted every datagram");
    assert_eq!(per_point.get(&1), Some(&received), "the exit counted what was delivered");
    assert!(periods[&0] >= 3, "the flow spanned several periods: {periods:?}");
    // The clocks: the marker's batches (the fine clock) within the sending and their periods,
    // and the exit's (the tick clock, up to a tick behind or, read with another CPU's offset,
    // ahead) within the marker's, give or take a tick: the exit saw some of the same packets
    // (nftables drops a tenth between them) microseconds later.
    // A flow's first packet, if its period is of colour 1, is held back to colour 0 (Keep):
    // counted in the period before its own or after, within half a period.
    let mut held = 0;
    for (&(point, period), &(first, last)) in &times {
        if point != 0 {
            continue;
        }
        assert!(
            sent_from <= first && first <= last && last <= sent_to,
            "marker: period {period} counted at {first}..{last}, sent {sent_from}..{sent_to}"
        );
        if !(period * t <= first && last < (period + 1) * t) {
            held += 1;
            assert!(
                own_colour == OwnColour::Keep
                    && period * t <= first + t / 2
                    && last < (period + 1) * t + t / 2,
                "marker: period {period} counted at {first}..{last}"
            );
        }
        if let Some(&(exit_first, exit_last)) = times.get(&(1, period)) {
            assert!(
                first <= exit_first + tick && exit_last <= last + tick,
                "period {period}: marker {first}..{last}, exit {exit_first}..{exit_last}"
            );
        }
    }
    assert!(held <= 1, "{held} periods with packets of others");
    assert!(
        times.keys().filter(|(point, _)| *point == 1).count() >= 3,
        "the exit counted in several periods: {times:?}"
    );

    // Drop reasons: every drop of the flow is the rule's, named by the kernel's BTF.
    let names = btf::drop_reasons();
    let mut by_reason: HashMap<String, u64> = HashMap::new();
    for (k, n) in p.drops().unwrap() {
        if k.flow.flow().dport == 7777 {
            *by_reason
                .entry(names.get(&u64::from(k.reason)).cloned().unwrap_or_default())
                .or_default() += n;
        }
    }
    assert_eq!(by_reason, HashMap::from([("NETFILTER_DROP".to_string(), dropped)]));

    p.detach(a_in);
    p.detach(a_out);
    let filters = sh(&format!("ip netns exec {} tc filter show dev r-in ingress", l.r.0));
    assert!(!filters.contains("tm_ingress"), "left behind: {filters}");
    drop(p);
}

/// User space reads the counters of the keys the programs announced (map "new_keys") instead
/// of walking the whole map, and walks it when an announcement found no room. Ground truth:
/// the source ports the sender used, one datagram each, every one counted once at the router's
/// ingress, whether it was read from an announcement or a walk.
#[test]
fn reads_the_keys_the_programs_announce_and_walks_when_they_could_not() {
    let l = line("k");
    // No IPv6 neighbour discovery: a key of its own created while the ring is full would move
    // the lost counter and make a read this test expects from the ring a walk.
    for ns in [&l.s, &l.r, &l.d] {
        ns.exec("sysctl -qw net.ipv6.conf.all.disable_ipv6=1");
    }
    let settings = Settings {
        period_ns: 1_000_000_000,
        guard_ns: 500_000_000,
        colour_bit: 0,
        ..Settings::default()
    };
    // Room for 1,024 keys; "new_keys" is then 16 KiB, room for 341 announcements.
    let mut p = Programs::load(1024, settings).expect("load the programs (root, BTF)");
    let a = p
        .attach(
            &Target { netns: Some(l.r.0.clone()), iface: "r-in".into() },
            Port {
                in_point: 0,
                out_point: NO_POINT,
                in_action: IngressAction::Count as u8,
                out_action: EgressAction::Count as u8,
            },
        )
        .expect("attach r-in");
    let send = |ports: std::ops::Range<u16>| {
        in_netns(Some(&l.s.0), || {
            for port in ports {
                let s = UdpSocket::bind(("10.77.1.1", port)).unwrap();
                s.send_to(b"k", "10.77.2.2:7777").unwrap();
                if port % 100 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    };
    // Source port -> packets counted, over both colours and every CPU.
    let counted = |p: &mut Programs| {
        let mut seen: HashMap<u16, u64> = HashMap::new();
        p.for_each_count(|k, cpus| {
            // (The veths' own IPv6 neighbour discovery is counted too.)
            if (k.dport, k.proto) != (7777, 17) {
                return;
            }
            assert_eq!(k.point, 0);
            let n: u64 = cpus.iter().map(|s| s.cur.packets + s.prev.packets).sum();
            *seen.entry(k.sport).or_default() += n;
        })
        .unwrap();
        seen
    };
    let lost = |p: &Programs| {
        p.stats().unwrap().into_iter().find(|(s, _)| *s == Stat::NewKeyLost).unwrap().1
    };
    let ones = |r: std::ops::Range<u16>| r.map(|port| (port, 1)).collect::<HashMap<u16, u64>>();
    let same = |seen: HashMap<u16, u64>, sent: HashMap<u16, u64>| {
        let wrong: Vec<_> =
            sent.iter().filter(|(port, n)| seen.get(port) != Some(n)).take(5).collect();
        let extra: Vec<_> = seen.keys().filter(|port| !sent.contains_key(port)).take(5).collect();
        assert!(
            wrong.is_empty() && extra.is_empty(),
            "{} source ports counted, {} sent; sent and not counted once: {wrong:?}; not \
             sent: {extra:?}",
            seen.len(),
            sent.len()
        );
    };

    assert!(counted(&mut p).is_empty());
    assert_eq!(p.count_walks(), 1, "the first read walks the map");
    send(20_000..20_020);
    same(counted(&mut p), ones(20_000..20_020));
    assert_eq!((lost(&p), p.count_walks()), (0, 1), "20 new keys: announced, no walk");

    // More new keys than "new_keys" has room for: the rest are found by a walk.
    send(20_020..20_820);
    same(counted(&mut p), ones(20_000..20_820));
    assert!(lost(&p) > 0, "800 new keys in a 16 KiB ring");
    assert_eq!(p.count_walks(), 2, "a lost announcement makes the next read a walk");
    send(20_820..20_825);
    same(counted(&mut p), ones(20_000..20_825));
    assert_eq!(p.count_walks(), 2, "announced again after the walk");

    // Keys user space deletes (idle flows) are no longer read; a flow that comes back is
    // announced again.
    let idle: Vec<_> = {
        let mut v = Vec::new();
        p.for_each_count(|k, _| {
            if k.dport == 7777 && k.sport < 20_010 {
                v.push(*k)
            }
        })
        .unwrap();
        v
    };
    assert_eq!(p.remove_quiet_counts(&idle, |_, _| true).unwrap().len(), 10);
    same(counted(&mut p), ones(20_010..20_825));
    send(20_000..20_001);
    same(counted(&mut p), ones(20_000..20_001).into_iter().chain(ones(20_010..20_825)).collect());
    assert_eq!(p.count_walks(), 2);
    p.detach(a);
}

/// The kernel's own account of one of this process's BPF maps (its fdinfo): (map_type,
/// max_entries, memlock), for each map fd open.
fn open_maps() -> Vec<(u32, u64, u64)> {
    let mut maps = Vec::new();
    for fd in std::fs::read_dir("/proc/self/fdinfo").expect("fdinfo") {
        let Ok(text) = std::fs::read_to_string(fd.expect("fd").path()) else { continue };
        let field = |name: &str| {
            text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
        };
        if let (Some(t), Some(n), Some(m)) =
            (field("map_type:"), field("max_entries:"), field("memlock:"))
        {
            maps.push((t as u32, n, m));
        }
    }
    maps
}

/// The memory the agent checks `[ebpf] flows` against before it loads is at least what the
/// kernel then charges for the counters (its fdinfo `memlock` of map "counts" and the ring
/// "new_keys"), and not far above it. Ground truth: the kernel's accounting.
#[test]
fn the_counters_memory_checked_at_load_is_what_the_kernel_takes() {
    // A size no other test here loads, so its maps are told apart by their max_entries.
    const FLOWS: u32 = 100_003;
    let settings =
        Settings { period_ns: 1_000_000_000, guard_ns: 500_000_000, ..Settings::default() };
    let p = Programs::load(FLOWS, settings).expect("load the programs (root, BTF)");
    const PERCPU_HASH: u32 = 5;
    const RINGBUF: u32 = 27;
    let maps = open_maps();
    let counts: Vec<u64> = maps
        .iter()
        .filter(|(t, n, _)| *t == PERCPU_HASH && *n == u64::from(FLOWS))
        .map(|m| m.2)
        .collect();
    assert_eq!(counts.len(), 1, "one map \"counts\" of {FLOWS} entries: {maps:?}");
    // The ring of 1.2 MB of announcements rounded up to a power of two.
    let ring: Vec<u64> =
        maps.iter().filter(|(t, n, _)| *t == RINGBUF && *n == 2 << 20).map(|m| m.2).collect();
    assert_eq!(ring.len(), 1, "one ring \"new_keys\" of 2 MiB: {maps:?}");
    let kernel = counts[0] + ring[0];
    let checked = ebpf::counters_bytes(FLOWS);
    assert!(
        checked >= kernel && checked <= kernel + kernel / 2,
        "checked {checked} bytes at load, the kernel charges {kernel}"
    );
    drop(p);
}
