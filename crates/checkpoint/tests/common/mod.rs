//! Helpers shared by the integration tests: a small train-like workload and table snapshots.

#![allow(dead_code)]

use std::collections::BTreeMap;

use sparta_table::{Eviction, Initializer, Optimizer, RowMeta, Table, TableConfig};

/// A small Adagrad table with idle-step eviction.
pub fn table_config(name: &str) -> TableConfig {
    TableConfig {
        name: name.to_string(),
        dim: 8,
        optimizer: Optimizer::Adagrad {
            lr: 0.05,
            initial_accumulator: 0.1,
            eps: 1e-8,
        },
        init: Initializer::Normal {
            mean: 0.0,
            std: 0.1,
        },
        seed: 7,
        shards: 4,
        eviction: Some(Eviction {
            max_idle_steps: Some(10),
            min_count: None,
            max_idle_seconds: None,
        }),
        ..TableConfig::default()
    }
}

/// Builds a fresh table for restore.
pub fn make_table(_name: &str, cfg: &TableConfig) -> Result<Table, sparta_table::TableError> {
    Table::new(cfg.clone())
}

/// Deterministic generator (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// `steps` train-like steps: pull a batch of skewed keys, push gradients for them, advance
/// the clock; every fourth step (of the table clock) evict idle rows and delete a few keys.
pub fn train(table: &Table, rng: &mut Rng, steps: usize) {
    train_where(table, rng, steps, |_| true)
}

/// [`train`] on the keys `keep` accepts only (a PS shard's keys).
pub fn train_where(table: &Table, rng: &mut Rng, steps: usize, keep: impl Fn(u64) -> bool) {
    let dim = table.dim();
    for _ in 0..steps {
        let mut keys: Vec<u64> = (0..128)
            .map(|_| {
                let r = rng.below(1000);
                // Skewed: a hot range plus a long tail, top byte used like a field id.
                let id = if r < 700 {
                    rng.below(300)
                } else {
                    rng.below(20_000)
                };
                (rng.below(3) << 56) | id
            })
            .filter(|&k| keep(k))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.is_empty() {
            continue;
        }
        let mut out = vec![0f32; keys.len() * dim];
        table.pull(&keys, &mut out);
        let grads: Vec<f32> = (0..keys.len() * dim).map(|_| rng.unit()).collect();
        table.push(&keys, &grads);
        if table.advance_step() % 4 == 3 {
            table.evict(usize::MAX);
            for _ in 0..5 {
                table.remove(keys[rng.below(keys.len() as u64) as usize]);
            }
        }
    }
}

/// Every row as float bits plus meta.
pub type Snapshot = BTreeMap<u64, (Vec<u32>, RowMeta)>;

/// Snapshot of all rows of a table.
pub fn snapshot(table: &Table) -> Snapshot {
    let mut m = BTreeMap::new();
    table.for_each_row(|k, row, meta| {
        m.insert(k, (row.iter().map(|f| f.to_bits()).collect(), meta));
    });
    m
}

/// Asserts two snapshots are identical, with a readable first difference.
pub fn assert_same(got: &Snapshot, want: &Snapshot) {
    assert_eq!(got.len(), want.len(), "row count differs");
    for (k, w) in want {
        match got.get(k) {
            None => panic!("key {k:#x} missing after restore"),
            Some(g) => assert_eq!(g, w, "row {k:#x} differs"),
        }
    }
}
