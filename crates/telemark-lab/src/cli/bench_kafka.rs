//! `telemark bench-kafka`: records per second through Kafka with the broker on this host
//! (docs/kafka.md, "Throughput"). This process and the collectors it starts run on one core
//! (`--cpu`); the broker runs on another (`eval/kafka-throughput.sh` starts it so).
//!
//! - **agent**: an agent's Kafka export ([`KafkaOut`]: numbering, the idempotent producer)
//!   publishing N loss records, acknowledged; and the same producer with the records encoded
//!   as protobuf instead of JSON.
//! - **collector publish**: a collector publishing N stored records from its outbox.
//! - **collector consume**: a collector in a consumer group reading what the two above put on
//!   the loss topic, and storing it.
//!
//! And a loss record's size and encoding time as JSON and as protobuf, to weigh the two.

use crate::cli::bench_collector::{median, metric, record, start_with, Proc};
use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use prost::Message as _;
use std::ffi::OsStr;
use std::time::{Duration, Instant};
use telemark_agent::kafka_out::KafkaOut;
use telemark_core::records::{LossRecord, Record};
use telemark_kafka::{KafkaConfig, Kind, Message, Origin, Producer};
use telemark_transport::now_ns;

/// `telemark bench-kafka` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The brokers (`host:port,…`), on this host.
    #[arg(long)]
    pub brokers: String,
    /// Records per measurement.
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Rounds (the median is printed).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// The core this process and its collectors run on.
    #[arg(long, default_value_t = 0)]
    pub cpu: usize,
}

/// A loss record in protobuf, as a `.proto` for DESIGN.md's loss record would define it
/// (addresses as 4 or 16 bytes, the scope as an enum number). Measured only: not published.
#[derive(Clone, PartialEq, prost::Message)]
struct LossPb {
    #[prost(string, tag = "1")]
    agent: String,
    #[prost(string, tag = "2")]
    port: String,
    #[prost(string, tag = "3")]
    point: String,
    #[prost(bytes = "vec", tag = "4")]
    src: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    dst: Vec<u8>,
    #[prost(uint32, tag = "6")]
    sport: u32,
    #[prost(uint32, tag = "7")]
    dport: u32,
    #[prost(uint32, tag = "8")]
    proto: u32,
    #[prost(uint32, tag = "9")]
    color: u32,
    #[prost(uint64, tag = "10")]
    batch: u64,
    #[prost(fixed64, tag = "11")]
    first_ns: u64,
    #[prost(fixed64, tag = "12")]
    last_ns: u64,
    #[prost(uint64, optional, tag = "13")]
    expected: Option<u64>,
    #[prost(uint64, tag = "14")]
    observed: u64,
    #[prost(uint64, tag = "15")]
    lost: u64,
    #[prost(uint64, tag = "16")]
    late: u64,
    #[prost(uint64, tag = "17")]
    uncertain: u64,
    #[prost(int32, tag = "18")]
    scope: i32,
    #[prost(bool, tag = "19")]
    tail: bool,
}

fn addr(s: &str) -> Vec<u8> {
    match s.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => a.octets().to_vec(),
        Ok(std::net::IpAddr::V6(a)) => a.octets().to_vec(),
        Err(_) => Vec::new(),
    }
}

fn protobuf(l: &LossRecord) -> Vec<u8> {
    LossPb {
        agent: l.agent.clone(),
        port: l.port.clone(),
        point: l.point.clone(),
        src: addr(&l.flow.src),
        dst: addr(&l.flow.dst),
        sport: l.flow.sport.into(),
        dport: l.flow.dport.into(),
        proto: l.flow.proto.into(),
        color: l.color.into(),
        batch: l.batch,
        first_ns: l.first_ns,
        last_ns: l.last_ns,
        expected: l.expected,
        observed: l.observed,
        lost: l.lost,
        late: l.late,
        uncertain: l.uncertain,
        scope: l.scope as i32,
        tail: l.tail,
    }
    .encode_to_vec()
}

/// The benchmark's records: loss batches of 1,000 flows.
fn records(agent: &str, n: u64) -> Vec<Record> {
    let t = now_ns() - 60_000_000_000;
    (0..n).map(|b| record(agent, b, t + b)).collect()
}

