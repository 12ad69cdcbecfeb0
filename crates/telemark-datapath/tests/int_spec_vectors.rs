//! INT v2.1 packets and Telemetry Report v2.0 datagrams built by an encoder written from the
//! specifications alone (`testdata-gen/int_vectors.py`: scapy for the outer headers, the INT
//! and report bytes by hand, with its own self-check decoder) decode to the values it records.
//!
//! Covers IPv4 and IPv6, UDP and TCP (with options), NPT 0/1/2, 1–6 hops, every instruction
//! bit including the reserved ones, domain-specific per-hop metadata, INT-MX, and reports with
//! several individual reports, every allowed RepMdBits bit, truncated inner packets and Report
//! Length 0xFF.
//!
//! Needs `python3` with scapy (`.ci/run` installs Debian's python3-scapy); never skipped.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use telemark_wire::dialect::Mode;
use telemark_wire::int::{Field, HeaderType, Int, NextProtocol};
use telemark_wire::report::{self, InType, RepType};

/// Runs the generator into a fresh directory and returns (int_md.json, trpt_v2.json).
fn generate(tag: &str) -> (Value, Value) {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata-gen/int_vectors.py");
    let dir =
        std::env::temp_dir().join(format!("telemark-int-vectors-{tag}-{}", std::process::id()));
    let out = Command::new("python3")
        .arg(&script)
        .arg(&dir)
        .arg("--self-check")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "generator failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap()
    };
    let v = (read("int_md.json"), read("trpt_v2.json"));
    let _ = std::fs::remove_dir_all(&dir);
    v
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {v}"))
}

/// Offset of the byte after the L4 header at `l4` (UDP: 8; TCP: data offset).
fn after_l4(frame: &[u8], l4: usize, proto: &str) -> usize {
    match proto {
        "udp" => l4 + 8,
        _ => l4 + usize::from(frame[l4 + 12] >> 4) * 4,
    }
}

