//! The worker's side of cluster checkpoints ([`ClusterCheckpoints`]): every `K` steps each
//! worker enters the checkpoint barrier of every shard (see [`crate::ckpt`]); worker 0, the
//! coordinator, picks the checkpoint id and kind, and once every shard has written its part it
//! writes the manifest with every worker's position: the commit point.

use std::path::Path;
use std::sync::Arc;

use sparta_checkpoint::{
    open_dir, CheckpointError, CheckpointKind, Checkpointer, ClusterState, InputPosition, Manifest,
    PartEntry, RetentionPolicy, RetryPolicy, TableEntry, MANIFEST_FILE,
};
use sparta_core::config::TrainConfig;
use sparta_core::{CheckpointHook, CoreError};
use sparta_nn::Model;

use crate::ckpt::{worker_position, worker_state, Order, SHARD_MAP};
use crate::client::RemoteStore;
use crate::proto as pb;

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
        let layout = ClusterState {
            num_shards: sparta_core::SparseStore::num_shards(store.as_ref()) as u32,
            num_workers: num_workers as u32,
            shard_map: SHARD_MAP.to_string(),
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
        })
    }

    /// Continues the chain of the checkpoint the shards restored (its manifest).
    pub fn resume(&mut self, m: &Manifest) {
        if let Some(w) = &self.writer {
            w.resume_manifest(m);
        }
        self.written = 1;
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
        let cluster = ClusterState {
            samples_trained: workers.iter().map(|w| w.position.rows_consumed).sum(),
            workers,
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
        let order = pending.as_ref().map(|p| {
            Order {
                id: p.id(),
                kind: p.kind(),
                base: p.base(),
                prev: p.prev(),
            }
            .to_proto()
        });
        let resps = self.store.checkpoint(pb::CheckpointRequest {
            position: Some(self.position(step, position.clone(), last)),
            leaving: false,
            order,
            last,
        })?;
        if let Some((i, r)) = resps.iter().enumerate().find(|(_, r)| r.failed) {
            // A shard gave up writing its part: the job stops (every worker sees this).
            if let Some(p) = &pending {
                self.discard(p.id());
            }
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
            return Ok(None);
        }
        let order = Order {
            id: pending.id(),
            kind: pending.kind(),
            base: pending.base(),
            prev: pending.prev(),
        };
        drop(pending);
        let id = self.commit(order, &resps, step, position)?;
        self.written += 1;
        self.force_full = false;
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
            })
            .map(drop)
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
}
