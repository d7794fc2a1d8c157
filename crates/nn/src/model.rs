//! [`Model`]: parameters + optimizer state + per-shard workspaces + thread pool.

use rayon::prelude::*;

use crate::config::{ModelConfig, ParallelMode};
use crate::gemm_ops::Compute;
use crate::net::{Net, SequenceIn, ShardIn, Workspace};
use crate::optim::{self, OptimizerState};
use crate::params::{ParamLayout, ParamSpec};
use crate::NnError;

/// Parameters per part of the parallel optimizer pass (64 KiB of each buffer).
const OPT_CHUNK: usize = 16 * 1024;

/// The next part of an optimizer slot, or an empty one where the optimizer keeps none.
fn next_part<'a>(it: &mut Option<std::slice::ChunksMut<'a, f32>>) -> &'a mut [f32] {
    it.as_mut().and_then(|c| c.next()).unwrap_or_default()
}

/// One part of the optimizer pass: values, summed gradients, the two optimizer slots (empty
/// where the optimizer keeps none) and the other shards' gradients of the same parameters.
type OptPart<'a> = (
    &'a mut [f32],
    &'a mut [f32],
    &'a mut [f32],
    &'a mut [f32],
    Vec<&'a mut [f32]>,
);

/// One batch as seen by the dense network. All buffers are row-major.
#[derive(Clone, Copy, Debug)]
pub struct ModelBatch<'a> {
    /// Number of samples.
    pub rows: usize,
    /// `rows * num_fields * emb_dim` deep embeddings, laid out (sample, field, dim).
    pub emb: &'a [f32],
    /// `rows` per-sample sums of the first-order (wide) weights; ignored by dcn, dcnv2 and dlrm
    /// (may be empty, which means zeros).
    pub wide: &'a [f32],
    /// `rows * num_dense` dense features (already transformed).
    pub dense: &'a [f32],
    /// `rows * num_tasks` labels in {0, 1}, row-major (row r's task t at `r * num_tasks + t`,
    /// in [`ModelConfig::tasks`] order); may be empty for prediction.
    pub labels: &'a [f32],
    /// `rows` sample weights (>= 0) scaling each row's loss; empty means every weight is 1.
    pub weights: &'a [f32],
    /// One block per [`ModelConfig::sequences`] entry, for the models that attend over a
    /// sequence (din); may be empty for the others.
    pub sequences: &'a [SequenceIn<'a>],
}

/// A dense CTR model (wdl, deepfm, dcn, dcnv2, dlrm, din; multi-task mmoe and esmm).
///
/// Gradients of the dense parameters accumulate (sum) over calls of
/// [`Model::forward_backward`] until [`Model::apply_gradients`] applies and clears them.
pub struct Model {
    cfg: ModelConfig,
    net: Net,
    layout: ParamLayout,
    values: Vec<f32>,
    opt: OptimizerState,
    shards: Vec<Workspace>,
    pool: Option<rayon::ThreadPool>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("cfg", &self.cfg)
            .field("num_params", &self.values.len())
            .finish()
    }
}

