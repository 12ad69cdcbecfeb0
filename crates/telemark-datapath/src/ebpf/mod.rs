//! The eBPF datapath: Telemark's measurement at the tc hooks of interfaces a host already has
//! (docs/ebpf.md), with no change to how the host forwards.
//!
//! - The programs (`bpf/telemark.bpf.c`, built to the committed `bpf/telemark.bpf.o`): time-based
//!   alternate marking (RFC 9341 §3.2) where traffic enters the measured domain, per-flow,
//!   per-colour, per-period counts at the ingress and egress of each attached interface,
//!   unmarking where it leaves, and drops per flow and reason from `skb:kfree_skb`.
//! - [`Programs`]: loads them (aya: a pure-Rust loader, so building Telemark needs no C
//!   toolchain), attaches them by tcx link (Linux 6.6 and later) or clsact filter, on the host
//!   or in a named network namespace, and reads their maps.
//! - [`periods::PeriodReader`]: turns the counters into final periods; [`btf`] names the
//!   kernel's drop reasons.

pub mod btf;
pub mod maps;
pub mod periods;

use aya::maps::{
    Array, HashMap as BpfHashMap, MapData, MapError, PerCpuArray, PerCpuHashMap, PerfEventArray,
    RingBuf,
};
use aya::programs::tc::{self, TcAttachOptions};
use aya::programs::{BtfTracePoint, LinkOrder, SchedClassifier, TcAttachType};
use aya::{Btf, Ebpf, EbpfLoader};
use maps::{Clock, DropKey, DropPort, Key, Port, PortSlot, Slots, Stat, PORT_SLOTS};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

#[repr(C, align(8))]
struct Aligned<B: ?Sized>(B);

/// The compiled programs (`make -C crates/telemark-datapath/bpf`; CI checks it is what the
/// source builds to).
static OBJECT: &Aligned<[u8]> = &Aligned(*include_bytes!("../../bpf/telemark.bpf.o"));

/// The most kernel memory the counters may take.
const MAX_MAP_BYTES: u64 = 2 << 30;

/// The tc programs' names in the object and in `tc filter show`.
pub const INGRESS_PROGRAM: &str = "tm_ingress";
pub const EGRESS_PROGRAM: &str = "tm_egress";
/// The drop-reason program's name.
pub const DROP_PROGRAM: &str = "tm_drop";

/// What can go wrong loading or attaching.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the kernel has no BTF ({}): the eBPF datapath needs a kernel built with \
         CONFIG_DEBUG_INFO_BTF=y (Linux 5.8 or later; Debian, Ubuntu, Fedora and RHEL kernels \
         have it)",
        btf::VMLINUX
    )]
    NoBtf,
    #[error(
        "loading the eBPF programs: {0} (they need root or CAP_BPF with CAP_NET_ADMIN and \
         CAP_PERFMON, BTF, and Linux 6.1 or later for bpf_ktime_get_tai_ns)"
    )]
    Load(String),
    #[error("network namespace {ns:?}: {err}")]
    Netns { ns: String, err: io::Error },
    #[error("interface {target}: {err}")]
    Interface { target: String, err: String },
    #[error("reading or writing map {map}: {err}")]
    Map { map: &'static str, err: String },
}

/// An interface to attach to: by name, on the host or in a network namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// A namespace as `ip netns` names it (`/run/netns/<name>`), or a path to a namespace
    /// file (`/proc/<pid>/ns/net`); `None`: the agent's own.
    pub netns: Option<String>,
    pub iface: String,
}

impl Target {
    /// How records and logs name it: `iface`, or `netns:iface`.
    pub fn label(&self) -> String {
        match &self.netns {
            Some(ns) => format!("{}:{}", ns.rsplit('/').next().unwrap_or(ns), self.iface),
            None => self.iface.clone(),
        }
    }
}

/// How the programs are hooked to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// tcx links (Linux 6.6 and later): released by the kernel when the agent exits.
    Tcx,
    /// clsact filters (before 6.6): removed by the agent at stop and at the next start.
    Clsact,
}

impl Hook {
    /// tcx where the running kernel has it.
    pub fn for_this_kernel() -> Hook {
        use aya::util::KernelVersion;
        let tcx = KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0));
        if tcx {
            Hook::Tcx
        } else {
            Hook::Clsact
        }
    }
}

/// An interface the programs are attached to.
#[derive(Debug)]
pub struct Attached {
    pub target: Target,
    /// The interface's index in its namespace (the programs tell ports apart by it).
    pub ifindex: u32,
    /// Its namespace's cookie (the drop program tells namespaces apart by it).
    pub netns_cookie: u64,
    pub hook: Hook,
    ingress: aya::programs::tc::SchedClassifierLinkId,
    egress: aya::programs::tc::SchedClassifierLinkId,
}

impl Attached {
    fn drop_port(&self) -> DropPort {
        DropPort { netns: self.netns_cookie, ifindex: self.ifindex, pad: 0 }
    }
}

/// The perf buffers of sampled packets (sFlow), one per CPU.
pub struct Samples {
    buffers: Vec<aya::maps::perf::PerfEventArrayBuffer<MapData>>,
    scratch: Vec<u8>,
}

