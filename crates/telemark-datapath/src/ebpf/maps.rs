//! The layouts the programs share with user space, mirrored from `bpf/telemark.bpf.c` (the
//! C is the reference: a change there is a change here, checked by the sizes below).

use std::net::{IpAddr, Ipv6Addr};
use telemark_wire::FlowKey;

/// A point id meaning "no point here" (`TM_NO_POINT`).
pub const NO_POINT: u8 = 0xff;

/// `enum tm_ingress_action`: what a port does to the traffic arriving on it.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressAction {
    /// Count it at the port's ingress point.
    Count = 0,
    /// The measured domain starts here: colour it and count it (the marker).
    Mark = 1,
}

/// `enum tm_egress_action`: what a port does to the traffic leaving by it.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressAction {
    /// Count it at the port's egress point.
    Count = 0,
    /// The domain ends here: count it, then give the flow its own DSCP bit back.
    Unmark = 1,
}

/// `struct tm_port`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Port {
    pub in_point: u8,
    pub out_point: u8,
    /// [`IngressAction`].
    pub in_action: u8,
    /// [`EgressAction`].
    pub out_action: u8,
}

/// `TM_PORT_SLOTS`: map "ports" holds an interface's [`Port`] in slot `ifindex % PORT_SLOTS`.
pub const PORT_SLOTS: u32 = 65536;

/// `struct tm_port_slot`: a slot of map "ports": an interface's port and a copy of every
/// setting its hooks read for each packet, so that a run touches one cache line of it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortSlot {
    /// sFlow: the most bytes of a sampled packet sent.
    pub sample_bytes: u32,
    pub pad: u32,
    /// The interface the slot belongs to (0: free).
    pub ifindex: u32,
    pub port: Port,
    pub period_ns: u64,
    pub guard_ns: u64,
    /// The tick clock's offset to Unix time: the programs' own (0: to be taken again).
    pub tick_offset_ns: u64,
    /// The period a packet here was last seen in: the programs' own.
    pub period_seen: u64,
    /// sFlow: one packet in this many sampled at the port's ingress point (0: none).
    pub sample_rate: u32,
    /// The kernel's tick (a jiffy), in ns.
    pub tick_ns: u32,
    /// The tick (its low 16 bits) the tick clock's offset was taken in: the programs' own.
    pub tick_seen: u16,
    /// CLOCK_TAI minus CLOCK_REALTIME, in seconds (the kernel's TAI offset).
    pub tai_offset_s: u16,
    pub colour_bit: u8,
    /// [`Clock`]: the counting points'.
    pub clock: u8,
    /// `enum tm_restore`: the marker's own, set by it and kept as map "settings"' by user
    /// space.
    pub restore: u8,
    /// [`OwnColour`].
    pub own_colour: u8,
}

/// `enum tm_own_colour`: what the domain does with a packet whose sender set the colour bit
/// (`[ebpf] own_colour`).
#[repr(u8)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OwnColour {
    /// Left as it is and not measured; an exit clears the bit only of flows it saw without it.
    #[default]
    Keep = 0,
    /// The domain reserves the bit: every packet is coloured, and the flow's own bit given back
    /// only by an exit on the marker's host.
    Overwrite = 1,
}

/// `struct tm_drop_port`: an attached interface as the drop program tells them apart.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DropPort {
    /// The network namespace's cookie (`SO_NETNS_COOKIE`).
    pub netns: u64,
    pub ifindex: u32,
    pub pad: u32,
}

/// `struct tm_settings`: what the drop program reads, and the hooks at the domain's edges (a
/// copy of what the hooks read for every packet is in each [`PortSlot`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Settings {
    pub period_ns: u64,
    pub guard_ns: u64,
    pub colour_bit: u8,
    /// `enum tm_restore`, set by the kernel.
    pub restore: u8,
    pub pad: [u8; 2],
    /// This kernel's `SKB_CONSUMED` (not a drop), or `u32::MAX`.
    pub consumed_reason: u32,
    /// CLOCK_TAI minus CLOCK_REALTIME, in ns.
    pub tai_offset_ns: u64,
    /// The period a packet was last seen in: the drop program's own, kept across writes.
    pub period_seen: u64,
}

/// `enum tm_clock`: the clock a counting point reads.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The TSC-based clock: exact.
    Fine = 0,
    /// Unix time to within a tick, from the kernel's jiffies: for guards of many ticks.
    Tick = 1,
}

/// `struct tm_key`: a flow at a point in one colour.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Key {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub point: u8,
    pub colour: u8,
    pub pad: u8,
}

