//! The switch's flow-export stage: sFlow sampling and the IPFIX flow cache
//! (`telemark_core::flowexport`) run on every packet the switch forwarded, and what they
//! produce leaves through a ring to the exporting thread, which encodes and sends it. A full
//! ring drops and counts; nothing here waits.

use std::time::{Duration, Instant};
use telemark_core::flow_hash;
use telemark_core::flowexport::{
    CacheConfig, CacheStats, EndReason, FlowCache, FlowEntry, FragmentPorts, Observation, Sampler,
};
use telemark_core::spsc::{self, Consumer, Producer};
use telemark_wire::flow::{Fragment, Parsed};
use telemark_wire::link::LinkType;

/// The most header bytes an sFlow sample carries.
pub const MAX_HEADER: usize = 256;

/// sFlow sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SflowSettings {
    /// One packet in this many is sampled, per input port.
    pub rate: u32,
    /// Header bytes copied from a sampled packet (at most [`MAX_HEADER`]).
    pub header_bytes: usize,
}

/// The IPFIX metering process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpfixSettings {
    /// One packet in this many is metered, per input port (1: every packet).
    pub rate: u32,
    /// The flow cache's room and timeouts.
    pub cache: CacheConfig,
}

/// A sampled packet on its way to the sFlow exporter.
#[derive(Debug, Clone, Copy)]
pub struct SampledPacket {
    /// Input port (index in the agent's port list).
    pub port: u16,
    /// Output port (`u16::MAX`: none).
    pub out_port: u16,
    /// Length of the frame on the wire.
    pub frame_len: u32,
    /// Packets the port's sampler had seen (sFlow's sample pool).
    pub pool: u32,
    /// Samples of this port dropped before this one (ring full).
    pub drops: u32,
    /// Header bytes copied.
    pub header_len: u16,
    /// The header.
    pub header: [u8; MAX_HEADER],
}

impl SampledPacket {
    /// A sample of a frame received on `port` (sent out of `out_port`, `u16::MAX`: none) of
    /// `frame_len` bytes on the wire, with its first `header` bytes (at most [`MAX_HEADER`]),
    /// the port's sample pool and the samples of it dropped before this one.
    pub fn new(
        port: u16,
        out_port: u16,
        frame_len: u32,
        pool: u32,
        drops: u32,
        header: &[u8],
    ) -> Self {
        let n = header.len().min(MAX_HEADER);
        let mut s = SampledPacket {
            port,
            out_port,
            frame_len,
            pool,
            drops,
            header_len: n as u16,
            header: [0; MAX_HEADER],
        };
        s.header[..n].copy_from_slice(&header[..n]);
        s
    }
}

/// A flow the cache handed out, and why.
pub type ExportedFlow = (FlowEntry, EndReason);

/// One port's traffic as the switch saw it (sFlow's generic interface counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortCounters {
    /// Frames received.
    pub in_packets: u64,
    /// Their bytes.
    pub in_octets: u64,
    /// Frames sent.
    pub out_packets: u64,
    /// Their bytes.
    pub out_octets: u64,
}

/// What the stage did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeterStats {
    /// sFlow samples taken.
    pub sflow_samples: u64,
    /// sFlow samples dropped (ring full).
    pub sflow_drops: u64,
    /// The IPFIX cache's counters.
    pub cache: CacheStats,
    /// Flows it held.
    pub cache_flows: u64,
    /// Flow records dropped (ring full).
    pub ipfix_drops: u64,
    /// Per port.
    pub ports: Vec<PortCounters>,
    /// Time spent in the stage, as its caller measured it ([`FlowMeter::add_busy_ns`]).
    pub busy_ns: u64,
}

struct SflowStage {
    settings: SflowSettings,
    samplers: Vec<Sampler>,
    drops: Vec<u32>,
    samples: u64,
    ring: Producer<SampledPacket>,
}

