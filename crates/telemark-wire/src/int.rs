//! In-band Network Telemetry over TCP/UDP: the shim, the INT-MD and INT-MX headers and the
//! per-hop metadata stack.
//!
//! References: P4.org *In-band Network Telemetry (INT) Dataplane Specification* v2.1 (2020):
//! §5.1 "INT Header Types", §5.7.2 "INT over TCP/UDP" (shim), §5.8 "INT-MD Metadata Header
//! Format" (header, instruction bits, stack), §5.9 "INT-MX Header Format"; and v1.0 (2018)
//! §4.6.1 and §4.7 for the older shim and header that deployed switches still send.
//!
//! Layout on the wire, after the TCP or UDP header of the packet:
//!
//! ```text
//! shim (4)  | INT-MD header (12; v1.0: 8) | hop n … hop 1 (Hop ML words each) | original L4 payload
//! shim (4)  | INT-MX header (12)                                             | original L4 payload
//! ```
//!
//! The v2.1 shim starts with its 4-bit type (1, 2, 3), the v1.0 shim with an 8-bit type (1), so
//! the first byte tells the versions apart. The newest hop's metadata comes first in the stack.

use crate::dialect::{tolerate, Deviation, Deviations, Mode};
use crate::{Error, Result};

/// Length of the shim header.
pub const SHIM_LEN: usize = 4;
/// Length of the INT-MD (and INT-MX) header in v2.1.
pub const MD_HEADER_LEN: usize = 12;
/// Length of the INT metadata header in v1.0.
pub const MD_HEADER_LEN_V1: usize = 8;
/// Most metadata items one hop can carry (every instruction bit set).
pub const MAX_ITEMS: usize = 24;

/// Which INT specification a header follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// INT v1.0 (2018): 8-bit shim type, 8-byte metadata header, 4-byte timestamps.
    V1_0,
    /// INT v2.1 (2020): 4-bit shim type with NPT, 12-byte INT-MD/MX header, 8-byte timestamps.
    V2_1,
}

/// What follows the shim (INT v2.1 §5.1, the shim's Type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeaderType {
    /// 1: INT-MD, metadata stacked hop by hop in the packet.
    Md,
    /// 2: INT-Destination, source-to-sink options only.
    Destination,
    /// 3: INT-MX, each hop reports directly and the packet carries only the instructions.
    Mx,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for HeaderType {
    fn from(v: u8) -> Self {
        match v {
            1 => HeaderType::Md,
            2 => HeaderType::Destination,
            3 => HeaderType::Mx,
            o => HeaderType::Unknown(o),
        }
    }
}

impl From<HeaderType> for u8 {
    fn from(v: HeaderType) -> u8 {
        match v {
            HeaderType::Md => 1,
            HeaderType::Destination => 2,
            HeaderType::Mx => 3,
            HeaderType::Unknown(o) => o,
        }
    }
}

/// How the source marked the packet and where it keeps what it changed (the shim's NPT field
/// and bytes 2–3; INT v2.1 §5.7.2). v1.0 shims only have the DSCP form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NextProtocol {
    /// NPT 0: the original L4 payload follows; a DSCP value signalled INT and the original
    /// DSCP is kept here (6 bits).
    Dscp(u8),
    /// NPT 1: a UDP destination port signalled INT; the original destination port is kept here.
    UdpPort(u16),
    /// NPT 2: the IP protocol field signalled INT; the original IP protocol is kept here.
    IpProtocol(u8),
    /// NPT 3 (reserved).
    Reserved(u16),
}

/// A view of the 4-byte shim.
#[derive(Debug, Clone)]
pub struct Shim<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Shim<T> {
    /// Wraps a buffer holding at least the shim.
    pub fn new_checked(buffer: T) -> Result<Self> {
        Error::check_len("int shim", SHIM_LEN, buffer.as_ref().len())?;
        Ok(Shim { buffer })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// v1.0 shims carry an 8-bit type (so the first byte is below 16); v2.1 a 4-bit one.
    #[inline]
    pub fn version(&self) -> Version {
        if self.b()[0] < 0x10 {
            Version::V1_0
        } else {
            Version::V2_1
        }
    }
    /// Type field.
    #[inline]
    pub fn header_type(&self) -> HeaderType {
        match self.version() {
            Version::V1_0 => HeaderType::from(self.b()[0]),
            Version::V2_1 => HeaderType::from(self.b()[0] >> 4),
        }
    }
    /// Length field in 4-byte words (v2.1: shim included; v1.0 byte 2).
    #[inline]
    pub fn length_words(&self) -> u8 {
        match self.version() {
            Version::V1_0 => self.b()[2],
            Version::V2_1 => self.b()[1],
        }
    }
    /// NPT and the field it selects.
    #[inline]
    pub fn next_protocol(&self) -> NextProtocol {
        let b = self.b();
        match self.version() {
            Version::V1_0 => NextProtocol::Dscp(b[3] >> 2),
            Version::V2_1 => match (b[0] >> 2) & 0x3 {
                0 => NextProtocol::Dscp(b[3] >> 2),
                1 => NextProtocol::UdpPort(u16::from_be_bytes([b[2], b[3]])),
                2 => NextProtocol::IpProtocol(b[3]),
                _ => NextProtocol::Reserved(u16::from_be_bytes([b[2], b[3]])),
            },
        }
    }
}

/// Owned shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShimRepr {
    /// Shim version.
    pub version: Version,
    /// Type.
    pub header_type: HeaderType,
    /// NPT and its field.
    pub next_protocol: NextProtocol,
    /// Length in words, as on the wire (see [`Version`] for what it counts).
    pub length_words: u8,
}

