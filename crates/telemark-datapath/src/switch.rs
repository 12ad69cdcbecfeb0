//! A minimal but real software switch fast path, the loss paper's evaluation subject (V-C):
//! parse, flow hash, exact-match lookup of the output port, an optional action (`dec_ttl`),
//! the loss check (`pkt_loss_chk`) at ingress and egress, and a write to the output ring.
//!
//! The loss check needs no lookup of its own, and no cache line of its own: both points' hot
//! loss state ([`PairState`]) lives in the forwarding entry the lookup found, as OvS updates a
//! flow's statistics in the entry its lookup found. An entry is one 64-byte line: a hash tag,
//! the port, the slot's state and the flow key packed into 17 bytes (IPv4 5-tuple and NSH SPI/SI; other
//! keys are compared against a side array of full keys), then the hot state (28 bytes with
//! 8-bit counters, 40 with 16-bit; with 32-bit counters an entry takes two lines). Both points
//! are counted in one call once the switch has decided the packet's fate: ingress always,
//! egress if it goes out.
//!
//! Packets move in bursts of up to [`BURST`]: the first pass parses and hashes every packet
//! and prefetches the flow's home slot, the second pass does the work, so one packet's cache
//! misses overlap with the others' (the DPDK and VPP way). No allocation, lock or syscall per
//! packet.

use crate::Pkt;
use telemark_core::flow_hash;
use telemark_core::loss::{
    color_of, with_color, Counter, EventSink, LossConfig, Marker, PairPacket, PairState, PairTable,
    PointStats, Refusal, Selection,
};
use telemark_core::watch::Watch;
use telemark_wire::flow::{self, LinkType, Parsed};
use telemark_wire::{int_frame, ipv4, ipv6, FlowKey};

/// Runs `$e` with `$core` and `$loss` bound to the switch's parts, whatever its counter width.
macro_rules! each_core {
    ($inner:expr, ($core:ident, $loss:ident) => $e:expr) => {
        match $inner {
            Inner::U8($core, $loss) => $e,
            Inner::U16($core, $loss) => $e,
            Inner::U32($core, $loss) => $e,
        }
    };
}

/// Packets per burst.
pub const BURST: usize = 32;

/// A switch's observation points, numbered as the aggregator's point specs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Points {
    /// Where it colours arriving traffic (used with [`SwitchConfig::mark`]).
    pub marker: u8,
    /// Where arriving packets are counted in.
    pub ingress: u8,
    /// Where forwarded packets are counted out.
    pub egress: u8,
}

/// What the switch does to a packet besides forwarding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Forward only (OvS `output`, the paper's `no_action`).
    NoAction,
    /// Decrement TTL / hop limit, with RFC 1624 checksum update (OvS `dec_ttl`).
    DecTtl,
}

/// Who put a flow in the forwarding table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A route from the configuration: stays until the configuration changes.
    Configured,
    /// Installed by the switch on a miss: retired when idle or no longer selected.
    Learned,
}

/// How an entry holds its flow's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyForm {
    /// Packed into the entry ([`pack`]), with or without an NSH SPI and SI.
    Packed { spi: bool, si: bool },
    /// Did not pack (IPv6, a wide SPI): the side array's full key is compared.
    Side,
}

impl KeyForm {
    const SPI: u8 = 1 << 2;
    const SI: u8 = 1 << 3;
    const SIDE: u8 = 1 << 4;

    /// The form's bits in [`SlotState`].
    #[inline(always)]
    const fn bits(self) -> u8 {
        match self {
            KeyForm::Packed { spi, si } => {
                (if spi { Self::SPI } else { 0 }) | (if si { Self::SI } else { 0 })
            }
            KeyForm::Side => Self::SIDE,
        }
    }
}

/// A slot's state: free, or holding a flow of some [`Origin`] whose key has some [`KeyForm`].
/// One byte, because the entry must stay one cache line; these methods are the only code that
/// knows the bits.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct SlotState(u8);

impl SlotState {
    const CONFIGURED: u8 = 1;
    const LEARNED: u8 = 2;
    const ORIGIN: u8 = Self::CONFIGURED | Self::LEARNED;
    const KEY: u8 = KeyForm::SPI | KeyForm::SI | KeyForm::SIDE;

    fn holding(origin: Origin, form: KeyForm) -> SlotState {
        let o = match origin {
            Origin::Configured => Self::CONFIGURED,
            Origin::Learned => Self::LEARNED,
        };
        SlotState(o | form.bits())
    }

    /// Who put the slot's flow there; `None`: the slot is free.
    #[inline(always)]
    fn origin(self) -> Option<Origin> {
        match self.0 & Self::ORIGIN {
            Self::CONFIGURED => Some(Origin::Configured),
            Self::LEARNED => Some(Origin::Learned),
            _ => None,
        }
    }

