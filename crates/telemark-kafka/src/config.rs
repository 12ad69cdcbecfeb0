//! The `[kafka]` section both the collector and the agent read.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where and how to reach Kafka.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port[,host:port…]`.
    pub brokers: String,
    /// Topic names start with this (`telemark.` gives `telemark.loss.v1`).
    #[serde(default = "default_prefix")]
    pub topic_prefix: String,
    /// How long a producer waits to fill a batch, in ms (librdkafka `linger.ms`).
    #[serde(default = "default_linger_ms")]
    pub linger_ms: u32,
    /// Most records per batch to a partition (`batch.num.messages`).
    #[serde(default = "default_batch_records")]
    pub batch_records: u32,
    /// Most records a producer holds unacknowledged (`queue.buffering.max.messages`); past it
    /// an agent drops new records and counts them, a collector waits to read more from its
    /// outbox.
    #[serde(default = "default_buffer_records")]
    pub buffer_records: u32,
    /// How long a record may take to be acknowledged, retries included, before it counts as
    /// failed (`message.timeout.ms`); a collector sends it again later.
    #[serde(default = "default_timeout_ms")]
    pub delivery_timeout_ms: u32,
    /// TLS to the brokers.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// SASL authentication.
    #[serde(default)]
    pub sasl: Option<SaslConfig>,
    /// Any other librdkafka property, as librdkafka names it (`compression.type = "lz4"`).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// TLS settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// CA certificates (PEM) that sign the brokers' certificates; absent: the system's.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for brokers that authenticate clients by certificate.
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    pub key_file: Option<PathBuf>,
}

/// SASL settings (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaslConfig {
    /// Mechanism.
    pub mechanism: String,
    /// User name.
    pub username: String,
    /// File holding the password (one line).
    pub password_file: PathBuf,
}

fn default_prefix() -> String {
    "telemark.".into()
}
fn default_linger_ms() -> u32 {
    5
}
fn default_batch_records() -> u32 {
    10_000
}
fn default_buffer_records() -> u32 {
    100_000
}
fn default_timeout_ms() -> u32 {
    30_000
}

impl KafkaConfig {
    /// A configuration with defaults for `brokers`.
    pub fn new(brokers: &str) -> KafkaConfig {
        KafkaConfig {
            brokers: brokers.to_string(),
            topic_prefix: default_prefix(),
            linger_ms: default_linger_ms(),
            batch_records: default_batch_records(),
            buffer_records: default_buffer_records(),
            delivery_timeout_ms: default_timeout_ms(),
            tls: None,
            sasl: None,
            properties: BTreeMap::new(),
        }
    }

    /// Checks what can be checked before connecting.
    pub fn validate(&self) -> Result<(), String> {
        if self.brokers.trim().is_empty() {
            return Err("kafka.brokers is empty".into());
        }
        for b in self.brokers.split(',') {
            let b = b.trim();
            let port = b.rsplit_once(':').map(|(_, p)| p);
            if port.and_then(|p| p.parse::<u16>().ok()).is_none() {
                return Err(format!("kafka.brokers: {b:?} is not host:port"));
            }
        }
        let prefix_ok =
            self.topic_prefix.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !prefix_ok || self.topic_prefix.len() > 200 {
            return Err(format!(
                "kafka.topic_prefix {:?}: topic names take letters, digits, '.', '_' and '-'",
                self.topic_prefix
            ));
        }
        if self.buffer_records == 0 || self.batch_records == 0 {
            return Err("kafka.buffer_records and kafka.batch_records must be at least 1".into());
        }
        if let Some(s) = &self.sasl {
            let known = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];
            if !known.contains(&s.mechanism.as_str()) {
                return Err(format!(
                    "kafka.sasl.mechanism {:?}: one of {}",
                    s.mechanism,
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// The librdkafka properties this configuration sets (the password read from its file).
    pub fn client_properties(&self) -> Result<Vec<(String, String)>, String> {
        let mut p = vec![
            ("bootstrap.servers".to_string(), self.brokers.clone()),
            ("socket.connection.setup.timeout.ms".into(), "10000".into()),
        ];
        let security = match (&self.tls, &self.sasl) {
            (None, None) => "plaintext",
            (Some(_), None) => "ssl",
            (None, Some(_)) => "sasl_plaintext",
            (Some(_), Some(_)) => "sasl_ssl",
        };
        p.push(("security.protocol".into(), security.into()));
        if let Some(t) = &self.tls {
            let files = [
                ("ssl.ca.location", &t.ca_file),
                ("ssl.certificate.location", &t.cert_file),
                ("ssl.key.location", &t.key_file),
            ];
            for (name, f) in files {
                if let Some(f) = f {
                    p.push((name.into(), f.display().to_string()));
                }
            }
        }
        if let Some(s) = &self.sasl {
            let password = std::fs::read_to_string(&s.password_file).map_err(|e| {
                format!("kafka.sasl.password_file {}: {e}", s.password_file.display())
            })?;
            p.push(("sasl.mechanisms".into(), s.mechanism.clone()));
            p.push(("sasl.username".into(), s.username.clone()));
            p.push(("sasl.password".into(), password.trim_end().to_string()));
        }
        for (k, v) in &self.properties {
            p.push((k.clone(), v.clone()));
        }
        Ok(p)
    }
}
