//! Sums of the loss records, kept beside them so that long windows read few rows.
//!
//! Both stores keep three tables of sums, written in the transaction that stores the
//! records (only records stored for the first time are added, so a redelivery adds nothing):
//!
//! - `flow_hours`: per flow, point and hour of a batch's first packet. The flows list ranks
//!   flows from it, and the edges of a window that does not start or end on a day.
//! - `flow_days`: the same per day (24 times fewer rows): the whole days of a ranking's window.
//! - `segment_hours`: per segment (agent, point, upstream, scope), IP protocol and hour: the
//!   overview in buckets of whole hours, whatever the number of flows.
//!
//! Segments between two agents' points, settled by the collector (`crate::settle`), are
//! added to the three with scope [`LINK_SCOPE`] when their slots are stored.
//!
//! Absent NSH fields and upstreams are stored as -1 and '' (key columns are not NULL).
//! Retention removes a period's sums only once the period is wholly before the cut.

use crate::settle::LinkSlot;
use std::collections::BTreeMap;
use telemark_core::records::{Flow, LossRecord};

/// An hour in nanoseconds.
pub const HOUR_NS: u64 = 3_600_000_000_000;
/// A day in nanoseconds.
pub const DAY_NS: u64 = 24 * HOUR_NS;

/// A row key of `flow_hours` or `flow_days`: the period (hour or day since the epoch), the flow
/// and the point.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FlowPeriod {
    pub agent: String,
    pub period: i64,
    pub src: String,
    pub dst: String,
    pub sport: i32,
    pub dport: i32,
    pub proto: i16,
    pub spi: i64,
    pub si: i16,
    pub point: String,
    pub upstream: String,
    pub scope: &'static str,
}

/// A row key of `segment_hours`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SegmentHour {
    pub agent: String,
    pub hour: i64,
    pub point: String,
    pub upstream: String,
    pub scope: &'static str,
    pub proto: i16,
}

/// What batches add to a row (exact: i128 here; the stores saturate or use NUMERIC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sums {
    pub batches: i64,
    pub lossy_batches: i64,
    pub expected: i128,
    pub lost: i128,
    pub uncertain: i128,
    pub first_ns: i64,
    pub last_ns: i64,
}

impl Default for Sums {
    fn default() -> Sums {
        Sums {
            batches: 0,
            lossy_batches: 0,
            expected: 0,
            lost: 0,
            uncertain: 0,
            first_ns: i64::MAX,
            last_ns: i64::MIN,
        }
    }
}

impl Sums {
    /// A loss record's batch.
    fn of_record(l: &LossRecord) -> Sums {
        Sums {
            batches: 1,
            // A lossy batch is one with a packet lost, as everywhere (not one only uncertain).
            lossy_batches: i64::from(l.lost > 0),
            expected: i128::from(l.expected.unwrap_or(0)),
            lost: i128::from(l.lost),
            uncertain: i128::from(l.uncertain),
            first_ns: i(l.first_ns),
            last_ns: i(l.last_ns),
        }
    }

    /// A settled segment's slot: its periods are its batches.
    fn of_slot(s: &LinkSlot) -> Sums {
        Sums {
            batches: i(s.periods),
            lossy_batches: i(s.lossy_periods),
            expected: i128::from(s.expected),
            lost: i128::from(s.lost),
            uncertain: 0,
            first_ns: i(s.first_ns),
            last_ns: i(s.last_ns),
        }
    }

    fn add(&mut self, o: &Sums) {
        self.batches += o.batches;
        self.lossy_batches += o.lossy_batches;
        self.expected += o.expected;
        self.lost += o.lost;
        self.uncertain += o.uncertain;
        self.first_ns = self.first_ns.min(o.first_ns);
        self.last_ns = self.last_ns.max(o.last_ns);
    }
}

/// The scope of a settled segment's sums (`crate::settle`): between two agents' points, the
/// upstream one named `agent/point`.
pub const LINK_SCOPE: &str = "link";

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// One transaction's additions to the three tables, each row once, in key order (two
/// collectors sharing a database then take the rows' locks in the same order).
#[derive(Debug, Default)]
pub(crate) struct Rollup {
    pub flow_hours: BTreeMap<FlowPeriod, Sums>,
    pub flow_days: BTreeMap<FlowPeriod, Sums>,
    pub segment_hours: BTreeMap<SegmentHour, Sums>,
}

