//! A task tower: an [`MlpBlock`] then a linear layer to one logit, written into column `t` of
//! the shard's `[rows, num_tasks]` logits (mmoe's and esmm's towers).

use super::mlp::{Dropping, Inits, MlpBlock, MlpBlockWs};
use crate::config::DenseInit;
use crate::gemm_ops::Compute;
use crate::layers::linear::Linear;
use crate::params::ParamLayout;

/// Hidden block + logit layer of one task.
#[derive(Clone, Debug)]
pub(crate) struct Tower {
    pub block: MlpBlock,
    /// `[block out, 1]`, no activation.
    pub head: Linear,
}

/// Buffers of one [`Tower`] for one shard.
#[derive(Clone, Debug, Default)]
pub(crate) struct TowerWs {
    block: MlpBlockWs,
    /// The logit column, `[rows]`, and its gradient.
    z: Vec<f32>,
    dz: Vec<f32>,
}

/// How a tower is built: `{prefix}.{i}` for the hidden `widths`, `{prefix}.{widths.len()}` for
/// the logit layer.
pub(crate) struct TowerSpec<'a> {
    pub prefix: &'a str,
    pub in_dim: usize,
    pub widths: &'a [usize],
    pub layer_norm: bool,
    pub dropout: f32,
}

impl Tower {
    pub fn build(
        layout: &mut ParamLayout,
        inits: &mut Inits,
        init: DenseInit,
        spec: &TowerSpec,
        next_id: &mut u64,
    ) -> Tower {
        let block = MlpBlock::build(
            layout,
            inits,
            init,
            spec.prefix,
            spec.in_dim,
            spec.widths,
            spec.layer_norm,
            spec.dropout,
            next_id,
        );
        let h = block.out_dim(spec.in_dim);
        let n = spec.widths.len();
        let w = layout.add(format!("{}.{n}.weight", spec.prefix), &[h, 1]);
        let b = layout.add(format!("{}.{n}.bias", spec.prefix), &[1]);
        inits.uniform.push((w, h, init.limit(h, 1)));
        let head = Linear {
            in_dim: h,
            out_dim: 1,
            w,
            b,
            relu: false,
        };
        Tower { block, head }
    }

    pub fn ensure(&self, ws: &mut TowerWs, rows: usize) {
        self.block.ensure(&mut ws.block, rows);
        ws.z = vec![0.0; rows];
        ws.dz = vec![0.0; rows];
    }

    /// Forward on `input`; writes the logits into `logits[r * tasks + t]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        p: &[f32],
        input: &[f32],
        rows: usize,
        ws: &mut TowerWs,
        drop: Option<Dropping>,
        (logits, tasks, t): (&mut [f32], usize, usize),
        par: Compute,
    ) {
        self.block.forward(p, input, rows, &mut ws.block, drop, par);
        let h = self.block.output(&ws.block, input);
        self.head.forward(p, h, rows, &mut ws.z, par);
        for (r, &z) in ws.z[..rows].iter().enumerate() {
            logits[r * tasks + t] = z;
        }
    }

    /// Backward after a training forward, reading dL/dlogit from `dlogits[r * tasks + t]`.
    /// Writes (or with `accumulate` adds) dL/d(input) into `dx` if given.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &[f32],
        input: &[f32],
        rows: usize,
        ws: &mut TowerWs,
        (dlogits, tasks, t): (&[f32], usize, usize),
        grads: &mut [f32],
        dx: Option<(&mut [f32], usize, usize)>,
        accumulate: bool,
        par: Compute,
    ) {
        for (r, d) in ws.dz[..rows].iter_mut().enumerate() {
            *d = dlogits[r * tasks + t];
        }
        if self.block.layers.is_empty() {
            let z = &ws.z;
            self.head
                .backward_acc(p, input, z, &mut ws.dz, rows, grads, dx, accumulate, par);
            return;
        }
        let h = self.block.out_dim(0);
        let x = ws.block.acts.last().expect("block has a layer");
        let dh = ws.block.dacts.last_mut().expect("block has a layer");
        self.head.backward(
            p,
            x,
            &ws.z,
            &mut ws.dz,
            rows,
            grads,
            Some((&mut dh[..], h, h)),
            par,
        );
        self.block
            .backward(p, input, &mut ws.block, rows, grads, dx, accumulate, par);
    }

    /// FLOPs per sample, forward + backward; the input gradient spans `dx_cols` columns.
    pub fn flops_per_sample(&self, dx_cols: usize) -> f64 {
        let head_dx = if self.block.layers.is_empty() {
            dx_cols
        } else {
            self.head.in_dim
        };
        self.block.flops_per_sample(dx_cols) + self.head.flops_per_sample(head_dx)
    }
}
