//! The worker's side of cluster checkpoint and export rounds ([`ClusterCheckpoints`],
//! [`ClusterExports`]): every `K` steps each worker enters the checkpoint barrier of every
//! shard (the shard's side: `sparta_ps::ckpt`); worker 0, the
//! coordinator, picks the checkpoint id and kind, and once every shard has written its part it
//! writes the manifest with every worker's position: the commit point.

use std::path::Path;
use std::sync::Arc;

use sparta_checkpoint::{
    open_dir, CheckpointError, CheckpointKind, Checkpointer, ClusterState, InputPosition, Manifest,
    PartEntry, RetentionPolicy, RetryPolicy, TableEntry, MANIFEST_FILE,
};
use std::time::{Duration, Instant};

use sparta_core::config::{ExportConfig, TrainConfig};
use sparta_core::{CheckpointHook, CoreError};
use sparta_export::gate::{Gate, GateRule};
use sparta_export::{Committer, ExportKind, ExportOptions, ExportQuality, Plan};
use sparta_nn::Model;

use sparta_proto::ckpt::{worker_position, worker_state, Order};
use sparta_proto::pb;
use sparta_proto::wire::{self, Compression};

use crate::error::ClusterError;
use crate::store::RemoteStore;

/// Coordinated checkpoints of a PS cluster, seen from one worker.
pub struct ClusterCheckpoints {
    store: Arc<RemoteStore>,
    rank: usize,
    every_steps: u64,
    full_every: u64,
    written: u64,
    force_full: bool,
    /// Worker 0 only: picks ids and commits manifests.
    writer: Option<Checkpointer>,
    job_text: String,
    layout: ClusterState,
    /// This worker's final step and position, once it finished training.
    finished: Option<(u64, InputPosition)>,
    /// Worker 0 with an export directory: serving exports at checkpoint rounds.
    exports: Option<ClusterExports>,
    /// Run as this worker enters a round (see [`ClusterCheckpoints::with_before_round`]).
    before_round: Option<Box<dyn FnMut() -> Result<(), CoreError> + Send>>,
    /// While waiting for input, join a round the other workers wait in at a later step
    /// (see [`ClusterCheckpoints::joining_when_idle`]).
    join_when_idle: bool,
}

/// Worker 0's side of cluster exports: at a checkpoint round where an export is due, every
/// shard writes its rows as one part of the version (after its checkpoint part, with every
/// worker still in the barrier), and worker 0 publishes the manifest after the checkpoint's.
/// So an export never holds a step the newest checkpoint does not: a rollback never moves the
/// served model back behind a version already served, except to an older checkpoint, which
/// the new lineage announces.
pub struct ClusterExports {
    committer: Committer,
    every_steps: u64,
    every: Option<Duration>,
    last_step: Option<u64>,
    last_time: Instant,
    tally: ExportTally,
    /// `[export] gate`: holds back versions worse than the recent published ones.
    gate: Option<Gate>,
    /// Worker 0's progressive window metrics as of the round (see
    /// [`CheckpointHook::set_quality`]): recorded in the manifest and judged by the gate.
    quality: Option<ExportQuality>,
}

/// What the cluster exports of this run wrote.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExportTally {
    /// The export directory.
    pub dir: String,
    /// Versions published.
    pub count: u64,
    /// Full ones among them.
    pub full: u64,
    /// The last version published.
    pub last_version: Option<u64>,
    /// Versions the quality gate held back (not written; see `[export] gate`).
    pub held_back: u64,
    /// Versions abandoned (a shard could not write its part).
    pub abandoned: u64,
    /// Seconds spent publishing (worker 0's side).
    pub seconds: f64,
}

