//! The saved INT vectors in shared/testdata/int decode to the values their sources give:
//! CableLabs' Telemetry Report v2.0 vectors against `expected.json` (transcribed from their
//! JUnit tests) and bmv2's INT-MX reports against the values in the folder's README. Both are
//! dialects: a strict parse refuses them, a tolerant one accepts them and names each rule broken.

use serde_json::Value;
use std::path::PathBuf;
use telemark_datapath::capture::read_all;
use telemark_wire::dialect::{Deviation, Mode};
use telemark_wire::int::{Field, HeaderType, Int, NextProtocol};
use telemark_wire::report::{self, InType, RepType, Report};
use telemark_wire::{ethernet, ipv4, ipv6, udp};

fn int_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/int")
}

/// UDP payloads of every frame of a capture (Ethernet / IPv4 / UDP).
fn udp_payloads(name: &str) -> Vec<Vec<u8>> {
    let (pkts, _) = read_all(&int_dir().join(name)).expect("capture opens");
    pkts.iter()
        .map(|(_, p)| {
            let eth = ethernet::Frame::new_checked(&p.data[..]).unwrap();
            let ip = ipv4::Packet::new_checked(eth.payload()).unwrap();
            udp::Packet::new_checked(ip.payload()).unwrap().payload().to_vec()
        })
        .collect()
}

