//! Synthetic traffic for replay and benchmarks: frames of many flows with heavy-tailed sizes
//! drawn from a real flow-size distribution (CAIDA 2019 flow bytes, in `shared/testdata`), or
//! from a Pareto fit of it when the file is absent.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use telemark_core::loss::{with_color, LossConfig};
use telemark_core::rng::Rng;
use telemark_datapath::Pkt;
use telemark_wire::flow::build_frame;
use telemark_wire::{ipv4, ipv6, tcp, udp, FlowKey};

/// Flow sizes in bytes to draw from.
#[derive(Debug, Clone)]
pub struct SizeDist {
    sizes: Vec<u64>,
    /// Where the sizes came from.
    pub source: String,
}

impl SizeDist {
    /// Loads one size per line (bytes); blank and `#` lines are skipped, bad lines counted.
    pub fn load(path: &Path) -> std::io::Result<(SizeDist, usize)> {
        let text = std::fs::read_to_string(path)?;
        let mut bad = 0;
        let mut sizes = Vec::new();
        for l in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            match l.parse::<f64>() {
                Ok(v) if v >= 1.0 && v.is_finite() => sizes.push(v as u64),
                _ => bad += 1,
            }
        }
        if sizes.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "no flow sizes in file",
            ));
        }
        Ok((SizeDist { sizes, source: path.display().to_string() }, bad))
    }

    /// A Pareto distribution (shape 1.1, scale 1,500 B) resembling the CAIDA trace's tail.
    pub fn pareto(seed: u64) -> SizeDist {
        let mut r = Rng::new(seed);
        let sizes =
            (0..100_000).map(|_| (1500.0 / (1.0 - r.f64()).powf(1.0 / 1.1)) as u64).collect();
        SizeDist { sizes, source: "pareto(alpha=1.1, xm=1500B)".into() }
    }

    /// Sizes given directly (tests, experiments with a chosen shape).
    pub fn from_sizes(sizes: Vec<u64>, source: &str) -> SizeDist {
        let sizes = if sizes.is_empty() { vec![1500] } else { sizes };
        SizeDist { sizes, source: source.into() }
    }

    /// One flow size in bytes.
    pub fn sample(&self, r: &mut Rng) -> u64 {
        self.sizes.get(r.below(self.sizes.len() as u64) as usize).copied().unwrap_or(1500)
    }
}

/// Traffic shape.
#[derive(Debug, Clone)]
pub struct GenConfig {
    /// Number of flows.
    pub flows: usize,
    /// Seed.
    pub seed: u64,
    /// Time span the flows start in, ns.
    pub duration_ns: u64,
    /// Cap on packets per flow (the heavy tail can be gigabytes).
    pub max_packets: u64,
    /// Payload bytes per full-size packet (MSS-like).
    pub mtu_payload: usize,
    /// Fraction of IPv6 flows.
    pub ipv6_share: f64,
    /// Color the packets at generation (count- or time-based as the config says).
    pub mark: Option<LossConfig>,
    /// Start time, ns since the epoch.
    pub start_ns: u64,
    /// Backbone-like: flows arrive as a Poisson process over the whole span (and before it, so
    /// the trace starts in steady state) instead of in its first half; packets outside the span
    /// are not emitted ([`for_each_packet`]).
    pub stationary: bool,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            flows: 200,
            seed: 1,
            duration_ns: 1_000_000_000,
            max_packets: 5_000,
            mtu_payload: 1400,
            ipv6_share: 0.1,
            mark: None,
            start_ns: 1_763_740_800_000_000_000,
            stationary: false,
        }
    }
}

/// One flow's plan.
#[derive(Debug, Clone, Copy)]
pub struct FlowPlan {
    /// The flow.
    pub key: FlowKey,
    /// Packets it sends.
    pub packets: u64,
    /// Bytes it sends.
    pub bytes: u64,
    /// First packet time.
    pub start_ns: u64,
    /// Gap between packets.
    pub gap_ns: u64,
}

