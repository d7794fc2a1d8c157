//! A cluster worker's whole life behind one entry point: connect to the shards (and the
//! coordinator), join the ring in dense mode allreduce, resume where the shards' checkpoint
//! left this rank, train its part (files, a followed directory, or its partitions of a Kafka
//! topic), leave, and on rank 0 wait for every worker, write the end-of-job checkpoint,
//! evaluate and report.
//!
//! ```no_run
//! # fn main() -> Result<(), sparta_cluster::ClusterError> {
//! # let job: sparta_core::Job = todo!();
//! let client = sparta_cluster::ClientConfig::new(vec!["ps-0:7000".into()], "token".into(), 0, 1);
//! let report = sparta_cluster::ClusterWorker::connect(job, sparta_cluster::WorkerOptions::new(client))?
//!     .run()?;
//! println!("{}", report.wire_line);
//! # Ok(()) }
//! ```

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use sparta_core::{Job, JobConfig, SparseStore};
use sparta_worker::summary::peak_rss_bytes;
use sparta_worker::{
    ExportReport, FollowOptions, Progress, RunOptions, StepHook, Summary, TableSummary, Trainer,
};

use crate::error::ClusterError;
use crate::report::{wire_report, WireReport};
use crate::ring::{self, RingDense, RingOptions, RingTimes};
use crate::rounds::SharedCheckpoints;
use crate::store::{ClientConfig, RemoteStore};

/// What a worker does besides reaching the shards ([`ClientConfig`]).
pub struct WorkerOptions {
    /// How this worker reaches the shards (addresses, token, rank, retries, TLS).
    pub client: ClientConfig,
    /// Dense mode allreduce: the ring of the workers (empty peers: none).
    pub ring: RingOptions,
    /// Serve Prometheus `/metrics` and `/health` here.
    pub metrics_listen: Option<String>,
    /// Input files (every worker reads its 1/M part of each).
    pub train: Vec<PathBuf>,
    /// Test files, evaluated by rank 0 on the cluster's final model (all of them).
    pub test: Vec<PathBuf>,
    /// Rank 0 also evaluates on `test` during training after every this many job steps
    /// (0: not by steps) ...
    pub eval_every_steps: u64,
    /// ... and once this many seconds passed since its last evaluation (0: not by time).
    pub eval_every_secs: f64,
    /// Follow a directory (or object prefix) instead of `train`.
    pub follow: Option<FollowOptions>,
    /// Read a Kafka topic instead of `train`: this worker's partitions, `p % M == rank`
    /// (its `idle_without_partitions` is set from the PS mode).
    #[cfg(feature = "kafka")]
    pub kafka: Option<sparta_worker::KafkaOptions>,
    /// Log progress lines while training.
    pub progress: bool,
    /// Where progress goes (the binary's terminal bar; log lines by default).
    pub progress_sink: Option<Box<dyn Progress>>,
    /// Set to stop training after the current step (a signal, Ctrl-C in Python): the worker
    /// then leaves as at the end of its input, and rank 0 still finishes the job.
    pub stop: Option<Arc<AtomicBool>>,
    /// Work between steps that needs no tables in this process (a worker's tables live on
    /// the shards: its hooks see none), e.g. TensorBoard scalars ([`sparta_worker::BoardHook`]).
    pub hooks: Vec<Box<dyn StepHook>>,
}

impl WorkerOptions {
    /// The Kafka topic the worker reads, if it reads one.
    fn topic(&self) -> Option<&str> {
        #[cfg(feature = "kafka")]
        if let Some(k) = &self.kafka {
            return Some(&k.topic);
        }
        None
    }

    /// Whether the worker reads a Kafka topic.
    fn reads_kafka(&self) -> bool {
        self.topic().is_some()
    }

    /// A worker on files given later, no ring, no metrics endpoint, progress logged.
    pub fn new(client: ClientConfig) -> Self {
        Self {
            client,
            ring: RingOptions::default(),
            metrics_listen: None,
            train: Vec::new(),
            test: Vec::new(),
            eval_every_steps: 0,
            eval_every_secs: 0.0,
            follow: None,
            #[cfg(feature = "kafka")]
            kafka: None,
            progress: true,
            progress_sink: None,
            stop: None,
            hooks: Vec::new(),
        }
    }
}

