//! The eBPF datapath (docs/ebpf.md): the programs of `telemark_datapath::ebpf` attached to the
//! host's own interfaces, their counters read twice a period and handed to the aggregation as
//! batch events, exactly as the AF_PACKET switch hands its own (datapath.rs).
//!
//! Points. Each `[[port]]` interface has an ingress point (`mark:<if>` where the domain
//! starts, else `in:<if>`) and an egress point `out:<if>`. Which ingress a flow leaving by an
//! interface came in by depends on how the host forwards, which the agent does not know, so
//! an egress point is one per (interface out, interface in) pair, added when a flow first
//! shows the pair: `out:<if>` measured against the flow's ingress point in this agent.

use crate::config::{AgentConfig, EbpfPortConfig, EbpfSettings, OwnColourMode};
use crate::datapath::{Datapath, Started};
use crate::ebpf_flows::EbpfFlows;
use crate::error::AgentError;
use crate::flow_export::PortInfo;
use crate::shared::Shared;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use telemark_core::loss::EventSink;
use telemark_core::loss::{BatchEvent, BatchEventKind, PointSpec};
use telemark_core::spsc;
use telemark_datapath::ebpf::maps::{
    DropKey, EgressAction, IngressAction, Key, OwnColour, Port, Stat,
};
use telemark_datapath::ebpf::periods::{PeriodReader, Reading};
use telemark_datapath::ebpf::{self, Attached, Programs, Samples, Settings, Target};
use telemark_datapath::events::RingSink;
use telemark_wire::FlowKey;

/// Interfaces the kernel programs tell apart: two points each (ingress 2i, egress 2i + 1).
const MAX_PORTS: usize = 127;

/// Pages of each CPU's perf buffer of sampled packets (64 × 4 KiB).
const SAMPLE_PAGES: usize = 64;

pub(crate) struct EbpfPath {
    agent: String,
    settings: EbpfSettings,
    programs: Programs,
    events: RingSink,
    /// Events sent since the aggregation's doorbell was last rung.
    unrung: usize,
    reader: PeriodReader,
    /// The newest final period when the counters were last read: they are read again only
    /// once a later one is final (a walk of map "counts" visits all its buckets, 16 bytes per
    /// flow it could hold, however few flows it has).
    read_upto: u64,
    /// Attached interfaces by target.
    attached: HashMap<Target, Attached>,
    /// The slot each target got, kept so a re-created interface keeps its points.
    slots: HashMap<Target, usize>,
    /// Per slot: its target, the aggregator's ingress point, and the `[[port]]` it matched.
    ports: Vec<(Target, u8, EbpfPortConfig)>,
    /// Per slot: when its interface was last attached (Unix time). A period that began before
    /// (less the guard, in which a period's early packets come) was counted only in part there:
    /// it is no measurement and is not reported ([`EbpfPath::whole_since`]).
    attached_ns: Vec<u64>,
    /// Egress points by (slot out, ingress point it is measured against, if any).
    out_points: HashMap<(usize, Option<u8>), u8>,
    /// The aggregator's points so far (it adds the ones published in `shared.new_points`),
    /// as (name, port) for `/metrics`.
    point_labels: Vec<(String, String)>,
    /// Whether a point was refused for want of numbers (said once).
    out_of_points: bool,
    /// Each flow's ingress point and its slot, as last seen.
    flow_in: HashMap<FlowKey, (u8, usize)>,
    /// The port (slot) each flow last left by.
    flow_out: HashMap<FlowKey, usize>,
    /// The flow meter and heavy-hitter stages (ebpf_flows.rs), and whether sFlow or IPFIX is on.
    flows: EbpfFlows,
    meter: bool,
    /// Each slot's interface as sFlow and IPFIX name it.
    port_infos: Vec<PortInfo>,
    /// The kernel's sampled packets (with `[sflow]`).
    samples: Option<Samples>,
    /// Targets that failed to attach, so each failure is logged once.
    failed: HashMap<Target, String>,
    refused_seen: Vec<u64>,
    /// Periods the kernel overwrote before they were read, as last seen.
    overruns: u64,
    /// Each flow's newest closed batch at each kernel point (either colour: the key's colour
    /// is 0 here), held until the next one closes (then it is sent as it is) or the flow goes
    /// idle or the agent stops (then it is sent as the tail: the point's watch of the flow
    /// ended with it, so the batches upstream of it can be judged).
    held: HashMap<Key, BatchEvent>,
    shared: std::sync::Arc<Shared>,
    next_scan: Instant,
    /// Drops per flow and reason as last read (the kernel's counts are cumulative).
    drops_seen: HashMap<DropKey, u64>,
    /// The kernel's drop reason names by number (its BTF).
    reason_names: HashMap<u64, String>,
    /// When the drops per reason are read next.
    next_reasons: Instant,
    /// Flows no longer measured here, each with the events handed to the aggregation so far
    /// (`RingSink::handed`, gaps included) once its tail batches were sent:
    /// their drops not named yet are forgotten once the aggregation has taken that many
    /// events (Shared::events_handled), so after the tail records that could name them.
    leaving: Vec<(FlowKey, u64)>,
    /// `[ebpf] own_colour = "keep"`: each flow a marker left as its sender coloured it (by
    /// its key in map "own"), with its packets so far and when they last grew (Unix time).
    own_seen: HashMap<Key, (u64, u64)>,
}

