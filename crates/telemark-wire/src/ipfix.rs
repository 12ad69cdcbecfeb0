//! IPFIX and NetFlow v9 messages: header, sets, templates and data records.
//!
//! References: RFC 7011 (IPFIX protocol) §3.1 message header, §3.3 set header, §3.4.1
//! template record, §3.4.2.2 options template record, §3.2 field specifier (enterprise bit),
//! §7 variable-length encoding, §8.1 template withdrawal, §3.3.1 set padding; RFC 7012
//! (information model) §3.1 abstract data types; RFC 3954 (NetFlow v9) §5.1 header, §5.2
//! template flowset, §6.1 options template flowset; RFC 7011 §6.2 reduced-size encoding.
//!
//! ```text
//! IPFIX:  version=10 | length | export time | sequence | observation domain | set …
//! v9:     version=9  | count  | sysUptime | unix secs | sequence | source id | flowset …
//! set:    set id | length | body (templates: 2/0, options templates: 3/1, data: ≥ 256)
//! ```
//!
//! Both versions read into the same [`Template`]s and [`DataRecords`]: a v9 field type is an
//! IANA element number without an enterprise, and v9 options templates give scope and option
//! lengths in bytes where IPFIX gives a scope field count.

/// IANA's IPFIX Information Elements registry (generated; see the file's head).
#[path = "ipfix_iana.rs"]
pub mod iana;

use crate::{Error, Result};
use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// The IPFIX version number.
pub const IPFIX_VERSION: u16 = 10;
/// The NetFlow v9 version number.
pub const NETFLOW_V9_VERSION: u16 = 9;
/// IPFIX message header length.
pub const IPFIX_HEADER_LEN: usize = 16;
/// NetFlow v9 packet header length.
pub const V9_HEADER_LEN: usize = 20;
/// Set (flowset) header length.
pub const SET_HEADER_LEN: usize = 4;
/// The field length that says "variable length" (RFC 7011 §7).
pub const VARIABLE_LENGTH: u16 = 65535;
/// The lowest data set id; below it, set ids name template kinds.
pub const MIN_DATA_SET_ID: u16 = 256;
/// The Private Enterprise Number RFC 5103 gives reverse-direction elements.
pub const REVERSE_PEN: u32 = 29305;
/// Telemark's elements' enterprise number: the documentation PEN of RFC 5612 until one is
/// registered (docs/flow-export.md lists the elements).
pub const TELEMARK_PEN: u32 = 32473;

const LAYER: &str = "ipfix";

/// Which protocol a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// NetFlow v9 (RFC 3954).
    NetflowV9,
    /// IPFIX (RFC 7011).
    Ipfix,
}

/// A message header, either version's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The protocol.
    pub version: Version,
    /// Export time, seconds since the Unix epoch.
    pub export_time: u32,
    /// Milliseconds since the exporter booted (v9 only).
    pub sys_uptime_ms: Option<u32>,
    /// IPFIX: data records sent before this message in this domain (RFC 7011 §3.1). v9:
    /// packets sent before this one (RFC 3954 §5.1).
    pub sequence: u32,
    /// Observation domain (IPFIX) or source id (v9).
    pub domain: u32,
    /// Records in the packet, templates included (v9 only; exporters often get it wrong).
    pub count: Option<u16>,
}

/// A message: its header and its sets, not yet read.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// The header.
    pub header: Header,
    sets: &'a [u8],
}

