//! The running collector: receive workers (one per socket, reports read and detectors run on
//! the worker's core), the exporter that drains their rings to the collector's store, and the
//! listener for `/metrics` and the control API.

use crate::config::{self, Args, Config};
use crate::control::Control;
use crate::metrics::Listener;
use crate::stats::{Shared, WorkerStats};
use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use telemark_core::int::collect::Collector;
use telemark_core::int::sequence::Sequences;
use telemark_core::int::{DetectRule, Detectors, Event};
use telemark_core::records::Record;
use telemark_core::spsc;
use telemark_datapath::xdp::{udp_payload, XdpProgram, XskRx};
use telemark_socket::udp::{RxOptions, UdpRx};
use telemark_socket::Prefix;
use telemark_transport::exporter::Exporter;
use telemark_transport::server::{Server, ServerConfig, ServerStats};

/// Runs until SIGINT/SIGTERM.
pub fn run(a: Args) -> Result<()> {
    let cfg = config::resolve(a)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let shared =
        Arc::new(Shared { sequences: Mutex::new(Sequences::new(cfg.limits)), ..Shared::default() });
    shared
        .workers
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .resize(cfg.workers, WorkerStats::default());
    let opts = RxOptions { rcvbuf: cfg.rcvbuf, ..RxOptions::default() };
    // Bind every socket before starting (a bad address or interface fails at once). With
    // AF_XDP, one XDP socket per worker and one UDP socket for what XDP passes on.
    let mut sources = Vec::new();
    let udp_workers = if cfg.xdp.is_some() { 1 } else { cfg.workers };
    for _ in 0..udp_workers {
        let rx = UdpRx::bind(cfg.listen, opts)
            .with_context(|| format!("listening on {}", cfg.listen))?;
        sources.push(Source::Udp(rx));
    }
    let bound = match &sources[0] {
        Source::Udp(rx) => rx.local_addr()?,
        Source::Xdp(_) => cfg.listen,
    };
    let program = match &cfg.xdp {
        Some((iface, mode)) => {
            let p = XdpProgram::attach(iface, bound.port(), *mode)
                .with_context(|| format!("AF_XDP on {iface}"))?;
            for q in 0..cfg.workers {
                let x = p.socket(q as u32).with_context(|| {
                    format!("AF_XDP socket on {iface} queue {q} (one per worker; fewer --workers?)")
                })?;
                sources.push(Source::Xdp(x));
            }
            Some(p)
        }
        None => None,
    };
    shared
        .workers
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .resize(sources.len(), WorkerStats::default());
    let mut consumers = Vec::new();
    let mut threads = Vec::new();
    let n_sources = sources.len();
    let control = Arc::new(Control::new(&cfg.rules, n_sources, cfg.flows));
    for (w, rx) in sources.into_iter().enumerate() {
        let (tx, rx_events) = spsc::channel::<Item>(cfg.queue.div_ceil(n_sources).max(64));
        consumers.push(rx_events);
        let detectors = Detectors::new(cfg.rules.rules.to_vec(), cfg.flows);
        let (stop, shared, mode) = (stop.clone(), shared.clone(), cfg.mode);
        let (allow, control) = (cfg.allow.clone(), control.clone());
        threads.push(std::thread::Builder::new().name(format!("int-rx-{w}")).spawn(move || {
            let c = Collector::new(detectors, mode).with_shared_sequences();
            worker(w, rx, c, tx, &allow, &stop, &shared, &control)
        })?);
    }
    let server = match &cfg.metrics {
        Some((listen, token)) => {
            let transport = Arc::new(ServerStats::default());
            let handler = Arc::new(Listener {
                name: cfg.name.clone(),
                shared: shared.clone(),
                token: token.clone(),
                control_token: cfg.control_token.clone(),
                control: control.clone(),
                transport: transport.clone(),
            });
            let scfg = ServerConfig::metrics_listener(*listen, cfg.control_token.is_some());
            Some(Server::start(scfg, handler, transport)?)
        }
        None => None,
    };
    tracing::info!(
        "telemark int-collector {}: reports on udp {bound}{} from {} ({} worker(s), {:?} mode, {} rule(s)), events to {}",
        cfg.name,
        cfg.xdp.as_ref().map_or(String::new(), |(i, m)| format!(" and AF_XDP on {i} ({m:?})")),
        if cfg.allow.is_empty() { "anywhere (loopback)".to_string() } else { format!("{} prefix(es)", cfg.allow.len()) },
        cfg.workers,
        cfg.mode,
        cfg.rules.rules.len(),
        cfg.collector.as_deref().unwrap_or("nowhere (no collector)")
    );
    export(&cfg, &consumers, &stop, &shared);
    for t in threads {
        let _ = t.join();
    }
    drop(program);
    if let Some(s) = server {
        s.stop();
    }
    tracing::info!("stopped");
    Ok(())
}

