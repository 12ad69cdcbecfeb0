//! `telemark sim`: a fleet on one machine (docs/scale.md). N simulated hosts publish to Kafka
//! what real agents would; K collectors in one consumer group store it into one PostgreSQL
//! database; the run reports the records and bytes the fleet sends, the group's lag, the rows
//! stored per second and how long `/flows`, `/loss` and `/localise` take meanwhile.
//!
//! A simulated host is an agent without packets: each batch period its counters (per flow, at
//! the VM's tap where traffic is marked and at the uplink) go through the agent's own loss
//! aggregation (`telemark_core::loss::Aggregator`, the loss paper's aggregator) as batch events,
//! and every summary interval it adds the summary, health and cost records an agent sends.
//! Records are numbered per host (agent, boot, seq) and published as the agent's Kafka output
//! does (`telemark_kafka::Message`, the idempotent producer); the hosts share one producer, as
//! ten thousand clients would not fit one machine, which changes nothing on the wire.

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use telemark_collector::kafka::{ConsumeConfig, KafkaFile};
use telemark_collector::{Collector, Config};
use telemark_core::loss::{Aggregator, BatchEvent, BatchEventKind, PointSpec};
use telemark_core::records::{CostRecord, HealthRecord, Record};
use telemark_kafka::{KafkaConfig, Kind, Message, Origin, Producer, SendError};
use telemark_transport::now_ns;
use telemark_wire::FlowKey;

/// `telemark sim` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Kafka brokers (host:port, comma-separated). Each run makes topics of its own (left on
    /// the brokers: `<run>.<time>.` prefixes).
    #[arg(long)]
    pub brokers: String,
    /// PostgreSQL URL whose role may create databases: each run stores into a database of its
    /// own (this URL's database name with `_sim_N_K` appended), dropped after the run.
    #[arg(long)]
    pub db: String,
    /// The PostgreSQL password, read from this file.
    #[arg(long)]
    pub db_password_file: Option<std::path::PathBuf>,
    /// Fleet sizes to run, in hosts.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000,10000")]
    pub hosts: Vec<usize>,
    /// Collector counts to run each fleet size with (one consumer group).
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub collectors: Vec<usize>,
    /// Flows each host measures.
    #[arg(long, default_value_t = 10)]
    pub flows: u32,
    /// Fraction of each host's flows that lose packets inside it (every batch).
    #[arg(long, default_value_t = 0.2)]
    pub lossy: f64,
    /// Packets per second of each flow.
    #[arg(long, default_value_t = 1000)]
    pub pps: u64,
    /// Fraction of a lossy flow's packets lost.
    #[arg(long, default_value_t = 0.01)]
    pub loss_rate: f64,
    /// Marking period (one batch per flow and period; docs/ebpf.md).
    #[arg(long, default_value = "1s", value_parser = super::opts::parse_duration_ns)]
    pub period: u64,
    /// Summary interval (summary, health and cost records; the agent's `export.summary_interval`).
    #[arg(long, default_value = "1s", value_parser = super::opts::parse_duration_ns)]
    pub summary_interval: u64,
    /// Seconds measured per run, after the consumer group has settled.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Partitions per topic.
    #[arg(long, default_value_t = 6)]
    pub partitions: usize,
    /// Most seconds to wait, after the hosts stop, for the group to store what is left.
    #[arg(long, default_value_t = 60)]
    pub drain: u64,
}

/// One simulated host.
struct Host {
    agent: String,
    boot: u64,
    seq: u64,
    agg: Aggregator,
    flows: Vec<FlowKey>,
    lossy: usize,
    ordinal: u32,
    next_batch_ns: u64,
    interval_start_ns: u64,
    next_summary_ns: u64,
    packets: u64,
}

/// The two points of a host: the VM's tap (marker) and the uplink, downstream of it (a
/// segment inside the host).
fn points(agent: &str) -> Vec<PointSpec> {
    let spec = |name: &str, port: &str, upstream: Option<u8>| PointSpec {
        name: name.into(),
        agent: agent.into(),
        port: port.into(),
        upstream,
        marker: upstream.is_none(),
        skew_ns: 0,
        upstream_label: None,
        every_batch: false,
    };
    vec![spec("ingress", "vnet0", None), spec("egress", "eth0", Some(0))]
}

/// Flow `f` of host `h`: from a VM address of the host to a service address.
fn flow(h: usize, f: u32) -> FlowKey {
    FlowKey {
        src: IpAddr::V4(Ipv4Addr::new(10, (h >> 8) as u8 & 0x7f, h as u8, 2)),
        dst: IpAddr::V4(Ipv4Addr::new(172, 16, (f >> 8) as u8, f as u8)),
        sport: 40000 + (f % 20000) as u16,
        dport: 443,
        proto: 6,
        spi: None,
        si: None,
    }
}

