//! Which detectors each flow runs, and each flow's detector state: the paper's per-flow
//! algorithm table (§III-C "Algorithm") as a fixed-size table the fast path owns.
//!
//! Every rule that matches a flow applies to it, in rule order, each with detector state of
//! its own: a flow covered by a per-hop latency rule for every flow and by an EWMA queue rule
//! for UDP runs both, and one packet may fire either or both. (The paper gives a flow one
//! algorithm; operators layer rules, and a first-match table silently dropped the later ones.)
//!
//! A slot holds one (flow, rule) state: the flow's `nth` matching rule, and the index of the
//! rule after it that matches the flow too. The rules a flow runs are matched once, when each
//! state is placed; a packet follows the chain from the flow's first state without matching
//! again. The table is sized at start-up (open addressing, 8 probes from the flow's hash plus
//! `nth`, so a flow's states sit side by side); a state that finds no free slot among its 8
//! takes the one seen least recently, and the eviction is counted. The capacity counts states,
//! not flows: a flow that runs k rules takes k slots. There is no bound on the rules per flow
//! beyond the rules' count (at most [`MAX_RULES`]), so nothing is refused at load for it.

use super::detector::{Detection, Detector, FlowState, MAX_HOPS};
use super::expr::Expr;
use crate::hash::flow_hash;
use crate::records::{EventHop, EventRecord, Flow};
use crate::watch::Rule;
use telemark_wire::int::{Field, Hop};
use telemark_wire::FlowKey;

const PROBES: usize = 8;

/// Most rules a table runs: rule indices are 16 bits in a slot and in an [`Event`]; rules
/// past this many never match. The int-collector's control API refuses more at load.
pub const MAX_RULES: usize = 1 << 16;

/// A slot's `next` when its rule is the flow's last.
const LAST: u32 = u32::MAX;

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

/// What a probe looks at: the state's hash (0: empty) and when it was last seen (for
/// eviction). Kept apart from the entries so that the probes of a lookup read one or two
/// cache lines.
#[derive(Debug, Clone, Copy)]
struct Tag {
    hash: u64,
    seen_ns: u64,
}

const FREE: Tag = Tag { hash: 0, seen_ns: 0 };

/// The tag of `flow`'s `nth` state, from the flow's hash: the states of one flow differ in
/// their tags, so a probe reads only the entry it wants (never 0: 0 is a free slot).
fn tag(hash: u64, nth: u16) -> u64 {
    // Fibonacci hashing's constant, 2^64 / φ (Knuth, TAOCP vol. 3, §6.4): spreads `nth`
    // over all 64 bits; the first state's tag is the flow's hash as it always was.
    (hash ^ u64::from(nth).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1
}

/// One (flow, rule) state at its tag's index: in C order on a cache line of its own, so that
/// the key is one line and the state's start the next.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct Entry {
    key: FlowKey,
    /// Which of the flow's matching rules this is: 0 its first, 1 its second, ...
    nth: u16,
    /// That rule's index.
    rule: u16,
    /// The index of the next rule that matches the flow, or [`LAST`].
    next: u32,
    state: FlowState,
}

// The key, slot fields included, fills the first line and the state starts the next.
const _: () = assert!(core::mem::offset_of!(Entry, state) == 64);

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
    nth: 0,
    rule: 0,
    next: LAST,
    state: FlowState::EMPTY,
};

/// What the table's counters say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableCounts {
    /// Flows held (those whose first state is in the table).
    pub flows: u64,
    /// Detector states held, one per (flow, rule that matches it).
    pub states: u64,
    /// States pushed out to make room (each starts again if its flow comes back).
    pub evicted: u64,
    /// Packets of flows no rule covers.
    pub unmatched: u64,
}

/// What one packet's telemetry came to. The detections themselves go to the caller's
/// `fire` as they happen, so that any number fit without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No rule covers the flow.
    Unwatched,
    /// Its rules ran and none fired.
    Quiet,
    /// This many of its rules fired (each handed to `fire`, in rule order).
    Fired(u32),
}

/// Rules and per-flow state.
#[derive(Debug, Clone)]
pub struct Detectors {
    rules: Vec<DetectRule>,
    tags: Box<[Tag]>,
    entries: Box<[Entry]>,
    counts: TableCounts,
}

/// Where a lookup ended: at the state, or at the slot to put it in.
enum Probe {
    Found(usize),
    Vacant(usize),
}

impl Detectors {
    /// A table for `capacity` (flow, rule) states (rounded up to a power of two, at least
    /// 8): as many flows when each matches one rule. Rules past [`MAX_RULES`] never match.
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

