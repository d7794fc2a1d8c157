//! Ready-to-train batches in a columnar, jagged layout.

use std::ops::Range;

pub use crate::error::BadBatch;

/// Transform applied to every dense value: sign-preserving `log1p`
/// (`x >= 0 -> ln(1+x)`, `x < 0 -> -ln(1-x)`). Missing values become 0 before it.
#[inline]
pub fn log_transform(x: f64) -> f32 {
    if x >= 0.0 {
        x.ln_1p() as f32
    } else {
        -((-x).ln_1p()) as f32
    }
}

/// A batch of rows.
///
/// Ids are jagged: the values of row `r`, field `f` are
/// `ids[offsets[r * num_fields + f] as usize .. offsets[r * num_fields + f + 1] as usize]`,
/// and every (row, field) has at least one id (a missing value is the field's missing id).
///
/// Labels are strided: row `r`'s label `k` (the schema's `k`-th label column) is
/// `labels[r * num_labels + k]`. A batch with one label is laid out as before labels were
/// strided.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Number of rows.
    pub rows: usize,
    /// Sparse fields per row.
    pub num_fields: usize,
    /// Dense values per row.
    pub num_dense: usize,
    /// Labels per row (the schema's label columns, at least 1).
    pub num_labels: usize,
    /// `rows * num_labels` labels, 0.0 or 1.0, row-major.
    pub labels: Vec<f32>,
    /// `rows * num_dense` transformed dense values, row-major.
    pub dense: Vec<f32>,
    /// Feature ids, row-major then field-major.
    pub ids: Vec<u64>,
    /// `rows * num_fields + 1` offsets into `ids`, starting at 0.
    pub offsets: Vec<u32>,
    /// One weight per id when some slot is a weighted bag; empty when every weight is 1.
    pub weights: Vec<f32>,
    /// One sample weight per row (the schema's `weight` column) when the schema has one;
    /// empty when every row weighs 1. Not to be confused with `weights` (per id).
    pub sample_weights: Vec<f32>,
}

impl Default for Batch {
    /// No rows, no shape, one label per row (and, unlike [`Batch::empty`], no offsets yet).
    fn default() -> Self {
        Batch {
            rows: 0,
            num_fields: 0,
            num_dense: 0,
            num_labels: 1,
            labels: Vec::new(),
            dense: Vec::new(),
            ids: Vec::new(),
            offsets: Vec::new(),
            weights: Vec::new(),
            sample_weights: Vec::new(),
        }
    }
}

impl Batch {
    /// An empty batch with the given shape and one label per row.
    pub fn empty(num_fields: usize, num_dense: usize) -> Batch {
        Self::empty_with_labels(num_fields, num_dense, 1)
    }

    /// An empty batch with the given shape and `num_labels` labels per row.
    pub fn empty_with_labels(num_fields: usize, num_dense: usize, num_labels: usize) -> Batch {
        Batch {
            rows: 0,
            num_fields,
            num_dense,
            num_labels,
            labels: Vec::new(),
            dense: Vec::new(),
            ids: Vec::new(),
            offsets: vec![0],
            weights: Vec::new(),
            sample_weights: Vec::new(),
        }
    }

    /// The labels of row `row` (`num_labels` of them).
    pub fn labels_of(&self, row: usize) -> &[f32] {
        let l = self.num_labels;
        &self.labels[row * l..(row + 1) * l]
    }

