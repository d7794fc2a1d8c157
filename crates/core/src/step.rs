//! The first stage of a step, shared by training, evaluation and serving: lookup (dedup +
//! partition, pull, gather) and the forward pass over a looked-up batch ([`predict`]). The
//! training stages after it (dense forward/backward, push) live in `sparta-worker`.
//! Each stage fills a reusable buffer, so a steady-state step allocates nothing.

use sparta_data::Batch;
use sparta_nn::{Model, ModelBatch, SequenceIn};

use sparta_data::features::Pooling;

use crate::dedup::{Deduper, KeyParts, UniqueIds};
use crate::error::CoreError;
use crate::features::Features;
use crate::store::{PullInto, SparseStore, TableId};

/// A sequence feature's rows for the models that attend over them: `[rows x max_len x dim]`
/// (positions past a row's length are zeros) and each row's length.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SequenceBlock {
    /// Slot (batch field) of the feature.
    pub slot: usize,
    /// Positions per row.
    pub max_len: usize,
    /// Row width.
    pub dim: usize,
    /// `rows * max_len * dim` values.
    pub values: Vec<f32>,
    /// Valid positions per row (>= 1: an empty sequence holds the missing id).
    pub lengths: Vec<u32>,
}

/// A batch with its embeddings looked up: the input of the dense stage.
#[derive(Default)]
pub struct Lookup {
    /// The samples.
    pub batch: Batch,
    /// Distinct ids, grouped by shard and class, and the inverse index (reused by the push).
    pub unique: UniqueIds,
    /// Pulled rows per physical table (index = [`TableId`]), one per key of its classes.
    pub rows: Vec<Vec<f32>>,
    /// Per distinct id: its row in its deep table's `rows`.
    pub row_of: Vec<u32>,
    /// Every distinct id is of one class: its row in its deep table (and, when it has one,
    /// in the wide table) is its index in `unique.keys` (`row_of` is the identity).
    pub rows_are_keys: bool,
    /// Per distinct id: its row in the wide table's `rows` (`u32::MAX`: none).
    pub wide_row_of: Vec<u32>,
    /// Embeddings per sample: each slot's pooled vector at its offset, `rows * emb_width`.
    pub emb: Vec<f32>,
    /// Per-sample sum of the wide features' first-order weights.
    pub wide_sum: Vec<f32>,
    /// One block per sequence feature, in slot order.
    pub sequences: Vec<SequenceBlock>,
}

/// Dedups the batch's ids, pulls their rows from every table, and gathers them per sample.
pub fn lookup(
    store: &dyn SparseStore,
    deduper: &mut Deduper,
    features: &Features,
    batch: Batch,
    out: &mut Lookup,
    create: bool,
) -> Result<(), CoreError> {
    out.batch = batch;
    deduper.run_classed(
        &out.batch.ids,
        store.num_shards(),
        &features.class_of_tag,
        features.num_classes,
        &mut out.unique,
    );
    place_rows(features, out);
    pull_tables(store, features, &out.unique.parts(), &mut out.rows, create)?;
    regather(features, out);
    Ok(())
}

/// Pulls the rows of `keys` from every physical table of `features` into `rows` (one buffer per
/// table, index = [`TableId`], each holding the rows of its classes in (shard, class) order).
pub fn pull_tables(
    store: &dyn SparseStore,
    features: &Features,
    keys: &KeyParts<'_>,
    rows: &mut Vec<Vec<f32>>,
    create: bool,
) -> Result<(), CoreError> {
    rows.resize_with(features.physical.len(), Vec::new);
    let mut into: Vec<PullInto<'_>> = rows
        .iter_mut()
        .zip(&features.physical)
        .enumerate()
        .map(|(t, (values, p))| {
            values.clear();
            values.resize(keys.total(p.classes) * p.config.dim, 0.0);
            PullInto {
                table: TableId(t as u16),
                classes: p.classes,
                values,
            }
        })
        .collect();
    store.pull(keys, &mut into, create)
}

/// Numbers every distinct id's row in its deep table and in the wide table, in the order the
/// stores fill them: (shard, class) parts in order, each table reading the classes of its mask.
fn place_rows(features: &Features, out: &mut Lookup) {
    let u = &out.unique;
    let n = u.keys.len();
    out.row_of.clear();
    out.row_of.resize(n, 0);
    out.wide_row_of.clear();
    out.wide_row_of.resize(n, u32::MAX);
    let classes = u.classes.max(1);
    let used = (0..classes)
        .filter(|&c| {
            (0..u.part_offsets.len() / classes).any(|s| {
                let p = s * classes + c;
                u.part_offsets[p + 1] > u.part_offsets[p]
            })
        })
        .count();
    out.rows_are_keys = used <= 1;
    let deep_tables = features.physical.len() - usize::from(features.wide_table.is_some());
    let mut next = vec![0u32; deep_tables];
    let mut next_wide = 0u32;
    for p in 0..u.part_offsets.len() - 1 {
        let c = p % classes;
        let (table, wide) = (c / 2, c % 2 == 1);
        for k in u.part_offsets[p]..u.part_offsets[p + 1] {
            out.row_of[k] = next[table];
            next[table] += 1;
            if wide {
                out.wide_row_of[k] = next_wide;
                next_wide += 1;
            }
        }
    }
}

