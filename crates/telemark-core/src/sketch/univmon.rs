//! UnivMon (Liu, Manousis, Vorsanger, Sekar & Braverman, "One sketch to rule them all",
//! SIGCOMM 2016): one sketch for many statistics.
//!
//! `levels` Count Sketches, each with a top-k heap. Level 0 sees every key; level j sees the keys
//! whose level hash starts with j one-bits, half of the keys of level j−1. Heavy hitters come
//! from level 0's heap; any G-sum Σ g(f_x) (distinct keys with g = 1, entropy with
//! g = f·log f, moments) comes from the heaps of every level by the recursive estimator of
//! Braverman & Ostrovsky (STOC 2013), [`UnivMon::gsum`].
//!
//! In NitroSketch mode every level's rows are sampled as in [`super::nitro`].

use super::countsketch::CountSketch;
use super::nitro::Sampler;
use super::topk::TopK;
use super::{Hasher, KeyBytes, MergeError, RowSketch};
use serde::{Deserialize, Serialize};

/// A UnivMon sketch.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "UnivMonShape")]
pub struct UnivMon {
    levels: Vec<CountSketch>,
    heaps: Vec<TopK>,
    level_hasher: Hasher,
    samplers: Option<Vec<Sampler>>,
    seen: u64,
}

/// A [`UnivMon`] as read from outside, checked before use: one heap (and sampler) per level.
#[derive(Deserialize)]
struct UnivMonShape {
    levels: Vec<CountSketch>,
    heaps: Vec<TopK>,
    level_hasher: Hasher,
    samplers: Option<Vec<Sampler>>,
    seen: u64,
}

impl TryFrom<UnivMonShape> for UnivMon {
    type Error = String;
    fn try_from(s: UnivMonShape) -> Result<UnivMon, String> {
        let n = s.levels.len();
        if !(1..=32).contains(&n)
            || s.heaps.len() != n
            || s.samplers.as_ref().is_some_and(|v| v.len() != n)
        {
            return Err(format!(
                "UnivMon of {n} levels with {} heaps and {} samplers",
                s.heaps.len(),
                s.samplers.as_ref().map_or(0, Vec::len)
            ));
        }
        Ok(UnivMon {
            levels: s.levels,
            heaps: s.heaps,
            level_hasher: s.level_hasher,
            samplers: s.samplers,
            seen: s.seen,
        })
    }
}

impl UnivMon {
    /// `levels` (1..=32) Count Sketches of `depth` × `width`, heaps of `top` keys.
    pub fn new(levels: usize, depth: usize, width: usize, top: usize, hasher: Hasher) -> UnivMon {
        let levels = levels.clamp(1, 32);
        UnivMon {
            levels: (0..levels)
                .map(|j| {
                    CountSketch::new(
                        depth,
                        width,
                        Hasher::new(hasher.kind, hasher.seed.wrapping_add(0x1000 * j as u32 + 1)),
                    )
                })
                .collect(),
            heaps: (0..levels).map(|_| TopK::new(top)).collect(),
            level_hasher: Hasher::new(hasher.kind, hasher.seed ^ 0x5bd1_e995),
            samplers: None,
            seen: 0,
        }
    }

    /// NitroSketch mode: rows sampled with probability `p` (AlwaysCorrect when asked).
    pub fn nitro(mut self, p: f64, always_correct: bool, seed: u64) -> UnivMon {
        let d = self.levels[0].depth();
        self.samplers = Some(
            (0..self.levels.len())
                .map(|j| Sampler::new(p, d, seed.wrapping_add(j as u64 * 0x9e37), always_correct))
                .collect(),
        );
        self
    }

    /// The deepest level `key` belongs to.
    #[inline]
    fn top_level(&self, key: &[u8]) -> usize {
        let h = self.level_hasher.row(key, 0);
        (h.trailing_ones() as usize).min(self.levels.len() - 1)
    }

    /// Counts one packet of `key`.
    pub fn update(&mut self, key: &KeyBytes) {
        self.seen += 1;
        let top = self.top_level(key.as_bytes());
        for j in 0..=top {
            let est = match &mut self.samplers {
                None => self.levels[j].update_estimate(key.as_bytes(), 1),
                Some(s) => {
                    let mask = s[j].sample();
                    if mask == 0 {
                        continue;
                    }
                    let inc = s[j].increment();
                    let cs = &mut self.levels[j];
                    for r in 0..cs.depth() {
                        if mask & (1 << r) != 0 {
                            let h = cs.hasher().row(key.as_bytes(), r);
                            cs.add_row(r, h, inc);
                        }
                    }
                    if s[j].full && self.seen.is_multiple_of(256) {
                        let l1 = self.seen >> j;
                        if cs.sampling_is_safe(l1, cs.l2_squared(), s[j].p()) {
                            s[j].start_sampling();
                        }
                    }
                    cs.estimate(key.as_bytes())
                }
            };
            self.heaps[j].offer(key, est);
        }
    }

