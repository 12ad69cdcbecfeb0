//! The HTTP server both services listen with: hyper's HTTP/1.1 on a small tokio runtime, TLS
//! from rustls, and every bound an exposed service needs (docs/collector.md, "Limits"):
//!
//! - a bound on open connections (the next wait in the kernel's backlog of [`Limits::backlog`]),
//!   each a task, not a thread, so idle sockets cost memory only; at most
//!   [`Limits::max_connections_per_source`] of them from one address (more are accepted and
//!   closed at once, counted), and when three quarters of the bound are open, connections idle
//!   for a second are closed (counted), so idle sockets cannot lock clients out;
//! - the request head (line and headers) within [`Limits::max_head`] bytes and
//!   [`Limits::head_timeout`], which also closes keep-alive connections left idle;
//! - the URL within [`Limits::max_url`], the body within [`Limits::max_body`] (a larger
//!   Content-Length is refused before a byte of it is read) and [`Limits::body_timeout`];
//! - who may make a request is asked of the handler ([`Handler::admit`]) once its head has
//!   arrived and before a byte of its body is read: a request without a valid token is answered
//!   401 (403, …) and its connection closed, counted, at no cost in body budget;
//! - a body must keep coming at [`Limits::min_body_rate`] after its first 2 s (a trickle is cut
//!   off, 408, counted);
//! - handlers on at most `workers` threads, so slow sockets never hold one: a handler runs only
//!   once its whole request has arrived;
//! - at most `2 × workers × max_body` bytes of request bodies in memory at once (each body
//!   takes its Content-Length, or `max_body` without one, from that budget before it is read;
//!   the others wait, unread, in their sockets, at most [`Limits::body_wait`], then 503 with
//!   `Retry-After`), so memory is bounded by the workers, not by the connections; one source
//!   address may hold at most half of that budget (503 beyond, counted);
//! - accept failures (file descriptors exhausted) counted and retried, never fatal;
//! - graceful shutdown: stop accepting, finish what is in progress, within a grace period.
//!
//! Handlers are [`Handler`]s: pure functions of request and clock.

use crate::http::{bearer, Handler, Request, Response};
use crate::metrics::{Exposition, Value};
use crate::now_ns;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Semaphore};

/// The bounds on what a client may make the server hold.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body.
    pub max_body: usize,
    /// Largest request head (request line and headers); hyper's floor is 8 KiB.
    pub max_head: usize,
    /// Longest URL (path and query).
    pub max_url: usize,
    /// Connections open at once.
    pub max_connections: usize,
    /// Time to send a request head, and the longest a keep-alive connection may sit idle.
    pub head_timeout: Duration,
    /// Time to send a request body.
    pub body_timeout: Duration,
    /// Time to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// How long a shutdown waits for requests in progress.
    pub shutdown_grace: Duration,
    /// Connections open at once from one source address (more are closed at once, counted).
    pub max_connections_per_source: usize,
    /// The listen backlog (the kernel caps it at `net.core.somaxconn`).
    pub backlog: u32,
    /// Longest a request waits for room in the body budget before it is answered 503.
    pub body_wait: Duration,
    /// Slowest a body may arrive after its first 2 s, bytes per second (0: no minimum).
    pub min_body_rate: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body: 8 << 20,
            max_head: 16 << 10,
            max_url: 4 << 10,
            max_connections: 4096,
            head_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
            max_connections_per_source: 256,
            backlog: 4096,
            body_wait: Duration::from_secs(2),
            min_body_rate: 1024,
        }
    }
}

/// Where and how to listen.
#[derive(Clone)]
pub struct ServerConfig {
    /// The address.
    pub listen: SocketAddr,
    /// TLS, when set (see [`crate::tls::server_config`]).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The bounds.
    pub limits: Limits,
    /// Threads running handlers.
    pub workers: usize,
}

