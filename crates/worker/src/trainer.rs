//! The training loop of one worker: batches in, steps out, then evaluation and a summary.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sparta_data::{read_batches, Batch, DataError, ReaderConfig};
use sparta_nn::{metrics, Model};
use sparta_table::Table;

use sparta_checkpoint::InputPosition;

use crate::checkpointing::{self, CheckpointHook, Checkpoints};
use crate::config::Job;
use crate::dedup::Deduper;
use crate::error::WorkerError;
use crate::pipeline::{self, PipelineConfig};
use crate::progress::Progress;
use crate::step::{self, DenseScratch, Gradients, Lookup};
use crate::store::{DenseStore, LocalStore, SparseStore};
use crate::summary::{peak_rss_bytes, StageSeconds, Summary};

/// The input position saved in checkpoints: rows consumed since the start of training.
fn position(rows: u64) -> InputPosition {
    InputPosition {
        rows_consumed: rows,
        ..InputPosition::default()
    }
}

/// Training loss over a run: the mean for the summary, a moving average for progress.
#[derive(Default)]
struct LossMeter {
    sum: f64,
    steps: u64,
    recent: f64,
}

impl LossMeter {
    /// Records one step's loss; returns the moving average.
    fn record(&mut self, loss: f32) -> f64 {
        let loss = loss as f64;
        self.sum += loss;
        self.steps += 1;
        self.recent = if self.steps == 1 {
            loss
        } else {
            0.95 * self.recent + 0.05 * loss
        };
        self.recent
    }

    fn mean(&self) -> f64 {
        self.sum / self.steps.max(1) as f64
    }
}

/// Skips the first `n` rows of a batch stream (a resumed job's already-trained rows).
struct SkipRows<I> {
    inner: I,
    left: u64,
}

impl<I> SkipRows<I> {
    fn new(inner: I, left: u64) -> Self {
        Self { inner, left }
    }
}

impl<I: Iterator<Item = Result<Batch, DataError>>> Iterator for SkipRows<I> {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let batch = match self.inner.next()? {
                Ok(b) => b,
                Err(e) => return Some(Err(e)),
            };
            if self.left == 0 {
                return Some(Ok(batch));
            }
            let rows = batch.rows as u64;
            if rows <= self.left {
                self.left -= rows;
                continue;
            }
            let from = self.left as usize;
            self.left = 0;
            return Some(Ok(batch.slice(from..batch.rows)));
        }
    }
}

/// What to train on and what to evaluate.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Training files (plain or gzip).
    pub train: Vec<PathBuf>,
    /// Test files; evaluation is skipped when empty.
    pub test: Vec<PathBuf>,
    /// Show a progress bar (on a terminal) or periodic log lines.
    pub progress: bool,
}

/// Evaluation results on a test set.
#[derive(Clone, Debug)]
pub struct Evaluation {
    /// AUC, logloss, positive rate, calibration.
    pub metrics: metrics::EvalSummary,
    /// Malformed lines skipped.
    pub bad_lines: u64,
    /// Wall time.
    pub seconds: f64,
}

/// A worker: the dense model in this process and a store for the sparse rows.
pub struct Trainer {
    job: Job,
    /// Writes checkpoints at step boundaries (embedded tables, or a PS cluster's).
    checkpoints: Option<Box<dyn CheckpointHook>>,
    /// Step and rows consumed before this process started (from a checkpoint).
    start_step: u64,
    start_rows: u64,
    resumed_from: Option<String>,
    store: Arc<dyn SparseStore>,
    dense_store: Option<Arc<dyn DenseStore>>,
    model: Model,
    deduper: Deduper,
    lookup: Lookup,
    grads: Gradients,
    scratch: DenseScratch,
}

impl Trainer {
    /// A trainer over an embedded cluster: the tables live in this process.
    pub fn embedded(job: Job) -> Result<Self, WorkerError> {
        let embedding = Arc::new(Table::new(job.embedding.clone())?);
        let wide = match &job.wide {
            Some(cfg) => Some(Arc::new(Table::new(cfg.clone())?)),
            None => None,
        };
        Self::embedded_with(job, embedding, wide, None)
    }

