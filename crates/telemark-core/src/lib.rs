//! Telemark's sans-IO core. Nothing here reads a clock, touches a socket or spawns a thread:
//! callers pass `now` (nanoseconds since the Unix epoch) and bytes, and take results back. The
//! same code runs in capture replay, in the live agent, in benchmarks and in tests.

/// Runs `$e` with `$t` bound to the table inside `$v`, an enum `$enum` with one variant per
/// counter width (`U8`, `U16`, `U32`): the one place run-time counter widths are dispatched.
#[macro_export]
#[doc(hidden)]
macro_rules! each_width {
    ($enum:ident, $v:expr, $t:ident => $e:expr) => {
        match $v {
            $enum::U8($t) => $e,
            $enum::U16($t) => $e,
            $enum::U32($t) => $e,
        }
    };
}

pub mod flowexport;
pub mod hash;
pub mod int;
pub mod loss;
pub mod records;
pub mod rng;
pub mod sketch;
pub mod spsc;
pub mod units;
pub mod watch;

pub use hash::flow_hash;
pub use telemark_wire::FlowKey;
