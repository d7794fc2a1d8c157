//! DIN's target attention over a sequence: for every valid position `p` of a row, an MLP
//! scores `a_p = [h_p, t, h_p - t, h_p ⊙ t]`; the weights are the softmax of the scores over
//! the row's valid positions (`p < length`) and the output is `Σ_p w_p h_p`.
//!
//! The MLP runs as GEMMs over all `rows * max_len` positions; masked positions are computed
//! but get weight 0, and their gradients are exactly 0.

use super::kernels::dot;
use super::linear::Linear;
use crate::gemm_ops::Compute;

/// Feature blocks per position: `[h, t, h - t, h ⊙ t]`.
const BLOCKS: usize = 4;

/// One attention unit bound to its MLP's parameter offsets.
#[derive(Clone, Debug)]
pub struct Attention {
    /// Width of a position (and of the target).
    pub dim: usize,
    /// Positions per row.
    pub max_len: usize,
    /// Scoring MLP: `4 * dim` -> hidden (ReLU) ... -> 1 (linear).
    pub mlp: Vec<Linear>,
}

/// Forward activations of one unit, reused by its backward (sized for `cap` rows).
#[derive(Clone, Debug, Default)]
pub struct AttentionCache {
    cap: usize,
    /// `[rows * max_len, 4 * dim]` position features.
    feats: Vec<f32>,
    /// Per MLP layer `[rows * max_len, out]`; the last holds the scores.
    acts: Vec<Vec<f32>>,
    dacts: Vec<Vec<f32>>,
    /// dL/d(feats).
    dfeats: Vec<f32>,
    /// `[rows * max_len]` softmax weights (0 past a row's length).
    weights: Vec<f32>,
}

impl AttentionCache {
    /// The softmax weights of the last forward (`rows * max_len`, 0 at masked positions).
    pub fn weights(&self, rows: usize, max_len: usize) -> &[f32] {
        &self.weights[..rows * max_len]
    }
}

fn valid(lengths: &[u32], r: usize, max_len: usize) -> usize {
    (lengths[r] as usize).min(max_len)
}

impl Attention {
    /// Makes `cache` hold `rows` rows (allocates only when growing).
    pub fn ensure_cache(&self, cache: &mut AttentionCache, rows: usize) {
        if rows <= cache.cap && cache.acts.len() == self.mlp.len() {
            return;
        }
        let n = rows * self.max_len;
        cache.cap = rows;
        cache.feats = vec![0.0; n * BLOCKS * self.dim];
        cache.dfeats = vec![0.0; n * BLOCKS * self.dim];
        cache.acts = self.mlp.iter().map(|l| vec![0.0; n * l.out_dim]).collect();
        cache.dacts = self.mlp.iter().map(|l| vec![0.0; n * l.out_dim]).collect();
        cache.weights = vec![0.0; n];
    }