impl ShimRepr {
    /// Reads a shim.
    #[inline(always)]
    pub fn parse<T: AsRef<[u8]>>(s: &Shim<T>) -> ShimRepr {
        ShimRepr {
            version: s.version(),
            header_type: s.header_type(),
            next_protocol: s.next_protocol(),
            length_words: s.length_words(),
        }
    }
    /// Writes the shim into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let Some(h) = buf.get_mut(..SHIM_LEN) else {
            return Err(Error::Truncated { layer: "int shim", need: SHIM_LEN, have: buf.len() });
        };
        h.fill(0);
        let ty = u8::from(self.header_type);
        match self.version {
            Version::V1_0 => {
                h[0] = ty;
                h[2] = self.length_words;
                if let NextProtocol::Dscp(d) = self.next_protocol {
                    h[3] = d << 2;
                }
            }
            Version::V2_1 => {
                let (npt, rest) = match self.next_protocol {
                    NextProtocol::Dscp(d) => (0, u16::from(d) << 2),
                    NextProtocol::UdpPort(p) => (1, p),
                    NextProtocol::IpProtocol(p) => (2, u16::from(p)),
                    NextProtocol::Reserved(r) => (3, r),
                };
                h[0] = (ty << 4) | (npt << 2);
                h[1] = self.length_words;
                h[2..4].copy_from_slice(&rest.to_be_bytes());
            }
        }
        Ok(())
    }
}

/// One per-hop metadata value (INT v2.1 §5.8; the instruction bit that asks for it in
/// [`Field::instruction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Field {
    /// Bit 0: node (switch) ID, 4 bytes.
    NodeId = 0,
    /// Bit 1: level-1 ingress interface ID, 2 bytes.
    L1IngressIf,
    /// Bit 1: level-1 egress interface ID, 2 bytes.
    L1EgressIf,
    /// Bit 2: hop latency, 4 bytes (nanoseconds in Telemark's switch).
    HopLatency,
    /// Bit 3: queue ID, 1 byte.
    QueueId,
    /// Bit 3: queue occupancy, 3 bytes.
    QueueOccupancy,
    /// Bit 4: ingress timestamp, 8 bytes (v1.0: 4).
    IngressTs,
    /// Bit 5: egress timestamp, 8 bytes (v1.0: 4).
    EgressTs,
    /// Bit 6: level-2 ingress interface ID, 4 bytes.
    L2IngressIf,
    /// Bit 6: level-2 egress interface ID, 4 bytes.
    L2EgressIf,
    /// Bit 7: egress interface TX utilisation, 4 bytes.
    TxUtilization,
    /// Bit 8: buffer ID, 1 byte.
    BufferId,
    /// Bit 8: buffer occupancy, 3 bytes.
    BufferOccupancy,
    /// Bit 15: checksum complement, 4 bytes.
    ChecksumComplement,
    /// Queue of a drop (Telemetry Report RepMdBits only: v2.0 bit 15, v1.0 bit 4), 1 byte.
    DropQueueId,
    /// Drop reason (Telemetry Report RepMdBits only: v2.0 bit 15, v1.0 bit 4), 1 byte.
    DropReason,
}

/// Number of [`Field`] values.
pub const FIELD_COUNT: usize = 16;

impl Field {
    /// Every field, in stack order within a hop.
    pub const ALL: [Field; FIELD_COUNT] = [
        Field::NodeId,
        Field::L1IngressIf,
        Field::L1EgressIf,
        Field::HopLatency,
        Field::QueueId,
        Field::QueueOccupancy,
        Field::IngressTs,
        Field::EgressTs,
        Field::L2IngressIf,
        Field::L2EgressIf,
        Field::TxUtilization,
        Field::BufferId,
        Field::BufferOccupancy,
        Field::ChecksumComplement,
        Field::DropQueueId,
        Field::DropReason,
    ];

    /// The stable snake_case name used in configs, expressions and records.
    pub const fn name(self) -> &'static str {
        match self {
            Field::NodeId => "node_id",
            Field::L1IngressIf => "l1_ingress_if",
            Field::L1EgressIf => "l1_egress_if",
            Field::HopLatency => "hop_latency",
            Field::QueueId => "queue_id",
            Field::QueueOccupancy => "queue_occupancy",
            Field::IngressTs => "ingress_ts",
            Field::EgressTs => "egress_ts",
            Field::L2IngressIf => "l2_ingress_if",
            Field::L2EgressIf => "l2_egress_if",
            Field::TxUtilization => "tx_utilization",
            Field::BufferId => "buffer_id",
            Field::BufferOccupancy => "buffer_occupancy",
            Field::ChecksumComplement => "checksum_complement",
            Field::DropQueueId => "drop_queue_id",
            Field::DropReason => "drop_reason",
        }
    }

    /// The field named `name`.
    pub fn from_name(name: &str) -> Option<Field> {
        Field::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The INT instruction bit (0 = most significant) that asks for this field (for
    /// [`Field::DropReason`], Telemetry Report v2.0's RepMdBits bit).
    pub const fn instruction(self) -> u8 {
        match self {
            Field::NodeId => 0,
            Field::L1IngressIf | Field::L1EgressIf => 1,
            Field::HopLatency => 2,
            Field::QueueId | Field::QueueOccupancy => 3,
            Field::IngressTs => 4,
            Field::EgressTs => 5,
            Field::L2IngressIf | Field::L2EgressIf => 6,
            Field::TxUtilization => 7,
            Field::BufferId | Field::BufferOccupancy => 8,
            Field::ChecksumComplement | Field::DropQueueId | Field::DropReason => 15,
        }
    }
}

/// The 16-bit instruction bitmap; bit 0 is the most significant bit on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Instructions(pub u16);

impl Instructions {
    /// Whether instruction `bit` (0–15) is set.
    pub const fn has(self, bit: u8) -> bool {
        bit < 16 && self.0 & (0x8000 >> bit) != 0
    }
    /// The bitmap asking for exactly `fields`.
    pub fn of(fields: &[Field]) -> Instructions {
        Instructions(fields.iter().fold(0, |m, f| m | (0x8000 >> f.instruction())))
    }
}

/// Which bitmap a [`Layout`] reads: the INT instruction bitmap of either INT version, or a
/// Telemetry Report's RepMdBits, which reuse most bits with different meanings at the edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// INT v1.0 instruction bitmap (4-byte timestamps; bits 8–14 reserved).
    IntV1_0,
    /// INT v2.1 instruction bitmap.
    IntV2_1,
    /// Telemetry Report v1.0 RepMdBits (6 bits, in the top of the bitmap; v1.0 §3.2).
    ReportV1_0,
    /// Telemetry Report v2.0 RepMdBits (v2.0 §3.3.1: bit 15 is queue ID and drop reason).
    ReportV2_0,
}

