//! The INT roles of a Telemark switch, per flow rule (the INT paper §III-C "INT Mode"; INT
//! v2.1 §3 node roles): **source** inserts INT with the flow's instructions, **transit** pushes
//! this switch's metadata, **sink** strips INT, giving the receiver the original packet, and
//! runs the flow's detectors (every detect rule that covers it) on the path's metadata.
//!
//! Sans-IO: the caller says what the switch measured for the packet ([`Measured`]: ports,
//! its own ingress and egress times, the egress queue's occupancy) and gets the edited frame
//! and, at a sink, an event for each detector that fired and the Telemetry Report to send
//! ([`Output`]; INT Telemetry Report v2.0 §3, one individual report per datagram).

use telemark_core::int::{DetectRule, Detectors, Event, Outcome};
use telemark_core::watch::Rule;
use telemark_wire::dialect::Mode;
use telemark_wire::int::{Field, Hop, Instructions};
use telemark_wire::int_frame::{self, Edit, Signal, Source, MAX_HOPS};
use telemark_wire::report::{self, Flags, InType};
use telemark_wire::FlowKey;

/// Which packets a sink sends a Telemetry Report for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReportMode {
    /// None: events become records only.
    #[default]
    Off,
    /// Those for which any of the flow's detectors fired: the INT paper's filtering at the
    /// sink (§III-C); one report however many fired.
    Events,
    /// Every INT packet: the specification's sink without filtering (the paper's baseline).
    All,
}

/// What a sink hands on.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // handed by value to the caller's closure, never stored
pub enum Output<'a> {
    /// One of the flow's detectors fired (one each, in rule order, on the same packet).
    Event(Event),
    /// A Telemetry Report v2.0 datagram (one individual INT report) to send to the collector.
    Report(&'a [u8]),
}

/// Inner packet bytes a report carries at most: the headers and the INT stack, cut so that the
/// individual report fits its Report Length (255 words less the main contents).
const REPORT_INNER_MAX: usize = 900;

/// What a switch does with a flow's INT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Insert INT asking for `instructions`, for at most `max_hops` switches (this one too).
    Source {
        /// Metadata to collect.
        instructions: Instructions,
        /// RemainingHopCnt before this switch.
        max_hops: u8,
    },
    /// Push this switch's metadata.
    Transit,
    /// Strip INT and detect.
    Sink,
}

/// One rule: the flows it covers (`None`: every flow) and their role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleRule {
    /// Flows matched.
    pub flows: Option<Rule>,
    /// Their role here.
    pub role: Role,
}

/// The switch's INT settings.
#[derive(Debug, Clone, Copy)]
pub struct IntConfig {
    /// This switch's node ID.
    pub node_id: u32,
    /// How the domain signals INT.
    pub signal: Signal,
    /// Largest frame (from the IP header) INT may grow a packet to.
    pub mtu: usize,
    /// Domain-specific ID a source writes.
    pub domain_id: u16,
    /// Which packets a sink reports.
    pub report: ReportMode,
}

/// What the switch measured for one packet: the metadata it contributes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measured {
    /// Port the packet came in on.
    pub ingress_port: u16,
    /// Port it leaves by.
    pub egress_port: u16,
    /// When it came in (ns).
    pub ingress_ns: u64,
    /// When it leaves (ns).
    pub egress_ns: u64,
    /// The egress queue.
    pub queue_id: u8,
    /// Bytes in that queue when the packet joined it.
    pub queue_bytes: u32,
    /// Egress port utilisation.
    pub tx_utilization: u32,
}

/// What the roles did, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoleCounts {
    /// INT inserted (source).
    pub sourced: u64,
    /// Metadata pushed (transit).
    pub pushed: u64,
    /// INT stripped (sink).
    pub stripped: u64,
    /// Not added: RemainingHopCnt spent (E set).
    pub hop_count_exceeded: u64,
    /// Not added: the MTU (M set, or no INT inserted).
    pub mtu_exceeded: u64,
    /// INT that did not parse, left as it was.
    pub malformed: u64,
    /// Sink events (one per rule that fired).
    pub events: u64,
    /// Telemetry Reports handed on (one per datagram).
    pub reports: u64,
}

