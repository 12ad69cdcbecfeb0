//! `telemark bench-sketch`: sketch update rates on one core, vanilla against NitroSketch
//! (NitroSketch §7), and the SFCMon pipeline against an exact hash table as the number of
//! active flows grows (SFCMon Fig. 4). Medians of several passes over a pool of keys built
//! before timing; one run of this command gives every ratio it prints.

use crate::bench::{median, synthetic_flow, uniform_bursts, zipf_ranks};
use crate::nitro_thread;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::hint::black_box;
use std::time::Instant;
use telemark_core::sketch::countmin::CountMin;
use telemark_core::sketch::countsketch::CountSketch;
use telemark_core::sketch::kary::Kary;
use telemark_core::sketch::nitro::Nitro;
use telemark_core::sketch::sfcmon::{ExactFlows, HhConfig, Sfcmon};
use telemark_core::sketch::univmon::UnivMon;
use telemark_core::sketch::{Hasher, Hashing, KeyBytes, RowSketch};

/// `telemark bench-sketch` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Packets per pass.
    #[arg(long, default_value_t = 2_000_000)]
    pub packets: usize,
    /// Passes per measurement; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// NitroSketch sampling probability.
    #[arg(long, default_value_t = 0.01)]
    pub p: f64,
    /// Hash family for the sketches.
    #[arg(long, value_enum, default_value = "murmur3")]
    pub hashing: HashArg,
    /// Active-flow counts for the pipeline measurement.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 100, 10_000, 100_000, 1_000_000])]
    pub flows: Vec<usize>,
    /// Run only one part.
    #[arg(long, value_enum)]
    pub only: Option<Part>,
}

/// A part of the benchmark.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Each sketch, vanilla against NitroSketch.
    Sketches,
    /// The SFCMon pipeline against the exact table.
    Pipeline,
}

/// Hash family flag.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum HashArg {
    /// Seeded MurmurHash3 per row.
    Murmur3,
    /// One multiply-fold hash, rows by double hashing.
    Fast,
}

/// A Zipf(1)-like stream over `n` flows.
fn zipf_keys(n: usize, len: usize) -> Vec<KeyBytes> {
    zipf_ranks(n as u64, len, 0x9e37_79b9_7f4a_7c15)
        .into_iter()
        .map(|rank| KeyBytes::flow_of(&synthetic_flow(rank)))
        .collect()
}

fn median_ns_per(rounds: usize, n: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    median(&mut v)
}

