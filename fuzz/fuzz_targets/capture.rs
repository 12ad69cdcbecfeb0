#![no_main]
//! Fuzz target: any bytes as a pcap or pcapng file are read without a panic, each record's
//! captured bytes never exceed its wire length, and reading always ends.
use libfuzzer_sys::fuzz_target;
use std::io::Cursor;
use std::path::Path;
use telemark_datapath::capture::CaptureReader;

fuzz_target!(|data: &[u8]| {
    let Ok(mut r) = CaptureReader::from_reader(Cursor::new(data), Path::new("fuzz")) else {
        return;
    };
    let mut n = 0u64;
    while let Some(p) = r.next_packet() {
        assert!(p.data.len() as u64 <= u64::from(p.wire_len));
        n += 1;
        // Every packet takes at least a record header of the input.
        assert!(n <= data.len() as u64);
    }
    assert_eq!(n, r.packets);
});
