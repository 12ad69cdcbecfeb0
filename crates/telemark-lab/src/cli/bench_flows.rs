//! `telemark bench-flows`: how fast the collector takes flow export (docs/flows.md,
//! "Performance").
//!
//! - **Decoding, in memory, one core:** records per second the collector's decoder makes of
//!   IPFIX (a template of 13 common elements, 30 records a message), NetFlow v5 (30 records a
//!   datagram) and sFlow (10 flow samples of 128-byte headers a datagram).
//! - **End to end over loopback UDP:** a `telemark collector --flows-listen` pinned to one
//!   core, sent bursts of IPFIX datagrams at a given rate: flows stored per second, and the
//!   datagrams the kernel dropped (the socket's overflow counter) and never read.

use crate::cli::bench_collector::metric;
use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use std::ffi::OsStr;
use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};
use telemark_collector::flows::Decoder;

/// `telemark bench-flows` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Seconds of decoding per format (in memory).
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Datagram rates of the end-to-end bursts, per second (0: skip that part).
    #[arg(long, value_delimiter = ',', default_value = "20000,100000,500000")]
    pub rates: Vec<u64>,
    /// Datagrams per burst.
    #[arg(long, default_value_t = 50_000)]
    pub burst: u64,
    /// The core the collector is pinned to.
    #[arg(long, default_value_t = 1)]
    pub cpu: usize,
    /// Also store into this PostgreSQL database (a `postgresql://` URL, as `--db` takes it):
    /// the end-to-end bursts run against SQLite, then against it, in the same run.
    #[arg(long)]
    pub postgres: Option<String>,
}

/// IPFIX elements of the benchmark's template: (id, length).
const FIELDS: [(u16, u16); 13] = [
    (8, 4),   // sourceIPv4Address
    (12, 4),  // destinationIPv4Address
    (7, 2),   // sourceTransportPort
    (11, 2),  // destinationTransportPort
    (4, 1),   // protocolIdentifier
    (6, 1),   // tcpControlBits
    (5, 1),   // ipClassOfService
    (10, 4),  // ingressInterface
    (14, 4),  // egressInterface
    (1, 8),   // octetDeltaCount
    (2, 8),   // packetDeltaCount
    (152, 8), // flowStartMilliseconds
    (153, 8), // flowEndMilliseconds
];

/// An IPFIX message: the template (if asked) and 30 data records, numbered from `seq`.
fn ipfix(seq: u32, with_template: bool, flow: u32) -> Vec<u8> {
    let mut sets = Vec::new();
    if with_template {
        let mut t = vec![0, 2, 0, 0, 1, 0, 0, FIELDS.len() as u8];
        for (id, len) in FIELDS {
            t.extend_from_slice(&id.to_be_bytes());
            t.extend_from_slice(&len.to_be_bytes());
        }
        let n = t.len() as u16;
        t[2..4].copy_from_slice(&n.to_be_bytes());
        sets.extend(t);
    }
    let now_ms = telemark_transport::now_ns() / 1_000_000;
    let mut d = vec![1, 0, 0, 0];
    for r in 0..30u32 {
        let f = flow.wrapping_add(r);
        d.extend_from_slice(&[10, 1, (f >> 8) as u8, f as u8]);
        d.extend_from_slice(&[10, 2, 0, 1]);
        d.extend_from_slice(&(1024 + (f % 60000) as u16).to_be_bytes());
        d.extend_from_slice(&443u16.to_be_bytes());
        d.extend_from_slice(&[6, 0x18, 0]);
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(&4u32.to_be_bytes());
        d.extend_from_slice(&15_000u64.to_be_bytes());
        d.extend_from_slice(&10u64.to_be_bytes());
        d.extend_from_slice(&(now_ms - 1000).to_be_bytes());
        d.extend_from_slice(&now_ms.to_be_bytes());
    }
    let n = d.len() as u16;
    d[2..4].copy_from_slice(&n.to_be_bytes());
    sets.extend(d);
    let mut m = vec![0, 10, 0, 0];
    m.extend_from_slice(&((now_ms / 1000) as u32).to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&7u32.to_be_bytes());
    m.extend(sets);
    let n = m.len() as u16;
    m[2..4].copy_from_slice(&n.to_be_bytes());
    m
}

