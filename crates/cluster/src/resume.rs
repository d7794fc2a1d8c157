//! A cluster worker's checkpoint setup: continue from the checkpoint the PS shards restored
//! (this rank's step and input position from its manifest) and join the checkpoint and
//! export rounds ([`crate::rounds`]).
//!
//! A job reading files continues each rank at its own saved position (the checkpoint must
//! have been written by as many workers). A job reading a Kafka topic may resume with
//! another worker count: the saved offsets of all workers are merged (each partition `p`
//! was read by worker `p % M` of the M that wrote the checkpoint, whose offset is taken) and
//! each worker takes the offsets of its partitions under the new count ([`kafka_share`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use sparta_checkpoint::{open_dir, CheckpointId, ClusterState, InputPosition, Manifest};
use sparta_core::Job;
use sparta_worker::Trainer;

use crate::error::ClusterError;
use crate::ring::RingDense;
use crate::rounds::{ClusterCheckpoints, ClusterExports, SharedCheckpoints};
use crate::store::RemoteStore;

/// Resumes `trainer` where the shards' checkpoint left this worker, and installs the cluster
/// checkpoint hook when the job has a checkpoint directory. Returns the hook to worker 0 (for
/// the end-of-job checkpoint).
///
/// `kafka`: this worker reads a Kafka topic, so while it waits for records it joins a round
/// the other workers wait in ([`ClusterCheckpoints::joining_when_idle`]).
pub fn setup(
    trainer: &mut Trainer,
    store: &Arc<RemoteStore>,
    job: &Job,
    ring: &Option<Arc<RingDense>>,
    kafka: bool,
) -> Result<Option<SharedCheckpoints>, ClusterError> {
    let (rank, num_workers) = (store.rank(), store.num_workers());
    let dir = job.raw.train.checkpoint_dir.clone();
    let manifest = resumed_manifest(store, job)?;
    if let Some(m) = &manifest {
        let c = m
            .cluster
            .as_ref()
            .ok_or_else(|| ClusterError::Setup(format!("{} has no cluster section", m.id)))?;
        let (step, position) = if reads_kafka(c) {
            kafka_share(c, rank, num_workers)?
        } else {
            let Some(w) = c.workers.iter().find(|w| w.rank as usize == rank) else {
                return Err(ClusterError::Setup(format!(
                    "{} holds no position for worker {rank}",
                    m.id
                )));
            };
            (w.step, w.position.clone())
        };
        tracing::info!(
            "worker {rank}: resuming from {} at step {step} ({} rows already trained{})",
            m.id,
            position.rows_consumed,
            if position.topic.is_empty() {
                String::new()
            } else {
                format!("; topic {} at {:?}", position.topic, position.kafka)
            }
        );
        trainer.set_resume_point(step, position, m.id.to_string());
        store.set_step(step);
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
    if kafka {
        hook = hook.joining_when_idle();
    }
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

/// Whether the workers of a cluster checkpoint read a Kafka topic.
fn reads_kafka(c: &ClusterState) -> bool {
    c.workers.iter().any(|w| !w.position.topic.is_empty())
}

/// Which of `workers` workers reads partition `p` (its rank).
fn owner(p: i32, workers: usize) -> usize {
    usize::try_from(p).unwrap_or(0) % workers.max(1)
}

/// Where worker `rank` of `workers` continues a topic from the cluster checkpoint `c`: the
/// saved offsets of every worker merged (partition `p` taken from worker `p % M` of the `M`
/// that wrote it), those of this worker's partitions (`p % workers == rank`) kept. Every
/// worker starts at the highest step saved, so all count their checkpoint rounds alike (a
/// worker that had finished draining stopped at an earlier step). The rows consumed are the
/// worker's own with the same worker count, else all on worker 0 (the job's total stays
/// right).
pub fn kafka_share(
    c: &ClusterState,
    rank: usize,
    workers: usize,
) -> Result<(u64, InputPosition), ClusterError> {
    let old = c.num_workers.max(1) as usize;
    let mut topic = String::new();
    for w in c.workers.iter().filter(|w| !w.position.topic.is_empty()) {
        if topic.is_empty() {
            topic.clone_from(&w.position.topic);
        } else if w.position.topic != topic {
            return Err(ClusterError::Setup(format!(
                "the checkpoint's workers read different topics ({topic} and {}): it cannot \
                 be continued on one",
                w.position.topic
            )));
        }
    }
    let mut merged = BTreeMap::new();
    for w in &c.workers {
        for &(p, o) in &w.position.kafka {
            if owner(p, old) == w.rank as usize {
                merged.insert(p, o);
            } else {
                tracing::warn!(
                    "the checkpoint lists partition {p} at offset {o} for worker {}, which did \
                     not read it (partition {p} is worker {}'s of {old}): ignored",
                    w.rank,
                    owner(p, old)
                );
            }
        }
    }
    let rows = if workers == old {
        c.workers
            .iter()
            .find(|w| w.rank as usize == rank)
            .map_or(0, |w| w.position.rows_consumed)
    } else if rank == 0 {
        c.workers.iter().map(|w| w.position.rows_consumed).sum()
    } else {
        0
    };
    let position = InputPosition {
        rows_consumed: rows,
        topic,
        kafka: merged
            .into_iter()
            .filter(|&(p, _)| owner(p, workers) == rank)
            .collect(),
        ..InputPosition::default()
    };
    let step = c.workers.iter().map(|w| w.step).max().unwrap_or(0);
    Ok((step, position))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparta_checkpoint::WorkerState;

    /// A worker's step, rows consumed and partition offsets.
    type Saved<'a> = (u64, u64, &'a [(i32, i64)]);

    /// A checkpoint of `workers.len()` workers reading `clicks`.
    fn checkpoint(workers: &[Saved<'_>]) -> ClusterState {
        ClusterState {
            num_workers: workers.len() as u32,
            workers: workers
                .iter()
                .enumerate()
                .map(|(r, &(step, rows, kafka))| WorkerState {
                    rank: r as u32,
                    step,
                    position: InputPosition {
                        rows_consumed: rows,
                        topic: "clicks".into(),
                        kafka: kafka.to_vec(),
                        ..InputPosition::default()
                    },
                    done: false,
                })
                .collect(),
            ..ClusterState::default()
        }
    }

    #[test]
    fn the_same_worker_count_continues_each_worker_at_its_own_offsets() {
        let c = checkpoint(&[
            (40, 700, &[(0, 10), (2, 30)]),
            (40, 500, &[(1, 20), (3, 40)]),
        ]);
        let (step, p) = kafka_share(&c, 1, 2).unwrap();
        assert_eq!((step, p.rows_consumed), (40, 500));
        assert_eq!(p.kafka, [(1, 20), (3, 40)]);
        assert_eq!(p.topic, "clicks");
    }

    #[test]
    fn fewer_workers_take_every_old_workers_partitions_and_the_rows_in_total() {
        let c = checkpoint(&[
            (40, 700, &[(0, 10), (2, 30)]),
            (33, 500, &[(1, 20), (3, 40)]),
        ]);
        let (step, p) = kafka_share(&c, 0, 1).unwrap();
        // The highest step: a worker that finished draining earlier stopped at 33.
        assert_eq!((step, p.rows_consumed), (40, 1200));
        assert_eq!(p.kafka, [(0, 10), (1, 20), (2, 30), (3, 40)]);
    }

    #[test]
    fn more_workers_split_the_merged_offsets_by_the_new_count() {
        let c = checkpoint(&[
            (40, 700, &[(0, 10), (2, 30)]),
            (40, 500, &[(1, 20), (3, 40)]),
        ]);
        let shares: Vec<_> = (0..3).map(|r| kafka_share(&c, r, 3).unwrap().1).collect();
        assert_eq!(shares[0].kafka, [(0, 10), (3, 40)]);
        assert_eq!(shares[1].kafka, [(1, 20)]);
        assert_eq!(shares[2].kafka, [(2, 30)]);
        let rows: Vec<u64> = shares.iter().map(|p| p.rows_consumed).collect();
        assert_eq!(rows, [1200, 0, 0]);
    }

    #[test]
    fn an_offset_listed_by_a_worker_that_did_not_own_the_partition_is_ignored() {
        // Partition 1 is worker 1's of 2; worker 0 listing it is not where it stands.
        let c = checkpoint(&[(8, 5, &[(0, 3), (1, 99)]), (8, 5, &[(1, 2)])]);
        let (_, p) = kafka_share(&c, 0, 1).unwrap();
        assert_eq!(p.kafka, [(0, 3), (1, 2)]);
    }

    #[test]
    fn workers_of_different_topics_are_refused() {
        let mut c = checkpoint(&[(8, 5, &[(0, 3)]), (8, 5, &[(1, 2)])]);
        c.workers[1].position.topic = "views".into();
        let e = kafka_share(&c, 0, 2).unwrap_err().to_string();
        assert!(e.contains("different topics (clicks and views)"), "{e}");
    }

    #[test]
    fn a_checkpoint_of_files_is_not_shared_as_a_topic() {
        let mut c = checkpoint(&[(8, 5, &[])]);
        c.workers[0].position.topic.clear();
        assert!(!reads_kafka(&c));
        assert!(reads_kafka(&checkpoint(&[(8, 5, &[])])));
    }
}