impl From<Version> for Format {
    fn from(v: Version) -> Format {
        match v {
            Version::V1_0 => Format::IntV1_0,
            Version::V2_1 => Format::IntV2_1,
        }
    }
}

/// Where one item of a hop's metadata goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// A named value.
    Field(Field),
    /// The raw word of a reserved instruction bit (9–14).
    Reserved(u8),
    /// Padding, skipped.
    Padding,
}

/// What one bit of `format`'s bitmap puts in a hop's metadata: `(slot, width in bytes)`.
/// This table is the one rule for sizes; [`Layout`] derives everything from it.
const fn items_of(bit: u8, format: Format) -> &'static [(Slot, u8)] {
    use Field::*;
    use Slot::Field as F;
    const PORTS_L1: &[(Slot, u8)] = &[(F(L1IngressIf), 2), (F(L1EgressIf), 2)];
    const LATENCY: &[(Slot, u8)] = &[(F(HopLatency), 4)];
    const QUEUE: &[(Slot, u8)] = &[(F(QueueId), 1), (F(QueueOccupancy), 3)];
    const DROP: &[(Slot, u8)] = &[(F(DropQueueId), 1), (F(DropReason), 1), (Slot::Padding, 2)];
    const TX: &[(Slot, u8)] = &[(F(TxUtilization), 4)];
    match (format, bit) {
        // Telemetry Report v1.0 RepMdBits, 6 bits (§3.2), all 4 bytes.
        (Format::ReportV1_0, 0) => PORTS_L1,
        (Format::ReportV1_0, 1) => LATENCY,
        (Format::ReportV1_0, 2) => QUEUE,
        (Format::ReportV1_0, 3) => &[(F(EgressTs), 4)],
        (Format::ReportV1_0, 4) => DROP,
        (Format::ReportV1_0, 5) => TX,
        (Format::ReportV1_0, _) => &[(Slot::Padding, 4)],
        // INT (v2.1 §5.8, v1.0 §4.7) and Telemetry Report v2.0 RepMdBits (§3.3.1).
        (_, 0) => &[(F(NodeId), 4)],
        (_, 1) => PORTS_L1,
        (_, 2) => LATENCY,
        (_, 3) => QUEUE,
        (Format::IntV1_0, 4) => &[(F(IngressTs), 4)],
        (_, 4) => &[(F(IngressTs), 8)],
        (Format::IntV1_0, 5) => &[(F(EgressTs), 4)],
        (_, 5) => &[(F(EgressTs), 8)],
        (_, 6) => &[(F(L2IngressIf), 4), (F(L2EgressIf), 4)],
        (_, 7) => TX,
        (Format::IntV1_0, 8) => &[(Slot::Reserved(8), 4)],
        (_, 8) => &[(F(BufferId), 1), (F(BufferOccupancy), 3)],
        (Format::ReportV2_0, 15) => DROP,
        (_, 15) => &[(F(ChecksumComplement), 4)],
        (_, 9) => &[(Slot::Reserved(9), 4)],
        (_, 10) => &[(Slot::Reserved(10), 4)],
        (_, 11) => &[(Slot::Reserved(11), 4)],
        (_, 12) => &[(Slot::Reserved(12), 4)],
        (_, 13) => &[(Slot::Reserved(13), 4)],
        (_, _) => &[(Slot::Reserved(14), 4)],
    }
}

/// Bytes a format's bitmap asks for, by `Format as usize` and then by the bitmap's high and
/// low byte ([`items_of`]'s widths summed; sizes add up bit by bit): [`Layout::len_of`] runs
/// on every packet.
const BITMAP_LEN: [[[u8; 256]; 2]; 4] = {
    const fn half(format: Format, first_bit: u8) -> [u8; 256] {
        let mut out = [0u8; 256];
        let mut byte = 0;
        while byte < 256 {
            let mut bit = 0;
            while bit < 8 {
                if byte & (0x80 >> bit) != 0 {
                    let items = items_of(first_bit + bit as u8, format);
                    let mut i = 0;
                    while i < items.len() {
                        out[byte] += items[i].1;
                        i += 1;
                    }
                }
                bit += 1;
            }
            byte += 1;
        }
        out
    }
    const fn both(format: Format) -> [[u8; 256]; 2] {
        [half(format, 0), half(format, 8)]
    }
    [
        both(Format::IntV1_0),
        both(Format::IntV2_1),
        both(Format::ReportV1_0),
        both(Format::ReportV2_0),
    ]
};

/// Where each requested value sits inside one hop's metadata, computed once per packet from
/// the instruction bitmap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    items: [Item; MAX_ITEMS],
    count: u8,
    hop_len: u8,
    /// What a hop read with this layout has present (as [`Hop::put`] marks each item).
    present: u32,
    /// The named values among `items`, as [`read_into`](Self::read_into) reads them.
    reads: [FieldRead; FIELD_COUNT],
    read_count: u8,
    /// Whether `items` has reserved words (read apart, rarely there).
    reserved: bool,
}

/// Where a named value is, ready to read: `items` entries of [`Slot::Field`] reduced to
/// numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FieldRead {
    offset: u8,
    width: u8,
    field: u8,
    /// The value is the last word of the hop whatever its stride (the checksum complement):
    /// its offset moves by the stride's extra bytes.
    at_end: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Item {
    offset: u8,
    width: u8,
    slot: Slot,
}