/// Runs `telemark bench-sketch`.
pub fn run(a: Args) -> Result<()> {
    if a.packets == 0 || a.rounds == 0 || !(a.p > 0.0 && a.p <= 1.0) || a.flows.contains(&0) {
        anyhow::bail!("--packets, --rounds and --flows must be ≥ 1 and --p in (0, 1]");
    }
    let hasher = Hasher::new(
        match a.hashing {
            HashArg::Murmur3 => Hashing::Murmur3,
            HashArg::Fast => Hashing::Fast,
        },
        7,
    );
    // The keys of a switch's current packets are in cache; a pool of 65,536 (2.8 MB) replayed
    // keeps this measurement about the sketch, not about streaming keys from memory.
    let pool = zipf_keys(100_000, 65_536);
    let reps = a.packets.div_ceil(pool.len());
    let n = reps * pool.len();
    let keys = &pool;
    println!(
        "one core; {n} packets per pass (a pool of 65,536 from a Zipf stream over 100,000 flows, replayed); median of {} passes; {:?} hashing; p = {}",
        a.rounds, hasher.kind, a.p
    );
    if a.only != Some(Part::Pipeline) {
        println!(
            "{:<12} {:>14} {:>14} {:>8} {:>18} {:>9}",
            "sketch", "vanilla Mpps", "nitro Mpps", "speedup", "thread: fast Mpps", "overflow"
        );
        fn pair<S: RowSketch + Clone + Send + 'static>(
            name: &str,
            s: S,
            (keys, reps): (&[KeyBytes], usize),
            rounds: usize,
            p: f64,
        ) -> Result<()> {
            let n = keys.len() * reps;
            let mut v = s.clone();
            let van = median_ns_per(rounds, n, || {
                for _ in 0..reps {
                    for k in keys {
                        v.update(k.as_bytes(), 1);
                    }
                }
            });
            let mut ni = Nitro::new(s.clone(), p, false, 0, 1);
            let nit = median_ns_per(rounds, n, || {
                for _ in 0..reps {
                    for k in keys {
                        ni.update(k);
                    }
                }
            });
            black_box((&v, &ni.sketch));
            // The separate-thread variant: what the switch's core pays per packet while the
            // sketch thread applies the samples on the other core.
            // Only the feed's loop is timed; joining waits for the sketch thread to drain.
            let (mut overflow, mut sampled) = (0u64, 0u64);
            let mut per = Vec::with_capacity(rounds);
            for _ in 0..rounds.max(1) {
                let (mut feed, running) =
                    nitro_thread::spawn(Nitro::new(s.clone(), p, false, 0, 1), 1 << 14)?;
                let t = Instant::now();
                for _ in 0..reps {
                    for k in keys {
                        feed.offer(k);
                    }
                }
                per.push(t.elapsed().as_nanos() as f64 / n as f64);
                overflow += feed.overflow();
                sampled += feed.overflow() + feed.pushed();
                black_box(running.finish(feed).applied);
            }
            let thr = median(&mut per);
            println!(
                "{name:<12} {:>14.1} {:>14.1} {:>7.1}× {:>18.1} {:>8.2}%",
                1e3 / van,
                1e3 / nit,
                van / nit,
                1e3 / thr,
                100.0 * overflow as f64 / sampled.max(1) as f64
            );
            Ok(())
        }
        pair("count-min", CountMin::new(5, 5436, hasher), (keys, reps), a.rounds, a.p)?;
        pair("count-sketch", CountSketch::new(5, 5436, hasher), (keys, reps), a.rounds, a.p)?;
        pair("k-ary", Kary::new(5, 5436, hasher), (keys, reps), a.rounds, a.p)?;
        {
            let mut v = UnivMon::new(16, 5, 2048, 100, hasher);
            let van = median_ns_per(a.rounds, n, || {
                for _ in 0..reps {
                    for k in keys {
                        v.update(k);
                    }
                }
            });
            let mut ni = UnivMon::new(16, 5, 2048, 100, hasher).nitro(a.p, false, 1);
            let nit = median_ns_per(a.rounds, n, || {
                for _ in 0..reps {
                    for k in keys {
                        ni.update(k);
                    }
                }
            });
            black_box((&v, &ni));
            println!(
                "{:<12} {:>14.1} {:>14.1} {:>7.1}× {:>18} {:>9}",
                "univmon",
                1e3 / van,
                1e3 / nit,
                van / nit,
                "all-in-one only",
                ""
            );
        }
    }
    if a.only == Some(Part::Sketches) {
        return Ok(());
    }

    println!("\npipeline vs exact table, uniform traffic over N active flows (SFCMon Fig. 4)");
    println!("{:>9} {:>14} {:>14} {:>10}", "flows", "sfcmon Mpps", "exact Mpps", "ratio");
    // Each packet's flow is a scrambled packet number mod N, its key written into a burst in
    // memory (the same work for both), and every pass measures every N in turn, so that a
    // noisy neighbour slows all
    // columns of a pass alike rather than one row. One pipeline serves every N, starting a
    // window before each: separate instances differ by where their arrays landed in memory by
    // up to 15 % at the same N, which would be measured as a difference between flow counts.
    // The exact table keeps one instance per N, so that it stays filled.
    let cfg = HhConfig { hashing: hasher.kind, ..HhConfig::default() };
    let mut s = Sfcmon::new(cfg);
    let mut state: Vec<(ExactFlows, Vec<f64>, Vec<f64>)> =
        a.flows.iter().map(|_| (ExactFlows::default(), vec![], vec![])).collect();
    let n = (a.packets as u64).div_ceil(32) * 32;
    for pass in 0..=a.rounds as u64 {
        for (&flows, (e, sf, ex)) in a.flows.iter().zip(&mut state) {
            let base = pass * n;
            black_box(s.end_window());
            // Keys come from memory, 32 at a time (see `uniform_bursts`).
            let t = Instant::now();
            uniform_bursts(base, n, flows as u64, |key| s.observe(key, 64));
            let t_s = t.elapsed().as_nanos() as f64 / n as f64;
            let t = Instant::now();
            uniform_bursts(base, n, flows as u64, |key| e.observe(key, 64));
            let t_e = t.elapsed().as_nanos() as f64 / n as f64;
            // Pass 0 warms up (fills the exact table).
            if pass > 0 {
                sf.push(t_s);
                ex.push(t_e);
            }
        }
    }
    let (mut fast, mut slow) = ([f64::MAX; 2], [0f64; 2]);
    for (&flows, (e, sf, ex)) in a.flows.iter().zip(&mut state) {
        let (sf, ex) = (median(sf), median(ex));
        black_box(e.packets());
        println!("{flows:>9} {:>14.1} {:>14.1} {:>9.2}×", 1e3 / sf, 1e3 / ex, ex / sf);
        for (i, ns) in [sf, ex].into_iter().enumerate() {
            fast[i] = fast[i].min(ns);
            slow[i] = slow[i].max(ns);
        }
    }
    println!(
        "{:>9} {:>13.2}× {:>13.2}×   (fastest / slowest rate over the flow counts)",
        "max/min",
        slow[0] / fast[0],
        slow[1] / fast[1]
    );
    Ok(())
}
