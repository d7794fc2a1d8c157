//! Model configuration (serde, with defaults) and its validation.

use serde::{Deserialize, Serialize};

use crate::gemm_ops::Precision;

use crate::NnError;

/// Which CTR architecture to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// Wide & Deep: logit = bias + wide sum + MLP(concat(emb, dense)).
    Wdl,
    /// DeepFM: logit = bias + wide (first order) + FM(emb) + MLP(concat(emb, dense)).
    Deepfm,
    /// Deep & Cross (v1): cross tower and MLP on x0 = concat(emb, dense), concat -> linear.
    Dcn,
    /// DCN-v2: matrix cross layers `x_{l+1} = x0 ⊙ (W_l x_l + b_l) + x_l` (full rank, low rank
    /// or a gated mixture of low-rank experts), stacked under or parallel to the MLP.
    Dcnv2,
    /// DLRM: bottom MLP on the dense features, pairwise dot products among it and the field
    /// embeddings, top MLP on [bottom output, dots] -> logit.
    Dlrm,
    /// MMoE (multi-gate mixture of experts): `experts` expert MLPs on x0 = concat(emb, dense),
    /// per task a softmax gate over the experts and a tower MLP on their mixture -> one logit
    /// per task.
    Mmoe,
    /// ESMM (entire space multi-task): a CTR tower and a CVR tower on x0; outputs pCTR and
    /// pCTCVR = pCTR * pCVR, trained on click and click-and-convert labels over all samples.
    Esmm,
    /// DIN: each sequence field's positions pooled by target attention (weights from an MLP
    /// over `[h, t, h - t, h ⊙ t]`, softmax over the valid positions), then an MLP over
    /// `[emb | dense]` -> logit.
    Din,
}

/// How din pools a sequence field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SequencePooling {
    /// Target attention over the positions (needs the sequence blocks).
    #[default]
    Attention,
    /// The caller's mean-pooled vector as given (the baseline; no sequence blocks).
    Mean,
}

/// How DCN-v2 combines its cross tower with the MLP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrossStructure {
    /// Cross tower and MLP side by side on x0, their outputs concatenated into the logit layer.
    #[default]
    Parallel,
    /// Cross layers first, the MLP on their output, then the logit layer.
    Stacked,
}

/// Optimizer for the dense parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum DenseOptimizer {
    /// Plain SGD: w -= lr * g.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// Adagrad: a += g^2; w -= lr * g / (sqrt(a) + eps).
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// Initial value of the accumulator.
        initial_accumulator: f32,
        /// Denominator epsilon.
        eps: f32,
    },
    /// Adam with bias correction: w -= lr * m_hat / (sqrt(v_hat) + eps).
    Adam {
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Denominator epsilon.
        eps: f32,
    },
}

impl Default for DenseOptimizer {
    fn default() -> Self {
        DenseOptimizer::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// Weight initialization of the dense layers. Biases always start at zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenseInit {
    /// Glorot/Xavier uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)). The default
    /// (as in the common TF CTR implementations).
    #[default]
    XavierUniform,
    /// He/Kaiming uniform: U(-a, a), a = sqrt(6 / fan_in).
    HeUniform,
}

impl DenseInit {
    /// Half-width of the uniform distribution for a `[fan_in, fan_out]` weight.
    pub fn limit(self, fan_in: usize, fan_out: usize) -> f32 {
        match self {
            DenseInit::XavierUniform => (6.0 / (fan_in + fan_out) as f32).sqrt(),
            DenseInit::HeUniform => (6.0 / fan_in as f32).sqrt(),
        }
    }
}

/// How `threads > 1` are used for one batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParallelMode {
    /// Split the batch rows into `threads` shards, run each shard with single-threaded GEMMs
    /// and sum the parameter gradients (measured faster on 2 cores; see `dense_bench`).
    #[default]
    Shard,
    /// One shard; every GEMM uses `gemm`'s own `Compute::rayon(threads)`.
    Gemm,
}

