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

/// [`DenseTransform::Log1p`] of the small whole numbers (most of a count column's values),
/// computed once: [`Log1pTable::dense_value`] reads it instead of calling `ln_1p`, with the
/// very same bits.
#[derive(Clone)]
pub(super) struct Log1pTable(Box<[f32]>);

impl Log1pTable {
    /// Whole numbers `0..SMALL` are in the table.
    const SMALL: usize = 1024;

    pub(super) fn new() -> Log1pTable {
        Log1pTable(
            (0..Self::SMALL)
                .map(|i| DenseTransform::Log1p.apply(i as f64))
                .collect(),
        )
    }

    /// [`dense_value`]: from the table for `Log1p` of `+0..SMALL` in whole numbers (the bits
    /// of a non-negative double order as its value; `-0`, negatives and NaN are above the
    /// bound), computed otherwise.
    #[inline]
    pub(super) fn dense_value(&self, transform: DenseTransform, x: f64) -> Option<f32> {
        if transform == DenseTransform::Log1p
            && x.to_bits() < (Self::SMALL as f64).to_bits()
            && x.fract() == 0.0
        {
            return Some(self.0[x as usize]);
        }
        dense_value(transform, x)
    }
}

impl std::fmt::Debug for Log1pTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Log1pTable(0..{})", self.0.len())
    }
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
