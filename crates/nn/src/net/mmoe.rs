//! MMoE (Ma et al., "Modeling Task Relationships in Multi-task Learning with Multi-gate
//! Mixture-of-Experts", KDD 2018): `experts` expert MLPs on x0 = [emb | dense]; per task t a
//! gate `g_t = softmax(x0 W_t + b_t)` over the experts, the mixture `u_t = sum_k g_tk e_k`, and
//! a [`Tower`] on `u_t` to the task's logit.

use super::mlp::{Dropping, Inits, MlpBlock, MlpBlockWs};
use super::tower::{Tower, TowerSpec, TowerWs};
use super::{Net, ShardIn, Workspace};
use crate::config::ModelConfig;
use crate::gemm_ops::Compute;
use crate::layers::gate::{softmax_rows, softmax_rows_backward};
use crate::layers::kernels::dot;
use crate::layers::linear::Linear;
use crate::params::ParamLayout;

/// Experts, gates and towers bound to their parameters.
#[derive(Clone, Debug)]
pub(crate) struct Mmoe {
    /// `expert.{k}.{i}`: each `hidden` wide, ReLU on every layer.
    pub experts: Vec<MlpBlock>,
    /// `gate.{t}`: `[d0, K]` scores per task.
    pub gates: Vec<Linear>,
    /// `tower.{t}.{i}`: `tower_hidden` then the logit layer.
    pub towers: Vec<Tower>,
    /// Width H of every expert's output.
    pub expert_dim: usize,
}

/// One shard's mmoe buffers.
#[derive(Clone, Debug, Default)]
pub(crate) struct MmoeWs {
    experts: Vec<MlpBlockWs>,
    /// Per task: gate values `[rows, K]`.
    gates: Vec<Vec<f32>>,
    /// dL/d(gate scores) `[rows, K]` (one task at a time).
    dgate: Vec<f32>,
    /// Per task: the expert mixture `[rows, H]`.
    mixed: Vec<Vec<f32>>,
    /// dL/d(mixture) `[rows, H]` (one task at a time).
    dmixed: Vec<f32>,
    towers: Vec<TowerWs>,
}

impl Mmoe {
    pub fn build(cfg: &ModelConfig, layout: &mut ParamLayout, inits: &mut Inits) -> Mmoe {
        let d0 = cfg.input_dim();
        let (k, tasks) = (cfg.experts, cfg.num_tasks());
        let mut next_id = 0;
        let experts = (0..k)
            .map(|e| {
                MlpBlock::build(
                    layout,
                    inits,
                    cfg.init,
                    &format!("expert.{e}"),
                    d0,
                    &cfg.hidden,
                    cfg.layer_norm,
                    cfg.dropout,
                    &mut next_id,
                )
            })
            .collect::<Vec<_>>();
        let expert_dim = experts[0].out_dim(d0);
        let gates = (0..tasks)
            .map(|t| {
                let w = layout.add(format!("gate.{t}.weight"), &[d0, k]);
                let b = layout.add(format!("gate.{t}.bias"), &[k]);
                inits.uniform.push((w, d0 * k, cfg.init.limit(d0, k)));
                Linear {
                    in_dim: d0,
                    out_dim: k,
                    w,
                    b,
                    relu: false,
                }
            })
            .collect();
        let towers = (0..tasks)
            .map(|t| {
                let spec = TowerSpec {
                    prefix: &format!("tower.{t}"),
                    in_dim: expert_dim,
                    widths: &cfg.tower_hidden,
                    layer_norm: cfg.layer_norm,
                    dropout: cfg.dropout,
                };
                Tower::build(layout, inits, cfg.init, &spec, &mut next_id)
            })
            .collect();
        Mmoe {
            experts,
            gates,
            towers,
            expert_dim,
        }
    }

    pub fn ensure(&self, ws: &mut MmoeWs, rows: usize) {
        let (k, h) = (self.experts.len(), self.expert_dim);
        ws.experts = vec![MlpBlockWs::default(); k];
        for (e, w) in self.experts.iter().zip(&mut ws.experts) {
            e.ensure(w, rows);
        }
        ws.gates = vec![vec![0.0; rows * k]; self.gates.len()];
        ws.dgate = vec![0.0; rows * k];
        ws.mixed = vec![vec![0.0; rows * h]; self.towers.len()];
        ws.dmixed = vec![0.0; rows * h];
        ws.towers = vec![TowerWs::default(); self.towers.len()];
        for (t, w) in self.towers.iter().zip(&mut ws.towers) {
            t.ensure(w, rows);
        }
    }

