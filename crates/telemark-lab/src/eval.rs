//! Accuracy experiment of the loss paper (V-B.1, Fig. 4): one flow through marker → ingress →
//! dropper → egress; the estimated drop probability p̂ = lost / expected at egress is compared
//! with the configured drop probability (as the paper plots it) and with the dropper's realised
//! drop rate (the measurement's own error), with and without reordering.

use crate::dropper::{DropModel, Dropper};
use crate::reorder::Reorderer;
use telemark_core::loss::{Aggregator, BatchEvent, ColorTable, LossConfig, Marker, PointSpec};
use telemark_core::{flow_hash, FlowKey};

/// One run's outcome.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Estimated drop probability.
    pub p_hat: f64,
    /// Realised drop rate (dropped / offered).
    pub realised: f64,
    /// Packets offered to the dropper.
    pub offered: u64,
}

/// Runs `batches` batches of `b` packets of one flow with drop probability `p` and reordering
/// of depth `reorder`, both between the ingress and the egress point.
pub fn run(b: u32, batches: u32, p: f64, reorder: u64, seed: u64) -> Outcome {
    let cfg = LossConfig {
        batch: b,
        counter_bits: if b > 255 { 16 } else { 8 },
        ..LossConfig::default()
    };
    let spec = |name: &str, upstream, marker| PointSpec {
        name: name.into(),
        agent: "eval".into(),
        port: "-".into(),
        upstream,
        marker,
        skew_ns: 0,
        upstream_label: None,
        every_batch: false,
    };
    let mut agg = Aggregator::new(
        vec![
            spec("marker", None, true),
            spec("ingress", Some(0), false),
            spec("egress", Some(1), false),
        ],
        Some(b),
        0,
    );
    let mut marker = Marker::new(&cfg, 0);
    let mut ing = ColorTable::<u16>::new(&cfg, 1);
    let mut eg = ColorTable::<u16>::new(&cfg, 2);
    let mut dropper = Dropper::new(DropModel::Independent { p }, seed);
    let mut reo: Reorderer<(u64, u8)> = Reorderer::new(reorder, seed ^ 0x5eed);
    let key = FlowKey::default();
    let h = flow_hash(&key);
    let mut ev: Vec<BatchEvent> = Vec::new();
    let mut held = Vec::new();
    let total = u64::from(b) * u64::from(batches);
    // marker → ingress → dropper → reorderer → egress: the reordering happens on the
    // measured segment, so the two points see different orders.
    for t in 0..total {
        let Some((c, _)) = marker.mark(&key, h, t, &mut ev) else { continue };
        ing.observe(&key, h, c, t, &mut ev);
        if !dropper.drop_packet(&key, None) {
            reo.push((t, c), &mut held);
            for (t, c) in held.drain(..) {
                eg.observe(&key, h, c, t, &mut ev);
            }
        }
        for e in ev.drain(..) {
            agg.handle(e);
        }
    }
    reo.flush(&mut held);
    for (t, c) in held.drain(..) {
        eg.observe(&key, h, c, t, &mut ev);
    }
    marker.flush(&mut ev);
    ing.flush(&mut ev);
    eg.flush(&mut ev);
    for e in ev.drain(..) {
        agg.handle(e);
    }
    agg.flush();
    let t = agg.totals(&key, 2);
    Outcome {
        p_hat: if t.expected == 0 { 0.0 } else { t.lost as f64 / t.expected as f64 },
        realised: dropper.rate(),
        offered: dropper.seen,
    }
}

/// Mean and 95 % confidence half-width (Student t) of `v`.
pub fn mean_ci95(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, f64::NAN);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, t975(v.len() - 1) * (var / n).sqrt())
}

/// Two-sided 95 % quantile of Student's t with `df` degrees of freedom (standard tables).
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => T[df - 1],
        31..=60 => 2.000,
        61..=120 => 1.980,
        _ => 1.960,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_interval_uses_the_right_t() {
        // Two samples: df 1, t = 12.706; sd of {0, 2} is √2, so 12.706 · √2 / √2.
        let (m, ci) = mean_ci95(&[0.0, 2.0]);
        assert_eq!(m, 1.0);
        assert!((ci - 12.706).abs() < 1e-9, "{ci}");
        assert!(mean_ci95(&[1.0]).1.is_nan());
    }

    #[test]
    fn exact_without_reordering_close_with() {
        for seed in 0..5 {
            let o = run(100, 25, 0.05, 0, seed);
            assert!((o.p_hat - o.realised).abs() < 1e-12, "{o:?}");
            let r = run(100, 25, 0.05, 33, seed);
            assert!((r.p_hat - r.realised).abs() < 0.01 * 0.05 + 1e-3, "{r:?}");
        }
    }
}
