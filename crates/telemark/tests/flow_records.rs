//! What exporters say of each flow, kept in the collector's flow records and read back through
//! `GET /api/v1/flows/records`, against truth that shares no code with Telemark:
//! - softflowd (needs Debian's `softflowd` and `tshark`) exports one capture as NetFlow v5, v9
//!   and IPFIX: every flow has one key in all three (ICMP type and code as v5 writes them),
//!   the packets, ToS, TCP flags and first/last packet times tshark reads in the capture;
//! - Open vSwitch (needs root, `openvswitch-switch` and `tshark`; testbed/ovs.sh) exports IPFIX
//!   sampled at ingress and egress, its default: every packet is reported twice, which tshark
//!   reads in OvS's own datagrams, and the collector counts each flow's packets once — equal to
//!   what was sent at 1:1, within the sampling's bound at 1:16 — with each record's direction
//!   and OvS's own flow times.

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use telemark_lab::traffic::{self, FlowSpec};
use telemark_wire::FlowKey;

mod common;
use common::{collector, tshark_fields, write_ethernet_pcap as write_pcap, write_udp_pcap, Ovs};

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn get(url: &str) -> serde_json::Value {
    let r = ureq::get(url).timeout(Duration::from_secs(10)).call().expect("GET answers");
    r.into_json().unwrap()
}

/// Every flow record the collector at `base` lists for `query` (every page, following
/// `next_cursor`), and the totals it gives.
fn records(base: &str, query: &str) -> (Vec<serde_json::Value>, serde_json::Value) {
    let (mut all, mut cursor) = (Vec::new(), String::new());
    loop {
        let at = if cursor.is_empty() { String::new() } else { format!("&cursor={cursor}") };
        let v = get(&format!("{base}/api/v1/flows/records?since_ns=0&limit=50{at}&{query}"));
        all.extend(v["records"].as_array().unwrap().iter().cloned());
        match v["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => return (all, v["totals"].clone()),
        }
    }
}

/// A record's flow key: (src, dst, sport, dport, proto).
type Key = (String, String, u64, u64, u64);

fn key_of(r: &serde_json::Value) -> Key {
    let f = &r["flow"];
    (
        f["src"].as_str().unwrap().to_string(),
        f["dst"].as_str().unwrap().to_string(),
        f["sport"].as_u64().unwrap(),
        f["dport"].as_u64().unwrap(),
        f["proto"].as_u64().unwrap(),
    )
}

// ---------------------------------------------------------------------------------------------
// softflowd: one capture, three formats.

/// IPv4 header checksum / ICMP checksum (RFC 1071).
fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 =
        b.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet frame of an IPv4 packet.
fn frame(src: [u8; 4], dst: [u8; 4], proto: u8, tos: u8, l4: &[u8], id: u16) -> Vec<u8> {
    let mut f = vec![2, 0x31, 0, 0, 0, dst[3], 2, 0x31, 0, 0, 0, src[3], 8, 0];
    let mut ip = vec![0x45, tos];
    ip.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&id.to_be_bytes());
    ip.extend_from_slice(&[0x40, 0, 64, proto, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(l4);
    f
}

fn icmp(ty: u8, code: u8, seq: u16) -> Vec<u8> {
    let mut m = vec![ty, code, 0, 0, 0, 7];
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&[b'x'; 32]);
    let c = checksum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

/// A TCP header (no payload, checksum left 0: softflowd does not check it).
fn tcp(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0x20, 0, 0, 0, 0, 0]);
    t
}

/// A capture of one ping (five echo requests and their replies) and one short TCP exchange
/// with DSCP EF, its packets' times just behind now.
fn ping_and_tcp(path: &Path) {
    let (a, b) = ([10, 31, 9, 1], [10, 31, 9, 2]);
    let t0 = now_ns() - 3_000_000_000;
    let mut v = Vec::new();
    for i in 0..5u16 {
        let t = t0 + u64::from(i) * 100_000_000;
        v.push((t, frame(a, b, 1, 0, &icmp(8, 0, i), i)));
        v.push((t + 1_000_000, frame(b, a, 1, 0, &icmp(0, 0, i), 100 + i)));
    }
    for (i, flags) in [0x02u8, 0x18, 0x11].into_iter().enumerate() {
        let t = t0 + 50_000_000 + i as u64 * 200_000_000;
        v.push((t, frame(a, b, 6, 0xb8, &tcp(40_000, 80, flags), 200 + i as u16)));
    }
    v.sort_by_key(|(t, _)| *t);
    write_pcap(path, &v);
}