/// The roles and the sink's detectors.
#[derive(Debug)]
pub struct IntRoles {
    cfg: IntConfig,
    rules: Vec<RoleRule>,
    detectors: Detectors,
    counts: RoleCounts,
    /// The next report's sequence number (22 bits on the wire).
    report_seq: u32,
    /// The sink's copy of a packet's headers and INT, before stripping.
    inner: Vec<u8>,
    /// The report datagram being built.
    datagram: Vec<u8>,
}

impl IntRoles {
    /// Roles by `rules` (first match decides: a flow has one role here), detection at the sink
    /// by `detect` (every rule that matches a flow runs).
    pub fn new(
        cfg: IntConfig,
        rules: Vec<RoleRule>,
        detect: Vec<DetectRule>,
        flows: usize,
    ) -> Self {
        IntRoles {
            cfg,
            rules,
            detectors: Detectors::new(detect, flows),
            counts: RoleCounts::default(),
            report_seq: 0,
            inner: Vec::with_capacity(REPORT_INNER_MAX),
            datagram: vec![0; 2048],
        }
    }

    /// Replaces the rules and the sink's detector table (the controller changed them; the
    /// caller builds the table, off the fast path).
    pub fn set_rules(&mut self, rules: Vec<RoleRule>, detectors: Detectors) {
        self.rules = rules;
        self.detectors = detectors;
    }

    /// The counters.
    pub fn counts(&self) -> RoleCounts {
        self.counts
    }

    /// The sink's detector rules (to turn events into records).
    pub fn detect_rules(&self) -> &[DetectRule] {
        self.detectors.rules()
    }

    /// This switch's metadata for a packet: what it measured, every field a source may ask
    /// for. Hop latency is the time from ingress to egress, the egress timestamp the time it
    /// leaves.
    pub fn hop(&self, m: &Measured) -> Hop {
        let mut h = Hop::default();
        h.set(Field::NodeId, u64::from(self.cfg.node_id));
        h.set(Field::L1IngressIf, u64::from(m.ingress_port));
        h.set(Field::L1EgressIf, u64::from(m.egress_port));
        h.set(
            Field::HopLatency,
            m.egress_ns.saturating_sub(m.ingress_ns).min(u64::from(u32::MAX - 1)),
        );
        h.set(Field::QueueId, u64::from(m.queue_id));
        h.set(Field::QueueOccupancy, u64::from(m.queue_bytes.min(0xff_fffe)));
        h.set(Field::IngressTs, m.ingress_ns);
        h.set(Field::EgressTs, m.egress_ns);
        h.set(Field::L2IngressIf, u64::from(m.ingress_port));
        h.set(Field::L2EgressIf, u64::from(m.egress_port));
        h.set(Field::TxUtilization, u64::from(m.tx_utilization));
        h
    }

    fn role_of(&self, flow: &FlowKey) -> Option<Role> {
        self.rules.iter().find(|r| r.flows.as_ref().is_none_or(|f| f.matches(flow))).map(|r| r.role)
    }

