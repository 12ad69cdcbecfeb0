//! Sketches: small, fixed-size summaries of a packet stream that answer "how many packets did
//! this key send" (Count-Min, Count Sketch, K-ary, UnivMon), "have I seen this key" (Bloom
//! filter) and "which keys, with what counts" (IBLT), plus NitroSketch's sampled updates that
//! make them cheap enough for the fast path. Sans-IO like the rest of the core: a sketch takes
//! key bytes and counts, and gives estimates back.
//!
//! Every structure derives its indices from a [`Hasher`], is `serde`-serialisable, and merges
//! with another built with the same shape and seed (`merge`), so windows and agents combine.
//! The error bounds from the literature are stated on each type and checked by its tests.
//! docs/sketches.md has the whole picture and the measured figures.

pub mod bloom;
pub mod countmin;
pub mod countsketch;
pub mod iblt;
pub mod kary;
pub mod murmur;
pub mod nitro;
pub mod sfcmon;
pub mod topk;
pub mod univmon;

use core::net::IpAddr;
use serde::{Deserialize, Serialize};
use telemark_wire::FlowKey;

pub use murmur::murmur3_32;

/// How a sketch turns a key into one 32-bit hash per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Hashing {
    /// One seeded MurmurHash3 (x86, 32-bit) per row, as SFCMon: rows are independent.
    #[default]
    Murmur3,
    /// One 64-bit multiply-fold hash of the key, rows derived by double hashing
    /// (Kirsch & Mitzenmacher, "Less hashing, same performance", ESA 2006) and a 32-bit
    /// finaliser: a single pass over the key whatever the depth.
    Fast,
}

/// Row hashes of keys: a [`Hashing`] and a seed. Two sketches merge only with equal hashers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hasher {
    /// The hash family.
    pub kind: Hashing,
    /// The seed; row `i` uses a seed derived from it.
    pub seed: u32,
}

impl Default for Hasher {
    fn default() -> Self {
        Hasher { kind: Hashing::Murmur3, seed: 0x7e1e_3a4c }
    }
}

const GOLDEN: u32 = 0x9e37_79b9;

impl Hasher {
    /// A hasher of `kind` with `seed`.
    pub fn new(kind: Hashing, seed: u32) -> Hasher {
        Hasher { kind, seed }
    }

    /// The 32-bit hash of `key` for row `row`.
    #[inline]
    pub fn row(&self, key: &[u8], row: usize) -> u32 {
        match self.kind {
            Hashing::Murmur3 => {
                murmur3_32(key, self.seed.wrapping_add(GOLDEN.wrapping_mul(row as u32)))
            }
            Hashing::Fast => {
                let h = fast64(key, self.seed);
                derive(h, row)
            }
        }
    }

    /// The hashes of `key` for rows `0..out.len()`.
    #[inline]
    pub fn rows(&self, key: &[u8], out: &mut [u32]) {
        match self.kind {
            Hashing::Murmur3 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = self.row(key, i);
                }
            }
            Hashing::Fast => {
                let h = fast64(key, self.seed);
                for (i, o) in out.iter_mut().enumerate() {
                    *o = derive(h, i);
                }
            }
        }
    }
}

#[inline(always)]
fn derive(h: u64, row: usize) -> u32 {
    let (a, b) = (h as u32, ((h >> 32) as u32) | 1);
    murmur::fmix32(a.wrapping_add(b.wrapping_mul(row as u32)))
}

