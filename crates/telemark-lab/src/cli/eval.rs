//! `telemark eval accuracy`: the data of Fig. 4a and 4b of the loss paper as CSV.

use crate::eval::{self as ev, mean_ci95};
use anyhow::{Context, Result};
use clap::{Args as ClapArgs, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

/// Which experiment.
#[derive(ValueEnum, Clone, Debug)]
pub enum Which {
    /// Fig. 4a and 4b: relative error of the estimated drop probability.
    Accuracy,
    /// SFCMon Fig. 3: heavy-hitter FPR, accuracy, recall, precision against the window length.
    HeavyHitters,
    /// NitroSketch Figs. 11/12: heavy-hitter error against packets seen, vanilla vs NitroSketch.
    Nitro,
    /// Heavy-hitter error against memory for each sketch.
    Memory,
}

/// `telemark eval` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The experiment.
    #[arg(value_enum, default_value = "accuracy")]
    pub which: Which,
    /// Directory for the CSV files.
    #[arg(long, default_value = "docs/eval")]
    pub out: PathBuf,
    /// Seeds per point (the 95 % interval is over these).
    #[arg(long, default_value_t = 30)]
    pub seeds: u64,
    /// Reordering depths to run, in packets (0 = none).
    #[arg(long, value_delimiter = ',', default_values_t = [0u64, 33])]
    pub reorder: Vec<u64>,
    /// heavy-hitters: flows in the generated backbone-like trace.
    #[arg(long, default_value_t = 300_000)]
    pub flows: usize,
    /// heavy-hitters: length of the trace, seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// heavy-hitters: seed of the trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// nitro, memory: independent sketch seeds per point.
    #[arg(long, default_value_t = 3)]
    pub runs: u64,
    /// nitro, memory: heavy hitter = at least this share of the packets.
    #[arg(long, default_value_t = 0.001)]
    pub threshold: f64,
    /// nitro: counters per row of Count-Min and Count Sketch (UnivMon's levels: a quarter).
    #[arg(long, default_value_t = 1024)]
    pub width: usize,
    /// memory: packets of the trace to count.
    #[arg(long, default_value_t = 8_000_000)]
    pub packets: u64,
}

const PROBS: [f64; 4] = [0.001, 0.01, 0.05, 0.10];
const BATCHES: [u32; 10] = [1, 2, 5, 10, 15, 20, 25, 30, 40, 50];
const SIZES: [u32; 8] = [10, 25, 50, 75, 100, 150, 200, 255];

/// Runs `telemark eval`.
pub fn run_eval(a: Args) -> Result<()> {
    if a.seeds < 2 {
        anyhow::bail!("--seeds must be at least 2 for a confidence interval");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let path = a.out.join("fig4.csv");
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?,
    );
    writeln!(f, "figure,reorder,p,batch_size,batches,against,mean_rel_error,ci95,seeds,skipped")?;
    let mut rows = 0;
    for &reorder in &a.reorder {
        for &p in &PROBS {
            let points_a = BATCHES.iter().map(|n| ("4a", 100u32, *n));
            let points_b = SIZES.iter().map(|b| ("4b", *b, 25u32));
            for (fig, b, n) in points_a.chain(points_b) {
                let mut vs_cfg = Vec::new();
                let mut vs_real = Vec::new();
                let mut skipped = 0;
                for seed in 0..a.seeds {
                    let o = ev::run(b, n, p, reorder.min(u64::from(b) / 3), seed * 7919 + 1);
                    vs_cfg.push((o.p_hat - p).abs() / p);
                    if o.realised > 0.0 {
                        vs_real.push((o.p_hat - o.realised).abs() / o.realised);
                    } else {
                        skipped += 1;
                    }
                }
                for (against, v, sk) in
                    [("configured", &vs_cfg, 0), ("realised", &vs_real, skipped)]
                {
                    let (m, ci) = mean_ci95(v);
                    writeln!(
                        f,
                        "{fig},{reorder},{p},{b},{n},{against},{m:.6},{ci:.6},{},{sk}",
                        v.len()
                    )?;
                    rows += 1;
                }
            }
        }
    }
    f.flush()?;
    println!(
        "wrote {} ({rows} rows; reordering depth capped at a third of the batch)",
        path.display()
    );
    Ok(())
}

/// Entry point used by main.
pub fn run(a: Args) -> Result<()> {
    match a.which {
        Which::Accuracy => run_eval(a),
        Which::HeavyHitters => {
            if a.flows == 0 || a.seconds == 0 {
                anyhow::bail!("--flows and --seconds must be at least 1");
            }
            std::fs::create_dir_all(&a.out)
                .with_context(|| format!("creating {}", a.out.display()))?;
            crate::cli::eval_hh::run(&a.out, a.flows, a.seconds, a.seed)
        }
        Which::Nitro | Which::Memory => {
            if a.flows == 0 || a.seconds == 0 || a.runs == 0 || a.packets == 0 {
                anyhow::bail!("--flows, --seconds, --runs and --packets must be at least 1");
            }
            if !(a.threshold > 0.0 && a.threshold < 1.0) {
                anyhow::bail!("--threshold must be between 0 and 1");
            }
            std::fs::create_dir_all(&a.out)
                .with_context(|| format!("creating {}", a.out.display()))?;
            let o = crate::cli::eval_sketch::Opts {
                out: &a.out,
                flows: a.flows,
                seconds: a.seconds,
                seed: a.seed,
                runs: a.runs,
                threshold: a.threshold,
                width: a.width.max(2),
            };
            if matches!(a.which, Which::Nitro) {
                crate::cli::eval_sketch::run_nitro(&o)
            } else {
                crate::cli::eval_sketch::run_memory(&o, a.packets)
            }
        }
    }
}
