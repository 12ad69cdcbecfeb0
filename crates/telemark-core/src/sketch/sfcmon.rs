//! The SFCMon heavy-hitter pipeline (Ferreira Jr. et al., "SFCMon", SBRC 2020), with the changes
//! that lift its precision from under 30 % to above 95 % (docs/sketches.md):
//!
//! 1. Every packet counts FlowID1 = (SPI, SI, source address) in a Count-Min sketch.
//! 2. After `eval_after` packets of the window, a packet whose FlowID1 estimate reaches the bar is
//!    heavy: FlowID2 = (SPI, SI, 5-tuple) is looked up in a Bloom filter, inserted into the
//!    Bloom filter and the IBLT if new, and its packet and byte counts are added in the IBLT.
//! 3. At the end of the window the IBLT is listed off the fast path and everything is reset.
//!
//! SFCMon's bar is `threshold × packets so far`, so early in a window almost any source passes
//! (0.1 % of 1,000 packets is one packet): those sources fill the IBLT and come out as false
//! positives. Telemark changes two things, both configurable back to the paper:
//! - the bar is `threshold × max(packets so far, expect × previous window's packets)`
//!   (`expect` = 0.5: a window may carry half the previous one's traffic and still see its
//!   heavy sources admitted as soon as they are heavy);
//! - the bar is never under `min_packets` (16): in a window's first thousands of packets
//!   0.1 % is a handful of packets, which mice reach; a source must send 16 before it can be
//!   admitted (a heavy source of a window under 16,000 packets is therefore not reported);
//! - a listed flow is reported only if its source's final estimate passes
//!   `threshold × window packets` (what "heavy in this window" means), checked off the fast path.
//!
//! Counts: a listed flow's IBLT packets are exact from its admission on; packets before it
//! (or while its source dipped under the bar) are missed, at most the source's Count-Min estimate
//! minus everything counted for the source's flows, which is the reported `error_bound`.

use super::bloom::Bloom;
use super::countmin::CountMin;
use super::iblt::Iblt;
use super::{Hasher, Hashing, KeyBytes};
use crate::hash::FlowTableHasher;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use telemark_wire::FlowKey;

/// Pipeline settings (defaults: DESIGN.md and docs/sketches.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HhConfig {
    /// Heavy = at least this share of the window's packets (SFCMon: 0.1 %).
    pub threshold: f64,
    /// Packets of a window before any packet is tested (SFCMon's Threshold_Eval).
    pub eval_after: u64,
    /// Share of the previous window's packets the bar starts from (0: SFCMon's running bar).
    pub expect: f64,
    /// The bar is never under this many packets (0: SFCMon's running bar).
    pub min_packets: u64,
    /// Report only flows whose source passes the threshold at the end of the window.
    pub final_check: bool,
    /// Count-Min rows.
    pub cms_depth: usize,
    /// Count-Min counters per row.
    pub cms_width: usize,
    /// Count-Min conservative update.
    pub conservative: bool,
    /// Bloom filter bits.
    pub bloom_bits: usize,
    /// Bloom filter hash functions.
    pub bloom_k: usize,
    /// IBLT cells.
    pub iblt_cells: usize,
    /// IBLT cells per key.
    pub iblt_k: usize,
    /// Hash family.
    pub hashing: Hashing,
    /// Seed.
    pub seed: u32,
}

impl Default for HhConfig {
    fn default() -> Self {
        HhConfig {
            threshold: 0.001,
            eval_after: 1000,
            expect: 0.5,
            min_packets: 16,
            final_check: true,
            cms_depth: 4,
            cms_width: 4000,
            conservative: true,
            bloom_bits: 16_384,
            bloom_k: 4,
            iblt_cells: 420,
            iblt_k: 3,
            hashing: Hashing::Murmur3,
            seed: 0x5fc0_0001,
        }
    }
}

