//! The agent's configuration file (TOML). Every key is documented in `docs/agent.md` and in
//! `examples/agent.toml` (which a test loads); unknown keys are errors, so a typo never silently
//! falls back to a default.

use serde::{Deserialize, Serialize};
use std::path::Path;
use telemark_core::int::{DetectRule, DetectSection};
use telemark_core::loss::LossConfig;
use telemark_core::units::{parse_duration_ns, parse_rate_bps, parse_size_bytes};
use telemark_core::watch::{parse_proto, Rule, Watch};
use telemark_datapath::int_roles::{IntConfig, ReportMode, Role, RoleRule};
use telemark_wire::int::{Field, Instructions};
use telemark_wire::int_frame::Signal;

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

/// A watch rule as written in the file (and in the control API's `/api/v1/watch`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WatchSection {
    /// Source address or prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<String>,
    /// Destination address or prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    /// `tcp`, `udp`, `icmp` or a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    /// Source port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<u16>,
    /// Destination port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<u16>,
}

impl WatchSection {
    /// Rule `r` as written: prefixes, the protocol as its number.
    pub fn of(r: &Rule) -> WatchSection {
        WatchSection {
            src: r.src.map(|p| p.to_string()),
            dst: r.dst.map(|p| p.to_string()),
            proto: r.proto.map(|p| p.to_string()),
            sport: r.sport,
            dport: r.dport,
        }
    }
}

/// Watch rules as written, checked: an error names the rule (`#1` first) and what is wrong.
/// A rule with no field would match every flow, and is refused (no rule at all watches every
/// flow).
pub fn watch_rules(sections: &[WatchSection]) -> Result<Watch, String> {
    let mut watch = Watch::default();
    for (i, w) in sections.iter().enumerate() {
        let bad = |e: telemark_core::watch::WatchError| format!("[[watch]] #{}: {e}", i + 1);
        let rule = Rule {
            src: w.src.as_deref().map(str::parse).transpose().map_err(bad)?,
            dst: w.dst.as_deref().map(str::parse).transpose().map_err(bad)?,
            proto: w.proto.as_deref().map(parse_proto).transpose().map_err(bad)?,
            sport: w.sport,
            dport: w.dport,
        };
        if rule == Rule::default() {
            return Err(format!("[[watch]] #{} is empty: it would match everything", i + 1));
        }
        watch.rules.push(rule);
    }
    Ok(watch)
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
    /// Send the token to an `http://` collector on another host, in clear text (a network
    /// where anyone who can read the traffic may write as this agent); default false: such a
    /// configuration is refused, use `https://`.
    pub insecure_token: Option<bool>,
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
    /// Deprecated: `[control] token_file`, read here too (with a warning) for configs written
    /// before the control API had its own section.
    pub control_token_file: Option<std::path::PathBuf>,
}

/// `[control]`: the control API (`GET`/`PUT /api/v1/int`, docs/int.md "Control API"), served
/// on the `/metrics` listener, which must then be a loopback address.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlSection {
    /// A file holding the token a controller sends; without `[control]` the INT rules change
    /// only by SIGHUP.
    pub token_file: std::path::PathBuf,
}

/// An egress queue with a rate: a bottleneck inside the switch (docs/int.md, "Queues").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSection {
    /// The port whose outgoing frames it holds.
    pub port: String,
    /// Its drain rate, e.g. `20Mbit`.
    pub rate: String,
    /// Bytes it holds at most, e.g. `150KB` (default); more are dropped.
    pub limit: Option<String>,
}

/// A validated queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// Port name.
    pub port: String,
    /// Bits per second.
    pub rate_bps: u64,
    /// Bytes.
    pub limit_bytes: u64,
}

/// An INT role's name in a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleName {
    /// Insert INT.
    Source,
    /// Push metadata.
    Transit,
    /// Strip INT and detect.
    Sink,
}

/// One `[[int.rule]]`: which flows take which role here.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoleSection {
    /// Flows (a watch rule such as `dst=10.0.3.0/24,proto=udp`; `*` or absent: every flow).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub flows: String,
    /// `source`, `transit` or `sink`.
    pub role: RoleName,
    /// A source's instructions: INT field names (default: node_id, l1_ingress_if,
    /// hop_latency, queue_occupancy, egress_ts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instructions: Vec<String>,
    /// A source's RemainingHopCnt, itself included (default 8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_hops: Option<u8>,
}

/// The rules the controller may change at run time: the body of `PUT /api/v1/int` and the
/// rules of `[int]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IntRulesSection {
    /// Roles, first match decides.
    #[serde(default)]
    pub rule: Vec<RoleSection>,
    /// The sink's detectors, first match decides.
    #[serde(default)]
    pub detect: Vec<DetectSection>,
}

/// Rules validated, with the text they came from (to show them back).
#[derive(Debug, Clone, PartialEq)]
pub struct IntRules {
    /// As written.
    pub text: IntRulesSection,
    /// Roles.
    pub roles: Vec<RoleRule>,
    /// Detectors.
    pub detect: Vec<DetectRule>,
}

/// The most bytes a `[[queue]]` may hold (a large switch's whole buffer is ~12–64 MB).
const MAX_QUEUE_BYTES: u64 = 64_000_000;

const DEFAULT_INSTRUCTIONS: [Field; 5] =
    [Field::NodeId, Field::L1IngressIf, Field::HopLatency, Field::QueueOccupancy, Field::EgressTs];