fn default_hidden() -> Vec<usize> {
    vec![512, 256, 128]
}
fn default_cross_layers() -> usize {
    3
}
fn default_threads() -> usize {
    1
}
fn default_cross_experts() -> usize {
    1
}
fn is_zero(v: &usize) -> bool {
    *v == 0
}
fn is_one(v: &usize) -> bool {
    *v == 1
}
fn is_f32(v: &Precision) -> bool {
    *v == Precision::F32
}
fn is_parallel(v: &CrossStructure) -> bool {
    *v == CrossStructure::Parallel
}
/// Hidden width of the default DLRM bottom MLP (`[64, D]`).
const DEFAULT_BOTTOM_WIDTH: usize = 64;
fn default_attention_hidden() -> Vec<usize> {
    vec![64, 32]
}
fn is_default_attention_hidden(v: &[usize]) -> bool {
    v == default_attention_hidden()
}
fn is_attention(v: &SequencePooling) -> bool {
    *v == SequencePooling::Attention
}
fn default_kind() -> ModelKind {
    ModelKind::Wdl
}
fn default_experts() -> usize {
    4
}
fn is_default_experts(v: &usize) -> bool {
    *v == default_experts()
}
fn default_tower_hidden() -> Vec<usize> {
    vec![64]
}
fn is_default_tower_hidden(v: &[usize]) -> bool {
    v == default_tower_hidden().as_slice()
}
fn is_false(v: &bool) -> bool {
    !*v
}
fn is_zero_f32(v: &f32) -> bool {
    *v == 0.0
}

/// Configuration of a dense model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Architecture (default `wdl`).
    #[serde(default = "default_kind")]
    pub kind: ModelKind,
    /// Number of sparse fields F.
    pub num_fields: usize,
    /// Embedding dimension D (deep embeddings, per field).
    pub emb_dim: usize,
    /// Width of each field's embedding when they differ (feature columns over tables of several
    /// dims); empty means every field is `emb_dim` wide. `num_fields` entries when given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feature_dims: Vec<usize>,
    /// Number of dense (continuous) features.
    #[serde(default)]
    pub num_dense: usize,
    /// Hidden layer widths of the MLP (ReLU), default `[512, 256, 128]`; mmoe: each expert's,
    /// esmm: each tower's.
    #[serde(default = "default_hidden")]
    pub hidden: Vec<usize>,
    /// Number of cross layers (dcn, dcnv2), default 3.
    #[serde(default = "default_cross_layers")]
    pub cross_layers: usize,
    /// dcnv2: rank r of each cross matrix `W = U Vᵀ` (U, V `d×r`); 0 (default) = full rank `d×d`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cross_rank: usize,
    /// dcnv2: low-rank experts per cross layer, mixed by a softmax gate over `a_iᵀ x_l`
    /// (default 1; more than 1 needs `cross_rank > 0`).
    #[serde(default = "default_cross_experts", skip_serializing_if = "is_one")]
    pub cross_experts: usize,
    /// dcnv2: `parallel` (default) or `stacked`.
    #[serde(default, skip_serializing_if = "is_parallel")]
    pub cross_structure: CrossStructure,
    /// dlrm: widths of the bottom MLP over the dense features (ReLU after each); the last must
    /// equal the fields' embedding width D. Empty (default) means `[64, D]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bottom_hidden: Vec<usize>,
    /// din: hidden widths (ReLU) of the attention MLP that scores each position, default
    /// `[64, 32]` (a linear layer to one score follows).
    #[serde(
        default = "default_attention_hidden",
        skip_serializing_if = "is_default_attention_hidden"
    )]
    pub attention_hidden: Vec<usize>,
    /// din: `attention` (default) or `mean` (the baseline over the mean-pooled sequences).
    #[serde(default, skip_serializing_if = "is_attention")]
    pub sequence_pooling: SequencePooling,
    /// Dense optimizer, default Adam(lr 1e-3, 0.9, 0.999, 1e-8).
    #[serde(default)]
    pub optimizer: DenseOptimizer,
    /// Weight init, default `xavier_uniform`.
    #[serde(default)]
    pub init: DenseInit,
    /// Seed of the weight initialization.
    #[serde(default)]
    pub seed: u64,
    /// Threads used by one forward/backward (default 1).
    #[serde(default = "default_threads")]
    pub threads: usize,
    /// How the threads are used (default `shard`).
    #[serde(default)]
    pub parallel: ParallelMode,
    /// Arithmetic of the dense GEMMs: `f32` (default) or `bf16` (operands rounded to bfloat16,
    /// f32 sums; AMX tiles where the CPU has them).
    #[serde(default, skip_serializing_if = "is_f32")]
    pub precision: Precision,
    /// The objectives, in label order; empty means one task named `ctr` with weight 1 (every
    /// single-task model). mmoe takes one or more, esmm exactly two (`ctr`, then `ctcvr`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskSpec>,
    /// The sequence features the model attends over (din), each against its target field:
    /// distinct fields of equal width, `max_len >= 1`; din with attention pooling needs at least
    /// one. The other kinds ignore them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sequences: Vec<SequenceSpec>,
    /// mmoe: number of expert MLPs (each `hidden` wide), default 4.
    #[serde(
        default = "default_experts",
        skip_serializing_if = "is_default_experts"
    )]
    pub experts: usize,
    /// mmoe: hidden widths of each task's tower MLP (ReLU) before its logit, default `[64]`.
    #[serde(
        default = "default_tower_hidden",
        skip_serializing_if = "is_default_tower_hidden"
    )]
    pub tower_hidden: Vec<usize>,
    /// mmoe, esmm: layer normalization (gain, bias; eps 1e-5) after every hidden linear layer,
    /// before its ReLU (default false).
    #[serde(default, skip_serializing_if = "is_false")]
    pub layer_norm: bool,
    /// mmoe, esmm: inverted dropout rate after every hidden layer's ReLU, in [0, 1), training
    /// only (default 0 = off). Masks are a hash of (seed, optimizer step, row, layer, unit).
    #[serde(default, skip_serializing_if = "is_zero_f32")]
    pub dropout: f32,
}

