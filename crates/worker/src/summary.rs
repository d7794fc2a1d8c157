//! The job summary written as JSON (`--summary-json`) and printed at the end of a run.

use serde::Serialize;
use sparta_nn::metrics::EvalSummary;

/// Seconds spent per stage of the step (summed over steps).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StageSeconds {
    /// Waiting for parsed batches from the reader.
    pub read: f64,
    /// Dedup + partition, pull and gather.
    pub pull: f64,
    /// Dense forward, backward and optimizer.
    pub dense: f64,
    /// Gradient scatter and push.
    pub push: f64,
    /// Waiting on pipeline queues (0 without a pipeline).
    pub wait: f64,
}

/// One of the slowest steps of a run: the longest waits between two steps' ends (a pause: a
/// failover, a checkpoint round, a slow source).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SlowStep {
    /// The step (counted from the job's start, resumed steps included).
    pub step: u64,
    /// Seconds since the previous step ended (or training started).
    pub seconds: f64,
    /// When it ended, seconds after training started.
    pub at_seconds: f64,
}

/// Keeps the `N` slowest steps of a run and the median step time (from a histogram of
/// power-of-2^(1/4) buckets: within 19% of the true median).
#[derive(Clone, Debug)]
pub struct StepClock {
    start: std::time::Instant,
    last: std::time::Instant,
    slowest: Vec<SlowStep>,
    buckets: Vec<u64>,
}

/// How many slow steps a run reports.
pub const SLOW_STEPS: usize = 5;
/// Histogram buckets of step times: 2^(k/4) microseconds, k < 128 (up to ~4.3e3 s).
const STEP_BUCKETS: usize = 128;

impl Default for StepClock {
    fn default() -> Self {
        let now = std::time::Instant::now();
        Self {
            start: now,
            last: now,
            slowest: Vec::with_capacity(SLOW_STEPS + 1),
            buckets: vec![0; STEP_BUCKETS],
        }
    }
}

impl StepClock {
    /// Step `step` ended now.
    pub fn tick(&mut self, step: u64) {
        let now = std::time::Instant::now();
        let seconds = (now - self.last).as_secs_f64();
        self.last = now;
        self.record(step, seconds, (now - self.start).as_secs_f64());
    }

    /// Training resumes after a pause that is no step's (evaluation, an idle source): the
    /// next step is timed from now.
    pub fn restart(&mut self) {
        self.last = std::time::Instant::now();
    }

    fn record(&mut self, step: u64, seconds: f64, at_seconds: f64) {
        let micros = (seconds * 1e6).max(1.0);
        let k = ((micros.log2() * 4.0) as usize).min(STEP_BUCKETS - 1);
        self.buckets[k] += 1;
        let slowest_kept = self.slowest.last().map_or(0.0, |s| s.seconds);
        if self.slowest.len() < SLOW_STEPS || seconds > slowest_kept {
            let at = self.slowest.partition_point(|s| s.seconds >= seconds);
            self.slowest.insert(
                at,
                SlowStep {
                    step,
                    seconds,
                    at_seconds,
                },
            );
            self.slowest.truncate(SLOW_STEPS);
        }
    }

    /// The slowest steps, slowest first.
    pub fn slowest(&self) -> Vec<SlowStep> {
        self.slowest.clone()
    }

    /// The median step time, seconds (0 before any step): the middle of its bucket.
    pub fn median(&self) -> f64 {
        let n: u64 = self.buckets.iter().sum();
        if n == 0 {
            return 0.0;
        }
        let mut seen = 0;
        for (k, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen * 2 >= n {
                return 2f64.powf((k as f64 + 0.5) / 4.0) / 1e6;
            }
        }
        unreachable!("the buckets hold n steps")
    }
}

/// What the training input cost: bytes and the time spent waiting on its source.
#[derive(Clone, Debug, Default, Serialize)]
pub struct InputSummary {
    /// Bytes of (decompressed) text parsed (Kafka: record values plus `\n`).
    pub text_bytes: u64,
    /// Bytes fetched from object storage (as stored, e.g. compressed; 0 for local files).
    pub source_bytes: u64,
    /// Seconds the reader waited on object storage (read-ahead not there yet).
    pub source_wait_seconds: f64,
    /// Object-storage requests retried after a transient error.
    pub source_retries: u64,
    /// Rows read per second of training wall time.
    pub rows_per_sec: f64,
}

impl InputSummary {
    /// The input figures of a reader's stats over `seconds` of training.
    pub fn of(stats: &sparta_data::ReadStats, seconds: f64) -> InputSummary {
        InputSummary {
            text_bytes: stats.bytes(),
            source_bytes: stats.source_bytes(),
            source_wait_seconds: stats.source_wait_seconds(),
            source_retries: stats.source_retries(),
            rows_per_sec: stats.rows() as f64 / seconds.max(1e-9),
        }
    }
}

