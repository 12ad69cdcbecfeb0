//! Telemark's data path: packets in bursts through parse → mark → observe@ingress → forward →
//! observe@egress, over capture files (this crate) and, later, live ports. The stages call the
//! sans-IO core; only this crate knows where packets come from.

pub mod afpacket;
pub mod capture;
pub mod ebpf;
pub mod events;
pub mod flow_meter;
pub mod heavy_hitters;
pub mod input;
pub mod int_roles;
pub mod queue;
pub mod switch;
pub mod xdp;

/// One packet in flight.
#[derive(Debug, Clone, Default)]
pub struct Pkt {
    /// Capture or arrival time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// The frame (as captured: possibly cut short, see `wire_len`).
    pub data: Vec<u8>,
    /// Length of the frame on the wire, when more was sent than `data` holds (a capture's
    /// snapshot length); 0 or less than `data`: `data`'s length.
    pub wire_len: u32,
}

impl Pkt {
    /// Bytes the frame had on the wire (what `flow` records count).
    pub fn bytes_on_wire(&self) -> u64 {
        (self.wire_len as u64).max(self.data.len() as u64)
    }
}
