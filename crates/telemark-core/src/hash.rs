//! Flow hashing for the fast path.
//!
//! The 64-bit hash is split the way the loss paper's tables use it (IV-B): the low 32 bits are
//! "the 32-bit flow hash" that picks a bucket and (bit 16) a way; the high 32 bits are kept in
//! the entry as a tag that tells flows sharing a bucket apart.

use core::net::IpAddr;
use telemark_wire::FlowKey;

const K0: u64 = 0x9e37_79b9_7f4a_7c15;
const K1: u64 = 0xbf58_476d_1ce4_e5b9;
const K2: u64 = 0x94d0_49bb_1331_11eb;

#[inline(always)]
fn mix(acc: u64, v: u64) -> u64 {
    // Multiply-fold round (in the style of wyhash/foldhash): cheap and well spread in both halves.
    let m = u128::from(acc ^ v) * u128::from(K1);
    (m as u64) ^ ((m >> 64) as u64)
}

#[inline(always)]
fn fin(mut z: u64) -> u64 {
    // SplitMix64 finaliser (Steele et al., OOPSLA 2014).
    z = (z ^ (z >> 30)).wrapping_mul(K1);
    z = (z ^ (z >> 27)).wrapping_mul(K2);
    z ^ (z >> 31)
}

/// 64-bit hash of a flow key; equal keys hash equal, in every process (no random seed), so
/// replay results are reproducible.
#[inline]
pub fn flow_hash(k: &FlowKey) -> u64 {
    let ports = (u64::from(k.sport) << 48)
        | (u64::from(k.dport) << 32)
        | (u64::from(k.proto) << 24)
        | u64::from(k.si.unwrap_or(0));
    let mut h = K0 ^ ports;
    match (k.src, k.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            h = mix(h, (u64::from(u32::from(s)) << 32) | u64::from(u32::from(d)));
        }
        (s, d) => {
            for a in [s, d] {
                let o = match a {
                    IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                    IpAddr::V6(a) => a.octets(),
                };
                let (hi, lo) = o.split_at(8);
                h = mix(h, u64::from_be_bytes(hi.try_into().unwrap_or([0; 8])));
                h = mix(h, u64::from_be_bytes(lo.try_into().unwrap_or([0; 8])) ^ 0x6);
            }
        }
    }
    if let Some(spi) = k.spi {
        h = mix(h, u64::from(spi) | 1 << 40);
    }
    fin(h)
}

/// A [`core::hash::Hasher`] for tables keyed by flows (`HashMap<FlowKey, _, FlowTableHasher>`):
/// one multiply-fold per field written, then the SplitMix64 finaliser, instead of std's SipHash,
/// which costs more than the rest of an exact flow table's update. Like [`flow_hash`] it has no
/// random seed, so it suits measurement tables and baselines, not tables whose keys an attacker
/// chooses freely to collide.
#[derive(Debug, Clone, Copy, Default)]
pub struct FoldHasher(u64);

impl core::hash::Hasher for FoldHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.0 = mix(self.0, u64::from_le_bytes(w) ^ K2);
        }
    }
    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_u16(&mut self, v: u16) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = mix(self.0 ^ K0, v);
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        fin(self.0)
    }
}

/// The `BuildHasher` of [`FoldHasher`].
pub type FlowTableHasher = core::hash::BuildHasherDefault<FoldHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;
    use std::collections::HashSet;

    fn key(i: u32) -> FlowKey {
        FlowKey {
            src: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 1, 0, 1)),
            sport: 40000,
            dport: 5201,
            proto: 17,
            spi: None,
            si: None,
        }
    }

    #[test]
    fn distinct_and_spread() {
        // 65,536 sequential flows: no 64-bit collisions, and the 512 buckets × 2 ways of the
        // paper's layout are filled evenly (each slot within 4 sigma of the mean of 64).
        let mut seen = HashSet::new();
        let mut slots = vec![0u32; 1024];
        for i in 0..65536 {
            let h = flow_hash(&key(i));
            assert!(seen.insert(h));
            let lo = h as u32;
            slots[((lo as usize & 511) << 1) | ((lo >> 16) & 1) as usize] += 1;
        }
        let (min, max) = (slots.iter().min().unwrap(), slots.iter().max().unwrap());
        assert!(*min >= 32 && *max <= 96, "min {min} max {max}");
    }

    #[test]
    fn nsh_path_changes_hash() {
        let a = key(1);
        let b = FlowKey { spi: Some(5), si: Some(255), ..a };
        let c = FlowKey { spi: Some(5), si: Some(254), ..a };
        assert_ne!(flow_hash(&a), flow_hash(&b));
        assert_ne!(flow_hash(&b), flow_hash(&c));
    }
}