impl Samples {
    /// Hands every sampled packet waiting to `f`, with its meta; returns how many samples the
    /// kernel reported lost (the buffer was full) and how many were malformed.
    pub fn drain(&mut self, mut f: impl FnMut(maps::SampleMeta, &[u8])) -> (u64, u64) {
        let (mut lost, mut bad) = (0, 0);
        let scratch = &mut self.scratch;
        for b in &mut self.buffers {
            b.for_each(|ev| match ev {
                aya::maps::perf::PerfEvent::Sample { head, tail } => {
                    let raw = if tail.is_empty() {
                        head
                    } else {
                        scratch.clear();
                        scratch.extend_from_slice(head);
                        scratch.extend_from_slice(tail);
                        &scratch[..]
                    };
                    match maps::SampleMeta::parse(raw) {
                        Some((meta, bytes)) => f(meta, bytes),
                        None => bad += 1,
                    }
                }
                aya::maps::perf::PerfEvent::Lost { count } => lost += count,
            });
        }
        (lost, bad)
    }
}

/// What the agent tells the programs: the marking, and sFlow's sampling at ingress points.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    pub period_ns: u64,
    pub guard_ns: u64,
    /// The DSCP bit (0..5) that carries the colour.
    pub colour_bit: u8,
    /// What markers and exits do with a packet whose sender set that bit.
    pub own_colour: maps::OwnColour,
    /// sFlow: one packet in this many sampled at each ingress point (0: none).
    pub sample_rate: u32,
    /// sFlow: the most bytes of a sampled packet sent (its headers).
    pub sample_bytes: u32,
}

/// The slot of interface `ifindex` in map "ports": its port, and the settings and clock
/// offsets its hooks read.
fn slot(ifindex: u32, port: Port, s: Settings, c: Clocks) -> PortSlot {
    PortSlot {
        sample_bytes: s.sample_bytes,
        ifindex,
        port,
        period_ns: s.period_ns,
        guard_ns: s.guard_ns,
        sample_rate: s.sample_rate,
        tick_ns: u32::try_from(tick_ns()).unwrap_or(u32::MAX),
        tai_offset_s: c.tai_offset_s,
        colour_bit: s.colour_bit,
        clock: clock_for(s.period_ns, s.guard_ns) as u8,
        own_colour: s.own_colour as u8,
        ..Default::default()
    }
}

/// What turns the kernel's clocks into Unix time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Clocks {
    /// CLOCK_TAI minus CLOCK_REALTIME, in seconds.
    tai_offset_s: u16,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC (the tick clock's base): moves when the clock is
    /// set.
    mono_offset_ns: u64,
}

impl Clocks {
    fn now() -> Clocks {
        Clocks { tai_offset_s: tai_offset_s(), mono_offset_ns: mono_offset_ns() }
    }

    /// Whether the clock was set between `self` and `later`: the two reads behind the
    /// monotonic offset are microseconds apart, so a millisecond is a step.
    fn stepped(&self, later: &Clocks) -> bool {
        self.mono_offset_ns.abs_diff(later.mono_offset_ns) >= 1_000_000
    }
}

/// Room in map "new_keys" for a quarter of the keys map "counts" holds (56 bytes each), rounded
/// up to a power of two, from 16 KiB (or a page, if larger: the kernel wants whole pages) to
/// 4 MiB: keys created faster than that between two reads make the next read a walk.
fn new_keys_bytes(flows: u32) -> u32 {
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let least = page.max(16 << 10).next_power_of_two();
    let bytes = (u64::from(flows) * 56 / 4).next_power_of_two().clamp(least, least.max(4 << 20));
    u32::try_from(bytes).unwrap_or(4 << 20)
}

/// CPUs the kernel could bring online (per-CPU maps hold a value for each, not only for those
/// this process may run on); where /sys does not say, the CPUs there are now.
fn possible_cpus() -> u64 {
    let now = || std::thread::available_parallelism().map_or(1, |n| n.get());
    aya::util::nr_cpus().unwrap_or_else(|_| now()).max(1) as u64
}

/// The kernel memory the counters of `flows` keys take (checked against [`MAX_MAP_BYTES`] at
/// load): map "counts", a per-CPU hash allocated whole at load (for each key 96 bytes of slots
/// per possible CPU and the element with its key, about 100 bytes; a 16-byte bucket for each
/// key rounded up to a power of two), and the ring "new_keys".
pub fn counters_bytes(flows: u32) -> u64 {
    let n = u64::from(flows);
    n * (96 * possible_cpus() + 128) + 16 * n.next_power_of_two() + u64::from(new_keys_bytes(flows))
}

/// What user space knows of map "counts"' keys: every one after a walk of the map, and since
/// then those the programs announced in map "new_keys" as they created them. A walk visits
/// every bucket (16 bytes for each key the map can hold: 1 MiB at the default 65,536 flows,
/// 16 MiB at a million), however few keys it has; reading the known keys costs one lookup
/// each.
struct CountedKeys {
    ring: RingBuf<MapData>,
    /// With the TTL of the packet that created each, where the programs announced it.
    keys: std::collections::HashMap<Key, Option<u8>>,
    /// The programs' `new_key_lost` when the map was last walked; `None`: never walked.
    lost_at_walk: Option<u64>,
    walks: u64,
}

/// The loaded programs and their maps.
pub struct Programs {
    ebpf: Ebpf,
    hook: Hook,
    settings: Settings,
    clocks: Clocks,
    counted: CountedKeys,
    /// Attached interfaces by index, with what their hooks do: indexes are per namespace, so
    /// two interfaces in different namespaces may share one, and only the first can be
    /// attached.
    attached: std::collections::HashMap<u32, (Target, Port)>,
    /// Why drops cannot be attributed, when the `kfree_skb` program could not be attached.
    pub drops_unavailable: Option<String>,
}

