//! The job configuration: what a user writes in `job.toml`, validated into a [`Job`].
//!
//! Two stages, as ripgrep and raft-rs do it: [`JobConfig`] is the raw serde form (every field
//! has a default, unknown fields are refused with their name), [`JobConfig::validate`] turns it
//! into a [`Job`] whose parts are ready to build components from.

use serde::{Deserialize, Serialize};
use sparta_data::{ReaderConfig, Schema};
use sparta_nn::{
    CrossStructure, DenseInit, DenseOptimizer, ModelConfig, ModelKind, ParallelMode, Precision,
    SequencePooling,
};
use sparta_table::{
    Admission, Eviction, Initializer, Optimizer, RowPrecision, Storage, TableConfig,
};

use crate::error::CoreError;
use crate::features::{
    legacy_sections, resolve, FeatureSection, Features, TableDefaults, TableSection,
};

/// The whole job as written in TOML. Every section is optional.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobConfig {
    /// Input layout and reader settings.
    pub data: DataConfig,
    /// The dense network (its shape comes from the schema and the embedding dim).
    pub model: ModelSection,
    /// Row settings every table inherits unless its `[[tables]]` entry sets them (and, in a job
    /// without `[[tables]]`, the dim of every sparse column's table).
    pub embedding: EmbeddingConfig,
    /// The first-order ("wide") table: one weight per id.
    pub wide: WideConfig,
    /// The training loop.
    pub train: TrainConfig,
    /// Serving exports written while training (`sparta train`).
    pub export: ExportConfig,
    /// Parameter-server shards (`sparta ps`, `sparta launch`).
    #[serde(skip_serializing_if = "PsSection::is_default")]
    pub ps: PsSection,
    /// Progressive validation while training (`[metrics]`).
    #[serde(skip_serializing_if = "MetricsSection::is_default")]
    pub metrics: MetricsSection,
    /// `[[tables]]`: named embedding tables (feature columns; see [`crate::features`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<TableSection>,
    /// `[[features]]`: the model's inputs; empty means one `id`/`bag` feature and table per
    /// sparse column and a `log1p` numeric feature per dense column (as printed by
    /// `sparta config show`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<FeatureSection>,
    /// `[[tasks]]`: the objectives of a multi-task model, each on a label column; empty means
    /// one task (`ctr`) on the schema's first label column.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskSection>,
}

/// `[[tasks]]`: one objective.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSection {
    /// Name in outputs and metrics (`ctr`, `ctcvr`, ...).
    pub name: String,
    /// The label column it learns (default: the column of its name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Weight of its loss in the total loss.
    #[serde(default = "one", skip_serializing_if = "is_unit")]
    pub weight: f32,
    /// esmm: the task this one follows (its probability is P(after) x P(this | after), and its
    /// label counts only where the `after` task's label is 1: CTCVR after CTR).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

fn one() -> f32 {
    1.0
}
fn is_unit(v: &f32) -> bool {
    *v == 1.0
}

/// `[model]`: the dense network. Field counts and the embedding width are derived.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// `wdl`, `deepfm`, `dcn`, `dcnv2`, `dlrm`, `din`, `mmoe` or `esmm`.
    pub kind: ModelKind,
    /// Hidden layer widths of the MLP (dlrm: the top MLP).
    pub hidden: Vec<usize>,
    /// Cross layers (dcn, dcnv2).
    pub cross_layers: usize,
    /// dcnv2: rank of each cross matrix (0 = full rank).
    #[serde(skip_serializing_if = "is_zero")]
    pub cross_rank: usize,
    /// dcnv2: low-rank experts per cross layer (softmax-gated; > 1 needs `cross_rank`).
    #[serde(skip_serializing_if = "is_one")]
    pub cross_experts: usize,
    /// dcnv2: `parallel` or `stacked`.
    #[serde(skip_serializing_if = "is_parallel")]
    pub cross_structure: CrossStructure,
    /// dlrm: bottom MLP widths over the dense features, ending at the embedding dim
    /// (empty: `[64, dim]`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bottom_hidden: Vec<usize>,
    /// din: hidden widths of the attention MLP scoring each position (default `[64, 32]`).
    #[serde(skip_serializing_if = "is_attention_default")]
    pub attention_hidden: Vec<usize>,
    /// din: `attention` (default) or `mean` (the sequences mean-pooled: the same model
    /// without the attention).
    #[serde(skip_serializing_if = "is_attention")]
    pub sequence_pooling: SequencePooling,
    /// mmoe: expert MLPs (each `hidden` wide), default 4.
    #[serde(skip_serializing_if = "is_four")]
    pub experts: usize,
    /// mmoe: each task's tower MLP before its logit (default `[64]`).
    #[serde(skip_serializing_if = "is_tower_default")]
    pub tower_hidden: Vec<usize>,
    /// mmoe, esmm: layer normalization after every hidden linear layer.
    #[serde(skip_serializing_if = "is_false")]
    pub layer_norm: bool,
    /// mmoe, esmm: dropout rate after every hidden layer, training only.
    #[serde(skip_serializing_if = "is_zero_f32")]
    pub dropout: f32,
    /// Dense optimizer.
    pub optimizer: DenseOptimizer,
    /// Dense weight initialisation.
    pub init: DenseInit,
    /// How compute threads split a batch.
    pub parallel: ParallelMode,
    /// Arithmetic of the dense GEMMs: `f32` (default) or `bf16` (mixed precision: operands
    /// rounded to bfloat16, f32 sums; AMX tiles where the CPU has AMX-BF16).
    #[serde(skip_serializing_if = "is_f32")]
    pub precision: Precision,
}

impl Default for ModelSection {
    fn default() -> Self {
        let d = ModelConfig::new(ModelKind::Wdl, 1, 1, 0);
        Self {
            kind: d.kind,
            hidden: d.hidden,
            cross_layers: d.cross_layers,
            cross_rank: d.cross_rank,
            cross_experts: d.cross_experts,
            cross_structure: d.cross_structure,
            bottom_hidden: d.bottom_hidden,
            attention_hidden: d.attention_hidden,
            sequence_pooling: d.sequence_pooling,
            experts: d.experts,
            tower_hidden: d.tower_hidden,
            layer_norm: d.layer_norm,
            dropout: d.dropout,
            optimizer: d.optimizer,
            init: d.init,
            parallel: d.parallel,
            precision: d.precision,
        }
    }
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
fn is_attention(v: &SequencePooling) -> bool {
    *v == SequencePooling::Attention
}
fn is_attention_default(v: &[usize]) -> bool {
    v == ModelSection::default().attention_hidden.as_slice()
}
fn is_tower_default(v: &[usize]) -> bool {
    v == ModelSection::default().tower_hidden.as_slice()
}
fn is_four(v: &usize) -> bool {
    *v == ModelSection::default().experts
}
fn is_false(v: &bool) -> bool {
    !*v
}
fn is_zero_f32(v: &f32) -> bool {
    *v == 0.0
}

/// Input format: a named layout or a custom schema.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// Criteo Kaggle: label, I1..I13, C1..C26, tab separated.
    #[default]
    Criteo,
    /// Avazu Kaggle `train.csv`: header, comma separated.
    Avazu,
    /// The `[data.schema]` section describes the columns.
    Custom,
}

