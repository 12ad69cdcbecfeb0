//! The eBPF datapath around Open vSwitch's userspace datapath (needs root, iproute2, nftables,
//! ethtool, bpftool and openvswitch-switch, as CI has; testbed/ovs.sh with OVS_DATAPATH=dummy):
//!
//! ```text
//!  ns Ps            ns Pa: host A, routes            root namespace: OvS            ns Pb
//!  s0 ═══ ax [agent ha: mark:ax, out:a0] a0 ═══ Ppa ─ [br-P, userspace] ─ Ppb ═══ b0
//!  10.33.1.1   10.33.1.254       10.33.0.1    [agent sw: in:Ppa, out:Ppb, exit]   10.33.0.2
//! ```
//!
//! OvS's userspace datapath reads its system ports with AF_PACKET sockets, which take their
//! copy of a frame before tc's ingress hook runs: a marker at `Ppa` would colour the host's
//! copy, not the one OvS forwards (docs/ebpf.md, "Deployments"). So the flows are coloured one
//! hop upstream, where they enter host A (`ax`), and OvS's ports are counting points: its
//! input's ingress and its output's egress, where the flows also leave the domain.
//!
//! Ground truth: nftables' rule counters and tbf's drops at the egress of OvS's output port,
//! the two ports' own interface counters and what the receiver got. OvS sends a batch of up to
//! 32 frames with one `sendmmsg`; when the kernel refuses the first of a call (nftables' egress
//! hook or the queue dropped it), OvS 3.1 gives up on the rest of the batch, unsent and counted
//! nowhere (not even in its own port statistics). The switch's segment therefore loses more
//! than nftables and tbf count: its truth is what entered `Ppa` less what left `Ppb`, and only
//! the kernel's share of it has drop reasons.

use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{
    collector_in_process, counter, in_ns, named, named_of, our_programs, recv_port_tos, set_int,
    sh, Ovs,
};

/// The testbed: ovs.sh's bridge and hosts, the sender's namespace and the nftables table in the
/// host namespace. Dropped on every path: the table and the sender's namespace here, then
/// `ovs.sh down` (daemons, bridge, namespaces, veths, state directory) as `ovs` drops.
struct Bed {
    p: String,
    ovs: Ovs,
}

impl Bed {
    fn up(p: &str) -> Bed {
        let bed = Bed { p: p.to_string(), ovs: Ovs { prefix: p.to_string() } };
        bed.clean();
        bed.ovs.run(&["up"]);
        // The sender, one routed hop behind host A: its traffic enters the domain at `ax`.
        let (s, a, b) = (format!("{p}s"), format!("{p}a"), format!("{p}b"));
        sh(&format!("ip netns add {s}"));
        sh(&format!(
            "ip netns exec {s} sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
             net.ipv6.conf.default.disable_ipv6=1"
        ));
        sh(&format!("ip -n {s} link set lo up"));
        sh(&format!("ip -n {s} link add s0 type veth peer name ax netns {a}"));
        sh(&format!("ip -n {s} addr add 10.33.1.1/24 dev s0"));
        sh(&format!("ip netns exec {s} ethtool -K s0 tx off"));
        sh(&format!("ip -n {s} link set s0 up"));
        sh(&format!("ip -n {s} route add default via 10.33.1.254"));
        sh(&format!("ip -n {a} addr add 10.33.1.254/24 dev ax"));
        sh(&format!("ip -n {a} link set ax up"));
        sh(&format!("ip netns exec {a} sysctl -qw net.ipv4.ip_forward=1"));
        sh(&format!("ip -n {b} route add 10.33.1.0/24 via 10.33.0.1"));
        bed
    }

