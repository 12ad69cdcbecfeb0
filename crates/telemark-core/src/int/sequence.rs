//! Reports lost between a switch and the collector, from the sequence numbers of its report
//! datagrams (Telemetry Report v2.0 §3.2: per node and hardware ID, 22 bits, wrapping).
//!
//! Each (node, hardware ID) keeps a window of the last [`WINDOW`] sequence numbers. A number
//! is counted lost only when the window moves past it unseen, so reports that arrive out of
//! order within the window are not loss, duplicates are counted apart, and the lost counter
//! only grows. Numbers inside the window not seen yet are `missing`: loss unless they still
//! come. A number far behind the window many times in a row means the sender restarted its
//! count: the window starts again there.
//!
//! Sequence numbers are not authenticated (TR v2.0 has no integrity field), so what one
//! datagram can do is bounded: a jump ahead by more than [`Limits::max_gap`] numbers is not
//! read as that many lost reports but as a jump (counted; the window starts again at the new
//! number), and at most [`Limits::max_nodes`] (node, hardware ID) pairs are followed: a new
//! pair takes the place of the one idle longest only if that one has been idle for
//! [`Limits::idle_ns`]; otherwise the new pair is refused and counted, and the pairs followed
//! keep their windows and counters.

use std::collections::HashMap;

/// Sequence numbers a window spans.
pub const WINDOW: u32 = 1024;
/// Most (node, hardware ID) pairs followed, by default.
pub const MAX_NODES: usize = 4096;
/// Largest jump ahead read as lost reports, by default.
pub const MAX_GAP: u32 = 65_536;
/// Idle time after which a pair may give its place to a new one, by default (10 minutes).
pub const IDLE_NS: u64 = 600_000_000_000;

/// Bounds on what the windows take from datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most (node, hardware ID) pairs followed.
    pub max_nodes: usize,
    /// Largest jump ahead (in sequence numbers) counted as lost reports; a longer one is a
    /// jump: counted apart, the window starts again there.
    pub max_gap: u32,
    /// Nanoseconds a pair must have been silent before a new pair may take its place.
    pub idle_ns: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_nodes: MAX_NODES, max_gap: MAX_GAP, idle_ns: IDLE_NS }
    }
}
/// Datagrams behind the window in a row that mean the sender started counting again.
const RESTART_AFTER: u32 = 64;

/// One datagram's sequence number, as a collector saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Reporting node.
    pub node: u32,
    /// Hardware ID.
    pub hw_id: u8,
    /// Sequence number.
    pub seq: u32,
    /// Width of the sequence field in bits (22 in v2.0, 16 in CableLabs' dialect, 32 before).
    pub bits: u8,
    /// When it arrived (nanoseconds; only compared with other arrivals).
    pub time: u64,
}

/// One (node, hardware ID)'s window and counters. The window is a ring of bits indexed by
/// the sequence number modulo [`WINDOW`] (every field width is a multiple of it), so moving it
/// by one number costs one bit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSeq {
    /// Lowest sequence number in the window.
    base: u32,
    /// Which numbers of the window were seen, by number modulo WINDOW.
    seen: [u64; (WINDOW / 64) as usize],
    /// Highest position (from `base`) seen.
    top: u32,
    behind_run: u32,
    /// Datagrams received (each sequence number once).
    pub received: u64,
    /// Sequence numbers the window moved past unseen.
    pub lost: u64,
    /// Datagrams whose number was seen already.
    pub duplicates: u64,
    /// Datagrams that came after their number was counted lost.
    pub late: u64,
    /// Times the sender started counting again.
    pub restarts: u64,
    /// Jumps ahead longer than the limit (not counted as loss).
    pub jumps: u64,
    /// Last arrival.
    last: u64,
}