/// Loads the programs and attaches them to the interfaces there are now.
pub(crate) fn open(
    cfg: &AgentConfig,
    eb: &EbpfSettings,
    shared: std::sync::Arc<Shared>,
) -> Result<Started, AgentError> {
    let sflow = cfg.sflow.as_ref().map(|s| s.settings);
    let settings = Settings {
        period_ns: eb.period_ns,
        guard_ns: eb.guard_ns,
        colour_bit: cfg.loss.color_bit,
        own_colour: match eb.own_colour {
            OwnColourMode::Keep => OwnColour::Keep,
            OwnColourMode::Overwrite => OwnColour::Overwrite,
        },
        sample_rate: sflow.map_or(0, |s| s.rate),
        sample_bytes: sflow.map_or(0, |s| s.header_bytes as u32),
    };
    let load_err = |e: ebpf::Error| AgentError::Port(std::io::Error::other(e.to_string()));
    let mut programs = Programs::load(eb.flows, settings).map_err(load_err)?;
    // Each CPU's buffer holds about a thousand samples: several sweeps' worth at 1 in 400.
    let samples = match sflow {
        Some(_) => Some(programs.open_samples(SAMPLE_PAGES).map_err(load_err)?),
        None => None,
    };
    if let Some(why) = &programs.drops_unavailable {
        tracing::warn!("drop reasons unavailable (skb:kfree_skb): {why}");
    }
    let (prod, events) = spsc::channel::<BatchEvent>(1 << 16);
    let (_int_prod, int_events) = spsc::channel(16);
    let (flows, meter_rings, hh_windows) = EbpfFlows::new(
        cfg.sflow.is_some(),
        cfg.ipfix.as_ref(),
        cfg.heavy_hitters.as_ref(),
        eb.period_ns,
    );
    let meter = cfg.sflow.is_some() || cfg.ipfix.is_some();
    let mut path = EbpfPath {
        agent: cfg.agent.clone(),
        settings: eb.clone(),
        programs,
        events: RingSink::new(prod),
        unrung: 0,
        reader: PeriodReader::with_settle(
            eb.period_ns,
            eb.guard_ns,
            ebpf::settle_ns(eb.period_ns, eb.guard_ns),
        ),
        read_upto: 0,
        attached: HashMap::new(),
        slots: HashMap::new(),
        ports: Vec::new(),
        attached_ns: Vec::new(),
        out_points: HashMap::new(),
        point_labels: Vec::new(),
        out_of_points: false,
        flow_in: HashMap::new(),
        flow_out: HashMap::new(),
        flows,
        meter,
        port_infos: Vec::new(),
        samples,
        failed: HashMap::new(),
        refused_seen: vec![0; 256],
        overruns: 0,
        held: HashMap::new(),
        shared,
        next_scan: Instant::now(),
        drops_seen: HashMap::new(),
        reason_names: ebpf::btf::drop_reasons(),
        next_reasons: Instant::now(),
        leaving: Vec::new(),
        own_seen: HashMap::new(),
    };
    path.scan();
    if path.attached.is_empty() {
        tracing::warn!("eBPF: no interface matches a [[port]] yet; looking again every rescan");
    }
    Ok(Started {
        path: Box::new(path),
        ports: Vec::new(),
        events,
        int_events,
        hh_windows,
        meter_rings: meter.then_some(meter_rings),
    })
}

