//! The architectures as one layer graph, plus the per-shard [`Workspace`] holding every
//! activation/gradient buffer (allocated once per batch-size capacity, reused every step).
//! wdl, deepfm and dcn run here; dcnv2, dlrm, din, mmoe and esmm in their own modules, the
//! losses over the logits in `objective`.

mod dcnv2;
mod din;
mod dlrm;
mod esmm;
pub(crate) mod mlp;
mod mmoe;
mod objective;
mod tower;

use crate::config::{CrossStructure, ModelConfig, ModelKind};
use crate::gemm_ops::Compute;
use crate::layers::cross::Cross;
use crate::layers::cross_v2::{CrossV2, CrossV2Cache, CrossV2Scratch};
use crate::layers::dot::DotInteraction;
use crate::layers::fm::{fm_backward, fm_forward};
use crate::layers::head::ConcatHead;
use crate::layers::linear::Linear;
use crate::params::ParamLayout;
use crate::rng::SplitMix64;

/// One sequence feature's rows in a batch: `rows * max_len * dim` values (positions past a
/// row's length are zeros) and each row's valid length (>= 1).
#[derive(Clone, Copy, Debug, Default)]
pub struct SequenceIn<'a> {
    /// `rows * max_len * dim` values, laid out (sample, position, dim).
    pub values: &'a [f32],
    /// Valid positions per row.
    pub lengths: &'a [u32],
}

/// One shard's slice of a batch.
#[derive(Clone)]
pub(crate) struct ShardIn<'a> {
    pub rows: usize,
    pub emb: &'a [f32],
    pub wide: &'a [f32],
    pub dense: &'a [f32],
    /// `rows * num_tasks` labels (or empty when predicting).
    pub labels: &'a [f32],
    /// `rows` sample weights, or empty (all 1).
    pub weights: &'a [f32],
    /// Index of the shard's first row in the whole batch (dropout masks hash it).
    pub row0: usize,
    /// The optimizer step of a training forward (dropout on); `None` in predict and loss.
    pub train_step: Option<u64>,
    /// The shard's rows of every sequence block (attending models only, else empty).
    pub sequences: Vec<SequenceIn<'a>>,
}

/// Architecture: layers bound to parameter offsets.
#[derive(Clone, Debug)]
pub(crate) struct Net {
    pub kind: ModelKind,
    pub fields: usize,
    pub dim: usize,
    /// Width of one sample's flattened embeddings (fields may differ in width, except for FM).
    pub emb_width: usize,
    pub num_dense: usize,
    /// MLP layers; for wdl/deepfm/dlrm the last one maps to one logit (no ReLU).
    pub mlp: Vec<Linear>,
    pub cross: Vec<Cross>,
    /// dcnv2 cross layers.
    pub cross_v2: Vec<CrossV2>,
    /// dcnv2: how the cross tower and the MLP are combined.
    pub structure: CrossStructure,
    /// dlrm bottom MLP over the dense features (empty without dense features).
    pub bottom: Vec<Linear>,
    /// dlrm interaction of [bottom output, field embeddings].
    pub dot: Option<DotInteraction>,
    /// dcn/dcnv2 combination layer.
    pub head: Option<ConcatHead>,
    /// wdl/deepfm global bias offset.
    pub bias: Option<usize>,
    /// Each task's loss weight (one entry for the single-task kinds).
    pub task_weights: Vec<f32>,
    /// The model's seed (dropout masks hash it).
    pub seed: u64,
    /// mmoe's experts, gates and towers.
    pub mmoe: Option<mmoe::Mmoe>,
    /// esmm's two towers.
    pub esmm: Option<esmm::Esmm>,
    /// din's attention units (attention pooling only).
    pub din: Option<din::Din>,
}

