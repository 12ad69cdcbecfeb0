//! The report collector's sans-IO half (the paper's INT monitor, §III-B): Telemetry Report
//! datagrams in, [`Event`]s out.
//!
//! Per datagram: parse the reports (tolerantly: real switches send dialects, each counted by
//! the rule it breaks); count reports lost from sequence-number gaps per reporting node and
//! hardware ID; per individual report, gather the path's metadata (the reporting node's own,
//! then the stack of the INT packet it carries, newest hop first), find the flow as the INT
//! source saw it, and run every detector whose rule covers the flow. A flow no rule covers was
//! filtered by the switch that reported it: its report is an event as it is (detector
//! `switch`).

use super::detector::{Detection, MAX_HOPS};
use super::sequence::{Limits, Observation, Sequences};
use super::table::{Detectors, Event, Outcome};
use telemark_wire::dialect::{Deviation, Deviations, Mode};
use telemark_wire::int::{Field, Hop, Instructions, Layout, Version};
use telemark_wire::int_frame::{self, Found, Start};
use telemark_wire::report::{self, InType, Report};
use telemark_wire::report_fast;

/// Why a datagram or report was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// Not a Telemetry Report at all (version, lengths).
    Malformed,
    /// An individual report inside a datagram did not parse (the ones before it are kept).
    BadReport,
    /// The INT in the reported packet did not parse.
    BadInt,
    /// The reported packet has no flow Telemark reads (not TCP/UDP over IP).
    NoFlow,
    /// A group header without any report (TR v2.0 §3.3: a report packet holds one or more).
    /// Tolerantly its sequence number is still taken (the datagram arrived); strictly the
    /// datagram is malformed.
    NoReports,
    /// The sender is not in the allow-list (counted by the receive loop, not here).
    NotAllowed,
}

impl Refusal {
    /// Every refusal.
    pub const ALL: [Refusal; 6] = [
        Refusal::Malformed,
        Refusal::BadReport,
        Refusal::BadInt,
        Refusal::NoFlow,
        Refusal::NoReports,
        Refusal::NotAllowed,
    ];

    /// Name for counters.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::BadReport => "bad_report",
            Refusal::BadInt => "bad_int",
            Refusal::NoFlow => "no_flow",
            Refusal::NoReports => "no_reports",
            Refusal::NotAllowed => "not_allowed",
        }
    }
}

/// Counters of everything the collector saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Datagrams read.
    pub datagrams: u64,
    /// Individual reports used.
    pub reports: u64,
    /// Refused, by reason.
    pub refused: [u64; Refusal::ALL.len()],
    /// Reports that broke a rule and were read anyway, by [`Deviation`].
    pub deviations: [u64; Deviation::ALL.len()],
    /// Events handed on (a report that fires several of its flow's rules makes one each).
    pub events: u64,
    /// Reports none of whose flow's detectors fired.
    pub quiet: u64,
}

/// Where datagrams' sequence numbers go.
#[derive(Debug)]
enum SeqSink {
    /// This collector follows them.
    Own(Sequences),
    /// Kept for the caller, who follows them for several collectors (workers that share
    /// senders: a sender may spread its datagrams over them by source port).
    Shared(Vec<Observation>),
}

/// The report collector's state.
#[derive(Debug)]
pub struct Collector {
    detectors: Detectors,
    /// The current report's path, reused from report to report.
    hops: [Hop; MAX_HOPS],
    /// The last stack layout built, by instructions and version: reports of one domain carry
    /// the same instructions, so it is built once, not per report. It reads only the fields
    /// the detectors and events use.
    layout: Option<(Instructions, Version, Layout)>,
    mode: Mode,
    seq: SeqSink,
    counts: Counts,
}

impl Collector {
    /// A collector running `detectors` on flows their rules cover.
    pub fn new(detectors: Detectors, mode: Mode) -> Collector {
        Collector {
            detectors,
            hops: [Hop::default(); MAX_HOPS],
            layout: None,
            mode,
            seq: SeqSink::Own(Sequences::default()),
            counts: Counts::default(),
        }
    }

    /// Follows sequence numbers within `limits` (when this collector follows them itself).
    pub fn with_sequence_limits(mut self, limits: Limits) -> Collector {
        if let SeqSink::Own(s) = &mut self.seq {
            *s = Sequences::new(limits);
        }
        self
    }

    /// Counts a datagram refused before it was read (its sender not allowed).
    pub fn not_allowed(&mut self) {
        self.counts.datagrams += 1;
        self.refuse(Refusal::NotAllowed);
    }