/// 64-bit multiply-fold hash of a byte string (8 bytes per round, SplitMix64 finaliser).
#[inline]
pub fn fast64(key: &[u8], seed: u32) -> u64 {
    const K: u64 = 0xbf58_476d_1ce4_e5b9;
    let mix = |acc: u64, v: u64| {
        let m = u128::from(acc ^ v) * u128::from(K);
        (m as u64) ^ ((m >> 64) as u64)
    };
    let mut h = 0x9e37_79b9_7f4a_7c15 ^ u64::from(seed) ^ ((key.len() as u64) << 56);
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = mix(h, u64::from_le_bytes(b));
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut b = [0u8; 8];
        b[..tail.len()].copy_from_slice(tail);
        h = mix(h, u64::from_le_bytes(b) ^ 0x5555);
    }
    let mut z = h;
    z = (z ^ (z >> 30)).wrapping_mul(K);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Column of a 32-bit hash in a row of `width` counters (multiply-shift range reduction: uses the
/// high bits, no division).
#[inline(always)]
pub fn column(h: u32, width: usize) -> usize {
    ((u64::from(h) * width as u64) >> 32) as usize
}

/// +1 or −1 from a row hash's lowest bit (independent of the column, which uses the high bits).
#[inline(always)]
pub fn sign(h: u32) -> i64 {
    1 - 2 * i64::from(h & 1)
}

/// Largest encoded key: tag, SPI (3), SI, two IPv6 addresses, ports, protocol.
pub const KEY_MAX: usize = 42;

/// A flow key (or part of one) as compact bytes: what sketches hash and the IBLT stores.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyBytes {
    buf: [u8; KEY_MAX],
    len: u8,
}

impl core::fmt::Debug for KeyBytes {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.flow() {
            Some(k) => write!(f, "{k:?}"),
            None => write!(f, "KeyBytes({:02x?})", self.as_bytes()),
        }
    }
}

const TAG_V6: u8 = 1;
const TAG_NSH: u8 = 2;
const TAG_SOURCE: u8 = 4;

impl KeyBytes {
    /// Any byte string of at most [`KEY_MAX`] bytes as a key.
    pub fn from_slice(b: &[u8]) -> Option<KeyBytes> {
        let mut out = KeyBytes { buf: [0; KEY_MAX], len: 0 };
        (b.len() <= KEY_MAX).then(|| {
            out.push(b);
            out
        })
    }

    /// The encoded bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }

    /// The zero-padded buffer (what an IBLT cell XORs).
    pub fn padded(&self) -> &[u8; KEY_MAX] {
        &self.buf
    }

    fn push(&mut self, b: &[u8]) {
        let at = usize::from(self.len);
        self.buf[at..at + b.len()].copy_from_slice(b);
        self.len += b.len() as u8;
    }

    fn start(k: &FlowKey, extra: u8) -> KeyBytes {
        let mut tag = extra;
        if k.src.is_ipv6() || k.dst.is_ipv6() {
            tag |= TAG_V6;
        }
        if k.spi.is_some() || k.si.is_some() {
            tag |= TAG_NSH;
        }
        let mut out = KeyBytes { buf: [0; KEY_MAX], len: 0 };
        out.push(&[tag]);
        let spi = k.spi.unwrap_or(0).to_be_bytes();
        out.push(&[spi[1], spi[2], spi[3], k.si.unwrap_or(0)]);
        out
    }

    fn addr(&mut self, a: IpAddr, v6: bool) {
        match (a, v6) {
            (IpAddr::V4(a), false) => self.push(&a.octets()),
            (IpAddr::V4(a), true) => self.push(&a.to_ipv6_mapped().octets()),
            (IpAddr::V6(a), _) => self.push(&a.octets()),
        }
    }

    /// SFCMon's FlowID2: SPI, SI and the 5-tuple.
    pub fn flow_of(k: &FlowKey) -> KeyBytes {
        let mut out = KeyBytes::start(k, 0);
        let v6 = out.buf[0] & TAG_V6 != 0;
        out.addr(k.src, v6);
        out.addr(k.dst, v6);
        out.push(&k.sport.to_be_bytes());
        out.push(&k.dport.to_be_bytes());
        out.push(&[k.proto]);
        out
    }

    /// SFCMon's FlowID1: SPI, SI and the source address.
    pub fn source_of(k: &FlowKey) -> KeyBytes {
        let mut out = KeyBytes::start(k, TAG_SOURCE);
        out.addr(k.src, k.src.is_ipv6());
        out
    }