    pub fn flops_per_sample(&self, emb_width: usize) -> f64 {
        let (k, h) = (self.experts.len(), self.expert_dim);
        let experts: f64 = self
            .experts
            .iter()
            .map(|e| e.flops_per_sample(emb_width))
            .sum();
        let gates: f64 = self
            .gates
            .iter()
            .map(|g| g.flops_per_sample(emb_width))
            .sum();
        // mixture forward (2 K H), its backward to the gates and the experts (4 K H)
        let mix = (6 * k * h * self.towers.len()) as f64;
        let towers: f64 = self.towers.iter().map(|t| t.flops_per_sample(h)).sum();
        experts + gates + mix + towers
    }
}

impl Net {
    pub(super) fn forward_mmoe(&self, p: &[f32], ws: &mut Workspace, x: &ShardIn, par: Compute) {
        let m = self.mmoe.as_ref().expect("mmoe net");
        let rows = x.rows;
        let drop = Dropping::for_shard(self.seed, x);
        self.fill_x0(ws, x);
        let Workspace {
            x0, mmoe, logit, ..
        } = ws;
        let (k, h, tasks) = (m.experts.len(), m.expert_dim, m.towers.len());
        for (e, w) in m.experts.iter().zip(&mut mmoe.experts) {
            e.forward(p, x0, rows, w, drop, par);
        }
        for t in 0..tasks {
            let g = &mut mmoe.gates[t][..rows * k];
            m.gates[t].forward(p, x0, rows, g, par);
            softmax_rows(g, k);
            let u = &mut mmoe.mixed[t][..rows * h];
            u.fill(0.0);
            for (e, (blk, w)) in m.experts.iter().zip(&mmoe.experts).enumerate() {
                let out = blk.output(w, x0);
                for r in 0..rows {
                    let gk = g[r * k + e];
                    for (a, &b) in u[r * h..(r + 1) * h]
                        .iter_mut()
                        .zip(&out[r * h..(r + 1) * h])
                    {
                        *a += gk * b;
                    }
                }
            }
            m.towers[t].forward(
                p,
                u,
                rows,
                &mut mmoe.towers[t],
                drop,
                (&mut logit[..], tasks, t),
                par,
            );
        }
    }

    /// Backward after a training [`Net::forward_mmoe`]; `ws.dlogit` holds dL/dlogit.
    pub(super) fn backward_mmoe(
        &self,
        p: &[f32],
        ws: &mut Workspace,
        rows: usize,
        d_emb: &mut [f32],
        par: Compute,
    ) {
        let m = self.mmoe.as_ref().expect("mmoe net");
        let fd = self.emb_width();
        let Workspace {
            x0,
            mmoe,
            dlogit,
            grads,
            ..
        } = ws;
        let (k, h, tasks) = (m.experts.len(), m.expert_dim, m.towers.len());
        d_emb[..rows * fd].fill(0.0);
        for w in &mut mmoe.experts {
            w.dacts.last_mut().expect("expert has a layer")[..rows * h].fill(0.0);
        }
        for t in 0..tasks {
            let du = &mut mmoe.dmixed[..rows * h];
            m.towers[t].backward(
                p,
                &mmoe.mixed[t],
                rows,
                &mut mmoe.towers[t],
                (&dlogit[..], tasks, t),
                grads,
                Some((&mut du[..], h, h)),
                false,
                par,
            );
            let g = &mmoe.gates[t][..rows * k];
            let dg = &mut mmoe.dgate[..rows * k];
            for (e, w) in mmoe.experts.iter_mut().enumerate() {
                let out = w.acts.last().expect("expert has a layer");
                let dout = w.dacts.last_mut().expect("expert has a layer");
                for r in 0..rows {
                    let (ur, er) = (&du[r * h..(r + 1) * h], &out[r * h..(r + 1) * h]);
                    dg[r * k + e] = dot(ur, er);
                    let gk = g[r * k + e];
                    for (d, &v) in dout[r * h..(r + 1) * h].iter_mut().zip(ur) {
                        *d += gk * v;
                    }
                }
            }
            softmax_rows_backward(g, dg, k);
            m.gates[t].backward_acc(
                p,
                x0,
                g,
                dg,
                rows,
                grads,
                Some((&mut d_emb[..], fd, fd)),
                true,
                par,
            );
        }
        for (e, w) in m.experts.iter().zip(&mut mmoe.experts) {
            e.backward(
                p,
                x0,
                w,
                rows,
                grads,
                Some((&mut d_emb[..], fd, fd)),
                true,
                par,
            );
        }
    }
}
