//! The paper's flow-table layout, shared by the marker and the color counter tables.
//!
//! `buckets` indices × 2 ways, indexed by the low bits of the 32-bit flow hash; bit 16 of that
//! hash picks the preferred way, the other way takes a colliding flow (loss paper, IV-B). The
//! high 32 bits of the 64-bit hash are the entry's tag. Admission is first come, first served;
//! a slot whose flow has been idle longer than the idle timeout may be taken over.

/// A per-color packet counter of configurable width (8 bits as in the paper, or wider so that
/// B can exceed 255).
pub trait Counter: Copy + Default + Send + 'static {
    /// Largest value.
    const MAX: u32;
    /// The most packets a budget of the hot path may let through before the slow path looks
    /// again (see `fast::budgets`): 127 with 8-bit counters (a budget is kept in a lane of the
    /// counter's width, with its top bit as the guard, see [`Counter::Lanes`]), 255 otherwise.
    const BUDGET: u8;
    /// One color's budgets and counters at both points of a switch, as four lanes of the
    /// counter's width in one integer (`u32` for 8-bit counters, `u64` for 16, `u128` for 32):
    /// lanes 0 and 1 hold ingress's and egress's budgets, each as how far the lane is below
    /// its top bit (a budget of b is kept as `top − 1 − b`); lanes 2 and 3 hold their
    /// counters. One add of one to every lane spends both budgets and bumps both counters
    /// ([`Counter::spend`]), and the packet was within budget if no budget lane reached its
    /// top bit. No lane carries into the next: a budget lane is kept only below its top bit
    /// (the add that would take it there is not kept), and a budget never lets a counter pass
    /// [`Self::MAX`].
    type Lanes: Copy + Default + Send + 'static;
    /// Lanes holding budgets of 0 and counters of 0.
    const EMPTY: Self::Lanes;
    /// Adds one, saturating.
    fn inc(&mut self);
    /// Adds one, wrapping (the hot path, whose budgets keep it from wrapping).
    fn bump(&mut self);
    /// `v`, or the largest value if `v` is larger.
    fn from_u32(v: u32) -> Self;
    /// The value.
    fn get(self) -> u32;
    /// Spends one packet's budget at both points and counts it at both: the new lanes, or
    /// `None` (and nothing changed) when either budget is spent or `lanes` holds no valid
    /// budget.
    fn spend(lanes: Self::Lanes) -> Option<Self::Lanes>;
    /// Point `at`'s (0, 1) budget and counter.
    fn lane(lanes: Self::Lanes, at: usize) -> (u8, Self);
    /// Sets point `at`'s budget (at most [`Self::BUDGET`]) and counter.
    fn set_lane(lanes: &mut Self::Lanes, at: usize, budget: u8, count: Self);
    /// Lanes with both points' budgets `budget` (at most [`Self::BUDGET`]) and counters
    /// `count`.
    fn both_points(budget: u8, count: Self) -> Self::Lanes;
    /// Both budgets spent, counters kept.
    fn without_budget(lanes: Self::Lanes) -> Self::Lanes;
}

macro_rules! counter {
    ($t:ty, $lanes:ty, $budget:expr) => {
        impl Counter for $t {
            const MAX: u32 = <$t>::MAX as u32;
            const BUDGET: u8 = $budget;
            type Lanes = $lanes;
            const EMPTY: $lanes = (Self::GUARD - 1) | (Self::GUARD - 1) << <$t>::BITS;
            #[inline(always)]
            fn inc(&mut self) {
                *self = self.saturating_add(1);
            }
            #[inline(always)]
            fn bump(&mut self) {
                *self = self.wrapping_add(1);
            }
            #[inline(always)]
            fn from_u32(v: u32) -> Self {
                <$t>::try_from(v).unwrap_or(<$t>::MAX)
            }
            #[inline(always)]
            fn get(self) -> u32 {
                self as u32
            }
            #[inline(always)]
            fn spend(lanes: $lanes) -> Option<$lanes> {
                const W: u32 = <$t>::BITS;
                const ONE_EACH: $lanes = 1 | 1 << W | 1 << 2 * W | 1 << 3 * W;
                const TOPS: $lanes = <$t as Guard>::GUARD | <$t as Guard>::GUARD << W;
                let next = lanes.wrapping_add(ONE_EACH);
                (next & TOPS == 0).then_some(next)
            }
            #[inline(always)]
            fn lane(lanes: $lanes, at: usize) -> (u8, Self) {
                let w = <$t>::BITS as usize * (at & 1);
                let below = (Self::GUARD - 1) as $t;
                let budget = below.saturating_sub((lanes >> w) as $t);
                (budget as u8, (lanes >> (w + 2 * <$t>::BITS as usize)) as $t)
            }
            #[inline(always)]
            fn set_lane(lanes: &mut $lanes, at: usize, budget: u8, count: Self) {
                let w = <$t>::BITS as usize * (at & 1);
                let c = w + 2 * <$t>::BITS as usize;
                let mask = <$lanes>::from(<$t>::MAX);
                *lanes = (*lanes & !(mask << w) & !(mask << c))
                    | Self::budget_lane(budget) << w
                    | <$lanes>::from(count) << c;
            }
            #[inline(always)]
            fn both_points(budget: u8, count: Self) -> $lanes {
                const W: u32 = <$t>::BITS;
                let b = Self::budget_lane(budget);
                let c = <$lanes>::from(count);
                b | b << W | c << 2 * W | c << 3 * W
            }
            #[inline(always)]
            fn without_budget(lanes: $lanes) -> $lanes {
                let counters =
                    !(<$lanes>::from(<$t>::MAX) | <$lanes>::from(<$t>::MAX) << <$t>::BITS);
                (lanes & counters) | Self::EMPTY
            }
        }
        impl Guard for $t {
            type L = $lanes;
            const GUARD: $lanes = 1 << (<$t>::BITS - 1);
            #[inline(always)]
            fn budget_lane(budget: u8) -> $lanes {
                Self::GUARD - 1 - <$lanes>::from(budget.min(<$t as Counter>::BUDGET))
            }
        }
    };
}