impl IntRulesSection {
    /// Checks every rule.
    pub fn validate(self) -> Result<IntRules, ConfigError> {
        let mut roles = Vec::new();
        for (i, r) in self.rule.iter().enumerate() {
            let bad = |e: String| invalid(format!("[[int.rule]] #{}: {e}", i + 1));
            let flows = match r.flows.trim() {
                "" | "*" => None,
                f => Some(f.parse::<Rule>().map_err(|e| bad(e.0))?),
            };
            let role = match r.role {
                RoleName::Source => {
                    let mut fields = Vec::new();
                    for name in &r.instructions {
                        fields.push(Field::from_name(name).ok_or_else(|| {
                            let names: Vec<&str> = Field::ALL.iter().map(|f| f.name()).collect();
                            bad(format!(
                                "unknown instruction {name:?}; INT fields are {}",
                                names.join(", ")
                            ))
                        })?);
                    }
                    if fields.is_empty() {
                        fields.extend(DEFAULT_INSTRUCTIONS);
                    }
                    let max_hops = r.max_hops.unwrap_or(8);
                    if max_hops == 0 {
                        return Err(bad("max_hops: at least 1 (the source itself)".into()));
                    }
                    Role::Source { instructions: Instructions::of(&fields), max_hops }
                }
                RoleName::Transit | RoleName::Sink
                    if !r.instructions.is_empty() || r.max_hops.is_some() =>
                {
                    return Err(bad("instructions and max_hops are a source's".into()));
                }
                RoleName::Transit => Role::Transit,
                RoleName::Sink => Role::Sink,
            };
            roles.push(RoleRule { flows, role });
        }
        let mut detect = Vec::new();
        for (i, d) in self.detect.iter().enumerate() {
            detect.push(d.rule().map_err(|e| invalid(format!("[[int.detect]] #{}: {e}", i + 1)))?);
        }
        Ok(IntRules { text: self, roles, detect })
    }
}

/// `[int]`: this switch's INT settings and rules (docs/int.md, "Switch roles").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntSection {
    /// This switch's node ID in the metadata it adds and the reports it sends.
    pub node_id: u32,
    /// The DSCP value that signals INT (default 0x17, the specification's example).
    pub signal_dscp: Option<u8>,
    /// A UDP destination port that signals INT instead (INT v2.1 §5.7.2, NPT 1).
    pub signal_port: Option<u16>,
    /// Largest packet (from the IP header) INT may grow a packet to (default 1500).
    pub mtu: Option<usize>,
    /// Domain-specific ID a source writes (default 0).
    pub domain_id: Option<u16>,
    /// Where a sink sends Telemetry Reports (the INT collector's UDP address).
    pub report_to: Option<std::net::SocketAddr>,
    /// Which packets a sink reports: `events` (default: those whose detector fired), `all`
    /// or `off`.
    pub report: Option<String>,
    /// Flows the sink keeps detector state for (default 65536).
    pub flows: Option<usize>,
    /// Roles. (These two are [`IntRulesSection`]'s fields: serde cannot flatten a struct
    /// into one that refuses unknown keys.)
    #[serde(default)]
    pub rule: Vec<RoleSection>,
    /// Detectors.
    #[serde(default)]
    pub detect: Vec<DetectSection>,
}

/// Validated `[int]`.
#[derive(Debug, Clone)]
pub struct IntSettings {
    /// What the roles need.
    pub cfg: IntConfig,
    /// Where reports go.
    pub report_to: Option<std::net::SocketAddr>,
    /// Detector table size.
    pub flows: usize,
    /// The rules at start.
    pub rules: IntRules,
}

impl IntSettings {
    /// Whether `other` differs only in its rules (which change without a restart).
    pub fn same_but_rules(&self, other: &IntSettings) -> bool {
        let (a, b) = (&self.cfg, &other.cfg);
        (a.node_id, a.signal, a.mtu, a.domain_id, a.report)
            == (b.node_id, b.signal, b.mtu, b.domain_id, b.report)
            && self.report_to == other.report_to
            && self.flows == other.flows
    }
}

impl IntSection {
    fn validate(self) -> Result<IntSettings, ConfigError> {
        if self.node_id == 0 || self.node_id == u32::MAX {
            return Err(invalid("int.node_id: 1 to 4294967294 (0 and all-ones mean none)"));
        }
        let dscp = match (self.signal_dscp, self.signal_port) {
            (Some(d), _) if d > 0x3f => {
                return Err(invalid(format!("int.signal_dscp {d}: DSCP is 0 to 63")))
            }
            (Some(d), _) => Some(d),
            (None, Some(_)) => None,
            (None, None) => Some(0x17),
        };
        let mtu = self.mtu.unwrap_or(1500);
        if !(576..=9216).contains(&mtu) {
            return Err(invalid(format!("int.mtu {mtu}: 576 to 9216")));
        }
        let report = match self.report.as_deref() {
            None | Some("events") => ReportMode::Events,
            Some("all") => ReportMode::All,
            Some("off") => ReportMode::Off,
            Some(o) => return Err(invalid(format!("int.report {o:?}: events, all or off"))),
        };
        if report == ReportMode::All && self.report_to.is_none() {
            // Said and not done would be worse than refused: every report would go nowhere.
            return Err(invalid(
                "int.report = \"all\" sends a Telemetry Report for every INT packet, but there \
                 is no int.report_to address to send them to (add report_to = \"host:32766\", \
                 or drop report)",
            ));
        }
        let report = if self.report_to.is_none() { ReportMode::Off } else { report };
        let flows = self.flows.unwrap_or(65_536);
        if !(1..=1 << 20).contains(&flows) {
            return Err(invalid("int.flows: 1 to 1048576"));
        }
        let rules = IntRulesSection { rule: self.rule, detect: self.detect }.validate()?;
        Ok(IntSettings {
            cfg: IntConfig {
                node_id: self.node_id,
                // The loss monitor's color bit, if it runs, is set with [loss] below.
                signal: Signal { dscp, udp_port: self.signal_port, color_bit: None },
                mtu,
                domain_id: self.domain_id.unwrap_or(0),
                report,
            },
            report_to: self.report_to,
            flows,
            rules,
        })
    }
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
    /// Publish records to Kafka directly, instead of sending them to a collector
    /// (docs/kafka.md, "From an agent").
    pub kafka: Option<telemark_kafka::KafkaConfig>,
    /// The agent's `/metrics`; absent: no listener.
    pub metrics: Option<MetricsSection>,
    /// The control API; absent: none.
    pub control: Option<ControlSection>,
    /// INT roles; absent: INT passes untouched.
    pub int: Option<IntSection>,
    /// Egress queues with a rate.
    #[serde(default)]
    pub queue: Vec<QueueSection>,
    /// sFlow export (docs/flow-export.md).
    pub sflow: Option<SflowSection>,
    /// IPFIX export (docs/flow-export.md).
    pub ipfix: Option<IpfixSection>,
    /// Heavy hitters (docs/agent.md, "Heavy hitters").
    pub heavy_hitters: Option<HeavyHittersSection>,
    /// Interfaces the eBPF datapath attaches to (docs/ebpf.md): the host's own ports,
    /// measured where they are, instead of `[[pair]]`/`[[tap]]` through Telemark's switch.
    #[serde(default)]
    pub port: Vec<EbpfPortConfig>,
    /// The eBPF datapath's settings.
    pub ebpf: Option<EbpfSection>,
}

