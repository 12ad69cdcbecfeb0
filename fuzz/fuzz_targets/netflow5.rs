#![no_main]
//! Fuzz target: any datagram as NetFlow v5: its header and as many records as its count says
//! (1 to 30), or an error, never a panic.
use libfuzzer_sys::fuzz_target;
use telemark_wire::netflow5;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, records)) = netflow5::parse(data) {
        assert_eq!(records.len(), usize::from(h.count));
        assert!(data.len() >= netflow5::HEADER_LEN + records.len() * netflow5::RECORD_LEN);
    }
});
