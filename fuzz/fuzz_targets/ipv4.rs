#![no_main]
//! Fuzz target: the ipv4 view and repr never panic on any input.
use libfuzzer_sys::fuzz_target;
use telemark_wire::ipv4;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = ipv4::Packet::new_lenient(data) { let _ = (p.payload(), p.options(), p.verify_checksum()); if let Ok(r) = ipv4::Repr::parse(&p) { let mut b = vec![0u8; r.buffer_len() + r.payload_len]; let _ = r.emit(&mut b); } }
});
