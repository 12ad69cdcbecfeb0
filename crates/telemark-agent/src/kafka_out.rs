//! Records published to Kafka by the agent itself (docs/kafka.md, "From an agent").

use telemark_core::records::Record;
use telemark_kafka::{Message, Origin, Producer};

/// An agent run's records on their way to Kafka: numbered in the run as for a collector
/// (agent, boot, seq), handed to the producer's bounded queue; when it is full (the brokers
/// away for long), new records are dropped and counted, and never numbered. Never blocks.
pub struct KafkaOut {
    /// The producer (idempotent).
    pub producer: Producer,
    agent: String,
    boot: u64,
    next_seq: u64,
    /// Dropped: the producer's queue was full.
    pub dropped: u64,
    /// Acknowledged by the brokers.
    pub acked: u64,
    /// Failed after the producer's retries (lost).
    pub failed: u64,
}

impl KafkaOut {
    /// The records of `agent`'s run `boot`, numbered from 0.
    pub fn new(producer: Producer, agent: &str, boot: u64) -> KafkaOut {
        KafkaOut {
            producer,
            agent: agent.to_string(),
            boot,
            next_seq: 0,
            dropped: 0,
            acked: 0,
            failed: 0,
        }
    }

    /// Queues `r`; false when the queue was full (dropped, counted).
    pub fn push(&mut self, r: &Record) -> bool {
        let origin = Origin { agent: self.agent.clone(), boot: self.boot, seq: self.next_seq };
        match self.producer.send(&Message::new(r, origin), self.next_seq) {
            Ok(()) => {
                self.next_seq += 1;
                true
            }
            Err(_) => {
                self.dropped += 1;
                false
            }
        }
    }

    /// Takes the delivery reports in.
    pub fn poll(&mut self) {
        for d in self.producer.deliveries() {
            match d.error {
                None => self.acked += 1,
                Some(e) => {
                    if self.failed == 0 {
                        tracing::warn!("kafka: a record was not delivered: {e}");
                    }
                    self.failed += 1;
                }
            }
        }
    }

    /// Records lost: dropped at a full queue, or failed.
    pub fn lost(&self) -> u64 {
        self.dropped + self.failed
    }
}