impl Key {
    /// The flow (IPv4-mapped addresses back to IPv4).
    pub fn flow(&self) -> FlowKey {
        let ip = |b: [u8; 16]| -> IpAddr {
            let a = Ipv6Addr::from(b);
            match a.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(a),
            }
        };
        FlowKey {
            src: ip(self.src),
            dst: ip(self.dst),
            sport: self.sport,
            dport: self.dport,
            proto: self.proto,
            spi: None,
            si: None,
        }
    }

    /// A key as the programs announced it in map "new_keys" (`struct tm_new_key`), with the
    /// TTL (hop limit) of the packet that created it (`None`: not 48 bytes).
    pub fn announced(b: &[u8]) -> Option<(Key, u8)> {
        let b: &[u8; 48] = b.try_into().ok()?;
        Some((Key::from_bytes(&b[..40])?, b[40]))
    }

    /// A key as the programs lay it out (`None`: not 40 bytes).
    pub fn from_bytes(b: &[u8]) -> Option<Key> {
        let b: &[u8; 40] = b.try_into().ok()?;
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(Key {
            src: b[0..16].try_into().ok()?,
            dst: b[16..32].try_into().ok()?,
            sport: u16_at(32),
            dport: u16_at(34),
            proto: b[36],
            point: b[37],
            colour: b[38],
            pad: b[39],
        })
    }
}

/// `struct tm_batch`: one period's counts at one point, on one CPU.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Batch {
    pub period: u64,
    pub packets: u64,
    pub bytes: u64,
    pub last_ns: u64,
    pub first_ns: u64,
    pub late: u64,
}

/// `struct tm_slots`: the period being counted and the one of the same colour before it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slots {
    pub cur: Batch,
    pub prev: Batch,
}

/// `struct tm_drop_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DropKey {
    pub flow: Key,
    pub reason: u32,
}

/// `enum tm_stat`: the programs' counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    NotIp = 0,
    Marked,
    Unmarked,
    Refused,
    Late,
    LateLost,
    OriginalFull,
    Drops,
    DropsUnparsed,
    DropsFull,
    Unattached,
    Overrun,
    /// Dropped by an egress queue after the egress point counted it: taken back.
    QueueUncounted,
    /// Such a drop whose count could not be taken back (read already, or counted late).
    QueueMissed,
    /// Packets sampled for sFlow.
    Sampled,
    /// Of those, not sent (no room in the perf buffer).
    SampleLost,
    /// Keys new in "counts" the programs could not announce (no room in "new_keys"): user
    /// space then walks the map.
    NewKeyLost,
    /// Packets a marker left as their sender coloured them (`OwnColour::Keep`): not measured.
    OwnColour,
    /// New flows whose first packet a marker held back from colour 1.
    Held,
    /// Flows an exit first saw with the colour bit set: left with it.
    Unsure,
}

impl Stat {
    /// Its name in `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Stat::NotIp => "not_ip",
            Stat::Marked => "marked",
            Stat::Unmarked => "unmarked",
            Stat::Refused => "refused",
            Stat::Late => "late",
            Stat::LateLost => "late_lost",
            Stat::OriginalFull => "original_full",
            Stat::Drops => "drops",
            Stat::DropsUnparsed => "drops_unparsed",
            Stat::DropsFull => "drops_full",
            Stat::Unattached => "unattached",
            Stat::Overrun => "overrun",
            Stat::QueueUncounted => "queue_uncounted",
            Stat::QueueMissed => "queue_missed",
            Stat::Sampled => "sampled",
            Stat::SampleLost => "sample_lost",
            Stat::NewKeyLost => "new_key_lost",
            Stat::OwnColour => "own_colour",
            Stat::Held => "held",
            Stat::Unsure => "unsure",
        }
    }

    /// Every counter, in map order.
    pub const ALL: [Stat; 20] = [
        Stat::NotIp,
        Stat::Marked,
        Stat::Unmarked,
        Stat::Refused,
        Stat::Late,
        Stat::LateLost,
        Stat::OriginalFull,
        Stat::Drops,
        Stat::DropsUnparsed,
        Stat::DropsFull,
        Stat::Unattached,
        Stat::Overrun,
        Stat::QueueUncounted,
        Stat::QueueMissed,
        Stat::Sampled,
        Stat::SampleLost,
        Stat::NewKeyLost,
        Stat::OwnColour,
        Stat::Held,
        Stat::Unsure,
    ];
}

