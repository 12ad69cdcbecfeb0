//! A minimal but real software switch fast path, the loss paper's evaluation subject (V-C):
//! parse, flow hash, exact-match lookup of the output port, an optional action (`dec_ttl`),
//! the loss check (`pkt_loss_chk`) at ingress and egress, and a write to the output ring.
//!
//! Packets move in bursts of up to [`BURST`]: the first pass parses and hashes every packet
//! and prefetches the buckets it will touch (forwarding table and both color tables), the
//! second pass does the work, so one packet's cache misses overlap with the others' (the DPDK
//! and VPP way). No allocation, lock or syscall per packet.

use crate::Pkt;
use telemark_core::flow_hash;
use telemark_core::loss::{color_of, with_color, AnyColorTable, EventSink, LossConfig, Marker};
use telemark_wire::flow::{self, LinkType, Parsed};
use telemark_wire::{ipv4, ipv6, FlowKey};

/// Packets per burst.
pub const BURST: usize = 32;

/// What the switch does to a packet besides forwarding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Forward only (OvS `output`, the paper's `no_action`).
    NoAction,
    /// Decrement TTL / hop limit, with RFC 1624 checksum update (OvS `dec_ttl`).
    DecTtl,
}

#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct FibEntry {
    hash: u64,
    key: FlowKey,
    port: u16,
    used: bool,
}

/// Exact-match forwarding table: flow → output port, open addressing with linear probing,
/// one cache line per entry, sized at start-up (like OvS's exact-match cache).
pub struct Fib {
    slots: Vec<FibEntry>,
    mask: usize,
    len: usize,
}

impl Fib {
    /// A table with room for `flows` flows at a load factor ≤ 0.5.
    pub fn with_capacity(flows: usize) -> Self {
        let n = (flows.max(1) * 2).next_power_of_two();
        Fib { slots: vec![FibEntry::default(); n], mask: n - 1, len: 0 }
    }

    /// Adds or replaces a route; false when the table is full.
    pub fn insert(&mut self, key: FlowKey, port: u16) -> bool {
        let hash = flow_hash(&key);
        let mut i = hash as usize & self.mask;
        for _ in 0..self.slots.len() {
            let Some(e) = self.slots.get_mut(i) else { return false };
            if !e.used || (e.hash == hash && e.key == key) {
                if !e.used {
                    self.len += 1;
                }
                *e = FibEntry { hash, key, port, used: true };
                return true;
            }
            i = (i + 1) & self.mask;
        }
        false
    }