impl Host {
    fn new(h: usize, a: &Args, start_ns: u64, phase_ns: u64) -> Host {
        let agent = format!("sim-h{h:05}");
        // A view of one batch at the two points lies within the period (as the eBPF agent
        // allows half its guard).
        let agg = Aggregator::new(points(&agent), None, a.period / 2);
        let lossy = ((f64::from(a.flows) * a.lossy).round() as usize).min(a.flows as usize);
        Host {
            boot: start_ns,
            seq: 0,
            agg,
            flows: (0..a.flows).map(|f| flow(h, f)).collect(),
            lossy,
            ordinal: 0,
            next_batch_ns: start_ns + phase_ns,
            interval_start_ns: start_ns,
            next_summary_ns: start_ns + phase_ns + a.summary_interval,
            packets: 0,
            agent,
        }
    }

    /// The batch that ended at `end_ns` for every flow, at both points, through the
    /// aggregator; the records it resolved go to `out`.
    fn batch(&mut self, a: &Args, end_ns: u64, out: &mut Vec<Record>) {
        let sent = (a.pps as f64 * a.period as f64 / 1e9).round().max(1.0) as u32;
        let lost = ((f64::from(sent) * a.loss_rate).ceil() as u32).min(sent);
        let first_ns = end_ns - a.period;
        for (i, key) in self.flows.iter().enumerate() {
            let at_uplink = if i < self.lossy { sent - lost } else { sent };
            for (point, count, delay) in [(0u8, sent, 0u64), (1, at_uplink, 50_000)] {
                self.agg.handle(BatchEvent {
                    key: *key,
                    point,
                    kind: BatchEventKind::Closed,
                    color: (self.ordinal % 2) as u8,
                    ordinal: self.ordinal,
                    count,
                    first_ns: first_ns + delay,
                    last_ns: end_ns - 1_000 + delay,
                    tail: false,
                    head: false,
                    cut: false,
                    ttl: None,
                });
            }
            self.packets += u64::from(sent);
        }
        self.ordinal = self.ordinal.wrapping_add(1);
        while let Some(r) = self.agg.poll_record() {
            out.push(r);
        }
    }

    /// The interval's summaries, health and cost records.
    fn interval(&mut self, now: u64, out: &mut Vec<Record>) {
        out.extend(self.agg.summaries(self.interval_start_ns, now));
        out.push(Record::Health(HealthRecord {
            agent: self.agent.clone(),
            interval_start_ns: self.interval_start_ns,
            interval_end_ns: now,
            rx: self.packets,
            ..Default::default()
        }));
        out.push(Record::Cost(CostRecord {
            agent: self.agent.clone(),
            stage: "switch".into(),
            packets: self.packets,
            cycles: self.packets * 40,
            interval_ns: now - self.interval_start_ns,
        }));
        self.packets = 0;
        self.interval_start_ns = now;
    }
}

/// What one run measured.
#[derive(Debug, Default)]
struct Figures {
    sent: u64,
    bytes: u64,
    dropped: u64,
    failed: u64,
    seconds: f64,
    /// Host periods the generator started late by more than a period.
    late: u64,
    stored: u64,
    max_lag: u64,
    drain_s: f64,
    left: u64,
    flows_ms: Vec<f64>,
    loss_ms: Vec<f64>,
    localise_ms: Vec<f64>,
    db_bytes: u64,
    rows: u64,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn p95(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[(v.len() * 95 / 100).min(v.len() - 1)]
}

/// A sample of the collectors' /metrics (summed over them).
fn metric_sum(cs: &[Collector], name: &str) -> u64 {
    cs.iter()
        .filter_map(|c| super::bench_collector::metric(&format!("http://{}", c.addr), name).ok())
        .sum()
}

/// `url` with its database name replaced by `name`.
fn with_database(url: &str, name: &str) -> Result<String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let rest = base.strip_prefix("postgresql://").or_else(|| base.strip_prefix("postgres://"));
    let Some(rest) = rest else { bail!("--db: a postgresql:// URL") };
    let host = rest.split('/').next().unwrap_or(rest);
    Ok(format!("postgresql://{host}/{name}{query}"))
}

