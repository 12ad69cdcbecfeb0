#![no_main]
//! Fuzz target: Telemetry Report datagrams (v0.5, v1.0, v2.0 and the tolerated dialects) never
//! panic on any input, and the walk over individual reports ends.
use libfuzzer_sys::fuzz_target;
use telemark_wire::dialect::Mode;
use telemark_wire::int::Field;
use telemark_wire::report;

fuzz_target!(|data: &[u8]| {
    for mode in [Mode::Strict, Mode::Tolerant] {
        if let Ok(reports) = report::parse(data, mode) {
            for r in reports.take(data.len() + 1).flatten() {
                assert!(r.inner.len() <= data.len());
                let _ = r.metadata().get(Field::QueueOccupancy);
            }
        }
    }
});