/// What a worker's run leaves: its summary, the same as JSON with the cluster's figures
/// (`rank`, `workers`, `ps_shards`, `wire`, `dense`), and the wire line the binary prints.
pub struct WorkerReport {
    /// The training summary. Rank 0's is the job's: the training totals of every worker
    /// (`train_rows`, `samples_trained`, `steps`, `bad_lines`; `train_seconds`: the
    /// longest), the evaluation and every table's rows.
    pub summary: Summary,
    /// The summary as written to `--summary-json`; rank 0's adds `workers_reported` (the
    /// workers its totals sum) and `worker` (its own training figures).
    pub json: serde_json::Value,
    /// One line: RPCs per step and bytes per sample on the wire.
    pub wire_line: String,
    /// Where this worker's metrics are served, when they are.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// A connected cluster worker, ready to train.
pub struct ClusterWorker {
    job: Job,
    store: Arc<RemoteStore>,
    trainer: Trainer,
    ring: Option<Arc<RingDense>>,
    rounds: Option<SharedCheckpoints>,
    opts: WorkerOptions,
    metrics_addr: Option<std::net::SocketAddr>,
}

impl ClusterWorker {
    /// Connects to the cluster and sets everything up before the first step: the store (its
    /// metrics served when asked), the trainer on this rank's part, the dense state (from the
    /// shards, or the ring's), the resume point and the checkpoint rounds.
    pub fn connect(mut job: Job, mut opts: WorkerOptions) -> Result<Self, ClusterError> {
        check_job(&job.raw)?;
        let (rank, m) = (opts.client.rank, opts.client.num_workers.max(1));
        job.reader.part = Some((rank, m));
        // `max_rows` counts rows of the whole job: each worker reads its share.
        job.reader.max_rows = job.reader.max_rows.map(|r| r.div_ceil(m as u64));
        let store = Arc::new(RemoteStore::connect(opts.client.clone(), &job)?);
        let metrics_addr = match &opts.metrics_listen {
            Some(addr) => Some(store.serve_metrics(addr)?),
            None => None,
        };
        let mut trainer = Trainer::with_store(job.clone(), store.clone())?;
        if metrics_addr.is_some() {
            crate::live_metrics::publish(&mut trainer, store.metrics());
        }
        if let Some(p) = opts.progress_sink.take() {
            trainer.set_progress(p);
        }
        if let Some(stop) = &opts.stop {
            trainer.stop_on(Arc::clone(stop));
        }
        for hook in std::mem::take(&mut opts.hooks) {
            trainer.add_hook(hook)?;
        }
        store.init_dense(trainer.model_mut().param_values_mut())?;
        let times = RingTimes {
            form: opts.client.retry_wait,
            io: opts.client.rpc_timeout,
        };
        let ring = ring::setup(
            &opts.ring,
            times,
            &job,
            &store,
            trainer.model_mut().param_values_mut(),
        )?;
        match &ring {
            Some(r) => trainer.set_dense_store(r.clone()),
            None => trainer.set_dense_store(store.clone()),
        }
        let rounds = crate::resume::setup(&mut trainer, &store, &job, &ring, opts.reads_kafka())?;
        Ok(Self {
            job,
            store,
            trainer,
            ring,
            rounds,
            opts,
            metrics_addr,
        })
    }

    /// Where this worker's metrics are served (`metrics_listen`), once bound.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr
    }

    /// Trains this worker's part, leaves, and on rank 0 finishes the job (waits for every
    /// worker, the end-of-job checkpoint, the evaluation, every table's rows) and then tells
    /// every PS process the job is over.
    pub fn run(mut self) -> Result<WorkerReport, ClusterError> {
        let (rank, m) = (self.store.rank(), self.store.num_workers());
        let input = match self.opts.topic() {
            Some(t) => format!("the partitions p of topic {t} where p mod {m} = {rank}"),
            None => format!("part {rank} of {m} of {} file(s)", self.opts.train.len()),
        };
        tracing::info!(
            "worker {rank} of {m}: {:?} on {input}, {} PS shard(s)",
            self.job.model.kind,
            self.store.num_shards()
        );
        if rank == 0 {
            // Rank 0's model (the dense state as of its last step) on all of the test files.
            self.trainer.set_periodic_eval(
                &self.opts.test,
                self.opts.eval_every_steps,
                self.opts.eval_every_secs,
            )?;
        }
        let mut summary = match &self.opts.follow {
            // Every worker follows the directory and reads its share of each file.
            Some(f) => self.trainer.run(&RunOptions {
                follow: Some(f.clone()),
                progress: self.opts.progress,
                ..RunOptions::default()
            })?,
            None => match self.train_kafka()? {
                Some(s) => s,
                None => self.trainer.train(&self.opts.train, self.opts.progress)?,
            },
        };
        let training = wire_report(&self.store, &self.job, summary.steps);
        self.store.worker_done(tally(&summary))?;
        let dense_wire = self.finish_ring()?;
        let own = summary.clone();
        let totals = self.finish_job(&mut summary)?;
        if rank == 0 {
            self.end_job();
        }
        summary.peak_rss_bytes = peak_rss_bytes();
        let report = WireReport {
            dense_bytes: dense_wire.unwrap_or(training.dense_bytes),
            ..training
        };
        self.report(summary, &own, totals, &report)
    }