impl Net {
    /// Registers all parameters in `layout` and returns the net plus initial values.
    pub fn build(cfg: &ModelConfig, layout: &mut ParamLayout) -> (Net, Vec<f32>) {
        let d0 = cfg.input_dim();
        let mut inits: Vec<(usize, usize, f32)> = Vec::new(); // (offset, len, limit)
        let bias = match cfg.kind {
            ModelKind::Wdl | ModelKind::Deepfm => Some(layout.add("bias", &[1])),
            ModelKind::Dcn
            | ModelKind::Dcnv2
            | ModelKind::Dlrm
            | ModelKind::Din
            | ModelKind::Mmoe
            | ModelKind::Esmm => None,
        };
        let mut bottom = Vec::new();
        let mut dot = None;
        let mut mlp_in = d0;
        if cfg.kind == ModelKind::Dlrm {
            let widths = cfg.bottom_widths();
            let mut in_dim = cfg.num_dense;
            for (i, &out) in widths.iter().enumerate() {
                let w = layout.add(format!("bottom.{i}.weight"), &[in_dim, out]);
                let b = layout.add(format!("bottom.{i}.bias"), &[out]);
                inits.push((w, in_dim * out, cfg.init.limit(in_dim, out)));
                bottom.push(Linear {
                    in_dim,
                    out_dim: out,
                    w,
                    b,
                    relu: true,
                });
                in_dim = out;
            }
            let has_bottom = !widths.is_empty();
            let di = DotInteraction {
                n: cfg.num_fields + has_bottom as usize,
                dim: cfg.field_dim(),
            };
            mlp_in = if has_bottom { di.dim } else { 0 } + di.out_dim();
            dot = Some(di);
        }
        let multi_task = matches!(cfg.kind, ModelKind::Mmoe | ModelKind::Esmm);
        let mut widths = if multi_task {
            Vec::new() // their towers are built below
        } else {
            cfg.hidden.clone()
        };
        if !matches!(cfg.kind, ModelKind::Dcn | ModelKind::Dcnv2) && !multi_task {
            widths.push(1);
        }
        let mut mlp = Vec::new();
        let mut in_dim = mlp_in;
        let n_hidden = cfg.hidden.len();
        for (i, &out) in widths.iter().enumerate() {
            let w = layout.add(format!("mlp.{i}.weight"), &[in_dim, out]);
            let b = layout.add(format!("mlp.{i}.bias"), &[out]);
            inits.push((w, in_dim * out, cfg.init.limit(in_dim, out)));
            mlp.push(Linear {
                in_dim,
                out_dim: out,
                w,
                b,
                relu: i < n_hidden,
            });
            in_dim = out;
        }
        let din = din::Din::build(cfg, layout, &mut inits);
        let mut cross = Vec::new();
        let mut head = None;
        if cfg.kind == ModelKind::Dcn {
            for l in 0..cfg.cross_layers {
                let w = layout.add(format!("cross.{l}.weight"), &[d0]);
                let b = layout.add(format!("cross.{l}.bias"), &[d0]);
                inits.push((w, d0, cfg.init.limit(d0, 1)));
                cross.push(Cross { dim: d0, w, b });
            }
            let h = cfg.hidden.last().copied().unwrap_or(0);
            let w = layout.add("head.weight", &[d0 + h, 1]);
            let b = layout.add("head.bias", &[1]);
            inits.push((w, d0 + h, cfg.init.limit(d0 + h, 1)));
            head = Some(ConcatHead {
                a: d0,
                b_dim: h,
                w,
                b,
            });
        }
        let mut cross_v2 = Vec::new();
        if cfg.kind == ModelKind::Dcnv2 {
            cross_v2 = dcnv2::build_cross(cfg, layout, &mut inits);
            let h = cfg.hidden.last().copied().unwrap_or(0);
            let (a, b_dim) = match cfg.cross_structure {
                CrossStructure::Parallel => (d0, h),
                CrossStructure::Stacked => (if h > 0 { h } else { d0 }, 0),
            };
            let w = layout.add("head.weight", &[a + b_dim, 1]);
            let b = layout.add("head.bias", &[1]);
            inits.push((w, a + b_dim, cfg.init.limit(a + b_dim, 1)));
            head = Some(ConcatHead { a, b_dim, w, b });
        }
        let mut more = mlp::Inits::default();
        let mmoe = (cfg.kind == ModelKind::Mmoe).then(|| mmoe::Mmoe::build(cfg, layout, &mut more));
        let esmm = (cfg.kind == ModelKind::Esmm).then(|| esmm::Esmm::build(cfg, layout, &mut more));
        inits.extend(more.uniform);
        let mut values = vec![0.0f32; layout.total()];
        let mut rng = SplitMix64::new(cfg.seed);
        for (off, len, limit) in inits {
            for v in &mut values[off..off + len] {
                *v = rng.uniform(limit);
            }
        }
        for (off, len) in more.ones {
            values[off..off + len].fill(1.0);
        }
        let net = Net {
            kind: cfg.kind,
            fields: cfg.num_fields,
            dim: cfg.emb_dim,
            emb_width: cfg.emb_width(),
            num_dense: cfg.num_dense,
            mlp,
            cross,
            cross_v2,
            structure: cfg.cross_structure,
            bottom,
            dot,
            head,
            bias,
            task_weights: (0..cfg.num_tasks()).map(|t| cfg.task_weight(t)).collect(),
            seed: cfg.seed,
            mmoe,
            esmm,
            din,
        };
        (net, values)
    }

