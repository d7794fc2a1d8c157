//! Scalar values of a line: labels, sample weights, item weights and raw numbers.

/// Parses an item weight: a finite float.
#[inline]
pub(super) fn parse_weight(s: &[u8]) -> Option<f32> {
    let w: f32 = std::str::from_utf8(s).ok()?.parse().ok()?;
    w.is_finite().then_some(w)
}

/// Parses a sample weight: a number that is finite (as an `f32`) and `>= 0` (`1`, `0.5`,
/// `2e-1`); the empty value is 1. `-0` is 0.
#[inline]
pub fn parse_sample_weight(s: &[u8]) -> Option<f32> {
    match s {
        b"" | b"1" => Some(1.0),
        b"0" => Some(0.0),
        _ => {
            // Parsed as f32 directly: the Parquet writer stores this f32, whose text reads
            // back as the same value.
            let w: f32 = std::str::from_utf8(s).ok()?.parse().ok()?;
            (w.is_finite() && w >= 0.0).then_some(w.abs())
        }
    }
}

/// Parses a label: `0`, `1`, or any number equal to 0 or 1 (`0.0`, `1.0`).
#[inline]
pub fn parse_label(s: &[u8]) -> Option<f32> {
    match s {
        b"0" => Some(0.0),
        b"1" => Some(1.0),
        _ => {
            let v: f64 = std::str::from_utf8(s).ok()?.parse().ok()?;
            if v == 0.0 {
                Some(0.0)
            } else if v == 1.0 {
                Some(1.0)
            } else {
                None
            }
        }
    }
}

/// Parses a non-empty raw number: an integer (fast path) or a finite float; anything else
/// (and the empty value) is `None`.
#[inline]
pub fn parse_number(s: &[u8]) -> Option<f64> {
    let (neg, digits) = match s.first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if !digits.is_empty() && digits.len() <= 18 {
        let mut v: i64 = 0;
        let mut all_digits = true;
        for &b in digits {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                all_digits = false;
                break;
            }
            v = v * 10 + d as i64;
        }
        if all_digits {
            let x = if neg { -v } else { v };
            return Some(x as f64);
        }
    }
    let v: f64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    v.is_finite().then_some(v)
}
