//! The loss over a shard's logits (`[rows, tasks]`), weighted by task and by sample:
//! `sum_t w_t sum_i s_i BCE_t(i)` (divided by the WHOLE batch's rows by the caller, as Keras'
//! SUM_OVER_BATCH_SIZE), its gradient w.r.t. the logits, and the probabilities predict reports.
//! Every kind has one logit per task and a sigmoid per task, except esmm, whose second output is
//! pCTCVR = σ(z0)·σ(z1) (see [`ctcvr_bce`]).

use super::{Net, ShardIn, Workspace};
use crate::config::ModelKind;
use crate::layers::loss::{bce_forward_backward, bce_with_logits, ctcvr_bce, sigmoid};

impl Net {
    fn num_tasks(&self) -> usize {
        self.task_weights.len()
    }

    /// One row's weighted loss (sample weight not applied) and, if `dz` is given, its gradient
    /// w.r.t. the row's logits (multi-task kinds).
    fn row_loss(&self, z: &[f32], y: &[f32], dz: Option<(&mut [f32], f32)>) -> f64 {
        let w = &self.task_weights;
        if self.kind == ModelKind::Esmm {
            let (w0, w1) = (w[0] as f64, w[1] as f64);
            let (l1, g0, g1) = ctcvr_bce(z[0], z[1], y[0] * y[1]);
            if let Some((d, scale)) = dz {
                let g_ctr = (sigmoid(z[0]) - y[0]) as f64;
                d[0] = ((w0 * g_ctr + w1 * g0) * scale as f64) as f32;
                d[1] = ((w1 * g1) * scale as f64) as f32;
            }
            return w0 * bce_with_logits(z[0], y[0]) + w1 * l1;
        }
        let mut sum = 0.0;
        match dz {
            Some((d, scale)) => {
                for t in 0..z.len() {
                    sum += w[t] as f64 * bce_with_logits(z[t], y[t]);
                    d[t] = (sigmoid(z[t]) - y[t]) * (w[t] * scale);
                }
            }
            None => {
                for t in 0..z.len() {
                    sum += w[t] as f64 * bce_with_logits(z[t], y[t]);
                }
            }
        }
        sum
    }

    /// The shard's loss SUM after a forward; writes dL/dlogit into `ws.dlogit` (`scale` is
    /// 1 / the whole batch's rows).
    pub(super) fn objective_backward(&self, ws: &mut Workspace, x: &ShardIn, scale: f32) -> f64 {
        let (rows, n) = (x.rows, self.num_tasks());
        let weights = (!x.weights.is_empty()).then_some(x.weights);
        if n == 1 && self.kind != ModelKind::Esmm {
            let w0 = self.task_weights[0];
            let sum = bce_forward_backward(
                &ws.logit[..rows],
                x.labels,
                weights,
                scale * w0,
                &mut ws.dlogit[..rows],
            );
            return sum * w0 as f64;
        }
        let mut sum = 0.0;
        for r in 0..rows {
            let s = weights.map_or(1.0, |w| w[r]);
            let (z, y) = (&ws.logit[r * n..(r + 1) * n], &x.labels[r * n..(r + 1) * n]);
            let d = &mut ws.dlogit[r * n..(r + 1) * n];
            sum += s as f64 * self.row_loss(z, y, Some((d, s * scale)));
        }
        sum
    }

    /// The shard's loss SUM after a forward (no gradient).
    pub(crate) fn objective_loss(&self, ws: &Workspace, x: &ShardIn) -> f64 {
        let (rows, n) = (x.rows, self.num_tasks());
        let weights = (!x.weights.is_empty()).then_some(x.weights);
        if n == 1 && self.kind != ModelKind::Esmm {
            let z = &ws.logit[..rows];
            let sum: f64 = match weights {
                None => z
                    .iter()
                    .zip(x.labels)
                    .map(|(&z, &y)| bce_with_logits(z, y))
                    .sum(),
                Some(w) => z
                    .iter()
                    .zip(x.labels)
                    .zip(w)
                    .map(|((&z, &y), &s)| s as f64 * bce_with_logits(z, y))
                    .sum(),
            };
            return sum * self.task_weights[0] as f64;
        }
        (0..rows)
            .map(|r| {
                let s = weights.map_or(1.0, |w| w[r]) as f64;
                let (z, y) = (&ws.logit[r * n..(r + 1) * n], &x.labels[r * n..(r + 1) * n]);
                s * self.row_loss(z, y, None)
            })
            .sum()
    }

    /// Each row's `num_tasks` probabilities (`out`, `[rows, tasks]`) after a forward.
    pub(crate) fn probabilities(&self, ws: &Workspace, rows: usize, out: &mut [f32]) {
        let n = self.num_tasks();
        for (o, &z) in out.iter_mut().zip(&ws.logit[..rows * n]) {
            *o = sigmoid(z);
        }
        if self.kind == ModelKind::Esmm {
            for row in out[..rows * n].chunks_exact_mut(n) {
                row[1] *= row[0];
            }
        }
    }
}