/// Whether `name` matches `pattern` (`*` matches any run of characters).
fn matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// A point name from an interface label: letters, digits and `-_.:` (records' rule).
fn point_name(prefix: &str, label: &str) -> String {
    let clean: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.:".contains(c) { c } else { '_' })
        .collect();
    let mut n = format!("{prefix}:{clean}");
    n.truncate(64);
    n
}

impl EbpfPath {
    /// Publishes a point to the aggregation; its number (`None`: 255 points taken).
    fn add_point(&mut self, spec: PointSpec) -> Option<u8> {
        if self.point_labels.len() >= usize::from(u8::MAX) {
            if !self.out_of_points {
                tracing::warn!(
                    "eBPF: all 255 points are taken; new interfaces and paths are not \
                     measured until the agent restarts"
                );
                self.out_of_points = true;
            }
            return None;
        }
        let id = self.point_labels.len() as u8;
        self.point_labels.push((spec.name.clone(), spec.port.clone()));
        self.shared.new_points.lock().unwrap_or_else(|p| p.into_inner()).push(spec);
        Some(id)
    }

    /// Takes the `[[port]]`s a reload gave: interfaces no longer matched are detached, those
    /// whose role changed (marking, unmarking, upstream) get new points.
    fn reload(&mut self) {
        let new = self.shared.new_ebpf_ports.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(ports) = new {
            tracing::info!("eBPF: {} [[port]]s from the reload", ports.len());
            self.settings.ports = ports;
            self.failed.clear();
            self.scan();
        }
    }

    /// Attaches to interfaces that match a `[[port]]` and are not attached yet; detaches those
    /// no `[[port]]` matches any more; forgets those that are gone (the kernel has released
    /// their hooks with them).
    fn scan(&mut self) {
        let mut seen: Vec<(Target, EbpfPortConfig, u32)> = Vec::new();
        let mut listed: HashMap<Option<String>, Vec<(String, u32)>> = HashMap::new();
        for pc in &self.settings.ports {
            let list = listed.entry(pc.netns.clone()).or_insert_with(|| {
                ebpf::interfaces(pc.netns.as_deref()).unwrap_or_else(|e| {
                    tracing::debug!("eBPF: listing interfaces of {:?}: {e}", pc.netns);
                    Vec::new()
                })
            });
            for (name, ifindex) in list.iter() {
                let t = Target { netns: pc.netns.clone(), iface: name.clone() };
                if matches(&pc.interface, name) && !seen.iter().any(|s| s.0 == t) {
                    seen.push((t, pc.clone(), *ifindex));
                }
            }
        }
        // Gone, or re-created under the same name with another index.
        let gone: Vec<Target> = self
            .attached
            .iter()
            .filter(|(t, a)| !seen.iter().any(|(s, _, i)| s == *t && *i == a.ifindex))
            .map(|(t, _)| t.clone())
            .collect();
        for t in gone {
            if let Some(a) = self.attached.remove(&t) {
                tracing::info!("eBPF: {} is gone or no longer matched; detached", t.label());
                self.programs.detach(a);
            }
        }
        // A role changed by a reload: new points (the old ones' batches stay as they were);
        // anything else of its `[[port]]` (how its name was matched) changes nothing.
        for (t, pc, _) in &seen {
            let Some(&slot) = self.slots.get(t) else { continue };
            if self.ports[slot].2.role() == pc.role() {
                self.ports[slot].2 = pc.clone();
            } else {
                if let Some(a) = self.attached.remove(t) {
                    tracing::info!("eBPF: {}'s [[port]] changed; attached anew", t.label());
                    self.programs.detach(a);
                }
                self.slots.remove(t);
            }
        }
        for (t, pc, _) in seen {
            if self.attached.contains_key(&t) {
                continue;
            }
            if let Err(e) = self.attach(&t, &pc) {
                if self.failed.get(&t) != Some(&e) {
                    tracing::warn!("eBPF: {e}");
                    self.failed.insert(t, e);
                }
            }
        }
    }

