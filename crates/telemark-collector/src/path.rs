//! A flow's path: its observation points lined up, and its loss split into segments.
//!
//! Inside one agent each point measures against the point just upstream of it there, so its
//! figures belong to one segment ([`Scope::Segment`]). A point whose upstream is in another
//! agent (a switch that did not mark the flow) has only the batch size B to compare with, so
//! its figures cover the whole path from the marking switch ([`Scope::Path`]). Adding the
//! points' figures up would count a packet lost on the first link again at every switch after
//! it; here each such point gets the segment from the nearest point upstream of it instead:
//!
//! - **Which point is upstream.** The one named in the agent's configuration (`upstream_a`,
//!   a tap's `upstream`), if given. Where the points count marking periods of time (the eBPF
//!   datapath), from what they counted: the agents in the order of what they counted of the
//!   marker's periods, most first ([`period_chain`]), whatever their clocks say. Otherwise
//!   from the batches' times: the same batch reaches points further down the path later, so
//!   among the other agents' points that saw the flow, the upstream one is the one the point's
//!   batches trail by the least ([`trail_ns`]); this needs the agents' clocks to agree to
//!   within half a batch (one host, or NTP/PTP across hosts for batches of milliseconds).
//! - **Its segment's loss.** When both points report every batch (`report_all`; host mode's
//!   points at the ends of cross-host segments by default), the batches are lined up one by
//!   one ([`line_up`]: by period number, else by time; both count batches lost whole).
//!   Otherwise the segment's loss is the difference of the two points' path losses
//!   ([`reach`]): what was lost from the marking to here, less what was lost from the marking
//!   to the upstream point.
//!
//! A point with no upstream found keeps its path figures, named as the path from the marking.

use crate::link::{match_batches, match_periods, Batch, LinkBatch};
use serde::Serialize;
use telemark_core::records::Scope;

/// One point's loss records of one flow.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PointRecords {
    pub agent: String,
    pub point: String,
    pub port: String,
    /// The `upstream` of its records: a point of the same agent ([`Scope::Segment`]), or the
    /// configured name of another agent's point, if any ([`Scope::Path`]).
    pub upstream: Option<String>,
    pub scope: Scope,
    /// Its batches in order of first packet (empty when only the sums were read).
    pub batches: Vec<Batch>,
    /// The last batch ended the point's watch (closed by a flush or an idle timeout).
    pub ended: bool,
    pub expected: u64,
    pub lost: u64,
    pub uncertain: u64,
    pub lossy_batches: u64,
    /// It reported batches that lost nothing too: its batches are every batch it closed.
    pub every_batch: bool,
    /// The kernel's drops of the flow its agent named in these records, per reason.
    pub drops: std::collections::BTreeMap<String, u64>,
    /// The flow's TTL (hop limit) there, where its records say (records' `ttl`).
    pub ttl: Option<u8>,
    /// Packets the marker there left as their sender coloured them, unmeasured (records'
    /// `own_colour`).
    pub own_colour: u64,
}

impl PointRecords {
    /// `agent/point`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.agent, self.point)
    }
}

/// How a segment's figures were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Measured by the agent between two of its points.
    InSwitch,
    /// Both points' batches lined up one by one at the collector.
    LinedUp,
    /// The downstream point's path loss less the upstream point's.
    Difference,
    /// No upstream point reported the flow: the path loss from the marking switch.
    FromMarking,
}

/// Loss on one segment of a flow's path: the stretch just upstream of one point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Segment {
    /// Agent of the point at the segment's downstream end.
    pub agent: String,
    /// The point.
    pub point: String,
    /// Its port.
    pub port: String,
    /// The point at the upstream end (`agent/point`), if known.
    pub from: Option<String>,
    /// How the figures were found.
    pub method: Method,
    /// Packets lost on the segment.
    pub lost: u64,
    /// Packets missing on the segment whose loss cannot be told.
    pub uncertain: u64,
    /// Packets sent into the segment (as far as the figures go).
    pub expected: u64,
    /// Lossy batches.
    pub lossy_batches: u64,
    /// Why the kernel of the segment's agent dropped packets of the flow, per drop reason
    /// (the eBPF datapath's `skb:kfree_skb`), as its loss records named them.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub drops: std::collections::BTreeMap<String, u64>,
    /// Packets the marker at this point left unmeasured, as their sender had set the colour
    /// bit (records' `own_colour`).
    #[serde(skip_serializing_if = "is_zero")]
    pub own_colour: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Each point's segment, most lost first.
