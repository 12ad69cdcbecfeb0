//! `telemark int-collector`: the INT report collector (docs/int.md). Telemetry Reports in over
//! UDP (one worker per core on a shared port, batches per system call), events out to the
//! collector's store over the agents' acknowledged transport, behind a bounded queue whose
//! drops are counted; Prometheus `/metrics` of everything it saw, and on the same listener
//! the control API that replaces the detector rules at run time (`int_control.rs`).

use crate::int_control::{Control, DetectList, Refused, Rules};
use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use serde::Deserialize;
use signal_hook::consts::{SIGINT, SIGTERM};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use telemark_collector::flow_listen::Prefix;
use telemark_core::int::collect::{Collector, Counts, Refusal};
use telemark_core::int::sequence::{Limits as SeqLimits, NodeSeq, Sequences};
use telemark_core::int::{DetectRule, DetectSection, Detectors, Event};
use telemark_core::records::Record;
use telemark_core::spsc;
use telemark_datapath::udp_rx::{RxOptions, UdpRx};
use telemark_datapath::xdp::{udp_payload, XdpMode, XdpProgram, XskRx};
use telemark_transport::exporter::Exporter;
use telemark_transport::http::{Handler, Request, Response};
use telemark_transport::server::{Limits, Server, ServerConfig, ServerStats};
use telemark_wire::dialect::{Deviation, Mode};

/// `telemark int-collector` flags (each overrides the config file's value).
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Config file (TOML; see docs/int.md): detector rules, export, metrics.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to receive Telemetry Reports on.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Name events are stored under.
    #[arg(long)]
    pub name: Option<String>,
    /// Collector to send events to (http://host:port).
    #[arg(long)]
    pub collector: Option<String>,
    /// Receive workers (one socket and one core each).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Address to serve /metrics on.
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Refuse reports that break the specifications instead of reading known dialects.
    #[arg(long)]
    pub strict: bool,
    /// Receive through AF_XDP on this interface (one socket per worker, on queues 0..workers);
    /// what XDP does not take (IPv6, IPv4 with options) still arrives on the UDP socket.
    #[arg(long)]
    pub xdp: Option<String>,
    /// Senders whose reports are read (address prefix, repeatable: `--allow 192.0.2.0/24`);
    /// datagrams from elsewhere are dropped and counted (refused{reason="not_allowed"}).
    /// Needed unless the listen address is loopback. Adds to the config file's `allow`.
    #[arg(long = "allow", value_name = "PREFIX")]
    pub allow: Vec<Prefix>,
    /// Most (node, hardware ID) pairs whose sequence numbers are followed (default 4096).
    #[arg(long)]
    pub max_nodes: Option<usize>,
    /// Largest jump ahead of a node's sequence number counted as lost reports (default
    /// 65536); a longer one is counted as a jump (sequence_jumps_total), not loss.
    #[arg(long)]
    pub max_seq_gap: Option<u32>,
    /// How long a node must be silent before a new node may take its place in a full table
    /// (default 10m).
    #[arg(long, value_parser = crate::opts::parse_duration_ns)]
    pub node_idle: Option<u64>,
    /// A file holding the token a controller sends to read and replace the detector rules
    /// (`GET`/`PUT /api/v1/detectors` on the metrics listener, which must be loopback);
    /// `metrics.control_token_file` in the config file. Absent: the rules change only by a
    /// restart.
    #[arg(long, value_name = "FILE")]
    pub control_token_file: Option<PathBuf>,
}

