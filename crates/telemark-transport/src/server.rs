//! The HTTP server both services listen with: hyper's HTTP/1.1 on a small tokio runtime, TLS
//! from rustls, and every bound an exposed service needs (docs/collector.md, "Limits"):
//!
//! - a bound on open connections (the next wait in the kernel's backlog), each a task, not a
//!   thread, so idle sockets cost memory only;
//! - the request head (line and headers) within [`Limits::max_head`] bytes and
//!   [`Limits::head_timeout`], which also closes keep-alive connections left idle;
//! - the URL within [`Limits::max_url`], the body within [`Limits::max_body`] (a larger
//!   Content-Length is refused before a byte of it is read) and [`Limits::body_timeout`];
//! - handlers on at most `workers` threads, so slow sockets never hold one: a handler runs only
//!   once its whole request has arrived;
//! - at most `2 × workers × max_body` bytes of request bodies in memory at once (each body
//!   takes its Content-Length, or `max_body` without one, from that budget before it is read;
//!   the others wait, unread, in their sockets), so memory is bounded by the workers, not by
//!   the connections;
//! - accept failures (file descriptors exhausted) counted and retried, never fatal;
//! - graceful shutdown: stop accepting, finish what is in progress, within a grace period.
//!
//! Handlers are [`Handler`]s: pure functions of request and clock.

use crate::http::{bearer, Handler, Request, Response};
use crate::now_ns;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
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

    /// The Prometheus text for these counters, each name starting with `prefix` (for example
    /// `telemark_collector`).
    pub fn render(&self, prefix: &str, o: &mut String) {
        let _ = writeln!(
            o,
            "# HELP {prefix}_connections_total Connections accepted.\n\
             # TYPE {prefix}_connections_total counter\n\
             {prefix}_connections_total {}\n\
             # HELP {prefix}_connections_open Connections open now.\n\
             # TYPE {prefix}_connections_open gauge\n\
             {prefix}_connections_open {}",
            self.connections.load(Ordering::Relaxed),
            self.open.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            o,
            "# HELP {prefix}_http_refused_total Requests and connections the transport refused \
             or lost, by reason.\n# TYPE {prefix}_http_refused_total counter"
        );
        for (k, n) in self.refused.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(o, "{prefix}_http_refused_total{{reason=\"{k}\"}} {n}");
        }
        let _ = writeln!(
            o,
            "# HELP {prefix}_http_request_duration_seconds Time from a complete request to its \
             answer, by route.\n# TYPE {prefix}_http_request_duration_seconds histogram"
        );
        for (route, h) in self.latency.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let name = format!("{prefix}_http_request_duration_seconds");
            for (n, le) in h.buckets.iter().zip(LATENCY_BUCKETS) {
                let _ = writeln!(o, "{name}_bucket{{route=\"{route}\",le=\"{le}\"}} {n}");
            }
            let _ = writeln!(o, "{name}_bucket{{route=\"{route}\",le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(o, "{name}_sum{{route=\"{route}\"}} {}", h.sum);
            let _ = writeln!(o, "{name}_count{{route=\"{route}\"}} {}", h.count);
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
        let listen = cfg.listen;
        let std_listener = std::net::TcpListener::bind(listen)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|err| ServerError::Listen { addr: listen, err })?;
        let addr = std_listener.local_addr().unwrap_or(listen);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(cfg.workers.max(1))
            .thread_name("telemark-http")
            .enable_all()
            .build()
            .map_err(ServerError::Runtime)?;
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("telemark-http-accept".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(std_listener) {
                        Ok(l) => accept_loop(l, cfg, handler, stats, stopped).await,
                        Err(e) => tracing::error!(%addr, "cannot listen: {e}"),
                    }
                });
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