    pub fn emb_width(&self) -> usize {
        self.emb_width
    }

    pub fn input_dim(&self) -> usize {
        self.emb_width() + self.num_dense
    }

    pub fn flops_per_sample(&self) -> f64 {
        if let Some(m) = &self.mmoe {
            return m.flops_per_sample(self.emb_width());
        }
        if let Some(m) = &self.esmm {
            return m.flops_per_sample(self.emb_width());
        }
        let fd = match (self.kind, self.structure) {
            (ModelKind::Dlrm, _) => self.mlp[0].in_dim,
            (ModelKind::Dcnv2, CrossStructure::Stacked) => self.input_dim(),
            _ => self.emb_width(),
        };
        let mut f = 0.0;
        for (i, l) in self.mlp.iter().enumerate() {
            f += l.flops_per_sample(if i == 0 { fd } else { l.in_dim });
        }
        for (i, l) in self.bottom.iter().enumerate() {
            f += l.flops_per_sample(if i == 0 { 0 } else { l.in_dim });
        }
        f += self
            .dot
            .as_ref()
            .map_or(0.0, DotInteraction::flops_per_sample);
        f += self
            .cross_v2
            .iter()
            .map(CrossV2::flops_per_sample)
            .sum::<f64>();
        f += self.cross.iter().map(Cross::flops_per_sample).sum::<f64>();
        if let Some(h) = &self.head {
            f += (6 * (h.a + h.b_dim)) as f64;
        }
        if self.kind == ModelKind::Deepfm {
            f += (7 * fd) as f64;
        }
        f += self.din.as_ref().map_or(0.0, din::Din::flops_per_sample);
        f
    }

