//! sFlow v5, NetFlow v9 and IPFIX datagrams from real exporters (Akvorado's test captures,
//! `../shared/testdata/flow/akvorado/`), read with Telemark's wire parsers and held against
//! the values Akvorado's own tests expect of them (`expected.json`): interfaces, VLANs and
//! sampling rates of sFlow samples, the flow key of their sampled headers (read with
//! Telemark's packet parser), and the first flow's fields of NetFlow v9 and IPFIX captures.

mod common;

use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use telemark_collector::flows::{Decoder, ExportedFlow, Refusal};
use telemark_datapath::capture::CaptureReader;
use telemark_wire::flow::extract;
use telemark_wire::ipfix::{self, Message, SetKind, Templates, Value};
use telemark_wire::link::LinkType;
use telemark_wire::sflow::{self, FlowData, Sample};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/flow/akvorado")
}

/// The UDP payloads of a capture of Ethernet frames, with the sender's address.
fn datagrams(path: &Path) -> Vec<(IpAddr, Vec<u8>)> {
    let mut r = CaptureReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        let f = &p.data;
        let parsed = extract(f, LinkType::Ethernet).expect("an IP/UDP frame");
        let ip = parsed.ip_offset;
        let udp = if parsed.ip_version == 4 { ip + usize::from(f[ip] & 0xf) * 4 } else { ip + 40 };
        out.push((parsed.key.src, f[udp + 8..].to_vec()));
    }
    out
}

fn expected() -> Vec<Json> {
    let v: Json =
        serde_json::from_slice(&std::fs::read(dir().join("expected.json")).unwrap()).unwrap();
    v["cases"].as_array().unwrap().clone()
}

/// The flow samples of an sFlow capture, each with its datagram's agent address.
fn flow_samples(file: &str) -> Vec<(IpAddr, sflow::FlowSample<'static>)> {
    let mut out = Vec::new();
    for (_, d) in datagrams(&dir().join(file)) {
        let d: &'static [u8] = Box::leak(d.into_boxed_slice());
        let dg = sflow::parse(d).unwrap_or_else(|e| panic!("{file}: {e:?}"));
        assert!(!dg.samples.is_empty(), "{file}: a datagram without samples");
        for s in dg.samples {
            if let Sample::Flow(f) = s {
                out.push((dg.agent, f));
            }
        }
    }
    out
}

/// What a flow sample says, in Akvorado's names.
fn sflow_fields(f: &sflow::FlowSample) -> BTreeMap<&'static str, Json> {
    let mut m = BTreeMap::new();
    m.insert("sampling_rate", Json::from(f.sampling_rate));
    m.insert("in_if", Json::from(f.input));
    if let sflow::Output::Interface(i) = f.output {
        m.insert("out_if", Json::from(i));
    }
    for r in &f.records {
        match r {
            FlowData::Header(h) => {
                let link = if h.protocol == 1 { LinkType::Ethernet } else { LinkType::RawIp };
                if let Ok(p) = extract(h.header, link) {
                    m.insert("src", Json::from(p.key.src.to_string()));
                    m.insert("dst", Json::from(p.key.dst.to_string()));
                    m.insert("sport", Json::from(p.key.sport));
                    m.insert("dport", Json::from(p.key.dport));
                    m.insert("proto", Json::from(p.key.proto));
                }
            }
            FlowData::Switch(s) => {
                m.insert("src_vlan", Json::from(s.src_vlan));
                m.insert("dst_vlan", Json::from(s.dst_vlan));
            }
            _ => {}
        }
    }
    m
}

