//! Telemark's data path: packets in bursts through parse → mark → observe@ingress → forward →
//! observe@egress, over capture files (this crate) and, later, live ports. The stages call the
//! sans-IO core; only this crate knows where packets come from.

pub mod afpacket;
pub mod bench;
pub mod bursts;
pub mod capture;
pub mod dropper;
pub mod eval;
pub mod events;
pub mod flow_meter;
pub mod gen;
pub mod heavy_hitters;
pub mod int_roles;
pub mod nitro_thread;
pub mod pipeline;
pub mod queue;
pub mod reorder;
pub mod rng;
pub mod switch;
pub mod udp_rx;
pub mod xdp;

/// One packet in flight, with the bookkeeping the evaluation needs.
#[derive(Debug, Clone, Default)]
pub struct Pkt {
    /// Capture or arrival time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// The frame (as captured: possibly cut short, see `wire_len`).
    pub data: Vec<u8>,
    /// Length of the frame on the wire, when more was sent than `data` holds (a capture's
    /// snapshot length); 0 or less than `data`: `data`'s length.
    pub wire_len: u32,
    /// Position in the source (capture order), for ground truth.
    pub seq: u64,
    /// Marker batch number of this packet, when a marker in this process colored it.
    pub batch: Option<u32>,
}

impl Pkt {
    /// Bytes the frame had on the wire (what `flow` records count).
    pub fn bytes_on_wire(&self) -> u64 {
        (self.wire_len as u64).max(self.data.len() as u64)
    }
}
