//! A cluster worker's checkpoint setup: continue from the checkpoint the PS shards restored
//! (this rank's step and input position from its manifest) and join coordinated checkpoints.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use sparta_checkpoint::{open_dir, CheckpointId, Manifest};
use sparta_core::Job;
use sparta_ps::coord::{ClusterCheckpoints, ClusterExports, SharedCheckpoints};
use sparta_ps::RemoteStore;
use sparta_worker::{RingDense, Trainer};

/// Resumes `trainer` where the shards' checkpoint left rank `rank`, and installs the cluster
/// checkpoint hook when the job has a checkpoint directory. Returns the hook to worker 0 (for
/// the end-of-job checkpoint).
pub fn setup(
    trainer: &mut Trainer,
    store: &Arc<RemoteStore>,
    job: &Job,
    rank: usize,
    num_workers: usize,
    ring: &Option<Arc<RingDense>>,
) -> Result<Option<SharedCheckpoints>> {
    let dir = job.raw.train.checkpoint_dir.clone();
    let manifest = match (store.resumed_from()?, &dir) {
        (None, _) => None,
        (Some((id, _)), None) => bail!(
            "the PS shards resumed from checkpoint {}, but this worker has no checkpoint \
             directory to read its input position from: give it the cluster's job config \
             ([train] checkpoint_dir / --checkpoint-dir)",
            CheckpointId(id)
        ),
        (Some((id, _)), Some(d)) => {
            let storage = open_dir(d)?;
            let m = Manifest::read(storage.as_ref(), CheckpointId(id)).with_context(|| {
                format!(
                    "reading the manifest the PS shards resumed from in {}",
                    d.display()
                )
            })?;
            Some(m)
        }
    };
    if let Some(m) = &manifest {
        let c = m
            .cluster
            .as_ref()
            .with_context(|| format!("{} has no cluster section", m.id))?;
        let Some(w) = c.workers.iter().find(|w| w.rank as usize == rank) else {
            bail!("{} holds no position for worker {rank}", m.id);
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
    if let Some(d) = &dir {
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
        return Ok((rank == 0).then_some(hook));
    }
    Ok(None)
}
