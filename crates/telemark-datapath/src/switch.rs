//! A minimal but real software switch fast path, the loss paper's evaluation subject (V-C):
//! parse, flow hash, exact-match lookup of the output port, an optional action (`dec_ttl`),
//! the loss check (`pkt_loss_chk`) at ingress and egress, and a write to the output ring.
//!
//! The loss check needs no lookup of its own: the forwarding lookup's slot indexes the flow's
//! loss state at both points ([`PairTable`]), as OvS updates a flow's statistics in the entry
//! its lookup found.
//!
//! Packets move in bursts of up to [`BURST`]: the first pass parses and hashes every packet
//! and prefetches what it will touch (the flow's home slot in the forwarding table and its loss
//! state), the second pass does the work, so one packet's cache misses overlap with the others' (the DPDK
//! and VPP way). No allocation, lock or syscall per packet.

use crate::Pkt;
use telemark_core::flow_hash;
use telemark_core::loss::{
    color_of, with_color, AnyPairTable, Counter, EventSink, LossConfig, Marker, PairTable,
    PointStats, Refusal, Selection,
};
use telemark_core::watch::Watch;
use telemark_wire::flow::{self, LinkType, Parsed};
use telemark_wire::{ipv4, ipv6, FlowKey};

macro_rules! each {
    ($self:expr, $t:ident => $e:expr) => {
        telemark_core::each_width!(AnyPairTable, $self, $t => $e)
    };
}

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
    /// Installed by the switch on a miss (may be retired when idle), not by configuration.
    learned: bool,
}

/// Exact-match flow table: flow → output port, open addressing with linear probing, one cache
/// line per entry, sized at start-up (like OvS's exact-match cache). The slot a lookup finds
/// also indexes the flow's loss state ([`PairTable`]).
pub struct Fib {
    slots: Vec<FibEntry>,
    mask: usize,
    len: usize,
    max: usize,
}

impl Fib {
    /// A table with room for `flows` flows at a load factor ≤ 0.5.
    pub fn with_capacity(flows: usize) -> Self {
        let n = (flows.max(1) * 2).next_power_of_two();
        Fib { slots: vec![FibEntry::default(); n], mask: n - 1, len: 0, max: flows.max(1) }
    }

    /// Adds or replaces a route; false when the table is full.
    pub fn insert(&mut self, key: FlowKey, port: u16) -> bool {
        self.put(key, flow_hash(&key), port, false).is_some()
    }

