//! Settling: the loss of segments between two agents, lined up once and stored for the sums.
//!
//! A segment between two agents' points (host mode's wire between two hosts, docs/ebpf.md
//! "Clocks and periods") has its figures in no record: neither agent knows the other's
//! counts. A flow's path lines its marking periods up at query time
//! ([`crate::path::lined_up_by_period`]), but the flows list ranks flows, and the overview
//! draws segments, from sums kept beside the records (`crate::rollup`). So the collector lines
//! those segments up once more, [`SETTLE_AFTER`] after their periods ended (both agents have
//! reported them by then), and stores each flow's segment per second (`link_sums`, a
//! [`LinkSlot`] a row), adding it to the sums with scope `link` and the upstream point as
//! `agent/point`.
//!
//! - **Once.** A slot is settled in one pass and stored under its key; a second pass, a
//!   restart or another collector sharing the database finds the row there and adds nothing.
//! - **What comes later is left out of the sums.** Records that reach the collector more than
//!   [`SETTLE_AFTER`] after their period (an agent's outbox drained after an outage) are in
//!   the flow's path, `/localise` and `/link`, which line periods up when asked, but not in a
//!   slot already settled. A period not yet reported by either end when its slot settles is
//!   unmeasured there, never lost (the rules of `crate::link::match_periods`).
//! - **Bounded.** A pass settles at most [`MAX_SPAN_NS`] (the next follows at once while more
//!   is due); a store never settled (a first start) begins [`FIRST_LOOKBACK_NS`] back.

use crate::path::PointRecords;
use std::time::Duration;
use telemark_core::records::Flow;

/// How long after a period ended its segments are settled.
pub const SETTLE_AFTER: Duration = Duration::from_secs(10);
/// A slot: the sums' grain (a second of the upstream end's clock).
pub const SLOT_NS: u64 = 1_000_000_000;
/// The most one pass settles.
pub const MAX_SPAN_NS: u64 = 10 * SLOT_NS;
/// Where a store that never settled begins.
pub const FIRST_LOOKBACK_NS: u64 = 600 * SLOT_NS;

/// A segment between two agents' points, one flow, one second: the sums of its periods that
/// entered the segment (upstream's first packet) in `[slot_ns, slot_ns + SLOT_NS)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSlot {
    pub flow: Flow,
    /// The downstream point's agent and point.
    pub agent: String,
    pub point: String,
    /// The upstream point, `agent/point`.
    pub upstream: String,
    pub slot_ns: u64,
    /// Periods lined up (measured), and those that lost packets.
    pub periods: u64,
    pub lossy_periods: u64,
    /// Packets upstream sent into the segment, and of them lost.
    pub expected: u64,
    pub lost: u64,
    /// The first and last periods' first packets upstream.
    pub first_ns: u64,
    pub last_ns: u64,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Slots stored.
    pub slots: u64,
    /// More is due now: the next pass need not wait.
    pub behind: bool,
}

/// The span the next pass settles, `[from, to)` in whole slots: from where the last pass
/// ended (`settled`) to [`SETTLE_AFTER`] before `now_ns`, at most [`MAX_SPAN_NS`], and
/// whether more is due after it. `None`: nothing to settle yet.
pub fn span(settled: Option<u64>, now_ns: u64) -> Option<((u64, u64), bool)> {
    let ready = now_ns.saturating_sub(SETTLE_AFTER.as_nanos() as u64) / SLOT_NS * SLOT_NS;
    let from = settled.unwrap_or(0).max(ready.saturating_sub(FIRST_LOOKBACK_NS)).div_ceil(SLOT_NS)
        * SLOT_NS;
    let to = ready.min(from.saturating_add(MAX_SPAN_NS));
    (to > from).then_some(((from, to), to < ready))
}

