//! Layer normalization over each row's features: `y = gain ⊙ (x - mean) / sqrt(var + eps) + bias`
//! (biased variance, as in Ba et al. and Keras' `LayerNormalization`).

use super::kernels::{dot, dot3, sum, sum_sq_dev};

/// Epsilon added to the variance.
pub const LAYER_NORM_EPS: f32 = 1e-5;

/// One layer norm bound to its parameter offsets (`gain` and `bias` are both `[dim]`).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// Features per row.
    pub dim: usize,
    /// Offset of the gain (initialized to 1).
    pub gain: usize,
    /// Offset of the bias (initialized to 0).
    pub bias: usize,
}

impl LayerNorm {
    /// In place for `rows` rows: `xy` holds x on entry and y on exit. Keeps the normalized
    /// `xhat` (`[rows, dim]`) and each row's `1 / sqrt(var + eps)` (`rstd`, `[rows]`) for
    /// backward.
    pub fn forward(
        &self,
        p: &[f32],
        xy: &mut [f32],
        rows: usize,
        xhat: &mut [f32],
        rstd: &mut [f32],
    ) {
        let n = self.dim;
        let (g, b) = (&p[self.gain..self.gain + n], &p[self.bias..self.bias + n]);
        for r in 0..rows {
            let row = &mut xy[r * n..(r + 1) * n];
            let mean = sum(row) / n as f32;
            let var = sum_sq_dev(row, mean) / n as f32;
            let rs = 1.0 / (var + LAYER_NORM_EPS).sqrt();
            rstd[r] = rs;
            let xh = &mut xhat[r * n..(r + 1) * n];
            for (((y, h), &gj), &bj) in row.iter_mut().zip(xh.iter_mut()).zip(g).zip(b) {
                *h = (*y - mean) * rs;
                *y = gj * *h + bj;
            }
        }
    }

    /// Backward in place: `dy` holds dL/dy on entry and dL/dx on exit. Accumulates dL/dgain
    /// and dL/dbias into `grads`. With `t = gain ⊙ dy`:
    /// `dx = rstd (t - mean(t) - xhat mean(t ⊙ xhat))`.
    pub fn backward(
        &self,
        p: &[f32],
        xhat: &[f32],
        rstd: &[f32],
        dy: &mut [f32],
        rows: usize,
        grads: &mut [f32],
    ) {
        let n = self.dim;
        let g = &p[self.gain..self.gain + n];
        let (lo, hi) = grads.split_at_mut(self.bias.max(self.gain));
        let (dgain, dbias) = if self.gain < self.bias {
            (&mut lo[self.gain..self.gain + n], &mut hi[..n])
        } else {
            (&mut hi[..n], &mut lo[self.bias..self.bias + n])
        };
        for r in 0..rows {
            let (xh, d) = (&xhat[r * n..(r + 1) * n], &mut dy[r * n..(r + 1) * n]);
            for (((gg, gb), &dj), &xj) in dgain.iter_mut().zip(dbias.iter_mut()).zip(&*d).zip(xh) {
                *gg += dj * xj;
                *gb += dj;
            }
            let m1 = dot(g, d) / n as f32;
            let m2 = dot3(g, d, xh) / n as f32;
            let rs = rstd[r];
            for ((dj, &gj), &xj) in d.iter_mut().zip(g).zip(xh) {
                *dj = rs * (gj * *dj - m1 - xj * m2);
            }
        }
    }

    /// FLOPs per sample, forward + backward (elementwise).
    pub fn flops_per_sample(&self) -> f64 {
        (16 * self.dim) as f64
    }
}
