//! Factorization-machine second-order interaction:
//! `fm(v) = 0.5 * sum_d ((sum_f v_fd)^2 - sum_f v_fd^2)` per sample, `v` being `[F, D]`.

const LANES: usize = 16;

/// Forward: `out[r] = fm(emb[r])` for `emb` of `[rows, F*D]`. `out` is overwritten.
pub fn fm_forward(emb: &[f32], rows: usize, fields: usize, dim: usize, out: &mut [f32]) {
    let w = fields * dim;
    for (r, o) in out[..rows].iter_mut().enumerate() {
        let v = &emb[r * w..(r + 1) * w];
        let mut acc = 0.0f32;
        // 16 dims at a time so the field loop vectorizes over d.
        for d0 in (0..dim).step_by(LANES) {
            let n = (dim - d0).min(LANES);
            let (mut s, mut q) = ([0.0f32; LANES], [0.0f32; LANES]);
            for f in 0..fields {
                let x = &v[f * dim + d0..f * dim + d0 + n];
                for k in 0..n {
                    s[k] += x[k];
                    q[k] += x[k] * x[k];
                }
            }
            acc += (0..n).map(|k| s[k] * s[k] - q[k]).sum::<f32>();
        }
        *o = 0.5 * acc;
    }
}

/// Backward: `d_emb[r, f, d] += g[r] * (sum_f' v_f'd - v_fd)` (accumulates).
pub fn fm_backward(
    emb: &[f32],
    g: &[f32],
    rows: usize,
    fields: usize,
    dim: usize,
    d_emb: &mut [f32],
) {
    let w = fields * dim;
    for r in 0..rows {
        let v = &emb[r * w..(r + 1) * w];
        let gr = g[r];
        let dv = &mut d_emb[r * w..(r + 1) * w];
        for d0 in (0..dim).step_by(LANES) {
            let n = (dim - d0).min(LANES);
            let mut s = [0.0f32; LANES];
            for f in 0..fields {
                let x = &v[f * dim + d0..f * dim + d0 + n];
                for k in 0..n {
                    s[k] += x[k];
                }
            }
            for f in 0..fields {
                let (x, dx) = (
                    &v[f * dim + d0..f * dim + d0 + n],
                    &mut dv[f * dim + d0..f * dim + d0 + n],
                );
                for k in 0..n {
                    dx[k] += gr * (s[k] - x[k]);
                }
            }
        }
    }
}
