use core::fmt;

/// Loss-monitor parameters. The same flags set them everywhere (`--batch`, `--period`,
/// `--color-bit`, `--threshold`, `--table-size`, `--counter-bits`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossConfig {
    /// Packets per color in count-based marking, B. 100 by default (loss paper, V-C).
    pub batch: u32,
    /// Period T of time-based marking (RFC 9341 §3.1), in nanoseconds; `None` for count-based.
    pub period_ns: Option<u64>,
    /// DSCP bit that carries the color: 0 is the least significant DSCP bit (TOS 0x04), the
    /// default of DESIGN.md.
    pub color_bit: u8,
    /// Share of the next batch that must arrive before a step is declared: 0.3 (loss paper,
    /// IV-B: "we use 30% as the threshold").
    pub threshold: f64,
    /// Flows a table can hold: buckets × 2 ways. 1,024 (512 × 2) by default (loss paper, IV-B).
    pub table_size: usize,
    /// Width of each per-color counter: 8 (the paper), 16 or 32 bits.
    pub counter_bits: u8,
    /// A flow silent this long has its open batch closed and its slot freed.
    pub idle_ns: u64,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            batch: 100,
            period_ns: None,
            color_bit: 0,
            threshold: 0.3,
            table_size: 1024,
            counter_bits: 8,
            idle_ns: 2_000_000_000,
        }
    }
}

/// A parameter out of range, with what would be accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigError {
    /// B is 0 or does not fit the counters.
    Batch {
        /// B asked for.
        batch: u32,
        /// Counter bits configured.
        counter_bits: u8,
    },
    /// Counter width other than 8, 16, 32.
    CounterBits(u8),
    /// DSCP has bits 0..=5.
    ColorBit(u8),
    /// Threshold outside (0, 0.5].
    Threshold(f64),
    /// Table size 0 or not a power of two ≥ 2.
    TableSize(usize),
    /// Period of 0.
    Period,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Batch { batch, counter_bits } => write!(
                f,
                "batch size {batch} does not fit {counter_bits}-bit counters (1..={}); raise --counter-bits",
                max_for_bits(*counter_bits)
            ),
            ConfigError::CounterBits(b) => write!(f, "counter bits must be 8, 16 or 32, not {b}"),
            ConfigError::ColorBit(b) => write!(f, "color bit must be a DSCP bit 0..=5, not {b}"),
            ConfigError::Threshold(t) => write!(f, "threshold must be in (0, 0.5], not {t}"),
            ConfigError::TableSize(s) => {
                write!(f, "table size must be a power of two of at least 2 flows, not {s}")
            }
            ConfigError::Period => write!(f, "period must be longer than 0"),
        }
    }
}

impl std::error::Error for ConfigError {}

fn max_for_bits(bits: u8) -> u64 {
    match bits {
        8 => u64::from(u8::MAX),
        16 => u64::from(u16::MAX),
        _ => u64::from(u32::MAX),
    }
}

impl LossConfig {
    /// Checks every parameter; the error says which and what would do.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !matches!(self.counter_bits, 8 | 16 | 32) {
            return Err(ConfigError::CounterBits(self.counter_bits));
        }
        // A counter holds one batch plus the early share of the next batch of the same color
        // while the batch is open; 2B bounds both. 8-bit counters therefore allow B ≤ 127 with
        // full headroom and the paper's B ≤ 255 with the counter saturating only under
        // reordering deeper than 255 - B packets, which the step detector would not survive
        // anyway. We require B ≤ max so the paper's own setting (B = 255) is accepted.
        if self.batch == 0 || u64::from(self.batch) > max_for_bits(self.counter_bits) {
            return Err(ConfigError::Batch { batch: self.batch, counter_bits: self.counter_bits });
        }
        if self.color_bit > 5 {
            return Err(ConfigError::ColorBit(self.color_bit));
        }
        if !(self.threshold > 0.0 && self.threshold <= 0.5) {
            return Err(ConfigError::Threshold(self.threshold));
        }
        if self.table_size < 2 || !self.table_size.is_power_of_two() {
            return Err(ConfigError::TableSize(self.table_size));
        }
        if self.period_ns == Some(0) {
            return Err(ConfigError::Period);
        }
        Ok(())
    }

    /// Packets of the next color that close a batch: ⌈threshold × B⌉, at least 1.
    pub fn close_at(&self) -> u32 {
        ((self.threshold * f64::from(self.batch)).ceil() as u32).max(1)
    }

    /// While the open batch has fewer packets than this, a packet of the other color belongs
    /// to the batch just closed (it is late); from here on it is an early packet of the next
    /// batch. Half-way between the two places reordering can put such a packet: just after the
    /// step (≤ threshold·B + depth) and just before the next one (≥ B − depth).
    pub fn late_limit(&self) -> u32 {
        (((1.0 + self.threshold) / 2.0 * f64::from(self.batch)).ceil() as u32).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers() {
        let c = LossConfig::default();
        c.validate().unwrap();
        assert_eq!((c.batch, c.close_at(), c.late_limit(), c.table_size), (100, 30, 65, 1024));
    }

    #[test]
    fn rejects() {
        let d = LossConfig::default();
        assert!(LossConfig { batch: 256, ..d }.validate().is_err());
        LossConfig { batch: 256, counter_bits: 16, ..d }.validate().unwrap();
        assert!(LossConfig { counter_bits: 12, ..d }.validate().is_err());
        assert!(LossConfig { color_bit: 6, ..d }.validate().is_err());
        assert!(LossConfig { threshold: 0.0, ..d }.validate().is_err());
        assert!(LossConfig { threshold: f64::NAN, ..d }.validate().is_err());
        assert!(LossConfig { table_size: 1000, ..d }.validate().is_err());
        let e = LossConfig { batch: 300, ..d }.validate().unwrap_err().to_string();
        assert!(e.contains("--counter-bits"), "{e}");
    }
}
