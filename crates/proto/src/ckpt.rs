//! The checkpoint round on the wire: the coordinator's order (id, full or incremental, chain
//! links), the workers' positions, and how shard parts are named and keys routed as recorded
//! in cluster manifests. The round itself is the PS's (`sparta_ps::ckpt`, the barrier) and
//! the worker's (`sparta_cluster::rounds`, the manifest).

use sparta_checkpoint::{CheckpointId, CheckpointKind, InputPosition, WorkerState};

use crate::pb;

/// What the coordinator asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Order {
    /// Checkpoint id.
    pub id: CheckpointId,
    /// Full or incremental.
    pub kind: CheckpointKind,
    /// Chain base.
    pub base: CheckpointId,
    /// Previous checkpoint of the chain (incremental).
    pub prev: Option<CheckpointId>,
}

impl Order {
    /// From the wire form.
    pub fn from_proto(o: &pb::CheckpointOrder) -> Self {
        Order {
            id: CheckpointId(o.id),
            kind: if o.full {
                CheckpointKind::Full
            } else {
                CheckpointKind::Incremental
            },
            base: CheckpointId(o.base),
            prev: (o.prev != 0).then_some(CheckpointId(o.prev)),
        }
    }

    /// To the wire form.
    pub fn to_proto(self) -> pb::CheckpointOrder {
        pb::CheckpointOrder {
            id: self.id.0,
            full: self.kind == CheckpointKind::Full,
            base: self.base.0,
            prev: self.prev.map_or(0, |p| p.0),
            export: None,
        }
    }
}

/// A worker position on the wire → the checkpoint crate's form.
pub fn worker_state(p: &pb::WorkerPosition) -> WorkerState {
    WorkerState {
        rank: p.rank,
        step: p.step,
        position: InputPosition {
            epoch: p.epoch,
            file_index: p.file_index,
            byte_offset: p.byte_offset,
            rows_consumed: p.rows_consumed,
            file: p.file.clone(),
            topic: p.topic.clone(),
            kafka: p.kafka.iter().map(|o| (o.partition, o.offset)).collect(),
            ..InputPosition::default()
        },
        done: p.done,
    }
}

/// The checkpoint crate's worker state → the wire form.
pub fn worker_position(w: &WorkerState) -> pb::WorkerPosition {
    pb::WorkerPosition {
        rank: w.rank,
        step: w.step,
        epoch: w.position.epoch,
        file_index: w.position.file_index,
        byte_offset: w.position.byte_offset,
        rows_consumed: w.position.rows_consumed,
        done: w.done,
        file: w.position.file.clone(),
        topic: w.position.topic.clone(),
        kafka: w
            .position
            .kafka
            .iter()
            .map(|&(partition, offset)| pb::PartitionOffset { partition, offset })
            .collect(),
    }
}

/// The checkpoint part name of shard `shard`.
pub fn part_name(shard: usize) -> String {
    format!("ps-{shard}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    proptest! {
        /// Every field of a worker's state crosses the wire: a Kafka position's topic and
        /// partition offsets too (a worker's offsets live in the cluster checkpoint).
        #[test]
        fn a_worker_state_survives_the_wire(
            rank in 0u32..64,
            step in any::<u64>(),
            rows in any::<u64>(),
            epoch in any::<u64>(),
            file_index in any::<u64>(),
            byte_offset in any::<u64>(),
            file in "[a-z0-9.]{0,12}",
            topic in "[a-z]{0,8}",
            kafka in proptest::collection::vec((any::<i32>(), any::<i64>()), 0..8),
            done in any::<bool>(),
        ) {
            let w = WorkerState {
                rank,
                step,
                position: InputPosition {
                    epoch,
                    file_index,
                    byte_offset,
                    rows_consumed: rows,
                    file,
                    topic,
                    kafka,
                    ..InputPosition::default()
                },
                done,
            };
            let bytes = worker_position(&w).encode_to_vec();
            let back = pb::WorkerPosition::decode(bytes.as_slice()).unwrap();
            prop_assert_eq!(worker_state(&back), w);
        }
    }
}