pub fn segments(points: &[PointRecords]) -> Vec<Segment> {
    let mut out: Vec<Segment> = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let seg = |from, method, lost, uncertain, expected, lossy_batches| Segment {
                agent: p.agent.clone(),
                point: p.point.clone(),
                port: p.port.clone(),
                from,
                method,
                lost,
                uncertain,
                expected,
                lossy_batches,
                drops: p.drops.clone(),
                own_colour: p.own_colour,
            };
            if p.scope == Scope::Segment {
                let from = p.upstream.as_ref().map(|u| format!("{}/{u}", p.agent));
                return seg(
                    from,
                    Method::InSwitch,
                    p.lost,
                    p.uncertain,
                    p.expected,
                    p.lossy_batches,
                );
            }
            let Some(u) = upstream_of(points, i) else {
                let (l, x, e, b) = (p.lost, p.uncertain, p.expected, p.lossy_batches);
                return seg(p.upstream.clone(), Method::FromMarking, l, x, e, b);
            };
            let up = &points[u];
            if let Some(m) = by_periods(points, i, u) {
                let lost = m.iter().fold(0u64, |a, b| a.saturating_add(b.lost));
                let expected = m.iter().fold(0u64, |a, b| a.saturating_add(b.expected));
                let lossy = m.iter().filter(|b| b.lost > 0).count() as u64;
                seg(Some(up.name()), Method::LinedUp, lost, 0, expected, lossy)
            } else if up.every_batch && p.every_batch {
                // Every batch `up` reported lost something: that it reported them all is only
                // seen from the stream being unbroken (`unbroken`), which says nothing of the
                // time before its first batch or after its last. Line up only the downstream
                // batches that begin within that span (and half a batch after it: the delay).
                let inferred = up.lossy_batches >= up.batches.len() as u64;
                let half = up
                    .batches
                    .iter()
                    .map(|b| b.last_ns.saturating_sub(b.first_ns))
                    .max()
                    .unwrap_or(0)
                    / 2;
                let down: Vec<Batch> = match (inferred, up.batches.first(), up.batches.last()) {
                    (true, Some(first), Some(last)) => p
                        .batches
                        .iter()
                        .filter(|d| {
                            d.first_ns >= first.first_ns
                                && d.first_ns <= last.last_ns.saturating_add(half)
                        })
                        .copied()
                        .collect(),
                    _ => p.batches.clone(),
                };
                let m = match_batches(&up.batches, &down, skew_ns(up, p), up.ended);
                // Saturating: stored counts are at most 2^53 - 1 each, not their sums.
                let lost = m.iter().fold(0u64, |t, b| t.saturating_add(b.lost));
                let expected = m.iter().fold(0u64, |t, b| t.saturating_add(b.expected));
                let lossy = m.iter().filter(|b| b.lost > 0).count() as u64;
                seg(Some(up.name()), Method::LinedUp, lost, 0, expected, lossy)
            } else {
                let ((pl, px), (ul, ux)) = (reach(points, i), reach(points, u));
                let (lost, uncertain) = (pl.saturating_sub(ul), px.saturating_sub(ux));
                seg(
                    Some(up.name()),
                    Method::Difference,
                    lost,
                    uncertain,
                    p.expected,
                    p.lossy_batches,
                )
            }
        })
        .collect();
    out.sort_by(|a, b| b.lost.cmp(&a.lost).then(b.uncertain.cmp(&a.uncertain)));
    out
}

