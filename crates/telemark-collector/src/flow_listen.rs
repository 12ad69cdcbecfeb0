//! The collector's flow-export listeners (docs/flows.md): UDP sockets that take NetFlow v5,
//! NetFlow v9, IPFIX and sFlow v5 from any exporter, decode them ([`crate::flows`]) and store
//! the flows as `flow` records, one agent per exporter address.
//!
//! - **Workers.** Each address gets `workers` sockets bound with `SO_REUSEPORT`: the kernel
//!   spreads exporters over them by their address and port, so one exporter's templates stay
//!   with one worker's decoder.
//! - **Overflows.** `SO_RXQ_OVFL` makes the kernel say, with each datagram, how many it dropped
//!   on that socket because its receive buffer (`rcvbuf`) was full; they are counted.
//! - **Storing.** Each receiver hands its flows to one storing thread every half second (or
//!   every 10,000), so receiving never waits for the database; when the store falls behind, the
//!   flows it has no room for are dropped and counted. They are numbered in the exporter's run
//!   as the worker saw it: (exporter, collector start + worker, n).
//! - **Templates survive restarts.** What exporters' templates and options data taught a
//!   worker is kept in the database each second, and every worker starts from it.
//! - **Times.** A flow the exporter did not time (sFlow samples, or times older than the store
//!   keeps) takes its arrival time.

use crate::flows::{Budget, Decoder, ExportedFlow, Limits, Refusal};
use crate::ingest::Ingest;
use std::collections::HashMap;
use std::io::Read as _;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use telemark_core::records::{Flow, FlowExport, FlowRecord, Record};
use telemark_socket::udp::{RxOptions, UdpRx};
use telemark_transport::metrics::Exposition;
use telemark_wire::ipfix::TemplateRecord;

/// Listener settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowListenConfig {
    /// Addresses to listen on (2055 NetFlow/IPFIX, 4739 IPFIX, 6343 sFlow by convention; any
    /// address takes any of the formats).
    pub listen: Vec<SocketAddr>,
    /// Addresses to take IPFIX over TCP on (RFC 7011 §10.4; 4739 by convention).
    pub listen_tcp: Vec<SocketAddr>,
    /// Sockets per address.
    pub workers: usize,
    /// Receive buffer per socket, bytes (the kernel caps it at `net.core.rmem_max`).
    pub rcvbuf: usize,
    /// What each decoder (a UDP socket's, a TCP session's) may spend: held sets, template
    /// size, templates per domain, work per datagram, sequence gaps (docs/flows.md).
    pub limits: Limits,
    /// Bytes of data sets held for templates not seen yet, across every decoder.
    pub held_max_bytes: usize,
    /// Template fields kept, across every decoder and what a restart loads.
    pub template_fields_max: usize,
    /// IPFIX-over-TCP sessions one exporter address may hold at once.
    pub tcp_per_source: usize,
    /// Time a new IPFIX-over-TCP session has to send its first whole message.
    pub tcp_first_message: Duration,
    /// Exporters given their own label on the per-exporter metrics (the first seen; the
    /// rest are counted under `other`).
    pub exporter_labels: usize,
    /// Templates and sampling rates kept for a restart are deleted when not sent again for
    /// this long (0: only the size bound, `template_fields_max` × 8 bytes, deletes them).
    pub state_retention: Duration,
    /// The exporters whose datagrams are read (address prefixes); empty: any, which only a
    /// loopback listener may do. These protocols carry no credentials: the prefixes (and a
    /// firewall) are what keeps strangers out.
    pub allow: Vec<Prefix>,
}

/// The allow-lists' address prefix (written once, in `telemark-socket`).
pub use telemark_socket::Prefix;

impl Default for FlowListenConfig {
    fn default() -> Self {
        FlowListenConfig {
            listen: Vec::new(),
            listen_tcp: Vec::new(),
            workers: 1,
            rcvbuf: 8 << 20,
            limits: Limits::default(),
            held_max_bytes: 64 << 20,
            template_fields_max: 4 << 20,
            tcp_per_source: 16,
            tcp_first_message: Duration::from_secs(10),
            exporter_labels: 32,
            state_retention: Duration::from_secs(7 * 24 * 3600),
            allow: Vec::new(),
        }
    }
}

