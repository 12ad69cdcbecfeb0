//! K-ary sketch (Krishnamurthy, Sen, Zhang & Chen, "Sketch-based change detection", IMC 2003).
//!
//! `depth` rows of `width` (K) counters without signs; a row's estimate of a key is its
//! counter minus the row's even share of everything else, `(v − N/K) / (1 − 1/K)`, which is
//! unbiased; the estimate is the median over rows. Its variance per row is at most
//! L2²/(K − 1), so like Count Sketch the error is within ε·L2 for K = O(1/ε²). Linear, so
//! sketches of two windows subtract to find changes, and merge exactly.

use super::countsketch::add_i32;
use super::{median_of, Hasher, MergeError, RowSketch, Rows};
use serde::{Deserialize, Serialize};

/// A K-ary sketch with 32-bit counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kary {
    rows: Rows<i32>,
    total: i64,
}

impl Kary {
    /// `depth` rows (1..=16) of `width` counters (≥ 2).
    pub fn new(depth: usize, width: usize, hasher: Hasher) -> Kary {
        Kary { rows: Rows::new(depth, width, 2, hasher), total: 0 }
    }

    /// N: the sum of all counts.
    pub fn total(&self) -> i64 {
        self.total
    }

    fn row_estimate(&self, v: i32) -> i64 {
        let k = self.rows.width() as f64;
        ((f64::from(v) - self.total as f64 / k) / (1.0 - 1.0 / k)).round() as i64
    }

    /// Zeroes every counter.
    pub fn clear(&mut self) {
        self.rows.clear();
        self.total = 0;
    }
}

impl RowSketch for Kary {
    type Counter = i32;
    fn rows(&self) -> &Rows<i32> {
        &self.rows
    }
    #[inline]
    fn add_row(&mut self, row: usize, h: u32, inc: i64) -> i64 {
        let c = self.rows.at(row, h);
        let old = i64::from(*c);
        *c = add_i32(*c, inc);
        if row == 0 {
            self.total += inc;
        }
        old
    }
    fn update(&mut self, key: &[u8], inc: i64) {
        let h = self.rows.hashes(key);
        for (r, hr) in h[..self.rows.depth()].iter().enumerate() {
            let c = self.rows.at(r, *hr);
            *c = add_i32(*c, inc);
        }
        self.total += inc;
    }
    fn estimate(&self, key: &[u8]) -> i64 {
        let h = self.rows.hashes(key);
        median_of(
            h[..self.rows.depth()]
                .iter()
                .enumerate()
                .map(|(r, hr)| self.row_estimate(self.rows.get(r, *hr))),
        )
    }
    /// The same rule as Count Sketch: row error about L2/√K, sampling noise about √(L1/(K·p)).
    fn sampling_is_safe(&self, l1: u64, l2_squared: f64, p: f64) -> bool {
        l2_squared >= l1 as f64 / p
    }
    /// Exactly the sketch of the union of both streams.
    fn merge(&mut self, other: &Kary) -> Result<(), MergeError> {
        self.rows.merge_with(
            &other.rows,
            "k-ary dimensions or hasher differ",
            i32::saturating_add,
        )?;
        self.total += other.total;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unbiased_and_within_eps_l2() {
        let mut s = Kary::new(5, 1200, Hasher::default());
        let truth: Vec<(u32, i64)> =
            (0u32..20_000).map(|i| (i, i64::from((100_000 / (i + 1)).max(1)))).collect();
        for (k, n) in &truth {
            s.update(&k.to_le_bytes(), *n);
        }
        let l2 = (truth.iter().map(|(_, n)| (n * n) as f64).sum::<f64>()).sqrt();
        let errs: Vec<i64> = truth.iter().map(|(k, n)| s.estimate(&k.to_le_bytes()) - n).collect();
        let bad = errs.iter().filter(|e| e.abs() as f64 > 0.05 * l2).count();
        assert!(bad * 100 <= truth.len(), "{bad} keys off by more than ε·L2");
        let mean = errs.iter().sum::<i64>() as f64 / errs.len() as f64;
        assert!(mean.abs() < 0.005 * l2, "mean error {mean:.1} (unbiased)");
    }

    #[test]
    fn merge_is_the_sketch_of_the_union() {
        let h = Hasher::default();
        let (mut a, mut b, mut u) = (Kary::new(3, 64, h), Kary::new(3, 64, h), Kary::new(3, 64, h));
        for i in 0u32..3_000 {
            let k = (i % 101).to_le_bytes();
            if i % 2 == 0 {
                a.update(&k, 3);
            } else {
                b.update(&k, 1);
            }
            u.update(&k, if i % 2 == 0 { 3 } else { 1 });
        }
        a.merge(&b).unwrap();
        assert_eq!(a, u);
    }
}