/// `[data]`: how samples are read.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `criteo`, `avazu` or `custom` (then `schema` is required).
    pub format: Format,
    /// Column layout for `format = "custom"`.
    pub schema: Option<Schema>,
    /// Samples per training step.
    pub batch_size: usize,
    /// Parser threads (0 = one per core).
    pub reader_threads: usize,
    /// Batches buffered ahead of training (0 = automatic).
    pub queue_batches: usize,
    /// Fraction of malformed lines tolerated before the job stops.
    pub max_bad_line_ratio: f64,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            format: Format::Criteo,
            schema: None,
            batch_size: 4096,
            reader_threads: 0,
            queue_batches: 0,
            max_bad_line_ratio: 0.01,
        }
    }
}

/// `[embedding]`: the deep embedding table.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddingConfig {
    /// Embedding dimension per field.
    pub dim: usize,
    /// Row optimizer.
    pub optimizer: Optimizer,
    /// Initial values of new rows.
    pub init: Initializer,
    /// Which ids get a row.
    pub admission: Admission,
    /// Table shards (lock stripes; 0 = automatic).
    pub shards: usize,
    /// Rows removed while training: `{ max_idle_steps = N }` (not pulled for N steps) and/or
    /// `{ min_count = C }` (pulled fewer than C times when the scan reaches them). Applies to
    /// the wide table too unless `[wide] eviction` says otherwise.
    pub eviction: Option<Eviction>,
    /// How rows store their weights: `f32` (default), `f16` or `bf16` (2 bytes a weight), or
    /// `int8` (a byte a weight and a power-of-two scale per row), rounded stochastically; the
    /// optimizer state stays f32. `[[tables]] precision` overrides it per table.
    pub precision: RowPrecision,
    /// The SSD tier of every table that inherits it: `{ ram_rows = N, disk_dir = "..." }`
    /// (or `ram_bytes = B` instead of `ram_rows`): each physical table keeps its `N` most
    /// recently pulled rows in RAM and the rest in an unnamed file in `disk_dir`. In a
    /// cluster the budget is per PS shard. The wide table stays in RAM.
    pub storage: Option<Storage>,
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        Self {
            dim: 16,
            optimizer: Optimizer::Adagrad {
                lr: 0.05,
                initial_accumulator: 0.1,
                eps: 1e-8,
            },
            init: Initializer::Uniform {
                low: -0.05,
                high: 0.05,
            },
            admission: Admission::Always,
            shards: 0,
            eviction: None,
            precision: RowPrecision::F32,
            storage: None,
        }
    }
}

/// `[wide]`: the first-order table (used by `wdl` and `deepfm`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WideConfig {
    /// Row optimizer of the one-weight rows.
    pub optimizer: Optimizer,
    /// Initial weight of new ids.
    pub init: Initializer,
    /// Which ids get a weight.
    pub admission: Admission,
    /// Eviction of the wide table (default: the embedding table's).
    pub eviction: Option<Eviction>,
}

impl Default for WideConfig {
    fn default() -> Self {
        Self {
            optimizer: Optimizer::Adagrad {
                lr: 0.05,
                initial_accumulator: 0.1,
                eps: 1e-8,
            },
            init: Initializer::Zeros,
            admission: Admission::Always,
            eviction: None,
        }
    }
}

/// How the per-sample loss is reduced before the sparse gradient reaches the table optimizers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SparseLoss {
    /// Rows see the gradient of the batch-mean loss (what most frameworks do by default).
    Mean,
    /// Rows see the gradient of the summed loss: each sample's full gradient.
    #[default]
    Sum,
}

impl SparseLoss {
    /// Factor applied to the batch-mean gradients before they reach the sparse optimizers.
    pub fn scale(self, rows: usize) -> f32 {
        match self {
            SparseLoss::Mean => 1.0,
            SparseLoss::Sum => rows as f32,
        }
    }
}

/// `[train]`: the loop.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Passes over the training files.
    pub epochs: usize,
    /// Compute threads (0 = one per core).
    pub threads: usize,
    /// Seed of every initialiser.
    pub seed: u64,
    /// Reduction of the loss as the sparse optimizers see it.
    pub sparse_loss: SparseLoss,
    /// Parse the whole training set into memory before the first step.
    pub preload: bool,
    /// Stop after this many training rows (per epoch).
    pub max_rows: Option<u64>,
    /// Write checkpoints into this directory (full + incremental chains).
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// Steps between checkpoints (0 = only at the end of training).
    pub checkpoint_every_steps: u64,
    /// Every n-th checkpoint is full, the others incremental (rows changed since the last).
    pub checkpoint_full_every: u64,
    /// Full checkpoints kept (with their incrementals); older ones are deleted.
    pub checkpoint_keep_full: usize,
    /// Overlap the embedding lookup of the next batch and the push of the last one with the
    /// dense work of this one. Unset: on for an embedded job training on files (measured
    /// faster at the same AUC), off for followed directories, Kafka and cluster workers;
    /// `false` gives the sequential loop (`--exact`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<bool>,
    /// With the pipeline on: 1 (default) trains each batch on rows that miss the previous
    /// batch's updates only (the same in every run); 0 re-pulls what the previous batches
    /// changed, for exact sequential semantics.
    pub pipeline_staleness: u32,
    /// How much lower than the dense threads' the scheduling priority of the threads feeding
    /// them is (the readers and the table's pull/push thread): a nice increment, 0..=19. The
    /// dense threads meet at a join every step; with equal priorities, on a machine with no
    /// more cores than busy threads, the scheduler slices the feeding threads into one dense
    /// thread's core and the other core idles at the join. 0: equal priorities.
    pub pipeline_nice: i32,
    /// PS cluster workers: how long an unreachable PS is retried (backoff) before the
    /// worker stops with an error naming its address, seconds.
    pub ps_retry_secs: u64,
    /// PS cluster in sync mode: a step goes on without this many of the slowest workers; their
    /// gradients join the next step (none is dropped). 0 = wait for every worker.
    pub backup_workers: usize,
    /// Consecutive failed attempts to write a checkpoint (each one removed, retried with
    /// backoff) after which the job stops with an error.
    pub checkpoint_max_failures: u32,
    /// PS cluster: a barrier (sync step, checkpoint) that waits longer than this logs which
    /// workers it waits for, again at this interval, seconds.
    pub barrier_warn_secs: f64,
    /// Evaluation also reports GAUC: the AUC of each group of test rows sharing this sparse
    /// feature's value (e.g. the user id), averaged weighted by the group's rows; groups with
    /// one class only are skipped. Names a sparse feature.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gauc_by: Option<String>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 1,
            threads: 0,
            seed: 42,
            sparse_loss: SparseLoss::Sum,
            preload: false,
            max_rows: None,
            checkpoint_dir: None,
            checkpoint_every_steps: 0,
            checkpoint_full_every: 5,
            checkpoint_keep_full: 2,
            pipeline: None,
            pipeline_staleness: 1,
            pipeline_nice: 10,
            ps_retry_secs: 60,
            backup_workers: 0,
            checkpoint_max_failures: 3,
            barrier_warn_secs: 10.0,
            gauc_by: None,
        }
    }
}

