//! DCN-v1 cross layer (vector form): `x_{l+1} = x0 * (x_l . w) + b + x_l`.

use super::kernels::dot;

/// One cross layer bound to its parameter offsets (`w` and `b` are both `[dim]`).
#[derive(Clone, Debug)]
pub struct Cross {
    /// Width of x0.
    pub dim: usize,
    /// Offset of w.
    pub w: usize,
    /// Offset of b.
    pub b: usize,
}

impl Cross {
    /// Forward for `rows` rows. Writes `x_next` and the per-row scalar `s = x_l . w` (needed
    /// by backward).
    pub fn forward(
        &self,
        p: &[f32],
        x0: &[f32],
        xl: &[f32],
        rows: usize,
        x_next: &mut [f32],
        s: &mut [f32],
    ) {
        let n = self.dim;
        let (w, b) = (&p[self.w..self.w + n], &p[self.b..self.b + n]);
        crate::simd::wide(
            #[inline(always)]
            || {
                for r in 0..rows {
                    let (a0, al) = (&x0[r * n..(r + 1) * n], &xl[r * n..(r + 1) * n]);
                    let sr = dot(al, w);
                    s[r] = sr;
                    let out = &mut x_next[r * n..(r + 1) * n];
                    for j in 0..n {
                        out[j] = a0[j] * sr + b[j] + al[j];
                    }
                }
            },
        );
    }

    /// Backward. On entry `g` holds dL/dx_{l+1}; on exit dL/dx_l (in place). Accumulates
    /// dw, db into `grads` and the direct x0 contribution `g * s` into `dx0[:, :dx0_cols]`
    /// (row stride `ldx0`).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &[f32],
        x0: &[f32],
        xl: &[f32],
        s: &[f32],
        g: &mut [f32],
        rows: usize,
        grads: &mut [f32],
        (dx0, ldx0, dx0_cols): (&mut [f32], usize, usize),
    ) {
        let n = self.dim;
        let w = &p[self.w..self.w + n];
        let (gw, gb) = {
            let (lo, hi) = grads.split_at_mut(self.b.max(self.w));
            if self.w < self.b {
                (&mut lo[self.w..self.w + n], &mut hi[..n])
            } else {
                (&mut hi[..n], &mut lo[self.b..self.b + n])
            }
        };
        crate::simd::wide(
            #[inline(always)]
            || {
                for r in 0..rows {
                    let (a0, al) = (&x0[r * n..(r + 1) * n], &xl[r * n..(r + 1) * n]);
                    let gr = &mut g[r * n..(r + 1) * n];
                    let t = dot(gr, a0);
                    let sr = s[r];
                    let d0 = &mut dx0[r * ldx0..r * ldx0 + dx0_cols];
                    for (d, &gv) in d0.iter_mut().zip(gr.iter()) {
                        *d += gv * sr;
                    }
                    for j in 0..n {
                        gw[j] += al[j] * t;
                        gb[j] += gr[j];
                        gr[j] += w[j] * t;
                    }
                }
            },
        );
    }

    /// Approximate FLOPs per sample, forward + backward.
    pub fn flops_per_sample(&self) -> f64 {
        (14 * self.dim) as f64
    }
}
