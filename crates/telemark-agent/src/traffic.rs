//! Telemark's own live traffic generator: UDP flows at fixed packet rates, written to an
//! interface's AF_PACKET TX ring (from inside a network namespace if asked). The testbed's probe
//! flow comes from here, so its exact flow key, rate and count are known.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use telemark_datapath::afpacket::{self, RingConfig};
use telemark_datapath::gen::build_frame;
use telemark_wire::FlowKey;

/// One flow to send.
#[derive(Debug, Clone)]
pub struct FlowSpec {
    /// Flow key (addresses, ports, protocol 17).
    pub key: FlowKey,
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// UDP payload bytes.
    pub payload: usize,
    /// Packets per second.
    pub pps: u64,
}

/// Sends `flow` on `iface` (in `netns`) until `stop` is set or `duration` passed; returns the
/// packets handed to the kernel. Paced in steps of at most 512 packets; a full TX ring is
/// retried, not skipped, so the count is what was sent.
pub fn send(
    netns: Option<&str>,
    iface: &str,
    flow: &FlowSpec,
    duration: Duration,
    stop: &AtomicBool,
) -> io::Result<u64> {
    let (_rx, mut tx) = afpacket::open(
        iface,
        netns,
        RingConfig { rx_block: 1 << 16, rx_blocks: 2, ..RingConfig::default() },
    )?;
    let mut frame = build_frame(&flow.key, flow.payload, 0, 64);
    frame[0..6].copy_from_slice(&flow.dst_mac);
    frame[6..12].copy_from_slice(&flow.src_mac);
    let start = Instant::now();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let el = start.elapsed();
        if el >= duration {
            break;
        }
        let due = (el.as_nanos() * u128::from(flow.pps) / 1_000_000_000) as u64;
        let mut n = 0;
        while sent < due && n < 512 {
            if !tx.tx(&frame) {
                break;
            }
            sent += 1;
            n += 1;
        }
        tx.kick();
        if sent >= due || n == 0 {
            // On time (or the ring is full): wait a little. Behind: send on at once.
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // Let the kernel finish what is queued.
    tx.kick();
    std::thread::sleep(Duration::from_millis(5));
    Ok(sent)
}
