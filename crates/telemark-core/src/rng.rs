//! A small, seedable, portable PRNG: NitroSketch's sampler draws from it, and the lab's
//! dropper, reorderer and generators. The same seed gives the same run on every machine and
//! every Rust version.

use serde::{Deserialize, Serialize};

/// SplitMix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014).
/// Serialised as its one word of state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    /// A generator whose state is `state` as it is (no mixing with a constant).
    pub fn with_state(state: u64) -> Self {
        Rng(state)
    }
    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [0, n) (n > 0), by Lemire's multiply-shift.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.f64() < p
    }
    /// Exponentially distributed with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.f64()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_enough() {
        let mut r = Rng::new(7);
        let n = 100_000;
        let hits = (0..n).filter(|_| r.chance(0.1)).count();
        assert!((9_500..10_500).contains(&hits), "{hits}");
        let mut buckets = [0u32; 10];
        for _ in 0..n {
            buckets[r.below(10) as usize] += 1;
        }
        assert!(buckets.iter().all(|b| (9_500..10_500).contains(b)), "{buckets:?}");
    }
}