fn mac(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

fn bits(s: &Value) -> u16 {
    u16::from_str_radix(s.as_str().unwrap(), 2).unwrap()
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// The L4 payload of an IPv4 or IPv6 packet, with addresses as text and the L4 protocol.
fn ip_payload(ip: &[u8]) -> (String, String, u8, Vec<u8>, u64) {
    if ip[0] >> 4 == 4 {
        let p = ipv4::Packet::new_checked(ip).unwrap();
        let (src, dst) = (p.src().to_string(), p.dst().to_string());
        (src, dst, u8::from(p.protocol()), p.payload().to_vec(), u64::from(p.total_len()))
    } else {
        let p = ipv6::Packet::new_checked(ip).unwrap();
        let (src, dst) = (p.src().to_string(), p.dst().to_string());
        (src, dst, u8::from(p.next_header()), p.payload().to_vec(), u64::from(p.payload_len()))
    }
}

#[test]
fn cablelabs_v2_vectors_decode_to_expected_json() {
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(int_dir().join("cablelabs-trpt-v2/expected.json")).unwrap(),
    )
    .unwrap();
    let payloads = udp_payloads("cablelabs-trpt-v2/cablelabs-trpt-v2-vectors.pcap");
    let frames = expected["frames"].as_array().unwrap();
    assert_eq!(payloads.len(), frames.len());
    for (payload, want) in payloads.iter().zip(frames) {
        let name = want["name"].as_str().unwrap();
        assert_eq!(payload.len() as u64, num(want, "udp_payload_len"), "{name}");
        // Strict mode refuses the dialect (RepType 0 with INT contents).
        let strict: Result<Vec<Report>, _> =
            report::parse(payload, Mode::Strict).unwrap().collect();
        assert!(strict.is_err(), "{name}: strict parse accepted a dialect");

        let reports: Vec<Report> =
            report::parse(payload, Mode::Tolerant).unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(reports.len(), 1, "{name}");
        let r = &reports[0];
        let w = &want["report"];
        assert_eq!(u64::from(r.hw_id), num(w, "hw_id"), "{name}");
        assert_eq!(u64::from(r.seq), num(w, "seq"), "{name}");
        assert_eq!(r.seq_bits, 16, "{name}: CableLabs numbers datagrams in 16 bits");
        assert_eq!(r.node_id.map(u64::from), Some(num(w, "node_id")), "{name}");
        assert_eq!(r.rep_type, RepType::None, "{name}");
        if w.get("domain_id").is_some() {
            assert_eq!(u64::from(r.domain_id), num(w, "domain_id"), "{name}");
        }
        assert!(r.deviations.contains(Deviation::RepTypeNone), "{name}");
        for (flag, got) in [
            ("d", r.flags.dropped),
            ("q", r.flags.congested),
            ("f", r.flags.tracked_flow),
            ("i", r.flags.intermediate),
        ] {
            if let Some(v) = w.get(flag) {
                assert_eq!(u64::from(got), v.as_u64().unwrap(), "{name} flag {flag}");
            }
        }
        if let Some(b) = w.get("rep_md_bits") {
            assert_eq!(r.md_bits.0, bits(b), "{name}");
        }
        if let Some(b) = w.get("ds_md_bits") {
            assert_eq!(r.ds_md_bits, bits(b), "{name}");
            assert_eq!(r.ds_md_status, bits(&w["ds_md_status"]), "{name}");
        }
        if let Some(d) = want.get("drop_ext") {
            let drop = r.drop.expect("drop contents");
            assert_eq!(u64::from(drop.timestamp), num(d, "timestamp"));
            assert_eq!(drop.count, num(d, "drop_count"));
            let key: String = drop.key.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(key, d["drop_key_hex"].as_str().unwrap());
            assert_eq!(r.inner, b"tps drop report");
            continue;
        }
        // The inner contents: Ethernet although InType says IPv4/IPv6.
        assert_eq!(r.in_type, InType::Ethernet, "{name}");
        assert!(r.deviations.contains(Deviation::InnerEthernetDespiteInType), "{name}");
        let eth = ethernet::Frame::new_checked(r.inner).unwrap();
        if let Some(e) = want.get("inner_eth") {
            assert_eq!(mac(eth.dst()), e["dst"].as_str().unwrap());
            assert_eq!(mac(eth.src()), e["src"].as_str().unwrap());
            assert_eq!(u64::from(u16::from(eth.ethertype())), num(e, "type"));
        }
        let ip = &want["inner_ip"];
        let (src, dst, proto, l4, len) = ip_payload(eth.payload());
        let (proto_key, len_key) =
            if num(ip, "ver") == 4 { ("proto", "total_len") } else { ("next", "payload_len") };
        assert_eq!(u64::from(proto), num(ip, proto_key), "{name}");
        assert_eq!(len, num(ip, len_key), "{name}");
        if let Some(s) = ip.get("src") {
            assert_eq!(src, s.as_str().unwrap(), "{name}");
            assert_eq!(dst, ip["dst"].as_str().unwrap(), "{name}");
        }
        let u = udp::Packet::new_checked(&l4[..]).unwrap();
        let wu = &want["int_udp"];
        assert_eq!(
            (u64::from(u.src_port()), u64::from(u.dst_port()), u64::from(u.len())),
            (num(wu, "sport"), num(wu, "dport"), num(wu, "len")),
            "{name}"
        );
        // CableLabs' shim Length counts the shim (v1.0's rule, not v2.1's).
        let strict = Int::parse(u.payload(), Mode::Strict);
        assert!(strict.is_err(), "{name}: strict parse accepted {strict:?}");
        let int = Int::parse(u.payload(), Mode::Tolerant).unwrap();
        assert!(int.deviations.contains(Deviation::ShimLengthIncludesShim), "{name}");
        let ws = &want["int_shim"];
        assert_eq!(int.shim.header_type, HeaderType::Md);
        assert_eq!(u64::from(u8::from(int.shim.header_type)), num(ws, "type"));
        let NextProtocol::IpProtocol(orig) = int.shim.next_protocol else {
            panic!("{name}: NPT {:?}", int.shim.next_protocol)
        };
        assert_eq!(num(ws, "npt"), 2);
        assert_eq!(u64::from(orig), num(ws, "orig_ip_proto"), "{name}");
        let md = int.header.unwrap();
        let wm = &want["int_md"];
        assert_eq!(u64::from(md.version), num(wm, "ver"));
        assert_eq!(u64::from(md.hop_ml), num(wm, "hop_ml"));
        assert_eq!(u64::from(md.remaining_hop_cnt), num(wm, "remaining_hops"));
        if let Some(b) = wm.get("instr_bitmap") {
            assert_eq!(md.instructions.0, bits(b));
            assert_eq!(u64::from(md.domain_id), num(wm, "domain_id"));
        }
        if let Some(b) = wm.get("ds_instr") {
            assert_eq!(md.ds_instructions, bits(b));
            assert_eq!(md.ds_flags, bits(&wm["ds_flags"]));
        }
        let nodes: Vec<u64> = int.hops().filter_map(|h| h.get(Field::NodeId)).collect();
        for n in wm["hop_node_ids_contains"].as_array().unwrap() {
            assert!(nodes.contains(&n.as_u64().unwrap()), "{name}: {nodes:?}");
        }
        // After INT: the original L4 header, then the payload.
        let orig = &u.payload()[int.len..];
        let wl = &want["l4"];
        let ports =
            (u16::from_be_bytes([orig[0], orig[1]]), u16::from_be_bytes([orig[2], orig[3]]));
        assert_eq!((u64::from(ports.0), u64::from(ports.1)), (num(wl, "sport"), num(wl, "dport")));
        let text = want["payload"].as_str().unwrap().as_bytes();
        assert!(orig.ends_with(text), "{name}: payload");
    }
}

/// bmv2's INT-MX reports (one per switch) and the INT-MX data packets between switches, with
/// the values hand-checked in the folder's README.
#[test]
fn bmv2_int_mx_reports_decode() {
    // (file, node id, L1 ingress, L1 egress)
    for (file, node, port_in, port_out) in [
        ("laofan13-bmv2-int-mx/s1-cpu-eth0_out.pcap", 1, 0, 3),
        ("laofan13-bmv2-int-mx/s2-cpu-eth0_out.pcap", 2, 0, 3),
        ("laofan13-bmv2-int-mx/s3-cpu-eth0_out.pcap", 3, 0, 4),
    ] {
        for payload in udp_payloads(file) {
            assert_eq!(payload.len(), 122, "{file}");
            assert!(report::parse(&payload, Mode::Strict).is_err(), "{file}: version 1 accepted");
            let reports: Vec<Report> =
                report::parse(&payload, Mode::Tolerant).unwrap().collect::<Result<_, _>>().unwrap();
            assert_eq!(reports.len(), 1);
            let r = &reports[0];
            assert_eq!((r.hw_id, r.seq, r.node_id), (1, 0, Some(node)), "{file}");
            assert_eq!(r.rep_type, RepType::Int);
            assert!(r.flags.tracked_flow && r.flags.intermediate && !r.flags.dropped);
            for d in [
                Deviation::GroupVersionOne,
                Deviation::ReportLengthZero,
                Deviation::InnerEthernetDespiteInType,
            ] {
                assert!(r.deviations.contains(d), "{file}: {d:?} not flagged");
            }
            let eth = ethernet::Frame::new_checked(r.inner).unwrap();
            // bmv2 cut the inner packet after the metadata: its payload is not in the report.
            let ip = ipv4::Packet::new_lenient(eth.payload()).unwrap();
            assert!(ip.is_truncated());
            assert_eq!(ip.src().to_string(), "10.0.1.1");
            assert_eq!(ip.dst().to_string(), "10.0.3.3");
            assert_eq!(ip.dscp(), 0x17);
            let u = udp::Packet::new_checked(ip.payload()).unwrap();
            assert_eq!((u.src_port(), u.dst_port()), (64057, 8080));
            let int = Int::parse(u.payload(), Mode::Tolerant).unwrap();
            assert_eq!(int.shim.header_type, HeaderType::Mx);
            assert_eq!(int.shim.next_protocol, NextProtocol::Dscp(0));
            assert_eq!(int.header.unwrap().instructions.0, 0xff00);
            // bmv2's shim Length is right (v2.1 does not count the shim); the metadata is not.
            assert!(!int.deviations.contains(Deviation::ShimLengthIncludesShim));
            assert!(int.deviations.contains(Deviation::MxCarriesMetadata));
            assert_eq!(int.hop_count(), 1, "{file}");
            let hop = int.hop(0).unwrap();
            assert_eq!(hop.get(Field::NodeId), Some(u64::from(node)));
            assert_eq!(hop.get(Field::L1IngressIf), Some(port_in));
            assert_eq!(hop.get(Field::L1EgressIf), Some(port_out));
            if node == 1 {
                assert_eq!(hop.get(Field::HopLatency), Some(0x02b1_8c35));
            }
            assert_eq!(hop.get(Field::BufferId), None);
        }
    }
    for file in ["laofan13-bmv2-int-mx/s1-eth2_out.pcap", "laofan13-bmv2-int-mx/s2-eth2_out.pcap"] {
        for payload in udp_payloads(file) {
            let int = Int::parse(&payload, Mode::Strict).unwrap();
            assert_eq!(int.shim.header_type, HeaderType::Mx);
            assert_eq!(int.hop_count(), 0);
            assert_eq!(&payload[int.len..], b"this is a INT!");
        }
    }
}