/// What tshark reads in the capture, per flow key (ICMP: type × 256 + code as the destination
/// port, as NetFlow v5 writes it): packets, first and last time (ns), ToS, TCP flags ORed.
fn tshark_truth(pcap: &Path) -> BTreeMap<Key, (u64, u64, u64, u64, u64)> {
    let out = tshark_fields(
        pcap,
        &[],
        "ip",
        &[
            "ip.src",
            "ip.dst",
            "ip.proto",
            "tcp.srcport",
            "tcp.dstport",
            "icmp.type",
            "icmp.code",
            "frame.time_epoch",
            "ip.dsfield",
            "tcp.flags",
        ],
    );
    let mut m: BTreeMap<Key, (u64, u64, u64, u64, u64)> = BTreeMap::new();
    for l in out.lines() {
        let c: Vec<&str> = l.split('\t').collect();
        let n = |i: usize| -> u64 {
            let s = c[i].trim_start_matches("0x");
            u64::from_str_radix(s, if c[i].starts_with("0x") { 16 } else { 10 }).unwrap_or(0)
        };
        let proto = n(2);
        let (sport, dport) = if proto == 1 { (0, n(5) * 256 + n(6)) } else { (n(3), n(4)) };
        let t = (c[7].parse::<f64>().unwrap() * 1e9).round() as u64;
        let e = m.entry((c[0].to_string(), c[1].to_string(), sport, dport, proto)).or_insert((
            0,
            u64::MAX,
            0,
            0,
            0,
        ));
        e.0 += 1;
        e.1 = e.1.min(t);
        e.2 = e.2.max(t);
        e.3 = n(8);
        e.4 |= n(9);
    }
    m
}

/// softflowd reads `pcap` and exports its flows as NetFlow `version` (5, 9, 10) to
/// 127.0.0.1:`port`; returns once it has read the whole capture.
fn softflowd(dir: &Path, pcap: &Path, version: &str, port: u16) {
    let ctl = dir.join(format!("ctl{version}"));
    let mut sf = Command::new("softflowd")
        .args(["-d", "-r"])
        .arg(pcap)
        .args(["-n", &format!("127.0.0.1:{port}"), "-v", version, "-c"])
        .arg(&ctl)
        .arg("-p")
        .arg(dir.join(format!("pid{version}")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("softflowd runs (Debian package softflowd)");
    // With -r it waits on its control socket before each batch of packets.
    let until = Instant::now() + Duration::from_secs(30);
    while sf.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "softflowd did not finish");
        let _ = Command::new("softflowctl")
            .arg("-c")
            .arg(&ctl)
            .arg("statistics")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// softflowd exports one capture (a ping, a TCP exchange marked DSCP EF) as NetFlow v5, v9 and
/// IPFIX: each format's stored records have the same keys — ICMP type and code in the
/// destination port, as v5 carries them — with the packets, first and last packet times
/// (window), ToS and TCP flags tshark reads in the capture. softflowd's flowDirection (the
/// address order of a bidirectional flow, not ingress/egress) gives no direction.
#[test]
fn softflowd_v5_v9_and_ipfix_give_one_flow_one_key_and_the_exporters_times() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("ping.pcap");
    ping_and_tcp(&pcap);
    let truth = tshark_truth(&pcap);
    let total: u64 = truth.values().map(|t| t.0).sum();
    assert_eq!(total, 13, "{truth:?}");
    let mut keys = BTreeMap::new();
    for version in ["5", "9", "10"] {
        let db = dir.path().join(format!("v{version}.db"));
        let (_c, base, port) = collector(&db, &[]);
        softflowd(dir.path(), &pcap, version, port);
        let until = Instant::now() + Duration::from_secs(15);
        let mut got = records(&base, "").0;
        while got.iter().map(|r| r["packets"].as_u64().unwrap()).sum::<u64>() < total
            && Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(200));
            got = records(&base, "").0;
        }
        let mut by_key: BTreeMap<Key, (u64, u64, u64)> = BTreeMap::new();
        for r in &got {
            let e = by_key.entry(key_of(r)).or_insert((0, u64::MAX, 0));
            e.0 += r["packets"].as_u64().unwrap();
            e.1 = e.1.min(r["window_start_ns"].as_u64().unwrap());
            e.2 = e.2.max(r["window_end_ns"].as_u64().unwrap());
            assert!(r.get("direction").is_none(), "-v {version}: softflowd says no direction {r}");
            assert_eq!(r["exporter_times"], true, "-v {version}: {r}");
            assert_eq!(r["sampling_rate"], 1, "-v {version}: {r}");
            if r["flow"]["proto"] == 6 {
                let t = &truth[&key_of(r)];
                assert_eq!(r["tos"].as_u64(), Some(t.3), "-v {version}: ToS {r}");
                assert_eq!(r["tcp_flags"].as_u64(), Some(t.4), "-v {version}: TCP flags {r}");
            }
        }
        println!("softflowd -v {version}: {by_key:?}");
        let packets: BTreeMap<&Key, u64> = by_key.iter().map(|(k, v)| (k, v.0)).collect();
        let want: BTreeMap<&Key, u64> = truth.iter().map(|(k, v)| (k, v.0)).collect();
        assert_eq!(packets, want, "-v {version}: keys and packets as tshark reads the capture");
        // The header's export time: v5 to the ns, v9 to the second (its unix_secs), IPFIX to
        // the ms (systemInitTimeMilliseconds); and softflowd's own uptime arithmetic, in ms,
        // on top (v9 was once 1.0025 s early).
        let slack = if version == "9" { 1_000_000_000 } else { 0 } + 2_000_000;
        for (k, (_, start, end)) in &by_key {
            let (_, first, last, _, _) = truth[k];
            assert!(
                start.abs_diff(first) <= slack && end.abs_diff(last) <= slack,
                "-v {version} {k:?}: window {start}..{end}, capture {first}..{last}"
            );
        }
        keys.insert(version, packets.keys().map(|k| (*k).clone()).collect::<Vec<_>>());
    }
    assert_eq!(keys["5"], keys["9"]);
    assert_eq!(keys["5"], keys["10"]);
    let echo = ("10.31.9.1".to_string(), "10.31.9.2".to_string(), 0, 8 * 256, 1);
    assert!(keys["10"].contains(&echo), "{keys:?}");
}

