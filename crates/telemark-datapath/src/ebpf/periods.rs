//! Reading the kernel's per-period counters (RFC 9341 §3.2: a colour's counters are read once
//! its period and the guard after it have passed, while the other colour is counted).
//!
//! The kernel keeps, per flow, point and colour and per CPU, the period being counted and the
//! one of the same colour before it ([`Slots`]). [`PeriodReader::read`] merges the CPUs' slots
//! by period, reports each period once it is final, and reports packets that arrived after
//! the guard (late) as they appear, until the slot is reused.

use super::maps::{Key, Slots};
use std::collections::HashMap;

/// Time after the guard before a period is read: a program that took its timestamp just
/// before the guard ended may still be adding to the slot on another CPU. Counting points on
/// the tick clock add a tick ([`super::settle_ns`]).
pub const SETTLE_NS: u64 = 1_000_000;

/// One final period of one flow at one point, summed over CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    pub key: Key,
    pub period: u64,
    pub packets: u64,
    pub bytes: u64,
    /// Unix time, nanoseconds.
    pub first_ns: u64,
    pub last_ns: u64,
}

/// What a read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// A period became final.
    Closed(Closed),
    /// `count` more packets of an already reported period arrived after its guard.
    Late { key: Key, period: u64, count: u64 },
}

#[derive(Debug, Clone, Copy, Default)]
struct Reported {
    period: u64,
    late: u64,
    /// Newest packet the key has seen (Unix time).
    seen_ns: u64,
}

/// Turns slot snapshots into final periods; remembers what it reported per key.
#[derive(Debug)]
pub struct PeriodReader {
    period_ns: u64,
    guard_ns: u64,
    settle_ns: u64,
    reported: HashMap<Key, Reported>,
}

impl PeriodReader {
    /// A reader for periods of `period_ns` with a guard of `guard_ns` (< `period_ns`), which
    /// waits [`SETTLE_NS`] after the guard.
    pub fn new(period_ns: u64, guard_ns: u64) -> Self {
        Self::with_settle(period_ns, guard_ns, SETTLE_NS)
    }

    /// The same, waiting `settle_ns` after the guard.
    pub fn with_settle(period_ns: u64, guard_ns: u64, settle_ns: u64) -> Self {
        PeriodReader { period_ns: period_ns.max(1), guard_ns, settle_ns, reported: HashMap::new() }
    }

    /// How long after a period's guard it is read.
    pub fn settle_ns(&self) -> u64 {
        self.settle_ns
    }

    /// The newest period that is final at `now` (its guard and the settling time passed).
    pub fn final_upto(&self, now: u64) -> u64 {
        let t = now.saturating_sub(self.guard_ns + self.settle_ns);
        (t / self.period_ns).saturating_sub(1)
    }

    /// Reads one key's per-CPU slots at `now`, adding what became final to `out`.
    pub fn read(&mut self, now: u64, key: &Key, cpus: &[Slots], out: &mut Vec<Reading>) {
        let upto = self.final_upto(now);
        // At most two periods per CPU: merge by period.
        let mut periods: Vec<(u64, Closed, u64)> = Vec::new();
        for b in cpus.iter().flat_map(|s| [&s.cur, &s.prev]) {
            if b.packets == 0 && b.late == 0 {
                continue;
            }
            let i = match periods.iter().position(|(p, _, _)| *p == b.period) {
                Some(i) => i,
                None => {
                    let c = Closed {
                        key: *key,
                        period: b.period,
                        packets: 0,
                        bytes: 0,
                        first_ns: u64::MAX,
                        last_ns: 0,
                    };
                    periods.push((b.period, c, 0));
                    periods.len() - 1
                }
            };
            let (_, c, late) = &mut periods[i];
            c.packets += b.packets;
            c.bytes += b.bytes;
            if b.packets > 0 {
                c.first_ns = c.first_ns.min(b.first_ns);
                c.last_ns = c.last_ns.max(b.last_ns);
            }
            *late += b.late;
        }
        periods.sort_unstable_by_key(|(p, _, _)| *p);
        let r = self.reported.entry(*key).or_default();
        for (p, c, late) in periods {
            r.seen_ns = r.seen_ns.max(c.last_ns);
            if p > upto {
                continue;
            }
            if p > r.period {
                if c.packets > 0 {
                    out.push(Reading::Closed(c));
                }
                *r = Reported { period: p, late: 0, seen_ns: r.seen_ns };
            }
            if p == r.period && late > r.late {
                out.push(Reading::Late { key: *key, period: p, count: late - r.late });
                r.late = late;
            }
        }
    }