fn load_err(e: impl std::fmt::Display) -> Error {
    // aya's Display stops at the first cause; the verifier's log is in the chain.
    Error::Load(e.to_string())
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |e| Error::Map { map, err: e.to_string() }
}

impl Programs {
    /// Loads the programs with room for `flows` (flow, point, colour) counters, and sets the
    /// marking period, guard and colour bit. Attaches the drop-reason program if it can.
    pub fn load(flows: u32, settings: Settings) -> Result<Programs, Error> {
        if !std::path::Path::new(btf::VMLINUX).exists() {
            return Err(Error::NoBtf);
        }
        let btf = Btf::from_sys_fs().map_err(|_| Error::NoBtf)?;
        let (bytes, cpus) = (counters_bytes(flows), possible_cpus());
        if bytes > MAX_MAP_BYTES {
            return Err(load_err(format!(
                "ebpf.flows = {flows} would take {} MiB of kernel memory on {cpus} CPUs (at most \
                 {} MiB): give fewer",
                bytes >> 20,
                MAX_MAP_BYTES >> 20
            )));
        }
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .map_max_entries("counts", flows.max(16))
            .map_max_entries("new_keys", new_keys_bytes(flows))
            .load(&OBJECT.0)
            .map_err(|e| load_err(format!("{e:#}")))?;
        load_tc_programs(&mut ebpf, &[INGRESS_PROGRAM, EGRESS_PROGRAM])?;
        let hook = Hook::for_this_kernel();
        let ring = ebpf.take_map("new_keys").expect("new_keys map");
        let ring = RingBuf::try_from(ring).map_err(map_err("new_keys"))?;
        let mut p = Programs {
            ebpf,
            hook,
            settings,
            clocks: Clocks::now(),
            counted: CountedKeys { ring, keys: Default::default(), lost_at_walk: None, walks: 0 },
            attached: Default::default(),
            drops_unavailable: None,
        };
        p.set_settings(settings)?;
        p.set_drop_places()?;
        p.drops_unavailable = p.attach_drops(&btf).err();
        Ok(p)
    }

    fn attach_drops(&mut self, btf: &Btf) -> Result<(), String> {
        let prog: &mut BtfTracePoint = self
            .ebpf
            .program_mut(DROP_PROGRAM)
            .ok_or("no program tm_drop")?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| e.to_string())?;
        prog.load("kfree_skb", btf).map_err(|e| verifier(&e))?;
        prog.attach().map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Tells the drop program which reasons are an egress queue's and which are no loss
    /// (from the kernel's BTF).
    fn set_drop_places(&mut self) -> Result<(), Error> {
        let mut a: Array<&mut MapData, u8> =
            Array::try_from(self.ebpf.map_mut("drop_places").expect("drop_places map"))
                .map_err(map_err("drop_places"))?;
        let places = [
            (btf::egress_queue_reasons(), maps::DropPlace::EgressQueue),
            (btf::not_loss_reasons(), maps::DropPlace::NotLoss),
        ];
        for (reasons, place) in places {
            for r in reasons.into_iter().filter(|r| *r < maps::REASONS) {
                a.set(r, place as u8, 0).map_err(map_err("drop_places"))?;
            }
        }
        Ok(())
    }

    /// How interfaces are hooked on this kernel.
    pub fn hook(&self) -> Hook {
        self.hook
    }

    /// Sets the marking period, guard, colour bit and sampling (a running marker changes at
    /// once).
    pub fn set_settings(&mut self, s: Settings) -> Result<(), Error> {
        self.write_settings(s, Clocks::now(), true)
    }

    /// Writes settings `s` and clock offsets `c` into every attached port's slot, and into
    /// map "settings" if `global` (what it holds changed). They become the programs' only
    /// once every write went through, so a write that failed is made again next time.
    fn write_settings(&mut self, s: Settings, c: Clocks, global: bool) -> Result<(), Error> {
        if global {
            let mut a: Array<&mut MapData, maps::Settings> =
                Array::try_from(self.ebpf.map_mut("settings").expect("settings map"))
                    .map_err(map_err("settings"))?;
            // What the programs write (restore, period_seen) is kept; a marker setting
            // restore between this read and the write sets it again with its next such flow.
            let old = a.get(&0, 0).unwrap_or_default();
            let value = maps::Settings {
                period_ns: s.period_ns,
                guard_ns: s.guard_ns,
                colour_bit: s.colour_bit,
                restore: old.restore,
                consumed_reason: btf::consumed_reason(),
                tai_offset_ns: u64::from(c.tai_offset_s) * 1_000_000_000,
                period_seen: old.period_seen,
                ..Default::default()
            };
            a.set(0, value, 0).map_err(map_err("settings"))?;
        }
        // After a step or a new TAI offset (the tick clock's offset is taken from the fine
        // clock less it), the programs take their tick clock's offset again at once.
        let retick = self.clocks.stepped(&c) || self.clocks.tai_offset_s != c.tai_offset_s;
        let ports: Vec<(u32, Port)> = self.attached.iter().map(|(i, (_, p))| (*i, *p)).collect();
        for (ifindex, port) in ports {
            self.put_slot(slot(ifindex, port, s, c), retick)?;
        }
        (self.settings, self.clocks) = (s, c);
        Ok(())
    }

