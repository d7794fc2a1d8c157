//! Restoring one shard from a cluster checkpoint: only its own part (`ps-<shard>`) is read,
//! after the checkpoint's layout has been checked against this shard's flags.

use std::path::Path;

use sparta_checkpoint::{
    missing_local_dir, newest_valid, nothing_to_resume, open_dir, restore_at, CheckpointId,
    Manifest, Restored, RestoredDense, WorkerState,
};
use sparta_core::Job;
use sparta_table::Table;

use sparta_proto::ckpt::{part_name, SHARD_MAP};

use crate::ckpt::Resume;
use crate::error::PsError;

/// A shard's state read back from a checkpoint.
pub struct RestoredShard {
    /// The checkpoint restored.
    pub id: CheckpointId,
    /// Its step (the coordinator's).
    pub step: u64,
    /// The shard's part of every table of the job, in `TableId` order.
    pub tables: Vec<Table>,
    /// The dense slice and its optimizer state.
    pub dense: Option<RestoredDense>,
    /// Every worker's position in the checkpoint.
    pub workers: Vec<WorkerState>,
    /// The full restore result (for continuing the incremental chain).
    pub restored: Restored,
}

fn err(m: String) -> PsError {
    PsError::Checkpoint(m)
}

/// Picks the checkpoint (`Resume::Newest`: the newest whose every file verifies, skipping and
/// logging invalid ones) and restores shard `shard` of `num_shards` from it. `Ok(None)` when
/// `dir` holds no checkpoint and the policy allows an empty start.
pub fn restore_shard(
    job: &Job,
    dir: &Path,
    resume: Resume,
    shard: usize,
    num_shards: usize,
    workers: usize,
) -> Result<Option<RestoredShard>, PsError> {
    if let Resume::Newest(policy) = resume {
        // Opening creates a missing directory: decide before.
        if missing_local_dir(&dir.to_string_lossy(), policy).map_err(|e| err(e.to_string()))? {
            return Ok(None);
        }
    }
    let storage = open_dir(dir).map_err(|e| err(format!("opening {}: {e}", dir.display())))?;
    let id = match resume {
        Resume::At(n) => CheckpointId(n),
        Resume::Newest(policy) => {
            match newest_valid(storage.as_ref()).map_err(|e| err(e.to_string()))? {
                Some(id) => id,
                None => {
                    nothing_to_resume(storage.as_ref(), policy).map_err(|e| err(e.to_string()))?;
                    tracing::warn!(
                        "no checkpoint in {}: PS shard {shard} starts empty",
                        dir.display()
                    );
                    return Ok(None);
                }
            }
        }
    };
    let m = Manifest::read(storage.as_ref(), id).map_err(|e| err(e.to_string()))?;
    let c = m.cluster.as_ref().ok_or_else(|| {
        err(format!(
            "{id} in {} was written by an embedded job (no cluster section); a PS resumes only \
             checkpoints of a PS cluster (use `sparta train --resume` for it)",
            dir.display()
        ))
    })?;
    if c.num_shards as usize != num_shards {
        return Err(err(format!(
            "{id} in {} was written by {} PS shard(s), this cluster has {num_shards}: keys are \
             routed by `{}`, so a part cannot be loaded by another shard count (restart with \
             --num-shards {})",
            dir.display(),
            c.num_shards,
            c.shard_map,
            c.num_shards
        )));
    }
    if c.shard_map != SHARD_MAP {
        return Err(err(format!(
            "{id} routes keys by `{}`, this build by `{SHARD_MAP}`",
            c.shard_map
        )));
    }
    // A Kafka job's offsets are merged and shared out again among any number of workers
    // (`sparta_cluster::resume`); a file position belongs to its rank's part.
    let reads_kafka = c.workers.iter().any(|w| !w.position.topic.is_empty());
    if c.num_workers as usize != workers && !reads_kafka {
        return Err(err(format!(
            "{id} was written by {} worker(s), this cluster has {workers}: each worker's input \
             position is saved by rank (restart with --workers {})",
            c.num_workers, c.num_workers
        )));
    }
    let part = part_name(shard);
    if !m.parts.iter().any(|p| p.part == part) {
        return Err(err(format!("{id} has no part {part}")));
    }
    let mut r = restore_at(storage.as_ref(), id, &|p| p.part == part, |_, cfg| {
        Table::new(cfg.clone())
    })
    .map_err(|e| err(format!("restoring {part} of {id}: {e}")))?;
    let tables = sparta_core::checkpoint::job_tables(
        &job.features,
        &mut r,
        &format!("{id} in {}", dir.display()),
    )
    .map_err(|e| err(e.to_string()))?;
    let dense = r
        .dense_parts
        .iter()
        .find(|(p, _)| *p == part)
        .map(|(_, d)| d.clone());
    tracing::info!(
        "PS shard {shard}: restored {id} (step {}): {}",
        r.step,
        tables
            .iter()
            .map(|t| format!("{} rows in {}", t.len(), t.config().name))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(Some(RestoredShard {
        id,
        step: r.step,
        tables,
        dense,
        workers: c.workers.clone(),
        restored: r,
    }))
}
