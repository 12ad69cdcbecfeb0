//! `telemark demo --int`: the INT paper's event detection on the live chain testbed
//! (testbed/chain.sh). Switch s1 is the INT source for G's network, s2 a transit whose egress
//! port is a rate-limited queue, s3 the sink, detecting per-hop changes of hop latency (one
//! probe flow) and of queue occupancy (another) and sending its events to the collector.
//! Background traffic congests s2's queue in the middle of the run; each second the demo
//! prints the events next to the queue's own counters (docs/int.md, "Demo").

use super::{Args, Testbed};
use crate::traffic::{self, FlowSpec};
use anyhow::{bail, Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use telemark_agent::{Agent, FileConfig};
use telemark_collector::api::Request;
use telemark_collector::{now_ns, Collector, Config};
use telemark_wire::FlowKey;

const SCRIPT: &str = include_str!("../../../../../testbed/chain.sh");
const PREFIX: &str = "tmdi-";
/// Probe flows (source ports): hop latency watched, queue occupancy watched; background.
const LATENCY_PROBE: u16 = 5301;
const QUEUE_PROBE: u16 = 5302;
const BACKGROUND: u16 = 5303;

/// One second of the INT demo.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IntSecond {
    /// Seconds since the start.
    pub t: u64,
    /// Background traffic on.
    pub background: bool,
    /// Hop-latency events of the latency probe, and the largest latency they carried (ns).
    pub latency_events: usize,
    /// The largest.
    pub latency_max_ns: u64,
    /// Queue-occupancy events of the queue probe, and the largest occupancy (bytes).
    pub queue_events: usize,
    /// The largest.
    pub queue_max_bytes: u64,
    /// The queue's own count: bytes it held at the end of the second.
    pub backlog_bytes: u64,
    /// The time the link needs to send that backlog (ns): the delay a frame joining it sees.
    pub backlog_delay_ns: u64,
    /// Frames it dropped in the second.
    pub drops: u64,
}

fn key(sport: u16) -> FlowKey {
    FlowKey {
        src: "10.9.1.1".parse().expect("literal"),
        dst: "10.9.2.7".parse().expect("literal"),
        sport,
        dport: 7000,
        proto: 17,
        spi: None,
        si: None,
    }
}

/// Sends flow `sport` from host A at `pps` until `stop`.
fn sender(
    sport: u16,
    payload: usize,
    pps: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let spec = FlowSpec {
            key: key(sport),
            src_mac: [2, 0, 0, 0, 1, 1],
            dst_mac: [2, 0, 0, 0, 1, 0xfe],
            payload,
            pps,
            catch_up: traffic::catch_up(pps),
            churn: false,
        };
        let ns = format!("{PREFIX}a");
        if let Err(e) = traffic::send(Some(&ns), "a0", &spec, Duration::from_secs(3600), &stop) {
            tracing::warn!("sender {sport}: {e}");
        }
    })
}

fn agent(toml: &str) -> Result<Agent> {
    Ok(Agent::start(FileConfig::parse(toml)?.validate()?)?)
}

/// One detector's events in one second: how many, and the largest value.
fn events(c: &Collector, sport: u16, from: u64, to: u64) -> Result<(usize, u64)> {
    let url = format!(
        "/api/v1/events?src=10.9.1.1&dst=10.9.2.7&sport={sport}&dport=7000&proto=udp\
         &from={from}&to={to}&limit=10000"
    );
    let r = c.api.handle(&Request::get(&url), now_ns());
    if r.status != 200 {
        bail!("collector answered {} to {url}", r.status);
    }
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    let ev = v["events"].as_array().map(Vec::as_slice).unwrap_or_default();
    Ok((ev.len(), ev.iter().filter_map(|e| e["value"].as_u64()).max().unwrap_or(0)))
}

