//! `telemark collector`: the telemetry server (docs/collector.md).

use anyhow::{Context, Result};
use clap::Args as ClapArgs;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::path::PathBuf;
use std::time::Duration;
use telemark_collector::{Collector, Config};

/// `telemark collector` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9900")]
    pub listen: std::net::SocketAddr,
    /// Where records are stored: a SQLite file (created if missing), or a PostgreSQL database
    /// that several collectors share (`postgresql://user@host:5432/telemark`; a Unix socket's
    /// directory percent-encoded as the host: `postgresql://telemark@%2Frun%2Fpostgresql/telemark`).
    #[arg(long, default_value = "telemark.db")]
    pub db: PathBuf,
    /// PostgreSQL: the password, read from this file (never on the command line).
    #[arg(long)]
    pub db_password_file: Option<PathBuf>,
    /// Delete records older than this (e.g. 3600s, 90m, 48h, 7d; 0 keeps everything).
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    pub retention: Duration,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Token file (TOML: `[agents] name = "token"`, `[readers] name = "token"`); needed to
    /// listen on anything but a loopback address.
    #[arg(long)]
    pub auth: Option<PathBuf>,
    /// Request-handling threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: u16,
    /// Connections open at once (more wait in the kernel's backlog).
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// Connections one source address may hold open at once; more are closed at once and
    /// counted (http_refused_total{reason="per_source_limit"}).
    #[arg(long, default_value_t = 256)]
    pub max_connections_per_source: usize,
    /// Longest a request waits for room in the request-body budget (2 x workers x
    /// max-body) before it is answered 503 with Retry-After (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub body_wait: Duration,
    /// Slowest a request body may arrive after its first 2 s, in bytes per second (0: no
    /// minimum); slower ones are answered 408.
    #[arg(long, default_value_t = 1024)]
    pub min_body_rate: u64,
    /// Time a client has to send a request's head; also how long a keep-alive connection may
    /// sit idle (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub head_timeout: Duration,
    /// Time a client has to send a request's body.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub body_timeout: Duration,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Kafka settings (TOML: `[kafka]` brokers and client settings, `[publish]` to publish
    /// what is stored, `[consume]` to store what a consumer group reads; docs/kafka.md).
    #[arg(long)]
    pub kafka: Option<PathBuf>,
    /// Take NetFlow v5/v9, IPFIX and sFlow v5 on this UDP address (repeatable; e.g.
    /// 0.0.0.0:2055, 0.0.0.0:6343; docs/flows.md).
    #[arg(long = "flows-listen")]
    pub flows_listen: Vec<std::net::SocketAddr>,
    /// Take IPFIX over TCP on this address (repeatable; e.g. 0.0.0.0:4739; docs/flows.md).
    #[arg(long = "flows-listen-tcp")]
    pub flows_listen_tcp: Vec<std::net::SocketAddr>,
    /// Exporters allowed to send flows (address or prefix, repeatable); required for a
    /// non-loopback --flows-listen or --flows-listen-tcp.
    #[arg(long = "flows-allow")]
    pub flows_allow: Vec<telemark_collector::flow_listen::Prefix>,
    /// Sockets per --flows-listen address (SO_REUSEPORT).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub flows_workers: u16,
    /// Receive buffer per flow socket, bytes.
    #[arg(long, default_value_t = 8 << 20)]
    pub flows_rcvbuf: usize,
    /// Longest one request may spend reading the database (e.g. 10s, 500ms); a query past it
    /// is stopped and answered 503 (docs/collector.md, "Queries").
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub query_budget: Duration,
    /// Requests that may read the database at once, each on a read-only connection of its own
    /// (0: half of --workers, at least 1); one more is answered 503.
    #[arg(long, default_value_t = 0)]
    pub query_readers: usize,
    /// The agents the console may steer (their watch and INT rules): a TOML file naming each
    /// agent's control URL (its loopback [metrics] listener) and control token file
    /// (docs/console.md, "Steering"). Changes need an [operators] token.
    #[arg(long)]
    pub control: Option<std::path::PathBuf>,
    /// Bytes of data sets held for templates not seen yet, across all flow sockets and
    /// IPFIX-over-TCP sessions (the oldest of a decoder go first; docs/flows.md).
    #[arg(long, default_value_t = 64 << 20)]
    pub flows_held_bytes: usize,
    /// Template fields kept across all flow decoders (each template counts its fields + 16;
    /// about 8 bytes each); new templates past it are refused and counted.
    #[arg(long, default_value_t = 4 << 20)]
    pub flows_template_fields: usize,
    /// Templates one exporter's observation domain may define.
    #[arg(long, default_value_t = 1024)]
    pub flows_templates_per_domain: usize,
    /// Fields one template may have; larger ones are refused and counted.
    #[arg(long, default_value_t = 512)]
    pub flows_max_template_fields: usize,
    /// Bytes a template's data record must take at least; shorter ones are refused.
    #[arg(long, default_value_t = 4)]
    pub flows_min_record_len: usize,
    /// Field reads (records x fields) one datagram may cost; the rest of it is refused.
    #[arg(long, default_value_t = 1 << 18)]
    pub flows_max_work: u64,
    /// A sequence number further ahead than this is a reset (counted), not loss.
    #[arg(long, default_value_t = 1 << 20)]
    pub flows_max_sequence_gap: u32,
    /// IPFIX-over-TCP sessions one exporter address may hold at once.
    #[arg(long, default_value_t = 16)]
    pub flows_tcp_per_source: usize,
    /// Time a new IPFIX-over-TCP session has to send its first whole message.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub flows_tcp_first_message: Duration,
    /// Exporter addresses given their own label on per-exporter flow metrics (the first
    /// seen); the others are counted as exporter="other".
    #[arg(long, default_value_t = 32)]
    pub flows_exporter_labels: usize,
}

