//! A reorderer of bounded depth: each packet is held back by a random 0..=depth positions, so
//! no packet ends up more than `depth` places from where it was.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use telemark_core::rng::Rng;

/// Reorders a stream of items with displacement at most `depth`.
#[derive(Debug)]
pub struct Reorderer<T> {
    depth: u64,
    rng: Rng,
    n: u64,
    heap: BinaryHeap<Reverse<(u64, u64, Slot<T>)>>,
}

#[derive(Debug)]
struct Slot<T>(T);
impl<T> PartialEq for Slot<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<T> Eq for Slot<T> {}
impl<T> PartialOrd for Slot<T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Slot<T> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl<T> Reorderer<T> {
    /// `depth` 0 passes everything through in order.
    pub fn new(depth: u64, seed: u64) -> Self {
        Reorderer { depth, rng: Rng::new(seed), n: 0, heap: BinaryHeap::new() }
    }

    /// Takes one item; appends to `out` every item whose time has come.
    pub fn push(&mut self, v: T, out: &mut Vec<T>) {
        let due = self.n + self.rng.below(self.depth + 1);
        self.heap.push(Reverse((due, self.n, Slot(v))));
        while let Some(Reverse((due, _, _))) = self.heap.peek() {
            if *due > self.n {
                break;
            }
            if let Some(Reverse((_, _, Slot(v)))) = self.heap.pop() {
                out.push(v);
            }
        }
        self.n += 1;
    }

    /// Releases everything held.
    pub fn flush(&mut self, out: &mut Vec<T>) {
        while let Some(Reverse((_, _, Slot(v)))) = self.heap.pop() {
            out.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_displacement_and_nothing_lost() {
        let mut r = Reorderer::new(33, 9);
        let mut out = Vec::new();
        for i in 0..10_000u64 {
            r.push(i, &mut out);
        }
        r.flush(&mut out);
        assert_eq!(out.len(), 10_000);
        let mut moved = 0;
        for (pos, v) in out.iter().enumerate() {
            let d = (pos as i64 - *v as i64).unsigned_abs();
            assert!(d <= 33, "item {v} at {pos}");
            moved += u64::from(d > 0);
        }
        assert!(moved > 5_000, "reordering actually happens: {moved}");
        let mut sorted = out.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10_000).collect::<Vec<_>>());
    }
}
