#![no_main]
//! Fuzz target: the vlan view and repr never panic on any input.
use libfuzzer_sys::fuzz_target;
use telemark_wire::vlan;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = vlan::Tag::new_checked(data) { let _ = vlan::Repr::parse(&t); let _ = t.payload(); }
});