    #[inline(always)]
    fn is_free(self) -> bool {
        self.0 & Self::ORIGIN == 0
    }

    /// Whether the slot's key has form `form`.
    #[inline(always)]
    fn key_is(self, form: KeyForm) -> bool {
        self.0 & Self::KEY == form.bits()
    }
}

/// One flow: its forwarding decision and both points' hot loss state, in one cache line with
/// 8- or 16-bit counters (checked below).
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct FibEntry<C: Counter> {
    /// The flow hash's low 32 bits (which also give the home slot).
    tag: u32,
    port: u16,
    state: SlotState,
    key: [u8; 17],
    hot: PairState<C>,
}

const _: () = assert!(core::mem::size_of::<FibEntry<u8>>() == 64);
const _: () = assert!(core::mem::size_of::<FibEntry<u16>>() == 64);

/// `key` packed for an entry: the IPv4 5-tuple, then SPI (24 bits, as NSH carries it) and SI,
/// with the form saying which are present; `None` for keys that do not pack (IPv6, an SPI
/// over 24 bits). Not `KeyBytes::flow_of`, the sketches' encoding: that one keeps one NSH bit
/// for SPI and SI together and the SPI's low 24 bits, which is right for counting but would let
/// two different keys match here.
#[inline(always)]
fn pack(key: &FlowKey) -> Option<([u8; 17], KeyForm)> {
    let (core::net::IpAddr::V4(src), core::net::IpAddr::V4(dst)) = (key.src, key.dst) else {
        return None;
    };
    let spi = match key.spi {
        Some(v) if v > 0x00ff_ffff => return None,
        v => v,
    };
    let mut o = [0u8; 17];
    o[..4].copy_from_slice(&src.octets());
    o[4..8].copy_from_slice(&dst.octets());
    o[8..10].copy_from_slice(&key.sport.to_be_bytes());
    o[10..12].copy_from_slice(&key.dport.to_be_bytes());
    o[12] = key.proto;
    o[13..16].copy_from_slice(&spi.unwrap_or(0).to_be_bytes()[1..]);
    o[16] = key.si.unwrap_or(0);
    Some((o, KeyForm::Packed { spi: spi.is_some(), si: key.si.is_some() }))
}

/// A packed key as two words, compared without a call to `memcmp`.
#[inline(always)]
fn words(k: &[u8; 17]) -> (u128, u8) {
    let (head, tail) = k.split_at(16);
    let mut h = [0u8; 16];
    h.copy_from_slice(head);
    (u128::from_ne_bytes(h), tail.first().copied().unwrap_or(0))
}

/// Exact-match flow table: flow → output port, open addressing with linear probing, one cache
/// line per entry holding the flow's hot loss state too, sized at start-up (like OvS's
/// exact-match cache). The slot a lookup finds also indexes the flow's cold loss state
/// ([`PairTable`]).
#[derive(Clone)]
pub struct Fib<C: Counter = u8> {
    slots: Vec<FibEntry<C>>,
    /// Every slot's full key: compared for keys that do not pack, read by sweeps and flushes.
    keys: Vec<FlowKey>,
    mask: usize,
    len: usize,
    max: usize,
}

impl<C: Counter> Fib<C> {
    /// A table with room for `flows` flows (at most 2³⁰, so that a 32-bit tag still gives the
    /// home slot) at a load factor ≤ 0.5.
    pub fn with_capacity(flows: usize) -> Self {
        let flows = flows.clamp(1, 1 << 30);
        let n = (flows * 2).next_power_of_two();
        Fib {
            slots: vec![FibEntry::default(); n],
            keys: vec![FlowKey::default(); n],
            mask: n - 1,
            len: 0,
            max: flows,
        }
    }

    /// Adds or replaces a route; false when the table is full.
    pub fn insert(&mut self, key: FlowKey, port: u16) -> bool {
        self.put(key, flow_hash(&key), port, false).is_some()
    }