    /// Keys whose newest packet is older than `before` and whose periods are all read:
    /// candidates for deletion from the kernel's map. The caller checks each is still quiet
    /// there ([`PeriodReader::quiet`]), deletes it, and [`PeriodReader::forget`]s it.
    pub fn idle(&self, before: u64, now: u64) -> Vec<Key> {
        let upto = self.final_upto(now);
        self.reported
            .iter()
            .filter(|(_, r)| r.seen_ns < before && r.seen_ns / self.period_ns <= upto)
            .map(|(k, _)| *k)
            .collect()
    }

    /// Whether the kernel's slots of `key` show no packet newer than the last read (a flow
    /// that resumed since must not be deleted under its new packets).
    pub fn quiet(&self, key: &Key, cpus: &[Slots]) -> bool {
        let seen = self.reported.get(key).map_or(0, |r| r.seen_ns);
        cpus.iter().all(|s| s.cur.last_ns <= seen && s.prev.last_ns <= seen)
    }

    /// Forgets a key deleted from the kernel's map.
    pub fn forget(&mut self, key: &Key) {
        self.reported.remove(key);
    }

    /// The keys being tracked.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.reported.keys()
    }

    /// Keys being tracked.
    pub fn len(&self) -> usize {
        self.reported.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.reported.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::maps::Batch;
    use super::*;

    const T: u64 = 100_000_000;
    const G: u64 = 50_000_000;

    fn batch(period: u64, packets: u64, late: u64) -> Batch {
        Batch {
            period,
            packets,
            bytes: packets * 100,
            first_ns: period * T + 10,
            last_ns: period * T + 90,
            late,
        }
    }

    fn closed(out: &[Reading]) -> Vec<(u64, u64)> {
        out.iter()
            .filter_map(|r| match r {
                Reading::Closed(c) => Some((c.period, c.packets)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_period_is_read_once_after_its_guard_summed_over_cpus() {
        let mut r = PeriodReader::new(T, G);
        let k = Key { colour: 0, ..Key::default() };
        let cpus = [
            Slots { cur: batch(10, 3, 0), prev: batch(8, 5, 0) },
            Slots { cur: batch(10, 4, 0), prev: Batch::default() },
        ];
        let mut out = Vec::new();
        // In period 11 before the guard: period 10 is not final yet; 8 is.
        r.read(11 * T + G / 2, &k, &cpus, &mut out);
        assert_eq!(closed(&out), vec![(8, 5)]);
        out.clear();
        r.read(11 * T + G + SETTLE_NS + 1, &k, &cpus, &mut out);
        assert_eq!(closed(&out), vec![(10, 7)]);
        out.clear();
        r.read(11 * T + G + 2 * SETTLE_NS, &k, &cpus, &mut out);
        assert!(out.is_empty(), "reported twice: {out:?}");
    }

    #[test]
    fn late_packets_are_reported_as_they_come_for_the_period_they_belong_to() {
        let mut r = PeriodReader::new(T, G);
        let k = Key::default();
        let mut out = Vec::new();
        let now = 11 * T + G + SETTLE_NS + 1;
        r.read(now, &k, &[Slots { cur: batch(10, 7, 0), prev: Batch::default() }], &mut out);
        out.clear();
        r.read(now + 1, &k, &[Slots { cur: batch(10, 7, 2), prev: Batch::default() }], &mut out);
        assert_eq!(out, vec![Reading::Late { key: k, period: 10, count: 2 }]);
        out.clear();
        r.read(now + 2, &k, &[Slots { cur: batch(10, 7, 3), prev: Batch::default() }], &mut out);
        assert_eq!(out, vec![Reading::Late { key: k, period: 10, count: 1 }]);
    }

    #[test]
    fn idle_keys_are_released_only_once_everything_is_read() {
        let mut r = PeriodReader::new(T, G);
        let k = Key::default();
        let mut out = Vec::new();
        r.read(10 * T + 1, &k, &[Slots { cur: batch(10, 1, 0), prev: Batch::default() }], &mut out);
        assert!(r.idle(20 * T, 10 * T + 2).is_empty(), "period 10 is not read yet");
        let cpus = [Slots { cur: batch(10, 1, 0), prev: Batch::default() }];
        r.read(12 * T, &k, &cpus, &mut out);
        assert_eq!(r.idle(20 * T, 12 * T), vec![k]);
        assert!(r.quiet(&k, &cpus));
        let resumed = [Slots { cur: batch(12, 1, 0), prev: batch(10, 1, 0) }];
        assert!(!r.quiet(&k, &resumed), "a packet since the last read");
        r.forget(&k);
        assert!(r.is_empty());
    }
}
