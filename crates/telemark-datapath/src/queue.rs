//! An egress queue with a configurable rate: a drop-tail FIFO drained at `rate` bits per
//! second, the bottleneck a testbed congests so that INT's queue occupancy and hop latency
//! are measured on a real queue (INT v2.1 §4.6 "Queue occupancy": the switch's own queue).
//!
//! Sans-IO: [`EgressQueue::enqueue`] takes the frame's buffer (swapping in an empty one from
//! the queue's pool, so a burst buffer never reallocates), [`EgressQueue::pop_due`] gives back
//! the frames whose departure time has come, in order. A frame departs when the link has sent
//! every byte queued before it: `depart = max(arrival, previous departure) + bits / rate`.

use std::collections::VecDeque;

/// Frames a queue holds at most, whatever their size (each keeps a ~2 KB buffer).
pub const MAX_FRAMES: usize = 65_536;

/// A frame waiting in the queue, with what the switch measured when it joined.
#[derive(Debug)]
pub struct Queued {
    /// The frame.
    pub data: Vec<u8>,
    /// The port it came in on.
    pub ingress_port: u16,
    /// When it came in (ns).
    pub ingress_ns: u64,
    /// Bytes queued ahead of it when it joined.
    pub queue_bytes: u32,
    /// When the link will have sent it (ns).
    pub depart_ns: u64,
}

/// Counters of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Frames that joined.
    pub enqueued: u64,
    /// Frames dropped because the queue was full (drop-tail).
    pub dropped: u64,
    /// Frames that left.
    pub departed: u64,
    /// Bytes queued now.
    pub backlog_bytes: u64,
    /// The most bytes ever queued.
    pub max_backlog_bytes: u64,
}

/// A rate-limited drop-tail FIFO.
#[derive(Debug)]
pub struct EgressQueue {
    /// Bits per second the queue drains at.
    rate_bps: u64,
    /// Bytes it holds at most.
    limit_bytes: u64,
    frames: VecDeque<Queued>,
    /// Empty buffers to swap in for frames taken.
    pool: Vec<Vec<u8>>,
    /// When the link finishes the last queued frame.
    link_free_ns: u64,
    stats: QueueStats,
}

impl EgressQueue {
    /// A queue draining at `rate_bps` that holds at most `limit_bytes`.
    pub fn new(rate_bps: u64, limit_bytes: u64) -> EgressQueue {
        EgressQueue {
            rate_bps: rate_bps.max(1),
            limit_bytes,
            frames: VecDeque::new(),
            pool: Vec::new(),
            link_free_ns: 0,
            stats: QueueStats::default(),
        }
    }

    /// Time the link takes to send `bytes`.
    fn serialisation_ns(&self, bytes: usize) -> u64 {
        (bytes as u128 * 8 * 1_000_000_000 / u128::from(self.rate_bps)) as u64
    }

    /// Queues the frame in `data` (taking it, leaving an empty buffer in its place) unless the
    /// queue is full; whether it joined.
    pub fn enqueue(
        &mut self,
        data: &mut Vec<u8>,
        ingress_port: u16,
        ingress_ns: u64,
        now: u64,
    ) -> bool {
        let len = data.len() as u64;
        // Each queued frame holds a whole receive buffer: the count of frames is bounded too.
        if self.stats.backlog_bytes + len > self.limit_bytes || self.frames.len() >= MAX_FRAMES {
            self.stats.dropped += 1;
            return false;
        }
        let depart_ns = self.link_free_ns.max(now) + self.serialisation_ns(data.len());
        self.link_free_ns = depart_ns;
        let mut buf = self.pool.pop().unwrap_or_else(|| Vec::with_capacity(data.capacity()));
        buf.clear();
        std::mem::swap(&mut buf, data);
        self.frames.push_back(Queued {
            data: buf,
            ingress_port,
            ingress_ns,
            queue_bytes: self.stats.backlog_bytes.min(u64::from(u32::MAX)) as u32,
            depart_ns,
        });
        self.stats.enqueued += 1;
        self.stats.backlog_bytes += len;
        self.stats.max_backlog_bytes = self.stats.max_backlog_bytes.max(self.stats.backlog_bytes);
        true
    }

    /// The oldest frame if the link has sent it by `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<Queued> {
        if self.frames.front()?.depart_ns > now {
            return None;
        }
        let q = self.frames.pop_front()?;
        self.stats.departed += 1;
        self.stats.backlog_bytes -= q.data.len() as u64;
        Some(q)
    }

    /// Drops every queued frame, counted as dropped.
    pub fn drop_all(&mut self) {
        self.stats.dropped += self.frames.len() as u64;
        self.stats.backlog_bytes = 0;
        self.frames.clear();
        self.link_free_ns = 0;
    }

    /// Gives a frame's buffer back for reuse.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < 1024 {
            self.pool.push(buf);
        }
    }

    /// When the next frame is due, if any is queued.
    pub fn next_due_ns(&self) -> Option<u64> {
        self.frames.front().map(|q| q.depart_ns)
    }

    /// The drain rate, bits per second.
    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_leave_at_the_rate_in_order_and_the_tail_drops_when_full() {
        // 8 Mbit/s: 1,000 bytes take 1 ms. Room for 3,000 bytes.
        let mut q = EgressQueue::new(8_000_000, 3_000);
        let mut f = vec![1u8; 1_000];
        let mut joined = Vec::new();
        for i in 0..4u8 {
            f.clear();
            f.resize(1_000, i);
            let ok = q.enqueue(&mut f, 1, 100, 0);
            // Taken by swapping buffers, never copied; a dropped frame stays with the caller.
            assert_eq!(f.is_empty(), ok);
            joined.push(ok);
        }
        assert_eq!(joined, [true, true, true, false]);
        assert_eq!(q.stats().dropped, 1);
        assert!(q.pop_due(999_999).is_none(), "the first frame is still on the wire");
        let a = q.pop_due(1_000_000).unwrap();
        assert_eq!((a.data[0], a.queue_bytes, a.depart_ns), (0, 0, 1_000_000));
        assert!(q.pop_due(1_500_000).is_none());
        let b = q.pop_due(3_000_000).unwrap();
        assert_eq!((b.data[0], b.queue_bytes), (1, 1_000));
        let c = q.pop_due(3_000_000).unwrap();
        assert_eq!((c.data[0], c.queue_bytes, c.depart_ns), (2, 2_000, 3_000_000));
        assert_eq!(q.stats().backlog_bytes, 0);
        assert_eq!(q.stats().max_backlog_bytes, 3_000);
        // An idle link starts again from the arrival time.
        q.recycle(a.data);
        assert!(q.enqueue(&mut vec![0; 500], 1, 0, 10_000_000));
        assert_eq!(q.next_due_ns(), Some(10_500_000));
    }
}
