//! A producer of Telemark records that never blocks its caller: `send` hands a record to
//! librdkafka's bounded queue or says it is full, and delivery reports come back through
//! [`Producer::deliveries`], each with the number the caller gave its record.

use crate::config::KafkaConfig;
use crate::message::{Kind, Message};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message as _, OwnedHeaders};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DefaultProducerContext, DeliveryResult, Producer as _,
    ProducerContext,
};
use rdkafka::ClientContext;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One record's fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The number the caller sent it with.
    pub id: u64,
    /// The topic it was sent to.
    pub topic: String,
    /// `None`: the brokers acknowledged it (all in-sync replicas, with the idempotent
    /// producer); else why it failed after librdkafka's retries.
    pub error: Option<String>,
}

/// Why a record was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The producer holds its `buffer_records` unacknowledged already.
    #[error("producer queue full")]
    Full,
    /// Anything else (a message larger than the brokers take, …).
    #[error("{0}")]
    Other(String),
}

/// Collects delivery reports as librdkafka serves them.
struct Reports {
    done: Mutex<Vec<Delivery>>,
}

impl ClientContext for Reports {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!("kafka: {error}: {reason}");
    }
}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<u64>;

    fn delivery(&self, result: &DeliveryResult<'_>, id: Box<u64>) {
        let (error, topic) = match result {
            Ok(m) => (None, m.topic().to_string()),
            Err((e, m)) => (Some(e.to_string()), m.topic().to_string()),
        };
        if let Ok(mut d) = self.done.lock() {
            d.push(Delivery { id: *id, topic, error });
        }
    }
}

/// A producer for one configuration.
pub struct Producer {
    inner: BaseProducer<Reports>,
    config: ClientConfig,
    topics: Vec<(Kind, String)>,
}

impl Producer {
    /// Connects (lazily: librdkafka reaches the brokers in the background). `idempotent`:
    /// the brokers drop what a retry sends twice, and one partition's records stay in order.
    pub fn new(cfg: &KafkaConfig, idempotent: bool) -> Result<Producer, String> {
        cfg.validate()?;
        let mut c = ClientConfig::new();
        for (k, v) in cfg.client_properties()? {
            c.set(k, v);
        }
        c.set("enable.idempotence", idempotent.to_string())
            .set("acks", "all")
            .set("linger.ms", cfg.linger_ms.to_string())
            .set("batch.num.messages", cfg.batch_records.to_string())
            .set("queue.buffering.max.messages", cfg.buffer_records.to_string())
            .set("message.timeout.ms", cfg.delivery_timeout_ms.to_string());
        let inner = c
            .create_with_context(Reports { done: Mutex::new(Vec::new()) })
            .map_err(|e| format!("kafka producer: {e}"))?;
        let topics = Kind::ALL.iter().map(|&k| (k, k.topic(&cfg.topic_prefix))).collect();
        Ok(Producer { inner, config: c, topics })
    }

    /// A probe of this producer's topics (every kind's, and `extra`), on a client of its own
    /// so that another thread can wait on it.
    pub fn topic_probe(&self, extra: Option<&str>) -> Result<TopicProbe, String> {
        let client = self
            .config
            .create::<BaseProducer<DefaultProducerContext>>()
            .map_err(|e| format!("kafka metadata client: {e}"))?;
        let mut topics: Vec<String> = self.topics.iter().map(|(_, t)| t.clone()).collect();
        topics.extend(extra.map(str::to_string));
        Ok(TopicProbe { client, topics })
    }

    fn topic(&self, kind: Kind) -> &str {
        self.topics.iter().find(|(k, _)| *k == kind).map_or("", |(_, t)| t)
    }