const NO_ITEM: Item = Item { offset: 0, width: 0, slot: Slot::Padding };

impl Layout {
    /// The layout `bits` ask for in `format`.
    pub fn new(bits: Instructions, format: impl Into<Format>) -> Layout {
        let format = format.into();
        let mut l = Layout {
            items: [NO_ITEM; MAX_ITEMS],
            count: 0,
            hop_len: 0,
            present: 0,
            reads: [FieldRead { offset: 0, width: 0, field: 0, at_end: false }; FIELD_COUNT],
            read_count: 0,
            reserved: false,
        };
        if bits.0 == 0 {
            return l;
        }
        // The set bits only, most significant (bit 0) first.
        let mut rest = bits.0;
        while rest != 0 {
            let bit = rest.leading_zeros() as u8;
            rest &= !(0x8000 >> bit);
            for &(slot, width) in items_of(bit, format) {
                if let Some(item) = l.items.get_mut(usize::from(l.count)) {
                    *item = Item { offset: l.hop_len, width, slot };
                    l.count += 1;
                }
                l.hop_len += width;
            }
        }
        let mut marks = Hop::default();
        for i in 0..usize::from(l.count) {
            let it = l.items[i];
            marks.put(it.slot, 0);
            match it.slot {
                Slot::Field(f) => {
                    if let Some(r) = l.reads.get_mut(usize::from(l.read_count)) {
                        let at_end = f == Field::ChecksumComplement;
                        *r = FieldRead {
                            offset: it.offset,
                            width: it.width,
                            field: f as u8,
                            at_end,
                        };
                        l.read_count += 1;
                    }
                }
                Slot::Reserved(_) => l.reserved = true,
                Slot::Padding => {}
            }
        }
        l.present = marks.present;
        l
    }
    /// Bytes of metadata `bits` ask for in `format`, without building the layout.
    pub fn len_of(bits: Instructions, format: impl Into<Format>) -> usize {
        let [high, low] = &BITMAP_LEN[format.into() as usize];
        let [h, l] = bits.0.to_be_bytes();
        usize::from(high[usize::from(h)]) + usize::from(low[usize::from(l)])
    }

    /// This layout reading only the fields in `wanted` (a mask of `1 << field as u8`): a
    /// reader that uses a few of a hop's values skips the rest, and the hops it reads have
    /// only those. Reserved words are skipped too. Writing is unchanged.
    pub fn reading_only(mut self, wanted: u32) -> Layout {
        let mut kept = 0;
        for i in 0..usize::from(self.read_count) {
            let r = self.reads[i];
            if wanted & (1 << r.field) != 0 {
                self.reads[kept] = r;
                kept += 1;
            }
        }
        self.read_count = kept as u8;
        self.present &= wanted & ((1 << FIELD_COUNT) - 1);
        self.reserved = false;
        self
    }

    /// Bytes of metadata per hop.
    pub const fn hop_len(&self) -> usize {
        self.hop_len as usize
    }
    fn items(&self) -> &[Item] {
        &self.items[..usize::from(self.count)]
    }
    /// Reads one hop from the front of `bytes` (at least [`hop_len`](Self::hop_len) long).
    pub fn read(&self, bytes: &[u8]) -> Result<Hop> {
        self.read_hop(bytes, self.hop_len())
    }
    /// Reads one hop of `stride` bytes: the baseline items, domain-specific words after them,
    /// and the checksum complement always in the last word (INT v2.1 §5.8).
    pub fn read_hop(&self, bytes: &[u8], stride: usize) -> Result<Hop> {
        let mut hop = Hop::default();
        self.read_into(bytes, stride, &mut hop)?;
        Ok(hop)
    }

    /// [`read_hop`](Self::read_hop) into `hop` (what was in it is forgotten), for callers that
    /// keep a buffer of hops instead of copying one out per read.
    pub fn read_into(&self, bytes: &[u8], stride: usize, hop: &mut Hop) -> Result<()> {
        let stride = stride.max(self.hop_len());
        Error::check_len("int hop", stride, bytes.len())?;
        // Words past the baseline items (domain-specific metadata) come before the last one.
        let extra = stride - self.hop_len();
        // Every item's value is written, so what is present is the layout's alone; values
        // read as all ones are collected apart and marked once.
        hop.present = self.present;
        let mut unavailable = 0u32;
        for r in &self.reads[..usize::from(self.read_count)] {
            let start = usize::from(r.offset) + if r.at_end { extra } else { 0 };
            let v = read_be(bytes, start, r.width);
            hop.values[usize::from(r.field)] = v;
            let all_ones = u64::MAX >> (64 - 8 * u32::from(r.width));
            unavailable |= u32::from(v == all_ones) << r.field;
        }
        hop.unavailable = unavailable;
        if self.reserved {
            for it in self.items() {
                if let Slot::Reserved(_) = it.slot {
                    hop.put(it.slot, read_be(bytes, usize::from(it.offset), it.width));
                }
            }
        }
        Ok(())
    }

    /// Writes `hop`'s values for this layout into the front of `buf`; missing values are all
    /// ones (unavailable), values wider than their field are truncated to it.
    pub fn write(&self, hop: &Hop, buf: &mut [u8]) -> Result<()> {
        let Some(out) = buf.get_mut(..self.hop_len()) else {
            return Err(Error::Truncated {
                layer: "int hop",
                need: self.hop_len(),
                have: buf.len(),
            });
        };
        for it in self.items() {
            let v = hop.slot(it.slot);
            let w = usize::from(it.width);
            let start = usize::from(it.offset);
            out[start..start + w].copy_from_slice(&v.to_be_bytes()[8 - w..]);
        }
        Ok(())
    }
}

