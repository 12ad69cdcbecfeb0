//! `telemark collector`: the telemetry server of the loss paper, grown up.
//!
//! Agents register, then send records in acknowledged batches over HTTP; each batch is stored
//! in SQLite in one transaction and acknowledged only once committed, and every record carries
//! (agent, run, sequence number) so a retried batch is stored once. The collector answers JSON
//! queries (flows, loss time series, localisation, agents), serves Prometheus metrics and a page.
//! See docs/collector.md.

pub mod api;
pub mod auth;
pub mod flow_listen;
pub mod flows;
pub mod ingest;
pub mod kafka;
pub mod link;
pub mod metrics;
pub mod overview;
mod page;
pub mod path;
pub mod pg;
mod rollup;
pub mod settle;
pub mod steer;
pub mod store;
pub mod validate;

use api::Api;
use ingest::Ingest;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
pub use telemark_transport::now_ns;
use telemark_transport::server::{Limits, Server, ServerConfig, ServerStats};

/// Collector settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Database file.
    pub db: PathBuf,
    /// The PostgreSQL password, read from this file (kept out of the URL, the command line and
    /// the logs).
    pub db_password_file: Option<PathBuf>,
    /// Records older than this are deleted (checked once a minute); 0 keeps everything.
    pub retention: Duration,
    /// What a client may make the server hold (body, head, URL, connections, timeouts).
    pub limits: Limits,
    /// TLS (certificate and key), when set.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Request-handling threads.
    pub workers: usize,
    /// Agents silent for longer than this are shown unhealthy.
    pub stale: Duration,
    /// Tokens; without them the collector serves anyone, on a loopback address only.
    pub auth: Option<auth::Auth>,
    /// Kafka: publish what is stored, store what is read (docs/kafka.md).
    pub kafka: Option<kafka::KafkaFile>,
    /// NetFlow, IPFIX and sFlow listeners (docs/flows.md); none when `listen` is empty.
    pub flows: flow_listen::FlowListenConfig,
    /// Longest one request may spend reading the database; past it the query is stopped and
    /// answered 503 (docs/collector.md, "Queries").
    pub query_budget: Duration,
    /// Read-only connections, so at most this many requests read at once (0: half the
    /// workers, at least 1); the writer is never one of them.
    pub query_readers: usize,
    /// The agents the console may steer, and how to reach their control APIs (`--control`;
    /// docs/console.md, "Steering").
    pub control: Option<Arc<steer::Steering>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 9900)),
            db: PathBuf::from("telemark.db"),
            db_password_file: None,
            retention: Duration::from_secs(7 * 24 * 3600),
            limits: Limits::default(),
            tls: None,
            workers: 4,
            stale: Duration::from_secs(15),
            auth: None,
            kafka: None,
            flows: flow_listen::FlowListenConfig::default(),
            query_budget: store::DEFAULT_QUERY_BUDGET,
            query_readers: 0,
            control: None,
        }
    }
}

impl Config {
    /// Reader connections: `query_readers`, or half the workers (at least 1), so queries
    /// never take every request thread from writers and probes.
    pub fn readers(&self) -> usize {
        match self.query_readers {
            0 => (self.workers / 2).max(1),
            n => n,
        }
    }
}

/// A failure to start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database could not be opened.
    #[error("cannot open database {path}: {err}")]
    Db {
        /// Its path or URL (without a password: [`store::describe`]).
        path: String,
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
    /// Kafka could not be set up (a bad setting, an in-memory database to publish from).
    #[error("kafka: {0}")]
    Kafka(String),
    /// A flow-export listener could not be set up.
    #[error("{0}")]
    Flows(String),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {err}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        err: telemark_transport::server::ServerError,
    },
}