impl<'a> Message<'a> {
    /// Reads the header of an IPFIX message or NetFlow v9 packet. An IPFIX message ends where
    /// its length says (bytes after it are ignored); a v9 packet at the end of `buf`.
    pub fn parse(buf: &'a [u8]) -> Result<Message<'a>> {
        Error::check_len(LAYER, 2, buf.len())?;
        match be16(buf, 0) {
            IPFIX_VERSION => {
                Error::check_len(LAYER, IPFIX_HEADER_LEN, buf.len())?;
                let length = usize::from(be16(buf, 2));
                if length < IPFIX_HEADER_LEN || length > buf.len() {
                    return Err(Error::BadLength { layer: LAYER, field: "length", value: length });
                }
                let header = Header {
                    version: Version::Ipfix,
                    export_time: be32(buf, 4),
                    sys_uptime_ms: None,
                    sequence: be32(buf, 8),
                    domain: be32(buf, 12),
                    count: None,
                };
                Ok(Message { header, sets: &buf[IPFIX_HEADER_LEN..length] })
            }
            NETFLOW_V9_VERSION => {
                Error::check_len(LAYER, V9_HEADER_LEN, buf.len())?;
                let header = Header {
                    version: Version::NetflowV9,
                    count: Some(be16(buf, 2)),
                    sys_uptime_ms: Some(be32(buf, 4)),
                    export_time: be32(buf, 8),
                    sequence: be32(buf, 12),
                    domain: be32(buf, 16),
                };
                Ok(Message { header, sets: &buf[V9_HEADER_LEN..] })
            }
            _ => Err(Error::Malformed { layer: LAYER, field: "version" }),
        }
    }

    /// Its sets, in wire order.
    pub fn sets(&self) -> Sets<'a> {
        Sets { rest: self.sets, version: self.header.version }
    }
}

/// What a set holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetKind {
    /// Template records (IPFIX set id 2, v9 flowset id 0).
    Template,
    /// Options template records (IPFIX 3, v9 1).
    OptionsTemplate,
    /// Data records of the template with this id.
    Data(u16),
    /// A reserved set id (IPFIX 0, 1, 4–255; v9 2–255): skipped.
    Reserved(u16),
}

impl SetKind {
    fn of(version: Version, id: u16) -> SetKind {
        match (version, id) {
            (_, id) if id >= MIN_DATA_SET_ID => SetKind::Data(id),
            (Version::Ipfix, 2) | (Version::NetflowV9, 0) => SetKind::Template,
            (Version::Ipfix, 3) | (Version::NetflowV9, 1) => SetKind::OptionsTemplate,
            (_, id) => SetKind::Reserved(id),
        }
    }
}

/// One set: its kind and its body (the records and any padding).
#[derive(Debug, Clone, Copy)]
pub struct Set<'a> {
    /// The set id.
    pub id: u16,
    /// What it holds.
    pub kind: SetKind,
    /// The bytes after the set header.
    pub body: &'a [u8],
    version: Version,
}

impl<'a> Set<'a> {
    /// Its template records (empty unless it is a template or options template set).
    pub fn templates(&self) -> TemplateRecords<'a> {
        let options = match self.kind {
            SetKind::Template => false,
            SetKind::OptionsTemplate => true,
            _ => {
                return TemplateRecords {
                    rest: &[],
                    version: self.version,
                    set_id: self.id,
                    options: false,
                }
            }
        };
        TemplateRecords { rest: self.body, version: self.version, set_id: self.id, options }
    }

    /// Its data records, read with `template` (which must be the one its set id names).
    pub fn records<'t>(&self, template: &'t Template) -> DataRecords<'a, 't> {
        DataRecords::new(self.body, template)
    }
}

/// The sets of a message.
#[derive(Debug, Clone)]
pub struct Sets<'a> {
    rest: &'a [u8],
    version: Version,
}

impl<'a> Iterator for Sets<'a> {
    type Item = Result<Set<'a>>;

    fn next(&mut self) -> Option<Result<Set<'a>>> {
        // Fewer bytes than a set header, or nothing but zeros, after the last set: padding
        // (some v9 exporters send one flowset in a zero-filled datagram).
        if self.rest.len() < SET_HEADER_LEN || self.rest.iter().all(|&b| b == 0) {
            self.rest = &[];
            return None;
        }
        let (id, len) = (be16(self.rest, 0), usize::from(be16(self.rest, 2)));
        if len < SET_HEADER_LEN || len > self.rest.len() {
            self.rest = &[];
            return Some(Err(Error::BadLength { layer: LAYER, field: "set length", value: len }));
        }
        let body = &self.rest[SET_HEADER_LEN..len];
        self.rest = &self.rest[len..];
        Some(Ok(Set { id, kind: SetKind::of(self.version, id), body, version: self.version }))
    }
}

