//! Bloom filter (Bloom, CACM 1970): a bit array that answers "possibly seen" or "surely not
//! seen". With m bits, k hash functions and n keys inserted, the false positive rate is about
//! (1 − e^(−kn/m))^k; there are no false negatives.

use super::{Hasher, MergeError};
use serde::{Deserialize, Serialize};

/// A Bloom filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "BloomShape")]
pub struct Bloom {
    bits: Vec<u64>,
    m: usize,
    k: usize,
    hasher: Hasher,
    inserted: u64,
}

/// A [`Bloom`] as read from outside, checked before use.
#[derive(Deserialize)]
struct BloomShape {
    bits: Vec<u64>,
    m: usize,
    k: usize,
    hasher: Hasher,
    inserted: u64,
}

impl TryFrom<BloomShape> for Bloom {
    type Error = String;
    fn try_from(s: BloomShape) -> Result<Bloom, String> {
        if s.m == 0 || !(1..=16).contains(&s.k) || s.bits.len() != s.m.div_ceil(64) {
            return Err(format!(
                "Bloom filter of {} bits and k = {} holds {} words",
                s.m,
                s.k,
                s.bits.len()
            ));
        }
        Ok(Bloom { bits: s.bits, m: s.m, k: s.k, hasher: s.hasher, inserted: s.inserted })
    }
}

impl Bloom {
    /// `m` bits (≥ 1), `k` hash functions (1..=16).
    pub fn new(m: usize, k: usize, hasher: Hasher) -> Bloom {
        let m = m.max(1);
        Bloom { bits: vec![0; m.div_ceil(64)], m, k: k.clamp(1, 16), hasher, inserted: 0 }
    }

    #[inline]
    fn positions(&self, rows: &[u32]) -> [usize; 16] {
        let mut out = [0usize; 16];
        for (o, h) in out.iter_mut().zip(&rows[..self.k]) {
            *o = super::column(*h, self.m);
        }
        out
    }

    /// Hash functions (row hashes it uses).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The hasher.
    pub fn hasher(&self) -> &Hasher {
        &self.hasher
    }

    /// Inserts `key`; returns whether it was (possibly) there already.
    #[inline]
    pub fn insert(&mut self, key: &[u8]) -> bool {
        let mut h = [0u32; 16];
        self.hasher.rows(key, &mut h[..self.k]);
        self.insert_hashed(&h, true)
    }

    /// [`Bloom::insert`] of a key whose row hashes (`self.hasher().rows`, at least `k` of
    /// them) the caller already has; sets the bits only if `set`, without branching on it (so a
    /// fast path can call it for every packet). Returns whether the key was possibly present.
    #[inline]
    pub fn insert_hashed(&mut self, rows: &[u32], set: bool) -> bool {
        let pos = self.positions(rows);
        let mask = u64::from(set).wrapping_neg();
        let mut present = true;
        for p in &pos[..self.k] {
            let (w, b) = (p / 64, 1u64 << (p % 64));
            present &= self.bits[w] & b != 0;
            self.bits[w] |= b & mask;
        }
        self.inserted += u64::from(set & !present);
        present
    }

    /// [`Bloom::contains`] of a key whose row hashes the caller already has; reads only, and
    /// without an early exit, so its cost does not depend on the answer.
    #[inline]
    pub fn contains_hashed(&self, rows: &[u32]) -> bool {
        let pos = self.positions(rows);
        let mut present = true;
        for p in &pos[..self.k] {
            present &= self.bits[p / 64] & (1 << (p % 64)) != 0;
        }
        present
    }

    /// Whether `key` was possibly inserted.
    #[inline]
    pub fn contains(&self, key: &[u8]) -> bool {
        let mut h = [0u32; 16];
        self.hasher.rows(key, &mut h[..self.k]);
        let pos = self.positions(&h);
        pos[..self.k].iter().all(|p| self.bits[p / 64] & (1 << (p % 64)) != 0)
    }

    /// Keys inserted that were not already (possibly) present.
    pub fn inserted(&self) -> u64 {
        self.inserted
    }

    /// The expected false positive rate with `n` keys inserted: (1 − e^(−kn/m))^k.
    pub fn false_positive_rate(&self, n: u64) -> f64 {
        (1.0 - (-(self.k as f64) * n as f64 / self.m as f64).exp()).powi(self.k as i32)
    }

    /// Bytes of state.
    pub fn memory(&self) -> usize {
        self.bits.len() * 8
    }

    /// ORs in `other`: exactly the filter of the union.
    pub fn merge(&mut self, other: &Bloom) -> Result<(), MergeError> {
        if (self.m, self.k, self.hasher) != (other.m, other.k, other.hasher) {
            return Err(MergeError::Shape("bloom filter size, k or hasher differ"));
        }
        for (a, b) in self.bits.iter_mut().zip(&other.bits) {
            *a |= b;
        }
        self.inserted += other.inserted;
        Ok(())
    }

    /// Empties the filter.
    pub fn clear(&mut self) {
        self.bits.fill(0);
        self.inserted = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_the_predicted_false_positive_rate() {
        let mut b = Bloom::new(16_384, 4, Hasher::default());
        for i in 0u32..2_000 {
            b.insert(&i.to_le_bytes());
        }
        assert!((0u32..2_000).all(|i| b.contains(&i.to_le_bytes())));
        let fp = (1_000_000u32..1_100_000).filter(|i| b.contains(&i.to_le_bytes())).count();
        let want = b.false_positive_rate(2_000) * 100_000.0; // ≈ 1.9 %
        assert!((fp as f64 - want).abs() < 0.2 * want, "{fp} false positives, predicted {want:.0}");
    }

    #[test]
    fn a_masked_insert_tests_without_setting() {
        let h = Hasher::default();
        let mut b = Bloom::new(1024, 3, h);
        let mut rows = [0u32; 16];
        h.rows(b"flow", &mut rows[..3]);
        assert!(!b.insert_hashed(&rows, false));
        assert!(!b.contains(b"flow") && !b.contains_hashed(&rows) && b.inserted() == 0);
        assert!(!b.insert_hashed(&rows, true));
        assert!(b.insert_hashed(&rows, false) && b.contains(b"flow") && b.inserted() == 1);
        assert!(b.contains_hashed(&rows));
        // With one bit of the three cleared, the key is absent to both tests.
        let mut c = b.clone();
        let p = crate::sketch::column(rows[1], 1024);
        c.bits[p / 64] &= !(1 << (p % 64));
        assert!(!c.contains(b"flow") && !c.contains_hashed(&rows));
    }

    #[test]
    fn merge_is_the_filter_of_the_union() {
        let h = Hasher::default();
        let (mut a, mut b, mut u) =
            (Bloom::new(1500, 3, h), Bloom::new(1500, 3, h), Bloom::new(1500, 3, h));
        for i in 0u32..200 {
            if i % 2 == 0 {
                a.insert(&i.to_le_bytes());
            } else {
                b.insert(&i.to_le_bytes());
            }
            u.insert(&i.to_le_bytes());
        }
        a.merge(&b).unwrap();
        assert_eq!(a.bits, u.bits);
    }
}