    /// Whether some flow's own DSCP had the colour bit (map "settings"' restore): a marker
    /// remembered it (`OwnColour::Overwrite`), or an exit left it (`OwnColour::Keep`).
    fn restore(&self) -> u8 {
        Array::<&MapData, maps::Settings>::try_from(self.ebpf.map("settings").expect("settings"))
            .and_then(|a| a.get(&0, 0))
            .map_or(0, |s| s.restore)
    }

    /// Tells every port's slot once some marker remembered a flow's own colour bit: a marker
    /// reads its own slot's flag, set when it remembers one itself, and this tells it when
    /// another marker did (a flow that moves to it without the bit is then forgotten). Run
    /// at every sweep.
    pub fn share_restore(&mut self) -> Result<(), Error> {
        if self.restore() == 0 {
            return Ok(());
        }
        // put_slot gives each slot the flag and leaves alone those that have it.
        self.write_settings(self.settings, self.clocks, false)
    }

    /// Writes a slot of map "ports", with map "settings"' restore flag (set whenever a slot's
    /// is) and the programs' own last period seen and, unless `retick`, tick clock; a slot
    /// that would not change is left alone. The kernel copies a value in without ordering
    /// its words, so a hook may read a slot half written: a slot being taken is first written
    /// whole with no interface (which the hooks ignore), then with it, so that the second
    /// copy changes only the index.
    fn put_slot(&mut self, value: PortSlot, retick: bool) -> Result<(), Error> {
        let mut value = PortSlot { restore: self.restore(), ..value };
        let mut m: Array<&mut MapData, PortSlot> =
            Array::try_from(self.ebpf.map_mut("ports").expect("ports map"))
                .map_err(map_err("ports"))?;
        let at = value.ifindex % PORT_SLOTS;
        match m.get(&at, 0) {
            Ok(old) if old.ifindex == value.ifindex => {
                value.period_seen = old.period_seen;
                if !retick {
                    value.tick_offset_ns = old.tick_offset_ns;
                    value.tick_seen = old.tick_seen;
                }
                if old == value {
                    return Ok(());
                }
            }
            _ => m.set(at, PortSlot { ifindex: 0, ..value }, 0).map_err(map_err("ports"))?,
        }
        m.set(at, value, 0).map_err(map_err("ports"))
    }

    /// Updates the programs' clock offsets if the kernel's changed (a leap second, the clock
    /// set); true if so.
    pub fn refresh_clocks(&mut self) -> Result<bool, Error> {
        let now = Clocks::now();
        if now.tai_offset_s == self.clocks.tai_offset_s && !self.clocks.stepped(&now) {
            return Ok(false);
        }
        // Map "settings" holds the TAI offset only.
        let global = now.tai_offset_s != self.clocks.tai_offset_s;
        self.write_settings(self.settings, now, global)?;
        Ok(true)
    }

    /// Attaches both programs to `target` with `port`'s points and actions. Filters a crashed
    /// agent left there (clsact) are removed first.
    pub fn attach(&mut self, target: &Target, port: Port) -> Result<Attached, Error> {
        let hook = self.hook;
        let label = target.label();
        let ierr = |err: String| Error::Interface { target: label.clone(), err };
        let ebpf = &mut self.ebpf;
        let attached = &self.attached;
        let result = in_netns(target.netns.as_deref(), || -> Result<_, Error> {
            let ifindex = ifindex(&target.iface).map_err(|e| ierr(e.to_string()))?;
            let cookie = netns_cookie_here().map_err(|e| ierr(format!("SO_NETNS_COOKIE: {e}")))?;
            let slot_taken = attached.iter().map(|(i, (o, _))| (i, o)).find(|(i, o)| {
                (**i == ifindex && *o != target)
                    || (**i != ifindex && *i % PORT_SLOTS == ifindex % PORT_SLOTS)
            });
            if let Some((i, other)) = slot_taken {
                return Err(ierr(format!(
                    "has index {ifindex}, and {} has {i}: an agent tells its interfaces apart by \
                     index (modulo {PORT_SLOTS}), so it cannot watch both (run one agent per \
                     namespace instead)",
                    other.label()
                )));
            }
            let mut ids = Vec::new();
            for (name, kind) in
                [(INGRESS_PROGRAM, TcAttachType::Ingress), (EGRESS_PROGRAM, TcAttachType::Egress)]
            {
                ids.push(attach_tc(ebpf, name, &target.iface, kind, hook).map_err(ierr)?);
            }
            Ok((ifindex, cookie, ids))
        })
        .map_err(|err| Error::Netns { ns: target.netns.clone().unwrap_or_default(), err })?;
        let (ifindex, netns_cookie, mut ids) = result?;
        let egress = ids.pop().expect("two links");
        let ingress = ids.pop().expect("two links");
        self.attached.insert(ifindex, (target.clone(), port));
        let a = Attached { target: target.clone(), ifindex, netns_cookie, hook, ingress, egress };
        if let Err(e) = self.set_port(&a, port) {
            self.detach(a);
            return Err(e);
        }
        Ok(a)
    }