    /// Replaces the rules (the controller changed them): every flow starts afresh, its rules
    /// matched again when it is next seen, each state from zero.
    pub fn set_rules(&mut self, rules: Vec<DetectRule>) {
        self.rules = rules;
        self.tags.fill(FREE);
        self.entries.fill(EMPTY);
        self.counts.flows = 0;
        self.counts.states = 0;
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

    /// Runs every detector of `flow` on one packet's `hops` (newest first) seen at `now`,
    /// handing each detection to `fire` with the index of the rule that fired.
    pub fn detect(
        &mut self,
        flow: &FlowKey,
        hops: &[Hop],
        now: u64,
        fire: impl FnMut(u16, Detection),
    ) -> Outcome {
        let place = self.place(flow, now);
        self.run(place, hops, fire)
    }

    /// [`detect`](Self::detect)'s first half: finds `flow`'s first state, or matches the rules
    /// and makes it for the first that covers the flow, as of `now`. A caller that has other
    /// work before it has the hops does it between the halves, while the state comes from
    /// memory.
    pub fn place(&mut self, flow: &FlowKey, now: u64) -> Place {
        let hash = flow_hash(flow);
        let slot = match self.probe(flow, hash, 0) {
            Probe::Found(i) => i,
            Probe::Vacant(i) => {
                let rule = self.next_match(flow, 0);
                if rule == LAST {
                    self.counts.unmatched += 1;
                    return Place::Unwatched;
                }
                self.put(i, flow, hash, 0, rule);
                i
            }
        };
        self.tags[slot].seen_ns = now;
        Place::Flow { slot, hash, now }
    }

    /// [`detect`](Self::detect)'s second half: the detectors of the flow at `place` on `hops`,
    /// in rule order, each detection handed to `fire`. The flow's states after the first are
    /// found by the chain, each put back (its rule known) if it was pushed out.
    pub fn run(
        &mut self,
        place: Place,
        hops: &[Hop],
        mut fire: impl FnMut(u16, Detection),
    ) -> Outcome {
        let Place::Flow { mut slot, hash, now } = place else { return Outcome::Unwatched };
        let mut fired = 0;
        // `get_mut`: a place from before the table changed ends the chain, never panics.
        while let Some(e) = self.entries.get_mut(slot) {
            if let Some(d) = self
                .rules
                .get(usize::from(e.rule))
                .and_then(|r| r.detector.detect(hops, &mut e.state))
            {
                fired += 1;
                fire(e.rule, d);
            }
            if e.next == LAST {
                break;
            }
            let (key, nth, next) = (e.key, e.nth + 1, e.next);
            slot = match self.probe(&key, hash, nth) {
                Probe::Found(i) => i,
                Probe::Vacant(i) => {
                    self.put(i, &key, hash, nth, next);
                    i
                }
            };
            self.tags[slot].seen_ns = now;
        }
        match fired {
            0 => Outcome::Quiet,
            n => Outcome::Fired(n),
        }
    }

    /// Where `flow`'s `nth` state is, or the slot for it: the first free one of its probes,
    /// else the one seen least recently.
    fn probe(&self, flow: &FlowKey, hash: u64, nth: u16) -> Probe {
        let want = tag(hash, nth);
        let mask = self.tags.len() - 1;
        let start = (hash as usize).wrapping_add(usize::from(nth)) & mask;
        let mut victim = start;
        for p in 0..PROBES {
            let i = (start + p) & mask;
            let t = self.tags[i];
            if t.hash == want && self.entries[i].key == *flow && self.entries[i].nth == nth {
                return Probe::Found(i);
            }
            if t.hash == 0 {
                return Probe::Vacant(i);
            }
            if t.seen_ns < self.tags[victim].seen_ns {
                victim = i;
            }
        }
        Probe::Vacant(victim)
    }

    /// Puts `flow`'s `nth` state, for `rule`, at `slot` (pushing out what is there), with the
    /// next rule that matches the flow: the one rule match each state costs.
    fn put(&mut self, slot: usize, flow: &FlowKey, hash: u64, nth: u16, rule: u32) {
        if self.tags[slot].hash == 0 {
            self.counts.states += 1;
        } else {
            self.counts.evicted += 1;
            if self.entries[slot].nth == 0 {
                self.counts.flows -= 1;
            }
        }
        if nth == 0 {
            self.counts.flows += 1;
        }
        let next = self.next_match(flow, rule as usize + 1);
        self.tags[slot].hash = tag(hash, nth);
        self.entries[slot] =
            Entry { key: *flow, nth, rule: rule as u16, next, state: FlowState::EMPTY };
    }

    /// The index of the first rule from `from` on that matches `flow`, or [`LAST`].
    fn next_match(&self, flow: &FlowKey, from: usize) -> u32 {
        let end = self.rules.len().min(MAX_RULES);
        let from = from.min(end);
        self.rules[from..end]
            .iter()
            .position(|r| r.matches(flow))
            .map_or(LAST, |i| (from + i) as u32)
    }
}

/// Where a flow's detector state is ([`Detectors::place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The flow's first state is at `slot`; `hash` and `now` find and stamp the others.
    Flow {
        /// Index of the first state.
        slot: usize,
        /// The flow's hash.
        hash: u64,
        /// When the packet was seen.
        now: u64,
    },
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
    /// Index of the rule that fired (a packet that fires several rules makes one event for
    /// each), or `None` for a report a switch already filtered.
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