    /// Trains on this worker's partitions of the topic, when the options name one. A worker
    /// with no partition waits for the stop in async mode (joining the checkpoint rounds) and
    /// leaves at once in the other modes, whose steps would wait for it.
    #[cfg(feature = "kafka")]
    fn train_kafka(&mut self) -> Result<Option<Summary>, ClusterError> {
        let Some(k) = &self.opts.kafka else {
            return Ok(None);
        };
        let k = sparta_worker::KafkaOptions {
            idle_without_partitions: self.store.mode()? == "async",
            ..k.clone()
        };
        let opts = RunOptions {
            progress: self.opts.progress,
            ..RunOptions::default()
        };
        Ok(Some(self.trainer.run_kafka(&k, &opts)?))
    }

    #[cfg(not(feature = "kafka"))]
    fn train_kafka(&mut self) -> Result<Option<Summary>, ClusterError> {
        Ok(None)
    }

    /// In dense mode allreduce: joins the ring with zero gradients until every worker's input
    /// has ended, then (rank 0) hands the shards the final dense state (evaluation, the
    /// end-of-job checkpoint, exports). Returns the ring's bytes.
    fn finish_ring(&self) -> Result<Option<u64>, ClusterError> {
        let Some(r) = &self.ring else {
            return Ok(None);
        };
        let calls = r.drain()?;
        tracing::debug!(
            "worker {}: {calls} ring call(s) after its input ended",
            self.store.rank()
        );
        let (sent, received) = r.bytes();
        if self.store.rank() == 0 {
            let (params, opt) = r.state();
            self.store.set_dense_state(&params, &opt)?;
        }
        Ok(Some(sent + received))
    }

    /// Rank 0, once every worker has finished: the job's training totals (in `summary`;
    /// returns how many workers reported theirs), the cluster's final state (for `--resume`,
    /// `sparta export --checkpoint` or a follow-up job), the evaluation, every table's rows.
    fn finish_job(&self, summary: &mut Summary) -> Result<Option<u32>, ClusterError> {
        let rank = self.store.rank();
        let mut reported = None;
        if rank == 0 {
            let (total, n) = self.store.wait_all_done()?;
            let workers = self.store.num_workers();
            if (n as usize) < workers {
                tracing::warn!(
                    "the job summary's training totals cover {n} of {workers} workers (shard 0 \
                     failed over to a copy that missed the others' reports)"
                );
            }
            summary.train_rows = total.train_rows;
            summary.samples_trained = total.samples_trained;
            summary.steps = total.steps;
            summary.bad_lines = total.bad_lines;
            summary.train_seconds = total.train_seconds;
            summary.train_samples_per_sec = total.train_rows as f64 / total.train_seconds.max(1e-9);
            reported = Some(n);
        }
        if let Some(c) = &self.rounds {
            let mut hook = c.0.lock();
            if let Some(id) = hook.write_last()? {
                summary.last_checkpoint = Some(id);
            }
            if let Some(t) = hook.export_tally() {
                summary.exports = Some(ExportReport {
                    dir: t.dir,
                    count: t.count,
                    last_version: t.last_version,
                    full: t.full,
                    held_back: t.held_back,
                    seconds: t.seconds,
                });
            }
        }
        if rank == 0 && !self.opts.test.is_empty() {
            self.evaluate(summary)?;
        }
        summary.table_rows = self.store.table_rows();
        if rank == 0 {
            summary.tables =
                TableSummary::from_counts(&self.job.features, &self.store.rows_by_tag()?);
            summary.shard_tables = self.store.shard_reports()?;
            summary.evicted_rows = summary
                .shard_tables
                .iter()
                .flat_map(|s| s.tables.values())
                .map(|t| {
                    let e = t.evicted;
                    e.idle_steps + e.idle_seconds + e.min_count + e.memory_limit
                })
                .sum();
        }
        Ok(reported)
    }