    fn attach(&mut self, t: &Target, pc: &EbpfPortConfig) -> Result<(), String> {
        let slot = match self.slots.get(t) {
            Some(s) => *s,
            None => {
                if self.ports.len() >= MAX_PORTS {
                    return Err(format!("{}: at most {MAX_PORTS} interfaces", t.label()));
                }
                let label = t.label();
                let ingress = self
                    .add_point(PointSpec {
                        name: point_name(if pc.mark { "mark" } else { "in" }, &label),
                        agent: self.agent.clone(),
                        port: label.clone(),
                        upstream: None,
                        marker: pc.mark,
                        skew_ns: 0,
                        upstream_label: pc.upstream.clone(),
                        // Traffic arriving here unmarked comes from another agent's point.
                        every_batch: self.settings.report_crossings && !pc.mark,
                    })
                    .ok_or("255 points taken")?;
                self.ports.push((t.clone(), ingress, pc.clone()));
                self.shared.port_labels.lock().unwrap_or_else(|p| p.into_inner()).push(label);
                self.slots.insert(t.clone(), self.ports.len() - 1);
                self.ports.len() - 1
            }
        };
        let port = Port {
            in_point: (2 * slot) as u8,
            out_point: (2 * slot + 1) as u8,
            in_action: if pc.mark { IngressAction::Mark } else { IngressAction::Count } as u8,
            out_action: if pc.unmark { EgressAction::Unmark } else { EgressAction::Count } as u8,
        };
        let attached = self.programs.attach(t, port).map_err(|e| e.to_string())?;
        if self.attached_ns.len() <= slot {
            self.attached_ns.resize(slot + 1, 0);
        }
        self.attached_ns[slot] = ebpf::now();
        tracing::info!("eBPF: attached to {} ({:?})", t.label(), attached.hook);
        // sFlow and IPFIX name the port by its interface index (a re-created one has another).
        if self.port_infos.len() <= slot {
            self.port_infos.resize(slot + 1, PortInfo { ifindex: 0 });
        }
        self.port_infos[slot] = PortInfo { ifindex: attached.ifindex };
        if self.meter {
            *self.shared.new_ports.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(self.port_infos.clone());
        }
        self.failed.remove(t);
        self.attached.insert(t.clone(), attached);
        Ok(())
    }

    /// Whether period `period` was counted whole at `slot`'s interface: it began a guard or
    /// more after the interface was attached (packets of a period are counted from a guard
    /// before it begins, as early ones from a host whose clock is ahead).
    fn whole_since(&self, slot: usize, period: u64) -> bool {
        let begins = period.saturating_mul(self.settings.period_ns);
        let attached = self.attached_ns.get(slot).copied().unwrap_or(u64::MAX);
        begins >= attached.saturating_add(self.settings.guard_ns)
    }

    /// The aggregator's egress point for flows leaving by `slot` that came in at `ingress`.
    fn out_point(&mut self, slot: usize, ingress: Option<u8>) -> Option<u8> {
        if let Some(p) = self.out_points.get(&(slot, ingress)) {
            return Some(*p);
        }
        let label = self.ports[slot].0.label();
        let p = self.add_point(PointSpec {
            name: point_name("out", &label),
            agent: self.agent.clone(),
            port: label,
            upstream: ingress,
            marker: false,
            skew_ns: 0,
            upstream_label: None,
            // Traffic leaving here marked goes on to another agent's point.
            every_batch: self.settings.report_crossings && !self.ports[slot].2.unmark,
        })?;
        self.out_points.insert((slot, ingress), p);
        Some(p)
    }

    /// Hands one event to the aggregation (an event that finds no room is counted, and the
    /// aggregation told of it by a gap before the next one: `RingSink`).
    fn send(&mut self, ev: BatchEvent) {
        self.events.emit(ev);
        // A sweep may close a batch of every flow at once: the aggregation, maybe asleep, is
        // woken long before they could fill its ring.
        self.unrung += 1;
        if self.unrung >= self.events.capacity() / 8 {
            self.unrung = 0;
            self.shared.aggregation_bell.ring();
        }
    }

