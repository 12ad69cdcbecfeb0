//! Which detector each flow runs, and each flow's detector state: the paper's per-flow
//! algorithm table (§III-C "Algorithm") as a fixed-size table the fast path owns.
//!
//! Rules are tried in order; a flow's first match decides its detector, remembered with the
//! flow. The table is sized at start-up (open addressing, 8 probes); when a flow finds no free
//! slot among its 8 it takes the one seen least recently, and the eviction is counted.

use super::detector::{Detection, Detector, FlowState, MAX_HOPS};
use super::expr::Expr;
use crate::hash::flow_hash;
use crate::records::{EventHop, EventRecord, Flow};
use crate::watch::Rule;
use telemark_wire::int::{Field, Hop};
use telemark_wire::FlowKey;

const PROBES: usize = 8;

/// One rule: the flows it covers (`None`: every flow) and their detector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectRule {
    /// Flows matched; `None` matches every flow.
    pub flows: Option<Rule>,
    /// Their detector.
    pub detector: Detector,
}

impl DetectRule {
    /// Builds a rule from its configuration text: `flows` as a watch rule (`dst=10.0.0.0/24,
    /// proto=udp`; empty or `*` for every flow), `detector` one of `per_hop`, `per_flow`,
    /// `ewma`, `noop`, `complex`; `metric` an INT field name, `threshold` a quantity (`10us`,
    /// `1500`, `64KB`), `alpha` for EWMA, `expression` for complex detection.
    pub fn from_config(
        flows: &str,
        detector: &str,
        metric: Option<&str>,
        threshold: Option<&str>,
        alpha: Option<f64>,
        expression: Option<&str>,
    ) -> Result<DetectRule, String> {
        let flows = match flows.trim() {
            "" | "*" => None,
            f => Some(f.parse::<Rule>().map_err(|e| e.0)?),
        };
        let metric = || -> Result<Field, String> {
            let m = metric.ok_or(format!("detector {detector} needs a metric (an INT field)"))?;
            Field::from_name(m).ok_or_else(|| {
                let names: Vec<&str> = Field::ALL.iter().map(|f| f.name()).collect();
                format!("unknown metric {m:?}; INT fields are {}", names.join(", "))
            })
        };
        let threshold = || -> Result<u64, String> {
            let t = threshold.ok_or(format!("detector {detector} needs a threshold"))?;
            let v = super::expr::parse_quantity(t)?;
            u64::try_from(v).map_err(|_| format!("threshold {t:?} is negative"))
        };
        let detector = match detector {
            "per_hop" => Detector::PerHop { metric: metric()?, threshold: threshold()? },
            "per_flow" => Detector::PerFlow { metric: metric()?, threshold: threshold()? },
            "ewma" => Detector::ewma(metric()?, threshold()?, alpha.unwrap_or(0.25))?,
            "noop" => Detector::Noop,
            "complex" => {
                let e = expression.ok_or("detector complex needs an expression")?;
                Detector::Complex(Box::new(Expr::parse(e).map_err(|e| e.to_string())?))
            }
            other => {
                return Err(format!(
                    "unknown detector {other:?} (per_hop, per_flow, ewma, noop, complex)"
                ))
            }
        };
        Ok(DetectRule { flows, detector })
    }

    fn matches(&self, k: &FlowKey) -> bool {
        self.flows.as_ref().is_none_or(|r| r.matches(k))
    }
}

/// One `[[detect]]` rule as a config file or the agent's control API writes it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct DetectSection {
    /// Flows (a watch rule; `*` or absent: every flow).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub flows: String,
    /// Detector name.
    pub detector: String,
    /// INT field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// Threshold (`100us`, `1500`, `64KB`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<String>,
    /// EWMA weight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f64>,
    /// CNF expression.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
}

impl DetectSection {
    /// The rule.
    pub fn rule(&self) -> Result<DetectRule, String> {
        DetectRule::from_config(
            &self.flows,
            &self.detector,
            self.metric.as_deref(),
            self.threshold.as_deref(),
            self.alpha,
            self.expression.as_deref(),
        )
    }
}

/// What a probe looks at: the flow's hash (0: empty) and when it was last seen (for eviction).
/// Kept apart from the entries so that the probes of a lookup read one or two cache lines.
#[derive(Debug, Clone, Copy)]
struct Tag {
    hash: u64,
    seen_ns: u64,
}

const FREE: Tag = Tag { hash: 0, seen_ns: 0 };

