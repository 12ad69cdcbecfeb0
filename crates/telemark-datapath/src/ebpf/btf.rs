//! Drop reason names from the running kernel's BTF: `enum skb_drop_reason` differs between
//! kernel versions, so the numbers `skb:kfree_skb` reports are named by the kernel's own
//! type information (`/sys/kernel/btf/vmlinux`), not by a table compiled in.
//!
//! The BTF layout is the kernel's (Documentation/bpf/btf.rst): a header, then type records of
//! 12 bytes each followed by kind-specific data, then the string section.

use std::collections::HashMap;

/// Where the running kernel publishes its BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const KIND_ENUM: u32 = 6;
const KIND_ENUM64: u32 = 19;

/// The constants of the enum named `name` (`SKB_DROP_REASON_` and the like left as they are),
/// by value; `None` when the BTF has no such enum. Errors name what is malformed.
pub fn enum_values(btf: &[u8], name: &str) -> Result<Option<HashMap<u64, String>>, String> {
    let u16_at = |o: usize| btf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| btf.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if u16_at(0) != Some(MAGIC) {
        return Err("not little-endian BTF (bad magic)".into());
    }
    let field = |o: usize| u32_at(o).map(|v| v as usize).ok_or("BTF header cut short");
    let hdr_len = field(4)?;
    let (type_off, type_len) = (field(8)?, field(12)?);
    let (str_off, str_len) = (field(16)?, field(20)?);
    let types = hdr_len.checked_add(type_off).ok_or("BTF type offset overflows")?;
    let strings = hdr_len.checked_add(str_off).ok_or("BTF string offset overflows")?;
    let types_end = types.checked_add(type_len).filter(|e| *e <= btf.len());
    let types_end = types_end.ok_or("BTF type section beyond the data")?;
    let strings_end = strings.checked_add(str_len).filter(|e| *e <= btf.len());
    let strings = &btf[strings..strings_end.ok_or("BTF string section beyond the data")?];
    let string = |off: u32| -> Option<&str> {
        let s = strings.get(off as usize..)?;
        let end = s.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&s[..end]).ok()
    };
    let mut o = types;
    while o + 12 <= types_end {
        let (name_off, info) = (u32_at(o).unwrap_or(0), u32_at(o + 4).unwrap_or(0));
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        let extra = match kind {
            1 | 14 | 17 => 4,          // INT, VAR, DECL_TAG
            3 => 12,                   // ARRAY
            4 | 5 | 15 => 12 * vlen,   // STRUCT, UNION, DATASEC
            6 | 13 => 8 * vlen,        // ENUM, FUNC_PROTO
            KIND_ENUM64 => 12 * vlen,  // ENUM64
            2 | 7..=12 | 16 | 18 => 0, // PTR, FWD … FUNC, FLOAT, TYPE_TAG
            k => return Err(format!("BTF kind {k} unknown")),
        };
        let body = o + 12;
        if (kind == KIND_ENUM || kind == KIND_ENUM64) && string(name_off) == Some(name) {
            let step = if kind == KIND_ENUM { 8 } else { 12 };
            let mut values = HashMap::new();
            for i in 0..vlen {
                let e = body + i * step;
                let (Some(n), Some(lo)) = (u32_at(e), u32_at(e + 4)) else {
                    return Err("BTF enum cut short".into());
                };
                let hi = if kind == KIND_ENUM64 { u32_at(e + 8).unwrap_or(0) } else { 0 };
                let v = u64::from(lo) | u64::from(hi) << 32;
                values.insert(v, string(n).unwrap_or("?").to_string());
            }
            return Ok(Some(values));
        }
        o = body + extra;
    }
    Ok(None)
}

/// The running kernel's drop reasons by number, without the `SKB_DROP_REASON_` prefix
/// (`NETFILTER_DROP`); empty when the kernel has no BTF or no reasons.
pub fn drop_reasons() -> HashMap<u64, String> {
    let Ok(btf) = std::fs::read(VMLINUX) else { return HashMap::new() };
    enum_values(&btf, "skb_drop_reason")
        .ok()
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .map(|(v, n)| (v, n.strip_prefix("SKB_DROP_REASON_").unwrap_or(&n).to_string()))
        .collect()
}