/// One objective of a (multi-task) model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Name in outputs and metrics (`ctr`, `ctcvr`, ...).
    pub name: String,
    /// Weight of its loss in the total loss (default 1).
    #[serde(default = "default_task_weight")]
    pub weight: f32,
}

fn default_task_weight() -> f32 {
    1.0
}

/// A sequence feature (a field whose embedding block the model reads position by position) and
/// the field it is compared with (the target id of the same table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequenceSpec {
    /// Field index of the sequence (its pooled vector's place in the embeddings).
    pub field: usize,
    /// Field index of the target.
    pub target: usize,
    /// Positions per row.
    pub max_len: usize,
}

impl ModelConfig {
    /// A config with all defaults for the given shape.
    pub fn new(kind: ModelKind, num_fields: usize, emb_dim: usize, num_dense: usize) -> Self {
        Self {
            kind,
            num_fields,
            emb_dim,
            feature_dims: Vec::new(),
            num_dense,
            hidden: default_hidden(),
            cross_layers: default_cross_layers(),
            cross_rank: 0,
            cross_experts: default_cross_experts(),
            cross_structure: CrossStructure::default(),
            bottom_hidden: Vec::new(),
            attention_hidden: default_attention_hidden(),
            sequence_pooling: SequencePooling::default(),
            optimizer: DenseOptimizer::default(),
            init: DenseInit::default(),
            seed: 0,
            threads: default_threads(),
            parallel: ParallelMode::default(),
            precision: Precision::F32,
            tasks: Vec::new(),
            sequences: Vec::new(),
            experts: default_experts(),
            tower_hidden: default_tower_hidden(),
            layer_norm: false,
            dropout: 0.0,
        }
    }

    /// Weight of task `t`'s loss in the total (1 when `tasks` is empty).
    pub fn task_weight(&self, t: usize) -> f32 {
        self.tasks.get(t).map_or(1.0, |s| s.weight)
    }

    /// The label task `task`'s loss and metrics use, from one row's `num_tasks` labels: esmm's
    /// second task (pCTCVR) is clicked-and-converted `y0 * y1`; every other task reads its own
    /// label.
    pub fn task_target(&self, task: usize, labels_row: &[f32]) -> f32 {
        if self.kind == ModelKind::Esmm && task == 1 {
            labels_row[0] * labels_row[1]
        } else {
            labels_row[task]
        }
    }

