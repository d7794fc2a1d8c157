//! One training step split into the stages a pipeline overlaps:
//! lookup (dedup + partition, pull, gather; in `sparta-core`) -> dense (forward/backward) ->
//! push (scatter, push). Each stage fills a reusable buffer, so a steady-state step allocates
//! nothing.

use sparta_core::dedup::UniqueIds;
use sparta_core::store::{DenseStore, PushFrom, SparseStore, TableId};
use sparta_core::CoreError;
use sparta_nn::{Model, ModelBatch};

pub use sparta_core::step::{lookup, predict, regather, Lookup};

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
) -> Result<f32, CoreError> {
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
pub fn push(store: &dyn SparseStore, grads: &Gradients, wide: bool) -> Result<(), CoreError> {
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