#[test]
fn spec_built_int_and_reports_decode() {
    let (int_md, trpt) = generate("decode");
    let frames = int_md["frames"].as_array().unwrap();
    assert!(frames.len() >= 80, "generator wrote {} INT frames", frames.len());
    let mut hops_seen = 0;
    let mut bits_seen = 0u16;
    for f in frames {
        let idx = num(f, "index");
        let frame = unhex(f["frame_hex"].as_str().unwrap());
        let outer = &f["outer"];
        let at = after_l4(&frame, num(outer, "l4_offset") as usize, outer["l4"].as_str().unwrap());
        assert_eq!(at as u64, num(f, "int_offset"), "frame {idx}: INT offset");
        let int =
            Int::parse(&frame[at..], Mode::Strict).unwrap_or_else(|e| panic!("frame {idx}: {e}"));
        assert!(int.deviations.is_empty(), "frame {idx}: {:?}", int.deviations);
        assert_eq!(int.len as u64, num(f, "int_total_len"), "frame {idx}: INT length");
        let shim = &f["shim"];
        assert_eq!(u64::from(u8::from(int.shim.header_type)), num(shim, "type"), "frame {idx}");
        assert_eq!(u64::from(int.shim.length_words), num(shim, "length_words"), "frame {idx}");
        match (int.shim.next_protocol, num(shim, "npt")) {
            (NextProtocol::Dscp(d), 0) => {
                assert_eq!(u64::from(d), num(shim, "original_dscp"), "frame {idx}")
            }
            (NextProtocol::UdpPort(p), 1) => {
                assert_eq!(u64::from(p), num(shim, "original_dport"), "frame {idx}")
            }
            (NextProtocol::IpProtocol(p), 2) => {
                assert_eq!(u64::from(p), num(shim, "original_proto"), "frame {idx}")
            }
            (got, npt) => panic!("frame {idx}: NPT {npt}, parsed {got:?}"),
        }
        let h = int.header.expect("MD or MX header");
        let payload = &frame[at + int.len..];
        assert_eq!(payload, unhex(f["payload_hex"].as_str().unwrap()), "frame {idx}: payload");
        if f["kind"] == "int_mx" {
            assert_eq!(int.shim.header_type, HeaderType::Mx);
            let mx = &f["mx"];
            assert_eq!(u64::from(h.instructions.0), num(mx, "instruction_bitmap"));
            assert_eq!(u64::from(h.domain_id), num(mx, "domain_specific_id"));
            assert_eq!(u64::from(h.ds_flags), num(mx, "ds_flags"));
            assert_eq!(u64::from(h.discard), num(mx, "d"));
            continue;
        }
        let md = &f["md"];
        assert_eq!(int.shim.header_type, HeaderType::Md);
        for (name, got) in [
            ("ver", u64::from(h.version)),
            ("d", u64::from(h.discard)),
            ("e", u64::from(h.hop_count_exceeded)),
            ("m", u64::from(h.mtu_exceeded)),
            ("hop_ml", u64::from(h.hop_ml)),
            ("remaining_hop_cnt", u64::from(h.remaining_hop_cnt)),
            ("instruction_bitmap", u64::from(h.instructions.0)),
            ("domain_specific_id", u64::from(h.domain_id)),
            ("ds_instruction", u64::from(h.ds_instructions)),
            ("ds_flags", u64::from(h.ds_flags)),
        ] {
            assert_eq!(got, num(md, name), "frame {idx}: md {name}");
        }
        bits_seen |= h.instructions.0;
        let want = f["hops"].as_array().unwrap();
        assert_eq!(int.hop_count(), want.len(), "frame {idx}: hops");
        for (i, (got, w)) in int.hops().zip(want).enumerate() {
            hops_seen += 1;
            for (name, v) in w.as_object().unwrap() {
                if name == "reserved" {
                    let reserved: Vec<u64> =
                        (9..=14).filter_map(|bit| got.reserved(bit).map(u64::from)).collect();
                    let want: Vec<u64> =
                        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
                    assert_eq!(reserved, want, "frame {idx} hop {i}: reserved words");
                    continue;
                }
                let field = Field::from_name(name).unwrap_or_else(|| panic!("field {name}"));
                assert_eq!(got.get(field), v.as_u64(), "frame {idx} hop {i}: {name}");
            }
            // Nothing the instructions did not ask for.
            let asked = Field::ALL.iter().filter(|f| got.get(**f).is_some()).count();
            assert_eq!(asked, w.as_object().unwrap().keys().filter(|k| *k != "reserved").count());
        }
    }
    assert_eq!(bits_seen, 0xffff, "every instruction bit covered");
    assert!(hops_seen > 150, "{hops_seen} hops checked");

    let mut reports_seen = 0;
    for f in trpt["frames"].as_array().unwrap() {
        let idx = num(f, "index");
        let frame = unhex(f["frame_hex"].as_str().unwrap());
        let at = num(f, "udp_payload_offset") as usize;
        let datagram = &frame[at..at + num(f, "udp_payload_len") as usize];
        let parsed = report::parse(datagram, Mode::Strict).unwrap();
        let g = &f["group"];
        assert_eq!(u64::from(parsed.group().hw_id), num(g, "hw_id"), "report frame {idx}");
        assert_eq!(u64::from(parsed.group().seq), num(g, "sequence_number"), "report frame {idx}");
        assert_eq!(parsed.group().node_id.map(u64::from), Some(num(g, "node_id")));
        let got: Vec<_> = parsed.collect::<Result<_, _>>().unwrap_or_else(|e| panic!("{idx}: {e}"));
        let want = f["reports"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "report frame {idx}");
        for (r, w) in got.iter().zip(want) {
            reports_seen += 1;
            assert!(r.deviations.is_empty(), "report frame {idx}: {:?}", r.deviations);
            assert_eq!(r.rep_type, RepType::Int);
            let in_type = match num(w, "in_type") {
                3 => InType::Ethernet,
                4 => InType::Ipv4,
                5 => InType::Ipv6,
                o => panic!("in_type {o}"),
            };
            assert_eq!(r.in_type, in_type, "report frame {idx}");
            for (name, got) in [
                ("d", u64::from(r.flags.dropped)),
                ("q", u64::from(r.flags.congested)),
                ("f", u64::from(r.flags.tracked_flow)),
                ("i", u64::from(r.flags.intermediate)),
                ("rep_md_bits", u64::from(r.md_bits.0)),
                ("domain_specific_id", u64::from(r.domain_id)),
                ("ds_md_bits", u64::from(r.ds_md_bits)),
                ("ds_md_status", u64::from(r.ds_md_status)),
            ] {
                assert_eq!(got, num(w, name), "report frame {idx}: {name}");
            }
            for (name, v) in w["baseline"].as_object().unwrap() {
                if name == "drop_padding" {
                    continue;
                }
                let field = Field::from_name(name).unwrap_or_else(|| panic!("field {name}"));
                assert_eq!(r.metadata().get(field), v.as_u64(), "report frame {idx}: {name}");
            }
            let inner_at = r.inner.as_ptr() as usize - datagram.as_ptr() as usize;
            assert_eq!(inner_at as u64, num(w, "inner_offset_in_udp_payload"), "frame {idx}");
            let captured = num(w, "inner_captured_len") as usize;
            let padded = captured + num(w, "inner_pad_len") as usize;
            if num(w, "report_length") == 255 {
                assert!(r.inner.len() >= captured, "report frame {idx}: inner cut");
            } else {
                assert_eq!(r.inner.len(), padded, "report frame {idx}: inner length");
            }
        }
    }
    assert!(reports_seen >= 50, "{reports_seen} individual reports checked");
}

