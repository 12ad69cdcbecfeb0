//! The agent's heavy-hitter stage: SFCMon's pipeline (`telemark_core::sketch::sfcmon`, the
//! paper's Algorithm 1: Count-Min → Bloom filter → IBLT) over every packet a port receives,
//! one pipeline per input port, in windows of fixed length. At a window's end the fast path
//! lists the pipeline and resets it (SFCMon's controller step, done here rather than by a
//! controller: a few microseconds for the default sizes, once per window and port, never per
//! packet; the listing allocates, and its time is not in the stage's cost) and hands the
//! window's heavy flows to the aggregator through a ring. A full ring drops the window and
//! counts it; nothing here waits.

use telemark_core::sketch::sfcmon::{HhConfig, HhWindow, Sfcmon};
use telemark_core::spsc::{self, Consumer, Producer};
use telemark_wire::FlowKey;

/// One port's window, as the pipeline listed it.
#[derive(Debug)]
pub struct PortWindow {
    /// Input port (index in the agent's port list).
    pub port: u16,
    /// Window start, ns since the epoch.
    pub start_ns: u64,
    /// Window end.
    pub end_ns: u64,
    /// What the pipeline found.
    pub hh: HhWindow,
}

/// What the stage did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HhStats {
    /// Windows closed (per port).
    pub windows: u64,
    /// Of those, windows whose IBLT could not list everything (the list said so).
    pub incomplete: u64,
    /// Heavy flows reported.
    pub flows: u64,
    /// Windows dropped because the ring to the aggregator was full.
    pub drops: u64,
    /// Time spent in the stage, as its caller measured it ([`HeavyHitters::add_busy_ns`]).
    pub busy_ns: u64,
}

/// The stage, owned by the fast path.
pub struct HeavyHitters {
    ports: Vec<Sfcmon>,
    window_ns: u64,
    start_ns: u64,
    ring: Producer<PortWindow>,
    stats: HhStats,
}

impl HeavyHitters {
    /// A pipeline per port with `cfg` (validated by the caller), windows of `window_ns` from
    /// `now_ns`; the consuming end of the ring goes to the aggregator.
    pub fn new(
        cfg: &HhConfig,
        ports: usize,
        window_ns: u64,
        now_ns: u64,
    ) -> (HeavyHitters, Consumer<PortWindow>) {
        let (ring, cons) = spsc::channel(64.max(4 * ports));
        let hh = HeavyHitters {
            ports: (0..ports).map(|_| Sfcmon::new(cfg.clone())).collect(),
            window_ns: window_ns.max(1),
            start_ns: now_ns,
            ring,
            stats: HhStats::default(),
        };
        (hh, cons)
    }

    /// Counts one packet of `len` bytes that arrived on `port`.
    #[inline]
    pub fn packet(&mut self, port: u16, key: &FlowKey, len: u32) {
        if let Some(p) = self.ports.get_mut(usize::from(port)) {
            p.observe(key, len);
        }
    }

    /// Closes the window once `window_ns` have passed since it opened (call it often: the fast
    /// path does on every round of its loop). A window ends when it is closed, so its record
    /// holds exactly the packets counted between its start and end, even after a stall; the
    /// next one opens then.
    pub fn tick(&mut self, now_ns: u64) {
        if now_ns < self.start_ns.saturating_add(self.window_ns) {
            return;
        }
        self.end_window(now_ns);
        self.start_ns = now_ns;
    }

    /// Closes the current window early, at `now_ns` (shutdown).
    pub fn flush(&mut self, now_ns: u64) {
        self.end_window(now_ns.max(self.start_ns));
        self.start_ns = now_ns;
    }

    fn end_window(&mut self, end_ns: u64) {
        for (i, p) in self.ports.iter_mut().enumerate() {
            let hh = p.end_window();
            self.stats.windows += 1;
            self.stats.incomplete += u64::from(!hh.complete);
            let flows = hh.flows.len() as u64;
            let w = PortWindow { port: i as u16, start_ns: self.start_ns, end_ns, hh };
            match self.ring.push(w) {
                Ok(()) => self.stats.flows += flows,
                Err(_) => self.stats.drops += 1,
            }
        }
    }

    /// Adds time the caller spent in [`packet`](Self::packet) calls.
    pub fn add_busy_ns(&mut self, ns: u64) {
        self.stats.busy_ns += ns;
    }

    /// The counters.
    pub fn stats(&self) -> HhStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(src: u16, sport: u16) -> FlowKey {
        FlowKey {
            src: std::net::Ipv4Addr::from(0x0a00_0000 | u32::from(src)).into(),
            dst: "10.0.1.1".parse().unwrap(),
            sport,
            dport: 80,
            proto: 6,
            spi: None,
            si: None,
        }
    }

    /// A port's elephant among mice (1,500 sources of 10 packets, each under the 0.1 % bar)
    /// comes out of its window with the packets it sent after admission; the other port's
    /// window is empty; windows tick on time.
    #[test]
    fn a_heavy_flow_is_reported_for_its_port_and_window() {
        let (mut hh, cons) = HeavyHitters::new(&HhConfig::default(), 2, 1_000, 10_000);
        for i in 0..20_000u32 {
            if i % 4 == 0 {
                hh.packet(0, &key(1, 1), 100);
            } else {
                hh.packet(0, &key((i % 2000) as u16 + 2, i as u16), 100);
            }
        }
        hh.tick(10_999);
        assert!(cons.pop().is_none(), "a window closed early");
        hh.tick(11_000);
        let w0 = cons.pop().unwrap();
        let w1 = cons.pop().unwrap();
        assert_eq!((w0.port, w0.start_ns, w0.end_ns), (0, 10_000, 11_000));
        assert_eq!(w0.hh.packets, 20_000);
        assert_eq!(w0.hh.flows.len(), 1, "{:?}", w0.hh);
        let f = w0.hh.flows[0];
        assert_eq!(f.key, key(1, 1));
        // 5,000 sent; the ones before admission are inside the error bound.
        assert!(f.packets <= 5_000 && f.packets + f.error_bound >= 5_000, "{f:?}");
        assert_eq!(f.bytes, f.packets * 100);
        assert!(w1.hh.flows.is_empty() && w1.hh.packets == 0);
        assert_eq!(hh.stats().windows, 2);
        assert_eq!(hh.stats().flows, 1);
        // A stall: the window ends when it is closed, and the next one starts there.
        hh.tick(14_500);
        let w = cons.pop().unwrap();
        assert_eq!((w.start_ns, w.end_ns), (11_000, 14_500));
        cons.pop().unwrap();
        hh.tick(15_499);
        assert!(cons.pop().is_none());
        hh.tick(15_500);
        assert_eq!(cons.pop().unwrap().start_ns, 14_500);
    }

    /// A ring nobody drains drops whole windows and counts them.
    #[test]
    fn a_full_ring_drops_windows_and_counts_them() {
        let (mut hh, _cons) = HeavyHitters::new(&HhConfig::default(), 1, 10, 0);
        let cap = hh.ring.capacity() as u64;
        for t in 1..=cap + 5 {
            hh.tick(t * 10);
        }
        assert_eq!(hh.stats().windows, cap + 5);
        assert_eq!(hh.stats().drops, 5);
    }
}