/// Where a worker's datagrams come from.
enum Source {
    /// A UDP socket (recvmmsg).
    Udp(UdpRx),
    /// An AF_XDP socket (whole frames; the UDP payload is taken out).
    Xdp(XskRx),
}

impl Source {
    /// Reads a batch, hands each datagram, whether it was cut and its sender to `f`;
    /// returns how many.
    fn batch(&mut self, mut f: impl FnMut(&[u8], bool, Option<IpAddr>)) -> std::io::Result<usize> {
        match self {
            Source::Udp(rx) => {
                let n = rx.recv()?;
                for i in 0..n {
                    let (d, cut) = rx.datagram(i);
                    f(d, cut, rx.source(i).map(|a| a.ip()));
                }
                Ok(n)
            }
            Source::Xdp(x) => {
                let n = x.recv(100)?;
                for i in 0..n {
                    // A frame the program redirected without a whole UDP datagram in it is
                    // counted malformed, as any datagram that is not a report. The program
                    // takes Ethernet/IPv4 only: the sender is at bytes 26..30.
                    let frame = x.frame(i);
                    let src = frame.get(26..30).map(|a| IpAddr::from([a[0], a[1], a[2], a[3]]));
                    f(udp_payload(frame).unwrap_or(&[]), false, src);
                }
                x.release();
                Ok(n)
            }
        }
    }

    /// Datagrams the kernel dropped before this worker saw them.
    fn drops(&self) -> u64 {
        match self {
            Source::Udp(rx) => rx.kernel_drops(),
            Source::Xdp(x) => {
                let s = x.stats();
                s.rx_dropped + s.rx_ring_full
            }
        }
    }
}

/// What a worker hands the exporter, in order: events, and the rules the events after it
/// fired under (so a record names the rule its event fired under, whenever it is exported).
// Events by value, as before: the ring's slots are event-sized anyway, and a box would
// allocate for every event on the receive path.
#[allow(clippy::large_enum_variant)]
enum Item {
    Event(Event),
    Rules(Arc<Vec<DetectRule>>),
}

/// Rules the exporter is to be told of before the next event, if the ring had no room yet.
type Marker = Option<Arc<Vec<DetectRule>>>;

/// Hands `e` to the exporter, after the new rules in `marker` if there are any; whether it
/// went (a full ring drops it).
fn send(tx: &spsc::Producer<Item>, marker: &mut Marker, e: Event) -> bool {
    if let Some(r) = marker.take() {
        if let Err(Item::Rules(r)) = tx.push(Item::Rules(r)) {
            *marker = Some(r);
            return false;
        }
    }
    tx.push(Item::Event(e)).is_ok()
}

