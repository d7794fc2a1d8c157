//! The SSD tier (`storage = { ram_rows, disk_dir }`): a table whose rows beyond a RAM budget
//! live in a local file is, to every reader and writer, the same table as the all-RAM one.
mod common;

use std::collections::BTreeMap;

use common::*;
use proptest::prelude::*;
use sparta_table::{Admission, Eviction, RowMeta, RowPrecision, Storage, Table, TableConfig};

fn config(opt_i: usize, precision: RowPrecision, admission: Admission) -> TableConfig {
    TableConfig {
        dim: 3,
        optimizer: all_optimizers()[opt_i].clone(),
        init: uniform(),
        seed: 11,
        shards: 4,
        admission,
        eviction: Some(Eviction {
            max_idle_steps: Some(6),
            ..Eviction::default()
        }),
        precision,
        ..TableConfig::default()
    }
}

fn tiered(cfg: &TableConfig, ram_rows: u64, dir: &std::path::Path) -> Table {
    Table::new(TableConfig {
        storage: Some(Storage {
            ram_rows: Some(ram_rows),
            ram_bytes: None,
            disk_dir: dir.to_path_buf(),
        }),
        ..cfg.clone()
    })
    .unwrap()
}

type Rows = BTreeMap<u64, (Vec<u32>, RowMeta)>;

fn rows(t: &Table) -> Rows {
    let mut m = BTreeMap::new();
    t.for_each_row(|k, row, meta| {
        m.insert(k, (bits(row), meta));
    });
    m
}

/// A copy row by row into a fresh table (a checkpoint restore).
fn restored(t: &Table, fresh: Table) -> Table {
    t.for_each_row(|k, row, meta| fresh.insert_raw(k, row, meta).unwrap());
    fresh.set_step(t.step());
    fresh.raise_version(t.version());
    fresh
}

#[derive(Clone, Debug)]
enum Op {
    Pull(Vec<u8>),
    Push(Vec<u8>, u64),
    Advance,
    Evict,
    Remove(u8),
    Checkpoint,
    Restore,
}

fn op() -> impl Strategy<Value = Op> {
    let keys = || proptest::collection::vec(any::<u8>(), 1..40);
    prop_oneof![
        4 => keys().prop_map(Op::Pull),
        4 => (keys(), any::<u64>()).prop_map(|(k, s)| Op::Push(k, s)),
        2 => Just(Op::Advance),
        1 => Just(Op::Evict),
        1 => any::<u8>().prop_map(Op::Remove),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Restore),
    ]
}

fn key(b: u8) -> u64 {
    ((b as u64 % 3) << 56) | (b as u64 * 7919)
}

