//! Full + incremental checkpoints restore bit-identical tables; dense state round-trips.

mod common;

use std::sync::Arc;

use common::{assert_same, make_table, snapshot, table_config, train, Rng};
use sparta_checkpoint::{
    inspect, restore_latest, CheckpointKind, CheckpointState, Checkpointer, DenseState,
    InputPosition, LocalDir, RetentionPolicy, Storage,
};
use sparta_nn::optim::OptimizerState;
use sparta_table::Table;

fn state<'a>(tables: Vec<(&'a str, &'a Table)>, step: u64, job: &'a str) -> CheckpointState<'a> {
    CheckpointState {
        tables,
        dense: None,
        step,
        position: InputPosition {
            epoch: 1,
            file_index: 2,
            byte_offset: step * 100,
            rows_consumed: step * 256,
            file: format!("h{step:02}.tsv"),
            ..InputPosition::default()
        },
        job_config: job,
    }
}

#[test]
fn full_plus_three_incrementals_restore_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let emb = Table::new(table_config("emb")).unwrap();
    let wide = Table::new(sparta_table::TableConfig {
        dim: 1,
        ..table_config("wide")
    })
    .unwrap();
    let mut rng = Rng(1);
    train(&emb, &mut rng, 30);
    train(&wide, &mut rng, 30);
    let full = ck
        .write_full(&state(vec![("emb", &emb), ("wide", &wide)], 30, "job-a"))
        .unwrap();
    let mut ids = vec![full];
    for i in 0..3u64 {
        train(&emb, &mut rng, 3);
        train(&wide, &mut rng, 3);
        let id = ck
            .write_incremental(&state(
                vec![("emb", &emb), ("wide", &wide)],
                33 + 3 * i,
                "job-a",
            ))
            .unwrap();
        ids.push(id);
    }
    let report = inspect(&*storage).unwrap();
    assert_eq!(report.checkpoints.len(), 4);
    assert!(
        report.checkpoints.iter().all(|c| c.valid),
        "{}",
        report.to_text()
    );
    assert_eq!(report.checkpoints[0].kind, Some(CheckpointKind::Full));
    for c in &report.checkpoints[1..] {
        assert_eq!(c.kind, Some(CheckpointKind::Incremental));
        let t = c.tables.iter().find(|t| t.table == "emb").unwrap();
        assert!(
            t.rows * 2 < t.table_rows,
            "incremental holds {} rows of {}",
            t.rows,
            t.table_rows
        );
        assert!(t.removed > 0, "evictions and deletes are recorded");
    }

    let r = restore_latest(&*storage, make_table)
        .unwrap()
        .expect("a checkpoint");
    assert_eq!(r.id, ids[3]);
    assert_eq!(r.chain, ids);
    assert_eq!(r.step, 39);
    assert_eq!(r.position.byte_offset, 3900);
    assert_eq!(r.job_config, "job-a");
    assert!(r.dense.is_none());
    assert_same(&snapshot(r.table("emb").unwrap()), &snapshot(&emb));
    assert_same(&snapshot(r.table("wide").unwrap()), &snapshot(&wide));
    let back = r.table("emb").unwrap();
    assert_eq!(back.version(), emb.version());
    assert_eq!(back.step(), emb.step());

    // Resume the chain from the restored tables: training continues on them and the next
    // incremental extends the restored chain.
    let ck2 = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    ck2.resume(&r);
    let (emb2, wide2) = (r.table("emb").unwrap(), r.table("wide").unwrap());
    train(emb2, &mut rng, 5);
    let id = ck2
        .write_incremental(&state(vec![("emb", emb2), ("wide", wide2)], 41, "job-b"))
        .unwrap();
    let r2 = restore_latest(&*storage, make_table).unwrap().unwrap();
    assert_eq!(r2.id, id);
    assert_eq!(r2.chain.len(), 5);
    assert_same(&snapshot(r2.table("emb").unwrap()), &snapshot(emb2));
    assert_same(&snapshot(r2.table("wide").unwrap()), &snapshot(wide2));
}

