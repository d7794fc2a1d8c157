//! The training loop of one worker: batches in, steps out, then evaluation and a summary.
//!
//! Between two steps the loop advances the tables' clock and evicts incrementally (when
//! configured), writes due checkpoints and runs due [`StepHook`]s (see [`crate::online`]).

mod eval;
mod external;
mod follow;
mod input;
#[cfg(feature = "kafka")]
mod kafka;
mod periodic;
mod pipelined;
mod steps;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sparta_core::config::Job;
use sparta_core::dedup::Deduper;
use sparta_core::store::{DenseStore, LocalStore, SparseStore};
use sparta_core::CoreError;
use sparta_data::{read_batches, read_batches_at, Batch, DataError, ReadPosition};
use sparta_nn::Model;
use sparta_table::Table;

use sparta_checkpoint::InputPosition;

use crate::checkpointing::{CheckpointHook, Checkpoints};
use crate::live::{Live, LiveHandle};
use crate::online::{Evictor, FollowOptions, StepHook};
use crate::progress::{LogProgress, NoProgress, Progress};
use crate::progressive::ProgressiveMeter;
use crate::step::{self, DenseScratch, Gradients, Lookup};
use crate::summary::{peak_rss_bytes, StageSeconds, StepClock, Summary};

use input::{read_start, LossMeter, PositionTrail, SkipRows, Tracked, UntilStopped};
use periodic::PeriodicEval;

/// Where a trainer publishes the live input counters of its current run.
pub type InputStats = Arc<parking_lot::Mutex<Option<Arc<sparta_data::ReadStats>>>>;

/// Where a trainer on a Kafka topic publishes the topic and its per-partition lag.
#[cfg(feature = "kafka")]
pub type KafkaLag = Arc<parking_lot::Mutex<Option<(String, sparta_data::kafka::LagMeter)>>>;

/// What to train on and what to evaluate.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Training files (plain or gzip).
    pub train: Vec<PathBuf>,
    /// Test files; evaluation is skipped when empty.
    pub test: Vec<PathBuf>,
    /// Report progress to the trainer's [`Progress`] handle ([`Trainer::set_progress`]; log
    /// lines by default).
    pub progress: bool,
    /// Train on the files of a directory as they appear instead of on `train`.
    pub follow: Option<FollowOptions>,
    /// Evaluate on `test` during training after every this many job steps (0: not by steps).
    pub eval_every_steps: u64,
    /// Evaluate on `test` during training once this many seconds passed since the last
    /// evaluation (or the start; 0: not by time).
    pub eval_every_secs: f64,
}

/// A worker: the dense model in this process and a store for the sparse rows.
pub struct Trainer {
    job: Job,
    /// The tables of an embedded cluster (what hooks and eviction see).
    tables: Vec<(String, Arc<Table>)>,
    /// Writes checkpoints at step boundaries (embedded tables, or a PS cluster's).
    checkpoints: Option<Box<dyn CheckpointHook>>,
    /// The job config as TOML (saved in checkpoints, given to hooks).
    job_text: String,
    /// Step and input position before this process started (from a checkpoint). The step
    /// also moves up when a cluster worker waiting for input joins the others' checkpoint
    /// round at a later step (see `while_idle`).
    start_step: u64,
    start_position: InputPosition,
    resumed_from: Option<String>,
    /// Work between steps (serving exports).
    hooks: Vec<Box<dyn StepHook>>,
    /// Where training progress goes.
    progress: Box<dyn Progress>,
    /// Set by a stop request (a signal): training on files ends after the current step.
    stop: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Table clock and incremental eviction (embedded tables only).
    evictor: Option<Evictor>,
    store: Arc<dyn SparseStore>,
    dense_store: Option<Arc<dyn DenseStore>>,
    model: Model,
    /// The live input counters of the run in progress (for metrics endpoints).
    input_stats: InputStats,
    /// The lag of the Kafka topic read by the run in progress (for metrics endpoints).
    #[cfg(feature = "kafka")]
    kafka_lag: KafkaLag,
    deduper: Deduper,
    lookup: Lookup,
    grads: Gradients,
    scratch: DenseScratch,
    /// Whether training on files pipelines when the job leaves `train.pipeline` unset: yes
    /// for an embedded trainer.
    pipeline_on_files: bool,
    /// Progressive validation of the batches trained (made at the first training loop).
    progressive: Option<ProgressiveMeter>,
    /// Evaluation on the test set during the run in progress, when asked for.
    periodic: Option<PeriodicEval>,
    /// The live status for a metrics endpoint, once asked for ([`Trainer::live_status`]).
    live: Option<Live>,
}

