//! Bounded single-producer/single-consumer ring: the only way state leaves the fast path.
//!
//! A Lamport queue with cached indices (each side re-reads the other's index only when its
//! cached copy says full/empty), burst-friendly like DPDK's `rte_ring` but for one producer and
//! one consumer. A full ring never blocks the producer: `push` hands the item back and the
//! caller counts a telemetry drop (DESIGN.md, "Single writer").

use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[repr(align(64))]
struct Padded<T>(T);

struct Shared<T> {
    buf: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: usize,
    head: Padded<AtomicUsize>, // next slot the consumer reads
    tail: Padded<AtomicUsize>, // next slot the producer writes
}

// SAFETY: a slot is written only by the producer while it is outside [head, tail) and read only
// by the consumer while it is inside; the Release store of `tail` (resp. `head`) publishes the
// write (resp. the release of the slot) to the other side's Acquire load.
unsafe impl<T: Send> Sync for Shared<T> {}
unsafe impl<T: Send> Send for Shared<T> {}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        let (mut h, t) = (*self.head.0.get_mut(), *self.tail.0.get_mut());
        while h != t {
            // SAFETY: slots in [head, tail) hold initialised values no one else can reach now.
            unsafe { (*self.buf[h & self.mask].get()).assume_init_drop() };
            h = h.wrapping_add(1);
        }
    }
}

/// The writing end, owned by the fast path.
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    tail: Cell<usize>,
    cached_head: Cell<usize>,
}

/// The reading end, owned by the aggregator.
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    head: Cell<usize>,
    cached_tail: Cell<usize>,
}

// SAFETY: each end is used by one thread at a time (it is not Sync); moving it is fine.
unsafe impl<T: Send> Send for Producer<T> {}
unsafe impl<T: Send> Send for Consumer<T> {}

/// A ring holding at least `capacity` items (rounded up to a power of two, minimum 2).
pub fn channel<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let cap = capacity.max(2).next_power_of_two();
    let buf = (0..cap).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect();
    let shared = Arc::new(Shared {
        buf,
        mask: cap - 1,
        head: Padded(AtomicUsize::new(0)),
        tail: Padded(AtomicUsize::new(0)),
    });
    (
        Producer { shared: shared.clone(), tail: Cell::new(0), cached_head: Cell::new(0) },
        Consumer { shared, head: Cell::new(0), cached_tail: Cell::new(0) },
    )
}

impl<T> Producer<T> {
    /// Capacity in items.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }

    /// Appends `v`, or gives it back when the ring is full. Never blocks.
    #[inline]
    pub fn push(&self, v: T) -> Result<(), T> {
        let t = self.tail.get();
        if t.wrapping_sub(self.cached_head.get()) > self.shared.mask {
            self.cached_head.set(self.shared.head.0.load(Ordering::Acquire));
            if t.wrapping_sub(self.cached_head.get()) > self.shared.mask {
                return Err(v);
            }
        }
        // SAFETY: slot t is outside [head, tail): the consumer does not touch it.
        unsafe { (*self.shared.buf[t & self.shared.mask].get()).write(v) };
        let t = t.wrapping_add(1);
        self.tail.set(t);
        self.shared.tail.0.store(t, Ordering::Release);
        Ok(())
    }

    /// Hints the CPU to fetch the slots the next `n` pushes will write, so that a producer
    /// that pushes rarely (a slot is reused only once the whole ring has gone round, long
    /// after it left the cache) does not wait for each of them when it does.
    #[inline]
    pub fn prefetch(&self, n: usize) {
        let t = self.tail.get();
        for i in 0..n {
            if let Some(slot) = self.shared.buf.get(t.wrapping_add(i) & self.shared.mask) {
                let first = slot.get().cast::<u8>();
                let last = first.wrapping_add(core::mem::size_of::<T>().saturating_sub(1));
                #[cfg(target_arch = "x86_64")]
                // SAFETY: a prefetch is a hint and never faults; both addresses are within
                // (or, for a zero-sized T, at) a live slot.
                unsafe {
                    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                    _mm_prefetch(first.cast::<i8>(), _MM_HINT_T0);
                    _mm_prefetch(last.cast::<i8>(), _MM_HINT_T0);
                }
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (first, last);
            }
        }
    }
}

