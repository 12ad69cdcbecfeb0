//! `telemark collector`: the telemetry server (docs/collector.md).

use anyhow::{Context, Result};
use clap::Args as ClapArgs;
use std::path::PathBuf;
use std::time::Duration;
use telemark_collector::{Collector, Config};

/// `telemark collector` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9900")]
    pub listen: std::net::SocketAddr,
    /// SQLite database file (created if missing).
    #[arg(long, default_value = "telemark.db")]
    pub db: PathBuf,
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
}

/// A duration such as `30s`, `15m`, `48h`, `7d` (seconds without a unit; 0 allowed).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    telemark_core::units::parse_duration_ns(s).map(Duration::from_nanos)
}

/// Runs the collector until Ctrl-C.
pub fn run(a: Args) -> Result<()> {
    let auth = a.auth.as_deref().map(telemark_collector::auth::Auth::load).transpose()?;
    let cfg = Config {
        auth,
        listen: a.listen,
        db: a.db,
        retention: a.retention,
        max_body: a.max_body,
        workers: usize::from(a.workers),
        ..Config::default()
    };
    let c = Collector::start(&cfg)?;
    eprintln!(
        "telemark collector: http://{} (page, /api/v1/…, /metrics), database {}",
        c.addr,
        cfg.db.display()
    );
    let (tx, rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })
    .context("installing the Ctrl-C handler")?;
    let _ = rx.recv();
    eprintln!("telemark collector: stopping");
    c.stop();
    Ok(())
}