    /// Keeps sequence numbers for the caller to follow ([`take_observations`]) instead of
    /// following them itself.
    ///
    /// [`take_observations`]: Self::take_observations
    pub fn with_shared_sequences(mut self) -> Collector {
        self.seq = SeqSink::Shared(Vec::with_capacity(256));
        self
    }

    /// The sequence numbers seen since the last call (with shared sequences).
    pub fn take_observations(&mut self) -> impl Iterator<Item = Observation> + '_ {
        match &mut self.seq {
            SeqSink::Shared(v) => Some(v.drain(..)),
            SeqSink::Own(_) => None,
        }
        .into_iter()
        .flatten()
    }

    /// The sequence windows (when this collector follows them itself).
    pub fn sequences(&self) -> Option<&Sequences> {
        match &self.seq {
            SeqSink::Own(s) => Some(s),
            SeqSink::Shared(_) => None,
        }
    }

    /// The counters.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// The detectors (for their rules and table counters).
    pub fn detectors(&self) -> &Detectors {
        &self.detectors
    }

    /// Mutable detectors (to change the rules).
    pub fn detectors_mut(&mut self) -> &mut Detectors {
        // The layout reads what the rules need: built again for the new ones.
        self.layout = None;
        &mut self.detectors
    }

    /// Processes one datagram received at `now`, handing each event to `emit`.
    pub fn datagram(&mut self, bytes: &[u8], now: u64, mut emit: impl FnMut(Event)) {
        self.counts.datagrams += 1;
        // The common report (one, conforming) is read at fixed offsets; anything else by the
        // reference readers, which the fast one answers exactly as for the common shape.
        if let Some((r, found)) = report_fast::read(bytes) {
            self.sequence(observation(&r, now));
            self.report(&r, Some(&found), now, &mut emit);
            return;
        }
        let reports = match report::parse(bytes, self.mode) {
            Ok(r) => r,
            Err(_) => {
                self.refuse(Refusal::Malformed);
                return;
            }
        };
        // Only the group's sequence number is kept past the loop (a datagram without reports).
        let group = observation(reports.group(), now);
        let mut sequenced = false;
        let mut empty = true;
        for r in reports {
            empty = false;
            let r = match r {
                Ok(r) => r,
                Err(_) => {
                    self.refuse(Refusal::BadReport);
                    break;
                }
            };
            if !sequenced {
                // The first report tells the dialect, and with it the sequence number's width.
                sequenced = true;
                self.sequence(observation(&r, now));
            }
            let start = match r.in_type {
                InType::Ethernet => Start::Ethernet,
                InType::Ipv4 | InType::Ipv6 => Start::Ip,
                _ => {
                    self.count_deviations(r.deviations);
                    self.refuse(Refusal::NoFlow);
                    continue;
                }
            };
            match int_frame::find_reported(r.inner, start, self.mode) {
                Ok(found) => self.report(&r, found.as_ref(), now, &mut emit),
                Err(_) => {
                    self.count_deviations(r.deviations);
                    self.refuse(Refusal::BadInt);
                }
            }
        }
        if !sequenced {
            // No report read: the datagram still arrived.
            if empty {
                self.refuse(Refusal::NoReports);
            }
            self.sequence(group);
        }
    }

    /// One report and the INT found in the packet it carries (if any): the flow, the path's
    /// metadata, and the flow's detectors.
    fn report(
        &mut self,
        r: &Report<'_>,
        found: Option<&Found<'_>>,
        now: u64,
        emit: &mut impl FnMut(Event),
    ) {
        self.count_deviations(r.deviations);
        let flow = match found {
            Some(f) => {
                self.count_deviations(f.int.deviations);
                f.flow
            }
            None => {
                let start = match r.in_type {
                    InType::Ethernet => Start::Ethernet,
                    _ => Start::Ip,
                };
                match int_frame::plain_flow(r.inner, start) {
                    Some(f) => f,
                    None => return self.refuse(Refusal::NoFlow),
                }
            }
        };
        self.counts.reports += 1;
        // The flow's state first: the table is large and seldom in cache, and the hops are
        // read while it comes.
        let place = self.detectors.place(&flow, now);
        // The reporting node's own metadata heads the path (newest) when the report carries
        // some, or when there is no INT stack to read.
        let hops = &mut self.hops;
        let mut n = 0;
        if !r.md.is_empty() || found.is_none() {
            hops[0] = r.metadata();
            if hops[0].get(Field::NodeId).is_none() {
                if let Some(id) = r.node_id {
                    hops[0].set(Field::NodeId, u64::from(id));
                }
            }
            n = 1;
        }
        if let Some(f) = found {
            let key = (f.int.instructions(), f.int.shim.version);
            let layout = match &self.layout {
                Some((i, v, l)) if (*i, *v) == key => l,
                _ => {
                    let l = f.int.layout().reading_only(self.detectors.fields());
                    &self.layout.insert((key.0, key.1, l)).2
                }
            };
            n += f.int.read_hops_with(layout, &mut self.hops[n..]);
        }
        let hops = &self.hops[..n];
        // One event per rule that fired, each naming its rule.
        let fire = |rule, d| emit(Event::new(now, flow, Some(rule), d, hops));
        match self.detectors.run(place, hops, fire) {
            Outcome::Fired(k) => self.counts.events += u64::from(k),
            Outcome::Quiet => self.counts.quiet += 1,
            Outcome::Unwatched => {
                self.counts.events += 1;
                let d = Detection { value: 0, hop: None };
                emit(Event::new(now, flow, None, d, hops));
            }
        }
    }

    fn count_deviations(&mut self, d: Deviations) {
        for d in d.iter() {
            self.counts.deviations[d as usize] += 1;
        }
    }

    fn refuse(&mut self, why: Refusal) {
        self.counts.refused[why as usize] += 1;
    }

    /// Follows one datagram's sequence number.
    fn sequence(&mut self, o: Observation) {
        match &mut self.seq {
            SeqSink::Own(s) => s.observe(o),
            SeqSink::Shared(v) => v.push(o),
        }
    }
}