/// The top bit of a lane: a budget lane that would reach it has no budget left.
trait Guard {
    type L;
    const GUARD: Self::L;
    /// A budget lane holding `budget` (at most [`Counter::BUDGET`]): how far it is below the
    /// top bit, less one.
    fn budget_lane(budget: u8) -> Self::L;
}

counter!(u8, u32, 127);
counter!(u16, u64, 255);
counter!(u32, u128, 255);

/// A table entry: how the shared lookup sees it.
pub(crate) trait Slot: Copy + Default {
    /// 0 when free.
    fn tag(&self) -> u32;
    /// Last packet time.
    fn seen_ns(&self) -> u64;
}

/// Outcome of [`find_or_admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The flow has slot `.0`.
    Hit(usize),
    /// The flow was given the free slot `.0`.
    New(usize),
    /// Slot `.0` holds an idle flow that must be retired before the new flow takes it.
    Evict(usize),
    /// Both ways hold active flows: the flow is refused (counted).
    Full,
}

#[inline(always)]
pub(crate) fn tag_of(hash: u64) -> u32 {
    ((hash >> 32) as u32) | 1
}

#[inline(always)]
pub(crate) fn slot_pair(hash: u64, bucket_mask: usize) -> (usize, usize) {
    let h = hash as u32;
    let base = (h as usize & bucket_mask) << 1;
    let way = ((h >> 16) & 1) as usize;
    (base | way, base | (way ^ 1))
}

/// Finds the flow's slot or admits it, first come first served.
#[inline(always)]
pub(crate) fn find_or_admit<E: Slot>(
    slots: &[E],
    bucket_mask: usize,
    hash: u64,
    now: u64,
    idle_ns: u64,
) -> Lookup {
    let tag = tag_of(hash);
    let (a, b) = slot_pair(hash, bucket_mask);
    let (ea, eb) = match (slots.get(a), slots.get(b)) {
        (Some(x), Some(y)) => (x, y),
        _ => return Lookup::Full,
    };
    if ea.tag() == tag {
        return Lookup::Hit(a);
    }
    if eb.tag() == tag {
        return Lookup::Hit(b);
    }
    if ea.tag() == 0 {
        return Lookup::New(a);
    }
    if eb.tag() == 0 {
        return Lookup::New(b);
    }
    let idle = |e: &E| now.saturating_sub(e.seen_ns()) > idle_ns;
    if idle(ea) {
        return Lookup::Evict(a);
    }
    if idle(eb) {
        return Lookup::Evict(b);
    }
    Lookup::Full
}

/// Hints the CPU to fetch the flow's bucket (both ways) ahead of use.
#[inline(always)]
pub(crate) fn prefetch<E>(slots: &[E], bucket_mask: usize, hash: u64) {
    let (a, _) = slot_pair(hash, bucket_mask);
    let base = a & !1;
    if let Some(e) = slots.get(base) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetch is a hint; it never faults, even on an invalid address, and this one
        // is a live element of `slots`.
        unsafe {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = e as *const E as *const i8;
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p.wrapping_add(core::mem::size_of::<E>()), _MM_HINT_T0);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = e;
    }
}
