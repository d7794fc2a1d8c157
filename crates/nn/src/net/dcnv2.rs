//! DCN-v2's graph: the matrix cross tower on x0, the MLP beside it (`parallel`, on x0) or on top
//! of it (`stacked`, on the tower's output), and the [`ConcatHead`] to one logit.
//!
//! [`ConcatHead`]: crate::layers::head::ConcatHead

use super::{mlp, Net, ShardIn, Workspace};
use crate::config::{CrossStructure, ModelConfig};
use crate::gemm_ops::Compute;
use crate::layers::cross_v2::{CrossMatrix, CrossV2};
use crate::params::ParamLayout;

/// Registers the cross layers' parameters (`cross.{l}.weight` `[d, d]` for full rank; else
/// `cross.{l}.v` `[d, K r]`, `cross.{l}.u` `[K r, d]` and, for K > 1, `cross.{l}.gate` `[d, K]`;
/// then `cross.{l}.bias` `[d]`) and their init ranges.
pub(super) fn build_cross(
    cfg: &ModelConfig,
    layout: &mut ParamLayout,
    inits: &mut Vec<(usize, usize, f32)>,
) -> Vec<CrossV2> {
    let d = cfg.input_dim();
    let (r, k) = (cfg.cross_rank, cfg.cross_experts);
    let mut add = |name: String, shape: &[usize], init: bool| {
        let off = layout.add(name, shape);
        if init {
            inits.push((off, shape[0] * shape[1], cfg.init.limit(shape[0], shape[1])));
        }
        off
    };
    (0..cfg.cross_layers)
        .map(|l| {
            let m = if r == 0 {
                CrossMatrix::Full {
                    w: add(format!("cross.{l}.weight"), &[d, d], true),
                }
            } else {
                let v = add(format!("cross.{l}.v"), &[d, k * r], true);
                let u = add(format!("cross.{l}.u"), &[k * r, d], true);
                let gate = (k > 1).then(|| add(format!("cross.{l}.gate"), &[d, k], true));
                CrossMatrix::LowRank {
                    rank: r,
                    experts: k,
                    v,
                    u,
                    gate,
                }
            };
            let b = add(format!("cross.{l}.bias"), &[d], false);
            CrossV2 { dim: d, m, b }
        })
        .collect()
}

impl Net {
    pub(super) fn forward_dcnv2(&self, p: &[f32], ws: &mut Workspace, x: &ShardIn, par: Compute) {
        let rows = x.rows;
        self.fill_x0(ws, x);
        for (l, c) in self.cross_v2.iter().enumerate() {
            let (prev, cur) = ws.cross_x.split_at_mut(l);
            let xl: &[f32] = if l == 0 { &ws.x0 } else { &prev[l - 1] };
            c.forward(p, &ws.x0, xl, rows, &mut cur[0], &mut ws.cross_v2[l], par);
        }
        let xc: &[f32] = ws.cross_x.last().unwrap_or(&ws.x0);
        let mlp_in: &[f32] = match self.structure {
            CrossStructure::Parallel => &ws.x0,
            CrossStructure::Stacked => xc,
        };
        mlp::forward(&self.mlp, p, mlp_in, &mut ws.acts, rows, par);
        let deep: &[f32] = ws.acts.last().map(|v| &v[..]).unwrap_or(&[]);
        let (xa, xb) = match self.structure {
            CrossStructure::Parallel => (xc, deep),
            CrossStructure::Stacked if deep.is_empty() => (xc, deep),
            CrossStructure::Stacked => (deep, &[][..]),
        };
        let head = self.head.as_ref().expect("dcnv2 has a head");
        head.forward(p, xa, xb, rows, &mut ws.logit[..rows]);
    }

    /// Backward after [`Net::forward_dcnv2`]; `ws.dlogit` holds dL/dlogit.
    pub(super) fn backward_dcnv2(
        &self,
        p: &[f32],
        ws: &mut Workspace,
        rows: usize,
        d_emb: &mut [f32],
        par: Compute,
    ) {
        let (fd, d0) = (self.emb_width(), self.input_dim());
        let head = self.head.as_ref().expect("dcnv2 has a head");
        let xc: &[f32] = ws.cross_x.last().unwrap_or(&ws.x0);
        let has_mlp = !self.mlp.is_empty();
        match self.structure {
            CrossStructure::Parallel => {
                let xb: &[f32] = ws.acts.last().map(|v| &v[..]).unwrap_or(&[]);
                let dxb: &mut [f32] = ws.dacts.last_mut().map(|v| &mut v[..]).unwrap_or(&mut []);
                head.backward(
                    p,
                    xc,
                    xb,
                    &ws.dlogit,
                    rows,
                    &mut ws.grads,
                    &mut ws.cross_g,
                    dxb,
                );
                let dx = has_mlp.then_some((&mut d_emb[..], fd, fd));
                mlp::backward(
                    &self.mlp,
                    p,
                    &ws.x0,
                    &ws.acts,
                    &mut ws.dacts,
                    rows,
                    &mut ws.grads,
                    dx,
                    par,
                );
                if !has_mlp {
                    d_emb[..rows * fd].fill(0.0);
                }
            }
            CrossStructure::Stacked if !has_mlp => {
                head.backward(
                    p,
                    xc,
                    &[],
                    &ws.dlogit,
                    rows,
                    &mut ws.grads,
                    &mut ws.cross_g,
                    &mut [],
                );
                d_emb[..rows * fd].fill(0.0);
            }
            CrossStructure::Stacked => {
                let deep = ws.acts.last().expect("stacked dcnv2 has an MLP");
                let ddeep = ws.dacts.last_mut().expect("stacked dcnv2 has an MLP");
                head.backward(
                    p,
                    deep,
                    &[],
                    &ws.dlogit,
                    rows,
                    &mut ws.grads,
                    ddeep,
                    &mut [],
                );
                let dx = Some((&mut ws.cross_g[..], d0, d0));
                mlp::backward(
                    &self.mlp,
                    p,
                    xc,
                    &ws.acts,
                    &mut ws.dacts,
                    rows,
                    &mut ws.grads,
                    dx,
                    par,
                );
                d_emb[..rows * fd].fill(0.0);
            }
        }
        // ws.cross_g holds dL/dx_L; d_emb the MLP's share of dL/d(emb) (parallel) or zeros.
        ws.dx0[..rows * d0].fill(0.0);
        for (l, c) in self.cross_v2.iter().enumerate().rev() {
            let xl: &[f32] = if l == 0 { &ws.x0 } else { &ws.cross_x[l - 1] };
            c.backward(
                p,
                &ws.x0,
                xl,
                &ws.cross_v2[l],
                &mut ws.cross_g,
                &mut ws.cross_v2_scratch,
                rows,
                &mut ws.grads,
                &mut ws.dx0,
                par,
            );
        }
        // x_0 is both the tower's input (cross_g now) and every layer's x0 (dx0).
        for r in 0..rows {
            let (g, g0) = (
                &ws.cross_g[r * d0..r * d0 + fd],
                &ws.dx0[r * d0..r * d0 + fd],
            );
            for ((d, &a), &b) in d_emb[r * fd..(r + 1) * fd].iter_mut().zip(g).zip(g0) {
                *d += a + b;
            }
        }
    }
}
