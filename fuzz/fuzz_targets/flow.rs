#![no_main]
//! Fuzz target: flow-key extraction through VLANs and tunnels never panics, and marking the
//! DSCP it found keeps the frame parseable to the same key.
use libfuzzer_sys::fuzz_target;
use telemark_wire::flow::{extract, set_dscp};
use telemark_wire::link::LinkType;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, frame)) = data.split_first() else { return };
    let link = match sel % 9 {
        0 => LinkType::Ethernet,
        1 => LinkType::RawIp,
        2 => LinkType::LinuxSll,
        3 => LinkType::LinuxSll2,
        4 => LinkType::Null,
        5 => LinkType::Loop,
        6 => LinkType::Nflog,
        7 => LinkType::Ppp,
        _ => LinkType::CiscoHdlc,
    };
    if let Ok(p) = extract(frame, link) {
        let mut f = frame.to_vec();
        set_dscp(&mut f, &p, p.dscp ^ 1).unwrap();
        let q = extract(&f, link).unwrap();
        assert_eq!(q.key, p.key);
        assert_eq!(q.dscp, p.dscp ^ 1);
    }
});