/// Runs the INT demo.
pub fn run(a: &Args, stop: Arc<AtomicBool>) -> Result<Option<super::Served>> {
    // SAFETY: plain syscall without arguments.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the demo builds network namespaces: run it as root");
    }
    let chain = Testbed::new("chain.sh", SCRIPT, &[PREFIX])?;
    let sports = format!("{LATENCY_PROBE} {QUEUE_PROBE} {BACKGROUND}");
    chain.run(&["up", &sports]).context("building the chain testbed (iproute2, nftables)")?;
    let dir = tempfile::tempdir()?;
    let db = a.db.clone().unwrap_or_else(|| dir.path().join("telemark.db"));
    let kafka = super::kafka_file(a)?;
    let c = Collector::start(&Config { listen: a.listen, db, kafka, ..Config::default() })?;
    let url = format!("http://{}", c.addr);
    let switch = |name: &str, int: &str| {
        agent(&format!(
            "agent = \"{name}\"\nnetns = \"{PREFIX}{name}\"\nmeasure = false\n\
             [[pair]]\na = \"{name}a\"\nb = \"{name}b\"\n\
             [export]\ncollector = \"{url}\"\ninterval = \"200ms\"\n{int}"
        ))
    };
    let _s1 = switch(
        "s1",
        "[int]\nnode_id = 1\n[[int.rule]]\nflows = \"dst=10.9.2.0/24\"\nrole = \"source\"\n",
    )?;
    let s2 = switch(
        "s2",
        &format!(
            "[[queue]]\nport = \"s2b\"\nrate = \"{}\"\nlimit = \"100KB\"\n\
             [int]\nnode_id = 2\n[[int.rule]]\nrole = \"transit\"\n",
            a.int_queue_rate
        ),
    )?;
    let _s3 = switch(
        "s3",
        &format!(
            "[int]\nnode_id = 3\n[[int.rule]]\nflows = \"dst=10.9.2.0/24\"\nrole = \"sink\"\n\
             [[int.detect]]\nflows = \"sport={LATENCY_PROBE}\"\ndetector = \"per_hop\"\n\
             metric = \"hop_latency\"\nthreshold = \"2ms\"\n\
             [[int.detect]]\nflows = \"sport={QUEUE_PROBE}\"\ndetector = \"per_hop\"\n\
             metric = \"queue_occupancy\"\nthreshold = \"10KB\"\n"
        ),
    )?;
    let probes_stop = Arc::new(AtomicBool::new(false));
    let probes = [
        sender(LATENCY_PROBE, 100, 500, probes_stop.clone()),
        sender(QUEUE_PROBE, 100, 500, probes_stop.clone()),
    ];
    let bg_stop = Arc::new(AtomicBool::new(false));
    let mut background = None;
    let secs = |ns: u64| ns.div_ceil(1_000_000_000);
    let (before, during) = (secs(a.before), secs(a.background));
    let total = before + during + secs(a.after);
    let rate_bps = telemark_core::units::parse_rate_bps(&a.int_queue_rate)
        .map_err(|e| anyhow::anyhow!("--int-queue-rate: {e}"))?;
    println!(
        "  t  background  latency events (largest ms)  queue events (largest B)  \
         s2 queue (its own counters): backlog B = delay ms  drops"
    );
    let mut seconds = Vec::new();
    let start = now_ns();
    let mut last_drops = 0;
    for t in 1..=total {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let on = t > before && t <= before + during;
        if on && background.is_none() {
            background = Some(sender(BACKGROUND, 1000, a.int_background_pps, bg_stop.clone()));
        }
        if !on {
            if let Some(b) = background.take() {
                bg_stop.store(true, Ordering::Release);
                let _ = b.join();
            }
        }
        let until = start + t * 1_000_000_000;
        while now_ns() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Events of the second that ended a moment ago (the agents export every 200 ms).
        std::thread::sleep(Duration::from_millis(300));
        let (from, to) = (until - 1_000_000_000, until);
        let (lat_n, lat_max) = events(&c, LATENCY_PROBE, from, to)?;
        let (q_n, q_max) = events(&c, QUEUE_PROBE, from, to)?;
        let q = s2.stats().path.queues.first().map(|x| x.1).unwrap_or_default();
        let s = IntSecond {
            t,
            background: on,
            latency_events: lat_n,
            latency_max_ns: lat_max,
            queue_events: q_n,
            queue_max_bytes: q_max,
            backlog_bytes: q.backlog_bytes,
            backlog_delay_ns: (u128::from(q.backlog_bytes) * 8_000_000_000 / u128::from(rate_bps))
                as u64,
            drops: q.dropped - last_drops,
        };
        println!(
            "{t:>3}  {:>10}  {:>6} {:>20.1}  {:>6} {:>17}  {:>31} = {:>8.1}  {:>5}",
            if on { "on" } else { "" },
            s.latency_events,
            s.latency_max_ns as f64 / 1e6,
            s.queue_events,
            s.queue_max_bytes,
            s.backlog_bytes,
            s.backlog_delay_ns as f64 / 1e6,
            s.drops
        );
        last_drops = q.dropped;
        seconds.push(s);
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_vec_pretty(&seconds)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    bg_stop.store(true, Ordering::Release);
    probes_stop.store(true, Ordering::Release);
    if let Some(b) = background {
        let _ = b.join();
    }
    for p in probes {
        let _ = p.join();
    }
    println!("events: {url}/ (the page) and {url}/api/v1/events");
    Ok(Some(super::Served { collector: c, _db_dir: dir }))
}
