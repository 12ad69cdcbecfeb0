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
    #[inline(always)]
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

impl Hasher {
    /// [`Hasher::rows`] of a [`KeyBytes`] (the same values), reading `Fast`'s words straight
    /// from its zero-padded buffer: the words line up with the stores that built the key, so
    /// the loads are forwarded from them instead of stalling.
    #[inline(always)]
    pub fn rows_of(&self, key: &KeyBytes, out: &mut [u32]) {
        match self.kind {
            Hashing::Murmur3 => self.rows(key.as_bytes(), out),
            Hashing::Fast => {
                let b = &key.buf;
                let word = |at: usize| match b.get(at..at + 8) {
                    Some(w) => u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]),
                    None => b.iter().skip(at).rev().fold(0u64, |v, x| (v << 8) | u64::from(*x)),
                };
                let h = fast64_words(key.as_bytes().len(), self.seed, word);
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

/// 64-bit multiply-fold hash of a byte string: every 16 bytes are folded by one 64×64→128-bit
/// multiply, independent of the other blocks' (so they run in parallel), then one more multiply
/// mixes the sum with the length and seed (the "mum" construction of wyhash; a key of up to
/// [`KEY_MAX`] bytes takes at most four multiplies).
#[inline(always)]
pub fn fast64(key: &[u8], seed: u32) -> u64 {
    let le = |w: &[u8]| u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
    let n = key.len();
    fast64_words(n, seed, |at| {
        if at + 8 <= n {
            le(&key[at..at + 8])
        } else if at >= n {
            0
        } else if n >= 8 {
            // The last 8 bytes, shifted so the ones before `at` fall off.
            le(&key[n - 8..]) >> (8 * (at + 8 - n))
        } else {
            key[at..].iter().rev().fold(0u64, |v, b| (v << 8) | u64::from(*b))
        }
    })
}

/// [`fast64`] of an `n`-byte key given as `word(at)`: its 8 bytes at `at`, zero-padded past
/// the end.
#[inline(always)]
fn fast64_words(n: usize, seed: u32, word: impl Fn(usize) -> u64) -> u64 {
    const P0: u64 = 0xa076_1d64_78bd_642f;
    const P1: u64 = 0xe703_7ed1_a0b4_28db;
    const P2: u64 = 0x8ebc_6af0_9c88_c6e3;
    const P3: u64 = 0x5899_65cc_7537_4cc3;
    #[inline(always)]
    fn mum(a: u64, b: u64) -> u64 {
        let m = u128::from(a) * u128::from(b);
        (m as u64) ^ ((m >> 64) as u64)
    }
    let s = u64::from(seed).wrapping_mul(P3) ^ P0;
    let mut acc = 0u64;
    let mut at = 0;
    let mut salt = s;
    while at < n {
        acc ^= mum(word(at) ^ salt ^ P1, word(at + 8) ^ P2);
        salt = salt.wrapping_add(P3);
        at += 16;
    }
    mum(acc ^ s ^ P2, (n as u64) ^ P1 ^ (s >> 1))
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

    /// Tag, SPI and SI: the first 5 bytes of every encoding.
    fn start(k: &FlowKey, tag: u8) -> KeyBytes {
        let tag = tag | if k.spi.is_some() || k.si.is_some() { TAG_NSH } else { 0 };
        let spi = k.spi.unwrap_or(0).to_be_bytes();
        let mut out = KeyBytes { buf: [0; KEY_MAX], len: 0 };
        out.push(&[tag, spi[1], spi[2], spi[3], k.si.unwrap_or(0)]);
        out
    }

    /// Tag, SPI, SI and an IPv4 address as the first 9 bytes of a big-endian u128: built in a
    /// register and stored whole, since byte-by-byte stores read back as words stall
    /// store-to-load forwarding (they made this the slowest step of a heavy packet).
    #[inline(always)]
    fn v4_head(k: &FlowKey, tag: u8, src: core::net::Ipv4Addr) -> u128 {
        let tag = tag | if k.spi.is_some() || k.si.is_some() { TAG_NSH } else { 0 };
        (u128::from(tag) << 120)
            | (u128::from(k.spi.unwrap_or(0) & 0x00ff_ffff) << 96)
            | (u128::from(k.si.unwrap_or(0)) << 88)
            | (u128::from(u32::from(src)) << 56)
    }

    /// SFCMon's FlowID2: SPI, SI and the 5-tuple (both addresses as IPv6 if either is).
    #[inline]
    pub fn flow_of(k: &FlowKey) -> KeyBytes {
        if let (IpAddr::V4(s), IpAddr::V4(d)) = (&k.src, &k.dst) {
            let head = KeyBytes::v4_head(k, 0, *s)
                | (u128::from(u32::from(*d)) << 24)
                | (u128::from(k.sport) << 8)
                | u128::from(k.dport >> 8);
            let mut buf = [0; KEY_MAX];
            buf[..16].copy_from_slice(&head.to_be_bytes());
            // Bytes 16 and 17 as one word store too (see `v4_head`).
            let tail = u64::from(k.dport as u8) | (u64::from(k.proto) << 8);
            buf[16..24].copy_from_slice(&tail.to_le_bytes());
            return KeyBytes { buf, len: 18 };
        }
        let mut out = KeyBytes::start(k, TAG_V6);
        out.push(&v6_octets(k.src));
        out.push(&v6_octets(k.dst));
        out.push(&k.sport.to_be_bytes());
        out.push(&k.dport.to_be_bytes());
        out.push(&[k.proto]);
        out
    }

    /// SFCMon's FlowID1: SPI, SI and the source address.
    #[inline]
    pub fn source_of(k: &FlowKey) -> KeyBytes {
        match k.src {
            IpAddr::V4(a) => {
                let mut buf = [0; KEY_MAX];
                buf[..16].copy_from_slice(&KeyBytes::v4_head(k, TAG_SOURCE, a).to_be_bytes());
                KeyBytes { buf, len: 9 }
            }
            IpAddr::V6(a) => {
                let mut out = KeyBytes::start(k, TAG_SOURCE | TAG_V6);
                out.push(&a.octets());
                out
            }
        }
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

/// An address as 16 bytes (IPv4 mapped into IPv6).
#[inline(always)]
fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
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
#[serde(try_from = "RowsShape<T>", bound(deserialize = "T: Deserialize<'de>"))]
pub struct Rows<T> {
    depth: usize,
    width: usize,
    hasher: Hasher,
    counters: Vec<T>,
}

/// [`Rows`] as read from outside (a stored window, another agent's sketch), checked before use:
/// counters that disagree with the shape would be indexed out of bounds.
#[derive(Deserialize)]
struct RowsShape<T> {
    depth: usize,
    width: usize,
    hasher: Hasher,
    counters: Vec<T>,
}

impl<T> TryFrom<RowsShape<T>> for Rows<T> {
    type Error = String;
    fn try_from(s: RowsShape<T>) -> Result<Rows<T>, String> {
        if !(1..=MAX_DEPTH).contains(&s.depth) || s.width == 0 {
            return Err(format!("sketch of {} rows × {} counters", s.depth, s.width));
        }
        if s.depth.checked_mul(s.width) != Some(s.counters.len()) {
            return Err(format!(
                "sketch of {} rows × {} counters holds {} counters",
                s.depth,
                s.width,
                s.counters.len()
            ));
        }
        Ok(Rows { depth: s.depth, width: s.width, hasher: s.hasher, counters: s.counters })
    }
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
    #[inline(always)]
    pub fn hashes(&self, key: &[u8]) -> [u32; MAX_DEPTH] {
        let mut h = [0u32; MAX_DEPTH];
        self.hasher.rows(key, &mut h[..self.depth]);
        h
    }

    /// Where in [`Rows::counters_mut`] the counter of row `row` picked by row hash `h` is.
    #[inline(always)]
    pub fn index(&self, row: usize, h: u32) -> usize {
        row * self.width + column(h, self.width)
    }

    /// All counters, row after row.
    #[inline(always)]
    pub fn counters_mut(&mut self) -> &mut [T] {
        &mut self.counters
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
    /// Counter type.
    type Counter: Copy + Default;
    /// The rows of counters (shape, hasher, counters).
    fn rows(&self) -> &Rows<Self::Counter>;
    /// Rows.
    fn depth(&self) -> usize {
        self.rows().depth()
    }
    /// Counters per row.
    fn width(&self) -> usize {
        self.rows().width()
    }
    /// The row hasher.
    fn hasher(&self) -> &Hasher {
        self.rows().hasher()
    }
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
    fn memory(&self) -> usize {
        self.rows().memory()
    }
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

    /// `fast64` reads its last word by shifting the key's last 8 bytes and `rows_of` reads a
    /// `KeyBytes`'s padded buffer: both must equal the plain definition (16-byte blocks of the
    /// key zero-padded), for every length.
    #[test]
    fn fast64_shortcuts_equal_the_zero_padded_definition() {
        fn reference(key: &[u8], seed: u32) -> u64 {
            let mut padded = key.to_vec();
            padded.resize(key.len().div_ceil(16) * 16 + 16, 0);
            let w = |at: usize| u64::from_le_bytes(padded[at..at + 8].try_into().unwrap());
            fast64_words(key.len(), seed, w)
        }
        let bytes: Vec<u8> = (0..KEY_MAX as u8).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
        let h = Hasher::new(Hashing::Fast, 11);
        for n in 0..=KEY_MAX {
            let key = &bytes[..n];
            assert_eq!(fast64(key, 11), reference(key, 11), "length {n}");
            let kb = KeyBytes::from_slice(key).unwrap();
            let (mut a, mut b) = ([0u32; 4], [0u32; 4]);
            h.rows(key, &mut a);
            h.rows_of(&kb, &mut b);
            assert_eq!(a, b, "length {n}");
        }
        // Keys that differ only in zero padding and length hash apart.
        assert_ne!(fast64(&[1, 0], 1), fast64(&[1], 1));
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

    /// Serialises `x`, lets `bend` damage the JSON, and returns the error reading it back.
    fn refused<T: Serialize + serde::de::DeserializeOwned>(
        x: &T,
        bend: impl Fn(&mut serde_json::Value),
    ) -> String {
        let mut v = serde_json::to_value(x).unwrap();
        bend(&mut v);
        match serde_json::from_value::<T>(v) {
            Ok(_) => panic!("a damaged sketch was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn stored_sketches_of_the_wrong_shape_are_refused_not_used() {
        use super::{bloom::Bloom, countmin::CountMin, nitro::Nitro, univmon::UnivMon};
        let h = Hasher::default();
        let mut cm = CountMin::new(4, 64, h);
        cm.update(b"k", 3);
        // Intact, each reads back equal.
        let back: CountMin = serde_json::from_value(serde_json::to_value(&cm).unwrap()).unwrap();
        assert_eq!(back, cm);
        let pop = |v: &mut serde_json::Value, path: &[&str]| {
            let mut at = v;
            for p in path {
                at = &mut at[*p];
            }
            at.as_array_mut().unwrap().pop();
        };
        let e = refused(&cm, |v| pop(v, &["rows", "counters"]));
        assert!(e.contains("4 rows × 64 counters holds 255 counters"), "{e}");
        assert!(refused(&cm, |v| v["rows"]["depth"] = 17.into()).contains("17 rows"));

        let b = Bloom::new(1000, 3, h);
        let back: Bloom = serde_json::from_value(serde_json::to_value(&b).unwrap()).unwrap();
        assert_eq!(back, b);
        assert!(refused(&b, |v| pop(v, &["bits"])).contains("1000 bits and k = 3 holds 15 words"));
        assert!(refused(&b, |v| v["k"] = 0.into()).contains("k = 0"));

        let n = Nitro::new(CountMin::new(4, 64, h), 0.01, true, 8, 1);
        let back: Nitro<CountMin> =
            serde_json::from_value(serde_json::to_value(&n).unwrap()).unwrap();
        assert_eq!((back.seen(), &back.sketch), (0, &n.sketch));
        assert!(refused(&n, |v| pop(v, &["sumsq"])).contains("4 rows with 3 row sums"));
        assert!(refused(&n, |v| v["sampler"]["depth"] = 5.into()).contains("sampler of 5 rows"));
        assert!(refused(&n, |v| v["sampler"]["inc"] = 0.into()).contains("1/p = 0"));

        let u = UnivMon::new(4, 3, 32, 8, h).nitro(0.1, false, 1);
        serde_json::from_value::<UnivMon>(serde_json::to_value(&u).unwrap()).unwrap();
        assert!(refused(&u, |v| pop(v, &["heaps"])).contains("4 levels with 3 heaps"));
        assert!(refused(&u, |v| pop(v, &["samplers"])).contains("and 3 samplers"));
    }
}
