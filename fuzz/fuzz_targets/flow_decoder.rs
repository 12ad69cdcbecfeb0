#![no_main]
//! Fuzz target: any sequence of datagrams (the input cut into pieces, each after a 2-byte
//! length) from one exporter
//! through the collector's flow decoder, whose templates, options and held data persist from
//! one to the next: flows or counted refusals, never a panic, and never more held than its
//! bound.
use libfuzzer_sys::fuzz_target;
use telemark_collector::flows::Decoder;

fuzz_target!(|data: &[u8]| {
    let mut d = Decoder::new(4);
    let mut out = Vec::new();
    let from = std::net::IpAddr::from([192, 0, 2, 1]);
    let mut rest = data;
    while let [a, b, tail @ ..] = rest {
        let n = usize::from(u16::from_be_bytes([*a, *b])).min(tail.len());
        let (dg, next) = tail.split_at(n);
        d.datagram(from, dg, &mut out);
        assert!(d.stats.pending <= 4);
        rest = next;
    }
    assert_eq!(d.stats.flows, out.len() as u64);
});
