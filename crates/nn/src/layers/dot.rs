//! DLRM pairwise dot interaction: for `n` vectors of width `dim` per sample, the strictly upper
//! triangle of their Gram matrix, `z_{ij} = <t_i, t_j>` for `i < j` in row-major pair order
//! ((0,1), (0,2), ..., (1,2), ...).

use super::kernels::dot;

/// The interaction of `n` vectors of width `dim`.
#[derive(Clone, Debug)]
pub struct DotInteraction {
    /// Vectors per sample.
    pub n: usize,
    /// Width of each vector.
    pub dim: usize,
}

impl DotInteraction {
    /// Number of outputs per sample, `n (n - 1) / 2`.
    pub fn out_dim(&self) -> usize {
        self.n * self.n.saturating_sub(1) / 2
    }

    /// `t` is `[rows, n * dim]`; writes the pairs into `out[r * ld + off ..][..out_dim]`.
    pub fn forward(&self, t: &[f32], rows: usize, (out, ld, off): (&mut [f32], usize, usize)) {
        let (n, d, w) = (self.n, self.dim, self.n * self.dim);
        for r in 0..rows {
            let v = &t[r * w..(r + 1) * w];
            let o = &mut out[r * ld + off..r * ld + off + self.out_dim()];
            let mut k = 0;
            for i in 0..n {
                for j in i + 1..n {
                    o[k] = dot(&v[i * d..(i + 1) * d], &v[j * d..(j + 1) * d]);
                    k += 1;
                }
            }
        }
    }

    /// Backward: `dz` is dL/d(pairs) at `dz[r * ld + off ..]`; overwrites `dt` (`[rows, n * dim]`)
    /// with `dt_i = sum_{j != i} dz_{ij} t_j`.
    pub fn backward(
        &self,
        t: &[f32],
        (dz, ld, off): (&[f32], usize, usize),
        rows: usize,
        dt: &mut [f32],
    ) {
        let (n, d, w) = (self.n, self.dim, self.n * self.dim);
        dt[..rows * w].fill(0.0);
        for r in 0..rows {
            let v = &t[r * w..(r + 1) * w];
            let g = &dz[r * ld + off..r * ld + off + self.out_dim()];
            let dv = &mut dt[r * w..(r + 1) * w];
            let mut k = 0;
            for i in 0..n {
                for j in i + 1..n {
                    let gk = g[k];
                    k += 1;
                    for c in 0..d {
                        dv[i * d + c] += gk * v[j * d + c];
                        dv[j * d + c] += gk * v[i * d + c];
                    }
                }
            }
        }
    }

    /// FLOPs per sample, forward + backward.
    pub fn flops_per_sample(&self) -> f64 {
        (6 * self.out_dim() * self.dim) as f64
    }
}
