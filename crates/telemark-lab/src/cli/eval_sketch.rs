//! `telemark eval nitro` and `telemark eval memory`: the sketches' accuracy on heavy hitters of
//! a generated backbone-like trace, with exact per-flow counts as ground truth.
//!
//! - `nitro` (NitroSketch Figs. 11 and 12): relative error on heavy hitters against the packets
//!   seen, vanilla against NitroSketch (p = 0.1 and 0.01, and AlwaysCorrect at p = 0.01), for
//!   Count-Min, Count Sketch and UnivMon, and when AlwaysCorrect switched to sampling.
//! - `memory`: relative error on heavy hitters against the memory of each sketch.
//!
//! Relative error on heavy hitters = the mean, over the flows with at least `threshold` of the
//! packets so far, of |estimate − true| / true: NitroSketch's accuracy metric.

use crate::gen::{for_each_packet, plan};
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use telemark_core::hash::FlowTableHasher;
use telemark_core::sketch::countmin::CountMin;
use telemark_core::sketch::countsketch::CountSketch;
use telemark_core::sketch::kary::Kary;
use telemark_core::sketch::nitro::Nitro;
use telemark_core::sketch::univmon::UnivMon;
use telemark_core::sketch::{Hasher, KeyBytes, RowSketch};

/// A sketch under evaluation.
trait Counter {
    fn update(&mut self, k: &KeyBytes);
    fn estimate(&self, k: &KeyBytes) -> i64;
    fn memory(&self) -> usize;
    /// Packets seen when AlwaysCorrect switched to sampling (None: not AlwaysCorrect, or not
    /// yet).
    fn switched_at(&self) -> Option<u64> {
        None
    }
}

struct Plain<S>(S);

impl<S: RowSketch> Counter for Plain<S> {
    fn update(&mut self, k: &KeyBytes) {
        self.0.update(k.as_bytes(), 1);
    }
    fn estimate(&self, k: &KeyBytes) -> i64 {
        self.0.estimate(k.as_bytes())
    }
    fn memory(&self) -> usize {
        self.0.memory()
    }
}

struct Sampled<S> {
    n: Nitro<S>,
    switched: Option<u64>,
}

impl<S: RowSketch> Counter for Sampled<S> {
    fn update(&mut self, k: &KeyBytes) {
        self.n.update(k);
        if self.switched.is_none() && self.n.always_correct() && self.n.sampling() {
            self.switched = Some(self.n.seen());
        }
    }
    fn estimate(&self, k: &KeyBytes) -> i64 {
        self.n.estimate(k.as_bytes())
    }
    fn memory(&self) -> usize {
        self.n.sketch.memory()
    }
    fn switched_at(&self) -> Option<u64> {
        self.switched
    }
}

impl Counter for UnivMon {
    fn update(&mut self, k: &KeyBytes) {
        UnivMon::update(self, k);
    }
    fn estimate(&self, k: &KeyBytes) -> i64 {
        UnivMon::estimate(self, k.as_bytes())
    }
    fn memory(&self) -> usize {
        UnivMon::memory(self)
    }
}

/// How a sketch is updated: every row (None), or NitroSketch with (p, AlwaysCorrect).
type Mode = Option<(f64, bool)>;

/// `s` updated as `mode` says (`seed` for the sampler).
fn variant<S: RowSketch + 'static>(s: S, mode: Mode, seed: u64) -> Box<dyn Counter> {
    match mode {
        None => Box::new(Plain(s)),
        Some((p, ac)) => Box::new(Sampled { n: Nitro::new(s, p, ac, 0, seed), switched: None }),
    }
}

/// One evaluated sketch: what it is, and one instance per run.
struct Entry {
    sketch: &'static str,
    mode: &'static str,
    width: usize,
    runs: Vec<Box<dyn Counter>>,
}

impl Entry {
    /// `runs` instances made by `make(run)`.
    fn new(
        sketch: &'static str,
        mode: &'static str,
        width: usize,
        runs: u64,
        make: impl Fn(u64) -> Box<dyn Counter>,
    ) -> Entry {
        Entry { sketch, mode, width, runs: (0..runs).map(make).collect() }
    }

    /// Mean error over the runs.
    fn error(&self, heavy: &[(KeyBytes, u64)]) -> f64 {
        mean(&self.runs.iter().map(|r| heavy_error(r.as_ref(), heavy)).collect::<Vec<_>>())
    }

    /// When each run's AlwaysCorrect switched to sampling, space-separated.
    fn switched(&self) -> String {
        let v: Vec<String> =
            self.runs.iter().filter_map(|r| r.switched_at()).map(|s| s.to_string()).collect();
        v.join(" ")
    }
}