    fn rule(flows: &str, detector: &str, threshold: Option<&str>) -> DetectRule {
        let metric = threshold.map(|_| "hop_latency");
        DetectRule::from_config(flows, detector, metric, threshold, None, None).unwrap()
    }

    /// Runs `flow`'s detectors on one packet: each (rule, value) that fired, and the outcome.
    fn fired(
        d: &mut Detectors,
        flow: &FlowKey,
        latency: u64,
        now: u64,
    ) -> (Vec<(u16, u64)>, Outcome) {
        let mut v = Vec::new();
        let out = d.detect(flow, &hops(latency), now, |r, det| v.push((r, det.value)));
        (v, out)
    }

    #[test]
    fn rules_pick_detectors_per_flow() {
        let rules = vec![
            rule("src=10.0.0.1", "per_flow", Some("10us")),
            rule("src=10.0.0.0/24", "noop", None),
        ];
        let mut d = Detectors::new(rules, 16);
        // flow 1 runs both rules, flow 2 the second only, 192.0.2.1 none.
        assert_eq!(fired(&mut d, &flow(1), 5_000, 1), (vec![(1, 0)], Outcome::Fired(1)));
        assert_eq!(
            fired(&mut d, &flow(1), 20_000, 2),
            (vec![(0, 20_000), (1, 0)], Outcome::Fired(2))
        );
        assert_eq!(fired(&mut d, &flow(2), 0, 3), (vec![(1, 0)], Outcome::Fired(1)));
        let other = FlowKey { src: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), ..flow(1) };
        assert_eq!(fired(&mut d, &other, 0, 4), (vec![], Outcome::Unwatched));
        assert_eq!(d.counts(), TableCounts { flows: 2, states: 3, evicted: 0, unmatched: 1 });
        let mut events = Vec::new();
        d.detect(&flow(1), &hops(50_000), 5, |r, det| {
            events.push(Event::new(5, flow(1), Some(r), det, &hops(50_000)).record("sink", &[]))
        });
        assert_eq!(events.len(), 2);
        let r =
            Event::new(5, flow(1), Some(0), Detection { value: 50_000, hop: None }, &hops(50_000))
                .record("sink", d.rules());
        assert_eq!((r.detector.as_str(), r.metric.as_deref()), ("per_flow", Some("hop_latency")));
        assert_eq!((r.value, r.threshold), (50_000, Some(10_000)));
        assert_eq!(r.path[0].switch_id, Some(7));
    }

    #[test]
    fn every_matching_rule_fires_from_its_own_state() {
        // The case: a rule for every flow and one for UDP on the same metric, with
        // thresholds 10 us and 30 us, and a rule (TCP) the flow does not match in between.
        let rules = vec![
            rule("*", "per_flow", Some("10us")),
            rule("proto=tcp", "noop", None),
            rule("proto=udp", "per_flow", Some("30us")),
        ];
        let mut d = Detectors::new(rules.clone(), 64);
        let udp = flow(1);
        // Each rule's stored value, by hand (both start at 0): 20 moves rule 0's (0 -> 20)
        // only; 40 moves both (20 -> 40 past 10, 0 -> 40 past 30); 45 neither; 5 both.
        for (latency, want) in [
            (20_000, vec![(0, 20_000)]),
            (40_000, vec![(0, 40_000), (2, 40_000)]),
            (45_000, vec![]),
            (5_000, vec![(0, 5_000), (2, 5_000)]),
            (14_000, vec![]),
            (16_000, vec![(0, 16_000)]),
        ] {
            let (got, out) = fired(&mut d, &udp, latency, latency);
            let n = want.len() as u32;
            assert_eq!(got, want, "latency {latency}");
            assert_eq!(out, if n == 0 { Outcome::Quiet } else { Outcome::Fired(n) });
        }
        // A TCP flow runs rules 0 and 1, not 2.
        let tcp = FlowKey { proto: 6, ..flow(2) };
        assert_eq!(fired(&mut d, &tcp, 40_000, 100).0, [(0, 40_000), (1, 0)]);
        assert_eq!(d.counts(), TableCounts { flows: 2, states: 4, evicted: 0, unmatched: 0 });
        // Each event names the rule that fired it: rule 2's threshold, not rule 0's.
        let det = Detection { value: 40_000, hop: None };
        let r = Event::new(0, udp, Some(2), det, &hops(40_000)).record("sink", &rules);
        assert_eq!((r.detector.as_str(), r.threshold), ("per_flow", Some(30_000)));
    }

    #[test]
    fn new_rules_are_matched_again_and_start_from_zero() {
        let mut d =
            Detectors::new(vec![rule("*", "noop", None), rule("proto=udp", "noop", None)], 64);
        assert_eq!(fired(&mut d, &flow(1), 0, 1).0, [(0, 0), (1, 0)]);
        // Rule 1 now covers TCP: the UDP flow's second state goes with it.
        d.set_rules(vec![rule("*", "noop", None), rule("proto=tcp", "noop", None)]);
        assert_eq!(d.counts().states, 0);
        assert_eq!(fired(&mut d, &flow(1), 0, 2).0, [(0, 0)]);
        assert_eq!(fired(&mut d, &flow(1), 0, 3).0, [(0, 0)]);
        // A rule that came to match a flow runs from the flow's next packet, from zero.
        d.set_rules(vec![rule("proto=udp", "per_flow", Some("10us")), rule("*", "noop", None)]);
        assert_eq!(fired(&mut d, &flow(1), 20_000, 4).0, [(0, 20_000), (1, 0)]);
        assert_eq!(fired(&mut d, &flow(1), 20_000, 5).0, [(1, 0)]);
        // The same rules again: the stored 20 us is gone, so 20 us fires again.
        d.set_rules(d.rules().to_vec());
        assert_eq!(fired(&mut d, &flow(1), 20_000, 6).0, [(0, 20_000), (1, 0)]);
        assert_eq!(d.counts(), TableCounts { flows: 1, states: 2, evicted: 0, unmatched: 0 });
    }

    #[test]
    fn more_rules_than_probes_all_run() {
        // 12 rules for every flow: more than one probe window; each runs, in order, on every
        // packet, and the second packet finds all 12 states.
        let rules = vec![rule("*", "noop", None); 12];
        let mut d = Detectors::new(rules, 64);
        let order: Vec<(u16, u64)> = (0..12).map(|r| (r, 0)).collect();
        assert_eq!(fired(&mut d, &flow(1), 0, 1), (order.clone(), Outcome::Fired(12)));
        assert_eq!(fired(&mut d, &flow(1), 0, 2), (order, Outcome::Fired(12)));
        assert_eq!(d.counts(), TableCounts { flows: 1, states: 12, evicted: 0, unmatched: 0 });
    }

    #[test]
    fn a_full_table_evicts_the_stalest() {
        let rules = vec![rule("*", "noop", None)];
        let mut d = Detectors::new(rules, 8);
        for n in 0..40 {
            d.detect(&flow(n), &hops(0), u64::from(n), |_, _| {});
        }
        let c = d.counts();
        assert!(c.flows <= 8 && c.evicted >= 32, "{c:?}");
    }

    #[test]
    fn two_rules_per_flow_stay_within_the_table_and_every_eviction_counts() {
        // 8 slots, 2 states a flow: 40 new flows make 80 states, 8 of them into free slots.
        let rules = vec![rule("*", "noop", None), rule("proto=udp", "per_flow", Some("1us"))];
        let mut d = Detectors::new(rules, 8);
        for n in 0..40 {
            let (got, _) = fired(&mut d, &flow(n), 10_000, u64::from(n) + 1);
            // Both fire from a fresh state, whatever was pushed out for them.
            assert_eq!(got, [(0, 0), (1, 10_000)], "flow {n}");
        }
        let c = d.counts();
        assert_eq!((c.states, c.evicted), (8, 72), "{c:?}");
        assert!((1..=4).contains(&c.flows), "{c:?}");
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
