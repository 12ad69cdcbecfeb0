//! Telemark's records on Apache Kafka (docs/kafka.md): which topic, key and headers each record
//! kind travels with ([`message`]), the `[kafka]` configuration ([`config`]), a producer that
//! never blocks its caller ([`producer`]) and a consumer-group member that commits only what
//! was stored ([`consumer`]), and the topics created from Telemark's own settings ([`admin`]). The client is librdkafka (through `rdkafka`): idempotent
//! producer, consumer groups, TLS and SASL.

pub mod admin;
pub mod config;
pub mod consumer;
pub mod goflow2;
pub mod message;
pub mod producer;

pub use admin::{ensure_topics, TopicOutcome, TopicPlan, TopicState};
pub use config::KafkaConfig;
pub use consumer::{Batch, Consumer};
pub use message::{Kind, Message, Origin};
pub use producer::{Delivery, Producer, SendError, TopicProbe};