    /// Sets what `a`'s hooks do.
    pub fn set_port(&mut self, a: &Attached, port: Port) -> Result<(), Error> {
        if let Some((_, p)) = self.attached.get_mut(&a.ifindex) {
            *p = port;
        }
        self.put_slot(slot(a.ifindex, port, self.settings, self.clocks), false)?;
        let mut d: BpfHashMap<&mut MapData, DropPort, Port> =
            BpfHashMap::try_from(self.ebpf.map_mut("drop_ports").expect("drop_ports map"))
                .map_err(map_err("drop_ports"))?;
        d.insert(a.drop_port(), port, 0).map_err(map_err("drop_ports"))
    }

    /// Detaches the programs from `a` (an interface already gone is not an error).
    pub fn detach(&mut self, a: Attached) {
        if let Ok(mut m) = Array::<&mut MapData, PortSlot>::try_from(
            self.ebpf.map_mut("ports").expect("ports map"),
        ) {
            // The index first, so that a hook reading the slot meanwhile sees it whole or
            // not at all (as in put_slot).
            let at = a.ifindex % PORT_SLOTS;
            if let Ok(old) = m.get(&at, 0) {
                let _ = m.set(at, PortSlot { ifindex: 0, ..old }, 0);
            }
            let _ = m.set(at, PortSlot::default(), 0);
        }
        self.attached.remove(&a.ifindex);
        if let Ok(mut d) = BpfHashMap::<&mut MapData, DropPort, Port>::try_from(
            self.ebpf.map_mut("drop_ports").expect("drop_ports map"),
        ) {
            let _ = d.remove(&a.drop_port());
        }
        let ebpf = &mut self.ebpf;
        let _ = in_netns(a.target.netns.as_deref(), || {
            for (name, id) in [(INGRESS_PROGRAM, a.ingress), (EGRESS_PROGRAM, a.egress)] {
                if let Some(Ok(prog)) = ebpf.program_mut(name).map(<&mut SchedClassifier>::try_from)
                {
                    let _ = prog.detach(id);
                }
            }
        });
    }

    /// Calls `f` with every counter entry and its per-CPU slots: those of the keys known
    /// (see [`CountedKeys`]), or, the first time and after the programs could not announce a
    /// new key, of a walk of the whole map.
    pub fn for_each_count(&mut self, mut f: impl FnMut(&Key, &[Slots])) -> Result<(), Error> {
        // Read first: a key the programs fail to announce from now on moves it again, and the
        // next call walks.
        let lost = self.stat(Stat::NewKeyLost)?;
        let counted = &mut self.counted;
        while let Some(item) = counted.ring.next() {
            if let Some((k, ttl)) = Key::announced(&item) {
                counted.keys.insert(k, Some(ttl).filter(|t| *t > 0));
            }
        }
        let m: PerCpuHashMap<&MapData, Key, Slots> =
            PerCpuHashMap::try_from(self.ebpf.map("counts").expect("counts map"))
                .map_err(map_err("counts"))?;
        if counted.lost_at_walk != Some(lost) {
            // Keys created during the walk that it missed are in the ring for the next call.
            let mut walked = std::collections::HashMap::new();
            let mut whole = true;
            for kv in m.iter() {
                match kv {
                    Ok((k, v)) => {
                        walked.insert(k, counted.keys.get(&k).copied().flatten());
                        f(&k, &v);
                    }
                    // A failed lookup (the iterator skips entries deleted meanwhile), or a
                    // failed step, which ends the walk: the next call walks again.
                    Err(_) => whole = false,
                }
            }
            counted.walks += 1;
            if whole {
                counted.keys = walked;
                counted.lost_at_walk = Some(lost);
            } else {
                counted.keys.extend(walked);
            }
            return Ok(());
        }
        counted.keys.retain(|k, _| match m.get(k, 0) {
            Ok(v) => {
                f(k, &v);
                true
            }
            Err(MapError::KeyNotFound) => false,
            Err(_) => true,
        });
        Ok(())
    }

    /// The TTL (IPv4) or hop limit (IPv6) of the packet that created counter key `k`, where
    /// the programs announced it (a key found by a walk has none).
    pub fn ttl(&self, k: &Key) -> Option<u8> {
        self.counted.keys.get(k).copied().flatten()
    }

    /// How many times [`Programs::for_each_count`] has walked the whole map.
    pub fn count_walks(&self) -> u64 {
        self.counted.walks
    }

    /// Deletes the counter entries of `keys` that `quiet` says have seen nothing since they
    /// were last read (idle flows); returns those deleted.
    pub fn remove_quiet_counts(
        &mut self,
        keys: &[Key],
        quiet: impl Fn(&Key, &[Slots]) -> bool,
    ) -> Result<Vec<Key>, Error> {
        let mut m: PerCpuHashMap<&mut MapData, Key, Slots> =
            PerCpuHashMap::try_from(self.ebpf.map_mut("counts").expect("counts map"))
                .map_err(map_err("counts"))?;
        let mut gone = Vec::new();
        for k in keys {
            match m.get(k, 0) {
                Ok(cpus) if quiet(k, &cpus) => {
                    if m.remove(k).is_ok() {
                        gone.push(*k);
                    }
                }
                Ok(_) => {}
                Err(MapError::KeyNotFound) => gone.push(*k),
                // Kept (and read again) rather than forgotten while it may still be there.
                Err(_) => {}
            }
        }
        for k in &gone {
            self.counted.keys.remove(k);
        }
        Ok(gone)
    }

