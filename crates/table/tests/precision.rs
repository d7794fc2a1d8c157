//! Compact rows (`precision = "f16" | "bf16" | "int8"`): the weights stored in 16 or 8 bits,
//! the optimizer state in f32; every path that reads or writes rows decodes and encodes them.
mod common;

use std::collections::BTreeMap;

use common::*;
use proptest::prelude::*;
use sparta_table::{RowMeta, RowPrecision, Table, TableConfig};

fn config(precision: RowPrecision, opt_i: usize, dim: usize) -> TableConfig {
    TableConfig {
        dim,
        optimizer: all_optimizers()[opt_i].clone(),
        init: uniform(),
        seed: 7,
        shards: 3,
        precision,
        ..TableConfig::default()
    }
}

/// Deterministic pulls and pushes of `keys` (gradients from `seed`).
fn train(t: &Table, keys: &[u64], rounds: usize, seed: u64) {
    for r in 0..rounds {
        train_round(t, keys, r, seed);
    }
}

/// Round `r` of [`train`]: a pull, a push of gradients in [-0.5, 0.5], a step.
fn train_round(t: &Table, keys: &[u64], r: usize, seed: u64) {
    let dim = t.dim();
    let mut out = vec![0f32; keys.len() * dim];
    t.pull(keys, &mut out);
    let g: Vec<f32> = (0..keys.len() * dim)
        .map(|i| {
            let h = sparta_table::mix64(seed ^ (r * 7919 + i) as u64);
            (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    t.push(keys, &g);
    t.advance_step();
}

/// The gap between `v` and the next 16-bit value away from zero: `mantissa` stored bits
/// (bf16 7, f16 10) at `v`'s binade, never below the format's smallest subnormal. A stored
/// value rounded from an exact one lies within one such gap of it (stochastic rounding picks
/// one of the two values around the exact one, both in the exact value's binade or at its
/// upper edge, whose gap is at least the bracket's).
fn gap(v: f32, mantissa: i32, smallest: f32) -> f32 {
    if v == 0.0 {
        return smallest;
    }
    (v.abs().log2().floor() - mantissa as f32)
        .exp2()
        .max(smallest)
}

/// The compact precisions.
const COMPACT: [RowPrecision; 3] = [RowPrecision::F16, RowPrecision::Bf16, RowPrecision::Int8];

/// Adds to `bound` the rounding gap of each stored weight of `rows` (rows of `dim`): the
/// 16-bit formats' gap at the value; int8's scale, at most the row's largest weight / 63.5
/// (the scale is the smallest power of two with 127 of it above that weight).
fn add_gaps(p: RowPrecision, rows: &[f32], dim: usize, bound: &mut [f32]) {
    for (row, out) in rows.chunks(dim).zip(bound.chunks_mut(dim)) {
        let m = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (&v, o) in row.iter().zip(out.iter_mut()) {
            *o += match p {
                RowPrecision::F16 => gap(v, 10, (-24f32).exp2()),
                RowPrecision::Bf16 => gap(v, 7, f32::from_bits(1)),
                _ => (m / 63.5).max((-126f32).exp2()),
            };
        }
    }
}

type Rows = BTreeMap<u64, (Vec<u32>, RowMeta)>;

fn rows(t: &Table) -> Rows {
    let mut m = BTreeMap::new();
    t.for_each_row(|k, row, meta| {
        m.insert(k, (bits(row), meta));
    });
    m
}

fn keys(n: u64) -> Vec<u64> {
    (0..n).map(|k| (k % 3) << 56 | (k * 7 + 1)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A compact table (f16, bf16, int8) trains as the f32 table does, up to the rounding of
    /// its weights: after 20 pushes every weight is within the sum of the rounding gaps of
    /// the values the compact table stored for it (its initial value and one per push), plus the f32 table's
    /// own rounding. That sum is the worst case, not a typical error: the gradients do not
    /// depend on the weights and the optimizer state is f32 in both tables, so each stored
    /// value's rounding error moves every later weight by at most itself (SGD, Adagrad, Adam
    /// add it unchanged; FTRL carries it through `z` scaled by less than one). A weight that
    /// passed through 0.3 and ended at 0.005 carries the gaps at 0.3, so the bound is per
    /// weight over its whole path, never at its final magnitude.
    #[test]
    fn a_compact_table_tracks_the_f32_table_within_its_rounding(
        opt_i in 0usize..5, dim in 1usize..7, p_i in 0usize..3, seed in any::<u64>(),
    ) {
        let p = COMPACT[p_i];
        let (wide, small) = (Table::new(config(RowPrecision::F32, opt_i, dim)).unwrap(),
                             Table::new(config(p, opt_i, dim)).unwrap());
        let ks = keys(40);
        let n = ks.len() * dim;
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        // Both tables insert their rows (the initial values) before the first round.
        wide.pull(&ks, &mut a);
        small.pull(&ks, &mut b);
        let mut bound = vec![0f32; n];
        add_gaps(p, &b, dim, &mut bound);
        let mut largest: Vec<f32> = a.iter().map(|v| v.abs()).collect();
        for r in 0..20 {
            train_round(&wide, &ks, r, seed);
            train_round(&small, &ks, r, seed);
            wide.pull_readonly(&ks, &mut a);
            small.pull_readonly(&ks, &mut b);
            add_gaps(p, &b, dim, &mut bound);
            for i in 0..n {
                largest[i] = largest[i].max(a[i].abs());
            }
        }
        for i in 0..n {
            // The f32 table rounds too: half an f32 ulp per operation, a few per push.
            let tol = bound[i] + 21.0 * 4.0 * f32::EPSILON * (largest[i] + 1e-3);
            prop_assert!((a[i] - b[i]).abs() <= tol, "{:?} {} vs {} (tol {})", p, a[i], b[i], tol);
        }
        prop_assert_eq!(small.len(), wide.len());
    }

    /// A compact table copied row by row (what a checkpoint, a replica or a re-cut shard
    /// does) into a fresh one holds the same rows bit for bit, and so do its deltas.
    #[test]
    fn a_compact_table_copies_bit_for_bit(
        opt_i in 0usize..5, dim in 1usize..7, p_i in 0usize..3, seed in any::<u64>(),
    ) {
        let p = COMPACT[p_i];
        let t = Table::new(config(p, opt_i, dim)).unwrap();
        train(&t, &keys(50), 8, seed);
        let copy = Table::new(config(p, opt_i, dim)).unwrap();
        t.for_each_row(|k, row, meta| copy.insert_raw(k, row, meta).unwrap());
        prop_assert_eq!(rows(&copy), rows(&t));
        let d = t.changed_since(0);
        let mut from_delta = BTreeMap::new();
        for (i, &k) in d.keys.iter().enumerate() {
            from_delta.insert(k, bits(&d.rows[i * d.row_stride..(i + 1) * d.row_stride]));
        }
        let whole: BTreeMap<u64, Vec<u32>> = rows(&t).into_iter().map(|(k, (r, _))| (k, r)).collect();
        prop_assert_eq!(from_delta, whole);
        // The weights a pull reads are the decoded stored ones.
        let ks = keys(50);
        let mut out = vec![0f32; ks.len() * dim];
        copy.pull_readonly(&ks, &mut out);
        let mut want = Vec::new();
        for k in &ks {
            t.read_raw(&[*k], |_, _, row, _| want.extend_from_slice(&row[..dim]));
        }
        prop_assert_eq!(bits(&out), bits(&want));
    }
}

/// The same pushes give the same compact rows (the rounding's random bits come from the key
/// and the version stamp).
#[test]
fn pushes_to_a_compact_table_are_deterministic() {
    for p in COMPACT {
        let (a, b) = (
            Table::new(config(p, 1, 8)).unwrap(),
            Table::new(config(p, 1, 8)).unwrap(),
        );
        train(&a, &keys(64), 10, 3);
        train(&b, &keys(64), 10, 3);
        assert_eq!(rows(&a), rows(&b));
    }
}

/// Dim 16 with per-weight Adagrad: 16 weights + 16 accumulators. In 16 bits the weights
/// take 8 words instead of 16: the payload per row (key + stored floats) drops from 136 to
/// 104 bytes, and the table's measured bytes per row (400k rows: the arena grows in 2 MiB
/// regions) by about the same 32; in int8, 5 words (a scale and 16 bytes): 92 bytes.
#[test]
fn compact_rows_take_fewer_bytes() {
    let adagrad = all_optimizers()
        .iter()
        .position(|o| matches!(o, sparta_table::Optimizer::Adagrad { .. }))
        .unwrap();
    let stats = |p| {
        let t = Table::new(config(p, adagrad, 16)).unwrap();
        train(&t, &keys(400_000), 1, 1);
        t.stats()
    };
    let (f32s, f16s, bf16s) = (
        stats(RowPrecision::F32),
        stats(RowPrecision::F16),
        stats(RowPrecision::Bf16),
    );
    assert_eq!(f32s.payload_bytes_per_row, 136);
    assert_eq!(f16s.payload_bytes_per_row, 104);
    assert_eq!(bf16s.payload_bytes_per_row, 104);
    let saved = f32s.bytes_per_row - f16s.bytes_per_row;
    assert!((28.0..=36.0).contains(&saved), "{f32s:?} vs {f16s:?}");
    // int8: a scale word and 16 bytes instead of 64: 44 bytes fewer than f32.
    let int8s = stats(RowPrecision::Int8);
    assert_eq!(int8s.payload_bytes_per_row, 92);
    let saved = f32s.bytes_per_row - int8s.bytes_per_row;
    assert!((40.0..=48.0).contains(&saved), "{f32s:?} vs {int8s:?}");
}
