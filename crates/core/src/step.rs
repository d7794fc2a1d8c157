//! The first stage of a step, shared by training, evaluation and serving: lookup (dedup +
//! partition, pull, gather; the gather's pooling is in [`crate::pool`]) and the forward pass
//! over a looked-up batch ([`predict`]). The training stages after it (dense forward/backward,
//! push) live in `sparta-worker`.
//! Each stage fills a reusable buffer, so a steady-state step allocates nothing.

use sparta_data::Batch;
use sparta_nn::{Model, ModelBatch, SequenceIn};

use crate::dedup::{Deduper, KeyParts, UniqueIds};
use crate::error::CoreError;
use crate::features::Features;
pub use crate::pool::SequenceBlock;
use crate::pool::{self, Occurrences};
pub use crate::range::{all_within, RangeCheck};
use crate::store::{PullInto, SparseStore, TableId};

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
    /// What the store kept of the pull for the push of these keys
    /// ([`SparseStore::pull_keeping`]).
    pub kept: Vec<Vec<u32>>,
    /// [`regather`] found every value of `emb` finite and at most
    /// [`MAX_EMBEDDING_MAGNITUDE`] in magnitude (false: not known; a check must look).
    pub emb_in_range: bool,
}

impl Lookup {
    /// Its id occurrences and where their rows are, with the distinct ids' `inverse` (the
    /// lookup's own, or the one moved to a step's gradients): what the backward pooling reads.
    pub fn occurrences<'a>(&'a self, inverse: &'a [u32]) -> Occurrences<'a> {
        Occurrences {
            batch: &self.batch,
            inverse,
            row_of: &self.row_of,
            wide_row_of: &self.wide_row_of,
            rows_are_keys: self.rows_are_keys,
        }
    }
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
        &store.routing(),
        &features.class_of_tag,
        features.num_classes,
        &mut out.unique,
    );
    place_rows(features, out);
    pull_tables_keeping(
        store,
        features,
        &out.unique.parts(),
        &mut out.rows,
        create,
        Some(&mut out.kept),
    )?;
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
    pull_tables_keeping(store, features, keys, rows, create, None)
}

/// [`pull_tables`], through [`SparseStore::pull_keeping`] into `kept` when it is given.
pub fn pull_tables_keeping(
    store: &dyn SparseStore,
    features: &Features,
    keys: &KeyParts<'_>,
    rows: &mut Vec<Vec<f32>>,
    create: bool,
    kept: Option<&mut Vec<Vec<u32>>>,
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
    match kept {
        Some(k) => store.pull_keeping(keys, &mut into, create, k),
        None => store.pull(keys, &mut into, create),
    }
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

/// Largest magnitude of a pooled embedding or wide sum a step accepts: beyond it an `f32`
/// row cannot take an ordinary update any more (the spacing of `f32` at 1e8 is 8), so the
/// table's optimizer has diverged (a learning rate far too high) even while the loss stays
/// finite (saturated predictions).
pub const MAX_EMBEDDING_MAGNITUDE: f32 = 1e8;

/// Rebuilds the per-sample inputs (`emb`, `wide_sum`, `sequences`) from the pulled rows: the
/// forward pooling, [`pool::gather`]; notes whether `emb` is in range
/// ([`Lookup::emb_in_range`]), checked as the rows are copied where the pooling only copies.
pub fn regather(features: &Features, out: &mut Lookup) {
    let occ = Occurrences {
        batch: &out.batch,
        inverse: &out.unique.inverse,
        row_of: &out.row_of,
        wide_row_of: &out.wide_row_of,
        rows_are_keys: out.rows_are_keys,
    };
    let checked = pool::gather(
        features,
        &occ,
        &out.rows,
        &mut out.emb,
        &mut out.wide_sum,
        &mut out.sequences,
        MAX_EMBEDDING_MAGNITUDE,
    );
    out.emb_in_range = checked.unwrap_or_else(|| all_within(&out.emb, MAX_EMBEDDING_MAGNITUDE));
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

/// Whether every value is finite (no NaN, no infinity): [`all_within`] `f32::MAX`.
pub fn all_finite(values: &[f32]) -> bool {
    all_within(values, f32::MAX)
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
