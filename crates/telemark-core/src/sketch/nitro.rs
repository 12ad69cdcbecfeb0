//! NitroSketch (Liu, Ben Basat, Einziger, Kassner, Braverman & Friedman, SIGCOMM 2019): a sketch
//! made cheap enough for a software switch by touching only a sample of its counter arrays.
//!
//! Each (packet, row) pair is updated with probability p, by 1/p, so every counter stays an
//! unbiased estimate. Which pairs are updated is drawn by geometric skipping: one random draw
//! gives how many row visits to skip, so a packet between samples costs a counter decrement and
//! no hashing at all. A packet whose skip lands inside the row range hashes only the rows it
//! touches.
//!
//! AlwaysCorrect mode updates every row until sampling stops hurting (each sketch states its
//! rule in [`RowSketch::sampling_is_safe`]; docs/sketches.md derives them), then samples.
//!
//! The fast path can also just draw the sample ([`Sampler::sample`], a row mask) and hand the
//! key and mask to a sketch thread through an SPSC ring ([`Nitro::apply_sampled`]): the paper's
//! separate-thread variant (telemark-datapath's `nitro_thread`).

use super::topk::TopK;
use super::{median_of, KeyBytes, MergeError, RowSketch};
use crate::rng::Rng;
use serde::{Deserialize, Serialize};

/// Draws which rows each packet updates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "SamplerShape")]
pub struct Sampler {
    p: f64,
    inc: i64,
    ln_q: f64,
    depth: u32,
    /// Row visits left to skip.
    skip: u64,
    rng: Rng,
    /// Every row, every packet (AlwaysCorrect before convergence).
    pub full: bool,
}

/// A [`Sampler`] as read from outside: its probability is derived again from the increment,
/// which must be a whole number ≥ 1, so a stored sampler cannot hold an inconsistent pair.
#[derive(Deserialize)]
struct SamplerShape {
    inc: i64,
    depth: u32,
    skip: u64,
    rng: Rng,
    full: bool,
}

impl TryFrom<SamplerShape> for Sampler {
    type Error = String;
    fn try_from(s: SamplerShape) -> Result<Sampler, String> {
        if s.inc < 1 || !(1..=32).contains(&s.depth) {
            return Err(format!("NitroSketch sampler with 1/p = {} over {} rows", s.inc, s.depth));
        }
        let p = 1.0 / s.inc as f64;
        Ok(Sampler {
            p,
            inc: s.inc,
            ln_q: (1.0 - p).ln(),
            depth: s.depth,
            skip: s.skip,
            rng: s.rng,
            full: s.full,
        })
    }
}

impl Sampler {
    /// Samples row visits with probability `p`, rounded so that 1/p is a whole number (counters
    /// stay integers); `full` starts in full-update mode.
    pub fn new(p: f64, depth: usize, seed: u64, full: bool) -> Sampler {
        let inc = (1.0 / p.clamp(1e-6, 1.0)).round().max(1.0) as i64;
        let p = 1.0 / inc as f64;
        let mut s = Sampler {
            p,
            inc,
            ln_q: (1.0 - p).ln(),
            depth: depth as u32,
            skip: 0,
            rng: Rng::with_state(seed ^ 0x2545_f491_4f6c_dd1d),
            full,
        };
        s.skip = s.geometric();
        s
    }

    /// The sampling probability actually used.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// What a sampled row visit adds: 1/p.
    pub fn increment(&self) -> i64 {
        if self.full {
            1
        } else {
            self.inc
        }
    }

