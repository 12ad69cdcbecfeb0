//! Count-Min sketch (Cormode & Muthukrishnan, "An improved data stream summary: the count-min
//! sketch and its applications", J. Algorithms 2005).
//!
//! `depth` rows of `width` counters; a key adds to one counter per row and its estimate is the
//! smallest of its counters. The estimate never undercounts, and with `width = ⌈e/ε⌉` and
//! `depth = ⌈ln 1/δ⌉` it overcounts by more than ε·N (N the packets counted) with probability at
//! most δ. SFCMon's w = 5436, d = 5 gives ε = 0.05 %, δ = 0.7 %.
//!
//! Conservative update (Estan & Varghese, SIGCOMM 2002) raises only the counters that are at the
//! key's current minimum: the same guarantee, much less overcounting on skewed traffic, but no
//! longer linear, so a merge of conservative sketches is an upper bound, not the sketch of the
//! union.

use super::{Hasher, MergeError, RowSketch, Rows};
use serde::{Deserialize, Serialize};

pub use super::MAX_DEPTH;

/// A Count-Min sketch with 32-bit counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountMin {
    rows: Rows<u32>,
    conservative: bool,
    /// Sum of all increments (N).
    total: u64,
}

impl CountMin {
    /// `depth` rows (1..=16) of `width` counters (≥ 1).
    pub fn new(depth: usize, width: usize, hasher: Hasher) -> CountMin {
        CountMin { rows: Rows::new(depth, width, 1, hasher), conservative: false, total: 0 }
    }

    /// Dimensions for an error of at most `eps`·N with probability `1 − delta`.
    pub fn with_error(eps: f64, delta: f64, hasher: Hasher) -> CountMin {
        let w = (core::f64::consts::E / eps).ceil() as usize;
        let d = (1.0 / delta).ln().ceil() as usize;
        CountMin::new(d, w, hasher)
    }

    /// Switches conservative update on or off (before counting).
    pub fn conservative(mut self, on: bool) -> CountMin {
        self.conservative = on;
        self
    }

    /// N: the sum of all counts added.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The additive error bound ε·N = (e / width)·N, exceeded with probability ≤ e^(−depth).
    pub fn error_bound(&self) -> u64 {
        (core::f64::consts::E / self.rows.width() as f64 * self.total as f64).ceil() as u64
    }

    /// Counts `inc` for `key` and returns the key's new estimate.
    #[inline]
    pub fn update_estimate(&mut self, key: &[u8], inc: u32) -> u32 {
        let h = self.rows.hashes(key);
        self.update_estimate_hashed(&h, inc)
    }

    /// [`CountMin::update_estimate`] of a key whose row hashes (`hasher().rows`, at least
    /// `depth` of them) the caller already has.
    #[inline]
    pub fn update_estimate_hashed(&mut self, h: &[u32], inc: u32) -> u32 {
        let d = self.rows.depth();
        // Counter positions first, then the counters: every load is independent of the others.
        let mut at = [0usize; MAX_DEPTH];
        for r in 0..d {
            at[r] = self.rows.index(r, h[r]);
        }
        let at = &at[..d];
        self.total += u64::from(inc);
        let c = self.rows.counters_mut();
        if self.conservative {
            let min = at.iter().map(|i| c[*i]).min().unwrap_or(0);
            let target = min.saturating_add(inc);
            for i in at {
                c[*i] = c[*i].max(target);
            }
            target
        } else {
            let mut min = u32::MAX;
            for i in at {
                c[*i] = c[*i].saturating_add(inc);
                min = min.min(c[*i]);
            }
            min
        }
    }

    /// The estimated count of `key`.
    pub fn estimate_u64(&self, key: &[u8]) -> u64 {
        self.estimate(key).max(0) as u64
    }

    /// Zeroes every counter (a new window).
    pub fn clear(&mut self) {
        self.rows.clear();
        self.total = 0;
    }
}