/// The flow's loss over its whole path: lost and uncertain from the marking to the point
/// furthest down (path losses only grow along the path, so the largest).
pub fn path_loss(points: &[PointRecords]) -> (u64, u64) {
    (0..points.len()).map(|i| reach(points, i)).max().unwrap_or_default()
}

/// Lost and uncertain from the marking to point `i`: its path figures, or its segment's
/// added to those of its upstream point in the same agent (none reported: nothing lost there).
fn reach(points: &[PointRecords], mut i: usize) -> (u64, u64) {
    let (mut lost, mut uncertain) = (0u64, 0u64);
    for _ in 0..points.len() {
        let p = &points[i];
        lost = lost.saturating_add(p.lost);
        uncertain = uncertain.saturating_add(p.uncertain);
        if p.scope == Scope::Path {
            break;
        }
        let up = p.upstream.as_deref();
        match points.iter().position(|q| q.agent == p.agent && Some(q.point.as_str()) == up) {
            Some(j) => i = j,
            None => break,
        }
    }
    (lost, uncertain)
}

/// The marking period of a point's batches, where they are periods of time (the eBPF
/// datapath's records carry it).
fn period_of(p: &PointRecords) -> Option<u64> {
    let t = p.batches.first()?.period?.length_ns;
    p.batches.iter().all(|b| b.period.map(|x| x.length_ns) == Some(t)).then_some(t)
}

/// How far behind the upstream end's clock the downstream end's may date the same packet,
/// when their batches are lined up by time: none between two exact clocks on one path (the
/// AF_PACKET switch's kernel timestamps); a quarter of a period where one end counts periods
/// of time (a counting point dated by the kernel's tick, a host whose clock differs from the
/// other's by up to its guard; docs/ebpf.md, "Clocks and periods"). Within a quarter
/// period, the batch of the same colour a period on is never mistaken for the source.
pub fn skew_ns(up: &PointRecords, down: &PointRecords) -> u64 {
    period_of(up).or(period_of(down)).map_or(0, |t| t / 4)
}

/// `down`'s batches lined up with `up`'s (another agent's point upstream): by period number
/// where both count marking periods of one length ([`match_periods`]: no clock involved),
/// else by time ([`match_batches`]) allowing `skew` (default [`skew_ns`]).
pub fn line_up(up: &PointRecords, down: &PointRecords, skew: Option<u64>) -> Vec<LinkBatch> {
    if same_periods(up, down) {
        return match_periods(&up.batches, &down.batches, up.ended);
    }
    let skew = skew.unwrap_or_else(|| skew_ns(up, down));
    match_batches(&up.batches, &down.batches, skew, up.ended)
}

/// Where path point `i`'s segment is measured by marking period: the other agent's point
/// upstream of it, when both count periods of one length, and the periods lined up
/// ([`match_periods`]). The segments of a flow's path read these figures at query time; the
/// collector's settling (`crate::settle`) stores them for the sums (overview, flows list).
pub fn lined_up_by_period(points: &[PointRecords], i: usize) -> Option<(usize, Vec<LinkBatch>)> {
    if points[i].scope != Scope::Path {
        return None;
    }
    let u = upstream_of(points, i)?;
    Some((u, by_periods(points, i, u)?))
}

/// `points[i]`'s periods lined up with those of `points[u]`, if both count periods of one
/// length.
fn by_periods(points: &[PointRecords], i: usize, u: usize) -> Option<Vec<LinkBatch>> {
    let (p, up) = (&points[i], &points[u]);
    same_periods(up, p).then(|| line_up(up, p, None))
}

/// Both points count marking periods, of one length.
fn same_periods(up: &PointRecords, down: &PointRecords) -> bool {
    period_of(down).is_some_and(|t| period_of(up) == Some(t))
}