/// Streams the trace's first `max_packets` packets (FlowID2 keys) through every sketch of
/// every entry and calls `report` at each checkpoint with the exact counts so far.
fn stream(
    flows: usize,
    seconds: u64,
    seed: u64,
    max_packets: u64,
    checkpoints: &[u64],
    entries: &mut [Entry],
    mut report: impl FnMut(u64, &HashMap<KeyBytes, u64, FlowTableHasher>, &[Entry]),
) -> Result<String> {
    let dist = crate::cli::gen::load_sizes(None, seed)?;
    let cfg = crate::cli::eval_hh::trace(flows, seconds, seed);
    let plans = plan(&cfg, &dist);
    let mut exact: HashMap<KeyBytes, u64, FlowTableHasher> = HashMap::default();
    let mut n = 0u64;
    let mut next = checkpoints.iter().copied().peekable();
    for_each_packet(&cfg, &plans, |_, k, _| {
        if n >= max_packets {
            return;
        }
        let id = KeyBytes::flow_of(k);
        *exact.entry(id).or_default() += 1;
        for e in entries.iter_mut() {
            for r in &mut e.runs {
                r.update(&id);
            }
        }
        n += 1;
        if next.peek() == Some(&n) {
            next.next();
            report(n, &exact, entries);
        }
    });
    if n < max_packets {
        anyhow::bail!(
            "the trace has only {n} packets; {max_packets} needed (raise --flows or --seconds)"
        );
    }
    Ok(dist.source)
}

/// Mean relative error of `c` over the heavy flows.
fn heavy_error(c: &dyn Counter, heavy: &[(KeyBytes, u64)]) -> f64 {
    let s: f64 =
        heavy.iter().map(|(k, t)| (c.estimate(k) as f64 - *t as f64).abs() / *t as f64).sum();
    s / heavy.len().max(1) as f64
}

fn heavy_flows(
    exact: &HashMap<KeyBytes, u64, FlowTableHasher>,
    n: u64,
    thr: f64,
) -> Vec<(KeyBytes, u64)> {
    let bar = (thr * n as f64).max(1.0);
    exact.iter().filter(|(_, c)| **c as f64 >= bar).map(|(k, c)| (*k, *c)).collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Settings shared by both experiments.
pub struct Opts<'a> {
    /// Output directory.
    pub out: &'a Path,
    /// Flows in the trace.
    pub flows: usize,
    /// Trace length, seconds.
    pub seconds: u64,
    /// Trace seed.
    pub seed: u64,
    /// Independent sketch seeds per point (errors are averaged over them).
    pub runs: u64,
    /// Heavy hitter = at least this share of the packets.
    pub threshold: f64,
    /// nitro: counters per row (UnivMon's levels get a quarter of it).
    pub width: usize,
}

/// Checkpoints of `nitro`, packets.
pub const CHECKPOINTS: [u64; 7] =
    [250_000, 500_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000, 16_000_000];

/// Rows of every sketch here (NitroSketch's and SFCMon's 5).
const DEPTH: usize = 5;