    /// Adds or replaces a route; its slot, or `None` when the table holds its capacity.
    fn put(&mut self, key: FlowKey, hash: u64, port: u16, learned: bool) -> Option<usize> {
        let mut i = hash as usize & self.mask;
        loop {
            let e = self.slots.get_mut(i)?;
            if e.used && e.hash == hash && e.key == key {
                *e = FibEntry { hash, key, port, used: true, learned };
                return Some(i);
            }
            if !e.used {
                if self.len >= self.max {
                    return None;
                }
                self.len += 1;
                *e = FibEntry { hash, key, port, used: true, learned };
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The slot holding `key`.
    #[inline(always)]
    pub fn lookup(&self, key: &FlowKey, hash: u64) -> Option<usize> {
        let mut i = hash as usize & self.mask;
        loop {
            let e = self.slots.get(i)?;
            if !e.used {
                return None;
            }
            if e.hash == hash && e.key == *key {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The output port of the flow in slot `slot`.
    #[inline(always)]
    pub fn port(&self, slot: usize) -> Option<u16> {
        self.slots.get(slot).filter(|e| e.used).map(|e| e.port)
    }

    /// Removes the flow in slot `slot`, closing the gap by moving later flows of its probe
    /// run back (backward-shift deletion, so lookups need no tombstones); `moved(from, to)` is
    /// told of every move.
    fn remove(&mut self, slot: usize, mut moved: impl FnMut(usize, usize)) {
        let Some(e) = self.slots.get_mut(slot) else { return };
        if !e.used {
            return;
        }
        *e = FibEntry::default();
        self.len -= 1;
        let mut hole = slot;
        let mut i = (slot + 1) & self.mask;
        while let Some(e) = self.slots.get(i).copied().filter(|e| e.used) {
            let home = e.hash as usize & self.mask;
            // `e` may fill the hole if its home is not cyclically in (hole, i].
            let dist_home = i.wrapping_sub(home) & self.mask;
            let dist_hole = i.wrapping_sub(hole) & self.mask;
            if dist_home >= dist_hole {
                if let Some(h) = self.slots.get_mut(hole) {
                    *h = e;
                }
                if let Some(x) = self.slots.get_mut(i) {
                    *x = FibEntry::default();
                }
                moved(i, hole);
                hole = i;
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

    /// Slots (twice the capacity).
    pub fn slots(&self) -> usize {
        self.slots.len()
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
    /// Flows installed on a miss ([`SwitchConfig::learn`]).
    pub learned: u64,
    /// Learned flows retired for idleness.
    pub unlearned: u64,
    /// Packets dropped inside the switch (TTL expired, or an evaluation dropper).
    pub dropped: u64,
    /// Packets an output ring had no room for.
    pub tx_full: u64,
    /// Packets of flows the watch rules leave out (forwarded, not marked, not measured).
    pub unwatched: u64,
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
    /// On a miss, install the flow towards `default_port` (the slow path's decision, as an OvS
    /// upcall installs a flow), so it is measured from its next packet on; learned flows idle
    /// for `loss.idle_ns` are retired by [`Switch::expire`].
    pub learn: bool,
    /// Point numbers of (marker, ingress, egress) for the aggregator.
    pub points: (u8, u8, u8),
}

#[derive(Clone, Copy, Default)]
struct Meta {
    parsed: Option<Parsed>,
    hash: u64,
}

/// Everything of the switch but the loss state, so a burst can borrow the two apart.
struct Core {
    cfg: SwitchConfig,
    fib: Fib,
    marker: Option<Marker>,
    meta: [Meta; BURST],
    /// Whether prefetching the loss state pays: only when it does not fit in the L2 cache.
    prefetch_loss: bool,
    stats: SwitchStats,
    /// Flows to learn and measure (`None`: all, first come first served).
    watch: Option<Watch>,
    /// Active flow selection: of the flows `watch` lets in, learn and measure only these
    /// (`None`: all).
    selection: Option<Selection>,
}

/// The switch: forwarding table, optional marker, the loss state of ingress and egress.
pub struct Switch {
    core: Core,
    loss: Option<AnyPairTable>,
}

impl Switch {
    /// A switch with an empty forwarding table sized for `flows`.
    pub fn new(cfg: SwitchConfig, flows: usize) -> Self {
        let (m, i, e) = cfg.points;
        let fib = Fib::with_capacity(flows);
        let loss = cfg.loss.map(|l| AnyPairTable::new(&l, fib.slots(), (i, e)));
        // State that fits in L1/L2 is only slowed by prefetch instructions (measured with
        // `telemark bench`: a few ns/pkt lost at 4 flows, +120 ns/pkt without it at 65 K flows).
        let prefetch_loss = fib.slots().saturating_mul(64) > 64 * 1024;
        Switch {
            core: Core {
                marker: cfg.loss.filter(|_| cfg.mark).map(|l| Marker::new(&l, m)),
                fib,
                meta: [Meta::default(); BURST],
                prefetch_loss,
                stats: SwitchStats::default(),
                watch: None,
                selection: None,
                cfg,
            },
            loss,
        }
    }

    /// Learns and measures only the flows `watch` matches (default: all).
    pub fn with_watch(mut self, watch: Watch) -> Self {
        self.core.watch = Some(watch).filter(|w| !w.rules.is_empty());
        self
    }

    /// Active flow selection (the loss paper's open problem, V-D): from now on the switch
    /// learns and measures only the flows in `selection` (`None`: every flow, first come first
    /// served), e.g. the heavy-hitter pipeline's top flows of the last window. Learned flows
    /// not selected any more leave the table, their open batches reported cut at both points;
    /// flows selected anew are learned on their next packet and measured armed, from the first
    /// whole batch. Routes installed by configuration stay measured. The other flows are
    /// forwarded on the default port and counted `unselected`. Off the per-packet path: call
    /// it between bursts, at window boundaries.
    pub fn select<S: EventSink>(&mut self, selection: Option<Selection>, sink: &mut S) {
        if let (Some(sel), Some(loss)) = (&selection, self.loss.as_mut()) {
            each!(loss, t => deselect(&mut self.core, t, sel, sink));
        }
        self.core.selection = selection;
    }

    /// The forwarding table.
    pub fn fib(&mut self) -> &mut Fib {
        &mut self.core.fib
    }

    /// Counters.
    pub fn stats(&self) -> SwitchStats {
        self.core.stats
    }

    /// Counters of the ingress and egress points (`None` with the loss check off).
    pub fn point_stats(&self) -> Option<[PointStats; 2]> {
        Some(each!(self.loss.as_ref()?, t => t.stats))
    }

    /// Flows the loss check can hold (the forwarding table's capacity).
    pub fn capacity(&self) -> usize {
        self.core.fib.max
    }

    /// Processes up to [`BURST`] packets. `drop_inside` is the evaluation's hook between the
    /// ingress and egress points (a real switch passes `|_, _| false`).
    #[inline]
    pub fn process<S, T, D>(&mut self, pkts: &mut [Pkt], sink: &mut S, tx: &mut T, drop_inside: D)
    where
        S: EventSink,
        T: Tx,
        D: FnMut(&FlowKey, &Pkt) -> bool,
    {
        match self.loss.as_mut() {
            None => burst::<u8, _, _, _>(&mut self.core, None, pkts, sink, tx, drop_inside),
            Some(l) => each!(l, t => burst(&mut self.core, Some(t), pkts, sink, tx, drop_inside)),
        }
    }

    /// Retires idle flows: the marker's, and the loss state of flows idle at `now` (their
    /// batches closed and reported); learned flows leave the forwarding table too. Call once
    /// per interval, off the per-packet path.
    pub fn expire<S: EventSink>(&mut self, now: u64, sink: &mut S) {
        if let Some(m) = self.core.marker.as_mut() {
            m.expire(now, sink);
        }
        let Some(loss) = self.loss.as_mut() else { return };
        each!(loss, t => expire_flows(&mut self.core, t, now, sink));
    }

    /// Closes every open batch, upstream first: the marker's, then every flow's at ingress,
    /// then at egress, each followed by `drain` so an aggregator sees them in that order (end
    /// of capture, shutdown).
    pub fn flush<S: EventSink>(&mut self, sink: &mut S, mut drain: impl FnMut(&mut S)) {
        if let Some(m) = self.core.marker.as_mut() {
            m.flush(sink);
            drain(sink);
        }
        let Some(loss) = self.loss.as_mut() else { return };
        for at in 0..2 {
            for (slot, e) in self.core.fib.slots.iter().enumerate() {
                if e.used {
                    each!(loss, t => t.retire_point(at, slot, &e.key, sink));
                }
            }
            drain(sink);
        }
    }
}

fn expire_flows<C: Counter, S: EventSink>(
    core: &mut Core,
    t: &mut PairTable<C>,
    now: u64,
    sink: &mut S,
) {
    sweep(core, t, |e, slot, t| {
        let idle = t.is_idle(slot, now);
        if idle {
            t.evict(slot, &e.key, sink);
        }
        idle
    });
}

/// Retires the learned flows `sel` leaves out (see [`Switch::select`]).
fn deselect<C: Counter, S: EventSink>(
    core: &mut Core,
    t: &mut PairTable<C>,
    sel: &Selection,
    sink: &mut S,
) {
    sweep(core, t, |e, slot, t| {
        let out = e.learned && !sel.contains(&e.key);
        if out {
            t.cut(slot, &e.key, sink);
        }
        out
    });
}

/// Walks the forwarding table: `retire(entry, slot, loss)` retires the flow's loss state when it
/// must and says so; a retired flow the switch learned then leaves the table (backward-shift
/// deletion moves later flows back, their loss state with them).
fn sweep<C: Counter>(
    core: &mut Core,
    t: &mut PairTable<C>,
    mut retire: impl FnMut(&FibEntry, usize, &mut PairTable<C>) -> bool,
) {
    let mut slot = 0;
    while slot < core.fib.slots.len() {
        let Some(e) = core.fib.slots.get(slot).copied() else { break };
        if e.used && retire(&e, slot, t) && e.learned {
            core.fib.remove(slot, |from, to| t.move_slot(from, to));
            core.stats.unlearned += 1;
            // A flow may have moved into this slot: look at it again.
            continue;
        }
        slot += 1;
    }
}

/// One burst, generic over the loss counters' width.
#[inline(always)]
fn burst<C, S, T, D>(
    core: &mut Core,
    mut loss: Option<&mut PairTable<C>>,
    pkts: &mut [Pkt],
    sink: &mut S,
    tx: &mut T,
    mut drop_inside: D,
) where
    C: Counter,
    S: EventSink,
    T: Tx,
    D: FnMut(&FlowKey, &Pkt) -> bool,
{
    let n = pkts.len().min(BURST);
    let link = core.cfg.link;
    let prefetch_loss = core.prefetch_loss && loss.is_some();
    // Pass 1: parse, hash, prefetch the flow's home slot in the table and its loss state.
    for (m, p) in core.meta.iter_mut().zip(pkts.iter()).take(n) {
        match flow::extract(&p.data, link) {
            Ok(parsed) => {
                let h = flow_hash(&parsed.key);
                *m = Meta { parsed: Some(parsed), hash: h };
                core.fib.prefetch(h);
                if prefetch_loss {
                    if let Some(t) = loss.as_deref() {
                        t.prefetch(h as usize & core.fib.mask);
                    }
                }
            }
            Err(r) => {
                *m = Meta { parsed: None, hash: 0 };
                if let Some(c) = core.stats.skipped.get_mut(r.index()) {
                    *c += 1;
                }
            }
        }
    }
    core.stats.rx += n as u64;
    // Pass 2: mark, look up, observe, act, observe, send.
    let color_bit = core.cfg.loss.map_or(0, |l| l.color_bit);
    for (idx, (m, p)) in core.meta.iter_mut().zip(pkts.iter_mut()).take(n).enumerate() {
        let Some(parsed) = m.parsed.as_mut() else {
            send(tx, &mut core.stats, core.cfg.default_port, idx);
            continue;
        };
        let now = p.ts_ns;
        let mut unselected = false;
        let slot = match core.fib.lookup(&parsed.key, m.hash) {
            Some(s) => Some(s),
            None => {
                core.stats.fib_miss += 1;
                if core.watch.as_ref().is_some_and(|w| !w.matches(&parsed.key)) {
                    // Not ours to measure: forwarded untouched.
                    core.stats.unwatched += 1;
                    send(tx, &mut core.stats, core.cfg.default_port, idx);
                    continue;
                }
                if core.selection.as_ref().is_some_and(|sel| !sel.contains(&parsed.key)) {
                    // Not selected: forwarded like a flow the table has no room for.
                    unselected = true;
                    None
                } else {
                    let s = learn(&core.cfg, &mut core.fib, &mut core.stats, &parsed.key, m.hash);
                    if let (Some(t), Some(s), true) =
                        (loss.as_deref_mut(), s, core.selection.is_some())
                    {
                        // Selected flows join mid-flow.
                        t.arm(s);
                    }
                    s
                }
            }
        };
        if let Some(mk) = core.marker.as_mut() {
            if let Some((c, ord)) = mk.mark(&parsed.key, m.hash, now, sink) {
                let d = with_color(parsed.dscp, color_bit, c);
                if d != parsed.dscp && flow::set_dscp(&mut p.data, parsed, d).is_ok() {
                    parsed.dscp = d;
                }
                p.batch = Some(ord);
            }
        }
        let port = slot.and_then(|s| core.fib.port(s)).unwrap_or(core.cfg.default_port);
        let color = color_of(parsed.dscp, color_bit);
        let watched = match (loss.as_deref_mut(), slot) {
            (Some(t), Some(s)) => {
                t.observe(0, s, &parsed.key, color, now, sink);
                Some(s)
            }
            (Some(t), None) => {
                // Not in the table (full, or not selected): forwarded, but not measured.
                let why = if unselected { Refusal::NotSelected } else { Refusal::Full };
                t.refuse(why, &parsed.key, m.hash, sink);
                None
            }
            _ => None,
        };
        if core.cfg.action == Action::DecTtl && !dec_ttl(&mut p.data, parsed) {
            core.stats.dropped += 1;
            continue;
        }
        if drop_inside(&parsed.key, p) {
            core.stats.dropped += 1;
            continue;
        }
        if let (Some(t), Some(s)) = (loss.as_deref_mut(), watched) {
            t.observe(1, s, &parsed.key, color, now, sink);
        }
        send(tx, &mut core.stats, port, idx);
    }
}

#[cold]
#[inline(never)]
fn learn(
    cfg: &SwitchConfig,
    fib: &mut Fib,
    stats: &mut SwitchStats,
    key: &FlowKey,
    hash: u64,
) -> Option<usize> {
    if !cfg.learn {
        return None;
    }
    let slot = fib.put(*key, hash, cfg.default_port, true)?;
    stats.learned += 1;
    Some(slot)
}

#[inline(always)]
fn send<T: Tx>(tx: &mut T, stats: &mut SwitchStats, port: u16, idx: usize) {
    if tx.send(port, idx) {
        stats.tx += 1;
    } else {
        stats.tx_full += 1;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use core::net::{IpAddr, Ipv4Addr};
    use std::collections::HashMap;

    fn key(i: u32) -> FlowKey {
        FlowKey {
            src: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9)),
            sport: 7,
            dport: 9,
            proto: 6,
            spi: None,
            si: None,
        }
    }

    struct Out(Vec<(u16, usize)>);
    impl Tx for Out {
        fn send(&mut self, port: u16, idx: usize) -> bool {
            self.0.push((port, idx));
            true
        }
    }

    /// A learning switch measures flows it has never seen, from their first packet, and when
    /// they go idle reports their last batches at both points and forgets them.
    #[test]
    fn learned_flows_are_measured_then_retired_when_idle() {
        let loss = LossConfig { idle_ns: 1_000, ..LossConfig::default() };
        let cfg = SwitchConfig {
            link: LinkType::Ethernet,
            action: Action::NoAction,
            loss: Some(loss),
            mark: false,
            default_port: 3,
            learn: true,
            points: (0, 1, 2),
        };
        let mut sw = Switch::new(cfg, 16);
        // 3 flows: 250, 120 and 40 packets, colors in batches of 100, interleaved.
        let sizes = [250u32, 120, 40];
        let mut pkts = Vec::new();
        for i in 0..250u32 {
            for (f, n) in sizes.iter().enumerate() {
                if i < *n {
                    let dscp = ((i / 100) % 2) as u8;
                    let data = crate::gen::build_frame(&key(f as u32), 18, dscp, 64);
                    pkts.push(Pkt { ts_ns: pkts.len() as u64, data, seq: 0, batch: None });
                }
            }
        }
        let (mut ev, mut out) = (Vec::new(), Out(Vec::new()));
        for chunk in pkts.chunks_mut(BURST) {
            sw.process(chunk, &mut ev, &mut out, |_, _| false);
        }
        assert_eq!(out.0.len(), pkts.len());
        assert!(out.0.iter().all(|(port, _)| *port == 3));
        assert_eq!((sw.stats().learned, sw.fib().len()), (3, 3));
        // Not idle yet: nothing retired.
        sw.expire(pkts.len() as u64, &mut ev);
        assert_eq!(sw.fib().len(), 3);
        sw.expire(pkts.len() as u64 + 5_000, &mut ev);
        assert_eq!((sw.stats().unlearned, sw.fib().len()), (3, 0));
        for at in 1..=2u8 {
            for (f, n) in sizes.iter().enumerate() {
                let counted: u32 = ev
                    .iter()
                    .filter(|e| e.point == at && e.key == key(f as u32))
                    .filter(|e| e.kind == telemark_core::loss::BatchEventKind::Closed)
                    .map(|e| e.count)
                    .sum();
                assert_eq!(counted, *n, "flow {f} at point {at}");
            }
        }
        let [i, e] = sw.point_stats().unwrap();
        assert_eq!((i.admitted, e.admitted, i.evicted, i.refused), (3, 3, 3, 0));
    }

    /// With watch rules, a marking switch colors and measures the flows the rules match and
    /// forwards the others byte for byte, without learning them.
    #[test]
    fn only_watched_flows_are_marked_and_measured() {
        let cfg = SwitchConfig {
            link: LinkType::Ethernet,
            action: Action::NoAction,
            loss: Some(LossConfig::default()),
            mark: true,
            default_port: 1,
            learn: true,
            points: (0, 1, 2),
        };
        let watch = Watch { rules: vec!["src=10.0.0.1/32".parse().unwrap()] };
        let mut sw = Switch::new(cfg, 16).with_watch(watch);
        let mut pkts: Vec<Pkt> = (0..300u32)
            .map(|i| Pkt {
                ts_ns: u64::from(i),
                data: crate::gen::build_frame(&key(1 + i % 2), 18, 0, 64),
                ..Pkt::default()
            })
            .collect();
        let sent: Vec<Vec<u8>> = pkts.iter().map(|p| p.data.clone()).collect();
        let (mut ev, mut out) = (Vec::new(), Out(Vec::new()));
        for chunk in pkts.chunks_mut(BURST) {
            sw.process(chunk, &mut ev, &mut out, |_, _| false);
        }
        assert_eq!(out.0.len(), 300);
        let st = sw.stats();
        assert_eq!((st.learned, st.unwatched, sw.fib().len()), (1, 150, 1));
        for (i, (p, orig)) in pkts.iter().zip(&sent).enumerate() {
            let parsed = flow::extract(&p.data, LinkType::Ethernet).unwrap();
            if i % 2 == 1 {
                assert_eq!(&p.data, orig, "unwatched packet {i} was changed");
            } else {
                // Watched: its 150 packets colored 0 ×100 then 1 ×50.
                assert_eq!(color_of(parsed.dscp, 0), u8::from(i / 2 >= 100), "packet {i}");
            }
        }
        assert!(ev.iter().all(|e| e.key == key(1)), "events for an unwatched flow");
    }

    /// Random inserts and removals against a `HashMap` model: every flow the model holds is
    /// found with its port, none it dropped is, and `moved` keeps a parallel array (as the
    /// loss state is kept) in step with the table.
    #[test]
    fn fib_removal_keeps_every_other_flow_findable() {
        let mut fib = Fib::with_capacity(64);
        let mut model: HashMap<u32, u16> = HashMap::new();
        let mut side = vec![u32::MAX; fib.slots()];
        let mut rng = Rng::new(5);
        for step in 0..20_000u32 {
            let k = rng.below(150) as u32;
            if rng.chance(0.5) {
                let port = (step % 7) as u16;
                let full = model.len() >= 64 && !model.contains_key(&k);
                let got = fib.put(key(k), flow_hash(&key(k)), port, true);
                assert_eq!(got.is_none(), full, "insert of {k} with {} held", model.len());
                if let Some(slot) = got {
                    model.insert(k, port);
                    side[slot] = k;
                }
            } else if let Some(slot) = fib.lookup(&key(k), flow_hash(&key(k))) {
                assert_eq!(side[slot], k);
                fib.remove(slot, |from, to| {
                    side[to] = side[from];
                    side[from] = u32::MAX;
                });
                model.remove(&k);
            }
            assert_eq!(fib.len(), model.len());
        }
        for k in 0..150u32 {
            let slot = fib.lookup(&key(k), flow_hash(&key(k)));
            assert_eq!(slot.and_then(|s| fib.port(s)), model.get(&k).copied(), "flow {k}");
            if let Some(s) = slot {
                assert_eq!(side[s], k, "loss state of flow {k} did not follow it");
            }
        }
    }
}