/// Counters, shared by the workers and rendered in `/metrics`.
#[derive(Debug, Default)]
pub struct FlowStats {
    listening: AtomicBool,
    datagrams: AtomicU64,
    flows: AtomicU64,
    stored: AtomicU64,
    store_errors: AtomicU64,
    overflows: AtomicU64,
    pending: AtomicU64,
    counter_samples: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
    not_allowed: AtomicU64,
    store_behind: AtomicU64,
    /// IPFIX-over-TCP sessions open now.
    tcp_sessions: AtomicU64,
    /// Sessions refused: too many open already.
    tcp_refused: AtomicU64,
    /// Sessions refused: their address holds `tcp_per_source` already.
    tcp_per_source_refused: AtomicU64,
    /// Sessions closed: no whole message within `tcp_first_message`.
    tcp_first_message_timeouts: AtomicU64,
    /// Idle sessions closed to make room for a new one.
    tcp_reclaimed: AtomicU64,
    sequence_resets: AtomicU64,
    domains_evicted: AtomicU64,
    /// What the decoders hold (bytes held, template fields), when a listener runs.
    budget: std::sync::OnceLock<Arc<Budget>>,
    /// Template rows a restart did not load (past the template budget).
    state_not_loaded: AtomicU64,
    /// Per exporter address: datagrams, flows, lost; at most `exporter_labels`, the rest
    /// under `None` ("other").
    exporters: std::sync::Mutex<ExporterCounts>,
}

/// Per-exporter counters with a bounded label set.
#[derive(Debug, Default)]
struct ExporterCounts {
    labels: usize,
    by: std::collections::BTreeMap<Option<IpAddr>, [u64; 3]>,
}

impl ExporterCounts {
    fn add(&mut self, from: IpAddr, c: [u64; 3]) {
        let known = self.by.contains_key(&Some(from));
        let named = self.by.keys().filter(|k| k.is_some()).count();
        let k = if known || named < self.labels { Some(from) } else { None };
        let e = self.by.entry(k).or_default();
        for (a, b) in e.iter_mut().zip(c) {
            *a += b;
        }
    }
}

/// IPFIX-over-TCP sessions held at once; more are refused (and counted).
pub const MAX_TCP_SESSIONS: usize = 256;
/// A session silent this long is closed (an exporter that died without closing it).
const TCP_IDLE: Duration = Duration::from_secs(600);

const REFUSALS: [Refusal; Refusal::ALL.len()] = Refusal::ALL;

