//! How a row's floats are stored: the embedding weights at the table's [`RowPrecision`]
//! (f32, f16 / bf16 packed two to a word, or int8 with a power-of-two scale per row), the
//! optimizer state always as f32.
//!
//! Outside the table a row is `[weights | state]` as f32 ([`Table::row_stride`] floats):
//! pulls, pushes, deltas and replication see f32 values, decoded from the stored ones. A
//! stored value decodes to an f32 exactly and encodes back to itself, so files can keep the
//! weights in their stored form ([`WeightBytes`]: checkpoint parts, exports, serving) and a
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
    /// 1 byte a weight and one 4-byte scale per row: the weights as integers in -127..=127
    /// times a power of two (the smallest that holds the row's largest weight).
    Int8,
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
            RowPrecision::Int8 => "int8",
        }
    }

    /// The number files record this precision by (checkpoint table parts, export dtypes):
    /// 0 = f32, 1 = f16, 2 = bf16, 3 = int8.
    pub fn code(self) -> u32 {
        match self {
            RowPrecision::F32 => 0,
            RowPrecision::F16 => 1,
            RowPrecision::Bf16 => 2,
            RowPrecision::Int8 => 3,
        }
    }

    /// The precision of [`RowPrecision::code`] `code`; `None` for an unknown number.
    pub fn from_code(code: u32) -> Option<RowPrecision> {
        match code {
            0 => Some(RowPrecision::F32),
            1 => Some(RowPrecision::F16),
            2 => Some(RowPrecision::Bf16),
            3 => Some(RowPrecision::Int8),
            _ => None,
        }
    }

    /// Bytes of `dim` weights in their stored form ([`WeightBytes`]): 4 a weight (f32), 2
    /// (f16, bf16), or 1 plus the row's 4-byte scale (int8).
    pub fn weight_bytes(self, dim: usize) -> usize {
        match self {
            RowPrecision::F32 => 4 * dim,
            RowPrecision::F16 | RowPrecision::Bf16 => 2 * dim,
            RowPrecision::Int8 => 4 + dim,
        }
    }
}

/// A row's weights in the bytes of their stored form, as files and serving keep them: the
/// table's stored words (little-endian) without their padding. f32: `dim` f32; f16 / bf16:
/// `dim` 16-bit values; int8: the scale (f32) then `dim` signed bytes. All little-endian.
///
/// Encoding a decoded row gives back the values it was decoded from (see the module docs),
/// so a row written from the table's decoded weights holds the table's stored values.
#[derive(Clone, Debug)]
pub struct WeightBytes {
    codec: RowCodec,
    words: Vec<u32>,
}

impl WeightBytes {
    /// The stored form of `dim` weights at `precision`.
    pub fn new(precision: RowPrecision, dim: usize) -> WeightBytes {
        let codec = RowCodec {
            precision,
            dim,
            state: 0,
        };
        WeightBytes {
            codec,
            words: vec![0; codec.stored_words()],
        }
    }

    /// The precision.
    pub fn precision(&self) -> RowPrecision {
        self.codec.precision
    }

    /// Weights per row.
    pub fn dim(&self) -> usize {
        self.codec.dim
    }

    /// Bytes of one row's weights.
    pub fn len(&self) -> usize {
        self.codec.precision.weight_bytes(self.codec.dim)
    }

    /// Whether a row's weights take no bytes (dim 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the stored form of `w` (`dim` weights) to `out`. Weights that are not
    /// values of the precision are rounded as a table write rounds them, by `seed`; the
    /// decoded weights of a stored row come back as they were, whatever the seed.
    pub fn encode(&mut self, w: &[f32], out: &mut Vec<u8>, seed: u64) {
        debug_assert_eq!(w.len(), self.codec.dim);
        self.codec.encode(w, &mut self.words, seed);
        let n = self.len();
        out.extend_from_slice(&bytemuck::cast_slice::<u32, u8>(&self.words)[..n]);
    }

