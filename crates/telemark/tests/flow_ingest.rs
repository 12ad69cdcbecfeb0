//! The collector's flow-export listener end to end: every Logstash test capture (real
//! exporters' NetFlow v5, v9 and IPFIX datagrams, `../shared/testdata/flow/logstash-codec-
//! netflow/pcap/`) is sent over UDP from its own loopback address to `telemark collector
//! --flows-listen`, and the flow records it stores (read with sqlite3) are held against what
//! tshark, an independent decoder, finds in the same capture. Needs tshark and sqlite3.
//!
//! Where tshark misreads a capture, Logstash's own expected count (a second independent
//! decoder, `expected.json`) is the reference: H3C's template (tshark decodes 1 of 16
//! records) and Procera's records (tshark counts their two source-address fields). Captures
//! Logstash calls invalid must not stop the collector; what it makes of them is not checked.
//! The NetScaler capture whose data comes before its template is left to the decoder's own
//! test: Telemark holds that data and decodes it when the template comes, where both
//! references drop it.

/// Captures where Logstash's count, not tshark's, is the reference (see above).
const LOGSTASH_COUNTS: [&str; 2] = ["16_netflow_9_h3c.pcap", "24_ipfix_procera.pcap"];
/// Data before its template, on purpose.
const HELD_DATA: &str = "50_ipfix_netscaler_with_variable_length_fields.pcap";

use std::collections::BTreeMap;
use std::net::{IpAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use telemark_datapath::capture::CaptureReader;
use telemark_wire::flow::extract;
use telemark_wire::link::LinkType;

mod common;
use common::{collector, tshark_fields, tshark_ip_packets};

fn pcaps() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/testdata/flow/logstash-codec-netflow/pcap");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

/// The UDP payloads of a capture.
fn payloads(path: &Path) -> Vec<Vec<u8>> {
    let mut r = CaptureReader::open(path).unwrap();
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        let f = &p.data;
        let parsed = extract(f, LinkType::Ethernet).unwrap();
        let ip = parsed.ip_offset;
        let udp = ip + usize::from(f[ip] & 0xf) * 4;
        out.push(f[udp + 8..].to_vec());
    }
    out
}

/// Flow records with a source address tshark decodes in a capture (templates learnt in the
/// capture's order).
fn tshark_flows(path: &Path) -> usize {
    tshark_fields(path, &[], "", &["cflow.srcaddr", "cflow.srcaddrv6"])
        .lines()
        .flat_map(|l| l.split(['\t', ';']))
        .filter(|s| !s.is_empty())
        .count()
}

