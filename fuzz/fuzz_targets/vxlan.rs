#![no_main]
//! Fuzz target: the vxlan view and repr never panic on any input.
use libfuzzer_sys::fuzz_target;
use telemark_wire::vxlan;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = vxlan::Packet::new_checked(data) { let _ = (p.payload(), p.next_protocol()); let _ = vxlan::Repr::parse(&p); }
});
