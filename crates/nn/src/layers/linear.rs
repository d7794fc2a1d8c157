//! Fully connected layer `y = act(x W + b)`, W stored `[in, out]` row-major.

use crate::gemm_ops::{matmul_nn_fused, matmul_nt, matmul_tn_grad, Compute, Epilogue};
use crate::params::disjoint_mut;

/// A linear layer bound to its parameter offsets.
#[derive(Clone, Debug)]
pub struct Linear {
    /// Input width.
    pub in_dim: usize,
    /// Output width.
    pub out_dim: usize,
    /// Offset of W (`in_dim * out_dim`).
    pub w: usize,
    /// Offset of b (`out_dim`).
    pub b: usize,
    /// Whether a ReLU follows (fused into the epilogue / backward prologue).
    pub relu: bool,
}

impl Linear {
    /// Weight slice.
    pub fn weight<'a>(&self, p: &'a [f32]) -> &'a [f32] {
        &p[self.w..self.w + self.in_dim * self.out_dim]
    }

    /// `y = act(x W + b)` for `rows` rows; `x` is `[rows, in]`, `y` is `[rows, out]`.
    pub fn forward(&self, p: &[f32], x: &[f32], rows: usize, y: &mut [f32], par: Compute) {
        let (i, o) = (self.in_dim, self.out_dim);
        let y = &mut y[..rows * o];
        let epilogue = Epilogue::bias(&p[self.b..self.b + o], self.relu);
        matmul_nn_fused(y, o, x, i, self.weight(p), o, (rows, i, o), epilogue, par);
    }

    /// Backward. `dy` (`[rows, out]`, gradient w.r.t. the layer output) is masked in place by the
    /// ReLU using the forward output `y`. Accumulates dW and db into `g`. If `dx` is given as
    /// `(buffer, row_stride, cols)`, writes `dx[:, :cols] = dy W[:cols, :]^T` (overwrite).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &[f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        rows: usize,
        g: &mut [f32],
        dx: Option<(&mut [f32], usize, usize)>,
        par: Compute,
    ) {
        self.backward_acc(p, x, y, dy, rows, g, dx, false, par);
    }

    /// [`Linear::backward`], adding `dy W^T` into `dx` instead of overwriting it when
    /// `accumulate` (for an input that feeds several layers).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_acc(
        &self,
        p: &[f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        rows: usize,
        g: &mut [f32],
        dx: Option<(&mut [f32], usize, usize)>,
        accumulate: bool,
        par: Compute,
    ) {
        let (i, o) = (self.in_dim, self.out_dim);
        let dy = &mut dy[..rows * o];
        let relu_out = if self.relu {
            Some(&y[..rows * o])
        } else {
            None
        };
        let (gw, db) = disjoint_mut(g, self.w..self.w + i * o, self.b..self.b + o);
        matmul_tn_grad(gw, o, x, i, dy, relu_out, db, (i, rows, o), true, par);
        if let Some((dx, ldx, cols)) = dx {
            assert!(cols <= i);
            matmul_nt(
                dx,
                ldx,
                dy,
                o,
                self.weight(p),
                o,
                (rows, o, cols),
                accumulate,
                par,
            );
        }
    }

    /// FLOPs per sample of forward + backward (dW, and dX over `dx_cols` input columns).
    pub fn flops_per_sample(&self, dx_cols: usize) -> f64 {
        (4 * self.in_dim * self.out_dim + 2 * dx_cols * self.out_dim) as f64
    }
}