impl FlowStats {
    /// The `telemark_collector_flow_*` families (nothing when no listener runs).
    pub fn render(&self, o: &mut Exposition) {
        if !self.listening.load(Ordering::Relaxed) {
            return;
        }
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (held, fields) = self
            .budget
            .get()
            .map_or((0, 0), |b| (b.held_bytes() as u64, b.template_fields() as u64));
        let families: [(&str, &str, &str, u64); 18] = [
            ("tcp_sessions", "gauge", "IPFIX-over-TCP sessions open.", g(&self.tcp_sessions)),
            (
                "tcp_sessions_refused_total",
                "counter",
                "IPFIX-over-TCP connections refused: too many sessions open.",
                g(&self.tcp_refused),
            ),
            (
                "tcp_per_source_refused_total",
                "counter",
                "IPFIX-over-TCP connections refused: their address holds --flows-tcp-per-source sessions.",
                g(&self.tcp_per_source_refused),
            ),
            (
                "tcp_first_message_timeouts_total",
                "counter",
                "IPFIX-over-TCP sessions closed: no whole message within --flows-tcp-first-message.",
                g(&self.tcp_first_message_timeouts),
            ),
            (
                "tcp_reclaimed_total",
                "counter",
                "Idle IPFIX-over-TCP sessions closed to make room for a new one.",
                g(&self.tcp_reclaimed),
            ),
            (
                "store_behind_total",
                "counter",
                "Flows decoded and not stored: the store was behind (receiving went on).",
                g(&self.store_behind),
            ),
            ("datagrams_total", "counter", "Flow-export datagrams received.", g(&self.datagrams)),
            ("flows_total", "counter", "Flows decoded.", g(&self.flows)),
            ("stored_total", "counter", "Flow records stored.", g(&self.stored)),
            ("store_errors_total", "counter", "Batches of flows the store refused.", g(&self.store_errors)),
            (
                "receive_overflows_total",
                "counter",
                "Datagrams the kernel dropped: a socket's receive buffer was full (SO_RXQ_OVFL).",
                g(&self.overflows),
            ),
            (
                "sequence_resets_total",
                "counter",
                "Exporter sequence numbers that jumped beyond --flows-max-sequence-gap (a restart or a forgery), not counted as lost.",
                g(&self.sequence_resets),
            ),
            (
                "domains_evicted_total",
                "counter",
                "Sessions' observation domains forgotten to make room for new ones (10,000 per decoder).",
                g(&self.domains_evicted),
            ),
            ("pending_sets", "gauge", "Data sets held for templates not seen yet.", g(&self.pending)),
            ("pending_bytes", "gauge", "Bytes of data sets held for templates not seen yet, all decoders.", held),
            ("template_fields", "gauge", "Template fields kept, all decoders.", fields),
            (
                "state_not_loaded_total",
                "counter",
                "Templates kept in the database that a start did not load: past --flows-template-fields.",
                g(&self.state_not_loaded),
            ),
            ("counter_samples_total", "counter", "sFlow counter samples received.", g(&self.counter_samples)),
        ];
        for (name, kind, help, v) in families {
            let name = format!("telemark_collector_flow_{name}");
            match kind {
                "counter" => o.counter(&name, help, &[]),
                _ => o.gauge(&name, help, &[]),
            }
            .value(v);
        }
        o.counter(
            "telemark_collector_flow_refused_total",
            "Datagrams or data sets not decoded, by reason.",
            &["reason"],
        )
        .samples(REFUSALS.iter().zip(&self.refused).map(|(r, c)| ([r.name()], g(c))))
        .sample(&["not_allowed"], g(&self.not_allowed));
        // Per exporter address, the first --flows-exporter-labels seen by name and the rest
        // as "other": a spoofing sender cannot make the label set grow.
        let ex = self.exporters.lock().unwrap_or_else(|p| p.into_inner());
        let per: [(&str, &str); 3] = [
            ("exporter_datagrams_total", "Flow-export datagrams received, by exporter address."),
            ("exporter_flows_total", "Flows decoded, by exporter address."),
            (
                "exporter_lost_total",
                "Records (IPFIX, v5) or datagrams (v9, sFlow) exporters' sequence numbers say never arrived, by exporter address.",
            ),
        ];
        for (i, (fam, help)) in per.iter().enumerate() {
            let name = format!("telemark_collector_flow_{fam}");
            let family = o.counter(&name, help, &["exporter"]);
            if ex.by.is_empty() {
                family.sample(&["other"], 0u64);
            }
            for (k, c) in &ex.by {
                let label = k.map_or("other".to_string(), |a| a.to_string());
                family.sample(&[label], c[i]);
            }
        }
    }
}

