//! Both observation points of one switch (ingress and egress), kept beside the switch's own
//! flow table instead of in two tables of their own.
//!
//! A switch already finds every packet's flow to forward it (OvS's exact-match cache, and the
//! per-flow `used`/packet/byte statistics it updates for every packet). The loss paper's
//! prototype looks the flow up twice more, once per point, in tables of its own; here the
//! switch passes the slot its lookup found, and the loss state of both points sits at the same
//! index of a parallel array: one 64-byte line holding the hot state of ingress and egress,
//! and a second, cold line touched once per batch. No hashing, no tag compare, no second miss,
//! and no flow the switch forwards is refused for lack of room in a loss table.
//!
//! The per-flow logic is the same as the stand-alone [`ColorTable`](super::ColorTable)'s
//! (module `point`); only the storage differs.

use super::point::{self, Cold, Hot, Params, USED};
use super::slots::Counter;
use super::{BatchEvent, EventSink, LossConfig, PointStats, RefusedSet};
use telemark_wire::FlowKey;

/// Ingress and egress of one flow: one cache line for every counter width.
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct PairHot<C: Counter> {
    seen_ns: u64,
    pts: [Hot<C>; 2],
}

/// The loss state of a switch's two points, indexed by the switch's flow-table slot.
pub struct PairTable<C: Counter> {
    hot: Vec<PairHot<C>>,
    cold: Vec<[Cold; 2]>,
    params: [Params; 2],
    idle_ns: u64,
    refused: RefusedSet,
    /// Counters of the ingress (`[0]`) and egress (`[1]`) points.
    pub stats: [PointStats; 2],
}

impl<C: Counter> PairTable<C> {
    /// State for a flow table of `slots` slots; `points` numbers ingress and egress for the
    /// aggregator.
    pub fn new(cfg: &LossConfig, slots: usize, points: (u8, u8)) -> Self {
        PairTable {
            hot: vec![PairHot::default(); slots],
            cold: vec![[Cold::default(); 2]; slots],
            params: [Params::new(cfg, points.0), Params::new(cfg, points.1)],
            idle_ns: cfg.idle_ns,
            refused: RefusedSet::default(),
            stats: [PointStats::default(); 2],
        }
    }

