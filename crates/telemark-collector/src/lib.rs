//! `telemark collector`: the telemetry server of the loss paper, grown up.
//!
//! Agents register, then send records in acknowledged batches over HTTP; each batch is stored
//! in SQLite in one transaction and acknowledged only once committed, and every record carries
//! (agent, run, sequence number) so a retried batch is stored once. The collector answers JSON
//! queries (flows, loss time series, localisation, agents), serves Prometheus metrics and a page.
//! See docs/collector.md.

pub mod api;
pub mod auth;
pub mod client;
pub mod link;
pub mod metrics;
mod page;
pub mod path;
pub mod store;
pub mod validate;

use api::{Api, Response};
use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Collector settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Database file.
    pub db: PathBuf,
    /// Records older than this are deleted (checked once a minute); 0 keeps everything.
    pub retention: Duration,
    /// Largest request body accepted.
    pub max_body: usize,
    /// Request-handling threads.
    pub workers: usize,
    /// Agents silent for longer than this are shown unhealthy.
    pub stale: Duration,
    /// Tokens; without them the collector serves anyone, on a loopback address only.
    pub auth: Option<auth::Auth>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 9900)),
            db: PathBuf::from("telemark.db"),
            retention: Duration::from_secs(7 * 24 * 3600),
            max_body: 8 << 20,
            workers: 4,
            stale: Duration::from_secs(15),
            auth: None,
        }
    }
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A failure to start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database could not be opened.
    #[error("cannot open database {path}: {err}")]
    Db {
        /// Its path.
        path: PathBuf,
        /// Why.
        err: store::StoreError,
    },
    /// A non-loopback address without tokens: anyone who reaches it could write and read.
    #[error(
        "{addr} is not a loopback address: listening there needs tokens (--auth FILE, \
         docs/collector.md \"Authentication\")"
    )]
    Exposed {
        /// The address.
        addr: SocketAddr,
    },
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {err}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        err: String,
    },
}

/// A running collector; dropping it stops it.
pub struct Collector {
    /// Where it listens (the real port when 0 was asked for).
    pub addr: SocketAddr,
    /// The shared state, for in-process use (the demo reads it directly).
    pub api: Arc<Api>,
    server: Arc<tiny_http::Server>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Collector {
    /// Opens the database and starts serving.
    pub fn start(cfg: &Config) -> Result<Collector, StartError> {
        if cfg.auth.is_none() && !cfg.listen.ip().is_loopback() {
            return Err(StartError::Exposed { addr: cfg.listen });
        }
        let store = store::Store::open(&cfg.db)
            .map_err(|err| StartError::Db { path: cfg.db.clone(), err })?;
        let api = Arc::new(Api {
            store: Mutex::new(store),
            metrics: metrics::Metrics::default(),
            stale_ns: cfg.stale.as_nanos() as u64,
            auth: cfg.auth.clone(),
        });
        let server = tiny_http::Server::http(cfg.listen)
            .map_err(|e| StartError::Listen { addr: cfg.listen, err: e.to_string() })?;
        let addr = server.server_addr().to_ip().unwrap_or(cfg.listen);
        let server = Arc::new(server);
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for _ in 0..cfg.workers.max(1) {
            let (server, api, stop) = (server.clone(), api.clone(), stop.clone());
            let max_body = cfg.max_body;
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match server.recv_timeout(Duration::from_millis(200)) {
                        Ok(Some(req)) => serve(&api, req, max_body),
                        Ok(None) => {}
                        Err(_) => break,
                    }
                }
            }));
        }
        if !cfg.retention.is_zero() {
            let (api, stop, keep) = (api.clone(), stop.clone(), cfg.retention);
            threads.push(std::thread::spawn(move || {
                let mut last = std::time::Instant::now() - Duration::from_secs(3600);
                while !stop.load(Ordering::Relaxed) {
                    if last.elapsed() >= Duration::from_secs(60) {
                        last = std::time::Instant::now();
                        let before = now_ns().saturating_sub(keep.as_nanos() as u64);
                        let mut st = api.store();
                        if st.expire(before).is_err() {
                            api.metrics.count_error("retention");
                        }
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }));
        }
        Ok(Collector { addr, api, server, stop, threads })
    }

    /// Stops serving and waits for the threads (requests in progress finish first).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.server.unblock();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Reads one request (at most `max_body` bytes of body) and answers it.
fn serve(api: &Api, mut req: tiny_http::Request, max_body: usize) {
    let method = req.method().as_str().to_string();
    let url = req.url().to_string();
    let authorization = req
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .map(|h| h.value.as_str().to_string());
    let token = authorization.as_deref().and_then(auth::bearer);
    let declared = req.body_length();
    let resp = if declared.is_some_and(|n| n > max_body) {
        api.metrics.count_error("body_too_large");
        Response::error(413, format!("request body over {max_body} bytes"))
    } else {
        let mut body = Vec::new();
        let read = req.as_reader().take(max_body as u64 + 1).read_to_end(&mut body);
        match read {
            Err(e) => {
                api.metrics.count_error("read");
                Response::error(400, format!("reading the request body: {e}"))
            }
            Ok(_) if body.len() > max_body => {
                api.metrics.count_error("body_too_large");
                Response::error(413, format!("request body over {max_body} bytes"))
            }
            Ok(_) => {
                let r = api::Request { method: &method, url: &url, token, body: &body };
                api.handle(&r, now_ns())
            }
        }
    };
    let mut r = tiny_http::Response::from_data(resp.body).with_status_code(resp.status);
    let headers = std::iter::once(("Content-Type", resp.content_type.to_string()))
        .chain(resp.headers)
        .filter_map(|(k, v)| tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).ok());
    for h in headers {
        r = r.with_header(h);
    }
    let _ = req.respond(r);
}
