//! `telemark demo`: the loss paper's congestion experiment (Fig. 3 / Fig. 5) on real kernel
//! queues. Builds the testbed (testbed/testbed.sh), starts a collector and the agents of
//! switches B and F, sends the probe flow A → G, turns iperf3 background traffic C → E on and
//! off across the tbf-shaped underlay link, and prints the probe flow's loss per second as
//! Telemark detected it next to the kernel's count. See docs/demo.md.

use crate::traffic::{self, FlowSpec};
use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use telemark_agent::{Agent, FileConfig};
use telemark_collector::api::Request;
use telemark_collector::{now_ns, Collector, Config};
use telemark_wire::FlowKey;

/// `telemark demo --int`: the INT experiment on the same testbed.
mod int;

const SCRIPT: &str = include_str!("../../../../testbed/testbed.sh");
const PROBE_PORT: u16 = 5201;

/// `telemark demo` flags.
#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// Probe flow alone at first, e.g. 15s.
    #[arg(long, default_value = "15s", value_parser = telemark_core::units::parse_duration_ns)]
    pub before: u64,
    /// Then background traffic on, congesting the underlay link (0: none).
    #[arg(long, default_value = "30s", value_parser = telemark_core::units::parse_duration_ns)]
    pub background: u64,
    /// Then background off again.
    #[arg(long, default_value = "15s", value_parser = telemark_core::units::parse_duration_ns)]
    pub after: u64,
    /// Probe flow rate, packets per second.
    #[arg(long, default_value_t = 10_000)]
    pub probe_pps: u64,
    /// Probe UDP payload, bytes.
    #[arg(long, default_value_t = 100)]
    pub probe_payload: usize,
    /// Background rate (iperf3 -b), e.g. 30M.
    #[arg(long, default_value = "20M")]
    pub background_rate: String,
    /// Rate of the tbf qdisc on the underlay link (tc syntax).
    #[arg(long, default_value = "25mbit")]
    pub tbf_rate: String,
    /// Random loss of the probe flow on the underlay link, per mille (nftables numgen), instead
    /// of or on top of congestion.
    #[arg(long, default_value_t = 0)]
    pub random_loss: u32,
    /// Collector address.
    #[arg(long, default_value = "127.0.0.1:9900")]
    pub listen: std::net::SocketAddr,
    /// Collector database (default: a fresh one in a temporary directory).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// The collector's Kafka settings (docs/kafka.md): publish every record it stores.
    #[arg(long)]
    pub kafka: Option<PathBuf>,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Exit when done instead of keeping the collector's page up until Ctrl-C.
    #[arg(long)]
    pub no_wait: bool,
    /// Stop the collector this long into the run and start it again 2 s later (tests that a
    /// restart loses and duplicates nothing).
    #[arg(long, value_parser = crate::cli::opts::parse_duration_ns)]
    pub restart_collector_at: Option<u64>,
    /// Let the probe's sender catch up after a stall by sending its whole backlog at once, as
    /// it once did: bursts that lose whole batches (docs/loss.md, "Whole batches lost").
    #[arg(long)]
    pub probe_bursts: bool,
    /// The INT demo instead (docs/int.md, "Demo"): INT source, transit and sink on a chain of
    /// three switches, per-hop latency and queue events while background traffic congests the
    /// transit's egress queue.
    #[arg(long)]
    pub int: bool,
    /// With --int: the transit's egress queue rate.
    #[arg(long, default_value = "10Mbit")]
    pub int_queue_rate: String,
    /// With --int: background packets per second (1,042-byte frames) while it is on.
    #[arg(long, default_value_t = 1500)]
    pub int_background_pps: u64,
}

/// One second of the experiment.
#[derive(Debug, Clone, Serialize)]
pub struct Second {
    /// Seconds since the start.
    pub t: u64,
    /// Start of the second, ns since the epoch.
    pub t_ns: u64,
    /// Whether background traffic ran during this second.
    pub background: bool,
    /// Probe packets lost on the link per the kernel (into the link minus out of it).
    pub truth_lost: u64,
    /// Probe packets lost as Telemark reported: sw-f ingress's batches lined up with sw-b
    /// egress's at the collector (`/api/v1/link`, which counts whole batches lost too),
    /// batches that entered the link this second (their first packet at sw-b).
    pub detected_lost: u64,
    /// What sw-f ingress alone reported, each batch against B.
    pub detected_against_b: u64,
    /// Packets of any flow the tbf qdisc dropped.
    pub tbf_drops: u64,
    /// How long the kernel counters took to read at the second's two ends (ns): when exactly
    /// they were read is that uncertain.
    pub truth_read_ns: u64,
}

