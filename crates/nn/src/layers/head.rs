//! Output layer over a virtual concatenation `[xa | xb]` -> one logit, without copying the
//! concat: `z = xa . w[..a] + xb . w[a..] + b` (the DCN combination layer).

use super::kernels::dot;

/// Two-input linear head to a single logit.
#[derive(Clone, Debug)]
pub struct ConcatHead {
    /// Width of the first input.
    pub a: usize,
    /// Width of the second input (may be 0).
    pub b_dim: usize,
    /// Offset of w (`a + b_dim`).
    pub w: usize,
    /// Offset of the scalar bias.
    pub b: usize,
}

impl ConcatHead {
    /// `z[r] = xa[r] . w_a + xb[r] . w_b + b` (overwrites `z`).
    pub fn forward(&self, p: &[f32], xa: &[f32], xb: &[f32], rows: usize, z: &mut [f32]) {
        let (a, nb) = (self.a, self.b_dim);
        let (wa, wb) = p[self.w..self.w + a + nb].split_at(a);
        let bias = p[self.b];
        for (r, zr) in z[..rows].iter_mut().enumerate() {
            let sa = dot(&xa[r * a..(r + 1) * a], wa);
            let sb = dot(&xb[r * nb..(r + 1) * nb], wb);
            *zr = sa + sb + bias;
        }
    }

    /// Backward: accumulates dw, db; overwrites `dxa = dz w_a^T` and `dxb = dz w_b^T`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &[f32],
        xa: &[f32],
        xb: &[f32],
        dz: &[f32],
        rows: usize,
        grads: &mut [f32],
        dxa: &mut [f32],
        dxb: &mut [f32],
    ) {
        let (a, nb) = (self.a, self.b_dim);
        let (wa, wb) = p[self.w..self.w + a + nb].split_at(a);
        let mut gbias = 0.0f32;
        {
            let (ga, gb) = grads[self.w..self.w + a + nb].split_at_mut(a);
            for (r, &d) in dz[..rows].iter().enumerate() {
                gbias += d;
                for ((g, &x), (dx, &w)) in ga
                    .iter_mut()
                    .zip(&xa[r * a..(r + 1) * a])
                    .zip(dxa[r * a..(r + 1) * a].iter_mut().zip(wa))
                {
                    *g += x * d;
                    *dx = w * d;
                }
                for ((g, &x), (dx, &w)) in gb
                    .iter_mut()
                    .zip(&xb[r * nb..(r + 1) * nb])
                    .zip(dxb[r * nb..(r + 1) * nb].iter_mut().zip(wb))
                {
                    *g += x * d;
                    *dx = w * d;
                }
            }
        }
        grads[self.b] += gbias;
    }
}
