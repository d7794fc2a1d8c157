//! A column's value as a reader hands it to [`LineParser::parse_cells`](super::LineParser):
//! the text its line would hold, or a decoded value that stands for exactly that text (a
//! Parquet number, a dictionary entry with its hash computed once), so a columnar reader
//! skips writing the text and parsing it back while every rule stays the text parser's.

use std::io::Write;

use super::values::{parse_label, parse_number};
use crate::ids::{feature_id, id_of_hash, missing_id};

/// Bytes enough for the text of any `f64` (the longest, a subnormal, is 327).
const FLOAT_TEXT: usize = 512;

/// One column's value of a row.
///
/// Each variant stands for one text (see [`Cell::write_text`]) and every use of it gives
/// what that text gives the text parser: the same ids, numbers, labels and bad values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cell<'v> {
    /// The value's text (empty: missing).
    Text(&'v [u8]),
    /// A non-empty text and its [`value_hash`](crate::ids::value_hash), computed once for
    /// every row that holds it (a Parquet dictionary entry).
    Hashed(&'v [u8], u64),
    /// An integer: its decimal text.
    Int(i64),
    /// An unsigned integer: its decimal text.
    UInt(u64),
    /// A float: its text is nothing for NaN (missing), the integer's text for a nonzero whole
    /// number below 2^53, else its shortest round-trip text (Rust's `Display`, `inf`, `-0`).
    Float(f64),
}

impl<'v> Cell<'v> {
    /// Missing: the empty text.
    pub const MISSING: Cell<'static> = Cell::Text(b"");

    /// Whether the value is missing (its text is empty).
    #[inline]
    pub fn is_empty(self) -> bool {
        match self {
            Cell::Text(t) | Cell::Hashed(t, _) => t.is_empty(),
            Cell::Float(x) => x.is_nan(),
            Cell::Int(_) | Cell::UInt(_) => false,
        }
    }

    /// Appends the value's text.
    pub fn write_text(self, out: &mut impl Write) {
        // A write to a Vec cannot fail; to a slice, only past its end (sized above).
        let _ = match self {
            Cell::Text(t) | Cell::Hashed(t, _) => out.write_all(t),
            Cell::Int(i) => write!(out, "{i}"),
            Cell::UInt(u) => write!(out, "{u}"),
            Cell::Float(x) if x.is_nan() => Ok(()),
            Cell::Float(x) if x.fract() == 0.0 && x.abs() < (1u64 << 53) as f64 && x != 0.0 => {
                write!(out, "{}", x as i64)
            }
            Cell::Float(x) => write!(out, "{x}"),
        };
    }

    /// `f(text)`, the text written to the stack for a number.
    #[inline]
    pub fn with_text<R>(self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Cell::Text(t) | Cell::Hashed(t, _) => f(t),
            _ => {
                let mut buf = [0u8; FLOAT_TEXT];
                let mut w: &mut [u8] = &mut buf;
                self.write_text(&mut w);
                let n = FLOAT_TEXT - w.len();
                f(&buf[..n])
            }
        }
    }

    /// [`parse_number`] of the text: the number, `None` for anything else (a non-number, a
    /// non-finite float, the empty value).
    #[inline]
    pub fn number(self) -> Option<f64> {
        match self {
            Cell::Text(t) | Cell::Hashed(t, _) => parse_number(t),
            // `as` rounds to nearest as the text's parse does (exact up to 2^53).
            Cell::Int(i) => Some(i as f64),
            Cell::UInt(u) => Some(u as f64),
            // The shortest round-trip text parses back to `x`, except `-0`, which parses as
            // the integer 0 (+ 0.0 makes -0 +0 and keeps every other value).
            Cell::Float(x) => x.is_finite().then_some(x + 0.0),
        }
    }

    /// [`parse_label`] of the text.
    #[inline]
    pub fn label(self) -> Option<f32> {
        match self {
            Cell::Text(t) | Cell::Hashed(t, _) => parse_label(t),
            Cell::Int(i) => label_of(i as f64),
            Cell::UInt(u) => label_of(u as f64),
            Cell::Float(x) => label_of(x),
        }
    }

    /// The id of the value in field `tag`: [`feature_id`] of the text, the missing id for the
    /// empty text.
    #[inline]
    pub fn id(self, tag: u8) -> u64 {
        match self {
            Cell::Hashed(t, hash) if !t.is_empty() => id_of_hash(tag, hash),
            Cell::Text(t) | Cell::Hashed(t, _) if t.is_empty() => missing_id(tag),
            Cell::Text(t) | Cell::Hashed(t, _) => feature_id(tag, t),
            Cell::Int(i) => feature_id(tag, itoa(i < 0, i.unsigned_abs(), &mut [0; 20])),
            Cell::UInt(u) => feature_id(tag, itoa(false, u, &mut [0; 20])),
            Cell::Float(x) if x.is_nan() => missing_id(tag),
            Cell::Float(_) => self.with_text(|t| feature_id(tag, t)),
        }
    }
}

