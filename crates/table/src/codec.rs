//! How a row's floats are stored: the embedding weights at the table's [`RowPrecision`]
//! (f32, or f16 / bf16 packed two to a word), the optimizer state always as f32.
//!
//! Outside the table a row is always `[weights | state]` as f32 ([`Table::row_stride`]
//! floats): pulls, pushes, checkpoints, deltas and replication see f32 values, decoded from
//! the stored ones. A 16-bit value decodes to an f32 exactly and encodes back to itself, so a
//! checkpoint restores a compact table bit for bit.
//!
//! Writing a weight that is not a 16-bit value (every push) rounds it **stochastically**: up
//! or down with probabilities that make the stored value right on average, so updates far
//! below half a unit in the last place (bf16 keeps 8 significant bits) are not all lost, as
//! round-to-nearest would lose them. The random bits come from the key and the row's version
//! stamp: the same pushes give the same rows.
//!
//! [`Table::row_stride`]: crate::Table::row_stride

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// How a table stores the embedding weights of a row (the optimizer state stays f32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowPrecision {
    /// 4 bytes per weight.
    #[default]
    F32,
    /// IEEE half: 2 bytes, 11 significant bits, |w| up to 65504.
    F16,
    /// bfloat16: 2 bytes, 8 significant bits, the f32 range.
    Bf16,
}

impl RowPrecision {
    /// Whether this is the default (f32).
    pub fn is_f32(&self) -> bool {
        *self == RowPrecision::F32
    }

    /// The name configs use.
    pub fn name(self) -> &'static str {
        match self {
            RowPrecision::F32 => "f32",
            RowPrecision::F16 => "f16",
            RowPrecision::Bf16 => "bf16",
        }
    }
}

/// The stored form of the rows of one table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowCodec {
    pub precision: RowPrecision,
    /// Weights per row.
    pub dim: usize,
    /// Optimizer-state floats per row.
    pub state: usize,
}

impl RowCodec {
    /// Stored 4-byte words per row (after the metadata words).
    pub fn stored_words(&self) -> usize {
        self.weight_words() + self.state
    }

    fn weight_words(&self) -> usize {
        match self.precision {
            RowPrecision::F32 => self.dim,
            RowPrecision::F16 | RowPrecision::Bf16 => self.dim.div_ceil(2),
        }
    }

    /// Whether rows are stored as their f32 values (no decoding).
    #[inline(always)]
    pub fn is_f32(&self) -> bool {
        self.precision == RowPrecision::F32
    }

    /// The weights of a stored row into `out` (`dim` floats).
    #[inline]
    pub fn decode_weights(&self, stored: &[u32], out: &mut [f32]) {
        match self.precision {
            RowPrecision::F32 => out.copy_from_slice(bytemuck::cast_slice(&stored[..self.dim])),
            RowPrecision::F16 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = f16::from_bits(half_at(stored, i)).to_f32();
                }
            }
            RowPrecision::Bf16 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = f32::from_bits((half_at(stored, i) as u32) << 16);
                }
            }
        }
    }

    /// A stored row into `out` (`dim + state` floats).
    #[inline]
    pub fn decode(&self, stored: &[u32], out: &mut [f32]) {
        let (w, s) = out.split_at_mut(self.dim);
        self.decode_weights(stored, w);
        s.copy_from_slice(bytemuck::cast_slice(&stored[self.weight_words()..]));
    }

    /// `row` (`dim + state` floats) into its stored form; `seed` picks the stochastic
    /// rounding of weights that are not 16-bit values (see the module docs).
    #[inline]
    pub fn encode(&self, row: &[f32], stored: &mut [u32], seed: u64) {
        let (w, s) = row.split_at(self.dim);
        let ww = self.weight_words();
        match self.precision {
            RowPrecision::F32 => stored[..ww].copy_from_slice(bytemuck::cast_slice(w)),
            RowPrecision::F16 | RowPrecision::Bf16 => {
                let mut bits = seed;
                for (k, pair) in w.chunks(2).enumerate() {
                    bits = crate::hash::mix64(bits.wrapping_add(0x9e37_79b9_7f4a_7c15));
                    let half = |x: f32, r: u32| match self.precision {
                        RowPrecision::F16 => f16_rounded(x, r),
                        _ => bf16_rounded(x, r),
                    };
                    let lo = half(pair[0], bits as u32) as u32;
                    let hi = pair
                        .get(1)
                        .map_or(0, |&x| half(x, (bits >> 32) as u32) as u32);
                    stored[k] = lo | hi << 16;
                }
            }
        }
        stored[ww..].copy_from_slice(bytemuck::cast_slice(s));
    }
}

/// The `i`-th 16-bit value of packed words (two per word, the lower half first).
#[inline(always)]
fn half_at(stored: &[u32], i: usize) -> u16 {
    (stored[i / 2] >> (16 * (i % 2))) as u16
}