async fn accept_loop<H: Handler>(
    listener: tokio::net::TcpListener,
    cfg: ServerConfig,
    handler: Arc<H>,
    stats: Arc<ServerStats>,
    mut stopped: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(cfg.limits.max_connections.max(1)));
    let budget = 2 * cfg.workers.max(1) * cfg.limits.max_body.div_ceil(1024).max(1);
    let bodies = Arc::new(Semaphore::new(budget.min(Semaphore::MAX_PERMITS)));
    let tls = cfg.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let cfg = Arc::new(cfg);
    // Accept failures come in storms (every 50 ms while descriptors are exhausted): logged once
    // per 10 s with how many there were; all are counted.
    let mut quiet_until = Instant::now();
    let mut unlogged = 0u64;
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
        let _ = tcp.set_nodelay(true);
        stats.connections.fetch_add(1, Ordering::Relaxed);
        stats.open.fetch_add(1, Ordering::Relaxed);
        let shared =
            Shared { handler: handler.clone(), stats: stats.clone(), bodies: bodies.clone() };
        let (cfg, stats, tls, stopped) = (cfg.clone(), stats.clone(), tls.clone(), stopped.clone());
        tokio::spawn(async move {
            match tls {
                None => connection(tcp, &cfg, shared, stopped).await,
                Some(acceptor) => {
                    let hs =
                        tokio::time::timeout(cfg.limits.handshake_timeout, acceptor.accept(tcp));
                    match hs.await {
                        Ok(Ok(s)) => connection(s, &cfg, shared, stopped).await,
                        Ok(Err(e)) => {
                            stats.refuse("tls_handshake");
                            tracing::debug!(%peer, "TLS handshake failed: {e}");
                        }
                        Err(_) => stats.refuse("tls_handshake_timeout"),
                    }
                }
            }
            stats.open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    // Stop accepting, then wait for the connections to finish (they were told to).
    drop(listener);
    let all = u32::try_from(cfg.limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(cfg.limits.shutdown_grace, slots.acquire_many(all)).await;
}

/// What every connection of a server shares.
struct Shared<H> {
    handler: Arc<H>,
    stats: Arc<ServerStats>,
    /// The KiB of request bodies that may be in memory.
    bodies: Arc<Semaphore>,
}

impl<H> Clone for Shared<H> {
    fn clone(&self) -> Self {
        Shared {
            handler: self.handler.clone(),
            stats: self.stats.clone(),
            bodies: self.bodies.clone(),
        }
    }
}

async fn connection<H, S>(
    io: S,
    cfg: &ServerConfig,
    shared: Shared<H>,
    mut stopped: watch::Receiver<bool>,
) where
    H: Handler,
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let stats = shared.stats.clone();
    let svc = {
        let limits = cfg.limits.clone();
        hyper::service::service_fn(move |req| {
            let (shared, limits) = (shared.clone(), limits.clone());
            async move { Ok::<_, std::convert::Infallible>(answer(req, shared, &limits).await) }
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

/// Reads one request within the limits and runs the handler on it.
async fn answer<H: Handler>(
    req: hyper::Request<Incoming>,
    shared: Shared<H>,
    limits: &Limits,
) -> hyper::Response<Full<Bytes>> {
    let Shared { handler, stats, bodies } = shared;
    let stats = &*stats;
    let (parts, body) = req.into_parts();
    let url = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let route = handler.route(url.split_once('?').map_or(url.as_str(), |(p, _)| p));
    if url.len() > limits.max_url {
        stats.refuse("url_too_long");
        return reply(Response::error(414, format!("URL over {} bytes", limits.max_url)));
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
    // send them.
    let _permit = if hyper::body::Body::is_end_stream(&body) {
        None
    } else {
        let size = declared.map_or(limits.max_body as u64, |n| n.min(limits.max_body as u64));
        let kib = u32::try_from(size.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        bodies.acquire_many_owned(kib).await.ok()
    };
    let read =
        tokio::time::timeout(limits.body_timeout, Limited::new(body, limits.max_body).collect());
    let body = match read.await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            stats.refuse("body_too_large");
            return reply(Response::error(
                413,
                format!("request body over {} bytes", limits.max_body),
            ));
        }
        Ok(Err(e)) => {
            stats.refuse("body_read");
            return reply(Response::error(400, format!("reading the request body: {e}")));
        }
        Err(_) => {
            stats.refuse("body_timeout");
            return reply(Response::error(408, "the request body took too long"));
        }
    };
    let token = parts
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .map(str::to_string);
    let method = parts.method.as_str().to_string();
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