/// The config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    name: Option<String>,
    listen: Option<SocketAddr>,
    workers: Option<usize>,
    /// `tolerant` (default) or `strict`.
    mode: Option<String>,
    /// Detector states each worker keeps, one per (flow, rule that covers it): as many flows
    /// when each is covered by one rule.
    flows: Option<usize>,
    /// Events waiting for export, at most.
    queue: Option<usize>,
    /// Receive buffer per socket, bytes.
    rcvbuf: Option<usize>,
    /// AF_XDP interface.
    xdp: Option<String>,
    /// `generic` (default), `native` or `zerocopy`.
    xdp_mode: Option<String>,
    /// Senders whose reports are read (address prefixes).
    #[serde(default)]
    allow: Vec<String>,
    /// Most (node, hardware ID) pairs followed.
    max_nodes: Option<usize>,
    /// Largest sequence jump read as loss.
    max_seq_gap: Option<u32>,
    /// Idle time before a node's place may be taken (e.g. "10m").
    node_idle: Option<String>,
    export: Option<ExportSection>,
    metrics: Option<MetricsSection>,
    #[serde(default)]
    detect: Vec<DetectSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportSection {
    collector: String,
    token_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    /// Send the token over http:// to another host (a network the operator trusts).
    insecure_token: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsSection {
    listen: SocketAddr,
    token_file: Option<PathBuf>,
    /// The control API's token (`PUT /api/v1/detectors`); absent: no control API.
    control_token_file: Option<PathBuf>,
}

/// Everything resolved.
struct Config {
    name: String,
    listen: SocketAddr,
    workers: usize,
    mode: Mode,
    flows: usize,
    queue: usize,
    rcvbuf: usize,
    xdp: Option<(String, XdpMode)>,
    allow: Vec<Prefix>,
    limits: SeqLimits,
    rules: Rules,
    collector: Option<String>,
    token: Option<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
    metrics: Option<(SocketAddr, Option<String>)>,
    /// The token a controller sends to change the detector rules; `None`: no control API.
    control_token: Option<String>,
}

fn read_token(p: &Path) -> Result<String> {
    let t = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    Ok(t.trim().to_string())
}

fn resolve(a: Args) -> Result<Config> {
    let file: FileConfig = match &a.config {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("{}", p.display()))?
        }
        None => FileConfig::default(),
    };
    // Checked by the code that checks the control API's bodies.
    let rules = DetectList { detect: file.detect }.validate().map_err(anyhow::Error::msg)?;
    let mode = match (a.strict, file.mode.as_deref()) {
        (true, _) | (_, Some("strict")) => Mode::Strict,
        (_, None | Some("tolerant")) => Mode::Tolerant,
        (_, Some(m)) => bail!("mode {m:?}: tolerant or strict"),
    };
    let export = file.export;
    let token =
        export.as_ref().and_then(|e| e.token_file.as_deref()).map(read_token).transpose()?;
    let tls = match export.as_ref().and_then(|e| e.ca_file.as_deref()) {
        Some(ca) => Some(telemark_transport::tls::client_config(ca)?),
        None => None,
    };
    let control_file =
        a.control_token_file.or(file.metrics.as_ref().and_then(|m| m.control_token_file.clone()));
    let metrics = match (a.metrics, file.metrics) {
        (Some(l), m) => {
            Some((l, m.and_then(|m| m.token_file).map(|p| read_token(&p)).transpose()?))
        }
        (None, Some(m)) => Some((m.listen, m.token_file.map(|p| read_token(&p)).transpose()?)),
        (None, None) => None,
    };
    if let Some((addr, None)) = &metrics {
        if !addr.ip().is_loopback() {
            bail!("/metrics on {addr} needs a token_file in [metrics] (only loopback is open)");
        }
    }
    let control_token = control_file.as_deref().map(read_token).transpose()?;
    if control_token.as_deref() == Some("") {
        bail!("control_token_file: the file is empty");
    }
    match (&control_token, &metrics) {
        (Some(_), None) => bail!(
            "control_token_file: the control API is served on the metrics listener; set \
             --metrics or [metrics] listen"
        ),
        // The listener has no TLS: a token that changes the detectors stays on this host, as
        // the agent's control token does.
        (Some(_), Some((addr, _))) if !addr.ip().is_loopback() => bail!(
            "metrics listen {addr}: the control API (control_token_file) is served on loopback \
             only; its token would cross the network in clear text"
        ),
        _ => {}
    }
    let xdp_mode = match file.xdp_mode.as_deref() {
        None | Some("generic") => XdpMode::Generic,
        Some("native") => XdpMode::Native,
        Some("zerocopy") => XdpMode::ZeroCopy,
        Some(m) => bail!("xdp_mode {m:?}: generic, native or zerocopy"),
    };
    let mut allow = a.allow;
    for p in &file.allow {
        allow.push(p.parse().map_err(|e| anyhow::anyhow!("allow: {e}"))?);
    }
    let listen = a.listen.or(file.listen).unwrap_or_else(|| "0.0.0.0:32766".parse().expect("addr"));
    if allow.is_empty() && !listen.ip().is_loopback() {
        bail!(
            "{listen} is not a loopback address: say which switches may send reports to it \
             (--allow PREFIX or allow = [...], docs/int.md); reports carry no credentials"
        );
    }
    let node_idle = match (a.node_idle, file.node_idle.as_deref()) {
        (Some(ns), _) => ns,
        (None, Some(t)) => {
            crate::opts::parse_duration_ns(t).map_err(|e| anyhow::anyhow!("node_idle: {e}"))?
        }
        (None, None) => telemark_core::int::sequence::IDLE_NS,
    };
    let max_gap =
        a.max_seq_gap.or(file.max_seq_gap).unwrap_or(telemark_core::int::sequence::MAX_GAP);
    if max_gap < telemark_core::int::sequence::WINDOW {
        bail!(
            "max_seq_gap {max_gap}: at least {} (the window)",
            telemark_core::int::sequence::WINDOW
        );
    }
    let limits = SeqLimits {
        max_nodes: a
            .max_nodes
            .or(file.max_nodes)
            .unwrap_or(telemark_core::int::sequence::MAX_NODES)
            .max(1),
        max_gap,
        idle_ns: node_idle,
    };
    let collector = a.collector.or(export.as_ref().map(|e| e.collector.clone()));
    if let (Some(url), Some(_)) = (&collector, &token) {
        // As the agent: the token crosses the network only inside TLS, unless opted in.
        let opt_in = export.as_ref().and_then(|e| e.insecure_token) == Some(true);
        telemark_transport::http::token_in_clear(
            url,
            "collector",
            "the token (export.token_file)",
            "export.ca_file",
            "export.insecure_token",
            opt_in,
        )
        .map_err(anyhow::Error::msg)?;
    }
    Ok(Config {
        allow,
        limits,
        xdp: a.xdp.or(file.xdp).map(|i| (i, xdp_mode)),
        name: a.name.or(file.name).unwrap_or_else(|| "int-collector".into()),
        listen,
        workers: a.workers.or(file.workers).unwrap_or(1).clamp(1, 64),
        mode,
        flows: file.flows.unwrap_or(65_536),
        queue: file.queue.unwrap_or(65_536).max(1),
        rcvbuf: file.rcvbuf.unwrap_or(8 << 20),
        rules,
        collector,
        token,
        tls,
        metrics,
        control_token,
    })
}