impl ClusterExports {
    /// Exports into `cfg.dir` (which must be set) as `cfg` says.
    pub fn open(cfg: &ExportConfig) -> Result<Self, CoreError> {
        let dir = cfg
            .dir
            .as_deref()
            .ok_or_else(|| CoreError::Config("no export directory".into()))?;
        let committer = Committer::open(dir, ExportOptions::from(cfg))
            .map_err(|e| CoreError::Config(format!("export directory {}: {e}", dir.display())))?;
        Ok(ClusterExports {
            committer,
            every_steps: cfg.every_steps,
            every: (cfg.every_secs > 0.0).then(|| Duration::from_secs_f64(cfg.every_secs)),
            last_step: None,
            last_time: Instant::now(),
            tally: ExportTally {
                dir: dir.display().to_string(),
                ..ExportTally::default()
            },
            gate: cfg.gate.as_ref().map(|g| Gate::new(GateRule::from(g))),
            quality: None,
        })
    }

    /// Whether the gate holds back the version due after `step` (judged on worker 0's
    /// progressive window: its own rows, which a job's workers draw from the same stream):
    /// logged and counted; nothing of it is written, so the next version published is a
    /// delta over the last published one, or full by the usual rules.
    fn held_back(&mut self, step: u64) -> bool {
        let last = self.tally.last_version;
        let quality = self.quality.as_ref();
        let held = self
            .gate
            .as_mut()
            .is_some_and(|g| g.holds_back(quality, "cluster export", step, last));
        if held {
            self.tally.held_back += 1;
            // Counted as an attempt: the next one comes on the usual schedule.
            self.last_step = Some(step);
            self.last_time = Instant::now();
        }
        held
    }

    /// Whether a round after `step` exports: at the end of the job; else by steps and/or
    /// time since the last export, or at every checkpoint when neither is set.
    fn due(&self, step: u64, last: bool) -> bool {
        if self.last_step == Some(step) {
            return false;
        }
        if last || (self.every_steps == 0 && self.every.is_none()) {
            return true;
        }
        let by_steps =
            self.every_steps > 0 && step >= self.last_step.unwrap_or(0) + self.every_steps;
        let by_time = self.every.is_some_and(|d| self.last_time.elapsed() >= d);
        by_steps || by_time
    }

    fn order(&self, plan: Plan) -> pb::ExportOrder {
        let o = self.committer.options();
        pb::ExportOrder {
            dir: self.committer.dir().display().to_string(),
            version: plan.version,
            base: plan.base.unwrap_or(0),
            fp16: o.fp16,
            min_count: o.min_count,
            sync: o.sync,
        }
    }

    /// Publishes `plan` from the shards' answers, or abandons it when a shard could not write
    /// its part (the next export is then full). Never fails the round: the checkpoint stands.
    fn publish(&mut self, plan: Plan, resps: &[pb::CheckpointResponse], job: &str, step: u64) {
        let start = Instant::now();
        match self.try_publish(plan, resps, job, step) {
            Ok(info) => {
                if let Some(g) = self.gate.as_mut() {
                    g.published(self.quality.as_ref());
                }
                self.tally.count += 1;
                self.tally.full += u64::from(info.kind == ExportKind::Full);
                self.tally.last_version = Some(info.version);
                self.last_step = Some(step);
                self.last_time = Instant::now();
            }
            Err(why) => {
                tracing::warn!(
                    "cluster export v{} at step {step} abandoned: {why}; the next export is full",
                    plan.version
                );
                self.committer.abandon(plan.version);
                self.tally.abandoned += 1;
            }
        }
        self.tally.seconds += start.elapsed().as_secs_f64();
    }

    fn try_publish(
        &mut self,
        plan: Plan,
        resps: &[pb::CheckpointResponse],
        job: &str,
        step: u64,
    ) -> Result<sparta_export::ExportInfo, ClusterError> {
        let mut files = Vec::new();
        let mut dense: Vec<f32> = Vec::new();
        for (i, r) in resps.iter().enumerate() {
            if !r.export_error.is_empty() {
                return Err(ClusterError::Round(format!(
                    "PS shard {i}: {}",
                    r.export_error
                )));
            }
            let f: Vec<sparta_export::TableFile> = serde_json::from_str(&r.export_json)
                .map_err(|e| ClusterError::Round(format!("PS shard {i}: export answer: {e}")))?;
            if f.is_empty() {
                return Err(ClusterError::Round(format!(
                    "PS shard {i} wrote no export part"
                )));
            }
            files.extend(f);
            let n = r.export_dense.len() / Compression::None.value_bytes();
            let slice = wire::values_to_vec(&r.export_dense, Compression::None, n)
                .map_err(|e| ClusterError::Round(format!("PS shard {i}: dense slice: {e}")))?;
            dense.extend(slice);
        }
        let kind = if plan.base.is_some() {
            ExportKind::Delta
        } else {
            ExportKind::Full
        };
        let parts = resps.len() as u32;
        let quality = self.quality.clone();
        self.committer
            .commit_with_quality(plan, kind, parts, files, &dense, job, step, quality)
            .map_err(|e| ClusterError::Round(e.to_string()))
    }
}