/// Process restarts per kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Restarts {
    /// Parameter-server restarts.
    pub ps: u64,
    /// Worker restarts.
    pub worker: u64,
}

pub use sparta_table::Evictions;

/// One PS shard at the end of a cluster job (worker 0's summary; `sparta launch`'s job
/// summary): its tables and the PS process's memory.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PsShardSummary {
    /// The shard.
    pub shard: u32,
    /// Resident memory of its PS process when the summary was made, bytes.
    pub resident_bytes: u64,
    /// Peak resident memory of its PS process, bytes.
    pub peak_rss_bytes: u64,
    /// Its physical tables by name: rows, bytes and rows evicted by reason.
    pub tables: std::collections::BTreeMap<String, PsTableSummary>,
    /// Slots (of 16384) whose keys it held at the end, and the epoch of its slot table (one
    /// more per slot move).
    pub slots: u64,
    /// The epoch of its slot table.
    pub routing_epoch: u64,
    /// Slot moves completed into it and out of it.
    pub moves_in: u64,
    /// Slot moves completed out of it.
    pub moves_out: u64,
}

/// One physical table of a PS shard in a [`PsShardSummary`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PsTableSummary {
    /// Rows held.
    pub rows: u64,
    /// Bytes held (rows and free slots, index, sketches, tombstone log).
    pub bytes: u64,
    /// Rows in its SSD tier (counted in `rows`).
    pub cold_rows: u64,
    /// Bytes of its SSD tier's file.
    pub disk_bytes: u64,
    /// Rows evicted so far, by reason.
    pub evicted: Evictions,
}

/// One logical table in a [`Summary`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TableSummary {
    /// Rows (ids) held.
    pub rows: u64,
    /// Row width.
    pub dim: usize,
    /// The payload of its rows: per row the key, the weights and the optimizer state, in its
    /// hash table and (with wide features) in the wide table. The index and slab overhead of the
    /// hash tables, shared by the tables stored together, is in the summary's `table_bytes`.
    pub bytes: u64,
}

impl TableSummary {
    /// The logical tables of `features` over the physical `tables` (in `TableId` order).
    pub fn of(
        features: &sparta_core::features::Features,
        tables: &[std::sync::Arc<sparta_table::Table>],
    ) -> std::collections::BTreeMap<String, TableSummary> {
        let counts: Vec<Vec<u64>> = tables.iter().map(|t| t.rows_by_tag()).collect();
        Self::from_counts(features, &counts)
    }

    /// The logical tables of `features` from each physical table's rows per tag (in
    /// `TableId` order; e.g. summed over the shards of a PS cluster).
    pub fn from_counts(
        features: &sparta_core::features::Features,
        counts: &[Vec<u64>],
    ) -> std::collections::BTreeMap<String, TableSummary> {
        let payload = |t: usize| features.physical[t].config.payload_bytes_per_row() as u64;
        let rows_of = |t: usize, tag: u8| {
            counts
                .get(t)
                .and_then(|c| c.get(tag as usize))
                .copied()
                .unwrap_or(0)
        };
        features
            .tables
            .iter()
            .map(|lt| {
                let rows = rows_of(lt.physical, lt.tag);
                let mut bytes = rows * payload(lt.physical);
                if let (Some(w), true) = (features.wide_table, lt.wide) {
                    bytes += rows_of(w, lt.tag) * payload(w);
                }
                let s = TableSummary {
                    rows,
                    dim: lt.dim,
                    bytes,
                };
                (lt.name.clone(), s)
            })
            .collect()
    }
}

