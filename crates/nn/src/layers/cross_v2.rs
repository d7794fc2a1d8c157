//! DCN-v2 cross layer (matrix form): `x_{l+1} = x0 ⊙ (M(x_l) + b) + x_l`, where `M` is
//! * full rank: `M(x) = x W` (W `[d, d]`, stored `[in, out]` like [`super::linear::Linear`]);
//! * low rank: `M(x) = (x V) U` with V `[d, r]` and U `[r, d]` (`W = V U`, rank r);
//! * a mixture of K low-rank experts: `M(x) = sum_i G_i(x) (x V_i) U_i` with the softmax gate
//!   `G(x) = softmax(x A)` (A `[d, K]`). The experts are linear (the paper's optional inner
//!   nonlinearity `g` and `r×r` matrix C are left out: g = identity), and the bias b is shared.
//!
//! The K experts' V are stored side by side as one `[d, K r]` matrix and their U stacked as one
//! `[K r, d]` matrix, so the mixture is two GEMMs: `z = x V`, `M = (G ⊙ z) U` with `G` broadcast
//! over each expert's r columns.

use super::gate::{softmax_rows, softmax_rows_backward};
use crate::gemm_ops::{
    matmul_nn, matmul_nn_fused, matmul_nt, matmul_tn, matmul_tn_grad, Compute, Epilogue,
};
use crate::params::disjoint_mut;

/// The cross matrix of one layer, bound to its parameter offsets.
#[derive(Clone, Debug)]
pub enum CrossMatrix {
    /// Full-rank W `[d, d]`.
    Full {
        /// Offset of W.
        w: usize,
    },
    /// `experts` low-rank factors of rank `rank`.
    LowRank {
        /// Rank r of each expert.
        rank: usize,
        /// Number of experts K.
        experts: usize,
        /// Offset of V `[d, K r]`.
        v: usize,
        /// Offset of U `[K r, d]`.
        u: usize,
        /// Offset of the gate A `[d, K]` (only when K > 1).
        gate: Option<usize>,
    },
}

/// One DCN-v2 cross layer.
#[derive(Clone, Debug)]
pub struct CrossV2 {
    /// Width d of x0.
    pub dim: usize,
    /// The matrix part.
    pub m: CrossMatrix,
    /// Offset of b `[d]`.
    pub b: usize,
}

/// Forward values of one layer kept for its backward (sized by [`CrossV2Cache::ensure`]).
#[derive(Clone, Debug, Default)]
pub struct CrossV2Cache {
    /// `h = M(x_l) + b`, `[rows, d]`.
    pub h: Vec<f32>,
    /// `z = x_l V`, `[rows, K r]` (low rank).
    pub z: Vec<f32>,
    /// `G ⊙ z`, `[rows, K r]` (K > 1).
    pub zg: Vec<f32>,
    /// Gate values `[rows, K]` (K > 1).
    pub gate: Vec<f32>,
}

/// Backward scratch shared by the layers of a tower.
#[derive(Clone, Debug, Default)]
pub struct CrossV2Scratch {
    dh: Vec<f32>,
    dz: Vec<f32>,
    dgate: Vec<f32>,
}

impl CrossV2 {
    /// `(K r, K)`: width of z and number of gate outputs (0, 0 for full rank; K = 1 has no gate).
    fn widths(&self) -> (usize, usize) {
        match self.m {
            CrossMatrix::Full { .. } => (0, 0),
            CrossMatrix::LowRank {
                rank,
                experts,
                gate,
                ..
            } => (rank * experts, if gate.is_some() { experts } else { 0 }),
        }
    }

    /// Sizes `cache` for `rows` rows.
    pub fn ensure_cache(&self, cache: &mut CrossV2Cache, rows: usize) {
        let (kr, k) = self.widths();
        cache.h = vec![0.0; rows * self.dim];
        cache.z = vec![0.0; rows * kr];
        cache.zg = vec![0.0; if k > 0 { rows * kr } else { 0 }];
        cache.gate = vec![0.0; rows * k];
    }

    /// Sizes `s` for `rows` rows (only grows).
    pub fn ensure_scratch(&self, s: &mut CrossV2Scratch, rows: usize) {
        let (kr, k) = self.widths();
        let grow = |v: &mut Vec<f32>, n: usize| {
            if v.len() < n {
                *v = vec![0.0; n];
            }
        };
        grow(&mut s.dh, rows * self.dim);
        grow(&mut s.dz, rows * kr);
        grow(&mut s.dgate, rows * k);
    }

