//! Telemark's own live traffic generator: UDP flows at fixed packet rates, written to an
//! interface's AF_PACKET TX ring (from inside a network namespace if asked). The testbed's probe
//! flow comes from here, so its exact flow key, rate and count are known.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use telemark_datapath::afpacket::{self, RingConfig};
use telemark_wire::flow::build_frame;
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
    /// The most packets sent back to back to catch up after falling behind; the rest of the
    /// backlog is skipped. [`catch_up`] is a constant-rate flow's.
    pub catch_up: u64,
    /// Every packet a flow of its own (one-packet flows, as a port scan or a busy DNS server
    /// makes): packet `n` has the key's source port plus `n`, wrapping within 1024..65535,
    /// and the source address plus one for each wrap. Packet `n`'s key is [`churn_key`].
    pub churn: bool,
}

/// The key of packet `n` of a churning flow `key` (see [`FlowSpec::churn`]).
pub fn churn_key(key: &FlowKey, n: u64) -> FlowKey {
    const PORTS: u64 = 65536 - 1024;
    let start = u64::from(key.sport.max(1024)) - 1024;
    let (wraps, port) = ((start + n) / PORTS, (start + n) % PORTS);
    let src = match key.src {
        std::net::IpAddr::V4(a) => {
            std::net::IpAddr::V4((u32::from(a).wrapping_add(wraps as u32)).into())
        }
        std::net::IpAddr::V6(a) => {
            std::net::IpAddr::V6((u128::from(a).wrapping_add(u128::from(wraps))).into())
        }
    };
    FlowKey { src, sport: (1024 + port) as u16, ..*key }
}

/// What [`send`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Packets handed to the kernel.
    pub sent: u64,
    /// Packets not sent because the sender fell more than `FlowSpec::catch_up` packets behind its
    /// schedule (the thread was descheduled): skipped, not sent late in one burst.
    pub skipped: u64,
}

impl FlowSpec {
    /// One constant-rate UDP flow from port 1000 to port 2000 of `payload`-byte datagrams
    /// (what the forwarding benchmarks send).
    pub fn constant_udp(
        (src, dst): (std::net::IpAddr, std::net::IpAddr),
        (src_mac, dst_mac): ([u8; 6], [u8; 6]),
        payload: usize,
        pps: u64,
    ) -> FlowSpec {
        FlowSpec {
            key: FlowKey { src, dst, sport: 1000, dport: 2000, proto: 17, spi: None, si: None },
            src_mac,
            dst_mac,
            payload,
            pps,
            catch_up: catch_up(pps),
            churn: false,
        }
    }
}

/// The most packets a sender that fell behind sends back to back to catch up: one
/// millisecond of the flow, at least 64. A constant-rate flow stays one: a sender stalled
/// for 100 ms by a busy machine would otherwise send 100 ms of packets at once, and a burst
/// that long into a full queue can take a whole marking batch (B packets) of one color, which
/// no single-point count can see (docs/loss.md, "Whole batches lost").
pub fn catch_up(pps: u64) -> u64 {
    (pps / 1000).max(64)
}

/// Packets due `el` into a flow of `pps`.
fn el_due(el: Duration, pps: u64) -> u64 {
    (el.as_nanos() * u128::from(pps) / 1_000_000_000) as u64
}

/// A sender `sent` packets in, `skipped` packets skipped, with `due` packets due by now:
/// how many it should have sent by now, and how many it has skipped. It never has more than
/// `slack` packets to catch up on.
fn schedule(due: u64, sent: u64, skipped: u64, slack: u64) -> (u64, u64) {
    let skipped = skipped.max(due.saturating_sub(sent.saturating_add(slack)));
    (due.saturating_sub(skipped), skipped)
}

/// Sends `flow` on `iface` (in `netns`) until `stop` is set or `duration` passed. Paced in
/// steps of at most 512 packets; a full TX ring is retried, not skipped, so `sent` is what
/// was sent. Falling further behind than `flow.catch_up` skips the rest (counted in `skipped`).
pub fn send(
    netns: Option<&str>,
    iface: &str,
    flow: &FlowSpec,
    duration: Duration,
    stop: &AtomicBool,
) -> io::Result<Sent> {
    let (_rx, mut tx) = afpacket::open(
        iface,
        netns,
        RingConfig { rx_block: 1 << 16, rx_blocks: 2, ..RingConfig::default() },
    )?;
    let frame_of = |key: &FlowKey| {
        let mut f = build_frame(key, flow.payload, 0, 64);
        f[0..6].copy_from_slice(&flow.dst_mac);
        f[6..12].copy_from_slice(&flow.src_mac);
        f
    };
    let mut frame = frame_of(&flow.key);
    let start = Instant::now();
    let slack = flow.catch_up;
    let (mut sent, mut skipped) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let el = start.elapsed();
        if el >= duration {
            break;
        }
        let due;
        (due, skipped) = schedule(el_due(el, flow.pps), sent, skipped, slack);
        let mut n = 0;
        while sent < due && n < 512 {
            if flow.churn {
                frame = frame_of(&churn_key(&flow.key, sent + skipped));
            }
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
    Ok(Sent { sent, skipped })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On schedule nothing is skipped; after a stall the backlog is cut to `slack` and what
    /// was cut is counted; sent + skipped + still to send is always what was due.
    #[test]
    fn a_stalled_sender_skips_its_backlog_beyond_the_slack() {
        let slack = catch_up(10_000);
        assert_eq!(slack, 64);
        assert_eq!(catch_up(1_000_000), 1000);
        // On time: 2 due, 0 sent.
        assert_eq!(schedule(2, 0, 0, slack), (2, 0));
        // 64 behind: still no skip.
        assert_eq!(schedule(164, 100, 0, slack), (164, 0));
        // A 100 ms stall at 10 kpps: 1,000 behind: 936 skipped, 64 left to send.
        let (to, skipped) = schedule(1100, 100, 0, slack);
        assert_eq!((to, skipped), (164, 936));
        // Back on schedule afterwards: the skip is kept, not repeated.
        assert_eq!(schedule(1110, 164, skipped, slack), (174, 936));
    }

    /// A churning flow's packets are all different flows, for millions of packets.
    #[test]
    fn churn_keys_do_not_repeat() {
        let base = FlowKey {
            src: "10.9.1.1".parse().unwrap(),
            dst: "10.9.2.7".parse().unwrap(),
            sport: 5000,
            dport: 7000,
            proto: 17,
            spi: None,
            si: None,
        };
        let mut seen = std::collections::HashSet::new();
        for n in (0..3_000_000).step_by(7) {
            let k = churn_key(&base, n);
            assert!(k.sport >= 1024);
            assert!(seen.insert((k.src, k.sport)), "packet {n} repeats a flow");
        }
        assert_eq!(churn_key(&base, 0), base);
    }
}
