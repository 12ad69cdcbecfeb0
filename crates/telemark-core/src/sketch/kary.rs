//! K-ary sketch (Krishnamurthy, Sen, Zhang & Chen, "Sketch-based change detection", IMC 2003).
//!
//! `depth` rows of `width` (K) counters without signs; a row's estimate of a key is its
//! counter minus the row's even share of everything else, `(v − N/K) / (1 − 1/K)`, which is
//! unbiased; the estimate is the median over rows. Its variance per row is at most
//! L2²/(K − 1), so like Count Sketch the error is within ε·L2 for K = O(1/ε²). Linear, so
//! sketches of two windows subtract to find changes, and merge exactly.

use super::{column, median, Hasher, MergeError, RowSketch};
use serde::{Deserialize, Serialize};

/// A K-ary sketch with 32-bit counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kary {
    depth: usize,
    width: usize,
    hasher: Hasher,
    counters: Vec<i32>,
    total: i64,
}

impl Kary {
    /// `depth` rows (1..=16) of `width` counters (≥ 2).
    pub fn new(depth: usize, width: usize, hasher: Hasher) -> Kary {
        let (depth, width) = (depth.clamp(1, super::countmin::MAX_DEPTH), width.max(2));
        Kary { depth, width, hasher, counters: vec![0; depth * width], total: 0 }
    }

    /// N: the sum of all counts.
    pub fn total(&self) -> i64 {
        self.total
    }

    fn row_estimate(&self, v: i64) -> i64 {
        let k = self.width as f64;
        ((v as f64 - self.total as f64 / k) / (1.0 - 1.0 / k)).round() as i64
    }

    /// Adds the counters of `other`: exactly the sketch of the union of both streams.
    pub fn merge(&mut self, other: &Kary) -> Result<(), MergeError> {
        if (self.depth, self.width, self.hasher) != (other.depth, other.width, other.hasher) {
            return Err(MergeError::Shape("k-ary dimensions or hasher differ"));
        }
        for (a, b) in self.counters.iter_mut().zip(&other.counters) {
            *a = a.saturating_add(*b);
        }
        self.total += other.total;
        Ok(())
    }

    /// Zeroes every counter.
    pub fn clear(&mut self) {
        self.counters.fill(0);
        self.total = 0;
    }
}

impl RowSketch for Kary {
    fn depth(&self) -> usize {
        self.depth
    }
    fn width(&self) -> usize {
        self.width
    }
    fn hasher(&self) -> &Hasher {
        &self.hasher
    }
    #[inline]
    fn add_row(&mut self, row: usize, h: u32, inc: i64) -> i64 {
        let c = &mut self.counters[row * self.width + column(h, self.width)];
        let old = i64::from(*c);
        *c = (old + inc).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
        if row == 0 {
            self.total += inc;
        }
        old
    }
    fn update(&mut self, key: &[u8], inc: i64) {
        let mut h = [0u32; super::countmin::MAX_DEPTH];
        let h = &mut h[..self.depth];
        self.hasher.rows(key, h);
        for (r, hr) in h.iter().enumerate() {
            let c = &mut self.counters[r * self.width + column(*hr, self.width)];
            *c = (i64::from(*c) + inc).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
        }
        self.total += inc;
    }
    fn estimate(&self, key: &[u8]) -> i64 {
        let mut est = [0i64; super::countmin::MAX_DEPTH];
        for (r, e) in est.iter_mut().enumerate().take(self.depth) {
            let v = i64::from(
                self.counters[r * self.width + column(self.hasher.row(key, r), self.width)],
            );
            *e = self.row_estimate(v);
        }
        median(&mut est[..self.depth])
    }
    /// The same rule as Count Sketch: row error about L2/√K, sampling noise about √(L1/(K·p)).
    fn sampling_is_safe(&self, l1: u64, l2_squared: f64, p: f64) -> bool {
        l2_squared >= l1 as f64 / p
    }
    fn memory(&self) -> usize {
        self.counters.len() * 4
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