    /// Rank 0, once the job is over: says so to every PS process (one run with
    /// `--exit-when-done` exits). A process that does not take it is logged: the job's
    /// results are in by then.
    fn end_job(&self) {
        for (addr, why) in self.store.end_job() {
            tracing::warn!("telling the PS at {addr} that the job is over: {why}");
        }
    }

    /// Evaluates the cluster's final model on all of the test files (no part restriction).
    fn evaluate(&self, summary: &mut Summary) -> Result<(), ClusterError> {
        let mut eval_job = self.job.clone();
        eval_job.reader.part = None;
        let mut eval = Trainer::with_store(eval_job, self.store.clone())?;
        self.store.pull_dense(eval.model_mut().param_values_mut())?;
        summary.record_eval(&eval.evaluate(&self.opts.test)?);
        Ok(())
    }

    /// The report: `summary` (on rank 0 with the job's training totals, which
    /// `workers_reported` workers reported) and this worker's `own` figures (the wire's per
    /// sample, and on rank 0 the summary's `worker` object).
    fn report(
        self,
        summary: Summary,
        own: &Summary,
        workers_reported: Option<u32>,
        wire: &WireReport,
    ) -> Result<WorkerReport, ClusterError> {
        let rank = self.store.rank();
        let samples = own.train_rows.max(1) as f64;
        let mut v = serde_json::to_value(&summary)
            .map_err(|e| ClusterError::Round(format!("the summary as JSON: {e}")))?;
        if let Some(n) = workers_reported {
            v["workers_reported"] = n.into();
            // Progressive validation is not merged across workers: the job summary's is
            // worker 0's own, and its name says so.
            if let Some(p) = v.as_object_mut().and_then(|o| o.remove("progressive")) {
                v["progressive_worker0"] = p;
            }
            v["worker"] = serde_json::json!({
                "rank": rank,
                "train_rows": own.train_rows,
                "samples_trained": own.samples_trained,
                "steps": own.steps,
                "bad_lines": own.bad_lines,
                "train_seconds": own.train_seconds,
                "train_samples_per_sec": own.train_samples_per_sec,
                "loop_samples_per_sec": own.loop_samples_per_sec,
            });
        }
        v["rank"] = rank.into();
        v["workers"] = self.store.num_workers().into();
        v["ps_shards"] = self.store.num_shards().into();
        v["wire"] = wire.json(samples);
        if let Some(r) = &self.ring {
            let (params, _) = r.state();
            v["dense"] = serde_json::json!({
                "mode": "allreduce",
                "ring_compression": self.opts.ring.compression.name(),
                "tls": self.opts.ring.tls.is_some(),
                "params": params.len(),
                "checksum": ring::checksum(&params),
            });
        }
        Ok(WorkerReport {
            wire_line: wire.line(rank, samples),
            summary,
            json: v,
            metrics_addr: self.metrics_addr,
        })
    }
}

/// What a worker reports to shard 0 when done: its summary's training figures.
fn tally(s: &Summary) -> sparta_proto::pb::WorkerTally {
    sparta_proto::pb::WorkerTally {
        train_rows: s.train_rows,
        samples_trained: s.samples_trained,
        steps: s.steps,
        train_seconds: s.train_seconds,
        bad_lines: s.bad_lines,
    }
}

/// What a job on a cluster needs beyond what its config validation checks: exports ride the
/// checkpoint rounds, so an export directory needs a checkpoint directory and a round every
/// K steps.
pub fn check_job(cfg: &JobConfig) -> Result<(), ClusterError> {
    if cfg.export.dir.is_some() {
        if cfg.train.checkpoint_dir.is_none() {
            return Err(ClusterError::Setup(
                "--export-dir on a cluster needs --checkpoint-dir: the PS shards write their \
                 parts of an export at a checkpoint round"
                    .into(),
            ));
        }
        if cfg.train.checkpoint_every_steps == 0 {
            return Err(ClusterError::Setup(
                "--export-dir on a cluster needs --checkpoint-every-steps: exports are written \
                 at checkpoint rounds (export.every_steps / every_secs pick which ones)"
                    .into(),
            ));
        }
    }
    Ok(())
}
