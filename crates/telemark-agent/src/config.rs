//! The agent's configuration file (TOML). Every key is documented in `docs/agent.md` and in
//! `examples/agent.toml` (which a test loads); unknown keys are errors, so a typo never silently
//! falls back to a default.

use serde::Deserialize;
use std::path::Path;
use telemark_core::loss::LossConfig;
use telemark_core::units::parse_duration_ns;
use telemark_core::watch::{parse_proto, Rule, Watch};

/// What is wrong with a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {err}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        err: std::io::Error,
    },
    /// TOML syntax, a wrong type, or an unknown key.
    #[error("{0}")]
    Toml(String),
    /// A value out of range, or settings that contradict each other.
    #[error("{0}")]
    Invalid(String),
}

fn invalid(s: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(s.into())
}

/// Which side of a port pair this switch is the first hop for: it colors packets arriving there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MarkSide {
    /// Packets arriving on port `a`.
    A,
    /// Packets arriving on port `b`.
    B,
    /// Both directions.
    Both,
    /// Neither: the flows were colored upstream.
    None,
}

/// Two ports the switch forwards between, both ways.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairConfig {
    /// One port (interface name).
    pub a: String,
    /// The other port.
    pub b: String,
    /// Where this switch colors packets (it is their first hop).
    #[serde(default = "mark_none")]
    pub mark: MarkSide,
    /// Another agent's point that sees the a → b traffic before port `a` does (`sw-b/egress`),
    /// so the collector can name the link between the two.
    pub upstream_a: Option<String>,
    /// The same for b → a traffic arriving on port `b`.
    pub upstream_b: Option<String>,
}

fn mark_none() -> MarkSide {
    MarkSide::None
}

/// A port observed without forwarding.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TapConfig {
    /// Interface name.
    pub port: String,
    /// Another agent's point upstream of this one (`sw-f/egress`).
    pub upstream: Option<String>,
}

/// Loss-monitor parameters (defaults from the loss paper).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossSection {
    /// Packets per color, B.
    pub batch: Option<u32>,
    /// Time-based marking period, e.g. `10ms` (count-based when absent).
    pub period: Option<String>,
    /// DSCP bit carrying the color.
    pub color_bit: Option<u8>,
    /// Step threshold, a share of B.
    pub threshold: Option<f64>,
    /// Flows measured per direction.
    pub table_size: Option<usize>,
    /// 8, 16 or 32.
    pub counter_bits: Option<u8>,
    /// A flow idle this long is closed and forgotten, e.g. `2s`.
    pub idle: Option<String>,
}

/// A watch rule as written in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchSection {
    /// Source address or prefix.
    pub src: Option<String>,
    /// Destination address or prefix.
    pub dst: Option<String>,
    /// `tcp`, `udp`, `icmp` or a number.
    pub proto: Option<String>,
    /// Source port.
    pub sport: Option<u16>,
    /// Destination port.
    pub dport: Option<u16>,
}

/// Export settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportSection {
    /// Collector base URL, `http://127.0.0.1:9900`; absent: records go to stdout as JSON lines.
    pub collector: Option<String>,
    /// How often records are sent, e.g. `1s`.
    pub interval: Option<String>,
    /// How often per-point summaries and cost records are made, e.g. `1s`.
    pub summary_interval: Option<String>,
    /// Records held while the collector does not acknowledge; more are dropped and counted.
    pub buffer: Option<usize>,
    /// Emit a loss record for every batch, not only lossy ones.
    pub report_all: Option<bool>,
    /// A file holding this agent's token for the collector (its token file's `[agents]`
    /// entry); read at start.
    pub token_file: Option<std::path::PathBuf>,
    /// For an `https://` collector: the CA certificate(s) (PEM) that signed its certificate;
    /// only these are trusted. Absent: the public web PKI.
    pub ca_file: Option<std::path::PathBuf>,
}

