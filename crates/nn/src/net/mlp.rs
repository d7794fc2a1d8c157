//! A stack of [`Linear`] layers over any input buffer (the DCN-v2 and DLRM graphs; wdl, deepfm
//! and dcn keep their own loops over `x0`), and [`MlpBlock`]: hidden layers with optional layer
//! norm and dropout (mmoe, esmm; usable by any graph).

use super::ShardIn;
use crate::config::DenseInit;
use crate::gemm_ops::Compute;
use crate::layers::activation::{relu_backward, relu_forward};
use crate::layers::dropout::{apply_mask, fill_mask, DropoutKey};
use crate::layers::layer_norm::LayerNorm;
use crate::layers::linear::Linear;
use crate::params::ParamLayout;

/// Forward through `layers`: `acts[i]` receives layer i's output.
pub(super) fn forward(
    layers: &[Linear],
    p: &[f32],
    input: &[f32],
    acts: &mut [Vec<f32>],
    rows: usize,
    par: Compute,
) {
    for (i, l) in layers.iter().enumerate() {
        let (prev, cur) = acts.split_at_mut(i);
        let x: &[f32] = if i == 0 { input } else { &prev[i - 1] };
        l.forward(p, x, rows, &mut cur[0], par);
    }
}

/// Backward through `layers`; `dacts.last()` must hold dL/d(output). Accumulates the parameter
/// gradients into `grads`; writes dL/d(input) into `dx` (`(buffer, row stride, cols)`) if given.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    layers: &[Linear],
    p: &[f32],
    input: &[f32],
    acts: &[Vec<f32>],
    dacts: &mut [Vec<f32>],
    rows: usize,
    grads: &mut [f32],
    mut dx: Option<(&mut [f32], usize, usize)>,
    par: Compute,
) {
    for (i, l) in layers.iter().enumerate().rev() {
        let x: &[f32] = if i == 0 { input } else { &acts[i - 1] };
        let (lo, hi) = dacts.split_at_mut(i);
        let d = if i == 0 {
            dx.take()
        } else {
            Some((&mut lo[i - 1][..], l.in_dim, l.in_dim))
        };
        l.backward(p, x, &acts[i], &mut hi[0], rows, grads, d, par);
    }
}

/// Initial values the builder registers besides the uniform weights.
#[derive(Debug, Default)]
pub(crate) struct Inits {
    /// `(offset, len, limit)`: uniform in [-limit, limit), drawn in this order from the seed.
    pub uniform: Vec<(usize, usize, f32)>,
    /// `(offset, len)`: set to 1 (layer norm gains).
    pub ones: Vec<(usize, usize)>,
}

/// A training forward's dropout context: the key (its `layer` is replaced per layer) and the
/// batch index of the shard's first row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dropping {
    pub key: DropoutKey,
    pub row0: usize,
}

impl Dropping {
    /// The context of a training forward of shard `x` (`None` in predict and loss).
    pub fn for_shard(seed: u64, x: &ShardIn) -> Option<Dropping> {
        x.train_step.map(|step| Dropping {
            key: DropoutKey {
                seed,
                step,
                layer: 0,
            },
            row0: x.row0,
        })
    }
}

/// A stack of hidden layers, each `linear -> [layer norm] -> ReLU -> [inverted dropout]`
/// (dropout only in a training forward). mmoe's experts and towers and esmm's towers are
/// blocks; the logit layer after a tower is a plain [`Linear`].
#[derive(Clone, Debug, Default)]
pub(crate) struct MlpBlock {
    /// The linear layers (ReLU fused in when there is no layer norm).
    pub layers: Vec<Linear>,
    /// One per layer with layer norm, else empty.
    pub norms: Vec<LayerNorm>,
    /// Drop rate (0 = no dropout).
    pub dropout: f32,
    /// Dropout layer number of `layers[0]` (layer i uses `first_id + i`).
    pub first_id: u64,
}

/// Buffers of one [`MlpBlock`] for one shard.
#[derive(Clone, Debug, Default)]
pub(crate) struct MlpBlockWs {
    /// Each layer's output after ReLU and dropout, `[rows, width]`.
    pub acts: Vec<Vec<f32>>,
    /// Gradients w.r.t. `acts`.
    pub dacts: Vec<Vec<f32>>,
    xhat: Vec<Vec<f32>>,
    rstd: Vec<Vec<f32>>,
    mask: Vec<Vec<f32>>,
}