/// The point upstream of path point `i`: the configured one, or the other agent's point the
/// flow reached last before it.
fn upstream_of(points: &[PointRecords], i: usize) -> Option<usize> {
    let p = &points[i];
    if let Some(label) = &p.upstream {
        let (agent, point) = label.split_once('/')?;
        return points
            .iter()
            .position(|q| q.agent == agent && q.point == point)
            .or_else(|| last_of(points, agent));
    }
    if let Some(t) = period_of(p) {
        if let Some(order) = period_chain(points, t) {
            let at = order.iter().position(|a| *a == p.agent)?;
            return last_of(points, order.get(at.checked_sub(1)?)?);
        }
    }
    let mut agents: Vec<&str> =
        points.iter().map(|q| q.agent.as_str()).filter(|a| *a != p.agent).collect();
    agents.sort_unstable();
    agents.dedup();
    agents
        .into_iter()
        .filter_map(|a| {
            // The agent's points, furthest down first, until one shares batches with `p`.
            let t = downstream_first(points, a)
                .find_map(|q| trail_ns(&points[q].batches, &p.batches))?;
            Some((t, last_of(points, a)?))
        })
        .filter(|(t, _)| *t > 0)
        .min()
        .map(|(_, q)| q)
}

/// The agents of a flow whose points count marking periods of `t`, in the order the flow
/// crosses them, found without their clocks: first the agent that marks it (whose points all
/// measure segments inside it), then the others by how much of what it sent they counted, most
/// first (a flow only loses packets on its way, so a host further down counts no more of the
/// same periods than one before it).
///
/// Agents that counted alike (nothing was lost between them) come by the TTL (hop limit) the
/// flow had at their first point, most first: each routed hop takes one off, so this is their
/// order along a routed path, and it decides which of them a loss before them is charged to.
/// Then (no TTL known, or hosts on one link that route nothing) by how long after the marker
/// their batches begin, which tells hosts apart only where their clocks agree to within the
/// delay between them; then by name. `None`: no one agent marks the flow, or an agent shares
/// no period with it.
fn period_chain(points: &[PointRecords], t: u64) -> Option<Vec<&str>> {
    let mut agents: Vec<&str> =
        points.iter().filter(|q| period_of(q) == Some(t)).map(|q| q.agent.as_str()).collect();
    agents.sort_unstable();
    agents.dedup();
    let marks = |a: &str| points.iter().filter(|q| q.agent == a).all(|q| q.scope == Scope::Segment);
    let mut roots = agents.iter().copied().filter(|a| marks(a));
    let (root, None) = (roots.next()?, roots.next()) else { return None };
    let sent = &points[last_of(points, root)?];
    let mut rest: Vec<(f64, Option<u8>, i64, &str)> = Vec::new();
    for a in agents.iter().copied().filter(|a| *a != root) {
        // The agent's first point: the one no point of its own names as upstream.
        let head = points
            .iter()
            .rposition(|q| q.agent == a && q.scope == Scope::Path && period_of(q) == Some(t))?;
        let (got, of) = shared_counts(&points[head].batches, &sent.batches);
        if of == 0 {
            return None;
        }
        let trail = trail_ns(&sent.batches, &points[head].batches).unwrap_or(0);
        rest.push((got as f64 / of as f64, points[head].ttl, trail, a));
    }
    // An unknown TTL sorts after every known one.
    rest.sort_by(|x, y| {
        y.0.total_cmp(&x.0).then(y.1.cmp(&x.1)).then(x.2.cmp(&y.2)).then(x.3.cmp(y.3))
    });
    Some(std::iter::once(root).chain(rest.into_iter().map(|(_, _, _, a)| a)).collect())
}

/// What `down` counted of the periods both `down` and `up` counted, and what `up` counted of
/// them.
fn shared_counts(down: &[Batch], up: &[Batch]) -> (u64, u64) {
    let (d, u) = (crate::link::by_period(down), crate::link::by_period(up));
    d.iter()
        .filter_map(|(k, n)| u.get(k).map(|m| (n.packets, m.packets)))
        .fold((0, 0), |(a, b), (n, m)| (a.saturating_add(n), b.saturating_add(m)))
}

/// The point of `agent` furthest down the flow's path: the one no other point of the agent
/// names as its upstream.
fn last_of(points: &[PointRecords], agent: &str) -> Option<usize> {
    downstream_first(points, agent).next()
}

