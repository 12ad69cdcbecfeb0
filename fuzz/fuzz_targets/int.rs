#![no_main]
//! Fuzz target: the INT shim, INT-MD/MX headers and metadata stack never panic on any input,
//! strict or tolerant, and every hop the parser counts can be read.
use libfuzzer_sys::fuzz_target;
use telemark_wire::dialect::Mode;
use telemark_wire::int::{Field, Int};

fuzz_target!(|data: &[u8]| {
    for mode in [Mode::Strict, Mode::Tolerant] {
        if let Ok(int) = Int::parse(data, mode) {
            assert!(int.len <= data.len());
            for i in 0..int.hop_count() {
                let hop = int.hop(i).expect("a counted hop reads");
                let _ = (hop.get(Field::HopLatency), hop.reserved(9));
            }
        }
    }
});