struct IpfixStage {
    samplers: Vec<Sampler>,
    cache: FlowCache,
    fragments: FragmentPorts,
    drops: u64,
    ring: Producer<ExportedFlow>,
}

/// The consuming ends, for the exporting thread.
pub struct MeterRings {
    /// Sampled packets (with sFlow).
    pub samples: Option<Consumer<SampledPacket>>,
    /// Finished flows (with IPFIX).
    pub flows: Option<Consumer<ExportedFlow>>,
}

/// The stage, owned by the fast path.
pub struct FlowMeter {
    sflow: Option<SflowStage>,
    ipfix: Option<IpfixStage>,
    ports: Vec<PortCounters>,
    /// How long a hand-off waits for room in a full ring (`None`: not at all, the fast path).
    patience: Option<Duration>,
    /// The frames' link type (VLAN tags are read from Ethernet frames).
    link: LinkType,
    busy_ns: u64,
}

impl FlowMeter {
    /// A stage for `ports` ports with sFlow, IPFIX or both, and the rings' consuming ends.
    pub fn new(
        ports: usize,
        sflow: Option<SflowSettings>,
        ipfix: Option<IpfixSettings>,
        seed: u64,
    ) -> (FlowMeter, MeterRings) {
        let samplers = |rate, salt: u64| -> Vec<Sampler> {
            (0..ports as u64).map(|p| Sampler::new(rate, seed ^ (salt + p))).collect()
        };
        let (sflow, samples) = match sflow {
            None => (None, None),
            Some(mut s) => {
                s.header_bytes = s.header_bytes.min(MAX_HEADER);
                let (tx, rx) = spsc::channel(4096);
                let stage = SflowStage {
                    settings: s,
                    samplers: samplers(s.rate, 0x5f10),
                    drops: vec![0; ports],
                    samples: 0,
                    ring: tx,
                };
                (Some(stage), Some(rx))
            }
        };
        let (ipfix, flows) = match ipfix {
            None => (None, None),
            Some(i) => {
                let (tx, rx) = spsc::channel(1 << 14);
                let stage = IpfixStage {
                    samplers: samplers(i.rate, 0x1f1c),
                    cache: FlowCache::new(i.cache),
                    fragments: FragmentPorts::new(1024),
                    drops: 0,
                    ring: tx,
                };
                (Some(stage), Some(rx))
            }
        };
        let meter = FlowMeter {
            sflow,
            ipfix,
            ports: vec![PortCounters::default(); ports],
            patience: None,
            link: LinkType::Ethernet,
            busy_ns: 0,
        };
        (meter, MeterRings { samples, flows })
    }

    /// A meter that waits for room in a full ring (up to two seconds a record) rather than
    /// drop: for a capture read from a file, which has time to wait.
    pub fn patient(mut self) -> Self {
        self.patience = Some(Duration::from_secs(2));
        self
    }

    /// Frames of link type `link` (default Ethernet).
    pub fn with_link(mut self, link: LinkType) -> Self {
        self.link = link;
        self
    }

    /// One packet the switch received on `in_port` and sent out of `out_port` (`u16::MAX`:
    /// none), with what the switch parsed of it.
    #[inline]
    pub fn packet(
        &mut self,
        in_port: u16,
        out_port: u16,
        frame: &[u8],
        wire_len: u32,
        parsed: Option<(&Parsed, u64)>,
        ts_ns: u64,
    ) {
        let i = usize::from(in_port);
        if let Some(c) = self.ports.get_mut(i) {
            c.in_packets += 1;
            c.in_octets += u64::from(wire_len);
        }
        if let Some(c) = self.ports.get_mut(usize::from(out_port)) {
            c.out_packets += 1;
            c.out_octets += u64::from(wire_len);
        }
        if let Some(s) = &mut self.sflow {
            if s.samplers.get_mut(i).is_some_and(Sampler::sample) {
                s.sample(i, in_port, out_port, frame, wire_len, self.patience);
            }
        }
        if let (Some(x), Some((p, hash))) = (&mut self.ipfix, parsed) {
            if let Fragment::First(id) = p.fragment {
                x.fragments.first(&p.key, id);
            }
            if x.samplers.get_mut(i).is_some_and(Sampler::sample) {
                let mut obs = observation(frame, self.link, p, hash, in_port, out_port, ts_ns);
                if let Fragment::Later(id) = p.fragment {
                    if let Some(key) = x.fragments.later(&p.key, id) {
                        (obs.key, obs.hash) = (key, flow_hash(&key));
                    }
                }
                let (ring, drops, patience) = (&x.ring, &mut x.drops, self.patience);
                x.cache.observe(&obs, &mut |e, why| hand_out(ring, drops, e, why, patience));
            }
        }
    }