/// `enum tm_drop_place`: where the kernel drops for a reason, as the points see it.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropPlace {
    /// Before the egress hook: never counted out.
    BeforeEgress = 0,
    /// In the egress queue (a qdisc), after the egress hook counted the packet.
    EgressQueue = 1,
    /// A copy the host was not meant to keep (no flow's loss): counted per reason only.
    NotLoss = 2,
}

/// `struct tm_sampler`: sFlow's sampler at one ingress point, on one CPU.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sampler {
    /// Packets it could have sampled.
    pub pool: u64,
    /// Packets before the next sample.
    pub skip: u32,
    /// Samples not sent (no room in the perf buffer): sFlow's drops.
    pub lost: u32,
}

/// `struct tm_sample`: what precedes a sampled packet's bytes in perf buffer "samples".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleMeta {
    /// The interface it arrived on (index in its namespace).
    pub ifindex: u32,
    /// A wire frame's length (a GSO or GRO skb's over its packets).
    pub frame_len: u32,
    /// Bytes of the packet that follow.
    pub header_len: u32,
    /// The ingress point (the port's slot × 2).
    pub in_point: u8,
}

impl SampleMeta {
    /// `struct tm_sample`'s size.
    pub const SIZE: usize = 16;

    /// The meta at the start of a perf sample, and the packet's bytes after it; `None` if
    /// the sample is shorter than it says.
    pub fn parse(raw: &[u8]) -> Option<(SampleMeta, &[u8])> {
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(raw.get(at..at + 4)?.try_into().ok()?))
        };
        let meta = SampleMeta {
            ifindex: u32_at(0)?,
            frame_len: u32_at(4)?,
            header_len: u32_at(8)?,
            in_point: *raw.get(12)?,
        };
        let end = Self::SIZE.checked_add(usize::try_from(meta.header_len).ok()?)?;
        Some((meta, raw.get(Self::SIZE..end)?))
    }
}

/// Drop reasons counted per reason (`TM_REASONS`).
pub const REASONS: u32 = 512;

// SAFETY (all): plain C layouts of integers, no padding the kernel could leave undefined
// beyond the explicit `pad` fields; every bit pattern is valid.
unsafe impl aya::Pod for Port {}
// SAFETY: as above.
unsafe impl aya::Pod for PortSlot {}
unsafe impl aya::Pod for DropPort {}
unsafe impl aya::Pod for Settings {}
unsafe impl aya::Pod for Key {}
unsafe impl aya::Pod for Slots {}
unsafe impl aya::Pod for DropKey {}
unsafe impl aya::Pod for Sampler {}

const _: () = {
    assert!(core::mem::size_of::<Port>() == 4);
    assert!(core::mem::size_of::<DropPort>() == 16);
    assert!(core::mem::size_of::<Settings>() == 40);
    assert!(core::mem::size_of::<PortSlot>() == 64);
    assert!(core::mem::size_of::<Sampler>() == 16);
    assert!(core::mem::size_of::<Key>() == 40);
    assert!(core::mem::size_of::<Batch>() == 48);
    assert!(core::mem::size_of::<Slots>() == 96);
    assert!(core::mem::size_of::<DropKey>() == 44);
};

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample's meta is read field by field, and a sample shorter than its header length
    /// says is refused.
    #[test]
    fn a_sample_reads_its_meta_and_no_more_than_it_holds() {
        let mut raw = Vec::new();
        for v in [7u32, 1514, 3] {
            raw.extend_from_slice(&v.to_ne_bytes());
        }
        raw.extend_from_slice(&[4, 0, 0, 0, 0xaa, 0xbb, 0xcc, 0, 0]); // 2 bytes of padding
        let (m, bytes) = SampleMeta::parse(&raw).unwrap();
        assert_eq!((m.ifindex, m.frame_len, m.header_len, m.in_point), (7, 1514, 3, 4));
        assert_eq!(bytes, &[0xaa, 0xbb, 0xcc]);
        raw[8] = 200;
        assert!(SampleMeta::parse(&raw).is_none());
        assert!(SampleMeta::parse(&raw[..10]).is_none());
    }

    #[test]
    fn ipv4_mapped_keys_read_back_as_ipv4() {
        let mut k = Key { sport: 5, dport: 6, proto: 17, ..Key::default() };
        k.src[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 1]);
        k.dst = "2001:db8::1".parse::<Ipv6Addr>().unwrap().octets();
        let f = k.flow();
        assert_eq!(f.src.to_string(), "10.0.0.1");
        assert_eq!(f.dst.to_string(), "2001:db8::1");
        assert_eq!((f.sport, f.dport, f.proto), (5, 6, 17));
    }
}