impl HhConfig {
    /// SFCMon as published: w = 5436, d = 5, Bloom 1500 cells, IBLT 245 cells, k = 3, the
    /// running bar and no final check.
    pub fn paper() -> HhConfig {
        HhConfig {
            expect: 0.0,
            min_packets: 0,
            final_check: false,
            cms_depth: 5,
            cms_width: 5436,
            conservative: false,
            bloom_bits: 1500,
            bloom_k: 3,
            iblt_cells: 245,
            iblt_k: 3,
            ..HhConfig::default()
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.threshold > 0.0 && self.threshold < 1.0) {
            return Err(format!("threshold {} must be between 0 and 1", self.threshold));
        }
        if !(0.0..=1.0).contains(&self.expect) {
            return Err(format!("expect {} must be between 0 and 1", self.expect));
        }
        if self.cms_depth == 0 || self.cms_depth > 16 || self.cms_width == 0 {
            return Err("count-min needs 1-16 rows of at least one counter".into());
        }
        if self.bloom_bits == 0 || !(1..=16).contains(&self.bloom_k) {
            return Err("bloom filter needs bits and 1-16 hash functions".into());
        }
        if self.iblt_cells < self.iblt_k || !(2..=8).contains(&self.iblt_k) {
            return Err("IBLT needs 2-8 cells per key and at least that many cells".into());
        }
        Ok(())
    }
}

/// One heavy flow of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeavyFlow {
    /// The flow (FlowID2).
    pub key: FlowKey,
    /// Packets counted since admission (a lower bound of the flow's packets).
    pub packets: u64,
    /// Bytes counted since admission.
    pub bytes: u64,
    /// The flow's true packets are in `packets ..= packets + error_bound`.
    pub error_bound: u64,
    /// Best estimate of the flow's packets: those counted plus its source's Count-Min count
    /// when it was admitted, capped by the bound (exact up to the sketch's overcount for a
    /// source with one flow).
    pub estimate: u64,
    /// The source's (FlowID1's) estimated packets in the window.
    pub source_estimate: u64,
}

/// What one window found.
#[derive(Debug, Clone, PartialEq)]
pub struct HhWindow {
    /// Packets seen in the window.
    pub packets: u64,
    /// The window's bar in packets: a flow is heavy when its source's estimate reaches it
    /// (`threshold × packets`, rounded up).
    pub threshold_packets: u64,
    /// Heavy flows, most packets first.
    pub flows: Vec<HeavyFlow>,
    /// Heavy sources (FlowID1 encodings) with their estimates.
    pub sources: Vec<(KeyBytes, u64)>,
    /// Whether the IBLT listed everything (false: the window's list is incomplete, and says so).
    pub complete: bool,
    /// IBLT cells left when listing stopped.
    pub stuck_cells: usize,
    /// Flows admitted to the IBLT.
    pub admitted: u64,
    /// Listed flows the final check dropped.
    pub dropped_by_check: u64,
    /// Every source admitted in the window, when [`Sfcmon::log_admissions`] is on (SFCMon's
    /// own evaluation reported these, as if the IBLT never overflowed).
    pub admitted_sources: Vec<KeyBytes>,
}

/// The pipeline for one observation point.
#[derive(Debug, Clone)]
pub struct Sfcmon {
    cfg: HhConfig,
    cms: CountMin,
    bloom: Bloom,
    iblt: Iblt,
    packets: u64,
    bar_floor: f64,
    admitted: u64,
    admission_log: Option<std::collections::HashSet<KeyBytes>>,
}

impl Sfcmon {
    /// Also remembers every admitted source (evaluation only: unbounded memory).
    pub fn log_admissions(mut self) -> Sfcmon {
        self.admission_log = Some(Default::default());
        self
    }