/// Everything a run reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// `wdl`, `deepfm`, `dcn`, `dcnv2`, `dlrm`, `din`, `mmoe` or `esmm`.
    pub model: String,
    /// Training rows consumed (all epochs).
    pub train_rows: u64,
    /// Evaluation rows.
    pub test_rows: u64,
    /// The first task's AUC on the test rows (sample-weighted, from a score histogram of
    /// relative bin width 2.4e-4; null without a test set).
    pub test_auc: Option<f64>,
    /// Mean log loss on the test rows.
    pub test_logloss: Option<f64>,
    /// Positive rate of the test rows.
    pub test_positive_rate: Option<f64>,
    /// Mean prediction / positive rate.
    pub test_calibration: Option<f64>,
    /// GAUC of the test rows grouped by `train.gauc_by` (absent without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_gauc: Option<f64>,
    /// Groups with both classes that GAUC averaged over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_gauc_groups: Option<u64>,
    /// A multi-task model's metrics per task, by task name (absent for one task: the `test_*`
    /// fields are its metrics).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub test_tasks: std::collections::BTreeMap<String, TaskMetrics>,
    /// Wall time of training, reading included.
    pub train_seconds: f64,
    /// `train_rows / train_seconds`.
    pub train_samples_per_sec: f64,
    /// Time spent parsing input before training when `preload` is on.
    pub load_seconds: f64,
    /// Samples per second of the training loop alone (reader wait excluded).
    pub loop_samples_per_sec: f64,
    /// Evaluation wall time.
    pub eval_seconds: f64,
    /// Malformed lines skipped (train + test).
    pub bad_lines: u64,
    /// Following a directory: bad files skipped (corrupt or truncated gzip, changed while
    /// read, a saved offset that does not fit the file).
    pub bad_files: u64,
    /// Following a directory: files that arrived late (sorting before a file already read)
    /// and were skipped.
    pub late_files_skipped: u64,
    /// Rows in all tables at the end.
    pub table_rows: u64,
    /// Peak resident memory of the process.
    pub peak_rss_bytes: u64,
    /// Steps taken.
    pub steps: u64,
    /// Mean training loss over the last epoch's steps.
    pub train_loss: f64,
    /// Epochs over the input.
    pub epochs: usize,
    /// Samples per step.
    pub batch_size: usize,
    /// Compute threads.
    pub threads: usize,
    /// Whether the embedding pipeline was on.
    pub pipeline: bool,
    /// Per-stage seconds.
    pub stage_seconds: StageSeconds,
    /// The median time of a step, seconds.
    pub step_seconds_median: f64,
    /// The slowest steps (the longest pauses between two steps: a failover, a checkpoint
    /// round, a slow source), slowest first.
    pub slowest_steps: Vec<SlowStep>,
    /// Input bytes, source waits and retries.
    pub input: InputSummary,
    /// Samples whose gradients were applied, counted once each, including those trained
    /// before a resume.
    pub samples_trained: u64,
    /// Process restarts by kind (an embedded job has none; `sparta launch` counts them).
    pub restarts: Restarts,
    /// The checkpoint this run resumed from, if any.
    pub resumed_from: Option<String>,
    /// The last checkpoint this run wrote, if any.
    pub last_checkpoint: Option<String>,
    /// Achieved dense GFLOP/s (model FLOPs / dense-stage seconds).
    pub dense_gflops: f64,
    /// Dense forward + backward FLOPs per sample, millions.
    pub dense_mflop_per_sample: f64,
    /// Bytes held by the embedded tables at the end (0 over a remote store).
    pub table_bytes: u64,
    /// Rows of the embedded tables in their SSD tiers at the end (counted in `table_rows`).
    pub table_cold_rows: u64,
    /// Bytes of the embedded tables' SSD tier files at the end.
    pub table_disk_bytes: u64,
    /// The job's (logical) tables at the end, by name: rows, dim and bytes (embedded; empty
    /// over a remote store).
    pub tables: std::collections::BTreeMap<String, TableSummary>,
    /// Rows evicted while training (eviction configured on a table; on a cluster, by every
    /// shard).
    pub evicted_rows: u64,
    /// A cluster job's PS shards at the end (worker 0): tables, evictions and memory.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shard_tables: Vec<PsShardSummary>,
    /// Where the input stands at the end: the epoch, file index and byte offset of the next
    /// unread line (or, following a directory, its file name and byte offset), and the rows
    /// consumed.
    pub input_position: Option<sparta_checkpoint::InputPosition>,
    /// Serving exports written while training.
    pub exports: Option<crate::online::ExportReport>,
    /// Training on files was stopped on request (SIGINT/SIGTERM) before the end of its input;
    /// `input_position` says where a `--resume` continues.
    pub stopped_early: bool,
    /// Progressive validation at the end of training (each batch scored by the model before
    /// it trained on it), per task: `window` (exact, over the last `[metrics] window` rows)
    /// and `cumulative` (since the run started; AUC from a score histogram of relative bin
    /// width 2.4e-4, no GAUC). Null without a trained batch. A cluster worker's are its own
    /// (not merged: worker 0's job summary JSON names them `progressive_worker0`).
    pub progressive: Option<sparta_nn::metrics::Progressive>,
    /// The evaluations on the test set during training (`--eval-every-steps`,
    /// `--eval-every-secs`), in order; the final one is the `test_*` fields.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evaluations: Vec<PeriodicEvaluation>,
}

