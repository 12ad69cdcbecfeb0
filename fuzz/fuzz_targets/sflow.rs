#![no_main]
//! Fuzz target: any datagram as sFlow v5: a datagram or an error, never a panic or an
//! allocation a count word alone asks for.
use libfuzzer_sys::fuzz_target;
use telemark_wire::sflow;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = sflow::parse(data) {
        assert!(d.samples.len() <= data.len() / 8);
    }
});
