//! Why a line is rejected.

use std::fmt;

use super::MAX_LINE_BYTES;

/// Why a line was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BadLine {
    /// Fewer columns than the schema has.
    TooFewColumns {
        /// Columns found.
        found: usize,
        /// Columns expected.
        expected: usize,
    },
    /// More columns than the schema has.
    TooManyColumns {
        /// Columns found.
        found: usize,
        /// Columns expected.
        expected: usize,
    },
    /// A label is not 0/1.
    BadLabel {
        /// Label column name.
        column: String,
    },
    /// A dense value is not a finite number, or its magnitude exceeds [`MAX_ABS_DENSE`](super::MAX_ABS_DENSE).
    BadDense {
        /// Dense column name.
        column: String,
    },
    /// A weighted bag item's weight (after the last weight separator) is not a finite number.
    BadWeight {
        /// Multi-sparse column name.
        column: String,
    },
    /// The sample weight is not a finite number `>= 0` (see [`parse_sample_weight`](super::parse_sample_weight)).
    BadSampleWeight {
        /// Weight column name.
        column: String,
    },
    /// The line is not valid UTF-8.
    InvalidUtf8,
    /// The line is longer than [`MAX_LINE_BYTES`].
    TooLong {
        /// Length in bytes (at least).
        len: usize,
    },
    /// A stream record (Kafka) holds a newline: one record must be one line.
    MultiLine,
}

impl fmt::Display for BadLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadLine::TooFewColumns { found, expected } => {
                write!(f, "too few columns ({found}, expected {expected})")
            }
            BadLine::TooManyColumns { found, expected } => {
                write!(f, "too many columns ({found}, expected {expected})")
            }
            BadLine::BadLabel { column } => write!(f, "label {column:?} is not 0 or 1"),
            BadLine::BadDense { column } => write!(f, "dense value {column:?} is not a number"),
            BadLine::BadWeight { column } => write!(
                f,
                "an item of {column:?} has a weight that is not a finite number"
            ),
            BadLine::BadSampleWeight { column } => {
                write!(f, "sample weight {column:?} is not a finite number >= 0")
            }
            BadLine::InvalidUtf8 => write!(f, "invalid UTF-8"),
            BadLine::MultiLine => write!(f, "a record holds a newline (one record is one line)"),
            BadLine::TooLong { len } => {
                write!(f, "line of {len} bytes exceeds {MAX_LINE_BYTES} bytes")
            }
        }
    }
}