impl NodeSeq {
    fn new(seq: u32) -> NodeSeq {
        let mut n = NodeSeq {
            base: seq,
            seen: [0; (WINDOW / 64) as usize],
            top: 0,
            behind_run: 0,
            received: 1,
            lost: 0,
            duplicates: 0,
            late: 0,
            restarts: 0,
            jumps: 0,
            last: 0,
        };
        n.set(seq);
        n
    }

    fn bit(seq: u32) -> (usize, u64) {
        let i = seq % WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    fn is_set(&self, seq: u32) -> bool {
        let (w, b) = Self::bit(seq);
        self.seen[w] & b != 0
    }

    fn set(&mut self, seq: u32) {
        let (w, b) = Self::bit(seq);
        self.seen[w] |= b;
    }

    fn clear(&mut self, seq: u32) {
        let (w, b) = Self::bit(seq);
        self.seen[w] &= !b;
    }

    /// Numbers in the window up to the highest seen that have not arrived (yet).
    pub fn missing(&self) -> u64 {
        let seen = (0..=self.top).filter(|&p| self.is_set(self.base.wrapping_add(p))).count();
        u64::from(self.top + 1) - seen as u64
    }

    fn observe(&mut self, seq: u32, bits: u8, max_gap: u32) {
        // Sequence numbers wrap at a power of two: a mask, not a division.
        let modulus = 1u64 << bits.clamp(10, 32);
        let wrap = |v: u64| (v & (modulus - 1)) as u32;
        let d = u64::from(wrap(u64::from(seq) + modulus - u64::from(self.base)));
        if d < u64::from(WINDOW) {
            self.behind_run = 0;
            if self.is_set(seq) {
                self.duplicates += 1;
            } else {
                self.set(seq);
                self.received += 1;
                self.top = self.top.max(d as u32);
            }
        } else if d < modulus / 2 && d > u64::from(max_gap.max(WINDOW)) {
            // Too far ahead to be believed as loss from one datagram: a jump (a forged or
            // corrupted number, or a sender that started again elsewhere); the window starts
            // again there.
            self.behind_run = 0;
            self.restart_at(seq);
            self.jumps += 1;
        } else if d < modulus / 2 {
            // Ahead of the window: move it so that `seq` is its last number; what leaves it
            // unseen is lost.
            self.behind_run = 0;
            let shift = d - u64::from(WINDOW - 1);
            let leaving = shift.min(u64::from(WINDOW)) as u32;
            for k in 0..leaving {
                let old = wrap(u64::from(self.base) + u64::from(k));
                if !self.is_set(old) {
                    self.lost += 1;
                }
                self.clear(old);
            }
            self.lost += shift.saturating_sub(u64::from(WINDOW));
            self.base = wrap(u64::from(self.base) + shift);
            self.top = WINDOW - 1;
            self.set(seq);
            self.received += 1;
        } else {
            self.late += 1;
            self.behind_run += 1;
            if self.behind_run >= RESTART_AFTER {
                self.restart_at(seq);
                self.restarts += 1;
            }
        }
    }

    /// Starts the window again at `seq` (received), keeping the counters. What the old
    /// window still missed can no longer be told from later numbers: it is lost.
    fn restart_at(&mut self, seq: u32) {
        self.lost += self.missing();
        let fresh = NodeSeq::new(seq);
        (self.base, self.seen, self.top, self.behind_run) = (fresh.base, fresh.seen, fresh.top, 0);
        self.received += 1;
    }
}

/// A hash for (node, hardware ID) keys: one multiply (the keys are not chosen by an attacker
/// who could gain from collisions; the table is bounded by [`MAX_NODES`] anyway).
#[derive(Debug, Default, Clone, Copy)]
pub struct NodeHasher(u64);

impl core::hash::Hasher for NodeHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
}

type NodeMap = HashMap<(u32, u8), usize, core::hash::BuildHasherDefault<NodeHasher>>;