    /// Forward pass for one shard: fills `ws.logit[..rows * num_tasks]`.
    pub fn forward(&self, p: &[f32], ws: &mut Workspace, x: &ShardIn, par: Compute) {
        let rows = x.rows;
        ws.ensure(self, rows);
        match self.kind {
            ModelKind::Dcnv2 => return self.forward_dcnv2(p, ws, x, par),
            ModelKind::Dlrm => return self.forward_dlrm(p, ws, x, par),
            ModelKind::Mmoe => return self.forward_mmoe(p, ws, x, par),
            ModelKind::Esmm => return self.forward_esmm(p, ws, x, par),
            ModelKind::Din => return self.forward_din(p, ws, x, par),
            ModelKind::Wdl | ModelKind::Deepfm | ModelKind::Dcn => {}
        }
        self.fill_x0(ws, x);
        for (i, l) in self.mlp.iter().enumerate() {
            let (prev, cur) = ws.acts.split_at_mut(i);
            let input: &[f32] = if i == 0 { &ws.x0 } else { &prev[i - 1] };
            l.forward(p, input, rows, &mut cur[0], par);
        }
        let logit = &mut ws.logit[..rows];
        match self.kind {
            ModelKind::Wdl | ModelKind::Deepfm => {
                let bias = p[self.bias.expect("wdl/deepfm have a bias")];
                let deep = ws.acts.last().expect("mlp has an output layer");
                for (r, z) in logit.iter_mut().enumerate() {
                    *z = deep[r] + bias + x.wide.get(r).copied().unwrap_or(0.0);
                }
                if self.kind == ModelKind::Deepfm {
                    fm_forward(x.emb, rows, self.fields, self.dim, &mut ws.fm);
                    for (z, f) in logit.iter_mut().zip(&ws.fm) {
                        *z += f;
                    }
                }
            }
            ModelKind::Dcn
            | ModelKind::Dcnv2
            | ModelKind::Dlrm
            | ModelKind::Din
            | ModelKind::Mmoe
            | ModelKind::Esmm => {
                for (l, c) in self.cross.iter().enumerate() {
                    let (prev, cur) = ws.cross_x.split_at_mut(l);
                    let xl: &[f32] = if l == 0 { &ws.x0 } else { &prev[l - 1] };
                    c.forward(p, &ws.x0, xl, rows, &mut cur[0], &mut ws.cross_s[l]);
                }
                let xa: &[f32] = ws.cross_x.last().unwrap_or(&ws.x0);
                let xb: &[f32] = ws.acts.last().map(|v| &v[..]).unwrap_or(&[]);
                let head = self.head.as_ref().expect("dcn has a head");
                head.forward(p, xa, xb, rows, logit);
            }
        }
    }

    /// Copies `[emb | dense]` of every row into `ws.x0`.
    fn fill_x0(&self, ws: &mut Workspace, x: &ShardIn) {
        let (fd, nd, d0) = (self.emb_width(), self.num_dense, self.input_dim());
        for r in 0..x.rows {
            let dst = &mut ws.x0[r * d0..(r + 1) * d0];
            dst[..fd].copy_from_slice(&x.emb[r * fd..(r + 1) * fd]);
            dst[fd..].copy_from_slice(&x.dense[r * nd..(r + 1) * nd]);
        }
    }