    fn embedded_with(
        job: Job,
        embedding: Arc<Table>,
        wide: Option<Arc<Table>>,
        restored: Option<&sparta_checkpoint::Restored>,
    ) -> Result<Self, WorkerError> {
        let mut tables = vec![("embedding".to_string(), Arc::clone(&embedding))];
        if let Some(w) = &wide {
            tables.push(("wide".to_string(), Arc::clone(w)));
        }
        let checkpoints = match &job.raw.train.checkpoint_dir {
            Some(dir) => {
                let mut c = Checkpoints::new(
                    dir,
                    &job.raw.train,
                    toml::to_string(&job.raw).unwrap_or_default(),
                    tables,
                )?;
                if let Some(r) = restored {
                    c.resume(r);
                }
                Some(Box::new(c) as Box<dyn CheckpointHook>)
            }
            None => None,
        };
        let mut t = Self::with_store(job, Arc::new(LocalStore::new(embedding, wide)))?;
        t.checkpoints = checkpoints;
        Ok(t)
    }

    /// An embedded trainer resumed from the newest valid checkpoint in `dir` (a fresh one when
    /// `dir` holds none). Tables, dense parameters and optimizer state, the step and the input
    /// position are restored; training skips the rows already consumed.
    pub fn embedded_resume(job: Job, dir: &Path) -> Result<Self, WorkerError> {
        let Some(r) = checkpointing::restore(dir)? else {
            tracing::warn!("no valid checkpoint in {}: starting fresh", dir.display());
            return Self::embedded(job);
        };
        let mut restored = r;
        let mut take = |name: &str| {
            restored
                .tables
                .iter()
                .position(|t| t.name == name)
                .map(|i| Arc::new(restored.tables.swap_remove(i).table))
        };
        let embedding = take("embedding").ok_or_else(|| {
            WorkerError::Training(format!(
                "checkpoint in {} has no embedding table",
                dir.display()
            ))
        })?;
        let wide = if job.wide.is_some() {
            Some(take("wide").ok_or_else(|| {
                WorkerError::Training(format!("checkpoint in {} has no wide table", dir.display()))
            })?)
        } else {
            None
        };
        if embedding.dim() != job.embedding.dim {
            return Err(WorkerError::Config(format!(
                "checkpoint embedding dim {} differs from the job's embedding.dim = {}",
                embedding.dim(),
                job.embedding.dim
            )));
        }
        if job.reader.threads > 1 {
            tracing::warn!(
                "resuming with {} reader threads: the rows consumed are skipped by count; \
                 exactly the unread rows are guaranteed only with reader_threads = 1",
                job.reader.threads
            );
        }
        let mut t = Self::embedded_with(job, embedding, wide, Some(&restored))?;
        if let Some(d) = &restored.dense {
            d.apply_to(&mut t.model)?;
        }
        t.start_step = restored.step;
        t.start_rows = restored.position.rows_consumed;
        t.resumed_from = Some(restored.id.to_string());
        tracing::info!(
            "resumed from checkpoint {} at step {} ({} rows consumed)",
            restored.id,
            restored.step,
            restored.position.rows_consumed
        );
        Ok(t)
    }

    /// A trainer over any store (embedded or remote).
    pub fn with_store(job: Job, store: Arc<dyn SparseStore>) -> Result<Self, WorkerError> {
        let model = Model::new(job.model.clone())?;
        Ok(Self {
            job,
            checkpoints: None,
            start_step: 0,
            start_rows: 0,
            resumed_from: None,
            store,
            dense_store: None,
            model,
            deduper: Deduper::new(),
            lookup: Lookup::default(),
            grads: Gradients::default(),
            scratch: DenseScratch::default(),
        })
    }

    /// Checkpoints this trainer's job with `hook` (a PS cluster's coordinated checkpoints).
    pub fn set_checkpoint_hook(&mut self, hook: Box<dyn CheckpointHook>) {
        self.checkpoints = Some(hook);
    }