    /// The key from a zero-padded buffer (as listed out of an IBLT), if it is a well-formed
    /// encoding.
    pub fn from_padded(buf: &[u8; KEY_MAX]) -> Option<KeyBytes> {
        let tag = buf[0];
        if tag & !(TAG_V6 | TAG_NSH | TAG_SOURCE) != 0 {
            return None;
        }
        let a = if tag & TAG_V6 != 0 { 16 } else { 4 };
        let len = if tag & TAG_SOURCE != 0 { 5 + a } else { 5 + 2 * a + 5 };
        if buf[len..].iter().any(|b| *b != 0) {
            return None;
        }
        Some(KeyBytes { buf: *buf, len: len as u8 })
    }

    /// The flow key back (FlowID2 encodings only; a source key has no destination).
    pub fn flow(&self) -> Option<FlowKey> {
        let b = self.as_bytes();
        let tag = *b.first()?;
        if tag & TAG_SOURCE != 0 {
            return None;
        }
        let a = if tag & TAG_V6 != 0 { 16 } else { 4 };
        if b.len() != 5 + 2 * a + 5 {
            return None;
        }
        let ip = |s: &[u8]| -> IpAddr {
            if a == 4 {
                IpAddr::from([s[0], s[1], s[2], s[3]])
            } else {
                let mut o = [0u8; 16];
                o.copy_from_slice(s);
                let v6 = core::net::Ipv6Addr::from(o);
                v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
            }
        };
        let p = 5 + 2 * a;
        let nsh = tag & TAG_NSH != 0;
        Some(FlowKey {
            src: ip(&b[5..5 + a]),
            dst: ip(&b[5 + a..5 + 2 * a]),
            sport: u16::from_be_bytes([b[p], b[p + 1]]),
            dport: u16::from_be_bytes([b[p + 2], b[p + 3]]),
            proto: b[p + 4],
            spi: nsh.then(|| u32::from_be_bytes([0, b[1], b[2], b[3]])),
            si: nsh.then_some(b[4]),
        })
    }
}

impl Serialize for KeyBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.as_bytes())
    }
}

impl<'de> Deserialize<'de> for KeyBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v: Vec<u8> = Deserialize::deserialize(d)?;
        KeyBytes::from_slice(&v).ok_or_else(|| {
            serde::de::Error::custom(format!("key of {} bytes; at most {KEY_MAX}", v.len()))
        })
    }
}

/// Why two sketches cannot be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// Different dimensions, hashing or seeds: their counters do not mean the same thing.
    #[error("cannot merge sketches of different shape or seed: {0}")]
    Shape(&'static str),
}

/// Deepest sketch supported (row hashes live on the stack).
pub const MAX_DEPTH: usize = 16;

/// `depth` rows of `width` counters and the hasher that picks one column per row: the state
/// Count-Min, Count Sketch and K-ary share (and merge the same way, counter by counter).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rows<T> {
    depth: usize,
    width: usize,
    hasher: Hasher,
    counters: Vec<T>,
}

impl<T: Copy + Default> Rows<T> {
    /// `depth` rows (1..=16) of `width` counters (at least `min_width`).
    pub fn new(depth: usize, width: usize, min_width: usize, hasher: Hasher) -> Rows<T> {
        let (depth, width) = (depth.clamp(1, MAX_DEPTH), width.max(min_width));
        Rows { depth, width, hasher, counters: vec![T::default(); depth * width] }
    }

    /// Rows.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Counters per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The row hasher.
    pub fn hasher(&self) -> &Hasher {
        &self.hasher
    }

    /// The row hashes of `key` (the first `depth` entries are used).
    #[inline]
    pub fn hashes(&self, key: &[u8]) -> [u32; MAX_DEPTH] {
        let mut h = [0u32; MAX_DEPTH];
        self.hasher.rows(key, &mut h[..self.depth]);
        h
    }

    /// The counter of row `row` that row hash `h` picks.
    #[inline]
    pub fn at(&mut self, row: usize, h: u32) -> &mut T {
        &mut self.counters[row * self.width + column(h, self.width)]
    }

    /// Its value.
    #[inline]
    pub fn get(&self, row: usize, h: u32) -> T {
        self.counters[row * self.width + column(h, self.width)]
    }

