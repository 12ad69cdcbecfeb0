//! Reports lost between a switch and the collector, from the sequence numbers of its report
//! datagrams (Telemetry Report v2.0 §3.2: per node and hardware ID, 22 bits, wrapping).
//!
//! Each (node, hardware ID) keeps a window of the last [`WINDOW`] sequence numbers. A number
//! is counted lost only when the window moves past it unseen, so reports that arrive out of
//! order within the window are not loss, duplicates are counted apart, and the lost counter
//! only grows. Numbers inside the window not seen yet are `missing`: loss unless they still
//! come. A number far behind the window many times in a row means the sender restarted its
//! count: the window starts again there.

use std::collections::HashMap;

/// Sequence numbers a window spans.
pub const WINDOW: u32 = 1024;
/// Most (node, hardware ID) pairs followed.
pub const MAX_NODES: usize = 4096;
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

    fn observe(&mut self, seq: u32, bits: u8) {
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
                let (received, lost, duplicates, late) =
                    (self.received, self.lost, self.duplicates, self.late);
                let restarts = self.restarts + 1;
                *self = NodeSeq::new(seq);
                (self.received, self.lost, self.duplicates, self.late, self.restarts) =
                    (received + 1, lost, duplicates, late, restarts);
            }
        }
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
    /// Where each pair's window is in `windows`.
    index: NodeMap,
    windows: Vec<((u32, u8), NodeSeq)>,
    /// The pair seen last and where its window is: a collector mostly hears from the same
    /// switch datagram after datagram, and then needs no lookup.
    last: Option<((u32, u8), usize)>,
    /// Datagrams of pairs beyond [`MAX_NODES`], not followed.
    pub untracked: u64,
}

impl Sequences {
    /// Takes one datagram's sequence number into account.
    pub fn observe(&mut self, o: Observation) {
        let key = (o.node, o.hw_id);
        let at = match self.last {
            Some((k, i)) if k == key => i,
            _ => match self.index.get(&key) {
                Some(&i) => i,
                None if self.windows.len() < MAX_NODES => {
                    self.index.insert(key, self.windows.len());
                    self.windows.push((key, NodeSeq::new(o.seq)));
                    self.last = Some((key, self.windows.len() - 1));
                    return;
                }
                None => {
                    self.untracked += 1;
                    return;
                }
            },
        };
        self.last = Some((key, at));
        if let Some((_, n)) = self.windows.get_mut(at) {
            n.observe(o.seq, o.bits);
        }
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
            s.observe(Observation { node: 1, hw_id: 0, seq, bits });
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
        s.observe(Observation { node: 1, hw_id: 0, seq: 2999, bits: 22 });
        s.observe(Observation { node: 1, hw_id: 0, seq: 3, bits: 22 });
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
}