/// Rebuilds the per-sample inputs (`emb`, `wide_sum`, `sequences`) from the pulled rows.
/// Rows outer, slots inner: `emb` is written once, in order.
pub fn regather(features: &Features, out: &mut Lookup) {
    let b = &out.batch;
    let width = features.emb_width;
    let fields = b.num_fields;
    out.emb.clear();
    out.emb.resize(b.rows * width, 0.0);
    let single = b.ids.len() == b.rows * fields && b.weights.is_empty();
    let weights = &b.weights;
    let inverse = &out.unique.inverse;
    let row_of = &out.row_of;
    let identity = out.rows_are_keys;
    let uniform = features.uniform();
    if let (true, true, Some((table, dim))) = (single, identity, uniform) {
        // One table, one dim, one id per slot: occurrence i is slot i, its row is its id's.
        let rows = &out.rows[table];
        for (dst, &u) in out.emb.chunks_exact_mut(dim).zip(inverse) {
            let at = u as usize * dim;
            dst.copy_from_slice(&rows[at..at + dim]);
        }
    }
    let flat = single && identity && uniform.is_some();
    for (r, emb_row) in out.emb.chunks_exact_mut(width.max(1)).enumerate() {
        if flat {
            break;
        }
        for (j, slot) in features.slots.iter().enumerate() {
            if slot.sequence.is_some() {
                continue;
            }
            let dim = slot.dim;
            let rows = &out.rows[slot.physical];
            let dst = &mut emb_row[slot.offset..slot.offset + dim];
            if single {
                let u = inverse[r * fields + j] as usize;
                let at = if identity { u } else { row_of[u] as usize } * dim;
                dst.copy_from_slice(&rows[at..at + dim]);
                continue;
            }
            let k = r * fields + j;
            let (lo, hi) = (b.offsets[k] as usize, b.offsets[k + 1] as usize);
            let scale = pool_scale(slot.pooling, weights, lo, hi);
            for (i, &u) in inverse[lo..hi].iter().enumerate() {
                let w = weights.get(lo + i).copied().unwrap_or(1.0) * scale;
                let at = row_of[u as usize] as usize * dim;
                for (d, s) in dst.iter_mut().zip(&rows[at..at + dim]) {
                    *d += w * s;
                }
            }
        }
    }
    let seq_slots = features
        .slots
        .iter()
        .filter(|s| s.sequence.is_some())
        .count();
    out.sequences.resize_with(seq_slots, SequenceBlock::default);
    let mut seq = 0;
    for (j, slot) in features.slots.iter().enumerate() {
        let Some(max_len) = slot.sequence else {
            continue;
        };
        let (rows, dim) = (&out.rows[slot.physical], slot.dim);
        let block = &mut out.sequences[seq];
        seq += 1;
        block.slot = j;
        block.max_len = max_len;
        block.dim = dim;
        block.values.clear();
        block.values.resize(b.rows * max_len * dim, 0.0);
        block.lengths.clear();
        for r in 0..b.rows {
            let k = r * fields + j;
            let (lo, hi) = (b.offsets[k] as usize, b.offsets[k + 1] as usize);
            block.lengths.push((hi - lo) as u32);
            let dst = &mut out.emb[r * width + slot.offset..r * width + slot.offset + dim];
            let inv = 1.0 / (hi - lo) as f32;
            for (p, &u) in inverse[lo..hi].iter().enumerate() {
                let at = row_of[u as usize] as usize * dim;
                let src = &rows[at..at + dim];
                let to = (r * max_len + p) * dim;
                block.values[to..to + dim].copy_from_slice(src);
                for (d, s) in dst.iter_mut().zip(src) {
                    *d += s * inv;
                }
            }
        }
    }
    out.wide_sum.clear();
    out.wide_sum.resize(b.rows, 0.0);
    if let Some(wt) = features.wide_table {
        let wide_rows = &out.rows[wt];
        let all_wide = features.slots.iter().all(|s| s.wide);
        for (r, sum) in out.wide_sum.iter_mut().enumerate() {
            if all_wide && weights.is_empty() {
                // Every id of the row counts once.
                let (lo, hi) = (
                    b.offsets[r * fields] as usize,
                    b.offsets[(r + 1) * fields] as usize,
                );
                *sum = if identity {
                    inverse[lo..hi].iter().map(|&u| wide_rows[u as usize]).sum()
                } else {
                    inverse[lo..hi]
                        .iter()
                        .map(|&u| wide_rows[out.wide_row_of[u as usize] as usize])
                        .sum()
                };
                continue;
            }
            for (j, slot) in features.slots.iter().enumerate() {
                if !slot.wide {
                    continue;
                }
                let k = r * fields + j;
                let (lo, hi) = (b.offsets[k] as usize, b.offsets[k + 1] as usize);
                for (i, &u) in inverse[lo..hi].iter().enumerate() {
                    let w = weights.get(lo + i).copied().unwrap_or(1.0);
                    *sum += w * wide_rows[out.wide_row_of[u as usize] as usize];
                }
            }
        }
    }
}