/// A flow's key, rule and detector state, at its tag's index: in C order on a cache line of
/// its own, so that the key is one line and the state's start the next.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct Entry {
    key: FlowKey,
    rule: u16,
    state: FlowState,
}

const EMPTY: Entry = Entry {
    key: FlowKey {
        src: core::net::IpAddr::V4(core::net::Ipv4Addr::UNSPECIFIED),
        dst: core::net::IpAddr::V4(core::net::Ipv4Addr::UNSPECIFIED),
        sport: 0,
        dport: 0,
        proto: 0,
        spi: None,
        si: None,
    },
    rule: 0,
    state: FlowState::EMPTY,
};

/// What the table's counters say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableCounts {
    /// Flows held.
    pub flows: u64,
    /// Flows pushed out to make room (their state starts again if they come back).
    pub evicted: u64,
    /// Packets of flows no rule covers.
    pub unmatched: u64,
}

/// What one packet's telemetry came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No rule covers the flow.
    Unwatched,
    /// The flow's detector did not fire.
    Quiet,
    /// It fired: which rule, and what it saw.
    Event(usize, Detection),
}

/// Rules and per-flow state.
#[derive(Debug, Clone)]
pub struct Detectors {
    rules: Vec<DetectRule>,
    tags: Box<[Tag]>,
    entries: Box<[Entry]>,
    counts: TableCounts,
}

impl Detectors {
    /// A table for `capacity` flows (rounded up to a power of two, at least 8).
    pub fn new(rules: Vec<DetectRule>, capacity: usize) -> Detectors {
        let n = capacity.max(PROBES).next_power_of_two();
        Detectors {
            rules,
            tags: vec![FREE; n].into_boxed_slice(),
            entries: vec![EMPTY; n].into_boxed_slice(),
            counts: TableCounts::default(),
        }
    }

    /// The rules.
    pub fn rules(&self) -> &[DetectRule] {
        &self.rules
    }

    /// Replaces the rules (the controller changed them); every flow starts afresh.
    pub fn set_rules(&mut self, rules: Vec<DetectRule>) {
        self.rules = rules;
        self.tags.fill(FREE);
        self.entries.fill(EMPTY);
        self.counts.flows = 0;
    }

    /// The fields of a hop the rules' detectors and the events they make read, as a mask of
    /// `1 << field as u8`: a reader of hops for this table needs no others.
    pub fn fields(&self) -> u32 {
        self.rules.iter().fold(PathHop::FIELDS, |m, r| m | r.detector.fields())
    }

    /// The counters.
    pub fn counts(&self) -> TableCounts {
        self.counts
    }

    /// Runs `flow`'s detector on one packet's `hops` (newest first) seen at `now`.
    pub fn detect(&mut self, flow: &FlowKey, hops: &[Hop], now: u64) -> Outcome {
        let place = self.place(flow, now);
        self.run(place, hops)
    }

    /// [`detect`](Self::detect)'s first half: finds `flow`'s state, or makes it for the first
    /// rule that covers the flow, as of `now`. A caller that has other work before it has the
    /// hops does it between the halves, while the state comes from memory.
    pub fn place(&mut self, flow: &FlowKey, now: u64) -> Place {
        let hash = flow_hash(flow) | 1;
        let mask = self.tags.len() - 1;
        let start = (hash as usize) & mask;
        let mut victim = start;
        let mut at = None;
        for p in 0..PROBES {
            let i = (start + p) & mask;
            let t = self.tags[i];
            if t.hash == hash && self.entries[i].key == *flow {
                at = Some(i);
                break;
            }
            if t.hash == 0 {
                victim = i;
                break;
            }
            if t.seen_ns < self.tags[victim].seen_ns {
                victim = i;
            }
        }
        let i = match at {
            Some(i) => i,
            None => {
                let Some(rule) = self.rules.iter().position(|r| r.matches(flow)) else {
                    self.counts.unmatched += 1;
                    return Place::Unwatched;
                };
                if self.tags[victim].hash == 0 {
                    self.counts.flows += 1;
                } else {
                    self.counts.evicted += 1;
                }
                self.tags[victim].hash = hash;
                self.entries[victim] =
                    Entry { key: *flow, rule: rule as u16, state: FlowState::EMPTY };
                victim
            }
        };
        self.tags[i].seen_ns = now;
        Place::Entry(i)
    }

