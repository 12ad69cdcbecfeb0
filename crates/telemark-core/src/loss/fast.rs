//! The detector's compact encoding, for the fast path: the state of [`Detector`] packed into
//! [`FastState`] (what almost every packet reads and writes: 16 bytes with 8-bit counters, so both
//! points of a switch fit beside a forwarding key in one cache line, see `pair`) and [`SlowState`]
//! (what only a visit touches), and a hot path that lets most packets through without the
//! detector.
//!
//! The narrow API: [`FastState::count`] (the hot path), [`slow`] (every other packet), [`retire`],
//! [`arm`]. The slow path decodes the state into a [`Detector`] ([`load`]), runs the
//! reference's rule on it, and encodes it back ([`store`]). Which part implements which rule
//! of the reference:
//! - [`FastState::count`] is [`Detector::packet`]'s plain cases: a packet of the open batch, and an
//!   early packet of the next batch short of the step. It does not tell them apart: it spends a
//!   per-color budget ([`budgets`]) that the last visit set to exactly the packets that change
//!   nothing but their counter and the time.
//! - [`catch_up`] is [`Detector::step`], taken late: the budgets let the next batch's early
//!   packets run past the threshold without a visit, so the next visit takes the step first.
//! - The state byte packs [`Phase`], [`Watch`] and the open color; the third counter holds
//!   `late` in the late window and `resumed` outside it (the reference never has both); a
//!   counter that reached its largest value is restarted from zero and marked saturated, so
//!   the hot path never wraps it, and decoded as the largest value again.
//!
//! The property tests below run the tables' way (hot path, budgets, visits) and the reference
//! (every packet through [`Detector::packet`]) on the same packets and require the same events.

use super::detector::{Detector, Params, Phase, Tail, Watch};
use super::slots::Counter;
use super::{EventSink, PointStats};
use telemark_wire::FlowKey;

/// Bits of [`FastState::state`].
const USED: u8 = 1;
const OPEN_COLOR: u8 = 2;
const LATE_WINDOW: u8 = 4;
const ARMED: u8 = 8;
const HEAD: u8 = 16;
const SATURATED: u8 = 32;
/// Index of the third counter (late or resumed) in [`FastState::c`].
pub(crate) const THIRD: usize = 2;

/// What nearly every packet touches: 16 bytes with 8-bit counters, 20 with 16-bit ones (the
/// time is kept as two 32-bit halves so that nothing aligns the state to 8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct FastState<C: Counter> {
    /// [`Phase`], [`Watch`], open color and saturation, packed.
    state: u8,
    /// Packets of each color [`FastState::count`] may still take (see [`budgets`]).
    pub budget: [u8; 2],
    /// Each color's counter (open batch, next batch), then late or resumed packets.
    pub c: [C; 3],
    /// [`FastState::last`], low half first.
    last: [u32; 2],
}

impl<C: Counter> FastState<C> {
    /// Time of the flow's last packet here, late ones aside ([`Detector::last_ns`]).
    #[inline(always)]
    pub fn last(&self) -> u64 {
        join(self.last)
    }

    /// Whether a flow is held.
    #[inline(always)]
    pub fn used(&self) -> bool {
        self.state & USED != 0
    }

    /// The packed state byte (opaque outside this module: `pair` keeps, compares and copies
    /// it).
    #[inline(always)]
    pub fn state(&self) -> u8 {
        self.state
    }

    /// The state `state`, budgets `budget`, counters `c`, last time `last` (as `pair` keeps
    /// them).
    #[inline(always)]
    pub fn from_parts(state: u8, budget: [u8; 2], c: [C; 3], last: u64) -> Self {
        FastState { state, budget, c, last: split(last) }
    }

    /// Whether `state` is that of a flow reporting (or about to report its first batch)
    /// whose open batch of `color` is past its late window and whose counter is not
    /// saturated: where [`Detector::step`] is the only rule a packet of the next color after
    /// the step can meet (`pair`'s steady visit).
    #[inline(always)]
    pub fn plainly_open(state: u8, color: u8) -> bool {
        state & (USED | ARMED | SATURATED | OPEN_COLOR | LATE_WINDOW)
            == USED | ((color & 1) * OPEN_COLOR)
    }

    /// Whether `state`'s open batch is the first reported after an armed admission
    /// ([`Watch::Head`]).
    #[inline(always)]
    pub fn head(state: u8) -> bool {
        state & HEAD != 0
    }

    /// The state byte of a reporting flow whose open batch of `color` is past its late window.
    #[inline(always)]
    pub fn open_state(color: u8) -> u8 {
        USED | ((color & 1) * OPEN_COLOR)
    }