/// `[export]`: serving exports written while training (by `sparta train`; flags override).
///
/// Each export is a new version in `dir`: the first full, then deltas (rows changed and
/// rows removed since the previous version), a full one every `full_every` deltas.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExportConfig {
    /// Export directory; exports are off without it.
    pub dir: Option<std::path::PathBuf>,
    /// Export every this many steps (0 = not by steps).
    pub every_steps: u64,
    /// Export when this many seconds passed since the last export (0 = not by time).
    pub every_secs: f64,
    /// Store row weights as half floats.
    pub fp16: bool,
    /// Export only rows pulled at least this often (needs eviction with `min_count`).
    pub min_count: u32,
    /// A full export after this many deltas.
    pub full_every: u32,
    /// Full exports kept, each with the deltas after it.
    pub keep_full: usize,
    /// The quality gate: versions whose progressive window is worse than the recent
    /// published ones are held back (`gate = { max_auc_drop = 0.01, max_logloss_rise = 0.02 }`).
    pub gate: Option<ExportGate>,
}

/// `[export] gate`: when a version is held back (not published) for its window metrics.
/// Every task is judged against the best of the last `history` published versions; see
/// `sparta_export::gate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExportGate {
    /// Largest allowed drop of the window AUC below the best recent published one.
    pub max_auc_drop: Option<f64>,
    /// Largest allowed rise of the window logloss above the best recent published one.
    pub max_logloss_rise: Option<f64>,
    /// Window rows a task needs before the gate judges it.
    pub min_rows: u64,
    /// Recent published versions compared with.
    pub history: usize,
}

impl Default for ExportGate {
    fn default() -> Self {
        Self {
            max_auc_drop: None,
            max_logloss_rise: None,
            min_rows: 1000,
            history: 5,
        }
    }
}

impl ExportGate {
    fn validate(&self) -> Result<(), CoreError> {
        let cfg = |m: String| Err(CoreError::Config(m));
        for (field, v) in [
            ("export.gate.max_auc_drop", self.max_auc_drop),
            ("export.gate.max_logloss_rise", self.max_logloss_rise),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v >= 0.0) {
                    return cfg(format!("{field} = {v} must be a number >= 0"));
                }
            }
        }
        if self.max_auc_drop.is_none() && self.max_logloss_rise.is_none() {
            return cfg(
                "export.gate judges nothing: set export.gate.max_auc_drop and/or \
                 export.gate.max_logloss_rise"
                    .into(),
            );
        }
        if self.history == 0 {
            return cfg("export.gate.history must be at least 1".into());
        }
        Ok(())
    }
}

impl Default for ExportConfig {
    fn default() -> Self {
        Self {
            dir: None,
            every_steps: 0,
            every_secs: 0.0,
            fp16: false,
            min_count: 0,
            full_every: 100,
            keep_full: 2,
            gate: None,
        }
    }
}

impl ExportConfig {
    fn validate(&self) -> Result<(), CoreError> {
        let cfg = |m: String| Err(CoreError::Config(m));
        if !(self.every_secs.is_finite() && self.every_secs >= 0.0) {
            return cfg(format!(
                "export.every_secs = {} must be a number of seconds >= 0",
                self.every_secs
            ));
        }
        if self.dir.is_none() && (self.every_steps > 0 || self.every_secs > 0.0) {
            return cfg(
                "export.every_steps / export.every_secs need an export directory \
                 (export.dir or --export-dir)"
                    .into(),
            );
        }
        if self.keep_full == 0 {
            return cfg("export.keep_full must be at least 1".into());
        }
        if let Some(g) = &self.gate {
            g.validate()?;
        }
        if self.dir.is_none() {
            let d = ExportConfig::default();
            let unused = [
                ("export.fp16", self.fp16 != d.fp16),
                ("export.min_count", self.min_count != d.min_count),
                ("export.full_every", self.full_every != d.full_every),
                ("export.keep_full", self.keep_full != d.keep_full),
                ("export.gate", self.gate.is_some()),
            ];
            if let Some((field, _)) = unused.iter().find(|(_, set)| *set) {
                return cfg(format!(
                    "{field} has no effect without an export directory (export.dir or \
                     --export-dir)"
                ));
            }
        }
        Ok(())
    }
}

/// `[metrics]`: progressive validation while training. Every training batch is scored by
/// the model before it trains on it; each task's metrics are kept over the last `window` rows
/// (exact) and since the run started (streamed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Rows of the progressive window (the most recent rows scored), at least 1.
    pub window: u64,
    /// Keep progressive validation (default true). Off: no progressive metrics in the summary,
    /// progress lines, TensorBoard or `/metrics`, and an `[export] gate` has nothing to judge
    /// (exports are published unjudged, with a warning). Measured cost in BENCHMARKS.md.
    pub progressive: bool,
}

/// The default `[metrics] window`.
pub const DEFAULT_METRICS_WINDOW: u64 = 100_000;

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            window: DEFAULT_METRICS_WINDOW,
            progressive: true,
        }
    }
}

impl MetricsSection {
    fn is_default(&self) -> bool {
        *self == MetricsSection::default()
    }

    fn validate(&self) -> Result<(), CoreError> {
        if self.window == 0 {
            return Err(CoreError::Config(
                "metrics.window = 0: the progressive window needs at least 1 row".into(),
            ));
        }
        Ok(())
    }
}

/// `[ps]`: settings of every parameter-server shard (flags of `sparta ps` override).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PsSection {
    /// Memory cap per shard (`"6GiB"`, `"512MB"`, ...): over it a shard evicts its stalest
    /// rows (see `sparta ps --memory-limit`).
    pub memory_limit: Option<String>,
}

impl PsSection {
    fn is_default(&self) -> bool {
        *self == PsSection::default()
    }

    /// `memory_limit` in bytes (`None`: no cap); an unreadable size is an error naming the
    /// field.
    pub fn memory_limit_bytes(&self) -> Result<Option<u64>, CoreError> {
        self.memory_limit
            .as_deref()
            .map(|s| parse_bytes(s).map_err(|e| CoreError::Config(format!("ps.memory_limit: {e}"))))
            .transpose()
    }
}

/// Parses a byte size: a number (decimals allowed) and a unit `B`, `KiB`, `MiB`, `GiB`, `TiB`
/// (powers of 1024) or `KB`, `MB`, `GB`, `TB` (powers of 1000), case-insensitive, an optional
/// space between; a bare number is bytes. The size must be above 0. The error says what was
/// wrong, without naming the flag or field (the caller does).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let n: f64 = num.parse().map_err(|_| {
        format!("{text:?} is not a size: a number and a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 6GiB")
    })?;
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
        }
    };
    let bytes = n * mult;
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{text:?} must be at least 1 byte"));
    }
    Ok(bytes as u64)
}

/// A validated job: every component's configuration, ready to build from.
#[derive(Clone, Debug)]
pub struct Job {
    /// The raw config it came from (echoed in summaries).
    pub raw: JobConfig,
    /// Input columns.
    pub schema: Schema,
    /// Reader settings for training input.
    pub reader: ReaderConfig,
    /// Dense network.
    pub model: ModelConfig,
    /// Resolved compute threads.
    pub threads: usize,
    /// Feature columns and tables, resolved (with each task's label column).
    pub features: std::sync::Arc<Features>,
}