#[allow(clippy::too_many_arguments)]
fn worker(
    w: usize,
    mut rx: Source,
    mut c: Collector,
    tx: spsc::Producer<Item>,
    allow: &[Prefix],
    stop: &AtomicBool,
    shared: &Shared,
    control: &Control,
) {
    let mut truncated = 0u64;
    let mut ring_dropped = 0u64;
    let mut last_publish = Instant::now();
    let mut marker: Marker = None;
    while !stop.load(Ordering::Relaxed) {
        let now = telemark_transport::now_ns();
        let r = rx.batch(|d, cut, src| {
            // Reports carry no credentials: the sender's address is what keeps strangers out.
            if !config::allowed(allow, src) {
                c.not_allowed();
                return;
            }
            truncated += u64::from(cut);
            c.datagram(d, now, |e| {
                if !send(&tx, &mut marker, e) {
                    ring_dropped += 1;
                }
            });
        });
        if let Err(e) = r {
            tracing::warn!("worker {w}: receive failed: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
        // One lock per batch for the batch's sequence numbers.
        {
            let mut obs = c.take_observations().peekable();
            if obs.peek().is_some() {
                if let Ok(mut seqs) = shared.sequences.lock() {
                    obs.for_each(|o| seqs.observe(o));
                }
            }
        }
        if last_publish.elapsed() >= Duration::from_millis(100) || stop.load(Ordering::Relaxed) {
            last_publish = Instant::now();
            // New rules from the control API, their table built already: every flow's
            // detector state starts again.
            if let Some((rules, table)) = control.take(w) {
                *c.detectors_mut() = table;
                marker = Some(rules);
            }
            if let Some(r) = marker.take() {
                if let Err(Item::Rules(r)) = tx.push(Item::Rules(r)) {
                    marker = Some(r);
                }
            }
            shared.ring_dropped.fetch_add(std::mem::take(&mut ring_dropped), Ordering::Relaxed);
            let t = c.detectors().counts();
            let stats = WorkerStats {
                path: match rx {
                    Source::Udp(_) => "udp",
                    Source::Xdp(_) => "xdp",
                },
                counts: c.counts().clone(),
                kernel_drops: rx.drops(),
                truncated,
                flows: t.flows,
                states: t.states,
                evicted: t.evicted,
            };
            if let Ok(mut ws) = shared.workers.lock() {
                ws[w] = stats;
            }
        }
    }
}

/// Drains the workers' rings into the exporter, flushing every 200 ms, until stopped; then
/// flushes what is left for up to 5 s.
fn export(cfg: &Config, rings: &[spsc::Consumer<Item>], stop: &AtomicBool, shared: &Shared) {
    let boot = telemark_transport::now_ns();
    let mut ex = cfg.collector.as_ref().map(|url| {
        let e = Exporter::new(url, &cfg.name, boot, cfg.queue).with_token(cfg.token.as_deref());
        match &cfg.tls {
            Some(t) => e.with_tls(t.clone()),
            None => e,
        }
    });
    let mut last_flush = Instant::now();
    let mut warned = false;
    // Per ring, the rules its events fired under.
    let mut rules = vec![cfg.rules.rules.clone(); rings.len()];
    let mut take = |ex: &mut Option<Exporter>, i: usize, item: Item| match item {
        Item::Rules(r) => rules[i] = r,
        Item::Event(e) => {
            if let Some(ex) = ex.as_mut() {
                ex.push(Record::Event(e.record(&cfg.name, &rules[i])));
            }
        }
    };
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        let mut got = 0;
        for (i, r) in rings.iter().enumerate() {
            got += r.drain(|item| take(&mut ex, i, item));
        }
        if let Some(ex) = ex.as_mut() {
            if last_flush.elapsed() >= Duration::from_millis(200) || stopping {
                last_flush = Instant::now();
                match ex.flush() {
                    Ok(_) => warned = false,
                    Err(e) if !warned => {
                        tracing::warn!("events not exported yet (kept, retried): {e}");
                        warned = true;
                    }
                    Err(_) => {}
                }
            }
            shared.exported.store(ex.acked, Ordering::Relaxed);
            shared.export_dropped.store(ex.dropped, Ordering::Relaxed);
            shared.export_failures.store(ex.failures, Ordering::Relaxed);
            shared.export_pending.store(ex.pending() as u64, Ordering::Relaxed);
        }
        if stopping {
            break;
        }
        if got == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Last words: what the rings still hold, then a few tries to deliver it.
    for (i, r) in rings.iter().enumerate() {
        r.drain(|item| take(&mut ex, i, item));
    }
    if let Some(ex) = ex.as_mut() {
        let until = Instant::now() + Duration::from_secs(5);
        while ex.pending() > 0 && Instant::now() < until {
            if ex.flush().is_err() {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        if ex.pending() > 0 {
            tracing::warn!("{} events not delivered at exit", ex.pending());
        }
    }
}