/// This kernel's `SKB_CONSUMED` (a free after use, reported by `kfree_skb` on kernels before
/// 6.2 where it was not split off), or `u32::MAX` where it has none.
pub fn consumed_reason() -> u32 {
    let Ok(btf) = std::fs::read(VMLINUX) else { return u32::MAX };
    let values = enum_values(&btf, "skb_drop_reason").ok().flatten().unwrap_or_default();
    values
        .iter()
        .find(|(_, n)| n.as_str() == "SKB_CONSUMED")
        .and_then(|(v, _)| u32::try_from(*v).ok())
        .unwrap_or(u32::MAX)
}

/// The drop reasons of egress queues (qdiscs), which drop after the tc egress hook: the reason
/// names of Linux 6.18 and before that mean it.
const EGRESS_QUEUE_REASONS: [&str; 7] = [
    "QDISC_DROP",
    "QDISC_OVERLIMIT",
    "QDISC_CONGESTED",
    "CAKE_FLOOD",
    "FQ_BAND_LIMIT",
    "FQ_FLOW_LIMIT",
    "FQ_HORIZON_LIMIT",
];

/// Reasons that free a copy the host was not meant to keep, not a packet of a flow: a frame
/// addressed to another host, freed by IP after a packet socket (Open vSwitch's userspace
/// datapath, a capture) took its own copy.
const NOT_LOSS_REASONS: [&str; 1] = ["OTHERHOST"];

/// This kernel's numbers for the reasons an egress queue drops with.
pub fn egress_queue_reasons() -> Vec<u32> {
    reasons_named(&EGRESS_QUEUE_REASONS)
}

/// This kernel's numbers for the reasons that are no flow's loss ([`NOT_LOSS_REASONS`]).
pub fn not_loss_reasons() -> Vec<u32> {
    reasons_named(&NOT_LOSS_REASONS)
}

fn reasons_named(names: &[&str]) -> Vec<u32> {
    drop_reasons()
        .into_iter()
        .filter(|(_, n)| names.contains(&n.as_str()))
        .filter_map(|(v, _)| u32::try_from(v).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob built by hand: an INT, then `enum colour { RED = 1, BLUE = 7 }`.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0colour\0RED\0BLUE\0";
        let mut types = Vec::new();
        let mut ty = |name: u32, info: u32, size: u32, extra: &[u32]| {
            for v in [name, info, size].iter().chain(extra) {
                types.extend_from_slice(&v.to_le_bytes());
            }
        };
        ty(1, 1 << 24, 4, &[32]);
        ty(5, (KIND_ENUM << 24) | 2, 4, &[12, 1, 16, 7]);
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [24u32, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&types);
        b.extend_from_slice(strings);
        b
    }

    #[test]
    fn finds_an_enum_by_name() {
        let v = enum_values(&blob(), "colour").unwrap().unwrap();
        assert_eq!(v[&1], "RED");
        assert_eq!(v[&7], "BLUE");
        assert_eq!(enum_values(&blob(), "shade").unwrap(), None);
    }

    #[test]
    fn malformed_blobs_are_errors_not_panics() {
        let b = blob();
        for cut in 0..b.len() {
            let _ = enum_values(&b[..cut], "colour");
        }
        assert!(enum_values(&[0u8; 3], "colour").is_err());
    }

    /// The running kernel's reasons, read independently through bpftool (needs bpftool and a
    /// kernel with BTF and drop reasons, as CI has): NETFILTER_DROP has bpftool's number.
    #[test]
    fn the_kernels_own_reasons_match_bpftool() {
        let out = std::process::Command::new("bpftool")
            .args(["btf", "dump", "file", VMLINUX, "format", "raw"])
            .output()
            .expect("this test needs bpftool (apt-get install bpftool)");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.contains("'SKB_DROP_REASON_NETFILTER_DROP'"))
            .expect("this test needs a kernel whose BTF has drop reasons (Linux 5.17 or later)");
        let want: u64 = line.rsplit("val=").next().unwrap().trim().parse().unwrap();
        assert_eq!(drop_reasons()[&want], "NETFILTER_DROP");
    }
}
