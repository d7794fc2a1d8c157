//! Inverted dropout with masks that are a pure function of where they apply: unit `j` of row
//! `row` (the row's index in the whole batch) in layer `layer` at optimizer step `step` of a
//! model seeded `seed` is kept iff a hash of those five numbers clears `rate`. So the masks do
//! not depend on threads or sharding, and a job resumed at a step draws the masks the
//! uninterrupted job would have.

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
        keep(self.row_hash(row), unit, rate)
    }
}

fn keep(row_hash: u64, unit: u64, rate: f32) -> bool {
    let u = (mix64(row_hash ^ unit.wrapping_mul(sparta_mix::GOLDEN_GAMMA)) >> 40) as f32
        / (1u64 << 24) as f32;
    u >= rate
}

/// Fills `mask` (`[rows, width]`) with `1 / (1 - rate)` for kept units and 0 for dropped ones;
/// local row `r` is batch row `row0 + r`.
pub fn fill_mask(mask: &mut [f32], width: usize, row0: usize, rate: f32, key: &DropoutKey) {
    let scale = 1.0 / (1.0 - rate);
    for (r, m) in mask.chunks_exact_mut(width).enumerate() {
        let h = key.row_hash((row0 + r) as u64);
        for (j, v) in m.iter_mut().enumerate() {
            *v = if keep(h, j as u64, rate) { scale } else { 0.0 };
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