    /// Tells the programs every period up to `period` has been read (for the overrun count).
    pub fn set_read_upto(&mut self, period: u64) -> Result<(), Error> {
        let mut a: Array<&mut MapData, u64> =
            Array::try_from(self.ebpf.map_mut("reader").expect("reader map"))
                .map_err(map_err("reader"))?;
        a.set(0, period, 0).map_err(map_err("reader"))
    }

    /// Entries `indexes` of per-CPU array `map`, each summed over the CPUs.
    fn per_cpu_sums(
        &self,
        map: &'static str,
        indexes: std::ops::Range<u32>,
    ) -> Result<Vec<u64>, Error> {
        let a: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.ebpf.map(map).expect("map")).map_err(map_err(map))?;
        indexes.map(|i| Ok(a.get(&i, 0).map_err(map_err(map))?.iter().sum())).collect()
    }

    /// One of the programs' counters.
    pub fn stat(&self, s: Stat) -> Result<u64, Error> {
        let i = s as u32;
        Ok(self.per_cpu_sums("stats", i..i + 1)?[0])
    }

    /// The programs' counters, by [`Stat`].
    pub fn stats(&self) -> Result<Vec<(Stat, u64)>, Error> {
        let v = self.per_cpu_sums("stats", 0..Stat::ALL.len() as u32)?;
        Ok(Stat::ALL.iter().copied().zip(v).collect())
    }

    /// Flows each of the first `points` points refused for lack of room, by point.
    pub fn refused(&self, points: u32) -> Result<Vec<u64>, Error> {
        self.per_cpu_sums("refused", 0..points.min(256))
    }

    /// Each ingress point's sFlow sampler summed over CPUs, by point: (pool, lost).
    pub fn samplers(&self, points: u32) -> Result<Vec<(u64, u32)>, Error> {
        let a: PerCpuArray<&MapData, maps::Sampler> =
            PerCpuArray::try_from(self.ebpf.map("samplers").expect("samplers map"))
                .map_err(map_err("samplers"))?;
        (0..points.min(256))
            .map(|i| {
                let cpus = a.get(&i, 0).map_err(map_err("samplers"))?;
                let pool = cpus.iter().map(|s| s.pool).sum();
                Ok((pool, cpus.iter().fold(0u32, |n, s| n.wrapping_add(s.lost))))
            })
            .collect()
    }

    /// Opens the perf buffers sampled packets arrive in, one per CPU of `pages` pages (a
    /// power of two); once only.
    pub fn open_samples(&mut self, pages: usize) -> Result<Samples, Error> {
        let map = self
            .ebpf
            .take_map("samples")
            .ok_or(Error::Map { map: "samples", err: "opened already".into() })?;
        let mut array: PerfEventArray<MapData> =
            PerfEventArray::try_from(map).map_err(map_err("samples"))?;
        let cpus = aya::util::online_cpus()
            .map_err(|(what, e)| Error::Map { map: "samples", err: format!("{what}: {e}") })?;
        let buffers = cpus
            .into_iter()
            .map(|cpu| {
                array
                    .open(cpu, Some(pages))
                    .map_err(|e| Error::Map { map: "samples", err: e.to_string() })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Samples { buffers, scratch: Vec::new() })
    }

    /// Drops the kernel reported, by reason number (non-zero ones).
    pub fn reasons(&self) -> Result<Vec<(u32, u64)>, Error> {
        let v = self.per_cpu_sums("reasons", 0..maps::REASONS)?;
        Ok(v.into_iter().enumerate().filter(|(_, n)| *n > 0).map(|(r, n)| (r as u32, n)).collect())
    }

    /// `OwnColour::Keep`: the packets each flow's sender sent with the colour bit set so far,
    /// by the flow at its marker's point (the key's colour 0).
    pub fn own_colour(&self) -> Result<Vec<(Key, u64)>, Error> {
        let m: PerCpuHashMap<&MapData, Key, u64> =
            PerCpuHashMap::try_from(self.ebpf.map("own").expect("own map"))
                .map_err(map_err("own"))?;
        Ok(m.iter().filter_map(Result::ok).map(|(k, v)| (k, v.iter().sum())).collect())
    }

    /// `OwnColour::Keep`: the flows an exit left with the colour bit, by the flow at its point
    /// (the key's colour 0): their first packet there had it, and none since came without it.
    pub fn unsure(&self) -> Result<Vec<Key>, Error> {
        let m: aya::maps::HashMap<&MapData, Key, u8> =
            aya::maps::HashMap::try_from(self.ebpf.map("unsure").expect("unsure map"))
                .map_err(map_err("unsure"))?;
        Ok(m.keys().filter_map(Result::ok).collect())
    }

    /// Drops per flow and reason.
    pub fn drops(&self) -> Result<Vec<(DropKey, u64)>, Error> {
        let m: PerCpuHashMap<&MapData, DropKey, u64> =
            PerCpuHashMap::try_from(self.ebpf.map("drops").expect("drops map"))
                .map_err(map_err("drops"))?;
        Ok(m.iter().filter_map(Result::ok).map(|(k, v)| (k, v.iter().sum())).collect())
    }

    /// What each program has cost so far (ingress, egress, and the drop program if attached).
    pub fn cost(&self) -> Vec<RunCost> {
        [INGRESS_PROGRAM, EGRESS_PROGRAM, DROP_PROGRAM]
            .into_iter()
            .filter_map(|p| run_cost(&self.ebpf, p))
            .collect()
    }

    /// Forgets drop entries (flows no longer measured).
    pub fn remove_drops(&mut self, keys: &[DropKey]) -> Result<(), Error> {
        let mut m: PerCpuHashMap<&mut MapData, DropKey, u64> =
            PerCpuHashMap::try_from(self.ebpf.map_mut("drops").expect("drops map"))
                .map_err(map_err("drops"))?;
        for k in keys {
            let _ = m.remove(k);
        }
        Ok(())
    }
}