/// The sink gives back, bit for bit, the packet the independent encoder's source received;
/// and Telemark's own source, transit and sink round-trip those original packets, with IP and
/// L4 checksums that tshark verifies on the INT packets in between.
#[test]
fn sink_restores_originals_and_roles_round_trip() {
    use telemark_datapath::capture::CaptureWriter;
    use telemark_wire::int::Instructions;
    use telemark_wire::int_frame::{self, Edit, Signal, Source};

    let (int_md, _) = generate("roles");
    let signal = Signal {
        dscp: Some(int_md["conventions"]["int_dscp"].as_u64().unwrap() as u8),
        udp_port: Some(int_md["conventions"]["int_udp_port"].as_u64().unwrap() as u16),
        color_bit: None,
    };
    let dir = std::env::temp_dir().join(format!("telemark-int-roles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("roles.pcap");
    let mut out = CaptureWriter::create(&pcap).unwrap();
    let mut stripped = 0;
    let mut round_trips = 0;
    for f in int_md["frames"].as_array().unwrap() {
        if f["kind"] != "int_md" {
            continue;
        }
        let idx = num(f, "index");
        let mut frame = unhex(f["frame_hex"].as_str().unwrap());
        let original = unhex(f["stripped_frame_hex"].as_str().unwrap());
        let s = int_frame::strip(&mut frame, &signal, Mode::Strict).unwrap().expect("INT found");
        assert_eq!(s.hop_count as u64, num(f, "hop_count"), "frame {idx}");
        assert_eq!(frame, original, "frame {idx}: sink output differs from the original");
        stripped += 1;

        // Telemark's roles on the original: source (by port for UDP when NPT 1 was used, by
        // DSCP otherwise), two transits, then the sink.
        let by_port = num(&f["shim"], "npt") == 1;
        let src = Source {
            signal: Signal { udp_port: signal.udp_port.filter(|_| by_port), ..signal },
            instructions: Instructions([0xff00, 0x9000, 0xb000, 0xff81, 0xa001][idx as usize % 5]),
            max_hops: 4,
            domain_id: 0,
        };
        let mut pkt = original.clone();
        let hop = |node: u64| {
            let mut h = telemark_wire::int::Hop::default();
            for field in Field::ALL {
                h.set(field, node * 1000 + field as u64);
            }
            h
        };
        assert_eq!(int_frame::insert(&mut pkt, &src, &hop(1), 9000).unwrap(), Edit::Added);
        for node in [2, 3] {
            assert_eq!(
                int_frame::push(&mut pkt, &src.signal, &hop(node), 9000).unwrap(),
                Edit::Added
            );
        }
        out.write(idx * 1000, &pkt).unwrap();
        let s = int_frame::strip(&mut pkt, &src.signal, Mode::Strict).unwrap().expect("INT found");
        let nodes: Vec<u64> = s.hops().iter().filter_map(|h| h.get(Field::NodeId)).collect();
        assert_eq!(nodes, [3000, 2000, 1000], "frame {idx}: newest hop first");
        if src.instructions.has(2) {
            let latency = s.hops()[1].get(Field::HopLatency);
            assert_eq!(latency, Some(2000 + Field::HopLatency as u64), "frame {idx}");
        }
        assert_eq!(s.header.remaining_hop_cnt, 1);
        assert_eq!(pkt, original, "frame {idx}: round trip changed the packet");
        round_trips += 1;
    }
    out.finish().unwrap();
    assert!(stripped >= 80 && round_trips == stripped);

    // tshark checks the checksums of the INT packets Telemark's source and transits built.
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(&pcap)
        .args(["-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE"])
        .args(["-o", "tcp.check_checksum:TRUE", "-T", "fields", "-e", "frame.number"])
        .args([
            "-e",
            "ip.checksum.status",
            "-e",
            "udp.checksum.status",
            "-e",
            "tcp.checksum.status",
        ])
        .output()
        .expect("tshark runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut checked = 0;
    for line in text.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        for status in &cols[1..] {
            // 0 = bad, 1 = good, 2 = unverified (a UDP checksum of 0).
            assert!(!status.split(',').any(|s| s == "0"), "tshark: bad checksum in {line}");
            checked += usize::from(status.split(',').any(|s| s == "1"));
        }
    }
    assert!(checked >= round_trips, "tshark verified {checked} checksums");
    let _ = std::fs::remove_dir_all(&dir);
}