    /// Adds time the caller spent in [`FlowMeter::packet`] (timed per burst, not per packet).
    pub fn add_busy_ns(&mut self, ns: u64) {
        self.busy_ns += ns;
    }

    /// Sweeps the next `ways` entries of the flow cache for timeouts at `now`.
    pub fn sweep(&mut self, now: u64, ways: usize) {
        if let Some(x) = &mut self.ipfix {
            let (ring, drops, patience) = (&x.ring, &mut x.drops, self.patience);
            x.cache.sweep(now, ways, &mut |e, why| hand_out(ring, drops, e, why, patience));
        }
    }

    /// Entries in the flow cache (0 without IPFIX).
    pub fn cache_capacity(&self) -> usize {
        self.ipfix.as_ref().map_or(0, |x| x.cache.capacity())
    }

    /// Hands out every cached flow (the agent stops), waiting for room in the ring as a
    /// patient meter does (the exporting thread drains it meanwhile).
    pub fn flush(&mut self) {
        if let Some(x) = &mut self.ipfix {
            let (ring, drops) = (&x.ring, &mut x.drops);
            let patience = Some(self.patience.unwrap_or(Duration::from_secs(2)));
            x.cache.flush(&mut |e, why| hand_out(ring, drops, e, why, patience));
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> MeterStats {
        MeterStats {
            sflow_samples: self.sflow.as_ref().map_or(0, |s| s.samples),
            sflow_drops: self
                .sflow
                .as_ref()
                .map_or(0, |s| s.drops.iter().map(|&d| u64::from(d)).sum()),
            cache: self.ipfix.as_ref().map(|x| x.cache.stats()).unwrap_or_default(),
            cache_flows: self.ipfix.as_ref().map_or(0, |x| x.cache.len() as u64),
            ipfix_drops: self.ipfix.as_ref().map_or(0, |x| x.drops),
            ports: self.ports.clone(),
            busy_ns: self.busy_ns,
        }
    }

    /// A copy with the same samplers and cache contents and rings of its own (benchmarks).
    pub fn fork(&self) -> (FlowMeter, MeterRings) {
        let sflow = self.sflow.as_ref().map(|s| {
            let (tx, rx) = spsc::channel(4096);
            let stage = SflowStage {
                settings: s.settings,
                samplers: s.samplers.clone(),
                drops: s.drops.clone(),
                samples: s.samples,
                ring: tx,
            };
            (stage, rx)
        });
        let ipfix = self.ipfix.as_ref().map(|x| {
            let (tx, rx) = spsc::channel(1 << 14);
            let stage = IpfixStage {
                samplers: x.samplers.clone(),
                cache: x.cache.clone(),
                fragments: x.fragments.clone(),
                drops: x.drops,
                ring: tx,
            };
            (stage, rx)
        });
        let (sflow, samples) = sflow.map_or((None, None), |(s, r)| (Some(s), Some(r)));
        let (ipfix, flows) = ipfix.map_or((None, None), |(s, r)| (Some(s), Some(r)));
        let meter = FlowMeter {
            sflow,
            ipfix,
            ports: self.ports.clone(),
            patience: self.patience,
            link: self.link,
            busy_ns: 0,
        };
        (meter, MeterRings { samples, flows })
    }

    /// Samples one packet in `rate` into the IPFIX cache from now on (benchmarks fill the
    /// cache at 1:1 first).
    pub fn set_ipfix_rate(&mut self, rate: u32) {
        if let Some(x) = &mut self.ipfix {
            x.samplers =
                (0..x.samplers.len() as u64).map(|p| Sampler::new(rate, 0x1f1c + p)).collect();
        }
    }

    /// The sampling rates: sFlow's and IPFIX's (0: off).
    pub fn rates(&self) -> (u32, u32) {
        let rate = |s: &[Sampler]| s.first().map_or(1, Sampler::rate);
        (
            self.sflow.as_ref().map_or(0, |s| rate(&s.samplers)),
            self.ipfix.as_ref().map_or(0, |x| rate(&x.samplers)),
        )
    }
}

impl SflowStage {
    #[cold]
    fn sample(
        &mut self,
        i: usize,
        in_port: u16,
        out_port: u16,
        frame: &[u8],
        wire_len: u32,
        patience: Option<Duration>,
    ) {
        let n = frame.len().min(self.settings.header_bytes);
        let (pool, drops) = (self.samplers[i].pool(), self.drops[i]);
        let s = SampledPacket::new(in_port, out_port, wire_len, pool, drops, &frame[..n]);
        self.samples += 1;
        if !hand(&self.ring, s, patience) {
            self.drops[i] = self.drops[i].wrapping_add(1);
        }
    }
}

fn hand_out(
    ring: &Producer<ExportedFlow>,
    drops: &mut u64,
    e: &FlowEntry,
    why: EndReason,
    patience: Option<Duration>,
) {
    if !hand(ring, (*e, why), patience) {
        *drops += 1;
    }
}

/// Pushes `item` onto `ring`; when it is full, waits for room up to `patience` (`None`: not
/// at all). False when the item was dropped.
#[inline]
fn hand<T>(ring: &Producer<T>, item: T, patience: Option<Duration>) -> bool {
    let Err(mut item) = ring.push(item) else { return true };
    let Some(p) = patience else { return false };
    let deadline = Instant::now() + p;
    loop {
        std::thread::sleep(Duration::from_micros(200));
        match ring.push(item) {
            Ok(()) => return true,
            Err(back) if Instant::now() < deadline => item = back,
            Err(_) => return false,
        }
    }
}

/// What the flow cache needs of a packet: its key, VLAN (of an Ethernet frame), DSCP, IP
/// length, TCP flags and ICMP type.
pub fn observation(
    frame: &[u8],
    link: LinkType,
    p: &Parsed,
    hash: u64,
    in_port: u16,
    out_port: u16,
    ts_ns: u64,
) -> Observation {
    let be16 = |at: usize| frame.get(at..at + 2).map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
    let vlan = match link {
        LinkType::Ethernet if be16(12) == 0x8100 => be16(14) & 0x0fff,
        _ => 0,
    };
    let ip = p.ip_offset;
    let octets = match p.ip_version {
        4 => u32::from(be16(ip + 2)),
        _ => u32::from(be16(ip + 4)) + 40,
    };
    // No transport header in a later fragment.
    let l4 = (!matches!(p.fragment, Fragment::Later(_))).then_some(p.l4_offset);
    let tcp_flags = match l4 {
        Some(at) if p.key.proto == 6 => frame.get(at + 13).copied().unwrap_or(0),
        _ => 0,
    };
    let icmp_type_code = match l4 {
        Some(at) if matches!(p.key.proto, 1 | 58) => be16(at),
        _ => 0,
    };
    Observation {
        key: p.key,
        hash,
        in_port,
        out_port,
        vlan,
        ip_version: p.ip_version,
        dscp: p.dscp,
        tcp_flags,
        icmp_type_code,
        octets,
        ts_ns,
    }
}