/// `telemark eval nitro`.
pub fn run_nitro(o: &Opts) -> Result<()> {
    let (width, um_width) = (o.width, (o.width / 4).max(2));
    let h = |r: u64| Hasher::new(Default::default(), 0x1117 + r as u32 * 0x9e37);
    let modes: [(&str, Mode); 4] = [
        ("vanilla", None),
        ("nitro p=0.1", Some((0.1, false))),
        ("nitro p=0.01", Some((0.01, false))),
        ("nitro p=0.01 always-correct", Some((0.01, true))),
    ];
    const SKETCHES: [&str; 3] = ["count-min", "count-sketch", "univmon"];
    let mut entries = Vec::new();
    for (mode, m) in modes {
        entries.push(Entry::new(SKETCHES[0], mode, width, o.runs, |r| {
            variant(CountMin::new(DEPTH, width, h(r)), m, r + 1)
        }));
        entries.push(Entry::new(SKETCHES[1], mode, width, o.runs, |r| {
            variant(CountSketch::new(DEPTH, width, h(r)), m, r + 1)
        }));
        entries.push(Entry::new(SKETCHES[2], mode, um_width, o.runs, |r| {
            let u = UnivMon::new(16, DEPTH, um_width, 0, h(r));
            Box::new(match m {
                None => u,
                Some((p, ac)) => u.nitro(p, ac, r + 1),
            })
        }));
    }
    // Where (sketch, mode) sits in `entries`, and so in each checkpoint's errors.
    let at = |es: &[Entry], sketch: &str, mode: &str| {
        es.iter().position(|e| e.sketch == sketch && e.mode == mode).unwrap_or(0)
    };
    let path = o.out.join(format!("nitro_convergence_w{width}.csv"));
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?,
    );
    writeln!(f, "sketch,mode,depth,width,memory_bytes,packets,heavy_flows,mean_rel_error,ratio_to_vanilla,runs,switched_at")?;
    let max = *CHECKPOINTS.last().unwrap_or(&0);
    let mut table: Vec<(u64, Vec<f64>)> = Vec::new();
    let mut io: Result<()> = Ok(());
    let source =
        stream(o.flows, o.seconds, o.seed, max, &CHECKPOINTS, &mut entries, |n, exact, es| {
            let heavy = heavy_flows(exact, n, o.threshold);
            let errs: Vec<f64> = es.iter().map(|e| e.error(&heavy)).collect();
            for (i, e) in es.iter().enumerate() {
                let vanilla = errs[at(es, e.sketch, "vanilla")];
                let r = writeln!(
                    f,
                    "{},{},{DEPTH},{},{},{n},{},{:.6},{:.3},{},{}",
                    e.sketch,
                    e.mode,
                    e.width,
                    e.runs[0].memory(),
                    heavy.len(),
                    errs[i],
                    errs[i] / vanilla.max(1e-12),
                    e.runs.len(),
                    e.switched()
                );
                if io.is_ok() {
                    io = r.map_err(Into::into);
                }
            }
            table.push((n, errs));
        })?;
    io?;
    f.flush()?;
    println!(
        "trace: {} flows over {} s (sizes: {source}); heavy = ≥ {} % of packets; {} sketch seeds per point",
        o.flows,
        o.seconds,
        o.threshold * 100.0,
        o.runs
    );
    println!("mean relative error on heavy hitters (NitroSketch / vanilla in brackets)");
    for sketch in SKETCHES {
        println!("\n{sketch}");
        print!("{:>10}", "packets");
        for (mode, _) in &modes {
            print!(" {mode:>28}");
        }
        println!();
        for (n, errs) in &table {
            print!("{n:>10}");
            let vanilla = errs[at(&entries, sketch, "vanilla")];
            for (m, (mode, _)) in modes.iter().enumerate() {
                let e = errs[at(&entries, sketch, mode)];
                if m == 0 {
                    print!(" {:>27.3}%", 100.0 * e);
                } else {
                    print!(" {:>18.3}% ({:>5.2}×)", 100.0 * e, e / vanilla.max(1e-12));
                }
            }
            println!();
        }
    }
    for e in entries.iter().filter(|e| !e.switched().is_empty()) {
        println!("{} {}: switched to sampling after {} packets", e.sketch, e.mode, e.switched());
    }
    println!("wrote {}", path.display());
    Ok(())
}

/// Widths of `memory`.
pub const WIDTHS: [usize; 7] = [256, 512, 1024, 2048, 4096, 8192, 16384];

/// `telemark eval memory`: error on heavy hitters after `packets` packets against memory.
pub fn run_memory(o: &Opts, packets: u64) -> Result<()> {
    let h = |r: u64| Hasher::new(Default::default(), 0x2227 + r as u32 * 0x9e37);
    let mut entries = Vec::new();
    for w in WIDTHS {
        let v = "vanilla";
        entries.push(Entry::new("count-min", v, w, o.runs, |r| {
            Box::new(Plain(CountMin::new(DEPTH, w, h(r))))
        }));
        entries.push(Entry::new("count-min-cu", v, w, o.runs, |r| {
            Box::new(Plain(CountMin::new(DEPTH, w, h(r)).conservative(true)))
        }));
        entries.push(Entry::new("count-sketch", v, w, o.runs, |r| {
            Box::new(Plain(CountSketch::new(DEPTH, w, h(r))))
        }));
        entries.push(Entry::new("k-ary", v, w, o.runs, |r| {
            Box::new(Plain(Kary::new(DEPTH, w, h(r))))
        }));
        entries.push(Entry::new("univmon", v, w, o.runs, |r| {
            Box::new(UnivMon::new(16, DEPTH, (w / 4).max(2), 0, h(r)))
        }));
    }
    let path = o.out.join("sketch_memory.csv");
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?,
    );
    writeln!(f, "sketch,depth,width,memory_bytes,packets,heavy_flows,mean_rel_error,runs")?;
    let mut rows = Vec::new();
    let source =
        stream(o.flows, o.seconds, o.seed, packets, &[packets], &mut entries, |n, exact, es| {
            let heavy = heavy_flows(exact, n, o.threshold);
            for e in es {
                rows.push((e.sketch, e.width, e.runs[0].memory(), heavy.len(), e.error(&heavy)));
            }
        })?;
    println!(
        "trace: {} flows over {} s (sizes: {source}); {packets} packets; heavy = ≥ {} % of packets; {} sketch seeds per point",
        o.flows,
        o.seconds,
        o.threshold * 100.0,
        o.runs
    );
    println!("{:<14} {:>6} {:>12} {:>14}", "sketch", "width", "memory", "heavy rel err");
    for (sketch, w, mem, heavy, err) in &rows {
        writeln!(f, "{sketch},{DEPTH},{w},{mem},{packets},{heavy},{err:.6},{}", o.runs)?;
        println!("{sketch:<14} {w:>6} {:>10} KiB {:>13.3}%", mem / 1024, 100.0 * err);
    }
    f.flush()?;
    println!("wrote {}", path.display());
    Ok(())
}
