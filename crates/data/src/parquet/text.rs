//! A value as the text its line would hold (see [`crate::parquet`]): one writer per kind of
//! value, shared by the Parquet decoder and the record batches handed in, so both give the
//! same text for the same value.

use std::fmt::Display;
use std::io::Write;

/// An integer as its decimal text.
pub(crate) fn write_int<T: Display>(v: T, out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail.
    let _ = write!(out, "{v}");
}

/// A float as its shortest round-trip decimal text (the text of the integer for a whole
/// number below 2^53, which is the same text, written faster); nothing for NaN, which is how
/// pandas writes a missing float: missing, as a null is.
pub(crate) fn write_float<T: Display + Copy + Into<f64>>(v: T, out: &mut Vec<u8>) {
    let x: f64 = v.into();
    if x.is_nan() {
        return;
    }
    // Writing to a Vec cannot fail.
    let _ = if x.fract() == 0.0 && x.abs() < (1u64 << 53) as f64 && x != 0.0 {
        write!(out, "{}", x as i64)
    } else {
        write!(out, "{v}")
    };
}

/// A boolean as `1` / `0`.
pub(crate) fn write_bool(v: bool, out: &mut Vec<u8>) {
    out.push(if v { b'1' } else { b'0' });
}

/// The projected values of a row joined by the line separator (for a bad-row report).
pub(crate) fn row_text(text: &[u8], spans: &[(usize, usize)], sep: u8) -> Vec<u8> {
    let mut line = Vec::with_capacity(text.len() + spans.len());
    for (k, &(a, b)) in spans.iter().enumerate() {
        if k > 0 {
            line.push(sep);
        }
        line.extend_from_slice(&text[a..b]);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float<T: Display + Copy + Into<f64>>(v: T) -> String {
        let mut out = Vec::new();
        write_float(v, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn floats_are_their_shortest_round_trip_text_and_nan_is_nothing() {
        assert_eq!(float(2.5f64), "2.5");
        assert_eq!(float(3.0f64), "3");
        assert_eq!(float(-0.0f64), "-0");
        assert_eq!(float(0.0f64), "0");
        assert_eq!(float(0.1f32), "0.1");
        assert_eq!(float(1e300f64), format!("{}", 1e300f64));
        assert_eq!(float(9007199254740992.0f64), "9007199254740992");
        assert_eq!(float(f64::NAN), "");
        assert_eq!(float(f32::INFINITY), "inf");
    }

    proptest::proptest! {
        #[test]
        fn a_double_cell_is_the_text_written_for_its_value(bits in proptest::prelude::any::<u64>(), i in proptest::prelude::any::<i64>()) {
            let x = f64::from_bits(bits);
            let mut cell = Vec::new();
            crate::parse::Cell::Float(x).write_text(&mut cell);
            proptest::prop_assert_eq!(String::from_utf8(cell).unwrap(), float(x));
            let whole = (i >> 10) as f64;
            let mut cell = Vec::new();
            crate::parse::Cell::Float(whole).write_text(&mut cell);
            proptest::prop_assert_eq!(String::from_utf8(cell).unwrap(), float(whole));
        }
    }
}
