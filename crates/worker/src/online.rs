//! Online learning: training on a followed directory, per-step hooks (serving exports), and
//! eviction inside the training loop.
//!
//! * [`FollowOptions`] in [`crate::RunOptions::follow`] makes [`crate::Trainer::run`] train on
//!   the files of a directory as they appear ([`sparta_data::follow`]); checkpoints save the
//!   file name and byte offset after the last trained batch, and a resumed trainer continues
//!   at exactly that line.
//! * A [`StepHook`] sees the model and the tables between steps ([`HookContext`]); the CLI wires
//!   the serving exporter through it (the worker cannot depend on the serving crate).
//! * With eviction configured on a table (`[embedding] eviction = { max_idle_steps = N }`), every
//!   step advances the tables' clock and scans a bounded window of slots
//!   ([`EVICT_SCAN_PER_KEY`] per distinct id of the step), so a table whose ids churn stays
//!   bounded.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sparta_checkpoint::InputPosition;
use sparta_data::FollowPosition;
use sparta_nn::Model;
use sparta_table::Table;

use sparta_core::CoreError;

/// Following a directory instead of reading a fixed list of files.
#[derive(Clone, Debug)]
pub struct FollowOptions {
    /// The directory a log shipper writes into.
    pub dir: PathBuf,
    /// Pause between directory listings while waiting for files.
    pub poll: Duration,
    /// A file is complete once unchanged for this long (or when a later file exists).
    pub settle: Duration,
    /// When this file exists, the files present are trained on and training ends.
    pub stop_file: Option<PathBuf>,
    /// Set (e.g. by a SIGINT/SIGTERM handler) to end training after the current step.
    pub stop: Arc<AtomicBool>,
}

impl FollowOptions {
    /// Follows `dir`: polls every second, settle 10 s, no stop file, a fresh stop flag.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let d = sparta_data::FollowConfig::new(dir);
        FollowOptions {
            dir: d.dir,
            poll: d.poll,
            settle: d.settle,
            stop_file: d.stop_file,
            stop: d.stop,
        }
    }
}

/// Training on a Kafka topic instead of files (`sparta train --kafka`).
#[cfg(feature = "kafka")]
#[derive(Clone, Debug)]
pub struct KafkaOptions {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// The topic.
    pub topic: String,
    /// Where partitions without a saved offset start (a fresh job: all of them).
    pub from: sparta_data::kafka::StartAt,
    /// End once every partition is read to the end it had at the start.
    pub drain: bool,
    /// Set (e.g. by a SIGINT/SIGTERM handler) to end training after the current step.
    pub stop: Arc<AtomicBool>,
    /// A cluster worker none of whose partitions exist (more workers than partitions): true
    /// waits for the stop flag (async mode: it trains nothing but joins the checkpoint
    /// rounds, and reads a partition of its share added later); false leaves at once (sync
    /// and staleness modes, whose steps would wait for its pushes).
    pub idle_without_partitions: bool,
}

/// A checkpoint's input position for a Kafka topic.
#[cfg(feature = "kafka")]
pub(crate) fn kafka_to_input(p: &sparta_data::kafka::KafkaPosition) -> InputPosition {
    InputPosition {
        rows_consumed: p.rows,
        topic: p.topic.clone(),
        kafka: p.offsets.clone(),
        ..InputPosition::default()
    }
}

/// Where a Kafka stream starts after a checkpoint's input position.
#[cfg(feature = "kafka")]
pub(crate) fn input_to_kafka(p: &InputPosition) -> sparta_data::kafka::KafkaPosition {
    sparta_data::kafka::KafkaPosition {
        topic: p.topic.clone(),
        offsets: p.kafka.clone(),
        rows: p.rows_consumed,
    }
}

/// A checkpoint's input position for a followed directory.
pub(crate) fn follow_to_input(p: &FollowPosition) -> InputPosition {
    InputPosition {
        byte_offset: p.offset,
        rows_consumed: p.rows,
        file: p.file.clone(),
        follow_files: p.recent.to_vec(),
        ..InputPosition::default()
    }
}