    /// Reads the counters: final periods become closed batches, late packets late events.
    fn sweep(&mut self) {
        if let Ok(true) = self.programs.refresh_clocks() {
            tracing::info!("eBPF: the clock was set or a leap second passed: followed");
        }
        if let Err(e) = self.programs.share_restore() {
            tracing::warn!("eBPF: {e}");
        }
        let now = ebpf::now();
        let mut out = Vec::new();
        let upto = self.reader.final_upto(now);
        // Late packets of periods already read, and drops, wait for the next final one.
        let walk = upto != self.read_upto;
        // The drops as they were before the walk: every flow they are of was counted before
        // them, so the walk tells which were measured here.
        let drops = if walk { self.programs.drops().ok() } else { None };
        if walk {
            let reader = &mut self.reader;
            if let Err(e) =
                self.programs.for_each_count(|k, cpus| reader.read(now, k, cpus, &mut out))
            {
                tracing::warn!("eBPF: {e}");
                return;
            }
            self.read_upto = upto;
            let _ = self.programs.set_read_upto(upto);
        }
        // Ingress points first: a flow's ingress tells which egress point its exit is.
        out.sort_by_key(|r| match r {
            Reading::Closed(c) => (c.key.point % 2, c.period),
            Reading::Late { key, period, .. } => (key.point % 2, *period),
        });
        for r in &out {
            if let Reading::Closed(c) = r {
                let slot = usize::from(c.key.point / 2);
                if let Some((_, ingress, _)) = self.ports.get(slot) {
                    if c.key.point % 2 == 0 {
                        self.flow_in.insert(c.key.flow(), (*ingress, slot));
                    } else if self.meter {
                        self.flow_out.insert(c.key.flow(), slot);
                    }
                }
            }
        }
        // Drops before the batches they explain, so that their records can name them.
        if let Some(drops) = drops {
            self.drops(drops);
        }
        let unmeasured = if walk { self.own_colour(now, upto) } else { HashSet::new() };
        for r in out {
            let (key, period) = match &r {
                Reading::Closed(c) => (c.key, c.period),
                Reading::Late { key, period, .. } => (*key, *period),
            };
            let slot = usize::from(key.point / 2);
            let Some((_, ingress, _)) = self.ports.get(slot) else { continue };
            let ingress = *ingress;
            let flow = key.flow();
            let point = if key.point % 2 == 0 {
                ingress
            } else {
                let from = self.flow_in.get(&flow).map(|(p, _)| *p);
                match self.out_point(slot, from) {
                    Some(p) => p,
                    None => continue,
                }
            };
            if let Reading::Closed(c) = &r {
                if key.point % 2 == 0 {
                    self.flows.ingress(slot, self.flow_out.get(&flow).copied(), c);
                } else {
                    self.flows.egress(slot, c);
                }
            }
            // A flow whose colour bit is its sender's is metered (above), not measured.
            if unmeasured.contains(&flow) {
                continue;
            }
            // A period one of the flow's points here was attached during is no measurement
            // (docs/ebpf.md, "Clocks and periods"): the batches around it make it unmeasured
            // here, and at the collector.
            let from_slot = match key.point % 2 {
                0 => None,
                _ => self.flow_in.get(&flow).map(|(_, s)| *s),
            };
            if !self.whole_since(slot, period)
                || from_slot.is_some_and(|s| !self.whole_since(s, period))
            {
                continue;
            }
            let ordinal = (period as u32).max(1);
            let ev = match r {
                Reading::Closed(c) => BatchEvent {
                    key: flow,
                    point,
                    kind: BatchEventKind::Closed,
                    color: key.colour,
                    ordinal,
                    count: u32::try_from(c.packets).unwrap_or(u32::MAX),
                    first_ns: c.first_ns,
                    last_ns: c.last_ns,
                    tail: false,
                    head: false,
                    cut: false,
                    // The period's colour's key, else the other's: a flow keeps its TTL.
                    ttl: self
                        .programs
                        .ttl(&key)
                        .or_else(|| self.programs.ttl(&Key { colour: key.colour ^ 1, ..key })),
                },
                Reading::Late { count, .. } => BatchEvent {
                    key: flow,
                    point,
                    kind: BatchEventKind::Late,
                    color: key.colour,
                    ordinal,
                    count: u32::try_from(count).unwrap_or(u32::MAX),
                    ..BatchEvent::gap()
                },
            };
            let either = Key { colour: 0, ..key };
            match ev.kind {
                BatchEventKind::Closed => {
                    if let Some(before) = self.held.insert(either, ev) {
                        self.send(before);
                    }
                }
                _ => {
                    // Late packets of the held batch: it goes first.
                    if self.held.get(&either).is_some_and(|h| h.ordinal == ev.ordinal) {
                        if let Some(before) = self.held.remove(&either) {
                            self.send(before);
                        }
                    }
                    self.send(ev);
                }
            }
        }
        self.refusals();
        self.overruns();
        self.flows.tick(now, self.reader.final_upto(now), self.ports.len());
        self.samples();
        self.unrung = 0;
        self.shared.aggregation_bell.ring();
    }

