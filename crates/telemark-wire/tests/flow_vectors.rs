//! NetFlow v5, NetFlow v9 and IPFIX datagrams captured from real exporters (Cisco, Juniper,
//! MikroTik, Palo Alto, Fortigate, VMware, NetScaler, YAF, softflowd, …), decoded and held
//! against the values Logstash's netflow codec's own tests expect of them
//! (`../shared/testdata/flow/logstash-codec-netflow/expected.json`).
//!
//! Each context feeds its files in order through one template cache (one exporter). Checked:
//! the number of data records, where the context gives one; and every expected value of a
//! field this decoder names: IANA's elements by their registry name (Logstash's IPFIX names),
//! NetFlow v9's by the RFC 3954 names Logstash uses (mapped here to element ids), and v5's
//! fixed fields. Vendor-specific fields Logstash renders its own way are listed, not checked.

use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use telemark_wire::ipfix::{self, DataType, Message, SetKind, Templates, Value, Version};
use telemark_wire::netflow5;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/testdata/flow/logstash-codec-netflow")
}

/// RFC 3954 §8 field type names (lowercased, as Logstash spells them) and their numbers.
const V9_NAMES: &[(&str, u16)] = &[
    ("in_bytes", 1),
    ("in_pkts", 2),
    ("flows", 3),
    ("protocol", 4),
    ("src_tos", 5),
    ("tcp_flags", 6),
    ("l4_src_port", 7),
    ("ipv4_src_addr", 8),
    ("src_mask", 9),
    ("input_snmp", 10),
    ("l4_dst_port", 11),
    ("ipv4_dst_addr", 12),
    ("dst_mask", 13),
    ("output_snmp", 14),
    ("ipv4_next_hop", 15),
    ("src_as", 16),
    ("dst_as", 17),
    ("bgp_ipv4_next_hop", 18),
    ("mul_dst_pkts", 19),
    ("mul_dst_bytes", 20),
    ("out_bytes", 23),
    ("out_pkts", 24),
    ("ipv6_src_addr", 27),
    ("ipv6_dst_addr", 28),
    ("ipv6_src_mask", 29),
    ("ipv6_dst_mask", 30),
    ("ipv6_flow_label", 31),
    ("icmp_type", 32),
    ("mul_igmp_type", 33),
    ("sampling_interval", 34),
    ("sampling_algorithm", 35),
    ("flow_active_timeout", 36),
    ("flow_inactive_timeout", 37),
    ("engine_type", 38),
    ("engine_id", 39),
    ("total_bytes_exp", 40),
    ("total_pkts_exp", 41),
    ("total_flows_exp", 42),
    ("mpls_top_label_type", 46),
    ("mpls_top_label_ip_addr", 47),
    ("flow_sampler_id", 48),
    ("flow_sampler_mode", 49),
    ("flow_sampler_random_interval", 50),
    ("min_ttl", 52),
    ("max_ttl", 53),
    ("ipv4_ident", 54),
    ("dst_tos", 55),
    ("in_src_mac", 56),
    ("out_dst_mac", 57),
    ("src_vlan", 58),
    ("dst_vlan", 59),
    ("ip_protocol_version", 60),
    ("direction", 61),
    ("ipv6_next_hop", 62),
    ("bgp_ipv6_next_hop", 63),
    ("ipv6_option_headers", 64),
    ("mpls_label_1", 70),
    ("mpls_label_2", 71),
    ("mpls_label_3", 72),
    ("in_dst_mac", 80),
    ("out_src_mac", 81),
    ("if_name", 82),
    ("if_desc", 83),
    ("sampler_name", 84),
    ("in_permanent_bytes", 85),
    ("in_permanent_pkts", 86),
    ("fragment_offset", 88),
    ("forwarding_status", 89),
];

/// One decoded data record: (field name, value as Logstash would write it) for every field
/// this decoder names.
type Event = BTreeMap<String, Json>;

/// `ns` since the epoch as Logstash writes a time, to the millisecond: `2016-11-11T12:09:19.000`.
fn iso_ms(ns: u64) -> String {
    let (secs, ms) = (ns / 1_000_000_000, ns / 1_000_000 % 1000);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}", rem / 3600, rem / 60 % 60, rem % 60)
}