fn metric(base: &str, name: &str) -> u64 {
    let text = ureq::get(&format!("{base}/metrics"))
        .call()
        .map(|r| r.into_string().unwrap_or_default())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[test]
fn every_logstash_capture_sent_over_udp_is_stored_as_tshark_decodes_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flows.db");
    let (_c, base, port) = collector(&db, &[]);

    let expected: Vec<serde_json::Value> = serde_json::from_slice(
        &std::fs::read(pcaps()[0].parent().unwrap().join("../expected.json")).unwrap(),
    )
    .unwrap();
    let mut want: BTreeMap<String, usize> = BTreeMap::new();
    let mut datagrams = 0;
    for (i, pcap) in pcaps().iter().enumerate() {
        // Each capture is its own exporter: 127.0.1.i.
        let from: IpAddr = format!("127.0.1.{}", i + 1).parse().unwrap();
        let sock = UdpSocket::bind((from, 0)).unwrap();
        for p in payloads(pcap) {
            sock.send_to(&p, ("127.0.0.1", port)).unwrap();
            datagrams += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
        let name = pcap.file_name().unwrap().to_str().unwrap();
        let logstash = expected
            .iter()
            .find(|c| c["pcap"].as_str().is_some_and(|p| p.ends_with(name)))
            .and_then(|c| c["expected_event_count"].as_u64());
        let n = match logstash {
            None => continue, // invalid on purpose
            Some(_) if name == HELD_DATA => continue,
            Some(n) if LOGSTASH_COUNTS.contains(&name) => n as usize,
            Some(_) => tshark_flows(pcap),
        };
        want.insert(from.to_string(), n);
    }
    let until = Instant::now() + Duration::from_secs(20);
    while metric(&base, "telemark_collector_flow_datagrams_total") < datagrams
        || metric(&base, "telemark_collector_flow_stored_total")
            < metric(&base, "telemark_collector_flow_flows_total")
    {
        assert!(Instant::now() < until, "not every datagram read and stored");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = Command::new("sqlite3")
        .arg(&db)
        .arg("SELECT agent, COUNT(*) FROM other WHERE kind = 'flow' GROUP BY agent")
        .output()
        .unwrap();
    let got: BTreeMap<String, usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(a, n)| (a.to_string(), n.parse().unwrap()))
        .collect();
    let mut diff = Vec::new();
    for (exp, n) in &want {
        let g = got.get(exp).copied().unwrap_or(0);
        if g != *n {
            diff.push(format!("{exp}: stored {g}, expected {n}"));
        }
    }

    assert!(want.len() >= 40 && want.values().sum::<usize>() >= 300, "too little compared");
    println!(
        "{datagrams} datagrams; {} exporters compared; {} flows stored; refused: {}",
        want.len(),
        got.values().sum::<usize>(),
        metric(&base, "telemark_collector_flow_refused_total")
    );
    assert!(diff.is_empty(), "{}", diff.join("\n"));
}

/// A collector with a flow listener on a free loopback port: (process, base URL, port).
/// softflowd (a real exporter; needs softflowd) reads a 10,000-packet CAIDA trace and exports
/// its flows as NetFlow v9 and as IPFIX to the collector: the packets of the flows stored add
/// up to the trace's IP packets as tshark counts them, and the exporter's sequence numbers
/// say nothing was lost (softflowd's IPFIX numbering counts each message's own records; the
/// decoder learns that).
#[test]
fn softflowd_exports_a_trace_and_every_packet_is_in_the_stored_flows() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/testdata/captures/caida-equinix-nyc-2018-10k.pcap");
    let ip_packets = tshark_ip_packets(&trace);
    assert!(ip_packets > 9000);
    for version in ["9", "10"] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("flows.db");
        let (_c, base, port) = collector(&db, &[]);
        let ctl = dir.path().join("ctl");
        let mut sf = Command::new("softflowd")
            .args(["-d", "-r"])
            .arg(&trace)
            .args(["-n", &format!("127.0.0.1:{port}"), "-v", version, "-c"])
            .arg(&ctl)
            .arg("-p")
            .arg(dir.path().join("pid"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("softflowd runs");
        // With -r it waits on its control socket before each batch of packets.
        let until = Instant::now() + Duration::from_secs(60);
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
        let until = Instant::now() + Duration::from_secs(20);
        let packets = || {
            let out = Command::new("sqlite3")
                .arg(&db)
                .arg("SELECT COALESCE(SUM(json_extract(json, '$.packets')), 0), COUNT(*) FROM other WHERE kind = 'flow'")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let (p, n) = text.split_once('|').unwrap_or(("0", "0"));
            (p.parse::<u64>().unwrap_or(0), n.parse::<u64>().unwrap_or(0))
        };
        while packets().0 < ip_packets && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(200));
        }
        std::thread::sleep(Duration::from_millis(1500));
        let (stored, flows) = packets();
        let lost = metric(&base, "telemark_collector_flow_exporter_lost_total");
        println!("softflowd -v {version}: {flows} flows, {stored} packets (tshark: {ip_packets}), lost {lost}");
        assert_eq!(stored, ip_packets, "-v {version}: every packet of the trace in a flow");
        assert!(flows > 1000, "-v {version}: {flows} flows");
        assert_eq!(lost, 0, "-v {version}: nothing lost on loopback");
    }
}

fn logstash_dat(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/testdata/flow/logstash-codec-netflow/dat")
            .join(name),
    )
    .unwrap()
}

fn stored_flows(db: &Path) -> u64 {
    let out = Command::new("sqlite3")
        .arg(db)
        .arg("SELECT COUNT(*) FROM other WHERE kind = 'flow'")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
}

/// A collector killed (SIGKILL) after an exporter's templates came decodes that exporter's
/// next data at once after its restart (MikroTik's IPFIX, Logstash's captures: 46 flows in its
/// two data datagrams, as Logstash's test expects): templates outlive the process.
#[test]
fn after_a_restart_the_first_data_decodes_without_waiting_for_templates() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flows.db");
    let exporter = UdpSocket::bind("127.0.2.1:0").unwrap();
    {
        let (_c, _base, port) = collector(&db, &[]);
        exporter
            .send_to(&logstash_dat("ipfix_test_mikrotik_tpl.dat"), ("127.0.0.1", port))
            .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let out = Command::new("sqlite3")
                .arg(&db)
                .arg("SELECT COUNT(*) FROM flow_state WHERE kind = 'template'")
                .output()
                .unwrap();
            if String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap_or(0) > 0 {
                break;
            }
            assert!(Instant::now() < until, "templates not kept");
            std::thread::sleep(Duration::from_millis(100));
        }
        // Dropping the collector kills it (SIGKILL).
    }
    let (_c, base, port) = collector(&db, &[]);
    for f in ["ipfix_test_mikrotik_data258.dat", "ipfix_test_mikrotik_data259.dat"] {
        exporter.send_to(&logstash_dat(f), ("127.0.0.1", port)).unwrap();
    }
    let until = Instant::now() + Duration::from_secs(10);
    while stored_flows(&db) < 46 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(stored_flows(&db), 46, "every record of the data after the restart");
    assert_eq!(metric(&base, "telemark_collector_flow_pending_sets"), 0, "none waited");
}