/// One field of a template: which element, and how many bytes it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldSpec {
    /// The element id (the enterprise bit cleared).
    pub id: u16,
    /// Its Private Enterprise Number; 0 for IANA's elements.
    pub enterprise: u32,
    /// Its length in bytes, or [`VARIABLE_LENGTH`].
    pub len: u16,
}

/// A template: the fields of its data records, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Template {
    /// Its id (256 or more).
    pub id: u16,
    /// How many of the first fields are scope fields (0 for a plain template).
    pub scope_fields: u16,
    /// Every field.
    pub fields: Vec<FieldSpec>,
    /// Whether it came in an options template set.
    pub options: bool,
}

impl Template {
    /// The fewest bytes a data record of it takes (a variable-length field at least 1):
    /// fewer left at the end of a set are padding (RFC 7011 §3.3.1).
    pub fn min_record_len(&self) -> usize {
        self.fields
            .iter()
            .map(|f| if f.len == VARIABLE_LENGTH { 1 } else { usize::from(f.len) })
            .sum()
    }
}

impl Template {
    /// Telemark's storage encoding of a template (not a wire format): id, scope field count,
    /// options flag, field count, then each field's id, length and enterprise number, all
    /// big-endian. [`Template::from_bytes`] reads it back.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(7 + 8 * self.fields.len());
        b.extend_from_slice(&self.id.to_be_bytes());
        b.extend_from_slice(&self.scope_fields.to_be_bytes());
        b.push(u8::from(self.options));
        b.extend_from_slice(&(self.fields.len() as u16).to_be_bytes());
        for f in &self.fields {
            b.extend_from_slice(&f.id.to_be_bytes());
            b.extend_from_slice(&f.len.to_be_bytes());
            b.extend_from_slice(&f.enterprise.to_be_bytes());
        }
        b
    }

    /// Reads [`Template::to_bytes`]' encoding; `None` if it is not one.
    pub fn from_bytes(b: &[u8]) -> Option<Template> {
        let n = usize::from(u16::from_be_bytes([*b.get(5)?, *b.get(6)?]));
        let body = b.get(7..)?;
        if body.len() != 8 * n || n > usize::from(u16::MAX) {
            return None;
        }
        let fields = body
            .chunks_exact(8)
            .map(|c| FieldSpec { id: be16(c, 0), len: be16(c, 2), enterprise: be32(c, 4) })
            .collect();
        Some(Template { id: be16(b, 0), scope_fields: be16(b, 2), options: b[4] != 0, fields })
    }
}

/// One template record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateRecord {
    /// A template, new or redefined.
    Define(Template),
    /// The template with this id is withdrawn (RFC 7011 §8.1).
    Withdraw(u16),
    /// Every template of this set's kind is withdrawn (an IPFIX withdrawal naming the set id).
    WithdrawAll {
        /// Options templates (set 3) or templates (set 2).
        options: bool,
    },
}

/// The template records of a set.
#[derive(Debug, Clone)]
pub struct TemplateRecords<'a> {
    rest: &'a [u8],
    version: Version,
    set_id: u16,
    options: bool,
}

