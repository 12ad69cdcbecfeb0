//! The IPFIX flow cache (the paper's §V-B "Introducing cache and flow aggregation"; RFC 5470
//! §5.1 "Metering Process" and RFC 5102's `flowEndReason` for why a flow left).
//!
//! A set-associative table: a flow's hash picks a bucket of [`WAYS`] entries, and the flow
//! lives in one of them. A packet of a cached flow adds to its counters; a new flow takes a
//! free way, or, with the bucket full, the way idle longest, whose flow leaves with reason
//! [`EndReason::LackOfResources`] (counted in [`CacheStats::evicted`]). A sweep, a slice of
//! the table at a time, hands out flows whose active timeout passed (their counters start
//! again: a long flow is reported every active timeout) and removes flows idle longer than the
//! idle timeout (a TCP flow that saw FIN or RST leaves as [`EndReason::EndOfFlow`]).
//!
//! With `max_flows` 0 there is no table: every packet leaves at once as a flow of its own (RFC
//! 5470 §5.1.1's immediate cache, the paper's "IPFIX without a cache"), reported as an active
//! timeout as Open vSwitch reports its records.
//!
//! Nothing here allocates after [`FlowCache::new`].

use crate::FlowKey;

/// Entries per bucket.
pub const WAYS: usize = 4;

/// TCP FIN and RST, the flags that end a connection.
const TCP_FIN_RST: u8 = 0x01 | 0x04;

/// Why a flow left the cache: RFC 5102 `flowEndReason` (IE 136), with its codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndReason {
    /// No packet for the idle timeout (0x01).
    IdleTimeout = 1,
    /// Cached for the active timeout; it goes on (0x02).
    ActiveTimeout = 2,
    /// A TCP FIN or RST was seen (0x03).
    EndOfFlow = 3,
    /// The exporter stopped (0x04).
    ForcedEnd = 4,
    /// The table had no room for a new flow (0x05).
    LackOfResources = 5,
}

/// The cache's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// The most flows held (rounded up to whole buckets of a power-of-two count); 0: no
    /// cache, every packet exported at once.
    pub max_flows: usize,
    /// A flow is reported at least this often while it lasts, ns.
    pub active_ns: u64,
    /// A flow silent this long is reported and removed, ns.
    pub idle_ns: u64,
}

impl Default for CacheConfig {
    /// 65,536 flows, a 60 s active and a 15 s idle timeout (the values of common exporters).
    fn default() -> Self {
        CacheConfig { max_flows: 65_536, active_ns: 60_000_000_000, idle_ns: 15_000_000_000 }
    }
}

/// One packet as the cache sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Its flow.
    pub key: FlowKey,
    /// `flow_hash(&key)`.
    pub hash: u64,
    /// Port it came in on.
    pub in_port: u16,
    /// Port it went out of (`u16::MAX`: none).
    pub out_port: u16,
    /// Its 802.1Q VLAN (0: none).
    pub vlan: u16,
    /// 4 or 6.
    pub ip_version: u8,
    /// Its DSCP.
    pub dscp: u8,
    /// Its TCP flags (0 if not TCP).
    pub tcp_flags: u8,
    /// ICMP or ICMPv6 type × 256 + code (0 for other protocols): ICMP messages of different
    /// types are different flows, as IPFIX's `icmpTypeCode` elements key them.
    pub icmp_type_code: u16,
    /// Bytes of its IP packet (the IPFIX octet count).
    pub octets: u32,
    /// When it arrived, ns since the Unix epoch.
    pub ts_ns: u64,
}

/// One flow's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowEntry {
    /// The first packet's view (key, ports, VLAN, version, DSCP).
    pub first: Observation,
    /// TCP flags of every packet, or-ed.
    pub tcp_flags: u8,
    /// Packets since the flow was last reported.
    pub packets: u64,
    /// Octets since then.
    pub octets: u64,
    /// First packet since then.
    pub start_ns: u64,
    /// Last packet.
    pub end_ns: u64,
}

impl Observation {
    /// Whether `other` belongs to the same cache entry: the key of the cache (flow key, input
    /// port, VLAN, ICMP type and code).
    fn same_flow(&self, other: &Observation) -> bool {
        self.key == other.key
            && self.in_port == other.in_port
            && self.vlan == other.vlan
            && self.icmp_type_code == other.icmp_type_code
    }
}

