//! NitroSketch's separate-thread variant (Liu et al., SIGCOMM 2019, §5 and Fig. 8(b)): the
//! switch's core only draws which counter rows a packet would update; a packet drawn for at least
//! one row goes, key and row mask, through an SPSC ring to a sketch thread on another core, which
//! hashes the rows and adds 1/p. At p = 0.01 over 5 rows about 5 packets in 100 are pushed, and
//! the other 95 cost the fast path one decrement of the sampler's skip counter.
//!
//! The split gives exactly the sketch the all-in-one variant ([`Nitro::update`]) would build from
//! the same sampler seed, as long as the ring never overflows. When it does (the sketch thread
//! fell behind), the sample is dropped and counted in [`Feed::overflow`]: the fast path never
//! waits, and a reader sees how much of the stream the estimates miss.
//!
//! Only fixed-p sampling: AlwaysCorrect decides when to start sampling from the sketch's own
//! counters, which live on the other thread; the paper also evaluates AlwaysCorrect all-in-one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use telemark_core::sketch::nitro::{Nitro, Sampler};
use telemark_core::sketch::{KeyBytes, RowSketch};
use telemark_core::spsc;

/// A sampled packet on its way to the sketch thread.
#[derive(Clone, Copy)]
struct Sampled {
    key: KeyBytes,
    mask: u32,
}

/// Why a sketch cannot run on a separate thread.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NitroThreadError {
    /// AlwaysCorrect needs the sketch's counters on the sampling side.
    #[error("AlwaysCorrect NitroSketch runs all-in-one only (its switch to sampling reads the sketch's counters)")]
    AlwaysCorrect,
    /// The system would not start another thread.
    #[error("cannot start the sketch thread: {0}")]
    Spawn(String),
}

/// The fast path's side: draws the sample and pushes sampled packets.
pub struct Feed {
    sampler: Sampler,
    ring: spsc::Producer<Sampled>,
    seen: u64,
    pushed: u64,
    overflow: u64,
}

impl Feed {
    /// Offers one packet of `key`.
    #[inline]
    pub fn offer(&mut self, key: &KeyBytes) {
        self.seen += 1;
        let mask = self.sampler.sample();
        if mask != 0 {
            if self.ring.push(Sampled { key: *key, mask }).is_ok() {
                self.pushed += 1;
            } else {
                self.overflow += 1;
            }
        }
    }

    /// Packets offered.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Sampled packets handed to the sketch thread.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Sampled packets lost because the ring was full.
    pub fn overflow(&self) -> u64 {
        self.overflow
    }
}

/// The sketch's side: applies what the feed pushed.
pub struct Sketcher<S> {
    nitro: Nitro<S>,
    ring: spsc::Consumer<Sampled>,
    applied: u64,
}

impl<S: RowSketch> Sketcher<S> {
    /// Applies everything in the ring now; returns how many samples.
    pub fn poll(&mut self) -> usize {
        let nitro = &mut self.nitro;
        let n = self.ring.drain(|s| nitro.apply_sampled(&s.key, s.mask));
        self.applied += n as u64;
        n
    }

    /// Samples applied so far.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Polls until `stop` is set, then drains what is left.
    pub fn run(mut self, stop: &AtomicBool) -> Self {
        let mut idle = 0u32;
        loop {
            if self.poll() > 0 {
                idle = 0;
                continue;
            }
            if stop.load(Ordering::Acquire) {
                self.poll();
                return self;
            }
            // A polling thread, as the paper's; it gives the core away when the switch is idle.
            idle += 1;
            if idle < 128 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The sketch, once the feed is done: `seen` is the feed's packet count (the stream's L1).
    pub fn into_sketch(mut self, seen: u64) -> Nitro<S> {
        self.poll();
        self.nitro.set_seen(seen);
        self.nitro
    }
}

/// Splits a NitroSketch into a fast-path feed and a sketch side joined by a ring of at least
/// `capacity` samples. The feed draws with the sketch's own sampler, so both halves together
/// build the sketch that [`Nitro::update`] would.
pub fn split<S: RowSketch>(
    mut nitro: Nitro<S>,
    capacity: usize,
) -> Result<(Feed, Sketcher<S>), NitroThreadError> {
    if nitro.always_correct() {
        return Err(NitroThreadError::AlwaysCorrect);
    }
    let (tx, rx) = spsc::channel(capacity);
    let feed =
        Feed { sampler: nitro.sampler_mut().clone(), ring: tx, seen: 0, pushed: 0, overflow: 0 };
    Ok((feed, Sketcher { nitro, ring: rx, applied: 0 }))
}

/// A sketch thread started by [`spawn`].
pub struct Running<S> {
    handle: JoinHandle<Sketcher<S>>,
    stop: Arc<AtomicBool>,
}

/// What the two halves measured, once joined.
pub struct Finished<S> {
    /// The sketch, its packet count set to the feed's.
    pub nitro: Nitro<S>,
    /// Packets the feed saw.
    pub seen: u64,
    /// Samples the sketch thread applied.
    pub applied: u64,
    /// Samples lost to a full ring.
    pub overflow: u64,
}

/// Starts the sketch side on a thread of its own (name `nitro-sketch`).
pub fn spawn<S: RowSketch + Send + 'static>(
    nitro: Nitro<S>,
    capacity: usize,
) -> Result<(Feed, Running<S>), NitroThreadError> {
    let (feed, sketcher) = split(nitro, capacity)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let handle = std::thread::Builder::new()
        .name("nitro-sketch".into())
        .spawn(move || sketcher.run(&flag))
        .map_err(|e| NitroThreadError::Spawn(e.to_string()))?;
    Ok((feed, Running { handle, stop }))
}