impl TemplateRecords<'_> {
    fn fields(&mut self, n: usize, enterprise_bit: bool) -> Result<Vec<FieldSpec>> {
        let mut fields = Vec::with_capacity(n.min(self.rest.len() / 4));
        for _ in 0..n {
            Error::check_len(LAYER, 4, self.rest.len())?;
            let (raw, len) = (be16(self.rest, 0), be16(self.rest, 2));
            self.rest = &self.rest[4..];
            let mut spec = FieldSpec { id: raw, enterprise: 0, len };
            if enterprise_bit && raw & 0x8000 != 0 {
                Error::check_len(LAYER, 4, self.rest.len())?;
                spec.id = raw & 0x7fff;
                spec.enterprise = be32(self.rest, 0);
                self.rest = &self.rest[4..];
            }
            fields.push(spec);
        }
        Ok(fields)
    }

    fn read(&mut self) -> Result<TemplateRecord> {
        let (id, count) = (be16(self.rest, 0), be16(self.rest, 2));
        self.rest = &self.rest[4..];
        match (self.version, self.options) {
            (Version::Ipfix, _) if count == 0 => {
                return Ok(if id == self.set_id {
                    TemplateRecord::WithdrawAll { options: self.options }
                } else {
                    TemplateRecord::Withdraw(id)
                });
            }
            _ if id < MIN_DATA_SET_ID => {
                return Err(Error::Malformed { layer: LAYER, field: "template id" })
            }
            _ => {}
        }
        let (scope_fields, n) = match (self.version, self.options) {
            (Version::Ipfix, false) | (Version::NetflowV9, false) => (0, usize::from(count)),
            (Version::Ipfix, true) => {
                Error::check_len(LAYER, 2, self.rest.len())?;
                let scope = be16(self.rest, 0);
                self.rest = &self.rest[2..];
                if scope == 0 || scope > count {
                    return Err(Error::Malformed { layer: LAYER, field: "scope field count" });
                }
                (scope, usize::from(count))
            }
            // v9: the second and third words are the scope and option lengths, in bytes.
            (Version::NetflowV9, true) => {
                Error::check_len(LAYER, 2, self.rest.len())?;
                let (scope_len, option_len) = (count, be16(self.rest, 0));
                self.rest = &self.rest[2..];
                let scope = scope_len / 4;
                (scope, usize::from(scope) + usize::from(option_len / 4))
            }
        };
        let fields = self.fields(n, self.version == Version::Ipfix)?;
        Ok(TemplateRecord::Define(Template { id, scope_fields, fields, options: self.options }))
    }
}

impl Iterator for TemplateRecords<'_> {
    type Item = Result<TemplateRecord>;

    fn next(&mut self) -> Option<Result<TemplateRecord>> {
        // Fewer bytes than a record header: the set's padding.
        if self.rest.len() < 4 {
            self.rest = &[];
            return None;
        }
        let r = self.read();
        if r.is_err() {
            self.rest = &[];
        }
        Some(r)
    }
}

/// The data records of a set.
#[derive(Debug, Clone)]
pub struct DataRecords<'a, 't> {
    rest: &'a [u8],
    template: &'t Template,
    min_len: usize,
}

impl<'a, 't> DataRecords<'a, 't> {
    /// The records of a data set's `body` (kept from an earlier message, say), read with
    /// `template`.
    pub fn new(body: &'a [u8], template: &'t Template) -> DataRecords<'a, 't> {
        DataRecords { rest: body, template, min_len: template.min_record_len() }
    }
}

impl<'a, 't> Iterator for DataRecords<'a, 't> {
    type Item = Result<DataRecord<'a, 't>>;

    fn next(&mut self) -> Option<Result<DataRecord<'a, 't>>> {
        // Less than the shortest record left: padding. A template whose records take no
        // bytes at all has no records.
        if self.min_len == 0 || self.rest.len() < self.min_len {
            self.rest = &[];
            return None;
        }
        let mut at = 0;
        for f in &self.template.fields {
            match field_len(f, &self.rest[at..]) {
                Ok((skip, len)) => at += skip + len,
                Err(e) => {
                    self.rest = &[];
                    return Some(Err(e));
                }
            }
        }
        let (bytes, rest) = self.rest.split_at(at);
        self.rest = rest;
        Some(Ok(DataRecord { bytes, template: self.template }))
    }
}

