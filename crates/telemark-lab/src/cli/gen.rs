//! `telemark gen`: a capture of N flows with realistic sizes.

use crate::cli::opts::{parse_duration_ns, LossOpts};
use crate::gen::{self as g, GenConfig, SizeDist};
use anyhow::{Context, Result};
use clap::Args as ClapArgs;
use std::path::{Path, PathBuf};
use telemark_datapath::capture::CaptureWriter;

/// `telemark gen` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Output pcap file.
    #[arg(short, long, value_name = "FILE")]
    pub out: PathBuf,
    /// Number of flows.
    #[arg(long, default_value_t = 200)]
    pub flows: usize,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Span the flows are spread over, e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = parse_duration_ns)]
    pub duration: u64,
    /// Flow sizes, one per line in bytes (default: the CAIDA 2019 distribution in
    /// shared/testdata, or a Pareto fit when absent).
    #[arg(long, value_name = "FILE")]
    pub sizes: Option<PathBuf>,
    /// Cap on packets per flow.
    #[arg(long, default_value_t = 5000)]
    pub max_packets: u64,
    /// Share of IPv6 flows.
    #[arg(long, default_value_t = 0.1)]
    pub ipv6_share: f64,
    /// Color the packets (alternate marking), as a first hop would.
    #[arg(long)]
    pub mark: bool,
    /// The active-flow-selection trace instead: --flows long-lived mice (100 packets/s each)
    /// from the start, then N elephants (10,000 packets/s each) from 3/8 of --duration on, to
    /// its end. Replay it with a table smaller than --flows, with and without --select-top.
    #[arg(long, value_name = "N", conflicts_with = "sizes")]
    pub elephants: Option<usize>,
    /// The INT paper's microburst trace instead (its Figs. 4/5; docs/int.md, "Pre-filtering"):
    /// MODEL is web, cache or hadoop (Zhang et al., IMC 2017). One UDP flow of INT packets
    /// (one every --every) through a switch port whose queue fills in bursts; each carries the
    /// queueing delay it met as its hop latency.
    #[arg(long, value_name = "MODEL", conflicts_with_all = ["sizes", "elephants"])]
    pub bursts: Option<String>,
    /// With --bursts: packets (the paper's traces have 200,000).
    #[arg(long, default_value_t = 200_000, requires = "bursts")]
    pub packets: usize,
    /// With --bursts: one INT packet this often (Zhang et al. sampled every 25 us), or
    /// `period`: one at the end of each burst and each gap, as the INT paper's traces.
    #[arg(long, default_value = "25us", value_parser = every, requires = "bursts")]
    pub every: u64,
    /// With --bursts: the port's line rate.
    #[arg(long, default_value = "10Gbit", value_parser = telemark_core::units::parse_rate_bps, requires = "bursts")]
    pub line_rate: u64,
    #[command(flatten)]
    pub loss: LossOpts,
}

/// The default flow-size file, found at run time (no build path is compiled in): under
/// `$TELEMARK_TESTDATA` if set, else `shared/testdata` beside the working directory (a
/// checkout's root, with `../shared` next to it).
pub fn default_sizes() -> Option<PathBuf> {
    const FILE: &str = "flow-sizes/caida-2019-0117-dirA-tcp-flow-bytes.txt";
    let set = std::env::var_os("TELEMARK_TESTDATA").map(|d| PathBuf::from(d).join(FILE));
    let beside = PathBuf::from("../shared/testdata").join(FILE);
    set.into_iter().chain([beside]).find(|p| p.is_file())
}

/// Loads the size distribution the flags ask for.
pub fn load_sizes(path: Option<&Path>, seed: u64) -> Result<SizeDist> {
    match path.map(Path::to_path_buf).or_else(default_sizes) {
        Some(p) => {
            let (d, bad) =
                SizeDist::load(&p).with_context(|| format!("flow sizes {}", p.display()))?;
            if bad > 0 {
                eprintln!("telemark: {}: skipped {bad} unreadable lines", p.display());
            }
            Ok(d)
        }
        None => Ok(SizeDist::pareto(seed)),
    }
}

/// `--every`: a duration, or `period` (0).
fn every(s: &str) -> Result<u64, String> {
    match s {
        "period" => Ok(0),
        d => match parse_duration_ns(d)? {
            0 => Err("--every: more than zero, or `period`".into()),
            v => Ok(v),
        },
    }
}