/// Binds every socket and starts a worker on each.
pub fn start(
    ingest: Arc<Ingest>,
    cfg: &FlowListenConfig,
    stats: Arc<FlowStats>,
    stop: Arc<AtomicBool>,
) -> Result<Vec<JoinHandle<()>>, String> {
    let every = cfg.listen.iter().chain(&cfg.listen_tcp);
    if let Some(a) = every.clone().find(|a| !a.ip().is_loopback() && cfg.allow.is_empty()) {
        return Err(format!(
            "flows: {a} is not a loopback address: say which exporters may send to it \
             (--flows-allow PREFIX, docs/flows.md)"
        ));
    }
    let mut sockets = Vec::new();
    for addr in &cfg.listen {
        for _ in 0..cfg.workers.max(1) {
            sockets.push(bind(*addr, cfg.rcvbuf).map_err(|e| format!("flows: {addr}: {e}"))?);
        }
    }
    let mut listeners = Vec::new();
    for addr in &cfg.listen_tcp {
        let l = TcpListener::bind(addr).map_err(|e| format!("flows: tcp {addr}: {e}"))?;
        l.set_nonblocking(true).map_err(|e| format!("flows: tcp {addr}: {e}"))?;
        listeners.push(l);
    }
    stats.listening.store(true, Ordering::Relaxed);
    let budget = Arc::new(Budget::new(cfg.held_max_bytes, cfg.template_fields_max));
    let _ = stats.budget.set(budget.clone());
    stats.exporters.lock().unwrap_or_else(|p| p.into_inner()).labels = cfg.exporter_labels;
    let boot = crate::now_ns();
    // What exporters taught the last run, newest first: every UDP worker starts from it,
    // each template held once and charged to the budget once, up to half of the budget (the
    // rest is for what exporters send now). What does not fit is counted, not loaded.
    let state_bytes = cfg.template_fields_max as u64 * 8;
    let state_cut = |retention: Duration| match retention.as_nanos() as u64 {
        0 => 0,
        keep => crate::now_ns().saturating_sub(keep),
    };
    let remembered = {
        let mut st = ingest.store();
        st.prune_flow_state(state_cut(cfg.state_retention), state_bytes)
            .map_err(|e| format!("flows: {e}"))?;
        st.flow_state(cfg.template_fields_max / 17 + 1).map_err(|e| format!("flows: {e}"))?
    };
    let mut restored = Vec::new();
    for r in remembered {
        match r {
            crate::flows::Remembered::Template(key, TemplateRecord::Define(t)) => {
                let cost = crate::flows::template_cost(&t);
                if !cfg.limits.admits(&t)
                    || budget.template_fields() + cost > cfg.template_fields_max / 2
                    || !budget.take_template(cost)
                {
                    stats.state_not_loaded.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                restored.push(Restored::Template(key, Arc::new(t)));
            }
            crate::flows::Remembered::Template(..) => {}
            r @ crate::flows::Remembered::Sampler(..) => restored.push(Restored::Other(r)),
        }
    }
    // Receivers hand batches to one storing thread; a store that falls behind costs flows
    // (counted), never the receive buffers.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Batch>(64);
    let mut storer = Storer { ingest, stats: stats.clone(), boot, next_seq: HashMap::new() };
    let retention = cfg.state_retention;
    let mut threads = vec![std::thread::spawn(move || {
        let mut pruned = Instant::now();
        loop {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(b) => storer.store(b),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
            // Kept state no exporter sent again within the retention, and the oldest past
            // the size bound, go once a minute.
            if pruned.elapsed() >= Duration::from_secs(60) {
                pruned = Instant::now();
                let r = storer.ingest.store().prune_flow_state(state_cut(retention), state_bytes);
                if let Err(e) = r {
                    tracing::warn!("flows: pruning kept templates: {e}");
                }
            }
        }
    })];
    let udp_workers = sockets.len();
    for (i, sock) in sockets.into_iter().enumerate() {
        let mut w = Worker::new(i, cfg, &stats, &tx, &budget, true);
        for r in &restored {
            match r {
                Restored::Template(key, t) => w.decoder.restore_shared(*key, t.clone()),
                Restored::Other(r) => w.decoder.restore(r.clone()),
            }
        }
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || w.run(sock, &stop)));
    }
    drop(restored);
    // One thread per IPFIX-over-TCP session, its templates its own (RFC 7011 §8: a template
    // lives as long as its transport session, so none is kept for a restart); each session
    // takes a free worker number so its records are numbered apart from the others'.
    let slots: Slots =
        Arc::new(std::sync::Mutex::new((0..MAX_TCP_SESSIONS).map(|_| None).collect()));
    for l in listeners {
        let (cfg, stats, tx, stop, slots, budget) =
            (cfg.clone(), stats.clone(), tx.clone(), stop.clone(), slots.clone(), budget.clone());
        threads.push(std::thread::spawn(move || {
            accept(&l, &cfg, &stats, &tx, &stop, &slots, &budget, udp_workers)
        }));
    }
    Ok(threads)
}

/// What a restart loaded, shared by every UDP worker.
enum Restored {
    Template(crate::flows::DomainKey, Arc<telemark_wire::ipfix::Template>),
    Other(crate::flows::Remembered),
}

/// An IPFIX-over-TCP session's slot: who holds it, when it last sent a whole message (ms
/// on [`clock_ms`]), and the flag that asks its thread to close it.
struct Slot {
    peer: IpAddr,
    last_message_ms: Arc<AtomicU64>,
    close: Arc<AtomicBool>,
}

type Slots = Arc<std::sync::Mutex<Vec<Option<Slot>>>>;

/// Milliseconds on a monotonic clock (since the first call).
fn clock_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A session that sent no whole message for this long may be closed when every slot is
/// taken and a new exporter connects.
const TCP_RECLAIM_IDLE: Duration = Duration::from_secs(10);