/// `[[port]]`: an interface (or every interface a pattern matches) the eBPF datapath's
/// programs are attached to, at its ingress and egress (docs/ebpf.md).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EbpfPortConfig {
    /// An interface name, or a pattern with `*` (`tap*`, `veth*`): interfaces that appear
    /// later are attached when they do.
    pub interface: String,
    /// Its network namespace (`ip netns` name, or a path such as `/proc/<pid>/ns/net`);
    /// absent: the agent's `netns`, or its own.
    pub netns: Option<String>,
    /// Traffic arriving here enters the measured domain: colour it (this is the marker).
    #[serde(default)]
    pub mark: bool,
    /// Traffic leaving here leaves the domain: give each flow its own DSCP bit back.
    #[serde(default)]
    pub unmark: bool,
    /// Another agent's point upstream of this port's ingress (`h1/out:eth0`), when it does
    /// not mark: names the link between the two in records.
    pub upstream: Option<String>,
}

impl EbpfPortConfig {
    /// What the port does: marks, unmarks, and against which upstream point it measures.
    pub fn role(&self) -> (bool, bool, Option<&str>) {
        (self.mark, self.unmark, self.upstream.as_deref())
    }
}

/// `[ebpf]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EbpfSection {
    /// Marking period (default: `[loss] period`, else 100ms).
    pub period: Option<String>,
    /// How long after a period ends its packets still count as in time (default: half the
    /// period; RFC 9341 §3.2 reads a colour's counters in the middle of the next period).
    pub guard: Option<String>,
    /// Room for (flow, point, colour) counters in the kernel (default 65536).
    pub flows: Option<u32>,
    /// How often interfaces are looked for (default 1s).
    pub rescan: Option<String>,
    /// What markers and exits do with a packet whose sender set the colour bit (default
    /// `keep`).
    pub own_colour: Option<OwnColourMode>,
}

/// `[ebpf] own_colour`: what the domain does with a packet that arrives at a marker with the
/// colour bit already set by its sender (docs/ebpf.md, "A sender's own colour bit").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnColourMode {
    /// Leave it as it is and do not measure it (its packets are named in the flow's records
    /// as `own_colour`); every endpoint sees the DSCP its peer sent.
    #[default]
    Keep,
    /// The domain reserves the bit (RFC 9341 §3.1's marking field): colour every packet; the
    /// flow's own bit is given back by an exit on its marker's host, cleared by any other.
    Overwrite,
}

/// Validated eBPF datapath settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbpfSettings {
    pub ports: Vec<EbpfPortConfig>,
    pub period_ns: u64,
    pub guard_ns: u64,
    pub flows: u32,
    pub rescan_ns: u64,
    /// The points at the ends of segments that cross to other agents (ingress points that do
    /// not mark, egress points that do not unmark) report every batch, lossy or not, so that
    /// the collector can line them up: `[export] report_all` unset or true.
    pub report_crossings: bool,
    pub own_colour: OwnColourMode,
}

impl EbpfSettings {
    /// Whether `other` differs in its `[[port]]`s alone (what a reload may change).
    pub fn same_but_ports(&self, other: &EbpfSettings) -> bool {
        EbpfSettings { ports: Vec::new(), ..self.clone() }
            == EbpfSettings { ports: Vec::new(), ..other.clone() }
    }
}

/// `[heavy_hitters]`: SFCMon's pipeline on each input port; each window's heavy flows become
/// `flow` records.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeavyHittersSection {
    /// Window length (default 1s).
    pub window: Option<String>,
    /// Heavy = at least this share of the port's packets in the window (default 0.001).
    pub threshold: Option<f64>,
    /// Packets of a window before any is tested (default 1000).
    pub eval_after: Option<u64>,
    /// A source must send this many packets in the window before it can be heavy (default 16).
    pub min_packets: Option<u64>,
}

/// Validated `[heavy_hitters]`.
#[derive(Debug, Clone, PartialEq)]
pub struct HeavyHittersSettings {
    /// Window length, ns.
    pub window_ns: u64,
    /// The pipeline's settings.
    pub hh: telemark_core::sketch::sfcmon::HhConfig,
}

impl HeavyHittersSection {
    /// Checks every value and fills in defaults.
    pub fn validate(self) -> Result<HeavyHittersSettings, ConfigError> {
        let d = telemark_core::sketch::sfcmon::HhConfig::default();
        let hh = telemark_core::sketch::sfcmon::HhConfig {
            threshold: self.threshold.unwrap_or(d.threshold),
            eval_after: self.eval_after.unwrap_or(d.eval_after),
            min_packets: self.min_packets.unwrap_or(d.min_packets),
            ..d
        };
        hh.validate().map_err(|e| invalid(format!("[heavy_hitters]: {e}")))?;
        Ok(HeavyHittersSettings {
            window_ns: duration("heavy_hitters.window", &self.window, 1_000_000_000)?,
            hh,
        })
    }
}

