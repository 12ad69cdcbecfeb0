#![no_main]
//! Fuzz target: the ethernet view and repr never panic on any input.
use libfuzzer_sys::fuzz_target;
use telemark_wire::ethernet;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = ethernet::Frame::new_checked(data) { let _ = ethernet::Repr::parse(&f); let _ = (f.payload(), f.src(), f.dst()); }
});