fn ckpt_err(e: CheckpointError) -> CoreError {
    if matches!(e, CheckpointError::GaveUp { .. }) {
        // Retried with backoff already: a rollback would only fail the same way.
        return CoreError::JobFailed(format!("cluster checkpoint: {e}"));
    }
    CoreError::Training(format!("cluster checkpoint: {e}"))
}

impl ClusterCheckpoints {
    /// Checkpoints every `train.checkpoint_every_steps` steps into `dir` (shared with the PS
    /// shards). `mode` names the dense consistency mode for the manifest.
    pub fn new(
        store: Arc<RemoteStore>,
        rank: usize,
        num_workers: usize,
        dir: &Path,
        train: &TrainConfig,
        job_text: String,
        mode: &str,
    ) -> Result<Self, CoreError> {
        let writer = if rank == 0 {
            let storage = open_dir(dir).map_err(ckpt_err)?;
            storage.check_writable().map_err(ckpt_err)?;
            let w = Checkpointer::new(
                storage,
                RetentionPolicy {
                    keep_full: train.checkpoint_keep_full,
                },
            )
            .with_retry(RetryPolicy::new(train.checkpoint_max_failures));
            // Manifests an earlier worker 0 was writing when it died (it is their only writer).
            w.remove_unfinished(&|name| name.ends_with(MANIFEST_FILE))
                .map_err(ckpt_err)?;
            Some(w)
        } else {
            None
        };
        let routing = sparta_core::SparseStore::routing(store.as_ref());
        let layout = ClusterState {
            num_shards: routing.num_shards() as u32,
            num_workers: num_workers as u32,
            shard_map: routing.shard_map().to_string(),
            slot_runs: routing.runs(),
            routing_epoch: store.routing_epoch(),
            dense_shards: store.dense_shards() as u32,
            mode: mode.to_string(),
            workers: Vec::new(),
            samples_trained: 0,
        };
        Ok(Self {
            store,
            rank,
            every_steps: train.checkpoint_every_steps,
            full_every: train.checkpoint_full_every.max(1),
            written: 0,
            force_full: false,
            writer,
            job_text,
            layout,
            finished: None,
            exports: None,
            before_round: None,
            join_when_idle: false,
        })
    }

    /// While this worker waits for input (an idle tick), it asks the shards for a pending
    /// round and joins it at the round's step (the trainer's steps count on from there). For
    /// Kafka: workers reading partitions of uneven traffic drift apart in steps, and a round
    /// waits for every worker at the same step, so a worker whose partitions are quiet would
    /// hold the others' checkpoints and exports (and their training) until it got records.
    pub fn joining_when_idle(mut self) -> Self {
        self.join_when_idle = true;
        self
    }

    /// Runs `f` as this worker enters every checkpoint round, before the barrier (dense mode
    /// allreduce: each worker writes its copy of the dense state to the shards, so the
    /// checkpoint holds it).
    pub fn with_before_round(
        mut self,
        f: Box<dyn FnMut() -> Result<(), CoreError> + Send>,
    ) -> Self {
        self.before_round = Some(f);
        self
    }

    /// Worker 0: also writes serving exports at checkpoint rounds (see [`ClusterExports`]).
    pub fn with_exports(mut self, exports: ClusterExports) -> Self {
        if self.writer.is_some() {
            self.exports = Some(exports);
        }
        self
    }