/// The length prefix and value length of field `f` at the start of `buf`.
fn field_len(f: &FieldSpec, buf: &[u8]) -> Result<(usize, usize)> {
    let (skip, len) = if f.len != VARIABLE_LENGTH {
        (0, usize::from(f.len))
    } else {
        match buf.first() {
            None => return Err(Error::Truncated { layer: LAYER, need: 1, have: 0 }),
            Some(255) => {
                Error::check_len(LAYER, 3, buf.len())?;
                (3, usize::from(be16(buf, 1)))
            }
            Some(&n) => (1, usize::from(n)),
        }
    };
    if skip + len > buf.len() {
        return Err(Error::BadLength { layer: LAYER, field: "field length", value: len });
    }
    Ok((skip, len))
}

/// One data record: its bytes and the template that reads them.
#[derive(Debug, Clone, Copy)]
pub struct DataRecord<'a, 't> {
    bytes: &'a [u8],
    template: &'t Template,
}

impl<'a, 't> DataRecord<'a, 't> {
    /// Each field and its value's bytes, in template order.
    pub fn fields(&self) -> impl Iterator<Item = (&'t FieldSpec, &'a [u8])> + '_ {
        let mut rest = self.bytes;
        self.template.fields.iter().map(move |f| {
            // The record was measured when it was read: every field is there.
            let (skip, len) = field_len(f, rest).unwrap_or((0, 0));
            let v = &rest[skip..skip + len];
            rest = &rest[skip + len..];
            (f, v)
        })
    }

    /// The template.
    pub fn template(&self) -> &'t Template {
        self.template
    }
}

/// An element's abstract data type (RFC 7012 §3.1), which says how its bytes read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// unsigned8 … unsigned64 (any length up to 8: reduced-size encoding).
    Unsigned,
    /// signed8 … signed64.
    Signed,
    /// float32, float64.
    Float,
    /// boolean (1 true, 2 false).
    Boolean,
    /// macAddress.
    MacAddress,
    /// string (UTF-8).
    String,
    /// dateTimeSeconds.
    Seconds,
    /// dateTimeMilliseconds.
    Milliseconds,
    /// dateTimeMicroseconds (NTP format).
    Microseconds,
    /// dateTimeNanoseconds (NTP format).
    Nanoseconds,
    /// ipv4Address.
    Ipv4Address,
    /// ipv6Address.
    Ipv6Address,
    /// octetArray, and anything unknown.
    OctetArray,
    /// basicList, subTemplateList, subTemplateMultiList (RFC 6313): kept as bytes.
    List,
}