    /// Label `k` of every row, in row order.
    ///
    /// # Panics
    /// If `k >= num_labels`.
    pub fn label_values(&self, k: usize) -> impl Iterator<Item = f32> + '_ {
        assert!(
            k < self.num_labels,
            "label {k} of a batch with {} labels",
            self.num_labels
        );
        self.labels
            .iter()
            .skip(k)
            .step_by(self.num_labels)
            .copied()
            .take(self.rows)
    }

    /// True when the batch carries sample weights (one per row).
    pub fn has_sample_weights(&self) -> bool {
        !self.sample_weights.is_empty()
    }

    /// The sample weight of row `row` (1 for a batch without sample weights).
    pub fn sample_weight(&self, row: usize) -> f32 {
        self.sample_weights.get(row).copied().unwrap_or(1.0)
    }

    /// Same fields, dense values and labels per row.
    fn same_shape(&self, other: &Batch) -> bool {
        self.num_fields == other.num_fields
            && self.num_dense == other.num_dense
            && self.num_labels == other.num_labels
    }

    /// True if every (row, field) has exactly one id, so `ids[r * num_fields + f]` indexing works.
    pub fn is_single_valued(&self) -> bool {
        // Every (row, field) has at least one id, so equality means exactly one each.
        self.ids.len() == self.rows * self.num_fields
    }

    /// Ids of row `row`, field `field`.
    pub fn ids_of(&self, row: usize, field: usize) -> &[u64] {
        let k = row * self.num_fields + field;
        &self.ids[self.offsets[k] as usize..self.offsets[k + 1] as usize]
    }

    /// Dense values of row `row`.
    pub fn dense_row(&self, row: usize) -> &[f32] {
        &self.dense[row * self.num_dense..(row + 1) * self.num_dense]
    }

    /// A copy of rows `range`.
    ///
    /// # Panics
    /// If the range is out of bounds.
    pub fn slice(&self, range: Range<usize>) -> Batch {
        assert!(
            range.start <= range.end && range.end <= self.rows,
            "slice {range:?} of a batch with {} rows",
            self.rows
        );
        let f = self.num_fields;
        let d = self.num_dense;
        let l = self.num_labels;
        let offs = &self.offsets[range.start * f..=range.end * f];
        let base = offs[0];
        Batch {
            rows: range.len(),
            num_fields: f,
            num_dense: d,
            num_labels: l,
            labels: self.labels[range.start * l..range.end * l].to_vec(),
            dense: self.dense[range.start * d..range.end * d].to_vec(),
            ids: self.ids[base as usize..offs[offs.len() - 1] as usize].to_vec(),
            offsets: offs.iter().map(|o| o - base).collect(),
            weights: if self.weights.is_empty() {
                Vec::new()
            } else {
                self.weights[base as usize..offs[offs.len() - 1] as usize].to_vec()
            },
            sample_weights: if self.sample_weights.is_empty() {
                Vec::new()
            } else {
                self.sample_weights[range].to_vec()
            },
        }
    }

    /// Concatenates batches of the same shape (fields, dense values and labels per row; an
    /// empty list gives an empty batch of shape 0x0). Rows of a batch without (item or
    /// sample) weights weigh 1 when another batch has them.
    ///
    /// # Panics
    /// If the shapes differ.
    pub fn concat(batches: &[Batch]) -> Batch {
        let Some(first) = batches.first() else {
            return Batch::empty(0, 0);
        };
        let mut out = Batch::empty_with_labels(first.num_fields, first.num_dense, first.num_labels);
        let weighted = batches.iter().any(|b| !b.weights.is_empty());
        let sample_weighted = batches.iter().any(Batch::has_sample_weights);
        for b in batches {
            assert!(out.same_shape(b), "concat of batches with different shapes");
            let base = *out.offsets.last().expect("offsets start with 0");
            out.rows += b.rows;
            out.labels.extend_from_slice(&b.labels);
            if sample_weighted {
                out.sample_weights.extend_from_slice(&b.sample_weights);
                // A batch without sample weights weighs every row 1.
                out.sample_weights.resize(out.rows, 1.0);
            }
            out.dense.extend_from_slice(&b.dense);
            out.ids.extend_from_slice(&b.ids);
            if b.weights.is_empty() {
                if weighted {
                    // An unweighted batch weighs every id 1.
                    out.weights.resize(out.ids.len(), 1.0);
                }
            } else {
                out.weights.extend_from_slice(&b.weights);
            }
            out.offsets.extend(b.offsets[1..].iter().map(|o| o + base));
        }
        out
    }

    /// Ids held by rows `..row` (the start of row `row`'s ids in `ids`).
    ///
    /// # Panics
    /// If `row > rows`.
    pub fn ids_before(&self, row: usize) -> usize {
        self.offsets[row * self.num_fields] as usize
    }

    /// Appends a copy of rows `range` of `other` (same shape) to this batch: the in-place
    /// form of `Batch::concat(&[self, other.slice(range)])`, without the intermediate copy.
    ///
    /// # Panics
    /// If the shapes differ, the range is out of bounds, or the ids of the result would not
    /// fit the `u32` offsets.
    pub fn append_rows(&mut self, other: &Batch, range: Range<usize>) {
        assert!(
            self.same_shape(other),
            "append_rows of batches with different shapes"
        );
        assert!(
            range.start <= range.end && range.end <= other.rows,
            "append_rows {range:?} of a batch with {} rows",
            other.rows
        );
        if self.offsets.is_empty() {
            // `Batch::default()`: no offsets yet.
            self.offsets.push(0);
        }
        let (f, d, l) = (self.num_fields, self.num_dense, self.num_labels);
        let offs = &other.offsets[range.start * f..=range.end * f];
        let src = offs[0];
        let dst = *self.offsets.last().expect("offsets start with 0");
        let (lo, hi) = (src as usize, offs[offs.len() - 1] as usize);
        assert!(
            self.ids.len() + (hi - lo) <= u32::MAX as usize,
            "append_rows: ids overflow the u32 offsets"
        );
        self.labels
            .extend_from_slice(&other.labels[range.start * l..range.end * l]);
        if other.has_sample_weights() {
            // Rows appended before without sample weights weigh 1.
            self.sample_weights.resize(self.rows, 1.0);
            self.sample_weights
                .extend_from_slice(&other.sample_weights[range.clone()]);
        } else if self.has_sample_weights() {
            self.sample_weights.resize(self.rows + range.len(), 1.0);
        }
        self.dense
            .extend_from_slice(&other.dense[range.start * d..range.end * d]);
        if !other.weights.is_empty() && self.weights.len() < self.ids.len() {
            // Appending weighted rows to unweighted ones: theirs weigh 1.
            self.weights.resize(self.ids.len(), 1.0);
        }
        self.ids.extend_from_slice(&other.ids[lo..hi]);
        if !other.weights.is_empty() {
            self.weights.extend_from_slice(&other.weights[lo..hi]);
        } else if !self.weights.is_empty() {
            self.weights.resize(self.ids.len(), 1.0);
        }
        self.offsets
            .extend(offs[1..].iter().map(|&o| o - src + dst));
        self.rows += range.len();
    }

    /// Number of rows whose first label is positive.
    pub fn positives(&self) -> usize {
        self.label_values(0).filter(|&l| l > 0.5).count()
    }

    /// True when the batch carries item weights (one per id).
    pub fn is_weighted(&self) -> bool {
        !self.weights.is_empty()
    }

    /// Weights of row `row`, field `field` (all 1 for an unweighted batch: `None`).
    pub fn weights_of(&self, row: usize, field: usize) -> Option<&[f32]> {
        if self.weights.is_empty() {
            return None;
        }
        let k = row * self.num_fields + field;
        Some(&self.weights[self.offsets[k] as usize..self.offsets[k + 1] as usize])
    }

    /// Checks the structural invariants (lengths, at least one label per row, monotone
    /// offsets, at least one id per slot, weights empty or one per id, sample weights empty or
    /// one per row). Used by tests and debug assertions. Which key space the ids are in is
    /// [`Batch::check_tags`]'s business.
    pub fn check(&self) -> Result<(), BadBatch> {
        let (r, f, d, l) = (self.rows, self.num_fields, self.num_dense, self.num_labels);
        if l == 0 {
            return Err(BadBatch::NoLabels);
        }
        if self.labels.len() != r * l
            || self.dense.len() != r * d
            || self.offsets.len() != r * f + 1
        {
            return Err(BadBatch::Lengths {
                rows: r,
                labels: self.labels.len(),
                per_row: l,
                dense: self.dense.len(),
                offsets: self.offsets.len(),
            });
        }
        if !self.sample_weights.is_empty() && self.sample_weights.len() != r {
            return Err(BadBatch::SampleWeights {
                found: self.sample_weights.len(),
                rows: r,
            });
        }
        if self.offsets[0] != 0 || *self.offsets.last().unwrap() as usize != self.ids.len() {
            return Err(BadBatch::OffsetsSpan);
        }
        if !self.weights.is_empty() && self.weights.len() != self.ids.len() {
            return Err(BadBatch::Weights {
                found: self.weights.len(),
                ids: self.ids.len(),
            });
        }
        for (k, w) in self.offsets.windows(2).enumerate() {
            if w[1] <= w[0] {
                return Err(BadBatch::EmptySlot { slot: k });
            }
        }
        Ok(())
    }

    /// Checks [`Batch::check`] and that every id of field `f` has tag `tags[f]` (its table's
    /// key space; the legacy plan tags field `f` with `f`).
    pub fn check_tags(&self, tags: &[u8]) -> Result<(), BadBatch> {
        self.check()?;
        let f = self.num_fields;
        if tags.len() != f {
            return Err(BadBatch::TagCount {
                tags: tags.len(),
                fields: f,
            });
        }
        for (k, w) in self.offsets.windows(2).enumerate() {
            let tag = tags[k % f.max(1)];
            if self.ids[w[0] as usize..w[1] as usize]
                .iter()
                .any(|&id| crate::ids::field_of(id) != tag)
            {
                return Err(BadBatch::ForeignId {
                    row: k / f.max(1),
                    field: k % f.max(1),
                    tag,
                });
            }
        }
        Ok(())
    }

    /// The tags of the legacy plan: field `f` tagged `f`.
    pub fn legacy_tags(&self) -> Vec<u8> {
        (0..self.num_fields).map(|f| f as u8).collect()
    }
}

