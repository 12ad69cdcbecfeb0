//! How the aggregation thread sleeps while nothing comes: the datapath rings a doorbell when
//! it hands events over, and the aggregation, finding its rings empty, waits for the bell or
//! a timeout that grows while it stays idle ([`Backoff`]).
//!
//! A thread that polls every 2 ms wakes 500 times a second; on a host of two cores
//! forwarding TCP at line rate, that alone cost about 8 % of the throughput with the eBPF
//! datapath (`telemark bench-ebpf`, docs/ebpf.md). Waiting on the bell, the idle aggregation
//! wakes 20 times a second, and a busy one no more often than it polled.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// A doorbell one thread waits on and any thread rings.
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    /// Whether the waiter is (about to be) parked.
    asleep: AtomicBool,
    waiter: OnceLock<Thread>,
}

impl Doorbell {
    /// Wakes the waiter if it sleeps; otherwise a fence and a load.
    pub(crate) fn ring(&self) {
        // Pairs with the fence in `wait`: either the waiter sees what was handed over before
        // this ring when it looks once more, or this sees it asleep.
        fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::Relaxed) && self.asleep.swap(false, Ordering::AcqRel) {
            if let Some(t) = self.waiter.get() {
                t.unpark();
            }
        }
    }

    /// Sleeps until the bell rings or `timeout` passes, unless `waiting()` (asked after the
    /// waiter said it sleeps) finds something handed over meanwhile. One thread only waits on
    /// a bell: the first that does (another would sleep out every timeout).
    pub(crate) fn wait(&self, timeout: Duration, waiting: impl Fn() -> bool) {
        let me = self.waiter.get_or_init(std::thread::current);
        assert_eq!(me.id(), std::thread::current().id(), "a doorbell has one waiter");
        self.asleep.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !waiting() {
            let until = Instant::now() + timeout;
            // A park may end early (an unpark left from before): sleep out the rest unless rung.
            while self.asleep.load(Ordering::Acquire) {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                std::thread::park_timeout(until - now);
            }
        }
        self.asleep.store(false, Ordering::Relaxed);
    }
}

/// How often a producer that hands things over continuously (the switch, as frames close
/// batches) rings at most: the consumer then takes them as often as it polled before.
pub(crate) const RING_EVERY: Duration = Duration::from_millis(2);

/// How long an idle consumer waits: [`Backoff::FIRST`] after it last found work, twice as long
/// each time it finds none, up to [`Backoff::MOST`].
#[derive(Debug)]
pub(crate) struct Backoff(Duration);

impl Backoff {
    /// The first wait after work: what the aggregation polled at before it had a bell.
    pub(crate) const FIRST: Duration = Duration::from_millis(2);
    /// The longest wait: what an idle agent's records and reloads may lag by.
    pub(crate) const MOST: Duration = Duration::from_millis(50);

    pub(crate) fn new() -> Self {
        Backoff(Self::FIRST)
    }

    /// Work was found: the next wait is short again.
    pub(crate) fn worked(&mut self) {
        self.0 = Self::FIRST;
    }

    /// The wait now, and a longer one next time.
    pub(crate) fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (d * 2).min(Self::MOST);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_ring_wakes_the_waiter_long_before_its_timeout() {
        let bell = Arc::new(Doorbell::default());
        let b = bell.clone();
        let waiter = std::thread::spawn(move || {
            let t0 = Instant::now();
            b.wait(Duration::from_secs(10), || false);
            t0.elapsed()
        });
        // Ring until the waiter has gone to sleep and been woken.
        while !waiter.is_finished() {
            std::thread::sleep(Duration::from_millis(20));
            bell.ring();
        }
        assert!(waiter.join().unwrap() < Duration::from_secs(5));
    }

    #[test]
    fn a_wait_with_work_waiting_returns_at_once_and_one_without_sleeps_its_timeout() {
        let bell = Doorbell::default();
        let t0 = Instant::now();
        bell.wait(Duration::from_secs(10), || true);
        assert!(t0.elapsed() < Duration::from_secs(5));
        // A ring before the wait (nobody asleep) does not cut the next wait short.
        bell.ring();
        let t0 = Instant::now();
        bell.wait(Duration::from_millis(30), || false);
        assert!(t0.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn the_backoff_doubles_to_its_cap_and_work_resets_it() {
        let mut b = Backoff::new();
        let waits: Vec<u128> = (0..7).map(|_| b.next().as_millis()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 50, 50]);
        b.worked();
        assert_eq!(b.next(), Backoff::FIRST);
    }
}
