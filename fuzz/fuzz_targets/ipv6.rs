#![no_main]
//! Fuzz target: the ipv6 view and repr never panic on any input.
use libfuzzer_sys::fuzz_target;
use telemark_wire::ipv6;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = ipv6::Packet::new_lenient(data) { let _ = (p.payload(), p.upper_layer()); let _ = ipv6::Repr::parse(&p); }
});