/// A field's value, read by its element's data type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    /// An unsigned integer.
    Unsigned(u64),
    /// A signed integer.
    Signed(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Boolean(bool),
    /// A MAC address.
    Mac([u8; 6]),
    /// An IPv4 address.
    V4(Ipv4Addr),
    /// An IPv6 address.
    V6(Ipv6Addr),
    /// A time, nanoseconds since the Unix epoch.
    Time(u64),
    /// A string (bytes that are not UTF-8 come as [`Value::Bytes`]).
    Text(&'a str),
    /// Bytes.
    Bytes(&'a [u8]),
}

/// Seconds from the NTP epoch (1900) to the Unix epoch (1970).
const NTP_TO_UNIX: u64 = 2_208_988_800;

impl<'a> Value<'a> {
    /// Reads `bytes` as a `ty`; a length the type cannot have gives the bytes.
    pub fn read(ty: DataType, bytes: &'a [u8]) -> Value<'a> {
        let n = bytes.len();
        let int = || bytes.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b));
        match ty {
            DataType::Unsigned if (1..=8).contains(&n) => Value::Unsigned(int()),
            DataType::Signed if (1..=8).contains(&n) => {
                let shift = 64 - 8 * n as u32;
                Value::Signed(((int() << shift) as i64) >> shift)
            }
            DataType::Float if n == 4 => Value::Float(f64::from(f32::from_bits(int() as u32))),
            DataType::Float if n == 8 => Value::Float(f64::from_bits(int())),
            DataType::Boolean if n == 1 => Value::Boolean(bytes[0] == 1),
            DataType::MacAddress if n == 6 => {
                let mut m = [0; 6];
                m.copy_from_slice(bytes);
                Value::Mac(m)
            }
            DataType::Ipv4Address if n == 4 => Value::V4(Ipv4Addr::from(int() as u32)),
            DataType::Ipv6Address if n == 16 => {
                let mut a = [0; 16];
                a.copy_from_slice(bytes);
                Value::V6(Ipv6Addr::from(a))
            }
            DataType::Seconds if n == 4 => Value::Time(int() * 1_000_000_000),
            DataType::Milliseconds if n == 8 => Value::Time(int().saturating_mul(1_000_000)),
            DataType::Microseconds | DataType::Nanoseconds if n == 8 => {
                let (secs, frac) = (int() >> 32, int() & 0xffff_ffff);
                // The microseconds type ignores the fraction's lowest 11 bits (RFC 7011 §6.1.9).
                let frac = if ty == DataType::Microseconds { frac & !0x7ff } else { frac };
                Value::Time(
                    secs.saturating_sub(NTP_TO_UNIX) * 1_000_000_000
                        + ((frac * 1_000_000_000) >> 32),
                )
            }
            DataType::String => match std::str::from_utf8(bytes) {
                Ok(s) => Value::Text(s),
                Err(_) => Value::Bytes(bytes),
            },
            _ => Value::Bytes(bytes),
        }
    }
}

/// An IANA element by id: its name and data type (IANA's registry, [`iana`]).
pub fn iana(id: u16) -> Option<(&'static str, DataType)> {
    let els = iana::ELEMENTS;
    els.binary_search_by_key(&id, |e| e.0).ok().map(|i| (els[i].1, els[i].2))
}

/// How a field's value reads: IANA's elements (and RFC 5103 reverse elements) by the
/// registry, others by their length (up to 8 bytes unsigned, else bytes).
pub fn value<'a>(f: &FieldSpec, bytes: &'a [u8]) -> Value<'a> {
    let ty = match f.enterprise {
        0 | REVERSE_PEN => iana(f.id).map(|e| e.1),
        _ => None,
    };
    Value::read(
        ty.unwrap_or(if bytes.len() <= 8 { DataType::Unsigned } else { DataType::OctetArray }),
        bytes,
    )
}

/// The templates of one exporter's observation domain (RFC 7011 §8): defined, redefined and
/// withdrawn in wire order.
///
/// Templates are shared (`Arc`): the templates a restarted collector restores are held once,
/// however many decoders start from them.
#[derive(Debug, Clone, Default)]
pub struct Templates {
    by_id: HashMap<u16, Arc<Template>>,
}

impl Templates {
    /// No templates.
    pub fn new() -> Templates {
        Templates::default()
    }

    /// Applies one template record.
    pub fn apply(&mut self, r: TemplateRecord) {
        self.apply_replacing(r);
    }

    /// Applies one template record; returns the templates it replaced or withdrew.
    pub fn apply_replacing(&mut self, r: TemplateRecord) -> Vec<Arc<Template>> {
        match r {
            TemplateRecord::Define(t) => self.insert(Arc::new(t)).into_iter().collect(),
            TemplateRecord::Withdraw(id) => self.by_id.remove(&id).into_iter().collect(),
            TemplateRecord::WithdrawAll { options } => {
                let gone: Vec<u16> =
                    self.by_id.values().filter(|t| t.options == options).map(|t| t.id).collect();
                gone.iter().filter_map(|id| self.by_id.remove(id)).collect()
            }
        }
    }

    /// Defines (or redefines) a template held elsewhere too; returns the one it replaced.
    pub fn insert(&mut self, t: Arc<Template>) -> Option<Arc<Template>> {
        self.by_id.insert(t.id, t)
    }