impl<T> Consumer<T> {
    /// Takes the oldest item, if any.
    #[inline]
    pub fn pop(&self) -> Option<T> {
        let h = self.head.get();
        if h == self.cached_tail.get() {
            self.cached_tail.set(self.shared.tail.0.load(Ordering::Acquire));
            if h == self.cached_tail.get() {
                return None;
            }
        }
        // SAFETY: slot h is inside [head, tail): initialised by the producer, published by its
        // Release store of tail, and not written again until head moves past it.
        let v = unsafe { (*self.shared.buf[h & self.shared.mask].get()).assume_init_read() };
        let h = h.wrapping_add(1);
        self.head.set(h);
        self.shared.head.0.store(h, Ordering::Release);
        Some(v)
    }

    /// Whether the ring holds nothing (as of now: the producer may push the next moment).
    pub fn is_empty(&self) -> bool {
        self.head.get() == self.shared.tail.0.load(Ordering::Acquire)
    }

    /// Pops everything currently in the ring into `f`; returns how many.
    pub fn drain(&self, mut f: impl FnMut(T)) -> usize {
        let mut n = 0;
        while let Some(v) = self.pop() {
            f(v);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_full() {
        let (p, c) = channel::<u32>(4);
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(9), Err(9));
        assert_eq!(c.pop(), Some(0));
        p.push(4).unwrap();
        let mut got = vec![];
        c.drain(|v| got.push(v));
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert_eq!(c.pop(), None);
    }

    /// The consumer sees a push from another thread without popping, and an empty ring after
    /// taking everything.
    #[test]
    fn is_empty_sees_the_other_threads_push() {
        let (p, c) = channel::<u32>(4);
        assert!(c.is_empty());
        std::thread::spawn(move || p.push(7).unwrap()).join().unwrap();
        assert!(!c.is_empty());
        assert_eq!(c.pop(), Some(7));
        assert!(c.is_empty());
    }

    /// Fetching ahead, further than the ring holds and for zero-sized items, changes nothing
    /// a push or a pop sees.
    #[test]
    fn prefetch_changes_nothing() {
        let (p, c) = channel::<[u64; 10]>(4);
        for i in 0..10u64 {
            p.prefetch(9);
            p.push([i; 10]).unwrap();
            assert_eq!(c.pop(), Some([i; 10]));
        }
        let (p, c) = channel::<()>(2);
        p.prefetch(3);
        p.push(()).unwrap();
        p.push(()).unwrap();
        p.prefetch(3);
        assert_eq!(p.push(()), Err(()));
        assert_eq!(c.drain(|_| {}), 2);
    }

    #[test]
    fn threads_lose_nothing_accepted() {
        let (p, c) = channel::<u64>(64);
        let n = 200_000u64;
        let prod = std::thread::spawn(move || {
            let mut dropped = 0u64;
            for i in 0..n {
                if p.push(i).is_err() {
                    dropped += 1;
                }
            }
            dropped
        });
        let mut got = Vec::new();
        loop {
            if let Some(v) = c.pop() {
                got.push(v);
            } else if prod.is_finished() {
                c.drain(|v| got.push(v));
                break;
            }
        }
        let dropped = prod.join().unwrap();
        assert_eq!(got.len() as u64 + dropped, n);
        assert!(got.windows(2).all(|w| w[0] < w[1]), "order kept");
    }

    #[test]
    fn drops_pending_items() {
        let (p, c) = channel::<String>(8);
        p.push("a".into()).unwrap();
        p.push("b".into()).unwrap();
        drop(p);
        assert_eq!(c.pop().as_deref(), Some("a"));
        drop(c); // "b" freed by Shared::drop; miri/asan would flag a leak or double free
    }
}
