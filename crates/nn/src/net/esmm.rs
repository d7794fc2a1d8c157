//! ESMM (Ma et al., "Entire Space Multi-Task Model", SIGIR 2018): a CTR [`Tower`] and a CVR
//! [`Tower`] on x0 = [emb | dense], each `hidden` then one logit. The outputs are
//! pCTR = σ(z0) and pCTCVR = σ(z0)·σ(z1); the loss (see [`crate::layers::loss::ctcvr_bce`]) is
//! `w0 BCE(pCTR, click) + w1 BCE(pCTCVR, click·conversion)` over every sample, so the CVR
//! tower learns only through pCTCVR.

use super::mlp::{Dropping, Inits};
use super::tower::{Tower, TowerSpec, TowerWs};
use super::{Net, ShardIn, Workspace};
use crate::config::ModelConfig;
use crate::gemm_ops::Compute;
use crate::params::ParamLayout;

/// The two towers (`tower.0.*` CTR, `tower.1.*` CVR).
#[derive(Clone, Debug)]
pub(crate) struct Esmm {
    pub towers: Vec<Tower>,
}

/// One shard's esmm buffers.
#[derive(Clone, Debug, Default)]
pub(crate) struct EsmmWs {
    towers: Vec<TowerWs>,
}

impl Esmm {
    pub fn build(cfg: &ModelConfig, layout: &mut ParamLayout, inits: &mut Inits) -> Esmm {
        let mut next_id = 0;
        let towers = (0..2)
            .map(|t| {
                let spec = TowerSpec {
                    prefix: &format!("tower.{t}"),
                    in_dim: cfg.input_dim(),
                    widths: &cfg.hidden,
                    layer_norm: cfg.layer_norm,
                    dropout: cfg.dropout,
                };
                Tower::build(layout, inits, cfg.init, &spec, &mut next_id)
            })
            .collect();
        Esmm { towers }
    }

    pub fn ensure(&self, ws: &mut EsmmWs, rows: usize) {
        ws.towers = vec![TowerWs::default(); self.towers.len()];
        for (t, w) in self.towers.iter().zip(&mut ws.towers) {
            t.ensure(w, rows);
        }
    }

    pub fn flops_per_sample(&self, emb_width: usize) -> f64 {
        self.towers
            .iter()
            .map(|t| t.flops_per_sample(emb_width))
            .sum()
    }
}

impl Net {
    pub(super) fn forward_esmm(&self, p: &[f32], ws: &mut Workspace, x: &ShardIn, par: Compute) {
        let m = self.esmm.as_ref().expect("esmm net");
        let drop = Dropping::for_shard(self.seed, x);
        self.fill_x0(ws, x);
        let Workspace {
            x0, esmm, logit, ..
        } = ws;
        let n = m.towers.len();
        for (t, (tower, w)) in m.towers.iter().zip(&mut esmm.towers).enumerate() {
            tower.forward(p, x0, x.rows, w, drop, (&mut logit[..], n, t), par);
        }
    }

    /// Backward after a training [`Net::forward_esmm`]; `ws.dlogit` holds dL/dlogit.
    pub(super) fn backward_esmm(
        &self,
        p: &[f32],
        ws: &mut Workspace,
        rows: usize,
        d_emb: &mut [f32],
        par: Compute,
    ) {
        let m = self.esmm.as_ref().expect("esmm net");
        let fd = self.emb_width();
        let Workspace {
            x0,
            esmm,
            dlogit,
            grads,
            ..
        } = ws;
        d_emb[..rows * fd].fill(0.0);
        let n = m.towers.len();
        for (t, (tower, w)) in m.towers.iter().zip(&mut esmm.towers).enumerate() {
            tower.backward(
                p,
                x0,
                rows,
                w,
                (&dlogit[..], n, t),
                grads,
                Some((&mut d_emb[..], fd, fd)),
                true,
                par,
            );
        }
    }
}
