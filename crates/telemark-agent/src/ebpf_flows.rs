//! The flow meter and the heavy-hitter stage on the eBPF datapath (docs/ebpf.md, "Flows and
//! heavy hitters"). Both read what the kernel already counts for loss: each flow's packets and
//! bytes per period at each port's ingress point, read once the period is final. So they cost
//! nothing more per packet in the kernel, and they hand the same things to the same threads as
//! the switch's stages (flow_meter.rs and heavy_hitters.rs in telemark-datapath): finished
//! flows to the flow-export thread, which encodes IPFIX; heavy flows per port and window to
//! the aggregation, which makes them `flow` records.
//!
//! - **IPFIX**: each final period of a flow at an ingress point goes into the switch's flow
//!   cache at once ([`FlowCache::observe_many`]), with the port it left by when an egress
//!   point saw it. Counts are exact (every packet is counted: `[ipfix] rate` is 1); what the
//!   kernel does not count is not in them (DSCP, TCP flags, VLAN, ICMP type: 0).
//! - **Heavy hitters**: a window is the periods that begin in it; its flows are counted exactly
//!   and listed by SFCMon's definition of heavy ([`ExactFlows::window`]), so every heavy flow
//!   comes with all its packets and no error bound. A window in which the kernel refused a
//!   flow at the port (no room in its map) is marked incomplete.
//! - **sFlow**: packet samples come from the kernel's own sampler (random 1-in-N at each
//!   ingress point, `sample()` in telemark.bpf.c), through a perf buffer; port counters from
//!   the counts (in at the ingress point, out at the egress point).

use crate::config::{HeavyHittersSettings, IpfixExport};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use telemark_core::flow_hash;
use telemark_core::flowexport::{EndReason, FlowCache, FlowEntry, Observation};
use telemark_core::sketch::sfcmon::ExactFlows;
use telemark_core::spsc::{self, Consumer, Producer};
use telemark_datapath::ebpf::maps::SampleMeta;
use telemark_datapath::ebpf::periods::Closed;
use telemark_datapath::flow_meter::{
    ExportedFlow, MeterRings, MeterStats, PortCounters, SampledPacket,
};
use telemark_datapath::heavy_hitters::{HhStats, PortWindow};

/// Ethernet header bytes, taken off each packet's count: IPFIX counts IP octets, the hooks
/// see frames.
const ETHERNET_HEADER: u64 = 14;

/// The cache is swept this many entries at a time.
const SWEEP_WAYS: usize = 4096;

/// How long the flush at a stop waits for room in the ring to the flow-export thread, in all.
const FLUSH_PATIENCE: Duration = Duration::from_secs(5);

struct Ipfix {
    cache: FlowCache,
    ring: Producer<ExportedFlow>,
    drops: u64,
}

struct HeavyHitters {
    settings: HeavyHittersSettings,
    period_ns: u64,
    /// Open windows by number (a window is `window_ns` of periods' start times), each with
    /// its flows per port and whether every flow was counted.
    open: BTreeMap<u64, Vec<(ExactFlows, bool)>>,
    ring: Producer<PortWindow>,
    stats: HhStats,
}

/// The stages, owned by the eBPF datapath's thread.
pub(crate) struct EbpfFlows {
    sflow: Option<Producer<SampledPacket>>,
    ipfix: Option<Ipfix>,
    hh: Option<HeavyHitters>,
    /// Per port (slot): what its points counted, for sFlow's counter samples.
    ports: Vec<PortCounters>,
    /// sFlow samples handed to the exporter, and those lost (the kernel's, and a full ring).
    sflow_samples: u64,
    sflow_drops: u64,
}