impl Job {
    /// The sparse slot evaluation groups GAUC by (`train.gauc_by`), if any.
    pub fn gauc_slot(&self) -> Option<usize> {
        let name = self.raw.train.gauc_by.as_ref()?;
        self.features.slots.iter().position(|s| &s.name == name)
    }
}

impl JobConfig {
    /// Parses TOML text; errors name the offending field.
    pub fn from_toml(text: &str) -> Result<Self, CoreError> {
        toml::from_str(text).map_err(|e| CoreError::Config(e.to_string()))
    }

    /// Reads and parses a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, CoreError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CoreError::Config(format!("cannot read config {}: {e}", path.display()))
        })?;
        Self::from_toml(&text).map_err(|e| CoreError::Config(format!("{}: {e}", path.display())))
    }

    /// Writes out the `[[tables]]` and `[[features]]` a job without them means (one table per
    /// sparse column at `[embedding] dim`; see [`crate::features::legacy_sections`]), so a user
    /// can start from them; a job that has them is unchanged. The job means the same after.
    pub fn make_features_explicit(&mut self) -> Result<(), CoreError> {
        if !self.tables.is_empty() || !self.features.is_empty() {
            return Ok(());
        }
        let job = self.validate()?;
        let wide = job.features.has_wide() || self.features.iter().any(|f| f.wide == Some(true));
        let (tables, features) = legacy_sections(&job.schema, self.embedding.dim, wide);
        self.tables = tables;
        self.features = features;
        self.embedding.dim = EmbeddingConfig::default().dim;
        Ok(())
    }

    /// Checks every field and derives the component configs (refusing a dense model that
    /// cannot fit in the memory available now).
    pub fn validate(&self) -> Result<Job, CoreError> {
        self.validate_with_memory(available_memory())
    }

    /// [`JobConfig::validate`] against `memory` bytes (`None`: no memory check).
    fn validate_with_memory(&self, memory: Option<u64>) -> Result<Job, CoreError> {
        let schema = self.resolve_schema()?;
        self.check_ranges()?;
        self.export.validate()?;
        self.metrics.validate()?;
        self.ps.memory_limit_bytes()?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = if self.train.threads == 0 {
            cores
        } else {
            self.train.threads
        };
        let reader_threads = if self.data.reader_threads == 0 {
            cores
        } else {
            self.data.reader_threads
        };
        let model_wide = matches!(self.model.kind, ModelKind::Wdl | ModelKind::Deepfm);
        let (embedding, wide) = self.table_defaults(model_wide)?;
        let (tables, sections) = self.feature_sections(&schema, model_wide)?;
        let mut features = resolve(
            &schema,
            &tables,
            &sections,
            &TableDefaults {
                embedding: &embedding,
                wide: wide.as_ref(),
            },
        )?;
        for p in &features.physical {
            p.config
                .validate()
                .map_err(|e| CoreError::Config(format!("table {:?}: {e}", p.config.name)))?;
        }
        let reader = self.reader_config(&schema, &features, reader_threads);
        self.check_dot_dims(&features)?;
        let mut model = self.model_config(&features, threads)?;
        features.task_labels = self.resolve_tasks(&schema, &mut model)?;
        model
            .validate()
            .map_err(|e| CoreError::Config(format!("model: {e}")))?;
        self.check_dense_memory(&model, memory)?;
        self.check_feature_uses(&features)?;
        Ok(Job {
            raw: self.clone(),
            schema,
            reader,
            model,
            threads,
            features: std::sync::Arc::new(features),
        })
    }

    /// The input columns: the custom `[data.schema]`, or a known format's.
    fn resolve_schema(&self) -> Result<Schema, CoreError> {
        let cfg = |m: String| CoreError::Config(m);
        let schema = match (self.data.format, &self.data.schema) {
            (Format::Custom, Some(s)) => s.clone(),
            (Format::Custom, None) => {
                return Err(cfg(
                    "data.format = \"custom\" needs a [data.schema] section".into(),
                ))
            }
            (Format::Criteo, None) => Schema::criteo(),
            (Format::Avazu, None) => Schema::avazu(),
            (f, Some(_)) => {
                return Err(cfg(format!(
                    "data.schema is given but data.format = {f:?}; set data.format = \"custom\""
                )))
            }
        };
        schema
            .validate()
            .map_err(|e| cfg(format!("data.schema: {e}")))?;
        Ok(schema)
    }

    /// The ranges of the `[data]`, `[train]` and `[embedding]` numbers.
    fn check_ranges(&self) -> Result<(), CoreError> {
        let cfg = |m: String| CoreError::Config(m);
        if self.data.batch_size == 0 || self.data.batch_size > 1 << 20 {
            return Err(cfg(format!(
                "data.batch_size = {} must be in 1..=1048576",
                self.data.batch_size
            )));
        }
        if !(0.0..=1.0).contains(&self.data.max_bad_line_ratio) {
            return Err(cfg(format!(
                "data.max_bad_line_ratio = {} must be in [0, 1]",
                self.data.max_bad_line_ratio
            )));
        }
        if self.train.epochs == 0 {
            return Err(cfg("train.epochs must be at least 1".into()));
        }
        if !matches!(self.train.pipeline_staleness, 0 | 1) {
            return Err(cfg(format!(
                "train.pipeline_staleness = {} must be 0 (exact) or 1 (one batch behind, the default)",
                self.train.pipeline_staleness
            )));
        }
        if !(0..=19).contains(&self.train.pipeline_nice) {
            return Err(cfg(format!(
                "train.pipeline_nice = {} must be within 0..=19 (0: the feeding threads at the dense threads' priority)",
                self.train.pipeline_nice
            )));
        }
        if self.train.checkpoint_max_failures == 0 {
            return Err(cfg(
                "train.checkpoint_max_failures must be at least 1".into()
            ));
        }
        if self.train.barrier_warn_secs.is_nan() || self.train.barrier_warn_secs <= 0.0 {
            return Err(cfg("train.barrier_warn_secs must be above 0".into()));
        }
        if self.train.checkpoint_full_every == 0 {
            return Err(cfg("train.checkpoint_full_every must be at least 1".into()));
        }
        for (field, eviction) in [
            ("embedding.eviction", &self.embedding.eviction),
            ("wide.eviction", &self.wide.eviction),
        ] {
            if eviction
                .as_ref()
                .is_some_and(|e| e.max_idle_steps == Some(0))
            {
                return Err(cfg(format!(
                    "{field}.max_idle_steps = 0 would evict every row after every step (a row \
                     pulled this step is already idle when the scan runs): it must be at least 1"
                )));
            }
        }
        if self.embedding.dim == 0 || self.embedding.dim > 4096 {
            return Err(cfg(format!(
                "embedding.dim = {} must be in 1..=4096",
                self.embedding.dim
            )));
        }
        Ok(())
    }

    /// The tables' defaults: `[embedding]` as a table config, and `[wide]`'s when the model has
    /// a first-order part (`model_wide`).
    fn table_defaults(
        &self,
        model_wide: bool,
    ) -> Result<(TableConfig, Option<TableConfig>), CoreError> {
        let cfg = |m: String| CoreError::Config(m);
        let embedding = TableConfig {
            name: "embedding".into(),
            dim: self.embedding.dim,
            optimizer: self.embedding.optimizer.clone(),
            init: self.embedding.init.clone(),
            seed: self.train.seed,
            shards: self.embedding.shards,
            admission: self.embedding.admission.clone(),
            eviction: self.embedding.eviction.clone(),
            initial_capacity: 1 << 16,
            precision: self.embedding.precision,
            storage: self.embedding.storage.clone(),
        };
        embedding
            .validate()
            .map_err(|e| cfg(format!("embedding: {e}")))?;
        let wide = if model_wide {
            let t = TableConfig {
                name: "wide".into(),
                dim: 1,
                optimizer: self.wide.optimizer.clone(),
                init: self.wide.init.clone(),
                seed: self.train.seed ^ 0x5749_4445,
                shards: self.embedding.shards,
                admission: self.wide.admission.clone(),
                eviction: self
                    .wide
                    .eviction
                    .clone()
                    .or_else(|| self.embedding.eviction.clone()),
                initial_capacity: 1 << 16,
                // One weight per row: nothing to gain from 16 bits.
                precision: sparta_table::RowPrecision::F32,
                // 24 bytes a row: kept in RAM.
                storage: None,
            };
            t.validate().map_err(|e| cfg(format!("wide: {e}")))?;
            Some(t)
        } else {
            None
        };
        Ok((embedding, wide))
    }

    /// The `[[tables]]` and `[[features]]` to resolve: the job's own, or those a job without
    /// them means ([`legacy_sections`]).
    fn feature_sections(
        &self,
        schema: &Schema,
        model_wide: bool,
    ) -> Result<(Vec<TableSection>, Vec<FeatureSection>), CoreError> {
        let cfg = |m: String| CoreError::Config(m);
        Ok(match (self.tables.is_empty(), self.features.is_empty()) {
            (true, true) => legacy_sections(schema, self.embedding.dim, model_wide),
            (false, false) => {
                if self.embedding.dim != EmbeddingConfig::default().dim {
                    return Err(cfg(
                        "embedding.dim has no effect with [[tables]]: each table has its own dim"
                            .into(),
                    ));
                }
                (self.tables.clone(), self.features.clone())
            }
            (true, false) => {
                return Err(cfg(
                    "[[features]] name tables: add the [[tables]] they use".into()
                ))
            }
            (false, true) => {
                return Err(cfg(
                    "[[tables]] are read through [[features]]: add the features that use them"
                        .into(),
                ))
            }
        })
    }

    /// The training input's reader settings.
    fn reader_config(
        &self,
        schema: &Schema,
        features: &Features,
        reader_threads: usize,
    ) -> ReaderConfig {
        ReaderConfig {
            schema: schema.clone(),
            plan: Some(std::sync::Arc::new(features.plan.clone())),
            batch_size: self.data.batch_size,
            threads: reader_threads,
            queue_batches: if self.data.queue_batches == 0 {
                2 * reader_threads + 2
            } else {
                self.data.queue_batches
            },
            max_bad_line_ratio: self.data.max_bad_line_ratio,
            epochs: self.train.epochs,
            max_rows: self.train.max_rows,
            part: None,
            objects: None,
            nice: self.train.pipeline_nice,
        }
    }

    /// The models that take dot products of the embeddings need one dim for every feature.
    fn check_dot_dims(&self, features: &Features) -> Result<(), CoreError> {
        let cfg = |m: String| CoreError::Config(m);
        let dots = match self.model.kind {
            ModelKind::Deepfm => Some("factorization machine"),
            ModelKind::Dlrm => Some("interaction"),
            _ => None,
        };
        if let Some(what) = dots {
            if let Some(s) = features
                .slots
                .iter()
                .find(|s| s.dim != features.slots[0].dim)
            {
                return Err(cfg(format!(
                    "model.kind = \"{}\" needs every sparse feature at one dim (its {what} \
                     takes dot products): feature {:?} has dim {}, feature {:?} has dim {}",
                    self.model.kind.name(),
                    features.slots[0].name,
                    features.slots[0].dim,
                    s.name,
                    s.dim
                )));
            }
        }
        Ok(())
    }

    /// The dense model's config (its tasks are filled by [`JobConfig::resolve_tasks`]).
    fn model_config(&self, features: &Features, threads: usize) -> Result<ModelConfig, CoreError> {
        let cfg = |m: String| CoreError::Config(m);
        let mut model = ModelConfig::with_feature_dims(
            self.model.kind,
            features.slot_dims(),
            features.plan.num_dense(),
        );
        model.hidden = self.model.hidden.clone();
        model.cross_layers = self.model.cross_layers;
        model.cross_rank = self.model.cross_rank;
        model.cross_experts = self.model.cross_experts;
        model.cross_structure = self.model.cross_structure;
        model.bottom_hidden = self.model.bottom_hidden.clone();
        model.attention_hidden = self.model.attention_hidden.clone();
        model.sequence_pooling = self.model.sequence_pooling;
        model.experts = self.model.experts;
        model.tower_hidden = self.model.tower_hidden.clone();
        model.layer_norm = self.model.layer_norm;
        model.dropout = self.model.dropout;
        if self.model.kind == ModelKind::Din {
            model.sequences = features.attended_sequences();
            let attends = self.model.sequence_pooling == SequencePooling::Attention;
            if attends && model.sequences.is_empty() {
                return Err(cfg(
                    "model.kind = \"din\" attends over a behaviour sequence against its target: \
                     give a kind = \"sequence\" feature a `target` (the kind = \"id\" feature of \
                     its table it is compared with), or set model.sequence_pooling = \"mean\""
                        .into(),
                ));
            }
        }
        model.optimizer = self.model.optimizer;
        model.init = self.model.init;
        model.parallel = self.model.parallel;
        model.precision = self.model.precision;
        model.seed = self.train.seed;
        model.threads = threads;
        Ok(model)
    }

    /// Refuses, before anything is allocated, a dense model whose parameters, gradients and
    /// optimizer state (plus one batch of activations) cannot fit in `available` bytes (`None`:
    /// unknown, no check). The estimate is a lower bound (the MLP's and cross layers' weight
    /// matrices only), so a job refused here could never have been trained; the error names
    /// the field that asks for the memory.
    fn check_dense_memory(
        &self,
        model: &ModelConfig,
        available: Option<u64>,
    ) -> Result<(), CoreError> {
        let Some(available) = available else {
            return Ok(());
        };
        let est = DenseEstimate::of(model, self.data.batch_size);
        let need = est.bytes();
        if need <= available as f64 {
            return Ok(());
        }
        let gb = |b: f64| b / 1e9;
        let field = if est.cross_params > est.mlp_params && est.cross_params > est.activations {
            format!(
                "model.cross_layers = {} (cross_rank = {})",
                self.model.cross_layers, self.model.cross_rank
            )
        } else if est.activations > est.mlp_params * est.floats_per_param {
            format!("data.batch_size = {}", self.data.batch_size)
        } else {
            format!("model.hidden = {:?}", self.model.hidden)
        };
        Err(CoreError::Config(format!(
            "{field}: the dense model needs at least {:.1} GB ({:.2e} parameters, each with its \
             gradient and {} optimizer state: {} bytes; plus {:.1} GB of activations per batch of \
             {}), but {:.1} GB of memory is available: use narrower layers or smaller batches",
            gb(need),
            est.mlp_params + est.cross_params,
            dense_optimizer_name(&model.optimizer),
            4.0 * est.floats_per_param,
            gb(est.activations * 4.0),
            self.data.batch_size,
            gb(available as f64),
        )))
    }

    /// What names a feature or needs its tables' counts: `train.gauc_by`, `export.min_count`.
    fn check_feature_uses(&self, features: &Features) -> Result<(), CoreError> {
        let cfg = |m: String| CoreError::Config(m);
        if let Some(name) = &self.train.gauc_by {
            if !features.slots.iter().any(|s| &s.name == name) {
                let names: Vec<&str> = features.slots.iter().map(|s| s.name.as_str()).collect();
                return Err(cfg(format!(
                    "train.gauc_by = {name:?}: no sparse feature of that name (sparse features: {})",
                    names.join(", ")
                )));
            }
        }
        let counts = |t: &TableConfig| t.eviction.as_ref().is_some_and(|e| e.min_count.is_some());
        if self.export.min_count > 1 && !features.physical.iter().all(|p| counts(&p.config)) {
            return Err(cfg(format!(
                "export.min_count = {} needs pull counts: set [embedding] eviction = \
                 {{ min_count = ... }} (tables count pulls only then; a [wide] eviction \
                 or a table's own eviction must keep min_count too)",
                self.export.min_count
            )));
        }
        Ok(())
    }

    /// Checks `[[tasks]]` against the schema's label columns and the model, fills
    /// `model.tasks`, and returns each task's label index.
    fn resolve_tasks(
        &self,
        schema: &Schema,
        model: &mut ModelConfig,
    ) -> Result<Vec<usize>, CoreError> {
        let cfg = |m: String| CoreError::Config(m);
        let labels = schema.label_names();
        let kind = self.model.kind;
        if self.tasks.is_empty() {
            if kind == ModelKind::Esmm {
                return Err(cfg(format!(
                    "model.kind = \"esmm\" needs two [[tasks]]: the click (name = \"ctr\", label = \
                     ...) and the conversion after it (name = \"ctcvr\", label = ..., after = \
                     \"ctr\"); label columns: {}",
                    labels.join(", ")
                )));
            }
            return Ok(vec![0]);
        }
        let multi = matches!(kind, ModelKind::Mmoe | ModelKind::Esmm);
        if !multi && self.tasks.len() > 1 {
            return Err(cfg(format!(
                "{} [[tasks]], but model.kind = \"{}\" learns one objective: use \"mmoe\" or \
                 \"esmm\" for several",
                self.tasks.len(),
                kind.name()
            )));
        }
        let mut out = Vec::with_capacity(self.tasks.len());
        for (i, t) in self.tasks.iter().enumerate() {
            // Names and weights are checked with the model (`ModelConfig::validate`).
            let at = |m: String| cfg(format!("tasks[{i}] ({:?}): {m}", t.name));
            let label = t.label.as_deref().unwrap_or(&t.name);
            let Some(l) = labels.iter().position(|n| n == label) else {
                return Err(at(format!(
                    "label = {label:?} is not a label column of the schema (label columns: {})",
                    labels.join(", ")
                )));
            };
            let esmm_second = kind == ModelKind::Esmm && i == 1;
            match (&t.after, esmm_second) {
                (Some(a), true) if *a == self.tasks[0].name => {}
                (None, false) => {}
                (Some(a), true) => {
                    return Err(at(format!(
                        "after = {a:?}: esmm's second task follows its first ({:?})",
                        self.tasks[0].name
                    )))
                }
                (None, true) => {
                    return Err(at(format!(
                        "esmm's second task needs after = {:?} (the conversion counts only \
                         through clicked samples)",
                        self.tasks[0].name
                    )))
                }
                (Some(_), false) => {
                    return Err(at(
                        "`after` applies to the second task of model.kind = \"esmm\" only".into(),
                    ))
                }
            }
            out.push(l);
        }
        if kind == ModelKind::Esmm && self.tasks.len() != 2 {
            return Err(cfg(format!(
                "model.kind = \"esmm\" takes exactly two [[tasks]] (ctr, then ctcvr after it), got {}",
                self.tasks.len()
            )));
        }
        model.tasks = self
            .tasks
            .iter()
            .map(|t| sparta_nn::TaskSpec {
                name: t.name.clone(),
                weight: t.weight,
            })
            .collect();
        Ok(out)
    }
}