impl Model {
    /// Validates `cfg`, builds and initializes the network.
    pub fn new(cfg: ModelConfig) -> Result<Model, NnError> {
        cfg.validate()?;
        let mut layout = ParamLayout::default();
        let (net, values) = Net::build(&cfg, &mut layout);
        let opt = OptimizerState::new(&cfg.optimizer, layout.total());
        let n_ws = match cfg.parallel {
            ParallelMode::Shard => cfg.threads,
            ParallelMode::Gemm => 1,
        };
        let shards = (0..n_ws)
            .map(|_| Workspace::new(&net, layout.total()))
            .collect();
        let pool = if cfg.threads > 1 {
            let p = rayon::ThreadPoolBuilder::new()
                .num_threads(cfg.threads)
                .thread_name(|i| format!("sparta-nn-{i}"))
                .build()
                .map_err(|e| NnError::ThreadPool(e.to_string()))?;
            Some(p)
        } else {
            None
        };
        tracing::debug!(kind = ?cfg.kind, params = layout.total(), threads = cfg.threads, precision = ?cfg.precision, "dense model built");
        if cfg.precision == crate::Precision::Bf16 {
            let kernel = crate::gemm_ops::bf16_kernel();
            if kernel == crate::gemm_ops::Bf16Kernel::Rounded {
                tracing::warn!(
                    "model.precision = \"bf16\": this CPU (or kernel) offers neither AMX-BF16 \
                     nor AVX512-BF16, so the GEMMs round their operands to bf16 on the f32 \
                     path: the same results, slower than f32"
                );
            } else {
                tracing::info!(kernel = kernel.name(), "bf16 GEMMs");
            }
        }
        Ok(Model {
            cfg,
            net,
            layout,
            values,
            opt,
            shards,
            pool,
        })
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Whether the caller's wide sums enter the logit (wdl and deepfm).
    pub fn uses_wide(&self) -> bool {
        self.net.bias.is_some()
    }

    /// Number of objectives: outputs per row of [`Model::predict`], labels per row.
    pub fn num_tasks(&self) -> usize {
        self.cfg.num_tasks()
    }

    /// The objectives' names, in output order (`["ctr"]` for a single-task model).
    pub fn task_names(&self) -> Vec<String> {
        self.cfg.task_names()
    }

    /// Whether the model reads the sequence blocks position by position (din with attention
    /// pooling): it needs [`ModelBatch::sequences`] and [`Model::forward_backward_seq`].
    pub fn attends(&self) -> bool {
        self.net.din.is_some()
    }

    /// Number of dense parameters.
    pub fn num_params(&self) -> usize {
        self.values.len()
    }

    /// FLOPs per sample of forward + backward (GEMMs and elementwise layers, not the optimizer).
    pub fn flops_per_sample(&self) -> f64 {
        self.net.flops_per_sample()
    }

    fn check_batch(&self, b: &ModelBatch, need_labels: bool) {
        let fd = self.net.emb_width();
        assert_eq!(
            b.emb.len(),
            b.rows * fd,
            "emb must be rows * num_fields * emb_dim"
        );
        assert_eq!(
            b.dense.len(),
            b.rows * self.net.num_dense,
            "dense must be rows * num_dense"
        );
        assert!(
            b.wide.is_empty() || b.wide.len() == b.rows,
            "wide must be empty or rows long"
        );
        if need_labels {
            assert_eq!(
                b.labels.len(),
                b.rows * self.num_tasks(),
                "labels must be rows * num_tasks long"
            );
        }
        assert!(
            b.weights.is_empty() || b.weights.len() == b.rows,
            "weights must be empty or rows long"
        );
        if self.attends() {
            self.check_sequences(b);
        }
    }

    fn check_sequences(&self, b: &ModelBatch) {
        let specs = &self.cfg.sequences;
        assert_eq!(
            b.sequences.len(),
            specs.len(),
            "din attends over {} sequences: the batch must carry one block per \
             ModelConfig::sequences entry",
            specs.len()
        );
        for (k, (s, spec)) in b.sequences.iter().zip(specs).enumerate() {
            let d = self.cfg.field_width(spec.field);
            assert_eq!(
                s.values.len(),
                b.rows * spec.max_len * d,
                "sequences[{k}].values must be rows * max_len ({}) * dim ({d})",
                spec.max_len
            );
            assert_eq!(
                s.lengths.len(),
                b.rows,
                "sequences[{k}].lengths must be rows long"
            );
            if let Some(r) = s
                .lengths
                .iter()
                .position(|&l| l == 0 || l as usize > spec.max_len)
            {
                panic!(
                    "sequences[{k}].lengths[{r}] = {} must be in 1..={}",
                    s.lengths[r], spec.max_len
                );
            }
        }
    }

    /// Per-row width of each sequence block (`max_len * dim`); empty unless the model attends.
    fn sequence_widths(&self) -> Vec<usize> {
        if !self.attends() {
            return Vec::new();
        }
        self.cfg
            .sequences
            .iter()
            .map(|s| s.max_len * self.cfg.field_width(s.field))
            .collect()
    }

    /// Runs `f` on every shard of the batch (in parallel when sharding), splitting `out_a`
    /// (`a_width` per row), `out_b` (1 per row, or empty), `out_p` (one per row and task, or
    /// empty), the sequence blocks and `out_seq`
    /// (one buffer per sequence block, or empty) by rows. `train_step` is the optimizer step of a
    /// training pass (dropout on). Returns the summed result.
    #[allow(clippy::too_many_arguments)]
    fn run_shards<F>(
        &mut self,
        b: &ModelBatch,
        train_step: Option<u64>,
        out_a: &mut [f32],
        a_width: usize,
        out_b: &mut [f32],
        out_p: &mut [f32],
        out_seq: &mut [&mut [f32]],
        f: F,
    ) -> f64
    where
        F: Fn(
                &Net,
                &[f32],
                &mut Workspace,
                &ShardIn,
                Compute,
                &mut [f32],
                &mut [f32],
                &mut [f32],
                &mut [&mut [f32]],
            ) -> f64
            + Sync,
    {
        let seq_widths = self.sequence_widths();
        let (net, values) = (&self.net, &self.values[..]);
        let nd = net.num_dense;
        let fd = net.emb_width();
        let nt = self.cfg.num_tasks();
        let (gemm_par, n) = match (self.cfg.parallel, &self.pool) {
            (ParallelMode::Gemm, Some(_)) => (Compute::rayon(self.cfg.threads), 1),
            _ => (Compute::SERIAL, self.shards.len().min(b.rows).max(1)),
        };
        let gemm_par = gemm_par.with_precision(self.cfg.precision);
        let chunk = b.rows.div_ceil(n).max(1);
        let mut tasks = Vec::with_capacity(n);
        let (mut rest_a, mut rest_b, mut rest_p) = (out_a, out_b, out_p);
        let mut rest_seq: Vec<&mut [f32]> = out_seq.iter_mut().map(|s| &mut **s).collect();
        for (i, ws) in self.shards.iter_mut().take(n).enumerate() {
            let lo = (i * chunk).min(b.rows);
            let hi = ((i + 1) * chunk).min(b.rows);
            let rows = hi - lo;
            let (a, ra) = std::mem::take(&mut rest_a).split_at_mut(rows * a_width);
            rest_a = ra;
            let bl = if rest_b.is_empty() { 0 } else { rows };
            let (bb, rb) = std::mem::take(&mut rest_b).split_at_mut(bl);
            rest_b = rb;
            let pl = if rest_p.is_empty() { 0 } else { rows * nt };
            let (pp, rp) = std::mem::take(&mut rest_p).split_at_mut(pl);
            rest_p = rp;
            let seq_out: Vec<&mut [f32]> = rest_seq
                .iter_mut()
                .zip(&seq_widths)
                .map(|(rest, &w)| {
                    let (mine, more) = std::mem::take(rest).split_at_mut(rows * w);
                    *rest = more;
                    mine
                })
                .collect();
            let sequences = b
                .sequences
                .iter()
                .zip(&seq_widths)
                .map(|(s, &w)| SequenceIn {
                    values: &s.values[lo * w..hi * w],
                    lengths: &s.lengths[lo..hi],
                })
                .collect();
            let x = ShardIn {
                rows,
                emb: &b.emb[lo * fd..hi * fd],
                wide: if b.wide.is_empty() {
                    &[]
                } else {
                    &b.wide[lo..hi]
                },
                dense: &b.dense[lo * nd..hi * nd],
                labels: if b.labels.is_empty() {
                    &[]
                } else {
                    &b.labels[lo * nt..hi * nt]
                },
                weights: if b.weights.is_empty() {
                    &[]
                } else {
                    &b.weights[lo..hi]
                },
                row0: lo,
                train_step,
                sequences,
            };
            tasks.push((ws, x, a, bb, pp, seq_out));
        }
        type Task<'t> = (
            &'t mut Workspace,
            ShardIn<'t>,
            &'t mut [f32],
            &'t mut [f32],
            &'t mut [f32],
            Vec<&'t mut [f32]>,
        );
        let run =
            |(ws, x, a, bb, pp, mut ds): Task| f(net, values, ws, &x, gemm_par, a, bb, pp, &mut ds);
        match &self.pool {
            Some(pool) => pool.install(|| tasks.into_par_iter().map(run).sum()),
            None => tasks.into_iter().map(run).sum(),
        }
    }

