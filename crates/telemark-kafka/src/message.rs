//! How a record travels on Kafka (docs/kafka.md, "Topics, keys and headers").
//!
//! - **Topic:** one per record kind and schema version, `{prefix}{kind}.v{version}`:
//!   `telemark.loss.v1`, `telemark.event.v1`, … A consumer reads the kinds it wants.
//! - **Key:** the flow for records about one flow (loss, flow_loss, flow, event), so one flow's
//!   records go to one partition, in order; the agent for the others (summary, cost, health,
//!   capture).
//! - **Value:** the record's JSON, as the collector's API returns it (DESIGN.md's schema, the
//!   `kind` field included).
//! - **Headers:** `telemark-schema` (the version), `telemark-kind`, and the record's origin
//!   `telemark-agent`, `telemark-boot`, `telemark-seq`: the key that makes storing a record
//!   twice impossible (a consumer that sees one again drops it).

use telemark_core::records::{Flow, Record};

/// The schema version in topic names and headers. It changes when a record's JSON changes in
/// a way an existing consumer would misread.
pub const SCHEMA_VERSION: u32 = 1;

/// Header names.
pub mod header {
    /// The schema version.
    pub const SCHEMA: &str = "telemark-schema";
    /// The record kind.
    pub const KIND: &str = "telemark-kind";
    /// The agent whose run numbered the record.
    pub const AGENT: &str = "telemark-agent";
    /// That run.
    pub const BOOT: &str = "telemark-boot";
    /// The record's number in that run.
    pub const SEQ: &str = "telemark-seq";
}

/// A record kind: the part of the topic name that tells kinds apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Loss batches.
    Loss,
    /// Interval summaries per measurement point.
    Summary,
    /// Per-flow loss totals of a run.
    FlowLoss,
    /// Per-flow packets and bytes (heavy hitters).
    Flow,
    /// Fast-path cost.
    Cost,
    /// What a replay read of a capture.
    Capture,
    /// An agent's health.
    Health,
    /// INT events.
    Event,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 8] = [
        Kind::Loss,
        Kind::Summary,
        Kind::FlowLoss,
        Kind::Flow,
        Kind::Cost,
        Kind::Capture,
        Kind::Health,
        Kind::Event,
    ];

    /// The kind of `r`.
    pub fn of(r: &Record) -> Kind {
        match r {
            Record::Loss(_) => Kind::Loss,
            Record::Summary(_) => Kind::Summary,
            Record::FlowLoss(_) => Kind::FlowLoss,
            Record::Flow(_) => Kind::Flow,
            Record::Cost(_) => Kind::Cost,
            Record::Capture(_) => Kind::Capture,
            Record::Health(_) => Kind::Health,
            Record::Event(_) => Kind::Event,
        }
    }

    /// Its name, as the record's `kind` field spells it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Loss => "loss",
            Kind::Summary => "summary",
            Kind::FlowLoss => "flow_loss",
            Kind::Flow => "flow",
            Kind::Cost => "cost",
            Kind::Capture => "capture",
            Kind::Health => "health",
            Kind::Event => "event",
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Its topic under `prefix`.
    pub fn topic(self, prefix: &str) -> String {
        format!("{prefix}{}.v{SCHEMA_VERSION}", self.name())
    }
}

/// Where a record comes from: the (agent, boot, seq) that is stored once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The agent.
    pub agent: String,
    /// Its run.
    pub boot: u64,
    /// The record's number in the run.
    pub seq: u64,
}

/// One record ready for a producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its kind (the topic follows from it).
    pub kind: Kind,
    /// The partitioning key.
    pub key: String,
    /// The record's JSON.
    pub payload: Vec<u8>,
    /// Where it comes from (headers).
    pub origin: Origin,
    /// Another topic than its kind's (goflow2-encoded flows), if any.
    pub topic: Option<String>,
}

impl Message {
    /// `record` numbered by `origin`.
    pub fn new(record: &Record, origin: Origin) -> Message {
        Message::from_json(record, serde_json::to_vec(record).unwrap_or_default(), origin)
    }

    /// `record` whose JSON is already at hand (the collector keeps it as it stored it).
    pub fn from_json(record: &Record, payload: Vec<u8>, origin: Origin) -> Message {
        let (kind, key) = (Kind::of(record), key(record, &origin.agent));
        Message { kind, key, payload, origin, topic: None }
    }

    /// The headers, as (name, value).
    pub fn headers(&self) -> [(&'static str, String); 5] {
        [
            (header::SCHEMA, SCHEMA_VERSION.to_string()),
            (header::KIND, self.kind.name().to_string()),
            (header::AGENT, self.origin.agent.clone()),
            (header::BOOT, self.origin.boot.to_string()),
            (header::SEQ, self.origin.seq.to_string()),
        ]
    }
}

/// The key of a flow: `proto/src/sport/dst/dport`, with `/spi/si` for NSH service paths.
pub fn flow_key(f: &Flow) -> String {
    let mut k = format!("{}/{}/{}/{}/{}", f.proto, f.src, f.sport, f.dst, f.dport);
    if let (Some(spi), Some(si)) = (f.spi, f.si) {
        k.push_str(&format!("/{spi}/{si}"));
    }
    k
}

/// A record's partitioning key: its flow, or `agent` for records about no single flow.
pub fn key(r: &Record, agent: &str) -> String {
    match r {
        Record::Loss(l) => flow_key(&l.flow),
        Record::FlowLoss(l) => flow_key(&l.flow),
        Record::Flow(l) => flow_key(&l.flow),
        Record::Event(e) => flow_key(&e.flow),
        Record::Summary(_) | Record::Cost(_) | Record::Capture(_) | Record::Health(_) => {
            agent.to_string()
        }
    }
}

/// Why a message read from Kafka is not a Telemark record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A header is missing or not what it should be.
    #[error("header {0}: missing or malformed")]
    Header(&'static str),
    /// The schema version is one this build does not read.
    #[error("schema version {0}, this build reads {SCHEMA_VERSION}")]
    Version(String),
    /// The value is not a record's JSON.
    #[error("value: {0}")]
    Value(String),
}

impl DecodeError {
    /// Name for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Header(_) => "header",
            DecodeError::Version(_) => "version",
            DecodeError::Value(_) => "value",
        }
    }
}

/// The record and origin of a message read from Kafka: `header(name)` gives a header's value.
pub fn decode<'h>(
    header: impl Fn(&str) -> Option<&'h [u8]>,
    payload: &[u8],
) -> Result<(Origin, Record), DecodeError> {
    let text = |name: &'static str| {
        header(name).and_then(|v| std::str::from_utf8(v).ok()).ok_or(DecodeError::Header(name))
    };
    let number =
        |name: &'static str| text(name)?.parse::<u64>().map_err(|_| DecodeError::Header(name));
    let version = text(header::SCHEMA)?;
    if version != SCHEMA_VERSION.to_string() {
        return Err(DecodeError::Version(version.to_string()));
    }
    let agent = text(header::AGENT)?;
    if agent.is_empty() {
        return Err(DecodeError::Header(header::AGENT));
    }
    let origin =
        Origin { agent: agent.to_string(), boot: number(header::BOOT)?, seq: number(header::SEQ)? };
    let record: Record =
        serde_json::from_slice(payload).map_err(|e| DecodeError::Value(e.to_string()))?;
    Ok((origin, record))
}