    /// Heavy keys with their estimates, largest first (level 0's heap).
    pub fn heavy(&self) -> Vec<(KeyBytes, i64)> {
        self.heaps[0].sorted()
    }

    /// The estimated count of `key` (level 0).
    pub fn estimate(&self, key: &[u8]) -> i64 {
        self.levels[0].estimate(key)
    }

    /// Estimates Σ_x g(f_x) over all keys of the stream.
    pub fn gsum(&self, g: impl Fn(f64) -> f64) -> f64 {
        let last = self.levels.len() - 1;
        let heap_sum = |j: usize, weight: &dyn Fn(&KeyBytes) -> f64| -> f64 {
            self.heaps[j]
                .sorted()
                .iter()
                .filter(|(_, e)| *e > 0)
                .map(|(k, e)| g(*e as f64) * weight(k))
                .sum()
        };
        let mut y = heap_sum(last, &|_| 1.0);
        for j in (0..last).rev() {
            y = 2.0 * y
                + heap_sum(j, &|k| if self.top_level(k.as_bytes()) > j { -1.0 } else { 1.0 });
        }
        y
    }

    /// Packets counted.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Bytes of counter state.
    pub fn memory(&self) -> usize {
        self.levels.iter().map(RowSketch::memory).sum()
    }

    /// Adds another UnivMon of the same shape: counters add, heaps are re-estimated.
    pub fn merge(&mut self, other: &UnivMon) -> Result<(), MergeError> {
        if self.levels.len() != other.levels.len() || self.level_hasher != other.level_hasher {
            return Err(MergeError::Shape("univmon levels or hasher differ"));
        }
        for j in 0..self.levels.len() {
            self.levels[j].merge(&other.levels[j])?;
            let keys: Vec<KeyBytes> =
                self.heaps[j].keys().chain(other.heaps[j].keys()).copied().collect();
            for k in keys {
                let e = self.levels[j].estimate(k.as_bytes());
                self.heaps[j].offer(&k, e);
            }
        }
        self.seen += other.seen;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> KeyBytes {
        KeyBytes::from_slice(&i.to_le_bytes()).unwrap()
    }

    /// Zipf-like: key i sends ⌈20,000/(i+1)⌉ packets, 30,000 keys.
    fn stream() -> Vec<(u32, u32)> {
        (0u32..30_000).map(|i| (i, (20_000 / (i + 1)).max(1))).collect()
    }

    #[test]
    fn heavy_hitters_and_g_sums() {
        let mut u = UnivMon::new(16, 5, 2048, 500, Hasher::default());
        let s = stream();
        // Interleave so heaps see keys grow as in a real stream.
        let mut left: Vec<(u32, u32)> = s.clone();
        while !left.is_empty() {
            left.retain_mut(|(k, n)| {
                u.update(&key(*k));
                *n -= 1;
                *n > 0
            });
        }
        let heavy: Vec<u32> = u
            .heavy()
            .iter()
            .take(10)
            .map(|(k, _)| u32::from_le_bytes(k.as_bytes().try_into().unwrap()))
            .collect();
        assert_eq!(heavy, (0..10).collect::<Vec<_>>());
        let l1: f64 = s.iter().map(|(_, n)| f64::from(*n)).sum();
        let est_l1 = u.gsum(|f| f);
        assert!((est_l1 - l1).abs() < 0.05 * l1, "L1 {l1} estimated {est_l1:.0}");
        let distinct = s.len() as f64;
        let est_d = u.gsum(|_| 1.0);
        assert!(
            (est_d - distinct).abs() < 0.25 * distinct,
            "distinct {distinct} estimated {est_d:.0}"
        );
    }

    #[test]
    fn merge_adds_streams() {
        let h = Hasher::default();
        let (mut a, mut b) = (UnivMon::new(8, 3, 256, 50, h), UnivMon::new(8, 3, 256, 50, h));
        for i in 0..5_000u32 {
            a.update(&key(i % 7));
            b.update(&key(i % 11));
        }
        a.merge(&b).unwrap();
        assert_eq!(a.seen(), 10_000);
        let e = a.estimate(key(0).as_bytes());
        assert!((e - (715 + 455)).abs() < 60, "{e}");
    }
}