    /// [`detect`](Self::detect)'s second half: the detector of the flow at `place` on `hops`.
    pub fn run(&mut self, place: Place, hops: &[Hop]) -> Outcome {
        let Place::Entry(i) = place else { return Outcome::Unwatched };
        let Some(s) = self.entries.get_mut(i) else { return Outcome::Unwatched };
        let rule = usize::from(s.rule);
        match self.rules.get(rule).and_then(|r| r.detector.detect(hops, &mut s.state)) {
            Some(d) => Outcome::Event(rule, d),
            None => Outcome::Quiet,
        }
    }
}

/// Where a flow's detector state is ([`Detectors::place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// At this entry of the table.
    Entry(usize),
    /// Nowhere: no rule covers the flow.
    Unwatched,
}

/// One hop of an event's path: the metadata an operator reads in an event, compact. A value
/// the hop did not carry is all ones, as INT writes an unavailable value (INT v2.1 §5.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathHop {
    /// Node ID.
    pub switch_id: u32,
    /// Hop latency, saturated at 2^32 - 2.
    pub hop_latency: u32,
    /// Queue occupancy.
    pub queue_occupancy: u32,
    /// Level-1 ingress and egress interface.
    pub ports: (u16, u16),
    /// Egress TX utilisation.
    pub tx_utilization: u32,
    /// Queue ID.
    pub queue_id: u8,
    /// Egress timestamp.
    pub egress_ts: u64,
}

const NONE32: u32 = u32::MAX;

impl PathHop {
    /// The fields [`PathHop::of`] reads, as a mask of `1 << field as u8`.
    const FIELDS: u32 = {
        let fields = [
            Field::NodeId,
            Field::HopLatency,
            Field::QueueOccupancy,
            Field::L1IngressIf,
            Field::L1EgressIf,
            Field::TxUtilization,
            Field::QueueId,
            Field::EgressTs,
        ];
        let mut m = 0;
        let mut i = 0;
        while i < fields.len() {
            m |= 1 << fields[i] as u8;
            i += 1;
        }
        m
    };

    const EMPTY: PathHop = PathHop {
        switch_id: NONE32,
        hop_latency: NONE32,
        queue_occupancy: NONE32,
        ports: (u16::MAX, u16::MAX),
        tx_utilization: NONE32,
        queue_id: u8::MAX,
        egress_ts: u64::MAX,
    };

    fn of(h: &Hop) -> PathHop {
        let n32 = |f: Field| h.available(f).map_or(NONE32, |v| v.min(u64::from(NONE32 - 1)) as u32);
        let n16 = |f: Field| h.available(f).map_or(u16::MAX, |v| v.min(0xfffe) as u16);
        PathHop {
            switch_id: n32(Field::NodeId),
            hop_latency: n32(Field::HopLatency),
            queue_occupancy: n32(Field::QueueOccupancy),
            ports: (n16(Field::L1IngressIf), n16(Field::L1EgressIf)),
            tx_utilization: n32(Field::TxUtilization),
            queue_id: h.available(Field::QueueId).map_or(u8::MAX, |v| v.min(0xfe) as u8),
            egress_ts: h.available(Field::EgressTs).unwrap_or(u64::MAX),
        }
    }

    fn record(&self) -> EventHop {
        let o32 = |v: u32| (v != NONE32).then_some(v);
        EventHop {
            switch_id: o32(self.switch_id),
            hop_latency: o32(self.hop_latency).map(u64::from),
            queue_id: (self.queue_id != u8::MAX).then_some(u32::from(self.queue_id)),
            queue_occupancy: o32(self.queue_occupancy).map(u64::from),
            ingress_port: (self.ports.0 != u16::MAX).then_some(u32::from(self.ports.0)),
            egress_port: (self.ports.1 != u16::MAX).then_some(u32::from(self.ports.1)),
            egress_ts: (self.egress_ts != u64::MAX).then_some(self.egress_ts),
            tx_utilization: o32(self.tx_utilization).map(u64::from),
        }
    }
}

/// An event as the fast path hands it on: fixed size, no allocation; the exporter turns it
/// into an [`EventRecord`].
#[derive(Debug, Clone, Copy)]
pub struct Event {
    /// When the packet or report was seen.
    pub time_ns: u64,
    /// The flow.
    pub flow: FlowKey,
    /// Index of the rule that fired, or `None` for a report a switch already filtered.
    pub rule: Option<u16>,
    /// What fired.
    pub detection: Detection,
    /// The path's metadata, newest first.
    pub hops: [PathHop; MAX_HOPS],
    /// How many of `hops` are filled.
    pub hop_count: u8,
}