impl ServerConfig {
    /// A service's own small listener for `/metrics` and, when `control` is true, its control
    /// API: no TLS (so it is loopback-only whenever a control token is set, which the services'
    /// configs check), one handler thread, 64 connections, and bodies only for the control API,
    /// small (64 KiB holds hundreds of rules).
    pub fn metrics_listener(listen: SocketAddr, control: bool) -> ServerConfig {
        let max_body = if control { 64 * 1024 } else { 0 };
        ServerConfig {
            listen,
            tls: None,
            limits: Limits { max_body, max_connections: 64, ..Limits::default() },
            workers: 1,
        }
    }
}

/// A failure to start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {err}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        err: std::io::Error,
    },
    /// The runtime could not be built.
    #[error("cannot start the HTTP runtime: {0}")]
    Runtime(std::io::Error),
}

/// Upper bounds, in seconds, of the request-latency histogram's buckets.
const LATENCY_BUCKETS: [f64; 12] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

#[derive(Default, Clone)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// What the server saw, for the service's `/metrics`.
#[derive(Default)]
pub struct ServerStats {
    connections: AtomicU64,
    open: AtomicU64,
    /// When the served TLS certificate stops being valid (Unix seconds; 0: no TLS).
    cert_expiry: std::sync::atomic::AtomicI64,
    refused: Mutex<BTreeMap<&'static str, u64>>,
    latency: Mutex<BTreeMap<&'static str, Histogram>>,
}

impl ServerStats {
    fn refuse(&self, reason: &'static str) {
        *self.refused.lock().unwrap_or_else(|p| p.into_inner()).entry(reason).or_default() += 1;
    }

    /// Requests or connections refused or failed at the transport, by reason.
    pub fn refused(&self, reason: &str) -> u64 {
        self.refused.lock().unwrap_or_else(|p| p.into_inner()).get(reason).copied().unwrap_or(0)
    }

    fn observe(&self, route: &'static str, took: Duration) {
        let mut l = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        let h = l.entry(route).or_default();
        let s = took.as_secs_f64();
        for (b, le) in h.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            *b += u64::from(s <= le);
        }
        h.count += 1;
        h.sum += s;
    }

    /// These counters' families on a `/metrics` page, each name starting with `prefix` (for
    /// example `telemark_collector`), without the page's common labels.
    pub fn render(&self, prefix: &str, page: &mut Exposition) {
        page.without_labels();
        page.counter(&format!("{prefix}_connections_total"), "Connections accepted.", &[])
            .value(self.connections.load(Ordering::Relaxed));
        page.gauge(&format!("{prefix}_connections_open"), "Connections open now.", &[])
            .value(self.open.load(Ordering::Relaxed));
        if let Some(t) = Some(self.cert_expiry.load(Ordering::Relaxed)).filter(|&t| t != 0) {
            page.gauge(
                &format!("{prefix}_tls_cert_expiry_seconds"),
                "When the served TLS certificate stops being valid (notAfter, Unix time).",
                &[],
            )
            .value(t);
        }
        let refused = page.counter(
            &format!("{prefix}_http_refused_total"),
            "Requests and connections the transport refused or lost, by reason.",
            &["reason"],
        );
        for (k, n) in self.refused.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            refused.sample(&[k], *n);
        }
        let latency = page.histogram(
            &format!("{prefix}_http_request_duration_seconds"),
            "Time from a complete request to its answer, by route.",
            &["route"],
        );
        for (route, h) in self.latency.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let buckets = LATENCY_BUCKETS.into_iter().zip(h.buckets).collect();
            latency.sample(&[route], Value::Histogram { sum: h.sum, count: h.count, buckets });
        }
    }
}