/// A report's sequence number, as the window follows it.
fn observation(r: &Report<'_>, time: u64) -> Observation {
    Observation { node: r.node_id.unwrap_or(0), hw_id: r.hw_id, seq: r.seq, bits: r.seq_bits, time }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int::table::DetectRule;
    use telemark_wire::int::Instructions;
    use telemark_wire::report::{Flags, Writer};

    /// A v2.0 datagram with one report whose inner IPv4/UDP packet has no INT.
    fn datagram(seq: u32, latency: u64) -> Vec<u8> {
        let mut inner = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        inner.extend_from_slice(&[0x13, 0x88, 0x14, 0x51, 0, 8, 0, 0]);
        let mut md = Hop::default();
        md.set(Field::HopLatency, latency);
        let mut buf = [0u8; 256];
        let mut w = Writer::new(&mut buf, 1, seq, 42).unwrap();
        let bits = Instructions::of(&[Field::HopLatency]);
        w.push(InType::Ipv4, Flags::default(), bits, &md, &inner).unwrap();
        let n = w.len();
        buf[..n].to_vec()
    }

    #[test]
    fn gaps_are_lost_reports_and_detectors_run() {
        let rule =
            DetectRule::from_config("*", "per_hop", Some("hop_latency"), Some("100"), None, None)
                .unwrap();
        let mut c = Collector::new(Detectors::new(vec![rule], 64), Mode::Tolerant);
        let mut events = Vec::new();
        for (seq, latency) in [(10, 50), (11, 500), (14, 520), (13, 900), (15, 0)] {
            c.datagram(&datagram(seq, latency), 0, |e| events.push(e));
        }
        // 12 skipped, 13 late but inside the window: one missing, nothing lost yet.
        let seqs = c.sequences().unwrap();
        let (key, node) = seqs.nodes().next().unwrap();
        assert_eq!(*key, (42, 1));
        assert_eq!((node.received, node.lost, node.missing()), (5, 0, 1));
        // With shared sequences the numbers are handed out instead.
        let mut w = Collector::new(Detectors::new(vec![], 8), Mode::Strict).with_shared_sequences();
        for seq in [(1 << 22) - 2, (1 << 22) - 1, 1] {
            w.datagram(&datagram(seq, 0), 0, |_| {});
        }
        let seen: Vec<(u32, u8)> = w.take_observations().map(|o| (o.seq, o.bits)).collect();
        assert_eq!(seen, [((1 << 22) - 2, 22), ((1 << 22) - 1, 22), (1, 22)]);
        // per_hop at 100: 500 fires (from 0), 520 does not, 900 does, 0 does.
        let values: Vec<u64> = events.iter().map(|e| e.detection.value).collect();
        assert_eq!(values, [500, 900, 0]);
        assert_eq!(events[0].flow.dport, 5201);
        assert_eq!(events[0].detection.hop, Some((0, 42)));
    }

    /// A sink's report of an Ethernet/IPv4/UDP frame whose INT stack (source and one transit)
    /// has node ID, hop latency and ingress timestamp: the common shape.
    fn stacked(seq: u32, ingress_ts: u64) -> Vec<u8> {
        use telemark_wire::int_frame::{insert, push, Signal, Source};
        let mut frame = vec![0u8; 12];
        frame.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        frame.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2, 0x13, 0x88, 0x14, 0x51, 0, 8, 0, 0]);
        let fields = [Field::NodeId, Field::HopLatency, Field::IngressTs];
        let src = Source {
            signal: Signal::default(),
            instructions: Instructions::of(&fields),
            max_hops: 8,
            domain_id: 0,
        };
        for (node, ts) in [(1, 100), (2, ingress_ts)] {
            let mut hop = Hop::default();
            hop.set(Field::NodeId, node);
            hop.set(Field::HopLatency, 5);
            hop.set(Field::IngressTs, ts);
            if node == 1 {
                insert(&mut frame, &src, &hop, 1500).unwrap();
            } else {
                push(&mut frame, &src.signal, &hop, 1500).unwrap();
            }
        }
        let mut buf = [0u8; 256];
        let mut w = Writer::new(&mut buf, 0, seq, 2).unwrap();
        w.push(InType::Ethernet, Flags::default(), Instructions(0), &Hop::default(), &frame)
            .unwrap();
        let n = w.len();
        buf[..n].to_vec()
    }

    #[test]
    fn rules_see_fields_events_do_not_carry() {
        // Events carry no ingress timestamp, and a hop-latency rule does not read one.
        let rule =
            DetectRule::from_config("*", "per_hop", Some("hop_latency"), Some("1"), None, None)
                .unwrap();
        let mut c = Collector::new(Detectors::new(vec![rule], 64), Mode::Tolerant);
        let mut fired = Vec::new();
        c.datagram(&stacked(0, 5000), 0, |e| fired.push((e.time_ns, e.detection.value)));
        assert_eq!(fired, [(0, 5)]);
        // A rule that reads it gets it, from the next report on.
        let rule = DetectRule::from_config(
            "*",
            "complex",
            None,
            None,
            None,
            Some("max(ingress_ts) > 1000"),
        )
        .unwrap();
        c.detectors_mut().set_rules(vec![rule]);
        fired.clear();
        for (seq, ts) in [(1, 900), (2, 1001), (3, 50)] {
            c.datagram(&stacked(seq, ts), u64::from(seq), |e| fired.push((e.time_ns, 0)));
        }
        assert_eq!(fired, [(2, 0)]);
    }

    #[test]
    fn garbage_is_counted_not_fatal() {
        let mut c = Collector::new(Detectors::new(vec![], 8), Mode::Tolerant);
        c.datagram(&[0xff; 40], 0, |_| panic!("no event from garbage"));
        c.datagram(&[], 0, |_| panic!("no event from nothing"));
        assert_eq!(c.counts().refused[Refusal::Malformed as usize], 2);
        let mut n = 0;
        c.datagram(&datagram(1, 5), 0, |e| {
            assert!(e.rule.is_none(), "no rule: the switch's report passes as it is");
            n += 1;
        });
        assert_eq!(n, 1);
    }

    #[test]
    fn a_group_header_alone_is_refused_not_silently_counted() {
        // 8 bytes: v2.0 group header, hw_id 1, seq 3, node 42; no individual report.
        let empty = [0x20, 0x40, 0, 3, 0, 0, 0, 42];
        let mut c = Collector::new(Detectors::new(vec![], 8), Mode::Tolerant);
        c.datagram(&datagram(2, 0), 0, |_| {});
        c.datagram(&empty, 0, |_| panic!("no event from no report"));
        c.datagram(&datagram(4, 0), 0, |_| {});
        assert_eq!(c.counts().refused[Refusal::NoReports as usize], 1);
        assert_eq!(c.counts().reports, 2);
        // Its sequence number arrived: no report is missing.
        let (_, n) = c.sequences().unwrap().nodes().next().unwrap();
        assert_eq!((n.received, n.missing(), n.lost), (3, 0, 0));
        // Strictly, not a Telemetry Report at all.
        let mut s = Collector::new(Detectors::new(vec![], 8), Mode::Strict);
        s.datagram(&empty, 0, |_| {});
        assert_eq!(s.counts().refused[Refusal::Malformed as usize], 1);
        assert!(s.sequences().unwrap().nodes().next().is_none());
    }
}
