#![no_main]
//! Fuzz target: the INT shim, INT-MD/MX headers and metadata stack never panic on any input,
//! strict or tolerant, every hop the parser counts can be read, and the sink and transit
//! edits of a whole frame and the key read from a port-signalled packet's shim never panic
//! either.
use libfuzzer_sys::fuzz_target;
use telemark_wire::dialect::Mode;
use telemark_wire::int::{Field, Hop, Int};
use telemark_wire::int_frame::{self, Signal};

fuzz_target!(|data: &[u8]| {
    for mode in [Mode::Strict, Mode::Tolerant] {
        if let Ok(int) = Int::parse(data, mode) {
            assert!(int.len <= data.len());
            for i in 0..int.hop_count() {
                let hop = int.hop(i).expect("a counted hop reads");
                let _ = (hop.get(Field::HopLatency), hop.reserved(9));
            }
        }
    }
    // With and without a loss monitor's color bit set aside from the DSCP signal.
    for color_bit in [None, Some(0)] {
        let signal = Signal { dscp: Some(0x17), udp_port: Some(5000), color_bit };
        let mut frame = data.to_vec();
        let _ = int_frame::push(&mut frame, &signal, &Hop::default(), 9000);
        let mut frame = data.to_vec();
        let _ = int_frame::strip(&mut frame, &signal, Mode::Tolerant);
    }
    // The key of a port-signalled packet, read from its shim.
    if let Ok(mut parsed) =
        telemark_wire::flow::extract(data, telemark_wire::flow::LinkType::Ethernet)
    {
        int_frame::key_as_sourced(data, &mut parsed, 5000);
    }
});