/// A running server; dropping it shuts it down gracefully.
pub struct Server {
    /// Where it listens (the real port when 0 was asked for).
    pub addr: SocketAddr,
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `cfg.listen` and serves `handler` on a thread of its own.
    pub fn start<H: Handler>(
        cfg: ServerConfig,
        handler: Arc<H>,
        stats: Arc<ServerStats>,
    ) -> Result<Server, ServerError> {
        raise_fd_limit();
        let expiry = cfg.tls.as_ref().and_then(crate::tls::cert_expiry).unwrap_or(0);
        stats.cert_expiry.store(expiry, Ordering::Relaxed);
        let listen = cfg.listen;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(cfg.workers.max(1))
            .thread_name("telemark-http")
            .enable_all()
            .build()
            .map_err(ServerError::Runtime)?;
        // A backlog larger than std's 128, so a burst of connections (or idle ones holding
        // every slot for a moment) does not make the kernel drop new clients' SYNs.
        let listener = runtime
            .block_on(async { bind(listen, cfg.limits.backlog) })
            .map_err(|err| ServerError::Listen { addr: listen, err })?;
        let addr = listener.local_addr().unwrap_or(listen);
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("telemark-http-accept".into())
            .spawn(move || {
                runtime.block_on(accept_loop(listener, cfg, handler, stats, stopped));
                // Handlers still running (past the grace period) are not waited for.
                runtime.shutdown_timeout(Duration::from_millis(100));
            })
            .map_err(ServerError::Runtime)?;
        Ok(Server { addr, stop: Some(stop), thread: Some(thread) })
    }

