//! One training step split into the stages a pipeline overlaps:
//! lookup (dedup + partition, pull, gather) -> dense (forward/backward) -> push (scatter, push).
//! Each stage fills a reusable buffer, so a steady-state step allocates nothing.

use sparta_data::Batch;
use sparta_nn::{Model, ModelBatch};

use crate::dedup::{Deduper, UniqueIds};
use crate::error::WorkerError;
use crate::store::{DenseStore, PullInto, PushFrom, SparseStore, TableId};

/// A batch with its embeddings looked up: the input of the dense stage.
#[derive(Default)]
pub struct Lookup {
    /// The samples.
    pub batch: Batch,
    /// Distinct ids, grouped by shard, and the inverse index (reused by the push).
    pub unique: UniqueIds,
    /// Pulled deep rows, one per distinct id.
    pub rows: Vec<f32>,
    /// Pulled wide weights, one per distinct id.
    pub wide_rows: Vec<f32>,
    /// Deep embeddings per (sample, field), sum-pooled: `rows * fields * dim`.
    pub emb: Vec<f32>,
    /// Per-sample sum of wide weights.
    pub wide_sum: Vec<f32>,
}

/// Gradients of one step, summed per distinct id: the input of the push stage.
#[derive(Default)]
pub struct Gradients {
    /// Distinct ids and their shard grouping (moved from the lookup).
    pub unique: UniqueIds,
    /// Deep row gradients, one per distinct id.
    pub rows: Vec<f32>,
    /// Wide gradients, one per distinct id.
    pub wide: Vec<f32>,
    /// Mean loss of the batch.
    pub loss: f32,
    /// Samples in the batch.
    pub samples: usize,
}

/// Scratch space of the dense stage.
#[derive(Default)]
pub struct DenseScratch {
    d_emb: Vec<f32>,
    d_wide: Vec<f32>,
    grads: Vec<f32>,
}

/// Dedups the batch's ids, pulls their rows, and gathers them per sample.
pub fn lookup(
    store: &dyn SparseStore,
    deduper: &mut Deduper,
    batch: Batch,
    out: &mut Lookup,
    wide: bool,
    create: bool,
) -> Result<(), WorkerError> {
    out.batch = batch;
    deduper.run(&out.batch.ids, store.num_shards(), &mut out.unique);
    let dim = store.dim(TableId::Embedding);
    let n = out.unique.len();
    out.rows.resize(n * dim, 0.0);
    out.wide_rows.resize(if wide { n } else { 0 }, 0.0);
    let mut into = [
        PullInto {
            table: TableId::Embedding,
            values: &mut out.rows,
        },
        PullInto {
            table: TableId::Wide,
            values: &mut out.wide_rows,
        },
    ];
    let tables = if wide { 2 } else { 1 };
    store.pull(
        &out.unique.keys,
        &out.unique.shard_offsets,
        &mut into[..tables],
        create,
    )?;
    regather(out, dim, wide);
    Ok(())
}

/// Rebuilds the per-sample inputs (`emb`, `wide_sum`) from the pulled rows.
pub fn regather(out: &mut Lookup, dim: usize, wide: bool) {
    let b = &out.batch;
    gather(b, &out.unique.inverse, &out.rows, dim, &mut out.emb);
    out.wide_sum.clear();
    out.wide_sum.resize(b.rows, 0.0);
    if wide {
        let fields = b.num_fields;
        for r in 0..b.rows {
            let lo = b.offsets[r * fields] as usize;
            let hi = b.offsets[(r + 1) * fields] as usize;
            out.wide_sum[r] = out.unique.inverse[lo..hi]
                .iter()
                .map(|&u| out.wide_rows[u as usize])
                .sum();
        }
    }
}