    /// Forward + backward of the loss `sum_t w_t sum_i s_i BCE_t(i) / rows` over the batch
    /// (`w_t` the task weights, `s_i` the sample weights; one task and no weights: the mean
    /// BCE-with-logits). Dropout (if configured) is on, its masks keyed by the optimizer step.
    ///
    /// Overwrites `d_emb` (`rows * F * D`) with dLoss/d(emb) and `d_wide` (`rows`, or empty to
    /// skip; zeros except for wdl and deepfm) with dLoss/d(wide_i) = w_0 s_i (p_i - y_i) / rows.
    /// Accumulates the dense parameter gradients internally and returns the loss.
    ///
    /// # Panics
    /// If the model [attends](Model::attends): use [`Model::forward_backward_seq`].
    pub fn forward_backward(
        &mut self,
        batch: &ModelBatch,
        d_emb: &mut [f32],
        d_wide: &mut [f32],
    ) -> f32 {
        assert!(
            !self.attends(),
            "din with attention pooling sends its sequence gradients to d_seq: call \
             Model::forward_backward_seq"
        );
        self.forward_backward_seq(batch, d_emb, d_wide, &mut [])
    }

    /// [`Model::forward_backward`] that also returns the gradient of every sequence block:
    /// `d_seq[k]` (`rows * max_len * dim` of [`ModelConfig::sequences`]`[k]`) is overwritten
    /// with dLoss/d(values), zeros past each row's length. One buffer per sequence when the
    /// model [attends](Model::attends), none otherwise. An attended field's slot in `d_emb` is
    /// written as zero (its gradient flows only through `d_seq`); its target's slot includes
    /// the attention's gradient.
    pub fn forward_backward_seq(
        &mut self,
        batch: &ModelBatch,
        d_emb: &mut [f32],
        d_wide: &mut [f32],
        d_seq: &mut [&mut [f32]],
    ) -> f32 {
        self.forward_backward_scored(batch, d_emb, d_wide, d_seq, &mut [])
    }