    /// `[ebpf] own_colour = "keep"`: names the flows markers left as their senders coloured
    /// them (a record of the marker's point for each period up to `upto` that had some, with
    /// their packets), and returns the flows not measured here: those, while their packets
    /// may be in the periods being read, and those an exit left with the bit ("unsure"). Their
    /// packets carry a colour bit that says nothing of their period, so what the points
    /// counted of them is no measurement.
    fn own_colour(&mut self, now: u64, upto: u64) -> HashSet<FlowKey> {
        let mut unmeasured = HashSet::new();
        if self.settings.own_colour != OwnColourMode::Keep {
            return unmeasured;
        }
        let t = self.settings.period_ns.max(1);
        // A period is read a guard and the settling after it ends: packets that grew a count
        // up to two periods before that may be in it.
        let reach = 3 * t + self.settings.guard_ns + ebpf::settle_ns(t, self.settings.guard_ns);
        match self.programs.own_colour() {
            Ok(counts) => {
                let mut live = HashSet::new();
                for (key, total) in counts {
                    live.insert(key);
                    let (seen, last) = self.own_seen.get(&key).copied().unwrap_or((0, 0));
                    // Fewer than seen: the map forgot the flow (LRU) and counts it anew.
                    let seen = if total < seen { 0 } else { seen };
                    if total > seen {
                        self.own_seen.insert(key, (total, now));
                        if let Some((_, marker, _)) = self.ports.get(usize::from(key.point / 2)) {
                            let period = upto.max(1);
                            self.send(BatchEvent {
                                key: key.flow(),
                                point: *marker,
                                kind: BatchEventKind::OwnColour,
                                ordinal: period as u32,
                                count: u32::try_from(total - seen).unwrap_or(u32::MAX),
                                first_ns: period.saturating_mul(t),
                                last_ns: now,
                                ..BatchEvent::gap()
                            });
                        }
                        unmeasured.insert(key.flow());
                    } else if now.saturating_sub(last) <= reach {
                        unmeasured.insert(key.flow());
                    }
                }
                self.own_seen.retain(|k, _| live.contains(k));
            }
            Err(e) => tracing::warn!("eBPF: {e}"),
        }
        match self.programs.unsure() {
            Ok(keys) => unmeasured.extend(keys.iter().map(Key::flow)),
            Err(e) => tracing::warn!("eBPF: {e}"),
        }
        unmeasured
    }

    /// Hands the packets the kernel sampled to the sFlow exporter, each with its port's
    /// sample pool and lost samples as of now.
    fn samples(&mut self) {
        let Some(samples) = &mut self.samples else { return };
        let points = 2 * self.ports.len() as u32;
        let samplers = self.programs.samplers(points).unwrap_or_default();
        let flows = &mut self.flows;
        let ports = self.ports.len();
        let (lost, bad) = samples.drain(|meta, bytes| {
            let slot = usize::from(meta.in_point / 2);
            let Some(&(pool, lost)) = samplers.get(usize::from(meta.in_point)) else { return };
            if slot < ports {
                flows.sampled(slot, &meta, bytes, pool, lost);
            }
        });
        if bad > 0 {
            tracing::warn!("eBPF: {bad} sampled packets were malformed");
        }
        self.flows.samples_lost(lost);
    }

    /// Periods overwritten before they were read make what the batches around them say
    /// uncertain (a gap in the events, as a full event ring is), never loss.
    fn overruns(&mut self) {
        let Ok(n) = self.programs.stat(Stat::Overrun) else { return };
        if n > self.overruns {
            tracing::warn!("eBPF: {} periods overwritten before they were read", n - self.overruns);
            self.overruns = n;
            self.events.owe_gap();
        }
    }

    fn reason_name(&self, reason: u32) -> String {
        match self.reason_names.get(&u64::from(reason)) {
            Some(n) => n.clone(),
            None => format!("REASON_{reason}"),
        }
    }

