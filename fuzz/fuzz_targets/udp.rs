#![no_main]
//! Fuzz target: the udp view and repr never panic on any input.
use libfuzzer_sys::fuzz_target;
use telemark_wire::udp;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = udp::Packet::new_checked(data) { let _ = p.payload(); let _ = udp::Repr::parse(&p); }
});