    /// [`Model::forward_backward_seq`] that also writes the probabilities its forward pass
    /// computed (before the backward pass and before any update: the model's scores of rows it
    /// has not trained on yet) into `out_prob`: `rows * num_tasks`, laid out as in
    /// [`Model::predict`], or empty to skip. They are the training pass's: with dropout
    /// configured, its masks apply.
    pub fn forward_backward_scored(
        &mut self,
        batch: &ModelBatch,
        d_emb: &mut [f32],
        d_wide: &mut [f32],
        d_seq: &mut [&mut [f32]],
        out_prob: &mut [f32],
    ) -> f32 {
        self.check_batch(batch, true);
        assert!(
            out_prob.is_empty() || out_prob.len() == batch.rows * self.num_tasks(),
            "out_prob must be empty or rows * num_tasks long"
        );
        let widths = self.sequence_widths();
        assert_eq!(
            d_seq.len(),
            widths.len(),
            "d_seq must hold one buffer per attended sequence ({})",
            widths.len()
        );
        for (k, (s, w)) in d_seq.iter().zip(&widths).enumerate() {
            assert_eq!(
                s.len(),
                batch.rows * w,
                "d_seq[{k}] must be rows * max_len * dim"
            );
        }
        assert_eq!(
            d_emb.len(),
            batch.rows * self.net.emb_width(),
            "d_emb must be rows * F * D"
        );
        assert!(
            d_wide.is_empty() || d_wide.len() == batch.rows,
            "d_wide must be empty or rows long"
        );
        if batch.rows == 0 {
            return 0.0;
        }
        let scale = 1.0 / batch.rows as f32;
        let fd = self.net.emb_width();
        let step = Some(self.opt.step);
        let sum = self.run_shards(
            batch,
            step,
            d_emb,
            fd,
            d_wide,
            out_prob,
            d_seq,
            |net, p, ws, x, par, de, dw, probs, ds| {
                net.forward(p, ws, x, par);
                if !probs.is_empty() {
                    net.probabilities(ws, x.rows, probs);
                }
                net.backward(p, ws, x, scale, de, dw, ds, par)
            },
        );
        (sum / batch.rows as f64) as f32
    }