    /// Queues `m`, numbered `id` for its delivery report. Never blocks.
    pub fn send(&self, m: &Message, id: u64) -> Result<(), SendError> {
        let mut headers = OwnedHeaders::new_with_capacity(5);
        for (name, value) in m.headers() {
            headers = headers.insert(Header { key: name, value: Some(value.as_bytes()) });
        }
        let topic = m.topic.as_deref().unwrap_or_else(|| self.topic(m.kind));
        let record = BaseRecord::with_opaque_to(topic, Box::new(id))
            .key(m.key.as_bytes())
            .payload(&m.payload)
            .headers(headers);
        match self.inner.send(record) {
            Ok(()) => Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                Err(SendError::Full)
            }
            Err((e, _)) => Err(SendError::Other(e.to_string())),
        }
    }

    /// Serves librdkafka's callbacks and returns the delivery reports since the last call.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.inner.poll(Duration::ZERO);
        match self.inner.context().done.lock() {
            Ok(mut d) => std::mem::take(&mut *d),
            Err(_) => Vec::new(),
        }
    }

    /// Records queued or sent and not yet reported.
    pub fn in_flight(&self) -> usize {
        usize::try_from(self.inner.in_flight_count()).unwrap_or(0)
    }

    /// Waits up to `timeout` for everything queued to be delivered or failed.
    pub fn flush(&self, timeout: Duration) {
        let _ = self.inner.flush(timeout);
    }
}

/// Whether the brokers have a producer's topics ready: each exists and every partition of it
/// has a leader. Records are sent only once they are: a topic the first record creates
/// (`auto.create.topics.enable`) is written while its partitions come up, and there an
/// acknowledged first batch was seen missing from the log (Kafka 4.3, librdkafka 2.12, a
/// loaded machine). Asking for a topic's metadata is what has the brokers create it.
pub struct TopicProbe {
    client: BaseProducer<DefaultProducerContext>,
    topics: Vec<String>,
}

impl TopicProbe {
    /// A probe of `topics` that never has the brokers create one (a consumer's: topics are
    /// created with the partitions a group needs, `telemark kafka-topics`).
    pub fn new(cfg: &KafkaConfig, topics: Vec<String>) -> Result<TopicProbe, String> {
        let mut c = ClientConfig::new();
        for (k, v) in cfg.client_properties()? {
            c.set(k, v);
        }
        c.set("allow.auto.create.topics", "false");
        let client = c.create().map_err(|e| format!("kafka metadata client: {e}"))?;
        Ok(TopicProbe { client, topics })
    }

    /// The topics not ready yet, each with why; asks the brokers, up to `timeout` a topic.
    pub fn not_ready(&self, timeout: Duration) -> Vec<String> {
        let mut missing = Vec::new();
        for topic in &self.topics {
            let why = match self.client.client().fetch_metadata(Some(topic), timeout) {
                Err(e) => Some(format!("{topic} ({e})")),
                Ok(m) => match m.topics().iter().find(|t| t.name() == topic) {
                    None => Some(format!("{topic} (not in the brokers' answer)")),
                    Some(t) => match t.error() {
                        Some(e) => Some(format!("{topic} ({})", RDKafkaErrorCode::from(e))),
                        None if t.partitions().is_empty() => {
                            Some(format!("{topic} (no partition)"))
                        }
                        None if t
                            .partitions()
                            .iter()
                            .any(|p| p.leader() < 0 || p.error().is_some()) =>
                        {
                            Some(format!("{topic} (a partition without a leader)"))
                        }
                        None => None,
                    },
                },
            };
            missing.extend(why);
        }
        missing
    }

    /// Asks until every topic is ready (true) or `stop` is set (false). Says once, after
    /// 10 s, which topics it still waits for: with `auto.create.topics.enable=false` on the
    /// brokers, the operator creates them.
    pub fn wait(&self, stop: &AtomicBool) -> bool {
        let start = Instant::now();
        let mut said = false;
        while !stop.load(Ordering::Relaxed) {
            let missing = self.not_ready(Duration::from_secs(2));
            if missing.is_empty() {
                if said {
                    tracing::info!("kafka: every topic is ready; publishing");
                }
                return true;
            }
            if !said && start.elapsed() > Duration::from_secs(10) {
                tracing::warn!(
                    "kafka: records wait for topics the brokers do not have ready (create \
                     them if the brokers do not create topics): {}",
                    missing.join(", ")
                );
                said = true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }
}