    fn clean(&self) {
        let p = &self.p;
        let quiet = |args: &[&str]| {
            let _ = Command::new("timeout")
                .arg("20")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        quiet(&["nft", "delete", "table", "netdev", p]);
        quiet(&["ip", "netns", "del", &format!("{p}s")]);
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.clean();
    }
}

/// Sends `n` datagrams of 1,000 bytes from each of `sports` at 10.33.1.1 (namespace `src`) to
/// 10.33.0.2:7777 (namespace `dst`) with TOS `tos`, the flows interleaved, at about 40 Mbit/s
/// in bursts of 40; returns, per flow, how many arrived and how many of those arrived with
/// another TOS (the receiver stops 1 s after the last).
fn send_flows(src: &str, dst: &str, sports: &[u16], n: u64, tos: u8) -> Vec<(u64, u64)> {
    let rx = {
        let (dst, sports) = (dst.to_string(), sports.to_vec());
        std::thread::spawn(move || {
            in_ns(&dst, || {
                let sock = UdpSocket::bind("10.33.0.2:7777").unwrap();
                sock.set_read_timeout(Some(Duration::from_millis(1000))).unwrap();
                set_int(&sock, libc::IPPROTO_IP, libc::IP_RECVTOS, 1);
                set_int(&sock, libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
                let mut got = vec![(0u64, 0u64); sports.len()];
                while let Some((port, t)) = recv_port_tos(&sock) {
                    if let Some(i) = sports.iter().position(|p| *p == port) {
                        got[i].0 += 1;
                        got[i].1 += u64::from(t != tos);
                    }
                }
                got
            })
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    in_ns(src, || {
        let socks: Vec<UdpSocket> = sports
            .iter()
            .map(|p| {
                let s = UdpSocket::bind(("10.33.1.1", *p)).unwrap();
                set_int(&s, libc::IPPROTO_IP, libc::IP_TOS, tos.into());
                s
            })
            .collect();
        let payload = [0u8; 1000];
        let mut k = 0u64;
        for _ in 0..n {
            for s in &socks {
                s.send_to(&payload, "10.33.0.2:7777").unwrap();
                if k % 40 == 39 {
                    std::thread::sleep(Duration::from_millis(8));
                }
                k += 1;
            }
        }
    });
    rx.join().unwrap()
}

/// A packet counter of interface `dev` in the host namespace (`rx_packets`, `tx_packets`).
fn link_counter(dev: &str, which: &str) -> u64 {
    let path = format!("/sys/class/net/{dev}/statistics/{which}");
    std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

/// Two flows from a host behind host A through Open vSwitch's userspace bridge to host B; at
/// the egress of OvS's output port nftables drops a share of each flow (its own rule each)
/// and `tbf` congests. One collector, two agents: `ha` colours the flows where they enter
/// host A and counts where they leave it; `sw` counts at OvS's two ports and restores the
/// DSCP at the exit. Per flow: host A and the link into OvS are clean; the segment through
/// OvS lost what its ports' counters and the receiver say, lost + uncertain exactly; its drop
/// reasons are the nftables rule's count (NETFILTER_DROP) and, over both flows, tbf's
/// (QDISC_DROP); the loss OvS added by giving up on the rest of a batch has no reason; the
/// verdict names the segment through OvS; the receiver got the DSCP it sent.
#[test]
fn the_loss_through_an_ovs_userspace_bridge_is_found_and_named() {
    use telemark_agent::{Agent, FileConfig};
    use telemark_collector::api::Request;
    use telemark_collector::now_ns;

    let p = format!("tmeo{}", std::process::id() % 100_000);
    let bed = Bed::up(&p);
    let (pa, pb) = (format!("{p}pa"), format!("{p}pb"));
    const SPORTS: [u16; 2] = [6666, 6667];
    // 5 % of the first flow, 4 % of the second, each counted by its own rule.
    sh(&format!(
        "nft 'add table netdev {p}; \
         add chain netdev {p} eg {{ type filter hook egress device {pb} priority 0; }}; \
         add rule netdev {p} eg udp sport {} numgen random mod 20 == 0 counter drop; \
         add rule netdev {p} eg udp sport {} numgen random mod 25 == 0 counter drop'",
        SPORTS[0], SPORTS[1]
    ));
    // OvS's output queue: 30 Mbit/s with a short queue, fed at about 40 Mbit/s in bursts.
    sh(&format!("tc qdisc add dev {pb} root tbf rate 30mbit burst 16kb limit 30kb"));

    let dir = tempfile::tempdir().unwrap();
    let (c, url) = collector_in_process(dir.path());
    // Periods of 50 ms: every point reads the fine clock (with the tick one, at 100 ms, the
    // two agents' clocks may put `sw`'s batches a few ns before `ha`'s, and the collector then
    // does not find the link between them from the timing).
    let agent = |name: &str, netns: &str, ports: &str| {
        let toml = format!(
            "agent = \"{name}\"\n{netns}[ebpf]\nperiod = \"50ms\"\n{ports}\n\
             [export]\ncollector = \"{url}\"\ninterval = \"200ms\"\nreport_all = true\n"
        );
        Agent::start(FileConfig::parse(&toml).unwrap().validate().unwrap()).unwrap()
    };
    let ha = agent(
        "ha",
        &format!("netns = \"{p}a\"\n"),
        "[[port]]\ninterface = \"ax\"\nmark = true\n[[port]]\ninterface = \"a0\"\n",
    );
    let sw = agent(
        "sw",
        "",
        &format!(
            "[[port]]\ninterface = \"{pa}\"\nupstream = \"ha/out:{p}a:a0\"\n\
             [[port]]\ninterface = \"{pb}\"\nunmark = true\n"
        ),
    );
    std::thread::sleep(Duration::from_millis(700));

    const SENT: u64 = 4000;
    // DSCP 10 (AF11): the colour bit (DSCP bit 0) clear, so the exit gives it back as sent.
    const TOS: u8 = 10 << 2;
    let (in0, out0) = (link_counter(&pa, "rx_packets"), link_counter(&pb, "tx_packets"));
    let got = send_flows(&format!("{p}s"), &format!("{p}b"), &SPORTS, SENT, TOS);
    let (into_ovs, out_of_ovs) =
        (link_counter(&pa, "rx_packets") - in0, link_counter(&pb, "tx_packets") - out0);
    let rules = sh(&format!("nft list chain netdev {p} eg"));
    let nft: Vec<u64> = SPORTS
        .iter()
        .map(|sp| {
            let rule = rules.lines().find(|l| l.contains(&format!("sport {sp} "))).unwrap();
            counter(rule, "packets ")
        })
        .collect();
    let tbf = counter(&sh(&format!("tc -s qdisc show dev {pb}")), "dropped ");
    ha.stop();
    sw.stop();
    std::thread::sleep(Duration::from_millis(500));

    let received: u64 = got.iter().map(|g| g.0).sum();
    eprintln!(
        "sent {SENT} per flow; received {got:?} (count, other TOS); into OvS {into_ovs}, out \
         {out_of_ovs}; nftables {nft:?}, tbf {tbf}"
    );
    // Every packet entered OvS and whatever was lost, was lost between its two ports.
    assert_eq!(into_ovs, 2 * SENT, "{p}pa received {into_ovs}");
    assert_eq!(out_of_ovs, received, "{p}pb sent {out_of_ovs}, host B received {received}");
    assert!(tbf > 20 && nft.iter().all(|n| *n > 20), "nftables {nft:?}, tbf {tbf}");
    for (i, (n, other_tos)) in got.iter().enumerate() {
        assert_eq!(
            *other_tos, 0,
            "flow {}: {other_tos} of {n} arrived with another DSCP",
            SPORTS[i]
        );
    }

    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let within = |got: u64, want: u64| got.abs_diff(want) * 100 <= want * 3;
    let mut queue_named = 0;
    let mut reasons = Vec::new();
    for (i, sport) in SPORTS.iter().enumerate() {
        let q = format!("src=10.33.1.1&dst=10.33.0.2&sport={sport}&dport=7777&proto=17");
        let r = c.api.handle(&Request::get(&format!("/api/v1/localise?{q}")), now_ns());
        assert_eq!(r.status, 200);
        let loc: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let truth = SENT - got[i].0;
        eprintln!("flow {sport}: lost {truth}, nftables {}; localise: {loc:#}", nft[i]);
        let segs = loc["segments"].as_array().unwrap();
        let seg = |agent: &str, point: &str| {
            segs.iter()
                .find(|s| s["agent"] == agent && s["point"] == point)
                .unwrap_or_else(|| panic!("no segment ending at {agent}/{point}: {loc:#}"))
        };
        // Host A, from the marker to its uplink: clean.
        let host_a = seg("ha", &format!("out:{p}a:a0"));
        assert_eq!(host_a["from"], format!("ha/mark:{p}a:ax"), "{host_a}");
        assert_eq!(n(&host_a["expected"]), SENT, "host A: {host_a}");
        assert_eq!(n(&host_a["lost"]) + n(&host_a["uncertain"]), 0, "host A: {host_a}");
        // The link into OvS, lined up across the two agents: clean.
        let link = seg("sw", &format!("in:{pa}"));
        assert_eq!(link["from"], format!("ha/out:{p}a:a0"), "{link}");
        assert_eq!(n(&link["expected"]), SENT, "link: {link}");
        assert_eq!(n(&link["lost"]) + n(&link["uncertain"]), 0, "link: {link}");
        // Through OvS: everything, lost + uncertain exactly, lost within 3 %.
        let ovs = seg("sw", &format!("out:{pb}"));
        assert_eq!(ovs["from"], format!("sw/in:{pa}"), "{ovs}");
        assert_eq!(n(&ovs["lost"]) + n(&ovs["uncertain"]), truth, "through OvS: {ovs}");
        assert!(within(n(&ovs["lost"]), truth), "through OvS: {ovs} against {truth}");
        named(ovs, "NETFILTER_DROP", nft[i]);
        queue_named += n(&ovs["drops"]["QDISC_DROP"]);
        let verdict = &loc["verdict"];
        assert_eq!(verdict["agent"], "sw", "verdict: {verdict}");
        assert_eq!(verdict["point"], format!("out:{pb}"), "verdict: {verdict}");
        assert_eq!(verdict["from"], format!("sw/in:{pa}"), "verdict: {verdict}");
        let named_here = ovs["drops"].as_object().unwrap().keys();
        reasons.push((*sport, named_here.cloned().collect::<Vec<String>>()));
    }
    named_of("QDISC_DROP", queue_named, tbf, "the flows through OvS");
    eprintln!(
        "through OvS: {} lost, of which the kernel counted {} (nftables {nft:?}, tbf {tbf}); \
         the rest OvS gave up on unsent",
        2 * SENT - received,
        nft.iter().sum::<u64>() + tbf
    );

    drop(c);
    drop(bed);
    assert_eq!(our_programs(), 0, "programs left: {}", sh("bpftool prog show"));

    // The kernel dropped the flows' packets for these reasons only: the nftables rules' and
    // the queue's. The host's own copy of each frame at OvS's input port (not addressed to
    // it, once OvS's socket took its copy) is freed as OTHERHOST: no loss of the flow, and
    // not to be named as one.
    for (sport, named_here) in &reasons {
        assert!(
            named_here.iter().all(|r| r == "NETFILTER_DROP" || r == "QDISC_DROP"),
            "flow {sport}: reasons named through OvS: {named_here:?}"
        );
    }
}
