//! Pooling, forward and backward side by side.
//!
//! * [`gather`] (forward): per sample, each slot's rows pooled into its vector of the flattened
//!   embeddings (`sum`, `mean` or `sqrtn` over the item weights, [`pool_scale`]; a sequence is
//!   mean-pooled and also laid out as a [`SequenceBlock`]), and the wide sum of the first-order
//!   weights.
//! * [`scatter`] (backward): the gradients of those outputs summed into each distinct id's row
//!   gradient, through the same pooling and item weights.
//!
//! Both read a batch's id occurrences through [`Occurrences`] (which distinct id each
//! occurrence is, and where its rows are). The lookup (`crate::step`) calls [`gather`]; the
//! training step (`sparta-worker`) calls [`scatter`]. The unit tests check one against the
//! other by finite differences.

use sparta_data::features::Pooling;
use sparta_data::Batch;

use crate::features::Features;
use crate::range::RangeCheck;

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

/// A batch's id occurrences and where their rows are: what both directions of the pooling read.
#[derive(Clone, Copy, Debug)]
pub struct Occurrences<'a> {
    /// The samples: ids, their offsets per (row, slot) and item weights.
    pub batch: &'a Batch,
    /// Per occurrence: its distinct id.
    pub inverse: &'a [u32],
    /// Per distinct id: its row in its deep table.
    pub row_of: &'a [u32],
    /// Per distinct id: its row in the wide table (`u32::MAX`: none).
    pub wide_row_of: &'a [u32],
    /// Every distinct id's row is its index (`row_of` is the identity).
    pub rows_are_keys: bool,
}