impl MlpBlock {
    /// Registers `{prefix}.{i}.weight` `[in, out]`, `{prefix}.{i}.bias` and, with layer norm,
    /// `{prefix}.{i}.ln.gain` / `{prefix}.{i}.ln.bias` for every width; takes dropout layer
    /// numbers from `next_id`.
    #[allow(clippy::too_many_arguments)]
    pub fn build(
        layout: &mut ParamLayout,
        inits: &mut Inits,
        init: DenseInit,
        prefix: &str,
        in_dim: usize,
        widths: &[usize],
        layer_norm: bool,
        dropout: f32,
        next_id: &mut u64,
    ) -> MlpBlock {
        let mut block = MlpBlock {
            dropout,
            first_id: *next_id,
            ..MlpBlock::default()
        };
        let mut in_dim = in_dim;
        for (i, &out) in widths.iter().enumerate() {
            let w = layout.add(format!("{prefix}.{i}.weight"), &[in_dim, out]);
            let b = layout.add(format!("{prefix}.{i}.bias"), &[out]);
            inits
                .uniform
                .push((w, in_dim * out, init.limit(in_dim, out)));
            block.layers.push(Linear {
                in_dim,
                out_dim: out,
                w,
                b,
                relu: !layer_norm,
            });
            if layer_norm {
                let gain = layout.add(format!("{prefix}.{i}.ln.gain"), &[out]);
                let bias = layout.add(format!("{prefix}.{i}.ln.bias"), &[out]);
                inits.ones.push((gain, out));
                block.norms.push(LayerNorm {
                    dim: out,
                    gain,
                    bias,
                });
            }
            in_dim = out;
        }
        *next_id += widths.len() as u64;
        block
    }

    /// Width of the block's output (`in_dim` when it has no layer).
    pub fn out_dim(&self, in_dim: usize) -> usize {
        self.layers.last().map_or(in_dim, |l| l.out_dim)
    }

    /// Sizes `ws` for `rows` rows.
    pub fn ensure(&self, ws: &mut MlpBlockWs, rows: usize) {
        let n = self.layers.len();
        let sized = |w: usize| vec![0.0f32; rows * w];
        ws.acts = self.layers.iter().map(|l| sized(l.out_dim)).collect();
        ws.dacts = self.layers.iter().map(|l| sized(l.out_dim)).collect();
        ws.xhat = self.norms.iter().map(|l| sized(l.dim)).collect();
        ws.rstd = self.norms.iter().map(|_| sized(1)).collect();
        ws.mask = if self.dropout > 0.0 {
            self.layers.iter().map(|l| sized(l.out_dim)).collect()
        } else {
            vec![Vec::new(); n]
        };
    }

    /// The block's output after [`MlpBlock::forward`] (`input` itself when it has no layer).
    pub fn output<'a>(&self, ws: &'a MlpBlockWs, input: &'a [f32]) -> &'a [f32] {
        ws.acts.last().map_or(input, |v| &v[..])
    }

    /// Forward for `rows` rows of `input`; `drop` is `Some` in a training forward only.
    pub fn forward(
        &self,
        p: &[f32],
        input: &[f32],
        rows: usize,
        ws: &mut MlpBlockWs,
        drop: Option<Dropping>,
        par: Compute,
    ) {
        for (i, l) in self.layers.iter().enumerate() {
            let (prev, cur) = ws.acts.split_at_mut(i);
            let x: &[f32] = if i == 0 { input } else { &prev[i - 1] };
            let y = &mut cur[0][..rows * l.out_dim];
            l.forward(p, x, rows, y, par);
            if let Some(ln) = self.norms.get(i) {
                ln.forward(p, y, rows, &mut ws.xhat[i], &mut ws.rstd[i]);
                relu_forward(y);
            }
            if let (Some(d), true) = (drop, self.dropout > 0.0) {
                let key = DropoutKey {
                    layer: self.first_id + i as u64,
                    ..d.key
                };
                let m = &mut ws.mask[i][..rows * l.out_dim];
                fill_mask(m, l.out_dim, d.row0, self.dropout, &key);
                apply_mask(y, m);
            }
        }
    }

