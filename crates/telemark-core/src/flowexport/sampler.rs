//! sFlow's random 1-in-N packet sampling (sFlow v5 specification, §4.2.2 "Packet Flow
//! Sampling"; the paper's §IV "Measuring with sFlow").
//!
//! Each packet decrements a skip count; the packet that takes it to zero is sampled and a new
//! skip is drawn uniformly from 1 ..= 2N − 1, so one packet in N is sampled on average and an
//! observer cannot predict which (a periodic 1-in-N sampler aliases with periodic traffic).
//! The sample pool counts every packet the sampler saw: a collector scales by pool / samples.

/// One data source's sampler.
#[derive(Debug, Clone)]
pub struct Sampler {
    rate: u32,
    skip: u32,
    pool: u32,
    rng: u64,
}

impl Sampler {
    /// A sampler of one packet in `rate` (0 is taken as 1: every packet), seeded with `seed`.
    pub fn new(rate: u32, seed: u64) -> Sampler {
        let mut s = Sampler { rate: rate.max(1), skip: 0, pool: 0, rng: seed };
        s.skip = s.next_skip();
        s
    }

    /// Whether this packet is sampled.
    #[inline]
    pub fn sample(&mut self) -> bool {
        self.pool = self.pool.wrapping_add(1);
        self.skip -= 1;
        if self.skip == 0 {
            self.skip = self.next_skip();
            return true;
        }
        false
    }

    /// One in how many packets is sampled.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Packets seen (the sFlow sample pool, wrapping at 2³²).
    pub fn pool(&self) -> u32 {
        self.pool
    }

    /// The next skip, uniform in 1 ..= 2·rate − 1 (SplitMix64 bits, Lemire's reduction).
    #[cold]
    fn next_skip(&mut self) -> u32 {
        if self.rate == 1 {
            return 1;
        }
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let span = 2 * u64::from(self.rate) - 1;
        1 + ((u128::from(z) * u128::from(span)) >> 64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_one_samples_every_packet() {
        let mut s = Sampler::new(1, 9);
        assert!((0..1000).all(|_| s.sample()));
        assert_eq!(s.pool(), 1000);
    }

    /// Over 10⁶ packets the number sampled is within four standard deviations of 10⁶/N: skips
    /// uniform on 1 ..= 2N − 1 have mean N and variance (N² − N)/3, so by renewal theory the
    /// count's variance is about n·(N²/3)/N³ = (n/N)/3.
    #[test]
    fn one_in_n_on_average_and_no_two_runs_alike() {
        for rate in [2u32, 64, 1000] {
            let n = 1_000_000u64;
            let mut s = Sampler::new(rate, u64::from(rate));
            let got = (0..n).filter(|_| s.sample()).count() as f64;
            let want = n as f64 / f64::from(rate);
            let sd = (want / 3.0).sqrt().max(1.0);
            assert!((got - want).abs() < 4.0 * sd, "rate {rate}: {got} sampled, {want} expected");
        }
        let picks = |seed| {
            let mut s = Sampler::new(16, seed);
            (0..256).map(|_| s.sample()).collect::<Vec<bool>>()
        };
        assert_ne!(picks(1), picks(2));
    }
}
