//! A cluster worker's checkpoint setup: continue from the checkpoint the PS shards restored
//! (this rank's step and input position from its manifest) and join the checkpoint and
//! export rounds ([`crate::rounds`]).

use std::sync::Arc;

use sparta_checkpoint::{open_dir, CheckpointId, Manifest};
use sparta_core::Job;
use sparta_worker::Trainer;

use crate::error::ClusterError;
use crate::ring::RingDense;
use crate::rounds::{ClusterCheckpoints, ClusterExports, SharedCheckpoints};
use crate::store::RemoteStore;

/// Resumes `trainer` where the shards' checkpoint left this worker, and installs the cluster
/// checkpoint hook when the job has a checkpoint directory. Returns the hook to worker 0 (for
/// the end-of-job checkpoint).
pub fn setup(
    trainer: &mut Trainer,
    store: &Arc<RemoteStore>,
    job: &Job,
    ring: &Option<Arc<RingDense>>,
) -> Result<Option<SharedCheckpoints>, ClusterError> {
    let (rank, num_workers) = (store.rank(), store.num_workers());
    let dir = job.raw.train.checkpoint_dir.clone();
    let manifest = resumed_manifest(store, job)?;
    if let Some(m) = &manifest {
        let c = m
            .cluster
            .as_ref()
            .ok_or_else(|| ClusterError::Setup(format!("{} has no cluster section", m.id)))?;
        let Some(w) = c.workers.iter().find(|w| w.rank as usize == rank) else {
            return Err(ClusterError::Setup(format!(
                "{} holds no position for worker {rank}",
                m.id
            )));
        };
        trainer.set_resume_point(w.step, w.position.clone(), m.id.to_string());
        store.set_step(w.step);
        tracing::info!(
            "worker {rank}: resuming from {} at step {} ({} rows already trained)",
            m.id,
            w.step,
            w.position.rows_consumed
        );
    }
    let Some(d) = &dir else {
        return Ok(None);
    };
    let text = toml::to_string(&job.raw).unwrap_or_default();
    let mode = store.mode()?;
    let mut hook = ClusterCheckpoints::new(
        Arc::clone(store),
        rank,
        num_workers,
        d,
        &job.raw.train,
        text,
        &mode,
    )?
    .with_members(job.features.members());
    if let Some(m) = &manifest {
        hook.resume(m);
    }
    if let Some(r) = ring {
        // Dense mode allreduce: the shards hold the dense state only as the workers
        // write it; every worker entering a round writes its (identical) copy.
        let (r, store) = (Arc::clone(r), Arc::clone(store));
        hook = hook.with_before_round(Box::new(move || {
            let (params, opt) = r.state();
            store.set_dense_state(&params, &opt)
        }));
    }
    if rank == 0 && job.raw.export.dir.is_some() {
        hook = hook.with_exports(ClusterExports::open(&job.raw.export)?);
    }
    let hook = SharedCheckpoints::new(hook);
    trainer.set_checkpoint_hook(Box::new(hook.clone()));
    Ok((rank == 0).then_some(hook))
}

/// The manifest of the checkpoint the shards resumed from, if they did.
fn resumed_manifest(store: &RemoteStore, job: &Job) -> Result<Option<Manifest>, ClusterError> {
    let Some((id, _)) = store.resumed_from()? else {
        return Ok(None);
    };
    let Some(d) = &job.raw.train.checkpoint_dir else {
        return Err(ClusterError::Setup(format!(
            "the PS shards resumed from checkpoint {}, but this worker has no checkpoint \
             directory to read its input position from: give it the cluster's job config \
             ([train] checkpoint_dir / --checkpoint-dir)",
            CheckpointId(id)
        )));
    };
    let storage = open_dir(d)?;
    let m = Manifest::read(storage.as_ref(), CheckpointId(id)).map_err(|e| {
        ClusterError::Setup(format!(
            "reading the manifest the PS shards resumed from in {}: {e}",
            d.display()
        ))
    })?;
    let what = format!("checkpoint {} in {}", m.id, d.display());
    sparta_core::config::check_resume(job, &m, &what)?;
    Ok(Some(m))
}