impl Event {
    /// An event with the first [`MAX_HOPS`] of `hops`.
    pub fn new(
        time_ns: u64,
        flow: FlowKey,
        rule: Option<u16>,
        detection: Detection,
        hops: &[Hop],
    ) -> Event {
        let mut e = Event {
            time_ns,
            flow,
            rule,
            detection,
            hops: [PathHop::EMPTY; MAX_HOPS],
            hop_count: 0,
        };
        for (slot, h) in e.hops.iter_mut().zip(hops) {
            *slot = PathHop::of(h);
            e.hop_count += 1;
        }
        e
    }

    /// The record, with the detector of `rules[rule]` (rules as they were when it fired).
    pub fn record(&self, agent: &str, rules: &[DetectRule]) -> EventRecord {
        let detector = self.rule.and_then(|r| rules.get(usize::from(r))).map(|r| &r.detector);
        EventRecord {
            agent: agent.to_string(),
            flow: Flow::from(&self.flow),
            detector: detector.map_or("switch", |d| d.name()).to_string(),
            metric: detector.and_then(|d| d.metric()).map(|f| f.name().to_string()),
            hop: self.detection.hop.map(|(h, _)| h),
            switch_id: self.detection.hop.map(|(_, s)| s),
            value: self.detection.value,
            threshold: detector.and_then(|d| d.threshold()),
            time_ns: self.time_ns,
            expression: match detector {
                Some(Detector::Complex(e)) => Some(e.text().to_string()),
                _ => None,
            },
            path: self.hops[..usize::from(self.hop_count)].iter().map(PathHop::record).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::{IpAddr, Ipv4Addr};

    fn flow(n: u8) -> FlowKey {
        FlowKey {
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)),
            sport: 1000,
            dport: 5201,
            proto: 17,
            spi: None,
            si: None,
        }
    }

    fn hops(latency: u64) -> [Hop; 1] {
        let mut h = Hop::default();
        h.set(Field::NodeId, 7);
        h.set(Field::HopLatency, latency);
        [h]
    }

    #[test]
    fn rules_pick_detectors_per_flow() {
        let rules = vec![
            DetectRule::from_config(
                "src=10.0.0.1",
                "per_flow",
                Some("hop_latency"),
                Some("10us"),
                None,
                None,
            )
            .unwrap(),
            DetectRule::from_config("src=10.0.0.0/24", "noop", None, None, None, None).unwrap(),
        ];
        let mut d = Detectors::new(rules, 16);
        assert!(matches!(d.detect(&flow(1), &hops(5_000), 1), Outcome::Quiet));
        assert!(matches!(d.detect(&flow(1), &hops(20_000), 2), Outcome::Event(0, _)));
        assert!(matches!(d.detect(&flow(2), &hops(0), 3), Outcome::Event(1, _)));
        let other = FlowKey { src: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), ..flow(1) };
        assert_eq!(d.detect(&other, &hops(0), 4), Outcome::Unwatched);
        assert_eq!(d.counts(), TableCounts { flows: 2, evicted: 0, unmatched: 1 });
        let Outcome::Event(rule, det) = d.detect(&flow(1), &hops(50_000), 5) else { panic!() };
        let r =
            Event::new(5, flow(1), Some(rule as u16), det, &hops(50_000)).record("sink", d.rules());
        assert_eq!((r.detector.as_str(), r.metric.as_deref()), ("per_flow", Some("hop_latency")));
        assert_eq!((r.value, r.threshold), (50_000, Some(10_000)));
        assert_eq!(r.path[0].switch_id, Some(7));
    }

    #[test]
    fn a_full_table_evicts_the_stalest() {
        let rules = vec![DetectRule::from_config("*", "noop", None, None, None, None).unwrap()];
        let mut d = Detectors::new(rules, 8);
        for n in 0..40 {
            d.detect(&flow(n), &hops(0), u64::from(n));
        }
        let c = d.counts();
        assert!(c.flows <= 8 && c.evicted >= 32, "{c:?}");
    }

    #[test]
    fn config_errors_name_the_problem() {
        for (det, metric, thr, says) in [
            ("per_hop", None, Some("1"), "needs a metric"),
            ("per_hop", Some("latency"), Some("1"), "unknown metric"),
            ("ewma", Some("hop_latency"), None, "needs a threshold"),
            ("median", None, None, "unknown detector"),
            ("complex", None, None, "needs an expression"),
        ] {
            let e = DetectRule::from_config("*", det, metric, thr, None, None).unwrap_err();
            assert!(e.contains(says), "{det}: {e}");
        }
    }
}