/// A duration such as `30s`, `15m`, `48h`, `7d` (seconds without a unit; 0 allowed).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    telemark_core::units::parse_duration_ns(s).map(Duration::from_nanos)
}

/// Runs the collector until Ctrl-C.
pub fn run(a: Args) -> Result<()> {
    let auth = a.auth.as_deref().map(telemark_collector::auth::Auth::load).transpose()?;
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(telemark_transport::tls::server_config(cert, key)?),
        _ => None,
    };
    let kafka = a
        .kafka
        .as_deref()
        .map(telemark_collector::kafka::KafkaFile::load)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let defaults = Config::default();
    let cfg = Config {
        auth,
        tls,
        listen: a.listen,
        db: a.db,
        db_password_file: a.db_password_file,
        retention: a.retention,
        limits: telemark_transport::server::Limits {
            max_body: a.max_body,
            max_connections: a.max_connections.max(1),
            max_connections_per_source: a.max_connections_per_source.max(1),
            body_wait: a.body_wait.max(Duration::from_millis(10)),
            min_body_rate: a.min_body_rate,
            head_timeout: a.head_timeout.max(Duration::from_millis(100)),
            body_timeout: a.body_timeout.max(Duration::from_millis(100)),
            ..defaults.limits.clone()
        },
        workers: usize::from(a.workers),
        query_budget: a.query_budget.max(Duration::from_millis(1)),
        query_readers: a.query_readers,
        control: a
            .control
            .as_deref()
            .map(telemark_collector::steer::Steering::load)
            .transpose()
            .map_err(anyhow::Error::msg)?
            .map(std::sync::Arc::new),
        kafka,
        flows: telemark_collector::flow_listen::FlowListenConfig {
            listen: a.flows_listen,
            listen_tcp: a.flows_listen_tcp,
            allow: a.flows_allow,
            workers: usize::from(a.flows_workers),
            rcvbuf: a.flows_rcvbuf,
            limits: telemark_collector::flows::Limits {
                pending_sets: defaults.flows.limits.pending_sets,
                max_template_fields: a.flows_max_template_fields,
                min_record_len: a.flows_min_record_len,
                max_templates_per_domain: a.flows_templates_per_domain,
                max_work: a.flows_max_work,
                max_sequence_gap: a.flows_max_sequence_gap,
            },
            held_max_bytes: a.flows_held_bytes,
            template_fields_max: a.flows_template_fields,
            tcp_per_source: a.flows_tcp_per_source,
            tcp_first_message: a.flows_tcp_first_message.max(Duration::from_millis(100)),
            exporter_labels: a.flows_exporter_labels,
            state_retention: a.retention,
        },
        ..defaults
    };
    let mut signals =
        Signals::new([SIGINT, SIGTERM, SIGHUP]).context("installing signal handlers")?;
    let c = Collector::start(&cfg)?;
    tracing::info!(
        "telemark collector: {}://{} (page, /api/v1/…, /metrics), database {}",
        if cfg.tls.is_some() { "https" } else { "http" },
        c.addr,
        telemark_collector::store::describe(&cfg.db)
    );
    for sig in signals.forever() {
        if sig != SIGHUP {
            break;
        }
        // SIGHUP: the token file again (rotating a token needs no restart).
        let Some(path) = &a.auth else {
            tracing::info!("SIGHUP: nothing to reload (no --auth)");
            continue;
        };
        match telemark_collector::auth::Auth::load(path).map_err(|e| e.to_string()) {
            Ok(auth) => match c.set_auth(auth) {
                Ok(()) => tracing::info!("tokens reloaded from {}", path.display()),
                Err(e) => tracing::warn!("tokens not reloaded: {e}"),
            },
            Err(e) => tracing::warn!("tokens not reloaded, the old ones stay: {e}"),
        }
    }
    tracing::info!("stopping: finishing requests in progress");
    c.stop();
    tracing::info!("stopped");
    Ok(())
}
