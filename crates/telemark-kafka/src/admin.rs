//! Telemark's topics on the brokers (`telemark kafka-topics`, docs/kafka.md): created from
//! Telemark's own `[kafka]` settings with the partitions a consumer group needs, so that an
//! operator never has to find the broker's own scripts (the Maven-jar broker has none).
//!
//! A consumer group spreads a topic's partitions over its members: a topic with fewer
//! partitions than collectors leaves the others idle on it. One flow's records go to one
//! partition (keyed by flow), so partitions may be added later; the store does not depend on
//! the order records arrive in.

use crate::config::KafkaConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use std::time::Duration;

/// What became of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicOutcome {
    /// Created with this many partitions.
    Created { partitions: usize },
    /// Was there with enough partitions.
    Present { partitions: usize },
    /// Was there with fewer: grown to the number asked for.
    Grown { from: usize, to: usize },
    /// Was there with fewer, left so (growing not asked for).
    TooFew { partitions: usize },
    /// The brokers refused (why).
    Failed(String),
}

/// One topic's name and outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicState {
    pub topic: String,
    pub outcome: TopicOutcome,
}

/// What to ask of the brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicPlan {
    /// Partitions per topic: at least the number of collectors in the largest group.
    pub partitions: usize,
    /// Copies of each partition (at most the brokers' count).
    pub replication: i32,
    /// Add partitions to topics that have fewer.
    pub grow: bool,
}

fn admin(cfg: &KafkaConfig) -> Result<AdminClient<DefaultClientContext>, String> {
    cfg.validate()?;
    let mut c = ClientConfig::new();
    for (k, v) in cfg.client_properties()? {
        c.set(k, v);
    }
    c.create().map_err(|e| format!("kafka admin client: {e}"))
}

/// Each topic's partition count on the brokers (`None`: absent), asking for at most `timeout`.
fn partitions(
    a: &AdminClient<DefaultClientContext>,
    topics: &[String],
    timeout: Duration,
) -> Result<Vec<Option<usize>>, String> {
    let m = a
        .inner()
        .fetch_metadata(None, timeout)
        .map_err(|e| format!("kafka: the brokers' metadata: {e}"))?;
    Ok(topics
        .iter()
        .map(|t| {
            m.topics()
                .iter()
                .find(|x| x.name() == t && x.error().is_none())
                .map(|x| x.partitions().len())
        })
        .collect())
}

/// Creates the `topics` that are missing, as `plan` says, and reports each.
pub fn ensure_topics(
    cfg: &KafkaConfig,
    topics: &[String],
    plan: TopicPlan,
    timeout: Duration,
) -> Result<Vec<TopicState>, String> {
    if plan.partitions == 0 || plan.replication < 1 {
        return Err("partitions and replication must be at least 1".into());
    }
    let a = admin(cfg)?;
    let have = partitions(&a, topics, timeout)?;
    let opts = AdminOptions::new().operation_timeout(Some(timeout)).request_timeout(Some(timeout));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let missing: Vec<&String> =
        topics.iter().zip(&have).filter(|(_, h)| h.is_none()).map(|(t, _)| t).collect();
    let new: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|t| {
            NewTopic::new(t, plan.partitions as i32, TopicReplication::Fixed(plan.replication))
        })
        .collect();
    let created = if new.is_empty() {
        Vec::new()
    } else {
        rt.block_on(a.create_topics(new.iter(), &opts))
            .map_err(|e| format!("kafka: creating topics: {e}"))?
    };
    let few: Vec<(&String, usize)> = topics
        .iter()
        .zip(&have)
        .filter_map(|(t, h)| h.filter(|n| *n < plan.partitions).map(|n| (t, n)))
        .collect();
    let grown = if plan.grow && !few.is_empty() {
        let more: Vec<NewPartitions<'_>> =
            few.iter().map(|(t, _)| NewPartitions::new(t, plan.partitions)).collect();
        rt.block_on(a.create_partitions(more.iter(), &opts))
            .map_err(|e| format!("kafka: adding partitions: {e}"))?
    } else {
        Vec::new()
    };
    let failed = |results: &[Result<String, (String, RDKafkaErrorCode)>], t: &str| {
        results.iter().find_map(|r| match r {
            Err((name, code)) if name == t => Some(*code),
            _ => None,
        })
    };
    Ok(topics
        .iter()
        .zip(&have)
        .map(|(t, h)| {
            let outcome = match *h {
                None => match failed(&created, t) {
                    // Another client created it meanwhile: there now, with its own count.
                    Some(RDKafkaErrorCode::TopicAlreadyExists) => {
                        let now = partitions(&a, std::slice::from_ref(t), timeout)
                            .ok()
                            .and_then(|p| p.first().copied().flatten());
                        TopicOutcome::Present { partitions: now.unwrap_or(0) }
                    }
                    Some(e) => TopicOutcome::Failed(e.to_string()),
                    None => TopicOutcome::Created { partitions: plan.partitions },
                },
                Some(n) if n >= plan.partitions => TopicOutcome::Present { partitions: n },
                Some(n) if !plan.grow => TopicOutcome::TooFew { partitions: n },
                Some(n) => match failed(&grown, t) {
                    Some(e) => TopicOutcome::Failed(e.to_string()),
                    None => TopicOutcome::Grown { from: n, to: plan.partitions },
                },
            };
            TopicState { topic: t.clone(), outcome }
        })
        .collect())
}