    /// A pipeline with `cfg` (call [`HhConfig::validate`] first; bad values are clamped).
    pub fn new(cfg: HhConfig) -> Sfcmon {
        let h = |i: u32| Hasher::new(cfg.hashing, cfg.seed.wrapping_add(i));
        Sfcmon {
            cms: CountMin::new(cfg.cms_depth, cfg.cms_width, h(0)).conservative(cfg.conservative),
            // One set of FlowID2 row hashes serves both: the Bloom filter and the IBLT are
            // separate arrays, so sharing hashes costs neither any independence it relies on.
            bloom: Bloom::new(cfg.bloom_bits, cfg.bloom_k, h(0x100)),
            iblt: Iblt::new(cfg.iblt_cells, cfg.iblt_k, h(0x100)),
            cfg,
            packets: 0,
            bar_floor: 0.0,
            admitted: 0,
            admission_log: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &HhConfig {
        &self.cfg
    }

    /// Bytes of state (Count-Min + Bloom + IBLT).
    pub fn memory(&self) -> usize {
        use super::RowSketch;
        self.cms.memory() + self.bloom.memory() + self.iblt.memory()
    }

    /// Counts one packet of `len` bytes (Algorithm 1).
    ///
    /// Every packet does the same work, heavy or not: FlowID2's row hashes are computed once
    /// and serve the Bloom filter and the IBLT, and a packet that is not heavy adds nothing
    /// (it only reads the Bloom filter and adds 0 to its IBLT cells) instead of branching
    /// away. The cost per packet therefore does not depend on the traffic mix, and whether a
    /// packet is heavy, which changes from packet to packet in real traffic, is never a
    /// mispredicted branch. Only a flow's admission (once per flow per window) branches.
    #[inline]
    pub fn observe(&mut self, key: &FlowKey, len: u32) {
        use super::RowSketch;
        let id1 = KeyBytes::source_of(key);
        self.packets += 1;
        let mut rows = [0u32; 16];
        self.cms.hasher().rows_of(&id1, &mut rows[..self.cfg.cms_depth.min(16)]);
        let est = self.cms.update_estimate_hashed(&rows, 1);
        let bar = (self.cfg.threshold * (self.packets as f64).max(self.bar_floor))
            .max(self.cfg.min_packets as f64);
        let heavy = self.packets >= self.cfg.eval_after && f64::from(est) >= bar;
        let id2 = KeyBytes::flow_of(key);
        let k = self.cfg.bloom_k.max(self.cfg.iblt_k).min(16);
        self.bloom.hasher().rows_of(&id2, &mut rows[..k]);
        // Only reads on the fast path: a key already present has all its bits set, so they
        // are written on admission alone.
        let present = self.bloom.contains_hashed(&rows);
        if heavy && !present {
            self.admit(&id2, &rows, est);
        }
        if let (Some(log), true) = (&mut self.admission_log, heavy) {
            log.insert(id1);
        }
        self.iblt.update_hashed(&rows, u64::from(heavy), u64::from(heavy) * u64::from(len));
    }

    #[cold]
    fn admit(&mut self, id2: &KeyBytes, rows: &[u32], est: u32) {
        self.bloom.insert_hashed(rows, true);
        self.iblt.insert_with_base(id2, u64::from(est) - 1);
        self.admitted += 1;
    }

    /// Closes the window: lists the IBLT, applies the final check, and resets for the next.
    pub fn end_window(&mut self) -> HhWindow {
        let listing = self.iblt.list();
        let n = self.packets;
        let final_bar = self.cfg.threshold * n as f64;
        let mut counted: HashMap<KeyBytes, u64> = HashMap::new();
        let mut flows = Vec::new();
        let mut dropped = 0;
        for e in &listing.entries {
            let Some(key) = e.key.flow() else { continue };
            let src = KeyBytes::source_of(&key);
            let est = self.cms.estimate_u64(src.as_bytes());
            if self.cfg.final_check && (est as f64) < final_bar {
                dropped += 1;
                continue;
            }
            *counted.entry(src).or_default() += e.packets;
            flows.push(HeavyFlow {
                key,
                packets: e.packets,
                bytes: e.bytes,
                error_bound: 0,
                estimate: e.packets + e.base,
                source_estimate: est,
            });
        }
        for f in &mut flows {
            let src = KeyBytes::source_of(&f.key);
            f.error_bound =
                f.source_estimate.saturating_sub(counted.get(&src).copied().unwrap_or(0));
        }
        let mut sources: Vec<(KeyBytes, u64)> =
            flows.iter().map(|f| (KeyBytes::source_of(&f.key), f.source_estimate)).collect();
        sources.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        sources.dedup_by(|a, b| a.0 == b.0);
        let w = HhWindow {
            packets: n,
            threshold_packets: final_bar.ceil() as u64,
            flows,
            sources,
            complete: listing.complete,
            stuck_cells: listing.stuck_cells,
            admitted: self.admitted,
            dropped_by_check: dropped,
            admitted_sources: self
                .admission_log
                .as_mut()
                .map(|l| l.drain().collect())
                .unwrap_or_default(),
        };
        self.bar_floor = self.cfg.expect * n as f64;
        self.packets = 0;
        self.admitted = 0;
        self.cms.clear();
        self.bloom.clear();
        self.iblt.clear();
        w
    }
}

/// The exact baseline: a hash table of every flow's packets and bytes (SFCMon's "P4 table"),
/// hashed with the fast path's [`FoldHasher`](crate::hash::FoldHasher), not SipHash, so that
/// the comparison is against a good table.
#[derive(Debug, Clone, Default)]
pub struct ExactFlows {
    flows: HashMap<FlowKey, (u64, u64), FlowTableHasher>,
    packets: u64,
}

impl ExactFlows {
    /// Counts one packet.
    #[inline]
    pub fn observe(&mut self, key: &FlowKey, len: u32) {
        self.add(key, 1, u64::from(len));
    }

    /// Counts `packets` packets of `bytes` bytes in all.
    pub fn add(&mut self, key: &FlowKey, packets: u64, bytes: u64) {
        let e = self.flows.entry(*key).or_default();
        e.0 += packets;
        e.1 += bytes;
        self.packets += packets;
    }

    /// The window as the pipeline's final check defines heavy (a source with at least
    /// `threshold` of the window's packets, and at least `min_packets`), listed from exact
    /// counts: every flow of a heavy source with all its packets (error bound 0). The eBPF
    /// datapath counts every flow exactly in the kernel, so it needs no sketch; `complete`
    /// says whether every flow of the window was counted.
    pub fn window(&self, threshold: f64, min_packets: u64, complete: bool) -> HhWindow {
        let bar = threshold * self.packets as f64;
        let sources = self.heavy_sources(threshold);
        let heavy = |src: &KeyBytes| sources.get(src).filter(|p| **p >= min_packets).copied();
        let mut flows: Vec<HeavyFlow> = self
            .flows
            .iter()
            .filter_map(|(k, (p, b))| {
                let source_estimate = heavy(&KeyBytes::source_of(k))?;
                Some(HeavyFlow {
                    key: *k,
                    packets: *p,
                    bytes: *b,
                    error_bound: 0,
                    estimate: *p,
                    source_estimate,
                })
            })
            .collect();
        flows.sort_by(|a, b| b.packets.cmp(&a.packets).then(a.key.cmp(&b.key)));
        let mut sources: Vec<(KeyBytes, u64)> =
            sources.into_iter().filter(|(_, p)| *p >= min_packets).collect();
        sources.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        HhWindow {
            packets: self.packets,
            threshold_packets: bar.ceil() as u64,
            admitted: flows.len() as u64,
            flows,
            sources,
            complete,
            stuck_cells: 0,
            dropped_by_check: 0,
            admitted_sources: Vec::new(),
        }
    }

    /// Packets in the window.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Every flow's (packets, bytes).
    pub fn flows(&self) -> &HashMap<FlowKey, (u64, u64), FlowTableHasher> {
        &self.flows
    }

    /// Sources (FlowID1) with at least `threshold` of the packets, with their packets.
    pub fn heavy_sources(&self, threshold: f64) -> HashMap<KeyBytes, u64> {
        let mut by_src: HashMap<KeyBytes, u64> = HashMap::new();
        for (k, (p, _)) in &self.flows {
            *by_src.entry(KeyBytes::source_of(k)).or_default() += p;
        }
        let bar = threshold * self.packets as f64;
        by_src.retain(|_, p| *p as f64 >= bar);
        by_src
    }

    /// Starts a new window.
    pub fn clear(&mut self) {
        self.flows.clear();
        self.packets = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::{IpAddr, Ipv4Addr};

    fn key(src: u32, sport: u16) -> FlowKey {
        FlowKey {
            src: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + src)),
            dst: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            sport,
            dport: 443,
            proto: 6,
            spi: Some(7),
            si: Some(255),
        }
    }

    /// Exact counts list every flow of each source over the bar, with all its packets, and
    /// nothing else; a source over the share but under `min_packets` is not heavy.
    #[test]
    fn an_exact_window_lists_the_flows_of_heavy_sources_only() {
        let mut x = ExactFlows::default();
        x.add(&key(1, 1), 600, 60_000);
        x.add(&key(1, 2), 5, 500); // a mouse of a heavy source: listed
        for s in 2..400 {
            x.add(&key(s, 9), 1, 100);
        }
        let w = x.window(0.01, 16, true);
        assert_eq!(w.packets, 1003);
        assert_eq!(w.threshold_packets, 11);
        let got: Vec<_> = w.flows.iter().map(|f| (f.key, f.packets, f.error_bound)).collect();
        assert_eq!(got, vec![(key(1, 1), 600, 0), (key(1, 2), 5, 0)]);
        assert_eq!(w.flows[1].source_estimate, 605);
        assert_eq!(w.sources.len(), 1);
        // 5 % of 100 packets is 5, under the 16-packet floor.
        let mut small = ExactFlows::default();
        small.add(&key(1, 1), 10, 1000);
        small.add(&key(2, 1), 90, 9000);
        let w = small.window(0.05, 16, false);
        assert_eq!(w.flows.len(), 1);
        assert!(!w.complete);
    }

    /// 150 heavy sources (2 flows each, ~0.33 % of packets each) among 50,000 one- to
    /// five-packet sources, interleaved; two windows so the second uses the previous bar.
    #[test]
    fn finds_every_heavy_source_with_bounded_counts() {
        let mut s = Sfcmon::new(HhConfig::default());
        let mut r = 12345u64;
        let mut rnd = || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            r
        };
        for window in 0..2 {
            let mut exact = ExactFlows::default();
            for i in 0..400_000u64 {
                let k = if i % 2 == 0 {
                    let h = (rnd() % 150) as u32;
                    key(h, 1000 + (rnd() % 2) as u16)
                } else {
                    key(1000 + (rnd() % 50_000) as u32, 2000)
                };
                let len = 64 + (rnd() % 1400) as u32;
                s.observe(&k, len);
                exact.observe(&k, len);
            }
            let w = s.end_window();
            assert!(w.complete, "window {window}: listing incomplete ({} stuck)", w.stuck_cells);
            let truth = exact.heavy_sources(0.001);
            let found: HashMap<KeyBytes, u64> = w.sources.iter().copied().collect();
            assert_eq!(truth.len(), 150);
            for k in truth.keys() {
                assert!(found.contains_key(k), "window {window}: missed a heavy source");
            }
            assert!(found.keys().all(|k| truth.contains_key(k)), "no false positives here");
            for f in &w.flows {
                let (p, b) = exact.flows()[&f.key];
                assert!(
                    f.packets <= p && p <= f.packets + f.error_bound,
                    "{} ≤ {p} ≤ +{}",
                    f.packets,
                    f.error_bound
                );
                assert!(f.bytes <= b);
            }
        }
    }

    #[test]
    fn the_paper_configuration_admits_early_mice() {
        let mut s = Sfcmon::new(HhConfig::paper());
        // Sources send three packets in a row: at 1,000–3,000 packets the bar is 1–3 packets.
        for i in 0..20_000u32 {
            s.observe(&key((i / 3) % 5_000, 1), 100);
        }
        let w = s.end_window();
        // With the running bar every source of the first few thousand packets is "heavy".
        assert!(w.admitted > 500, "{}", w.admitted);
        assert!(!w.complete, "245 cells cannot list them, and the listing says so");
    }

    #[test]
    fn config_validation() {
        assert!(HhConfig::default().validate().is_ok());
        assert!(HhConfig::paper().validate().is_ok());
        assert!(HhConfig { threshold: 0.0, ..HhConfig::default() }.validate().is_err());
        assert!(HhConfig { iblt_k: 1, ..HhConfig::default() }.validate().is_err());
        assert!(HhConfig { cms_depth: 17, ..HhConfig::default() }.validate().is_err());
    }
}