/// The demo's results.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Per second.
    pub seconds: Vec<Second>,
    /// Probe packets sent.
    pub probe_sent: u64,
    /// Probe packets skipped because the sender was descheduled (a constant-rate probe does
    /// not catch up in one burst).
    pub probe_skipped: u64,
    /// Probe packets lost per the kernel, in total.
    pub truth_lost: u64,
    /// Of those, dropped by the random-loss rule.
    pub random_drops: u64,
    /// Probe packets lost as detected (`/api/v1/link`), in total.
    pub detected_lost: u64,
    /// What sw-f ingress alone reported in total, each batch against B.
    pub detected_against_b: u64,
    /// Batches `/api/v1/link` found lost whole (not one packet arrived).
    pub whole_batches_lost: u64,
    /// The collector's localisation verdict (`where`).
    pub verdict: Option<String>,
    /// Loss records the collector stored for the probe flow.
    pub loss_records: u64,
    /// Records the agents produced / the collector acknowledged, per agent.
    pub agents: BTreeMap<String, telemark_agent::AgentStats>,
    /// Records the collector stored per agent.
    pub stored: BTreeMap<String, u64>,
    /// Duplicate records the collector recognised (and did not store again).
    pub duplicates: u64,
}

/// A testbed script (embedded, written to a temporary file) and the arguments that come
/// before every command (chain.sh's name prefix); `down` when dropped.
pub(crate) struct Testbed {
    name: &'static str,
    script: tempfile::NamedTempFile,
    lead: Vec<String>,
}

impl Testbed {
    /// The script `text` (`name` in messages), run with `lead` before each command's
    /// arguments.
    pub(crate) fn new(name: &'static str, text: &str, lead: &[&str]) -> Result<Testbed> {
        let mut script = tempfile::NamedTempFile::new()?;
        std::io::Write::write_all(&mut script, text.as_bytes())?;
        Ok(Testbed { name, script, lead: lead.iter().map(|s| s.to_string()).collect() })
    }

    pub(crate) fn run(&self, args: &[&str]) -> Result<String> {
        let words: Vec<&str> = std::iter::once(self.name)
            .chain(self.lead.iter().map(String::as_str))
            .chain(args.iter().copied())
            .collect();
        let what = words.join(" ");
        let mut c = Command::new("bash");
        c.arg(self.script.path()).args(&self.lead).args(args);
        crate::cli::opts::output(&mut c, &what)
    }
    fn spawn(&self, args: &[&str]) -> Result<Child> {
        Command::new("bash")
            .arg(self.script.path())
            .args(&self.lead)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("running bash")
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = self.run(&["down"]);
    }
}

#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
struct Truth {
    probe_in: u64,
    probe_out: u64,
    random_drop: u64,
    all_in: u64,
    tbf_drops: u64,
    backlog: u64,
    t_ns: u64,
    read_ns: u64,
}

/// Probe packets lost by each sample's time: into the link, minus out of it, minus those
/// still queued in the tbf (its backlog times the probe's share of what entered the link in
/// the second before), plus the random-loss rule's drops.
fn lost_by(samples: &[(u64, Truth)]) -> Vec<f64> {
    let mut prev = Truth::default();
    samples
        .iter()
        .map(|(_, x)| {
            let all = x.all_in.saturating_sub(prev.all_in);
            let share = if all == 0 {
                0.0
            } else {
                x.probe_in.saturating_sub(prev.probe_in) as f64 / all as f64
            };
            prev = *x;
            x.probe_in as f64 - x.probe_out as f64 - x.backlog as f64 * share + x.random_drop as f64
        })
        .collect()
}

fn agent(toml: &str) -> Result<Agent> {
    let cfg = FileConfig::parse(toml)?.validate()?;
    Ok(Agent::start(cfg)?)
}