/// `agent`'s points, each followed by the one upstream of it there, starting from the one
/// furthest down; then any others.
fn downstream_first<'a>(
    points: &'a [PointRecords],
    agent: &'a str,
) -> impl Iterator<Item = usize> + 'a {
    let mine: Vec<usize> = (0..points.len()).filter(|&q| points[q].agent == agent).collect();
    let named = |q: usize| {
        mine.iter().any(|&o| points[o].upstream.as_deref() == Some(points[q].point.as_str()))
    };
    let mut order: Vec<usize> = mine.iter().copied().filter(|&q| !named(q)).collect();
    let mut k = 0;
    while let Some(&q) = order.get(k) {
        let up = points[q].upstream.as_deref();
        if let Some(&j) = mine.iter().find(|&&j| Some(points[j].point.as_str()) == up) {
            if !order.contains(&j) {
                order.push(j);
            }
        }
        k += 1;
    }
    for q in mine {
        if !order.contains(&q) {
            order.push(q);
        }
    }
    order.into_iter()
}

/// Whether `batches` (in order of first packet) are plainly every batch the point closed, though
/// each lost something (a point that reports only lossy batches then reported them all): the
/// colours alternate and each batch begins within half the longer of the two after the one
/// before ended. A batch left out would show as two of one colour in a row or as a gap as long
/// as a batch.
pub fn unbroken(batches: &[Batch]) -> bool {
    batches.len() >= 2
        && batches.windows(2).all(|w| {
            let (a, b) = (&w[0], &w[1]);
            let longer =
                a.last_ns.saturating_sub(a.first_ns).max(b.last_ns.saturating_sub(b.first_ns));
            a.color != b.color
                && b.first_ns >= a.first_ns
                && b.first_ns.saturating_sub(a.last_ns) <= longer / 2
        })
}