    /// Hands the kernel's new drops of measured flows (`now`, as read before the last walk) to
    /// the aggregation (it names them in the flow's next lossy record); forgets those of flows
    /// not measured here.
    fn drops(&mut self, now: Vec<(DropKey, u64)>) {
        let mut unwatched = Vec::new();
        let mut fresh: Vec<(FlowKey, String, u64)> = Vec::new();
        // Flows counted at some point here (the walk found every key the drops may be of).
        let measured = if now.is_empty() { HashSet::new() } else { self.live_flows() };
        for (k, n) in now {
            let flow = k.flow.flow();
            if !measured.contains(&flow) {
                unwatched.push(k);
                self.drops_seen.remove(&k);
                continue;
            }
            let seen = self.drops_seen.insert(k, n).unwrap_or(0);
            if n > seen {
                fresh.push((flow, self.reason_name(k.reason), n - seen));
            }
        }
        if !unwatched.is_empty() {
            let _ = self.programs.remove_drops(&unwatched);
        }
        if !fresh.is_empty() {
            let mut pending = self.shared.pending_drops.lock().unwrap_or_else(|p| p.into_inner());
            for (flow, reason, n) in fresh {
                *pending.entry(flow).or_default().entry(reason).or_default() += n;
            }
        }
        // All 512 reasons are 512 reads: once a second is enough for /metrics.
        if Instant::now() >= self.next_reasons {
            self.next_reasons = Instant::now() + Duration::from_secs(1);
            if let Ok(by_reason) = self.programs.reasons() {
                let named = by_reason.into_iter().map(|(r, n)| (self.reason_name(r), n)).collect();
                *self.shared.kernel_drops.lock().unwrap_or_else(|p| p.into_inner()) = named;
            }
        }
    }

    /// Tells the aggregator which points have refused flows (it then treats a flow's first
    /// batch there as possibly partial, never as loss).
    fn refusals(&mut self) {
        let Ok(refused) = self.programs.refused(2 * self.ports.len() as u32) else { return };
        for (kp, n) in refused.iter().enumerate() {
            if *n <= self.refused_seen[kp] {
                continue;
            }
            self.refused_seen[kp] = *n;
            let slot = kp / 2;
            if kp % 2 == 0 {
                self.flows.refused(slot, ebpf::now() / self.settings.period_ns.max(1));
            }
            let points: Vec<u8> = if kp % 2 == 0 {
                vec![self.ports[slot].1]
            } else {
                self.out_points.iter().filter(|((s, _), _)| *s == slot).map(|(_, p)| *p).collect()
            };
            for point in points {
                self.send(BatchEvent::refused(&FlowKey::default(), point));
            }
        }
    }

    /// Forgets flows idle past the loss monitor's idle timeout (kernel entries included).
    fn expire(&mut self, idle_ns: u64) {
        let now = ebpf::now();
        self.forget_left_drops();
        let idle = self.reader.idle(now.saturating_sub(idle_ns), now);
        if idle.is_empty() {
            return;
        }
        let reader = &self.reader;
        let keys = match self.programs.remove_quiet_counts(&idle, |k, c| reader.quiet(k, c)) {
            Ok(keys) => keys,
            Err(e) => {
                tracing::warn!("eBPF: {e}");
                return;
            }
        };
        for k in &keys {
            self.reader.forget(k);
            let either = Key { colour: 0, ..*k };
            // The flow's last batch here, once both colours' keys are idle.
            if let Some(ev) = self.held.get(&either).copied() {
                if ev.color == k.colour {
                    self.held.remove(&either);
                    self.send(BatchEvent { tail: true, ..ev });
                }
            }
        }
        if !keys.is_empty() {
            // Flows no longer counted at any point are no longer measured here.
            let live = self.live_flows();
            self.flow_in.retain(|f, _| live.contains(f));
            self.flow_out.retain(|f, _| live.contains(f));
            let left: HashSet<FlowKey> =
                keys.iter().map(|k| k.flow()).filter(|f| !live.contains(f)).collect();
            self.leaving.extend(left.into_iter().map(|f| (f, self.events.handed)));
            // The tail batches go to the aggregation now, not at the next sweep.
            self.shared.aggregation_bell.ring();
        }
    }

    /// Flows counted at some point here now.
    fn live_flows(&self) -> HashSet<FlowKey> {
        self.reader.keys().map(|k| k.flow()).collect()
    }

    /// Forgets the drops not named of flows that left, once the aggregation has taken their
    /// tail batches and so given every record that could name them (a drop of a flow lost
    /// nowhere here, dropped before its first point, is never named). A flow measured again
    /// keeps its drops for its next lossy record.
    fn forget_left_drops(&mut self) {
        if self.leaving.is_empty() {
            return;
        }
        let handled = self.shared.events_handled.load(Ordering::Acquire);
        let live = self.live_flows();
        let mut gone = Vec::new();
        self.leaving.retain(|(f, at)| {
            if live.contains(f) {
                return false;
            }
            if *at <= handled {
                gone.push(*f);
                return false;
            }
            true
        });
        if !gone.is_empty() {
            let mut pending = self.shared.pending_drops.lock().unwrap_or_else(|p| p.into_inner());
            for f in gone {
                pending.remove(&f);
            }
        }
    }

