//! `telemark agent`: the loss monitor on live interfaces (docs/agent.md).

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::path::PathBuf;
use telemark_agent::config::{FileConfig, MarkSide, PairConfig, TapConfig};
use telemark_agent::Agent;

/// `telemark agent` flags. Flags add to (or override) what the config file says.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// TOML configuration (see examples/agent.toml).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Agent name in records (overrides the file).
    #[arg(long)]
    pub name: Option<String>,
    /// Network namespace of the ports (a name under /run/netns).
    #[arg(long)]
    pub netns: Option<String>,
    /// Forward between two ports, both ways: A,B or A,B,MARK with MARK = a|b|both|none (which
    /// side's arriving traffic this switch colors). Repeatable.
    #[arg(long, value_name = "A,B[,MARK]")]
    pub pair: Vec<String>,
    /// Observe a port without forwarding. Repeatable.
    #[arg(long, value_name = "PORT")]
    pub tap: Vec<String>,
    /// Watch only matching flows, e.g. dst=10.0.0.7/32,proto=udp,dport=5201. Repeatable.
    #[arg(long, value_name = "RULE")]
    pub watch: Vec<String>,
    /// Collector URL (http://host:port); without one, records go to stdout as JSON lines.
    #[arg(long)]
    pub collector: Option<String>,
}

fn pair(s: &str) -> Result<PairConfig> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let mark = match parts.get(2).copied() {
        None | Some("none") => MarkSide::None,
        Some("a") => MarkSide::A,
        Some("b") => MarkSide::B,
        Some("both") => MarkSide::Both,
        Some(m) => bail!("--pair {s}: mark {m:?} is not a, b, both or none"),
    };
    match parts[..] {
        [a, b] | [a, b, _] => {
            Ok(PairConfig { a: a.into(), b: b.into(), mark, upstream_a: None, upstream_b: None })
        }
        _ => bail!("--pair {s}: write A,B or A,B,MARK"),
    }
}

/// Builds the configuration from the file and the flags.
pub fn config(a: &Args) -> Result<telemark_agent::AgentConfig> {
    let mut f = match &a.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    if let Some(n) = &a.name {
        f.agent = n.clone();
    }
    if f.agent.is_empty() {
        bail!("give the agent a name: --name or `agent = ...` in the config");
    }
    if a.netns.is_some() {
        f.netns = a.netns.clone();
    }
    for p in &a.pair {
        f.pair.push(pair(p)?);
    }
    for t in &a.tap {
        f.tap.push(TapConfig { port: t.clone(), upstream: None });
    }
    if let Some(c) = &a.collector {
        f.export.get_or_insert_with(Default::default).collector = Some(c.clone());
    }
    let mut cfg = f.validate()?;
    for w in &a.watch {
        cfg.watch.rules.push(w.parse().with_context(|| format!("--watch {w}"))?);
    }
    Ok(cfg)
}

/// Runs the agent until SIGINT or SIGTERM (then closes every batch, exports what is left and
/// exits 0); SIGHUP reads the configuration again and applies its watch rules and export
/// settings (docs/agent.md, "Signals").
pub fn run(a: Args) -> Result<()> {
    let cfg = config(&a)?;
    let name = cfg.agent.clone();
    // Before the agent starts, so that an early SIGTERM still stops it cleanly.
    let mut signals =
        Signals::new([SIGINT, SIGTERM, SIGHUP]).context("installing signal handlers")?;
    let agent = Agent::start(cfg).context("starting the agent")?;
    let metrics =
        agent.metrics_addr().map(|a| format!(", /metrics on http://{a}")).unwrap_or_default();
    tracing::info!("agent {name} running{metrics} (SIGTERM or Ctrl-C stops, SIGHUP reloads)");
    for sig in signals.forever() {
        if sig != SIGHUP {
            break;
        }
        match config(&a).map_err(|e| format!("{e:#}")).and_then(|c| agent.reload(c)) {
            Ok(changed) if changed.is_empty() => tracing::info!("reloaded: nothing changed"),
            Ok(changed) => tracing::info!("reloaded: {} changed", changed.join(", ")),
            Err(e) => tracing::warn!("reload refused, running as before: {e}"),
        }
    }
    tracing::info!("agent {name} stopping: closing batches, exporting what is left");
    let s = agent.stop();
    tracing::info!("agent {name} stopped: {}", serde_json::to_string(&s)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: Args,
    }

    fn cfg(args: &[&str]) -> Result<telemark_agent::AgentConfig> {
        config(&Cli::try_parse_from(std::iter::once("agent").chain(args.iter().copied()))?.a)
    }

    /// Flags alone make a whole configuration; bad flags say which one.
    #[test]
    fn flags_build_a_configuration() {
        let c = cfg(&[
            "--name",
            "sw-x",
            "--pair",
            "p0,p1,b",
            "--tap",
            "t0",
            "--watch",
            "dport=5201",
            "--collector",
            "http://127.0.0.1:1",
        ])
        .unwrap();
        assert_eq!((c.pairs[0].a.as_str(), c.pairs[0].mark), ("p0", MarkSide::B));
        assert_eq!(c.taps[0].port, "t0");
        assert_eq!(c.watch.rules[0].dport, Some(5201));
        assert_eq!(c.collector.as_deref(), Some("http://127.0.0.1:1"));
        for (bad, want) in [
            (&["--pair", "p0,p1"][..], "name"),
            (&["--name", "s", "--pair", "p0"], "A,B"),
            (&["--name", "s", "--pair", "p0,p1,up"], "mark"),
            (&["--name", "s", "--tap", "t0", "--watch", "port=1"], "--watch"),
        ] {
            let e = format!("{:#}", cfg(bad).unwrap_err());
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }
}