/// Loads (verifies) the tc programs `names` of `ebpf`.
fn load_tc_programs(ebpf: &mut Ebpf, names: &[&str]) -> Result<(), Error> {
    for name in names {
        let prog: &mut SchedClassifier = ebpf
            .program_mut(name)
            .ok_or_else(|| load_err(format!("no program {name} in the object")))?
            .try_into()
            .map_err(load_err)?;
        prog.load().map_err(|e| load_err(verifier(&e)))?;
    }
    Ok(())
}

/// Attaches tc program `name` of `ebpf` (loaded) to this namespace's `iface` at `kind`, by
/// `hook`. A clsact filter of that name a crashed run left there is removed first.
fn attach_tc(
    ebpf: &mut Ebpf,
    name: &str,
    iface: &str,
    kind: TcAttachType,
    hook: Hook,
) -> Result<aya::programs::tc::SchedClassifierLinkId, String> {
    let prog: &mut SchedClassifier = ebpf
        .program_mut(name)
        .ok_or_else(|| format!("no program {name}"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    let options = match hook {
        Hook::Tcx => TcAttachOptions::TcxOrder(LinkOrder::default()),
        Hook::Clsact => {
            let _ = tc::qdisc_detach_program(iface, kind, name);
            let _ = tc::qdisc_add_clsact(iface);
            TcAttachOptions::Netlink(Default::default())
        }
    };
    prog.attach_with_options(iface, kind, options).map_err(|e| format!("attaching {name}: {e:#}"))
}

/// What one program has cost since it was loaded, by the kernel's own statistics
/// (`run_time_ns`, `run_cnt`), which count only while they are enabled: by
/// `sysctl kernel.bpf_stats_enabled=1` or while an [`enable_run_stats`] handle is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunCost {
    pub program: &'static str,
    pub runs: u64,
    pub run_ns: u64,
}

impl RunCost {
    /// Nanoseconds per run since `before` (NaN without runs).
    pub fn ns_per_run_since(&self, before: &RunCost) -> f64 {
        let runs = self.runs.saturating_sub(before.runs);
        self.run_ns.saturating_sub(before.run_ns) as f64 / runs as f64
    }
}

fn run_cost(ebpf: &Ebpf, program: &'static str) -> Option<RunCost> {
    let info = ebpf.program(program)?.info().ok()?;
    Some(RunCost {
        program,
        runs: info.run_count(),
        run_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
    })
}

/// The cost so far of every program loaded in the kernel under the name `program` (whoever
/// loaded it), summed: how a benchmark reads an agent's programs from outside.
pub fn loaded_cost(program: &'static str) -> RunCost {
    let mut c = RunCost { program, ..Default::default() };
    for info in aya::programs::loaded_programs().flatten() {
        if info.name_as_str() == Some(program) {
            c.runs += info.run_count();
            c.run_ns += u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
        }
    }
    c
}

/// Turns the kernel's per-program run statistics on for as long as the handle lives (the
/// BPF_ENABLE_STATS command; the sysctl stays as it was). They cost about 20 ns a run.
pub fn enable_run_stats() -> Result<OwnedFd, Error> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| load_err(format!("enabling run statistics: {e}")))
}

/// The yardstick of the datapath's cost (`bpf/reference.bpf.c`): programs that only count
/// packets and bytes per flow key, with the datapath's parser, key and map type, one per
/// direction as [`Programs`] has. The benchmark attaches them alone at the same hooks.
pub struct Reference {
    ebpf: Ebpf,
    hook: Hook,
    links: Vec<(Target, &'static str, aya::programs::tc::SchedClassifierLinkId)>,
}

static REFERENCE_OBJECT: &Aligned<[u8]> = &Aligned(*include_bytes!("../../bpf/reference.bpf.o"));

/// The reference programs' names (ingress, egress).
pub const REFERENCE_PROGRAMS: [&str; 2] = ["tm_ref_ingress", "tm_ref_egress"];

impl Reference {
    /// Loads the reference programs (not attached).
    pub fn load(hook: Hook) -> Result<Reference, Error> {
        let mut ebpf =
            EbpfLoader::new().load(&REFERENCE_OBJECT.0).map_err(|e| load_err(format!("{e:#}")))?;
        load_tc_programs(&mut ebpf, &REFERENCE_PROGRAMS)?;
        Ok(Reference { ebpf, hook, links: Vec::new() })
    }

    /// Attaches them at `target`'s ingress and egress.
    pub fn attach(&mut self, target: &Target) -> Result<(), Error> {
        let (ebpf, hook) = (&mut self.ebpf, self.hook);
        let ierr = |err: String| Error::Interface { target: target.label(), err };
        for (name, kind) in
            REFERENCE_PROGRAMS.into_iter().zip([TcAttachType::Ingress, TcAttachType::Egress])
        {
            let id = in_netns(target.netns.as_deref(), || {
                attach_tc(ebpf, name, &target.iface, kind, hook)
            })
            .map_err(|err| Error::Netns { ns: target.netns.clone().unwrap_or_default(), err })?
            .map_err(ierr)?;
            self.links.push((target.clone(), name, id));
        }
        Ok(())
    }