    /// The weights of one row's stored bytes `bytes` ([`WeightBytes::len`] long) into `out`
    /// (`dim` floats).
    #[inline]
    pub fn decode(&self, bytes: &[u8], out: &mut [f32]) {
        debug_assert_eq!(bytes.len(), self.len());
        debug_assert_eq!(out.len(), self.codec.dim);
        match self.codec.precision {
            RowPrecision::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            RowPrecision::F16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f16_value(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            RowPrecision::Bf16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = bf16_value(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            RowPrecision::Int8 => {
                let scale = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                for (o, &q) in out.iter_mut().zip(&bytes[4..]) {
                    *o = int8_value(q, scale);
                }
            }
        }
    }
}

/// An f16 value's f32.
#[inline(always)]
fn f16_value(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
}

/// A bf16 value's f32 (exact: the top half of its bits).
#[inline(always)]
fn bf16_value(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// An int8 weight `q` of a row of scale `scale`.
#[inline(always)]
fn int8_value(q: u8, scale: f32) -> f32 {
    q as i8 as f32 * scale
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
            // The scale, then the bytes four a word.
            RowPrecision::Int8 => 1 + self.dim.div_ceil(4),
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
            RowPrecision::F32 => copy_words(&stored[..self.dim], out),
            RowPrecision::F16 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = f16_value(half_at(stored, i));
                }
            }
            RowPrecision::Bf16 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = bf16_value(half_at(stored, i));
                }
            }
            RowPrecision::Int8 => {
                let scale = f32::from_bits(stored[0]);
                let bytes: &[u8] = bytemuck::cast_slice(&stored[1..]);
                for (o, &q) in out.iter_mut().zip(bytes) {
                    *o = int8_value(q, scale);
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
            RowPrecision::Int8 => encode_int8(w, &mut stored[..ww], seed),
        }
        stored[ww..].copy_from_slice(bytemuck::cast_slice(s));
    }
}

/// The weights `w` as int8 with one power-of-two scale (`stored`: the scale's f32 bits, then
/// the bytes four a word): the scale is the smallest power of two `2^e` with `max |w| <=
/// 127 * 2^e`, each weight `w / 2^e` (exact: a power of two) rounded stochastically to an
/// integer. A decoded row (integers times a power of two) encodes back to the same values,
/// exactly: its largest integer is 63-127 (a scale one smaller when it is 63, the integers
/// doubled), so a checkpoint restores an int8 table's values bit for bit. A row with a
/// non-finite weight decodes as NaN (the trainer's checks then stop on it).
fn encode_int8(w: &[f32], stored: &mut [u32], seed: u64) {
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut stored[1..]);
    bytes.fill(0);
    if w.iter().any(|x| !x.is_finite()) {
        stored[0] = f32::NAN.to_bits();
        return;
    }
    let m = w.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = int8_scale(m);
    stored[0] = scale.to_bits();
    // Near the largest f32 (a scale of 2^122 or more) 127 * scale overflows: the integers
    // stop where their value stays finite (63 at 2^122), or a finite weight would decode as
    // an infinity, which no longer encodes back.
    let qmax = if scale > f32::MAX / 127.0 {
        (f32::MAX / scale).floor() as i32
    } else {
        127
    };
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut stored[1..]);
    let mut bits = seed;
    for (i, (&x, b)) in w.iter().zip(bytes.iter_mut()).enumerate() {
        if i % 2 == 0 {
            bits = crate::hash::mix64(bits.wrapping_add(0x9e37_79b9_7f4a_7c15));
        }
        let r = (bits >> (32 * (i % 2))) as u32;
        let v = x / scale;
        let lo = v.floor();
        // Up with probability v - lo (exact: |v| <= 127).
        let up = ((r as f64) < (v - lo) as f64 * 4_294_967_296.0) as i32;
        *b = (lo as i32 + up).clamp(-qmax, qmax) as i8 as u8;
    }
}

