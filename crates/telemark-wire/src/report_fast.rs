//! The common Telemetry Report, read at fixed offsets: a faster encoding of what
//! [`report::parse`] and [`int_frame::find_reported`] give for it, for a collector that must
//! read millions of them per second.
//!
//! The common report is what a conforming INT v2.1 sink sends (Telemetry Report v2.0 §3):
//!
//! - a v2.0 datagram (group header version 2) holding exactly one individual report: its
//!   Report Length covers the rest of the datagram, or is 0xFF ("to the end", §3.3);
//! - RepType INT, InType Ethernet, IPv4 or IPv6 (the contents starting as it says), and MD
//!   Length at least what RepMdBits ask for;
//! - inside: the layers to TCP or UDP as [`int_frame::layers_from`] walks them (the same
//!   walk), then an INT v2.1 shim of type INT-MD signalled by DSCP (NPT 0) or by UDP port
//!   (NPT 1), whose Length read as v2.1 says fits the packet and whole hops; Hop ML at least
//!   the instructions' metadata, and more only with domain-specific instructions.
//!
//! Such a report breaks no rule, so strict and tolerant readings agree, and [`read`] returns
//! exactly what the reference readers return for it (a property test holds it to that). Any
//! other datagram, however ordinary (NPT 2, several reports, any dialect), gets `None`, and the
//! caller reads it with the reference readers.
//!
//! [`report::parse`]: crate::report::parse
//! [`int_frame::find_reported`]: crate::int_frame::find_reported
//! [`int_frame::layers_from`]: crate::int_frame::layers_from

use crate::dialect::Deviations;
use crate::int::{
    Format, HeaderType, Instructions, Int, Layout, MdHeader, NextProtocol, Shim, ShimRepr, Version,
    MD_HEADER_LEN, SHIM_LEN,
};
use crate::int_frame::{layers_from, original_flow, Found, Start};
use crate::report::{
    Flags, InType, RepType, Report, ReportVersion, GROUP_HEADER_LEN, INDIVIDUAL_HEADER_LEN,
    MAIN_FIXED_LEN,
};

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The one report of a common datagram and the INT in the packet it carries; `None` when the
/// datagram is not of the common shape (read it with the reference readers then).
pub fn read(datagram: &[u8]) -> Option<(Report<'_>, Found<'_>)> {
    let report = read_report(datagram)?;
    let start = match report.in_type {
        InType::Ethernet => Start::Ethernet,
        _ => Start::Ip,
    };
    let found = read_int(report.inner, start)?;
    Some((report, found))
}

/// The group header, the individual report header and the main contents.
#[inline(always)]
fn read_report(b: &[u8]) -> Option<Report<'_>> {
    const BODY: usize = GROUP_HEADER_LEN + INDIVIDUAL_HEADER_LEN;
    let body = b.get(BODY..)?;
    if b[0] >> 4 != 2 || body.len() < MAIN_FIXED_LEN {
        return None;
    }
    let ind = &b[GROUP_HEADER_LEN..BODY];
    let in_type = InType::from(ind[0] & 0x0f);
    // One report, filling the datagram.
    let whole = ind[1] == 0xff || usize::from(ind[1]) * 4 == body.len();
    let known_type = matches!(in_type, InType::Ethernet | InType::Ipv4 | InType::Ipv6);
    if ind[0] >> 4 != 1 || !known_type || !whole {
        return None;
    }
    let md_bits = Instructions(be16(body, 0));
    let main_len = MAIN_FIXED_LEN + usize::from(ind[2]) * 4;
    let md = body.get(MAIN_FIXED_LEN..main_len)?;
    if md.len() < Layout::len_of(md_bits, Format::ReportV2_0) {
        return None;
    }
    let inner = &body[main_len..];
    let version = inner.first().map(|v| v >> 4);
    match in_type {
        InType::Ipv4 if version != Some(4) => return None,
        InType::Ipv6 if version != Some(6) => return None,
        _ => {}
    }
    let w0 = be32(b, 0);
    Some(Report {
        version: ReportVersion::V2_0,
        hw_id: ((w0 >> 22) & 0x3f) as u8,
        seq: w0 & 0x3f_ffff,
        seq_bits: 22,
        node_id: Some(be32(b, 4)),
        ingress_ts: None,
        rep_type: RepType::Int,
        in_type,
        flags: Flags {
            dropped: ind[3] & 0x80 != 0,
            congested: ind[3] & 0x40 != 0,
            tracked_flow: ind[3] & 0x20 != 0,
            intermediate: ind[3] & 0x10 != 0,
        },
        md_bits,
        domain_id: be16(body, 2),
        ds_md_bits: be16(body, 4),
        ds_md_status: be16(body, 6),
        md,
        drop: None,
        inner,
        deviations: Deviations::NONE,
    })
}