/// A label equal to 0 or 1 (NaN and everything else: `None`).
#[inline]
fn label_of(x: f64) -> Option<f32> {
    if x == 0.0 {
        Some(0.0)
    } else if x == 1.0 {
        Some(1.0)
    } else {
        None
    }
}

/// The decimal text of `-u` (`neg`) or `u`, written at the end of `buf` (20 bytes hold
/// `u64::MAX` and, with the sign, `i64::MIN`'s 19 digits).
#[inline]
fn itoa(neg: bool, mut u: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if neg {
        at -= 1;
        buf[at] = b'-';
    }
    &buf[at..]
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ids::value_hash;
    use crate::parse::values::parse_sample_weight;

    fn text(c: Cell<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        c.write_text(&mut out);
        out
    }

    /// Every use of `c` gives what its text gives.
    fn same_as_text(c: Cell<'_>) {
        let t = text(c);
        assert_eq!(c.with_text(|w| w.to_vec()), t, "{c:?}");
        assert_eq!(c.is_empty(), t.is_empty(), "{c:?}");
        let (got, want) = (c.number(), parse_number(&t));
        assert_eq!(got.map(f64::to_bits), want.map(f64::to_bits), "{c:?}");
        assert_eq!(c.label(), parse_label(&t), "{c:?}");
        let want = if t.is_empty() {
            missing_id(7)
        } else {
            feature_id(7, &t)
        };
        assert_eq!(c.id(7), want, "{c:?}");
        assert_eq!(
            c.with_text(parse_sample_weight),
            parse_sample_weight(&t),
            "{c:?}"
        );
    }

    #[test]
    fn float_texts_are_the_text_writers() {
        assert_eq!(text(Cell::Float(2.5)), b"2.5");
        assert_eq!(text(Cell::Float(3.0)), b"3");
        assert_eq!(text(Cell::Float(-0.0)), b"-0");
        assert_eq!(text(Cell::Float(0.0)), b"0");
        assert_eq!(text(Cell::Float(f64::NAN)), b"");
        assert_eq!(text(Cell::Float(f64::NEG_INFINITY)), b"-inf");
        assert_eq!(text(Cell::Int(i64::MIN)), i64::MIN.to_string().as_bytes());
        assert_eq!(text(Cell::UInt(u64::MAX)), u64::MAX.to_string().as_bytes());
        let tiny = text(Cell::Float(-f64::from_bits(1)));
        assert!(tiny.len() < FLOAT_TEXT && tiny.starts_with(b"-0.000"));
    }

    #[test]
    fn edge_values_are_their_text() {
        for x in [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.1,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::from_bits(1),
            -f64::from_bits(1),
            9007199254740992.0,
            9007199254740994.0,
            1e18,
            1e19,
            123456789012345680.0,
        ] {
            same_as_text(Cell::Float(x));
        }
        for i in [0, 1, -1, 2, i64::MIN, i64::MAX, 1 << 53, (1 << 53) + 1] {
            same_as_text(Cell::Int(i));
        }
        for u in [0, 1, 2, u64::MAX, (1 << 63) + 1] {
            same_as_text(Cell::UInt(u));
        }
        same_as_text(Cell::Hashed(b"abc", value_hash(b"abc")));
        same_as_text(Cell::Hashed(b"", value_hash(b"")));
    }

    proptest! {
        #[test]
        fn a_float_is_its_text(bits in any::<u64>()) {
            same_as_text(Cell::Float(f64::from_bits(bits)));
        }

        #[test]
        fn a_short_float_is_its_text(x in -1e6f64..1e6, digits in 0i32..6) {
            let scale = 10f64.powi(digits);
            same_as_text(Cell::Float((x * scale).round() / scale));
        }

        #[test]
        fn an_integer_is_its_text(i in any::<i64>(), u in any::<u64>(), small in -3i64..3) {
            same_as_text(Cell::Int(i));
            same_as_text(Cell::Int(small));
            same_as_text(Cell::UInt(u));
        }

        #[test]
        fn a_hashed_text_is_its_text(t in "[a-z0-9.-]{0,12}") {
            same_as_text(Cell::Hashed(t.as_bytes(), value_hash(t.as_bytes())));
            same_as_text(Cell::Text(t.as_bytes()));
        }
    }
}
