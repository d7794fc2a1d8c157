//! Property test: random interleavings of pull / pull_readonly / push / advance_step / evict /
//! remove / changed_since against a HashMap model with the reference optimizer math.
mod common;
use std::collections::HashMap;

use common::*;
use proptest::prelude::*;
use sparta_table::{init_row, Eviction, Table, TableConfig};

#[derive(Clone, Debug)]
enum Op {
    Pull(Vec<u8>),
    PullReadonly(Vec<u8>),
    Push(Vec<u8>, u32),
    Advance,
    Evict(usize),
    Remove(u8),
    Delta(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let keys = prop::collection::vec(0u8..48, 1..24);
    prop_oneof![
        4 => keys.clone().prop_map(Op::Pull),
        1 => keys.clone().prop_map(Op::PullReadonly),
        4 => (keys, any::<u32>()).prop_map(|(k, s)| Op::Push(k, s)),
        2 => Just(Op::Advance),
        1 => (1usize..40).prop_map(Op::Evict),
        1 => (0u8..48).prop_map(Op::Remove),
        1 => (0u8..6).prop_map(Op::Delta),
    ]
}

/// Field-like keys: small id in the low bits, "field" in the top byte.
fn key(k: u8) -> u64 {
    ((k as u64 % 5) << 56) | (k as u64 * 1_000_003)
}

struct ModelRow {
    row: Vec<f32>,
    last_step: u32,
    stamp: u64,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn table_agrees_with_model(opt_i in 0usize..5, shards in 1usize..6, dim in 1usize..5,
                               ops in prop::collection::vec(op(), 1..60)) {
        let opt = all_optimizers()[opt_i].clone();
        let cfg = TableConfig {
            dim, optimizer: opt.clone(), init: uniform(), seed: 7, shards,
            eviction: Some(Eviction { max_idle_steps: Some(2), ..Eviction::default() }),
            ..TableConfig::default()
        };
        let t = Table::new(cfg.clone()).unwrap();
        let mut model: HashMap<u64, ModelRow> = HashMap::new();
        let mut tombstones: Vec<(u64, u64)> = Vec::new();
        let mut step = 0u32;
        for op in ops {
            match op {
                Op::Pull(ks) => {
                    let keys: Vec<u64> = ks.iter().map(|&k| key(k)).collect();
                    let mut out = vec![f32::NAN; keys.len() * dim];
                    let stamp = t.version() + 1;
                    t.pull(&keys, &mut out);
                    for (i, &k) in keys.iter().enumerate() {
                        let r = model.entry(k).or_insert_with(|| {
                            let mut row = vec![0.0; t.row_stride()];
                            init_row(&cfg.init, &opt, k, cfg.seed, dim, &mut row);
                            ModelRow { row, last_step: step, stamp }
                        });
                        r.last_step = step;
                        prop_assert_eq!(bits(&out[i * dim..(i + 1) * dim]), bits(&r.row[..dim]));
                    }
                }
                Op::PullReadonly(ks) => {
                    let keys: Vec<u64> = ks.iter().map(|&k| key(k)).collect();
                    let mut out = vec![f32::NAN; keys.len() * dim];
                    t.pull_readonly(&keys, &mut out);
                    for (i, k) in keys.iter().enumerate() {
                        let want = model.get(k).map_or(vec![0.0; dim], |r| r.row[..dim].to_vec());
                        prop_assert_eq!(bits(&out[i * dim..(i + 1) * dim]), bits(&want));
                    }
                }
                Op::Push(ks, seed) => {
                    let keys: Vec<u64> = ks.iter().map(|&k| key(k)).collect();
                    let grads: Vec<f32> = (0..keys.len() * dim)
                        .map(|i| ((seed as usize).wrapping_add(i * 2654435761) % 2001) as f32 / 1000.0 - 1.0)
                        .collect();
                    let stamp = t.version() + 1;
                    t.push(&keys, &grads);
                    for (i, k) in keys.iter().enumerate() {
                        if let Some(r) = model.get_mut(k) {
                            ref_apply(&opt, &mut r.row, &grads[i * dim..(i + 1) * dim]);
                            r.stamp = stamp;
                        }
                    }
                }
                Op::Advance => {
                    step += 1;
                    prop_assert_eq!(t.advance_step(), step);
                }
                Op::Evict(n) => {
                    let stamp = t.version() + 1;
                    let st = t.evict(n);
                    prop_assert!(st.scanned <= n);
                    let gone: Vec<u64> = model.keys().copied().filter(|&k| !t.contains(k)).collect();
                    prop_assert_eq!(gone.len(), st.evicted);
                    for k in gone {
                        let r = model.remove(&k).unwrap();
                        prop_assert!(step - r.last_step > 2, "evicted a fresh row");
                        tombstones.push((k, stamp));
                    }
                }
                Op::Remove(k) => {
                    let k = key(k);
                    let stamp = t.version() + 1;
                    let existed = model.remove(&k).is_some();
                    prop_assert_eq!(t.remove(k), existed);
                    if existed {
                        tombstones.push((k, stamp));
                    }
                }
                Op::Delta(back) => {
                    let v = t.version().saturating_sub(back as u64);
                    let d = t.changed_since(v);
                    prop_assert_eq!(d.version, t.version());
                    let mut got: Vec<(u64, Vec<u32>)> = d.upserts().map(|(k, r)| (k, bits(r))).collect();
                    got.sort();
                    let mut want: Vec<(u64, Vec<u32>)> = model.iter()
                        .filter(|(_, r)| r.stamp > v).map(|(&k, r)| (k, bits(&r.row))).collect();
                    want.sort();
                    prop_assert_eq!(got, want);
                    let mut removed = d.removed.clone();
                    removed.sort();
                    let mut want_removed: Vec<u64> = tombstones.iter().filter(|&&(_, s)| s > v).map(|&(k, _)| k).collect();
                    want_removed.sort();
                    prop_assert_eq!(removed, want_removed);
                    prop_assert!(!d.removed_truncated);
                }
            }
            prop_assert_eq!(t.len(), model.len());
        }
        // Final full comparison.
        let mut rows = 0;
        t.for_each_row(|k, r, _| {
            rows += 1;
            assert_eq!(bits(r), bits(&model[&k].row));
        });
        prop_assert_eq!(rows, model.len());
    }
}