/// The database name of `url`, if it is one the runs' names can be made from (lower-case
/// letters, digits and `_`: it goes into CREATE DATABASE as it is).
fn database_of(url: &str) -> Result<String> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    if query.split('&').any(|p| p.starts_with("dbname=")) {
        bail!("--db: name the database in the URL's path, not with dbname=");
    }
    let after = base.split("://").nth(1).unwrap_or(base);
    let name = after.split_once('/').map_or("postgres", |(_, d)| d);
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    if name.is_empty() || name.len() > 40 || !name.chars().all(ok) {
        bail!(
            "--db: a database name of lower-case letters, digits and _ (40 at most), not {name:?}"
        );
    }
    Ok(name.to_string())
}

fn admin(a: &Args) -> Result<postgres::Client> {
    let mut cfg: postgres::Config = a.db.parse().context("--db")?;
    if let Some(f) = &a.db_password_file {
        let pw = std::fs::read_to_string(f).with_context(|| f.display().to_string())?;
        cfg.password(pw.trim_end_matches(['\n', '\r']));
    }
    cfg.connect(postgres::NoTls).context("connecting to --db")
}

/// The database of the run of `n` hosts and `k` collectors.
fn run_database(a: &Args, n: usize, k: usize) -> Result<String> {
    Ok(format!("{}_sim_{n}_{k}", database_of(&a.db)?))
}