impl EbpfFlows {
    /// The stages `[ipfix]` and `[heavy_hitters]` ask for, and the ends of their rings the
    /// flow-export thread and the aggregation read.
    pub(crate) fn new(
        sflow: bool,
        ipfix: Option<&IpfixExport>,
        hh: Option<&HeavyHittersSettings>,
        period_ns: u64,
    ) -> (EbpfFlows, MeterRings, Option<Consumer<PortWindow>>) {
        let (sflow, samples) = match sflow {
            false => (None, None),
            true => {
                let (ring, cons) = spsc::channel(4096);
                (Some(ring), Some(cons))
            }
        };
        let (ipfix, flows) = match ipfix {
            None => (None, None),
            Some(x) => {
                let (ring, cons) = spsc::channel(1 << 14);
                let stage = Ipfix { cache: FlowCache::new(x.settings.cache), ring, drops: 0 };
                (Some(stage), Some(cons))
            }
        };
        let (hh, windows) = match hh {
            None => (None, None),
            Some(h) => {
                let (ring, cons) = spsc::channel(1024);
                let stage = HeavyHitters {
                    settings: h.clone(),
                    period_ns: period_ns.max(1),
                    open: BTreeMap::new(),
                    ring,
                    stats: HhStats::default(),
                };
                (Some(stage), Some(cons))
            }
        };
        let stages =
            EbpfFlows { sflow, ipfix, hh, ports: Vec::new(), sflow_samples: 0, sflow_drops: 0 };
        (stages, MeterRings { samples, flows }, windows)
    }

    /// A packet the kernel sampled at port `slot`, whose sampler had seen `pool` packets and
    /// lost `lost` samples so far.
    pub(crate) fn sampled(
        &mut self,
        slot: usize,
        meta: &SampleMeta,
        bytes: &[u8],
        pool: u64,
        lost: u32,
    ) {
        let Some(ring) = &self.sflow else { return };
        // sFlow's sample_pool is 32 bits and wraps.
        let s = SampledPacket::new(slot as u16, u16::MAX, meta.frame_len, pool as u32, lost, bytes);
        match ring.push(s) {
            Ok(()) => self.sflow_samples += 1,
            Err(_) => self.sflow_drops += 1,
        }
    }

    /// Samples the kernel could not send (its perf buffer was full).
    pub(crate) fn samples_lost(&mut self, n: u64) {
        self.sflow_drops += n;
    }

    /// A final period of a flow at port `slot`'s ingress point; `out`: the port it left by,
    /// when known.
    pub(crate) fn ingress(&mut self, slot: usize, out: Option<usize>, c: &Closed) {
        let window = self.hh.as_ref().map(|h| h.window_of(c.period));
        let port = self.port(slot);
        port.in_packets += c.packets;
        port.in_octets += c.bytes;
        if let Some(x) = &mut self.ipfix {
            let key = c.key.flow();
            let obs = Observation {
                key,
                hash: flow_hash(&key),
                in_port: slot as u16,
                out_port: out.map_or(u16::MAX, |o| o as u16),
                vlan: 0,
                ip_version: if key.src.is_ipv4() { 4 } else { 6 },
                dscp: 0,
                tcp_flags: 0,
                icmp_type_code: 0,
                octets: 0,
                ts_ns: c.first_ns,
            };
            let octets = c.bytes.saturating_sub(ETHERNET_HEADER * c.packets);
            let (ring, drops) = (&x.ring, &mut x.drops);
            x.cache.observe_many(&obs, c.packets, octets, c.last_ns, &mut |e, why| {
                hand_out(ring, drops, e, why, None)
            });
        }
        if let (Some(h), Some(w)) = (&mut self.hh, window) {
            h.port(w, slot).0.add(&c.key.flow(), c.packets, c.bytes);
        }
    }

    /// A final period of a flow at port `slot`'s egress point.
    pub(crate) fn egress(&mut self, slot: usize, c: &Closed) {
        let port = self.port(slot);
        port.out_packets += c.packets;
        port.out_octets += c.bytes;
    }

    /// The kernel refused flows at port `slot`'s ingress point, some time before period
    /// `now` ended: the heavy-hitter windows open until then (and the one `now` is in) may
    /// miss one.
    pub(crate) fn refused(&mut self, slot: usize, now: u64) {
        if let Some(h) = &mut self.hh {
            let w = h.window_of(now);
            h.port(w, slot);
            for ports in h.open.values_mut() {
                pad(ports, slot + 1)[slot].1 = false;
            }
        }
    }

    fn port(&mut self, slot: usize) -> &mut PortCounters {
        if self.ports.len() <= slot {
            self.ports.resize(slot + 1, PortCounters::default());
        }
        &mut self.ports[slot]
    }