/// The `width`-byte big-endian number at `start` (inside `bytes`): one 8-byte load and a shift
/// where the bytes allow, else byte by byte.
fn read_be(bytes: &[u8], start: usize, width: u8) -> u64 {
    match bytes.get(start..start + 8) {
        Some(w) => {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            u64::from_be_bytes(word) >> (64 - 8 * u32::from(width))
        }
        None => bytes
            .get(start..start + usize::from(width))
            .unwrap_or_default()
            .iter()
            .fold(0u64, |v, &x| (v << 8) | u64::from(x)),
    }
}

/// One hop's metadata. Values the instructions did not ask for are `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hop {
    values: [u64; FIELD_COUNT],
    reserved: [u32; 7],
    present: u32,
    /// Fields read as all ones: "unavailable" (INT v2.1 §5.8).
    unavailable: u32,
}

impl Hop {
    /// The value of `f`, if this hop carries it (as on the wire: all ones if the hop said it
    /// was unavailable).
    pub fn get(&self, f: Field) -> Option<u64> {
        (self.present & (1 << f as u8) != 0).then(|| self.values[f as usize])
    }
    /// The value of `f`, if this hop carries it and did not mark it unavailable (all ones).
    pub fn available(&self, f: Field) -> Option<u64> {
        self.get(f).filter(|_| self.unavailable & (1 << f as u8) == 0)
    }
    /// Sets `f`.
    pub fn set(&mut self, f: Field, v: u64) {
        self.put(Slot::Field(f), v);
    }
    /// The raw word of reserved instruction bit `bit` (8–14), if present.
    pub fn reserved(&self, bit: u8) -> Option<u32> {
        let i = usize::from(bit.checked_sub(8)?);
        let r = *self.reserved.get(i)?;
        (self.present & (1 << (FIELD_COUNT + i)) != 0).then_some(r)
    }
    fn put(&mut self, slot: Slot, v: u64) {
        match slot {
            Slot::Field(f) => {
                self.values[f as usize] = v;
                self.present |= 1 << f as u8;
                self.unavailable &= !(1 << f as u8);
            }
            Slot::Reserved(bit) => {
                let i = usize::from(bit.saturating_sub(8));
                if let Some(r) = self.reserved.get_mut(i) {
                    *r = v as u32;
                    self.present |= 1 << (FIELD_COUNT + i);
                }
            }
            Slot::Padding => {}
        }
    }
    /// The value to write for `slot`: what was set, else all ones ("unavailable", as a
    /// transit writes a value it does not have; INT v2.1 §5.8); padding is zero.
    fn slot(&self, slot: Slot) -> u64 {
        match slot {
            Slot::Field(f) => self.get(f).unwrap_or(u64::MAX),
            Slot::Reserved(bit) => {
                let i = usize::from(bit.saturating_sub(8));
                match self.reserved.get(i) {
                    Some(&r) if self.present & (1 << (FIELD_COUNT + i)) != 0 => u64::from(r),
                    _ => u64::MAX,
                }
            }
            Slot::Padding => 0,
        }
    }
}

/// The INT-MD (v2.1) or INT v1.0 metadata header, or the INT-MX header, owned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MdHeader {
    /// Version field (2 for v2.1, 1 for v1.0).
    pub version: u8,
    /// D: the sink must discard the packet copy after reporting (v2.1 only).
    pub discard: bool,
    /// E: a hop could not add metadata because RemainingHopCnt reached 0.
    pub hop_count_exceeded: bool,
    /// M: a hop could not add metadata because of the MTU.
    pub mtu_exceeded: bool,
    /// Hop ML: words of metadata each hop adds (not in INT-MX).
    pub hop_ml: u8,
    /// RemainingHopCnt (not in INT-MX).
    pub remaining_hop_cnt: u8,
    /// The instructions.
    pub instructions: Instructions,
    /// Domain-specific ID (v2.1).
    pub domain_id: u16,
    /// Domain-specific instructions (v2.1).
    pub ds_instructions: u16,
    /// Domain-specific flags (v2.1).
    pub ds_flags: u16,
}

impl MdHeader {
    /// Header length for `version`.
    pub const fn buffer_len(version: Version) -> usize {
        match version {
            Version::V1_0 => MD_HEADER_LEN_V1,
            Version::V2_1 => MD_HEADER_LEN,
        }
    }

    /// Reads an INT-MD (or v1.0) header.
    #[inline(always)]
    pub fn parse_md(b: &[u8], version: Version) -> Result<MdHeader> {
        Error::check_len("int md", Self::buffer_len(version), b.len())?;
        let h = MdHeader {
            version: b[0] >> 4,
            discard: version == Version::V2_1 && b[0] & 0x08 != 0,
            hop_count_exceeded: match version {
                Version::V1_0 => b[0] & 0x01 != 0,
                Version::V2_1 => b[0] & 0x04 != 0,
            },
            mtu_exceeded: match version {
                Version::V1_0 => b[1] & 0x80 != 0,
                Version::V2_1 => b[0] & 0x02 != 0,
            },
            hop_ml: b[2] & 0x1f,
            remaining_hop_cnt: b[3],
            instructions: Instructions(u16::from_be_bytes([b[4], b[5]])),
            domain_id: match version {
                Version::V1_0 => 0,
                Version::V2_1 => u16::from_be_bytes([b[6], b[7]]),
            },
            ds_instructions: match version {
                Version::V1_0 => 0,
                Version::V2_1 => u16::from_be_bytes([b[8], b[9]]),
            },
            ds_flags: match version {
                Version::V1_0 => 0,
                Version::V2_1 => u16::from_be_bytes([b[10], b[11]]),
            },
        };
        let want = match version {
            Version::V1_0 => 1,
            Version::V2_1 => 2,
        };
        if h.version != want {
            return Err(Error::Malformed { layer: "int md", field: "version" });
        }
        Ok(h)
    }