impl Occurrences<'_> {
    /// One id per slot and no item weights.
    fn single(&self) -> bool {
        let b = self.batch;
        b.ids.len() == b.rows * b.num_fields && b.weights.is_empty()
    }

    /// The occurrences of sample `r`'s slot `j`.
    fn bag(&self, r: usize, j: usize) -> (usize, usize) {
        let b = self.batch;
        let k = r * b.num_fields + j;
        (b.offsets[k] as usize, b.offsets[k + 1] as usize)
    }

    /// Item weight of occurrence `i` (1 without weights).
    fn weight(&self, i: usize) -> f32 {
        self.batch.weights.get(i).copied().unwrap_or(1.0)
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

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

/// The forward pooling: builds the per-sample inputs of the dense model from the pulled `rows`
/// (one buffer per physical table): `emb` (`rows * emb_width`, each slot's pooled vector at its
/// offset), one [`SequenceBlock`] per sequence slot in `sequences`, and `wide_sum` (per sample,
/// the weighted sum of its wide ids' first-order weights). Rows outer, slots inner: `emb` is
/// written once, in order.
///
/// Where the pooling only copies rows (one table, one dim, one id per slot), it also checks
/// them as they pass: `Some(whether every value of emb is within limit in magnitude)`, NaN
/// never is ([`crate::range::all_within`]); `None` elsewhere (not checked).
pub fn gather(
    features: &Features,
    occ: &Occurrences<'_>,
    rows: &[Vec<f32>],
    emb: &mut Vec<f32>,
    wide_sum: &mut Vec<f32>,
    sequences: &mut Vec<SequenceBlock>,
    limit: f32,
) -> Option<bool> {
    let checked = gather_slots(features, occ, rows, emb, limit);
    gather_sequences(features, occ, rows, emb, sequences);
    gather_wide(features, occ, rows, wide_sum);
    checked
}

/// Each non-sequence slot's pooled vector into `emb`; the copying case checked against
/// `limit` on the way ([`gather`]).
fn gather_slots(
    features: &Features,
    occ: &Occurrences<'_>,
    rows: &[Vec<f32>],
    emb: &mut Vec<f32>,
    limit: f32,
) -> Option<bool> {
    let b = occ.batch;
    let width = features.emb_width;
    let fields = b.num_fields;
    let single = occ.single();
    let (inverse, row_of, identity) = (occ.inverse, occ.row_of, occ.rows_are_keys);
    let uniform = features.uniform();
    if let (true, true, Some((table, dim))) = (single, identity, uniform) {
        // One table, one dim, one id per slot: occurrence i is slot i, its row is its id's.
        // Every value is written: no zeroing first (a reused buffer keeps its length).
        emb.resize(b.rows * width, 0.0);
        return Some(copy_rows(&rows[table], inverse, dim, emb, limit));
    }
    emb.clear();
    emb.resize(b.rows * width, 0.0);
    for (r, emb_row) in emb.chunks_exact_mut(width.max(1)).enumerate() {
        for (j, slot) in features.slots.iter().enumerate() {
            if slot.sequence.is_some() {
                continue;
            }
            let dim = slot.dim;
            let rows = &rows[slot.physical];
            let dst = &mut emb_row[slot.offset..slot.offset + dim];
            if single {
                let u = inverse[r * fields + j] as usize;
                let at = if identity { u } else { row_of[u] as usize } * dim;
                dst.copy_from_slice(&rows[at..at + dim]);
                continue;
            }
            let (lo, hi) = occ.bag(r, j);
            let scale = pool_scale(slot.pooling, &b.weights, lo, hi);
            for (i, &u) in inverse[lo..hi].iter().enumerate() {
                let w = occ.weight(lo + i) * scale;
                let at = row_of[u as usize] as usize * dim;
                for (d, s) in dst.iter_mut().zip(&rows[at..at + dim]) {
                    *d += w * s;
                }
            }
        }
    }
    None
}

/// `dst` (`inverse.len() * dim`) filled with the rows `inverse` names (row `u` of `rows` is
/// `rows[u * dim..(u + 1) * dim]`); whether every value copied is within `limit` in magnitude.
/// The common widths are copied as fixed-size arrays (a few vector moves, where a slice copy
/// of a run-time length calls `memcpy`), and checked on the way ([`RangeCheck`]).
fn copy_rows(rows: &[f32], inverse: &[u32], dim: usize, dst: &mut [f32], limit: f32) -> bool {
    match dim {
        16 => copy_rows_of::<16>(rows, inverse, dst, limit),
        32 => copy_rows_of::<32>(rows, inverse, dst, limit),
        64 => copy_rows_of::<64>(rows, inverse, dst, limit),
        _ => {
            for (d, &u) in dst.chunks_exact_mut(dim).zip(inverse) {
                let at = u as usize * dim;
                d.copy_from_slice(&rows[at..at + dim]);
            }
            crate::range::all_within(dst, limit)
        }
    }
}

/// [`copy_rows`] for a width `D` that is a multiple of [`RangeCheck::LANES`].
#[inline(always)]
fn copy_rows_of<const D: usize>(
    rows: &[f32],
    inverse: &[u32],
    dst: &mut [f32],
    limit: f32,
) -> bool {
    let mut check = RangeCheck::new(limit);
    for (d, &u) in dst.chunks_exact_mut(D).zip(inverse) {
        let at = u as usize * D;
        let src: &[f32; D] = rows[at..at + D].try_into().expect("a row of D values");
        let d: &mut [f32; D] = d.try_into().expect("a slot of D values");
        *d = *src;
        check.add_all(src);
    }
    check.ok()
}

/// Each sequence slot: its block of rows, and its mean into its slot of `emb`.
fn gather_sequences(
    features: &Features,
    occ: &Occurrences<'_>,
    rows: &[Vec<f32>],
    emb: &mut [f32],
    sequences: &mut Vec<SequenceBlock>,
) {
    let b = occ.batch;
    let width = features.emb_width;
    let seq_slots = features
        .slots
        .iter()
        .filter(|s| s.sequence.is_some())
        .count();
    sequences.resize_with(seq_slots, SequenceBlock::default);
    let mut seq = 0;
    for (j, slot) in features.slots.iter().enumerate() {
        let Some(max_len) = slot.sequence else {
            continue;
        };
        let (rows, dim) = (&rows[slot.physical], slot.dim);
        let block = &mut sequences[seq];
        seq += 1;
        block.slot = j;
        block.max_len = max_len;
        block.dim = dim;
        block.values.clear();
        block.values.resize(b.rows * max_len * dim, 0.0);
        block.lengths.clear();
        for r in 0..b.rows {
            let (lo, hi) = occ.bag(r, j);
            block.lengths.push((hi - lo) as u32);
            let dst = &mut emb[r * width + slot.offset..r * width + slot.offset + dim];
            let inv = 1.0 / (hi - lo) as f32;
            for (p, &u) in occ.inverse[lo..hi].iter().enumerate() {
                let at = occ.row_of[u as usize] as usize * dim;
                let src = &rows[at..at + dim];
                let to = (r * max_len + p) * dim;
                block.values[to..to + dim].copy_from_slice(src);
                for (d, s) in dst.iter_mut().zip(src) {
                    *d += s * inv;
                }
            }
        }
    }
}

/// Per sample, the weighted sum of its wide ids' first-order weights.
fn gather_wide(
    features: &Features,
    occ: &Occurrences<'_>,
    rows: &[Vec<f32>],
    wide_sum: &mut Vec<f32>,
) {
    let b = occ.batch;
    let fields = b.num_fields;
    let inverse = occ.inverse;
    wide_sum.clear();
    wide_sum.resize(b.rows, 0.0);
    let Some(wt) = features.wide_table else {
        return;
    };
    let wide_rows = &rows[wt];
    let all_wide = features.slots.iter().all(|s| s.wide);
    for (r, sum) in wide_sum.iter_mut().enumerate() {
        if all_wide && b.weights.is_empty() {
            // Every id of the row counts once.
            let (lo, hi) = (
                b.offsets[r * fields] as usize,
                b.offsets[(r + 1) * fields] as usize,
            );
            *sum = if occ.rows_are_keys {
                inverse[lo..hi].iter().map(|&u| wide_rows[u as usize]).sum()
            } else {
                inverse[lo..hi]
                    .iter()
                    .map(|&u| wide_rows[occ.wide_row_of[u as usize] as usize])
                    .sum()
            };
            continue;
        }
        for (j, slot) in features.slots.iter().enumerate() {
            if !slot.wide {
                continue;
            }
            let (lo, hi) = occ.bag(r, j);
            for (i, &u) in inverse[lo..hi].iter().enumerate() {
                let w = occ.weight(lo + i);
                *sum += w * wide_rows[occ.wide_row_of[u as usize] as usize];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

/// The backward pooling ([`gather`]'s adjoint): adds each occurrence's gradient (of its slot's
/// pooled vector, `d_emb`, and of the wide sum, `d_wide`) into its distinct id's row gradient,
/// through the slot's pooling and the item weights, scaled by `scale`. `d_seq` (empty unless
/// the model attends) holds, per sequence with a target, the gradient of each position's row:
/// those sequences take it instead of their pooled vector's. `grads` holds one buffer per
/// physical table, shaped as the pulled rows.
///
/// Where every value of `d_emb` is read once as it is (one table, one dim, one id per slot),
/// it is also checked on the way: `Some(whether every value of d_emb is finite)`; `None`
/// elsewhere (not checked).
pub fn scatter(
    features: &Features,
    occ: &Occurrences<'_>,
    d_emb: &[f32],
    d_wide: &[f32],
    d_seq: &[Vec<f32>],
    scale: f32,
    grads: &mut [Vec<f32>],
) -> Option<bool> {
    let checked = scatter_slots(features, occ, d_emb, d_seq, scale, grads);
    if let Some(wt) = features.wide_table {
        scatter_wide(features, occ, d_wide, scale, &mut grads[wt]);
    }
    checked
}

/// The slots' part of [`scatter`]: pooled vectors (and attended sequences' positions).
fn scatter_slots(
    features: &Features,
    occ: &Occurrences<'_>,
    d_emb: &[f32],
    d_seq: &[Vec<f32>],
    scale: f32,
    grads: &mut [Vec<f32>],
) -> Option<bool> {
    // Per slot: its block in `d_seq`, when it has one.
    let mut attended = [usize::MAX; 256];
    if !d_seq.is_empty() {
        let with_target = features
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.target.is_some());
        for (k, (j, _)) in with_target.enumerate() {
            attended[j] = k;
        }
    }
    let b = occ.batch;
    let fields = b.num_fields;
    let width = features.emb_width;
    let inverse = occ.inverse;
    let single = occ.single();
    let identity = occ.rows_are_keys;
    let uniform = features.uniform();
    if let (true, true, Some((table, dim))) = (single, identity, uniform) {
        // One table, one dim, one id per slot: occurrence i is slot i, its row is its id's.
        return Some(add_rows(d_emb, inverse, dim, scale, &mut grads[table]));
    }
    // Rows outer, slots inner: `d_emb` is read once, in order.
    for r in 0..b.rows {
        let d_row = &d_emb[r * width..(r + 1) * width];
        for (j, slot) in features.slots.iter().enumerate() {
            let dim = slot.dim;
            let grads = &mut grads[slot.physical];
            let g = &d_row[slot.offset..slot.offset + dim];
            let (lo, hi) = occ.bag(r, j);
            if let (Some(max_len), Some(ds)) = (slot.sequence, d_seq.get(attended[j])) {
                for (p, &u) in inverse[lo..hi].iter().enumerate() {
                    let g = &ds[(r * max_len + p) * dim..(r * max_len + p + 1) * dim];
                    let at = occ.row_of[u as usize] as usize * dim;
                    for (acc, gv) in grads[at..at + dim].iter_mut().zip(g) {
                        *acc += gv * scale;
                    }
                }
                continue;
            }
            if single {
                let u = inverse[r * fields + j] as usize;
                let at = if identity { u } else { occ.row_of[u] as usize } * dim;
                for (acc, gv) in grads[at..at + dim].iter_mut().zip(g) {
                    *acc += gv * scale;
                }
                continue;
            }
            let pool = match slot.sequence {
                Some(_) => 1.0 / (hi - lo) as f32,
                None => pool_scale(slot.pooling, &b.weights, lo, hi),
            };
            for (i, &u) in inverse[lo..hi].iter().enumerate() {
                let w = occ.weight(lo + i) * pool * scale;
                let at = occ.row_of[u as usize] as usize * dim;
                for (acc, gv) in grads[at..at + dim].iter_mut().zip(g) {
                    *acc += gv * w;
                }
            }
        }
    }
    None
}

/// Adds `src` (`inverse.len() * dim`, one gradient per occurrence), scaled by `scale`, into
/// the rows of `grads` that `inverse` names; whether every value of `src` is finite. The
/// common widths as fixed-size arrays, checked on the way ([`RangeCheck`]).
fn add_rows(src: &[f32], inverse: &[u32], dim: usize, scale: f32, grads: &mut [f32]) -> bool {
    match dim {
        16 => add_rows_of::<16>(src, inverse, scale, grads),
        32 => add_rows_of::<32>(src, inverse, scale, grads),
        64 => add_rows_of::<64>(src, inverse, scale, grads),
        _ => {
            for (g, &u) in src.chunks_exact(dim).zip(inverse) {
                let at = u as usize * dim;
                for (acc, gv) in grads[at..at + dim].iter_mut().zip(g) {
                    *acc += gv * scale;
                }
            }
            crate::range::all_within(src, f32::MAX)
        }
    }
}

/// [`add_rows`] for a width `D` that is a multiple of [`RangeCheck::LANES`].
#[inline(always)]
fn add_rows_of<const D: usize>(
    src: &[f32],
    inverse: &[u32],
    scale: f32,
    grads: &mut [f32],
) -> bool {
    let mut check = RangeCheck::new(f32::MAX);
    for (g, &u) in src.chunks_exact(D).zip(inverse) {
        let at = u as usize * D;
        let g: [f32; D] = *<&[f32; D]>::try_from(g).expect("a gradient of D values");
        let acc: &mut [f32; D] = (&mut grads[at..at + D])
            .try_into()
            .expect("a row of D values");
        // Whole rows in and out (registers in between): vector loads, FMAs and stores.
        let mut sum = *acc;
        for (a, gv) in sum.iter_mut().zip(&g) {
            *a += gv * scale;
        }
        *acc = sum;
        check.add_all(&g);
    }
    check.ok()
}

/// The wide sum's part of [`scatter`], into the wide table's gradient.
fn scatter_wide(
    features: &Features,
    occ: &Occurrences<'_>,
    d_wide: &[f32],
    scale: f32,
    grads: &mut [f32],
) {
    let b = occ.batch;
    let fields = b.num_fields;
    let inverse = occ.inverse;
    let all_wide = features.slots.iter().all(|s| s.wide) && b.weights.is_empty();
    for (r, &dw) in d_wide.iter().enumerate().take(b.rows) {
        let g = dw * scale;
        if all_wide {
            let (lo, hi) = (
                b.offsets[r * fields] as usize,
                b.offsets[(r + 1) * fields] as usize,
            );
            for &u in &inverse[lo..hi] {
                let row = if occ.rows_are_keys {
                    u as usize
                } else {
                    occ.wide_row_of[u as usize] as usize
                };
                grads[row] += g;
            }
            continue;
        }
        for (j, slot) in features.slots.iter().enumerate() {
            if !slot.wide {
                continue;
            }
            let (lo, hi) = occ.bag(r, j);
            for (i, &u) in inverse[lo..hi].iter().enumerate() {
                grads[occ.wide_row_of[u as usize] as usize] += g * occ.weight(lo + i);
            }
        }
    }
}

#[cfg(test)]
mod copy_tests {
    //! The fixed-width copies and sums of the copying gather and scatter against the
    //! run-time-width loop, at the widths that take each path.
    use super::{add_rows, copy_rows};

    fn rows(n: usize, dim: usize) -> Vec<f32> {
        (0..n * dim)
            .map(|i| (i % 97) as f32 * 0.37 - 17.0)
            .collect()
    }

    #[test]
    fn copy_rows_at_every_width_is_the_plain_copy_and_checks_the_bound() {
        for dim in [1, 5, 16, 24, 32, 64] {
            let table = rows(7, dim);
            let inverse = [3u32, 0, 6, 3, 1];
            let mut dst = vec![f32::NAN; inverse.len() * dim];
            assert!(copy_rows(&table, &inverse, dim, &mut dst, 1e8), "dim {dim}");
            for (k, &u) in inverse.iter().enumerate() {
                let u = u as usize;
                assert_eq!(dst[k * dim..(k + 1) * dim], table[u * dim..(u + 1) * dim]);
            }
            // A row out of range is reported only when copied.
            let mut bad = table.clone();
            bad[6 * dim + dim - 1] = f32::INFINITY;
            assert!(!copy_rows(&bad, &inverse, dim, &mut dst, 1e8), "dim {dim}");
            bad[6 * dim + dim - 1] = 0.0;
            bad[2 * dim] = -3e8;
            assert!(copy_rows(&bad, &inverse, dim, &mut dst, 1e8), "dim {dim}");
            assert!(
                !copy_rows(&bad, &[2], dim, &mut dst[..dim], 1e8),
                "dim {dim}"
            );
        }
    }

    #[test]
    fn add_rows_at_every_width_is_the_plain_sum_and_checks_finiteness() {
        for dim in [1, 5, 16, 24, 32, 64] {
            let inverse = [2u32, 0, 2, 2, 1];
            let src = rows(inverse.len(), dim);
            let mut got = rows(3, dim);
            let mut want = got.clone();
            for (g, &u) in src.chunks_exact(dim).zip(&inverse) {
                for (a, gv) in want[u as usize * dim..(u as usize + 1) * dim]
                    .iter_mut()
                    .zip(g)
                {
                    *a += gv * 0.5;
                }
            }
            assert!(add_rows(&src, &inverse, dim, 0.5, &mut got), "dim {dim}");
            assert_eq!(got, want, "dim {dim}");
            for bad in [f32::NAN, f32::INFINITY] {
                let mut src = src.clone();
                src[4 * dim] = bad;
                assert!(!add_rows(&src, &inverse, dim, 0.5, &mut got), "dim {dim}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! [`scatter`] against [`gather`] by finite differences: for a loss linear in the pooled
    //! outputs, `L = <c_emb, emb> + <c_wide, wide_sum> + <c_seq, attended blocks>`, the row
    //! gradients `scatter(c_emb, c_wide, c_seq)` must be the change of `L` when one pulled
    //! weight moves.

    use sparta_data::ids::{feature_id, missing_id};
    use sparta_data::Batch;

    use crate::config::{Job, JobConfig};
    use crate::dedup::Deduper;
    use crate::step::{lookup, regather, Lookup};
    use crate::store::LocalStore;

    /// Tables `user` (dim 4), `item` (dim 6, shared by an id and a sequence) and `tag` (dim 3,
    /// a weighted bag pooled by `pooling`); `target` gives the sequence a target (din attends).
    fn job(kind: &str, pooling: &str, target: bool) -> Job {
        let target = if target { "target = \"item\"" } else { "" };
        let text = format!(
            r#"
[data]
format = "custom"
[data.schema]
columns = [
  {{ name = "label", kind = "label" }},
  {{ name = "user", kind = "sparse" }},
  {{ name = "item", kind = "sparse" }},
  {{ name = "tags", kind = "multi_sparse", separator = "|" }},
  {{ name = "hist", kind = "multi_sparse", separator = "|" }},
]
[model]
kind = "{kind}"
hidden = [4]
[train]
threads = 1
seed = 3
[embedding]
init = {{ type = "uniform", low = -0.5, high = 0.5 }}
[wide]
init = {{ type = "uniform", low = -0.5, high = 0.5 }}
[[tables]]
name = "user"
dim = 4
[[tables]]
name = "item"
dim = 6
[[tables]]
name = "tag"
dim = 3
[[features]]
name = "user"
kind = "id"
table = "user"
[[features]]
name = "item"
kind = "id"
table = "item"
[[features]]
name = "tags"
kind = "bag"
table = "tag"
weighted = true
pooling = "{pooling}"
[[features]]
name = "hist"
kind = "sequence"
table = "item"
max_len = 3
{target}
"#
        );
        JobConfig::from_toml(&text).unwrap().validate().unwrap()
    }

    /// Three rows (slots: user, item, tags, hist); ids repeat within and across rows and slots.
    fn batch(job: &Job) -> Batch {
        let tag = |name: &str| job.features.table(name).unwrap().tag;
        let (u, i, t) = (tag("user"), tag("item"), tag("tag"));
        let id = |tag: u8, v: &str| feature_id(tag, v.as_bytes());
        let rows: Vec<Vec<Vec<(u64, f32)>>> = vec![
            vec![
                vec![(id(u, "u1"), 1.0)],
                vec![(id(i, "i1"), 1.0)],
                vec![(id(t, "a"), 0.5), (id(t, "b"), 2.0), (id(t, "a"), 1.5)],
                vec![(id(i, "i2"), 1.0), (id(i, "i1"), 1.0), (id(i, "i3"), 1.0)],
            ],
            vec![
                vec![(id(u, "u2"), 1.0)],
                vec![(id(i, "i2"), 1.0)],
                vec![(id(t, "c"), -0.7)],
                vec![(missing_id(i), 1.0)],
            ],
            vec![
                vec![(id(u, "u1"), 1.0)],
                vec![(id(i, "i3"), 1.0)],
                vec![(id(t, "b"), 1.0), (id(t, "c"), 0.25)],
                vec![(id(i, "i3"), 1.0), (id(i, "i3"), 1.0)],
            ],
        ];
        let mut b = Batch::empty(4, 0);
        for (r, slots) in rows.iter().enumerate() {
            b.labels.push((r % 2) as f32);
            for s in slots {
                for &(k, w) in s {
                    b.ids.push(k);
                    b.weights.push(w);
                }
                b.offsets.push(b.ids.len() as u32);
            }
            b.rows += 1;
        }
        b
    }

    /// Deterministic coefficients in [-1, 1).
    fn coefficients(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The linear loss's coefficients of the pooled outputs.
    struct Linear {
        emb: Vec<f32>,
        wide: Vec<f32>,
        /// Per attended sequence block (those with a target).
        seq: Vec<Vec<f32>>,
    }

    impl Linear {
        fn loss(&self, job: &Job, l: &Lookup) -> f64 {
            let dot = |a: &[f32], b: &[f32]| -> f64 {
                a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
            };
            let attended = l
                .sequences
                .iter()
                .filter(|b| job.features.slots[b.slot].target.is_some());
            dot(&self.emb, &l.emb)
                + dot(&self.wide, &l.wide_sum)
                + attended
                    .zip(&self.seq)
                    .map(|(b, c)| dot(c, &b.values))
                    .sum::<f64>()
        }
    }

    #[allow(clippy::needless_range_loop)] // perturbs l.rows[t][i] while reading grads[t][i]
    fn check(kind: &str, pooling: &str, target: bool) {
        let job = job(kind, pooling, target);
        let f = &job.features;
        let store = LocalStore::from_configs(&f.table_configs()).unwrap();
        let mut l = Lookup::default();
        lookup(&store, &mut Deduper::new(), f, batch(&job), &mut l, true).unwrap();
        assert_eq!(l.sequences.len(), 1);
        assert_eq!(l.sequences[0].lengths, vec![3, 1, 2]);
        let mut c = Linear {
            emb: coefficients(l.emb.len(), 1),
            wide: coefficients(l.wide_sum.len(), 2),
            seq: Vec::new(),
        };
        for (k, b) in l.sequences.iter().enumerate() {
            let slot = &f.slots[b.slot];
            if slot.target.is_none() {
                continue;
            }
            // An attending model reads the block, not the sequence's pooled vector.
            for row in c.emb.chunks_exact_mut(f.emb_width) {
                row[slot.offset..slot.offset + slot.dim].fill(0.0);
            }
            c.seq.push(coefficients(b.values.len(), 10 + k as u64));
        }
        assert_eq!(c.seq.len(), usize::from(target));
        let mut grads: Vec<Vec<f32>> = l.rows.iter().map(|r| vec![0.0; r.len()]).collect();
        let occ = l.occurrences(&l.unique.inverse);
        super::scatter(f, &occ, &c.emb, &c.wide, &c.seq, 1.0, &mut grads);

        let eps = 1e-2f32;
        let mut checked = 0;
        for t in 0..l.rows.len() {
            for i in 0..l.rows[t].len() {
                let orig = l.rows[t][i];
                l.rows[t][i] = orig + eps;
                regather(f, &mut l);
                let up = c.loss(&job, &l);
                l.rows[t][i] = orig - eps;
                regather(f, &mut l);
                let down = c.loss(&job, &l);
                l.rows[t][i] = orig;
                let numeric = (up - down) / (2.0 * eps as f64);
                let analytic = grads[t][i] as f64;
                assert!(
                    (numeric - analytic).abs() < 1e-3 * (1.0 + numeric.abs()),
                    "{kind}/{pooling}: table {} value {i}: numeric {numeric:.6} analytic \
                     {analytic:.6}",
                    f.physical[t].config.name
                );
                checked += 1;
            }
        }
        regather(f, &mut l);
        // Every deep row took part (a wide row of an id seen only in the sequence gets none).
        for (t, g) in grads.iter().enumerate() {
            if Some(t) == f.wide_table {
                continue;
            }
            let dim = f.physical[t].config.dim;
            for (r, row) in g.chunks(dim).enumerate() {
                assert!(
                    row.iter().any(|&x| x != 0.0),
                    "table {t} row {r}: no gradient"
                );
            }
        }
        assert!(checked > 40, "{checked}");
    }

    #[test]
    fn backward_matches_forward_for_weighted_sum_bags_sequences_and_wide() {
        check("wdl", "sum", false);
    }

    #[test]
    fn backward_matches_forward_for_mean_pooling() {
        check("wdl", "mean", false);
    }

    #[test]
    fn backward_matches_forward_for_sqrtn_pooling() {
        check("dcn", "sqrtn", false);
    }

    #[test]
    fn backward_matches_forward_for_attended_sequences() {
        check("din", "mean", true);
    }
}