    /// Hands out cached flows past their timeouts at `now`, and heavy-hitter windows whose
    /// periods are all final (`final_period`: the newest final period) for `ports` ports.
    pub(crate) fn tick(&mut self, now: u64, final_period: u64, ports: usize) {
        if let Some(x) = &mut self.ipfix {
            let (ring, drops) = (&x.ring, &mut x.drops);
            x.cache.sweep(now, SWEEP_WAYS, &mut |e, why| hand_out(ring, drops, e, why, None));
        }
        if let Some(h) = &mut self.hh {
            let window = h.settings.window_ns.max(1);
            // Window w's last period is the one that begins just before (w + 1) × window.
            let period_ns = h.period_ns;
            let last_period = |w: u64| ((w + 1).saturating_mul(window) - 1) / period_ns;
            let first_open = final_period.saturating_mul(h.period_ns) / window;
            // Windows with no flow yet are listed too (each port's health shows its windows).
            if h.open.is_empty() && final_period > 0 {
                h.open.insert(first_open, Vec::new());
            }
            while let Some((&w, _)) = h.open.first_key_value() {
                if last_period(w) > final_period {
                    break;
                }
                let Some((_, mut flows)) = h.open.pop_first() else { break };
                pad(&mut flows, ports);
                h.close(w, flows);
                h.open.entry(w + 1).or_default();
            }
        }
    }

    /// Hands out every cached flow and open window (the agent stops).
    pub(crate) fn flush(&mut self, ports: usize) {
        if let Some(x) = &mut self.ipfix {
            // The flow-export thread drains the ring meanwhile: room is waited for, up to a
            // few seconds in all.
            let deadline = Instant::now() + FLUSH_PATIENCE;
            let (ring, drops) = (&x.ring, &mut x.drops);
            x.cache.flush(&mut |e, why| hand_out(ring, drops, e, why, Some(deadline)));
        }
        if let Some(h) = &mut self.hh {
            while let Some((w, mut flows)) = h.open.pop_first() {
                if flows.iter().any(|f| f.0.packets() > 0) {
                    pad(&mut flows, ports);
                    h.close(w, flows);
                }
            }
        }
    }

    /// Packets counted in and out at every port so far (final periods).
    pub(crate) fn totals(&self) -> (u64, u64) {
        self.ports.iter().fold((0, 0), |(i, o), p| (i + p.in_packets, o + p.out_packets))
    }

    /// The flow meter's counters (with `[sflow]` or `[ipfix]`).
    pub(crate) fn meter_stats(&self) -> MeterStats {
        MeterStats {
            sflow_samples: self.sflow_samples,
            sflow_drops: self.sflow_drops,
            cache: self.ipfix.as_ref().map(|x| x.cache.stats()).unwrap_or_default(),
            cache_flows: self.ipfix.as_ref().map_or(0, |x| x.cache.len() as u64),
            ipfix_drops: self.ipfix.as_ref().map_or(0, |x| x.drops),
            ports: self.ports.clone(),
            busy_ns: 0,
        }
    }

    /// The heavy-hitter stage's counters (with `[heavy_hitters]`).
    pub(crate) fn hh_stats(&self) -> Option<HhStats> {
        self.hh.as_ref().map(|h| h.stats)
    }
}

/// `ports` with at least `n` ports (the ports attached since a window opened count nothing in
/// it, and every flow in it was counted).
fn pad(ports: &mut Vec<(ExactFlows, bool)>, n: usize) -> &mut Vec<(ExactFlows, bool)> {
    if ports.len() < n {
        ports.resize_with(n, || (ExactFlows::default(), true));
    }
    ports
}

