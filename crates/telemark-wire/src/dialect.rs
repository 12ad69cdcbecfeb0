//! Rules of the INT and Telemetry Report specifications that real senders break.
//!
//! A strict parse rejects a packet that breaks one of these rules; a tolerant parse reads it the
//! way its sender evidently meant and records which rule was broken, so a collector can accept
//! bmv2's and CableLabs' reports and still say, per exporter, that they are not spec-clean.

/// How strictly a parser applies the specification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Reject anything the specification does not allow.
    #[default]
    Strict,
    /// Accept the known dialects and record each [`Deviation`].
    Tolerant,
}

/// One specification rule a packet breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Deviation {
    /// A v2.1 shim's Length counts the shim itself (CableLabs), as v1.0's did; INT v2.1
    /// §5.7.2 counts only the INT header and the stack.
    ShimLengthIncludesShim = 0,
    /// A v1.0 shim's Length does not count the shim; INT v1.0 §4.6.1 counts it.
    ShimLengthExcludesShim,
    /// The per-hop stack is not a whole number of hops of `Hop ML` words (INT v2.1 §5.8).
    StackNotWholeHops,
    /// `Hop ML` is larger than the instruction bitmap asks for although no domain-specific
    /// instructions explain the extra words, which are skipped (INT v2.1 §5.8).
    HopLengthExceedsInstructions,
    /// A report group header says version 1 but is laid out as version 2.0 (bmv2):
    /// Telemetry Report v2.0 §3.1 says Ver = 2.
    GroupVersionOne,
    /// An individual report's Report Length is 0 though contents follow; the contents are
    /// taken to run to the end of the datagram (Telemetry Report v2.0 §3.2).
    ReportLengthZero,
    /// Report Length does not cover the inner packet that follows (CableLabs).
    ReportLengthShort,
    /// InType says IPv4 or IPv6 but the inner contents start with an Ethernet header
    /// (Telemetry Report v2.0 §3.2: InType 3 is Ethernet).
    InnerEthernetDespiteInType,
    /// RepType is 0 ("none") although INT contents follow (CableLabs transparent-security);
    /// their main contents are a fixed 12 bytes whatever RepMdBits says, and their sequence
    /// number is the 16 bits after the hardware ID.
    RepTypeNone,
    /// An INT-MX packet carries per-hop metadata after its header (bmv2 puts the reporting
    /// switch's metadata there); INT v2.1 §5.5 says INT-MX packets carry instructions only (§5.9).
    MxCarriesMetadata,
}

/// Number of [`Deviation`] values.
const COUNT: u8 = 10;

impl Deviation {
    /// Every deviation, in code order.
    pub const ALL: [Deviation; COUNT as usize] = [
        Deviation::ShimLengthIncludesShim,
        Deviation::ShimLengthExcludesShim,
        Deviation::StackNotWholeHops,
        Deviation::HopLengthExceedsInstructions,
        Deviation::GroupVersionOne,
        Deviation::ReportLengthZero,
        Deviation::ReportLengthShort,
        Deviation::InnerEthernetDespiteInType,
        Deviation::RepTypeNone,
        Deviation::MxCarriesMetadata,
    ];

    /// A stable snake_case name for counters and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Deviation::ShimLengthIncludesShim => "shim_length_includes_shim",
            Deviation::ShimLengthExcludesShim => "shim_length_excludes_shim",
            Deviation::StackNotWholeHops => "stack_not_whole_hops",
            Deviation::HopLengthExceedsInstructions => "hop_length_exceeds_instructions",
            Deviation::GroupVersionOne => "group_version_one",
            Deviation::ReportLengthZero => "report_length_zero",
            Deviation::ReportLengthShort => "report_length_short",
            Deviation::InnerEthernetDespiteInType => "inner_ethernet_despite_in_type",
            Deviation::RepTypeNone => "rep_type_none",
            Deviation::MxCarriesMetadata => "mx_carries_metadata",
        }
    }

    /// The rule broken, for an operator.
    pub const fn rule(self) -> &'static str {
        match self {
            Deviation::ShimLengthIncludesShim => {
                "INT v2.1 5.7.2: shim Length counts the INT header and the stack, not the shim"
            }
            Deviation::ShimLengthExcludesShim => {
                "INT v1.0 4.6.1: shim Length counts the shim, the INT header and the stack"
            }
            Deviation::StackNotWholeHops => {
                "INT v2.1 5.8: the stack is a whole number of hops of Hop ML words"
            }
            Deviation::HopLengthExceedsInstructions => {
                "INT v2.1 5.8: Hop ML is the metadata the instructions and DS instructions ask for"
            }
            Deviation::GroupVersionOne => "Telemetry Report v2.0 3.1: group header Ver is 2",
            Deviation::ReportLengthZero => {
                "Telemetry Report v2.0 3.2: Report Length covers the report's contents"
            }
            Deviation::ReportLengthShort => {
                "Telemetry Report v2.0 3.2: Report Length covers the inner packet"
            }
            Deviation::InnerEthernetDespiteInType => {
                "Telemetry Report v2.0 3.2: InType 4/5 contents start with the IP header"
            }
            Deviation::RepTypeNone => "Telemetry Report v2.0 3.2: INT contents have RepType 1",
            Deviation::MxCarriesMetadata => "INT v2.1 5.9: INT-MX packets carry no metadata stack",
        }
    }
}

/// The deviations one packet showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deviations(u16);

impl Deviations {
    /// No deviation.
    pub const NONE: Deviations = Deviations(0);

    /// Records `d`.
    pub fn insert(&mut self, d: Deviation) {
        self.0 |= 1 << d as u8;
    }
    /// Whether `d` was recorded.
    pub fn contains(self, d: Deviation) -> bool {
        self.0 & (1 << d as u8) != 0
    }
    /// Whether nothing was recorded.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// Adds everything in `other`.
    pub fn extend(&mut self, other: Deviations) {
        self.0 |= other.0;
    }
    /// The recorded deviations.
    pub fn iter(self) -> impl Iterator<Item = Deviation> {
        // Most packets break no rule: nothing to look through then.
        let all = if self.is_empty() { &[][..] } else { &Deviation::ALL[..] };
        all.iter().copied().filter(move |d| self.contains(*d))
    }
}

/// Either accepts a deviation (tolerant) or turns it into the strict error.
pub(crate) fn tolerate(
    mode: Mode,
    found: &mut Deviations,
    d: Deviation,
    strict: crate::Error,
) -> crate::Result<()> {
    match mode {
        Mode::Strict => Err(strict),
        Mode::Tolerant => {
            found.insert(d);
            Ok(())
        }
    }
}