/// Picks `cfg.flows` distinct flows with sizes from `dist`.
pub fn plan(cfg: &GenConfig, dist: &SizeDist) -> Vec<FlowPlan> {
    let mut r = Rng::new(cfg.seed);
    (0..cfg.flows)
        .map(|i| {
            let v6 = r.chance(cfg.ipv6_share);
            let (src, dst) = if v6 {
                (
                    IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 1, 0, 0, (i >> 16) as u16, i as u16)),
                    IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 2, 0, 0, 0, 1 + (r.below(64) as u16))),
                )
            } else {
                (
                    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + 1 + i as u32)),
                    IpAddr::V4(Ipv4Addr::from(0x0a80_0000 + 1 + r.below(256) as u32)),
                )
            };
            let tcp = r.chance(0.8);
            let key = FlowKey {
                src,
                dst,
                sport: 10_000 + r.below(50_000) as u16,
                dport: [80, 443, 5201, 53, 8080][r.below(5) as usize],
                proto: if tcp { 6 } else { 17 },
                spi: None,
                si: None,
            };
            let bytes = dist.sample(&mut r);
            let packets = bytes.div_ceil(cfg.mtu_payload as u64).clamp(1, cfg.max_packets);
            // Start times uniform given their number: a Poisson arrival process. Stationary
            // traces start flows from half a span before the trace on, so it opens mid-stream.
            let start_ns = if cfg.stationary {
                (cfg.start_ns - cfg.duration_ns / 2) + r.below(cfg.duration_ns * 3 / 2 + 1)
            } else {
                cfg.start_ns + r.below(cfg.duration_ns / 2 + 1)
            };
            // Spread each flow over 10–100 % of half the span: big flows are fast flows.
            let span = (cfg.duration_ns / 2) as f64 * (0.1 + 0.9 * r.f64());
            let gap_ns = ((span / packets as f64) as u64).max(1_000);
            FlowPlan {
                key,
                packets,
                bytes: bytes.min(packets * cfg.mtu_payload as u64),
                start_ns,
                gap_ns,
            }
        })
        .collect()
}

/// The trace that defeats first-come-first-served admission (the loss paper's open problem):
/// `mice` long-lived low-rate flows (one packet every `mouse_gap_ns`) start in the first
/// milliseconds and run the whole `cfg.duration_ns`, then, from `elephants_at_ns` after the
/// start, `elephants` fast flows (one packet every `elephant_gap_ns`) run to the end. A table
/// with room for fewer than `mice` flows is full of mice before the first elephant arrives.
/// Mice are 10.1.x.y → 10.200.0.1:80 TCP; elephants 10.2.0.i → 10.200.0.2:5201 UDP.
pub fn mice_then_elephants(
    cfg: &GenConfig,
    mice: usize,
    mouse_gap_ns: u64,
    elephants: usize,
    elephant_gap_ns: u64,
    elephants_at_ns: u64,
) -> Vec<FlowPlan> {
    let flow = |src: u32, dst: u32, sport: u16, dport: u16, proto: u8| FlowKey {
        src: IpAddr::V4(Ipv4Addr::from(src)),
        dst: IpAddr::V4(Ipv4Addr::from(dst)),
        sport,
        dport,
        proto,
        spi: None,
        si: None,
    };
    let mtu = cfg.mtu_payload as u64;
    let plan = |key, start_ns: u64, gap_ns: u64| {
        let packets = ((cfg.start_ns + cfg.duration_ns).saturating_sub(start_ns) / gap_ns.max(1))
            .clamp(1, cfg.max_packets);
        FlowPlan { key, packets, bytes: packets * mtu, start_ns, gap_ns: gap_ns.max(1) }
    };
    let mut v: Vec<FlowPlan> = (0..mice)
        .map(|i| {
            let key = flow(0x0a01_0000 + 1 + i as u32, 0x0ac8_0001, 20_000 + i as u16, 80, 6);
            // Spread over the first gap so the mice interleave evenly.
            plan(key, cfg.start_ns + i as u64 * mouse_gap_ns / mice.max(1) as u64, mouse_gap_ns)
        })
        .collect();
    v.extend((0..elephants).map(|i| {
        let key = flow(0x0a02_0000 + 1 + i as u32, 0x0ac8_0002, 30_000 + i as u16, 5201, 17);
        let start = cfg.start_ns + elephants_at_ns + i as u64 * elephant_gap_ns / elephants as u64;
        plan(key, start, elephant_gap_ns)
    }));
    v
}

/// Walks the packets of `plans` in time order: `f(time, plan, n, payload bytes)` for the n-th
/// packet of each flow. With `cfg.stationary`, only packets inside the span are passed.
fn walk(cfg: &GenConfig, plans: &[FlowPlan], mut f: impl FnMut(u64, &FlowPlan, u64, usize)) {
    let mut heap: BinaryHeap<Reverse<(u64, u32, u64)>> =
        plans.iter().enumerate().map(|(i, p)| Reverse((p.start_ns, i as u32, 0))).collect();
    let end = cfg.start_ns + cfg.duration_ns;
    let mtu = cfg.mtu_payload as u64;
    while let Some(Reverse((t, i, n))) = heap.pop() {
        let Some(p) = plans.get(i as usize) else { continue };
        if cfg.stationary && t >= end {
            continue;
        }
        let last = n + 1 == p.packets;
        if !cfg.stationary || t >= cfg.start_ns {
            let payload = if last { p.bytes.saturating_sub(n * mtu).clamp(1, mtu) } else { mtu };
            f(t, p, n, payload as usize);
        }
        if !last {
            heap.push(Reverse((t + p.gap_ns, i, n + 1)));
        }
    }
}

