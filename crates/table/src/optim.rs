//! Optimizer math applied in place to one row `[weights | state]`.
//!
//! Row layouts (`d` = dim):
//! * SGD: `[w; d]`
//! * Adagrad: `[w; d][acc; d]`
//! * row-wise Adagrad: `[w; d][acc]`
//! * Adam: `[w; d][m; d][v; d][step]` (step is a `u32` stored as raw `f32` bits)
//! * FTRL: `[w; d][z; d][n; d]`

use crate::config::Optimizer;

/// Applies one gradient to one row. `row.len() == dim + state`, `g.len() == dim`.
#[inline]
pub fn apply(opt: &Optimizer, row: &mut [f32], g: &[f32]) {
    let dim = g.len();
    let (w, state) = row.split_at_mut(dim);
    match *opt {
        Optimizer::Sgd { lr } => {
            for (w, g) in w.iter_mut().zip(g) {
                *w -= lr * g;
            }
        }
        Optimizer::Adagrad { lr, eps, .. } => {
            for ((w, a), g) in w.iter_mut().zip(state.iter_mut()).zip(g) {
                *a += g * g;
                *w -= lr * g / (a.sqrt() + eps);
            }
        }
        Optimizer::RowWiseAdagrad { lr, eps, .. } => {
            let sum: f32 = g.iter().map(|g| g * g).sum();
            state[0] += sum / dim as f32;
            let scale = lr / (state[0].sqrt() + eps);
            for (w, g) in w.iter_mut().zip(g) {
                *w -= scale * g;
            }
        }
        Optimizer::Adam {
            lr,
            beta1,
            beta2,
            eps,
        } => {
            let (m, rest) = state.split_at_mut(dim);
            let (v, step) = rest.split_at_mut(dim);
            let t = step[0].to_bits().saturating_add(1);
            step[0] = f32::from_bits(t);
            let ti = t.min(i32::MAX as u32) as i32;
            let bc1 = 1.0 - beta1.powi(ti);
            let bc2_sqrt = (1.0 - beta2.powi(ti)).sqrt();
            let step_size = lr / bc1;
            for i in 0..dim {
                let gi = g[i];
                m[i] = beta1 * m[i] + (1.0 - beta1) * gi;
                v[i] = beta2 * v[i] + (1.0 - beta2) * gi * gi;
                let denom = v[i].sqrt() / bc2_sqrt + eps;
                w[i] -= step_size * m[i] / denom;
            }
        }
        Optimizer::Ftrl {
            alpha,
            beta,
            l1,
            l2,
        } => {
            let (z, n) = state.split_at_mut(dim);
            for i in 0..dim {
                let gi = g[i];
                let n_new = n[i] + gi * gi;
                let sigma = (n_new.sqrt() - n[i].sqrt()) / alpha;
                z[i] += gi - sigma * w[i];
                n[i] = n_new;
                w[i] = if z[i].abs() <= l1 {
                    0.0
                } else {
                    -(z[i] - z[i].signum() * l1) / ((beta + n_new.sqrt()) / alpha + l2)
                };
            }
        }
    }
}