/// Sum-pools the rows of each (sample, field) into `emb` (`rows * fields * dim`).
fn gather(b: &Batch, inverse: &[u32], rows: &[f32], dim: usize, emb: &mut Vec<f32>) {
    let slots = b.rows * b.num_fields;
    emb.resize(slots * dim, 0.0);
    if b.ids.len() == slots {
        // Single-valued fields: occurrence i is slot i.
        for (dst, &u) in emb.chunks_exact_mut(dim).zip(inverse) {
            let u = u as usize;
            dst.copy_from_slice(&rows[u * dim..(u + 1) * dim]);
        }
        return;
    }
    for (slot, dst) in emb.chunks_exact_mut(dim).enumerate() {
        dst.fill(0.0);
        let (lo, hi) = (b.offsets[slot] as usize, b.offsets[slot + 1] as usize);
        for &u in &inverse[lo..hi] {
            let u = u as usize;
            for (d, s) in dst.iter_mut().zip(&rows[u * dim..(u + 1) * dim]) {
                *d += s;
            }
        }
    }
}

/// Scores a looked-up batch with `model` into `out` (one probability per row): the forward pass
/// that evaluation, offline prediction and serving share.
pub fn predict(model: &mut Model, lookup: &Lookup, out: &mut Vec<f32>) {
    let b = &lookup.batch;
    out.resize(b.rows, 0.0);
    let mb = ModelBatch {
        rows: b.rows,
        emb: &lookup.emb,
        wide: &lookup.wide_sum,
        dense: &b.dense,
        labels: &[],
    };
    model.predict(&mb, out);
}

/// Forward + backward + dense update; scatters the sparse gradients per distinct id into `out`
/// (scaled by `sparse_scale`). Moves the lookup's `unique` into `out`.
pub fn dense(
    model: &mut Model,
    dense_store: Option<&dyn DenseStore>,
    lookup: &mut Lookup,
    scratch: &mut DenseScratch,
    sparse_scale: f32,
    wide: bool,
    out: &mut Gradients,
) -> Result<f32, WorkerError> {
    let b = &lookup.batch;
    let fields = b.num_fields;
    let dim = lookup.rows.len() / lookup.unique.len().max(1);
    scratch.d_emb.resize(lookup.emb.len(), 0.0);
    scratch.d_wide.resize(b.rows, 0.0);
    let mb = ModelBatch {
        rows: b.rows,
        emb: &lookup.emb,
        wide: &lookup.wide_sum,
        dense: &b.dense,
        labels: &b.labels,
    };
    let loss = model.forward_backward(&mb, &mut scratch.d_emb, &mut scratch.d_wide);
    match dense_store {
        None => model.apply_gradients(),
        Some(ds) => {
            scratch.grads.clear();
            scratch.grads.extend_from_slice(model.gradients());
            model.zero_gradients();
            ds.push_pull(&scratch.grads, model.param_values_mut())?;
        }
    }

    std::mem::swap(&mut out.unique, &mut lookup.unique);
    let n = out.unique.len();
    let inverse = &out.unique.inverse;
    out.rows.clear();
    out.rows.resize(n * dim, 0.0);
    let slots = b.rows * fields;
    for slot in 0..slots {
        let (lo, hi) = (b.offsets[slot] as usize, b.offsets[slot + 1] as usize);
        let g = &scratch.d_emb[slot * dim..(slot + 1) * dim];
        for &u in &inverse[lo..hi] {
            let u = u as usize;
            for (acc, gv) in out.rows[u * dim..(u + 1) * dim].iter_mut().zip(g) {
                *acc += gv * sparse_scale;
            }
        }
    }
    out.wide.clear();
    if wide {
        out.wide.resize(n, 0.0);
        for r in 0..b.rows {
            let g = scratch.d_wide[r] * sparse_scale;
            let lo = b.offsets[r * fields] as usize;
            let hi = b.offsets[(r + 1) * fields] as usize;
            for &u in &inverse[lo..hi] {
                out.wide[u as usize] += g;
            }
        }
    }
    out.loss = loss;
    out.samples = b.rows;
    Ok(loss)
}

/// Pushes a step's gradients to the tables (one request per shard for all tables).
pub fn push(store: &dyn SparseStore, grads: &Gradients, wide: bool) -> Result<(), WorkerError> {
    let u = &grads.unique;
    let from = [
        PushFrom {
            table: TableId::Embedding,
            grads: &grads.rows,
        },
        PushFrom {
            table: TableId::Wide,
            grads: &grads.wide,
        },
    ];
    let tables = if wide { 2 } else { 1 };
    store.push(&u.keys, &u.shard_offsets, &from[..tables])
}
