//! Flags shared by every command that runs the loss monitor.

use anyhow::{bail, Context, Result};
use clap::Args;
use telemark_core::loss::LossConfig;

/// The loss parameters: the same flags everywhere.
#[derive(Args, Debug, Clone)]
pub struct LossOpts {
    /// Packets per color, B (count-based marking).
    #[arg(long = "batch", value_name = "B", default_value_t = 100)]
    pub batch: u32,
    /// Time-based marking with this period (RFC 9341), e.g. 100ms, 1s, 500us; overrides B.
    #[arg(long = "period", value_name = "T", value_parser = parse_duration_ns)]
    pub period: Option<u64>,
    /// DSCP bit carrying the color: 0 = least significant DSCP bit (TOS 0x04).
    #[arg(long = "color-bit", value_name = "N", default_value_t = 0)]
    pub color_bit: u8,
    /// Share of the next batch that closes a batch (step detection).
    #[arg(long = "threshold", value_name = "SHARE", default_value_t = 0.3)]
    pub threshold: f64,
    /// Flows per color table (buckets × 2 ways; a power of two).
    #[arg(long = "table-size", value_name = "FLOWS", default_value_t = 1024)]
    pub table_size: usize,
    /// Counter width: 8 (as the paper), 16 or 32 bits.
    #[arg(long = "counter-bits", value_name = "BITS", default_value_t = 8)]
    pub counter_bits: u8,
    /// A flow idle this long is closed and its slot freed, e.g. 2s.
    #[arg(long = "idle", value_name = "T", default_value = "2s", value_parser = parse_duration_ns)]
    pub idle: u64,
}

impl LossOpts {
    /// The validated configuration.
    pub fn config(&self) -> Result<LossConfig> {
        let c = LossConfig {
            batch: self.batch,
            period_ns: self.period,
            color_bit: self.color_bit,
            threshold: self.threshold,
            table_size: self.table_size,
            counter_bits: self.counter_bits,
            idle_ns: self.idle,
        };
        c.validate()?;
        Ok(c)
    }
}

/// Parses a non-zero duration (`1s`, `250ms`, `20us`; seconds without a unit).
pub use telemark_core::units::parse_positive_duration_ns as parse_duration_ns;

/// Parses `PLACE=P` or `PLACE=P:BURST` (drop probability, mean burst length).
pub fn parse_drop(s: &str) -> Result<(crate::dropper::Placement, crate::dropper::DropModel)> {
    use crate::dropper::DropModel;
    let Some((place, rest)) = s.split_once('=') else {
        bail!("--drop-at takes PLACE=PROB[:BURST], like switch=0.01 or ingress=0.02:8, not '{s}'");
    };
    let placement = place.parse().map_err(anyhow::Error::msg)?;
    let (p, burst) = match rest.split_once(':') {
        Some((p, b)) => (p, Some(b)),
        None => (rest, None),
    };
    let p: f64 =
        p.parse().map_err(|_| anyhow::anyhow!("drop probability '{p}' is not a number"))?;
    if !(0.0..=1.0).contains(&p) {
        bail!("drop probability {p} is outside 0..=1");
    }
    let model = match burst {
        None => DropModel::Independent { p },
        Some(b) => {
            let b: f64 =
                b.parse().map_err(|_| anyhow::anyhow!("burst length '{b}' is not a number"))?;
            if b.is_nan() || b < 1.0 {
                bail!("mean burst length must be at least 1 packet, not {b}");
            }
            DropModel::Bursty { p, burst: b }
        }
    };
    Ok((placement, model))
}

/// The CPUs this thread may run on, in order.
pub fn allowed_cpus() -> Result<Vec<usize>> {
    // SAFETY: the call fills a zeroed cpu_set_t.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
        }
        set
    };
    // SAFETY: CPU_ISSET reads the set.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Runs `cmd` (stdin closed) and returns its standard output; an error naming `what` and
/// quoting its standard error when it fails.
pub fn output(cmd: &mut std::process::Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("100ms"), Ok(100_000_000));
        assert_eq!(parse_duration_ns("2"), Ok(2_000_000_000));
        assert_eq!(parse_duration_ns("1.5us"), Ok(1_500));
        assert!(parse_duration_ns("-1s").is_err());
        assert!(parse_duration_ns("fast").is_err());
    }

    #[test]
    fn drops() {
        assert!(parse_drop("switch=0.01").is_ok());
        assert!(parse_drop("ingress=0.02:8").is_ok());
        assert!(parse_drop("nowhere=0.1").is_err());
        assert!(parse_drop("switch=2").is_err());
        assert!(parse_drop("switch").is_err());
        assert!(parse_drop("egress=0.1:0.5").is_err());
    }
}
