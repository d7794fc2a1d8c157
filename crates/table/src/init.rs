//! Deterministic initialisation of new rows from `(key, seed)`.

use crate::config::{Initializer, Optimizer};
use crate::hash::RowRng;

/// Fills the `dim` weights of a new row.
pub fn init_weights(init: &Initializer, key: u64, seed: u64, w: &mut [f32]) {
    match *init {
        Initializer::Zeros => w.fill(0.0),
        Initializer::Constant { value } => w.fill(value),
        Initializer::Uniform { low, high } => {
            let mut rng = RowRng::new(key, seed);
            for x in w.iter_mut() {
                *x = low + (high - low) * rng.next_f32();
            }
        }
        Initializer::Normal { mean, std } => {
            let mut rng = RowRng::new(key, seed);
            let mut i = 0;
            while i < w.len() {
                // Box-Muller; u1 in (0, 1] so ln is finite.
                let u1 = 1.0 - rng.next_f32();
                let u2 = rng.next_f32();
                let r = (-2.0 * u1.ln()).sqrt();
                let t = std::f32::consts::TAU * u2;
                w[i] = mean + std * r * t.cos();
                if i + 1 < w.len() {
                    w[i + 1] = mean + std * r * t.sin();
                }
                i += 2;
            }
        }
    }
}

/// Fills a new row: weights from the initializer, optimizer state at its initial value.
pub fn init_row(
    init: &Initializer,
    opt: &Optimizer,
    key: u64,
    seed: u64,
    dim: usize,
    row: &mut [f32],
) {
    let (w, state) = row.split_at_mut(dim);
    init_weights(init, key, seed, w);
    match *opt {
        Optimizer::Adagrad {
            initial_accumulator,
            ..
        }
        | Optimizer::RowWiseAdagrad {
            initial_accumulator,
            ..
        } => state.fill(initial_accumulator),
        Optimizer::Sgd { .. } | Optimizer::Adam { .. } | Optimizer::Ftrl { .. } => state.fill(0.0),
    }
}