/// The layers to TCP or UDP, then INT-MD v2.1.
#[inline(always)]
fn read_int(frame: &[u8], start: Start) -> Option<Found<'_>> {
    let layers = layers_from(frame, start)?;
    let after_l4 = layers.after_l4;
    let b = &frame[after_l4..];
    let head = b.get(..SHIM_LEN + MD_HEADER_LEN)?;
    // INT-MD v2.1, NPT 0 or 1.
    if head[0] >> 4 != 1 || (head[0] >> 2) & 0x3 > 1 || head[4] >> 4 != 2 {
        return None;
    }
    let shim = ShimRepr::parse(&Shim::new_checked(head).ok()?);
    let header = MdHeader::parse_md(&head[SHIM_LEN..], Version::V2_1).ok()?;
    let len = usize::from(shim.length_words) * 4 + SHIM_LEN;
    let stride = usize::from(header.hop_ml) * 4;
    let hop_len = Layout::len_of(header.instructions, Version::V2_1);
    let stack = b.get(SHIM_LEN + MD_HEADER_LEN..len)?;
    let whole_hops = match stride {
        0 => stack.is_empty(),
        s => (stack.len() as u32).is_multiple_of(s as u32),
    };
    let extra_explained = stride == hop_len || header.ds_instructions != 0;
    if !whole_hops || stride < hop_len || !extra_explained {
        return None;
    }
    debug_assert!(matches!(shim.next_protocol, NextProtocol::Dscp(_) | NextProtocol::UdpPort(_)));
    debug_assert_eq!(shim.header_type, HeaderType::Md);
    let int = Int {
        shim,
        header: Some(header),
        len,
        stack,
        hop_stride: stride,
        deviations: Deviations::NONE,
    };
    Some(Found { layers, int, flow: original_flow(frame, &layers, &int) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Mode;
    use crate::int::{Field, Hop};
    use crate::int_frame::{find_reported, Start};
    use crate::report::{self, Writer};
    use proptest::prelude::*;

    /// The knobs of a generated report: the common shape when every knob is at its first
    /// value, and the ways real senders leave it.
    #[derive(Debug, Clone)]
    struct Shape {
        in_type: u8,
        vlan: bool,
        tcp: bool,
        npt: u8,
        items: u16,
        hops: usize,
        extra_words: u8,
        ds_instructions: u16,
        length_delta: i8,
        own_md: u16,
        second_report: bool,
        report_len_ff: bool,
        group_version: u8,
        payload: usize,
    }

    fn shapes() -> impl Strategy<Value = Shape> {
        (
            (prop_oneof![Just(3u8), Just(4u8), Just(5u8)], any::<bool>(), any::<bool>(), 0u8..4),
            (any::<u16>(), 0usize..5, prop_oneof![Just(0u8), Just(0), Just(1)], any::<u16>()),
            (prop_oneof![Just(0i8), Just(0), Just(0), Just(-1), Just(1)], any::<u16>()),
            (any::<bool>(), any::<bool>(), prop_oneof![Just(2u8), Just(2), Just(1)], 0usize..24),
        )
            .prop_map(
                |((in_type, vlan, tcp, npt), (items, hops, extra, ds), (delta, md), rest)| {
                    Shape {
                        in_type,
                        vlan: vlan && in_type == 3,
                        tcp,
                        npt,
                        // Mostly the baseline bits 0–7, sometimes anything.
                        items: if items & 1 == 0 { items & 0xff00 } else { items },
                        hops,
                        extra_words: extra,
                        ds_instructions: if ds & 3 == 0 { ds } else { 0 },
                        length_delta: delta,
                        own_md: if md & 3 == 0 { md & 0xff00 } else { 0 },
                        second_report: rest.0 && rest.1,
                        report_len_ff: rest.1 && !rest.0,
                        group_version: rest.2,
                        payload: rest.3,
                    }
                },
            )
    }

    /// The packet a sink reports: Ethernet (or not), IPv4, UDP/TCP, an INT-MD v2.1 stack.
    fn inner(s: &Shape) -> Vec<u8> {
        let ins = Instructions(s.items);
        let layout = Layout::new(ins, Version::V2_1);
        let stride = layout.hop_len() + usize::from(s.extra_words) * 4;
        let int_len = SHIM_LEN + MD_HEADER_LEN + s.hops * stride;
        let l4_len = if s.tcp { 20 } else { 8 };
        let mut p = Vec::new();
        if s.in_type == 3 {
            p.extend_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
            if s.vlan {
                p.extend_from_slice(&[0x81, 0x00, 0, 7]);
            }
            p.extend_from_slice(&[0x08, 0x00]);
        }
        let ip = p.len();
        let total = 20 + l4_len + int_len + s.payload;
        p.extend_from_slice(&[0x45, 0x17 << 2]);
        p.extend_from_slice(&(total as u16).to_be_bytes());
        p.extend_from_slice(&[0, 1, 0x40, 0, 64, if s.tcp { 6 } else { 17 }, 0, 0]);
        p.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        p.extend_from_slice(&[0x9c, 0x40, 0x13, 0x88]);
        if s.tcp {
            p.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        } else {
            p.extend_from_slice(&((8 + int_len + s.payload) as u16).to_be_bytes());
            p.extend_from_slice(&[0, 0]);
        }
        let words = (int_len - SHIM_LEN) / 4;
        let length = (words as i16 + i16::from(s.length_delta)).clamp(0, 255) as u8;
        let (npt_rest, npt) = match s.npt {
            0 => ([0, 0x2e << 2], 0),
            1 => (5001u16.to_be_bytes(), 1),
            2 => ([0, 17], 2),
            _ => ([1, 2], 3),
        };
        p.extend_from_slice(&[0x10 | (npt << 2), length, npt_rest[0], npt_rest[1]]);
        p.extend_from_slice(&[0x20, 0, (stride / 4) as u8, 5]);
        p.extend_from_slice(&s.items.to_be_bytes());
        p.extend_from_slice(&[0, 9]);
        p.extend_from_slice(&s.ds_instructions.to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        for k in 0..s.hops {
            let mut hop = Hop::default();
            hop.set(Field::NodeId, k as u64 + 1);
            hop.set(Field::HopLatency, 1000 * k as u64 + 7);
            let mut b = vec![0u8; stride];
            layout.write(&hop, &mut b).unwrap();
            p.extend_from_slice(&b);
        }
        if s.npt == 2 {
            p.extend_from_slice(&[0x9c, 0x41, 0x13, 0x89, 0, (8 + s.payload) as u8, 0, 0]);
        }
        p.extend(std::iter::repeat_n(0xab, s.payload));
        let _ = ip;
        p
    }

    fn datagram(s: &Shape) -> Vec<u8> {
        let packet = inner(s);
        let mut buf = vec![0u8; 2 * packet.len() + 256];
        let mut w = Writer::new(&mut buf, 3, 1234, 77).unwrap();
        let mut md = Hop::default();
        md.set(Field::NodeId, 77);
        md.set(Field::HopLatency, 4242);
        let in_type = InType::from(s.in_type);
        w.push(in_type, Flags::default(), Instructions(s.own_md), &md, &packet).unwrap();
        if s.second_report {
            w.push(in_type, Flags::default(), Instructions(0), &md, &packet).unwrap();
        }
        let n = w.len();
        buf.truncate(n);
        buf[0] = (buf[0] & 0x0f) | (s.group_version << 4);
        if s.report_len_ff {
            buf[GROUP_HEADER_LEN + 1] = 0xff;
        }
        buf
    }

    /// Whenever the fast reader answers, both reference readings, strict and tolerant, say
    /// the same: the one report, its INT and flow, byte for byte the same slices.
    fn agrees(d: &[u8]) -> bool {
        let Some((r, f)) = read(d) else { return false };
        for mode in [Mode::Strict, Mode::Tolerant] {
            let mut reports = report::parse(d, mode).expect("reference reads the datagram");
            let reference = reports.next().expect("one report").expect("a good report");
            assert!(reports.next().is_none(), "the fast reader took a datagram of several");
            assert_eq!(reference, r);
            assert_eq!(
                (reference.inner.as_ptr(), reference.md.as_ptr()),
                (r.inner.as_ptr(), r.md.as_ptr())
            );
            let start = if r.in_type == InType::Ethernet { Start::Ethernet } else { Start::Ip };
            let found = find_reported(r.inner, start, mode).expect("INT reads").expect("INT");
            assert_eq!(found, f);
            assert_eq!(found.int.stack.as_ptr(), f.int.stack.as_ptr());
        }
        true
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn answers_exactly_as_the_reference_readers(s in shapes(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3), cut in any::<Option<usize>>()) {
            let mut d = datagram(&s);
            let common = s.in_type != 5 && s.npt < 2 && s.length_delta == 0
                && (s.extra_words == 0 || s.ds_instructions != 0)
                && !s.second_report && s.group_version == 2;
            // The common shape, untouched, is read fast; others may be too, when they happen
            // to be conforming reports of the common shape after all (agrees checks them).
            let fast = agrees(&d);
            prop_assert!(fast || !common, "{:?}", s);
            // Damaged: the fast reader declines or agrees.
            for (at, x) in flips {
                let n = d.len();
                d[at % n] ^= x;
            }
            if let Some(c) = cut {
                d.truncate(c % (d.len() + 1));
            }
            agrees(&d);
        }
    }
}
