//! A synthetic packet dropper that keeps the ground truth (loss paper, V-B: "a synthetic
//! packet dropper … at both the ingress and egress measuring points").

use std::collections::HashMap;
use telemark_core::rng::Rng;
use telemark_wire::FlowKey;

/// Where on the path a dropper sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Placement {
    /// On the link before the switch's ingress point: link loss, seen at ingress.
    Ingress,
    /// Inside the switch, between the ingress and egress points.
    Switch,
    /// On the link after the switch's egress point, seen at the next hop.
    Egress,
}

impl Placement {
    /// All placements, upstream first.
    pub const ALL: [Placement; 3] = [Placement::Ingress, Placement::Switch, Placement::Egress];

    /// Stable name (`ingress`, `switch`, `egress`).
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Ingress => "ingress",
            Placement::Switch => "switch",
            Placement::Egress => "egress",
        }
    }
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ingress" | "link" => Ok(Placement::Ingress),
            "switch" | "internal" => Ok(Placement::Switch),
            "egress" => Ok(Placement::Egress),
            o => Err(format!("unknown drop placement '{o}' (ingress, switch, egress)")),
        }
    }
}

/// Independent or bursty losses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DropModel {
    /// Each packet dropped with probability p (Bernoulli).
    Independent {
        /// Drop probability.
        p: f64,
    },
    /// Gilbert model: a good state that never drops and a bad state that always does, with the
    /// given long-run drop rate and mean burst length (packets).
    Bursty {
        /// Long-run drop probability.
        p: f64,
        /// Mean length of a loss burst, in packets (≥ 1).
        burst: f64,
    },
}

/// Drops packets as its model says and records every drop.
#[derive(Debug, Clone)]
pub struct Dropper {
    model: DropModel,
    rng: Rng,
    bad: bool,
    /// Packets seen.
    pub seen: u64,
    /// Packets dropped.
    pub dropped: u64,
    /// Drops per flow and marker batch (`u32::MAX` when the packet had no batch).
    pub truth: HashMap<(FlowKey, u32), u64>,
}

impl Dropper {
    /// A dropper with its own seed.
    pub fn new(model: DropModel, seed: u64) -> Self {
        Dropper {
            model,
            rng: Rng::new(seed),
            bad: false,
            seen: 0,
            dropped: 0,
            truth: HashMap::new(),
        }
    }

    /// Decides one packet's fate; `true` means drop (and it is recorded).
    pub fn drop_packet(&mut self, key: &FlowKey, batch: Option<u32>) -> bool {
        self.seen += 1;
        let drop = match self.model {
            DropModel::Independent { p } => self.rng.chance(p),
            DropModel::Bursty { p, burst } => {
                let b2g = 1.0 / burst.max(1.0);
                let g2b = if p >= 1.0 { 1.0 } else { p * b2g / (1.0 - p) };
                self.bad = if self.bad { !self.rng.chance(b2g) } else { self.rng.chance(g2b) };
                self.bad
            }
        };
        if drop {
            self.dropped += 1;
            *self.truth.entry((*key, batch.unwrap_or(u32::MAX))).or_default() += 1;
        }
        drop
    }

    /// Drops of one flow, all batches.
    pub fn flow_drops(&self, key: &FlowKey) -> u64 {
        self.truth.iter().filter(|((k, _), _)| k == key).map(|(_, n)| n).sum()
    }

    /// The realised drop rate.
    pub fn rate(&self) -> f64 {
        if self.seen == 0 {
            0.0
        } else {
            self.dropped as f64 / self.seen as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_bursts() {
        let k = FlowKey::default();
        let mut d = Dropper::new(DropModel::Independent { p: 0.05 }, 1);
        (0..200_000).for_each(|_| {
            d.drop_packet(&k, Some(0));
        });
        assert!((d.rate() - 0.05).abs() < 0.003, "{}", d.rate());
        assert_eq!(d.flow_drops(&k), d.dropped);

        let mut b = Dropper::new(DropModel::Bursty { p: 0.05, burst: 8.0 }, 2);
        let mut runs = Vec::new();
        let mut run = 0;
        for _ in 0..400_000 {
            if b.drop_packet(&k, None) {
                run += 1;
            } else if run > 0 {
                runs.push(run);
                run = 0;
            }
        }
        let mean = runs.iter().sum::<u64>() as f64 / runs.len() as f64;
        assert!((b.rate() - 0.05).abs() < 0.01, "{}", b.rate());
        assert!((mean - 8.0).abs() < 1.0, "mean burst {mean}");
    }
}