/// The agent's own `/metrics` listener (its health, for Prometheus).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Address, e.g. `127.0.0.1:9901`.
    pub listen: std::net::SocketAddr,
    /// A file holding the token scrapers must send (`Authorization: Bearer`); needed to listen
    /// on anything but a loopback address.
    pub token_file: Option<std::path::PathBuf>,
}

/// The file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Agent name in records (1–64 of letters, digits, `- _ . :`).
    pub agent: String,
    /// Network namespace (name under `/run/netns`) the ports live in; absent: this one.
    pub netns: Option<String>,
    /// Port pairs to forward between (switch mode).
    #[serde(default)]
    pub pair: Vec<PairConfig>,
    /// Ports to observe only (tap mode).
    #[serde(default)]
    pub tap: Vec<TapConfig>,
    /// Flows to watch; none: all flows, first come first served.
    #[serde(default)]
    pub watch: Vec<WatchSection>,
    /// Measure (default); false: forward only, the baseline of `telemark bench-live`.
    pub measure: Option<bool>,
    /// Loss monitor.
    pub loss: Option<LossSection>,
    /// Export.
    pub export: Option<ExportSection>,
    /// The agent's `/metrics`; absent: no listener.
    pub metrics: Option<MetricsSection>,
}

/// The validated configuration the agent runs with.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Agent name.
    pub agent: String,
    /// Network namespace of the ports.
    pub netns: Option<String>,
    /// Port pairs.
    pub pairs: Vec<PairConfig>,
    /// Tapped ports.
    pub taps: Vec<TapConfig>,
    /// Flows watched.
    pub watch: Watch,
    /// Loss monitor.
    pub loss: LossConfig,
    /// Collector URL.
    pub collector: Option<String>,
    /// Export interval, ns.
    pub export_interval_ns: u64,
    /// Summary interval, ns.
    pub summary_interval_ns: u64,
    /// Export buffer, records.
    pub buffer: usize,
    /// Report every batch.
    pub report_all: bool,
    /// The token sent to the collector.
    pub token: Option<String>,
    /// TLS trust for an `https://` collector, from `export.ca_file`.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// Where `/metrics` is served, and the token scrapers must send.
    pub metrics: Option<(std::net::SocketAddr, Option<String>)>,
    /// Measure; false: forward only.
    pub measure: bool,
    /// Discard records instead of printing them when there is no collector (benchmarks).
    pub quiet: bool,
}

/// The one token in file `f` (whitespace around it ignored).
fn token_file(what: &str, f: &std::path::Path) -> Result<String, ConfigError> {
    let t = std::fs::read_to_string(f)
        .map_err(|err| invalid(format!("{what} {}: {err}", f.display())))?;
    let t = t.trim().to_string();
    if t.len() < 32 || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(format!(
            "{what} {}: one token of at least 32 printable characters",
            f.display()
        )));
    }
    Ok(t)
}

fn duration(what: &str, s: &Option<String>, default: u64) -> Result<u64, ConfigError> {
    match s {
        None => Ok(default),
        Some(s) => match parse_duration_ns(s) {
            Ok(0) => Err(invalid(format!("{what}: must be more than zero"))),
            Ok(v) => Ok(v),
            Err(e) => Err(invalid(format!("{what}: {e}"))),
        },
    }
}

/// Whether `name` is a valid agent name (the collector's rule).
pub fn valid_agent_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
}

