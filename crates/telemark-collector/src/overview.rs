//! The overview: loss over time at every segment of every flow together, for the console's
//! first view (`GET /api/v1/overview`, docs/console.md).
//!
//! A segment here is where a loss record is measured: an agent's point, measured from its
//! `upstream` point, with scope `path` from the switch that marked the flow, or with scope
//! `link` from another agent's point (settled by the collector, `crate::settle`). Both stores
//! sum their loss records per segment and time bucket ([`OverviewRow`]); the rule that turns
//! those sums into the answer, the `top` segments that lost most and the rest summed as
//! "other", is written once, here ([`overview_of`]).

use serde::Serialize;
use std::collections::BTreeMap;

/// What a segment's figures cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentScope {
    /// From the point named `upstream`, in the same agent (records' scope `segment`).
    Segment,
    /// From the switch that marked the flow (records' scope `path`).
    Path,
    /// From another agent's point, `upstream` as `agent/point`: lined up by the collector
    /// (`crate::settle`).
    Link,
}

impl SegmentScope {
    /// From its name in the store.
    pub fn of(s: &str) -> SegmentScope {
        match s {
            "path" => SegmentScope::Path,
            crate::rollup::LINK_SCOPE => SegmentScope::Link,
            _ => SegmentScope::Segment,
        }
    }
}

/// Where the sums come from, by the bucket asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverviewSource {
    /// The loss records themselves (buckets shorter than an hour, or not whole hours).
    Batches,
    /// The sums per segment and hour (`segment_hours`, `crate::rollup`): buckets of whole
    /// hours; the window's first and last hours count whole.
    HourlySums,
}

impl OverviewSource {
    /// The source for buckets of `bucket_ns`.
    pub fn for_bucket(bucket_ns: u64) -> OverviewSource {
        if bucket_ns >= HOUR_NS && bucket_ns.is_multiple_of(HOUR_NS) {
            OverviewSource::HourlySums
        } else {
            OverviewSource::Batches
        }
    }
}

pub use crate::rollup::HOUR_NS;

/// What to sum: loss records in `window`, in buckets of `bucket_ns`, of one agent and one IP
/// protocol if given.
#[derive(Debug, Clone)]
pub struct OverviewQuery {
    /// The window.
    pub window: crate::store::Window,
    /// Bucket length (ns), positive.
    pub bucket_ns: u64,
    /// Only this agent's points.
    pub agent: Option<String>,
    /// Only flows of this IP protocol.
    pub proto: Option<u8>,
}

impl OverviewQuery {
    /// Where the sums come from.
    pub fn source(&self) -> OverviewSource {
        OverviewSource::for_bucket(self.bucket_ns)
    }

    /// The hours (since the epoch) the window touches, first and last included.
    pub fn hours(&self) -> (u64, u64) {
        (self.window.from_ns / HOUR_NS, self.window.to_ns.saturating_sub(1) / HOUR_NS)
    }
}

/// One segment's sums in one bucket, as a store reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct OverviewRow {
    /// The agent that measured.
    pub agent: String,
    /// Its point.
    pub point: String,
    /// The point the segment starts at (scope `segment`), if any.
    pub upstream: Option<String>,
    /// What the figures cover.
    pub scope: SegmentScope,
    /// The bucket's start (ns).
    pub t_ns: u64,
    /// The sums.
    pub sums: Sums,
}

/// Sums of loss records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Sums {
    /// Batches stored.
    pub batches: u64,
    /// Of them, with packets lost (as in the hourly sums and the metrics).
    pub lossy_batches: u64,
    /// Packets the segment's start counted (measured).
    pub expected: u64,
    /// Packets lost.
    pub lost: u64,
    /// Packets whose loss is uncertain.
    pub uncertain: u64,
}

impl Sums {
    fn add(&mut self, o: &Sums) {
        self.batches = self.batches.saturating_add(o.batches);
        self.lossy_batches = self.lossy_batches.saturating_add(o.lossy_batches);
        self.expected = self.expected.saturating_add(o.expected);
        self.lost = self.lost.saturating_add(o.lost);
        self.uncertain = self.uncertain.saturating_add(o.uncertain);
    }
}

/// One bucket of a series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bucket {
    /// Start (ns).
    pub t_ns: u64,
    /// Its sums.
    #[serde(flatten)]
    pub sums: Sums,
}

/// One segment's loss over time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SegmentSeries {
    /// The agent that measured.
    pub agent: String,
    /// Its point.
    pub point: String,
    /// The point the segment starts at, if any.
    pub upstream: Option<String>,
    /// `path`: measured from the marking switch.
    pub scope: SegmentScope,
    /// Over the whole window.
    pub total: Sums,
    /// Buckets with records, oldest first.
    pub buckets: Vec<Bucket>,
}

