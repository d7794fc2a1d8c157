//! Restoring one shard from a cluster checkpoint: only its own part (`ps-<shard>`) is read,
//! after the checkpoint's layout has been checked against this shard's flags.

use std::path::Path;

use sparta_checkpoint::{
    missing_local_dir, newest_valid, nothing_to_resume, open_dir, restore_at, restore_merged_at,
    CheckpointId, Manifest, Restored, RestoredDense, WorkerState,
};
use sparta_core::{Job, Routing};
use sparta_nn::optim::OptimizerState;
use sparta_table::Table;

use sparta_proto::ckpt::part_name;

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
    /// Written by another layout (shard count or slot table) and re-cut for this shard: the
    /// chain does not continue (the next checkpoint is full).
    pub resharded: bool,
    /// The slot table this shard routes by from now on, and its epoch: the checkpoint's when
    /// the shard count is the same (slot moves kept), else the even table of this count at
    /// the next epoch.
    pub routing: Routing,
    /// Its epoch.
    pub routing_epoch: u64,
}

fn err(m: String) -> PsError {
    PsError::Checkpoint(m)
}

/// Picks the checkpoint (`Resume::Newest`: the newest whose every file verifies, skipping and
/// logging invalid ones) and restores shard `shard` of `num_shards` from it, the first
/// `dense_shards` of them holding the dense vector. `Ok(None)` when `dir` holds no checkpoint
/// and the policy allows an empty start.
pub fn restore_shard(
    job: &Job,
    dir: &Path,
    resume: Resume,
    shard: usize,
    (num_shards, dense_shards): (usize, usize),
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
    let saved = Routing::from_manifest(&c.shard_map, c.num_shards as usize, &c.slot_runs)
        .map_err(|e| err(format!("{id} in {}: {e}", dir.display())))?;
    // The same count keeps the checkpoint's slot table (slot moves stay where they went);
    // another count re-cuts onto the even table of this count, at the next epoch.
    let keep_table =
        c.num_shards as usize == num_shards && c.shard_map == sparta_core::routing::SHARD_MAP;
    let (routing, routing_epoch) = if keep_table {
        (saved.clone(), c.routing_epoch)
    } else {
        (Routing::even(num_shards), c.routing_epoch + 1)
    };
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
    let make = |_: &str, cfg: &sparta_table::TableConfig| Table::new(cfg.clone());
    let resharded = saved != routing;
    // Dense slices written by another count of dense shards (shards were added while the
    // job trained, or this cluster is cut otherwise) are re-cut too.
    // A shard without a part of its own (added at the round of this checkpoint) reads what
    // it owns from the others' parts too.
    let recut = resharded
        || c.dense_shard_count() != dense_shards
        || !m.parts.iter().any(|p| p.part == part);
    let mut r = if !recut {
        restore_at(storage.as_ref(), id, &|p| p.part == part, make)
            .map_err(|e| err(format!("restoring {part} of {id}: {e}")))?
    } else {
        // Written by another layout: read the keys this shard now owns from the old parts
        // that held any of them, and every old dense slice (re-cut below).
        let mut sources: Vec<String> = saved
            .sources(&routing, shard)
            .into_iter()
            .map(part_name)
            .collect();
        if let Some(p) = sources
            .iter()
            .find(|p| !m.parts.iter().any(|e| e.part == **p))
        {
            return Err(err(format!("{id} has no part {p}")));
        }
        if sources.is_empty() {
            // A shard that owns no slot (added, no slot moved onto it yet) still makes the
            // job's tables: from one part's table configs, none of its rows kept.
            sources.push(part_name(0));
        }
        tracing::info!(
            "PS shard {shard} of {num_shards}: {id} was written by {} shard(s); reading the \
             keys this shard owns from {}",
            c.num_shards,
            sources.join(", ")
        );
        let keep =
            |p: &sparta_checkpoint::PartEntry| p.table().is_none() || sources.contains(&p.part);
        let mine = |k: u64| routing.shard_of(k) == shard;
        let mut r = restore_merged_at(storage.as_ref(), id, &keep, &mine, &part, make)
            .map_err(|e| err(format!("re-cutting {id} for {part}: {e}")))?;
        let total = sparta_nn::Model::new(job.model.clone())
            .map_err(|e| err(e.to_string()))?
            .num_params();
        let dense = if shard < dense_shards {
            recut_dense(&r.dense_parts, total, shard, dense_shards)
                .map_err(|e| err(format!("{id}: {e}")))?
        } else {
            None
        };
        r.dense_parts = dense.map(|d| (part.clone(), d)).into_iter().collect();
        r
    };
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
        resharded,
        routing,
        routing_epoch,
    }))
}