/// IPFIX over TCP: a connection that sends anything but IPFIX is closed and counted, and the
/// collector goes on; then Telemark's exporter sends the 10,000-packet CAIDA trace over TCP
/// (`telemark export --ipfix tcp://…`) and every packet is in the stored flows, as tshark
/// counts the trace's IP packets.
#[test]
fn ipfix_over_tcp_is_stored_and_a_garbage_stream_is_closed() {
    use std::io::{Read, Write};
    let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/testdata/captures/caida-equinix-nyc-2018-10k.pcap");
    let ip_packets = tshark_ip_packets(&trace);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flows.db");
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (_c, base, _) = collector(&db, &["--flows-listen-tcp", &format!("127.0.0.1:{tcp}")]);
    let mut junk = std::net::TcpStream::connect(("127.0.0.1", tcp)).unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    junk.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(junk.read(&mut b).unwrap_or(0), 0, "the collector closes a garbage stream");
    let refused = |base: &str| {
        let text = ureq::get(&format!("{base}/metrics")).call().unwrap().into_string().unwrap();
        text.lines()
            .find(|l| l.starts_with("telemark_collector_flow_refused_total{reason=\"malformed\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(refused(&base), 1);
    let st = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["export", "--read"])
        .arg(&trace)
        .args(["--ipfix", &format!("tcp://127.0.0.1:{tcp}")])
        .status()
        .unwrap();
    assert!(st.success(), "telemark export over TCP");
    let packets = || {
        let out = Command::new("sqlite3")
            .arg(&db)
            .arg("SELECT COALESCE(SUM(json_extract(json, '$.packets')), 0) FROM other WHERE kind = 'flow'")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap_or(0)
    };
    let until = Instant::now() + Duration::from_secs(20);
    while packets() < ip_packets && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(packets(), ip_packets, "every IP packet of the trace in a flow stored");
    assert_eq!(metric(&base, "telemark_collector_flow_exporter_lost_total"), 0);

    // The top talkers by packets are the trace's biggest flows, as tshark counts them.
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&trace)
        .args(["-Y", "ip and (tcp or udp)", "-T", "fields", "-e", "ip.src", "-e", "ip.dst"])
        .args(["-e", "tcp.srcport", "-e", "udp.srcport", "-e", "tcp.dstport", "-e", "udp.dstport"])
        .args(["-e", "ip.proto", "-E", "occurrence=f"])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let mut truth: BTreeMap<(String, String, u16, u16, u8), u64> = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let c: Vec<&str> = l.split('\t').collect();
        let port = |a: &str, b: &str| a.parse().or_else(|_| b.parse()).unwrap_or(0u16);
        let k = (
            c[0].into(),
            c[1].into(),
            port(c[2], c[3]),
            port(c[4], c[5]),
            c[6].parse().unwrap_or(0),
        );
        *truth.entry(k).or_default() += 1;
    }
    let top: serde_json::Value =
        ureq::get(&format!("{base}/api/v1/flows/top?by=packets&limit=5&point=ipfix"))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
    let flows = top["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 5, "{top}");
    let mut want: Vec<u64> = truth.values().copied().collect();
    want.sort_unstable_by(|a, b| b.cmp(a));
    for (f, w) in flows.iter().zip(&want) {
        let fl = &f["flow"];
        let k = (
            fl["src"].as_str().unwrap().to_string(),
            fl["dst"].as_str().unwrap().to_string(),
            fl["sport"].as_u64().unwrap() as u16,
            fl["dport"].as_u64().unwrap() as u16,
            fl["proto"].as_u64().unwrap() as u8,
        );
        assert_eq!(f["packets"].as_u64(), truth.get(&k).copied(), "{f}");
        assert_eq!(f["packets"].as_u64(), Some(*w), "rank of {f}");
        assert_eq!(f["exact"], true);
    }
    println!("top talkers: {}", serde_json::to_string(flows).unwrap());
}