    /// Reads an INT-MX header (v2.1 §5.9).
    pub fn parse_mx(b: &[u8]) -> Result<MdHeader> {
        Error::check_len("int mx", MD_HEADER_LEN, b.len())?;
        if b[0] >> 4 != 2 {
            return Err(Error::Malformed { layer: "int mx", field: "version" });
        }
        Ok(MdHeader {
            version: 2,
            discard: b[0] & 0x08 != 0,
            hop_count_exceeded: false,
            mtu_exceeded: false,
            hop_ml: 0,
            remaining_hop_cnt: 0,
            instructions: Instructions(u16::from_be_bytes([b[4], b[5]])),
            domain_id: u16::from_be_bytes([b[6], b[7]]),
            ds_instructions: u16::from_be_bytes([b[8], b[9]]),
            ds_flags: u16::from_be_bytes([b[10], b[11]]),
        })
    }

    /// Writes an INT-MD header (or, for `header_type` MX, an INT-MX header).
    pub fn emit(&self, version: Version, header_type: HeaderType, buf: &mut [u8]) -> Result<()> {
        let n = Self::buffer_len(version);
        let Some(h) = buf.get_mut(..n) else {
            return Err(Error::Truncated { layer: "int md", need: n, have: buf.len() });
        };
        h.fill(0);
        h[0] = self.version << 4;
        h[4..6].copy_from_slice(&self.instructions.0.to_be_bytes());
        match version {
            Version::V1_0 => {
                h[0] |= u8::from(self.hop_count_exceeded);
                h[1] = u8::from(self.mtu_exceeded) << 7;
            }
            Version::V2_1 => {
                h[0] |= u8::from(self.discard) << 3;
                if header_type != HeaderType::Mx {
                    h[0] |= (u8::from(self.hop_count_exceeded) << 2)
                        | (u8::from(self.mtu_exceeded) << 1);
                }
                h[6..8].copy_from_slice(&self.domain_id.to_be_bytes());
                h[8..10].copy_from_slice(&self.ds_instructions.to_be_bytes());
                h[10..12].copy_from_slice(&self.ds_flags.to_be_bytes());
            }
        }
        if header_type != HeaderType::Mx {
            h[2] = self.hop_ml & 0x1f;
            h[3] = self.remaining_hop_cnt;
        }
        Ok(())
    }
}

/// INT found at the start of an L4 payload: shim, header and the per-hop stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int<'a> {
    /// The shim.
    pub shim: ShimRepr,
    /// The INT-MD / INT-MX header (`None` for INT-Destination and unknown types).
    pub header: Option<MdHeader>,
    /// Bytes from the start of the shim to the original L4 payload.
    pub len: usize,
    /// The per-hop stack (INT-MD only; newest hop first).
    pub stack: &'a [u8],
    /// Bytes between hops: Hop ML × 4 (at least the layout's length).
    pub hop_stride: usize,
    /// Rules the packet broke and a tolerant parse accepted.
    pub deviations: Deviations,
}

/// How well a reading of the shim's Length fits the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fit {
    /// Outside the buffer, or not whole hops, or no L4 header where NPT 2 says one is.
    No,
    /// The L4 header after it says it is longer than what is present (a cut capture).
    Truncated,
    /// Everything adds up.
    Exact,
}

/// Whether `d` divides `n` (as `n.is_multiple_of(d)`), in 32-bit arithmetic where the values
/// allow: lengths here are below 2^16, and a 64-bit division costs several times more on
/// common x86 cores, on every packet.
fn divides(d: usize, n: usize) -> bool {
    match (u32::try_from(d), u32::try_from(n)) {
        (Ok(d), Ok(n)) => n.is_multiple_of(d),
        _ => n.is_multiple_of(d),
    }
}

/// How well `b` starts a header of IP protocol `proto`: UDP by its length field against the
/// bytes present, TCP by its data offset and reserved bits. Other protocols: exact.
fn l4_header_fit(proto: u8, b: &[u8]) -> Fit {
    match proto {
        17 => match b.get(4..6).map(|l| usize::from(u16::from_be_bytes([l[0], l[1]]))) {
            Some(n) if n == b.len() => Fit::Exact,
            Some(n) if n > b.len() => Fit::Truncated,
            _ => Fit::No,
        },
        // Data offset, then three reserved bits that are zero (RFC 9293 §3.1).
        6 => match b.get(12) {
            Some(&o) if o >> 4 >= 5 && usize::from(o >> 4) * 4 <= b.len() && o & 0x0e == 0 => {
                Fit::Exact
            }
            _ => Fit::No,
        },
        _ => Fit::Exact,
    }
}