    /// Forward for `rows` rows: writes `x_next` and fills `cache`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        p: &[f32],
        x0: &[f32],
        xl: &[f32],
        rows: usize,
        x_next: &mut [f32],
        cache: &mut CrossV2Cache,
        par: Compute,
    ) {
        let d = self.dim;
        let h = &mut cache.h[..rows * d];
        let bias = Epilogue::Bias(&p[self.b..self.b + d]);
        match self.m {
            CrossMatrix::Full { w } => {
                let w = &p[w..w + d * d];
                matmul_nn_fused(h, d, xl, d, w, d, (rows, d, d), bias, par);
            }
            CrossMatrix::LowRank {
                rank,
                experts,
                v,
                u,
                gate,
            } => {
                let kr = rank * experts;
                let z = &mut cache.z[..rows * kr];
                matmul_nn(
                    z,
                    kr,
                    xl,
                    d,
                    &p[v..v + d * kr],
                    kr,
                    (rows, d, kr),
                    false,
                    par,
                );
                let mixed: &[f32] = match gate {
                    None => z,
                    Some(a) => {
                        let g = &mut cache.gate[..rows * experts];
                        let pa = &p[a..a + d * experts];
                        matmul_nn(
                            g,
                            experts,
                            xl,
                            d,
                            pa,
                            experts,
                            (rows, d, experts),
                            false,
                            par,
                        );
                        softmax_rows(g, experts);
                        let zg = &mut cache.zg[..rows * kr];
                        for ((o, zi), gr) in zg
                            .chunks_exact_mut(rank)
                            .zip(z.chunks_exact(rank))
                            .zip(g.iter())
                        {
                            for (a, &b) in o.iter_mut().zip(zi) {
                                *a = gr * b;
                            }
                        }
                        zg
                    }
                };
                matmul_nn_fused(
                    h,
                    d,
                    mixed,
                    kr,
                    &p[u..u + kr * d],
                    d,
                    (rows, kr, d),
                    bias,
                    par,
                );
            }
        }
        for r in 0..rows {
            let s = r * d..(r + 1) * d;
            for (((o, &a0), &hv), &al) in x_next[s.clone()]
                .iter_mut()
                .zip(&x0[s.clone()])
                .zip(&h[s.clone()])
                .zip(&xl[s])
            {
                *o = a0 * hv + al;
            }
        }
    }

    /// Backward. On entry `g` holds dL/dx_{l+1}; on exit dL/dx_l (in place). Accumulates the
    /// parameter gradients into `grads` and the direct x0 term `g ⊙ h` into `dx0` (`[rows, d]`).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &[f32],
        x0: &[f32],
        xl: &[f32],
        cache: &CrossV2Cache,
        g: &mut [f32],
        s: &mut CrossV2Scratch,
        rows: usize,
        grads: &mut [f32],
        dx0: &mut [f32],
        par: Compute,
    ) {
        let d = self.dim;
        let n = rows * d;
        let (g, h) = (&mut g[..n], &cache.h[..n]);
        let dh = &mut s.dh[..n];
        for ((((dhv, &gv), &a0), &hv), dx) in dh
            .iter_mut()
            .zip(g.iter())
            .zip(&x0[..n])
            .zip(h)
            .zip(dx0[..n].iter_mut())
        {
            *dhv = gv * a0;
            *dx += gv * hv;
        }
        let db = self.b..self.b + d;
        match self.m {
            CrossMatrix::Full { w } => {
                let (gw, gb) = disjoint_mut(grads, w..w + d * d, db);
                matmul_tn_grad(gw, d, xl, d, dh, None, gb, (d, rows, d), true, par);
                matmul_nt(g, d, dh, d, &p[w..w + d * d], d, (rows, d, d), true, par);
            }
            CrossMatrix::LowRank {
                rank,
                experts,
                v,
                u,
                gate,
            } => {
                let kr = rank * experts;
                let z = &cache.z[..rows * kr];
                let mixed: &[f32] = if gate.is_some() {
                    &cache.zg[..rows * kr]
                } else {
                    z
                };
                let (gu, gb) = disjoint_mut(grads, u..u + kr * d, db);
                matmul_tn_grad(gu, d, mixed, kr, dh, None, gb, (kr, rows, d), true, par);
                let dh: &[f32] = dh;
                let dz = &mut s.dz[..rows * kr];
                matmul_nt(
                    dz,
                    kr,
                    dh,
                    d,
                    &p[u..u + kr * d],
                    d,
                    (rows, d, kr),
                    false,
                    par,
                );
                if let Some(a) = gate {
                    // dz holds dL/d(G ⊙ z): split it into dL/dG and dL/dz.
                    let gv = &cache.gate[..rows * experts];
                    let dg = &mut s.dgate[..rows * experts];
                    for (((dgi, &gi), dzi), zi) in dg
                        .iter_mut()
                        .zip(gv)
                        .zip(dz.chunks_exact_mut(rank))
                        .zip(z.chunks_exact(rank))
                    {
                        let mut t = 0.0f32;
                        for (dzc, &zc) in dzi.iter_mut().zip(zi) {
                            t += *dzc * zc;
                            *dzc *= gi;
                        }
                        *dgi = t;
                    }
                    softmax_rows_backward(gv, dg, experts);
                    let dg: &[f32] = dg;
                    let ga = &mut grads[a..a + d * experts];
                    matmul_tn(
                        ga,
                        experts,
                        xl,
                        d,
                        dg,
                        experts,
                        (d, rows, experts),
                        true,
                        par,
                    );
                    let pa = &p[a..a + d * experts];
                    matmul_nt(
                        g,
                        d,
                        dg,
                        experts,
                        pa,
                        experts,
                        (rows, experts, d),
                        true,
                        par,
                    );
                }
                let dz: &[f32] = dz;
                let gv = &mut grads[v..v + d * kr];
                matmul_tn(gv, kr, xl, d, dz, kr, (d, rows, kr), true, par);
                matmul_nt(
                    g,
                    d,
                    dz,
                    kr,
                    &p[v..v + d * kr],
                    kr,
                    (rows, kr, d),
                    true,
                    par,
                );
            }
        }
    }

    /// Approximate FLOPs per sample, forward + backward.
    pub fn flops_per_sample(&self) -> f64 {
        let d = self.dim;
        let (kr, k) = self.widths();
        let gemm = match self.m {
            CrossMatrix::Full { .. } => 6 * d * d,
            CrossMatrix::LowRank { .. } => 12 * d * kr + 6 * d * k + 6 * kr,
        };
        (gemm + 8 * d) as f64
    }
}