    /// Loss + backward for one shard after [`Net::forward`]. `scale` is 1 / (whole batch rows).
    /// Overwrites `d_emb` (`[rows, F*D]`), `d_wide` (`[rows]`, may be empty) and, for din with
    /// attention, `d_seq` (one `[rows, max_len, dim]` block per sequence); accumulates
    /// parameter gradients into `ws.grads`. Returns the SUM of the shard's losses.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &[f32],
        ws: &mut Workspace,
        x: &ShardIn,
        scale: f32,
        d_emb: &mut [f32],
        d_wide: &mut [f32],
        d_seq: &mut [&mut [f32]],
        par: Compute,
    ) -> f64 {
        let rows = x.rows;
        let fd = self.emb_width();
        let loss = self.objective_backward(ws, x, scale);
        let uses_wide = self.bias.is_some();
        if !d_wide.is_empty() {
            if uses_wide {
                d_wide[..rows].copy_from_slice(&ws.dlogit[..rows]);
            } else {
                d_wide[..rows].fill(0.0);
            }
        }
        match self.kind {
            ModelKind::Wdl | ModelKind::Deepfm => {
                let bias = self.bias.expect("wdl/deepfm have a bias");
                ws.grads[bias] += ws.dlogit[..rows].iter().sum::<f32>();
                let last = ws.dacts.last_mut().expect("mlp has an output layer");
                last[..rows].copy_from_slice(&ws.dlogit[..rows]);
                self.mlp_backward(p, ws, rows, d_emb, par);
                if self.kind == ModelKind::Deepfm {
                    fm_backward(x.emb, &ws.dlogit, rows, self.fields, self.dim, d_emb);
                }
            }
            ModelKind::Dcnv2 => self.backward_dcnv2(p, ws, rows, d_emb, par),
            ModelKind::Dlrm => self.backward_dlrm(p, ws, x, d_emb, par),
            ModelKind::Mmoe => self.backward_mmoe(p, ws, rows, d_emb, par),
            ModelKind::Esmm => self.backward_esmm(p, ws, rows, d_emb, par),
            ModelKind::Din => self.backward_din(p, ws, x, d_emb, d_seq, par),
            ModelKind::Dcn => {
                let head = self.head.as_ref().expect("dcn has a head");
                let xa: &[f32] = ws.cross_x.last().unwrap_or(&ws.x0);
                let xb: &[f32] = ws.acts.last().map(|v| &v[..]).unwrap_or(&[]);
                let mut empty: [f32; 0] = [];
                let dxb: &mut [f32] = ws
                    .dacts
                    .last_mut()
                    .map(|v| &mut v[..])
                    .unwrap_or(&mut empty);
                head.backward(
                    p,
                    xa,
                    xb,
                    &ws.dlogit,
                    rows,
                    &mut ws.grads,
                    &mut ws.cross_g,
                    dxb,
                );
                if self.mlp.is_empty() {
                    d_emb[..rows * fd].fill(0.0);
                } else {
                    self.mlp_backward(p, ws, rows, d_emb, par);
                }
                for (l, c) in self.cross.iter().enumerate().rev() {
                    let xl: &[f32] = if l == 0 { &ws.x0 } else { &ws.cross_x[l - 1] };
                    let s = &ws.cross_s[l];
                    c.backward(
                        p,
                        &ws.x0,
                        xl,
                        s,
                        &mut ws.cross_g,
                        rows,
                        &mut ws.grads,
                        (d_emb, fd, fd),
                    );
                }
                let d0 = self.input_dim();
                for r in 0..rows {
                    let g = &ws.cross_g[r * d0..r * d0 + fd];
                    for (d, &gv) in d_emb[r * fd..(r + 1) * fd].iter_mut().zip(g) {
                        *d += gv;
                    }
                }
            }
        }
        loss
    }

    /// Backward through the MLP; `ws.dacts.last()` must hold dL/d(output). Writes the
    /// embedding part of dL/dx0 into `d_emb`.
    fn mlp_backward(
        &self,
        p: &[f32],
        ws: &mut Workspace,
        rows: usize,
        d_emb: &mut [f32],
        par: Compute,
    ) {
        let fd = self.emb_width();
        for (i, l) in self.mlp.iter().enumerate().rev() {
            let x: &[f32] = if i == 0 { &ws.x0 } else { &ws.acts[i - 1] };
            let (lo, hi) = ws.dacts.split_at_mut(i);
            let dx = if i == 0 {
                (&mut d_emb[..], fd, fd)
            } else {
                (&mut lo[i - 1][..], l.in_dim, l.in_dim)
            };
            l.backward(
                p,
                x,
                &ws.acts[i],
                &mut hi[0],
                rows,
                &mut ws.grads,
                Some(dx),
                par,
            );
        }
    }
}

/// Activation and gradient buffers of one shard, sized for `cap` rows.
pub(crate) struct Workspace {
    cap: usize,
    x0: Vec<f32>,
    acts: Vec<Vec<f32>>,
    dacts: Vec<Vec<f32>>,
    logit: Vec<f32>,
    dlogit: Vec<f32>,
    fm: Vec<f32>,
    cross_x: Vec<Vec<f32>>,
    cross_s: Vec<Vec<f32>>,
    cross_g: Vec<f32>,
    cross_v2: Vec<CrossV2Cache>,
    cross_v2_scratch: CrossV2Scratch,
    /// dcnv2: dL/dx0 gathered from the cross layers' direct terms.
    dx0: Vec<f32>,
    bottom_acts: Vec<Vec<f32>>,
    bottom_dacts: Vec<Vec<f32>>,
    /// dlrm: the interacting vectors `[rows, n * D]` and their gradient.
    dot_t: Vec<f32>,
    dot_dt: Vec<f32>,
    /// dlrm: the top MLP's input `[bottom output | dots]` and its gradient.
    top_in: Vec<f32>,
    dtop_in: Vec<f32>,
    /// mmoe's and esmm's buffers (empty for the other kinds).
    mmoe: mmoe::MmoeWs,
    esmm: esmm::EsmmWs,
    /// din: the attention units' buffers.
    din: din::DinWorkspace,
    /// Parameter gradients accumulated by this shard (flat, like the parameters).
    pub grads: Vec<f32>,
}