/// What `telemark int-replay` takes from a config file (and flags): the collector's rules,
/// mode, flow table, allow-list and sequence limits, read exactly as the live collector does.
pub(crate) struct Offline {
    pub rules: Vec<DetectRule>,
    pub mode: Mode,
    pub flows: usize,
    pub allow: Vec<Prefix>,
    pub limits: SeqLimits,
}

/// Resolves a config file and flags as `int-collector` would, without binding anything.
pub(crate) fn offline(
    config: Option<PathBuf>,
    strict: bool,
    allow: Vec<Prefix>,
) -> Result<Offline> {
    let c = resolve(Args {
        config,
        // Loopback: the allow-list is not required for a capture.
        listen: Some("127.0.0.1:0".parse().expect("addr")),
        name: None,
        collector: None,
        workers: None,
        metrics: None,
        strict,
        xdp: None,
        allow,
        max_nodes: None,
        max_seq_gap: None,
        node_idle: None,
        control_token_file: None,
    })?;
    let rules = c.rules.rules.to_vec();
    Ok(Offline { rules, mode: c.mode, flows: c.flows, allow: c.allow, limits: c.limits })
}

/// Whether a datagram from `src` is read (for replay).
pub(crate) fn sender_allowed(allow: &[Prefix], src: IpAddr) -> bool {
    allowed(allow, Some(src))
}