/// The query of the flows whose marking periods two agents or more counted between the
/// parameters `from` and `to` (first packet), with each one's longest period: `src, dst, sport,
/// dport, proto, spi, si, period_ns`.
pub(crate) fn crossing_flows(from: &str, to: &str) -> String {
    format!(
        "SELECT src, dst, sport, dport, proto, spi, si, MAX(period_ns) FROM loss
         WHERE period_ns > 0 AND first_ns >= {from} AND first_ns < {to}
         GROUP BY src, dst, sport, dport, proto, spi, si HAVING COUNT(DISTINCT agent) >= 2
         ORDER BY src, dst, sport, dport, proto, spi, si"
    )
}

/// What a flow's records are read over to settle `[from_ns, to_ns)`, for marking periods of
/// `period_ns`: a period is judged from the two either side of it, the two ends' clocks may
/// date one period up to a slot apart, and which host is upstream of which is told from what
/// they counted over [`CONTEXT_NS`] more before the span (hosts that counted alike are told
/// apart by time, `crate::path`, which a few batches tell less surely than many).
///
/// The period is a record's word (`period_ns`), so it is held to [`LONGEST_PERIOD_NS`]: a
/// record claiming more cannot make a pass read a flow's whole history.
pub fn read_window(from_ns: u64, to_ns: u64, period_ns: u64) -> (u64, u64) {
    let margin = period_ns.min(LONGEST_PERIOD_NS) * 3 + SLOT_NS;
    (from_ns.saturating_sub(margin + CONTEXT_NS), to_ns.saturating_add(margin))
}

/// The longest marking period [`read_window`] allows for (a minute; the agent's default is
/// 100 ms).
pub const LONGEST_PERIOD_NS: u64 = 60 * SLOT_NS;

/// How much more before a span its flows' records are read (see [`read_window`]).
pub const CONTEXT_NS: u64 = 5 * SLOT_NS;

/// How often the collector settles.
pub const SETTLE_EVERY: Duration = Duration::from_secs(5);