/// The windows of every (node, hardware ID).
#[derive(Debug, Default, Clone)]
pub struct Sequences {
    limits: Limits,
    /// Where each pair's window is in `windows`.
    index: NodeMap,
    windows: Vec<((u32, u8), NodeSeq)>,
    /// The pair seen last and where its window is: a collector mostly hears from the same
    /// switch datagram after datagram, and then needs no lookup.
    last: Option<((u32, u8), usize)>,
    /// Datagrams of new pairs refused because the table was full of pairs not idle.
    pub untracked: u64,
    /// Pairs dropped from a full table for a new one (idle for at least `idle_ns`).
    pub evicted: u64,
    /// A full table had no pair idle enough before this time: no scan until then.
    next_idle: u64,
}

impl Sequences {
    /// Windows bounded by `limits`.
    pub fn new(limits: Limits) -> Sequences {
        Sequences { limits, ..Sequences::default() }
    }

    /// Takes one datagram's sequence number into account.
    pub fn observe(&mut self, o: Observation) {
        let key = (o.node, o.hw_id);
        let at = match self.last {
            Some((k, i)) if k == key => i,
            _ => match self.index.get(&key) {
                Some(&i) => i,
                None => {
                    if self.windows.len() >= self.limits.max_nodes.max(1) && !self.evict(o.time) {
                        self.untracked += 1;
                        return;
                    }
                    let mut n = NodeSeq::new(o.seq);
                    n.last = o.time;
                    self.index.insert(key, self.windows.len());
                    self.windows.push((key, n));
                    self.last = Some((key, self.windows.len() - 1));
                    return;
                }
            },
        };
        self.last = Some((key, at));
        if let Some((_, n)) = self.windows.get_mut(at) {
            n.last = n.last.max(o.time);
            n.observe(o.seq, o.bits, self.limits.max_gap);
        }
    }

    /// Drops the pair idle longest if it has been idle for `idle_ns` at `now`. A full table
    /// of busy pairs is scanned at most once until one of them can be idle enough.
    fn evict(&mut self, now: u64) -> bool {
        if now < self.next_idle {
            return false;
        }
        let Some((at, last)) =
            self.windows.iter().enumerate().map(|(i, (_, n))| (i, n.last)).min_by_key(|x| x.1)
        else {
            return false;
        };
        if now.saturating_sub(last) < self.limits.idle_ns {
            self.next_idle = last.saturating_add(self.limits.idle_ns);
            return false;
        }
        let (gone, _) = self.windows.swap_remove(at);
        self.index.remove(&gone);
        if let Some((moved, _)) = self.windows.get(at) {
            self.index.insert(*moved, at);
        }
        self.last = None;
        self.evicted += 1;
        true
    }

    /// Each (node, hardware ID) followed.
    pub fn nodes(&self) -> impl Iterator<Item = (&(u32, u8), &NodeSeq)> {
        self.windows.iter().map(|(k, n)| (k, n))
    }

    /// Lost in total.
    pub fn lost(&self) -> u64 {
        self.windows.iter().map(|(_, n)| n.lost).sum()
    }

