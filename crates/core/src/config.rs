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
use sparta_table::{Admission, Eviction, Initializer, Optimizer, TableConfig};

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
        if self.dir.is_none() {
            let d = ExportConfig::default();
            let unused = [
                ("export.fp16", self.fp16 != d.fp16),
                ("export.min_count", self.min_count != d.min_count),
                ("export.full_every", self.full_every != d.full_every),
                ("export.keep_full", self.keep_full != d.keep_full),
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

    /// Checks every field and derives the component configs.
    pub fn validate(&self) -> Result<Job, CoreError> {
        let schema = self.resolve_schema()?;
        self.check_ranges()?;
        self.export.validate()?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