impl FileConfig {
    /// Parses a TOML document.
    pub fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| ConfigError::Read { path: path.display().to_string(), err })?;
        FileConfig::parse(&text).map_err(|e| match e {
            ConfigError::Toml(m) => ConfigError::Toml(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Checks every value and fills in defaults.
    pub fn validate(self) -> Result<AgentConfig, ConfigError> {
        if !valid_agent_name(&self.agent) {
            return Err(invalid(format!(
                "agent name {:?}: 1-64 of letters, digits, '-', '_', '.', ':'",
                self.agent
            )));
        }
        if self.pair.is_empty() && self.tap.is_empty() {
            return Err(invalid("nothing to do: give at least one [[pair]] or [[tap]]"));
        }
        let mut seen = std::collections::HashSet::new();
        let ports =
            self.pair.iter().flat_map(|p| [&p.a, &p.b]).chain(self.tap.iter().map(|t| &t.port));
        for p in ports {
            if p.is_empty() || p.len() > 15 {
                return Err(invalid(format!("port {p:?}: interface names are 1-15 bytes")));
            }
            if !seen.insert(p.clone()) {
                return Err(invalid(format!("port {p:?} appears twice")));
            }
        }
        if seen.len() > 16 {
            return Err(invalid("at most 16 ports per agent"));
        }
        let ups = self
            .pair
            .iter()
            .flat_map(|p| [&p.upstream_a, &p.upstream_b])
            .chain(self.tap.iter().map(|t| &t.upstream));
        for u in ups.flatten() {
            let ok = u.split_once('/').is_some_and(|(a, p)| valid_agent_name(a) && !p.is_empty());
            if !ok {
                return Err(invalid(format!(
                    "upstream {u:?}: write it agent/point, e.g. sw-b/egress"
                )));
            }
        }
        let mut watch = Watch::default();
        for (i, w) in self.watch.iter().enumerate() {
            let bad =
                |e: telemark_core::watch::WatchError| invalid(format!("[[watch]] #{}: {e}", i + 1));
            let rule = Rule {
                src: w.src.as_deref().map(str::parse).transpose().map_err(bad)?,
                dst: w.dst.as_deref().map(str::parse).transpose().map_err(bad)?,
                proto: w.proto.as_deref().map(parse_proto).transpose().map_err(bad)?,
                sport: w.sport,
                dport: w.dport,
            };
            if rule == Rule::default() {
                return Err(invalid(format!(
                    "[[watch]] #{} is empty: it would match everything",
                    i + 1
                )));
            }
            watch.rules.push(rule);
        }
        let d = LossConfig::default();
        let l = self.loss.unwrap_or_default();
        let loss = LossConfig {
            batch: l.batch.unwrap_or(d.batch),
            period_ns: match &l.period {
                None => None,
                Some(_) => Some(duration("loss.period", &l.period, 0)?),
            },
            color_bit: l.color_bit.unwrap_or(d.color_bit),
            threshold: l.threshold.unwrap_or(d.threshold),
            table_size: l.table_size.unwrap_or(d.table_size),
            counter_bits: l.counter_bits.unwrap_or(d.counter_bits),
            idle_ns: duration("loss.idle", &l.idle, d.idle_ns)?,
        };
        loss.validate().map_err(|e| invalid(format!("[loss]: {e}")))?;
        let e = self.export.unwrap_or_default();
        if let Some(c) = &e.collector {
            if !(c.starts_with("http://") || c.starts_with("https://")) {
                return Err(invalid(format!(
                    "export.collector {c:?}: write http://host:port or https://host:port"
                )));
            }
        }
        let buffer = e.buffer.unwrap_or(100_000);
        if buffer == 0 {
            return Err(invalid("export.buffer: must be at least 1"));
        }
        let token =
            e.token_file.as_deref().map(|f| token_file("export.token_file", f)).transpose()?;
        let tls = match &e.ca_file {
            None => None,
            Some(f) => Some(
                telemark_transport::tls::client_config(f)
                    .map_err(|err| invalid(format!("export.ca_file: {err}")))?,
            ),
        };
        let metrics = match self.metrics {
            None => None,
            Some(m) => {
                let t = m.token_file.as_deref().map(|f| token_file("metrics.token_file", f));
                let t = t.transpose()?;
                if t.is_none() && !m.listen.ip().is_loopback() {
                    return Err(invalid(format!(
                        "metrics.listen {}: not a loopback address, so scrapers need a token \
                         (metrics.token_file)",
                        m.listen
                    )));
                }
                Some((m.listen, t))
            }
        };
        Ok(AgentConfig {
            agent: self.agent,
            netns: self.netns,
            pairs: self.pair,
            taps: self.tap,
            watch,
            loss,
            collector: e.collector,
            export_interval_ns: duration("export.interval", &e.interval, 1_000_000_000)?,
            summary_interval_ns: duration(
                "export.summary_interval",
                &e.summary_interval,
                1_000_000_000,
            )?,
            buffer,
            report_all: e.report_all.unwrap_or(false),
            token,
            tls,
            metrics,
            measure: self.measure.unwrap_or(true),
            quiet: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agent.toml");
        let c = FileConfig::load(&path).unwrap().validate().unwrap();
        assert_eq!(c.agent, "sw-b");
        assert_eq!(c.pairs.len(), 1);
        assert_eq!(c.pairs[0].mark, MarkSide::A);
        assert_eq!(c.watch.rules.len(), 1);
        assert_eq!(c.loss.batch, 100);
        assert_eq!(c.collector.as_deref(), Some("http://127.0.0.1:9900"));
    }

    /// deploy/agent.toml (a real host's taps) is valid once its CA and token files exist.
    #[test]
    fn the_deploy_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/agent.toml");
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertificateParams::new(vec!["ca".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("agent.token"), "0123456789abcdef0123456789abcdef\n")
            .unwrap();
        let text = std::fs::read_to_string(path)
            .unwrap()
            .replace("/etc/telemark", dir.path().to_str().unwrap());
        let c = FileConfig::parse(&text).unwrap().validate().unwrap();
        assert_eq!(c.taps.len(), 2);
        assert!(c.tls.is_some() && c.token.is_some());
        assert_eq!(c.metrics.map(|m| m.0.port()), Some(9901));
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let ok = "agent = \"sw\"\n[[pair]]\na = \"x0\"\nb = \"x1\"\n";
        assert!(FileConfig::parse(ok).unwrap().validate().is_ok());
        for (text, want) in [
            ("agent = \"sw\"\ncolour = 1\n[[pair]]\na = \"x0\"\nb = \"x1\"\n", "unknown field"),
            ("agent = \"sw\"\n[[pair]]\na = \"x0\"\nb = \"x1\"\nmarks = \"a\"\n", "unknown field"),
            (
                "agent = \"sw\"\n[[pair]]\na = \"x0\"\nb = \"x1\"\nmark = \"up\"\n",
                "unknown variant",
            ),
            ("agent = \"sw\"\n", "nothing to do"),
            ("agent = \"s w\"\n[[tap]]\nport = \"x0\"\n", "agent name"),
            ("agent = \"sw\"\n[[tap]]\nport = \"x0\"\n[[tap]]\nport = \"x0\"\n", "twice"),
            ("agent = \"sw\"\n[[tap]]\nport = \"x0\"\nupstream = \"b\"\n", "agent/point"),
            ("agent = \"sw\"\n[[tap]]\nport = \"x0\"\n[loss]\nbatch = 0\n", "[loss]"),
            ("agent = \"sw\"\n[[tap]]\nport = \"x0\"\n[loss]\nidle = \"soon\"\n", "loss.idle"),
            (
                "agent = \"sw\"\n[[tap]]\nport = \"x0\"\n[[watch]]\ndst = \"10.0.0.0/40\"\n",
                "prefix",
            ),
            ("agent = \"sw\"\n[[tap]]\nport = \"x0\"\n[[watch]]\n", "empty"),
            ("agent = \"sw\"\n[[tap]]\nport = \"x0\"\n[export]\ncollector = \"c:1\"\n", "http://"),
            ("agent = \"sw\"\n[[tap]]\nport = \"a-very-long-interface\"\n", "1-15"),
            ("agent = 3\n", "invalid type"),
        ] {
            let e = FileConfig::parse(text).and_then(FileConfig::validate).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