    /// The template with this id.
    pub fn get(&self, id: u16) -> Option<&Template> {
        self.by_id.get(&id).map(|t| &**t)
    }

    /// The template with this id, shared.
    pub fn get_shared(&self, id: u16) -> Option<Arc<Template>> {
        self.by_id.get(&id).cloned()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// None at all.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Every template.
    pub fn iter(&self) -> impl Iterator<Item = &Template> {
        self.by_id.values().map(|t| &**t)
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Writes one IPFIX message (RFC 7011 §3): the header, then sets one after another, each
/// closed (its length written) when the next begins or the message is finished.
///
/// Template records are written as §3.4.1 and §3.4.2.2 lay them out (the enterprise bit and
/// number for an enterprise-specific element); data records are the caller's bytes, laid out
/// as their template says (see [`put_variable`] for variable-length fields).
#[derive(Debug, Clone)]
pub struct MessageWriter {
    buf: Vec<u8>,
    /// The open set: where it starts, and its id.
    open: Option<(usize, u16)>,
    records: u32,
}

impl MessageWriter {
    /// A message of observation domain `domain`; `sequence` counts the data records sent
    /// before it in that domain (§3.1).
    pub fn new(export_time: u32, sequence: u32, domain: u32) -> MessageWriter {
        let mut buf = Vec::with_capacity(1500);
        buf.extend_from_slice(&IPFIX_VERSION.to_be_bytes());
        buf.extend_from_slice(&[0, 0]);
        buf.extend_from_slice(&export_time.to_be_bytes());
        buf.extend_from_slice(&sequence.to_be_bytes());
        buf.extend_from_slice(&domain.to_be_bytes());
        MessageWriter { buf, open: None, records: 0 }
    }

    fn open_set(&mut self, id: u16) {
        if self.open.map(|(_, open)| open) == Some(id) {
            return;
        }
        self.close_set();
        self.open = Some((self.buf.len(), id));
        self.buf.extend_from_slice(&id.to_be_bytes());
        self.buf.extend_from_slice(&[0, 0]);
    }

    fn close_set(&mut self) {
        if let Some((at, _)) = self.open.take() {
            let len = (self.buf.len() - at) as u16;
            self.buf[at + 2..at + 4].copy_from_slice(&len.to_be_bytes());
        }
    }

    /// Adds a template record: to a template set (id 2), or to an options template set (id 3)
    /// when `t.options`.
    pub fn template(&mut self, t: &Template) {
        self.open_set(if t.options { 3 } else { 2 });
        self.buf.extend_from_slice(&t.id.to_be_bytes());
        self.buf.extend_from_slice(&(t.fields.len() as u16).to_be_bytes());
        if t.options {
            self.buf.extend_from_slice(&t.scope_fields.to_be_bytes());
        }
        for f in &t.fields {
            let id = if f.enterprise != 0 { f.id | 0x8000 } else { f.id };
            self.buf.extend_from_slice(&id.to_be_bytes());
            self.buf.extend_from_slice(&f.len.to_be_bytes());
            if f.enterprise != 0 {
                self.buf.extend_from_slice(&f.enterprise.to_be_bytes());
            }
        }
    }

    /// Adds a template withdrawal (§8.1): of template `id`, from a template set, or an options
    /// template set when `options`.
    pub fn withdraw(&mut self, id: u16, options: bool) {
        self.open_set(if options { 3 } else { 2 });
        self.buf.extend_from_slice(&id.to_be_bytes());
        self.buf.extend_from_slice(&[0, 0]);
    }

    /// Adds a data record of template `template` (a data set is opened when the last set was
    /// another one), its fields already encoded in `bytes`.
    pub fn record(&mut self, template: u16, bytes: &[u8]) {
        self.open_set(template);
        self.buf.extend_from_slice(bytes);
        self.records += 1;
    }

    /// Bytes written so far (the open set's header included).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing follows the header.
    pub fn is_empty(&self) -> bool {
        self.buf.len() == IPFIX_HEADER_LEN
    }

    /// Data records added: the next message's sequence number is this message's plus these.
    pub fn data_records(&self) -> u32 {
        self.records
    }

    /// The message.
    pub fn finish(mut self) -> Vec<u8> {
        self.close_set();
        let len = self.buf.len() as u16;
        self.buf[2..4].copy_from_slice(&len.to_be_bytes());
        self.buf
    }
}

/// Appends a variable-length field's value (RFC 7011 §7): a one-byte length up to 254 bytes,
/// 255 and a two-byte length beyond (at most 65,535 bytes; longer values are cut).
pub fn put_variable(buf: &mut Vec<u8>, value: &[u8]) {
    let value = &value[..value.len().min(usize::from(u16::MAX))];
    if value.len() < 255 {
        buf.push(value.len() as u8);
    } else {
        buf.push(255);
        buf.extend_from_slice(&(value.len() as u16).to_be_bytes());
    }
    buf.extend_from_slice(value);
}

#[cfg(test)]
mod writer_tests {
    use super::*;

    #[test]
    fn a_written_message_reads_back_in_wire_order() {
        let plain = Template {
            id: 256,
            scope_fields: 0,
            options: false,
            fields: vec![
                FieldSpec { id: 8, enterprise: 0, len: 4 },
                FieldSpec { id: 2, enterprise: 0, len: 8 },
                FieldSpec { id: 1, enterprise: 32473, len: 8 },
                FieldSpec { id: 82, enterprise: 0, len: VARIABLE_LENGTH },
            ],
        };
        let options = Template {
            id: 257,
            scope_fields: 1,
            options: true,
            fields: vec![
                FieldSpec { id: 149, enterprise: 0, len: 4 },
                FieldSpec { id: 305, enterprise: 0, len: 4 },
            ],
        };
        let mut w = MessageWriter::new(1_700_000_000, 40, 7);
        w.template(&plain);
        w.template(&options);
        let long = vec![b'x'; 300];
        for name in [&b"eth0"[..], &long] {
            let mut r = Vec::new();
            r.extend_from_slice(&[192, 0, 2, 1]);
            r.extend_from_slice(&5u64.to_be_bytes());
            r.extend_from_slice(&9u64.to_be_bytes());
            put_variable(&mut r, name);
            w.record(256, &r);
        }
        w.record(257, &[0, 0, 0, 7, 0, 0, 0, 64]);
        w.withdraw(256, false);
        assert_eq!(w.data_records(), 3);
        let bytes = w.finish();

        let m = Message::parse(&bytes).unwrap();
        assert_eq!(usize::from(be16(&bytes, 2)), bytes.len());
        assert_eq!(
            (m.header.export_time, m.header.sequence, m.header.domain),
            (1_700_000_000, 40, 7)
        );
        let sets: Vec<Set> = m.sets().map(|s| s.unwrap()).collect();
        let kinds: Vec<SetKind> = sets.iter().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            [
                SetKind::Template,
                SetKind::OptionsTemplate,
                SetKind::Data(256),
                SetKind::Data(257),
                SetKind::Template
            ]
        );
        let got: Vec<TemplateRecord> = sets[0].templates().map(|t| t.unwrap()).collect();
        assert_eq!(got, [TemplateRecord::Define(plain.clone())]);
        let got: Vec<TemplateRecord> = sets[1].templates().map(|t| t.unwrap()).collect();
        assert_eq!(got, [TemplateRecord::Define(options.clone())]);
        let names: Vec<Vec<u8>> = sets[2]
            .records(&plain)
            .map(|r| r.unwrap().fields().last().unwrap().1.to_vec())
            .collect();
        assert_eq!(names, [b"eth0".to_vec(), long]);
        let got: Vec<TemplateRecord> = sets[4].templates().map(|t| t.unwrap()).collect();
        assert_eq!(got, [TemplateRecord::Withdraw(256)]);
    }
}