/// A running collector; dropping it stops it.
pub struct Collector {
    /// Where it listens (the real port when 0 was asked for).
    pub addr: SocketAddr,
    /// The shared state, for in-process use (the demo reads it directly).
    pub api: Arc<Api>,
    server: Option<Server>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Collector {
    /// Opens the database and starts serving.
    pub fn start(cfg: &Config) -> Result<Collector, StartError> {
        if cfg.auth.is_none() && !cfg.listen.ip().is_loopback() {
            return Err(StartError::Exposed { addr: cfg.listen });
        }
        let db_err = |err| StartError::Db { path: store::describe(&cfg.db), err };
        let password = match &cfg.db_password_file {
            Some(f) => Some(std::fs::read_to_string(f).map_err(|e| {
                db_err(store::StoreError::Postgres(format!("password file {}: {e}", f.display())))
            })?),
            None => None,
        };
        let mut store = store::Store::open_with(&cfg.db, password.as_deref().map(str::trim_end))
            .map_err(db_err)?;
        let publish = match cfg.kafka.as_ref().and_then(|k| k.publish.as_ref()) {
            Some(_) if cfg.db.as_os_str() == ":memory:" => {
                return Err(StartError::Kafka(
                    "publishing needs a database file (the outbox is read by its own \
                     connection)"
                        .into(),
                ))
            }
            Some(p) => Some(store.publish(p.outbox_max).map_err(db_err)?),
            None => None,
        };
        let readers = store.readers(cfg.readers(), cfg.query_budget).map_err(db_err)?;
        let ingest = Arc::new(Ingest::new(store));
        let api = Arc::new(Api {
            ingest: ingest.clone(),
            readers,
            stale_ns: cfg.stale.as_nanos() as u64,
            auth: std::sync::RwLock::new(cfg.auth.clone()),
            transport: Arc::new(ServerStats::default()),
            kafka: Arc::new(kafka::KafkaStats::default()),
            flows: Arc::new(flow_listen::FlowStats::default()),
            steering: cfg.control.clone(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        if let Some(k) = &cfg.kafka {
            if let Some(state) = publish {
                let goflow2 = k.publish.as_ref().and_then(|p| p.goflow2_topic.clone());
                let t = kafka::publish(
                    cfg.db.clone(),
                    k.kafka.clone(),
                    goflow2,
                    state,
                    api.kafka.clone(),
                    stop.clone(),
                )
                .map_err(StartError::Kafka)?;
                threads.push(t);
            }
            if let Some(c) = &k.consume {
                let t = kafka::consume(
                    ingest.clone(),
                    k.kafka.clone(),
                    c.clone(),
                    api.kafka.clone(),
                    stop.clone(),
                )
                .map_err(StartError::Kafka)?;
                threads.push(t);
            }
        }
        if !cfg.flows.listen.is_empty() || !cfg.flows.listen_tcp.is_empty() {
            let t = flow_listen::start(ingest.clone(), &cfg.flows, api.flows.clone(), stop.clone())
                .map_err(StartError::Flows)?;
            threads.extend(t);
        }
        let server_cfg = ServerConfig {
            listen: cfg.listen,
            tls: cfg.tls.clone(),
            limits: cfg.limits.clone(),
            workers: cfg.workers,
        };
        let server = Server::start(server_cfg, api.clone(), api.transport.clone())
            .map_err(|err| StartError::Listen { addr: cfg.listen, err })?;
        let addr = server.addr;
        // Housekeeping: segments between agents settled every few seconds (`settle`), records past
        // the retention removed each minute.
        let (api2, stop2, keep) = (api.clone(), stop.clone(), cfg.retention);
        threads.push(std::thread::spawn(move || {
            let (api, stop) = (api2, stop2);
            let long_ago = std::time::Instant::now() - Duration::from_secs(3600);
            let (mut expired, mut settled) = (long_ago, long_ago);
            while !stop.load(Ordering::Relaxed) {
                if settled.elapsed() >= settle::SETTLE_EVERY {
                    settled = std::time::Instant::now();
                    loop {
                        let pass = api.store().settle(now_ns());
                        match pass {
                            Ok(p) if p.behind && !stop.load(Ordering::Relaxed) => continue,
                            Ok(_) => break,
                            Err(e) => {
                                tracing::warn!("settling segments between agents: {e}");
                                api.ingest.metrics.count_error("settle");
                                break;
                            }
                        }
                    }
                }
                if !keep.is_zero() && expired.elapsed() >= Duration::from_secs(60) {
                    expired = std::time::Instant::now();
                    let before = now_ns().saturating_sub(keep.as_nanos() as u64);
                    let done = api.store().expire(before);
                    if let Err(e) = done {
                        tracing::warn!("retention: {e}");
                        api.ingest.metrics.count_error("retention");
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }));
        Ok(Collector { addr, api, server: Some(server), stop, threads })
    }

    /// New tokens (SIGHUP after the token file changed): requests from now on are checked
    /// against them. A collector started without tokens keeps serving without.
    pub fn set_auth(&self, auth: auth::Auth) -> Result<(), &'static str> {
        let mut cur = self.api.auth.write().unwrap_or_else(|p| p.into_inner());
        if cur.is_none() {
            return Err("started without tokens: restart with --auth to use them");
        }
        *cur = Some(auth);
        Ok(())
    }

    /// Stops accepting, lets requests in progress finish, and waits for the threads.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
        self.stop.store(true, Ordering::Relaxed);
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