    /// Failures before the next success of a Bernoulli(p) trial: ⌊ln U / ln(1 − p)⌋.
    fn geometric(&mut self) -> u64 {
        if self.inc == 1 {
            return 0;
        }
        let u = ((self.rng.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        (u.ln() / self.ln_q) as u64
    }

    /// Leaves full-update mode and starts sampling.
    pub fn start_sampling(&mut self) {
        if self.full {
            self.full = false;
            self.skip = self.geometric();
        }
    }

    /// The rows this packet updates, as a bit mask (0: none, the common case).
    #[inline]
    pub fn sample(&mut self) -> u32 {
        let d = u64::from(self.depth);
        if self.full {
            return if d >= 32 { u32::MAX } else { (1u32 << d) - 1 };
        }
        if self.skip >= d {
            self.skip -= d;
            return 0;
        }
        let mut mask = 0u32;
        let mut r = self.skip;
        while r < d {
            mask |= 1 << r;
            r += 1 + self.geometric();
        }
        self.skip = r - d;
        mask
    }
}

/// A sketch updated NitroSketch's way, with an optional top-k heap of heavy keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(
    try_from = "NitroShape<S>",
    bound(deserialize = "S: RowSketch + Deserialize<'de>", serialize = "S: Serialize")
)]
pub struct Nitro<S> {
    /// The sketch.
    pub sketch: S,
    sampler: Sampler,
    always_correct: bool,
    /// Packets seen (L1).
    seen: u64,
    /// Σ counter² per row, tracked while updating every row (AlwaysCorrect's L2 estimate).
    sumsq: Vec<f64>,
    /// Heavy keys by estimate, refreshed when a packet touched the sketch.
    pub top: TopK,
}

/// A [`Nitro`] as read from outside, checked before use: AlwaysCorrect's per-row sums and the
/// sampler must match the sketch's depth.
#[derive(Deserialize)]
struct NitroShape<S> {
    sketch: S,
    sampler: Sampler,
    always_correct: bool,
    seen: u64,
    sumsq: Vec<f64>,
    top: TopK,
}

impl<S: RowSketch> TryFrom<NitroShape<S>> for Nitro<S> {
    type Error = String;
    fn try_from(s: NitroShape<S>) -> Result<Nitro<S>, String> {
        let d = s.sketch.depth();
        if s.sumsq.len() != d || s.sampler.depth as usize != d {
            return Err(format!(
                "NitroSketch over {d} rows with {} row sums and a sampler of {} rows",
                s.sumsq.len(),
                s.sampler.depth
            ));
        }
        Ok(Nitro {
            sketch: s.sketch,
            sampler: s.sampler,
            always_correct: s.always_correct,
            seen: s.seen,
            sumsq: s.sumsq,
            top: s.top,
        })
    }
}

impl<S: RowSketch> Nitro<S> {
    /// Wraps `sketch`: rows sampled with probability `p`; `always_correct` updates every row
    /// until sampling is safe; `top` heavy keys are tracked (0 for none).
    pub fn new(sketch: S, p: f64, always_correct: bool, top: usize, seed: u64) -> Nitro<S> {
        let d = sketch.depth();
        Nitro {
            sampler: Sampler::new(p, d, seed, always_correct),
            sketch,
            always_correct,
            seen: 0,
            sumsq: vec![0.0; d],
            top: TopK::new(top),
        }
    }

    /// Packets seen.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Whether it has switched to sampling (always, unless AlwaysCorrect has not converged).
    pub fn sampling(&self) -> bool {
        !self.sampler.full
    }

