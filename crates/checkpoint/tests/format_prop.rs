//! Property tests of the file format: random rows round-trip bit-exactly through every
//! compression setting; random corruption or truncation never panics and is always caught.

mod common;

use std::sync::Arc;

use proptest::prelude::*;
use sparta_checkpoint::{
    inspect, restore_latest, CheckpointState, Checkpointer, Compression, InputPosition, LocalDir,
    RetentionPolicy, Storage, WriteOptions,
};
use sparta_table::{Optimizer, RowMeta, Table, TableConfig};

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
    let t = Table::new(config(dim)).unwrap();
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