/// What the workers publish for /metrics and the exporter.
#[derive(Default)]
struct Shared {
    /// Per worker: its collector's counters, kernel drops.
    workers: Mutex<Vec<WorkerStats>>,
    /// Every worker's datagrams' sequence numbers: a sender may spread its datagrams over the
    /// workers (SO_REUSEPORT and RSS hash its source port), so they are followed together.
    sequences: Mutex<Sequences>,
    ring_dropped: AtomicU64,
    exported: AtomicU64,
    export_dropped: AtomicU64,
    export_failures: AtomicU64,
    export_pending: AtomicU64,
}

#[derive(Default, Clone)]
struct WorkerStats {
    /// `udp` or `xdp`.
    path: &'static str,
    counts: Counts,
    kernel_drops: u64,
    truncated: u64,
    flows: u64,
    /// (flow, rule) detector states held.
    states: u64,
    evicted: u64,
}

/// Runs until SIGINT/SIGTERM.
pub fn run(a: Args) -> Result<()> {
    let cfg = resolve(a)?;
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
            let handler = Arc::new(Metrics {
                name: cfg.name.clone(),
                shared: shared.clone(),
                token: token.clone(),
                control_token: cfg.control_token.clone(),
                control: control.clone(),
                transport: transport.clone(),
            });
            // Bodies only for the control API, and small: 64 KiB holds hundreds of rules.
            let max_body = if cfg.control_token.is_some() { 64 * 1024 } else { 0 };
            let scfg = ServerConfig {
                listen: *listen,
                tls: None,
                limits: Limits { max_body, max_connections: 64, ..Limits::default() },
                workers: 1,
            };
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
            if !allowed(allow, src) {
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

/// Whether a datagram from `src` is read: any sender when the list is empty (loopback only).
fn allowed(allow: &[Prefix], src: Option<IpAddr>) -> bool {
    allow.is_empty() || src.is_some_and(|ip| allow.iter().any(|p| p.contains(to_v4(ip))))
}

/// An IPv4-mapped IPv6 sender (a dual-stack socket) as the IPv4 address it is.
fn to_v4(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
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

/// The listener: `/metrics`, and the control API (`/api/v1/detectors`) when a control token
/// is configured.
struct Metrics {
    name: String,
    shared: Arc<Shared>,
    /// The token scrapers must send, when set.
    token: Option<String>,
    /// The token a controller must send; `None`: no control API.
    control_token: Option<String>,
    control: Arc<Control>,
    transport: Arc<ServerStats>,
}

/// The control API's one path.
const DETECTORS: &str = "/api/v1/detectors";

impl Handler for Metrics {
    fn handle(&self, req: &Request<'_>, _now: u64) -> Response {
        if let Err(r) = self.access(req.method, req.path(), req.token) {
            return r;
        }
        match (req.method, req.path()) {
            ("GET", "/metrics") => Response::text("text/plain; version=0.0.4", self.render()),
            ("GET", DETECTORS) => Response::json(200, &self.control.in_force()),
            ("PUT", DETECTORS) => match self.control.put(req.body) {
                Ok(rules) => Response::json(200, &rules),
                Err(e) => Response::error(400, e),
            },
            _ => Response::error(405, "GET /metrics, GET or PUT /api/v1/detectors"),
        }
    }

    fn admit(&self, method: &str, path: &str, token: Option<&str>) -> Option<Response> {
        let refused = self.access(method, path, token).err()?;
        if method == "PUT" && path == DETECTORS && refused.status == 401 {
            self.control.refuse(Refused::Unauthenticated);
        }
        Some(refused)
    }

    fn route(&self, path: &str) -> &'static str {
        match path {
            "/metrics" => "/metrics",
            DETECTORS => DETECTORS,
            _ => "other",
        }
    }
}

impl Metrics {
    /// Whether a request may be made, from its method, path and token alone: the listener's
    /// access rules, all here, as the agent's. The server asks this before it reads a body
    /// (so nobody without the control token can hold the listener's body budget), and
    /// [`Handler::handle`] asks again.
    fn access(&self, method: &str, path: &str, token: Option<&str>) -> Result<(), Response> {
        let valid = |want: &str| token.is_some_and(|t| telemark_transport::http::token_eq(want, t));
        match (method, path) {
            (_, "/metrics") if !self.token.as_deref().is_none_or(valid) => {
                Err(Response::unauthenticated())
            }
            ("GET", "/metrics") => Ok(()),
            (_, "/metrics") => Err(Response::error(405, "only GET is allowed on /metrics")),
            (_, DETECTORS) => {
                let Some(want) = &self.control_token else {
                    return Err(Response::error(
                        404,
                        "the control API is off: set metrics.control_token_file \
                         (--control-token-file)",
                    ));
                };
                if !valid(want) {
                    return Err(Response::unauthenticated());
                }
                match method {
                    "GET" | "PUT" => Ok(()),
                    _ => Err(Response::error(405, "GET or PUT /api/v1/detectors")),
                }
            }
            (_, p) => Err(Response::error(
                404,
                format!("no such endpoint: {p} (this serves /metrics and {DETECTORS})"),
            )),
        }
    }

    fn render(&self) -> String {
        let ws = self.shared.workers.lock().map(|w| w.clone()).unwrap_or_default();
        let mut o = String::new();
        let c = |f: &dyn Fn(&WorkerStats) -> u64| ws.iter().map(f).sum::<u64>();
        let l = format!("collector=\"{}\"", self.name);
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(o, "{name}{{{l}{labels}}} {v}");
            }
        };
        let one = |v: u64| vec![(String::new(), v)];
        let by_path = |p: &str| ws.iter().filter(|w| w.path == p).map(|w| w.counts.datagrams).sum();
        family(
            "telemark_int_datagrams_total",
            "counter",
            "Report datagrams received, by receive path (udp socket or AF_XDP).",
            vec![
                (",path=\"udp\"".into(), by_path("udp")),
                (",path=\"xdp\"".into(), by_path("xdp")),
            ],
        );
        family(
            "telemark_int_reports_total",
            "counter",
            "Individual reports read.",
            one(c(&|w| w.counts.reports)),
        );
        family(
            "telemark_int_refused_total",
            "counter",
            "Datagrams or reports not read, by reason.",
            Refusal::ALL
                .iter()
                .map(|r| {
                    (format!(",reason=\"{}\"", r.name()), c(&|w| w.counts.refused[*r as usize]))
                })
                .collect(),
        );
        family(
            "telemark_int_deviations_total",
            "counter",
            "Reports read although they break a rule of the specifications, by rule.",
            Deviation::ALL
                .iter()
                .map(|d| {
                    (format!(",rule=\"{}\"", d.name()), c(&|w| w.counts.deviations[*d as usize]))
                })
                .collect(),
        );
        family(
            "telemark_int_events_total",
            "counter",
            "Events handed to the export queue.",
            one(c(&|w| w.counts.events)),
        );
        family(
            "telemark_int_quiet_total",
            "counter",
            "Reports whose flow's detector did not fire.",
            one(c(&|w| w.counts.quiet)),
        );
        let per_node = |f: &dyn Fn(&NodeSeq) -> u64| -> Vec<(String, u64)> {
            match self.shared.sequences.lock() {
                Ok(seqs) => seqs
                    .nodes()
                    .map(|((node, hw), n)| (format!(",node=\"{node}\",hw_id=\"{hw}\""), f(n)))
                    .collect(),
                Err(_) => Vec::new(),
            }
        };
        family("telemark_int_reports_lost_total", "counter", "Report datagrams lost between a node and this collector: sequence numbers the 1,024-wide window moved past unseen (a node's gap is counted here only after 1,024 later numbers arrive; until then it is in telemark_int_reports_missing).", per_node(&|n| n.lost));
        family(
            "telemark_int_reports_missing",
            "gauge",
            "Sequence numbers inside the window not arrived yet (lost unless they still come).",
            per_node(&NodeSeq::missing),
        );
        family(
            "telemark_int_node_datagrams_total",
            "counter",
            "Report datagrams received per reporting node (each sequence number once).",
            per_node(&|n| n.received),
        );
        family(
            "telemark_int_duplicates_total",
            "counter",
            "Datagrams whose sequence number was seen already.",
            per_node(&|n| n.duplicates),
        );
        family(
            "telemark_int_late_total",
            "counter",
            "Datagrams that came after their sequence number was counted lost.",
            per_node(&|n| n.late),
        );
        family(
            "telemark_int_sequence_restarts_total",
            "counter",
            "Times a node started counting again (a restart).",
            per_node(&|n| n.restarts),
        );
        family(
            "telemark_int_sequence_jumps_total",
            "counter",
            "Jumps ahead of more than max_seq_gap numbers: not counted as lost reports, the window starts again.",
            per_node(&|n| n.jumps),
        );
        let (nodes, refused, evicted) = match self.shared.sequences.lock() {
            Ok(s) => (s.nodes().count() as u64, s.untracked, s.evicted),
            Err(_) => (0, 0, 0),
        };
        family(
            "telemark_int_nodes",
            "gauge",
            "(node, hardware ID) pairs whose sequence numbers are followed (at most max_nodes).",
            one(nodes),
        );
        family(
            "telemark_int_nodes_refused_total",
            "counter",
            "Datagrams of new nodes not followed: the node table was full and no node in it idle for node_idle.",
            one(refused),
        );
        family(
            "telemark_int_nodes_evicted_total",
            "counter",
            "Nodes dropped from a full table for a new one, after being silent for node_idle.",
            one(evicted),
        );
        family(
            "telemark_int_socket_drops_total",
            "counter",
            "Datagrams the kernel dropped for a full socket buffer (SO_RXQ_OVFL).",
            one(c(&|w| w.kernel_drops)),
        );
        family(
            "telemark_int_truncated_total",
            "counter",
            "Datagrams longer than 9216 bytes, cut.",
            one(c(&|w| w.truncated)),
        );
        family("telemark_int_flows", "gauge", "Flows with detector state.", one(c(&|w| w.flows)));
        family(
            "telemark_int_detector_states",
            "gauge",
            "Detector states held, one per flow and rule that covers it.",
            one(c(&|w| w.states)),
        );
        family(
            "telemark_int_flows_evicted_total",
            "counter",
            "Detector states (a flow's, for one rule) pushed out of a full table.",
            one(c(&|w| w.evicted)),
        );
        let s = &self.shared;
        family(
            "telemark_int_queue_dropped_total",
            "counter",
            "Events dropped because a worker's export ring was full.",
            one(s.ring_dropped.load(Ordering::Relaxed)),
        );
        family(
            "telemark_int_exported_total",
            "counter",
            "Events the collector acknowledged.",
            one(s.exported.load(Ordering::Relaxed)),
        );
        family(
            "telemark_int_export_dropped_total",
            "counter",
            "Events dropped because the export buffer was full (collector away).",
            one(s.export_dropped.load(Ordering::Relaxed)),
        );
        family(
            "telemark_int_export_failures_total",
            "counter",
            "Failed deliveries to the collector (retried).",
            one(s.export_failures.load(Ordering::Relaxed)),
        );
        family(
            "telemark_int_export_pending",
            "gauge",
            "Events waiting for the collector.",
            one(s.export_pending.load(Ordering::Relaxed)),
        );
        let ctl = &self.control;
        family(
            "telemark_int_detector_rules",
            "gauge",
            "Detector rules in force.",
            one(ctl.rule_count() as u64),
        );
        family(
            "telemark_int_detector_changes_total",
            "counter",
            "Times the control API replaced the detector rules (every flow's state started again).",
            one(ctl.changes()),
        );
        family(
            "telemark_int_detector_changes_refused_total",
            "counter",
            "PUT /api/v1/detectors refused, by reason: no or a wrong control token, or a body that does not check (nothing changed).",
            Refused::ALL.iter().map(|r| (format!(",reason=\"{}\"", r.name()), ctl.refused(*r))).collect(),
        );
        self.transport.render("telemark_int", &mut o);
        o
    }
}