    /// What the cluster exports of this run wrote (worker 0 with an export directory).
    pub fn export_tally(&self) -> Option<ExportTally> {
        self.exports.as_ref().map(|e| e.tally.clone())
    }

    /// Continues the chain of the checkpoint the shards restored (its manifest).
    /// Records the job's logical tables (per physical table) in the manifests worker 0 commits.
    pub fn with_members(self, members: sparta_checkpoint::Members) -> Self {
        if let Some(w) = &self.writer {
            w.set_members(members);
        }
        self
    }

    pub fn resume(&mut self, m: &Manifest) {
        if let Some(w) = &self.writer {
            w.resume_manifest(m);
        }
        self.written = 1;
        // Restored on another layout (shard count or slot table): the shards re-cut the
        // parts, so the chain's increments do not apply to theirs; the next one is full.
        // The shards' own test (`sparta_ps::resume`): the saved routing differs from this
        // cluster's (an unreadable one counts as different; the shards refuse it anyway).
        if let Some(c) = &m.cluster {
            let l = &self.layout;
            let saved = sparta_core::Routing::from_manifest(
                &c.shard_map,
                c.num_shards as usize,
                &c.slot_runs,
            );
            if saved.ok() != Some(sparta_core::SparseStore::routing(self.store.as_ref())) {
                tracing::info!(
                    "checkpoint {} was written by {} PS shard(s), this cluster has {}: the next \
                     checkpoint is full",
                    m.id,
                    c.num_shards,
                    l.num_shards
                );
                self.force_full = true;
            }
        }
    }

    fn position(&self, step: u64, p: InputPosition, done: bool) -> pb::WorkerPosition {
        worker_position(&sparta_checkpoint::WorkerState {
            rank: self.rank as u32,
            step,
            position: p,
            done,
        })
    }

    /// Builds the manifest from the shards' answers and commits it (worker 0). A failed
    /// manifest write is retried with backoff (the parts stay); when it gives up, the whole
    /// checkpoint is removed and the job stops.
    fn commit(
        &self,
        order: Order,
        resps: &[pb::CheckpointResponse],
        step: u64,
        position: InputPosition,
    ) -> Result<String, CoreError> {
        let w = self.writer.as_ref().expect("worker 0 commits");
        let mut parsed = Vec::with_capacity(resps.len());
        for (i, r) in resps.iter().enumerate() {
            let bad = |what: &str, e: serde_json::Error| {
                CoreError::Training(format!("PS shard {i}: checkpoint answer: {what}: {e}"))
            };
            let parts: Vec<PartEntry> =
                serde_json::from_str(&r.parts_json).map_err(|e| bad("parts", e))?;
            let tables: Vec<TableEntry> =
                serde_json::from_str(&r.tables_json).map_err(|e| bad("tables", e))?;
            parsed.push((parts, tables));
        }
        let workers: Vec<_> = resps[0].workers.iter().map(worker_state).collect();
        // The slot table after the round (a slot move switches at a round; the store took the
        // newest table the shards answered).
        let routing = sparta_core::SparseStore::routing(self.store.as_ref());
        let cluster = ClusterState {
            samples_trained: workers.iter().map(|w| w.position.rows_consumed).sum(),
            workers,
            num_shards: routing.num_shards() as u32,
            slot_runs: routing.runs(),
            routing_epoch: self.store.routing_epoch(),
            dense_shards: self.store.dense_shards() as u32,
            ..self.layout.clone()
        };
        let samples = cluster.samples_trained;
        let attempt = || {
            let pending = w.begin_at(order.id, order.kind, order.base, order.prev)?;
            for (parts, tables) in &parsed {
                for p in parts {
                    let cfg = p
                        .table()
                        .and_then(|t| tables.iter().find(|e| e.name == t))
                        .map(|e| &e.config);
                    pending.add_part(p.clone(), cfg)?;
                }
            }
            pending.commit_with(
                step,
                position.clone(),
                &self.job_text,
                Some(cluster.clone()),
            )
        };
        let what = format!("committing checkpoint {}", order.id);
        let id = w.retry().run(&what, attempt, || {}).map_err(|e| {
            self.discard(order.id);
            ckpt_err(e)
        })?;
        tracing::info!(
            "cluster checkpoint {id} committed at step {step} ({samples} samples trained)"
        );
        Ok(id.to_string())
    }

