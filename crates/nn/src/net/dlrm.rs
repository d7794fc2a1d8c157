//! DLRM's graph: bottom MLP on the dense features, dot interaction among [bottom output, field
//! embeddings], top MLP on [bottom output | dots] to one logit.

use super::{mlp, Net, ShardIn, Workspace};
use crate::gemm_ops::Compute;

impl Net {
    /// Width of the bottom MLP's output inside the top MLP's input (0 without dense features).
    fn bottom_width(&self) -> usize {
        self.bottom.last().map_or(0, |l| l.out_dim)
    }

    pub(super) fn forward_dlrm(&self, p: &[f32], ws: &mut Workspace, x: &ShardIn, par: Compute) {
        let rows = x.rows;
        let dot = self.dot.as_ref().expect("dlrm has a dot interaction");
        let (fd, db, ti) = (self.emb_width(), self.bottom_width(), self.mlp[0].in_dim);
        let nw = dot.n * dot.dim;
        mlp::forward(&self.bottom, p, x.dense, &mut ws.bottom_acts, rows, par);
        let bout: &[f32] = ws.bottom_acts.last().map(|v| &v[..]).unwrap_or(&[]);
        for r in 0..rows {
            let t = &mut ws.dot_t[r * nw..(r + 1) * nw];
            t[..db].copy_from_slice(&bout[r * db..(r + 1) * db]);
            t[db..].copy_from_slice(&x.emb[r * fd..(r + 1) * fd]);
            ws.top_in[r * ti..r * ti + db].copy_from_slice(&bout[r * db..(r + 1) * db]);
        }
        dot.forward(&ws.dot_t, rows, (&mut ws.top_in, ti, db));
        mlp::forward(&self.mlp, p, &ws.top_in, &mut ws.acts, rows, par);
        let out = ws.acts.last().expect("dlrm has a top MLP");
        ws.logit[..rows].copy_from_slice(&out[..rows]);
    }

    /// Backward after [`Net::forward_dlrm`]; `ws.dlogit` holds dL/dlogit.
    pub(super) fn backward_dlrm(
        &self,
        p: &[f32],
        ws: &mut Workspace,
        x: &ShardIn,
        d_emb: &mut [f32],
        par: Compute,
    ) {
        let rows = x.rows;
        let dot = self.dot.as_ref().expect("dlrm has a dot interaction");
        let (fd, db, ti) = (self.emb_width(), self.bottom_width(), self.mlp[0].in_dim);
        let nw = dot.n * dot.dim;
        let last = ws.dacts.last_mut().expect("dlrm has a top MLP");
        last[..rows].copy_from_slice(&ws.dlogit[..rows]);
        let dx = Some((&mut ws.dtop_in[..], ti, ti));
        mlp::backward(
            &self.mlp,
            p,
            &ws.top_in,
            &ws.acts,
            &mut ws.dacts,
            rows,
            &mut ws.grads,
            dx,
            par,
        );
        dot.backward(&ws.dot_t, (&ws.dtop_in, ti, db), rows, &mut ws.dot_dt);
        for r in 0..rows {
            d_emb[r * fd..(r + 1) * fd].copy_from_slice(&ws.dot_dt[r * nw + db..(r + 1) * nw]);
        }
        if let Some(dout) = ws.bottom_dacts.last_mut() {
            for r in 0..rows {
                let (a, b) = (
                    &ws.dot_dt[r * nw..r * nw + db],
                    &ws.dtop_in[r * ti..r * ti + db],
                );
                for ((o, &u), &v) in dout[r * db..(r + 1) * db].iter_mut().zip(a).zip(b) {
                    *o = u + v;
                }
            }
            mlp::backward(
                &self.bottom,
                p,
                x.dense,
                &ws.bottom_acts,
                &mut ws.bottom_dacts,
                rows,
                &mut ws.grads,
                None,
                par,
            );
        }
    }
}
