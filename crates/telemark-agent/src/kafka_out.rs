//! Records published to Kafka by the agent itself (docs/kafka.md, "From an agent").

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use telemark_core::records::Record;
use telemark_kafka::{Message, Origin, Producer, SendError};

/// Whether the agent's topics are ready on the brokers (`TopicProbe`), as a thread asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topics {
    /// Records are numbered and held here, up to the producer's bound.
    Waiting,
    /// Records go to the producer.
    Ready,
}

/// An agent run's records on their way to Kafka: numbered in the run as for a collector
/// (agent, boot, seq), handed to the producer's bounded queue (held here, under the same
/// bound, until the brokers have the topics ready); when it is full (the brokers away for
/// long), new records are dropped and counted, and never numbered. Never blocks.
pub struct KafkaOut {
    /// The producer (idempotent).
    pub producer: Producer,
    agent: String,
    boot: u64,
    next_seq: u64,
    topics: Topics,
    /// Set by the probe thread once every topic is ready.
    ready: Arc<AtomicBool>,
    /// Tells the probe thread to give up (the agent stops).
    stop: Arc<AtomicBool>,
    /// Numbered records waiting for their topics, oldest first.
    held: VecDeque<Message>,
    bound: usize,
    /// Dropped: the producer's queue was full.
    pub dropped: u64,
    /// Acknowledged by the brokers.
    pub acked: u64,
    /// Failed after the producer's retries (lost).
    pub failed: u64,
}

impl KafkaOut {
    /// The records of `agent`'s run `boot`, numbered from 0, held up to `bound` until the
    /// topics are ready.
    pub fn new(producer: Producer, agent: &str, boot: u64, bound: usize) -> KafkaOut {
        let ready = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        match producer.topic_probe(None) {
            Ok(probe) => {
                let (ready, stop) = (ready.clone(), stop.clone());
                std::thread::spawn(move || {
                    if probe.wait(&stop) {
                        ready.store(true, Ordering::Release);
                    }
                });
            }
            Err(e) => {
                // Without a probe, records go as they come (the brokers create topics then).
                tracing::warn!("kafka: {e}; records are sent without waiting for topics");
                ready.store(true, Ordering::Release);
            }
        }
        KafkaOut {
            producer,
            agent: agent.to_string(),
            boot,
            next_seq: 0,
            topics: Topics::Waiting,
            ready,
            stop,
            held: VecDeque::new(),
            bound,
            dropped: 0,
            acked: 0,
            failed: 0,
        }
    }

    /// Queues `r`; false when there was no room (dropped, counted).
    pub fn push(&mut self, r: &Record) -> bool {
        self.poll_topics();
        let origin = Origin { agent: self.agent.clone(), boot: self.boot, seq: self.next_seq };
        let m = Message::new(r, origin);
        let taken = if self.topics == Topics::Ready && self.held.is_empty() {
            self.producer.send(&m, self.next_seq).is_ok()
        } else if self.held.len() < self.bound {
            // Behind what is held, in order.
            self.held.push_back(m);
            true
        } else {
            false
        };
        if taken {
            self.next_seq += 1;
        } else {
            self.dropped += 1;
        }
        taken
    }

    /// Once the topics are ready, hands what is held to the producer, in order.
    fn poll_topics(&mut self) {
        if self.topics == Topics::Waiting && self.ready.load(Ordering::Acquire) {
            self.topics = Topics::Ready;
        }
        if self.topics == Topics::Ready {
            while let Some(m) = self.held.front() {
                match self.producer.send(m, m.origin.seq) {
                    Ok(()) => {}
                    // Room comes as deliveries are reported; the rest waits for it.
                    Err(SendError::Full) => break,
                    Err(SendError::Other(e)) => {
                        tracing::warn!("kafka: record {} not sent: {e}", m.origin.seq);
                        self.failed += 1;
                    }
                }
                self.held.pop_front();
            }
        }
    }

    /// Takes the delivery reports in.
    pub fn poll(&mut self) {
        self.poll_topics();
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

    /// At exit: waits up to `timeout` for the topics and the deliveries; what is still held
    /// then counts as lost.
    pub fn finish(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.held.is_empty() && Instant::now() < deadline {
            self.poll();
            std::thread::sleep(Duration::from_millis(20));
        }
        self.producer.flush(deadline.saturating_duration_since(Instant::now()));
        self.poll();
        if !self.held.is_empty() {
            tracing::warn!(
                held = self.held.len(),
                "records never sent: their Kafka topics were not ready at exit"
            );
            self.failed += self.held.len() as u64;
            self.held.clear();
        }
    }

    /// Records handed on and not yet reported: held or in the producer.
    pub fn pending(&self) -> usize {
        self.held.len() + self.producer.in_flight()
    }

    /// Records lost: dropped at a full queue, or failed.
    pub fn lost(&self) -> u64 {
        self.dropped + self.failed
    }
}

impl Drop for KafkaOut {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
