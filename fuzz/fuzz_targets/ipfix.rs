#![no_main]
//! Fuzz target: any datagram as an IPFIX message or NetFlow v9 packet. Templates it defines
//! go into one cache and its data sets are read with them, in wire order: errors, never a
//! panic; every record read takes at least its template's shortest length.
use libfuzzer_sys::fuzz_target;
use telemark_wire::ipfix::{self, Message, SetKind, Templates};

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Message::parse(data) else { return };
    let mut templates = Templates::new();
    for set in m.sets() {
        let Ok(set) = set else { break };
        match set.kind {
            SetKind::Template | SetKind::OptionsTemplate => {
                for r in set.templates().flatten() {
                    templates.apply(r);
                }
            }
            SetKind::Data(id) => {
                let Some(t) = templates.get(id).cloned() else { continue };
                for rec in set.records(&t).flatten() {
                    let mut n = 0;
                    for (f, bytes) in rec.fields() {
                        let _ = ipfix::value(f, bytes);
                        n += 1;
                    }
                    assert_eq!(n, t.fields.len());
                }
            }
            SetKind::Reserved(_) => {}
        }
    }
});