/// `[sflow]`: sample the switch's packets, poll its ports' counters, send both as sFlow v5.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SflowSection {
    /// Collectors, `host:port` (UDP).
    pub collectors: Vec<String>,
    /// One packet in this many is sampled per port (default 400, Open vSwitch's default).
    pub sampling: Option<u32>,
    /// Header bytes sent of each sampled packet (default 128, at most 256).
    pub header_bytes: Option<usize>,
    /// Counter polling interval per port (default 30s).
    pub polling: Option<String>,
    /// The agent address in datagrams (default: the address the agent reaches the first
    /// collector from).
    pub agent_address: Option<std::net::IpAddr>,
}

/// `[ipfix]`: meter the switch's flows in a cache and export them as IPFIX.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpfixSection {
    /// Collectors: `host:port` or `udp://host:port` (UDP), `tcp://host:port` (TCP).
    pub collectors: Vec<String>,
    /// One packet in this many is metered per port (default 1: every packet).
    pub sampling: Option<u32>,
    /// Observation domain id (default 1).
    pub domain: Option<u32>,
    /// A flow is reported at least this often while it lasts (default 60s).
    pub active_timeout: Option<String>,
    /// A flow silent this long is reported and forgotten (default 15s).
    pub idle_timeout: Option<String>,
    /// The most flows the cache holds (default 65536; 0: no cache, every metered packet is
    /// exported as a flow of its own).
    pub max_flows: Option<usize>,
    /// Templates are sent again this often over UDP (default 60s; RFC 7011 §8.4).
    pub template_refresh: Option<String>,
    /// Loss records go out too, as Telemark's enterprise elements (default true).
    pub loss: Option<bool>,
}

/// How an IPFIX collector is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpfixTransport {
    /// Datagrams (templates resent every `template_refresh`).
    Udp,
    /// A stream (templates once per connection; reconnected when it breaks).
    Tcp,
}

/// Validated `[sflow]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SflowExport {
    /// Where datagrams go.
    pub collectors: Vec<std::net::SocketAddr>,
    /// Sampling.
    pub settings: telemark_datapath::flow_meter::SflowSettings,
    /// Counter polling interval, ns.
    pub polling_ns: u64,
    /// Agent address, when given.
    pub agent_address: Option<std::net::IpAddr>,
}

/// Validated `[ipfix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpfixExport {
    /// Where messages go, and how.
    pub collectors: Vec<(IpfixTransport, std::net::SocketAddr)>,
    /// Metering.
    pub settings: telemark_datapath::flow_meter::IpfixSettings,
    /// Observation domain.
    pub domain: u32,
    /// UDP template refresh, ns.
    pub template_refresh_ns: u64,
    /// Loss records too.
    pub loss: bool,
}

/// A collector address: `host:port`, resolved now (the first address it resolves to).
fn collector_addr(what: &str, s: &str) -> Result<std::net::SocketAddr, ConfigError> {
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .map_err(|e| invalid(format!("{what} {s:?}: {e} (write host:port)")))?
        .next()
        .ok_or_else(|| invalid(format!("{what} {s:?}: resolves to no address")))
}

fn sampling(what: &str, v: Option<u32>, default: u32) -> Result<u32, ConfigError> {
    match v.unwrap_or(default) {
        0 => Err(invalid(format!("{what}: 1 or more (one packet in N)"))),
        n => Ok(n),
    }
}

impl SflowSection {
    /// Checks every value and fills in defaults.
    pub fn validate(self) -> Result<SflowExport, ConfigError> {
        if self.collectors.is_empty() {
            return Err(invalid("[sflow] collectors: give at least one host:port"));
        }
        let collectors = self
            .collectors
            .iter()
            .map(|c| collector_addr("[sflow] collector", c))
            .collect::<Result<_, _>>()?;
        let header_bytes = self.header_bytes.unwrap_or(128);
        if !(14..=telemark_datapath::flow_meter::MAX_HEADER).contains(&header_bytes) {
            return Err(invalid(format!("sflow.header_bytes {header_bytes}: 14 to 256")));
        }
        Ok(SflowExport {
            collectors,
            settings: telemark_datapath::flow_meter::SflowSettings {
                rate: sampling("sflow.sampling", self.sampling, 400)?,
                header_bytes,
            },
            polling_ns: duration("sflow.polling", &self.polling, 30_000_000_000)?,
            agent_address: self.agent_address,
        })
    }
}