fn grads(seed: u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = sparta_table::mix64(seed ^ i as u64);
            (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Under any sequence of pulls, pushes, clock steps, eviction scans, removals, incremental
    /// copies (deltas) and restores, a table keeping at most `ram_rows` rows in RAM holds the
    /// same rows (weights, optimizer state, metadata: bit for bit), reads the same weights and
    /// reports the same deltas as the all-RAM table, for every optimizer, f32 and bf16 rows,
    /// and with admission by count.
    #[test]
    fn a_tiered_table_is_the_all_ram_table(
        opt_i in 0usize..5,
        bf in any::<bool>(),
        by_count in any::<bool>(),
        ram_rows in 1u64..48,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let admission = if by_count { Admission::Count { min_count: 2 } } else { Admission::Always };
        let cfg = config(opt_i, if bf { RowPrecision::Bf16 } else { RowPrecision::F32 }, admission);
        let mut ram = Table::new(cfg.clone()).unwrap();
        let mut tier = tiered(&cfg, ram_rows, dir.path());
        let mut since = 0;
        for op in ops {
            match op {
                Op::Pull(ks) => {
                    let ks: Vec<u64> = ks.into_iter().map(key).collect();
                    let (mut a, mut b) = (vec![0f32; ks.len() * 3], vec![0f32; ks.len() * 3]);
                    ram.pull(&ks, &mut a);
                    tier.pull(&ks, &mut b);
                    prop_assert_eq!(bits(&a), bits(&b));
                }
                Op::Push(ks, seed) => {
                    let ks: Vec<u64> = ks.into_iter().map(key).collect();
                    let g = grads(seed, ks.len() * 3);
                    ram.push(&ks, &g);
                    tier.push(&ks, &g);
                }
                Op::Advance => {
                    ram.advance_step();
                    tier.advance_step();
                }
                Op::Evict => {
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    ram.evict_collect(usize::MAX, &mut a);
                    tier.evict_collect(usize::MAX, &mut b);
                    a.sort_unstable();
                    b.sort_unstable();
                    prop_assert_eq!(a, b);
                }
                Op::Remove(k) => {
                    prop_assert_eq!(ram.remove(key(k)), tier.remove(key(k)));
                }
                Op::Checkpoint => {
                    let (a, b) = (ram.changed_since(since), tier.changed_since(since));
                    let map = |d: &sparta_table::Delta| -> BTreeMap<u64, Vec<u32>> {
                        d.upserts().map(|(k, r)| (k, bits(r))).collect()
                    };
                    prop_assert_eq!(map(&a), map(&b));
                    let (mut ra, mut rb) = (a.removed.clone(), b.removed.clone());
                    ra.sort_unstable();
                    rb.sort_unstable();
                    prop_assert_eq!(ra, rb);
                    since = a.version;
                }
                Op::Restore => {
                    ram = restored(&ram, Table::new(cfg.clone()).unwrap());
                    tier = restored(&tier, tiered(&cfg, ram_rows, dir.path()));
                    since = 0;
                }
            }
            prop_assert_eq!(ram.len(), tier.len());
            let st = tier.stats();
            // The RAM budget holds after every operation.
            let ram_now = st.rows - st.cold_rows;
            prop_assert!(ram_now <= ram_rows as usize, "{} rows in RAM", ram_now);
        }
        prop_assert_eq!(rows(&ram), rows(&tier));
        let all: Vec<u64> = (0..=255u8).map(key).collect();
        let (mut a, mut b) = (vec![0f32; all.len() * 3], vec![0f32; all.len() * 3]);
        ram.pull_readonly(&all, &mut a);
        tier.pull_readonly(&all, &mut b);
        prop_assert_eq!(bits(&a), bits(&b));
        prop_assert_eq!(ram.rows_by_tag(), tier.rows_by_tag());
    }
}

/// Rows beyond the budget are on disk: RAM holds the budget, the file the rest, and each cold
/// row costs at most 18 bytes of RAM (its key in an array grown by a quarter: 8-10; an index
/// entry of 4-7 bytes; a live bit and a share of its block's summary) against its whole slot
/// in RAM (the table here is not sized for its rows: it grows).
#[test]
fn rows_beyond_the_budget_live_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TableConfig {
        dim: 16,
        shards: 4,
        ..TableConfig::default()
    };
    let t = tiered(&cfg, 10_000, dir.path());
    let all = Table::new(cfg).unwrap();
    for batch in 0..25u64 {
        let keys: Vec<u64> = (batch * 4000..(batch + 1) * 4000).collect();
        let mut out = vec![0f32; keys.len() * 16];
        t.pull(&keys, &mut out);
        all.pull(&keys, &mut out);
        t.advance_step();
        all.advance_step();
    }
    let st = t.stats();
    assert_eq!(st.rows, 100_000);
    assert_eq!(
        st.rows - st.cold_rows,
        10_000,
        "RAM rows: the budget exactly"
    );
    // Dim 16 with Adagrad: 2 stamps and 32 floats of 4 bytes per record.
    assert_eq!(st.disk_bytes, 90_000 * 136);
    let cold_per_row = st.cold_ram_bytes as f64 / st.cold_rows as f64;
    let ram_per_row = all.bytes() as f64 / 100_000.0;
    assert!(
        cold_per_row <= 18.0 && ram_per_row > 140.0,
        "RAM per cold row {cold_per_row:.1} B, per RAM row {ram_per_row:.1} B"
    );
    // Reads leave rows where they are.
    let mut out = vec![0f32; 2 * 16];
    t.pull_readonly(&[99_999, 0], &mut out);
    assert_eq!(t.stats().promoted, 0);
    // The least recently pulled rows went first: the last two batches' rows (pulled at this
    // step and the one before) are all in RAM, the first batch's are not.
    let last: Vec<u64> = (92_000..100_000).collect();
    t.pull(&last, &mut vec![0f32; last.len() * 16]);
    assert_eq!(t.stats().promoted, 0);
    let first: Vec<u64> = (0..4000).collect();
    t.pull(&first, &mut vec![0f32; first.len() * 16]);
    assert_eq!(t.stats().promoted, 4000);
}

/// A RAM budget in bytes holds the rows whose slots and index entries fit in it.
#[test]
fn a_budget_in_bytes_keeps_that_much_in_ram() {
    let dir = tempfile::tempdir().unwrap();
    let t = Table::new(TableConfig {
        dim: 16,
        shards: 4,
        storage: Some(Storage {
            ram_rows: None,
            ram_bytes: Some(1 << 20),
            disk_dir: dir.path().to_path_buf(),
        }),
        ..TableConfig::default()
    })
    .unwrap();
    let keys: Vec<u64> = (0..50_000).collect();
    t.pull(&keys, &mut vec![0f32; keys.len() * 16]);
    let st = t.stats();
    let in_ram = st.rows - st.cold_rows;
    // 144-byte slots (key, step, version, 32 floats) + 4.7 bytes of index: 7051 rows per MiB.
    assert_eq!(in_ram, 7051);
}

/// A storage section is checked when the table is made, naming what is wrong.
#[test]
fn storage_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let bad = |storage: Storage| {
        Table::new(TableConfig {
            name: "clicks".into(),
            storage: Some(storage),
            ..TableConfig::default()
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    let both = bad(Storage {
        ram_rows: Some(1),
        ram_bytes: Some(1),
        disk_dir: dir.path().into(),
    });
    assert!(
        both.contains("clicks") && both.contains("not both"),
        "{both}"
    );
    let none = bad(Storage {
        ram_rows: None,
        ram_bytes: None,
        disk_dir: dir.path().into(),
    });
    assert!(none.contains("ram_rows or ram_bytes"), "{none}");
    let missing = bad(Storage {
        ram_rows: Some(1),
        ram_bytes: None,
        disk_dir: dir.path().join("nope"),
    });
    assert!(
        missing.contains("disk_dir") && missing.contains("nope"),
        "{missing}"
    );
}