    /// The hot path: counts a packet that changes nothing but its counter and the time, if
    /// its color has budget left; false, having changed nothing, when it needs [`slow`].
    #[inline(always)]
    pub fn count(&mut self, color: u8, now: u64) -> bool {
        let k = usize::from(color & 1);
        let Some(budget) = self.budget.get_mut(k) else { return false };
        if *budget == 0 {
            return false;
        }
        *budget -= 1;
        if let Some(c) = self.c.get_mut(k) {
            c.bump();
        }
        self.last = split(now);
        true
    }
}

/// What only the slow path touches.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct SlowState {
    pub ordinal: u32,
    pub first_ns: u64,
    pub next_first_ns: u64,
    pub open_last_ns: u64,
}

/// A time as two 32-bit halves, low first: the hot state keeps times so, to stay 4-aligned.
#[inline(always)]
pub(crate) fn split(t: u64) -> [u32; 2] {
    [t as u32, (t >> 32) as u32]
}

/// The time [`split`] made the halves of.
#[inline(always)]
pub(crate) fn join(h: [u32; 2]) -> u64 {
    u64::from(h[0]) | u64::from(h[1]) << 32
}

/// Decodes a flow's state.
#[inline]
pub(crate) fn load<C: Counter>(h: &FastState<C>, c: &SlowState) -> Detector<C> {
    let s = h.state;
    let open_color = u8::from(s & OPEN_COLOR != 0);
    let o = usize::from(open_color);
    let phase = match (s & USED != 0, s & LATE_WINDOW != 0) {
        (false, _) => Phase::Free,
        (true, true) => Phase::LateWindow,
        (true, false) => Phase::Open,
    };
    let watch = match (s & ARMED != 0, s & HEAD != 0) {
        (true, _) => Watch::Armed,
        (false, true) => Watch::Head,
        (false, false) => Watch::Reporting,
    };
    let open = if s & SATURATED != 0 { C::from_u32(C::MAX) } else { h.c[o] };
    let third = h.c[THIRD];
    let (late, resumed) =
        if phase == Phase::LateWindow { (third, C::default()) } else { (C::default(), third) };
    Detector {
        phase,
        watch,
        open_color,
        open,
        next: h.c[o ^ 1],
        late,
        resumed,
        last_ns: h.last(),
        ordinal: c.ordinal,
        first_ns: c.first_ns,
        next_first_ns: c.next_first_ns,
        open_last_ns: c.open_last_ns,
    }
}

/// Encodes a flow's state, with the budgets for what comes next.
#[inline]
pub(crate) fn store<C: Counter>(
    h: &mut FastState<C>,
    c: &mut SlowState,
    d: &Detector<C>,
    p: &Params,
) {
    let o = usize::from(d.open_color & 1);
    h.state = encode(d);
    h.c[o] = d.open;
    h.c[o ^ 1] = d.next;
    h.c[THIRD] = if d.phase == Phase::LateWindow { d.late } else { d.resumed };
    h.last = split(d.last_ns);
    *c = SlowState {
        ordinal: d.ordinal,
        first_ns: d.first_ns,
        next_first_ns: d.next_first_ns,
        open_last_ns: d.open_last_ns,
    };
    budgets(h, p);
}

/// The state byte of `d` (saturation aside).
fn encode<C: Counter>(d: &Detector<C>) -> u8 {
    let phase = match d.phase {
        Phase::Free => 0,
        Phase::LateWindow => USED | LATE_WINDOW,
        Phase::Open => USED,
    };
    let watch = match d.watch {
        Watch::Reporting => 0,
        Watch::Armed => ARMED,
        Watch::Head => HEAD,
    };
    phase | watch | ((d.open_color & 1) * OPEN_COLOR)
}

