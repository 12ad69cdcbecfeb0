//! Where the fast path's frames leave: straight onto the output port's TX ring, or through
//! that port's rate-limited queue ([`EgressQueue`]); on the way out, the flow's INT role
//! ([`IntRoles`]) edits the frame with what this switch measured for it (docs/int.md,
//! "Switch roles").
//!
//! ```text
//!  switch output (port, frame) ─► [queue: drop-tail, drained at its rate] ─► INT role ─► TX ring
//!                                                                              │ event (SPSC ring)
//!                                                                              │ report (UDP, never waits)
//! ```
//!
//! INT is applied when the frame leaves, so the hop latency it carries (INT v2.1 §4.6) runs
//! from the AF_PACKET receive timestamp to the moment the frame goes onto the TX ring, the
//! time spent queued included, and the queue occupancy is the bytes queued ahead of it.

use std::net::UdpSocket;
use std::sync::Arc;
use telemark_core::int::{DetectRule, Detectors, Event};
use telemark_core::spsc::Producer;
use telemark_datapath::afpacket::TxRing;
use telemark_datapath::int_roles::{IntRoles, Measured, Output, RoleCounts};
use telemark_datapath::queue::{EgressQueue, QueueStats, Queued};

/// An event with the detector rules it fired under (the aggregator turns it into a record).
pub(crate) type RuledEvent = (Event, Arc<Vec<DetectRule>>);

/// What the INT stage did, counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct IntStats {
    /// The roles' counters.
    pub roles: RoleCounts,
    /// Events lost because the event ring was full.
    pub event_drops: u64,
    /// Reports the socket did not take (the collector unreachable, the buffer full).
    pub report_errors: u64,
}

/// The switch's INT roles, and where their events and reports go.
pub(crate) struct IntStage {
    roles: IntRoles,
    rules: Arc<Vec<DetectRule>>,
    events: Producer<RuledEvent>,
    /// Non-blocking, connected to the INT collector.
    report: Option<UdpSocket>,
    event_drops: u64,
    report_errors: u64,
}

impl IntStage {
    pub(crate) fn new(
        roles: IntRoles,
        events: Producer<RuledEvent>,
        report: Option<UdpSocket>,
    ) -> IntStage {
        let rules = Arc::new(roles.detect_rules().to_vec());
        IntStage { roles, rules, events, report, event_drops: 0, report_errors: 0 }
    }

    /// New rules from the controller or a reload, with their detector table.
    pub(crate) fn set_rules(&mut self, r: &crate::config::IntRules, table: Detectors) {
        self.roles.set_rules(r.roles.clone(), table);
        self.rules = Arc::new(r.detect.clone());
    }

    pub(crate) fn stats(&self) -> IntStats {
        IntStats {
            roles: self.roles.counts(),
            event_drops: self.event_drops,
            report_errors: self.report_errors,
        }
    }

    fn apply(&mut self, frame: &mut Vec<u8>, m: &Measured) {
        let (events, rules, report) = (&mut self.events, &self.rules, &self.report);
        let (event_drops, report_errors) = (&mut self.event_drops, &mut self.report_errors);
        self.roles.apply(frame, m, |out| match out {
            Output::Event(e) => {
                if events.push((e, rules.clone())).is_err() {
                    *event_drops += 1;
                }
            }
            Output::Report(bytes) => {
                if report.as_ref().is_some_and(|s| s.send(bytes).is_err()) {
                    *report_errors += 1;
                }
            }
        });
    }
}

/// One output port's queue, and what it sent in the last utilisation window.
struct PortQueue {
    queue: EgressQueue,
    window_start_ns: u64,
    window_bytes: u64,
    /// Per mille of the rate, over the last whole window.
    utilization: u32,
}

/// Utilisation is measured over windows this long.
const UTIL_WINDOW_NS: u64 = 100_000_000;

/// The output side of the fast path.
pub(crate) struct Egress {
    pub(crate) txs: Vec<TxRing>,
    queues: Vec<Option<PortQueue>>,
    pub(crate) int: Option<IntStage>,
    kick: Vec<bool>,
}

impl Egress {
    /// Ports `txs` (by port number), queues where `queues` has one.
    pub(crate) fn new(
        txs: Vec<TxRing>,
        queues: Vec<Option<EgressQueue>>,
        int: Option<IntStage>,
    ) -> Egress {
        let queues = queues
            .into_iter()
            .map(|q| {
                q.map(|queue| PortQueue {
                    queue,
                    window_start_ns: 0,
                    window_bytes: 0,
                    utilization: 0,
                })
            })
            .collect();
        let kick = vec![false; txs.len()];
        Egress { txs, queues, int, kick }
    }