impl RowSketch for CountMin {
    type Counter = u32;
    fn rows(&self) -> &Rows<u32> {
        &self.rows
    }
    #[inline]
    fn add_row(&mut self, row: usize, h: u32, inc: i64) -> i64 {
        let c = self.rows.at(row, h);
        let old = *c;
        *c = old.saturating_add(inc.clamp(0, i64::from(u32::MAX)) as u32);
        if row == 0 {
            self.total += inc.max(0) as u64;
        }
        i64::from(old)
    }
    fn update(&mut self, key: &[u8], inc: i64) {
        self.update_estimate(key, inc.clamp(0, i64::from(u32::MAX)) as u32);
    }
    fn estimate(&self, key: &[u8]) -> i64 {
        let h = self.rows.hashes(key);
        h[..self.rows.depth()]
            .iter()
            .enumerate()
            .map(|(r, hr)| self.rows.get(r, *hr))
            .min()
            .map_or(0, i64::from)
    }
    /// A Count-Min estimate is off by about N/width already; sampling adds a standard deviation
    /// of about √(N/(width·p)) per counter, which is smaller once N ≥ width/p.
    fn sampling_is_safe(&self, l1: u64, _l2_squared: f64, p: f64) -> bool {
        l1 as f64 >= self.rows.width() as f64 / p
    }
    /// For vanilla sketches exactly the sketch of the union of both streams; for conservative
    /// ones an upper bound of it.
    fn merge(&mut self, other: &CountMin) -> Result<(), MergeError> {
        self.rows.merge_with(
            &other.rows,
            "count-min dimensions or hasher differ",
            u32::saturating_add,
        )?;
        self.total += other.total;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sketch::Hashing;
    use std::collections::HashMap;

    /// A Zipf-like stream: key i gets about `n / (i + 1)` packets.
    pub(crate) fn zipf(keys: u32, scale: u32) -> Vec<(u32, u32)> {
        (0..keys).map(|i| (i, (scale / (i + 1)).max(1))).collect()
    }

    fn check_bound(conservative: bool, kind: Hashing) {
        let mut s = CountMin::new(4, 1024, Hasher::new(kind, 9)).conservative(conservative);
        let stream = zipf(20_000, 200_000);
        let mut truth = HashMap::new();
        for (k, n) in &stream {
            for _ in 0..*n {
                s.update_estimate(&k.to_le_bytes(), 1);
            }
            truth.insert(*k, *n);
        }
        let bound = s.error_bound() as i64;
        let mut over = 0;
        for (k, n) in &truth {
            let e = s.estimate(&k.to_le_bytes());
            assert!(e >= i64::from(*n), "never undercounts");
            over += i64::from(e - i64::from(*n) > bound);
        }
        // δ = e^-4 ≈ 1.8 % of keys may exceed the bound; allow that share.
        assert!(over * 1000 <= 18 * truth.len() as i64, "{over} of {} over {bound}", truth.len());
    }

    #[test]
    fn error_within_eps_n_with_probability_one_minus_delta() {
        for kind in [Hashing::Murmur3, Hashing::Fast] {
            check_bound(false, kind);
            check_bound(true, kind);
        }
    }

    #[test]
    fn conservative_update_overcounts_less() {
        let (mut v, mut c) = (
            CountMin::new(4, 512, Hasher::default()),
            CountMin::new(4, 512, Hasher::default()).conservative(true),
        );
        let stream = zipf(5_000, 50_000);
        // Round-robin over the keys still sending, as packets of concurrent flows interleave.
        let mut left = stream.clone();
        while !left.is_empty() {
            left.retain_mut(|(k, n)| {
                v.update_estimate(&k.to_le_bytes(), 1);
                c.update_estimate(&k.to_le_bytes(), 1);
                *n -= 1;
                *n > 0
            });
        }
        let err = |s: &CountMin| -> i64 {
            stream.iter().map(|(k, n)| s.estimate(&k.to_le_bytes()) - i64::from(*n)).sum()
        };
        assert!(err(&c) * 4 < err(&v) * 3, "conservative {} vs vanilla {}", err(&c), err(&v));
    }

    #[test]
    fn merge_is_the_sketch_of_the_union() {
        let h = Hasher::new(Hashing::Fast, 3);
        let (mut a, mut b, mut u) =
            (CountMin::new(3, 256, h), CountMin::new(3, 256, h), CountMin::new(3, 256, h));
        for i in 0u32..10_000 {
            let k = (i % 777).to_le_bytes();
            if i % 3 == 0 {
                a.update_estimate(&k, 1);
            } else {
                b.update_estimate(&k, 2);
            }
            u.update_estimate(&k, if i % 3 == 0 { 1 } else { 2 });
        }
        a.merge(&b).unwrap();
        assert_eq!(a, u);
        let bytes = serde_json::to_vec(&a).unwrap();
        assert_eq!(serde_json::from_slice::<CountMin>(&bytes).unwrap(), u);
        assert!(a.merge(&CountMin::new(3, 255, h)).is_err());
        assert!(a.merge(&CountMin::new(3, 256, Hasher::new(Hashing::Fast, 4))).is_err());
    }
}