/// Hands a flow to the flow-export thread; when the ring is full, waits for room until
/// `deadline` (`None`: not at all), then drops it and counts it.
fn hand_out(
    ring: &Producer<ExportedFlow>,
    drops: &mut u64,
    e: &FlowEntry,
    why: EndReason,
    deadline: Option<Instant>,
) {
    let mut item = (*e, why);
    loop {
        match ring.push(item) {
            Ok(()) => return,
            Err(back) if deadline.is_some_and(|d| Instant::now() < d) => item = back,
            Err(_) => {
                *drops += 1;
                return;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

impl HeavyHitters {
    /// The window period `period` begins in.
    fn window_of(&self, period: u64) -> u64 {
        period.saturating_mul(self.period_ns) / self.settings.window_ns.max(1)
    }

    /// Port `slot`'s flows in window `w` (opened if it was not).
    fn port(&mut self, w: u64, slot: usize) -> &mut (ExactFlows, bool) {
        &mut pad(self.open.entry(w).or_default(), slot + 1)[slot]
    }

    fn close(&mut self, w: u64, flows: Vec<(ExactFlows, bool)>) {
        let window = self.settings.window_ns.max(1);
        let (start_ns, end_ns) = (w.saturating_mul(window), (w + 1).saturating_mul(window));
        let cfg = &self.settings.hh;
        for (port, (exact, complete)) in flows.into_iter().enumerate() {
            let hh = exact.window(cfg.threshold, cfg.min_packets, complete);
            self.stats.windows += 1;
            self.stats.incomplete += u64::from(!hh.complete);
            let n = hh.flows.len() as u64;
            match self.ring.push(PortWindow { port: port as u16, start_ns, end_ns, hh }) {
                Ok(()) => self.stats.flows += n,
                Err(_) => self.stats.drops += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use telemark_core::flowexport::CacheConfig;
    use telemark_core::sketch::sfcmon::HhConfig;
    use telemark_datapath::ebpf::maps::Key;
    use telemark_datapath::flow_meter::IpfixSettings;

    fn closed(src: u8, point: u8, period: u64, packets: u64) -> Closed {
        let mut k = Key::default();
        k.src[10] = 0xff;
        k.src[11] = 0xff;
        k.src[12] = 10;
        k.src[15] = src;
        k.dst[10] = 0xff;
        k.dst[11] = 0xff;
        k.dst[12] = 10;
        k.dst[15] = 200;
        k.proto = 17;
        k.sport = 1000;
        k.dport = 53;
        k.point = point;
        Closed {
            key: k,
            period,
            packets,
            bytes: packets * 114,
            first_ns: period * 100_000_000,
            last_ns: period * 100_000_000 + 50_000_000,
        }
    }

    /// Ten 100 ms periods make a 1 s window; it is listed only once its last period is final,
    /// with the heavy flow's exact count; a refusal marks the windows still open incomplete.
    #[test]
    fn windows_close_when_their_periods_are_final() {
        let hh = HeavyHittersSettings {
            window_ns: 1_000_000_000,
            hh: HhConfig { threshold: 0.1, ..HhConfig::default() },
        };
        let (mut f, _, windows) = EbpfFlows::new(false, None, Some(&hh), 100_000_000);
        let windows = windows.unwrap();
        for p in 100..110 {
            f.ingress(0, None, &closed(1, 0, p, 100));
            f.ingress(0, None, &closed(2, 0, p, 1));
        }
        f.tick(0, 108, 1);
        assert!(windows.pop().is_none(), "listed before its last period was final");
        f.ingress(0, None, &closed(1, 0, 110, 7)); // the next window
        f.tick(0, 109, 1);
        let w = windows.pop().expect("window 10");
        assert_eq!((w.port, w.start_ns, w.end_ns), (0, 10_000_000_000, 11_000_000_000));
        assert_eq!(w.hh.packets, 1010);
        assert_eq!(w.hh.flows.len(), 1);
        assert_eq!((w.hh.flows[0].packets, w.hh.flows[0].bytes), (1000, 114_000));
        assert!(w.hh.complete, "window 10 counted every flow");
        // A refusal read while period 112 runs: window 11, which is still open.
        f.refused(0, 112);
        f.flush(1);
        let next = windows.pop().expect("window 11 at the stop");
        assert_eq!(next.hh.packets, 7);
        assert!(!next.hh.complete);
    }

    /// Periods of a flow add up in the cache into one record with their sums, IP octets.
    #[test]
    fn periods_add_up_to_one_ipfix_record() {
        let x = IpfixExport {
            collectors: Vec::new(),
            settings: IpfixSettings {
                rate: 1,
                cache: CacheConfig { max_flows: 64, active_ns: 60_000_000_000, idle_ns: 1 },
            },
            domain: 1,
            template_refresh_ns: 1,
            loss: false,
        };
        let (mut f, rings, _) = EbpfFlows::new(false, Some(&x), None, 100_000_000);
        let flows = rings.flows.unwrap();
        for p in 10..13 {
            f.ingress(2, Some(3), &closed(1, 4, p, 10));
        }
        f.tick(2_000_000_000, 12, 4);
        let (e, _) = flows.pop().expect("idle flow");
        assert_eq!((e.packets, e.octets), (30, 30 * 100));
        assert_eq!((e.first.in_port, e.first.out_port), (2, 3));
        assert_eq!((e.start_ns, e.end_ns), (1_000_000_000, 1_250_000_000));
        assert!(flows.pop().is_none());
        assert_eq!(f.meter_stats().ports[2].in_packets, 30);
    }
}