/// Builds a [`Batch`] row by row, with rollback of a half-written row.
///
/// A row gets its `num_labels` labels ([`BatchBuilder::push_label`], in label order), its
/// sample weight when the builder has them ([`BatchBuilder::push_sample_weight`]), its dense
/// values and its fields.
#[derive(Debug)]
pub struct BatchBuilder {
    batch: Batch,
    /// Lengths of labels, dense, ids (and weights), offsets at the row start.
    mark: (usize, usize, usize, usize),
    /// Every id gets a weight (some slot of the plan is a weighted bag).
    weighted: bool,
    /// Every row gets a sample weight (the schema has a weight column).
    sample_weighted: bool,
}

impl BatchBuilder {
    /// A builder for batches of the given shape with room for `capacity` rows.
    /// Its batches have no weights.
    pub fn new(num_fields: usize, num_dense: usize, capacity: usize) -> Self {
        Self::with_weights(num_fields, num_dense, capacity, false)
    }

    /// Like [`BatchBuilder::new`]; with `weighted`, every id gets a weight (1 unless pushed
    /// with [`BatchBuilder::push_weighted_id`]).
    pub fn with_weights(
        num_fields: usize,
        num_dense: usize,
        capacity: usize,
        weighted: bool,
    ) -> Self {
        let mut b = BatchBuilder {
            batch: Batch::empty(num_fields, num_dense),
            mark: (0, 0, 0, 1),
            weighted,
            sample_weighted: false,
        };
        b.reserve(capacity);
        b
    }