    /// Number of objectives (1 when `tasks` is empty).
    pub fn num_tasks(&self) -> usize {
        self.tasks.len().max(1)
    }

    /// The objectives' names (`["ctr"]` when `tasks` is empty).
    pub fn task_names(&self) -> Vec<String> {
        if self.tasks.is_empty() {
            vec!["ctr".to_string()]
        } else {
            self.tasks.iter().map(|t| t.name.clone()).collect()
        }
    }

    /// A config whose fields have the given embedding widths (in field order).
    pub fn with_feature_dims(kind: ModelKind, feature_dims: Vec<usize>, num_dense: usize) -> Self {
        let uniform = feature_dims
            .first()
            .copied()
            .filter(|&d| feature_dims.iter().all(|&x| x == d));
        let mut cfg = Self::new(kind, feature_dims.len(), uniform.unwrap_or(0), num_dense);
        if uniform.is_none() {
            cfg.feature_dims = feature_dims;
        }
        cfg
    }

    /// Whether every field has the same embedding width (`emb_dim`).
    pub fn uniform_dims(&self) -> bool {
        self.feature_dims.is_empty()
    }

    /// Width of the flattened embeddings of one sample (the sum of the fields' widths).
    pub fn emb_width(&self) -> usize {
        if self.feature_dims.is_empty() {
            self.num_fields * self.emb_dim
        } else {
            self.feature_dims.iter().sum()
        }
    }

    /// Width of x0 = concat(emb flattened, dense).
    pub fn input_dim(&self) -> usize {
        self.emb_width() + self.num_dense
    }

    /// The width of the first field's embedding (every field's, when the widths are uniform).
    pub fn field_dim(&self) -> usize {
        self.feature_dims.first().copied().unwrap_or(self.emb_dim)
    }

    /// dlrm: the bottom MLP's layer widths (`bottom_hidden`, or `[64, D]` when empty); empty
    /// when the job has no dense features (no bottom MLP then).
    pub fn bottom_widths(&self) -> Vec<usize> {
        if self.num_dense == 0 {
            Vec::new()
        } else if self.bottom_hidden.is_empty() {
            vec![DEFAULT_BOTTOM_WIDTH, self.field_dim()]
        } else {
            self.bottom_hidden.clone()
        }
    }

    /// Checks shapes, hyper-parameters and thread count.
    pub fn validate(&self) -> Result<(), NnError> {
        let bad = |m: String| Err(NnError::Config(m));
        if self.feature_dims.is_empty() {
            if self.num_fields == 0 || self.emb_dim == 0 {
                return bad("num_fields and emb_dim must be > 0".into());
            }
        } else {
            if self.feature_dims.len() != self.num_fields || self.feature_dims.contains(&0) {
                return bad(format!(
                    "feature_dims {:?} must hold num_fields = {} widths > 0",
                    self.feature_dims, self.num_fields
                ));
            }
            if self.kind == ModelKind::Deepfm {
                return bad(format!(
                    "deepfm's factorization machine needs every field at one embedding dim, got {:?}",
                    self.feature_dims
                ));
            }
        }
        if self.kind == ModelKind::Dlrm {
            self.validate_dlrm()?;
        }
        if self.kind == ModelKind::Dcnv2 {
            self.validate_dcnv2()?;
        }
        self.validate_tasks()?;
        self.validate_multitask()?;
        if self.kind == ModelKind::Din {
            self.validate_din()?;
        }
        if self.hidden.contains(&0) {
            return bad(format!("hidden widths must be > 0, got {:?}", self.hidden));
        }
        let crossing = matches!(self.kind, ModelKind::Dcn | ModelKind::Dcnv2);
        if crossing && self.cross_layers == 0 && self.hidden.is_empty() {
            return bad(format!(
                "{} needs cross layers or hidden layers",
                self.kind.name()
            ));
        }
        if !crossing && self.hidden.is_empty() {
            return bad(
                "model.hidden = [] leaves the deep part without a hidden layer (a linear model \
                 over the embeddings): give at least one width, e.g. [256, 128]"
                    .into(),
            );
        }
        if self.threads == 0 || self.threads > 256 {
            return bad(format!("threads must be in 1..=256, got {}", self.threads));
        }
        let pos = |x: f32| x.is_finite() && x > 0.0;
        let unit = |x: f32| x.is_finite() && (0.0..1.0).contains(&x);
        let ok = match self.optimizer {
            DenseOptimizer::Sgd { lr } => pos(lr),
            DenseOptimizer::Adagrad {
                lr,
                initial_accumulator,
                eps,
            } => {
                pos(lr) && initial_accumulator.is_finite() && initial_accumulator >= 0.0 && pos(eps)
            }
            DenseOptimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => pos(lr) && unit(beta1) && unit(beta2) && pos(eps),
        };
        if !ok {
            return bad(format!(
                "invalid optimizer hyper-parameters: {:?}",
                self.optimizer
            ));
        }
        Ok(())
    }
}