    /// Worker 0: removes what a failed checkpoint left (every shard's part).
    fn discard(&self, id: sparta_checkpoint::CheckpointId) {
        if let Some(w) = &self.writer {
            match w.discard(id) {
                Ok(()) => tracing::warn!("removed the partial checkpoint {id}"),
                Err(e) => tracing::warn!("removing the partial checkpoint {id}: {e}"),
            }
        }
    }
}

impl ClusterCheckpoints {
    /// One checkpoint: worker 0 picks the id and kind and commits the manifest once every
    /// shard has written its part; other workers only take part in the barrier. `last`: the
    /// end-of-job checkpoint (every worker has left; worker 0 only).
    fn round(
        &mut self,
        step: u64,
        position: InputPosition,
        last: bool,
    ) -> Result<Option<String>, CoreError> {
        if let Some(f) = self.before_round.as_mut() {
            f()?;
        }
        let pending = match &self.writer {
            None => None,
            Some(w) => {
                let full = self.force_full || self.written.is_multiple_of(self.full_every);
                let kind = if full {
                    CheckpointKind::Full
                } else {
                    CheckpointKind::Incremental
                };
                Some(
                    match w.begin(kind) {
                        Err(CheckpointError::NeedFull { .. }) => w.begin(CheckpointKind::Full),
                        other => other,
                    }
                    .map_err(ckpt_err)?,
                )
            }
        };
        let export_plan = match (&pending, self.exports.as_mut()) {
            (Some(_), Some(e)) if e.due(step, last) => {
                (!e.held_back(step)).then(|| e.committer.claim())
            }
            _ => None,
        };
        let order = pending.as_ref().map(|p| {
            let mut o = Order {
                id: p.id(),
                kind: p.kind(),
                base: p.base(),
                prev: p.prev(),
            }
            .to_proto();
            if let (Some(plan), Some(e)) = (export_plan, &self.exports) {
                o.export = Some(e.order(plan));
            }
            o
        });
        let abandon = |exports: &mut Option<ClusterExports>| {
            if let (Some(plan), Some(e)) = (export_plan, exports.as_mut()) {
                e.committer.abandon(plan.version);
            }
        };
        let shards_before = sparta_core::SparseStore::num_shards(self.store.as_ref());
        let resps = self.store.checkpoint(pb::CheckpointRequest {
            position: Some(self.position(step, position.clone(), last)),
            leaving: false,
            order,
            last,
            probe: false,
        })?;
        // A shard added at this round has no part that increments could build on: the next
        // checkpoint is full.
        let shards_changed =
            sparta_core::SparseStore::num_shards(self.store.as_ref()) != shards_before;
        self.force_full |= shards_changed;
        if let Some((i, r)) = resps.iter().enumerate().find(|(_, r)| r.failed) {
            // A shard gave up writing its part: the job stops (every worker sees this).
            if let Some(p) = &pending {
                self.discard(p.id());
            }
            abandon(&mut self.exports);
            return Err(CoreError::JobFailed(format!(
                "cluster checkpoint at step {step} failed on PS shard {i}: {}; the job stops",
                r.reason
            )));
        }
        let Some(pending) = pending else {
            return Ok(None);
        };
        if let Some((i, r)) = resps.iter().enumerate().find(|(_, r)| !r.written) {
            tracing::warn!(
                "checkpoint {} at step {step} not written: PS shard {i}: {}; the next one will be full",
                pending.id(),
                r.reason
            );
            self.force_full = true;
            abandon(&mut self.exports);
            return Ok(None);
        }
        let order = Order {
            id: pending.id(),
            kind: pending.kind(),
            base: pending.base(),
            prev: pending.prev(),
        };
        drop(pending);
        let id = match self.commit(order, &resps, step, position) {
            Ok(id) => id,
            Err(e) => {
                abandon(&mut self.exports);
                return Err(e);
            }
        };
        self.written += 1;
        self.force_full = shards_changed;
        if let (Some(plan), Some(e)) = (export_plan, self.exports.as_mut()) {
            // After the checkpoint's commit: an export never runs ahead of the checkpoints.
            e.publish(plan, &resps, &self.job_text, step);
        }
        Ok(Some(id))
    }