    /// Continues a job from a checkpoint: `step` steps and `rows` input rows are done (the
    /// rows are skipped), `from` names the checkpoint.
    pub fn set_resume_point(&mut self, step: u64, rows: u64, from: String) {
        self.start_step = step;
        self.start_rows = rows;
        self.resumed_from = Some(from);
    }

    /// Keeps the dense parameters on the parameter servers instead of in this process.
    pub fn set_dense_store(&mut self, dense: Arc<dyn DenseStore>) {
        self.dense_store = Some(dense);
    }

    /// The dense model (mutable: checkpoints restore into it).
    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    /// The validated job.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The dense model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The sparse store.
    pub fn store(&self) -> &Arc<dyn SparseStore> {
        &self.store
    }

    fn uses_wide(&self) -> bool {
        self.job.wide.is_some() && self.model.uses_wide()
    }

    /// Trains, then evaluates when test files are given; returns the summary.
    pub fn run(&mut self, opts: &RunOptions) -> Result<Summary, WorkerError> {
        let mut summary = self.train(&opts.train, opts.progress)?;
        if !opts.test.is_empty() {
            let eval = self.evaluate(&opts.test)?;
            summary.test_rows = eval.metrics.rows as u64;
            summary.test_auc = Some(eval.metrics.auc);
            summary.test_logloss = Some(eval.metrics.logloss);
            summary.test_positive_rate = Some(eval.metrics.positive_rate);
            summary.test_calibration = Some(eval.metrics.calibration);
            summary.bad_lines += eval.bad_lines;
            summary.eval_seconds = eval.seconds;
        }
        summary.table_rows = self.store.table_rows();
        summary.peak_rss_bytes = peak_rss_bytes();
        Ok(summary)
    }

    /// Trains over `paths` for the configured epochs.
    pub fn train(&mut self, paths: &[PathBuf], progress: bool) -> Result<Summary, WorkerError> {
        if paths.is_empty() {
            return Err(WorkerError::Config("no training files given".into()));
        }
        let total_bytes: u64 = paths
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
            .sum::<u64>()
            * self.job.reader.epochs as u64;
        let start = Instant::now();
        let stream = read_batches(paths, &self.job.reader)?;
        let stats = stream.stats();
        let stream = SkipRows::new(stream, self.start_rows);
        let mut summary = Summary::default();
        let mut progress = Progress::new(total_bytes, progress);
        let loop_start;
        if self.job.raw.train.preload {
            let batches: Vec<Batch> = stream.collect::<Result<_, DataError>>()?;
            summary.load_seconds = start.elapsed().as_secs_f64();
            tracing::info!(
                "preloaded {} rows in {:.2}s",
                stats.rows(),
                summary.load_seconds
            );
            loop_start = Instant::now();
            self.train_loop(
                batches.into_iter().map(Ok),
                &mut summary,
                &mut progress,
                || stats.bytes(),
            )?;
        } else {
            loop_start = Instant::now();
            self.train_loop(stream, &mut summary, &mut progress, || stats.bytes())?;
        }
        progress.finish();
        if let Some(c) = self.checkpoints.as_mut() {
            let step = self.start_step + summary.steps;
            let rows = self.start_rows + summary.train_rows;
            if c.at_end() {
                if let Some(id) = c.write(step, position(rows), &self.model)? {
                    summary.last_checkpoint = Some(id);
                }
            }
            c.finish(step, position(rows))?;
        }
        let loop_secs = loop_start.elapsed().as_secs_f64();
        summary.train_seconds = start.elapsed().as_secs_f64();
        summary.bad_lines = stats.bad_lines();
        // Without the pipeline, time blocked on the reader is not training-loop time; with it,
        // reading overlaps and the wall time is what counts.
        let busy = if summary.pipeline {
            loop_secs
        } else {
            loop_secs - summary.stage_seconds.read
        };
        summary.train_samples_per_sec = summary.train_rows as f64 / summary.train_seconds.max(1e-9);
        summary.loop_samples_per_sec = summary.train_rows as f64 / busy.max(1e-9);
        summary.dense_gflops = self.model.flops_per_sample() * summary.train_rows as f64
            / summary.stage_seconds.dense.max(1e-9)
            / 1e9;
        summary.samples_trained = self.start_rows + summary.train_rows;
        summary.resumed_from = self.resumed_from.clone();
        summary.model = format!("{:?}", self.job.model.kind).to_lowercase();
        summary.epochs = self.job.reader.epochs;
        summary.batch_size = self.job.reader.batch_size;
        summary.threads = self.job.threads;
        if summary.train_rows == 0 && self.start_rows == 0 {
            return Err(WorkerError::Training(
                "the training input held no valid rows".into(),
            ));
        }
        if !summary.train_loss.is_finite() {
            return Err(WorkerError::Training(format!(
                "the loss diverged ({}); lower the learning rates",
                summary.train_loss
            )));
        }
        Ok(summary)
    }