    /// The sampler (the separate-thread variant draws on the fast path).
    pub fn sampler_mut(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    /// Counts one packet of `key` (the all-in-one variant).
    #[inline]
    pub fn update(&mut self, key: &KeyBytes) {
        let mask = self.sampler.sample();
        self.seen += 1;
        if mask != 0 {
            self.apply_counted(key, mask);
        }
    }

    /// Applies a packet drawn elsewhere: `mask` from [`Sampler::sample`] (the separate-thread
    /// variant's sketch side). The packet count is the drawing side's: see [`Nitro::set_seen`].
    #[inline]
    pub fn apply_sampled(&mut self, key: &KeyBytes, mask: u32) {
        if mask != 0 {
            self.apply_counted(key, mask);
        }
    }

    /// Sets the packets seen (sampled or not) when another thread drew the samples.
    pub fn set_seen(&mut self, seen: u64) {
        self.seen = seen;
    }

    fn apply_counted(&mut self, key: &KeyBytes, mask: u32) {
        let inc = self.sampler.increment();
        let d = self.sketch.depth();
        let full = self.sampler.full;
        for r in 0..d {
            if mask & (1 << r) != 0 {
                let h = self.sketch.hasher().row(key.as_bytes(), r);
                let old = self.sketch.add_row(r, h, inc);
                if full {
                    self.sumsq[r] += (2 * old * inc + inc * inc) as f64;
                }
            }
        }
        if self.top.capacity() > 0 {
            let est = self.sketch.estimate(key.as_bytes());
            self.top.offer(key, est);
        }
        if full && self.seen.is_multiple_of(256) {
            let l2sq = median_of(self.sumsq.iter().map(|v| *v as i64)) as f64;
            if self.sketch.sampling_is_safe(self.seen, l2sq, self.sampler.p) {
                self.sampler.start_sampling();
            }
        }
    }

    /// The estimated count of `key`.
    pub fn estimate(&self, key: &[u8]) -> i64 {
        self.sketch.estimate(key)
    }

    /// Whether AlwaysCorrect mode was asked for.
    pub fn always_correct(&self) -> bool {
        self.always_correct
    }
}

impl<S: RowSketch> Nitro<S> {
    /// Merges another window or agent's sketch (heaps are combined by re-estimating).
    pub fn merge(&mut self, other: &Nitro<S>) -> Result<(), MergeError> {
        self.sketch.merge(&other.sketch)?;
        self.seen += other.seen;
        let keys: Vec<KeyBytes> = self.top.keys().chain(other.top.keys()).copied().collect();
        for k in keys {
            let e = self.sketch.estimate(k.as_bytes());
            self.top.offer(&k, e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sketch::countmin::CountMin;
    use crate::sketch::countsketch::CountSketch;
    use crate::sketch::Hasher;

    #[test]
    fn samples_row_visits_with_probability_p() {
        let mut s = Sampler::new(0.01, 5, 7, false);
        let n = 2_000_000u64;
        let visits: u64 = (0..n).map(|_| u64::from(s.sample().count_ones())).sum();
        let want = n as f64 * 5.0 * 0.01;
        // Binomial: σ = √(n·d·p·(1−p)) ≈ 315; 5σ.
        assert!((visits as f64 - want).abs() < 1600.0, "{visits} sampled visits, want {want}");
    }

    #[test]
    fn sampled_counts_are_unbiased() {
        let mut n = Nitro::new(CountSketch::new(5, 2048, Hasher::default()), 0.05, false, 0, 3);
        let heavy = KeyBytes::from_slice(b"elephant").unwrap();
        for i in 0u32..400_000 {
            if i % 4 == 0 {
                n.update(&heavy);
            } else {
                n.update(&KeyBytes::from_slice(&(i % 50_000).to_le_bytes()).unwrap());
            }
        }
        let e = n.estimate(heavy.as_bytes());
        // 100,000 true; sampling σ ≈ √(100,000·19) ≈ 1,380 per row, the median of 5 tighter.
        assert!((e - 100_000).abs() < 5_000, "estimate {e}");
    }

    #[test]
    fn always_correct_is_exact_until_it_converges() {
        let mut n = Nitro::new(CountMin::new(4, 1024, Hasher::default()), 0.01, true, 10, 1);
        let k = KeyBytes::from_slice(b"k").unwrap();
        for _ in 0..10_000 {
            n.update(&k);
        }
        assert!(!n.sampling(), "CMS waits for N ≥ w/p = 102,400");
        assert_eq!(n.estimate(k.as_bytes()), 10_000);
        for _ in 0..100_000 {
            n.update(&k);
        }
        assert!(n.sampling());
        assert_eq!(n.top.sorted()[0].0, k);
    }
}