/// Where a follower starts after a checkpoint's input position.
pub(crate) fn input_to_follow(p: &InputPosition) -> FollowPosition {
    FollowPosition {
        file: p.file.clone(),
        offset: p.byte_offset,
        rows: p.rows_consumed,
        recent: std::sync::Arc::new(p.follow_files.clone()),
    }
}

/// What a hook sees between two steps: a consistent model (every push of the steps so far
/// applied) and the tables it was trained with.
pub struct HookContext<'a> {
    /// Training steps taken, counting those before a resume.
    pub step: u64,
    /// Training rows consumed, counting those before a resume.
    pub rows: u64,
    /// The job config as TOML (what the model was trained with).
    pub job_toml: &'a str,
    /// The dense model.
    pub model: &'a Model,
    /// The embedded tables by name (`embedding`, and `wide` when the model has one).
    pub tables: &'a [(String, Arc<Table>)],
    /// Progressive validation so far (each batch scored before training on it), when the
    /// run keeps it.
    pub progressive: Option<&'a sparta_nn::metrics::Progressive>,
}

impl HookContext<'_> {
    /// The tables as `(name, table)` borrows.
    pub fn table_refs(&self) -> Vec<(&str, &Table)> {
        self.tables
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_ref()))
            .collect()
    }
}

/// Work done between training steps (serving exports, metrics, ...).
///
/// The trainer asks [`StepHook::due`] after every step (keep it cheap); when it says yes it
/// calls [`StepHook::after_step`] at a consistent point: in the sequential loop between two
/// steps; in the pipelined loop after the pushes in flight were drained (the lookup thread may
/// already have pulled the next batch, creating its new rows with their initial values).
/// [`StepHook::finish`] runs once after the last step (and the final checkpoint).
pub trait StepHook: Send {
    /// Whether `after_step` has work to do after step `step`.
    fn due(&mut self, step: u64) -> bool;
    /// Runs the hook's work; an error stops training.
    fn after_step(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError>;
    /// Runs once when training ends (also after a stop request).
    fn finish(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError>;
    /// Adds what the hook did to the run summary.
    fn summarize(&self, _summary: &mut crate::Summary) {}
    /// Whether the hook needs the tables in this process ([`HookContext::tables`]): true
    /// (the default) refuses it on a trainer over a remote store (a cluster worker), whose
    /// hooks see no tables; a hook that reports what there is (TensorBoard scalars) says
    /// false.
    fn needs_tables(&self) -> bool {
        true
    }
    /// The last serving export version this hook published (for a metrics endpoint).
    fn last_export_version(&self) -> Option<u64> {
        None
    }
}

/// Serving exports written by a run (see `sparta train --export-dir`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExportReport {
    /// The export directory.
    pub dir: String,
    /// Versions written by this run.
    pub count: u64,
    /// The last version written.
    pub last_version: Option<u64>,
    /// Full exports among them (the others are deltas).
    pub full: u64,
    /// Versions the quality gate held back (not published; see `[export] gate`).
    pub held_back: u64,
    /// Seconds spent exporting.
    pub seconds: f64,
}

pub use sparta_table::{EVICT_SCAN_MIN, EVICT_SCAN_PER_KEY};

/// Advances the tables' clock after every step and evicts incrementally where configured.
pub(crate) struct Evictor {
    tables: Vec<Arc<Table>>,
    /// Rows evicted by this run.
    pub evicted: u64,
}

impl Evictor {
    pub(crate) fn new(tables: &[(String, Arc<Table>)]) -> Self {
        Evictor {
            tables: tables.iter().map(|(_, t)| Arc::clone(t)).collect(),
            evicted: 0,
        }
    }

    /// After a step that touched `keys` distinct ids: advance the step clock of every table,
    /// then scan a window proportional to `keys` of each table with eviction.
    pub(crate) fn after_step(&mut self, keys: usize) {
        let window = (keys * EVICT_SCAN_PER_KEY).max(EVICT_SCAN_MIN);
        for t in &self.tables {
            t.advance_step();
            if t.config().eviction.is_some() {
                self.evicted += t.evict(window).evicted as u64;
            }
        }
    }
}