impl IpfixSection {
    /// Checks every value and fills in defaults.
    pub fn validate(self) -> Result<IpfixExport, ConfigError> {
        if self.collectors.is_empty() {
            return Err(invalid("[ipfix] collectors: give at least one host:port"));
        }
        let mut collectors = Vec::new();
        for c in &self.collectors {
            let (t, rest) = match c.split_once("://") {
                None => (IpfixTransport::Udp, c.as_str()),
                Some(("udp", r)) => (IpfixTransport::Udp, r),
                Some(("tcp", r)) => (IpfixTransport::Tcp, r),
                Some((other, _)) => {
                    return Err(invalid(format!(
                        "[ipfix] collector {c:?}: transport {other:?} is not udp or tcp"
                    )))
                }
            };
            collectors.push((t, collector_addr("[ipfix] collector", rest)?));
        }
        let max_flows = self.max_flows.unwrap_or(65_536);
        if max_flows != 0 && !(16..=1 << 24).contains(&max_flows) {
            return Err(invalid(format!(
                "ipfix.max_flows {max_flows}: 16 to 16777216, or 0 for no cache"
            )));
        }
        let cache = telemark_core::flowexport::CacheConfig {
            max_flows,
            active_ns: duration("ipfix.active_timeout", &self.active_timeout, 60_000_000_000)?,
            idle_ns: duration("ipfix.idle_timeout", &self.idle_timeout, 15_000_000_000)?,
        };
        Ok(IpfixExport {
            collectors,
            settings: telemark_datapath::flow_meter::IpfixSettings {
                rate: sampling("ipfix.sampling", self.sampling, 1)?,
                cache,
            },
            domain: self.domain.unwrap_or(1),
            template_refresh_ns: duration(
                "ipfix.template_refresh",
                &self.template_refresh,
                60_000_000_000,
            )?,
            loss: self.loss.unwrap_or(true),
        })
    }
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
    /// Kafka, when records go there instead.
    pub kafka: Option<telemark_kafka::KafkaConfig>,
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
    /// The token a controller sends to change INT rules on that listener.
    pub control_token: Option<String>,
    /// INT.
    pub int: Option<IntSettings>,
    /// Egress queues.
    pub queues: Vec<QueueConfig>,
    /// Measure; false: forward only.
    pub measure: bool,
    /// Discard records instead of printing them when there is no collector (benchmarks).
    pub quiet: bool,
    /// sFlow export.
    pub sflow: Option<SflowExport>,
    /// IPFIX export.
    pub ipfix: Option<IpfixExport>,
    /// Heavy hitters.
    pub heavy_hitters: Option<HeavyHittersSettings>,
    /// The eBPF datapath, when `[[port]]`s are given (instead of pairs and taps).
    pub ebpf: Option<EbpfSettings>,
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

pub use telemark_core::records::valid_agent_name;

impl AgentConfig {
    /// Every port, in the order the agent numbers them: each pair's a then b (a pair's ports
    /// are 2i and 2i+1), then the taps.
    pub fn port_names(&self) -> Vec<&String> {
        self.pairs
            .iter()
            .flat_map(|p| [&p.a, &p.b])
            .chain(self.taps.iter().map(|t| &t.port))
            .collect()
    }
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
        if self.pair.is_empty() && self.tap.is_empty() && self.port.is_empty() {
            return Err(invalid(
                "nothing to do: give at least one [[pair]] or [[tap]] (Telemark's switch) or \
                 [[port]] (eBPF at the host's interfaces)",
            ));
        }
        let switch_ports = !self.pair.is_empty() || !self.tap.is_empty();
        if !self.port.is_empty() && switch_ports {
            return Err(invalid(
                "[[port]] (eBPF) and [[pair]]/[[tap]] (AF_PACKET) are two datapaths; an agent \
                 runs one: run two agents",
            ));
        }
        if self.port.is_empty() && self.ebpf.is_some() {
            return Err(invalid("[ebpf] without [[port]]: name the interfaces to attach to"));
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
        let watch = watch_rules(&self.watch).map_err(invalid)?;
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
        let report_all = e.report_all;
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
        // As the control API (below): a token crosses the network only inside TLS, unless the
        // operator says otherwise in so many words.
        if let Some(c) = e.collector.as_deref().filter(|_| token.is_some()) {
            telemark_transport::http::token_in_clear(
                c,
                "export.collector",
                "the agent's token (export.token_file)",
                "export.ca_file",
                "export.insecure_token",
                e.insecure_token == Some(true),
            )
            .map_err(invalid)?;
        }
        let tls = match &e.ca_file {
            None => None,
            Some(f) => Some(
                telemark_transport::tls::client_config(f)
                    .map_err(|err| invalid(format!("export.ca_file: {err}")))?,
            ),
        };
        let old = self.metrics.as_ref().and_then(|m| m.control_token_file.as_deref());
        let control_file = match (self.control.as_ref().map(|c| c.token_file.as_path()), old) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "metrics.control_token_file and [control] token_file: set only [control] \
                     token_file (the old key is deprecated)",
                ))
            }
            (Some(f), None) => Some(("control.token_file", f)),
            (None, Some(f)) => {
                tracing::warn!(
                    "metrics.control_token_file is deprecated: write [control] token_file \
                     (read as before for now)"
                );
                Some(("metrics.control_token_file", f))
            }
            (None, None) => None,
        };
        let control_token = control_file.map(|(key, f)| token_file(key, f)).transpose()?;
        if let (Some((key, _)), None) = (control_file, &self.metrics) {
            return Err(invalid(format!(
                "{key}: the control API is served on the metrics listener; add [metrics] listen"
            )));
        }
        // The listener has no TLS: a token that changes the switch stays on this host.
        if let Some(m) = self.metrics.as_ref().filter(|_| control_token.is_some()) {
            if !m.listen.ip().is_loopback() {
                return Err(invalid(format!(
                    "metrics.listen {}: the control API ([control]) is served on loopback \
                     only; its token would cross the network in clear text",
                    m.listen
                )));
            }
        }
        let mut queues = Vec::new();
        for (i, q) in self.queue.iter().enumerate() {
            let bad = |e: String| invalid(format!("[[queue]] #{}: {e}", i + 1));
            if !self.pair.iter().any(|p| p.a == q.port || p.b == q.port) {
                return Err(bad(format!("port {:?} is not one of the pairs' ports", q.port)));
            }
            if queues.iter().any(|x: &QueueConfig| x.port == q.port) {
                return Err(bad(format!("port {:?} has a queue already", q.port)));
            }
            let rate_bps = parse_rate_bps(&q.rate).map_err(bad)?;
            let limit = q.limit.as_deref().unwrap_or("150KB");
            let limit_bytes = parse_size_bytes(limit)
                .ok()
                .filter(|v| (1_500..=MAX_QUEUE_BYTES).contains(v))
                .ok_or_else(|| bad(format!("limit {limit:?}: a size from 1500B to 64MB")))?;
            queues.push(QueueConfig { port: q.port.clone(), rate_bps, limit_bytes });
        }
        let mut int = self.int.map(IntSection::validate).transpose()?;
        if let Some(i) = int.as_mut().filter(|_| self.measure.unwrap_or(true)) {
            // Alternate marking owns its color bit; INT signalled by DSCP owns the other five,
            // so the loss monitor and INT can watch one flow (docs/int.md).
            let signal = &mut i.cfg.signal;
            signal.color_bit = Some(loss.color_bit);
            if let Some(d) = signal.dscp.filter(|d| d & !(1 << loss.color_bit) == 0) {
                return Err(invalid(format!(
                    "int.signal_dscp {d:#04x}: the loss monitor's color is DSCP bit {}, so INT \
                     is told by the other five bits, and here they are all 0: every best-effort \
                     packet would read as INT (choose a value with another bit set)",
                    loss.color_bit
                )));
            }
        }
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
        if let Some(k) = &self.kafka {
            k.validate().map_err(|e| invalid(format!("[kafka]: {e}")))?;
        }
        let kafka = match (self.kafka, &e.collector) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "[kafka] and export.collector: records go to one of them; keep one",
                ))
            }
            (k, _) => k,
        };
        let ebpf = if self.port.is_empty() {
            None
        } else {
            let section = self.ebpf.unwrap_or_default();
            let mut e = section.validate(self.port, &self.netns, loss.period_ns)?;
            // Cross-host segments need both their ends' every batch: the default in host mode;
            // `report_all = false` keeps to lossy batches (and so to segments inside hosts).
            e.report_crossings = report_all != Some(false);
            Some(e)
        };
        let ipfix = self.ipfix.map(IpfixSection::validate).transpose()?;
        if let (Some(e), Some(x)) = (&ebpf, &ipfix) {
            if x.settings.cache.idle_ns <= e.period_ns + e.guard_ns {
                return Err(invalid(
                    "ipfix.idle_timeout: the eBPF datapath adds a flow's counts once a period \
                     and its guard have passed; give an idle timeout longer than that",
                ));
            }
            if x.settings.rate != 1 {
                return Err(invalid(
                    "ipfix.sampling: the eBPF datapath counts every packet of every flow; \
                     leave sampling at 1",
                ));
            }
        }
        Ok(AgentConfig {
            agent: self.agent,
            netns: self.netns,
            pairs: self.pair,
            taps: self.tap,
            watch,
            loss,
            collector: e.collector,
            kafka,
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
            control_token,
            int,
            queues,
            measure: self.measure.unwrap_or(true),
            quiet: false,
            sflow: self.sflow.map(SflowSection::validate).transpose()?,
            ipfix,
            heavy_hitters: self.heavy_hitters.map(HeavyHittersSection::validate).transpose()?,
            ebpf,
        })
    }
}

