//! The INT collector's configuration: its flags, its TOML file (docs/int.md) and the two
//! resolved into one [`Config`], checked before anything binds.

use crate::control::{DetectList, Rules};
use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use telemark_core::int::sequence::Limits as SeqLimits;
use telemark_core::int::{DetectRule, DetectSection};
use telemark_datapath::xdp::XdpMode;
use telemark_socket::Prefix;
use telemark_wire::dialect::Mode;

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
    #[arg(long, value_parser = telemark_core::units::parse_positive_duration_ns)]
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
pub(crate) struct Config {
    pub(crate) name: String,
    pub(crate) listen: SocketAddr,
    pub(crate) workers: usize,
    pub(crate) mode: Mode,
    pub(crate) flows: usize,
    pub(crate) queue: usize,
    pub(crate) rcvbuf: usize,
    pub(crate) xdp: Option<(String, XdpMode)>,
    pub(crate) allow: Vec<Prefix>,
    pub(crate) limits: SeqLimits,
    pub(crate) rules: Rules,
    pub(crate) collector: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) metrics: Option<(SocketAddr, Option<String>)>,
    /// The token a controller sends to change the detector rules; `None`: no control API.
    pub(crate) control_token: Option<String>,
}

fn read_token(p: &Path) -> Result<String> {
    let t = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    Ok(t.trim().to_string())
}

/// Resolves the config file and the flags (flags win).
pub(crate) fn resolve(a: Args) -> Result<Config> {
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
        (None, Some(t)) => telemark_core::units::parse_positive_duration_ns(t)
            .map_err(|e| anyhow::anyhow!("node_idle: {e}"))?,
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
pub struct Offline {
    pub rules: Vec<DetectRule>,
    pub mode: Mode,
    pub flows: usize,
    pub allow: Vec<Prefix>,
    pub limits: SeqLimits,
}

/// Resolves a config file and flags as `int-collector` would, without binding anything.
pub fn offline(config: Option<PathBuf>, strict: bool, allow: Vec<Prefix>) -> Result<Offline> {
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
pub fn sender_allowed(allow: &[Prefix], src: IpAddr) -> bool {
    allowed(allow, Some(src))
}

/// Whether a datagram from `src` is read: any sender when the list is empty (loopback only).
/// The receiver gives an IPv4-mapped sender as IPv4 already.
pub(crate) fn allowed(allow: &[Prefix], src: Option<IpAddr>) -> bool {
    allow.is_empty() || src.is_some_and(|ip| allow.iter().any(|p| p.contains(ip)))
}