// ---------------------------------------------------------------------------------------------
// Open vSwitch: IPFIX at ingress and egress.

/// Datagrams kept: (the port they came to, bytes).
type Kept = Arc<Mutex<Vec<(u16, Vec<u8>)>>>;

/// A UDP relay on a free port: keeps each datagram (for tshark) and passes it on to `to`.
fn relay(to: u16, kept: &Kept, stop: &Arc<AtomicBool>) -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let port = s.local_addr().unwrap().port();
    let (kept, stop) = (kept.clone(), stop.clone());
    std::thread::spawn(move || {
        let out = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut buf = vec![0u8; 65_536];
        while !stop.load(Ordering::Relaxed) {
            if let Ok(n) = s.recv(&mut buf) {
                kept.lock().unwrap().push((port, buf[..n].to_vec()));
                let _ = out.send_to(&buf[..n], ("127.0.0.1", to));
            }
        }
    });
    port
}

const SPORTS: [u16; 3] = [5101, 5102, 5103];

fn within_sampling_bound(estimate: u64, truth: u64, rate: u64) -> bool {
    let sd = ((truth * rate) as f64).sqrt();
    (estimate as f64 - truth as f64).abs() <= 4.0 * sd + rate as f64
}

/// OvS's IPFIX sampling 1 in `rate` at ingress and egress ("both", OvS's default) while three
/// UDP flows cross its bridge: tshark reads every flow twice in OvS's datagrams (once each
/// direction), and the collector's records API and top talkers count it once.
fn ovs_ipfix_both_directions(tag: &str, rate: u64) {
    let ovs = Ovs { prefix: format!("tmfr{tag}{}", std::process::id() % 10_000) };
    ovs.run(&["up"]);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("collector.db");
    let (_collector, base, port) = collector(&db, &[]);
    let (kept, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
    let relay_port = relay(port, &kept, &stop);
    ovs.run(&["ipfix", &relay_port.to_string(), &rate.to_string(), "both"]);
    let ns = format!("{}a", ovs.prefix);
    let start = now_ns();
    let senders: Vec<_> = SPORTS
        .iter()
        .map(|&sport| {
            let ns = ns.clone();
            std::thread::spawn(move || {
                let spec = FlowSpec {
                    key: FlowKey {
                        src: "10.33.0.1".parse().unwrap(),
                        dst: "10.33.0.2".parse().unwrap(),
                        sport,
                        dport: 7000,
                        proto: 17,
                        spi: None,
                        si: None,
                    },
                    src_mac: [2, 0x33, 0, 0, 0, 1],
                    dst_mac: [2, 0x33, 0, 0, 0, 2],
                    payload: 200,
                    pps: 1000,
                    catch_up: traffic::catch_up(1000),
                    churn: false,
                };
                let stop = AtomicBool::new(false);
                traffic::send(Some(&ns), "a0", &spec, Duration::from_secs(3), &stop).unwrap().sent
            })
        })
        .collect();
    let sent: BTreeMap<u16, u64> =
        SPORTS.iter().zip(senders).map(|(&s, h)| (s, h.join().unwrap())).collect();
    let end = now_ns();
    // OvS exports a flow's entry every 2 s while active, then once more after it went idle.
    let totals = |sport: u16| records(&base, &format!("sport={sport}&proto=udp")).1;
    let until = Instant::now() + Duration::from_secs(20);
    let mut last = Vec::new();
    loop {
        let now: Vec<u64> =
            SPORTS.iter().map(|&s| totals(s)["records"].as_u64().unwrap_or(0)).collect();
        if (now == last && now.iter().all(|&n| n > 0)) || Instant::now() > until {
            break;
        }
        last = now;
        std::thread::sleep(Duration::from_secs(3));
    }
    stop.store(true, Ordering::Relaxed);
    // What OvS sent, read by tshark: packets per (source port, direction).
    let pcap = dir.path().join("ovs-ipfix.pcap");
    write_udp_pcap(&pcap, &kept.lock().unwrap());
    let out = tshark_fields(
        &pcap,
        &[format!("udp.port=={relay_port},cflow")],
        "cflow.srcport",
        &["cflow.srcport", "cflow.direction", "cflow.packets"],
    );
    let mut ovs_said: BTreeMap<(u16, u64), u64> = BTreeMap::new();
    for l in out.lines() {
        let c: Vec<Vec<&str>> = l.split('\t').map(|f| f.split(';').collect()).collect();
        for ((sp, d), p) in c[0].iter().zip(&c[1]).zip(&c[2]) {
            *ovs_said.entry((sp.parse().unwrap(), d.parse().unwrap())).or_default() +=
                p.parse::<u64>().unwrap();
        }
    }
    let top = get(&format!("{base}/api/v1/flows/top?since_ns=0&by=packets&limit=10"));
    println!(
        "1:{rate} sent {sent:?}\nOvS's datagrams (tshark), per (port, direction): {ovs_said:?}"
    );
    for (&sp, &truth) in &sent {
        let t = totals(sp);
        let packets = t["packets"].as_u64().unwrap();
        let top_packets = top["flows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["flow"]["sport"] == sp)
            .map(|f| f["packets"].as_u64().unwrap());
        println!("port {sp}: sent {truth}, records API {t}, top talkers {top_packets:?}");
        // OvS reports the flow once at ingress (0) and once at egress (1).
        for d in [0, 1] {
            let said = ovs_said.get(&(sp, d)).copied().unwrap_or(0);
            if rate == 1 {
                assert_eq!(said, truth, "port {sp}: OvS direction {d}");
            } else {
                assert!(within_sampling_bound(said, truth, rate), "port {sp} dir {d}: {said}");
            }
        }
        assert_eq!(top_packets, Some(packets), "port {sp}: top talkers = records API");
        if rate == 1 {
            assert_eq!(packets, truth, "port {sp}: counted once");
        } else {
            assert!(within_sampling_bound(packets, truth, rate), "port {sp}: {packets}");
        }
        assert!(t["counted"].as_u64().unwrap() < t["records"].as_u64().unwrap(), "{t}");
        let (recs, _) = records(&base, &format!("sport={sp}&proto=udp"));
        let dirs: std::collections::BTreeSet<&str> =
            recs.iter().filter_map(|r| r["direction"].as_str()).collect();
        assert_eq!(dirs, ["egress", "ingress"].into_iter().collect(), "port {sp}");
        for r in &recs {
            // OvS's own times (flowStart/EndDeltaMicroseconds), inside the sending.
            let (s, e) =
                (r["window_start_ns"].as_u64().unwrap(), r["window_end_ns"].as_u64().unwrap());
            assert_eq!(r["exporter_times"], true, "{r}");
            assert!(s >= start - 1_000_000_000 && e <= end + 1_000_000_000 && s <= e, "{r}");
            assert_eq!(r["sampling_rate"], 1, "OvS's counts come scaled: {r}");
        }
        let ingress = records(&base, &format!("sport={sp}&proto=udp&direction=ingress")).1;
        assert_eq!(ingress["packets"], t["packets"], "port {sp}");
    }
}

/// Open vSwitch's IPFIX with every packet sampled, at ingress and egress: per flow, the packets
/// sent (needs root, openvswitch-switch, tshark).
#[test]
fn open_vswitch_ipfix_at_ingress_and_egress_counts_each_packet_once() {
    ovs_ipfix_both_directions("a", 1);
}

/// The same sampling 1 in 16: within the sampling's bound (needs root, openvswitch-switch,
/// tshark).
#[test]
fn open_vswitch_ipfix_sampled_at_ingress_and_egress_is_within_the_bound() {
    ovs_ipfix_both_directions("b", 16);
}