/// A NetFlow v5 datagram of 30 records.
fn netflow5(seq: u32) -> Vec<u8> {
    let mut b = vec![0, 5, 0, 30];
    b.extend_from_slice(&100_000u32.to_be_bytes());
    b.extend_from_slice(&((telemark_transport::now_ns() / 1_000_000_000) as u32).to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&seq.to_be_bytes());
    b.extend_from_slice(&[0, 0, 0, 0]);
    for r in 0..30u8 {
        let mut rec = [0u8; 48];
        rec[..4].copy_from_slice(&[10, 1, 0, r]);
        rec[4..8].copy_from_slice(&[10, 2, 0, 1]);
        rec[16..20].copy_from_slice(&10u32.to_be_bytes());
        rec[20..24].copy_from_slice(&15_000u32.to_be_bytes());
        rec[32..34].copy_from_slice(&(1024 + u16::from(r)).to_be_bytes());
        rec[34..36].copy_from_slice(&443u16.to_be_bytes());
        rec[38] = 6;
        b.extend_from_slice(&rec);
    }
    b
}

/// An sFlow datagram of 10 flow samples, each a 128-byte Ethernet/IPv4/TCP header.
fn sflow(seq: u32) -> Vec<u8> {
    let w = |b: &mut Vec<u8>, v: u32| b.extend_from_slice(&v.to_be_bytes());
    let mut frame = vec![0u8; 128];
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    frame[14] = 0x45;
    frame[16..18].copy_from_slice(&1500u16.to_be_bytes());
    frame[22] = 64;
    frame[23] = 6;
    frame[26..30].copy_from_slice(&[10, 1, 0, 1]);
    frame[30..34].copy_from_slice(&[10, 2, 0, 1]);
    frame[34..36].copy_from_slice(&40000u16.to_be_bytes());
    frame[36..38].copy_from_slice(&443u16.to_be_bytes());
    frame[46] = 0x50;
    let mut b = Vec::new();
    w(&mut b, 5);
    w(&mut b, 1);
    b.extend_from_slice(&[192, 0, 2, 1]);
    w(&mut b, 0);
    w(&mut b, seq);
    w(&mut b, 100_000);
    w(&mut b, 10);
    for s in 0..10u32 {
        let mut rec = Vec::new();
        w(&mut rec, 1); // header protocol: Ethernet
        w(&mut rec, 1518);
        w(&mut rec, 4);
        w(&mut rec, frame.len() as u32);
        rec.extend_from_slice(&frame);
        let mut sample = Vec::new();
        for v in [seq * 10 + s, 3, 1024, 0, 0, 3, 4, 1] {
            w(&mut sample, v);
        }
        w(&mut sample, 1); // flow record: sampled header
        w(&mut sample, rec.len() as u32);
        sample.extend(rec);
        w(&mut b, 1); // flow sample
        w(&mut b, sample.len() as u32);
        b.extend(sample);
    }
    b
}

/// Flows per second one decoder makes of `datagrams`, cycled for `seconds`.
fn decode_rate(datagrams: &[Vec<u8>], seconds: f64) -> f64 {
    let mut d = Decoder::new(1000);
    let from = IpAddr::from([192, 0, 2, 1]);
    let mut out = Vec::with_capacity(64);
    let start = Instant::now();
    let mut flows = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        for dg in datagrams {
            d.datagram(from, dg, &mut out);
            flows += out.len() as u64;
            out.clear();
        }
    }
    flows as f64 / start.elapsed().as_secs_f64()
}