    /// Applies the flow's role to `frame` leaving the switch; a sink's event and report go to
    /// `emit`.
    pub fn apply(&mut self, frame: &mut Vec<u8>, m: &Measured, mut emit: impl FnMut(Output<'_>)) {
        let signal = self.cfg.signal;
        // The flow, and where INT ends (what a sink's report carries of the frame).
        let found = match int_frame::find(frame, &signal, Mode::Tolerant) {
            Ok(f) => f.map(|f| (f.flow, f.layers.after_l4 + f.int.len)),
            Err(_) => {
                self.counts.malformed += 1;
                return;
            }
        };
        let own = self.hop(m);
        match found {
            // No INT yet: only a source acts.
            None => {
                let Some(flow) = int_frame::plain_flow(frame, int_frame::Start::Ethernet) else {
                    return;
                };
                if let Some(Role::Source { instructions, max_hops }) = self.role_of(&flow) {
                    let src =
                        Source { signal, instructions, max_hops, domain_id: self.cfg.domain_id };
                    match int_frame::insert(frame, &src, &own, self.cfg.mtu) {
                        Ok(Edit::Added) => self.counts.sourced += 1,
                        Ok(Edit::MtuExceeded) => self.counts.mtu_exceeded += 1,
                        Ok(_) => {}
                        Err(_) => self.counts.malformed += 1,
                    }
                }
            }
            Some((flow, int_end)) => match self.role_of(&flow) {
                Some(Role::Transit) => match int_frame::push(frame, &signal, &own, self.cfg.mtu) {
                    Ok(Edit::Added) => self.counts.pushed += 1,
                    Ok(Edit::MtuExceeded) => self.counts.mtu_exceeded += 1,
                    Ok(Edit::HopCountExceeded) => self.counts.hop_count_exceeded += 1,
                    Ok(Edit::Skipped) => {}
                    Err(_) => self.counts.malformed += 1,
                },
                Some(Role::Sink) => self.sink(frame, int_end, m, own, &mut emit),
                // A source sees INT it did not add: another domain's; left alone.
                Some(Role::Source { .. }) | None => {}
            },
        }
    }

    fn sink(
        &mut self,
        frame: &mut Vec<u8>,
        int_end: usize,
        m: &Measured,
        own: Hop,
        emit: &mut impl FnMut(Output<'_>),
    ) {
        if self.cfg.report != ReportMode::Off {
            // The report's inner packet: the frame as it arrived, up to the end of INT.
            let end = int_end.min(REPORT_INNER_MAX).min(frame.len());
            self.inner.clear();
            self.inner.extend_from_slice(&frame[..end]);
        }
        let stripped = match int_frame::strip(frame, &self.cfg.signal, Mode::Tolerant) {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(_) => {
                self.counts.malformed += 1;
                return;
            }
        };
        self.counts.stripped += 1;
        // The path, newest first: this switch, then the stack.
        let mut path = [Hop::default(); MAX_HOPS];
        path[0] = own;
        let n = 1 + stripped.hop_count.min(MAX_HOPS - 1);
        path[1..n].copy_from_slice(&stripped.hops()[..n - 1]);
        // Every rule that covers the flow runs; each that fires is an event naming its rule.
        let (flow, path) = (stripped.flow, &path[..n]);
        let fire =
            |rule, d| emit(Output::Event(Event::new(m.egress_ns, flow, Some(rule), d, path)));
        let fired = match self.detectors.detect(&flow, path, m.egress_ns, fire) {
            Outcome::Fired(k) => {
                self.counts.events += u64::from(k);
                true
            }
            Outcome::Quiet | Outcome::Unwatched => false,
        };
        let report = match self.cfg.report {
            ReportMode::Off => false,
            ReportMode::Events => fired,
            ReportMode::All => true,
        };
        if report {
            if let Some(len) = self.write_report(stripped.header.instructions, &own) {
                self.counts.reports += 1;
                emit(Output::Report(&self.datagram[..len]));
            }
        }
    }

    /// A Telemetry Report v2.0 datagram: this switch's metadata for the flow's instructions
    /// (RepMdBits: bits 1–8 only, as bit 0 is reserved, the node ID being in the group
    /// header, and bits 9–15 mean other things in a report), the packet as it arrived as the
    /// inner Ethernet contents.
    fn write_report(&mut self, instructions: Instructions, own: &Hop) -> Option<usize> {
        let md_bits = Instructions(instructions.0 & 0x7f80);
        let seq = self.report_seq;
        let mut w = report::Writer::new(&mut self.datagram, 0, seq, self.cfg.node_id).ok()?;
        let flags = Flags { tracked_flow: true, ..Flags::default() };
        w.push(InType::Ethernet, flags, md_bits, own, &self.inner).ok()?;
        self.report_seq = (seq + 1) & 0x3f_ffff;
        Some(w.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet / IPv4 / UDP 10.0.0.1:4000 → 10.0.3.3:5201 with `payload`.
    fn packet(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let total = (20 + 8 + payload.len()) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 3, 3]);
        let c = telemark_wire::checksum::checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&4000u16.to_be_bytes());
        f.extend_from_slice(&5201u16.to_be_bytes());
        f.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    fn switch(node: u32, role: Role, detect: Vec<DetectRule>) -> IntRoles {
        let cfg = IntConfig {
            node_id: node,
            signal: Signal::default(),
            mtu: 1500,
            domain_id: 0,
            report: ReportMode::Events,
        };
        let rules = vec![RoleRule { flows: Some("dst=10.0.3.0/24".parse().unwrap()), role }];
        IntRoles::new(cfg, rules, detect, 64)
    }

    fn at(t: u64, queue_bytes: u32) -> Measured {
        Measured {
            ingress_port: 1,
            egress_port: 2,
            ingress_ns: t,
            egress_ns: t + 1_000 + u64::from(queue_bytes),
            queue_bytes,
            ..Measured::default()
        }
    }

    #[test]
    fn source_transit_sink_carry_measured_metadata_and_give_the_packet_back() {
        let ins = Instructions::of(&[Field::NodeId, Field::HopLatency, Field::QueueOccupancy]);
        let mut s1 = switch(1, Role::Source { instructions: ins, max_hops: 8 }, vec![]);
        let mut s2 = switch(2, Role::Transit, vec![]);
        let detect = DetectRule::from_config("*", "noop", None, None, None, None).unwrap();
        let mut s3 = switch(3, Role::Sink, vec![detect]);
        let original = packet(b"hello, int");
        let mut f = original.clone();
        s1.apply(&mut f, &at(0, 0), |_| panic!("a source emits nothing"));
        assert!(f.len() > original.len());
        s2.apply(&mut f, &at(10_000, 4_000), |_| panic!("a transit emits nothing"));
        let mut events = Vec::new();
        let mut reports = Vec::new();
        let inner_sent = f.clone();
        s3.apply(&mut f, &at(20_000, 500), |o| match o {
            Output::Event(e) => events.push(e),
            Output::Report(r) => reports.push(r.to_vec()),
        });
        assert_eq!(f, original, "the receiver gets the original packet");
        // One v2.0 report: the sink's own metadata, the packet as it arrived inside.
        assert_eq!(reports.len(), 1);
        let mut parsed = report::parse(&reports[0], Mode::Strict).unwrap();
        let r = parsed.next().unwrap().unwrap();
        assert_eq!(r.node_id, Some(3));
        assert_eq!(r.metadata().get(Field::QueueOccupancy), Some(500));
        let found = int_frame::find_reported(r.inner, int_frame::Start::Ethernet, Mode::Strict)
            .unwrap()
            .unwrap();
        assert_eq!((found.flow.dport, found.int.hop_count()), (5201, 2));
        assert!(inner_sent.starts_with(&r.inner[..found.layers.after_l4 + found.int.len]));
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(e.flow.dport, 5201);
        let path: Vec<(u32, u32, u32)> = e.hops[..usize::from(e.hop_count)]
            .iter()
            .map(|h| (h.switch_id, h.hop_latency, h.queue_occupancy))
            .collect();
        // Newest first: the sink, the transit, the source; latency = egress - ingress.
        assert_eq!(path, [(3, 1_500, 500), (2, 5_000, 4_000), (1, 1_000, 0)]);
        assert_eq!((s1.counts().sourced, s2.counts().pushed, s3.counts().stripped), (1, 1, 1));
    }

    #[test]
    fn a_sink_runs_every_detect_rule_of_the_flow_and_reports_once() {
        let ins = Instructions::of(&[Field::NodeId, Field::HopLatency]);
        let mut s1 = switch(1, Role::Source { instructions: ins, max_hops: 8 }, vec![]);
        let rule = |flows: &str, det: &str, thr: Option<&str>| {
            DetectRule::from_config(flows, det, thr.map(|_| "hop_latency"), thr, None, None)
                .unwrap()
        };
        let detect = vec![
            rule("*", "noop", None),
            rule("proto=tcp", "noop", None),
            rule("proto=udp", "per_hop", Some("1us")),
        ];
        let mut s3 = switch(3, Role::Sink, detect);
        let mut f = packet(b"both");
        s1.apply(&mut f, &at(0, 0), |_| {});
        let (mut events, mut reports) = (Vec::new(), 0);
        // The sink's hop latency is 1,500 ns (past 1 us), the source's 1,000 (not).
        s3.apply(&mut f, &at(20_000, 500), |o| match o {
            Output::Event(e) => events.push((e.rule, e.detection.value, e.detection.hop)),
            Output::Report(_) => reports += 1,
        });
        assert_eq!(events, [(Some(0), 0, None), (Some(2), 1_500, Some((0, 3)))]);
        assert_eq!((reports, s3.counts().events, s3.counts().reports), (1, 2, 1));
    }

    #[test]
    fn flows_without_a_rule_pass_untouched() {
        let mut s1 =
            switch(1, Role::Source { instructions: Instructions(0x8000), max_hops: 4 }, vec![]);
        let mut other = packet(b"x");
        other[30..34].copy_from_slice(&[192, 0, 2, 1]); // dst outside the rule
        let before = other.clone();
        s1.apply(&mut other, &at(0, 0), |_| {});
        assert_eq!(other, before);
        assert_eq!(s1.counts(), RoleCounts::default());
    }
}