    /// `pooled[r] = Σ_{p < lengths[r]} softmax(score)_p h[r, p]` for `rows` rows.
    /// `h` is `[rows, max_len, dim]`, `t` and `pooled` are `[rows, dim]`; `lengths[r]` >= 1.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        p: &[f32],
        h: &[f32],
        lengths: &[u32],
        t: &[f32],
        rows: usize,
        cache: &mut AttentionCache,
        pooled: &mut [f32],
        par: Compute,
    ) {
        let (d, ml) = (self.dim, self.max_len);
        self.ensure_cache(cache, rows);
        let n = rows * ml;
        let fw = BLOCKS * d;
        for r in 0..rows {
            let tr = &t[r * d..(r + 1) * d];
            for q in 0..ml {
                let i = r * ml + q;
                let hp = &h[i * d..(i + 1) * d];
                let a = &mut cache.feats[i * fw..(i + 1) * fw];
                let (a_h, rest) = a.split_at_mut(d);
                let (a_t, rest) = rest.split_at_mut(d);
                let (a_diff, a_prod) = rest.split_at_mut(d);
                a_h.copy_from_slice(hp);
                a_t.copy_from_slice(tr);
                for j in 0..d {
                    a_diff[j] = hp[j] - tr[j];
                    a_prod[j] = hp[j] * tr[j];
                }
            }
        }
        for (i, l) in self.mlp.iter().enumerate() {
            let (prev, cur) = cache.acts.split_at_mut(i);
            let x: &[f32] = if i == 0 { &cache.feats } else { &prev[i - 1] };
            l.forward(p, x, n, &mut cur[0], par);
        }
        let scores = cache.acts.last().expect("attention MLP has a score layer");
        for r in 0..rows {
            let len = valid(lengths, r, ml);
            let s = &scores[r * ml..r * ml + len];
            let w = &mut cache.weights[r * ml..(r + 1) * ml];
            let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for (wq, &sq) in w.iter_mut().zip(s) {
                *wq = (sq - m).exp();
                sum += *wq;
            }
            for wq in &mut w[..len] {
                *wq /= sum;
            }
            w[len..].fill(0.0);
            let out = &mut pooled[r * d..(r + 1) * d];
            out.fill(0.0);
            for (q, &wq) in w[..len].iter().enumerate() {
                let hp = &h[(r * ml + q) * d..(r * ml + q + 1) * d];
                for (o, &v) in out.iter_mut().zip(hp) {
                    *o += wq * v;
                }
            }
        }
    }

    /// Backward after [`Attention::forward`] on the same inputs: from `d_pooled` (`[rows, dim]`)
    /// accumulates the MLP's parameter gradients into `grads`, overwrites `dh`
    /// (`[rows, max_len, dim]`, zeros past each length) and `dt` (`[rows, dim]`).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &[f32],
        h: &[f32],
        lengths: &[u32],
        t: &[f32],
        rows: usize,
        cache: &mut AttentionCache,
        d_pooled: &[f32],
        grads: &mut [f32],
        dh: &mut [f32],
        dt: &mut [f32],
        par: Compute,
    ) {
        let (d, ml) = (self.dim, self.max_len);
        let n = rows * ml;
        let fw = BLOCKS * d;
        // dL/dscore into the score layer's gradient; the direct term w_p * d_pooled into dh.
        let ds = cache
            .dacts
            .last_mut()
            .expect("attention MLP has a score layer");
        for r in 0..rows {
            let len = valid(lengths, r, ml);
            let g = &d_pooled[r * d..(r + 1) * d];
            let w = &cache.weights[r * ml..(r + 1) * ml];
            let dsr = &mut ds[r * ml..(r + 1) * ml];
            let mut mean = 0.0f32;
            for q in 0..len {
                let i = r * ml + q;
                let hp = &h[i * d..(i + 1) * d];
                let dw = dot(hp, g);
                dsr[q] = dw;
                mean += w[q] * dw;
                for (o, &gv) in dh[i * d..(i + 1) * d].iter_mut().zip(g) {
                    *o = w[q] * gv;
                }
            }
            for q in 0..len {
                dsr[q] = w[q] * (dsr[q] - mean);
            }
            dsr[len..].fill(0.0);
            dh[(r * ml + len) * d..(r + 1) * ml * d].fill(0.0);
        }
        for (i, l) in self.mlp.iter().enumerate().rev() {
            let x: &[f32] = if i == 0 {
                &cache.feats
            } else {
                &cache.acts[i - 1]
            };
            let (lo, hi) = cache.dacts.split_at_mut(i);
            let dx = if i == 0 {
                (&mut cache.dfeats[..], fw, fw)
            } else {
                (&mut lo[i - 1][..], l.in_dim, l.in_dim)
            };
            l.backward(p, x, &cache.acts[i], &mut hi[0], n, grads, Some(dx), par);
        }
        // a = [h, t, h - t, h ⊙ t]: dh += da_h + da_diff + da_prod ⊙ t,
        // dt = Σ_p (da_t - da_diff + da_prod ⊙ h).
        for r in 0..rows {
            let len = valid(lengths, r, ml);
            let tr = &t[r * d..(r + 1) * d];
            let dtr = &mut dt[r * d..(r + 1) * d];
            dtr.fill(0.0);
            for q in 0..len {
                let i = r * ml + q;
                let hp = &h[i * d..(i + 1) * d];
                let da = &cache.dfeats[i * fw..(i + 1) * fw];
                let dhp = &mut dh[i * d..(i + 1) * d];
                for j in 0..d {
                    let (g_h, g_t, g_diff, g_prod) =
                        (da[j], da[d + j], da[2 * d + j], da[3 * d + j]);
                    dhp[j] += g_h + g_diff + g_prod * tr[j];
                    dtr[j] += g_t - g_diff + g_prod * hp[j];
                }
            }
        }
    }

    /// FLOPs per sample of forward + backward, counting every one of the `max_len` positions.
    pub fn flops_per_sample(&self) -> f64 {
        let mlp: f64 = self.mlp.iter().map(|l| l.flops_per_sample(l.in_dim)).sum();
        // features (2d), softmax and pooling (2d), backward pooling (4d) and features (6d)
        let elementwise = (14 * self.dim + 8) as f64;
        self.max_len as f64 * (mlp + elementwise)
    }
}
