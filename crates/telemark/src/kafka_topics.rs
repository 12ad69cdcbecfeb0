//! `telemark kafka-topics`: creates Telemark's Kafka topics from its own `[kafka]` settings
//! (docs/kafka.md, "Topics"), with the partitions a consumer group of collectors needs.

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use std::path::PathBuf;
use std::time::Duration;
use telemark_kafka::{ensure_topics, KafkaConfig, Kind, TopicOutcome, TopicPlan};

/// `telemark kafka-topics` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// A Telemark file with a `[kafka]` section: a collector's `--kafka` file or an agent's
    /// config. Its brokers, TLS, SASL and topic prefix are used; a collector's
    /// `[publish] goflow2_topic` is created too.
    #[arg(long)]
    pub config: PathBuf,
    /// Partitions per topic: at least as many as collectors in one consumer group (each
    /// partition is read by one member).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub partitions: u32,
    /// Copies of each partition (at most the number of brokers).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=16))]
    pub replication: i32,
    /// Add partitions to topics that have fewer than --partitions (a flow's records then
    /// go to another partition from that moment; collectors do not depend on the order).
    #[arg(long)]
    pub grow: bool,
    /// Longest wait for the brokers' answer.
    #[arg(long, default_value = "15s", value_parser = crate::collector::parse_duration)]
    pub timeout: Duration,
}

/// The `[kafka]` section of `path` and the topics its records use.
fn topics_of(path: &std::path::Path) -> Result<(KafkaConfig, Vec<String>)> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let doc: toml::Table = toml::from_str(&text).with_context(|| path.display().to_string())?;
    let Some(section) = doc.get("kafka") else {
        bail!("{}: no [kafka] section", path.display());
    };
    let cfg: KafkaConfig =
        section.clone().try_into().with_context(|| format!("{}: [kafka]", path.display()))?;
    cfg.validate().map_err(anyhow::Error::msg).with_context(|| path.display().to_string())?;
    let mut topics: Vec<String> = Kind::ALL.iter().map(|k| k.topic(&cfg.topic_prefix)).collect();
    let goflow2 = doc.get("publish").and_then(|p| p.get("goflow2_topic")).and_then(|t| t.as_str());
    topics.extend(goflow2.map(str::to_string));
    Ok((cfg, topics))
}

pub fn run(a: Args) -> Result<()> {
    let (cfg, topics) = topics_of(&a.config)?;
    let plan =
        TopicPlan { partitions: a.partitions as usize, replication: a.replication, grow: a.grow };
    let states = ensure_topics(&cfg, &topics, plan, a.timeout).map_err(anyhow::Error::msg)?;
    let mut failed = 0;
    for s in &states {
        let what = match &s.outcome {
            TopicOutcome::Created { partitions } => format!("created, {partitions} partitions"),
            TopicOutcome::Present { partitions } => format!("present, {partitions} partitions"),
            TopicOutcome::Grown { from, to } => format!("grown from {from} to {to} partitions"),
            TopicOutcome::TooFew { partitions } => format!(
                "present with {partitions} partitions, fewer than {} (--grow adds them)",
                a.partitions
            ),
            TopicOutcome::Failed(e) => {
                failed += 1;
                format!("FAILED: {e}")
            }
        };
        println!("{:<32} {what}", s.topic);
    }
    if failed > 0 {
        bail!("{failed} of {} topics could not be created", states.len());
    }
    Ok(())
}
