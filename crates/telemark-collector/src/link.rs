//! Loss between two agents: a point's batches lined up with the batches of its upstream point
//! in another agent (DESIGN.md: batches are identified across points by flow, color and start
//! time).
//!
//! A point whose upstream is in another agent can check a batch only against B, and one
//! color bit cannot number batches. When a whole batch is lost on the way, the two batches of
//! the other color around it arrive back to back and read as one (docs/loss.md, "Whole
//! batches lost"). With both points reporting every batch (`report_all`), the collector lines
//! them up here (see [`match_batches`]): each downstream batch expects the counts of the
//! upstream batches of its color it took in, and an upstream batch nothing downstream took in
//! was lost whole.

use serde::Serialize;

/// One batch at one point, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub color: u8,
    pub first_ns: u64,
    pub last_ns: u64,
    /// Packets counted in the batch.
    pub observed: u64,
    /// Packets of the batch that came after it closed.
    pub late: u64,
}

/// One batch's loss between the two points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LinkBatch {
    pub color: u8,
    /// The downstream batch's first packet; an upstream batch's when it was lost whole.
    pub first_ns: u64,
    /// Packets upstream sent (observed + late there).
    pub expected: u64,
    /// Packets downstream got (observed + late).
    pub got: u64,
    /// `expected − got` (0 if more arrived).
    pub lost: u64,
    /// Upstream batches this one stands for: 2 or more when whole batches in between were
    /// lost and two of this color merged.
    pub upstream_batches: u32,
    /// Not one packet of this upstream batch arrived.
    pub whole: bool,
}

/// Lines `down` up with `up` (each in order of first packet). `skew_ns` is how far the
/// downstream clock may run behind the upstream one (0 on one host).
///
/// Each downstream batch's first packet came from the last upstream batch of its color that
/// had begun when it arrived (its source): a packet arrives after it left, and the next batch
/// of that color begins a whole cycle (2B packets) later, which no path delays a packet by. A
/// downstream batch then stands for the upstream batches from its source up to the next
/// downstream batch's source: those of its color merged into it, those of the other color in
/// between were lost whole.
///
/// A downstream batch is judged once the next one's source is known: the last downstream
/// batch waits, and so does any whose next one upstream has not yet reported past. Upstream
/// batches before downstream's first are not charged: downstream may not have been watching.
pub fn match_batches(up: &[Batch], down: &[Batch], skew_ns: u64) -> Vec<LinkBatch> {
    // Each downstream batch's source, while upstream has reported past it.
    let mut sources: Vec<Option<usize>> = Vec::new();
    let mut from = 0;
    for d in down {
        let arrived = d.first_ns.saturating_add(skew_ns);
        let begun =
            from + up.get(from..).map_or(0, |u| u.partition_point(|x| x.first_ns <= arrived));
        if begun >= up.len() {
            break; // upstream has not reported past it yet
        }
        let k = (from..begun).rev().find(|&k| up[k].color == d.color);
        from = k.unwrap_or(from);
        sources.push(k);
    }
    let mut out = Vec::new();
    for (n, d) in down.iter().enumerate() {
        let (Some(Some(a)), Some(Some(b))) = (sources.get(n), sources.get(n + 1)) else {
            continue; // no source (nothing upstream sent it, or its records are gone), or waiting
        };
        let (mut expected, mut batches) = (0, 0);
        for u in up.get(*a..*b).into_iter().flatten() {
            if u.color == d.color {
                expected += u.observed + u.late;
                batches += 1;
            } else {
                out.push(whole(u));
            }
        }
        let got = d.observed + d.late;
        out.push(LinkBatch {
            color: d.color,
            first_ns: d.first_ns,
            expected,
            got,
            lost: expected.saturating_sub(got),
            upstream_batches: batches,
            whole: false,
        });
    }
    out
}

/// An upstream batch not one packet of which arrived.
fn whole(u: &Batch) -> LinkBatch {
    let expected = u.observed + u.late;
    LinkBatch {
        color: u.color,
        first_ns: u.first_ns,
        expected,
        got: 0,
        lost: expected,
        upstream_batches: 1,
        whole: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path: `sent` packets of one flow, 100 µs apart, marked in batches of `b`; packets
    /// whose index `lose` picks are lost. Returns both points' batches as each would close
    /// them (a batch ends where the next color begins) and the number lost.
    fn path(sent: u64, b: u64, delay: u64, lose: impl Fn(u64) -> bool) -> (Vec<Batch>, Vec<Batch>) {
        let mut up: Vec<Batch> = Vec::new();
        let mut down: Vec<Batch> = Vec::new();
        let add = |v: &mut Vec<Batch>, color: u8, t: u64| match v.last_mut() {
            Some(x) if x.color == color => {
                x.observed += 1;
                x.last_ns = t;
            }
            _ => v.push(Batch { color, first_ns: t, last_ns: t, observed: 1, late: 0 }),
        };
        for i in 0..sent {
            let (color, t) = (((i / b) % 2) as u8, 1_000_000 + i * 100_000);
            add(&mut up, color, t);
            if !lose(i) {
                add(&mut down, color, t + delay);
            }
        }
        (up, down)
    }

    #[test]
    fn whole_batches_lost_are_counted_exactly() {
        // Runs of loss 0..=350 packets long at every offset in a batch, B = 100, with 3 ms of
        // path delay: every packet that did not arrive is counted, whatever it took with it.
        for run in [0u64, 1, 99, 100, 101, 150, 199, 200, 250, 350] {
            for start in (1000..1100).step_by(7) {
                let lose = |i: u64| i >= start && i < start + run;
                let (up, down) = path(3000, 100, 3_000_000, lose);
                let m = match_batches(&up, &down, 0);
                let lost: u64 = m.iter().map(|x| x.lost).sum();
                assert_eq!(lost, run, "run {run} from {start}");
                let got: u64 = m.iter().map(|x| x.got).sum();
                // Every packet that arrived, but for the last two batches': upstream has not
                // reported a batch that began after they ended.
                assert_eq!(got + 200, 3000 - run, "run {run} from {start}");
            }
        }
    }

    #[test]
    fn scattered_loss_and_nothing_upstream_past_yet() {
        let lose = |i: u64| i % 37 == 5 && i < 1800; // the last two batches wait
        let (up, down) = path(2000, 100, 1_000_000, lose);
        let lost = (0..2000).filter(|i| lose(*i)).count() as u64;
        let m = match_batches(&up, &down, 0);
        assert_eq!(m.iter().map(|x| x.lost).sum::<u64>(), lost);
        assert!(m.iter().all(|x| x.upstream_batches == 1 && !x.whole));
        // Upstream has reported 10 batches: downstream batches 8 on wait.
        let m = match_batches(&up[..10], &down, 0);
        assert_eq!(m.len(), 8);
    }

    #[test]
    fn a_downstream_that_began_late_is_not_charged_for_what_came_before() {
        let (up, down) = path(1000, 100, 1_000_000, |_| false);
        let m = match_batches(&up, &down[3..], 0);
        assert_eq!(m.iter().map(|x| x.lost).sum::<u64>(), 0);
        assert_eq!(m.first().map(|x| x.first_ns), down.get(3).map(|d| d.first_ns));
    }
}
