//! The requests of a training step, built in one place: what [`super::RemoteStore`] sends, and
//! what [`crate::report::sparse_step_bytes`] and [`crate::report::dense_step_bytes`] count for
//! a plan made before any cluster runs (`sparta plan`).

use sparta_core::{KeyParts, TableId};
use sparta_proto::pb;
use sparta_proto::wire::{self, Compression};

/// Offsets of each class inside shard `shard`'s keys (empty for one class).
pub(crate) fn class_offsets(keys: &KeyParts<'_>, shard: usize) -> Vec<u32> {
    if keys.classes <= 1 {
        return Vec::new();
    }
    let base = keys.offsets[shard * keys.classes];
    (0..=keys.classes)
        .map(|c| (keys.offsets[shard * keys.classes + c] - base) as u32)
        .collect()
}

/// The pull of shard `shard`'s keys of `keys` from every table of `tables`, the values to come
/// back encoded as `c`.
pub(crate) fn pull(
    keys: &KeyParts<'_>,
    shard: usize,
    tables: &[pb::TableSpec],
    create: bool,
    c: Compression,
) -> pb::PullRequest {
    pb::PullRequest {
        keys: wire::keys_to_bytes(&keys.keys[keys.shard_range(shard)]),
        tables: tables.to_vec(),
        create,
        compression: c.to_proto() as i32,
        class_offsets: class_offsets(keys, shard),
    }
}

/// One table's part of a push: `grads` (one row of `dim` per key of its `classes` on the
/// shard), encoded as `c`.
pub(crate) fn table_grads(
    table: TableId,
    dim: usize,
    classes: u64,
    grads: &[f32],
    c: Compression,
) -> pb::TableGrads {
    pb::TableGrads {
        table: table.0 as u32,
        dim: dim as u32,
        grads: wire::values_to_bytes(grads, c),
        classes,
    }
}

/// The push of shard `shard`'s keys of `keys` with one [`table_grads`] per table.
pub(crate) fn push(
    keys: &KeyParts<'_>,
    shard: usize,
    tables: Vec<pb::TableGrads>,
    c: Compression,
    id: Option<pb::PushId>,
    steps: u32,
) -> pb::PushRequest {
    pb::PushRequest {
        keys: wire::keys_to_bytes(&keys.keys[keys.shard_range(shard)]),
        tables,
        compression: c.to_proto() as i32,
        class_offsets: class_offsets(keys, shard),
        id,
        steps,
    }
}

/// A dense push-pull: this worker's gradients of one shard's slice (f32), the slice's new
/// values coming back.
pub(crate) fn dense_push_pull(
    rank: u32,
    step: u64,
    total: u64,
    grads: &[f32],
    id: Option<pb::PushId>,
) -> pb::DensePushPullRequest {
    pb::DensePushPullRequest {
        rank,
        step,
        total,
        grads: wire::values_to_bytes(grads, Compression::None),
        id,
    }
}