/// Pins the calling thread (and the threads it starts from now on) to `cpu`.
fn pin(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid; the call reads it only.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        bail!("pinning to cpu {cpu}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// How a record becomes a message.
#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Json,
    Protobuf,
}

/// Records per second an agent's producer gets acknowledged: `recs` sent as fast as its queue
/// takes them (a real agent drops what does not fit; here the sender waits instead).
fn agent(cfg: &KafkaConfig, recs: &[Record], encoding: Encoding) -> Result<f64> {
    let producer = Producer::new(cfg, true).map_err(anyhow::Error::msg)?;
    // The topics ready before the clock starts.
    let probe = producer.topic_probe(None).map_err(anyhow::Error::msg)?;
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let missing = probe.not_ready(Duration::from_secs(2));
        if missing.is_empty() {
            break;
        }
        if Instant::now() > until {
            bail!("topics not ready within 60 s: {}", missing.join(", "));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let room = cfg.buffer_records as usize;
    let mut out = KafkaOut::new(producer, "bench-agent", now_ns(), room);
    let started = Instant::now();
    let mut seq = 0u64;
    for r in recs {
        while out.pending() >= room {
            out.poll();
            std::thread::sleep(Duration::from_micros(200));
        }
        let taken = match encoding {
            Encoding::Json => out.push(r),
            Encoding::Protobuf => {
                let Record::Loss(l) = r else { bail!("loss records only") };
                let origin = Origin { agent: "bench-agent".into(), boot: 1, seq };
                let m = Message {
                    kind: Kind::Loss,
                    key: telemark_kafka::message::key(r, &origin.agent),
                    payload: protobuf(l),
                    origin,
                    topic: None,
                };
                out.producer.send(&m, seq).is_ok()
            }
        };
        if !taken {
            bail!("the producer refused a record with room in its queue");
        }
        seq += 1;
        if seq.is_multiple_of(1024) {
            out.poll();
        }
    }
    let until = Instant::now() + Duration::from_secs(120);
    while out.pending() > 0 {
        if Instant::now() > until {
            bail!("not acknowledged within 2 minutes: {}", out.pending());
        }
        out.poll();
        std::thread::sleep(Duration::from_millis(1));
    }
    out.poll();
    if out.failed > 0 {
        bail!("{} records failed", out.failed);
    }
    Ok(recs.len() as f64 / started.elapsed().as_secs_f64())
}

/// Records per second by the collector counter `name`, from its first change until it
/// reaches `n`.
fn rate_of(url: &str, name: &str, n: u64) -> Result<f64> {
    let timeout = Duration::from_secs(120);
    let until = Instant::now() + timeout;
    let (mut t0, mut c0) = (None, 0);
    loop {
        let c = metric(url, name)?;
        let now = Instant::now();
        if t0.is_none() && c > 0 {
            (t0, c0) = (Some(now), c);
        }
        if c >= n {
            let Some(t0) = t0.filter(|t| *t < now) else { bail!("{name} reached {n} at once") };
            return Ok((c - c0) as f64 / now.duration_since(t0).as_secs_f64());
        }
        if now > until {
            let text = ureq::get(&format!("{url}/metrics")).call()?.into_string()?;
            let kafka: Vec<&str> =
                text.lines().filter(|l| l.starts_with("telemark_collector_kafka")).collect();
            bail!("{name}: {c} of {n} after {} s; {}", timeout.as_secs(), kafka.join("; "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A collector's Kafka file.
fn kafka_file(
    dir: &std::path::Path,
    name: &str,
    cfg: &KafkaConfig,
    role: &str,
) -> Result<std::path::PathBuf> {
    let path = dir.join(name);
    let text = format!(
        "[kafka]\nbrokers = \"{}\"\ntopic_prefix = \"{}\"\n{role}\n",
        cfg.brokers, cfg.topic_prefix
    );
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Records per second a collector publishes from an outbox of `recs`, stored beforehand.
fn collector_publish(cfg: &KafkaConfig, dir: &std::path::Path, recs: &[Record]) -> Result<f64> {
    let db = dir.join("publish.db");
    {
        let mut st = telemark_collector::store::Store::open(&db)?;
        st.publish(u64::MAX)?;
        st.register("bench-collector", "bench", 1, now_ns())?;
        for (i, chunk) in recs.chunks(10_000).enumerate() {
            let seq = (i * 10_000) as u64;
            st.ingest("bench-collector", 1, seq, chunk, 0, now_ns())?;
        }
    }
    let file = kafka_file(dir, "publish.toml", cfg, "[publish]")?;
    let exe = std::env::current_exe()?;
    let (_p, url): (Proc, String) =
        start_with(&exe, &db, cpu_of_this_thread()?, &[OsStr::new("--kafka"), file.as_os_str()])?;
    rate_of(&url, "telemark_collector_kafka_published_total", recs.len() as u64)
}

/// Records per second a collector in a fresh consumer group reads and stores, of the `n` on
/// the loss topic.
fn collector_consume(cfg: &KafkaConfig, dir: &std::path::Path, n: u64) -> Result<f64> {
    let group = format!("[consume]\ngroup = \"bench-{}\"\nkinds = [\"loss\"]", std::process::id());
    let file = kafka_file(dir, "consume.toml", cfg, &group)?;
    let exe = std::env::current_exe()?;
    let (_p, url) = start_with(
        &exe,
        &dir.join("consume.db"),
        cpu_of_this_thread()?,
        &[OsStr::new("--kafka"), file.as_os_str()],
    )?;
    rate_of(&url, "telemark_collector_kafka_consumed_total", n)
}

/// The one core this thread may run on.
fn cpu_of_this_thread() -> Result<usize> {
    crate::cli::opts::allowed_cpus()?.first().copied().context("no cpu")
}

/// Bytes and encoding nanoseconds per record, JSON and protobuf.
fn sizes(recs: &[Record]) -> [(f64, f64); 2] {
    let n = recs.len().min(100_000);
    let mut out = [(0.0, 0.0); 2];
    for (i, enc) in [Encoding::Json, Encoding::Protobuf].into_iter().enumerate() {
        let mut times = Vec::new();
        let mut bytes = 0usize;
        for _ in 0..5 {
            bytes = 0;
            let t = Instant::now();
            for r in &recs[..n] {
                bytes += match (enc, r) {
                    (Encoding::Json, _) => serde_json::to_vec(r).map_or(0, |v| v.len()),
                    (Encoding::Protobuf, Record::Loss(l)) => protobuf(l).len(),
                    _ => 0,
                };
            }
            times.push(t.elapsed().as_nanos() as f64 / n as f64);
        }
        out[i] = (bytes as f64 / n as f64, median(&mut times));
    }
    out
}

/// Runs the rounds and prints the medians.
pub fn run(a: Args) -> Result<()> {
    pin(a.cpu)?;
    let recs = records("bench-collector", a.records);
    let agent_recs = records("bench-agent", a.records);
    let [json, pb] = sizes(&recs);
    let mut rates: [Vec<f64>; 4] = Default::default();
    for round in 0..a.rounds.max(1) {
        let dir = tempfile::tempdir()?;
        let mut cfg = KafkaConfig::new(&a.brokers);
        cfg.topic_prefix = format!("bench{}r{round}.", std::process::id());
        let agent_json = agent(&cfg, &agent_recs, Encoding::Json)?;
        let publish = collector_publish(&cfg, dir.path(), &recs)?;
        // Both of the above are on the loss topic: the consumer stores 2N.
        let consume = collector_consume(&cfg, dir.path(), 2 * a.records)?;
        let mut pb_cfg = cfg.clone();
        pb_cfg.topic_prefix.push_str("pb.");
        let agent_pb = agent(&pb_cfg, &agent_recs, Encoding::Protobuf)?;
        eprintln!(
            "round {round}: agent {agent_json:.0}/s (protobuf {agent_pb:.0}/s), collector \
             publish {publish:.0}/s, consume and store {consume:.0}/s"
        );
        for (v, r) in rates.iter_mut().zip([agent_json, agent_pb, publish, consume]) {
            v.push(r);
        }
    }
    let [aj, ap, p, c] = rates.map(|mut v| median(&mut v));
    println!(
        "Kafka throughput, loss records, broker on this host, this side pinned to cpu {}, \
         medians of {} rounds of {} records:",
        a.cpu,
        a.rounds.max(1),
        a.records
    );
    println!("{:<44} {:>12}", "path", "records/s");
    println!("{:<44} {:>12.0}", "agent → Kafka (JSON, acknowledged)", aj);
    println!("{:<44} {:>12.0}", "agent → Kafka (protobuf, acknowledged)", ap);
    println!("{:<44} {:>12.0}", "collector outbox → Kafka (JSON)", p);
    println!("{:<44} {:>12.0}", "Kafka → collector, stored (JSON)", c);
    println!(
        "loss record: JSON {:.0} B, {:.0} ns to encode; protobuf {:.0} B, {:.0} ns \
         (protobuf / JSON: {:.2} of the bytes, {:.2} of the time; throughput {:.2})",
        json.0,
        json.1,
        pb.0,
        pb.1,
        pb.0 / json.0,
        pb.1 / json.1,
        ap / aj
    );
    Ok(())
}
