#![no_main]
//! Fuzz target: the gre view and repr never panic on any input.
use libfuzzer_sys::fuzz_target;
use telemark_wire::gre;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = gre::Packet::new_checked(data) { let _ = gre::erspan_header_len(p.protocol(), p.has_seq(), p.payload()); let _ = gre::Repr::parse(&p); }
});