    fn publish(&self, shared: &Shared) {
        let Ok(stats) = self.programs.stats() else { return };
        let get = |s: Stat| stats.iter().find(|(k, _)| *k == s).map_or(0, |(_, v)| *v);
        // Each port's points, with what the kernel refused there for lack of room (an egress's
        // refusals are shown at the first of its points).
        let refused = &self.refused_seen;
        let capacity = u64::from(self.settings.flows);
        let flows = self.reader.len() as u64;
        let mut tables = Vec::new();
        for (slot, (_, ingress, _)) in self.ports.iter().enumerate() {
            let mut outs: Vec<u8> =
                self.out_points.iter().filter(|((s, _), _)| *s == slot).map(|(_, p)| *p).collect();
            outs.sort_unstable();
            for (point, kp) in [(Some(*ingress), 2 * slot), (outs.first().copied(), 2 * slot + 1)] {
                let Some(point) = point else { continue };
                let stats = telemark_core::loss::PointStats {
                    refused: refused.get(kp).copied().unwrap_or(0),
                    ..Default::default()
                };
                tables.push(crate::shared::PointTable { point, stats, flows, capacity });
            }
        }
        let mut p = shared.path.lock().unwrap_or_else(|p| p.into_inner());
        p.points = tables;
        // Frames counted at the points (the programs keep no per-packet total: a counter
        // bumped for every packet would cost another cache line a packet).
        let (rx, tx) = self.flows.totals();
        p.rx = rx + get(Stat::NotIp);
        p.tx = tx;
        p.skipped = get(Stat::NotIp);
        p.event_drops = self.events.dropped;
        p.learned = self.reader.len() as u64;
        p.meter = self.meter.then(|| self.flows.meter_stats());
        p.hh = self.flows.hh_stats();
        p.ebpf = Some(crate::shared::EbpfStats {
            kernel: stats.iter().map(|(s, v)| (s.name(), *v)).collect(),
            programs: self.programs.cost(),
            points: self.point_labels.clone(),
            attached: self.attached.len() as u64,
        });
    }
}

impl Datapath for EbpfPath {
    fn run(mut self: Box<Self>, stop: &AtomicBool, done: &AtomicBool, shared: &Shared) {
        let half = Duration::from_nanos(self.settings.period_ns / 2).max(Duration::from_millis(1));
        let idle_ns = 2_000_000_000u64.max(4 * self.settings.period_ns);
        let mut next_expire = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(half);
            self.reload();
            self.sweep();
            if Instant::now() >= self.next_scan {
                self.next_scan = Instant::now() + Duration::from_nanos(self.settings.rescan_ns);
                self.scan();
            }
            if Instant::now() >= next_expire {
                next_expire = Instant::now() + Duration::from_secs(1);
                self.expire(idle_ns);
            }
            self.publish(shared);
        }
        // Every period that began before the stop is counted to its end and read, then the
        // hooks are removed: a stop loses no finished period.
        let t = self.settings.period_ns;
        let end = (ebpf::now() / t + 1) * t + self.settings.guard_ns;
        let wait = end.saturating_sub(ebpf::now()) + 2 * self.reader.settle_ns();
        std::thread::sleep(Duration::from_nanos(wait));
        self.sweep();
        for (_, ev) in std::mem::take(&mut self.held) {
            self.send(BatchEvent { tail: true, ..ev });
        }
        self.flows.flush(self.ports.len());
        for (_, a) in std::mem::take(&mut self.attached) {
            self.programs.detach(a);
        }
        self.publish(shared);
        done.store(true, Ordering::Release);
        shared.aggregation_bell.ring();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_globs() {
        assert!(matches("tap*", "tap0"));
        assert!(matches("tap*", "tap"));
        assert!(!matches("tap*", "eth0"));
        assert!(matches("*-in", "r-in"));
        assert!(matches("veth*c*", "veth1c2"));
        assert!(!matches("veth*c*x", "veth1c2"));
        assert!(matches("eth0", "eth0") && !matches("eth0", "eth01"));
    }

    #[test]
    fn point_names_follow_the_records_rule() {
        let n = point_name("out", "h1:veth@x");
        assert_eq!(n, "out:h1:veth_x");
        assert!(telemark_core::records::valid_agent_name(&n));
    }
}
