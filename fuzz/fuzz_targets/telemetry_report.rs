#![no_main]
//! Fuzz target: Telemetry Report datagrams (v0.5, v1.0, v2.0 and the tolerated dialects) never
//! panic on any input, the walk over individual reports ends, and whatever the fast reader of
//! the common report accepts, the reference readers read the same in both modes.
use libfuzzer_sys::fuzz_target;
use telemark_wire::dialect::Mode;
use telemark_wire::int::Field;
use telemark_wire::int_frame::{find_reported, Start};
use telemark_wire::report::{self, InType};
use telemark_wire::report_fast;

fuzz_target!(|data: &[u8]| {
    for mode in [Mode::Strict, Mode::Tolerant] {
        if let Ok(reports) = report::parse(data, mode) {
            for r in reports.take(data.len() + 1).flatten() {
                assert!(r.inner.len() <= data.len());
                let _ = r.metadata().get(Field::QueueOccupancy);
            }
        }
    }
    if let Some((r, f)) = report_fast::read(data) {
        for mode in [Mode::Strict, Mode::Tolerant] {
            let mut reports = report::parse(data, mode).expect("the reference reads it");
            assert_eq!(reports.next().expect("a report").expect("a good one"), r);
            assert!(reports.next().is_none());
            let start = if r.in_type == InType::Ethernet { Start::Ethernet } else { Start::Ip };
            let found = find_reported(r.inner, start, mode).expect("INT reads").expect("INT");
            assert_eq!(found, f);
        }
    }
});