    /// The port for `key`.
    #[inline(always)]
    pub fn lookup(&self, key: &FlowKey, hash: u64) -> Option<u16> {
        let mut i = hash as usize & self.mask;
        loop {
            let e = self.slots.get(i)?;
            if !e.used {
                return None;
            }
            if e.hash == hash && e.key == *key {
                return Some(e.port);
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        #[cfg(target_arch = "x86_64")]
        if let Some(e) = self.slots.get(hash as usize & self.mask) {
            // SAFETY: a prefetch hint on a live element never faults.
            unsafe {
                core::arch::x86_64::_mm_prefetch(
                    e as *const FibEntry as *const i8,
                    core::arch::x86_64::_MM_HINT_T0,
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = hash;
    }

    /// Routes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no route is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Where forwarded packets go: an output ring per port, or the next pipeline stage.
pub trait Tx {
    /// Queues packet `idx` of the burst on `port`; false if the ring was full (counted).
    fn send(&mut self, port: u16, idx: usize) -> bool;
}

/// Counters of the switch (exported as metrics, checked by tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwitchStats {
    /// Packets received.
    pub rx: u64,
    /// Packets handed to an output.
    pub tx: u64,
    /// Packets skipped per [`SkipReason`] (forwarded on the default port unmeasured).
    pub skipped: [u64; 4],
    /// Packets with no route (sent to the default port).
    pub fib_miss: u64,
    /// Packets dropped inside the switch (TTL expired, or an evaluation dropper).
    pub dropped: u64,
    /// Packets an output ring had no room for.
    pub tx_full: u64,
}

/// Switch settings.
#[derive(Debug, Clone, Copy)]
pub struct SwitchConfig {
    /// Link type of the input port.
    pub link: LinkType,
    /// Extra action.
    pub action: Action,
    /// Loss check at ingress and egress (`None`: off).
    pub loss: Option<LossConfig>,
    /// Mark colors here (this switch is the first hop of its flows).
    pub mark: bool,
    /// Port for packets without a route.
    pub default_port: u16,
    /// Point numbers of (marker, ingress, egress) for the aggregator.
    pub points: (u8, u8, u8),
}

#[derive(Clone, Copy, Default)]
struct Meta {
    parsed: Option<Parsed>,
    hash: u64,
}

/// The switch: forwarding table, optional marker, color tables at ingress and egress.
pub struct Switch {
    cfg: SwitchConfig,
    /// The forwarding table.
    pub fib: Fib,
    marker: Option<Marker>,
    ingress: Option<AnyColorTable>,
    egress: Option<AnyColorTable>,
    meta: [Meta; BURST],
    /// Whether prefetching the color tables pays: only when they do not fit in the L2 cache.
    prefetch_loss: bool,
    /// Counters.
    pub stats: SwitchStats,
}

impl Switch {
    /// A switch with an empty forwarding table sized for `flows`.
    pub fn new(cfg: SwitchConfig, flows: usize) -> Self {
        let (m, i, e) = cfg.points;
        Switch {
            fib: Fib::with_capacity(flows),
            marker: cfg.loss.filter(|_| cfg.mark).map(|l| Marker::new(&l, m)),
            ingress: cfg.loss.map(|l| AnyColorTable::new(&l, i)),
            egress: cfg.loss.map(|l| AnyColorTable::new(&l, e)),
            meta: [Meta::default(); BURST],
            // A table that fits in L1/L2 is only slowed by prefetch instructions (measured with
            // `telemark bench`: a few ns/pkt lost at 4 flows, +120 ns/pkt without it at 65 K flows).
            prefetch_loss: cfg.loss.is_some_and(|l| l.table_size.saturating_mul(64) > 64 * 1024),
            stats: SwitchStats::default(),
            cfg,
        }
    }

    /// The ingress and egress tables, for stats and flushing.
    pub fn tables_mut(
        &mut self,
    ) -> (Option<&mut Marker>, Option<&mut AnyColorTable>, Option<&mut AnyColorTable>) {
        (self.marker.as_mut(), self.ingress.as_mut(), self.egress.as_mut())
    }

    /// The ingress and egress tables, read-only.
    pub fn tables(&self) -> (Option<&AnyColorTable>, Option<&AnyColorTable>) {
        (self.ingress.as_ref(), self.egress.as_ref())
    }

    /// Processes up to [`BURST`] packets. `drop_inside` is the evaluation's hook between the
    /// ingress and egress points (a real switch passes `|_, _| false`).
    #[inline]
    pub fn process<S, T, D>(
        &mut self,
        pkts: &mut [Pkt],
        sink: &mut S,
        tx: &mut T,
        mut drop_inside: D,
    ) where
        S: EventSink,
        T: Tx,
        D: FnMut(&FlowKey, &Pkt) -> bool,
    {
        let n = pkts.len().min(BURST);
        let link = self.cfg.link;
        // Pass 1: parse, hash, prefetch.
        for (m, p) in self.meta.iter_mut().zip(pkts.iter()).take(n) {
            match flow::extract(&p.data, link) {
                Ok(parsed) => {
                    let h = flow_hash(&parsed.key);
                    *m = Meta { parsed: Some(parsed), hash: h };
                    self.fib.prefetch(h);
                    if self.prefetch_loss {
                        if let Some(t) = &self.ingress {
                            t.prefetch(h);
                        }
                        if let Some(t) = &self.egress {
                            t.prefetch(h);
                        }
                    }
                }
                Err(r) => {
                    *m = Meta { parsed: None, hash: 0 };
                    if let Some(c) = self.stats.skipped.get_mut(r.index()) {
                        *c += 1;
                    }
                }
            }
        }
        self.stats.rx += n as u64;
        // Pass 2: mark, observe, look up, act, observe, send.
        let color_bit = self.cfg.loss.map_or(0, |l| l.color_bit);
        for (idx, (m, p)) in self.meta.iter_mut().zip(pkts.iter_mut()).take(n).enumerate() {
            let Some(parsed) = m.parsed.as_mut() else {
                if !tx.send(self.cfg.default_port, idx) {
                    self.stats.tx_full += 1;
                } else {
                    self.stats.tx += 1;
                }
                continue;
            };
            let now = p.ts_ns;
            if let Some(mk) = self.marker.as_mut() {
                if let Some((c, ord)) = mk.mark(&parsed.key, m.hash, now, sink) {
                    let d = with_color(parsed.dscp, color_bit, c);
                    if d != parsed.dscp && flow::set_dscp(&mut p.data, parsed, d).is_ok() {
                        parsed.dscp = d;
                    }
                    p.batch = Some(ord);
                }
            }
            let color = color_of(parsed.dscp, color_bit);
            if let Some(t) = self.ingress.as_mut() {
                t.observe(&parsed.key, m.hash, color, now, sink);
            }
            let port = match self.fib.lookup(&parsed.key, m.hash) {
                Some(port) => port,
                None => {
                    self.stats.fib_miss += 1;
                    self.cfg.default_port
                }
            };
            if self.cfg.action == Action::DecTtl && !dec_ttl(&mut p.data, parsed) {
                self.stats.dropped += 1;
                continue;
            }
            if drop_inside(&parsed.key, p) {
                self.stats.dropped += 1;
                continue;
            }
            if let Some(t) = self.egress.as_mut() {
                t.observe(&parsed.key, m.hash, color, now, sink);
            }
            if tx.send(port, idx) {
                self.stats.tx += 1;
            } else {
                self.stats.tx_full += 1;
            }
        }
    }

    /// Retires idle flows in every table (call once per interval, off the per-packet path).
    pub fn expire<S: EventSink>(&mut self, now: u64, sink: &mut S) {
        if let Some(m) = self.marker.as_mut() {
            m.expire(now, sink);
        }
        for t in [self.ingress.as_mut(), self.egress.as_mut()].into_iter().flatten() {
            t.expire(now, sink);
        }
    }

    /// Closes every open batch, upstream first (end of capture, shutdown).
    pub fn flush<S: EventSink>(&mut self, sink: &mut S) {
        if let Some(m) = self.marker.as_mut() {
            m.flush(sink);
        }
        for t in [self.ingress.as_mut(), self.egress.as_mut()].into_iter().flatten() {
            t.flush(sink);
        }
    }
}

/// TTL / hop-limit decrement; false when it expires (the packet is dropped, as OvS does).
#[inline(always)]
fn dec_ttl(data: &mut [u8], parsed: &Parsed) -> bool {
    let Some(ip) = data.get_mut(parsed.ip_offset..) else { return false };
    match parsed.ip_version {
        4 => match ipv4::Packet::new_lenient(ip) {
            Ok(mut p) if p.ttl() > 1 => {
                p.dec_ttl_update_checksum();
                true
            }
            _ => false,
        },
        _ => match ipv6::Packet::new_lenient(ip) {
            Ok(mut p) if p.hop_limit() > 1 => {
                p.dec_hop_limit();
                true
            }
            _ => false,
        },
    }
}