impl Trainer {
    /// A trainer over an embedded cluster: the tables live in this process.
    pub fn embedded(job: Job) -> Result<Self, CoreError> {
        let tables = job
            .features
            .physical
            .iter()
            .map(|p| Table::new(p.config.clone()).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Self::embedded_with(job, tables, None)
    }

    fn embedded_with(
        job: Job,
        store_tables: Vec<Arc<Table>>,
        restored: Option<&sparta_checkpoint::Restored>,
    ) -> Result<Self, CoreError> {
        let tables: Vec<(String, Arc<Table>)> = store_tables
            .iter()
            .map(|t| (t.config().name.clone(), Arc::clone(t)))
            .collect();
        let checkpoints = match &job.raw.train.checkpoint_dir {
            Some(dir) => {
                let mut c = Checkpoints::new(
                    dir,
                    &job.raw.train,
                    toml::to_string(&job.raw).unwrap_or_default(),
                    tables.clone(),
                    job.features.members(),
                )?;
                if let Some(r) = restored {
                    c.resume(r);
                }
                Some(Box::new(c) as Box<dyn CheckpointHook>)
            }
            None => None,
        };
        let mut t = Self::with_store(job, Arc::new(LocalStore::new(store_tables)))?;
        t.evictor = Some(Evictor::new(&tables));
        t.tables = tables;
        t.pipeline_on_files = true;
        t.checkpoints = checkpoints;
        Ok(t)
    }

    /// An embedded trainer resumed from the newest valid checkpoint in `dir` (a fresh one only
    /// when `policy` allows it: see [`sparta_core::checkpoint::resume_from`]). Tables, dense
    /// parameters and optimizer state, the step and the input position are restored;
    /// training skips the rows already consumed.
    pub fn embedded_resume(
        job: Job,
        dir: &Path,
        policy: sparta_checkpoint::ResumePolicy,
    ) -> Result<Self, CoreError> {
        let Some(r) = sparta_core::checkpoint::resume_from(dir, policy)? else {
            return Self::embedded(job);
        };
        let mut restored = r;
        let what = format!("checkpoint {} in {}", restored.id, dir.display());
        sparta_core::config::check_resume(&job, &restored.manifest, &what)?;
        let mut tables = sparta_core::checkpoint::job_tables(&job.features, &mut restored, &what)?;
        // The job's learning rates (and other hyper-parameters of the same optimizers) apply
        // from here on; `check_resume` refused another optimizer kind.
        for (t, p) in tables.iter_mut().zip(&job.features.physical) {
            if t.config().optimizer != p.config.optimizer {
                tracing::info!(
                    "table {:?}: training on with {:?} (the checkpoint's was {:?})",
                    p.config.name,
                    p.config.optimizer,
                    t.config().optimizer
                );
                t.set_optimizer(p.config.optimizer.clone())
                    .map_err(|e| CoreError::Config(format!("{what}: {e}")))?;
            }
        }
        let tables = tables.into_iter().map(Arc::new).collect();
        let mut t = Self::embedded_with(job, tables, Some(&restored))?;
        if let Some(d) = &restored.dense {
            d.apply_to(&mut t.model)?;
        }
        t.start_step = restored.step;
        t.start_position = restored.position.clone();
        t.resumed_from = Some(restored.id.to_string());
        tracing::info!(
            "resumed from checkpoint {} at step {} ({} rows consumed{})",
            restored.id,
            restored.step,
            restored.position.rows_consumed,
            if restored.position.file.is_empty() {
                String::new()
            } else {
                format!(
                    "; next line at byte {} of {}",
                    restored.position.byte_offset, restored.position.file
                )
            }
        );
        Ok(t)
    }

    /// A trainer over any store (embedded or remote).
    pub fn with_store(job: Job, store: Arc<dyn SparseStore>) -> Result<Self, CoreError> {
        let model = Model::new(job.model.clone())?;
        let job_text = toml::to_string(&job.raw).unwrap_or_default();
        Ok(Self {
            job,
            tables: Vec::new(),
            checkpoints: None,
            job_text,
            start_step: 0,
            start_position: InputPosition::default(),
            resumed_from: None,
            hooks: Vec::new(),
            progress: Box::new(LogProgress::default()),
            stop: None,
            evictor: None,
            store,
            dense_store: None,
            model,
            input_stats: InputStats::default(),
            #[cfg(feature = "kafka")]
            kafka_lag: KafkaLag::default(),
            deduper: Deduper::new(),
            lookup: Lookup::default(),
            grads: Gradients::default(),
            scratch: DenseScratch::default(),
            pipeline_on_files: false,
            progressive: None,
            periodic: None,
            live: None,
        })
    }

    /// Reports training progress to `progress` (a terminal bar in the CLI) instead of log lines.
    pub fn set_progress(&mut self, progress: Box<dyn Progress>) {
        self.progress = progress;
    }

    /// The progress handle for one run: the trainer's, or none when `enabled` is false. Give it
    /// back with [`Trainer::end_progress`].
    fn begin_progress(&mut self, enabled: bool, total_bytes: u64) -> Box<dyn Progress> {
        if !enabled {
            return Box::new(NoProgress);
        }
        let mut p = std::mem::replace(&mut self.progress, Box::new(NoProgress));
        p.start(total_bytes);
        p
    }

    fn end_progress(&mut self, enabled: bool, mut progress: Box<dyn Progress>) {
        progress.finish();
        if enabled {
            self.progress = progress;
        }
    }

    /// [`Trainer::train_loop`] with the progress handle taken for the run (reporting
    /// `total_bytes` of input when `enabled`) and given back after it.
    #[allow(clippy::too_many_arguments)]
    fn train_reporting(
        &mut self,
        pipelined: bool,
        enabled: bool,
        total_bytes: u64,
        batches: impl Iterator<Item = Result<Batch, DataError>> + Send,
        summary: &mut Summary,
        bytes_read: impl Fn() -> u64,
        pos: &dyn Fn(u64) -> Result<InputPosition, CoreError>,
    ) -> Result<(), CoreError> {
        let mut progress = self.begin_progress(enabled, total_bytes);
        let r = self.train_loop(
            pipelined,
            batches,
            summary,
            progress.as_mut(),
            bytes_read,
            pos,
        );
        self.end_progress(enabled, progress);
        r.map_err(|e| self.explain_divergence(e, summary))
    }

    /// Ends training on files gracefully once `flag` is set (a signal handler sets it): the
    /// step in progress finishes, then the final checkpoint, exports and summary are written
    /// as at the end of the input. (A followed directory has its own stop flag.)
    pub fn stop_on(&mut self, flag: Arc<std::sync::atomic::AtomicBool>) {
        self.stop = Some(flag);
    }

    /// The live status of the runs of this trainer (step, samples, loss, progressive
    /// metrics, last checkpoint and export) for a metrics endpoint to read while training
    /// runs; kept from the first call on.
    pub fn live_status(&mut self) -> LiveHandle {
        self.live.get_or_insert_with(Live::new).handle()
    }

    /// The live input counters (rows, bad lines, bad and late files, ...) of the run in
    /// progress, for a metrics endpoint to read while training runs (`None` before a run).
    pub fn input_stats(&self) -> InputStats {
        Arc::clone(&self.input_stats)
    }

    /// The topic and per-partition lag of the Kafka run in progress, for a metrics endpoint
    /// to read while training runs (`None` before a Kafka run).
    #[cfg(feature = "kafka")]
    pub fn kafka_lag(&self) -> KafkaLag {
        Arc::clone(&self.kafka_lag)
    }

    /// Checkpoints this trainer's job with `hook` (a PS cluster's coordinated checkpoints).
    pub fn set_checkpoint_hook(&mut self, hook: Box<dyn CheckpointHook>) {
        self.checkpoints = Some(hook);
    }

    /// Continues a job from a checkpoint: `step` steps are done and the input continues at
    /// `at` (its file, byte offset and epoch; or, for a position saved as a row count only,
    /// after skipping that many rows); `from` names the checkpoint.
    pub fn set_resume_point(&mut self, step: u64, at: InputPosition, from: String) {
        self.start_step = step;
        self.start_position = at;
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

    /// The tables of an embedded trainer by name (empty over a remote store).
    pub fn tables(&self) -> &[(String, Arc<Table>)] {
        &self.tables
    }

    /// The job config as TOML text (as saved in checkpoints and exports).
    pub fn job_toml(&self) -> &str {
        &self.job_text
    }

    /// Adds work to run between steps and at the end of training (a hook that needs the
    /// tables, such as exports, on embedded trainers only).
    pub fn add_hook(&mut self, hook: Box<dyn StepHook>) -> Result<(), CoreError> {
        if self.tables.is_empty() && hook.needs_tables() {
            return Err(CoreError::Config(
                "step hooks (exports) need an embedded trainer: its tables live in this process"
                    .into(),
            ));
        }
        self.hooks.push(hook);
        Ok(())
    }

    /// Trains (on `train`, or on a followed directory), then evaluates when test files are
    /// given; returns the summary.
    pub fn run(&mut self, opts: &RunOptions) -> Result<Summary, CoreError> {
        self.periodic_from(opts)?;
        let summary = match &opts.follow {
            Some(f) => self.train_follow(f, opts.progress)?,
            None => self.train(&opts.train, opts.progress)?,
        };
        self.complete_run(summary, opts)
    }

    /// [`Trainer::run`] on a Kafka topic (`opts.train` and `opts.follow` are not read).
    #[cfg(feature = "kafka")]
    pub fn run_kafka(
        &mut self,
        k: &crate::online::KafkaOptions,
        opts: &RunOptions,
    ) -> Result<Summary, CoreError> {
        self.periodic_from(opts)?;
        let summary = self.train_kafka(k, opts.progress)?;
        self.complete_run(summary, opts)
    }

    /// Evaluates on `test` during the next training run (on files, a followed directory, a
    /// topic or batches handed in) after every `every_steps` job steps and once `every_secs`
    /// seconds passed since the last evaluation (0: not by that; both 0: no evaluation during
    /// training), each recorded in the summary's `evaluations`. [`Trainer::run`] sets it from
    /// its options when they ask for one.
    pub fn set_periodic_eval(
        &mut self,
        test: &[PathBuf],
        every_steps: u64,
        every_secs: f64,
    ) -> Result<(), CoreError> {
        self.periodic = PeriodicEval::new(test, every_steps, every_secs)?;
        Ok(())
    }

    /// The periodic evaluation `opts` asks for, if it asks for one.
    fn periodic_from(&mut self, opts: &RunOptions) -> Result<(), CoreError> {
        if opts.eval_every_steps > 0 || opts.eval_every_secs != 0.0 {
            self.set_periodic_eval(&opts.test, opts.eval_every_steps, opts.eval_every_secs)?;
        }
        Ok(())
    }

    /// After training: evaluation on `opts.test`, table and memory figures, hook reports.
    fn complete_run(
        &mut self,
        mut summary: Summary,
        opts: &RunOptions,
    ) -> Result<Summary, CoreError> {
        self.periodic = None;
        if !opts.test.is_empty() {
            summary.record_eval(&self.evaluate(&opts.test)?);
        }
        summary.table_rows = self.store.table_rows();
        for (_, t) in &self.tables {
            let st = t.stats();
            summary.table_bytes += st.bytes as u64;
            summary.table_cold_rows += st.cold_rows as u64;
            summary.table_disk_bytes += st.disk_bytes;
        }
        if !self.tables.is_empty() {
            let tables: Vec<_> = self.tables.iter().map(|(_, t)| Arc::clone(t)).collect();
            summary.tables = crate::summary::TableSummary::of(&self.job.features, &tables);
        }
        summary.peak_rss_bytes = peak_rss_bytes();
        for h in &self.hooks {
            h.summarize(&mut summary);
        }
        Ok(summary)
    }

    /// Trains over `paths` for the configured epochs.
    pub fn train(&mut self, paths: &[PathBuf], progress: bool) -> Result<Summary, CoreError> {
        if paths.is_empty() {
            return Err(CoreError::Config("no training files given".into()));
        }
        self.refuse_kafka_position()?;
        let total_bytes: u64 = paths
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
            .sum::<u64>()
            * self.job.reader.epochs as u64
            // A cluster worker of M reads 1/M of the input.
            / self.job.reader.part.map_or(1, |(_, m)| m.max(1) as u64);
        let start = Instant::now();
        let start_rows = self.start_position.rows_consumed;
        let preload = self.job.raw.train.preload;
        // A checkpoint's file, byte offset and epoch: start there. A position saved as a row
        // count only: read from the start and skip that many rows.
        let (stream, skip, trail) = match read_start(&self.start_position) {
            Some(at) => {
                tracing::info!(
                    "continuing at byte {} of file {} in epoch {} ({} rows consumed)",
                    at.byte_offset,
                    at.file_index,
                    at.epoch,
                    at.rows
                );
                let s = read_batches_at(paths, &self.job.reader, at)?;
                (s, 0, PositionTrail::new(at, preload))
            }
            None => {
                let s = read_batches(paths, &self.job.reader)?;
                (
                    s,
                    start_rows,
                    PositionTrail::new(ReadPosition::default(), preload),
                )
            }
        };
        let stats = stream.stats();
        *self.input_stats.lock() = Some(Arc::clone(&stats));
        let stream = UntilStopped {
            inner: SkipRows::new(Tracked::new(stream, trail.clone()), skip),
            stop: self.stop.clone(),
        };
        let pos = |rows: u64| Ok(trail.at(rows));
        let mut summary = Summary::default();
        let enabled = progress;
        let pipelined = self.pipelines_batches();
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
            self.train_reporting(
                pipelined,
                enabled,
                total_bytes,
                batches.into_iter().map(Ok),
                &mut summary,
                || crate::progress::delivered_bytes(&stats),
                &pos,
            )?;
        } else {
            loop_start = Instant::now();
            self.train_reporting(
                pipelined,
                enabled,
                total_bytes,
                stream,
                &mut summary,
                || crate::progress::delivered_bytes(&stats),
                &pos,
            )?;
        }
        let end = pos(start_rows + summary.train_rows)?;
        self.end_batch_run(&mut summary, start, loop_start, &stats, end, start_rows)?;
        Ok(summary)
    }

    /// Whether a run on files (or on batches handed in) pipelines: the job's `train.pipeline`,
    /// else the trainer's default (on when embedded).
    fn pipelines_batches(&self) -> bool {
        self.job
            .raw
            .train
            .pipeline
            .unwrap_or(self.pipeline_on_files)
    }

    /// After the loop of a run on files or handed-in batches ending at `end`: the summary's
    /// position and early stop, the final checkpoint and hooks ([`Trainer::finish_training`]);
    /// an error when a fresh run found no valid rows.
    fn end_batch_run(
        &mut self,
        summary: &mut Summary,
        start: Instant,
        loop_start: Instant,
        stats: &sparta_data::ReadStats,
        end: InputPosition,
        start_rows: u64,
    ) -> Result<(), CoreError> {
        summary.input_position = Some(end.clone());
        summary.stopped_early = self
            .stop
            .as_ref()
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
        if summary.stopped_early {
            tracing::warn!(
                "stopped on request after {} rows of this run (step {}): writing the final \
                 checkpoint and summary",
                summary.train_rows,
                self.start_step + summary.steps
            );
        }
        self.finish_training(summary, start, loop_start, stats, end)?;
        if summary.train_rows == 0 && start_rows == 0 {
            return Err(CoreError::Training(
                "the training input held no valid rows".into(),
            ));
        }
        Ok(())
    }

    /// A checkpoint of a job reading a Kafka topic resumes only on that topic.
    fn refuse_kafka_position(&self) -> Result<(), CoreError> {
        match self.start_position.topic.as_str() {
            "" => Ok(()),
            topic => Err(CoreError::Config(format!(
                "the checkpoint was written by a job reading the Kafka topic {topic}: resume it \
                 with --kafka BROKERS --topic {topic}"
            ))),
        }
    }

    fn train_loop(
        &mut self,
        pipelined: bool,
        batches: impl Iterator<Item = Result<Batch, DataError>> + Send,
        summary: &mut Summary,
        progress: &mut dyn Progress,
        bytes_read: impl Fn() -> u64,
        pos: &dyn Fn(u64) -> Result<InputPosition, CoreError>,
    ) -> Result<(), CoreError> {
        let store = Arc::clone(&self.store);
        let features = Arc::clone(&self.job.features);
        if self.progressive.is_none() && self.job.raw.metrics.progressive {
            self.progressive = Some(ProgressiveMeter::new(&self.job));
        }
        if pipelined {
            return self.train_pipelined(batches, summary, progress, bytes_read, pos);
        }
        let mut stage = StageSeconds::default();
        let mut losses = LossMeter::default();
        let mut clock = StepClock::default();
        let mut t = Instant::now();
        for batch in batches {
            let batch = batch?;
            if batch.rows == 0 {
                // An idle tick of a followed directory: timed work between steps.
                self.while_idle(summary, pos)?;
                t = Instant::now();
                clock.restart();
                continue;
            }
            let t1 = Instant::now();
            stage.read += (t1 - t).as_secs_f64();
            let scale = self.job.raw.train.sparse_loss.scale(batch.rows);
            step::lookup(
                store.as_ref(),
                &mut self.deduper,
                &features,
                batch,
                &mut self.lookup,
                true,
            )?;
            let t2 = Instant::now();
            stage.pull += (t2 - t1).as_secs_f64();
            let loss = step::dense(
                &mut self.model,
                self.dense_store.as_deref(),
                &features,
                &mut self.lookup,
                &mut self.scratch,
                scale,
                &mut self.grads,
            )?;
            let t3 = Instant::now();
            stage.dense += (t3 - t2).as_secs_f64();
            if let Some(m) = self.progressive.as_mut() {
                m.record(&features, &self.lookup.batch, self.scratch.scored());
            }
            step::push(store.as_ref(), &features, &self.grads)?;
            t = Instant::now();
            stage.push += (t - t3).as_secs_f64();

            summary.steps += 1;
            summary.train_rows += self.grads.samples as u64;
            clock.tick(self.start_step + summary.steps);
            self.between_steps(self.grads.unique.keys.len(), summary, pos)?;
            if self.evaluate_if_due(summary)? {
                clock.restart();
            }
            let recent = losses.record(loss);
            if let Some(live) = self.live.as_mut() {
                live.step(
                    self.start_step + summary.steps,
                    self.start_position.rows_consumed + summary.train_rows,
                    recent,
                    self.progressive.as_ref(),
                    || steps::export_version(&self.hooks, self.checkpoints.as_deref()),
                );
            }
            let meter = self.progressive.as_ref();
            progress.update_with(
                bytes_read(),
                summary.train_rows,
                recent,
                &format!(
                    "read {:.1}s pull {:.1}s dense {:.1}s push {:.1}s",
                    stage.read, stage.pull, stage.dense, stage.push
                ),
                &mut || meter.and_then(ProgressiveMeter::line),
            );
        }
        summary.train_loss = losses.mean();
        summary.stage_seconds = stage;
        summary.step_seconds_median = clock.median();
        summary.slowest_steps = clock.slowest();
        Ok(())
    }

    /// Evaluates on the test set when a periodic evaluation is due after the current step
    /// (with this trainer's model); returns whether one ran.
    fn evaluate_if_due(&mut self, summary: &mut Summary) -> Result<bool, CoreError> {
        let step = self.start_step + summary.steps;
        let Some(p) = self.periodic.as_mut().filter(|p| p.is_due(step)) else {
            return Ok(false);
        };
        let rows = self.start_position.rows_consumed + summary.train_rows;
        p.evaluate(&self.job, &self.store, &self.model, step, rows, summary)?;
        Ok(true)
    }

    /// The progressive validation report at job step `step` (`None` before any training).
    fn progressive_report(&self, step: u64) -> Option<sparta_nn::metrics::Progressive> {
        self.progressive.as_ref().map(|m| m.report(step))
    }
}
