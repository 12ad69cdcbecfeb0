use core::fmt;

/// Why a header could not be read. Small and `Copy` so the fast path can count it cheaply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer ends before the fixed part of the header.
    Truncated {
        /// Which header.
        layer: &'static str,
        /// Bytes the header needs.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A length field points outside the buffer or below the fixed header size.
    BadLength {
        /// Which header.
        layer: &'static str,
        /// Which length field.
        field: &'static str,
        /// The value found.
        value: usize,
    },
    /// A version or other fixed field has a value this parser cannot read.
    Malformed {
        /// Which header.
        layer: &'static str,
        /// Which field.
        field: &'static str,
    },
    /// The checksum does not verify.
    Checksum {
        /// Which header.
        layer: &'static str,
    },
}

/// Result of a wire operation.
pub type Result<T> = core::result::Result<T, Error>;

impl Error {
    /// The header that failed.
    pub fn layer(&self) -> &'static str {
        match *self {
            Error::Truncated { layer, .. }
            | Error::BadLength { layer, .. }
            | Error::Malformed { layer, .. }
            | Error::Checksum { layer } => layer,
        }
    }

    pub(crate) fn check_len(layer: &'static str, need: usize, have: usize) -> Result<()> {
        if have < need {
            Err(Error::Truncated { layer, need, have })
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated { layer, need, have } => {
                write!(f, "{layer}: truncated, need {need} bytes, have {have}")
            }
            Error::BadLength { layer, field, value } => {
                write!(f, "{layer}: bad {field} {value}")
            }
            Error::Malformed { layer, field } => write!(f, "{layer}: unsupported {field}"),
            Error::Checksum { layer } => write!(f, "{layer}: checksum mismatch"),
        }
    }
}

impl std::error::Error for Error {}