#[test]
fn sflow_samples_read_as_akvorado_expects() {
    let mut checked = 0;
    for case in expected() {
        let feed: Vec<&str> =
            case["feed"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        if !feed[0].starts_with("sflow/") {
            continue;
        }
        let samples: Vec<_> = feed.iter().flat_map(|f| flow_samples(f)).collect();
        assert!(!samples.is_empty(), "{feed:?}: no flow sample");
        for (key, i) in [("first_flow", 0), ("second_flow", 1), ("fourth_flow", 3)] {
            let Some(want) = case[key].as_object() else { continue };
            let got = sflow_fields(&samples[i].1);
            for (field, v) in want {
                if field == "exporter" {
                    assert_eq!(samples[i].0.to_string(), v.as_str().unwrap());
                    checked += 1;
                } else if let Some(g) = got.get(field.as_str()) {
                    assert_eq!(g, v, "{feed:?} {key}.{field}");
                    checked += 1;
                }
            }
        }
        let what = case["what"].as_str().unwrap();
        let f = &samples[0].1;
        if what.starts_with("expanded flow sample") {
            assert_eq!((f.input, f.output), (29001, sflow::Output::Interface(1_285_816_721)));
            checked += 1;
        }
        if what.contains("'discard' encoding") {
            assert!(matches!(f.output, sflow::Output::Discarded(_)), "{:?}", f.output);
            assert_eq!(f.input, 27);
            checked += 1;
        }
        if what.contains("'local' and 'multiple interfaces'") {
            assert_eq!(f.output, sflow::Output::Interface(0x3fff_ffff), "the agent itself");
            let multiple = &samples.last().unwrap().1;
            assert!(matches!(multiple.output, sflow::Output::Multiple(_)), "{:?}", multiple.output);
            assert_eq!((f.input, multiple.input), (27, 27));
            checked += 1;
        }
        if what.starts_with("sampled IPv4 record") {
            assert!(f.records.iter().any(|r| matches!(r, FlowData::Ipv4(_))));
            assert_eq!((f.input, f.output), (0, sflow::Output::Interface(182)));
            checked += 1;
        }
    }
    println!("{checked} sFlow values checked");
    assert!(checked >= 20, "only {checked} values checked");
}

/// The first data record of a NetFlow v9 or IPFIX feed, by IANA element name; every datagram
/// must read without error.
fn first_record(feed: &[&str]) -> BTreeMap<String, Json> {
    let mut caches: BTreeMap<(IpAddr, u32), Templates> = BTreeMap::new();
    for file in feed {
        for (from, d) in datagrams(&dir().join(file)) {
            if d[..2] == [0, 5] {
                continue;
            }
            let m = Message::parse(&d).unwrap_or_else(|e| panic!("{file}: {e:?}"));
            let t = caches.entry((from, m.header.domain)).or_default();
            for set in m.sets() {
                let set = set.unwrap_or_else(|e| panic!("{file}: {e:?}"));
                match set.kind {
                    SetKind::Template | SetKind::OptionsTemplate => {
                        for r in set.templates() {
                            t.apply(r.unwrap_or_else(|e| panic!("{file}: {e:?}")));
                        }
                    }
                    SetKind::Data(id) => {
                        let Some(tpl) = t.get(id) else { continue };
                        if tpl.options {
                            continue;
                        }
                        if let Some(rec) = set.records(tpl).next() {
                            let rec = rec.unwrap_or_else(|e| panic!("{file}: {e:?}"));
                            let mut m = BTreeMap::new();
                            for (f, bytes) in rec.fields() {
                                let Some((name, _)) = ipfix::iana(f.id) else { continue };
                                if f.enterprise != 0 {
                                    continue;
                                }
                                let v = match ipfix::value(f, bytes) {
                                    Value::Unsigned(u) => Json::from(u),
                                    Value::V4(a) => Json::from(a.to_string()),
                                    Value::V6(a) => Json::from(a.to_string()),
                                    _ => continue,
                                };
                                m.insert(name.to_string(), v);
                            }
                            return m;
                        }
                    }
                    SetKind::Reserved(_) => {}
                }
            }
        }
    }
    BTreeMap::new()
}

#[test]
fn netflow_v9_and_ipfix_first_flows_read_as_akvorado_expects() {
    // Akvorado's names and the IANA elements that carry them (either address family).
    let names: &[(&str, &[&str])] = &[
        ("src", &["sourceIPv4Address", "sourceIPv6Address"]),
        ("dst", &["destinationIPv4Address", "destinationIPv6Address"]),
        ("next_hop", &["ipNextHopIPv4Address", "ipNextHopIPv6Address"]),
        ("in_if", &["ingressInterface"]),
        ("out_if", &["egressInterface"]),
        ("src_mask", &["sourceIPv4PrefixLength", "sourceIPv6PrefixLength"]),
        ("dst_mask", &["destinationIPv4PrefixLength", "destinationIPv6PrefixLength"]),
        ("bytes", &["octetDeltaCount"]),
        ("packets", &["packetDeltaCount"]),
        ("proto", &["protocolIdentifier"]),
        ("sport", &["sourceTransportPort"]),
        ("dport", &["destinationTransportPort"]),
        ("tcp_flags", &["tcpControlBits"]),
        ("src_vlan", &["vlanId"]),
        ("flow_label", &["flowLabelIPv6"]),
        ("tos", &["ipClassOfService"]),
        ("forwarding_status", &["forwardingStatus"]),
        ("ingress_vrf", &["ingressVRFID"]),
        ("egress_vrf", &["egressVRFID"]),
    ];
    let mut checked = 0;
    for case in expected() {
        let feed: Vec<&str> =
            case["feed"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        if !feed[0].starts_with("netflow/") {
            continue;
        }
        let got = first_record(&feed);
        let Some(want) = case["first_flow"].as_object() else { continue };
        for (field, v) in want {
            let Some((_, ies)) = names.iter().find(|n| n.0 == field) else { continue };
            let Some(g) = ies.iter().find_map(|ie| got.get(*ie)) else { continue };
            assert_eq!(g, v, "{feed:?} first flow {field}");
            checked += 1;
        }
    }
    println!("{checked} NetFlow v9 / IPFIX values checked");
    assert!(checked >= 30, "only {checked} values checked");
}

/// Every datagram of `feed`, in order, through one collector decoder.
fn decode(feed: &[&str]) -> (Vec<ExportedFlow>, Decoder) {
    let mut d = Decoder::new(1000);
    let mut out = Vec::new();
    for f in feed {
        for (from, dg) in datagrams(&dir().join(f)) {
            d.datagram(from, &dg, &mut out);
        }
    }
    (out, d)
}

/// The collector's decoder (templates, options data, sFlow samples) against Akvorado's
/// expectations: sampling rates learnt from options data, carried in the record, or mapped
/// through per-flow sampler ids; interfaces, addresses, ports and counts of the first flows.
#[test]
fn the_collectors_decoder_applies_sampling_as_akvorado_expects() {
    let mut checked = 0;
    for case in expected() {
        let feed: Vec<&str> =
            case["feed"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        let (flows, d) = decode(&feed);
        let what = case["what"].as_str().unwrap();
        assert_eq!(d.stats.refused.len(), 0, "{feed:?}: {:?}", d.stats.refused);
        if what.starts_with("data without template") {
            assert!(flows.is_empty() && d.stats.pending > 0, "{feed:?}: held for its template");
            checked += 1;
            continue;
        }
        assert!(!flows.is_empty(), "{feed:?}: no flow");
        for (key, i) in [("first_flow", 0), ("second_flow", 1), ("fourth_flow", 3)] {
            let Some(want) = case[key].as_object() else { continue };
            let f = &flows[i];
            for (field, v) in want {
                let got = match field.as_str() {
                    "sampling_rate" => Json::from(f.sampling_rate),
                    "src" => Json::from(f.key.src.to_string()),
                    "dst" => Json::from(f.key.dst.to_string()),
                    "sport" => Json::from(f.key.sport),
                    "dport" => Json::from(f.key.dport),
                    "proto" => Json::from(f.key.proto),
                    "in_if" => Json::from(f.in_if),
                    "out_if" => Json::from(f.out_if),
                    "packets" => Json::from(f.packets),
                    "bytes" => Json::from(f.bytes),
                    // Akvorado's exporter of an sFlow flow is the agent address the datagram
                    // claims; Telemark keeps that as `agent` and files the flow under its
                    // sender (issue 31: a claim is not an identity).
                    "exporter" => Json::from(f.agent.unwrap_or(f.exporter).to_string()),
                    _ => continue,
                };
                assert_eq!(&got, v, "{feed:?} {key}.{field}");
                checked += 1;
            }
        }
        if what.contains("'discard' encoding") {
            assert!(flows[0].dropped && flows[0].out_if == 0 && flows[0].in_if == 27);
            checked += 1;
        }
    }
    println!("{checked} decoded values checked");
    assert!(checked >= 60, "only {checked} values checked");
}

fn logstash(file: &str) -> Vec<u8> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/testdata/flow/logstash-codec-netflow/dat");
    std::fs::read(dir.join(file)).unwrap()
}

/// Data that comes before its template (NetScaler's, from Logstash's captures) is held and
/// decoded when the template comes, to the same flows as in the right order; past the bound
/// it is dropped and counted.
#[test]
fn data_before_its_template_is_decoded_when_the_template_comes() {
    let (tpl, data) =
        (logstash("ipfix_test_netscaler_tpl.dat"), logstash("ipfix_test_netscaler_data.dat"));
    let from: IpAddr = "192.0.2.9".parse().unwrap();
    let mut in_order = Vec::new();
    let mut d = Decoder::new(10);
    d.datagram(from, &tpl, &mut in_order);
    d.datagram(from, &data, &mut in_order);
    assert_eq!(in_order.len(), 3);

    let mut late = Vec::new();
    let mut d = Decoder::new(10);
    d.datagram(from, &data, &mut late);
    let held = d.stats.pending;
    assert!(late.is_empty() && held > 0, "its data sets held");
    d.datagram(from, &tpl, &mut late);
    // Decoded set by set as their templates come: the same flows, maybe in another order.
    let sorted = |v: &[ExportedFlow]| {
        let mut v: Vec<String> = v.iter().map(|f| format!("{f:?}")).collect();
        v.sort();
        v
    };
    assert_eq!(sorted(&late), sorted(&in_order), "decoded when the template came");
    // A set whose template never comes stays held (in order, it was never decoded either).
    assert_eq!(d.stats.pending + d.stats.pending_decoded, held);
    assert!(d.stats.pending_decoded > 0);

    // A bound of one datagram's sets: the second early datagram pushes the first out.
    let mut d = Decoder::new(held as usize);
    let mut out = Vec::new();
    d.datagram(from, &data, &mut out);
    d.datagram(from, &data, &mut out);
    assert_eq!(d.stats.refused.get(&Refusal::PendingDropped), Some(&held));
    d.datagram(from, &tpl, &mut out);
    assert_eq!(out.len(), 3, "only the datagram held");
}

/// IPFIX sequence numbers count data records: a message whose number is 7 ahead of what the
/// last one announced says 7 records were lost; one behind (reordered) says nothing.
#[test]
fn sequence_gaps_count_records_the_exporter_sent_and_we_never_got() {
    let (tpl, data) =
        (logstash("ipfix_test_netscaler_tpl.dat"), logstash("ipfix_test_netscaler_data.dat"));
    let from: IpAddr = "192.0.2.10".parse().unwrap();
    let with_seq = |buf: &[u8], seq: u32| {
        let mut b = buf.to_vec();
        b[8..12].copy_from_slice(&seq.to_be_bytes());
        b
    };
    let mut d = Decoder::new(10);
    let mut out = Vec::new();
    d.datagram(from, &with_seq(&tpl, 100), &mut out);
    d.datagram(from, &with_seq(&data, 100), &mut out);
    assert_eq!(out.len(), 3);
    assert_eq!(d.stats.sequence_lost, 0);
    // The next message should say 103; it says 110.
    d.datagram(from, &with_seq(&data, 110), &mut out);
    assert_eq!(d.stats.sequence_lost, 7);
    // An older one (reordered) loses nothing more.
    d.datagram(from, &with_seq(&data, 105), &mut out);
    assert_eq!(d.stats.sequence_lost, 7);
}

/// ICMP and TCP in sFlow samples' sampled headers, against tshark's dissection of the same
/// headers (needs tshark): every ICMP/ICMPv6 sample's flow is keyed type × 256 + code in its
/// destination port, as NetFlow v5 keys ICMP and as the collector keys v9 and IPFIX records
/// (before: 0/0), and every TCP sample carries its segment's flags (before: 0).
#[test]
fn sflow_sampled_headers_give_icmp_keys_and_tcp_flags_as_tshark_reads_them() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir().join("sflow"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    files.sort();
    let (mut icmp_checked, mut tcp_checked) = (0, 0);
    for path in files {
        let file = format!("sflow/{}", path.file_name().unwrap().to_string_lossy());
        // Samples with a sampled IPv4/IPv6 record instead of a header: not tshark's to read.
        if flow_samples(&file).iter().any(|(_, s)| {
            s.records.iter().any(|r| matches!(r, FlowData::Ipv4(_) | FlowData::Ipv6(_)))
        }) {
            continue;
        }
        let fields = ["icmp.type", "icmp.code", "icmpv6.type", "icmpv6.code", "tcp.flags"];
        let text = common::tshark_fields(&path, &[], "sflow", &fields);
        let (mut want_icmp, mut want_tcp) = (Vec::new(), Vec::new());
        for line in text.lines() {
            let cols: Vec<Vec<u64>> = line
                .split('\t')
                .map(|c| c.split(';').filter(|v| !v.is_empty()).map(parse_number).collect())
                .collect();
            for (t, c) in [(0, 1), (2, 3)] {
                for (ty, code) in cols[t].iter().zip(&cols[c]) {
                    want_icmp.push(ty * 256 + code);
                }
            }
            want_tcp.extend(cols[4].iter().map(|f| f & 0xff));
        }
        let (flows, _) = decode(&[file.as_str()]);
        let mut got_icmp: Vec<u64> = flows
            .iter()
            .filter(|f| matches!(f.key.proto, 1 | 58))
            .map(|f| u64::from(f.key.dport))
            .collect();
        let mut got_tcp: Vec<u64> =
            flows.iter().filter(|f| f.key.proto == 6).map(|f| u64::from(f.tcp_flags)).collect();
        for v in [&mut want_icmp, &mut want_tcp, &mut got_icmp, &mut got_tcp] {
            v.sort_unstable();
        }
        assert_eq!(got_icmp, want_icmp, "{file}: ICMP type × 256 + code");
        assert_eq!(got_tcp, want_tcp, "{file}: TCP flags");
        icmp_checked += got_icmp.len();
        tcp_checked += got_tcp.len();
    }
    println!("{icmp_checked} ICMP keys and {tcp_checked} TCP flags checked against tshark");
    assert!(icmp_checked >= 2 && tcp_checked >= 5, "{icmp_checked} ICMP, {tcp_checked} TCP");
}

/// A tshark number, decimal or 0x-hexadecimal.
fn parse_number(v: &str) -> u64 {
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => v.parse().unwrap(),
    }
}