impl<'a> Int<'a> {
    /// Reads INT at the front of `b` (the bytes after the TCP or UDP header).
    pub fn parse(b: &'a [u8], mode: Mode) -> Result<Int<'a>> {
        let shim = ShimRepr::parse(&Shim::new_checked(b)?);
        let mut deviations = Deviations::NONE;
        let header_len = match shim.header_type {
            HeaderType::Md => MdHeader::buffer_len(shim.version),
            HeaderType::Mx => MD_HEADER_LEN,
            _ => 0,
        };
        let Some(header_bytes) = b.get(SHIM_LEN..SHIM_LEN + header_len) else {
            return Err(Error::Truncated {
                layer: "int header",
                need: SHIM_LEN + header_len,
                have: b.len(),
            });
        };
        let header = match shim.header_type {
            HeaderType::Md => Some(MdHeader::parse_md(header_bytes, shim.version)?),
            HeaderType::Mx => Some(MdHeader::parse_mx(header_bytes)?),
            _ => None,
        };
        let stride = match (shim.header_type, header) {
            (HeaderType::Md, Some(h)) => usize::from(h.hop_ml) * 4,
            (HeaderType::Mx, Some(h)) if h.ds_instructions == 0 => {
                Layout::len_of(h.instructions, shim.version)
            }
            (HeaderType::Mx, Some(_)) => 4,
            _ => 0,
        };
        // How well a reading of Length fits: the buffer, whole hops after the header and,
        // when the shim says an L4 header follows (NPT 2), that header.
        let fit = |len: usize| {
            if len < SHIM_LEN + header_len
                || len > b.len()
                || !divides(stride, len - SHIM_LEN - header_len)
            {
                return Fit::No;
            }
            match shim.next_protocol {
                NextProtocol::IpProtocol(p) => l4_header_fit(p, &b[len..]),
                _ => Fit::Exact,
            }
        };
        // Length counts the shim in v1.0 (§4.6.1) but not since v2.0 (v2.1 §5.7.2); senders
        // mix the two up. The spec's reading wins unless the other fits strictly better: then
        // a strict parse refuses the packet and a tolerant one takes the other reading.
        let words = usize::from(shim.length_words) * 4;
        let (spec, other) = match shim.version {
            Version::V1_0 => (words, words + SHIM_LEN),
            Version::V2_1 => (words + SHIM_LEN, words),
        };
        let len = match (fit(spec) >= fit(other), mode) {
            (true, _) => spec,
            (false, Mode::Tolerant) => {
                deviations.insert(match shim.version {
                    Version::V1_0 => Deviation::ShimLengthExcludesShim,
                    Version::V2_1 => Deviation::ShimLengthIncludesShim,
                });
                other
            }
            (false, Mode::Strict) => {
                return Err(Error::BadLength { layer: "int shim", field: "length", value: words });
            }
        };
        if len < SHIM_LEN + header_len || len > b.len() {
            return Err(Error::BadLength { layer: "int shim", field: "length", value: len });
        }
        let body = &b[SHIM_LEN..len];
        let instructions = header.map(|h| h.instructions).unwrap_or_default();
        // Only the length here: the layout itself is built where hops are read.
        let hop_len = Layout::len_of(instructions, shim.version);
        let mut int = Int { shim, header, len, stack: &[], hop_stride: hop_len, deviations };
        // After an INT-MX header only domain-specific source metadata may follow (v2.1 §5.9);
        // without domain-specific instructions, bmv2 put its hop's metadata there.
        let mx_extra = body.len() > header_len;
        if let (HeaderType::Mx, true, Some(h)) = (shim.header_type, mx_extra, header) {
            if h.ds_instructions == 0 {
                let bad = Error::BadLength { layer: "int mx", field: "length", value: len };
                tolerate(mode, &mut int.deviations, Deviation::MxCarriesMetadata, bad)?;
                int.stack = &body[header_len..];
            }
        }
        if let (HeaderType::Md, Some(h)) = (shim.header_type, header) {
            int.stack = &body[header_len..];
            int.hop_stride = usize::from(h.hop_ml) * 4;
            if int.hop_stride < hop_len {
                return Err(Error::BadLength {
                    layer: "int md",
                    field: "hop ml",
                    value: usize::from(h.hop_ml),
                });
            }
            // Hop ML counts domain-specific metadata too (v2.1 §5.8); without domain-specific
            // instructions the extra words are unexplained.
            if int.hop_stride > hop_len && h.ds_instructions == 0 {
                let bad =
                    Error::BadLength { layer: "int md", field: "hop ml", value: int.hop_stride };
                tolerate(mode, &mut int.deviations, Deviation::HopLengthExceedsInstructions, bad)?;
            }
            if !divides(int.hop_stride, int.stack.len()) {
                let bad =
                    Error::BadLength { layer: "int md", field: "stack", value: int.stack.len() };
                tolerate(mode, &mut int.deviations, Deviation::StackNotWholeHops, bad)?;
            }
        }
        Ok(int)
    }

    /// The per-hop metadata layout the instructions give.
    pub fn layout(&self) -> Layout {
        Layout::new(self.instructions(), self.shim.version)
    }

    /// The instructions (none without an INT-MD/MX header).
    pub fn instructions(&self) -> Instructions {
        self.header.map(|h| h.instructions).unwrap_or_default()
    }

    /// Number of whole hops in the stack.
    pub fn hop_count(&self) -> usize {
        match (u32::try_from(self.stack.len()), u32::try_from(self.hop_stride)) {
            (Ok(n), Ok(d)) => n.checked_div(d).unwrap_or(0) as usize,
            _ => self.stack.len().checked_div(self.hop_stride).unwrap_or(0),
        }
    }

    /// Hop `i` (0 = the newest).
    pub fn hop(&self, i: usize) -> Result<Hop> {
        let start = i.saturating_mul(self.hop_stride);
        match self.stack.get(start..) {
            Some(rest) if i < self.hop_count() => self.layout().read_hop(rest, self.hop_stride),
            _ => Err(Error::BadLength { layer: "int md", field: "hop index", value: i }),
        }
    }

    /// The hops, newest first.
    pub fn hops(&self) -> impl Iterator<Item = Hop> + '_ {
        (0..self.hop_count()).filter_map(|i| self.hop(i).ok())
    }

    /// Reads the hops, newest first, into `out` (as many as fit); returns how many.
    pub fn read_hops(&self, out: &mut [Hop]) -> usize {
        self.read_hops_with(&self.layout(), out)
    }