/// Calls `f(time, flow, frame length)` for every packet of `plans` in time order, without
/// building frames (hundreds of millions of packets fit in no memory as frames).
pub fn for_each_packet(cfg: &GenConfig, plans: &[FlowPlan], mut f: impl FnMut(u64, &FlowKey, u32)) {
    walk(cfg, plans, |t, p, _, payload| {
        let ip = if p.key.src.is_ipv6() { ipv6::HEADER_LEN } else { ipv4::MIN_HEADER_LEN };
        let l4 = if p.key.proto == 6 { tcp::MIN_HEADER_LEN } else { udp::HEADER_LEN };
        f(t, &p.key, (14 + ip + l4 + payload) as u32);
    });
}

/// Generates the packets of `plans` in time order. With `cfg.mark`, packets carry alternate
/// marking colors (B per color, or period T).
pub fn packets(cfg: &GenConfig, plans: &[FlowPlan]) -> Vec<Pkt> {
    let mut out = Vec::with_capacity(plans.iter().map(|p| p.packets as usize).sum());
    walk(cfg, plans, |t, p, n, payload| {
        let dscp = match &cfg.mark {
            Some(l) => {
                let color = match l.period_ns {
                    Some(per) => ((t / per) & 1) as u8,
                    None => ((n / u64::from(l.batch)) & 1) as u8,
                };
                with_color(0, l.color_bit, color)
            }
            None => 0,
        };
        out.push(Pkt { ts_ns: t, data: build_frame(&p.key, payload, dscp, 64), wire_len: 0 });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use telemark_wire::flow::{extract, LinkType};

    #[test]
    fn frames_parse_back_to_their_keys() {
        let cfg = GenConfig { flows: 50, ipv6_share: 0.3, ..GenConfig::default() };
        let plans = plan(&cfg, &SizeDist::pareto(1));
        let pk = packets(&cfg, &plans);
        assert_eq!(pk.len() as u64, plans.iter().map(|p| p.packets).sum::<u64>());
        assert!(pk.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
        let keys: std::collections::HashSet<FlowKey> = plans.iter().map(|p| p.key).collect();
        for p in &pk {
            let parsed = extract(&p.data, LinkType::Ethernet).unwrap();
            assert!(keys.contains(&parsed.key));
            if parsed.ip_version == 4 {
                assert!(ipv4::Packet::new_checked(&p.data[14..]).unwrap().verify_checksum());
            }
        }
    }

    /// The frame-less walk sees the same packets as the frames built: time, flow and length.
    #[test]
    fn for_each_packet_matches_the_built_frames() {
        let cfg = GenConfig { flows: 40, ipv6_share: 0.3, ..GenConfig::default() };
        let plans = plan(&cfg, &SizeDist::pareto(3));
        let built: Vec<(u64, FlowKey, u32)> = packets(&cfg, &plans)
            .iter()
            .map(|p| {
                (p.ts_ns, extract(&p.data, LinkType::Ethernet).unwrap().key, p.data.len() as u32)
            })
            .collect();
        let mut walked = Vec::new();
        for_each_packet(&cfg, &plans, |t, k, len| walked.push((t, *k, len)));
        assert_eq!(walked, built);
    }

    #[test]
    fn marking_alternates_per_flow() {
        let l = LossConfig { batch: 10, ..LossConfig::default() };
        let cfg = GenConfig { flows: 5, mark: Some(l), ..GenConfig::default() };
        let plans = plan(&cfg, &SizeDist::pareto(2));
        let pk = packets(&cfg, &plans);
        let first = plans[0].key;
        let colors: Vec<u8> = pk
            .iter()
            .filter_map(|p| extract(&p.data, LinkType::Ethernet).ok())
            .filter(|p| p.key == first)
            .map(|p| p.dscp & 1)
            .collect();
        for (i, c) in colors.iter().enumerate() {
            assert_eq!(*c, ((i / 10) % 2) as u8);
        }
    }
}
