#![no_main]
//! Fuzz target: the geneve view and repr never panic on any input.
use libfuzzer_sys::fuzz_target;
use telemark_wire::geneve;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = geneve::Packet::new_checked(data) { let _ = (p.payload(), p.options()); let _ = geneve::Repr::parse(&p); }
});