    /// This builder with `num_labels` labels per row (1 unless set; at least 1).
    ///
    /// # Panics
    /// If `num_labels` is 0 or rows were written.
    pub fn with_labels(mut self, num_labels: usize) -> Self {
        assert!(num_labels >= 1, "a row has at least one label");
        assert_eq!(self.batch.rows, 0, "with_labels on a builder with rows");
        let rows = self.batch.labels.capacity() / self.batch.num_labels;
        self.batch.num_labels = num_labels;
        self.batch.labels.reserve(rows * num_labels);
        self
    }

    /// This builder with (`true`) or without a sample weight per row.
    pub fn with_sample_weights(mut self, sample_weighted: bool) -> Self {
        self.sample_weighted = sample_weighted;
        if sample_weighted {
            let rows = self.batch.labels.capacity() / self.batch.num_labels;
            self.batch.sample_weights.reserve(rows);
        }
        self
    }

    /// Labels per row.
    pub fn num_labels(&self) -> usize {
        self.batch.num_labels
    }

    /// True when every row gets a sample weight.
    pub fn is_sample_weighted(&self) -> bool {
        self.sample_weighted
    }

    /// True when every id gets a weight.
    pub fn is_weighted(&self) -> bool {
        self.weighted
    }

    fn reserve(&mut self, rows: usize) {
        let b = &mut self.batch;
        b.labels.reserve(rows * b.num_labels);
        if self.sample_weighted {
            b.sample_weights.reserve(rows);
        }
        b.dense.reserve(rows * b.num_dense);
        b.ids.reserve(rows * b.num_fields);
        b.offsets.reserve(rows * b.num_fields);
        if self.weighted {
            b.weights.reserve(rows * b.num_fields);
        }
    }

    /// Rows completed so far.
    #[inline]
    pub fn rows(&self) -> usize {
        self.batch.rows
    }

    /// Ids written so far.
    #[inline]
    pub fn num_ids(&self) -> usize {
        self.batch.ids.len()
    }

    /// Starts a row (remembers where to roll back to).
    #[inline]
    pub fn begin_row(&mut self) {
        let b = &self.batch;
        self.mark = (b.labels.len(), b.dense.len(), b.ids.len(), b.offsets.len());
    }

    /// Appends the next label of the current row (`num_labels` per row, in label order).
    #[inline]
    pub fn push_label(&mut self, label: f32) {
        self.batch.labels.push(label);
    }

    /// Sets the sample weight of the current row (a sample-weighted builder's rows need one).
    #[inline]
    pub fn push_sample_weight(&mut self, weight: f32) {
        self.batch.sample_weights.push(weight);
    }

