//! Scalar reference implementations shared by the integration tests.
#![allow(dead_code)]

use sparta_table::{Initializer, Optimizer};

/// Independent scalar reference of one optimizer step on `[w | state]` (textbook formulas).
pub fn ref_apply(opt: &Optimizer, row: &mut [f32], g: &[f32]) {
    let d = g.len();
    match *opt {
        Optimizer::Sgd { lr } => {
            for i in 0..d {
                row[i] -= lr * g[i];
            }
        }
        Optimizer::Adagrad { lr, eps, .. } => {
            for i in 0..d {
                row[d + i] += g[i] * g[i];
                row[i] -= lr * g[i] / (row[d + i].sqrt() + eps);
            }
        }
        Optimizer::RowWiseAdagrad { lr, eps, .. } => {
            let mut s = 0.0f32;
            for &x in g {
                s += x * x;
            }
            row[d] += s / d as f32;
            for i in 0..d {
                row[i] -= lr / (row[d].sqrt() + eps) * g[i];
            }
        }
        Optimizer::Adam {
            lr,
            beta1,
            beta2,
            eps,
        } => {
            let t = row[3 * d].to_bits() + 1;
            row[3 * d] = f32::from_bits(t);
            let bias1 = 1.0 - beta1.powi(t as i32);
            let bias2 = 1.0 - beta2.powi(t as i32);
            for i in 0..d {
                let m = beta1 * row[d + i] + (1.0 - beta1) * g[i];
                let v = beta2 * row[2 * d + i] + (1.0 - beta2) * g[i] * g[i];
                row[d + i] = m;
                row[2 * d + i] = v;
                // PyTorch: p -= (lr / bias1) * m / (sqrt(v) / sqrt(bias2) + eps)
                row[i] -= (lr / bias1) * m / (v.sqrt() / bias2.sqrt() + eps);
            }
        }
        Optimizer::Ftrl {
            alpha,
            beta,
            l1,
            l2,
        } => {
            for i in 0..d {
                let (w, z, n) = (row[i], row[d + i], row[2 * d + i]);
                let n_new = n + g[i] * g[i];
                let sigma = (n_new.sqrt() - n.sqrt()) / alpha;
                let z_new = z + (g[i] - sigma * w); // z += g - sigma * w
                row[d + i] = z_new;
                row[2 * d + i] = n_new;
                row[i] = if z_new.abs() <= l1 {
                    0.0
                } else {
                    let sgn = if z_new < 0.0 { -1.0 } else { 1.0 };
                    -(z_new - sgn * l1) / ((beta + n_new.sqrt()) / alpha + l2)
                };
            }
        }
    }
}

/// Reference initial optimizer state (weights come from the table's deterministic initializer).
pub fn ref_state(opt: &Optimizer, d: usize) -> Vec<f32> {
    match *opt {
        Optimizer::Sgd { .. } => vec![],
        Optimizer::Adagrad {
            initial_accumulator,
            ..
        } => vec![initial_accumulator; d],
        Optimizer::RowWiseAdagrad {
            initial_accumulator,
            ..
        } => vec![initial_accumulator],
        Optimizer::Adam { .. } => vec![0.0; 2 * d + 1],
        Optimizer::Ftrl { .. } => vec![0.0; 2 * d],
    }
}

/// One of each optimizer with typical hyper-parameters.
pub fn all_optimizers() -> Vec<Optimizer> {
    vec![
        Optimizer::Sgd { lr: 0.1 },
        Optimizer::Adagrad {
            lr: 0.05,
            initial_accumulator: 0.1,
            eps: 1e-7,
        },
        Optimizer::RowWiseAdagrad {
            lr: 0.05,
            initial_accumulator: 0.1,
            eps: 1e-7,
        },
        Optimizer::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        Optimizer::Ftrl {
            alpha: 0.1,
            beta: 1.0,
            l1: 0.01,
            l2: 0.1,
        },
    ]
}

/// A uniform initializer (non-zero so initial values matter).
pub fn uniform() -> Initializer {
    Initializer::Uniform {
        low: -0.05,
        high: 0.05,
    }
}

/// Bit patterns of a float slice (exact comparison, NaN-safe).
pub fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}