impl FlowEntry {
    /// A flow of packet `p` alone.
    fn of(p: &Observation) -> FlowEntry {
        FlowEntry {
            first: *p,
            tcp_flags: p.tcp_flags,
            packets: 1,
            octets: u64::from(p.octets),
            start_ns: p.ts_ns,
            end_ns: p.ts_ns,
        }
    }
}

/// What the cache did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Packets counted.
    pub packets: u64,
    /// Flows created.
    pub created: u64,
    /// Flows pushed out for room (reason `LackOfResources`).
    pub evicted: u64,
    /// Records handed out, every reason.
    pub exported: u64,
}

#[derive(Debug, Clone, Copy)]
struct Way {
    used: bool,
    tag: u32,
    entry: FlowEntry,
}

/// The flow cache of one worker.
#[derive(Debug, Clone)]
pub struct FlowCache {
    cfg: CacheConfig,
    ways: Box<[Way]>,
    /// Bucket count − 1 (a power of two).
    mask: usize,
    cursor: usize,
    len: usize,
    stats: CacheStats,
}

fn empty_way() -> Way {
    let first = Observation {
        key: FlowKey::default(),
        hash: 0,
        in_port: 0,
        out_port: 0,
        vlan: 0,
        ip_version: 0,
        dscp: 0,
        tcp_flags: 0,
        icmp_type_code: 0,
        octets: 0,
        ts_ns: 0,
    };
    Way {
        used: false,
        tag: 0,
        entry: FlowEntry { first, tcp_flags: 0, packets: 0, octets: 0, start_ns: 0, end_ns: 0 },
    }
}

impl FlowCache {
    /// An empty cache.
    pub fn new(cfg: CacheConfig) -> FlowCache {
        let buckets = cfg.max_flows.div_ceil(WAYS).max(1).next_power_of_two();
        FlowCache {
            cfg,
            ways: vec![empty_way(); buckets * WAYS].into_boxed_slice(),
            mask: buckets - 1,
            cursor: 0,
            len: 0,
            stats: CacheStats::default(),
        }
    }

    /// Counts packet `p`; a flow pushed out for room goes to `out` (without a cache: the
    /// packet's own record).
    #[inline]
    pub fn observe(&mut self, p: &Observation, out: &mut impl FnMut(&FlowEntry, EndReason)) {
        self.observe_many(p, 1, u64::from(p.octets), p.ts_ns, out);
    }