impl<S: RowSketch> Running<S> {
    /// Stops the thread once it has applied everything `feed` pushed, and joins it.
    pub fn finish(self, feed: Feed) -> Finished<S> {
        self.stop.store(true, Ordering::Release);
        let sketcher = match self.handle.join() {
            Ok(s) => s,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let applied = sketcher.applied();
        Finished {
            nitro: sketcher.into_sketch(feed.seen),
            seen: feed.seen,
            applied,
            overflow: feed.overflow,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use telemark_core::sketch::countmin::CountMin;
    use telemark_core::sketch::countsketch::CountSketch;
    use telemark_core::sketch::{Hasher, Hashing};

    /// A skewed stream over 2,000 keys (u32 bytes).
    fn stream(n: usize) -> Vec<KeyBytes> {
        crate::bench::zipf_ranks(2000, n, 0x1234_5678_9abc_def1)
            .into_iter()
            .map(|rank| KeyBytes::from_slice(&(rank as u32).to_be_bytes()).unwrap())
            .collect()
    }

    fn cms() -> CountMin {
        CountMin::new(5, 1024, Hasher::new(Hashing::Murmur3, 3))
    }

    #[test]
    fn the_thread_builds_the_all_in_one_sketch() {
        let keys = stream(400_000);
        let mut inline = Nitro::new(
            CountSketch::new(5, 1024, Hasher::new(Hashing::Murmur3, 3)),
            0.01,
            false,
            0,
            9,
        );
        for k in &keys {
            inline.update(k);
        }
        // A ring as large as the stream's samples can get cannot overflow, so the thread must
        // apply exactly the samples the all-in-one variant applied.
        let nitro = Nitro::new(
            CountSketch::new(5, 1024, Hasher::new(Hashing::Murmur3, 3)),
            0.01,
            false,
            0,
            9,
        );
        let (mut feed, running) = spawn(nitro, 1 << 16).unwrap();
        for k in &keys {
            feed.offer(k);
        }
        let done = running.finish(feed);
        assert_eq!(done.overflow, 0);
        assert_eq!(done.seen, keys.len() as u64);
        assert_eq!(done.nitro.seen(), keys.len() as u64);
        assert!(
            done.applied > 0 && done.applied < keys.len() as u64 / 10,
            "{} applied",
            done.applied
        );
        assert_eq!(
            done.nitro.sketch.rows(),
            inline.sketch.rows(),
            "counters differ from all-in-one"
        );
    }

    #[test]
    fn threaded_estimates_track_exact_counts() {
        let keys = stream(1_000_000);
        let mut exact: HashMap<KeyBytes, i64> = HashMap::new();
        for k in &keys {
            *exact.entry(*k).or_default() += 1;
        }
        // Polled in step every 1,000 packets (about 410 samples), so a 4,096-sample ring never
        // fills whatever the machine's load.
        let (mut feed, mut sketcher) = split(Nitro::new(cms(), 0.1, false, 0, 4), 1 << 12).unwrap();
        for chunk in keys.chunks(1000) {
            for k in chunk {
                feed.offer(k);
            }
            sketcher.poll();
        }
        assert_eq!(feed.overflow(), 0);
        let nitro = sketcher.into_sketch(feed.seen());
        // Keys with ≥ 1 % of the stream: sampling's relative deviation is about
        // √((1 − p)/(p·c)) ≤ 1 % per row for c ≥ 10⁴ at p = 0.1, plus Count-Min's
        // overestimate of about N/w ≈ 1,000; 6 % is far outside both.
        let mut heavy = 0;
        for (k, &c) in &exact {
            if c * 100 >= keys.len() as i64 {
                heavy += 1;
                let e = nitro.estimate(k.as_bytes());
                let rel = (e - c).abs() as f64 / c as f64;
                assert!(rel < 0.06, "key {k:?}: estimate {e}, exact {c}");
            }
        }
        assert!(heavy >= 5, "the stream should have heavy keys ({heavy})");
    }

    #[test]
    fn a_full_ring_drops_and_counts_samples_but_keeps_what_it_took() {
        let keys = stream(50_000);
        let (mut feed, mut sketcher) = split(Nitro::new(cms(), 0.1, false, 0, 4), 8).unwrap();
        for k in &keys {
            feed.offer(k);
        }
        // Nothing polled: the ring holds its first 8 samples and every later one overflowed.
        assert_eq!(feed.pushed(), 8);
        assert!(feed.overflow() > 1000, "{} overflowed", feed.overflow());
        assert_eq!(sketcher.poll(), 8);
        let total: u64 = sketcher.nitro.sketch.rows().rows().flatten().map(|&c| u64::from(c)).sum();
        let nitro = sketcher.into_sketch(feed.seen());
        assert_eq!(nitro.seen(), 50_000);
        // The same draws, replayed: the sketch holds exactly the first 8 samples' row visits,
        // 1/p = 10 each; whatever overflowed is gone, not half-applied.
        let mut draws = Sampler::new(0.1, 5, 4, false);
        let visits: u32 = std::iter::repeat_with(|| draws.sample())
            .filter(|&m| m != 0)
            .take(8)
            .map(u32::count_ones)
            .sum();
        assert_eq!(total, 10 * u64::from(visits));
    }

    #[test]
    fn always_correct_is_refused() {
        let r = split(Nitro::new(cms(), 0.01, true, 0, 1), 16);
        assert_eq!(r.err(), Some(NitroThreadError::AlwaysCorrect));
    }
}