    /// Worker 0, once every worker has finished (see `RemoteStore::wait_all_done`): the
    /// end-of-job checkpoint of the whole cluster, at worker 0's final step and position.
    /// Returns its id, or `None` when a shard could not write its part (logged).
    pub fn write_last(&mut self) -> Result<Option<String>, CoreError> {
        if self.writer.is_none() {
            return Err(CoreError::Training(
                "only worker 0 writes the end-of-job checkpoint".into(),
            ));
        }
        let (step, position) = self.finished.clone().ok_or_else(|| {
            CoreError::Training(
                "the end-of-job checkpoint is written after this worker finished training".into(),
            )
        })?;
        self.round(step, position, true)
    }
}

impl CheckpointHook for ClusterCheckpoints {
    fn every_steps(&self) -> u64 {
        self.every_steps
    }

    fn write(
        &mut self,
        step: u64,
        position: InputPosition,
        _model: &Model,
    ) -> Result<Option<String>, CoreError> {
        self.round(step, position, false)
    }

    fn at_end(&self) -> bool {
        false
    }

    fn finish(&mut self, step: u64, position: InputPosition) -> Result<(), CoreError> {
        self.finished = Some((step, position.clone()));
        self.store
            .checkpoint(pb::CheckpointRequest {
                position: Some(self.position(step, position, true)),
                leaving: true,
                order: None,
                last: false,
                probe: false,
            })
            .map(drop)
    }

    fn pending_round(&mut self, step: u64) -> Result<Option<u64>, CoreError> {
        if !self.join_when_idle || self.every_steps == 0 {
            return Ok(None);
        }
        Ok(self.store.pending_round()?.filter(|&s| s > step))
    }

    fn wants_quality(&self) -> bool {
        self.exports.is_some()
    }

    fn set_quality(&mut self, progressive: &sparta_nn::metrics::Progressive) {
        if let Some(e) = self.exports.as_mut() {
            e.quality = Some(ExportQuality::from_progressive(progressive));
        }
    }

    fn last_export_version(&self) -> Option<u64> {
        self.exports.as_ref().and_then(|e| e.tally.last_version)
    }
}

/// A [`ClusterCheckpoints`] shared by the trainer (periodic checkpoints) and the worker's
/// end-of-job code ([`ClusterCheckpoints::write_last`]).
#[derive(Clone)]
pub struct SharedCheckpoints(pub Arc<parking_lot::Mutex<ClusterCheckpoints>>);

impl SharedCheckpoints {
    /// Shares `c`.
    pub fn new(c: ClusterCheckpoints) -> Self {
        Self(Arc::new(parking_lot::Mutex::new(c)))
    }
}

impl CheckpointHook for SharedCheckpoints {
    fn every_steps(&self) -> u64 {
        self.0.lock().every_steps()
    }

    fn write(
        &mut self,
        step: u64,
        position: InputPosition,
        model: &Model,
    ) -> Result<Option<String>, CoreError> {
        self.0.lock().write(step, position, model)
    }

    fn at_end(&self) -> bool {
        self.0.lock().at_end()
    }

    fn finish(&mut self, step: u64, position: InputPosition) -> Result<(), CoreError> {
        self.0.lock().finish(step, position)
    }

    fn pending_round(&mut self, step: u64) -> Result<Option<u64>, CoreError> {
        self.0.lock().pending_round(step)
    }

    fn wants_quality(&self) -> bool {
        self.0.lock().wants_quality()
    }

    fn set_quality(&mut self, progressive: &sparta_nn::metrics::Progressive) {
        self.0.lock().set_quality(progressive)
    }

    fn last_export_version(&self) -> Option<u64> {
        self.0.lock().last_export_version()
    }
}