/// `flow`'s segments between agents whose periods entered them in `[from_ns, to_ns)`, per
/// slot, from its points' records read over [`read_window`].
pub fn slots(flow: &Flow, points: &[PointRecords], from_ns: u64, to_ns: u64) -> Vec<LinkSlot> {
    let mut out: Vec<LinkSlot> = Vec::new();
    for i in 0..points.len() {
        let Some((u, periods)) = crate::path::lined_up_by_period(points, i) else { continue };
        let (down, up) = (&points[i], &points[u]);
        let mut at = out.len();
        for b in periods.iter().filter(|b| b.sent_ns >= from_ns && b.sent_ns < to_ns) {
            let slot_ns = b.sent_ns / SLOT_NS * SLOT_NS;
            if out.get(at).is_none_or(|s| s.slot_ns != slot_ns) {
                // Periods come in order, so a slot's are together.
                at = out.len();
                out.push(LinkSlot {
                    flow: flow.clone(),
                    agent: down.agent.clone(),
                    point: down.point.clone(),
                    upstream: up.name(),
                    slot_ns,
                    periods: 0,
                    lossy_periods: 0,
                    expected: 0,
                    lost: 0,
                    first_ns: b.sent_ns,
                    last_ns: b.sent_ns,
                });
            }
            let s = &mut out[at];
            s.periods += 1;
            s.lossy_periods += u64::from(b.lost > 0);
            s.expected = s.expected.saturating_add(b.expected);
            s.lost = s.lost.saturating_add(b.lost);
            s.last_ns = b.sent_ns;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::{Batch, Period};
    use telemark_core::records::Scope;

    const T: u64 = 100_000_000;

    fn flow() -> Flow {
        Flow {
            src: "10.0.0.1".into(),
            dst: "10.0.1.1".into(),
            sport: 7777,
            dport: 7777,
            proto: 17,
            spi: None,
            si: None,
        }
    }

    /// Period `k` of a flow at one point: `n` packets, dated `shift_ns` into the period.
    fn period(k: u64, n: u64, shift_ns: u64, boot: u64) -> Batch {
        Batch {
            color: (k % 2) as u8,
            first_ns: k * T + shift_ns,
            last_ns: k * T + shift_ns + T / 2,
            observed: n,
            boot,
            period: Some(Period { length_ns: T, number: k }),
            ..Batch::default()
        }
    }

    fn point(agent: &str, scope: Scope, batches: Vec<Batch>) -> PointRecords {
        PointRecords {
            agent: agent.into(),
            point: "uplink".into(),
            scope,
            every_batch: true,
            batches,
            ..PointRecords::default()
        }
    }

    /// Host a marks and sends 10 packets a period for 4 s; host b gets them 2 ms later, less
    /// 3 in period 25 and all of period 31.
    fn two_hosts() -> Vec<PointRecords> {
        let k0 = 10_000u64;
        let up = (k0..k0 + 40).map(|k| period(k, 10, 1_000, 1)).collect();
        let down = (k0..k0 + 40)
            .filter(|k| *k != k0 + 31)
            .map(|k| period(k, if k == k0 + 25 { 7 } else { 10 }, 2_001_000, 7))
            .collect();
        vec![point("a", Scope::Segment, up), point("b", Scope::Path, down)]
    }

    #[test]
    fn a_segment_between_hosts_is_settled_per_second_with_its_loss() {
        let flow = flow();
        let s = slots(&flow, &two_hosts(), 0, u64::MAX);
        // Seconds 1000..1003; the last period is not judged (upstream may still report it).
        let per: Vec<_> = s.iter().map(|s| (s.slot_ns / SLOT_NS, s.periods, s.lost)).collect();
        assert_eq!(per, [(1000, 10, 0), (1001, 10, 0), (1002, 10, 3), (1003, 9, 10)]);
        assert!(s.iter().all(|s| s.agent == "b" && s.upstream == "a/uplink"));
        let lossy: Vec<_> = s.iter().map(|s| s.lossy_periods).collect();
        assert_eq!(lossy, [0, 0, 1, 1]);
        assert_eq!((s[2].expected, s[3].expected), (100, 90));
    }

    #[test]
    fn a_span_settles_only_the_periods_that_entered_in_it() {
        let flow = flow();
        let all = two_hosts();
        let s = slots(&flow, &all, 1001 * SLOT_NS, 1003 * SLOT_NS);
        let per: Vec<_> = s.iter().map(|s| s.slot_ns / SLOT_NS).collect();
        assert_eq!(per, [1001, 1002]);
        // Settled in two spans, the same as in one.
        let mut halves = slots(&flow, &all, 0, 1002 * SLOT_NS);
        halves.extend(slots(&flow, &all, 1002 * SLOT_NS, u64::MAX));
        assert_eq!(halves, slots(&flow, &all, 0, u64::MAX));
    }

    #[test]
    fn a_record_claiming_a_huge_period_reads_no_more_than_a_minutes_margin() {
        let (from, to) = (1_000 * SLOT_NS, 1_010 * SLOT_NS);
        let (a, b) = read_window(from, to, u64::MAX);
        assert_eq!(b - to, 3 * LONGEST_PERIOD_NS + SLOT_NS);
        assert_eq!(from - a, 3 * LONGEST_PERIOD_NS + SLOT_NS + CONTEXT_NS);
    }

    #[test]
    fn spans_are_whole_seconds_settle_after_behind_and_bounded() {
        let now = 5_000 * SLOT_NS + 300;
        let ready = 5_000 * SLOT_NS - SETTLE_AFTER.as_nanos() as u64;
        // Never settled: ten minutes back, ten seconds at a time.
        let first = ready - FIRST_LOOKBACK_NS;
        assert_eq!(span(None, now), Some(((first, first + MAX_SPAN_NS), true)));
        assert_eq!(
            span(Some(ready - 3 * SLOT_NS), now),
            Some(((ready - 3 * SLOT_NS, ready), false))
        );
        assert_eq!(span(Some(ready), now), None);
        assert_eq!(span(Some(ready + 5 * SLOT_NS), now), None);
    }
}