    /// Sends `frame`, which came in on port `in_port` at `ingress_ns`, out of `port`: into
    /// its queue if it has one (taking the buffer), else through INT onto the TX ring.
    pub(crate) fn send(
        &mut self,
        in_port: u16,
        port: u16,
        frame: &mut Vec<u8>,
        ingress_ns: u64,
        now: u64,
    ) {
        let p = usize::from(port);
        if matches!(self.queues.get(p), Some(Some(_))) {
            // What the link has sent by now leaves first, so the frame queues behind only
            // what is still waiting.
            self.drain_port(p, now);
            if let Some(Some(q)) = self.queues.get_mut(p) {
                q.queue.enqueue(frame, in_port, ingress_ns, now);
            }
            return;
        }
        let m = Measured {
            ingress_port: in_port + 1,
            egress_port: port + 1,
            ingress_ns,
            egress_ns: now,
            tx_utilization: u32::MAX,
            ..Measured::default()
        };
        if let Some(int) = &mut self.int {
            int.apply(frame, &m);
        }
        self.transmit(p, frame);
    }

    fn transmit(&mut self, p: usize, frame: &[u8]) {
        if let Some(tx) = self.txs.get_mut(p) {
            tx.tx(frame);
            self.kick[p] = true;
        }
    }

    /// Sends every queued frame the link has sent by `now`.
    pub(crate) fn drain_due(&mut self, now: u64) {
        for p in 0..self.queues.len() {
            self.drain_port(p, now);
        }
    }

    /// Sends port `p`'s queued frames the link has sent by `now`.
    fn drain_port(&mut self, p: usize, now: u64) {
        while let Some((mut q, utilization)) = self.pop_due(p, now) {
            let m = Measured {
                ingress_port: q.ingress_port + 1,
                egress_port: p as u16 + 1,
                ingress_ns: q.ingress_ns,
                egress_ns: now,
                queue_id: 0,
                queue_bytes: q.queue_bytes,
                tx_utilization: utilization,
            };
            if let Some(int) = &mut self.int {
                int.apply(&mut q.data, &m);
            }
            self.transmit(p, &q.data);
            if let Some(Some(pq)) = self.queues.get_mut(p) {
                pq.queue.recycle(q.data);
            }
        }
    }

    /// Port `p`'s next frame if due, and the port's utilisation (per mille of its rate over
    /// the last whole window).
    fn pop_due(&mut self, p: usize, now: u64) -> Option<(Queued, u32)> {
        let pq = self.queues.get_mut(p)?.as_mut()?;
        let q = pq.queue.pop_due(now)?;
        if now >= pq.window_start_ns + UTIL_WINDOW_NS {
            let bits = u128::from(pq.window_bytes) * 8 * 1_000_000_000;
            let span = u128::from(now - pq.window_start_ns).max(1);
            let rate = u128::from(pq.queue.rate_bps());
            pq.utilization = (bits * 1000 / span / rate).min(1000) as u32;
            pq.window_start_ns = now;
            pq.window_bytes = 0;
        }
        pq.window_bytes += q.data.len() as u64;
        Some((q, pq.utilization))
    }

    /// Wakes the kernel for every TX ring written since the last call.
    pub(crate) fn kick(&mut self) {
        for (tx, k) in self.txs.iter_mut().zip(self.kick.iter_mut()) {
            if *k {
                tx.kick();
                *k = false;
            }
        }
    }

    /// Drops every queued frame (counted as the queues' drops).
    pub(crate) fn drop_queued(&mut self) {
        for q in self.queues.iter_mut().flatten() {
            q.queue.drop_all();
        }
    }

    /// When the next queued frame is due, if any is queued.
    pub(crate) fn next_due_ns(&self) -> Option<u64> {
        self.queues.iter().flatten().filter_map(|q| q.queue.next_due_ns()).min()
    }

    /// Each queued port's number and counters.
    pub(crate) fn queue_stats(&self) -> Vec<(usize, QueueStats)> {
        self.queues
            .iter()
            .enumerate()
            .filter_map(|(p, q)| q.as_ref().map(|q| (p, q.queue.stats())))
            .collect()
    }
}
