//! Dense transforms of a raw number ([`DenseTransform`], the legacy `log1p` of
//! [`parse_dense`]) and its bucket id.

use super::values::parse_number;
use super::MAX_ABS_DENSE;
use crate::features::DenseTransform;
use crate::ids::missing_id;

/// Id of value `x` cut at `boundaries` (ascending): bucket `i` = the number of boundaries
/// `<= x`, id `(tag << 56) | (i + 1)` (hash part 0 stays the missing id).
#[inline]
pub fn bucket_id(tag: u8, boundaries: &[f64], x: f64) -> u64 {
    let i = boundaries.partition_point(|&b| b <= x) as u64;
    missing_id(tag) | (i + 1)
}

/// `transform(x)` when `|x| <= MAX_ABS_DENSE` and the result is a finite f32.
#[inline]
pub(super) fn dense_value(transform: DenseTransform, x: f64) -> Option<f32> {
    if x.abs() > MAX_ABS_DENSE {
        return None;
    }
    let v = transform.apply(x);
    v.is_finite().then_some(v)
}

/// Parses a dense value and applies [`log_transform`](crate::batch::log_transform); empty is missing (0).
/// Accepts integers and finite floats of magnitude up to [`MAX_ABS_DENSE`]; anything else is
/// `None`.
#[inline]
pub fn parse_dense(s: &[u8]) -> Option<f32> {
    if s.is_empty() {
        return Some(0.0);
    }
    parse_number(s).and_then(|x| dense_value(DenseTransform::Log1p, x))
}