    /// Their cost so far (ingress, egress; every interface together).
    pub fn cost(&self) -> [RunCost; 2] {
        REFERENCE_PROGRAMS.map(|p| {
            run_cost(&self.ebpf, p).unwrap_or(RunCost { program: p, ..Default::default() })
        })
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        let ebpf = &mut self.ebpf;
        for (target, name, id) in self.links.drain(..) {
            let _ = in_netns(target.netns.as_deref(), || {
                if let Some(Ok(prog)) = ebpf.program_mut(name).map(<&mut SchedClassifier>::try_from)
                {
                    let _ = prog.detach(id);
                }
            });
        }
    }
}

/// The verifier's complaint, if the error carries one (its last lines say what failed).
fn verifier(e: &aya::programs::ProgramError) -> String {
    match e {
        aya::programs::ProgramError::LoadError { io_error, verifier_log } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log.lines().rev().take(6).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("{io_error}; verifier: {}", tail.join(" | "))
        }
        other => format!("{other:#}"),
    }
}

/// Runs `f` on a thread inside network namespace `ns` (`None`: this one), so that interface
/// names, indexes, netlink and tcx links resolve there.
pub fn in_netns<R: Send>(ns: Option<&str>, f: impl FnOnce() -> R + Send) -> io::Result<R> {
    let Some(ns) = ns else { return Ok(f()) };
    let path = if ns.contains('/') { ns.to_string() } else { format!("/run/netns/{ns}") };
    let file: OwnedFd = std::fs::File::open(&path)?.into();
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on this thread only (it ends with the scope); the fd is open.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("namespace thread panicked"))?
    })
}

fn ifindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::other("interface name has a NUL"))?;
    // SAFETY: a valid C string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::new(io::ErrorKind::NotFound, "no such interface")),
        i => Ok(i),
    }
}

/// The cookie of this thread's network namespace (`SO_NETNS_COOKIE`, Linux 5.14).
fn netns_cookie_here() -> io::Result<u64> {
    // SAFETY: plain socket(2); the fd is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket nobody else owns.
    let sock = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let mut cookie = 0u64;
    // SAFETY: every bit pattern is a valid u64.
    unsafe {
        telemark_socket::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            &mut cookie,
        )
    }?;
    Ok(cookie)
}

/// The interfaces of network namespace `ns` (`None`: this one), by name with their indexes.
pub fn interfaces(ns: Option<&str>) -> io::Result<Vec<(String, u32)>> {
    in_netns(ns, || {
        // SAFETY: if_nameindex returns an array ended by a zero entry, freed below.
        let list = unsafe { libc::if_nameindex() };
        if list.is_null() {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut p = list;
        // SAFETY: walking the array up to its terminator.
        unsafe {
            while (*p).if_index != 0 && !(*p).if_name.is_null() {
                let name = std::ffi::CStr::from_ptr((*p).if_name).to_string_lossy().into_owned();
                out.push((name, (*p).if_index));
                p = p.add(1);
            }
            libc::if_freenameindex(list);
        }
        Ok(out)
    })?
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Now on the programs' clock: Unix time (CLOCK_REALTIME), which they derive from CLOCK_TAI.
pub fn now() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC (the base of jiffies, the tick clock's): the same
/// until the clock is set.
fn mono_offset_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME).saturating_sub(clock_ns(libc::CLOCK_MONOTONIC))
}

/// The clock counting points read with periods of `period_ns` and a guard of `guard_ns`: the
/// tick clock where a tick is at most an eighth of both the guard and the early window
/// (`period - guard`, where a packet the marker coloured for the next period may come), so a
/// tick's error moves a packet's time by at most 1/8 of either.
pub fn clock_for(period_ns: u64, guard_ns: u64) -> Clock {
    let window = guard_ns.min(period_ns.saturating_sub(guard_ns));
    if tick_ns().saturating_mul(8) <= window {
        Clock::Tick
    } else {
        Clock::Fine
    }
}

/// How long after a period's guard to wait before reading it: 1 ms, and a tick more where
/// counting points read the tick clock (a packet's time may lag by up to a tick).
pub fn settle_ns(period_ns: u64, guard_ns: u64) -> u64 {
    match clock_for(period_ns, guard_ns) {
        Clock::Tick => periods::SETTLE_NS + tick_ns(),
        Clock::Fine => periods::SETTLE_NS,
    }
}

/// The kernel's tick (a jiffy): how far the coarse clocks, and the tick clock, move at a time.
pub fn tick_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer.
    if unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        return u64::MAX / 16;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The kernel's TAI offset in seconds (CLOCK_TAI minus CLOCK_REALTIME: 37 since 2017 where
/// chrony, ntpd or ptp4l set it, else 0), from adjtimex(2); one beyond 16 bits, which no clock
/// has had, is taken as 0.
fn tai_offset_s() -> u16 {
    // SAFETY: an all-zero timex with modes 0 only reads the kernel's clock state.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: tx is a valid out-pointer.
    unsafe { libc::adjtimex(&mut tx) };
    u16::try_from(tx.tai).unwrap_or(0)
}