/// The rest, summed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Other {
    /// How many segments.
    pub segments: usize,
    /// Over the whole window.
    pub total: Sums,
    /// Buckets with records, oldest first.
    pub buckets: Vec<Bucket>,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Overview {
    /// Bucket length (ns).
    pub bucket_ns: u64,
    /// What the sums were read from.
    pub source: OverviewSource,
    /// Every segment over the whole window.
    pub total: Sums,
    /// The segments that lost most (then had most uncertain, then measured most), at most
    /// `top`.
    pub segments: Vec<SegmentSeries>,
    /// The others, if any.
    pub other: Option<Other>,
}

/// The overview from a store's rows: segments ranked by packets lost, then uncertain, then
/// measured, in the window; the first `top` with their series, the rest summed as "other".
pub fn overview_of(
    rows: Vec<OverviewRow>,
    bucket_ns: u64,
    source: OverviewSource,
    top: usize,
) -> Overview {
    type Key = (String, String, Option<String>, SegmentScope);
    let mut by_segment: BTreeMap<Key, (Sums, BTreeMap<u64, Sums>)> = BTreeMap::new();
    let mut total = Sums::default();
    for r in rows {
        total.add(&r.sums);
        let e = by_segment.entry((r.agent, r.point, r.upstream, r.scope)).or_default();
        e.0.add(&r.sums);
        e.1.entry(r.t_ns).or_default().add(&r.sums);
    }
    let mut ranked: Vec<_> = by_segment.into_iter().collect();
    // Stable, so ties keep the segments' name order.
    ranked.sort_by(|a, b| {
        let (x, y) = (&a.1 .0, &b.1 .0);
        (y.lost, y.uncertain, y.expected).cmp(&(x.lost, x.uncertain, x.expected))
    });
    let buckets = |m: BTreeMap<u64, Sums>| -> Vec<Bucket> {
        m.into_iter().map(|(t_ns, sums)| Bucket { t_ns, sums }).collect()
    };
    let rest = ranked.split_off(top.min(ranked.len()));
    let segments = ranked
        .into_iter()
        .map(|((agent, point, upstream, scope), (total, series))| SegmentSeries {
            agent,
            point,
            upstream,
            scope,
            total,
            buckets: buckets(series),
        })
        .collect();
    let other = (!rest.is_empty()).then(|| {
        let mut total = Sums::default();
        let mut series: BTreeMap<u64, Sums> = BTreeMap::new();
        let segments = rest.len();
        for (_, (t, s)) in rest {
            total.add(&t);
            for (at, sums) in s {
                series.entry(at).or_default().add(&sums);
            }
        }
        Other { segments, total, buckets: buckets(series) }
    });
    Overview { bucket_ns, source, total, segments, other }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(agent: &str, t_ns: u64, lost: u64, expected: u64) -> OverviewRow {
        OverviewRow {
            agent: agent.into(),
            point: "ingress".into(),
            upstream: None,
            scope: SegmentScope::Path,
            t_ns,
            sums: Sums {
                batches: 1,
                lossy_batches: u64::from(lost > 0),
                expected,
                lost,
                uncertain: 0,
            },
        }
    }

    #[test]
    fn the_top_segments_come_first_and_the_rest_is_summed_as_other() {
        let rows = vec![
            row("a", 0, 1, 100),
            row("a", 10, 2, 100),
            row("b", 0, 50, 100),
            row("c", 10, 0, 900),
            row("d", 0, 0, 10),
            row("d", 10, 4, 10),
        ];
        let o = overview_of(rows, 10, OverviewSource::Batches, 2);
        let names: Vec<_> = o.segments.iter().map(|s| s.agent.as_str()).collect();
        assert_eq!(names, ["b", "d"]);
        assert_eq!(o.total.lost, 57);
        assert_eq!(o.total.expected, 1220);
        assert_eq!(o.segments[1].buckets.len(), 2);
        let other = o.other.unwrap();
        // a (3 lost) and c: the others, per bucket.
        assert_eq!(other.segments, 2);
        assert_eq!(other.total.lost, 3);
        assert_eq!(other.total.expected, 1100);
        let b: Vec<_> =
            other.buckets.iter().map(|b| (b.t_ns, b.sums.lost, b.sums.batches)).collect();
        assert_eq!(b, [(0, 1, 1), (10, 2, 2)]);
    }

    #[test]
    fn whole_hours_read_the_hourly_sums() {
        assert_eq!(OverviewSource::for_bucket(60_000_000_000), OverviewSource::Batches);
        assert_eq!(OverviewSource::for_bucket(HOUR_NS), OverviewSource::HourlySums);
        assert_eq!(OverviewSource::for_bucket(6 * HOUR_NS), OverviewSource::HourlySums);
        assert_eq!(OverviewSource::for_bucket(HOUR_NS + 1), OverviewSource::Batches);
    }
}