impl ModelKind {
    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Wdl => "wdl",
            ModelKind::Deepfm => "deepfm",
            ModelKind::Dcn => "dcn",
            ModelKind::Dcnv2 => "dcnv2",
            ModelKind::Dlrm => "dlrm",
            ModelKind::Mmoe => "mmoe",
            ModelKind::Esmm => "esmm",
            ModelKind::Din => "din",
        }
    }
}

/// Most experts per dcnv2 cross layer.
const MAX_CROSS_EXPERTS: usize = 64;

impl ModelConfig {
    fn validate_dcnv2(&self) -> Result<(), NnError> {
        if self.cross_experts == 0 || self.cross_experts > MAX_CROSS_EXPERTS {
            return Err(NnError::Config(format!(
                "cross_experts must be in 1..={MAX_CROSS_EXPERTS}, got {}",
                self.cross_experts
            )));
        }
        if self.cross_experts > 1 && self.cross_rank == 0 {
            return Err(NnError::Config(format!(
                "cross_experts = {} mixes low-rank experts: set cross_rank > 0 (e.g. 32) too",
                self.cross_experts
            )));
        }
        Ok(())
    }

    fn validate_dlrm(&self) -> Result<(), NnError> {
        if let Some(f) =
            (0..self.feature_dims.len()).find(|&f| self.feature_dims[f] != self.feature_dims[0])
        {
            return Err(NnError::Config(format!(
                "dlrm's dot interaction needs every field at one embedding dim: field {f} has \
                 width {}, field 0 has {}",
                self.feature_dims[f], self.feature_dims[0]
            )));
        }
        if self.num_fields + usize::from(self.num_dense > 0) < 2 {
            return Err(NnError::Config(
                "dlrm needs two vectors to interact: more than one field, or dense features".into(),
            ));
        }
        if self.bottom_hidden.contains(&0) {
            return Err(NnError::Config(format!(
                "bottom_hidden widths must be > 0, got {:?}",
                self.bottom_hidden
            )));
        }
        let d = self.field_dim();
        if let Some(&last) = self.bottom_hidden.last() {
            if last != d {
                return Err(NnError::Config(format!(
                    "bottom_hidden = {:?} must end at the fields' embedding width {d} (its output \
                     takes dot products with the embeddings), e.g. [64, {d}]",
                    self.bottom_hidden
                )));
            }
        }
        Ok(())
    }
}

/// Most experts of an mmoe model.
const MAX_EXPERTS: usize = 64;

