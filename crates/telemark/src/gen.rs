//! `telemark gen`: a capture of N flows with realistic sizes.

use crate::opts::{parse_duration_ns, LossOpts};
use anyhow::{Context, Result};
use clap::Args as ClapArgs;
use std::path::{Path, PathBuf};
use telemark_datapath::capture::CaptureWriter;
use telemark_datapath::gen::{self as g, GenConfig, SizeDist};

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

/// Runs `telemark gen`.
pub fn run(a: Args) -> Result<()> {
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