    /// The loss [`Model::forward_backward`] reports, of a labeled batch (forward only, no
    /// dropout, f64 accumulation).
    pub fn loss(&mut self, batch: &ModelBatch) -> f64 {
        self.check_batch(batch, true);
        if batch.rows == 0 {
            return f64::NAN;
        }
        let sum = self.run_shards(
            batch,
            None,
            &mut [],
            0,
            &mut [],
            &mut [],
            &mut [],
            |net, p, ws, x, par, _, _, _, _| {
                net.forward(p, ws, x, par);
                net.objective_loss(ws, x)
            },
        );
        sum / batch.rows as f64
    }

    /// Probabilities for the batch (no gradients, no dropout): `out_prob` is
    /// `rows * num_tasks`, row-major (row r's task t at `r * num_tasks + t`; esmm: pCTR, then
    /// pCTCVR = pCTR * pCVR).
    pub fn predict(&mut self, batch: &ModelBatch, out_prob: &mut [f32]) {
        self.check_batch(batch, false);
        let nt = self.num_tasks();
        assert_eq!(
            out_prob.len(),
            batch.rows * nt,
            "out_prob must be rows * num_tasks long"
        );
        if batch.rows == 0 {
            return;
        }
        self.run_shards(
            batch,
            None,
            out_prob,
            nt,
            &mut [],
            &mut [],
            &mut [],
            |net, p, ws, x, par, out, _, _, _| {
                net.forward(p, ws, x, par);
                net.probabilities(ws, x.rows, out);
                0.0
            },
        );
    }

    /// Sums the shards' gradients into shard 0 and returns them (flat, aligned with
    /// [`Model::param_specs`]). Does not clear them.
    pub fn gradients(&mut self) -> &[f32] {
        let (first, rest) = self.shards.split_at_mut(1);
        let g0 = &mut first[0].grads;
        for ws in rest {
            for (a, b) in g0.iter_mut().zip(ws.grads.iter_mut()) {
                *a += *b;
                *b = 0.0;
            }
        }
        &first[0].grads
    }