/// A value as Logstash's codec writes it: seconds and milliseconds since the epoch as numbers,
/// finer times as ISO text (compared to the millisecond).
fn json_of(ty: Option<DataType>, v: Value) -> Option<Json> {
    Some(match v {
        Value::Time(ns) => match ty {
            Some(DataType::Seconds) => Json::from(ns / 1_000_000_000),
            Some(DataType::Milliseconds) => Json::from(ns / 1_000_000),
            _ => Json::from(iso_ms(ns)),
        },
        Value::Unsigned(u) => Json::from(u),
        Value::Signed(i) => Json::from(i),
        Value::Float(f) => Json::from(f),
        Value::Boolean(b) => Json::from(b),
        Value::Mac(m) => {
            Json::from(m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"))
        }
        Value::V4(a) => Json::from(a.to_string()),
        Value::V6(a) => Json::from(a.to_string()),
        Value::Text(s) => Json::from(s.trim_end_matches('\0')),
        Value::Bytes(_) => return None,
    })
}

/// Decodes one datagram into `events`, with `templates` the exporter's template cache.
fn decode(buf: &[u8], templates: &mut BTreeMap<u32, Templates>, events: &mut Vec<Event>) {
    if buf.len() >= 2 && buf[..2] == [0, 5] {
        let Ok((h, records)) = netflow5::parse(buf) else { return };
        for r in records {
            let mut e = Event::new();
            e.insert("version".into(), Json::from(5));
            e.insert("ipv4_src_addr".into(), Json::from(r.src.to_string()));
            e.insert("ipv4_dst_addr".into(), Json::from(r.dst.to_string()));
            e.insert("l4_src_port".into(), Json::from(r.sport));
            e.insert("l4_dst_port".into(), Json::from(r.dport));
            e.insert("tcp_flags".into(), Json::from(r.tcp_flags));
            e.insert("src_tos".into(), Json::from(r.tos));
            e.insert("src_as".into(), Json::from(r.src_as));
            e.insert("dst_as".into(), Json::from(r.dst_as));
            e.insert("in_pkts".into(), Json::from(r.packets));
            e.insert("in_bytes".into(), Json::from(r.octets));
            e.insert("protocol".into(), Json::from(r.proto));
            e.insert("flow_seq_num".into(), Json::from(h.flow_sequence));
            e.insert("sampling_interval".into(), Json::from(h.sampling_interval));
            events.push(e);
        }
        return;
    }
    let Ok(m) = Message::parse(buf) else { return };
    let version = match m.header.version {
        Version::Ipfix => 10,
        Version::NetflowV9 => 9,
    };
    let tpls = templates.entry(m.header.domain).or_default();
    for set in m.sets() {
        let Ok(set) = set else { break };
        match set.kind {
            SetKind::Template | SetKind::OptionsTemplate => {
                for r in set.templates() {
                    match r {
                        Ok(r) => tpls.apply(r),
                        Err(_) => break,
                    }
                }
            }
            SetKind::Data(id) => {
                let Some(t) = tpls.get(id) else { continue };
                let t = t.clone();
                for rec in set.records(&t) {
                    let Ok(rec) = rec else { break };
                    let mut e = Event::new();
                    e.insert("version".into(), Json::from(version));
                    for (f, bytes) in rec.fields() {
                        // v9 fields by RFC 3954's names, where it names them; else IANA's.
                        let v9 = V9_NAMES.iter().find(|n| version == 9 && n.1 == f.id);
                        let iana = ipfix::iana(f.id).filter(|_| f.enterprise == 0);
                        let name = v9.map(|n| n.0).or(iana.map(|e| e.0));
                        let v = json_of(iana.map(|e| e.1), ipfix::value(f, bytes));
                        if let (Some(name), Some(v)) = (name, v) {
                            e.insert(name.to_string(), v);
                        }
                    }
                    events.push(e);
                }
            }
            SetKind::Reserved(_) => {}
        }
    }
}

#[test]
fn real_exporters_datagrams_decode_to_what_logstash_expects() {
    let dir = data();
    let expected: Vec<Json> =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).expect("testdata"))
            .unwrap();
    let (mut checked, mut unchecked, mut counted) = (0, BTreeMap::<String, usize>::new(), 0);
    let mut failures = Vec::new();
    for ctx in &expected {
        let name = ctx["context"].as_str().unwrap();
        let mut templates = BTreeMap::new();
        let mut events = Vec::new();
        for f in ctx["files_in_order"].as_array().unwrap() {
            let buf = std::fs::read(dir.join("dat").join(f.as_str().unwrap())).unwrap();
            decode(&buf, &mut templates, &mut events);
        }
        if let Some(n) = ctx["expected_event_count"].as_u64() {
            counted += 1;
            if events.len() as u64 != n {
                failures.push(format!("{name}: {} records, Logstash {n}", events.len()));
            }
        }
        for x in ctx["field_expectations"].as_array().unwrap() {
            let field = x["field"].as_str().unwrap();
            let field = field.trim_start_matches("[netflow][").trim_end_matches(']');
            let i = x["event"].as_u64().unwrap() as usize;
            let Some(got) = events.get(i).and_then(|e| e.get(field)) else {
                *unchecked.entry(field.to_string()).or_default() += 1;
                continue;
            };
            checked += 1;
            // Logstash's finer times end in a version-dependent sub-millisecond suffix:
            // compared to the millisecond.
            let want = match x["eq"].as_str() {
                Some(t) if t.len() > 23 && t.as_bytes()[10] == b'T' => Json::from(&t[..23]),
                _ => x["eq"].clone(),
            };
            if got != &want {
                failures.push(format!("{name}: record {i} {field} = {got}, Logstash {}", x["eq"]));
            }
        }
    }
    println!(
        "{} contexts, {counted} record counts and {checked} field values checked; not named \
         here: {unchecked:?}",
        expected.len()
    );
    assert!(failures.is_empty(), "{} differences:\n{}", failures.len(), failures.join("\n"));
    assert!(
        counted >= 40 && checked >= 60,
        "too little checked: {counted} counts, {checked} values"
    );
}
