//! Inverted dropout with masks that are a pure function of where they apply: unit `j` of row
//! `row` (the row's index in the whole batch) in layer `layer` at optimizer step `step` of a
//! model seeded `seed` is kept iff a hash of those five numbers clears `rate`. So the masks do
//! not depend on threads or sharding, and a job resumed at a step draws the masks the
//! uninterrupted job would have. One 64-bit hash serves four units (16 bits each, so the rate
//! is applied at 1/65536 resolution).

use sparta_mix::{mix64, splitmix64};

/// Where a mask applies (everything but the row and the unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropoutKey {
    /// The model's seed.
    pub seed: u64,
    /// Optimizer steps applied so far.
    pub step: u64,
    /// The layer's number inside the model (unique per dropout site).
    pub layer: u64,
}

impl DropoutKey {
    fn row_hash(&self, row: u64) -> u64 {
        let h = splitmix64(self.seed);
        let h = splitmix64(h ^ self.step);
        let h = splitmix64(h ^ self.layer);
        splitmix64(h ^ row)
    }

    /// Whether unit `unit` of batch row `row` is kept at drop rate `rate`.
    pub fn keep(&self, row: u64, unit: u64, rate: f32) -> bool {
        let h = unit_hash(self.row_hash(row), unit / 4);
        draw(h, unit % 4) >= threshold(rate)
    }
}

/// The hash shared by units `4 q .. 4 q + 4` of a row.
fn unit_hash(row_hash: u64, q: u64) -> u64 {
    mix64(row_hash ^ q.wrapping_mul(sparta_mix::GOLDEN_GAMMA))
}

/// Unit `4 q + k`'s 16-bit draw from its group's hash.
fn draw(h: u64, k: u64) -> u32 {
    ((h >> (16 * k)) & 0xFFFF) as u32
}

/// A unit is kept when its 16-bit draw is at least this (`rate` of the 65536 draws fall below).
fn threshold(rate: f32) -> u32 {
    (rate as f64 * 65536.0).round() as u32
}

/// Fills `mask` (`[rows, width]`) with `1 / (1 - rate)` for kept units and 0 for dropped ones;
/// local row `r` is batch row `row0 + r`.
pub fn fill_mask(mask: &mut [f32], width: usize, row0: usize, rate: f32, key: &DropoutKey) {
    let scale = 1.0 / (1.0 - rate);
    let th = threshold(rate);
    for (r, m) in mask.chunks_exact_mut(width).enumerate() {
        let rh = key.row_hash((row0 + r) as u64);
        for (q, group) in m.chunks_mut(4).enumerate() {
            let h = unit_hash(rh, q as u64);
            for (k, v) in group.iter_mut().enumerate() {
                *v = if draw(h, k as u64) >= th { scale } else { 0.0 };
            }
        }
    }
}

/// `x *= mask` elementwise (forward, and backward on the gradient).
pub fn apply_mask(x: &mut [f32], mask: &[f32]) {
    assert_eq!(x.len(), mask.len());
    for (v, &m) in x.iter_mut().zip(mask) {
        *v *= m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_keep_about_one_minus_rate_and_depend_on_every_key_part() {
        let key = DropoutKey {
            seed: 3,
            step: 10,
            layer: 2,
        };
        let (rows, w) = (64, 32);
        let mut m = vec![0.0; rows * w];
        fill_mask(&mut m, w, 0, 0.25, &key);
        let kept = m.iter().filter(|&&v| v > 0.0).count() as f64 / m.len() as f64;
        assert!((kept - 0.75).abs() < 0.04, "kept {kept}");
        assert!(m.iter().all(|&v| v == 0.0 || v == 1.0 / 0.75));
        for (i, &v) in m.iter().enumerate() {
            let (r, j) = ((i / w) as u64, (i % w) as u64);
            assert_eq!(key.keep(r, j, 0.25), v > 0.0);
        }
        // rows 8.. filled as a shard starting at row 8 equal the whole batch's rows 8..
        let mut tail = vec![0.0; (rows - 8) * w];
        fill_mask(&mut tail, w, 8, 0.25, &key);
        assert_eq!(&m[8 * w..], &tail[..]);
        for other in [
            DropoutKey { seed: 4, ..key },
            DropoutKey { step: 11, ..key },
            DropoutKey { layer: 3, ..key },
        ] {
            let mut o = vec![0.0; rows * w];
            fill_mask(&mut o, w, 0, 0.25, &other);
            assert_ne!(m, o, "{other:?}");
        }
        let mut none = vec![7.0; w];
        fill_mask(&mut none, w, 0, 0.0, &key);
        assert!(none.iter().all(|&v| v == 1.0));
    }
}
