#![no_main]
//! Fuzz target: the tcp view and repr never panic on any input.
use libfuzzer_sys::fuzz_target;
use telemark_wire::tcp;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = tcp::Packet::new_checked(data) { let _ = (p.payload(), p.options()); if let Ok(r) = tcp::Repr::parse(&p) { let mut b = vec![0u8; r.buffer_len()]; r.emit(&mut b).unwrap(); assert_eq!(tcp::Repr::parse(&tcp::Packet::new_checked(&b[..]).unwrap()).unwrap(), r); } }
});