impl Rollup {
    /// Adds a loss record `agent` sent, stored for the first time.
    pub fn add(&mut self, agent: &str, l: &LossRecord) {
        let upstream = l.upstream.clone().unwrap_or_default();
        let at = (agent, l.point.as_str(), upstream, l.scope.as_str());
        self.add_sums(&l.flow, at, l.first_ns, &Sums::of_record(l));
    }

    /// Adds a settled segment's slot, stored for the first time.
    pub fn add_link(&mut self, s: &LinkSlot) {
        let at = (s.agent.as_str(), s.point.as_str(), s.upstream.clone(), LINK_SCOPE);
        self.add_sums(&s.flow, at, s.slot_ns, &Sums::of_slot(s));
    }

    /// Adds `sums` of `f` at `(agent, point, upstream, scope)`, dated `t_ns`, to each table.
    fn add_sums(
        &mut self,
        f: &Flow,
        (agent, point, upstream, scope): (&str, &str, String, &'static str),
        t_ns: u64,
        sums: &Sums,
    ) {
        let hour = i(t_ns / HOUR_NS);
        let key = FlowPeriod {
            agent: agent.to_string(),
            period: hour,
            src: f.src.clone(),
            dst: f.dst.clone(),
            sport: i32::from(f.sport),
            dport: i32::from(f.dport),
            proto: i16::from(f.proto),
            spi: f.spi.map_or(-1, i64::from),
            si: f.si.map_or(-1, i16::from),
            point: point.to_string(),
            upstream,
            scope,
        };
        let segment = SegmentHour {
            agent: agent.to_string(),
            hour,
            point: key.point.clone(),
            upstream: key.upstream.clone(),
            scope: key.scope,
            proto: key.proto,
        };
        self.segment_hours.entry(segment).or_default().add(sums);
        let day = FlowPeriod { period: i(t_ns / DAY_NS), ..key.clone() };
        self.flow_days.entry(day).or_default().add(sums);
        self.flow_hours.entry(key).or_default().add(sums);
    }

    pub fn is_empty(&self) -> bool {
        self.flow_hours.is_empty()
    }
}

/// An inclusive range of hours split for reading: the whole days in it from `flow_days`, the
/// hours before and after them from `flow_hours`. An empty range is `(1, 0)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HourSplit {
    pub days: (i64, i64),
    pub before: (i64, i64),
    pub after: (i64, i64),
}

const EMPTY: (i64, i64) = (1, 0);

/// Splits the hours `first..=last`.
pub(crate) fn split_hours(first: i64, last: i64) -> HourSplit {
    if first > last {
        return HourSplit { days: EMPTY, before: EMPTY, after: EMPTY };
    }
    // The first day that starts at or after `first`, the last that ends at or before `last`.
    let (d0, d1) = ((first + 23).div_euclid(24), (last + 1).div_euclid(24) - 1);
    if d0 > d1 {
        return HourSplit { days: EMPTY, before: (first, last), after: EMPTY };
    }
    let before = if first < d0 * 24 { (first, d0 * 24 - 1) } else { EMPTY };
    let after = if last > d1 * 24 + 23 { (d1 * 24 + 24, last) } else { EMPTY };
    HourSplit { days: (d0, d1), before, after }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every hour of the range is covered once: by its day or by itself.
    fn covered(s: HourSplit) -> Vec<i64> {
        let mut h: Vec<i64> = (s.before.0..=s.before.1).collect();
        h.extend((s.days.0..=s.days.1).flat_map(|d| d * 24..d * 24 + 24));
        h.extend(s.after.0..=s.after.1);
        h.sort();
        h
    }

    #[test]
    fn split_covers_each_hour_once() {
        for first in 0..60 {
            for last in first..130 {
                let s = split_hours(first, last);
                assert_eq!(covered(s), (first..=last).collect::<Vec<_>>(), "{first}..={last}");
            }
        }
        assert_eq!(covered(split_hours(5, 4)), Vec::<i64>::new());
    }

    #[test]
    fn split_reads_whole_days_from_days() {
        let s = split_hours(20, 24 * 9 + 3);
        assert_eq!(s.days, (1, 8));
        assert_eq!(s.before, (20, 23));
        assert_eq!(s.after, (216, 219));
        assert_eq!(split_hours(24, 47), HourSplit { days: (1, 1), before: EMPTY, after: EMPTY });
        assert_eq!(split_hours(25, 46).before, (25, 46));
    }
}
