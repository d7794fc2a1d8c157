//! DIN's graph: every attended sequence field's slot of x0 = [emb | dense] replaced by its
//! target-attention pooling, then the MLP to one logit. With mean pooling (no [`Din`] parts)
//! x0 is [emb | dense] as given.

use super::{mlp, Net, ShardIn, Workspace};
use crate::config::{ModelConfig, SequencePooling};
use crate::gemm_ops::Compute;
use crate::layers::attention::{Attention, AttentionCache};
use crate::layers::linear::Linear;
use crate::params::ParamLayout;

/// One attended sequence: its attention unit and where its field and its target sit in one
/// sample's flattened embeddings.
#[derive(Clone, Debug)]
pub(crate) struct SeqAttention {
    pub unit: Attention,
    pub field_off: usize,
    pub target_off: usize,
}

/// din's attention parts, one per [`ModelConfig::sequences`] entry (attention pooling only).
#[derive(Clone, Debug)]
pub(crate) struct Din {
    pub seqs: Vec<SeqAttention>,
}

impl Din {
    /// Registers `attention.{k}.{i}.weight/bias` for every sequence; `None` unless din pools
    /// by attention.
    pub(super) fn build(
        cfg: &ModelConfig,
        layout: &mut ParamLayout,
        inits: &mut Vec<(usize, usize, f32)>,
    ) -> Option<Din> {
        if cfg.kind != crate::config::ModelKind::Din
            || cfg.sequence_pooling != SequencePooling::Attention
        {
            return None;
        }
        let seqs = cfg
            .sequences
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let dim = cfg.field_width(s.field);
                let mut widths = cfg.attention_hidden.clone();
                widths.push(1);
                let n_hidden = cfg.attention_hidden.len();
                let mut in_dim = 4 * dim;
                let mut layers = Vec::with_capacity(widths.len());
                for (i, &out) in widths.iter().enumerate() {
                    let w = layout.add(format!("attention.{k}.{i}.weight"), &[in_dim, out]);
                    let b = layout.add(format!("attention.{k}.{i}.bias"), &[out]);
                    inits.push((w, in_dim * out, cfg.init.limit(in_dim, out)));
                    layers.push(Linear {
                        in_dim,
                        out_dim: out,
                        w,
                        b,
                        relu: i < n_hidden,
                    });
                    in_dim = out;
                }
                SeqAttention {
                    unit: Attention {
                        dim,
                        max_len: s.max_len,
                        mlp: layers,
                    },
                    field_off: cfg.field_offset(s.field),
                    target_off: cfg.field_offset(s.target),
                }
            })
            .collect();
        Some(Din { seqs })
    }

    pub(super) fn flops_per_sample(&self) -> f64 {
        self.seqs.iter().map(|s| s.unit.flops_per_sample()).sum()
    }
}

/// Per-shard buffers of the attention units (per sequence: cache, targets, pooled vectors and
/// their gradients).
#[derive(Default)]
pub(crate) struct DinWorkspace {
    caches: Vec<AttentionCache>,
    /// `[rows, dim]` target embeddings, gathered from `emb`.
    t: Vec<Vec<f32>>,
    /// `[rows, dim]` pooled vectors, then dL/d(pooled).
    pooled: Vec<Vec<f32>>,
    /// `[rows, dim]` dL/dt.
    dt: Vec<Vec<f32>>,
}

impl DinWorkspace {
    pub(super) fn ensure(&mut self, din: &Din, rows: usize) {
        let n = din.seqs.len();
        self.caches.resize_with(n, AttentionCache::default);
        let buf = |s: &SeqAttention| vec![0.0; rows * s.unit.dim];
        self.t = din.seqs.iter().map(buf).collect();
        self.pooled = din.seqs.iter().map(buf).collect();
        self.dt = din.seqs.iter().map(buf).collect();
        for (s, c) in din.seqs.iter().zip(&mut self.caches) {
            s.unit.ensure_cache(c, rows);
        }
    }
}

impl Net {
    pub(super) fn forward_din(&self, p: &[f32], ws: &mut Workspace, x: &ShardIn, par: Compute) {
        let rows = x.rows;
        self.fill_x0(ws, x);
        // (a shard may be empty: its buffers are never sized then)
        if let Some(din) = self.din.as_ref().filter(|_| rows > 0) {
            let (fd, d0) = (self.emb_width(), self.input_dim());
            let dw = &mut ws.din;
            for (k, s) in din.seqs.iter().enumerate() {
                let d = s.unit.dim;
                let seq = &x.sequences[k];
                let t = &mut dw.t[k];
                for r in 0..rows {
                    t[r * d..(r + 1) * d].copy_from_slice(&x.emb[r * fd + s.target_off..][..d]);
                }
                let pooled = &mut dw.pooled[k];
                s.unit.forward(
                    p,
                    seq.values,
                    seq.lengths,
                    t,
                    rows,
                    &mut dw.caches[k],
                    pooled,
                    par,
                );
                for r in 0..rows {
                    ws.x0[r * d0 + s.field_off..][..d].copy_from_slice(&pooled[r * d..(r + 1) * d]);
                }
            }
        }
        mlp::forward(&self.mlp, p, &ws.x0, &mut ws.acts, rows, par);
        let out = ws.acts.last().expect("din has an MLP");
        ws.logit[..rows].copy_from_slice(&out[..rows]);
    }

    /// Backward after [`Net::forward_din`]; `ws.dlogit` holds dL/dlogit. An attended field's
    /// slot of `d_emb` is written as zero (its gradient goes to `d_seq`); its target's slot
    /// includes the attention's dL/dt.
    pub(super) fn backward_din(
        &self,
        p: &[f32],
        ws: &mut Workspace,
        x: &ShardIn,
        d_emb: &mut [f32],
        d_seq: &mut [&mut [f32]],
        par: Compute,
    ) {
        let rows = x.rows;
        let last = ws.dacts.last_mut().expect("din has an MLP");
        last[..rows].copy_from_slice(&ws.dlogit[..rows]);
        self.mlp_backward(p, ws, rows, d_emb, par);
        let Some(din) = self.din.as_ref().filter(|_| rows > 0) else {
            return;
        };
        let fd = self.emb_width();
        let dw = &mut ws.din;
        for (k, s) in din.seqs.iter().enumerate() {
            let d = s.unit.dim;
            let seq = &x.sequences[k];
            let dpooled = &mut dw.pooled[k];
            for r in 0..rows {
                let slot = &mut d_emb[r * fd + s.field_off..][..d];
                dpooled[r * d..(r + 1) * d].copy_from_slice(slot);
                slot.fill(0.0);
            }
            let dt = &mut dw.dt[k];
            s.unit.backward(
                p,
                seq.values,
                seq.lengths,
                &dw.t[k],
                rows,
                &mut dw.caches[k],
                dpooled,
                &mut ws.grads,
                d_seq[k],
                dt,
                par,
            );
            for r in 0..rows {
                let slot = &mut d_emb[r * fd + s.target_off..][..d];
                for (g, &v) in slot.iter_mut().zip(&dt[r * d..(r + 1) * d]) {
                    *g += v;
                }
            }
        }
    }
}