/// Sets the budgets [`FastState::count`] spends: for each color, how many more of its packets change
/// nothing but their counter and the time in [`Detector::packet`], so that the packet after
/// them is the first the slow path must see:
/// - not in use, or timed periods: none (every packet needs the clock);
/// - in the late window: the open color without limit ([`Counter::BUDGET`] at a time); the
///   other none (a late packet, which only reordering makes). The first packet of the other
///   color after the window's end ends the window there: the window needs no visit of its own;
/// - outside it, before any early packet: the open color without limit; the other none, as
///   its first packet opens the next batch;
/// - after early packets: the open color none (a resumed packet); the other without limit,
///   past the step, which changes nothing a packet of the next color does (it counts, and
///   moves the time, before and after): the next visit takes it first ([`catch_up`]).
///
/// Per batch, the slow path sees one packet: the batch's first. It takes the step the batch
/// before it passed and ends the late window that followed.
#[inline]
fn budgets<C: Counter>(h: &mut FastState<C>, p: &Params) {
    if h.state & USED == 0 || p.period_ns.is_some() {
        h.budget = [0; 2];
        return;
    }
    let o = usize::from((h.state & OPEN_COLOR) / OPEN_COLOR);
    // A counter at its largest value is marked saturated and restarts from zero (decoded as
    // its largest value again by `load`): so the open color runs on, and no hot-path
    // increment ever wraps.
    if h.c[o].get() == C::MAX {
        h.state |= SATURATED;
        h.c[o] = C::default();
    }
    let (open, next) = (h.c[o].get(), h.c[o ^ 1].get());
    let (for_open, for_next) = if h.state & LATE_WINDOW != 0 || next == 0 {
        (budget_for::<C>(open), 0)
    } else {
        (0, budget_for::<C>(next))
    };
    h.budget = if o == 0 { [for_open, for_next] } else { [for_next, for_open] };
}

/// A color's budget with `n` of its packets counted: what its counter has room for.
#[inline(always)]
pub(crate) fn budget_for<C: Counter>(n: u32) -> u8 {
    C::MAX.saturating_sub(n).min(u32::from(C::BUDGET)) as u8
}

/// [`Detector::step`] taken late: with count-based periods the next batch's early packets run
/// past the threshold without a visit (see [`budgets`]), so a flow may come to the slow path
/// with the step behind it. Nothing the hot path counted since differs: a packet of the next
/// color counts and moves the time either way, and one of the open color, which would have
/// been resumed, was not let through.
#[inline]
fn catch_up<C: Counter, S: EventSink>(
    d: &mut Detector<C>,
    key: &FlowKey,
    p: &Params,
    stats: &mut PointStats,
    sink: &mut S,
) {
    if d.phase == Phase::Open && p.period_ns.is_none() && d.next.get() >= p.close_at {
        let last = d.last_ns;
        d.step(key, p, stats, last, sink);
    }
}

/// Every packet the hot path left: decoded, the step the budgets let pass taken, the packet
/// through [`Detector::packet`], encoded back with new budgets.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn slow<C: Counter, S: EventSink>(
    h: &mut FastState<C>,
    c: &mut SlowState,
    key: &FlowKey,
    p: &Params,
    stats: &mut PointStats,
    color: u8,
    now: u64,
    sink: &mut S,
) {
    let mut d = load(h, c);
    catch_up(&mut d, key, p, stats, sink);
    d.packet(key, p, stats, color, now, sink);
    store(h, c, &d, p);
}

/// Closes and reports everything the flow holds ([`Detector::retire`]). The caller frees
/// the state.
pub(crate) fn retire<C: Counter, S: EventSink>(
    h: &FastState<C>,
    c: &SlowState,
    key: &FlowKey,
    p: &Params,
    stats: &mut PointStats,
    how: Tail,
    sink: &mut S,
) {
    let mut d = load(h, c);
    catch_up(&mut d, key, p, stats, sink);
    d.retire(key, p, stats, how, sink);
}