/// One evaluation on the test set during training.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PeriodicEvaluation {
    /// The job step after which it ran.
    pub step: u64,
    /// Training rows consumed by then (this run's and those before a resume).
    pub train_rows: u64,
    /// Test rows evaluated.
    pub rows: u64,
    /// The first task's metrics (AUC sample-weighted, from a score histogram as `test_auc`),
    /// written as fields of the evaluation itself (`auc`, `logloss`, ...).
    #[serde(flatten)]
    pub first: TaskMetrics,
    /// A multi-task model's metrics per task (absent for one task).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tasks: std::collections::BTreeMap<String, TaskMetrics>,
    /// Wall time of the evaluation.
    pub seconds: f64,
}

impl PeriodicEvaluation {
    /// The record of `e`, run after job step `step` with `train_rows` rows consumed.
    pub fn of(step: u64, train_rows: u64, e: &Evaluation) -> Self {
        PeriodicEvaluation {
            step,
            train_rows,
            rows: e.metrics.rows as u64,
            first: TaskMetrics::of(&e.metrics),
            tasks: task_metrics(e),
            seconds: e.seconds,
        }
    }
}

/// A multi-task evaluation's metrics by task name (empty for one task).
fn task_metrics(e: &Evaluation) -> std::collections::BTreeMap<String, TaskMetrics> {
    if e.tasks.len() <= 1 {
        return Default::default();
    }
    e.tasks
        .iter()
        .map(|t| {
            let tm = TaskMetrics::of(&t.metrics);
            (t.name.clone(), tm)
        })
        .collect()
}

impl Summary {
    /// Records an evaluation on the test set: its metrics, rows, bad lines and time.
    pub fn record_eval(&mut self, e: &Evaluation) {
        self.test_rows = e.metrics.rows as u64;
        self.test_auc = Some(e.metrics.auc);
        self.test_logloss = Some(e.metrics.logloss);
        self.test_positive_rate = Some(e.metrics.positive_rate);
        self.test_calibration = Some(e.metrics.calibration);
        if let Some((g, groups)) = e.metrics.gauc {
            self.test_gauc = Some(g);
            self.test_gauc_groups = Some(groups as u64);
        }
        self.test_tasks = task_metrics(e);
        self.bad_lines += e.bad_lines;
        self.eval_seconds = e.seconds;
    }
}

/// Evaluation results on a test set.
#[derive(Clone, Debug)]
pub struct Evaluation {
    /// The first task's AUC, logloss, positive rate, calibration (and GAUC).
    pub metrics: EvalSummary,
    /// Every task's metrics, in the model's task order.
    pub tasks: Vec<TaskEvaluation>,
    /// Malformed lines skipped.
    pub bad_lines: u64,
    /// Wall time.
    pub seconds: f64,
}

/// One task's metrics on a test set.
#[derive(Clone, Debug)]
pub struct TaskEvaluation {
    /// The task's name (`ctr`, `ctcvr`, ...).
    pub name: String,
    /// Its metrics (sample-weighted).
    pub metrics: EvalSummary,
}

/// One task's test metrics.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TaskMetrics {
    /// AUC (sample-weighted).
    pub auc: f64,
    /// Mean log loss.
    pub logloss: f64,
    /// Positive rate of its target.
    pub positive_rate: f64,
    /// Mean prediction / positive rate.
    pub calibration: f64,
    /// GAUC by `train.gauc_by`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gauc: Option<f64>,
    /// Groups GAUC averaged over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gauc_groups: Option<u64>,
}

impl TaskMetrics {
    /// The metrics of one task's evaluation.
    pub fn of(m: &EvalSummary) -> Self {
        TaskMetrics {
            auc: m.auc,
            logloss: m.logloss,
            positive_rate: m.positive_rate,
            calibration: m.calibration,
            gauc: m.gauc.map(|g| g.0),
            gauc_groups: m.gauc.map(|g| g.1 as u64),
        }
    }
}

/// Peak resident set size of this process (VmHWM), 0 where unavailable.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_clock_keeps_the_slowest_steps_and_the_median() {
        let mut c = StepClock::default();
        for step in 1..=1000u64 {
            let seconds = match step {
                400 => 3.0,
                700 => 0.5,
                _ => 0.010 + (step % 7) as f64 * 1e-4,
            };
            c.record(step, seconds, step as f64);
        }
        let slow = c.slowest();
        assert_eq!(slow.len(), SLOW_STEPS);
        assert_eq!((slow[0].step, slow[0].seconds), (400, 3.0));
        assert_eq!((slow[1].step, slow[1].seconds), (700, 0.5));
        assert!(slow.windows(2).all(|w| w[0].seconds >= w[1].seconds));
        let m = c.median();
        assert!((0.0085..0.0125).contains(&m), "median {m}");
        assert_eq!(StepClock::default().median(), 0.0);
    }
}