impl ModelConfig {
    fn validate_tasks(&self) -> Result<(), NnError> {
        let bad = |m: String| Err(NnError::Config(m));
        let n = self.tasks.len();
        match self.kind {
            ModelKind::Esmm if n != 2 => {
                return bad(format!(
                    "esmm needs exactly two tasks (tasks = [ctr, ctcvr]: labels click, then \
                     conversion), got {n}"
                ))
            }
            ModelKind::Mmoe | ModelKind::Esmm => {}
            kind if n > 1 => {
                return bad(format!(
                    "{} is single-task: tasks must hold at most one entry, got {n} (use kind = \
                     mmoe or esmm for several)",
                    kind.name()
                ))
            }
            _ => {}
        }
        for (i, t) in self.tasks.iter().enumerate() {
            if t.name.is_empty() {
                return bad(format!("tasks[{i}].name must not be empty"));
            }
            if !(t.weight.is_finite() && t.weight >= 0.0) {
                return bad(format!(
                    "tasks[{i}].weight must be finite and >= 0, got {}",
                    t.weight
                ));
            }
            if self.tasks[..i].iter().any(|o| o.name == t.name) {
                return bad(format!("tasks[{i}].name `{}` is used twice", t.name));
            }
        }
        Ok(())
    }

    fn validate_multitask(&self) -> Result<(), NnError> {
        let bad = |m: String| Err(NnError::Config(m));
        let multi = matches!(self.kind, ModelKind::Mmoe | ModelKind::Esmm);
        if !(self.dropout.is_finite() && (0.0..1.0).contains(&self.dropout)) {
            return bad(format!("dropout must be in [0, 1), got {}", self.dropout));
        }
        if !multi && (self.layer_norm || self.dropout > 0.0) {
            return bad(format!(
                "layer_norm and dropout are implemented for mmoe and esmm, not {}: remove them",
                self.kind.name()
            ));
        }
        if self.kind == ModelKind::Mmoe {
            if self.experts == 0 || self.experts > MAX_EXPERTS {
                return bad(format!(
                    "experts must be in 1..={MAX_EXPERTS}, got {}",
                    self.experts
                ));
            }
            if self.tower_hidden.contains(&0) {
                return bad(format!(
                    "tower_hidden widths must be > 0, got {:?}",
                    self.tower_hidden
                ));
            }
        }
        Ok(())
    }
}

impl ModelConfig {
    /// Width of field `f`'s embedding.
    pub fn field_width(&self, f: usize) -> usize {
        self.feature_dims.get(f).copied().unwrap_or(self.emb_dim)
    }

    /// Offset of field `f`'s embedding in one sample's flattened embeddings.
    pub fn field_offset(&self, f: usize) -> usize {
        (0..f).map(|i| self.field_width(i)).sum()
    }

    fn validate_din(&self) -> Result<(), NnError> {
        let bad = |m: String| Err(NnError::Config(m));
        if self.sequence_pooling == SequencePooling::Attention && self.sequences.is_empty() {
            return bad(
                "din with sequence_pooling = \"attention\" needs at least one entry in \
                 sequences (a sequence field and its target field)"
                    .into(),
            );
        }
        if self.attention_hidden.contains(&0) {
            return bad(format!(
                "attention_hidden widths must be > 0, got {:?}",
                self.attention_hidden
            ));
        }
        for (k, s) in self.sequences.iter().enumerate() {
            let n = self.num_fields;
            if s.field >= n || s.target >= n {
                return bad(format!(
                    "sequences[{k}]: field {} and target {} must be field indices < num_fields = {n}",
                    s.field, s.target
                ));
            }
            if s.field == s.target {
                return bad(format!(
                    "sequences[{k}]: field and target must be distinct fields, both are {}",
                    s.field
                ));
            }
            let (wf, wt) = (self.field_width(s.field), self.field_width(s.target));
            if wf != wt {
                return bad(format!(
                    "sequences[{k}]: field {} (width {wf}) and target {} (width {wt}) must have \
                     equal embedding widths",
                    s.field, s.target
                ));
            }
            if s.max_len == 0 {
                return bad(format!("sequences[{k}]: max_len must be >= 1, got 0"));
            }
            let clash = self
                .sequences
                .iter()
                .enumerate()
                .find(|&(j, o)| j != k && (o.field == s.field || o.target == s.field));
            if let Some((j, _)) = clash {
                return bad(format!(
                    "sequences[{k}]: field {} is also sequences[{j}]'s field or target; each \
                     sequence field is attended once and is no target",
                    s.field
                ));
            }
        }
        Ok(())
    }
}