    /// Appends a (transformed) dense value to the current row.
    #[inline]
    pub fn push_dense(&mut self, value: f32) {
        self.batch.dense.push(value);
    }

    /// Appends an id (weight 1) to the current field.
    #[inline]
    pub fn push_id(&mut self, id: u64) {
        self.batch.ids.push(id);
        if self.weighted {
            self.batch.weights.push(1.0);
        }
    }

    /// Appends an id with its weight to the current field (the weight is dropped by an
    /// unweighted builder: its batches weigh every id 1).
    #[inline]
    pub fn push_weighted_id(&mut self, id: u64, weight: f32) {
        self.batch.ids.push(id);
        if self.weighted {
            self.batch.weights.push(weight);
        }
    }

    /// Reverses the ids (and their weights) written from index `start` on (a field written
    /// newest first becomes oldest first).
    #[inline]
    pub fn reverse_ids_from(&mut self, start: usize) {
        self.batch.ids[start..].reverse();
        if self.weighted {
            self.batch.weights[start..].reverse();
        }
    }

    /// Closes the current field.
    #[inline]
    pub fn end_field(&mut self) {
        self.batch.offsets.push(self.batch.ids.len() as u32);
    }

    /// Completes the current row.
    #[inline]
    pub fn end_row(&mut self) {
        self.batch.rows += 1;
        debug_assert_eq!(
            self.batch.labels.len(),
            self.batch.rows * self.batch.num_labels
        );
        debug_assert_eq!(
            self.batch.sample_weights.len(),
            if self.sample_weighted {
                self.batch.rows
            } else {
                0
            }
        );
        debug_assert_eq!(
            self.batch.offsets.len(),
            self.batch.rows * self.batch.num_fields + 1
        );
    }

    /// Drops everything written since [`BatchBuilder::begin_row`].
    #[inline]
    pub fn rollback(&mut self) {
        let (l, d, i, o) = self.mark;
        let b = &mut self.batch;
        b.labels.truncate(l);
        b.dense.truncate(d);
        b.ids.truncate(i);
        b.offsets.truncate(o);
        if self.weighted {
            b.weights.truncate(i);
        }
        b.sample_weights.truncate(b.rows);
    }

    /// Takes the finished rows out as a batch and starts a new one.
    pub fn take(&mut self) -> Batch {
        let b = &self.batch;
        let cap = b.labels.capacity() / b.num_labels;
        let fresh = Batch::empty_with_labels(b.num_fields, b.num_dense, b.num_labels);
        let out = std::mem::replace(&mut self.batch, fresh);
        self.reserve(cap);
        out
    }