    /// Backward after a TRAINING [`MlpBlock::forward`]; `ws.dacts.last()` holds dL/d(output).
    /// Accumulates parameter gradients into `grads`; writes (or, with `accumulate`, adds)
    /// dL/d(input) into `dx` = `(buffer, row stride, cols)` if given.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &[f32],
        input: &[f32],
        ws: &mut MlpBlockWs,
        rows: usize,
        grads: &mut [f32],
        mut dx: Option<(&mut [f32], usize, usize)>,
        accumulate: bool,
        par: Compute,
    ) {
        for (i, l) in self.layers.iter().enumerate().rev() {
            let x: &[f32] = if i == 0 { input } else { &ws.acts[i - 1] };
            let (lo, hi) = ws.dacts.split_at_mut(i);
            let dy = &mut hi[0][..rows * l.out_dim];
            let y = &ws.acts[i][..rows * l.out_dim];
            if self.dropout > 0.0 {
                apply_mask(dy, &ws.mask[i][..rows * l.out_dim]);
            }
            if let Some(ln) = self.norms.get(i) {
                relu_backward(dy, y);
                ln.backward(p, &ws.xhat[i], &ws.rstd[i], dy, rows, grads);
            }
            let (d, acc) = if i == 0 {
                (dx.take(), accumulate)
            } else {
                (Some((&mut lo[i - 1][..], l.in_dim, l.in_dim)), false)
            };
            l.backward_acc(p, x, y, dy, rows, grads, d, acc, par);
        }
    }

    /// FLOPs per sample of forward + backward; the first layer's input gradient spans
    /// `dx_cols` columns.
    pub fn flops_per_sample(&self, dx_cols: usize) -> f64 {
        let mut f = 0.0;
        for (i, l) in self.layers.iter().enumerate() {
            f += l.flops_per_sample(if i == 0 { dx_cols } else { l.in_dim });
        }
        f += self
            .norms
            .iter()
            .map(LayerNorm::flops_per_sample)
            .sum::<f64>();
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::GradCheck;

    fn pseudo(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| (sparta_mix::splitmix64_next(&mut s) >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }

    /// A block with layer norm and dropout in training mode (fixed key, so a fixed mask):
    /// its parameter and input gradients match finite differences of `sum(c * output)`.
    #[test]
    fn block_with_layer_norm_and_dropout_gradients() {
        let (rows, d_in) = (5, 6);
        let mut layout = ParamLayout::default();
        let mut inits = Inits::default();
        let mut id = 0;
        let block = MlpBlock::build(
            &mut layout,
            &mut inits,
            DenseInit::HeUniform,
            "b",
            d_in,
            &[7, 4],
            true,
            0.3,
            &mut id,
        );
        assert_eq!(id, 2);
        let names: Vec<&str> = layout.specs().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "b.0.weight",
                "b.0.bias",
                "b.0.ln.gain",
                "b.0.ln.bias",
                "b.1.weight",
                "b.1.bias",
                "b.1.ln.gain",
                "b.1.ln.bias"
            ]
        );
        let mut p = pseudo(layout.total(), 1);
        for &(off, len) in &inits.ones {
            for v in &mut p[off..off + len] {
                *v += 1.0;
            }
        }
        let x = pseudo(rows * d_in, 2);
        let c = pseudo(rows * 4, 3);
        let drop = Some(Dropping {
            key: DropoutKey {
                seed: 5,
                step: 9,
                layer: 0,
            },
            row0: 3,
        });
        let mut ws = MlpBlockWs::default();
        block.ensure(&mut ws, rows);
        let loss = |pp: &[f32], xx: &[f32], ws: &mut MlpBlockWs| -> f64 {
            block.forward(pp, xx, rows, ws, drop, Compute::SERIAL);
            let out = block.output(ws, xx);
            out.iter().zip(&c).map(|(&a, &b)| a as f64 * b as f64).sum()
        };
        loss(&p, &x, &mut ws);
        assert!(
            ws.mask.iter().flatten().any(|&m| m == 0.0),
            "some unit is dropped"
        );
        ws.dacts.last_mut().unwrap()[..rows * 4].copy_from_slice(&c);
        let mut grads = vec![0.0; p.len()];
        let mut dx = vec![0.0; rows * d_in];
        let x2 = x.clone();
        block.backward(
            &p,
            &x2,
            &mut ws,
            rows,
            &mut grads,
            Some((&mut dx, d_in, d_in)),
            false,
            Compute::SERIAL,
        );
        // a wider step than the default: layer norm's O(1) outputs put f32 rounding noise of
        // ~1e-6 into every loss, which a 2^-10 step would turn into ~5e-4 of slope noise
        let fd = GradCheck {
            eps: 1.0 / 256.0,
            ..GradCheck::default()
        };
        let check = |analytic: &[f32], at: &[f32], f: &mut dyn FnMut(&[f32]) -> f64| {
            let a: Vec<f64> = analytic.iter().map(|&v| v as f64).collect();
            let mut xs = at.to_vec();
            let rep = fd
                .check(&a, |i, d| {
                    let o = xs[i];
                    xs[i] = (o as f64 + d) as f32;
                    let l = f(&xs);
                    xs[i] = o;
                    l
                })
                .expect("gradient check");
            assert!(rep.checked > rep.skipped * 5, "{rep:?}");
        };
        let mut ws2 = MlpBlockWs::default();
        block.ensure(&mut ws2, rows);
        check(&grads, &p, &mut |pp| loss(pp, &x, &mut ws2));
        check(&dx, &x, &mut |xx| loss(&p, xx, &mut ws2));
        // a flipped parameter gradient fails the check
        let k = (0..grads.len())
            .max_by(|&a, &b| grads[a].abs().total_cmp(&grads[b].abs()))
            .unwrap();
        let mut bad = grads.clone();
        bad[k] = -bad[k];
        let a: Vec<f64> = bad.iter().map(|&v| v as f64).collect();
        let mut ps = p.clone();
        assert!(fd
            .check(&a, |i, d| {
                let o = ps[i];
                ps[i] = (o as f64 + d) as f32;
                let l = loss(&ps, &x, &mut ws2);
                ps[i] = o;
                l
            })
            .is_err());
    }
}
