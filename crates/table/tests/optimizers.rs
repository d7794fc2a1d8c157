//! Each optimizer against the scalar reference, plus the hand-computed textbook values.
mod common;
use common::*;
use sparta_table::{Initializer, Optimizer, RowMeta, Table, TableConfig};

fn table(opt: Optimizer, dim: usize, init: Initializer) -> Table {
    Table::new(TableConfig {
        dim,
        optimizer: opt,
        init,
        shards: 4,
        ..TableConfig::default()
    })
    .unwrap()
}

fn full_row(t: &Table, key: u64) -> Vec<f32> {
    let mut out = None;
    t.for_each_row(|k, row, _| {
        if k == key {
            out = Some(row.to_vec())
        }
    });
    out.expect("row present")
}

#[test]
fn every_optimizer_matches_scalar_reference_bit_for_bit() {
    let dim = 5;
    for opt in all_optimizers() {
        let t = table(opt.clone(), dim, uniform());
        let key = 0xAB00_0000_0000_1234;
        let mut w = vec![0.0; dim];
        t.pull(&[key], &mut w);
        let mut reference = w.clone();
        reference.extend(ref_state(&opt, dim));
        assert_eq!(
            bits(&full_row(&t, key)),
            bits(&reference),
            "{opt:?} initial row"
        );
        for step in 0..50 {
            let g: Vec<f32> = (0..dim)
                .map(|i| ((step * 7 + i * 3) % 11) as f32 * 0.1 - 0.5)
                .collect();
            t.push(&[key], &g);
            ref_apply(&opt, &mut reference, &g);
        }
        assert_eq!(
            bits(&full_row(&t, key)),
            bits(&reference),
            "{opt:?} after 50 pushes"
        );
        t.pull(&[key], &mut w);
        assert_eq!(
            bits(&w),
            bits(&reference[..dim]),
            "{opt:?} pull returns weights"
        );
    }
}

#[test]
fn textbook_values_for_one_step() {
    // Adagrad: acc = 0.1 + 4 = 4.1; w = 1 - 0.5 * 2 / (sqrt(4.1) + 0) .
    let t = table(
        Optimizer::Adagrad {
            lr: 0.5,
            initial_accumulator: 0.1,
            eps: 0.0,
        },
        1,
        Initializer::Constant { value: 1.0 },
    );
    let mut w = [0.0];
    t.pull(&[1], &mut w);
    t.push(&[1], &[2.0]);
    t.pull(&[1], &mut w);
    assert!((w[0] - (1.0 - 0.5 * 2.0 / 4.1f32.sqrt())).abs() < 1e-6);
    // Row-wise Adagrad: acc = 0 + mean(1, 9) = 5.
    let t = table(
        Optimizer::RowWiseAdagrad {
            lr: 1.0,
            initial_accumulator: 0.0,
            eps: 0.0,
        },
        2,
        Initializer::Zeros,
    );
    let mut w = [0.0; 2];
    t.pull(&[1], &mut w);
    t.push(&[1], &[1.0, 3.0]);
    assert_eq!(full_row(&t, 1)[2], 5.0);
    // Adam first step moves each weight by ~lr * sign(g).
    let t = table(
        Optimizer::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        2,
        Initializer::Zeros,
    );
    t.pull(&[1], &mut w);
    t.push(&[1], &[0.3, -2.0]);
    t.pull(&[1], &mut w);
    assert!(
        (w[0] + 0.01).abs() < 1e-6 && (w[1] - 0.01).abs() < 1e-6,
        "{w:?}"
    );
    // FTRL: one step with g = 1, alpha = 1, beta = 1, l1 = 0.5, l2 = 0:
    // n = 1, sigma = 1, z = 1, w = -(1 - 0.5) / ((1 + 1) / 1) = -0.25.
    let t = table(
        Optimizer::Ftrl {
            alpha: 1.0,
            beta: 1.0,
            l1: 0.5,
            l2: 0.0,
        },
        1,
        Initializer::Zeros,
    );
    let mut w = [0.0];
    t.pull(&[1], &mut w);
    t.push(&[1], &[1.0]);
    t.pull(&[1], &mut w);
    assert_eq!(w[0], -0.25);
    // FTRL with |z| <= l1 gives exactly 0.
    t.push(&[1], &[-0.9]);
    t.pull(&[1], &mut w);
    let row = full_row(&t, 1);
    assert!(row[1].abs() <= 0.5 && w[0] == 0.0, "{row:?}");
}

#[test]
fn duplicates_in_one_push_apply_sequentially() {
    let opt = Optimizer::Adagrad {
        lr: 0.1,
        initial_accumulator: 0.0,
        eps: 1e-8,
    };
    let t = table(opt.clone(), 2, uniform());
    let mut w = vec![0.0; 2];
    t.pull(&[9], &mut w);
    let mut reference = w.clone();
    reference.extend(ref_state(&opt, 2));
    let grads = [0.5, -1.0, 2.0, 0.25, -0.75, 1.5];
    t.push(&[9, 9, 9], &grads);
    for g in grads.chunks(2) {
        ref_apply(&opt, &mut reference, g);
    }
    assert_eq!(bits(&full_row(&t, 9)), bits(&reference));
}

#[test]
fn raw_restore_is_bit_identical() {
    let opt = Optimizer::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
    };
    let src = table(
        opt.clone(),
        4,
        Initializer::Normal {
            mean: 0.0,
            std: 1.0,
        },
    );
    let keys: Vec<u64> = (0..3000u64)
        .map(|k| k.wrapping_mul(0x9E37_79B9) ^ (k << 56))
        .collect();
    let mut out = vec![0.0; keys.len() * 4];
    src.pull(&keys, &mut out);
    let grads: Vec<f32> = (0..keys.len() * 4).map(|i| (i % 13) as f32 - 6.0).collect();
    src.push(&keys, &grads);
    let dst = table(opt, 4, Initializer::Zeros);
    let mut rows: Vec<(u64, Vec<u32>, RowMeta)> = Vec::new();
    src.for_each_row(|k, r, m| {
        dst.insert_raw(k, r, m).unwrap();
        rows.push((k, bits(r), m));
    });
    assert_eq!(rows.len(), keys.len());
    let mut restored = Vec::new();
    dst.for_each_row(|k, r, m| restored.push((k, bits(r), m)));
    rows.sort_by_key(|r| r.0);
    restored.sort_by_key(|r| r.0);
    assert_eq!(rows, restored);
    assert!(dst.insert_raw(1, &[0.0; 3], RowMeta::default()).is_err());
}

#[test]
fn initializer_is_deterministic_per_key_and_seed() {
    let mk = |seed| {
        Table::new(TableConfig {
            dim: 8,
            init: Initializer::Normal {
                mean: 0.0,
                std: 1.0,
            },
            seed,
            ..TableConfig::default()
        })
        .unwrap()
    };
    let (a, b, c) = (mk(1), mk(1), mk(2));
    let keys = [5u64, 1 << 60, 77];
    let (mut x, mut y, mut z) = (vec![0.0; 24], vec![0.0; 24], vec![0.0; 24]);
    a.pull(&keys, &mut x);
    b.pull(&[77, 5, 1 << 60], &mut y);
    c.pull(&keys, &mut z);
    assert_eq!(&x[..8], &y[8..16]);
    assert_eq!(&x[16..24], &y[..8]);
    assert_ne!(x, z);
    assert_ne!(&x[..8], &x[8..16]);
    let mean: f32 = x.iter().sum::<f32>() / 24.0;
    assert!(mean.abs() < 1.0 && x.iter().all(|v| v.is_finite()));
}