/// This shard's slice of the dense vector (`total` values) and its optimizer state, cut
/// from the slices of a checkpoint written by another shard count (`parts`: `ps-<k>` of
/// every old shard). `None` when the checkpoint has no dense state.
fn recut_dense(
    parts: &[(String, RestoredDense)],
    total: usize,
    shard: usize,
    num_shards: usize,
) -> Result<Option<RestoredDense>, String> {
    if parts.is_empty() {
        return Ok(None);
    }
    let mut ordered: Vec<(usize, &RestoredDense)> = Vec::with_capacity(parts.len());
    for (name, d) in parts {
        let k = name
            .strip_prefix("ps-")
            .and_then(|k| k.parse::<usize>().ok())
            .ok_or_else(|| format!("dense part `{name}` is not a PS shard's"))?;
        ordered.push((k, d));
    }
    ordered.sort_by_key(|(k, _)| *k);
    if ordered.iter().enumerate().any(|(i, (k, _))| i != *k) {
        return Err(format!(
            "dense parts {:?} are not one per shard",
            ordered.iter().map(|(k, _)| k).collect::<Vec<_>>()
        ));
    }
    let cat = |f: &dyn Fn(&RestoredDense) -> &[f32]| -> Vec<f32> {
        ordered
            .iter()
            .flat_map(|(_, d)| f(d).iter().copied())
            .collect()
    };
    let params = cat(&|d| &d.params);
    if params.len() != total {
        return Err(format!(
            "the dense slices hold {} values, the model has {total}",
            params.len()
        ));
    }
    let (slot1, slot2) = (cat(&|d| &d.optimizer.slot1), cat(&|d| &d.optimizer.slot2));
    let (lo, len) = sparta_proto::dense_slice(total, shard, num_shards);
    let cut = |v: &[f32]| -> Result<Vec<f32>, String> {
        match v.len() {
            0 => Ok(Vec::new()),
            n if n == total => Ok(v[lo..lo + len].to_vec()),
            n => Err(format!(
                "dense optimizer state of {n} values for {total} parameters"
            )),
        }
    };
    Ok(Some(RestoredDense {
        params: params[lo..lo + len].to_vec(),
        optimizer: OptimizerState {
            step: ordered[0].1.optimizer.step,
            slot1: cut(&slot1)?,
            slot2: cut(&slot2)?,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slices(total: usize, n: usize) -> Vec<(String, RestoredDense)> {
        (0..n)
            .map(|k| {
                let (lo, len) = sparta_proto::dense_slice(total, k, n);
                let v: Vec<f32> = (lo..lo + len).map(|i| i as f32).collect();
                let d = RestoredDense {
                    params: v.clone(),
                    optimizer: OptimizerState {
                        step: 9,
                        slot1: v.iter().map(|x| x + 0.5).collect(),
                        slot2: Vec::new(),
                    },
                };
                (part_name(k), d)
            })
            .collect()
    }

    /// Slices written by 2 shards, re-cut for 3 and for 1, are the slices 3 and 1 shards
    /// hold, parameters and optimizer state, whatever order the parts come in.
    #[test]
    fn dense_slices_of_two_shards_recut_for_three_and_for_one() {
        let total = 1001;
        let mut two = slices(total, 2);
        two.reverse();
        for n in [1, 3] {
            let want = slices(total, n);
            for (k, (_, w)) in want.iter().enumerate() {
                let got = recut_dense(&two, total, k, n).unwrap().unwrap();
                assert_eq!(got.params, w.params, "{n} shards, shard {k}");
                assert_eq!(got.optimizer, w.optimizer, "{n} shards, shard {k}");
            }
        }
        assert!(recut_dense(&two, total + 1, 0, 3).is_err());
        assert!(recut_dense(&two[..1], total, 0, 3).is_err());
        assert!(recut_dense(&[], total, 0, 3).unwrap().is_none());
    }
}