/// The factor a bag's pooling applies on top of each item's weight: 1 for `sum`, `1 / sum w`
/// for `mean`, `1 / sqrt(sum w^2)` for `sqrtn` (0 when the denominator is 0). `weights` is
/// empty when every weight is 1.
#[inline]
pub fn pool_scale(pooling: Pooling, weights: &[f32], lo: usize, hi: usize) -> f32 {
    let w = |i: usize| weights.get(i).copied().unwrap_or(1.0);
    let denom = match pooling {
        Pooling::Sum => return 1.0,
        Pooling::Mean => (lo..hi).map(w).sum::<f32>(),
        Pooling::Sqrtn => (lo..hi).map(|i| w(i) * w(i)).sum::<f32>().sqrt(),
    };
    if denom == 0.0 {
        0.0
    } else {
        1.0 / denom
    }
}

/// The labels of the model's tasks, `rows * tasks` (row-major), picked from the batch's label
/// columns by `task_labels` (each task's column). The batch's own buffer when it already holds
/// exactly those columns in that order; else they are copied into `scratch`.
pub fn task_labels<'a>(
    batch: &'a Batch,
    task_labels: &[usize],
    scratch: &'a mut Vec<f32>,
) -> &'a [f32] {
    let n = batch.num_labels.max(1);
    let identity = task_labels.len() == n && task_labels.iter().enumerate().all(|(i, &l)| i == l);
    if identity || batch.labels.is_empty() {
        return &batch.labels;
    }
    scratch.clear();
    for row in batch.labels.chunks_exact(n) {
        scratch.extend(task_labels.iter().map(|&l| row[l]));
    }
    scratch
}

/// The sequence blocks an attending model reads (those with a target, in slot order); empty
/// when the job has none.
pub fn sequence_inputs<'a>(features: &Features, lookup: &'a Lookup) -> Vec<SequenceIn<'a>> {
    lookup
        .sequences
        .iter()
        .filter(|b| features.slots[b.slot].target.is_some())
        .map(|b| SequenceIn {
            values: &b.values,
            lengths: &b.lengths,
        })
        .collect()
}

/// Scores a looked-up batch with `model` into `out` (`rows * tasks` probabilities, row-major):
/// the forward pass that evaluation, offline prediction and serving share.
pub fn predict(model: &mut Model, features: &Features, lookup: &Lookup, out: &mut Vec<f32>) {
    let b = &lookup.batch;
    out.resize(b.rows * model.num_tasks(), 0.0);
    let sequences = sequence_inputs(features, lookup);
    let mb = ModelBatch {
        rows: b.rows,
        emb: &lookup.emb,
        wide: &lookup.wide_sum,
        dense: &b.dense,
        labels: &[],
        weights: &[],
        sequences: &sequences,
    };
    model.predict(&mb, out);
}

/// Whether every value is finite (no NaN, no infinity): an integer max over the magnitude
/// bits, which compilers vectorize, so checking a step's gradients costs a fraction of the
/// push that follows.
pub fn all_finite(values: &[f32]) -> bool {
    let mut m = 0u32;
    for &v in values {
        m = m.max(v.to_bits() & 0x7fff_ffff);
    }
    m < 0x7f80_0000
}

#[cfg(test)]
mod task_label_tests {
    use super::{task_labels, Batch};

    /// Three rows of two labels: (1, 1), (0, 0), (1, 0).
    fn two_labels() -> Batch {
        let mut b = Batch::empty_with_labels(1, 0, 2);
        b.rows = 3;
        b.labels = vec![1.0, 1.0, 0.0, 0.0, 1.0, 0.0];
        b
    }

    #[test]
    fn tasks_pick_their_label_columns_in_task_order() {
        let b = two_labels();
        let mut scratch = Vec::new();
        // every column in schema order: the batch's own buffer, not a copy
        let same = task_labels(&b, &[0, 1], &mut scratch);
        assert!(std::ptr::eq(same, &b.labels[..]));
        assert_eq!(task_labels(&b, &[0], &mut scratch), &[1.0, 0.0, 1.0]);
        assert_eq!(
            task_labels(&b, &[1, 0], &mut scratch),
            &[1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        );
        assert_eq!(task_labels(&b, &[1], &mut scratch), &[1.0, 0.0, 0.0]);
        // one label column, one task: unchanged
        let mut one = Batch::empty(1, 0);
        one.rows = 2;
        one.labels = vec![0.0, 1.0];
        assert!(std::ptr::eq(
            task_labels(&one, &[0], &mut scratch),
            &one.labels[..]
        ));
    }
}

#[cfg(test)]
mod finite_tests {
    use super::all_finite;

    #[test]
    fn non_finite_values_are_found_anywhere() {
        assert!(all_finite(&[]));
        assert!(all_finite(&[
            0.0,
            -0.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45
        ]));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN] {
            for at in [0, 17, 99] {
                let mut v = vec![1.5f32; 100];
                v[at] = bad;
                assert!(!all_finite(&v), "{bad} at {at}");
            }
        }
    }
}
