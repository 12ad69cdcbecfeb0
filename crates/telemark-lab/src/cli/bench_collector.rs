//! `telemark bench-collector`: how many records per second one collector stores, acknowledged,
//! with the collector pinned to one core and senders on the others; with `--query-batches N`,
//! how long the API's queries take over a database of N stored batches instead
//! (docs/collector.md, "Performance"). With `--against OTHER_BINARY` the same load runs against
//! another build's collector too, alternating, so two builds compare in one run.

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use telemark_core::records::{Flow, LossRecord, Record, Scope};
use telemark_transport::exporter::Exporter;
use telemark_transport::now_ns;

/// `telemark bench-collector` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Seconds of load per round.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Rounds per binary (the median is printed).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Sending threads (each one agent).
    #[arg(long, default_value_t = 2)]
    pub senders: usize,
    /// Records per request.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// The core the collector is pinned to.
    #[arg(long, default_value_t = 1)]
    pub cpu: usize,
    /// Another `telemark` binary whose collector runs the same load, alternating with this one.
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// Time queries instead, over a database of this many loss records (batches) spread over
    /// the last 7 days, 1,000 per flow, one in ten lossy.
    #[arg(long)]
    pub query_batches: Option<u64>,
    /// With --query-batches: fill this database file, and keep it (the console's figures in
    /// docs/console.md are timed on it); an existing file is used as it is.
    #[arg(long)]
    pub query_db: Option<PathBuf>,
}

pub(crate) struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `exe collector` on a fresh database, pinned to `cpu`; returns it and its base URL.
fn start(exe: &std::path::Path, db: &std::path::Path, cpu: usize) -> Result<(Proc, String)> {
    start_with(exe, db, cpu, &[])
}

/// [`start`], with `extra` arguments.
pub(crate) fn start_with(
    exe: &std::path::Path,
    db: &std::path::Path,
    cpu: usize,
    extra: &[&std::ffi::OsStr],
) -> Result<(Proc, String)> {
    let mut cmd = Command::new(exe);
    cmd.args(["collector", "--listen", "127.0.0.1:0", "--retention", "0", "--db"])
        .arg(db)
        .args(extra)
        // Its log says where it listens (at info): whatever the caller's TELEMARK_LOG.
        .env("TELEMARK_LOG", "info")
        .stderr(Stdio::piped());
    // SAFETY: sched_setaffinity on the child itself, between fork and exec; async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            Ok(())
        });
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {}", exe.display()))?;
    let mut err = BufReader::new(child.stderr.take().context("collector stderr")?);
    let mut line = String::new();
    let url = loop {
        line.clear();
        if err.read_line(&mut line)? == 0 {
            bail!("{} did not say where it listens", exe.display());
        }
        if let Some(url) = line.split_whitespace().find(|w| w.starts_with("http://")) {
            break url.to_string();
        }
    };
    // Keep reading its log so that it never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    Ok((Proc(child), url))
}

/// The value of `name` on the collector's `/metrics` page.
pub(crate) fn metric(url: &str, name: &str) -> Result<u64> {
    let text = ureq::get(&format!("{url}/metrics")).call()?.into_string()?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64))
}

pub(crate) fn record(agent: &str, batch: u64, t: u64) -> Record {
    Record::Loss(LossRecord {
        agent: agent.into(),
        port: "p1".into(),
        point: "ingress".into(),
        upstream: None,
        flow: Flow {
            src: "10.0.0.1".into(),
            dst: "10.0.0.7".into(),
            sport: 40_000 + (batch % 1000) as u16,
            dport: 5201,
            proto: 17,
            spi: None,
            si: None,
        },
        color: (batch % 2) as u8,
        batch,
        period_ns: None,
        first_ns: t,
        last_ns: t + 1_000_000,
        expected: Some(100),
        observed: 99,
        lost: 1,
        late: 0,
        uncertain: 0,
        scope: Scope::Path,
        tail: false,
        incomplete: false,
        drops: Vec::new(),
        ttl: None,
        own_colour: 0,
    })
}

