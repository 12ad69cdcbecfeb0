//! sFlow v5, NetFlow v9 and IPFIX datagrams from real exporters (Akvorado's test captures,
//! `../shared/testdata/flow/akvorado/`), read with Telemark's wire parsers and held against
//! the values Akvorado's own tests expect of them (`expected.json`): interfaces, VLANs and
//! sampling rates of sFlow samples, the flow key of their sampled headers (read with
//! Telemark's packet parser), and the first flow's fields of NetFlow v9 and IPFIX captures.

use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
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
    m.insert("out_if", Json::from(f.output));
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
            assert_eq!((f.input, f.output), (29001, 1_285_816_721));
            checked += 1;
        }
        if what.contains("'discard' encoding") {
            // The compact output interface's top two bits: 1 = the packet was discarded.
            assert_eq!(f.output >> 30, 1, "{:#x}", f.output);
            assert_eq!(f.input, 27);
            checked += 1;
        }
        if what.starts_with("sampled IPv4 record") {
            assert!(f.records.iter().any(|r| matches!(r, FlowData::Ipv4(_))));
            assert_eq!((f.input, f.output), (0, 182));
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
