//! Softmax gate over experts: `G[r, :] = softmax(s[r, :])`, row-wise over `k` scores.

/// Forward: overwrites `s` (`[rows, k]` scores) with the row-wise softmax (max-subtracted).
pub fn softmax_rows(s: &mut [f32], k: usize) {
    for row in s.chunks_exact_mut(k) {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for v in row.iter_mut() {
            *v = (*v - m).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in row.iter_mut() {
            *v *= inv;
        }
    }
}

/// Backward: `dg` holds dL/dG on entry and dL/ds on exit (in place), given the forward output
/// `g`: `ds_i = G_i (dG_i - sum_j G_j dG_j)`.
pub fn softmax_rows_backward(g: &[f32], dg: &mut [f32], k: usize) {
    assert_eq!(g.len(), dg.len());
    for (gr, dr) in g.chunks_exact(k).zip(dg.chunks_exact_mut(k)) {
        let t: f32 = gr.iter().zip(dr.iter()).map(|(a, b)| a * b).sum();
        for (d, &gv) in dr.iter_mut().zip(gr) {
            *d = gv * (*d - t);
        }
    }
}