/// `x` as bf16 bits, rounded stochastically by the random `r`: `x` itself when it is a bf16
/// value; non-finite values round to nearest.
fn bf16_rounded(x: f32, r: u32) -> u16 {
    if !x.is_finite() {
        return bf16::from_f32(x).to_bits();
    }
    // Adding a uniform value below one bf16 unit to the magnitude bits and truncating rounds
    // up with probability (distance to the lower value) / unit.
    let b = x.to_bits();
    let up = b.wrapping_add(r >> 16);
    if (up & 0x7f80_0000) == 0x7f80_0000 {
        // Rounded past the largest finite value: keep the largest finite one.
        return (b >> 16) as u16;
    }
    (up >> 16) as u16
}

/// `x` as f16 bits, rounded stochastically by the random `r` between the two f16 values
/// around it: `x` itself when it is an f16 value; beyond the f16 range and non-finite values
/// round to nearest (infinity).
fn f16_rounded(x: f32, r: u32) -> u16 {
    let h = f16::from_f32(x);
    let y = h.to_f32();
    if y == x || !x.is_finite() || !y.is_finite() {
        return h.to_bits();
    }
    // The f16 value on the other side of x.
    let bits = h.to_bits();
    let other = if y == 0.0 {
        if x > 0.0 {
            0x0001
        } else {
            0x8001
        }
    } else if (x > y) == (bits & 0x8000 == 0) {
        bits + 1
    } else {
        bits - 1
    };
    let z = f16::from_bits(other).to_f32();
    if !z.is_finite() {
        return bits;
    }
    // Round to `other` with probability |x - y| / |z - y|.
    let p = ((x - y) / (z - y)) as f64;
    if (r as f64) < p * 4_294_967_296.0 {
        other
    } else {
        bits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn codec(precision: RowPrecision, dim: usize, state: usize) -> RowCodec {
        RowCodec {
            precision,
            dim,
            state,
        }
    }

    #[test]
    fn stored_words_halve_the_weights() {
        assert_eq!(codec(RowPrecision::F32, 16, 16).stored_words(), 32);
        assert_eq!(codec(RowPrecision::F16, 16, 16).stored_words(), 24);
        assert_eq!(codec(RowPrecision::Bf16, 7, 1).stored_words(), 5);
    }

    proptest! {
        /// A row decoded from its stored form encodes back to the same words (what a
        /// checkpoint restore relies on), whatever the rounding seed.
        #[test]
        fn a_stored_row_survives_decode_and_encode(
            words in proptest::collection::vec(any::<u32>(), 9),
            seed in any::<u64>(),
            f16_row in any::<bool>(),
        ) {
            let p = if f16_row { RowPrecision::F16 } else { RowPrecision::Bf16 };
            let c = codec(p, 7, 5);
            // Finite 16-bit values only (NaN payloads are not kept).
            let mut stored = words.clone();
            let mut row = vec![0f32; 12];
            c.decode(&stored, &mut row);
            for x in row.iter_mut() {
                if !x.is_finite() {
                    *x = 0.5;
                }
            }
            c.encode(&row, &mut stored, 1);
            let mut again = vec![0f32; 12];
            c.decode(&stored, &mut again);
            prop_assert_eq!(&again, &row);
            let mut other = vec![0u32; 9];
            c.encode(&again, &mut other, seed);
            prop_assert_eq!(other, stored);
        }

        /// Stochastic rounding lands on one of the two 16-bit values around x.
        #[test]
        fn a_weight_rounds_to_a_neighbour(x in -60000f32..60000f32, r in any::<u32>()) {
            // Both f16 values around x are less than one f16 unit (at x) away from it.
            let h = f16::from_bits(f16_rounded(x, r)).to_f32();
            let unit = (x.abs().log2().floor() - 10.0).exp2().max((-24f32).exp2());
            prop_assert!((h - x).abs() < unit || h == x, "{} -> {} (unit {})", x, h, unit);
            let b = f32::from_bits((bf16_rounded(x, r) as u32) << 16);
            let lo = f32::from_bits(x.to_bits() & 0xffff_0000);
            let hi = f32::from_bits((x.to_bits() & 0xffff_0000).wrapping_add(0x1_0000));
            prop_assert!(b == lo || b == hi, "{} -> {}", x, b);
        }
    }

    /// Updates far below half a bf16 unit are kept on average: 10,000 additions of 1e-4 to
    /// 1.0 (a bf16 unit is 2^-7 there) reach 2.0 within 2%, where rounding to nearest would
    /// stay at 1.0.
    #[test]
    fn small_updates_add_up_on_average() {
        for p in [RowPrecision::Bf16, RowPrecision::F16] {
            let c = codec(p, 1, 0);
            let mut stored = [0u32; 1];
            c.encode(&[1.0], &mut stored, 0);
            let mut w = [0f32; 1];
            for step in 0..10_000u64 {
                c.decode(&stored, &mut w);
                w[0] += 1e-4;
                c.encode(&w, &mut stored, step);
            }
            c.decode(&stored, &mut w);
            assert!((w[0] - 2.0).abs() < 0.04, "{p:?}: {}", w[0]);
        }
    }
}