/// Admits a flow armed ([`Detector::armed`]). The caller has cleared the state.
pub(crate) fn arm<C: Counter>(h: &mut FastState<C>) {
    *h = FastState { state: encode(&Detector::<C>::armed()), ..FastState::default() };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::{BatchEvent, LossConfig};
    use proptest::prelude::*;

    /// One flow's packets (colors, 10 ns apart) through one point, then a flush: every event,
    /// and the point's counters. `budgeted`: as the tables run it, in the compact encoding,
    /// the hot path first; otherwise the reference, every packet through the detector.
    fn run<C: Counter>(
        cfg: &LossConfig,
        colors: &[u8],
        armed: bool,
        budgeted: bool,
    ) -> (Vec<BatchEvent>, PointStats) {
        let p = Params::new(cfg, 3);
        let (mut stats, mut ev) = (PointStats::default(), Vec::new());
        let key = FlowKey::default();
        if !budgeted {
            let mut d = if armed { Detector::<C>::armed() } else { Detector::default() };
            for (i, &color) in colors.iter().enumerate() {
                d.packet(&key, &p, &mut stats, color, 1_000 + 10 * i as u64, &mut ev);
            }
            d.retire(&key, &p, &mut stats, Tail::End, &mut ev);
            return (ev, stats);
        }
        let (mut h, mut c) = (FastState::<C>::default(), SlowState::default());
        if armed {
            arm(&mut h);
        }
        for (i, &color) in colors.iter().enumerate() {
            let now = 1_000 + 10 * i as u64;
            if !h.count(color, now) {
                slow(&mut h, &mut c, &key, &p, &mut stats, color, now, &mut ev);
            }
        }
        retire(&h, &c, &key, &p, &mut stats, Tail::End, &mut ev);
        (ev, stats)
    }

    /// B-packet batches of alternating colors, each packet dropped with probability `drop`
    /// (in runs, when `bursty`), then moved back by up to `depth` places.
    fn marked(seed: u64, n: usize, b: u32, drop: f64, bursty: bool, depth: usize) -> Vec<u8> {
        let mut r = seed | 1;
        let mut rand = move || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            (r >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut out = Vec::with_capacity(n);
        let mut burst = 0;
        for i in 0..n {
            if burst > 0 {
                burst -= 1;
                continue;
            }
            if rand() < drop {
                burst = if bursty { (rand() * 8.0) as usize } else { 0 };
                continue;
            }
            out.push(((i as u32 / b.max(1)) & 1) as u8);
        }
        for i in 1..out.len() {
            let back = (rand() * (depth + 1) as f64) as usize;
            out[i.saturating_sub(back)..=i].rotate_right(1);
        }
        out
    }

    fn cfg(batch: u32, threshold: f64, period: bool) -> LossConfig {
        LossConfig {
            batch,
            threshold,
            period_ns: period.then_some(batch as u64 * 10),
            ..LossConfig::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// The budgets let through exactly the packets the state machine would only count:
        /// every event and counter is the same on marked traffic with loss and reordering, and
        /// the events account for every packet.
        #[test]
        fn budgets_change_no_event_on_marked_traffic(
            seed in any::<u64>(),
            b in 1u32..=255,
            threshold in prop::sample::select(vec![0.05, 0.3, 0.5, 0.95]),
            drop in prop::sample::select(vec![0.0, 0.01, 0.2, 0.7]),
            bursty in any::<bool>(),
            depth in 0usize..40,
            armed in any::<bool>(),
            period in prop::bool::weighted(0.1),
        ) {
            let colors = marked(seed, 2_000, b, drop, bursty, depth);
            let c = cfg(b, threshold, period);
            let (ev, _) = run::<u32>(&c, &colors, armed, true);
            if !armed {
                // Against the packets themselves: each is counted once, in a batch or late.
                // (With 32-bit counters: reordering beyond the late window can merge batches
                // past what 8 bits hold, and a saturated counter loses the rest.)
                prop_assert_eq!(ev.iter().map(|e| e.count as usize).sum::<usize>(), colors.len());
            }
            prop_assert!(run::<u8>(&c, &colors, armed, true) == run::<u8>(&c, &colors, armed, false));
            prop_assert!(run::<u32>(&c, &colors, armed, true) == run::<u32>(&c, &colors, armed, false));
        }

        /// And on any sequence of colors at all, with batches too long for 8-bit counters.
        #[test]
        fn budgets_change_no_event_on_any_colors(
            colors in prop::collection::vec(0u8..4, 0..3_000),
            b in prop::sample::select(vec![1u32, 2, 3, 10, 100, 255, 600, 1_000]),
            threshold in prop::sample::select(vec![0.05, 0.3, 0.95]),
            armed in any::<bool>(),
        ) {
            let c = cfg(b, threshold, false);
            let (ev, _) = run::<u16>(&c, &colors, armed, true);
            if !armed {
                prop_assert_eq!(ev.iter().map(|e| e.count as usize).sum::<usize>(), colors.len());
            }
            prop_assert!(run::<u16>(&c, &colors, armed, true) == run::<u16>(&c, &colors, armed, false));
            if b <= 255 {
                prop_assert!(run::<u8>(&c, &colors, armed, true) == run::<u8>(&c, &colors, armed, false));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]

        /// Traffic marked with batches longer than the configured B, and than 8-bit counters
        /// hold: the saturated counter, restarted on the hot path, reads as saturated.
        #[test]
        fn budgets_change_no_event_when_batches_overflow_the_counters(
            seed in any::<u64>(),
            marked_b in 200u32..1_000,
            drop in prop::sample::select(vec![0.0, 0.05]),
            depth in 0usize..5,
        ) {
            let colors = marked(seed, 4_000, marked_b, drop, false, depth);
            let c = cfg(100, 0.3, false);
            prop_assert!(run::<u8>(&c, &colors, false, true) == run::<u8>(&c, &colors, false, false));
        }
    }

    #[test]
    fn the_hot_state_keeps_its_size() {
        assert_eq!(core::mem::size_of::<FastState<u8>>(), 16);
        assert_eq!(core::mem::size_of::<FastState<u16>>(), 20);
        assert_eq!(core::mem::size_of::<FastState<u32>>(), 24);
    }
}
