//! `telemark eval heavy-hitters`: SFCMon's Fig. 3 (false positive rate, accuracy, recall and
//! precision of heavy-hitter detection against the window length) on a generated backbone-like
//! trace, for Telemark's pipeline and for SFCMon as its paper evaluated it, with the exact
//! per-window counts as ground truth.

use crate::gen::{for_each_packet, plan, GenConfig};
use anyhow::{Context, Result};
use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use telemark_core::sketch::sfcmon::{ExactFlows, HhConfig, HhWindow, Sfcmon};
use telemark_core::sketch::KeyBytes;

/// Window lengths of the paper's Fig. 3, seconds.
pub const WINDOWS_S: [u64; 6] = [6, 7, 10, 15, 30, 60];

/// The trace the evaluation runs on.
pub fn trace(flows: usize, seconds: u64, seed: u64) -> GenConfig {
    GenConfig {
        flows,
        seed,
        duration_ns: seconds * 1_000_000_000,
        max_packets: 1_000_000,
        stationary: true,
        ..GenConfig::default()
    }
}

#[derive(Default, Clone, Copy)]
struct Tally {
    tp: u64,
    fp: u64,
    fn_: u64,
    tn: u64,
    windows: u64,
    complete: u64,
    heavy: u64,
    reported: u64,
    flows_checked: u64,
    flows_in_bound: u64,
    rel_err_sum: f64,
    under_sum: f64,
}

impl Tally {
    fn add(
        &mut self,
        reported: &HashSet<KeyBytes>,
        exact: &ExactFlows,
        threshold: f64,
        sources: u64,
    ) {
        let truth = exact.heavy_sources(threshold);
        let tp = reported.iter().filter(|k| truth.contains_key(k)).count() as u64;
        let fp = reported.len() as u64 - tp;
        let fn_ = truth.len() as u64 - tp;
        self.tp += tp;
        self.fp += fp;
        self.fn_ += fn_;
        self.tn += sources - tp - fp - fn_;
        self.windows += 1;
        self.heavy += truth.len() as u64;
        self.reported += reported.len() as u64;
    }

    fn counts(&mut self, w: &HhWindow, exact: &ExactFlows) {
        self.complete += u64::from(w.complete);
        for f in &w.flows {
            let Some((p, _)) = exact.flows().get(&f.key) else { continue };
            self.flows_checked += 1;
            self.flows_in_bound += u64::from(f.packets <= *p && *p <= f.packets + f.error_bound);
            self.rel_err_sum += (f.estimate as f64 - *p as f64).abs() / *p as f64;
            self.under_sum += (*p as f64 - f.packets as f64) / *p as f64;
        }
    }

    fn row(&self) -> (f64, f64, f64, f64) {
        let r = |a: u64, b: u64| if b == 0 { 1.0 } else { a as f64 / b as f64 };
        (
            r(self.fp, self.fp + self.tn),
            r(self.tp + self.tn, self.tp + self.tn + self.fp + self.fn_),
            r(self.tp, self.tp + self.fn_),
            r(self.tp, self.tp + self.fp),
        )
    }
}

/// Runs the evaluation and writes `sfcmon_fig3.csv` into `out`.
pub fn run(out: &Path, flows: usize, seconds: u64, seed: u64) -> Result<()> {
    let dist = crate::cli::gen::load_sizes(None, seed)?;
    let cfg = trace(flows, seconds, seed);
    let plans = plan(&cfg, &dist);
    let ours_cfg = HhConfig::default();
    let memory = Sfcmon::new(ours_cfg.clone()).memory();
    let path = out.join("sfcmon_fig3.csv");
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?,
    );
    writeln!(f, "pipeline,window_s,windows,packets_per_window,fpr,accuracy,recall,precision,heavy_per_window,reported_per_window,listing_complete,flows_within_bound,counted_share_missed,estimate_rel_error,memory_bytes")?;
    println!("trace: {flows} flows over {seconds} s (sizes: {}), memory {memory} B", dist.source);
    println!(
        "{:<14} {:>4} {:>8} {:>7} {:>8} {:>7} {:>9} {:>6} {:>9}",
        "pipeline", "win", "windows", "FPR", "accuracy", "recall", "precision", "heavy", "complete"
    );
    for w_s in WINDOWS_S {
        let w_ns = w_s * 1_000_000_000;
        let mut ours = Sfcmon::new(ours_cfg.clone());
        let mut paper = Sfcmon::new(HhConfig::paper()).log_admissions();
        let mut exact = ExactFlows::default();
        let (mut t_ours, mut t_paper) = (Tally::default(), Tally::default());
        let mut next = cfg.start_ns + w_ns;
        let mut packets = 0u64;
        let mut close = |ours: &mut Sfcmon, paper: &mut Sfcmon, exact: &mut ExactFlows| {
            let wo = ours.end_window();
            let wp = paper.end_window();
            let sources: HashSet<KeyBytes> =
                exact.flows().keys().map(KeyBytes::source_of).collect();
            let n = sources.len() as u64;
            let rep: HashSet<KeyBytes> = wo.sources.iter().map(|(k, _)| *k).collect();
            t_ours.add(&rep, exact, ours_cfg.threshold, n);
            t_ours.counts(&wo, exact);
            let rep: HashSet<KeyBytes> = wp.admitted_sources.iter().copied().collect();
            t_paper.add(&rep, exact, ours_cfg.threshold, n);
            t_paper.complete += u64::from(wp.complete);
            packets += exact.packets();
            exact.clear();
        };
        for_each_packet(&cfg, &plans, |t, k, len| {
            while t >= next {
                close(&mut ours, &mut paper, &mut exact);
                next += w_ns;
            }
            ours.observe(k, len);
            paper.observe(k, len);
            exact.observe(k, len);
        });
        // A last window shorter than the others is left out.
        if next == cfg.start_ns + cfg.duration_ns {
            close(&mut ours, &mut paper, &mut exact);
        }
        for (name, t, mem) in [
            ("telemark", t_ours, memory),
            ("sfcmon-paper", t_paper, Sfcmon::new(HhConfig::paper()).memory()),
        ] {
            let (fpr, acc, rec, prec) = t.row();
            let wn = t.windows.max(1) as f64;
            let within = if t.flows_checked == 0 {
                1.0
            } else {
                t.flows_in_bound as f64 / t.flows_checked as f64
            };
            let per = |v: f64| if t.flows_checked == 0 { 0.0 } else { v / t.flows_checked as f64 };
            let (under, est_err) = (per(t.under_sum), per(t.rel_err_sum));
            writeln!(
                f,
                "{name},{w_s},{},{:.0},{fpr:.6},{acc:.6},{rec:.6},{prec:.6},{:.1},{:.1},{:.3},{within:.4},{under:.5},{est_err:.5},{mem}",
                t.windows,
                packets as f64 / wn,
                t.heavy as f64 / wn,
                t.reported as f64 / wn,
                t.complete as f64 / wn,
            )?;
            println!(
                "{name:<14} {w_s:>3}s {:>8} {:>7.5} {:>8.5} {:>7.4} {:>9.4} {:>6.0} {:>9.2}",
                t.windows,
                fpr,
                acc,
                rec,
                prec,
                t.heavy as f64 / wn,
                t.complete as f64 / wn
            );
        }
    }
    f.flush()?;
    println!("wrote {}", path.display());
    Ok(())
}