    /// Adds or replaces a route; its slot, or `None` when the table holds its capacity.
    fn put(&mut self, key: FlowKey, hash: u64, port: u16, learned: bool) -> Option<usize> {
        let (packed, form) = pack(&key).unwrap_or(([0; 17], KeyForm::Side));
        let origin = if learned { Origin::Learned } else { Origin::Configured };
        let state = SlotState::holding(origin, form);
        if let Some(i) = self.lookup(&key, hash) {
            // A new route for a flow held: its loss state stays.
            let e = self.slots.get_mut(i)?;
            e.port = port;
            e.state = state;
            return Some(i);
        }
        if self.len >= self.max {
            return None;
        }
        let mut i = hash as usize & self.mask;
        loop {
            let e = self.slots.get_mut(i)?;
            if e.state.is_free() {
                self.len += 1;
                *e = FibEntry {
                    tag: hash as u32,
                    port,
                    state,
                    key: packed,
                    hot: PairState::default(),
                };
                *self.keys.get_mut(i)? = key;
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The slot holding `key`.
    #[inline(always)]
    pub fn lookup(&self, key: &FlowKey, hash: u64) -> Option<usize> {
        let (packed, form) = pack(key).unwrap_or(([0; 17], KeyForm::Side));
        let want = words(&packed);
        let mut i = hash as usize & self.mask;
        loop {
            let e = self.slots.get(i)?;
            if e.state.is_free() {
                return None;
            }
            if e.tag == hash as u32
                && e.state.key_is(form)
                && words(&e.key) == want
                && (form != KeyForm::Side || self.keys.get(i) == Some(key))
            {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The output port of the flow in slot `slot`.
    #[inline(always)]
    pub fn port(&self, slot: usize) -> Option<u16> {
        self.slots.get(slot).filter(|e| !e.state.is_free()).map(|e| e.port)
    }

    /// The entry in slot `slot`, if a flow holds it: its port and hot loss state.
    #[inline(always)]
    fn used_mut(&mut self, slot: usize) -> Option<&mut FibEntry<C>> {
        self.slots.get_mut(slot).filter(|e| !e.state.is_free())
    }

    /// Removes the flow in slot `slot`, closing the gap by moving later flows of its probe
    /// run back (backward-shift deletion, so lookups need no tombstones); `moved(from, to)` is
    /// told of every move.
    fn remove(&mut self, slot: usize, mut moved: impl FnMut(usize, usize)) {
        let Some(e) = self.slots.get_mut(slot) else { return };
        if e.state.is_free() {
            return;
        }
        *e = FibEntry::default();
        self.len -= 1;
        let mut hole = slot;
        let mut i = (slot + 1) & self.mask;
        while let Some(e) = self.slots.get(i).copied().filter(|e| !e.state.is_free()) {
            let home = e.tag as usize & self.mask;
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
                self.keys.swap(hole, i);
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
                    e as *const FibEntry<C> as *const i8,
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

    /// The flow in slot `slot`, who put it there and its hot loss state; `None` for a free
    /// slot.
    fn entry_mut(&mut self, slot: usize) -> Option<(&FlowKey, Origin, &mut PairState<C>)> {
        let e = self.slots.get_mut(slot)?;
        let origin = e.state.origin()?;
        Some((self.keys.get(slot)?, origin, &mut e.hot))
    }
}

/// Where forwarded packets go: an output ring per port, or the next pipeline stage.
pub trait Tx {
    /// Queues packet `idx` of the burst on `port`; false if the ring was full (counted).
    fn send(&mut self, port: u16, idx: usize) -> bool;
}

/// What happens to a packet inside the switch, between its ingress and egress points, after
/// the forwarding decision: the switch's one extension point. A policy or a fault injector
/// (the lab's dropper) says whether the packet goes on; one that does not is counted in
/// [`SwitchStats::dropped`] and, with the loss check on, counted at ingress and not at egress,
/// as loss inside the switch. The switch as it ships passes everything ([`PassAll`]).
pub trait Inside {
    /// Whether packet `idx` of the burst, of flow `key`, goes on to egress.
    fn forward(&mut self, idx: usize, key: &FlowKey, pkt: &Pkt) -> bool;
}

/// Everything the forwarding decision sends goes out: [`Switch::process`].
pub struct PassAll;

impl Inside for PassAll {
    #[inline(always)]
    fn forward(&mut self, _: usize, _: &FlowKey, _: &Pkt) -> bool {
        true
    }
}

impl<F: FnMut(usize, &FlowKey, &Pkt) -> bool> Inside for F {
    #[inline(always)]
    fn forward(&mut self, idx: usize, key: &FlowKey, pkt: &Pkt) -> bool {
        self(idx, key, pkt)
    }
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
    /// The switch's observation points, as the aggregator numbers them.
    pub points: Points,
    /// The UDP port that signals INT in this domain, if one does: packets carrying INT by it
    /// are keyed by their own destination port, kept in the shim
    /// ([`int_frame::key_as_sourced`]).
    pub int_port: Option<u16>,
}

#[derive(Clone, Copy, Default)]
struct Meta {
    parsed: Option<Parsed>,
    hash: u64,
}

/// A packet whose loss check waits for the end of its burst (see `burst`).
#[derive(Clone, Copy, Default)]
struct Visit {
    idx: u8,
    color: u8,
    forwarded: bool,
    slot: u32,
}

/// Everything of the switch but the cold loss state, so a burst can borrow the two apart.
#[derive(Clone)]
struct Core<C: Counter> {
    cfg: SwitchConfig,
    fib: Fib<C>,
    marker: Option<Marker>,
    meta: [Meta; BURST],
    visits: [Visit; BURST],
    stats: SwitchStats,
    /// Flows to learn and measure (`None`: all, first come first served).
    watch: Option<Watch>,
    /// Active flow selection: of the flows `watch` lets in, learn and measure only these
    /// (`None`: all).
    selection: Option<Selection>,
}

/// The switch's parts at one counter width: the forwarding table (with the hot loss state),
/// and the cold loss state when the loss check is on.
#[derive(Clone)]
enum Inner {
    U8(Core<u8>, Option<PairTable<u8>>),
    U16(Core<u16>, Option<PairTable<u16>>),
    U32(Core<u32>, Option<PairTable<u32>>),
}

/// The switch: forwarding table, optional marker, the loss state of ingress and egress.
#[derive(Clone)]
pub struct Switch {
    inner: Inner,
}

fn parts<C: Counter>(cfg: SwitchConfig, flows: usize) -> (Core<C>, Option<PairTable<C>>) {
    let Points { marker, ingress, egress } = cfg.points;
    let fib = Fib::with_capacity(flows);
    let loss = cfg.loss.map(|l| PairTable::new(&l, fib.slots(), (ingress, egress)));
    let core = Core {
        marker: cfg.loss.filter(|_| cfg.mark).map(|l| Marker::new(&l, marker)),
        fib,
        meta: [Meta::default(); BURST],
        visits: [Visit::default(); BURST],
        stats: SwitchStats::default(),
        watch: None,
        selection: None,
        cfg,
    };
    (core, loss)
}

impl Switch {
    /// A switch with an empty forwarding table sized for `flows`. Without the loss check the
    /// entries keep room for 8-bit loss state, so that switching it on adds no line.
    pub fn new(cfg: SwitchConfig, flows: usize) -> Self {
        let inner = match cfg.loss.map(|l| l.counter_bits) {
            None | Some(8) => {
                let (c, l) = parts(cfg, flows);
                Inner::U8(c, l)
            }
            Some(16) => {
                let (c, l) = parts(cfg, flows);
                Inner::U16(c, l)
            }
            Some(_) => {
                let (c, l) = parts(cfg, flows);
                Inner::U32(c, l)
            }
        };
        Switch { inner }
    }

    /// Learns and measures only the flows `watch` matches (default: all).
    pub fn with_watch(mut self, watch: Watch) -> Self {
        self.set_watch(watch);
        self
    }

    /// New watch rules: they decide for flows learned from now on; flows already learned are
    /// measured until they go idle, so no batch is cut by the change.
    pub fn set_watch(&mut self, watch: Watch) {
        let w = Some(watch).filter(|w| !w.rules.is_empty());
        each_core!(&mut self.inner, (core, _l) => core.watch = w);
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
        each_core!(&mut self.inner, (core, loss) => {
            if let (Some(sel), Some(t)) = (&selection, loss.as_mut()) {
                deselect(core, t, sel, sink);
            }
            core.selection = selection;
        });
    }

    /// Adds or replaces a route (configuration, not learning); false when the table is full.
    pub fn route(&mut self, key: FlowKey, port: u16) -> bool {
        each_core!(&mut self.inner, (core, _l) => core.fib.insert(key, port))
    }

    /// Routes held.
    pub fn routes(&self) -> usize {
        each_core!(&self.inner, (core, _l) => core.fib.len())
    }

    /// Counters.
    pub fn stats(&self) -> SwitchStats {
        each_core!(&self.inner, (core, _l) => core.stats)
    }

    /// Counters of the ingress and egress points (`None` with the loss check off).
    pub fn point_stats(&self) -> Option<[PointStats; 2]> {
        each_core!(&self.inner, (_c, loss) => loss.as_ref().map(|t| t.stats))
    }

    /// Flows the loss check can hold (the forwarding table's capacity).
    pub fn capacity(&self) -> usize {
        each_core!(&self.inner, (core, _l) => core.fib.max)
    }

    /// The flow key the last [`Switch::process`] parsed from packet `idx` of its burst, with
    /// its `flow_hash` (`None`: the packet had no flow key), for stages after the switch.
    pub fn parsed(&self, idx: usize) -> Option<(&Parsed, u64)> {
        each_core!(&self.inner, (core, _l) => {
            core.meta.get(idx).and_then(|m| m.parsed.as_ref().map(|p| (p, m.hash)))
        })
    }

    /// Processes up to [`BURST`] packets.
    #[inline]
    pub fn process<S: EventSink, T: Tx>(&mut self, pkts: &mut [Pkt], sink: &mut S, tx: &mut T) {
        self.process_with(pkts, sink, tx, &mut PassAll)
    }

    /// Processes up to [`BURST`] packets, asking `inside` whether each goes on to egress.
    #[inline]
    pub fn process_with<S, T, I>(
        &mut self,
        pkts: &mut [Pkt],
        sink: &mut S,
        tx: &mut T,
        inside: &mut I,
    ) where
        S: EventSink,
        T: Tx,
        I: Inside,
    {
        each_core!(&mut self.inner, (core, loss) => {
            burst(core, loss.as_mut(), pkts, sink, tx, inside)
        })
    }

    /// Retires idle flows: the marker's, and the loss state of flows idle at `now` (their
    /// batches closed and reported); learned flows leave the forwarding table too. Call once
    /// per interval, off the per-packet path.
    pub fn expire<S: EventSink>(&mut self, now: u64, sink: &mut S) {
        each_core!(&mut self.inner, (core, loss) => {
            if let Some(m) = core.marker.as_mut() {
                m.expire(now, sink);
            }
            if let Some(t) = loss.as_mut() {
                expire_flows(core, t, now, sink);
            }
        })
    }

    /// Closes every open batch, upstream first: the marker's, then every flow's at ingress,
    /// then at egress, each followed by `drain` so an aggregator sees them in that order (end
    /// of capture, shutdown).
    pub fn flush<S: EventSink>(&mut self, sink: &mut S, mut drain: impl FnMut(&mut S)) {
        each_core!(&mut self.inner, (core, loss) => {
            if let Some(m) = core.marker.as_mut() {
                m.flush(sink);
                drain(sink);
            }
            let Some(t) = loss.as_mut() else { return };
            for at in 0..2 {
                for slot in 0..core.fib.slots() {
                    if let Some((key, _, hot)) = core.fib.entry_mut(slot) {
                        t.retire_point(at, hot, slot, key, sink);
                    }
                }
                drain(sink);
            }
        })
    }
}

fn expire_flows<C: Counter, S: EventSink>(
    core: &mut Core<C>,
    t: &mut PairTable<C>,
    now: u64,
    sink: &mut S,
) {
    sweep(core, t, |key, _, hot, slot, t| {
        let idle = t.is_idle(hot, now);
        if idle {
            t.evict(hot, slot, key, sink);
        }
        idle
    });
}

/// Retires the learned flows `sel` leaves out (see [`Switch::select`]).
fn deselect<C: Counter, S: EventSink>(
    core: &mut Core<C>,
    t: &mut PairTable<C>,
    sel: &Selection,
    sink: &mut S,
) {
    sweep(core, t, |key, origin, hot, slot, t| {
        let out = origin == Origin::Learned && !sel.contains(key);
        if out {
            t.cut(hot, slot, key, sink);
        }
        out
    });
}

/// Walks the forwarding table: `retire(key, origin, hot, slot, loss)` retires the flow's loss
/// state when it must and says so; a retired flow the switch learned then leaves the table
/// (backward-shift deletion moves later flows back, their loss state with them).
fn sweep<C: Counter>(
    core: &mut Core<C>,
    t: &mut PairTable<C>,
    mut retire: impl FnMut(&FlowKey, Origin, &mut PairState<C>, usize, &mut PairTable<C>) -> bool,
) {
    let mut slot = 0;
    while slot < core.fib.slots() {
        let Some((key, origin, hot)) = core.fib.entry_mut(slot) else {
            slot += 1;
            continue;
        };
        let key = *key;
        if retire(&key, origin, hot, slot, t) && origin == Origin::Learned {
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
fn burst<C, S, T, I>(
    core: &mut Core<C>,
    mut loss: Option<&mut PairTable<C>>,
    pkts: &mut [Pkt],
    sink: &mut S,
    tx: &mut T,
    inside: &mut I,
) where
    C: Counter,
    S: EventSink,
    T: Tx,
    I: Inside,
{
    let n = pkts.len().min(BURST);
    let link = core.cfg.link;
    // Pass 1: parse, hash, prefetch the flow's home slot in the table (its loss state with it).
    for (m, p) in core.meta.iter_mut().zip(pkts.iter()).take(n) {
        match flow::extract(&p.data, link) {
            Ok(mut parsed) => {
                if let Some(port) = core.cfg.int_port {
                    int_frame::key_as_sourced(&p.data, &mut parsed, port);
                }
                let h = flow_hash(&parsed.key);
                *m = Meta { parsed: Some(parsed), hash: h };
                core.fib.prefetch(h);
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
    // Pass 2: mark, look up, act, count at both points, send.
    let color_bit = core.cfg.loss.map_or(0, |l| l.color_bit);
    if loss.is_some() {
        // Where the burst's events will be written (a ring slot comes round again only long
        // after it left the cache), fetched while the burst is worked on.
        sink.prefetch();
    }
    let mut visits = 0;
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
                    if let (Some(t), Some(s)) = (loss.as_deref_mut(), s) {
                        let joins = t.admitted(m.hash, now);
                        // Flows admitted after a refusal (or while the table refuses flows)
                        // and selected flows join mid-flow: the batch open now may lack
                        // packets not counted.
                        if let Some((_, _, hot)) = core.fib.entry_mut(s) {
                            if joins {
                                t.join(hot, s, &parsed.key, sink);
                            } else if core.selection.is_some() {
                                t.arm(hot, s);
                            }
                        }
                    }
                    s
                }
            }
        };
        if let Some(mk) = core.marker.as_mut() {
            if let Some((c, _)) = mk.mark(&parsed.key, m.hash, now, sink) {
                let d = with_color(parsed.dscp, color_bit, c);
                if d != parsed.dscp && flow::set_dscp(&mut p.data, parsed, d).is_ok() {
                    parsed.dscp = d;
                }
            }
        }
        // The flow's slot and entry, read for its port and, with the loss check on, counted in.
        let entry = slot.and_then(|s| core.fib.used_mut(s).map(|e| (s, e)));
        let port = entry.as_ref().map_or(core.cfg.default_port, |(_, e)| e.port);
        let color = color_of(parsed.dscp, color_bit);
        let forwarded = (core.cfg.action != Action::DecTtl || dec_ttl(&mut p.data, parsed))
            && inside.forward(idx, &parsed.key, p);
        // Both points at once, after the switch's decision: ingress saw the packet, egress
        // sees it if it goes out. A packet the slow path must see waits for the end of the
        // burst, with its cold line fetched meanwhile; its flow's later packets in the burst
        // wait behind it, so each point still sees them in their order.
        if let Some(t) = loss.as_deref_mut() {
            match entry {
                Some((s, e)) => {
                    if !e.hot.count(color, now, forwarded) {
                        e.hot.hold_until_visit();
                        t.prefetch(s);
                        if let Some(v) = core.visits.get_mut(visits) {
                            *v = Visit { idx: idx as u8, color, forwarded, slot: s as u32 };
                            visits += 1;
                        }
                    }
                }
                None => {
                    // Not in the table (full, or not selected): forwarded, but not measured.
                    let why = if unselected { Refusal::NotSelected } else { Refusal::Full };
                    t.refuse(why, (&parsed.key, m.hash, now), sink);
                }
            }
        }
        if !forwarded {
            core.stats.dropped += 1;
            continue;
        }
        send(tx, &mut core.stats, port, idx);
    }
    // Pass 3: the packets the slow path must see, in order.
    if let Some(t) = loss {
        for v in core.visits.iter().take(visits) {
            let idx = usize::from(v.idx);
            let (Some(e), Some(Meta { parsed: Some(parsed), .. }), Some(p)) =
                (core.fib.slots.get_mut(v.slot as usize), core.meta.get(idx), pkts.get(idx))
            else {
                continue;
            };
            let pkt = PairPacket {
                slot: v.slot as usize,
                key: &parsed.key,
                color: v.color,
                now: p.ts_ns,
                forwarded: v.forwarded,
            };
            t.visit(&mut e.hot, pkt, sink);
        }
    }
}

#[cold]
#[inline(never)]
fn learn<C: Counter>(
    cfg: &SwitchConfig,
    fib: &mut Fib<C>,
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
    use core::net::{IpAddr, Ipv4Addr};
    use std::collections::HashMap;
    use telemark_core::rng::Rng;
    use telemark_wire::flow::build_frame;

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

    /// A learning switch with the loss check (points 0, 1, 2), flows sent to `port`.
    fn learning(loss: LossConfig, mark: bool, port: u16) -> SwitchConfig {
        SwitchConfig {
            link: LinkType::Ethernet,
            action: Action::NoAction,
            loss: Some(loss),
            mark,
            default_port: port,
            learn: true,
            points: Points { marker: 0, ingress: 1, egress: 2 },
            int_port: None,
        }
    }

    struct Out(Vec<(u16, usize)>);
    impl Tx for Out {
        fn send(&mut self, port: u16, idx: usize) -> bool {
            self.0.push((port, idx));
            true
        }
    }

    /// Putting a packet's slow-path visit off to the end of its burst changes nothing: three
    /// flows, often several packets of one flow in a burst, small batches (many steps),
    /// reordering and drops inside the switch give, per flow and point, the same events as the
    /// loss state driven one packet at a time with nothing put off.
    #[test]
    fn visits_put_off_to_the_end_of_the_burst_change_no_event() {
        use telemark_core::loss::{BatchEvent, PairState, PairTable};
        let loss = LossConfig { batch: 20, idle_ns: u64::MAX / 2, ..LossConfig::default() };
        let cfg = learning(loss, false, 3);
        let mut rng = Rng::new(11);
        let mut sent = [0u32; 3];
        let mut order: Vec<(usize, u8)> = (0..4_000)
            .map(|_| {
                // Flow 0 carries half the packets, so bursts hold it many times over.
                let f = [0, 0, 1, 2][rng.below(4) as usize];
                sent[f] += 1;
                (f, (((sent[f] - 1) / 20) % 2) as u8)
            })
            .collect();
        for i in 1..order.len() {
            let back = rng.below(4) as usize;
            order[i.saturating_sub(back)..=i].rotate_right(1);
        }
        let dropped = |seq: u64| seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60 == 0;
        let mut pkts: Vec<Pkt> = order
            .iter()
            .enumerate()
            .map(|(i, &(f, color))| Pkt {
                ts_ns: 10 * i as u64,
                data: build_frame(&key(f as u32), 18, color, 64),
                wire_len: 0,
            })
            .collect();
        let mut sw = Switch::new(cfg, 16);
        let (mut got, mut out) = (Vec::new(), Out(Vec::new()));
        for (c, chunk) in pkts.chunks_mut(BURST).enumerate() {
            let mut inside = |idx: usize, _: &FlowKey, _: &Pkt| !dropped((c * BURST + idx) as u64);
            sw.process_with(chunk, &mut got, &mut out, &mut inside);
        }
        sw.flush(&mut got, |_| {});
        let mut t = PairTable::<u8>::new(&loss, 3, (1, 2));
        let mut hot = [PairState::<u8>::default(); 3];
        let mut want: Vec<BatchEvent> = Vec::new();
        for (i, &(f, color)) in order.iter().enumerate() {
            let now = 10 * i as u64;
            let k = key(f as u32);
            let pkt = PairPacket { slot: f, key: &k, color, now, forwarded: !dropped(i as u64) };
            t.observe(&mut hot[f], pkt, &mut want);
        }
        for at in 0..2 {
            for (f, h) in hot.iter_mut().enumerate() {
                t.retire_point(at, h, f, &key(f as u32), &mut want);
            }
        }
        assert!(sw.stats().dropped > 100, "too few drops to show anything");
        assert!(want.iter().filter(|e| e.count > 0).count() > 300);
        // Against what arrived: every packet of a flow is counted once at ingress, in a batch
        // or as late, and every packet the switch let through once at egress.
        for f in 0..3 {
            let arrived = order.iter().filter(|(g, _)| *g == f).count() as u32;
            let out = order
                .iter()
                .enumerate()
                .filter(|(i, (g, _))| *g == f && !dropped(*i as u64))
                .count() as u32;
            for (point, truth) in [(1u8, arrived), (2, out)] {
                let counted: u32 = got
                    .iter()
                    .filter(|e| e.key == key(f as u32) && e.point == point)
                    .map(|e| e.count)
                    .sum();
                assert_eq!(counted, truth, "flow {f}, point {point}");
            }
        }
        for f in 0..3 {
            for point in [1, 2] {
                let of = |ev: &[BatchEvent]| -> Vec<BatchEvent> {
                    ev.iter().filter(|e| e.key == key(f) && e.point == point).copied().collect()
                };
                assert_eq!(of(&got), of(&want), "flow {f}, point {point}");
            }
        }
    }

    /// A learning switch measures flows it has never seen, from their first packet, and when
    /// they go idle reports their last batches at both points and forgets them; at every
    /// counter width (the hot state of 8- and 16-bit counters shares the forwarding entry's
    /// line, 32-bit counters make the entry two lines).
    #[test]
    fn learned_flows_are_measured_then_retired_when_idle() {
        for bits in [8, 16, 32] {
            learned_flows_at(bits);
        }
    }

    fn learned_flows_at(counter_bits: u8) {
        let loss = LossConfig { idle_ns: 1_000, counter_bits, ..LossConfig::default() };
        let cfg = learning(loss, false, 3);
        let mut sw = Switch::new(cfg, 16);
        // 3 flows: 250, 120 and 40 packets, colors in batches of 100, interleaved.
        let sizes = [250u32, 120, 40];
        let mut pkts = Vec::new();
        for i in 0..250u32 {
            for (f, n) in sizes.iter().enumerate() {
                if i < *n {
                    let dscp = ((i / 100) % 2) as u8;
                    let data = build_frame(&key(f as u32), 18, dscp, 64);
                    pkts.push(Pkt { ts_ns: pkts.len() as u64, data, ..Pkt::default() });
                }
            }
        }
        let (mut ev, mut out) = (Vec::new(), Out(Vec::new()));
        for chunk in pkts.chunks_mut(BURST) {
            sw.process(chunk, &mut ev, &mut out);
        }
        assert_eq!(out.0.len(), pkts.len());
        assert!(out.0.iter().all(|(port, _)| *port == 3));
        assert_eq!((sw.stats().learned, sw.routes()), (3, 3));
        // Not idle yet: nothing retired.
        sw.expire(pkts.len() as u64, &mut ev);
        assert_eq!(sw.routes(), 3);
        sw.expire(pkts.len() as u64 + 5_000, &mut ev);
        assert_eq!((sw.stats().unlearned, sw.routes()), (3, 0));
        for at in 1..=2u8 {
            for (f, n) in sizes.iter().enumerate() {
                let counted: u32 = ev
                    .iter()
                    .filter(|e| e.point == at && e.key == key(f as u32))
                    .filter(|e| e.kind == telemark_core::loss::BatchEventKind::Closed)
                    .map(|e| e.count)
                    .sum();
                assert_eq!(counted, *n, "flow {f} at point {at}, {counter_bits}-bit counters");
            }
        }
        let [i, e] = sw.point_stats().unwrap();
        assert_eq!((i.admitted, e.admitted, i.evicted, i.refused), (3, 3, 3, 0));
    }

    /// With watch rules, a marking switch colors and measures the flows the rules match and
    /// forwards the others byte for byte, without learning them.
    #[test]
    fn only_watched_flows_are_marked_and_measured() {
        let cfg = learning(LossConfig::default(), true, 1);
        let watch = Watch { rules: vec!["src=10.0.0.1/32".parse().unwrap()] };
        let mut sw = Switch::new(cfg, 16).with_watch(watch);
        let mut pkts: Vec<Pkt> = (0..300u32)
            .map(|i| Pkt {
                ts_ns: u64::from(i),
                data: build_frame(&key(1 + i % 2), 18, 0, 64),
                ..Pkt::default()
            })
            .collect();
        let sent: Vec<Vec<u8>> = pkts.iter().map(|p| p.data.clone()).collect();
        let (mut ev, mut out) = (Vec::new(), Out(Vec::new()));
        for chunk in pkts.chunks_mut(BURST) {
            sw.process(chunk, &mut ev, &mut out);
        }
        assert_eq!(out.0.len(), 300);
        let st = sw.stats();
        assert_eq!((st.learned, st.unwatched, sw.routes()), (1, 150, 1));
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

    /// Flow `i` of three kinds: plain IPv4, IPv4 with NSH (packed in the entry), and IPv6
    /// (compared against the side array), the IPv6 ones sharing their low bits with IPv4 ones.
    fn mixed_key(i: u32) -> FlowKey {
        match i % 3 {
            0 => key(i),
            1 => FlowKey { spi: Some(0x00ab_cdef - i), si: Some(254), ..key(i) },
            _ => FlowKey {
                src: IpAddr::V6(core::net::Ipv6Addr::from(u128::from(0x0a00_0000 + i))),
                dst: IpAddr::V6(core::net::Ipv6Addr::from(0x0a09_0909u128)),
                ..key(i)
            },
        }
    }

    #[test]
    fn keys_pack_only_where_nothing_is_lost() {
        assert!(pack(&key(1)).is_some() && pack(&mixed_key(1)).is_some());
        assert!(pack(&mixed_key(2)).is_none(), "IPv6 goes to the side array");
        let wide = FlowKey { spi: Some(0x0100_0000), ..key(1) };
        assert!(pack(&wide).is_none(), "an SPI over 24 bits does not pack");
        // Present-but-zero and absent SPI/SI differ.
        let zero = FlowKey { spi: Some(0), si: Some(0), ..key(1) };
        assert_ne!(pack(&zero), pack(&key(1)));
        let mut fib = Fib::<u8>::with_capacity(8);
        assert!(fib.insert(zero, 1) && fib.insert(key(1), 2) && fib.insert(wide, 3));
        let port = |f: &Fib<u8>, k: &FlowKey| f.lookup(k, flow_hash(k)).and_then(|s| f.port(s));
        assert_eq!(
            (port(&fib, &zero), port(&fib, &key(1)), port(&fib, &wide)),
            (Some(1), Some(2), Some(3))
        );
    }

    /// Random inserts and removals against a `HashMap` model, over packed and side-array keys:
    /// every flow the model holds is found with its port, none it dropped is, and `moved`
    /// keeps a parallel array (as the cold loss state is kept) in step with the table.
    #[test]
    fn fib_removal_keeps_every_other_flow_findable() {
        let key = mixed_key;
        let mut fib = Fib::<u8>::with_capacity(64);
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
