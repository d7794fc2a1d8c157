//! Property tests of the file format: random rows round-trip bit-exactly through every
//! compression setting; random corruption or truncation never panics and is always caught.

mod common;

use std::sync::Arc;

use proptest::prelude::*;
use sparta_checkpoint::{
    inspect, restore_latest, CheckpointState, Checkpointer, Compression, InputPosition, LocalDir,
    RetentionPolicy, Storage, WriteOptions,
};
use sparta_table::{Optimizer, RowMeta, RowPrecision, Table, TableConfig};

fn config(dim: usize) -> TableConfig {
    TableConfig {
        name: "t".into(),
        dim,
        optimizer: Optimizer::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        shards: 2,
        ..TableConfig::default()
    }
}

type Row = (u64, Vec<u32>, (u32, u32, u32));

fn rows_strategy(stride: usize) -> impl Strategy<Value = Vec<Row>> {
    prop::collection::vec(
        (
            any::<u64>(),
            prop::collection::vec(any::<u32>(), stride),
            (any::<u32>(), any::<u32>(), 0u32..1),
        ),
        0..200,
    )
}

fn fill(rows: &[Row], dim: usize) -> Table {
    fill_at(rows, dim, RowPrecision::F32)
}

/// A table of weights stored at `precision` holding `rows` (weights rounded as a push rounds
/// them; non-finite ones as they come).
fn fill_at(rows: &[Row], dim: usize, precision: RowPrecision) -> Table {
    let t = Table::new(TableConfig {
        precision,
        ..config(dim)
    })
    .unwrap();
    for (k, bits, (s, v, c)) in rows {
        let floats: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let meta = RowMeta {
            last_step: (*s).min(u32::MAX - 2),
            version: *v,
            count: *c,
        };
        t.insert_raw(*k, &floats, meta).unwrap();
    }
    t
}

fn opts(chunk_rows: usize, codec: u8) -> WriteOptions {
    WriteOptions {
        chunk_rows,
        compression: if codec == 0 {
            Compression::None
        } else {
            Compression::Zstd {
                level: codec as i32 - 2,
            }
        },
        shuffle: codec % 2 == 1,
        threads: 2,
    }
}

fn write(dir: &std::path::Path, t: &Table, o: WriteOptions) -> Arc<LocalDir> {
    let storage = Arc::new(LocalDir::new(dir).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 }).with_options(o);
    ck.write_full(&CheckpointState {
        tables: vec![("t", t)],
        dense: None,
        step: 1,
        position: InputPosition::default(),
        job_config: "cfg",
    })
    .unwrap();
    storage
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_rows_round_trip(rows in rows_strategy(2 * 2 + 2 + 1), chunk in 1usize..64, codec in 0u8..5) {
        let t = fill(&rows, 2);
        let dir = tempfile::tempdir().unwrap();
        let storage = write(dir.path(), &t, opts(chunk, codec));
        let r = restore_latest(&*storage, common::make_table).unwrap().unwrap();
        common::assert_same(&common::snapshot(r.table("t").unwrap()), &common::snapshot(&t));
    }

    /// A compact table (f16, bf16, int8 weights of dims 1 to 5, odd ones too) comes back
    /// bit for bit: weights, optimizer state and metadata, through every compression setting.
    #[test]
    fn compact_tables_round_trip_bit_for_bit(
        dim in 1usize..6,
        code in 1u32..4,
        rows in rows_strategy(3 * 5 + 1).prop_map(|rs| rs.into_iter().take(60).collect::<Vec<_>>()),
        chunk in 1usize..64,
        codec in 0u8..5,
    ) {
        let precision = RowPrecision::from_code(code).unwrap();
        let stride = 3 * dim + 1; // Adam: weights, two moments, the step
        let rows: Vec<Row> = rows.into_iter().map(|(k, mut b, m)| { b.truncate(stride); (k, b, m) }).collect();
        let t = fill_at(&rows, dim, precision);
        let dir = tempfile::tempdir().unwrap();
        let storage = write(dir.path(), &t, opts(chunk, codec));
        let r = restore_latest(&*storage, common::make_table).unwrap().unwrap();
        let back = r.table("t").unwrap();
        prop_assert_eq!(back.config().precision, precision);
        common::assert_same(&common::snapshot(back), &common::snapshot(&t));
    }

    /// Corrupting or truncating any file of a checkpoint of a compact table is caught, never
    /// a panic.
    #[test]
    fn corruption_of_a_compact_table_is_caught_without_panics(
        code in 1u32..4,
        rows in rows_strategy(3 * 2 + 1),
        which in any::<prop::sample::Index>(),
        pos in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        truncate in any::<bool>(),
    ) {
        let t = fill_at(&rows, 2, RowPrecision::from_code(code).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let storage = write(dir.path(), &t, opts(16, 3));
        let files = storage.list("").unwrap();
        let f = which.get(&files);
        let path = dir.path().join(&f.name);
        let mut bytes = std::fs::read(&path).unwrap();
        if truncate {
            bytes.truncate(pos.index(bytes.len()));
        } else {
            let i = pos.index(bytes.len());
            bytes[i] ^= flip;
        }
        std::fs::write(&path, bytes).unwrap();
        let r = restore_latest(&*storage, common::make_table).unwrap();
        prop_assert!(r.is_none(), "corrupted {} restored", f.name);
    }

    #[test]
    fn random_corruption_is_caught_without_panics(
        rows in rows_strategy(2 * 2 + 2 + 1),
        which in any::<prop::sample::Index>(),
        pos in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        truncate in any::<bool>(),
    ) {
        let t = fill(&rows, 2);
        let dir = tempfile::tempdir().unwrap();
        let storage = write(dir.path(), &t, opts(16, 3));
        let files = storage.list("").unwrap();
        let f = which.get(&files);
        let path = dir.path().join(&f.name);
        let mut bytes = std::fs::read(&path).unwrap();
        if truncate {
            bytes.truncate(pos.index(bytes.len()));
        } else {
            let i = pos.index(bytes.len());
            bytes[i] ^= flip;
        }
        std::fs::write(&path, bytes).unwrap();
        let r = restore_latest(&*storage, common::make_table).unwrap();
        prop_assert!(r.is_none(), "corrupted {} restored", f.name);
        let rep = inspect(&*storage).unwrap();
        prop_assert!(!rep.checkpoints[0].valid);
        prop_assert!(rep.checkpoints[0].reason.is_some());
    }
}