    /// Every row's counters.
    pub fn rows(&self) -> core::slice::ChunksExact<'_, T> {
        self.counters.chunks_exact(self.width)
    }

    /// Adds `other` counter by counter with `add`; refuses another shape or hasher.
    pub fn merge_with(
        &mut self,
        other: &Rows<T>,
        what: &'static str,
        add: impl Fn(T, T) -> T,
    ) -> Result<(), MergeError> {
        if (self.depth, self.width, self.hasher) != (other.depth, other.width, other.hasher) {
            return Err(MergeError::Shape(what));
        }
        for (a, b) in self.counters.iter_mut().zip(&other.counters) {
            *a = add(*a, *b);
        }
        Ok(())
    }

    /// Zeroes every counter.
    pub fn clear(&mut self) {
        self.counters.fill(T::default());
    }

    /// Bytes of counter state.
    pub fn memory(&self) -> usize {
        self.counters.len() * core::mem::size_of::<T>()
    }
}

/// A sketch made of `depth` rows of `width` counters, updated row by row: the interface
/// NitroSketch's sampling drives (it decides which rows a packet touches).
pub trait RowSketch {
    /// Rows.
    fn depth(&self) -> usize;
    /// Counters per row.
    fn width(&self) -> usize;
    /// The row hasher.
    fn hasher(&self) -> &Hasher;
    /// Adds `inc` to the counter of row `row` picked by the row hash `h`; returns the counter's
    /// value before.
    fn add_row(&mut self, row: usize, h: u32, inc: i64) -> i64;
    /// Counts one key's `inc` in every row (the vanilla update).
    fn update(&mut self, key: &[u8], inc: i64);
    /// The estimated count of `key`.
    fn estimate(&self, key: &[u8]) -> i64;
    /// Whether sampling with probability `p` now adds less error than the sketch already has,
    /// given the stream's L1 (packets) and an estimate of its squared L2 norm (the
    /// AlwaysCorrect switch; docs/sketches.md derives each rule).
    fn sampling_is_safe(&self, l1: u64, l2_squared: f64, p: f64) -> bool;
    /// Bytes of counter state.
    fn memory(&self) -> usize;
    /// Adds `other` (same shape and hasher) counter by counter.
    fn merge(&mut self, other: &Self) -> Result<(), MergeError>
    where
        Self: Sized;
}

/// The lower median of at most [`MAX_DEPTH`] values, without allocating.
pub(crate) fn median_of(v: impl IntoIterator<Item = i64>) -> i64 {
    let mut a = [0i64; MAX_DEPTH];
    let mut n = 0;
    for x in v.into_iter().take(MAX_DEPTH) {
        a[n] = x;
        n += 1;
    }
    median(&mut a[..n])
}

/// Median of a small slice (sorted in place); the lower median for even lengths.
pub(crate) fn median(v: &mut [i64]) -> i64 {
    v.sort_unstable();
    v.get((v.len().saturating_sub(1)) / 2).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn keys_round_trip_through_the_padded_form() {
        let keys = [
            FlowKey {
                src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                dst: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)),
                sport: 40000,
                dport: 5201,
                proto: 17,
                spi: None,
                si: None,
            },
            FlowKey {
                src: IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
                dst: IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2)),
                sport: 1,
                dport: 443,
                proto: 6,
                spi: Some(0x00ab_cdef),
                si: Some(254),
            },
        ];
        for k in keys {
            let b = KeyBytes::flow_of(&k);
            assert_eq!(KeyBytes::from_padded(b.padded()), Some(b));
            assert_eq!(b.flow(), Some(k));
            let s = KeyBytes::source_of(&k);
            assert_ne!(s.as_bytes(), b.as_bytes());
            assert_eq!(s.flow(), None);
        }
        assert_eq!(KeyBytes::from_padded(&[0xff; KEY_MAX]), None);
    }

    #[test]
    fn row_hashes_spread_over_columns() {
        for kind in [Hashing::Murmur3, Hashing::Fast] {
            let h = Hasher::new(kind, 1);
            let mut hits = [0u32; 64];
            for i in 0u32..64_000 {
                hits[column(h.row(&i.to_le_bytes(), 2), 64)] += 1;
            }
            // 1,000 expected per column; 5 sigma is about 160.
            assert!(hits.iter().all(|n| (840..1160).contains(n)), "{kind:?}: {hits:?}");
        }
    }
}