    /// Missing in total (in windows, not arrived yet).
    pub fn missing(&self) -> u64 {
        self.windows.iter().map(|(_, n)| n.missing()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seqs: impl IntoIterator<Item = u32>, bits: u8) -> Sequences {
        let mut s = Sequences::default();
        for seq in seqs {
            s.observe(Observation { node: 1, hw_id: 0, seq, bits, time: 0 });
        }
        s
    }

    fn node(s: &Sequences) -> NodeSeq {
        s.nodes().next().map(|(_, n)| n.clone()).unwrap()
    }

    #[test]
    fn reordering_inside_the_window_is_not_loss() {
        let s = run([10, 11, 14, 13, 15, 12], 22);
        let n = node(&s);
        assert_eq!((n.received, n.lost, n.missing(), n.late), (6, 0, 0, 0));
    }

    #[test]
    fn gaps_become_lost_when_the_window_passes() {
        let s = run((0..3000).filter(|i| i % 10 != 3), 22);
        let n = node(&s);
        // 300 numbers skipped: those the window passed are lost, the rest still missing.
        assert_eq!(n.lost + n.missing(), 300);
        assert!(n.lost >= 190, "{n:?}");
        assert_eq!(n.received, 2700);
        // A duplicate is not a receipt; a number long gone is late, not found.
        let mut s = s;
        s.observe(Observation { node: 1, hw_id: 0, seq: 2999, bits: 22, time: 0 });
        s.observe(Observation { node: 1, hw_id: 0, seq: 3, bits: 22, time: 0 });
        let m = node(&s);
        assert_eq!((m.duplicates, m.late, m.lost), (1, 1, n.lost));
    }

    #[test]
    fn wraps_and_jumps() {
        let top = (1u32 << 22) - 1;
        let s = run([top - 2, top - 1, top, 0, 2], 22);
        assert_eq!(node(&s).missing() + node(&s).lost, 1);
        // An outage of 5,000 reports.
        let s = run([0, 1, 5002], 22);
        assert_eq!(node(&s).lost + node(&s).missing(), 5000);
        // 16-bit sequence numbers (CableLabs) wrap at 65,536.
        let s = run([65_534, 65_535, 0, 1], 16);
        assert_eq!((node(&s).lost, node(&s).missing()), (0, 0));
    }

    #[test]
    fn a_restarted_sender_is_followed_again() {
        let s = run((1_000_000..1_000_100).chain(0..200), 22);
        let n = node(&s);
        assert_eq!(n.restarts, 1);
        assert_eq!(n.lost + n.missing(), 0, "{n:?}");
    }

    #[test]
    fn one_datagram_cannot_fake_millions_lost() {
        // The attack of issue 31: seq 0, then one datagram 2,096,126 ahead.
        let s = run([0, 2_096_126, 2_096_127], 22);
        let n = node(&s);
        assert_eq!((n.lost, n.missing(), n.jumps, n.received), (0, 0, 1, 3), "{n:?}");
        // What the window missed before the jump is lost.
        let s = run([0, 2, 2_096_126], 22);
        assert_eq!((node(&s).lost, node(&s).missing(), node(&s).jumps), (1, 0, 1));
        // An outage inside the limit is still loss.
        let s = run([0, 60_001], 22);
        assert_eq!(node(&s).lost + node(&s).missing(), 60_000);
    }

    #[test]
    fn a_full_table_keeps_its_nodes_and_counts_the_refused() {
        let limits = Limits { max_nodes: 4, max_gap: MAX_GAP, idle_ns: 1_000 };
        let mut s = Sequences::new(limits);
        let o = |node, seq, time| Observation { node, hw_id: 0, seq, bits: 22, time };
        // A real node, then forged ones filling the table.
        s.observe(o(7, 0, 0));
        for (i, node) in (100..110).enumerate() {
            s.observe(o(node, 0, 10 + i as u64));
        }
        s.observe(o(7, 1, 500));
        assert_eq!((s.untracked, s.evicted), (7, 0));
        let n7 = s.nodes().find(|(k, _)| k.0 == 7).map(|(_, n)| n.received);
        assert_eq!(n7, Some(2), "the real node keeps its window");
        // Once idle long enough, the forged ones give way (the real node is busy).
        s.observe(o(7, 2, 1_012));
        s.observe(o(200, 0, 1_013));
        assert_eq!((s.untracked, s.evicted), (7, 1));
        assert!(s.nodes().any(|(k, _)| k.0 == 200) && s.nodes().any(|(k, _)| k.0 == 7));
        // Index and windows stay consistent after the swap.
        for node in [7, 200, 101, 102] {
            s.observe(o(node, 3, 1_014));
        }
        assert_eq!(s.nodes().count(), 4);
        assert_eq!(s.nodes().find(|(k, _)| k.0 == 7).map(|(_, n)| n.received), Some(4));
    }
}
