//! Count Sketch (Charikar, Chen & Farach-Colton, "Finding frequent items in data streams",
//! ICALP 2002).
//!
//! `depth` rows of `width` signed counters; a key adds ±1 (a per-row sign hash) to one counter
//! per row, and its estimate is the median over rows of sign × counter. Unbiased; with
//! `width = ⌈3/ε²⌉` and `depth = O(ln 1/δ)` the error exceeds ε·L2 (L2 the stream's second
//! frequency norm, √Σ f²) with probability at most δ: each row's error has variance at most
//! L2²/width, and the median of `depth` rows concentrates it.

use super::{median_of, sign, Hasher, MergeError, RowSketch, Rows};
use serde::{Deserialize, Serialize};

/// A Count Sketch with 32-bit signed counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountSketch {
    rows: Rows<i32>,
}

/// `c + d`, held within the i32 range.
#[inline]
pub(crate) fn add_i32(c: i32, d: i64) -> i32 {
    (i64::from(c) + d).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

impl CountSketch {
    /// `depth` rows (1..=16) of `width` counters (≥ 1).
    pub fn new(depth: usize, width: usize, hasher: Hasher) -> CountSketch {
        CountSketch { rows: Rows::new(depth, width, 1, hasher) }
    }

    /// Counts `inc` for `key` and returns the key's new estimate.
    #[inline]
    pub fn update_estimate(&mut self, key: &[u8], inc: i64) -> i64 {
        let h = self.rows.hashes(key);
        let h = &h[..self.rows.depth()];
        median_of(h.iter().enumerate().map(|(r, hr)| {
            let c = self.rows.at(r, *hr);
            *c = add_i32(*c, sign(*hr) * inc);
            sign(*hr) * i64::from(*c)
        }))
    }

    /// The median over rows of Σ counter², an estimate of the stream's L2² (AMS, STOC 1996).
    pub fn l2_squared(&self) -> f64 {
        median_of(
            self.rows.rows().map(|r| r.iter().map(|c| i64::from(*c) * i64::from(*c)).sum::<i64>()),
        ) as f64
    }

    /// Zeroes every counter.
    pub fn clear(&mut self) {
        self.rows.clear();
    }
}

impl RowSketch for CountSketch {
    type Counter = i32;
    fn rows(&self) -> &Rows<i32> {
        &self.rows
    }
    #[inline]
    fn add_row(&mut self, row: usize, h: u32, inc: i64) -> i64 {
        let c = self.rows.at(row, h);
        let old = i64::from(*c);
        *c = add_i32(*c, sign(h) * inc);
        old * sign(h)
    }
    fn update(&mut self, key: &[u8], inc: i64) {
        self.update_estimate(key, inc);
    }
    fn estimate(&self, key: &[u8]) -> i64 {
        let h = self.rows.hashes(key);
        median_of(
            h[..self.rows.depth()]
                .iter()
                .enumerate()
                .map(|(r, hr)| sign(*hr) * i64::from(self.rows.get(r, *hr))),
        )
    }
    /// A Count Sketch row errs by about L2/√width; sampling adds about √(L1/(width·p)), which is
    /// smaller once L2² ≥ L1/p.
    fn sampling_is_safe(&self, l1: u64, l2_squared: f64, p: f64) -> bool {
        l2_squared >= l1 as f64 / p
    }
    /// Exactly the sketch of the union of both streams.
    fn merge(&mut self, other: &CountSketch) -> Result<(), MergeError> {
        self.rows.merge_with(
            &other.rows,
            "count sketch dimensions or hasher differ",
            i32::saturating_add,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sketch::Hashing;

    #[test]
    fn error_within_eps_l2() {
        // width 3/ε² with ε = 0.05 → 1200; depth 5.
        let mut s = CountSketch::new(5, 1200, Hasher::new(Hashing::Murmur3, 5));
        let truth: Vec<(u32, i64)> =
            (0u32..20_000).map(|i| (i, i64::from((100_000 / (i + 1)).max(1)))).collect();
        for (k, n) in &truth {
            s.update_estimate(&k.to_le_bytes(), *n);
        }
        let l2 = (truth.iter().map(|(_, n)| (n * n) as f64).sum::<f64>()).sqrt();
        let bad = truth
            .iter()
            .filter(|(k, n)| ((s.estimate(&k.to_le_bytes()) - n).abs() as f64) > 0.05 * l2)
            .count();
        assert!(bad * 100 <= truth.len(), "{bad} keys off by more than ε·L2 = {:.0}", 0.05 * l2);
        let est = s.l2_squared().sqrt();
        assert!((est - l2).abs() < 0.1 * l2, "L2 {l2:.0} estimated {est:.0}");
    }

    #[test]
    fn merge_is_the_sketch_of_the_union() {
        let h = Hasher::default();
        let (mut a, mut b, mut u) =
            (CountSketch::new(3, 100, h), CountSketch::new(3, 100, h), CountSketch::new(3, 100, h));
        for i in 0u32..5_000 {
            let k = (i % 333).to_le_bytes();
            if i % 2 == 0 {
                a.update_estimate(&k, 1);
            } else {
                b.update_estimate(&k, 1);
            }
            u.update_estimate(&k, 1);
        }
        a.merge(&b).unwrap();
        assert_eq!(a, u);
        assert!(a.merge(&CountSketch::new(4, 100, h)).is_err());
    }
}
