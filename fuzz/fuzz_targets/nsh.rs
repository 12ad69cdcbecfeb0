#![no_main]
//! Fuzz target: the nsh view and repr never panic on any input.
use libfuzzer_sys::fuzz_target;
use telemark_wire::nsh;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = nsh::Packet::new_checked(data) { let _ = (p.payload(), p.metadata()); if let Ok(r) = nsh::Repr::parse(&p) { let mut b = vec![0u8; r.buffer_len()]; r.emit(&mut b).unwrap(); assert_eq!(nsh::Repr::parse(&nsh::Packet::new_checked(&b[..]).unwrap()).unwrap(), r); } }
});