/// Records per second `senders` agents got acknowledged by the collector at `url`.
fn load(url: &str, a: &Args) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let threads: Vec<_> = (0..a.senders)
        .map(|i| {
            let (url, batch) = (url.to_string(), a.batch);
            std::thread::spawn(move || -> Result<u64> {
                let name = format!("bench-{i}");
                let mut ex = Exporter::new(&url, &name, now_ns(), batch * 2);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let t = now_ns() - 60_000_000_000;
                    for _ in 0..batch {
                        ex.push(record(&name, n, t));
                        n += 1;
                    }
                    ex.flush().map_err(|e| anyhow::anyhow!("{e}"))?;
                }
                Ok(ex.acked)
            })
        })
        .collect();
    let started = Instant::now();
    let mut acked = 0;
    for t in threads {
        acked += t.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
    }
    Ok(acked as f64 / started.elapsed().as_secs_f64())
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A database of `n` loss records of `n / 1000` flows at 16 points over the last 7 days, made with the store
/// itself (an agent would take hours to send them).
fn fill(db: &std::path::Path, n: u64) -> Result<()> {
    let mut st = telemark_collector::store::Store::open(db)?;
    let now = now_ns();
    st.register("bench", "bench", 1, now)?;
    let span = 7 * 24 * 3600 * 1_000_000_000u64;
    let flows = (n / 1000).max(1);
    let chunk = 20_000u64;
    let mut seq = 0;
    while seq < n {
        let recs: Vec<Record> = (seq..(seq + chunk).min(n))
            .map(|k| {
                // Batch k belongs to flow k % flows, at a time spread evenly over the span.
                let t = now - span + k * (span / n);
                let mut r = record("bench", k / flows, t);
                if let Record::Loss(l) = &mut r {
                    let f = k % flows;
                    l.flow.src = format!("10.{}.{}.1", f / 256 % 256, f % 256);
                    l.flow.sport = 1024 + (f / 65536) as u16;
                    l.lost = u64::from(k % 10 == 0);
                    // Sixteen points: the overview's segments.
                    l.point = format!("p{}", f % 16);
                    l.observed = 100 - l.lost;
                }
                r
            })
            .collect();
        st.ingest("bench", 1, seq, &recs, 0, now)?;
        seq += recs.len() as u64;
    }
    Ok(())
}

/// Median milliseconds of `rounds` GETs of `path`.
fn time_get(url: &str, path: &str, rounds: usize) -> Result<f64> {
    let http = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
    let mut ms = Vec::new();
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        let r = http.get(&format!("{url}{path}")).call().with_context(|| path.to_string())?;
        let _ = r.into_string()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(&mut ms))
}

/// Times the API's queries over a database of `n` batches, for each binary.
fn queries(a: &Args, bins: &[(String, PathBuf)], n: u64) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = a.query_db.clone().unwrap_or_else(|| dir.path().join("q.db"));
    if !db.exists() {
        let t = Instant::now();
        fill(&db, n)?;
        eprintln!("{n} batches stored in {:.0} s", t.elapsed().as_secs_f64());
    }
    let hour_ago = now_ns() - 3_600_000_000_000;
    let week_ago = now_ns() - 7 * 24 * 3_600_000_000_000;
    let paths = [
        "/api/v1/flows".to_string(),
        format!("/api/v1/flows?since_ns={hour_ago}"),
        format!("/api/v1/flows?since_ns={week_ago}"),
        "/api/v1/loss?src=10.0.7.1&dst=10.0.0.7&sport=1024&dport=5201&proto=17".to_string(),
        // The console's overview: a week in 2-hour buckets (the hourly sums), an hour in
        // 30-second buckets (the records); its list of flows that lost.
        format!("/api/v1/overview?since_ns={week_ago}&bucket_ns=7200000000000&top=100"),
        format!("/api/v1/overview?since_ns={hour_ago}&bucket_ns=30000000000&top=100"),
        format!("/api/v1/flows?since_ns={week_ago}&lossy=true&limit=500"),
    ];
    println!("query latency, {n} stored batches of {} flows over 7 days, collector pinned to cpu {}, median of {} rounds:", n / 1000, a.cpu, a.rounds.max(1));
    for (name, exe) in bins {
        // Each binary on its own copy: a newer build may add tables to the file.
        let copy = dir.path().join("copy.db");
        std::fs::copy(&db, &copy)?;
        let (_proc, url) = start(exe, &copy, a.cpu)?;
        for p in &paths {
            println!("  {name}: GET {p}: {:.1} ms", time_get(&url, p, a.rounds)?);
        }
    }
    Ok(())
}

/// Runs the rounds and prints one line per binary.
pub fn run(a: Args) -> Result<()> {
    let this = std::env::current_exe()?;
    let mut bins = vec![("this build".to_string(), this)];
    if let Some(o) = &a.against {
        bins.push((o.display().to_string(), o.clone()));
    }
    if let Some(n) = a.query_batches {
        return queries(&a, &bins, n);
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); bins.len()];
    for round in 0..a.rounds.max(1) {
        for (i, (name, exe)) in bins.iter().enumerate() {
            let dir = tempfile::tempdir()?;
            let (_proc, url) = start(exe, &dir.path().join("bench.db"), a.cpu)?;
            let r = load(&url, &a)?;
            eprintln!("round {round}: {name}: {r:.0} records/s");
            rates[i].push(r);
        }
    }
    println!(
        "collector ingest, pinned to cpu {}, {} senders, {} records per request:",
        a.cpu, a.senders, a.batch
    );
    for ((name, _), r) in bins.iter().zip(&mut rates) {
        println!("  {name}: median {:.0} records/s over {} rounds", median(r), r.len());
    }
    Ok(())
}