/// The name of a (dense or row) optimizer as configs write it (`type = "adam"`).
fn optimizer_type<T: Serialize>(o: &T) -> String {
    toml::Value::try_from(o)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Checks, before a resume restores anything, that checkpoint `saved` (named `what` in the
/// error) was written by a job with this job's model and optimizers: the model kind and every
/// model option that shapes the dense parameters, the tasks, the dense optimizer, and each
/// table's row optimizer (its state per row). No conversion between them exists, so any
/// difference is refused with an error listing each one. Learning rates and other
/// hyper-parameters, batch size, threads, epochs, input and checkpoint settings may change
/// (tables and dims are checked by [`crate::checkpoint::job_tables`]). A checkpoint whose
/// job text does not parse (an older version) has its tables checked only.
pub fn check_resume(
    job: &Job,
    saved: &sparta_checkpoint::Manifest,
    what: &str,
) -> Result<(), CoreError> {
    let mut diffs: Vec<String> = Vec::new();
    let mut differ = |field: &str, saved: String, now: String| {
        if saved != now {
            diffs.push(format!(
                "{field}: the checkpoint has {saved}, the job says {now}"
            ));
        }
    };
    if let Ok(old) = JobConfig::from_toml(&saved.job_config) {
        let (s, j) = (&old.model, &job.raw.model);
        let kind = j.kind;
        differ(
            "model.kind",
            format!("{:?}", s.kind.name()),
            format!("{:?}", kind.name()),
        );
        if s.kind == kind {
            let dcn = matches!(kind, ModelKind::Dcn | ModelKind::Dcnv2);
            let fields: [(&str, bool, String, String); 11] = [
                (
                    "model.hidden",
                    true,
                    format!("{:?}", s.hidden),
                    format!("{:?}", j.hidden),
                ),
                (
                    "model.cross_layers",
                    dcn,
                    s.cross_layers.to_string(),
                    j.cross_layers.to_string(),
                ),
                (
                    "model.cross_rank",
                    kind == ModelKind::Dcnv2,
                    s.cross_rank.to_string(),
                    j.cross_rank.to_string(),
                ),
                (
                    "model.cross_experts",
                    kind == ModelKind::Dcnv2,
                    s.cross_experts.to_string(),
                    j.cross_experts.to_string(),
                ),
                (
                    "model.bottom_hidden",
                    kind == ModelKind::Dlrm,
                    format!("{:?}", s.bottom_hidden),
                    format!("{:?}", j.bottom_hidden),
                ),
                (
                    "model.attention_hidden",
                    kind == ModelKind::Din,
                    format!("{:?}", s.attention_hidden),
                    format!("{:?}", j.attention_hidden),
                ),
                (
                    "model.sequence_pooling",
                    kind == ModelKind::Din,
                    format!("{:?}", s.sequence_pooling),
                    format!("{:?}", j.sequence_pooling),
                ),
                (
                    "model.experts",
                    kind == ModelKind::Mmoe,
                    s.experts.to_string(),
                    j.experts.to_string(),
                ),
                (
                    "model.tower_hidden",
                    kind == ModelKind::Mmoe,
                    format!("{:?}", s.tower_hidden),
                    format!("{:?}", j.tower_hidden),
                ),
                (
                    "model.layer_norm",
                    matches!(kind, ModelKind::Mmoe | ModelKind::Esmm),
                    s.layer_norm.to_string(),
                    j.layer_norm.to_string(),
                ),
                (
                    "[[tasks]]",
                    true,
                    format!(
                        "{:?}",
                        old.tasks.iter().map(|t| &t.name).collect::<Vec<_>>()
                    ),
                    format!(
                        "{:?}",
                        job.raw.tasks.iter().map(|t| &t.name).collect::<Vec<_>>()
                    ),
                ),
            ];
            for (field, applies, a, b) in fields {
                if applies {
                    differ(field, a, b);
                }
            }
        }
        differ(
            "model.optimizer",
            optimizer_type(&s.optimizer),
            optimizer_type(&j.optimizer),
        );
    }
    for p in &job.features.physical {
        let Some(t) = saved.tables.iter().find(|t| t.name == p.config.name) else {
            continue;
        };
        let field = match p.config.name.as_str() {
            "embedding" | "wide" => format!("{}.optimizer", p.config.name),
            name => format!("table {name:?} optimizer"),
        };
        differ(
            &field,
            optimizer_type(&t.config.optimizer),
            optimizer_type(&p.config.optimizer),
        );
    }
    if diffs.is_empty() {
        return Ok(());
    }
    Err(CoreError::Config(format!(
        "{what} was written by another model or optimizer; refusing to resume (no conversion \
         of its parameters or optimizer state exists):\n  {}\nLearning rates, batch size, \
         threads, epochs and input may change across a resume; to train this job, start it \
         without --resume or with a new checkpoint directory",
        diffs.join("\n  ")
    )))
}

/// A lower bound of a dense model's memory (floats counted as `f64` so no width overflows).
struct DenseEstimate {
    /// Weights of the (expert) MLPs.
    mlp_params: f64,
    /// Weights of dcn / dcnv2 cross layers.
    cross_params: f64,
    /// Floats per parameter: the weight, its gradient, the optimizer's state.
    floats_per_param: f64,
    /// Activation floats of one batch (values and their gradients).
    activations: f64,
}

impl DenseEstimate {
    fn of(model: &ModelConfig, batch_size: usize) -> DenseEstimate {
        let input = model.input_dim() as f64;
        let widths: Vec<f64> = model.hidden.iter().map(|&w| w as f64).collect();
        // dlrm's top MLP reads the interactions, not the flat input: count its input as 1.
        let first_in = if model.kind == ModelKind::Dlrm {
            1.0
        } else {
            input
        };
        let mut mlp = 0.0;
        let mut fan_in = first_in;
        for &w in &widths {
            mlp += fan_in * w;
            fan_in = w;
        }
        mlp += fan_in;
        if model.kind == ModelKind::Mmoe {
            mlp *= model.experts.max(1) as f64;
        }
        let cross_params = match model.kind {
            ModelKind::Dcn => model.cross_layers as f64 * 2.0 * input,
            ModelKind::Dcnv2 if model.cross_rank == 0 => model.cross_layers as f64 * input * input,
            ModelKind::Dcnv2 => {
                model.cross_layers as f64
                    * model.cross_experts.max(1) as f64
                    * 2.0
                    * input
                    * model.cross_rank as f64
            }
            _ => 0.0,
        };
        let state = match model.optimizer {
            DenseOptimizer::Sgd { .. } => 0.0,
            DenseOptimizer::Adagrad { .. } => 1.0,
            DenseOptimizer::Adam { .. } => 2.0,
        };
        let activations = 2.0 * batch_size as f64 * (input + widths.iter().sum::<f64>());
        DenseEstimate {
            mlp_params: mlp,
            cross_params,
            floats_per_param: 2.0 + state,
            activations,
        }
    }

    /// Bytes: every float is 4.
    fn bytes(&self) -> f64 {
        4.0 * ((self.mlp_params + self.cross_params) * self.floats_per_param + self.activations)
    }
}

fn dense_optimizer_name(o: &DenseOptimizer) -> &'static str {
    match o {
        DenseOptimizer::Sgd { .. } => "sgd (no)",
        DenseOptimizer::Adagrad { .. } => "adagrad",
        DenseOptimizer::Adam { .. } => "adam",
    }
}

/// Memory a job may use, in bytes: the smaller of the system's available memory
/// (`MemAvailable` of `/proc/meminfo`) and the cgroup's limit; `None` where neither is known.
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok());
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_bytes_reads_binary_and_decimal_units() {
        assert_eq!(parse_bytes("6GiB"), Ok(6 << 30));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("64kib"), Ok(64 << 10));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("2MB"), Ok(2_000_000));
        assert_eq!(parse_bytes("3KB"), Ok(3000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("10B"), Ok(10));
        for bad in ["", "GiB", "6 parsecs", "0", "-1GiB", "1e9"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        assert!(parse_bytes("6 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
    }

    #[test]
    fn export_gate_is_read_with_defaults_and_bad_values_name_the_field() {
        let c = JobConfig::from_toml(
            "[export]\ndir = \"x\"\ngate = { max_auc_drop = 0.01, max_logloss_rise = 0.02 }\n",
        )
        .unwrap();
        let g = c.export.gate.clone().unwrap();
        assert_eq!(g.max_auc_drop, Some(0.01));
        assert_eq!(g.max_logloss_rise, Some(0.02));
        assert_eq!((g.min_rows, g.history), (1000, 5));
        c.validate().unwrap();
        let err = |text: &str| {
            JobConfig::from_toml(text)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string()
        };
        let e = err("[export]\ndir = \"x\"\ngate = { max_auc_drop = -0.1 }\n");
        assert!(e.contains("export.gate.max_auc_drop"), "{e}");
        let e = err("[export]\ndir = \"x\"\ngate = { max_logloss_rise = nan }\n");
        assert!(e.contains("export.gate.max_logloss_rise"), "{e}");
        let e = err("[export]\ndir = \"x\"\ngate = { min_rows = 10 }\n");
        assert!(e.contains("judges nothing"), "{e}");
        let e = err("[export]\ndir = \"x\"\ngate = { max_auc_drop = 0.1, history = 0 }\n");
        assert!(e.contains("export.gate.history"), "{e}");
        let e = err("[export]\ngate = { max_auc_drop = 0.1 }\n");
        assert!(e.contains("export.gate has no effect"), "{e}");
        let e = JobConfig::from_toml("[export]\ngate = { max_auc = 0.1 }\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_auc"), "{e}");
    }

    #[test]
    fn metrics_window_is_read_defaults_and_zero_is_refused_naming_the_field() {
        let c = JobConfig::from_toml("[metrics]\nwindow = 500\n").unwrap();
        assert_eq!(c.metrics.window, 500);
        assert!(c.validate().is_ok());
        let d = JobConfig::from_toml("").unwrap();
        assert_eq!(d.metrics.window, DEFAULT_METRICS_WINDOW);
        // The default section is not written back (checkpoints and exports keep their text).
        assert!(!toml::to_string(&d).unwrap().contains("[metrics]"));
        let zero = JobConfig::from_toml("[metrics]\nwindow = 0\n").unwrap();
        let e = zero.validate().unwrap_err().to_string();
        assert!(e.contains("metrics.window"), "{e}");
        assert!(d.metrics.progressive);
        let off = JobConfig::from_toml("[metrics]\nprogressive = false\n").unwrap();
        assert!(!off.metrics.progressive);
        let unknown = JobConfig::from_toml("[metrics]\nwindw = 5\n").unwrap_err();
        assert!(unknown.to_string().contains("windw"), "{unknown}");
    }

    #[test]
    fn pipeline_nice_defaults_to_10_and_one_out_of_range_names_the_field() {
        let d = JobConfig::from_toml("").unwrap();
        assert_eq!(d.train.pipeline_nice, 10);
        assert_eq!(d.validate().unwrap().reader.nice, 10);
        let zero = JobConfig::from_toml("[train]\npipeline_nice = 0\n").unwrap();
        assert!(zero.validate().is_ok());
        for bad in ["-1", "20"] {
            let c = JobConfig::from_toml(&format!("[train]\npipeline_nice = {bad}\n")).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("train.pipeline_nice"), "{e}");
        }
    }

    #[test]
    fn ps_memory_limit_is_read_and_a_bad_one_names_the_field() {
        let c = JobConfig::from_toml("[ps]\nmemory_limit = \"48MiB\"\n").unwrap();
        assert_eq!(c.ps.memory_limit_bytes().unwrap(), Some(48 << 20));
        let bad = JobConfig::from_toml("[ps]\nmemory_limit = \"lots\"\n").unwrap();
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("ps.memory_limit"), "{e}");
        assert!(JobConfig::from_toml("[ps]\nlimit = 1\n").is_err());
    }

    fn manifest_of(job: &Job) -> sparta_checkpoint::Manifest {
        use sparta_checkpoint::{CheckpointId, CheckpointKind, Manifest, TableEntry};
        Manifest {
            format_version: 2,
            id: CheckpointId(1),
            kind: CheckpointKind::Full,
            base: CheckpointId(1),
            prev: None,
            step: 1,
            created_unix_ms: 0,
            position: Default::default(),
            job_config: toml::to_string(&job.raw).unwrap(),
            tables: job
                .features
                .physical
                .iter()
                .map(|p| TableEntry {
                    name: p.config.name.clone(),
                    config: p.config.clone(),
                    members: Vec::new(),
                })
                .collect(),
            parts: Vec::new(),
            cluster: None,
        }
    }

    #[test]
    fn check_resume_lists_each_shape_or_optimizer_difference_and_allows_the_rest() {
        let job = |text: &str| JobConfig::from_toml(text).unwrap().validate().unwrap();
        let saved = manifest_of(&job("[model]\nkind = \"dcnv2\"\ncross_rank = 8\n"));
        // Learning rates, batch size, threads, epochs: allowed.
        let ok = job(
            "[model]\nkind = \"dcnv2\"\ncross_rank = 8\n[model.optimizer]\ntype = \"adam\"\n\
             lr = 0.01\nbeta1 = 0.9\nbeta2 = 0.999\neps = 1e-8\n[data]\nbatch_size = 64\n\
             [train]\nthreads = 3\nepochs = 4\n",
        );
        check_resume(&ok, &saved, "ckpt").unwrap();
        let bad = job("[model]\nkind = \"dcnv2\"\ncross_rank = 4\nhidden = [64]\n\
             [embedding.optimizer]\ntype = \"row_wise_adagrad\"\nlr = 0.05\n\
             initial_accumulator = 0.1\neps = 1e-8\n");
        let e = check_resume(&bad, &saved, "ckpt-1 in d")
            .unwrap_err()
            .to_string();
        for want in [
            "ckpt-1 in d was written by another model or optimizer",
            "model.hidden: the checkpoint has [512, 256, 128], the job says [64]",
            "model.cross_rank: the checkpoint has 8, the job says 4",
            "embedding.optimizer: the checkpoint has adagrad, the job says row_wise_adagrad",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
        // A checkpoint whose job text does not parse: its tables are still compared.
        let mut old = saved.clone();
        old.job_config = "[job]\nold = 1\n".into();
        let e = check_resume(&bad, &old, "ckpt").unwrap_err().to_string();
        assert!(
            e.contains("embedding.optimizer") && !e.contains("model."),
            "{e}"
        );
    }

    #[test]
    fn a_dense_model_larger_than_memory_is_refused_naming_the_field() {
        let cfg = JobConfig::from_toml("[model]\nhidden = [100000, 100000]\n").unwrap();
        let job = cfg.validate_with_memory(None).unwrap();
        // 1e10 weights with gradient and adam state: 160 GB at least.
        let est = DenseEstimate::of(&job.model, cfg.data.batch_size);
        assert!(est.bytes() >= 160e9, "{}", est.bytes());
        let e = cfg
            .check_dense_memory(&job.model, Some(64 << 30))
            .unwrap_err()
            .to_string();
        assert!(e.contains("model.hidden = [100000, 100000]"), "{e}");
        assert!(e.contains("GB of memory is available"), "{e}");
        // The default model fits in far less than a GB.
        let small = JobConfig::default();
        let job = small.validate_with_memory(None).unwrap();
        assert!(small.check_dense_memory(&job.model, Some(1 << 30)).is_ok());
    }

    #[test]
    fn eviction_after_zero_idle_steps_is_refused_naming_the_field() {
        for (text, field) in [
            (
                "[embedding]\neviction = { max_idle_steps = 0 }\n",
                "embedding.eviction.max_idle_steps = 0",
            ),
            (
                "[wide]\neviction = { max_idle_steps = 0 }\n",
                "wide.eviction.max_idle_steps = 0",
            ),
        ] {
            let e = JobConfig::from_toml(text)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{e}");
        }
        let ok = "[embedding]\neviction = { max_idle_steps = 1 }\n";
        JobConfig::from_toml(ok).unwrap().validate().unwrap();
    }

    #[test]
    fn model_section_reaches_the_dense_model() {
        let job = JobConfig::from_toml(
            "[model]\nkind = \"dcnv2\"\ncross_rank = 16\ncross_experts = 2\n\
             cross_structure = \"stacked\"\n",
        )
        .unwrap()
        .validate()
        .unwrap();
        let m = &job.model;
        assert_eq!(m.kind, ModelKind::Dcnv2);
        assert_eq!((m.cross_rank, m.cross_experts), (16, 2));
        assert_eq!(m.cross_structure, CrossStructure::Stacked);
        let dim = job.raw.embedding.dim;
        let text = format!("[model]\nkind = \"dlrm\"\nbottom_hidden = [32, {dim}]\n");
        let job = JobConfig::from_toml(&text).unwrap().validate().unwrap();
        assert_eq!(job.model.bottom_hidden, vec![32, dim]);
        let bad = JobConfig::from_toml("[model]\nkind = \"dlrm\"\nbottom_hidden = [32, 3]\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(bad.contains("bottom_hidden = [32, 3]"), "{bad}");
        // a job without the new keys writes none of them (checkpointed job texts stay as they were)
        let text = toml::to_string(&JobConfig::default()).unwrap();
        for key in [
            "cross_rank",
            "cross_experts",
            "cross_structure",
            "bottom_hidden",
        ] {
            assert!(!text.contains(key), "{text}");
        }
    }
}
