//! Ports for later fragments. An IP packet cut into fragments carries its transport header in
//! the first fragment only (RFC 791 §3.2, RFC 8200 §4.5); metered by their own headers, the
//! later fragments would make a second flow without ports. A small direct-mapped table keeps
//! the first fragment's ports under (source, destination, protocol, identification) until the
//! later ones come. A later fragment that arrives first, or after its entry was overwritten,
//! keeps its port-less key.

use crate::{flow_hash, FlowKey};

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The first fragment's key (ports included).
    key: Option<FlowKey>,
    id: u32,
}

/// The table.
#[derive(Debug, Clone)]
pub struct FragmentPorts {
    slots: Box<[Slot]>,
}

/// The slot index of fragment `id` of port-less flow `k`.
fn index(k: &FlowKey, id: u32, len: usize) -> usize {
    let h = flow_hash(k) ^ u64::from(id).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h as usize) & (len - 1)
}

fn portless(k: &FlowKey) -> FlowKey {
    FlowKey { sport: 0, dport: 0, ..*k }
}

impl FragmentPorts {
    /// A table of `slots` entries (rounded up to a power of two).
    pub fn new(slots: usize) -> FragmentPorts {
        FragmentPorts { slots: vec![Slot::default(); slots.max(1).next_power_of_two()].into() }
    }

    /// The first fragment of packet `id`, with its key.
    pub fn first(&mut self, key: &FlowKey, id: u32) {
        let i = index(&portless(key), id, self.slots.len());
        self.slots[i] = Slot { key: Some(*key), id };
    }

    /// A later fragment of packet `id`: its key with the first fragment's ports, if that was
    /// seen.
    pub fn later(&self, key: &FlowKey, id: u32) -> Option<FlowKey> {
        let k = portless(key);
        let s = self.slots[index(&k, id, self.slots.len())];
        s.key.filter(|f| s.id == id && portless(f) == k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_fragment_takes_its_first_fragments_ports_and_no_one_elses() {
        let mut t = FragmentPorts::new(64);
        let first = FlowKey {
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            sport: 6363,
            dport: 53,
            proto: 17,
            spi: None,
            si: None,
        };
        let later = FlowKey { sport: 0, dport: 0, ..first };
        assert_eq!(t.later(&later, 7), None);
        t.first(&first, 7);
        assert_eq!(t.later(&later, 7), Some(first));
        assert_eq!(t.later(&later, 8), None, "another packet");
        let other = FlowKey { src: "10.0.0.9".parse().unwrap(), ..later };
        assert_eq!(t.later(&other, 7), None, "another source");
    }
}