impl EbpfSection {
    fn validate(
        self,
        mut ports: Vec<EbpfPortConfig>,
        netns: &Option<String>,
        loss_period: Option<u64>,
    ) -> Result<EbpfSettings, ConfigError> {
        for p in &mut ports {
            let bad = |why: &str| invalid(format!("[[port]] interface {:?}: {why}", p.interface));
            let name = p.interface.replace('*', "");
            if p.interface.is_empty() || p.interface.len() > 15 || name.contains(['/', ' ']) {
                return Err(bad("interface names (and patterns) are 1-15 bytes, no '/' or space"));
            }
            if let Some(u) = &p.upstream {
                if !u
                    .split_once('/')
                    .is_some_and(|(a, q)| valid_agent_name(a) && valid_agent_name(q))
                {
                    return Err(bad("upstream is agent/point, e.g. \"h1/out:eth0\""));
                }
                if p.mark {
                    return Err(bad("a marking port is where the domain starts: no upstream"));
                }
            }
            if p.netns.is_none() {
                p.netns.clone_from(netns);
            }
        }
        let period_ns = duration("ebpf.period", &self.period, loss_period.unwrap_or(100_000_000))?;
        if period_ns < 1_000_000 {
            return Err(invalid("ebpf.period: at least 1ms"));
        }
        let guard_ns = duration("ebpf.guard", &self.guard, period_ns / 2)?;
        if guard_ns == 0 || guard_ns >= period_ns {
            return Err(invalid("ebpf.guard: more than 0 and less than the period"));
        }
        let flows = self.flows.unwrap_or(65_536);
        if !(16..=16_777_216).contains(&flows) {
            return Err(invalid("ebpf.flows: 16 to 16777216"));
        }
        let rescan_ns = duration("ebpf.rescan", &self.rescan, 1_000_000_000)?;
        Ok(EbpfSettings {
            ports,
            period_ns,
            guard_ns,
            flows,
            rescan_ns,
            report_crossings: true,
            own_colour: self.own_colour.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ebpf_deploy_config_loads_and_bad_ports_say_what_is_wrong() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/agent-ebpf.toml");
        let c = FileConfig::load(&path).unwrap().validate().unwrap();
        let e = c.ebpf.expect("eBPF datapath");
        assert_eq!((e.period_ns, e.guard_ns, e.flows), (100_000_000, 50_000_000, 65_536));
        assert_eq!(e.ports.len(), 2);
        assert!(e.ports[0].mark && e.ports[0].unmark && !e.ports[1].mark);
        assert_eq!(e.own_colour, OwnColourMode::Keep);
        let base = "agent = \"h1\"\n";
        let own = |v: &str| {
            FileConfig::parse(&format!("{base}[ebpf]\n{v}[[port]]\ninterface = \"x\"\n"))
                .and_then(FileConfig::validate)
                .map(|c| c.ebpf.map(|e| e.own_colour))
        };
        assert_eq!(own("").unwrap(), Some(OwnColourMode::Keep), "the default");
        assert_eq!(own("own_colour = \"overwrite\"\n").unwrap(), Some(OwnColourMode::Overwrite));
        let err = own("own_colour = \"clear\"\n").unwrap_err().to_string();
        assert!(err.contains("keep") && err.contains("overwrite"), "{err}");
        for (extra, want) in [
            ("[[port]]\ninterface = \"\"\n", "1-15 bytes"),
            ("[[port]]\ninterface = \"a/b\"\n", "no '/'"),
            ("[[port]]\ninterface = \"x\"\nupstream = \"nope\"\n", "agent/point"),
            ("[[port]]\ninterface = \"x\"\nmark = true\nupstream = \"a/b\"\n", "no upstream"),
            ("[ebpf]\nguard = \"2s\"\n[[port]]\ninterface = \"x\"\n", "ebpf.guard"),
            ("[ebpf]\nflows = 1\n[[port]]\ninterface = \"x\"\n", "ebpf.flows"),
            ("[ebpf]\nperiod = \"10us\"\n[[port]]\ninterface = \"x\"\n", "at least 1ms"),
            ("[ebpf]\n", "[[port]] (eBPF"),
            ("[[tap]]\nport = \"t0\"\n[ebpf]\n", "[ebpf] without [[port]]"),
            ("[[tap]]\nport = \"t0\"\n[[port]]\ninterface = \"x\"\n", "two datapaths"),
            ("[[port]]\ninterface = \"x\"\nmarks = true\n", "unknown field"),
            (
                "[[port]]\ninterface = \"x\"\n[ipfix]\ncollectors = [\"127.0.0.1:4739\"]\nsampling = 10\n",
                "leave sampling at 1",
            ),
        ] {
            let err = FileConfig::parse(&format!("{base}{extra}"))
                .and_then(FileConfig::validate)
                .expect_err(extra)
                .to_string();
            assert!(err.contains(want), "{extra}: {err}");
        }
    }

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

    /// deploy/agent-kafka.toml (a fleet's agent, publishing to Kafka) is valid as it is.
    #[test]
    fn the_fleet_deploy_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/agent-kafka.toml");
        let c = FileConfig::load(&path).unwrap().validate().unwrap();
        let k = c.kafka.expect("[kafka]");
        assert_eq!(k.brokers.split(',').count(), 3);
        assert_eq!(k.topic_prefix, "telemark.");
        assert!(c.collector.is_none());
        assert_eq!(c.ebpf.expect("eBPF datapath").ports.len(), 2);
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

    /// examples/agent-int-sink.toml (an INT sink) is valid once its token file exists.
    #[test]
    fn the_int_sink_example_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agent-int-sink.toml");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("control.token"), "0123456789abcdef0123456789abcdef\n")
            .unwrap();
        let text = std::fs::read_to_string(path)
            .unwrap()
            .replace("/etc/telemark", dir.path().to_str().unwrap());
        let c = FileConfig::parse(&text).unwrap().validate().unwrap();
        let int = c.int.unwrap();
        assert_eq!(int.cfg.node_id, 3);
        assert_eq!(int.cfg.report, ReportMode::Events);
        assert_eq!(int.rules.roles.len(), 1);
        assert_eq!(int.rules.roles[0].role, Role::Sink);
        assert_eq!(int.rules.detect.len(), 2);
        assert!(c.control_token.is_some());
    }

    /// The control API's token is read from `[control]`, and from the deprecated `[metrics]
    /// control_token_file` as before; both at once, or either without `[metrics]`, is refused.
    #[test]
    fn the_control_token_has_its_own_section_and_the_old_key_still_works() {
        let dir = tempfile::tempdir().unwrap();
        let tok = dir.path().join("control.token");
        std::fs::write(&tok, "0123456789abcdef0123456789abcdef\n").unwrap();
        let base = "agent = \"sw\"\n[[pair]]\na = \"x0\"\nb = \"x1\"\n[int]\nnode_id = 1\n";
        let metrics = "[metrics]\nlisten = \"127.0.0.1:9901\"\n";
        let old = format!("{metrics}control_token_file = {:?}\n", tok.to_str().unwrap());
        let new = format!("[control]\ntoken_file = {:?}\n", tok.to_str().unwrap());
        let load = |extra: &str| {
            FileConfig::parse(&format!("{base}{extra}")).and_then(FileConfig::validate)
        };
        let token = |c: AgentConfig| c.control_token;
        let want = Some("0123456789abcdef0123456789abcdef".to_string());
        assert_eq!(load(&format!("{metrics}{new}")).map(token).unwrap(), want);
        assert_eq!(load(&old).map(token).unwrap(), want);
        assert_eq!(load(metrics).map(token).unwrap(), None);
        let both = load(&format!("{old}{new}")).unwrap_err().to_string();
        assert!(both.contains("set only [control] token_file"), "{both}");
        let alone = load(&new).unwrap_err().to_string();
        assert!(alone.contains("add [metrics] listen"), "{alone}");
    }

    /// With the loss monitor on, INT by DSCP leaves its color bit out; without, all six bits
    /// signal. (`measure` comes before the sections in the file.)
    #[test]
    fn int_by_dscp_leaves_the_loss_monitors_color_bit_out() {
        let base = "agent = \"sw\"\n[[pair]]\na = \"x0\"\nb = \"x1\"\n";
        let signal = |lead: &str, tail: &str| {
            let text = format!("{lead}{base}{tail}[int]\nnode_id = 1\n");
            FileConfig::parse(&text).unwrap().validate().unwrap().int.unwrap().cfg.signal
        };
        assert_eq!(signal("", "").color_bit, Some(0));
        assert_eq!(signal("", "[loss]\ncolor_bit = 2\n").color_bit, Some(2));
        assert_eq!(signal("measure = false\n", "").color_bit, None);
        assert!(signal("", "").by_dscp(0x16) && !signal("measure = false\n", "").by_dscp(0x16));
    }

    #[test]
    fn bad_int_configs_say_what_is_wrong() {
        let base = "agent = \"sw\"\n[[pair]]\na = \"x0\"\nb = \"x1\"\n";
        for (extra, want) in [
            ("[int]\n", "missing field `node_id`"),
            ("[int]\nnode_id = 0\n", "int.node_id"),
            ("[int]\nnode_id = 1\nsignal_dscp = 64\n", "DSCP is 0 to 63"),
            // The color in bit 0 (the default) leaves INT bits 1-5, all 0 in DSCP 1.
            ("[int]\nnode_id = 1\nsignal_dscp = 1\n", "every best-effort packet"),
            ("[loss]\ncolor_bit = 3\n[int]\nnode_id = 1\nsignal_dscp = 8\n", "DSCP bit 3"),
            ("[int]\nnode_id = 1\nmtu = 100\n", "int.mtu"),
            ("[int]\nnode_id = 1\nreport = \"some\"\n", "events, all or off"),
            ("[int]\nnode_id = 1\nreport = \"all\"\n", "no int.report_to"),
            ("[int]\nnode_id = 1\n[[int.rule]]\nrole = \"relay\"\n", "unknown variant"),
            (
                "[int]\nnode_id = 1\n[[int.rule]]\nrole = \"source\"\ninstructions = [\"colour\"]\n",
                "unknown instruction",
            ),
            ("[int]\nnode_id = 1\n[[int.rule]]\nrole = \"sink\"\nmax_hops = 3\n", "a source's"),
            ("[int]\nnode_id = 1\n[[int.rule]]\nrole = \"source\"\nmax_hops = 0\n", "max_hops"),
            ("[int]\nnode_id = 1\n[[int.rule]]\nflows = \"dst=1.2.3\"\nrole = \"sink\"\n", "#1"),
            (
                "[int]\nnode_id = 1\n[[int.detect]]\ndetector = \"per_hop\"\n",
                "[[int.detect]] #1",
            ),
            ("[[queue]]\nport = \"x9\"\nrate = \"1Mbit\"\n", "not one of the pairs' ports"),
            ("[[queue]]\nport = \"x0\"\nrate = \"fast\"\n", "not a rate"),
            ("[[queue]]\nport = \"x0\"\nrate = \"1Mbit\"\nlimit = \"10B\"\n", "limit"),
            ("[[queue]]\nport = \"x0\"\nrate = \"1Mbit\"\nlimit = \"10ms\"\n", "a size from"),
            ("[metrics]\nlisten = \"127.0.0.1:1\"\ncontrol_token_file = \"/nonexistent\"\n", "control_token_file"),
        ] {
            let text = format!("{base}{extra}");
            let e = FileConfig::parse(&text).and_then(FileConfig::validate).unwrap_err().to_string();
            assert!(e.contains(want), "{extra:?}: {e}");
        }
    }

    /// The agent's token never crosses the network in clear text unless the operator says so
    /// (as the control API's token, which stays on loopback).
    #[test]
    fn a_token_goes_to_another_host_only_over_https() {
        let dir = tempfile::tempdir().unwrap();
        let tok = dir.path().join("agent.token");
        std::fs::write(&tok, "0123456789abcdef0123456789abcdef\n").unwrap();
        let with = |url: &str, extra: &str| {
            let text = format!(
                "agent = \"sw\"\n[[tap]]\nport = \"x0\"\n[export]\ncollector = \"{url}\"\n\
                 token_file = {:?}\n{extra}",
                tok.display()
            );
            FileConfig::parse(&text).and_then(FileConfig::validate).map(|c| c.token.is_some())
        };
        for url in
            ["http://192.0.2.10:9900", "http://collector.lan:9900/", "http://[2001:db8::1]:1"]
        {
            let e = with(url, "").unwrap_err().to_string();
            assert!(e.contains("clear text") && e.contains("insecure_token"), "{url}: {e}");
            assert!(with(url, "insecure_token = true\n").unwrap(), "{url} with the opt-in");
            assert!(with(url, "insecure_token = false\n").is_err(), "{url}");
        }
        for url in [
            "http://127.0.0.1:9900",
            "http://localhost:9900",
            "http://[::1]:9900",
            "https://192.0.2.10:9900",
        ] {
            assert!(with(url, "").unwrap(), "{url}");
        }
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

    #[test]
    fn heavy_hitters_section_loads_and_bad_values_say_what_is_wrong() {
        let base = "agent = \"sw\"\n[[tap]]\nport = \"x0\"\n";
        let c = FileConfig::parse(&format!("{base}[heavy_hitters]\nthreshold = 0.01\n"))
            .unwrap()
            .validate()
            .unwrap();
        let h = c.heavy_hitters.unwrap();
        assert_eq!((h.window_ns, h.hh.threshold, h.hh.eval_after), (1_000_000_000, 0.01, 1000));
        for (section, want) in [
            ("[heavy_hitters]\nthreshold = 1.5\n", "threshold"),
            ("[heavy_hitters]\nwindow = \"0s\"\n", "heavy_hitters.window"),
            ("[heavy_hitters]\nwindow = \"soon\"\n", "heavy_hitters.window"),
            ("[heavy_hitters]\nwidth = 3\n", "unknown field"),
        ] {
            let text = format!("{base}{section}");
            let e =
                FileConfig::parse(&text).and_then(FileConfig::validate).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn flow_export_sections_load_and_bad_ones_say_what_is_wrong() {
        let base = "agent = \"sw\"\n[[tap]]\nport = \"x0\"\n";
        let c = FileConfig::parse(&format!(
            "{base}[sflow]\ncollectors = [\"127.0.0.1:6343\"]\n\
             [ipfix]\ncollectors = [\"127.0.0.1:4739\", \"tcp://[::1]:4739\"]\nsampling = 64\n"
        ))
        .unwrap()
        .validate()
        .unwrap();
        let (s, i) = (c.sflow.unwrap(), c.ipfix.unwrap());
        assert_eq!(
            (s.settings.rate, s.settings.header_bytes, s.polling_ns),
            (400, 128, 30_000_000_000)
        );
        assert_eq!(i.collectors[1].0, IpfixTransport::Tcp);
        assert_eq!(
            (i.settings.rate, i.settings.cache.max_flows, i.domain, i.loss),
            (64, 65_536, 1, true)
        );
        for (section, want) in [
            ("[sflow]\ncollectors = []\n", "at least one"),
            ("[sflow]\ncollectors = [\"nowhere\"]\n", "host:port"),
            ("[sflow]\ncollectors = [\"127.0.0.1:6343\"]\nsampling = 0\n", "sflow.sampling"),
            ("[sflow]\ncollectors = [\"127.0.0.1:6343\"]\nheader_bytes = 300\n", "header_bytes"),
            ("[ipfix]\ncollectors = [\"sctp://127.0.0.1:4739\"]\n", "udp or tcp"),
            ("[ipfix]\ncollectors = [\"127.0.0.1:4739\"]\nmax_flows = 8\n", "max_flows"),
            ("[ipfix]\ncollectors = [\"127.0.0.1:4739\"]\nidle_timeout = \"0s\"\n", "idle_timeout"),
            ("[ipfix]\ncollectors = [\"127.0.0.1:4739\"]\ncache = 1\n", "unknown field"),
        ] {
            let text = format!("{base}{section}");
            let e =
                FileConfig::parse(&text).and_then(FileConfig::validate).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