    fn train_loop(
        &mut self,
        batches: impl Iterator<Item = Result<Batch, DataError>> + Send,
        summary: &mut Summary,
        progress: &mut Progress,
        bytes_read: impl Fn() -> u64,
    ) -> Result<(), WorkerError> {
        let wide = self.uses_wide();
        let store = Arc::clone(&self.store);
        if self.job.raw.train.pipeline {
            return self.train_pipelined(batches, summary, progress, bytes_read);
        }
        let mut stage = StageSeconds::default();
        let mut losses = LossMeter::default();
        let mut t = Instant::now();
        for batch in batches {
            let batch = batch?;
            if batch.rows == 0 {
                continue;
            }
            let t1 = Instant::now();
            stage.read += (t1 - t).as_secs_f64();
            let scale = self.job.raw.train.sparse_loss.scale(batch.rows);
            step::lookup(
                store.as_ref(),
                &mut self.deduper,
                batch,
                &mut self.lookup,
                wide,
                true,
            )?;
            let t2 = Instant::now();
            stage.pull += (t2 - t1).as_secs_f64();
            let loss = step::dense(
                &mut self.model,
                self.dense_store.as_deref(),
                &mut self.lookup,
                &mut self.scratch,
                scale,
                wide,
                &mut self.grads,
            )?;
            let t3 = Instant::now();
            stage.dense += (t3 - t2).as_secs_f64();
            step::push(store.as_ref(), &self.grads, wide)?;
            t = Instant::now();
            stage.push += (t - t3).as_secs_f64();

            summary.steps += 1;
            summary.train_rows += self.grads.samples as u64;
            if let Some(c) = self.checkpoints.as_mut() {
                let step = self.start_step + summary.steps;
                if c.due(step) {
                    let rows = self.start_rows + summary.train_rows;
                    if let Some(id) = c.write(step, position(rows), &self.model)? {
                        summary.last_checkpoint = Some(id);
                    }
                }
            }
            let recent = losses.record(loss);
            if !loss.is_finite() {
                summary.train_loss = loss as f64;
                return Ok(());
            }
            progress.update(
                bytes_read(),
                summary.train_rows,
                recent,
                &format!(
                    "read {:.1}s pull {:.1}s dense {:.1}s push {:.1}s",
                    stage.read, stage.pull, stage.dense, stage.push
                ),
            );
        }
        summary.train_loss = losses.mean();
        summary.stage_seconds = stage;
        Ok(())
    }