/// The smallest power of two `s` (a normal f32) with `m <= 127 * s`; 1 for `m == 0`.
fn int8_scale(m: f32) -> f32 {
    if m == 0.0 {
        return 1.0;
    }
    // m / 127 underflows to 0 for the smallest subnormals (log2 = -inf): start inside the
    // normal exponents, or the loop below would count up from i32::MIN.
    let mut e = ((m / 127.0).log2().ceil() as i32).clamp(-126, 127);
    // log2 of an f32 may be off by a unit: settle on the exact power.
    while e > -126 && m <= 127.0 * 2f32.powi(e - 1) {
        e -= 1;
    }
    while m > 127.0 * 2f32.powi(e) {
        e += 1;
    }
    2f32.powi(e.max(-126))
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

/// `out` filled with the f32 values whose bits `words` holds (as long as `out`). The common
/// widths as fixed-size arrays: a few vector moves, where a slice copy of a run-time length
/// calls `memcpy` (once per row pulled).
#[inline(always)]
fn copy_words(words: &[u32], out: &mut [f32]) {
    fn fixed<const D: usize>(words: &[u32], out: &mut [f32]) -> bool {
        match (<&[u32; D]>::try_from(words), <&mut [f32; D]>::try_from(out)) {
            (Ok(w), Ok(o)) => {
                *o = w.map(f32::from_bits);
                true
            }
            _ => false,
        }
    }
    let done = match out.len() {
        16 => fixed::<16>(words, out),
        32 => fixed::<32>(words, out),
        64 => fixed::<64>(words, out),
        _ => false,
    };
    if !done {
        out.copy_from_slice(bytemuck::cast_slice(words));
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

    proptest! {
        /// An int8 row: every weight within one scale unit of its value, the scale the
        /// smallest power of two that holds the largest weight, and the decoded row encodes
        /// back to the same values whatever the rounding seed (a checkpoint restore).
        #[test]
        fn an_int8_row_is_within_a_unit_and_survives_decode_and_encode(
            w in proptest::collection::vec(-100f32..100f32, 1..20),
            big in -30i32..30,
            seed in any::<u64>(),
            again in any::<u64>(),
        ) {
            let w: Vec<f32> = w.iter().map(|x| x * 2f32.powi(big)).collect();
            let c = codec(RowPrecision::Int8, w.len(), 0);
            let mut stored = vec![0u32; c.stored_words()];
            c.encode(&w, &mut stored, seed);
            let scale = f32::from_bits(stored[0]);
            let m = w.iter().fold(0f32, |m, x| m.max(x.abs()));
            prop_assert!(m <= 127.0 * scale && (m == 0.0 || m > 63.5 * scale), "{} {}", m, scale);
            let mut out = vec![0f32; w.len()];
            c.decode(&stored, &mut out);
            for (x, y) in w.iter().zip(&out) {
                prop_assert!((x - y).abs() < scale, "{} -> {} (scale {})", x, y, scale);
            }
            let mut stored2 = vec![0u32; c.stored_words()];
            c.encode(&out, &mut stored2, again);
            let mut out2 = vec![0f32; w.len()];
            c.decode(&stored2, &mut out2);
            prop_assert_eq!(out2, out);
        }
    }

    #[test]
    fn precision_codes_round_trip_and_unknown_ones_are_none() {
        for p in [
            RowPrecision::F32,
            RowPrecision::F16,
            RowPrecision::Bf16,
            RowPrecision::Int8,
        ] {
            assert_eq!(RowPrecision::from_code(p.code()), Some(p));
        }
        assert_eq!(RowPrecision::from_code(4), None);
        assert_eq!(RowPrecision::Int8.weight_bytes(16), 20);
        assert_eq!(RowPrecision::Bf16.weight_bytes(7), 14);
    }

    proptest! {
        /// The stored bytes of a row decode to exactly the values the table decodes its
        /// stored words to, and are the words' bytes without padding (f16, bf16; an int8
        /// row's values, whose scale may come out one smaller when its largest integer is 63).
        #[test]
        fn weight_bytes_hold_the_tables_stored_values_bit_for_bit(
            words in proptest::collection::vec(any::<u32>(), 1..12),
            dim in 1usize..20,
            code in 0u32..4,
            seed in any::<u64>(),
        ) {
            let p = RowPrecision::from_code(code).unwrap();
            let c = codec(p, dim, 0);
            // A stored row as a table write leaves it: encode a decoded (finite) row.
            let mut stored = vec![0u32; c.stored_words()];
            for (s, w) in stored.iter_mut().zip(words.iter().cycle()) {
                *s = *w;
            }
            if p == RowPrecision::Int8 {
                stored[0] = 2f32.powi((words[0] % 40) as i32 - 20).to_bits();
            }
            let mut row = vec![0f32; dim];
            c.decode_weights(&stored, &mut row);
            for x in row.iter_mut() {
                if !x.is_finite() {
                    *x = 0.25;
                }
            }
            c.encode(&row, &mut stored, 7);
            c.decode_weights(&stored, &mut row);
            let mut wb = WeightBytes::new(p, dim);
            let mut bytes = Vec::new();
            wb.encode(&row, &mut bytes, seed);
            prop_assert_eq!(bytes.len(), wb.len());
            let mut back = vec![0f32; dim];
            wb.decode(&bytes, &mut back);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&back), bits(&row));
            if p != RowPrecision::Int8 {
                let words_bytes: &[u8] = bytemuck::cast_slice(&stored);
                prop_assert_eq!(&bytes[..], &words_bytes[..bytes.len()]);
            }
        }
    }

    /// Weights so small that `max / 127` underflows to zero (subnormals) get the smallest
    /// normal scale at once (this once counted the exponent up from `i32::MIN`), and the
    /// largest finite ones a finite scale.
    #[test]
    fn int8_scales_of_extreme_rows_are_found_at_once() {
        assert_eq!(int8_scale(f32::from_bits(1)), 2f32.powi(-126));
        assert_eq!(int8_scale(f32::from_bits(300)), 2f32.powi(-126));
        let s = int8_scale(f32::MAX);
        assert!(s.is_finite() && f32::MAX <= 127.0 * s, "{s}");
        let c = codec(RowPrecision::Int8, 2, 0);
        let mut stored = vec![0u32; c.stored_words()];
        c.encode(&[f32::from_bits(1), -f32::from_bits(3)], &mut stored, 5);
        assert_eq!(f32::from_bits(stored[0]), 2f32.powi(-126));
    }

    /// A row whose largest weight is near `f32::MAX` (a scale of 2^122) decodes finite, and
    /// its decoded values encode back to themselves (found by the checkpoint's property test:
    /// -64 x 2^122 decoded as -inf, which encodes as NaN).
    #[test]
    fn an_int8_row_near_the_largest_f32_decodes_finite_and_encodes_back_exactly() {
        let c = codec(RowPrecision::Int8, 2, 0);
        let mut stored = vec![0u32; c.stored_words()];
        for seed in 0..64 {
            let row = [f32::from_bits(4286487081), 1.0e30];
            c.encode(&row, &mut stored, seed);
            let mut out = [0f32; 2];
            c.decode(&stored, &mut out);
            assert!(out.iter().all(|x| x.is_finite()), "seed {seed}: {out:?}");
            let mut again = vec![0u32; c.stored_words()];
            c.encode(&out, &mut again, seed + 1);
            let mut back = [0f32; 2];
            c.decode(&again, &mut back);
            assert_eq!(back.map(f32::to_bits), out.map(f32::to_bits), "seed {seed}");
        }
    }

    #[test]
    fn an_int8_row_with_a_non_finite_weight_decodes_as_nan() {
        let c = codec(RowPrecision::Int8, 3, 1);
        let mut stored = vec![0u32; c.stored_words()];
        c.encode(&[1.0, f32::INFINITY, 2.0, 0.5], &mut stored, 1);
        let mut out = [0f32; 4];
        c.decode(&stored, &mut out);
        assert!(out[..3].iter().all(|x| x.is_nan()));
        assert_eq!(out[3], 0.5, "the state stays f32");
        // dim 3: the scale and one word of bytes.
        assert_eq!(c.stored_words(), 3);
    }

    /// Updates far below half a unit are kept on average: 10,000 additions of 1e-4 to 1.0
    /// reach 2.0 on average, where rounding to nearest would stay at 1.0. Each addition
    /// rounds up by a unit `u` with probability 1e-4 / u, so one run ends at 2.0 give or take
    /// sqrt(10,000 x 1e-4 x u) = sqrt(u) (one standard deviation, `u` the largest unit on
    /// the way: bf16 2^-7, f16 2^-10, int8 2^-5 in a row whose other weight is 1.5); the mean
    /// of 16 runs with other random bits is within 4 standard deviations of it, sqrt(u).
    #[test]
    fn small_updates_add_up_on_average() {
        for (p, unit) in [
            (RowPrecision::Bf16, (-7f32).exp2()),
            (RowPrecision::F16, (-10f32).exp2()),
            (RowPrecision::Int8, (-5f32).exp2()),
        ] {
            let c = codec(p, 2, 0);
            let mut sum = 0.0;
            for run in 0..16u64 {
                let mut stored = vec![0u32; c.stored_words()];
                c.encode(&[1.0, 1.5], &mut stored, 0);
                let mut w = [0f32; 2];
                for step in 0..10_000u64 {
                    c.decode(&stored, &mut w);
                    w[0] += 1e-4;
                    c.encode(&w, &mut stored, (run << 32) | step);
                }
                c.decode(&stored, &mut w);
                assert_eq!(w[1], 1.5, "{p:?}");
                sum += w[0];
            }
            let mean = sum / 16.0;
            assert!((mean - 2.0).abs() < unit.sqrt(), "{p:?}: {mean}");
        }
    }
}
