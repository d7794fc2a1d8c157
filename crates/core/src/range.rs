//! Range checks of streamed `f32` values: whether every value is within a bound in magnitude
//! (finite, or not exploded), as one vectorized pass ([`all_within`]) or folded into a loop
//! that reads the values anyway ([`RangeCheck`]).

/// Whether every value is at most `limit` (a finite, non-negative bound) in magnitude; NaN
/// never is. One streaming pass that the baseline x86-64 build vectorizes (see
/// [`RangeCheck`]), so checking a step's values costs a fraction of the push that follows.
pub fn all_within(values: &[f32], limit: f32) -> bool {
    let mut check = RangeCheck::new(limit);
    check.add_all(values);
    check.ok()
}

/// A running "every value seen is within `limit` in magnitude" over values as they stream
/// past (a copy, a sum), so a check needs no pass of its own. Magnitude bits (the sign
/// cleared) order as the floats do, NaN above infinity, and fit in a non-negative `i32`:
/// `limit_bits - magnitude_bits` is negative exactly for a value out of range, and its sign
/// bit is OR-ed in. Subtract, mask and OR are plain SSE2 integer instructions (an unsigned
/// max is not; the baseline build emulates it), 16 lanes per step.
#[derive(Clone, Copy, Debug)]
pub struct RangeCheck {
    limit: i32,
    acc: [i32; RangeCheck::LANES],
}

impl RangeCheck {
    /// Lanes of [`RangeCheck::add_lanes`].
    pub const LANES: usize = 16;

    /// Nothing seen yet, within `limit` (finite, non-negative).
    #[inline]
    pub fn new(limit: f32) -> RangeCheck {
        debug_assert!(limit.is_finite() && limit >= 0.0);
        RangeCheck {
            limit: (limit.to_bits() & 0x7fff_ffff) as i32,
            acc: [0; RangeCheck::LANES],
        }
    }

    /// One value.
    #[inline(always)]
    pub fn add(&mut self, v: f32) {
        self.acc[0] |= self.limit - (v.to_bits() & 0x7fff_ffff) as i32;
    }

    /// [`RangeCheck::LANES`] values.
    #[inline(always)]
    pub fn add_lanes(&mut self, v: &[f32; RangeCheck::LANES]) {
        for (a, &x) in self.acc.iter_mut().zip(v) {
            *a |= self.limit - (x.to_bits() & 0x7fff_ffff) as i32;
        }
    }

    /// Values of any length (lanes at a time, then one by one).
    #[inline(always)]
    pub fn add_all(&mut self, values: &[f32]) {
        let mut chunks = values.chunks_exact(RangeCheck::LANES);
        for c in &mut chunks {
            self.add_lanes(c.try_into().expect("a chunk of LANES values"));
        }
        for &v in chunks.remainder() {
            self.add(v);
        }
    }

    /// Whether every value seen was within the limit.
    #[inline]
    pub fn ok(&self) -> bool {
        self.acc.iter().fold(0, |m, &a| m | a) >= 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition: every magnitude at most `limit`, NaN never.
    fn within(values: &[f32], limit: f32) -> bool {
        values.iter().all(|v| v.abs() <= limit)
    }

    /// Ordinary values and every special one: zeros of both signs, the bound itself and its
    /// neighbours, the largest and smallest floats, infinities, NaNs of both signs.
    fn value() -> impl Strategy<Value = f32> {
        prop_oneof![
            -2e8f32..2e8,
            Just(0.0f32),
            Just(-0.0f32),
            Just(1e8f32),
            Just(-1e8f32),
            Just(f32::from_bits(1e8f32.to_bits() + 1)),
            Just(f32::MAX),
            Just(f32::MIN),
            Just(f32::MIN_POSITIVE),
            Just(f32::INFINITY),
            Just(f32::NEG_INFINITY),
            Just(f32::NAN),
            Just(-f32::NAN),
        ]
    }

    proptest! {
        #[test]
        fn all_within_is_the_definition(
            values in proptest::collection::vec(value(), 0..80),
            limit in prop_oneof![Just(1e8f32), Just(f32::MAX), Just(0.0f32), 0.0f32..1e9],
        ) {
            prop_assert_eq!(all_within(&values, limit), within(&values, limit));
            // Folded in lanes, one by one, or mixed: the same verdict.
            let mut one = RangeCheck::new(limit);
            for &v in &values {
                one.add(v);
            }
            prop_assert_eq!(one.ok(), within(&values, limit));
        }
    }

    #[test]
    fn a_value_out_of_range_is_found_in_every_lane_and_the_tail() {
        for bad in [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            2e8,
            -1.0000001e8,
        ] {
            for len in [1, 15, 16, 17, 33, 100] {
                for at in 0..len {
                    let mut v = vec![-1e8f32; len];
                    v[at] = bad;
                    assert!(!all_within(&v, 1e8), "{bad} at {at} of {len}");
                    assert!(all_within(&v[..at], 1e8));
                }
            }
        }
        assert!(all_within(&[], 0.0));
        assert!(all_within(&[0.0, -0.0], 0.0));
        assert!(!all_within(&[f32::MIN_POSITIVE], 0.0));
    }
}