/// One run: `n` hosts, `k` collectors.
fn run_one(a: &Args, n: usize, k: usize) -> Result<Figures> {
    let run = format!("sim_{n}_{k}");
    let db_name = run_database(a, n, k)?;
    let mut pg = admin(a)?;
    pg.batch_execute(&format!("DROP DATABASE IF EXISTS {db_name}"))?;
    pg.batch_execute(&format!("CREATE DATABASE {db_name}")).context("the role needs CREATEDB")?;
    let url = with_database(&a.db, &db_name)?;

    let stamp = now_ns() / 1_000_000;
    let mut kcfg = KafkaConfig::new(&a.brokers);
    kcfg.topic_prefix = format!("{run}.{stamp}.");
    kcfg.linger_ms = 20;
    let topics: Vec<String> = Kind::ALL.iter().map(|k| k.topic(&kcfg.topic_prefix)).collect();
    let plan =
        telemark_kafka::admin::TopicPlan { partitions: a.partitions, replication: 1, grow: false };
    telemark_kafka::admin::ensure_topics(&kcfg, &topics, plan, Duration::from_secs(30))
        .map_err(anyhow::Error::msg)?;

    let collectors: Vec<Collector> = (0..k)
        .map(|_| {
            let cfg = Config {
                listen: "127.0.0.1:0".parse().unwrap(),
                db: url.clone().into(),
                db_password_file: a.db_password_file.clone(),
                retention: Duration::ZERO,
                workers: 4,
                kafka: Some(KafkaFile {
                    kafka: kcfg.clone(),
                    publish: None,
                    consume: Some(ConsumeConfig { group: format!("{run}.{stamp}"), kinds: None }),
                }),
                ..Config::default()
            };
            Collector::start(&cfg).map_err(|e| anyhow::anyhow!("collector: {e}"))
        })
        .collect::<Result<_>>()?;
    let settle = Instant::now() + Duration::from_secs(60);
    while collectors.iter().any(|c| {
        super::bench_collector::metric(
            &format!("http://{}", c.addr),
            "telemark_collector_kafka_partitions",
        )
        .unwrap_or(0)
            == 0
    }) {
        if Instant::now() > settle {
            bail!("the consumer group did not settle in 60 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    let connect = || -> Result<postgres::Client> {
        let mut db: postgres::Config = url.parse()?;
        if let Some(p) = &a.db_password_file {
            let pw = std::fs::read_to_string(p)?;
            db.password(pw.trim_end_matches(['\n', '\r']));
        }
        Ok(db.connect(postgres::NoTls)?)
    };
    let size = |c: &mut postgres::Client| -> Result<u64> {
        let row = c.query_one("SELECT pg_database_size(current_database())", &[])?;
        Ok(row.get::<_, i64>(0) as u64)
    };
    // The schema's own size, before any record.
    let empty_db = size(&mut connect()?)?;
    let producer = Producer::new(&kcfg, true).map_err(anyhow::Error::msg)?;
    let start = now_ns();
    let mut hosts: Vec<Host> =
        (0..n).map(|h| Host::new(h, a, start, a.period * h as u64 / n as u64)).collect();
    let mut f = Figures::default();

    // Queries while the fleet runs: a flow of a lossy host, round robin over the collectors.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bases: Vec<String> = collectors.iter().map(|c| format!("http://{}", c.addr)).collect();
    let querier = {
        let stop = stop.clone();
        let key = flow(0, 0);
        let q = format!(
            "src={}&dst={}&sport={}&dport={}&proto={}",
            key.src, key.dst, key.sport, key.dport, key.proto
        );
        std::thread::spawn(move || {
            let mut times: [Vec<f64>; 3] = Default::default();
            let mut i = 0usize;
            // Let some records arrive first.
            std::thread::sleep(Duration::from_secs(3));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let base = &bases[i % bases.len()];
                for (slot, path) in [
                    (0, "/api/v1/flows?limit=100".to_string()),
                    (1, format!("/api/v1/loss?{q}")),
                    (2, format!("/api/v1/localise?{q}")),
                ] {
                    let t = Instant::now();
                    let get = ureq::get(&format!("{base}{path}")).timeout(Duration::from_secs(10));
                    if get.call().is_ok() {
                        times[slot].push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            times
        })
    };

    // A warm-up before the measured window: the aggregator holds each flow's first batches
    // back (it waits for the batches after them), and one summary interval must pass.
    let warm = Duration::from_nanos(3 * a.period + a.summary_interval) + Duration::from_secs(1);
    let mut t0 = Instant::now() + warm;
    let until = t0 + Duration::from_secs(a.seconds);
    let mut stored0 = None;
    // Every record the producer took, warm-up included (what the group must store).
    let mut total_sent = 0u64;
    let mut out = Vec::new();
    let mut next_sample = Instant::now();
    while Instant::now() < until {
        if stored0.is_none() && Instant::now() >= t0 {
            // The measured window starts: counts from here.
            stored0 = Some(metric_sum(&collectors, "telemark_collector_kafka_consumed_total"));
            f = Figures::default();
            t0 = Instant::now();
        }
        let now = now_ns();
        for h in hosts.iter_mut() {
            while h.next_batch_ns <= now {
                if now - h.next_batch_ns > a.period {
                    f.late += 1;
                }
                let end = h.next_batch_ns;
                h.batch(a, end, &mut out);
                h.next_batch_ns += a.period;
            }
            if h.next_summary_ns <= now {
                h.interval(now, &mut out);
                h.next_summary_ns += a.summary_interval;
            }
            for r in out.drain(..) {
                let m =
                    Message::new(&r, Origin { agent: h.agent.clone(), boot: h.boot, seq: h.seq });
                match producer.send(&m, h.seq) {
                    Ok(()) => {
                        f.sent += 1;
                        total_sent += 1;
                        f.bytes += (m.payload.len()
                            + m.key.len()
                            + m.headers().iter().map(|(k, v)| k.len() + v.len()).sum::<usize>())
                            as u64;
                        h.seq += 1;
                    }
                    Err(SendError::Full) => f.dropped += 1,
                    Err(SendError::Other(_)) => f.failed += 1,
                }
            }
        }
        for d in producer.deliveries() {
            if d.error.is_some() {
                f.failed += 1;
            }
        }
        if stored0.is_some() && Instant::now() >= next_sample {
            f.max_lag =
                f.max_lag.max(metric_sum(&collectors, "telemark_collector_kafka_consumer_lag"));
            next_sample = Instant::now() + Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f.seconds = t0.elapsed().as_secs_f64();
    let stored0 = stored0.unwrap_or(0);
    let consumed = || metric_sum(&collectors, "telemark_collector_kafka_consumed_total");
    f.stored = consumed().saturating_sub(stored0);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let times = querier.join().map_err(|_| anyhow::anyhow!("query thread"))?;
    [f.flows_ms, f.loss_ms, f.localise_ms] = times;

    // What is left: the group stores it, or the run says how much it could not.
    producer.flush(Duration::from_secs(30));
    let d0 = Instant::now();
    while consumed() < total_sent && d0.elapsed() < Duration::from_secs(a.drain) {
        std::thread::sleep(Duration::from_millis(250));
    }
    f.drain_s = d0.elapsed().as_secs_f64();
    f.left = total_sent.saturating_sub(consumed());
    let mut c = connect()?;
    f.db_bytes = size(&mut c)?.saturating_sub(empty_db);
    let row =
        c.query_one("SELECT (SELECT COUNT(*) FROM loss) + (SELECT COUNT(*) FROM other)", &[])?;
    f.rows = row.get::<_, i64>(0) as u64;
    drop(c);
    for c in collectors {
        c.stop();
    }
    pg.batch_execute(&format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"))?;
    Ok(f)
}

/// Runs the sweep and prints its table.
pub fn run(a: Args) -> Result<()> {
    if a.hosts.is_empty() || a.collectors.is_empty() || a.flows == 0 || a.seconds == 0 {
        bail!("--hosts, --collectors, --flows and --seconds must not be empty or 0");
    }
    if a.collectors.iter().any(|&k| k == 0 || k > a.partitions) {
        bail!("each --collectors count must be 1..=--partitions ({})", a.partitions);
    }
    println!(
        "telemark sim: {} flows a host ({:.0} % lossy, {} pkt/s each), batch period {} ms, \
         summary interval {} ms, {} s a run, {} partitions a topic",
        a.flows,
        a.lossy * 100.0,
        a.pps,
        a.period / 1_000_000,
        a.summary_interval / 1_000_000,
        a.seconds,
        a.partitions
    );
    println!(
        "| hosts | collectors | offered records/s | sent records/s | per host | bytes/s | stored rows/s | max lag | left after {}s | late periods | /flows ms p50 (p95) | /loss ms p50 (p95) | /localise ms p50 (p95) | database bytes/record |",
        a.drain
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &a.hosts {
        for &k in &a.collectors {
            let done = run_one(&a, n, k);
            if done.is_err() {
                // A run that failed leaves no database behind.
                if let (Ok(mut pg), Ok(db)) = (admin(&a), run_database(&a, n, k)) {
                    let _ = pg.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"));
                }
            }
            let mut f = done.with_context(|| format!("{n} hosts, {k} collectors"))?;
            let rate = f.sent as f64 / f.seconds;
            // Past the empty schema: the records' rows, indexes, keys and hourly sums.
            let per_record = f.db_bytes as f64 / f.rows.max(1) as f64;
            println!(
                "| {n} | {k} | {:.0} | {rate:.0} | {:.2} | {:.0} | {:.0} | {} | {} | {} | {:.1} ({:.1}) | {:.1} ({:.1}) | {:.1} ({:.1}) | {per_record:.0} |",
                (f.sent + f.dropped + f.failed) as f64 / f.seconds,
                rate / n as f64,
                f.bytes as f64 / f.seconds,
                f.stored as f64 / f.seconds,
                f.max_lag,
                f.left,
                f.late,
                median(&mut f.flows_ms),
                p95(&mut f.flows_ms),
                median(&mut f.loss_ms),
                p95(&mut f.loss_ms),
                median(&mut f.localise_ms),
                p95(&mut f.localise_ms),
            );
            if f.dropped + f.failed > 0 {
                println!(
                    "  ({} records refused by a full producer queue, {} failed)",
                    f.dropped, f.failed
                );
            }
            tracing::debug!(rows = f.rows, drain_s = f.drain_s, "run done");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_database_keeps_the_servers_address_and_parameters() {
        let url = "postgresql://postgres@%2Ftmp%2Fpg:5433/telemark?connect_timeout=5";
        assert_eq!(database_of(url).unwrap(), "telemark");
        assert_eq!(
            with_database(url, "telemark_sim_10_1").unwrap(),
            "postgresql://postgres@%2Ftmp%2Fpg:5433/telemark_sim_10_1?connect_timeout=5"
        );
        assert_eq!(database_of("postgres://u@h").unwrap(), "postgres");
        assert!(database_of("postgresql://h/My-Db").is_err());
        assert!(database_of("postgresql://h/t?dbname=other").is_err());
        assert!(with_database("telemark.db", "x").is_err());
    }

    /// A host's records come from the loss aggregator: a lossy flow's segment inside the
    /// host reports what the uplink missed, a clean one nothing.
    #[test]
    fn a_host_reports_its_lossy_flows_loss_inside_it() {
        let a = Args::try_parse_from(["sim", "--brokers", "b", "--db", "postgresql://h/d"]);
        let a = a.unwrap();
        let mut h = Host::new(3, &a, 1_000_000_000_000, 0);
        let mut out = Vec::new();
        for p in 1..=8 {
            h.batch(&a, 1_000_000_000_000 + p * a.period, &mut out);
        }
        let lost: Vec<_> = out
            .iter()
            .filter_map(|r| match r {
                Record::Loss(l) => Some((l.flow.sport, l.point.clone(), l.lost)),
                _ => None,
            })
            .collect();
        assert!(!lost.is_empty());
        // 2 of 10 flows lossy (sports 40000, 40001): 1 % of 1,000 packets a period.
        assert!(
            lost.iter().all(|(sport, point, n)| *sport < 40002 && point == "egress" && *n == 10),
            "{lost:?}"
        );
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    impl Args {
        fn try_parse_from<const N: usize>(argv: [&str; N]) -> Result<Args, clap::Error> {
            use clap::Parser;
            Cli::try_parse_from(argv).map(|c| c.args)
        }
    }
}