    /// Hints the CPU to bring slot `slot`'s hot line into cache.
    #[inline(always)]
    pub fn prefetch(&self, slot: usize) {
        #[cfg(target_arch = "x86_64")]
        if let Some(e) = self.hot.get(slot) {
            // SAFETY: a prefetch hint on a live element never faults.
            unsafe {
                core::arch::x86_64::_mm_prefetch(
                    e as *const PairHot<C> as *const i8,
                    core::arch::x86_64::_MM_HINT_T0,
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }

    /// Counts one packet of the flow in slot `slot` at point `at` (0 ingress, 1 egress).
    #[inline(always)]
    pub fn observe<S: EventSink>(
        &mut self,
        at: usize,
        slot: usize,
        key: &FlowKey,
        color: u8,
        now: u64,
        sink: &mut S,
    ) {
        let (Some(e), Some(p)) = (self.hot.get_mut(slot), self.params.get(at)) else { return };
        e.seen_ns = now;
        let Some(h) = e.pts.get_mut(at) else { return };
        if point::fast(h, p, color, now) {
            self.observe_slow(at, slot, key, color, now, sink);
        }
    }

    #[cold]
    #[inline(never)]
    fn observe_slow<S: EventSink>(
        &mut self,
        at: usize,
        slot: usize,
        key: &FlowKey,
        color: u8,
        now: u64,
        sink: &mut S,
    ) {
        let (Some(e), Some(c), Some(p), Some(st)) = (
            self.hot.get_mut(slot),
            self.cold.get_mut(slot),
            self.params.get(at),
            self.stats.get_mut(at),
        ) else {
            return;
        };
        if let (Some(h), Some(c)) = (e.pts.get_mut(at), c.get_mut(at)) {
            point::slow(h, c, key, p, st, color, now, sink);
        }
    }

    /// A packet of a flow the switch's table had no room for: counted at both points, and
    /// reported (about once per flow) so nobody mistakes its absence for loss.
    #[cold]
    pub fn refuse<S: EventSink>(&mut self, key: &FlowKey, hash: u64, sink: &mut S) {
        let first = self.refused.first(hash);
        for (st, p) in self.stats.iter_mut().zip(self.params.iter()) {
            st.refused += 1;
            if first {
                sink.emit(BatchEvent::refused(key, p.point));
            }
        }
    }

    /// Whether slot `slot` holds a flow idle for longer than the idle timeout at `now`.
    pub fn is_idle(&self, slot: usize, now: u64) -> bool {
        self.hot.get(slot).is_some_and(|e| {
            e.pts.iter().any(|h| h.state & USED != 0)
                && now.saturating_sub(e.seen_ns) > self.idle_ns
        })
    }

    /// Closes and reports what slot `slot` holds at point `at` (0, 1) and frees that point.
    pub fn retire_point<S: EventSink>(
        &mut self,
        at: usize,
        slot: usize,
        key: &FlowKey,
        sink: &mut S,
    ) {
        let (Some(e), Some(c), Some(p), Some(st)) = (
            self.hot.get_mut(slot),
            self.cold.get(slot),
            self.params.get(at),
            self.stats.get_mut(at),
        ) else {
            return;
        };
        let seen = e.seen_ns;
        if let (Some(h), Some(c)) = (e.pts.get_mut(at), c.get(at)) {
            point::retire(h, c, key, p, st, seen, sink);
            *h = Hot::default();
        }
    }

    /// Retires slot `slot` at both points, ingress first, counting it as evicted.
    pub fn evict<S: EventSink>(&mut self, slot: usize, key: &FlowKey, sink: &mut S) {
        for at in 0..2 {
            self.retire_point(at, slot, key, sink);
            if let Some(s) = self.stats.get_mut(at) {
                s.evicted += 1;
            }
        }
        self.clear(slot);
    }

    /// Moves slot `from`'s state to `to` (the flow table moved the flow) and clears `from`.
    pub fn move_slot(&mut self, from: usize, to: usize) {
        if let (Some(h), Some(c)) = (self.hot.get(from).copied(), self.cold.get(from).copied()) {
            if let (Some(dh), Some(dc)) = (self.hot.get_mut(to), self.cold.get_mut(to)) {
                *dh = h;
                *dc = c;
            }
        }
        self.clear(from);
    }

    /// Frees slot `slot` without reporting (its flow left the table).
    pub fn clear(&mut self, slot: usize) {
        if let (Some(h), Some(c)) = (self.hot.get_mut(slot), self.cold.get_mut(slot)) {
            *h = PairHot::default();
            *c = [Cold::default(); 2];
        }
    }

    /// Slots.
    pub fn len(&self) -> usize {
        self.hot.len()
    }

    /// Whether the table has no slots.
    pub fn is_empty(&self) -> bool {
        self.hot.is_empty()
    }

    /// Bytes of hot state per slot (for the prefetch decision).
    pub const HOT_BYTES: usize = core::mem::size_of::<PairHot<C>>();
}

/// A [`PairTable`] whose counter width is chosen at run time (`--counter-bits`).
pub enum AnyPairTable {
    /// 8-bit counters (the paper's; B ≤ 255).
    U8(PairTable<u8>),
    /// 16-bit counters.
    U16(PairTable<u16>),
    /// 32-bit counters.
    U32(PairTable<u32>),
}

impl AnyPairTable {
    /// A table as `cfg.counter_bits` asks.
    pub fn new(cfg: &LossConfig, slots: usize, points: (u8, u8)) -> Self {
        match cfg.counter_bits {
            8 => AnyPairTable::U8(PairTable::new(cfg, slots, points)),
            16 => AnyPairTable::U16(PairTable::new(cfg, slots, points)),
            _ => AnyPairTable::U32(PairTable::new(cfg, slots, points)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::{AnyColorTable, BatchEventKind};
    use core::net::{IpAddr, Ipv4Addr};

    fn key(i: u8) -> FlowKey {
        FlowKey {
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)),
            sport: 1,
            dport: 2,
            proto: 17,
            spi: None,
            si: None,
        }
    }

    #[test]
    fn hot_state_of_both_points_is_one_cache_line() {
        assert_eq!(core::mem::size_of::<PairHot<u8>>(), 64);
        assert_eq!(core::mem::size_of::<PairHot<u32>>(), 64);
    }

    /// The pair table and two stand-alone color tables, fed the same packets (with some
    /// dropped between the points and some reordered), emit the same events.
    #[test]
    fn same_events_as_two_color_tables() {
        let cfg = LossConfig::default();
        let mut pair = PairTable::<u8>::new(&cfg, 8, (1, 2));
        let mut tables = [AnyColorTable::new(&cfg, 1), AnyColorTable::new(&cfg, 2)];
        let (mut a, mut b) = (Vec::<BatchEvent>::new(), Vec::<BatchEvent>::new());
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        for i in 0..15_000u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let f = (i % 3) as u8;
            // colors in batches of 100 per flow, with an occasional packet of the other color
            let mut color = ((i / 3 / 100) % 2) as u8;
            if rng.is_multiple_of(50) {
                color ^= 1;
            }
            let k = key(f);
            let slot = usize::from(f) * 2;
            pair.observe(0, slot, &k, color, i, &mut a);
            tables[0].observe(&k, crate::flow_hash(&k), color, i, &mut b);
            if rng % 97 != 3 {
                pair.observe(1, slot, &k, color, i, &mut a);
                tables[1].observe(&k, crate::flow_hash(&k), color, i, &mut b);
            }
        }
        for at in 0..2 {
            for f in 0..3u8 {
                pair.retire_point(at, usize::from(f) * 2, &key(f), &mut a);
            }
        }
        for t in tables.iter_mut() {
            t.flush(&mut b);
        }
        let sorted = |v: &[BatchEvent]| {
            let mut v: Vec<_> = v
                .iter()
                .map(|e| (e.point, e.key.src, e.ordinal, e.kind == BatchEventKind::Late, e.count))
                .collect();
            v.sort();
            v
        };
        assert!(a.len() > 200);
        assert_eq!(sorted(&a), sorted(&b));
        assert_eq!(pair.stats[0].late, tables[0].stats().late);
        assert_eq!(pair.stats[1].batches, tables[1].stats().batches);
    }
}