    /// Counts `packets` packets of `p`'s flow, `octets` in all, the first at `p.ts_ns` and the
    /// last at `last_ns`: a count kept elsewhere (the eBPF datapath's per-period counters)
    /// added at once, as that many calls to [`observe`](Self::observe) would.
    #[inline]
    pub fn observe_many(
        &mut self,
        p: &Observation,
        packets: u64,
        octets: u64,
        last_ns: u64,
        out: &mut impl FnMut(&FlowEntry, EndReason),
    ) {
        self.stats.packets += packets;
        let entry = FlowEntry { packets, octets, end_ns: last_ns.max(p.ts_ns), ..FlowEntry::of(p) };
        if self.cfg.max_flows == 0 {
            self.stats.created += 1;
            self.stats.exported += 1;
            out(&entry, EndReason::ActiveTimeout);
            return;
        }
        let base = (p.hash as usize & self.mask) * WAYS;
        let tag = (p.hash >> 32) as u32;
        let bucket = &mut self.ways[base..base + WAYS];
        let same = |w: &Way| w.used && w.tag == tag && w.entry.first.same_flow(p);
        if let Some(w) = bucket.iter_mut().find(|w| same(w)) {
            let e = &mut w.entry;
            if e.packets == 0 {
                e.start_ns = p.ts_ns;
            }
            e.packets += packets;
            e.octets += octets;
            e.tcp_flags |= p.tcp_flags;
            e.end_ns = e.end_ns.max(entry.end_ns);
            return;
        }
        let slot = match bucket.iter().position(|w| !w.used) {
            Some(free) => {
                self.len += 1;
                free
            }
            None => {
                // The way idle longest makes room.
                let (oldest, _) = bucket
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, w)| w.entry.end_ns)
                    .unwrap_or((0, &bucket[0]));
                self.stats.evicted += 1;
                if bucket[oldest].entry.packets > 0 {
                    self.stats.exported += 1;
                    out(&bucket[oldest].entry, EndReason::LackOfResources);
                }
                oldest
            }
        };
        self.stats.created += 1;
        bucket[slot] = Way { used: true, tag, entry };
    }

    /// Looks at the next `ways` entries (round robin over the table): flows past their active
    /// timeout at `now` go to `out` and start counting again; flows idle past the idle timeout
    /// go to `out` and leave.
    pub fn sweep(&mut self, now: u64, ways: usize, out: &mut impl FnMut(&FlowEntry, EndReason)) {
        let total = self.ways.len();
        for _ in 0..ways.min(total) {
            let i = self.cursor;
            self.cursor = (self.cursor + 1) % total;
            let w = &mut self.ways[i];
            if !w.used {
                continue;
            }
            let e = &mut w.entry;
            if now.saturating_sub(e.end_ns) >= self.cfg.idle_ns {
                if e.packets > 0 {
                    let why = if e.tcp_flags & TCP_FIN_RST != 0 {
                        EndReason::EndOfFlow
                    } else {
                        EndReason::IdleTimeout
                    };
                    self.stats.exported += 1;
                    out(e, why);
                }
                w.used = false;
                self.len -= 1;
            } else if e.packets > 0 && now.saturating_sub(e.start_ns) >= self.cfg.active_ns {
                self.stats.exported += 1;
                out(e, EndReason::ActiveTimeout);
                e.packets = 0;
                e.octets = 0;
                e.tcp_flags = 0;
                e.start_ns = now;
            }
        }
    }

    /// Hands every flow with packets to `out` ([`EndReason::ForcedEnd`]) and empties the
    /// cache (the exporter stops).
    pub fn flush(&mut self, out: &mut impl FnMut(&FlowEntry, EndReason)) {
        for w in self.ways.iter_mut().filter(|w| w.used) {
            if w.entry.packets > 0 {
                self.stats.exported += 1;
                out(&w.entry, EndReason::ForcedEnd);
            }
            w.used = false;
        }
        self.len = 0;
    }

    /// Flows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no flow is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries the table has (whole buckets).
    pub fn capacity(&self) -> usize {
        self.ways.len()
    }

    /// What it did so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow_hash;
    use std::collections::HashMap;
    use std::net::{IpAddr, Ipv4Addr};

    const S: u64 = 1_000_000_000;

    fn pkt(flow: u32, ts_ns: u64, octets: u32, tcp_flags: u8) -> Observation {
        let key = FlowKey {
            src: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + flow)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9)),
            sport: 1000,
            dport: 80,
            proto: 6,
            spi: None,
            si: None,
        };
        Observation {
            key,
            hash: flow_hash(&key),
            in_port: 0,
            out_port: 1,
            vlan: 0,
            ip_version: 4,
            dscp: 0,
            tcp_flags,
            icmp_type_code: 0,
            octets,
            ts_ns,
        }
    }

    type Out = Vec<(FlowKey, u64, u64, EndReason)>;

    fn collect(out: &mut Out) -> impl FnMut(&FlowEntry, EndReason) + '_ {
        |e, why| out.push((e.first.key, e.packets, e.octets, why))
    }

    /// Whatever the timeouts and room, every packet counted comes out in exactly one record
    /// of its flow: the sums per flow equal what went in.
    #[test]
    fn every_packet_is_reported_once_whatever_leaves_when() {
        let cfg = CacheConfig { max_flows: 64, active_ns: 3 * S, idle_ns: 2 * S };
        let mut c = FlowCache::new(cfg);
        let mut out = Out::new();
        let mut sent: HashMap<FlowKey, (u64, u64)> = HashMap::new();
        let mut x = 12345u64;
        for i in 0..200_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let flow = ((x >> 33) % 500) as u32; // more flows than room: evictions
            let ts = i * 100_000; // 10 kpps, 20 s
            let p = pkt(flow, ts, 100 + flow, 0x10);
            let s = sent.entry(p.key).or_default();
            s.0 += 1;
            s.1 += u64::from(p.octets);
            c.observe(&p, &mut collect(&mut out));
            if i % 1000 == 0 {
                c.sweep(ts, 64, &mut collect(&mut out));
            }
        }
        c.flush(&mut collect(&mut out));
        let mut got: HashMap<FlowKey, (u64, u64)> = HashMap::new();
        for (k, p, o, _) in &out {
            let g = got.entry(*k).or_default();
            g.0 += p;
            g.1 += o;
        }
        assert_eq!(got, sent);
        let st = c.stats();
        assert!(st.evicted > 0);
        assert_eq!(st.exported as usize, out.len());
        assert!(out.iter().any(|r| r.3 == EndReason::LackOfResources));
        assert!(c.is_empty());
    }

    /// Counts added in batches come out as the same packets one by one would: summed per
    /// flow, dated from the first batch's first packet to the last one's last.
    #[test]
    fn a_batch_counts_as_its_packets_one_by_one() {
        let cfg = CacheConfig { max_flows: 64, active_ns: 60 * S, idle_ns: 30 * S };
        let (mut one, mut many) = (FlowCache::new(cfg), FlowCache::new(cfg));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for batch in 0..10u64 {
            for i in 0..7 {
                one.observe(&pkt(3, batch * S + i, 100, 0), &mut |e, _| a.push(*e));
            }
            let first = pkt(3, batch * S, 100, 0);
            many.observe_many(&first, 7, 700, batch * S + 6, &mut |e, _| b.push(*e));
        }
        one.flush(&mut |e, _| a.push(*e));
        many.flush(&mut |e, _| b.push(*e));
        let sums = |v: &[FlowEntry]| -> Vec<(u64, u64, u64, u64)> {
            v.iter().map(|e| (e.packets, e.octets, e.start_ns, e.end_ns)).collect()
        };
        assert_eq!(sums(&a), sums(&b));
        assert_eq!((b[0].packets, b[0].octets, b[0].end_ns), (70, 7000, 9 * S + 6));
        assert_eq!(one.stats(), many.stats());
    }

    #[test]
    fn without_a_cache_every_packet_is_a_record_of_its_own() {
        let mut c = FlowCache::new(CacheConfig { max_flows: 0, active_ns: S, idle_ns: S });
        let mut out = Out::new();
        for t in 0..5 {
            c.observe(&pkt(1, t, 100, 0x10), &mut collect(&mut out));
        }
        assert_eq!(out.len(), 5);
        assert!(out.iter().all(|r| r.1 == 1 && r.2 == 100 && r.3 == EndReason::ActiveTimeout));
        assert!(c.is_empty());
    }

    #[test]
    fn active_idle_and_end_of_flow_each_report_as_rfc_5102_says() {
        let cfg = CacheConfig { max_flows: 1024, active_ns: 10 * S, idle_ns: 2 * S };
        let mut c = FlowCache::new(cfg);
        let mut out = Out::new();
        // Flow 1: a packet a second for 25 s; flow 2: two packets then silence; flow 3: TCP
        // closed with FIN.
        for t in 0..25 {
            c.observe(&pkt(1, t * S, 100, 0x10), &mut collect(&mut out));
            if t < 2 {
                c.observe(&pkt(2, t * S, 50, 0x10), &mut collect(&mut out));
                c.observe(
                    &pkt(3, t * S, 60, if t == 1 { 0x11 } else { 0x02 }),
                    &mut collect(&mut out),
                );
            }
            c.sweep(t * S, c.capacity(), &mut collect(&mut out));
        }
        fn of(out: &Out, f: u32) -> Vec<(u64, EndReason)> {
            out.iter().filter(|r| r.0 == pkt(f, 0, 0, 0).key).map(|r| (r.1, r.3)).collect()
        }
        // Packets of seconds 0–10 at the sweep of second 10, 11–21 at 21.
        let active = (11, EndReason::ActiveTimeout);
        assert_eq!(of(&out, 1), [active, active]);
        assert_eq!(of(&out, 2), [(2, EndReason::IdleTimeout)]);
        assert_eq!(of(&out, 3), [(2, EndReason::EndOfFlow)]);
        assert_eq!(c.len(), 1);
        c.flush(&mut collect(&mut out));
        assert_eq!(of(&out, 1).last(), Some(&(3, EndReason::ForcedEnd)));
    }
}