    /// [`read_hops`](Self::read_hops) with the layout already built (it must be
    /// [`layout`](Self::layout)'s): a reader that meets the same instructions packet after
    /// packet builds it once.
    pub fn read_hops_with(&self, layout: &Layout, out: &mut [Hop]) -> usize {
        // Whole hops only (as hop_count counts them), without its division.
        let mut n = 0;
        let mut at = 0;
        for slot in out.iter_mut() {
            match self.stack.get(at..) {
                Some(b) if self.hop_stride > 0 && b.len() >= self.hop_stride => {
                    if layout.read_into(b, self.hop_stride, slot).is_err() {
                        break;
                    }
                    n += 1;
                    at += self.hop_stride;
                }
                _ => break,
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An INT-MX packet whose shim Length (4) counts the shim, as v1.0's did, then 2 bytes of
    /// payload.
    const MX_LEN_WITH_SHIM: [u8; 18] =
        [0x30, 0x04, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0xff, 0x00, 0x00, 0x00, 0, 0, 0, 0, 1, 2];
    /// The same with Length 3 as v2.1 says.
    const MX: [u8; 16] =
        [0x30, 0x03, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0xff, 0x00, 0x00, 0x00, 0, 0, 0, 0];

    #[test]
    fn reading_only_some_fields() {
        let all = Layout::new(Instructions(0xff01), Version::V2_1);
        let mut hop = Hop::default();
        for f in Field::ALL {
            hop.set(f, 7);
        }
        hop.set(Field::HopLatency, 0xffff_ffff);
        hop.set(Field::ChecksumComplement, 0xabcd);
        let mut b = [0u8; 64];
        all.write(&hop, &mut b).unwrap();
        let wanted = 1 << Field::HopLatency as u8 | 1 << Field::ChecksumComplement as u8;
        let few = all.reading_only(wanted);
        // The checksum complement is the last word of a longer stride too.
        let mut wide = [0u8; 68];
        wide[..44].copy_from_slice(&b[..44]);
        wide[44..48].copy_from_slice(&[1, 2, 3, 4]);
        wide[48..52].copy_from_slice(&b[44..48]);
        let h = few.read_hop(&wide, 52).unwrap();
        assert_eq!(h.get(Field::ChecksumComplement), Some(0xabcd));
        assert_eq!(h.get(Field::HopLatency), Some(0xffff_ffff));
        assert_eq!(h.available(Field::HopLatency), None, "all ones: unavailable");
        assert_eq!((h.get(Field::NodeId), h.get(Field::EgressTs)), (None, None));
        // All of them, as the full layout reads them.
        let full = all.read_hop(&wide, 52).unwrap();
        assert_eq!(full.get(Field::NodeId), Some(7));
        assert_eq!(full.get(Field::ChecksumComplement), Some(0xabcd));
    }

    #[test]
    fn sizes_follow_the_instruction_table() {
        // Bits 0–7 in v2.1: 4 + 4 + 4 + 4 + 8 + 8 + 8 + 4 = 44 bytes (bmv2's reports).
        let l = Layout::new(Instructions(0xff00), Version::V2_1);
        assert_eq!(l.hop_len(), 44);
        // The same bits in v1.0 have 4-byte timestamps.
        assert_eq!(Layout::new(Instructions(0xff00), Version::V1_0).hop_len(), 36);
        // Every bit: 44 + 4 (buffer) + 6 × 4 (reserved) + 4 (checksum complement).
        assert_eq!(Layout::new(Instructions(0xffff), Version::V2_1).hop_len(), 76);
        assert_eq!(Instructions::of(&[Field::NodeId, Field::QueueOccupancy]), Instructions(0x9000));
    }

    #[test]
    fn mx_strict_and_tolerant() {
        assert!(Int::parse(&MX_LEN_WITH_SHIM, Mode::Strict).is_err());
        let int = Int::parse(&MX_LEN_WITH_SHIM, Mode::Tolerant).unwrap();
        assert_eq!(int.shim.header_type, HeaderType::Mx);
        assert_eq!(int.len, 16);
        assert_eq!(int.header.unwrap().instructions, Instructions(0xff00));
        assert!(int.deviations.contains(Deviation::ShimLengthIncludesShim));
        let clean = Int::parse(&MX, Mode::Strict).unwrap();
        assert_eq!((clean.len, clean.hop_count()), (16, 0));
    }

    #[test]
    fn md_round_trip() {
        let version = Version::V2_1;
        let ins = Instructions::of(&[Field::NodeId, Field::HopLatency, Field::IngressTs]);
        let layout = Layout::new(ins, version);
        let header = MdHeader {
            version: 2,
            discard: false,
            hop_count_exceeded: false,
            mtu_exceeded: true,
            hop_ml: (layout.hop_len() / 4) as u8,
            remaining_hop_cnt: 6,
            instructions: ins,
            domain_id: 7,
            ds_instructions: 0,
            ds_flags: 0x4000,
        };
        let hops = 3;
        let len = SHIM_LEN + MD_HEADER_LEN + hops * layout.hop_len();
        let mut buf = vec![0u8; len + 5];
        let shim = ShimRepr {
            version,
            header_type: HeaderType::Md,
            next_protocol: NextProtocol::UdpPort(5201),
            length_words: (len / 4 - 1) as u8,
        };
        shim.emit(&mut buf).unwrap();
        header.emit(version, HeaderType::Md, &mut buf[SHIM_LEN..]).unwrap();
        for i in 0..hops {
            let mut h = Hop::default();
            h.set(Field::NodeId, 10 + i as u64);
            h.set(Field::HopLatency, 1000 * i as u64);
            h.set(Field::IngressTs, u64::MAX - i as u64);
            let at = SHIM_LEN + MD_HEADER_LEN + i * layout.hop_len();
            layout.write(&h, &mut buf[at..]).unwrap();
        }
        let int = Int::parse(&buf, Mode::Strict).unwrap();
        assert_eq!(int.shim, shim);
        assert_eq!(int.header, Some(header));
        assert_eq!(int.len, len);
        assert_eq!(int.hop_count(), hops);
        let got: Vec<_> = int.hops().map(|h| h.get(Field::NodeId).unwrap()).collect();
        assert_eq!(got, [10, 11, 12]);
        assert_eq!(int.hop(2).unwrap().get(Field::IngressTs), Some(u64::MAX - 2));
        assert_eq!(int.hop(2).unwrap().get(Field::QueueId), None);
        assert!(int.hop(3).is_err());
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(data: Vec<u8>) {
            for mode in [Mode::Strict, Mode::Tolerant] {
                if let Ok(int) = Int::parse(&data, mode) {
                    for h in int.hops() {
                        let _ = h.get(Field::HopLatency);
                    }
                }
            }
        }
    }
}