#[test]
fn dense_state_round_trips_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 1 });
    let mut rng = Rng(9);
    let mut params: Vec<f32> = (0..1000).map(|_| rng.unit()).collect();
    params.extend([
        0.0,
        -0.0,
        f32::MIN_POSITIVE / 3.0,
        f32::MAX,
        f32::INFINITY,
        f32::from_bits(0x7fc0_1234),
    ]);
    let opt = OptimizerState {
        step: 12345,
        slot1: (0..params.len()).map(|_| rng.unit().abs()).collect(),
        slot2: (0..params.len()).map(|_| rng.unit()).collect(),
    };
    let t = Table::new(table_config("emb")).unwrap();
    train(&t, &mut rng, 2);
    let mut st = state(vec![("emb", &t)], 2, "");
    st.dense = Some(DenseState {
        params: &params,
        optimizer: &opt,
    });
    ck.write_full(&st).unwrap();
    let r = restore_latest(&*storage, make_table).unwrap().unwrap();
    let d = r.dense.expect("dense state");
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&d.params), bits(&params));
    assert_eq!(d.optimizer.step, opt.step);
    assert_eq!(bits(&d.optimizer.slot1), bits(&opt.slot1));
    assert_eq!(bits(&d.optimizer.slot2), bits(&opt.slot2));
    // The incremental carries the (small) dense state in full.
    train(&t, &mut rng, 2);
    let opt2 = OptimizerState {
        step: 99,
        ..opt.clone()
    };
    st.dense = Some(DenseState {
        params: &params[..10],
        optimizer: &opt2,
    });
    ck.write_incremental(&st).unwrap();
    let r = restore_latest(&*storage, make_table).unwrap().unwrap();
    assert_eq!(r.dense.unwrap().optimizer.step, 99);
    assert!(storage
        .list("")
        .unwrap()
        .iter()
        .any(|b| b.name.ends_with("dense.dense.bin")));
}

#[test]
fn several_writers_commit_one_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let shards: Vec<Table> = (0..3)
        .map(|_| Table::new(table_config("emb")).unwrap())
        .collect();
    let mut rng = Rng(3);
    for s in &shards {
        train(s, &mut rng, 4);
    }
    let pending = ck.begin(CheckpointKind::Full).unwrap();
    std::thread::scope(|sc| {
        for (i, s) in shards.iter().enumerate() {
            let p = &pending;
            sc.spawn(move || p.write_table(&format!("ps-{i}"), "emb", s).unwrap());
        }
    });
    pending.commit(4, InputPosition::default(), "job").unwrap();
    let r = restore_latest(&*storage, make_table).unwrap().unwrap();
    assert_eq!(r.tables.len(), 3);
    for (i, s) in shards.iter().enumerate() {
        let part = format!("ps-{i}");
        let t = r.tables.iter().find(|t| t.part == part).unwrap();
        assert_same(&snapshot(&t.table), &snapshot(s));
    }
}

#[test]
fn rows_only_pulled_since_the_last_checkpoint_keep_their_meta() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let emb = Table::new(table_config("emb")).unwrap();
    let mut rng = Rng(21);
    train(&emb, &mut rng, 5);
    ck.write_full(&state(vec![("emb", &emb)], 5, "")).unwrap();
    // Pulls without pushes move the rows' last_step (the eviction clock) only.
    let mut keys: Vec<u64> = snapshot(&emb).keys().copied().take(50).collect();
    keys.sort_unstable();
    emb.advance_step();
    emb.advance_step();
    let mut out = vec![0f32; keys.len() * emb.dim()];
    emb.pull(&keys, &mut out);
    ck.write_incremental(&state(vec![("emb", &emb)], 6, ""))
        .unwrap();
    let r = restore_latest(&*storage, make_table).unwrap().unwrap();
    assert_eq!(r.chain.len(), 2);
    assert_same(&snapshot(r.table("emb").unwrap()), &snapshot(&emb));
}

/// A compact table (f16, bf16, int8) with most rows in the SSD tier: a full and an
/// incremental checkpoint (weights in their stored form, cold rows included) restore it bit
/// for bit, RAM and cold rows alike.
#[test]
fn a_tiered_compact_table_restores_bit_identical() {
    for precision in [
        sparta_table::RowPrecision::F16,
        sparta_table::RowPrecision::Bf16,
        sparta_table::RowPrecision::Int8,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let disk = tempfile::tempdir().unwrap();
        let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
        let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
        let t = Table::new(sparta_table::TableConfig {
            precision,
            storage: Some(sparta_table::Storage {
                ram_rows: Some(200),
                ram_bytes: None,
                disk_dir: disk.path().to_path_buf(),
            }),
            ..table_config("emb")
        })
        .unwrap();
        let mut rng = Rng(11);
        train(&t, &mut rng, 30);
        assert!(t.stats().cold_rows > 100, "{:?}", t.stats());
        ck.write_full(&state(vec![("emb", &t)], 30, "job")).unwrap();
        train(&t, &mut rng, 10);
        let id = ck
            .write_incremental(&state(vec![("emb", &t)], 40, "job"))
            .unwrap();
        let r = restore_latest(&*storage, make_table).unwrap().unwrap();
        assert_eq!(r.id, id);
        let back = r.table("emb").unwrap();
        assert_eq!(back.config().precision, precision);
        assert_same(&snapshot(back), &snapshot(&t));
    }
}