    /// Applies one optimizer step with the accumulated gradients (including the model's wide
    /// bias) and clears them.
    ///
    /// One pass over the parameters in parts of [`OPT_CHUNK`], in parallel on the model's
    /// threads: each part sums the shards' gradients (in shard order, as
    /// [`Model::gradients`] does), applies the optimizer and clears them; the values are
    /// the same as one sequential pass.
    pub fn apply_gradients(&mut self) {
        let opt = self.cfg.optimizer;
        let k = self.opt.begin_step(&opt);
        let n = self.values.len();
        let (first, rest) = self.shards.split_at_mut(1);
        let mut w = self.values.chunks_mut(OPT_CHUNK);
        let mut g = first[0].grads.chunks_mut(OPT_CHUNK);
        let (s1, s2) = self.opt.slots_mut(0..n);
        let mut s1 = (!s1.is_empty()).then(|| s1.chunks_mut(OPT_CHUNK));
        let mut s2 = (!s2.is_empty()).then(|| s2.chunks_mut(OPT_CHUNK));
        let mut others: Vec<_> = rest
            .iter_mut()
            .map(|ws| ws.grads.chunks_mut(OPT_CHUNK))
            .collect();
        let mut parts = Vec::with_capacity(n.div_ceil(OPT_CHUNK));
        while let (Some(w), Some(g)) = (w.next(), g.next()) {
            let (s1, s2) = (next_part(&mut s1), next_part(&mut s2));
            let others: Vec<&mut [f32]> = others.iter_mut().filter_map(|c| c.next()).collect();
            parts.push((w, g, s1, s2, others));
        }
        let run = |(w, g, s1, s2, others): OptPart<'_>| {
            for o in others {
                for (a, b) in g.iter_mut().zip(o.iter_mut()) {
                    *a += *b;
                    *b = 0.0;
                }
            }
            optim::apply_chunk(&opt, k, w, g, s1, s2);
            g.fill(0.0);
        };
        match &self.pool {
            Some(pool) if parts.len() > 1 => pool.install(|| parts.into_par_iter().for_each(run)),
            _ => parts.into_iter().for_each(run),
        }
    }

    /// Clears accumulated gradients without applying them.
    pub fn zero_gradients(&mut self) {
        for ws in &mut self.shards {
            ws.grads.fill(0.0);
        }
    }

    /// Layout of the flat parameter buffer.
    pub fn param_specs(&self) -> &[ParamSpec] {
        self.layout.specs()
    }

    /// Every parameter tensor as (name, shape, values).
    pub fn params(&self) -> Vec<(String, Vec<usize>, &[f32])> {
        self.layout
            .specs()
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    s.shape.clone(),
                    &self.values[s.offset..s.offset + s.len],
                )
            })
            .collect()
    }

    /// All parameters as one flat buffer (layout: [`Model::param_specs`]).
    pub fn param_values(&self) -> &[f32] {
        &self.values
    }

    /// Mutable flat parameter buffer (for loading checkpoints or tests).
    pub fn param_values_mut(&mut self) -> &mut [f32] {
        &mut self.values
    }

    /// Overwrites one named parameter tensor.
    pub fn set_params(&mut self, name: &str, values: &[f32]) -> Result<(), NnError> {
        let s = self
            .layout
            .find(name)
            .ok_or_else(|| NnError::UnknownParam(name.to_string()))?;
        if s.len != values.len() {
            return Err(NnError::Length {
                name: name.to_string(),
                expected: s.len,
                got: values.len(),
            });
        }
        self.values[s.offset..s.offset + s.len].copy_from_slice(values);
        Ok(())
    }

    /// Optimizer state (flat slots aligned with the parameters), for checkpoints.
    pub fn optimizer_state(&self) -> &OptimizerState {
        &self.opt
    }

    /// Replaces the optimizer state (e.g. from a checkpoint); slot lengths must match.
    pub fn set_optimizer_state(&mut self, state: OptimizerState) -> Result<(), NnError> {
        let fresh = OptimizerState::new(&self.cfg.optimizer, self.values.len());
        for (name, want, got) in [
            ("slot1", fresh.slot1.len(), state.slot1.len()),
            ("slot2", fresh.slot2.len(), state.slot2.len()),
        ] {
            if want != got {
                return Err(NnError::Length {
                    name: name.to_string(),
                    expected: want,
                    got,
                });
            }
        }
        self.opt = state;
        Ok(())
    }
}