    fn train_pipelined(
        &mut self,
        batches: impl Iterator<Item = Result<Batch, DataError>> + Send,
        summary: &mut Summary,
        progress: &mut Progress,
        bytes_read: impl Fn() -> u64,
    ) -> Result<(), WorkerError> {
        let cfg = PipelineConfig {
            wide: self.uses_wide(),
            staleness: self.job.raw.train.pipeline_staleness,
            sparse_loss: self.job.raw.train.sparse_loss,
            quiesce_every: self.checkpoints.as_ref().map_or(0, |c| c.every_steps()),
            start_step: self.start_step,
        };
        let (start_step, start_rows) = (self.start_step, self.start_rows);
        let mut hook = self.checkpoints.take();
        let mut last_checkpoint = None;
        let mut on_quiescent = |steps: u64, samples: u64, model: &Model| {
            if let Some(h) = hook.as_mut() {
                let pos = position(start_rows + samples);
                if let Some(id) = h.write(start_step + steps, pos, model)? {
                    last_checkpoint = Some(id);
                }
            }
            Ok(())
        };
        let store = Arc::clone(&self.store);
        let dense_store = self.dense_store.clone();
        let mut losses = LossMeter::default();
        let mut diverged = None;
        let start = Instant::now();
        let stages = pipeline::run(
            store.as_ref(),
            dense_store.as_deref(),
            &mut self.model,
            batches,
            cfg,
            |r| {
                summary.steps += 1;
                summary.train_rows += r.samples as u64;
                let recent = losses.record(r.loss);
                if !r.loss.is_finite() {
                    diverged = Some(r.loss as f64);
                    return false;
                }
                progress.update(
                    bytes_read(),
                    summary.train_rows,
                    recent,
                    &format!(
                    "pipeline {:.1}s: read {:.1}s pull {:.1}s dense {:.1}s push {:.1}s wait {:.1}s",
                    start.elapsed().as_secs_f64(),
                    r.stages.read,
                    r.stages.pull,
                    r.stages.dense,
                    r.stages.push,
                    r.stages.wait
                ),
                );
                true
            },
            &mut on_quiescent,
        );
        self.checkpoints = hook;
        let stages = stages?;
        if last_checkpoint.is_some() {
            summary.last_checkpoint = last_checkpoint;
        }
        summary.train_loss = diverged.unwrap_or(losses.mean());
        summary.stage_seconds = stages;
        summary.pipeline = true;
        Ok(())
    }

    /// Scores `paths` with the current model (no rows are created) and computes the metrics.
    pub fn evaluate(&mut self, paths: &[PathBuf]) -> Result<Evaluation, WorkerError> {
        let start = Instant::now();
        let cfg = ReaderConfig {
            epochs: 1,
            max_rows: None,
            ..self.job.reader.clone()
        };
        let (labels, probs, bad_lines) = self.predict_files(paths, &cfg)?;
        if labels.is_empty() {
            return Err(WorkerError::Training(
                "the test input held no valid rows".into(),
            ));
        }
        Ok(Evaluation {
            metrics: metrics::evaluate(&labels, &probs),
            bad_lines,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Predicts every row of `paths` in input order (with one reader thread) and returns
    /// (labels, probabilities, bad lines).
    pub fn predict_files(
        &mut self,
        paths: &[PathBuf],
        cfg: &ReaderConfig,
    ) -> Result<(Vec<f32>, Vec<f32>, u64), WorkerError> {
        let wide = self.uses_wide();
        let store = Arc::clone(&self.store);
        let stream = read_batches(paths, cfg)?;
        let stats = stream.stats();
        let mut labels = Vec::new();
        let mut probs = Vec::new();
        let mut out = Vec::new();
        for batch in stream {
            let batch = batch?;
            if batch.rows == 0 {
                continue;
            }
            step::lookup(
                store.as_ref(),
                &mut self.deduper,
                batch,
                &mut self.lookup,
                wide,
                false,
            )?;
            let l = &self.lookup;
            out.resize(l.batch.rows, 0.0);
            let mb = sparta_nn::ModelBatch {
                rows: l.batch.rows,
                emb: &l.emb,
                wide: &l.wide_sum,
                dense: &l.batch.dense,
                labels: &[],
            };
            self.model.predict(&mb, &mut out);
            labels.extend_from_slice(&l.batch.labels);
            probs.extend_from_slice(&out);
        }
        Ok((labels, probs, stats.bad_lines()))
    }
}