/// Takes IPFIX-over-TCP connections on `l` until `stop`: each from an allowed exporter that
/// holds fewer than `tcp_per_source` sessions, while a slot is free or an idle session's can
/// be taken back, in a thread of its own.
#[allow(clippy::too_many_arguments)]
fn accept(
    l: &TcpListener,
    cfg: &FlowListenConfig,
    stats: &Arc<FlowStats>,
    tx: &std::sync::mpsc::SyncSender<Batch>,
    stop: &Arc<AtomicBool>,
    slots: &Slots,
    budget: &Arc<Budget>,
    first_worker: usize,
) {
    while !stop.load(Ordering::Relaxed) {
        let (s, peer) = match l.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(e) => {
                tracing::warn!("flows: tcp accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if !(cfg.allow.is_empty() || cfg.allow.iter().any(|p| p.contains(peer.ip()))) {
            stats.not_allowed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let Some((slot, last, close)) = take_slot(slots, peer.ip(), cfg, stats) else { continue };
        stats.tcp_sessions.fetch_add(1, Ordering::Relaxed);
        let mut w = Worker::new(first_worker + slot, cfg, stats, tx, budget, false);
        let (stats, stop, slots) = (stats.clone(), stop.clone(), slots.clone());
        let first = cfg.tcp_first_message;
        std::thread::spawn(move || {
            w.run_stream(s, peer, &stop, &close, &last, first);
            stats.tcp_sessions.fetch_sub(1, Ordering::Relaxed);
            slots.lock().unwrap_or_else(|p| p.into_inner())[slot] = None;
        });
    }
}

/// A slot for a session from `peer`: refused (counted) when `peer` holds `tcp_per_source`
/// already; else a free one, or, when none is free, the one of the session idle longest
/// (no whole message for [`TCP_RECLAIM_IDLE`]), closed for it (counted). Waits up to two
/// seconds for that session to close.
fn take_slot(
    slots: &Slots,
    peer: IpAddr,
    cfg: &FlowListenConfig,
    stats: &FlowStats,
) -> Option<(usize, Arc<AtomicU64>, Arc<AtomicBool>)> {
    let mut reclaiming = None;
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        {
            let mut v = slots.lock().unwrap_or_else(|p| p.into_inner());
            if reclaiming.is_none()
                && v.iter().flatten().filter(|s| s.peer == peer).count()
                    >= cfg.tcp_per_source.max(1)
            {
                stats.tcp_per_source_refused.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            if let Some(i) = v.iter().position(|s| s.is_none()) {
                let (last, close) =
                    (Arc::new(AtomicU64::new(clock_ms())), Arc::new(AtomicBool::new(false)));
                v[i] = Some(Slot { peer, last_message_ms: last.clone(), close: close.clone() });
                return Some((i, last, close));
            }
            if reclaiming.is_none() {
                let now = clock_ms();
                let idle = TCP_RECLAIM_IDLE.as_millis() as u64;
                let oldest = v
                    .iter()
                    .flatten()
                    .filter(|s| !s.close.load(Ordering::Relaxed))
                    .map(|s| (s.last_message_ms.load(Ordering::Relaxed), s))
                    .filter(|(t, _)| now.saturating_sub(*t) >= idle)
                    .min_by_key(|(t, _)| *t);
                match oldest {
                    Some((_, s)) => {
                        s.close.store(true, Ordering::Relaxed);
                        stats.tcp_reclaimed.fetch_add(1, Ordering::Relaxed);
                        reclaiming = Some(());
                    }
                    None => {
                        stats.tcp_refused.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                }
            }
        }
        if Instant::now() >= until {
            stats.tcp_refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Datagrams read per system call (`recvmmsg`).
const RECV_BATCH: usize = 16;

/// A flow worker's socket: `SO_REUSEPORT` (workers share the port), the configured receive
/// buffer, the kernel's overflow counter, and room for the largest UDP datagram.
fn bind(addr: SocketAddr, rcvbuf: usize) -> std::io::Result<UdpRx> {
    let opts = RxOptions {
        batch: RECV_BATCH,
        rcvbuf,
        timeout: Duration::from_millis(200),
        max_datagram: 65_535,
    };
    UdpRx::bind(addr, opts)
}

/// What a receiver hands the storing thread.
struct Batch {
    worker: usize,
    flows: Vec<ExportedFlow>,
    changes: Vec<crate::flows::Remembered>,
}

/// One socket's receiver: reads, decodes, hands batches over.
struct Worker {
    worker: usize,
    stats: Arc<FlowStats>,
    decoder: Decoder,
    flows: Vec<ExportedFlow>,
    /// What the decoder learnt and the storer has not taken yet.
    changes: Vec<crate::flows::Remembered>,
    /// Whether what the decoder learns is kept for a restart (UDP; a TCP session's
    /// templates end with it).
    persist: bool,
    last_overflow: u32,
    /// Decoder counters already added to the shared ones.
    seen: crate::flows::DecodeStats,
    /// Per exporter address since the last hand-over: datagrams, flows, lost.
    by_exporter: HashMap<IpAddr, [u64; 3]>,
    /// When exporter loss was last logged.
    last_loss_log: Option<Instant>,
    /// Lost records not logged yet, and the exporter that lost the latest.
    unlogged_loss: (u64, Option<SocketAddr>),
    allow: Vec<Prefix>,
    tx: std::sync::mpsc::SyncSender<Batch>,
}

/// Changes a worker keeps for the storer at most (a store that is behind must not make them
/// grow without bound); older ones go first.
const MAX_CHANGES: usize = 4096;

/// Exporter loss is logged at most this often (the metrics have every count).
const LOSS_LOG_EVERY: Duration = Duration::from_secs(10);

impl Worker {
    fn new(
        worker: usize,
        cfg: &FlowListenConfig,
        stats: &Arc<FlowStats>,
        tx: &std::sync::mpsc::SyncSender<Batch>,
        budget: &Arc<Budget>,
        persist: bool,
    ) -> Worker {
        Worker {
            worker,
            stats: stats.clone(),
            decoder: Decoder::with_limits(cfg.limits.clone(), budget.clone()),
            flows: Vec::new(),
            changes: Vec::new(),
            persist,
            last_overflow: 0,
            seen: Default::default(),
            by_exporter: HashMap::new(),
            last_loss_log: None,
            unlogged_loss: (0, None),
            allow: cfg.allow.clone(),
            tx: tx.clone(),
        }
    }

    /// Decodes one datagram (or TCP message) from `from`, counting it for its exporter.
    fn decode(&mut self, from: SocketAddr, bytes: &[u8]) {
        let (flows, lost) = (self.decoder.stats.flows, self.decoder.stats.sequence_lost);
        self.decoder.receive(from, bytes, &mut self.flows);
        let lost = self.decoder.stats.sequence_lost - lost;
        let c = self.by_exporter.entry(from.ip()).or_default();
        c[0] += 1;
        c[1] += self.decoder.stats.flows - flows;
        c[2] += lost;
        if lost > 0 {
            self.unlogged_loss = (self.unlogged_loss.0 + lost, Some(from));
        }
        // Spoofed senders must not grow the map between hand-overs.
        if self.by_exporter.len() >= 1024 {
            self.publish_exporters();
        }
    }

    fn publish_exporters(&mut self) {
        if self.by_exporter.is_empty() {
            return;
        }
        let mut ex = self.stats.exporters.lock().unwrap_or_else(|p| p.into_inner());
        for (ip, c) in self.by_exporter.drain() {
            ex.add(ip, c);
        }
    }

    /// One IPFIX-over-TCP session from exporter `from`: messages one after another, each as
    /// long as its header says (RFC 7011 §10.4.1). Anything but an IPFIX header closes the
    /// session (counted as malformed), as do no whole message within `first` of the start,
    /// silence for ten minutes, and `close` (set to give its slot to another exporter).
    fn run_stream(
        &mut self,
        mut s: TcpStream,
        from: SocketAddr,
        stop: &AtomicBool,
        close: &AtomicBool,
        last_message_ms: &AtomicU64,
        first: Duration,
    ) {
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = vec![0u8; 65_536];
        let mut have = 0usize;
        let started = Instant::now();
        let mut messages = 0u64;
        let (mut last_byte, mut last_handed) = (Instant::now(), Instant::now());
        while !stop.load(Ordering::Relaxed) && !close.load(Ordering::Relaxed) {
            if have >= 4 {
                let version = u16::from_be_bytes([buf[0], buf[1]]);
                let len = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
                if version != telemark_wire::ipfix::IPFIX_VERSION
                    || len < telemark_wire::ipfix::IPFIX_HEADER_LEN
                {
                    self.stats.refused[1].fetch_add(1, Ordering::Relaxed);
                    break;
                }
                if have >= len {
                    self.decode(from, &buf[..len]);
                    messages += 1;
                    last_message_ms.store(clock_ms(), Ordering::Relaxed);
                    buf.copy_within(len..have, 0);
                    have -= len;
                    continue;
                }
            }
            if messages == 0 && started.elapsed() >= first {
                self.stats.tcp_first_message_timeouts.fetch_add(1, Ordering::Relaxed);
                break;
            }
            match s.read(&mut buf[have..]) {
                Ok(0) => break,
                Ok(n) => {
                    have += n;
                    last_byte = Instant::now();
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if last_byte.elapsed() >= TCP_IDLE {
                        break;
                    }
                }
                Err(_) => break,
            }
            if self.flows.len() >= 10_000 || last_handed.elapsed() >= Duration::from_millis(500) {
                last_handed = Instant::now();
                self.hand_over();
            }
        }
        self.hand_over();
    }

    fn run(&mut self, mut rx: UdpRx, stop: &AtomicBool) {
        let mut last_handed = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            match rx.recv() {
                Ok(n) => {
                    // The kernel's count is cumulative for the socket (and wraps at 2^32).
                    let d = rx.kernel_drops() as u32;
                    let new = d.wrapping_sub(self.last_overflow);
                    self.last_overflow = d;
                    self.stats.overflows.fetch_add(u64::from(new), Ordering::Relaxed);
                    for i in 0..n {
                        let (bytes, _) = rx.datagram(i);
                        let Some(from) = rx.source(i) else { continue };
                        if self.allow.is_empty() || self.allow.iter().any(|p| p.contains(from.ip()))
                        {
                            self.decode(from, bytes);
                        } else {
                            self.stats.not_allowed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!("flows: receive: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            if self.flows.len() >= 10_000 || last_handed.elapsed() >= Duration::from_millis(500) {
                last_handed = Instant::now();
                self.hand_over();
            }
        }
        self.hand_over();
    }

    /// Publishes the decoder's counters and hands the flows and what it learnt to the storer.
    fn hand_over(&mut self) {
        let s = &self.decoder.stats;
        let add = |a: &AtomicU64, now: u64, before: u64| {
            a.fetch_add(now.saturating_sub(before), Ordering::Relaxed);
        };
        add(&self.stats.datagrams, s.datagrams, self.seen.datagrams);
        add(&self.stats.flows, s.flows, self.seen.flows);
        add(&self.stats.sequence_resets, s.sequence_resets, self.seen.sequence_resets);
        add(&self.stats.domains_evicted, s.domains_evicted, self.seen.domains_evicted);
        add(&self.stats.counter_samples, s.counter_samples, self.seen.counter_samples);
        for (r, c) in REFUSALS.iter().zip(&self.stats.refused) {
            let get = |st: &crate::flows::DecodeStats| st.refused.get(r).copied().unwrap_or(0);
            add(c, get(s), get(&self.seen));
        }
        // Pending is a gauge per worker; the shared one sums the changes.
        if s.pending >= self.seen.pending {
            self.stats.pending.fetch_add(s.pending - self.seen.pending, Ordering::Relaxed);
        } else {
            self.stats.pending.fetch_sub(self.seen.pending - s.pending, Ordering::Relaxed);
        }
        self.seen = s.clone();
        self.publish_exporters();
        if let (n @ 1.., Some(from)) = self.unlogged_loss {
            if self.last_loss_log.is_none_or(|t| t.elapsed() >= LOSS_LOG_EVERY) {
                tracing::warn!(
                    "flows: exporters' sequence numbers say {n} records or datagrams never \
                     arrived (latest from {from}); telemark_collector_flow_exporter_lost_total \
                     has them by exporter"
                );
                self.last_loss_log = Some(Instant::now());
                self.unlogged_loss = (0, None);
            }
        }
        let learnt = self.decoder.take_changes();
        if self.persist {
            self.changes.extend(learnt);
            if self.changes.len() > MAX_CHANGES {
                let over = self.changes.len() - MAX_CHANGES;
                self.changes.drain(..over);
                self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.flows.is_empty() && self.changes.is_empty() {
            return;
        }
        let b = Batch {
            worker: self.worker,
            flows: std::mem::take(&mut self.flows),
            changes: std::mem::take(&mut self.changes),
        };
        if let Err(std::sync::mpsc::TrySendError::Full(b)) = self.tx.try_send(b) {
            // The store is behind: the flows go (counted), what was learnt waits.
            self.stats.store_behind.fetch_add(b.flows.len() as u64, Ordering::Relaxed);
            self.changes = b.changes;
        }
    }
}

/// The storing thread: flows as `flow` records, numbered per exporter and worker.
struct Storer {
    ingest: Arc<Ingest>,
    stats: Arc<FlowStats>,
    /// This run's start; worker `i`'s records have boot `boot + i`.
    boot: u64,
    /// The next number per (exporter, worker).
    next_seq: HashMap<(String, usize), u64>,
}

impl Storer {
    fn store(&mut self, b: Batch) {
        if !b.changes.is_empty() {
            if let Err(e) = self.ingest.store().remember_flow_state(&b.changes) {
                tracing::warn!("flows: keeping templates: {e}");
                self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if b.flows.is_empty() {
            return;
        }
        let now = crate::now_ns();
        let mut by_exporter: HashMap<String, Vec<Record>> = HashMap::new();
        for f in &b.flows {
            let agent = f.exporter.to_string();
            let r = Record::Flow(record(&agent, f, now));
            by_exporter.entry(agent).or_default().push(r);
        }
        let mut st = self.ingest.store();
        for (agent, recs) in by_exporter {
            let next = self.next_seq.entry((agent.clone(), b.worker)).or_insert(0);
            let numbered: Vec<(u64, Record)> =
                recs.into_iter().enumerate().map(|(i, r)| (*next + i as u64, r)).collect();
            *next += numbered.len() as u64;
            match st.ingest_flows(&agent, self.boot + b.worker as u64, &numbered, now) {
                Ok(s) => {
                    self.stats.stored.fetch_add(s.accepted, Ordering::Relaxed);
                    // A count no reader could hold (validate::counts), refused by the store.
                    for _ in 0..s.refused {
                        self.ingest.metrics.count_error("exporter_count_too_large");
                    }
                }
                Err(e) => {
                    tracing::warn!("flows: storing {agent}'s flows: {e}");
                    self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// How far back an exporter's own times are believed: older ones (a clock far off, a
/// replayed capture) take the arrival time.
const BELIEVED_NS: u64 = 3600 * 1_000_000_000;

/// The `flow` record of an exported flow: packets and bytes scaled by the sampling rate,
/// exact only when every packet was counted; a sampled count's `error_bound` is the half
/// width of its 95 % interval (1.96 · rate · √samples).
fn record(agent: &str, f: &ExportedFlow, now: u64) -> FlowRecord {
    // The flow's own first and last packet times when the exporter sent believable ones
    // (one of them: a window of that instant); else the arrival time.
    let believable = |t: u64| {
        t != 0 && t.saturating_add(BELIEVED_NS) >= now && t <= now.saturating_add(BELIEVED_NS)
    };
    let (start, end, exporter_times) = match (believable(f.start_ns), believable(f.end_ns)) {
        (true, true) if f.start_ns <= f.end_ns => (f.start_ns, f.end_ns, true),
        (true, false) => (f.start_ns, f.start_ns, true),
        (false, true) => (f.end_ns, f.end_ns, true),
        _ => (now, now, false),
    };
    let rate = u64::from(f.sampling_rate.max(1));
    let exact = rate == 1;
    FlowRecord {
        agent: agent.to_string(),
        port: f.in_if.to_string(),
        point: f.protocol.name().to_string(),
        flow: Flow {
            src: f.key.src.to_string(),
            dst: f.key.dst.to_string(),
            sport: f.key.sport,
            dport: f.key.dport,
            proto: f.key.proto,
            spi: f.key.spi,
            si: f.key.si,
        },
        window_start_ns: start,
        window_end_ns: end,
        packets: f.packets_estimated(),
        bytes: f.bytes_estimated(),
        exact,
        error_bound: if exact {
            0
        } else {
            (1.96 * rate as f64 * (f.packets as f64).sqrt()).ceil() as u64
        },
        truth_packets: None,
        truth_bytes: None,
        exported: FlowExport {
            direction: f.direction,
            tos: Some(f.tos),
            tcp_flags: (f.key.proto == 6).then_some(f.tcp_flags),
            out_port: (f.out_if != 0).then(|| f.out_if.to_string()),
            sampling_rate: Some(f.sampling_rate.max(1)),
            exporter_times: Some(exporter_times),
        },
        heavy: Default::default(),
    }
}