/// `telemark gen --bursts MODEL`: the INT paper's pre-filtering trace.
fn bursts(a: &Args, name: &str) -> Result<()> {
    use crate::bursts::{self, MODELS};
    use telemark_wire::int::{Field, Hop, Instructions};
    use telemark_wire::int_frame::{insert, Signal, Source};
    let Some(model) = MODELS.iter().find(|m| m.name == name) else {
        let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        anyhow::bail!("--bursts {name:?}: one of {}", names.join(", "));
    };
    if a.packets == 0 {
        anyhow::bail!("--packets must be at least 1");
    }
    let key = telemark_wire::FlowKey {
        src: "10.0.0.1".parse().expect("literal"),
        dst: "10.0.1.1".parse().expect("literal"),
        sport: 40000,
        dport: 5201,
        proto: 17,
        spi: None,
        si: None,
    };
    let plain = telemark_wire::flow::build_frame(&key, 64, 0, 64);
    let source = Source {
        signal: Signal::default(),
        instructions: Instructions::of(&[Field::NodeId, Field::HopLatency, Field::QueueOccupancy]),
        max_hops: 8,
        domain_id: 0,
    };
    let trace = bursts::trace(model, a.packets, a.every, a.line_rate, a.seed);
    let start_ns = 1_700_000_000_000_000_000u64;
    let mut w = CaptureWriter::create(&a.out)?;
    for p in &trace {
        let mut hop = Hop::default();
        hop.set(Field::NodeId, 1);
        hop.set(Field::HopLatency, p.delay_ns.min(u64::from(u32::MAX - 1)));
        hop.set(Field::QueueOccupancy, p.queue_bytes.min(0xff_fffe));
        let mut f = plain.clone();
        insert(&mut f, &source, &hop, 1500)?;
        w.write(start_ns + p.t_ns, &f)?;
    }
    w.finish()?;
    let in_burst = trace.iter().filter(|p| p.in_burst).count();
    let max_delay = trace.iter().map(|p| p.delay_ns).max().unwrap_or(0);
    println!(
        "wrote {}: {} INT packets of the {} model over {:.1} ms, {:.1} % in bursts, \
         queueing delay up to {:.1} us",
        a.out.display(),
        trace.len(),
        model.name,
        trace.last().map_or(0, |p| p.t_ns) as f64 / 1e6,
        in_burst as f64 * 100.0 / trace.len() as f64,
        max_delay as f64 / 1e3
    );
    Ok(())
}

/// Runs `telemark gen`.
pub fn run(a: Args) -> Result<()> {
    if let Some(m) = &a.bursts {
        return bursts(&a, m);
    }
    if !(0.0..=1.0).contains(&a.ipv6_share) {
        anyhow::bail!("--ipv6-share must be in 0..=1, not {}", a.ipv6_share);
    }
    if a.flows == 0 {
        anyhow::bail!("--flows must be at least 1");
    }
    let loss = a.loss.config()?;
    let dist = load_sizes(a.sizes.as_deref(), a.seed)?;
    let cfg = GenConfig {
        flows: a.flows,
        seed: a.seed,
        duration_ns: a.duration,
        max_packets: a.max_packets.max(1),
        ipv6_share: a.ipv6_share,
        mark: a.mark.then_some(loss),
        ..GenConfig::default()
    };
    let plans = match a.elephants {
        None => g::plan(&cfg, &dist),
        Some(n) => {
            let cfg = GenConfig { max_packets: u64::MAX, ..cfg.clone() };
            g::mice_then_elephants(&cfg, a.flows, 10_000_000, n, 100_000, a.duration / 8 * 3)
        }
    };
    let pkts = g::packets(&cfg, &plans);
    let mut w = CaptureWriter::create(&a.out)?;
    for p in &pkts {
        w.write(p.ts_ns, &p.data)?;
    }
    w.finish()?;
    let bytes: usize = pkts.iter().map(|p| p.data.len()).sum();
    let source = match a.elephants {
        None => dist.source,
        Some(n) => format!("{} mice then {n} elephants", a.flows),
    };
    println!(
        "wrote {}: {} flows, {} packets, {} bytes, sizes from {}{}",
        a.out.display(),
        plans.len(),
        pkts.len(),
        bytes,
        source,
        if a.mark { ", marked" } else { "" }
    );
    Ok(())
}