fn probe_key() -> FlowKey {
    FlowKey {
        src: "10.0.0.1".parse().expect("literal"),
        dst: "10.0.0.7".parse().expect("literal"),
        sport: 40000,
        dport: PROBE_PORT,
        proto: 17,
        spi: None,
        si: None,
    }
}

fn sleep_until(t_ns: u64, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let now = now_ns();
        if now >= t_ns {
            return;
        }
        std::thread::sleep(Duration::from_nanos((t_ns - now).min(50_000_000)));
    }
}

fn get_json(c: &Collector, url: &str) -> Result<serde_json::Value> {
    let r = c.api.handle(&Request::get(url), now_ns());
    if r.status != 200 {
        bail!("collector answered {} to {url}: {}", r.status, String::from_utf8_lossy(&r.body));
    }
    Ok(serde_json::from_slice(&r.body)?)
}

/// Runs the experiment and returns what it measured (the testbed is gone when this returns).
pub fn experiment(a: &Args, stop: Arc<AtomicBool>) -> Result<(Outcome, Option<Served>)> {
    // SAFETY: plain syscall without arguments.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the demo builds network namespaces: run it as root");
    }
    for tool in ["ip", "tc", "nft", "iperf3"] {
        let ok = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            bail!("`{tool}` is missing: apt-get install iproute2 nftables iperf3");
        }
    }
    let tb = Testbed::new("testbed.sh", SCRIPT, &[])?;
    eprintln!("demo: building the testbed (tbf {} on u1 → u2)", a.tbf_rate);
    tb.run(&["up", &a.tbf_rate])?;
    if a.random_loss > 0 {
        tb.run(&["loss", &a.random_loss.to_string()])?;
    }
    let dir = tempfile::tempdir()?;
    let db = a.db.clone().unwrap_or_else(|| dir.path().join("demo.db"));
    let ccfg = Config { listen: a.listen, db, kafka: kafka_file(a)?, ..Config::default() };
    let mut collector = Some(Collector::start(&ccfg)?);
    let url = format!("http://{}", a.listen);
    eprintln!("demo: collector on {url}");
    // Every batch, lossy or not, so that the collector can line sw-f's up with sw-b's.
    let export =
        format!("[export]\ncollector = \"{url}\"\ninterval = \"500ms\"\nreport_all = true\n");
    let sw_b = agent(&format!(
        "agent = \"sw-b\"\nnetns = \"tm-b\"\n[[pair]]\na = \"b-a\"\nb = \"b-u\"\nmark = \"a\"\n{export}"
    ))?;
    let sw_f = agent(&format!(
        "agent = \"sw-f\"\nnetns = \"tm-f\"\n[[pair]]\na = \"f-u\"\nb = \"f-g\"\nmark = \"b\"\n\
         upstream_a = \"sw-b/egress\"\n{export}"
    ))?;
    // Truth: the kernel's counters at every whole second.
    let start = (now_ns() / 1_000_000_000 + 1) * 1_000_000_000;
    let total = a.before + a.background + a.after;
    if total < 2_000_000_000 {
        bail!("the experiment needs at least 2 s in all (--before + --background + --after)");
    }
    let samples: Arc<Mutex<Vec<(u64, Truth)>>> = Arc::default();
    let sampler = {
        let (samples, stop, path) = (samples.clone(), stop.clone(), tb.script.path().to_owned());
        let end = start + total + 2_000_000_000;
        std::thread::spawn(move || {
            let mut t = start;
            while t <= end && !stop.load(Ordering::Relaxed) {
                sleep_until(t, &stop);
                let out = Command::new("bash").arg(&path).arg("truth").output();
                if let Some(v) =
                    out.ok().and_then(|o| serde_json::from_slice::<Truth>(&o.stdout).ok())
                {
                    if let Ok(mut s) = samples.lock() {
                        s.push((t, v));
                    }
                }
                t += 1_000_000_000;
            }
        })
    };
    sleep_until(start, &stop);
    eprintln!(
        "demo: probe A → G at {} pps; background C → E from {} s to {} s; {} s in all",
        a.probe_pps,
        a.before / 1_000_000_000,
        (a.before + a.background) / 1_000_000_000,
        total / 1_000_000_000
    );
    let probe = {
        let stop = stop.clone();
        let spec = FlowSpec {
            key: probe_key(),
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 7],
            payload: a.probe_payload,
            pps: a.probe_pps,
            catch_up: if a.probe_bursts { u64::MAX } else { traffic::catch_up(a.probe_pps) },
            churn: false,
        };
        let d = Duration::from_nanos(total);
        std::thread::spawn(move || traffic::send(Some("tm-a"), "a0", &spec, d, &stop))
    };
    let mut restart = a.restart_collector_at.map(|t| start + t);
    let bg_start = start + a.before;
    let bg_end = bg_start + a.background;
    let mut bg: Option<Child> = None;
    while now_ns() < start + total && !stop.load(Ordering::Relaxed) {
        let now = now_ns();
        if bg.is_none() && a.background > 0 && now >= bg_start && now < bg_end {
            eprintln!("demo: background on");
            tb.run(&["iperf-server"])?;
            let secs = format!("{:.1}", (bg_end - now) as f64 / 1e9);
            bg = Some(tb.spawn(&["iperf-client", &secs, &a.background_rate])?);
        }
        if let Some(t) = restart.filter(|t| now >= *t) {
            restart = None;
            eprintln!("demo: stopping the collector for 2 s");
            if let Some(c) = collector.take() {
                c.stop();
            }
            std::thread::sleep(Duration::from_secs(2));
            collector = Some(Collector::start(&ccfg)?);
            eprintln!(
                "demo: collector back ({} ms late)",
                (now_ns() - t - 2_000_000_000) / 1_000_000
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(mut c) = bg.take() {
        let _ = c.wait();
    }
    let traffic::Sent { sent, skipped } =
        probe.join().map_err(|_| anyhow::anyhow!("probe sender panicked"))??;
    if skipped > 0 {
        eprintln!(
            "demo: the probe skipped {skipped} packets it fell behind on (the machine was busy)"
        );
    }
    let _ = sampler.join();
    eprintln!("demo: probe sent {sent} packets; stopping agents (they export what is left)");
    let mut agents = BTreeMap::new();
    agents.insert("sw-b".to_string(), sw_b.stop());
    agents.insert("sw-f".to_string(), sw_f.stop());
    drop(tb);
    let c = collector.context("collector not running")?;
    let k = probe_key();
    let flow = format!("src={}&dst={}&sport={}&dport={}&proto=17", k.src, k.dst, k.sport, k.dport);
    // Fine buckets, summed over the windows between the kernel counters' actual read times.
    let series = get_json(&c, &format!("/api/v1/loss?{flow}&bucket_ns=10000000"))?;
    let loc = get_json(&c, &format!("/api/v1/localise?{flow}"))?;
    let agent_rows = get_json(&c, "/api/v1/agents")?;
    let link = get_json(&c, &format!("/api/v1/link?{flow}&up=sw-b/egress&down=sw-f/ingress"))?;
    let mut against_b: BTreeMap<u64, u64> = BTreeMap::new();
    let mut loss_records = 0;
    for p in series["series"].as_array().into_iter().flatten() {
        if p["agent"] == "sw-f" && p["point"] == "ingress" {
            *against_b.entry(p["t_ns"].as_u64().unwrap_or(0)).or_default() +=
                p["lost"].as_u64().unwrap_or(0);
        }
        loss_records += p["batches"].as_u64().unwrap_or(0);
    }
    // Each batch's loss dated by when it entered the link, as the kernel's counters at the
    // link's entry (the tbf queue drops there) date it.
    let mut linked: BTreeMap<u64, u64> = BTreeMap::new();
    for b in link["batches"].as_array().into_iter().flatten() {
        *linked.entry(b["sent_ns"].as_u64().unwrap_or(0)).or_default() +=
            b["lost"].as_u64().unwrap_or(0);
    }
    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let lost = lost_by(&samples);
    let seconds: Vec<Second> = samples
        .windows(2)
        .zip(lost.windows(2))
        .map(|(w, l)| {
            let ((t0, a0), (_, a1)) = (w[0], w[1]);
            let window = a0.t_ns..a1.t_ns;
            Second {
                t: (t0 - start) / 1_000_000_000,
                t_ns: t0,
                background: t0 >= bg_start && t0 < bg_end,
                truth_lost: (l[1] - l[0]).round().max(0.0) as u64,
                detected_lost: linked.range(window.clone()).map(|(_, v)| v).sum(),
                detected_against_b: against_b.range(window).map(|(_, v)| v).sum(),
                tbf_drops: a1.tbf_drops.saturating_sub(a0.tbf_drops),
                truth_read_ns: a0.read_ns + a1.read_ns,
            }
        })
        .collect();
    let last = samples.last().map(|s| s.1).unwrap_or_default();
    let mut stored = BTreeMap::new();
    for r in agent_rows.as_array().into_iter().flatten() {
        if let Some(name) = r["agent"]["agent"].as_str() {
            stored.insert(name.to_string(), r["agent"]["records"].as_u64().unwrap_or(0));
        }
    }
    let metrics = c.api.handle(&Request::get("/metrics"), now_ns());
    let duplicates = String::from_utf8_lossy(&metrics.body)
        .lines()
        .find_map(|l| l.strip_prefix("telemark_collector_duplicates_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let outcome = Outcome {
        probe_sent: sent,
        probe_skipped: skipped,
        truth_lost: last.probe_in.saturating_sub(last.probe_out) + last.random_drop,
        random_drops: last.random_drop,
        detected_lost: linked.values().sum(),
        detected_against_b: against_b.values().sum(),
        whole_batches_lost: link["whole_batches_lost"].as_u64().unwrap_or(0),
        verdict: loc["verdict"]["where"].as_str().map(str::to_string),
        loss_records,
        seconds,
        agents,
        stored,
        duplicates,
    };
    Ok((outcome, Some(Served { collector: c, _db_dir: dir })))
}

/// Prints the timeline.
fn print(o: &Outcome) {
    println!("  t  background  lost(kernel)  lost(telemark)  (vs B)  tbf drops (all flows)");
    for s in &o.seconds {
        println!(
            "{:>3}  {:>10}  {:>12}  {:>14}  {:>6}  {:>10}",
            s.t,
            if s.background { "on" } else { "" },
            s.truth_lost,
            s.detected_lost,
            s.detected_against_b,
            s.tbf_drops
        );
    }
    println!(
        "probe: {} sent, {} lost per the kernel ({} by the random-loss rule), {} detected \
         ({} batches lost whole; {} by sw-f alone against B)",
        o.probe_sent,
        o.truth_lost,
        o.random_drops,
        o.detected_lost,
        o.whole_batches_lost,
        o.detected_against_b
    );
    println!("where: {}", o.verdict.as_deref().unwrap_or("no loss localised"));
}

/// The collector a demo leaves serving its page, and the temporary directory of its database
/// (removed after the collector stops; before, the page's every query failed once the
/// experiment had ended).
pub struct Served {
    /// The collector.
    pub collector: Collector,
    /// Where its database is, unless `--db` said.
    pub _db_dir: tempfile::TempDir,
}

/// Runs the demo.
pub fn run(a: Args) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    ctrlc::set_handler(move || s.store(true, Ordering::Release))
        .context("installing the Ctrl-C handler")?;
    let c = if a.int {
        int::run(&a, stop.clone())?
    } else {
        let (o, c) = experiment(&a, stop.clone())?;
        print(&o);
        if let Some(p) = &a.json {
            std::fs::write(p, serde_json::to_vec_pretty(&o)?)
                .with_context(|| format!("writing {}", p.display()))?;
        }
        c
    };
    if let Some(c) = c {
        if !a.no_wait && !stop.load(Ordering::Relaxed) {
            eprintln!("demo: page at http://{}/ — Ctrl-C to quit", c.collector.addr);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        c.collector.stop();
    }
    Ok(())
}

/// The collector's `--kafka` file, read.
pub fn kafka_file(a: &Args) -> Result<Option<telemark_collector::kafka::KafkaFile>> {
    a.kafka
        .as_deref()
        .map(telemark_collector::kafka::KafkaFile::load)
        .transpose()
        .map_err(anyhow::Error::msg)
}
