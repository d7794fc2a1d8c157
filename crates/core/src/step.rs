//! The first stage of a step, shared by training, evaluation and serving: lookup (dedup +
//! partition, pull, gather) and the forward pass over a looked-up batch ([`predict`]). The
//! training stages after it (dense forward/backward, push) live in `sparta-worker`.
//! Each stage fills a reusable buffer, so a steady-state step allocates nothing.

use sparta_data::Batch;
use sparta_nn::{Model, ModelBatch};

use crate::dedup::{Deduper, UniqueIds};
use crate::error::CoreError;
use crate::store::{PullInto, SparseStore, TableId};

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

/// Dedups the batch's ids, pulls their rows, and gathers them per sample.
pub fn lookup(
    store: &dyn SparseStore,
    deduper: &mut Deduper,
    batch: Batch,
    out: &mut Lookup,
    wide: bool,
    create: bool,
) -> Result<(), CoreError> {
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