    /// Stops accepting, lets requests in progress finish (within the grace period), returns.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A listening socket on `addr` with `backlog` (SO_REUSEADDR, as std's bind sets it).
fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<tokio::net::TcpListener> {
    let s = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    s.set_reuseaddr(true)?;
    s.bind(addr)?;
    s.listen(backlog.max(1))
}

/// Raises this process's soft limit on open files to its hard limit (as Go's runtime does), so
/// the connection bound, not the default 1,024, is what limits clients.
fn raise_fd_limit() {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// How long a connection must have been idle to be closed while the server is near its
/// connection bound.
const PRESSURED_IDLE: Duration = Duration::from_secs(1);

/// The grace a body has before [`Limits::min_body_rate`] applies.
const RATE_GRACE: Duration = Duration::from_secs(2);

/// The longest a refused request's body is read (and thrown away) before its answer, so that a
/// client that sent it whole reads the answer instead of a reset.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// How much of something (connections, KiB of bodies) each source address holds.
#[derive(Default)]
struct PerSource(Mutex<HashMap<IpAddr, u64>>);

impl PerSource {
    /// Takes `n` more for `ip` if it then holds at most `max`; given back when the guard drops.
    fn take(self: &Arc<Self>, ip: IpAddr, n: u64, max: u64) -> Option<SourceGuard> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let held = m.get(&ip).copied().unwrap_or(0);
        if held + n > max {
            return None;
        }
        m.insert(ip, held + n);
        Some(SourceGuard { of: self.clone(), ip, n })
    }
}

/// A source's share, given back on drop.
struct SourceGuard {
    of: Arc<PerSource>,
    ip: IpAddr,
    n: u64,
}

impl Drop for SourceGuard {
    fn drop(&mut self) {
        let mut m = self.of.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = m.get_mut(&self.ip) {
            *h = h.saturating_sub(self.n);
            if *h == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// When a connection last finished a request, and whether one is in progress.
struct Activity {
    busy: AtomicU64,
    /// ms since the server's epoch.
    last_ms: AtomicU64,
}

async fn accept_loop<H: Handler>(
    listener: tokio::net::TcpListener,
    cfg: ServerConfig,
    handler: Arc<H>,
    stats: Arc<ServerStats>,
    mut stopped: watch::Receiver<bool>,
) {
    let max = cfg.limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max));
    let budget = 2 * cfg.workers.max(1) * cfg.limits.max_body.div_ceil(1024).max(1);
    let budget = budget.min(Semaphore::MAX_PERMITS);
    let bodies = Arc::new(Semaphore::new(budget));
    let per_source = Arc::new(PerSource::default());
    let per_source_max = cfg.limits.max_connections_per_source.max(1) as u64;
    // Set while three quarters of the connections are open (cleared below half): idle ones
    // are closed then.
    let (pressure, pressured) = watch::channel(false);
    let pressure = Arc::new(pressure);
    let shared = Shared {
        handler,
        stats: stats.clone(),
        bodies,
        budget_kib: budget as u64,
        body_share: Arc::new(PerSource::default()),
        epoch: Instant::now(),
    };
    let tls = cfg.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let cfg = Arc::new(cfg);
    // Accept failures come in storms (every 50 ms while descriptors are exhausted): logged once
    // per 10 s with how many there were; all are counted. So are refusals per source.
    let mut quiet_until = Instant::now();
    let mut unlogged = 0u64;
    let mut source_quiet_until = Instant::now();
    let mut source_unlogged = 0u64;
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stopped.changed() => break,
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: the socket stays in the backlog; try again shortly.
                    stats.refuse("accept");
                    unlogged += 1;
                    if Instant::now() >= quiet_until {
                        tracing::warn!("accept failed {unlogged} time(s): {e}; retrying");
                        (quiet_until, unlogged) = (Instant::now() + Duration::from_secs(10), 0);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped.changed() => break,
        };
        // One address may not hold every slot: past its share, closed at once.
        let Some(source) = per_source.take(peer.ip(), 1, per_source_max) else {
            stats.refuse("per_source_limit");
            source_unlogged += 1;
            if Instant::now() >= source_quiet_until {
                tracing::warn!(
                    "{source_unlogged} connection(s) closed at once: {} holds {per_source_max} \
                     (--max-connections-per-source)",
                    peer.ip()
                );
                (source_quiet_until, source_unlogged) =
                    (Instant::now() + Duration::from_secs(10), 0);
            }
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let open = stats.open.fetch_add(1, Ordering::Relaxed) + 1;
        if open * 4 >= max as u64 * 3 {
            pressure.send_if_modified(|p| !std::mem::replace(p, true));
        }
        let (shared, pressure, pressured) = (shared.clone(), pressure.clone(), pressured.clone());
        let (cfg, stats, tls, stopped) = (cfg.clone(), stats.clone(), tls.clone(), stopped.clone());
        tokio::spawn(async move {
            let on = Conn { peer: peer.ip(), stopped, pressured };
            match tls {
                None => connection(tcp, &cfg, shared, on).await,
                Some(acceptor) => {
                    let hs =
                        tokio::time::timeout(cfg.limits.handshake_timeout, acceptor.accept(tcp));
                    match hs.await {
                        Ok(Ok(s)) => connection(s, &cfg, shared, on).await,
                        Ok(Err(e)) => {
                            stats.refuse("tls_handshake");
                            tracing::debug!(%peer, "TLS handshake failed: {e}");
                        }
                        Err(_) => stats.refuse("tls_handshake_timeout"),
                    }
                }
            }
            let open = stats.open.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
            if open * 2 <= max as u64 {
                pressure.send_if_modified(|p| std::mem::replace(p, false));
            }
            drop((source, permit));
        });
    }
    // Stop accepting, then wait for the connections to finish (they were told to).
    drop(listener);
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(cfg.limits.shutdown_grace, slots.acquire_many(all)).await;
}

/// What every connection of a server shares.
struct Shared<H> {
    handler: Arc<H>,
    stats: Arc<ServerStats>,
    /// The KiB of request bodies that may be in memory.
    bodies: Arc<Semaphore>,
    /// Its size.
    budget_kib: u64,
    /// The KiB of it each source address holds or waits for.
    body_share: Arc<PerSource>,
    /// When the server started (connections' activity is in ms since then).
    epoch: Instant,
}

impl<H> Clone for Shared<H> {
    fn clone(&self) -> Self {
        Shared {
            handler: self.handler.clone(),
            stats: self.stats.clone(),
            bodies: self.bodies.clone(),
            budget_kib: self.budget_kib,
            body_share: self.body_share.clone(),
            epoch: self.epoch,
        }
    }
}

/// One connection's peer and the signals it listens to.
struct Conn {
    peer: IpAddr,
    stopped: watch::Receiver<bool>,
    pressured: watch::Receiver<bool>,
}

async fn connection<H, S>(io: S, cfg: &ServerConfig, shared: Shared<H>, on: Conn)
where
    H: Handler,
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Conn { peer, mut stopped, pressured } = on;
    let (stats, epoch) = (shared.stats.clone(), shared.epoch);
    let ms = move || epoch.elapsed().as_millis() as u64;
    let act = Arc::new(Activity { busy: AtomicU64::new(0), last_ms: AtomicU64::new(ms()) });
    let svc = {
        let (limits, act) = (cfg.limits.clone(), act.clone());
        hyper::service::service_fn(move |req| {
            let (shared, limits, act) = (shared.clone(), limits.clone(), act.clone());
            async move {
                act.busy.fetch_add(1, Ordering::Relaxed);
                let r = answer(req, shared, &limits, peer).await;
                act.last_ms.store(ms(), Ordering::Relaxed);
                act.busy.fetch_sub(1, Ordering::Relaxed);
                Ok::<_, std::convert::Infallible>(r)
            }
        })
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(cfg.limits.head_timeout)
        .max_buf_size(cfg.limits.max_head.max(8192))
        .keep_alive(true);
    let conn = http.serve_connection(TokioIo::new(io), svc);
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stopped.changed() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = idle_under_pressure(pressured, &act, ms) => {
            stats.refuse("idle_under_pressure");
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        let reason = if e.is_timeout() {
            "head_timeout"
        } else if e.is_parse_too_large() {
            "head_too_large"
        } else if e.is_parse() {
            "bad_request"
        } else if e.is_incomplete_message() {
            "incomplete"
        } else {
            "connection"
        };
        stats.refuse(reason);
    }
}

/// Returns once the server is near its connection bound and this connection has been idle
/// (no request in progress) for [`PRESSURED_IDLE`].
async fn idle_under_pressure(
    mut pressured: watch::Receiver<bool>,
    act: &Activity,
    ms: impl Fn() -> u64,
) {
    loop {
        if pressured.wait_for(|p| *p).await.is_err() {
            return std::future::pending().await;
        }
        let idle = Duration::from_millis(ms().saturating_sub(act.last_ms.load(Ordering::Relaxed)));
        if act.busy.load(Ordering::Relaxed) == 0 && idle >= PRESSURED_IDLE {
            return;
        }
        let left = PRESSURED_IDLE.saturating_sub(idle).max(Duration::from_millis(100));
        tokio::time::sleep(left).await;
    }
}

/// `r`, and the connection closed after it (its body, if any, is not read further).
fn closing(mut r: Response) -> hyper::Response<Full<Bytes>> {
    r.headers.push(("Connection", "close".into()));
    reply(r)
}

/// 503: the server is busy; try again in a second.
fn busy(msg: &str) -> hyper::Response<Full<Bytes>> {
    let mut r = Response::error(503, msg);
    r.headers.push(("Retry-After", "1".into()));
    closing(r)
}

/// Reads one request within the limits and runs the handler on it.
async fn answer<H: Handler>(
    req: hyper::Request<Incoming>,
    shared: Shared<H>,
    limits: &Limits,
    peer: IpAddr,
) -> hyper::Response<Full<Bytes>> {
    let Shared { handler, stats, bodies, budget_kib, body_share, .. } = shared;
    let stats = &*stats;
    let (parts, body) = req.into_parts();
    let url = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let path = url.split_once('?').map_or(url.as_str(), |(p, _)| p);
    let route = handler.route(path);
    if url.len() > limits.max_url {
        stats.refuse("url_too_long");
        return reply(Response::error(414, format!("URL over {} bytes", limits.max_url)));
    }
    let token = parts
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .map(str::to_string);
    let method = parts.method.as_str().to_string();
    let has_body = !hyper::body::Body::is_end_stream(&body);
    // Who may make this request, before a byte of its body is read: a client without a
    // token cannot make the server hold its body.
    if let Some(r) = handler.admit(&method, path, token.as_deref()) {
        match r.status {
            401 => stats.refuse("unauthenticated"),
            403 => stats.refuse("forbidden"),
            _ => {}
        }
        if has_body {
            // Thrown away as it arrives (nothing is kept), for a short while, so a client
            // that sent its request whole reads this answer rather than a reset.
            let limits = Limits { body_timeout: DRAIN_LIMIT, ..limits.clone() };
            let _ = read_body(body, &limits, None).await;
        }
        return closing(r);
    }
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        stats.refuse("body_too_large");
        return reply(Response::error(413, format!("request body over {} bytes", limits.max_body)));
    }
    // A body is read only once its size is taken from the budget, and given back when its
    // answer is made: bodies in memory are bounded by the workers, however many connections
    // send them. One source address may hold (or wait for) at most half of it, and nobody
    // waits for it longer than `body_wait`.
    let _permit = if has_body {
        let size = declared.map_or(limits.max_body as u64, |n| n.min(limits.max_body as u64));
        let kib = size.div_ceil(1024).max(1);
        let Some(share) = body_share.take(peer, kib, (budget_kib / 2).max(kib)) else {
            stats.refuse("body_budget_source");
            return busy("this address has too many request bodies in progress; retry");
        };
        let kib = u32::try_from(kib).unwrap_or(u32::MAX);
        match tokio::time::timeout(limits.body_wait, bodies.acquire_many_owned(kib)).await {
            Ok(Ok(p)) => Some((p, share)),
            Ok(Err(_)) => return busy("the server is stopping"),
            Err(_) => {
                stats.refuse("body_budget_timeout");
                return busy("too many request bodies in progress; retry");
            }
        }
    } else {
        None
    };
    let body = match read_body(body, limits, Some(declared.unwrap_or(0) as usize)).await {
        Ok(b) => b,
        Err((reason, r)) => {
            stats.refuse(reason);
            return closing(r);
        }
    };
    let started = Instant::now();
    let ran = tokio::task::spawn_blocking(move || {
        let req = Request { method: &method, url: &url, token: token.as_deref(), body: &body };
        handler.handle(&req, now_ns())
    })
    .await;
    let resp = ran.unwrap_or_else(|e| {
        stats.refuse("handler_panic");
        tracing::error!("request handler failed: {e}");
        Response::error(500, "internal error")
    });
    stats.observe(route, started.elapsed());
    reply(resp)
}

/// Reads a body of at most `max_body` bytes within `body_timeout`, arriving at
/// `min_body_rate` or faster after its first [`RATE_GRACE`]; `keep`: whether to keep it (with
/// room for that many bytes), or throw it away as it arrives.
async fn read_body(
    mut body: Incoming,
    limits: &Limits,
    keep: Option<usize>,
) -> Result<Vec<u8>, (&'static str, Response)> {
    let start = tokio::time::Instant::now();
    let deadline = start + limits.body_timeout;
    let mut out = Vec::with_capacity(keep.unwrap_or(0).min(limits.max_body));
    let mut got = 0u64;
    loop {
        // By when more than `got` bytes must have come.
        let due = match limits.min_body_rate {
            0 => deadline,
            r => start + RATE_GRACE + Duration::from_secs_f64(got as f64 / r as f64),
        };
        let until = deadline.min(due);
        let frame = match tokio::time::timeout_at(until, body.frame()).await {
            Ok(f) => f,
            Err(_) if until >= deadline => {
                return Err((
                    "body_timeout",
                    Response::error(408, "the request body took too long"),
                ))
            }
            Err(_) => {
                return Err((
                    "body_too_slow",
                    Response::error(
                        408,
                        format!(
                            "the request body came slower than {} bytes/s",
                            limits.min_body_rate
                        ),
                    ),
                ))
            }
        };
        match frame {
            None => return Ok(out),
            Some(Err(e)) => {
                return Err(("body_read", Response::error(400, format!("reading the body: {e}"))))
            }
            Some(Ok(f)) => {
                let Ok(data) = f.into_data() else { continue };
                got += data.len() as u64;
                if got > limits.max_body as u64 {
                    return Err((
                        "body_too_large",
                        Response::error(
                            413,
                            format!("request body over {} bytes", limits.max_body),
                        ),
                    ));
                }
                if keep.is_some() {
                    out.extend_from_slice(&data);
                }
            }
        }
    }
}

fn reply(r: Response) -> hyper::Response<Full<Bytes>> {
    let mut b = hyper::Response::builder()
        .status(r.status)
        .header(hyper::header::CONTENT_TYPE, r.content_type);
    for (k, v) in &r.headers {
        b = b.header(*k, v.as_str());
    }
    b.body(Full::new(Bytes::from(r.body))).unwrap_or_else(|_| {
        let mut e = hyper::Response::new(Full::new(Bytes::from_static(b"bad response header")));
        *e.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        e
    })
}