/// Sends `n` datagrams at `rate` per second; returns the seconds it took.
fn blast(sock: &UdpSocket, to: (&str, u16), n: u64, rate: u64, seq: &mut u32) -> Result<f64> {
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < n {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < n && sent < due.max(1) {
            let m = ipfix(*seq, false, sent as u32 * 30);
            *seq = seq.wrapping_add(30);
            sock.send_to(&m, to)?;
            sent += 1;
        }
        if sent < due {
            continue;
        }
        std::thread::yield_now();
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Runs the benchmark.
pub fn run(a: Args) -> Result<()> {
    let ipfix_msgs: Vec<Vec<u8>> = std::iter::once(ipfix(0, true, 0))
        .chain((1..64).map(|i| ipfix(i * 30, false, i * 30)))
        .collect();
    let v5: Vec<Vec<u8>> = (0..64).map(|i| netflow5(i * 30)).collect();
    let sf: Vec<Vec<u8>> = (0..64).map(sflow).collect();
    println!("decoding, in memory, one core, {} s per format:", a.seconds);
    for (name, msgs) in
        [("IPFIX, 13 elements", &ipfix_msgs), ("NetFlow v5", &v5), ("sFlow, 128-byte headers", &sf)]
    {
        println!("  {name:<26} {:>12.0} flows/s", decode_rate(msgs, a.seconds));
    }
    if a.rates.iter().all(|&r| r == 0) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let sqlite = dir.path().join("flows.db");
    let mut stores = vec![("SQLite", sqlite.into_os_string())];
    if let Some(url) = &a.postgres {
        stores.push(("PostgreSQL", url.into()));
    }
    for (name, db) in stores {
        end_to_end(&a, name, &db)?;
    }
    Ok(())
}

/// The end-to-end bursts into a collector storing in `db` (a SQLite file or a PostgreSQL URL).
fn end_to_end(a: &Args, store: &str, db: &OsStr) -> Result<()> {
    let port = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
    let listen = format!("127.0.0.1:{port}");
    let exe = std::env::current_exe()?;
    let (_proc, url) = crate::cli::bench_collector::start_with(
        &exe,
        std::path::Path::new(db),
        a.cpu,
        &[
            OsStr::new("--flows-listen"),
            OsStr::new(&listen),
            OsStr::new("--flows-rcvbuf"),
            OsStr::new("8388608"),
        ],
    )?;
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    let mut seq = 0u32;
    sock.send_to(&ipfix(seq, true, 0), ("127.0.0.1", port))?;
    seq += 30;
    std::thread::sleep(Duration::from_millis(300));
    println!(
        "end to end into {store}, loopback UDP, collector pinned to cpu {}, bursts of {} IPFIX datagrams of 30 flows:",
        a.cpu, a.burst
    );
    for &rate in a.rates.iter().filter(|&&r| r > 0) {
        let (d0, s0, o0, b0) = (
            metric(&url, "telemark_collector_flow_datagrams_total")?,
            metric(&url, "telemark_collector_flow_stored_total")?,
            metric(&url, "telemark_collector_flow_receive_overflows_total")?,
            metric(&url, "telemark_collector_flow_store_behind_total")?,
        );
        let t0 = Instant::now();
        let took = blast(&sock, ("127.0.0.1", port), a.burst, rate, &mut seq)?;
        // Stored once the counters stop moving.
        let mut last = (u64::MAX, u64::MAX);
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            std::thread::sleep(Duration::from_millis(1200));
            let now = (
                metric(&url, "telemark_collector_flow_datagrams_total")?,
                metric(&url, "telemark_collector_flow_stored_total")?,
            );
            if now == last {
                break;
            }
            if Instant::now() > until {
                bail!("the collector is still storing after 2 minutes");
            }
            last = now;
        }
        let elapsed = t0.elapsed().as_secs_f64() - 1.2;
        let read = last.0 - d0;
        let stored = last.1 - s0;
        let overflow = metric(&url, "telemark_collector_flow_receive_overflows_total")? - o0;
        let behind = metric(&url, "telemark_collector_flow_store_behind_total")? - b0;
        println!(
            "  offered {:>7.0} datagrams/s ({:>8.0} flows/s): datagrams read {read} of {}, \
             kernel overflow {overflow}; flows stored {stored} ({:.0}/s over {elapsed:.1} s), \
             dropped with the store behind {behind}",
            a.burst as f64 / took,
            a.burst as f64 * 30.0 / took,
            a.burst,
            stored as f64 / elapsed.max(0.001)
        );
    }
    let _ = metric(&url, "telemark_collector_flow_datagrams_total").context("collector")?;
    Ok(())
}