    /// Like [`BatchBuilder::take`], but continues in `spare`'s buffers (cleared): saves the
    /// allocation (and page faults) of a fresh batch when batches are recycled.
    pub fn take_reusing(&mut self, mut spare: Batch) -> Batch {
        spare.rows = 0;
        spare.num_fields = self.batch.num_fields;
        spare.num_dense = self.batch.num_dense;
        spare.num_labels = self.batch.num_labels;
        spare.labels.clear();
        spare.sample_weights.clear();
        spare.dense.clear();
        spare.ids.clear();
        spare.offsets.clear();
        spare.offsets.push(0);
        spare.weights.clear();
        std::mem::replace(&mut self.batch, spare)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{feature_id, missing_id};

    #[test]
    fn dense_transform() {
        assert_eq!(log_transform(0.0), 0.0);
        assert!((log_transform(1.0) - 2f32.ln()).abs() < 1e-7);
        assert!((log_transform(-1.0) + 2f32.ln()).abs() < 1e-7);
        assert!((log_transform(1e6) - 1_000_001f64.ln() as f32).abs() < 1e-6);
        assert!((log_transform(0.5) - 1.5f32.ln()).abs() < 1e-7);
        for x in [-5.0, -0.3, 0.3, 7.0] {
            assert_eq!(log_transform(-x), -log_transform(x));
        }
    }

    /// Two rows, fields [single, multi]: row 0 = (a, [x, y]), row 1 = (missing, [z]).
    fn sample() -> Batch {
        let mut b = BatchBuilder::new(2, 1, 4);
        b.begin_row();
        b.push_label(1.0);
        b.push_dense(0.5);
        b.push_id(feature_id(0, b"a"));
        b.end_field();
        b.push_id(feature_id(1, b"x"));
        b.push_id(feature_id(1, b"y"));
        b.end_field();
        b.end_row();
        // a row that is abandoned half way
        b.begin_row();
        b.push_label(0.0);
        b.push_id(feature_id(0, b"junk"));
        b.end_field();
        b.rollback();
        b.begin_row();
        b.push_label(0.0);
        b.push_dense(1.5);
        b.push_id(missing_id(0));
        b.end_field();
        b.push_id(feature_id(1, b"z"));
        b.end_field();
        b.end_row();
        b.take()
    }

    #[test]
    fn builder_and_accessors() {
        let b = sample();
        b.check_tags(&b.legacy_tags()).unwrap();
        assert_eq!(b.rows, 2);
        assert_eq!(b.labels, vec![1.0, 0.0]);
        assert_eq!(b.offsets, vec![0, 1, 3, 4, 5]);
        assert_eq!(b.ids_of(0, 1), &[feature_id(1, b"x"), feature_id(1, b"y")]);
        assert_eq!(b.ids_of(1, 0), &[missing_id(0)]);
        assert_eq!(b.dense_row(1), &[1.5]);
        assert!(!b.is_single_valued());
        assert_eq!(b.positives(), 1);
    }

    #[test]
    fn slice_and_concat() {
        let b = sample();
        let s = b.slice(1..2);
        s.check().unwrap();
        assert_eq!(s.rows, 1);
        assert_eq!(s.offsets, vec![0, 1, 2]);
        assert_eq!(s.ids_of(0, 1), &[feature_id(1, b"z")]);
        assert!(s.is_single_valued());
        let empty = b.slice(1..1);
        empty.check().unwrap();
        assert_eq!(empty.offsets, vec![0]);
        let back = Batch::concat(&[b.slice(0..1), empty, s]);
        assert_eq!(back, b);
        // a builder continuing in a used batch's buffers builds the same batch
        let mut builder = BatchBuilder::new(2, 1, 0);
        let _ = builder.take_reusing(back);
        builder.begin_row();
        builder.push_label(1.0);
        builder.push_dense(0.5);
        builder.push_id(feature_id(0, b"a"));
        builder.end_field();
        builder.push_id(feature_id(1, b"x"));
        builder.push_id(feature_id(1, b"y"));
        builder.end_field();
        builder.end_row();
        assert_eq!(builder.take(), b.slice(0..1));
    }

    #[test]
    fn append_rows_matches_concat_of_slices() {
        let b = sample();
        let mut out = Batch::empty(2, 1);
        out.append_rows(&b, 1..2);
        out.append_rows(&b, 0..0);
        out.append_rows(&b, 0..2);
        out.check().unwrap();
        assert_eq!(out, Batch::concat(&[b.slice(1..2), b.clone()]));
        assert_eq!(out.ids_before(1), 2);
        assert_eq!(out.ids_before(2), 5);
        assert_eq!(out.ids_before(3), out.ids.len());
        // `Batch::default()` has no offsets yet: appending still gives a valid batch.
        let mut d = Batch {
            num_fields: 2,
            num_dense: 1,
            ..Batch::default()
        };
        d.append_rows(&b, 0..1);
        assert_eq!(d, b.slice(0..1));
    }

    /// Two rows, fields [id, weighted bag]: row 0 = (a, [x:0.5, y:2]), row 1 = (b, [missing]).
    fn weighted_sample() -> Batch {
        let mut b = BatchBuilder::with_weights(2, 0, 4, true);
        b.begin_row();
        b.push_label(1.0);
        b.push_id(feature_id(0, b"a"));
        b.end_field();
        b.push_weighted_id(feature_id(1, b"x"), 0.5);
        b.push_weighted_id(feature_id(1, b"y"), 2.0);
        b.end_field();
        b.end_row();
        b.begin_row();
        b.push_label(0.0);
        b.push_id(feature_id(0, b"junk"));
        b.push_weighted_id(feature_id(1, b"junk"), 9.0);
        b.rollback();
        b.begin_row();
        b.push_label(0.0);
        b.push_id(feature_id(0, b"b"));
        b.end_field();
        b.push_id(missing_id(1));
        b.end_field();
        b.end_row();
        b.take()
    }

    #[test]
    fn weights_follow_their_ids() {
        let b = weighted_sample();
        b.check_tags(&[0, 1]).unwrap();
        assert!(b.is_weighted());
        assert_eq!(b.weights, vec![1.0, 0.5, 2.0, 1.0, 1.0]);
        assert_eq!(b.weights_of(0, 1), Some(&[0.5, 2.0][..]));
        assert_eq!(sample().weights_of(0, 1), None);
        // slice / concat / append_rows keep one weight per id
        let s = b.slice(1..2);
        s.check().unwrap();
        assert_eq!(s.weights, vec![1.0, 1.0]);
        let back = Batch::concat(&[b.slice(0..1), b.slice(1..1), s.clone()]);
        assert_eq!(back, b);
        let mut out = Batch::empty(2, 0);
        out.append_rows(&b, 1..2);
        out.append_rows(&b, 0..2);
        out.check().unwrap();
        assert_eq!(out, Batch::concat(&[s, b.clone()]));
        // mixing with unweighted rows: those weigh 1
        let mut plain = BatchBuilder::new(2, 0, 1);
        plain.begin_row();
        plain.push_label(0.0);
        plain.push_id(feature_id(0, b"c"));
        plain.end_field();
        plain.push_weighted_id(feature_id(1, b"z"), 7.0); // dropped: unweighted builder
        plain.end_field();
        plain.end_row();
        let plain = plain.take();
        assert!(plain.weights.is_empty());
        plain.check().unwrap();
        let mixed = Batch::concat(&[plain.clone(), b.clone()]);
        mixed.check().unwrap();
        assert_eq!(mixed.weights, vec![1.0, 1.0, 1.0, 0.5, 2.0, 1.0, 1.0]);
        let mut m = plain.clone();
        m.append_rows(&b, 0..1);
        m.append_rows(&plain, 0..1);
        m.check().unwrap();
        assert_eq!(m.weights, vec![1.0, 1.0, 1.0, 0.5, 2.0, 1.0, 1.0]);
        // a weighted builder reusing buffers starts clean and stays weighted
        let mut wb = BatchBuilder::with_weights(2, 0, 0, true);
        let _ = wb.take_reusing(b.clone());
        let fresh = wb.take();
        assert!(fresh.weights.is_empty() && fresh.ids.is_empty());
        fresh.check().unwrap();
        // check refuses a weight count that is not the id count
        let mut broken = b.clone();
        broken.weights.pop();
        assert!(broken.check().unwrap_err().to_string().contains("weights"));
        // check_tags names the field holding a foreign id
        let e = b.check_tags(&[0, 2]).unwrap_err().to_string();
        assert!(e.contains("field 1"), "{e}");
        assert!(b.check_tags(&[0]).is_err());
    }

    #[test]
    fn reversing_a_field_reverses_its_weights() {
        let mut b = BatchBuilder::with_weights(1, 0, 1, true);
        b.begin_row();
        b.push_label(0.0);
        b.push_weighted_id(feature_id(0, b"new"), 3.0);
        b.push_weighted_id(feature_id(0, b"old"), 4.0);
        b.reverse_ids_from(0);
        b.end_field();
        b.end_row();
        let b = b.take();
        assert_eq!(b.ids, vec![feature_id(0, b"old"), feature_id(0, b"new")]);
        assert_eq!(b.weights, vec![4.0, 3.0]);
    }

    /// Three rows of two labels (click, conversion) and a sample weight each, fields
    /// [id, bag]; a row abandoned half way (labels and weight written) in between.
    fn two_label_sample() -> Batch {
        let mut b = BatchBuilder::new(2, 1, 2)
            .with_labels(2)
            .with_sample_weights(true);
        assert_eq!((b.num_labels(), b.is_sample_weighted()), (2, true));
        // (labels, sample weight, id, bag)
        type Row<'a> = ([f32; 2], f32, &'a [u8], &'a [&'a [u8]]);
        let rows: [Row; 3] = [
            ([1.0, 1.0], 0.5, b"a", &[b"x", b"y"]),
            ([0.0, 0.0], 1.0, b"b", &[b"z"]),
            ([1.0, 0.0], 2.0, b"c", &[b"x"]),
        ];
        for (r, (labels, w, id, bag)) in rows.into_iter().enumerate() {
            if r == 1 {
                b.begin_row();
                b.push_label(1.0);
                b.push_label(1.0);
                b.push_sample_weight(9.0);
                b.push_id(feature_id(0, b"junk"));
                b.rollback();
            }
            b.begin_row();
            for l in labels {
                b.push_label(l);
            }
            b.push_sample_weight(w);
            b.push_dense(r as f32);
            b.push_id(feature_id(0, id));
            b.end_field();
            for v in bag {
                b.push_id(feature_id(1, v));
            }
            b.end_field();
            b.end_row();
        }
        b.take()
    }

    #[test]
    fn several_labels_and_sample_weights_keep_their_stride() {
        let b = two_label_sample();
        b.check_tags(&b.legacy_tags()).unwrap();
        assert_eq!((b.rows, b.num_labels), (3, 2));
        assert_eq!(b.labels, vec![1.0, 1.0, 0.0, 0.0, 1.0, 0.0]);
        assert_eq!(b.labels_of(2), &[1.0, 0.0]);
        assert_eq!(b.label_values(1).collect::<Vec<_>>(), vec![1.0, 0.0, 0.0]);
        assert_eq!(b.sample_weights, vec![0.5, 1.0, 2.0]);
        assert_eq!(b.sample_weight(2), 2.0);
        assert_eq!(b.positives(), 2, "positives of the first label");
        // slice / concat / append_rows round trips
        for cut in 0..=3 {
            let (lo, hi) = (b.slice(0..cut), b.slice(cut..3));
            lo.check().unwrap();
            hi.check().unwrap();
            assert_eq!(lo.labels.len(), 2 * cut);
            assert_eq!(lo.sample_weights.len(), cut);
            assert_eq!(Batch::concat(&[lo.clone(), hi.clone()]), b, "cut {cut}");
            let mut out = Batch::empty_with_labels(2, 1, 2);
            out.append_rows(&b, 0..cut);
            out.append_rows(&b, cut..3);
            assert_eq!(out, b, "cut {cut}");
        }
        let s = b.slice(1..3);
        assert_eq!(s.labels, vec![0.0, 0.0, 1.0, 0.0]);
        assert_eq!(s.sample_weights, vec![1.0, 2.0]);
        // rows without sample weights weigh 1 next to rows with them
        let mut plain = b.clone();
        plain.sample_weights.clear();
        plain.check().unwrap();
        assert_eq!(plain.sample_weight(0), 1.0);
        let mixed = Batch::concat(&[plain.slice(0..1), b.slice(1..2), plain.slice(2..3)]);
        assert_eq!(mixed.sample_weights, vec![1.0, 1.0, 1.0]);
        let mut m = plain.slice(0..2);
        m.append_rows(&b, 2..3);
        m.append_rows(&plain, 0..1);
        m.check().unwrap();
        assert_eq!(m.sample_weights, vec![1.0, 1.0, 2.0, 1.0]);
        // a builder reusing the buffers keeps its shape and starts clean
        let mut builder = BatchBuilder::new(2, 1, 0)
            .with_labels(2)
            .with_sample_weights(true);
        let _ = builder.take_reusing(b.clone());
        let fresh = builder.take();
        assert_eq!(fresh.num_labels, 2);
        assert!(fresh.labels.is_empty() && fresh.sample_weights.is_empty());
        fresh.check().unwrap();
        let again = builder.take();
        assert_eq!(again.num_labels, 2, "take keeps the shape");
        // check refuses labels or sample weights off the stride
        let mut broken = b.clone();
        broken.labels.pop();
        assert!(broken
            .check()
            .unwrap_err()
            .to_string()
            .contains("2 per row"));
        let mut broken = b.clone();
        broken.sample_weights.pop();
        assert!(broken
            .check()
            .unwrap_err()
            .to_string()
            .contains("sample weights"));
        let mut broken = Batch::empty(2, 1);
        broken.num_labels = 0;
        assert!(broken
            .check()
            .unwrap_err()
            .to_string()
            .contains("num_labels"));
    }

    #[test]
    fn one_label_batches_are_laid_out_as_before() {
        assert_eq!(Batch::default().num_labels, 1);
        assert_eq!(Batch::empty(3, 2).num_labels, 1);
        let b = sample();
        assert_eq!(b.num_labels, 1);
        assert_eq!(b.labels.len(), b.rows);
        assert!(!b.has_sample_weights());
        assert_eq!(b.label_values(0).collect::<Vec<_>>(), b.labels);
    }

    #[test]
    #[should_panic(expected = "different shapes")]
    fn concat_of_other_label_counts_panics() {
        Batch::concat(&[sample().slice(0..1), two_label_sample().slice(0..1)]);
    }

    #[test]
    #[should_panic(expected = "different shapes")]
    fn append_rows_of_other_shape_panics() {
        Batch::empty(1, 1).append_rows(&sample(), 0..1);
    }

    #[test]
    #[should_panic(expected = "slice")]
    fn slice_out_of_range_panics() {
        sample().slice(1..3);
    }
}