/// How long `down`'s batches trail `up`'s: the median, over `down`'s batches that begin
/// within half a batch of one of `up`'s of the same color, of the time between the two
/// beginnings (`None`: no such pair). Positive when `up` is upstream.
pub fn trail_ns(up: &[Batch], down: &[Batch]) -> Option<i64> {
    let mut t: Vec<i64> = down
        .iter()
        .filter_map(|d| {
            let half = (d.last_ns.saturating_sub(d.first_ns) / 2).max(1);
            let lo = up.partition_point(|u| u.first_ns < d.first_ns.saturating_sub(half));
            up[lo..]
                .iter()
                .take_while(|u| u.first_ns <= d.first_ns.saturating_add(half))
                .filter(|u| u.color == d.color)
                .map(|u| d.first_ns as i64 - u.first_ns as i64)
                .min_by_key(|t| t.unsigned_abs())
        })
        .collect();
    t.sort_unstable();
    t.get(t.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::Period;

    /// Periods of 50 ms with packets every 8 ms: all of them are unbroken; leaving one out, or
    /// two in a row, is seen.
    #[test]
    fn a_stream_of_batches_is_unbroken_until_one_is_left_out() {
        let period = |k: u64| Batch {
            color: (k % 2) as u8,
            first_ns: k * 50_000_000 + 1_000_000,
            last_ns: k * 50_000_000 + 49_000_000,
            observed: 6,
            ..Batch::default()
        };
        let all: Vec<Batch> = (0..10).map(period).collect();
        assert!(unbroken(&all));
        let one_out: Vec<Batch> = (0..10).filter(|k| *k != 4).map(period).collect();
        assert!(!unbroken(&one_out));
        let two_out: Vec<Batch> = (0..10).filter(|k| *k != 4 && *k != 5).map(period).collect();
        assert!(!unbroken(&two_out));
        assert!(!unbroken(&all[..1]), "one batch says nothing");
    }

    /// A chain of `hops` agents, each with an ingress and an egress point, that the first one
    /// marks (its ingress measures against its marker); `lose(hop, i)` says whether packet
    /// `i` is lost on the link into agent `hop`. Every hop adds 50 µs. `every` makes each
    /// point report every batch. Returns the points' records and each link's true loss.
    fn chain(
        hops: usize,
        sent: u64,
        b: u64,
        every: bool,
        lose: impl Fn(usize, u64) -> bool,
    ) -> (Vec<PointRecords>, Vec<u64>) {
        let mut pts = Vec::new();
        let mut truth = vec![0; hops];
        let mut alive: Vec<bool> = vec![true; sent as usize];
        for (h, lost_here) in truth.iter_mut().enumerate() {
            for (i, a) in alive.iter_mut().enumerate() {
                if *a && h > 0 && lose(h, i as u64) {
                    *a = false;
                    *lost_here += 1;
                }
            }
            for point in ["ingress", "egress"] {
                let delay = (2 * h as u64 + u64::from(point == "egress")) * 50_000;
                let mut batches: Vec<Batch> = Vec::new();
                for i in (0..sent).filter(|i| alive[*i as usize]) {
                    let (color, t) = (((i / b) % 2) as u8, 1_000_000 + i * 100_000 + delay);
                    match batches.last_mut() {
                        Some(x) if x.color == color => {
                            x.observed += 1;
                            x.last_ns = t;
                        }
                        _ => batches.push(Batch {
                            color,
                            first_ns: t,
                            last_ns: t,
                            observed: 1,
                            ..Batch::default()
                        }),
                    }
                }
                // Against B at a path point; against the ingress (which lost nothing more) at
                // an egress; against the marker at the first ingress.
                let path = h > 0 && point == "ingress";
                let lost: u64 = if path { batches.iter().map(|x| b - x.observed).sum() } else { 0 };
                let lossy = batches.iter().filter(|x| path && x.observed < b).count() as u64;
                let batches: Vec<Batch> = if every {
                    batches
                } else {
                    batches.into_iter().filter(|x| path && x.observed < b).collect()
                };
                if batches.is_empty() {
                    continue; // reports only lossy batches and had none
                }
                pts.push(PointRecords {
                    agent: format!("s{}", h + 1),
                    point: point.into(),
                    port: "p".into(),
                    upstream: match (h, point) {
                        (_, "egress") => Some("ingress".into()),
                        (0, _) => Some("marker".into()),
                        _ => None,
                    },
                    scope: if path { Scope::Path } else { Scope::Segment },
                    batches,
                    ended: true,
                    expected: 0,
                    lost,
                    uncertain: 0,
                    lossy_batches: lossy,
                    every_batch: every,
                    drops: Default::default(),
                    ttl: None,
                    own_colour: 0,
                });
            }
        }
        (pts, truth)
    }

    fn lost_into(segs: &[Segment], agent: &str) -> u64 {
        segs.iter().filter(|s| s.agent == agent && s.point == "ingress").map(|s| s.lost).sum()
    }

    #[test]
    fn loss_on_any_link_of_a_chain_is_counted_once_on_that_link() {
        // Three and four switches; loss on the first link, the last, every one.
        for hops in [3, 4] {
            for every in [true, false] {
                for which in 0..3 {
                    let lose = |h: usize, i: u64| match which {
                        0 => h == 1 && i % 29 == 3,
                        1 => h == hops - 1 && i % 31 == 7,
                        _ => (i + h as u64 * 7).is_multiple_of(23),
                    };
                    let (pts, truth) = chain(hops, 5000, 100, every, lose);
                    let segs = segments(&pts);
                    for (h, truth_h) in truth.iter().enumerate().skip(1) {
                        let agent = format!("s{}", h + 1);
                        assert_eq!(
                            lost_into(&segs, &agent),
                            *truth_h,
                            "{hops} hops, every {every}, case {which}: link into {agent}"
                        );
                        // Named by the upstream agent's last point (with every batch
                        // reported; otherwise by its last point that reported one).
                        let s = segs.iter().find(|s| s.agent == agent && s.point == "ingress");
                        if let (true, Some(s)) = (every, s) {
                            assert_eq!(s.from.as_deref(), Some(format!("s{h}/egress").as_str()));
                        }
                    }
                    let total: u64 = segs.iter().map(|s| s.lost).sum();
                    assert_eq!(total, truth.iter().sum::<u64>());
                    assert_eq!(path_loss(&pts).0, total);
                }
            }
        }
    }

    #[test]
    fn a_named_upstream_wins_and_an_unknown_one_leaves_the_path_loss() {
        let (mut pts, truth) = chain(3, 3000, 100, true, |h, i| h == 1 && i % 17 == 0);
        // s3 names s2's egress; s2 names an agent that did not report.
        for p in pts.iter_mut().filter(|p| p.scope == Scope::Path) {
            p.upstream = Some(if p.agent == "s3" { "s2/egress" } else { "s9/egress" }.into());
        }
        let segs = segments(&pts);
        let into = |a: &str| segs.iter().find(|s| s.agent == a && s.point == "ingress").cloned();
        let s2 = into("s2").unwrap();
        assert_eq!(
            (s2.method, s2.lost, s2.from.as_deref()),
            (Method::FromMarking, truth[1], Some("s9/egress"))
        );
        let s3 = into("s3").unwrap();
        assert_eq!((s3.method, s3.lost), (Method::LinedUp, 0));
    }

    /// Host mode: a flow marked at `hosts[0]`'s tap crosses the hosts in order, each with an
    /// ingress point (`in:eth0`, but `mark:tap` at the first, not reported) and an egress
    /// point (`out:eth0`, or `out:tap` at the last), counting periods of 100 ms. `lose(h, k)`
    /// packets of period k are lost on the wire into host h. Each point dates its batches by
    /// `clock(h)` off the marker's clock (the kernel's tick, a host's clock error); the
    /// wire's delay is 50 µs, far inside either.
    fn hosts(
        hosts: &[&str],
        clock: impl Fn(usize) -> i64,
        lose: impl Fn(usize, u64) -> u64,
    ) -> (Vec<PointRecords>, Vec<u64>) {
        const T: u64 = 100_000_000;
        let k0 = 17_000_000_000u64;
        let mut truth = vec![0; hosts.len()];
        let mut sent: Vec<u64> = vec![100; 50];
        let mut pts = Vec::new();
        for (h, name) in hosts.iter().enumerate() {
            if h > 0 {
                for (k, n) in sent.iter_mut().enumerate() {
                    let l = lose(h, k as u64).min(*n);
                    *n -= l;
                    truth[h] += l;
                }
            }
            let batches: Vec<Batch> = sent
                .iter()
                .enumerate()
                .map(|(k, n)| {
                    let k = k0 + k as u64;
                    let first = (k * T + 1_000_000 + h as u64 * 50_000) as i64 + clock(h);
                    Batch {
                        color: (k % 2) as u8,
                        first_ns: first as u64,
                        last_ns: first as u64 + 95_000_000,
                        observed: *n,
                        boot: 1,
                        period: Some(Period { length_ns: T, number: k }),
                        ..Batch::default()
                    }
                })
                .collect();
            let last = h + 1 == hosts.len();
            let rec = |point: &str, upstream: Option<&str>, scope| PointRecords {
                agent: name.to_string(),
                point: point.into(),
                port: point.into(),
                upstream: upstream.map(String::from),
                scope,
                batches: batches.clone(),
                ended: true,
                every_batch: true,
                ..PointRecords::default()
            };
            let out = if last { "out:tap" } else { "out:eth0" };
            if h == 0 {
                pts.push(rec(out, Some("mark:tap"), Scope::Segment));
            } else {
                pts.push(rec("in:eth0", None, Scope::Path));
                pts.push(rec(out, Some("in:eth0"), Scope::Segment));
            }
        }
        (pts, truth)
    }

    #[test]
    fn hosts_line_up_by_period_in_either_direction_whatever_their_clocks() {
        // A→B and B→A; the downstream host's batches dated 600 µs before the upstream's, or
        // after, or 30 ms off (clocks a guard apart): the wire's loss, exactly, and 0 when it
        // lost nothing.
        for pair in [["a", "b"], ["b", "a"]] {
            for skew in [-600_000i64, 600_000, -30_000_000, 30_000_000] {
                for lossy in [true, false] {
                    let lose = |_h: usize, k: u64| u64::from(lossy && k % 7 == 2);
                    let (pts, truth) = hosts(&pair, |h| if h == 1 { skew } else { 0 }, lose);
                    let segs = segments(&pts);
                    let wire = segs.iter().find(|s| s.agent == pair[1] && s.point == "in:eth0");
                    let wire = wire.expect("a cross-host segment");
                    let what = format!("{pair:?}, skew {skew}, lossy {lossy}");
                    assert_eq!(wire.method, Method::LinedUp, "{what}");
                    assert_eq!(
                        wire.from.as_deref(),
                        Some(format!("{}/out:eth0", pair[0]).as_str())
                    );
                    assert_eq!(wire.lost, truth[1], "{what}");
                    assert_eq!(segs.iter().map(|s| s.lost).sum::<u64>(), truth[1], "{what}");
                }
            }
        }
    }

    #[test]
    fn three_hosts_are_ordered_by_what_they_counted_not_by_their_clocks() {
        // Loss on the second wire only, or on both; c's clock behind a's and b's by more than
        // the wires' delay, so time alone would order them wrong. (Loss on the first wire
        // only leaves b and c with the same counts: then their TTLs tell, next test.)
        for case in [0, 2] {
            let lose = |h: usize, k: u64| match case {
                0 => u64::from(h == 2 && k % 5 == 1),
                _ => u64::from(k % 5 == h as u64),
            };
            let (pts, truth) = hosts(&["a", "b", "c"], |h| -(h as i64) * 2_000_000, lose);
            let segs = segments(&pts);
            for (h, name) in ["a", "b", "c"].iter().enumerate().skip(1) {
                let s = segs.iter().find(|s| s.agent == *name && s.point == "in:eth0").unwrap();
                assert_eq!(s.lost, truth[h], "case {case}: the wire into {name}");
                let before = ["a", "b", "c"][h - 1];
                assert_eq!(s.from.as_deref(), Some(format!("{before}/out:eth0").as_str()));
            }
        }
    }

    #[test]
    fn hosts_that_counted_alike_are_ordered_by_their_ttl() {
        // Loss on the first wire only: b and c count the same, c's clock is behind by more
        // than the wires' delay (time alone puts c first), and the TTL each saw (one less at
        // each routed hop) says b comes first: the loss is the wire's into b.
        let lose = |h: usize, k: u64| u64::from(h == 1 && k % 5 == 1);
        let (mut pts, truth) = hosts(&["a", "b", "c"], |h| -(h as i64) * 2_000_000, lose);
        for p in &mut pts {
            let hop = ["a", "b", "c"].iter().position(|a| *a == p.agent).unwrap() as u8;
            p.ttl = Some(64 - 2 * hop);
        }
        let segs = segments(&pts);
        for (h, name) in ["a", "b", "c"].iter().enumerate().skip(1) {
            let s = segs.iter().find(|s| s.agent == *name && s.point == "in:eth0").unwrap();
            let before = ["a", "b", "c"][h - 1];
            assert_eq!(s.from.as_deref(), Some(format!("{before}/out:eth0").as_str()));
            assert_eq!(s.lost, truth[h], "the wire into {name}");
        }
        assert!(truth[1] > 0 && truth[2] == 0);
    }

    #[test]
    fn trail_is_positive_downstream_and_absent_without_common_batches() {
        let (pts, _) = chain(2, 2000, 100, true, |_, _| false);
        let (a, b) = (&pts[1].batches, &pts[2].batches); // s1 egress, s2 ingress
        assert_eq!(trail_ns(a, b), Some(50_000));
        assert_eq!(trail_ns(b, a), Some(-50_000));
        assert_eq!(trail_ns(&a[..2], &b[10..]), None);
    }
}
