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

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, in f64.
    fn naive(t: &[f32], n: usize, d: usize) -> Vec<f64> {
        let mut out = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                out.push(
                    (0..d)
                        .map(|c| t[i * d + c] as f64 * t[j * d + c] as f64)
                        .sum(),
                );
            }
        }
        out
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                ((i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8) as f32 / (1 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Widths and counts around the block size, rows written at an offset of a wider output.
    #[test]
    fn forward_and_backward_match_the_definition() {
        for (n, d) in [
            (1, 4),
            (2, 3),
            (5, 16),
            (17, 16),
            (27, 16),
            (33, 20),
            (16, 33),
        ] {
            let x = DotInteraction { n, dim: d };
            let (rows, m, w) = (3, x.out_dim(), n * d);
            let (ld, off) = (m + 5, 2);
            let t = values(rows * w, n as u32 * 31 + d as u32);
            let mut out = vec![7.0f32; rows * ld];
            x.forward(&t, rows, (&mut out, ld, off));
            let dz = values(rows * ld, 99);
            let mut dt = vec![1.0f32; rows * w];
            x.backward(&t, (&dz, ld, off), rows, &mut dt);
            for r in 0..rows {
                let v = &t[r * w..(r + 1) * w];
                let want = naive(v, n, d);
                for (k, want) in want.iter().enumerate() {
                    let got = out[r * ld + off + k] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "n {n} d {d} row {r} pair {k}: {got} vs {want}"
                    );
                }
                assert_eq!(out[r * ld], 7.0, "left of the pairs untouched");
                // dt_i = sum_{j != i} dz_ij t_j.
                let g = &dz[r * ld + off..];
                for i in 0..n {
                    for c in 0..d {
                        let mut want = 0.0f64;
                        let mut k = 0;
                        for a in 0..n {
                            for b in a + 1..n {
                                if a == i {
                                    want += g[k] as f64 * v[b * d + c] as f64;
                                } else if b == i {
                                    want += g[k] as f64 * v[a * d + c] as f64;
                                }
                                k += 1;
                            }
                        }
                        let got = dt[r * w + i * d + c] as f64;
                        assert!(
                            (got - want).abs() < 1e-4,
                            "n {n} d {d} dt[{i}][{c}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