impl Workspace {
    pub fn new(net: &Net, num_params: usize) -> Self {
        Workspace {
            cap: 0,
            x0: Vec::new(),
            acts: vec![Vec::new(); net.mlp.len()],
            dacts: vec![Vec::new(); net.mlp.len()],
            logit: Vec::new(),
            dlogit: Vec::new(),
            fm: Vec::new(),
            cross_x: vec![Vec::new(); net.cross.len() + net.cross_v2.len()],
            cross_s: vec![Vec::new(); net.cross.len()],
            cross_g: Vec::new(),
            cross_v2: vec![CrossV2Cache::default(); net.cross_v2.len()],
            cross_v2_scratch: CrossV2Scratch::default(),
            dx0: Vec::new(),
            bottom_acts: vec![Vec::new(); net.bottom.len()],
            bottom_dacts: vec![Vec::new(); net.bottom.len()],
            dot_t: Vec::new(),
            dot_dt: Vec::new(),
            top_in: Vec::new(),
            dtop_in: Vec::new(),
            mmoe: mmoe::MmoeWs::default(),
            esmm: esmm::EsmmWs::default(),
            din: din::DinWorkspace::default(),
            grads: vec![0.0; num_params],
        }
    }

    /// Makes every buffer hold at least `rows` rows (allocates only when growing).
    pub fn ensure(&mut self, net: &Net, rows: usize) {
        if rows <= self.cap {
            return;
        }
        let d0 = net.input_dim();
        self.cap = rows;
        self.x0 = vec![0.0; rows * d0];
        for (i, l) in net.mlp.iter().enumerate() {
            self.acts[i] = vec![0.0; rows * l.out_dim];
            self.dacts[i] = vec![0.0; rows * l.out_dim];
        }
        let tasks = net.task_weights.len();
        self.logit = vec![0.0; rows * tasks];
        self.dlogit = vec![0.0; rows * tasks];
        if let Some(m) = &net.mmoe {
            m.ensure(&mut self.mmoe, rows);
        }
        if let Some(m) = &net.esmm {
            m.ensure(&mut self.esmm, rows);
        }
        self.fm = if net.kind == ModelKind::Deepfm {
            vec![0.0; rows]
        } else {
            Vec::new()
        };
        for l in 0..net.cross.len() {
            self.cross_x[l] = vec![0.0; rows * d0];
            self.cross_s[l] = vec![0.0; rows];
        }
        self.cross_g = if matches!(net.kind, ModelKind::Dcn | ModelKind::Dcnv2) {
            vec![0.0; rows * d0]
        } else {
            Vec::new()
        };
        for (l, c) in net.cross_v2.iter().enumerate() {
            self.cross_x[l] = vec![0.0; rows * d0];
            c.ensure_cache(&mut self.cross_v2[l], rows);
            c.ensure_scratch(&mut self.cross_v2_scratch, rows);
        }
        if net.kind == ModelKind::Dcnv2 {
            self.dx0 = vec![0.0; rows * d0];
        }
        for (i, l) in net.bottom.iter().enumerate() {
            self.bottom_acts[i] = vec![0.0; rows * l.out_dim];
            self.bottom_dacts[i] = vec![0.0; rows * l.out_dim];
        }
        if let Some(dot) = &net.dot {
            let ti = net.mlp[0].in_dim;
            self.dot_t = vec![0.0; rows * dot.n * dot.dim];
            self.dot_dt = vec![0.0; rows * dot.n * dot.dim];
            self.top_in = vec![0.0; rows * ti];
            self.dtop_in = vec![0.0; rows * ti];
        }
        if let Some(din) = &net.din {
            self.din.ensure(din, rows);
        }
    }
}
