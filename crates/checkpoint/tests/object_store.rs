//! The object-store backend (`ObjectStorage`) on `object_store`'s in-memory store and on its
//! local file system (`file://` through `open_storage`): checkpoint chains, corruption
//! fallback, retention, atomic writes, list/delete semantics, names.
//!
//! Run with `cargo test -p sparta-checkpoint --features object-store`.

#![cfg(feature = "object-store")]

mod common;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use common::{assert_same, make_table, snapshot, table_config, train, Rng, Snapshot};
use sparta_checkpoint::object_store::local::LocalFileSystem;
use sparta_checkpoint::object_store::memory::InMemory;
use sparta_checkpoint::object_store::ObjectStore;
use sparta_checkpoint::{
    inspect, list_ids, newest_valid, open_storage, restore_latest, BlobInfo, CheckpointError,
    CheckpointId, CheckpointKind, CheckpointState, Checkpointer, DenseState, InputPosition,
    ObjectStorage, RetentionPolicy, Storage,
};
use sparta_nn::optim::OptimizerState;
use sparta_table::Table;
use tempfile::TempDir;

/// A storage under test; `dir` keeps a `file://` root alive.
struct Backend {
    what: &'static str,
    storage: Arc<dyn Storage>,
    dir: Option<TempDir>,
}

fn memory() -> Backend {
    let store = Arc::new(InMemory::new());
    Backend {
        what: "memory",
        storage: Arc::new(ObjectStorage::new(store, "jobs/run-1").unwrap()),
        dir: None,
    }
}

fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.join("ckpt").display())
}

fn local_fs() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    Backend {
        what: "file://",
        storage: open_storage(&file_url(dir.path())).unwrap(),
        dir: Some(dir),
    }
}

fn backends() -> [Backend; 2] {
    [memory(), local_fs()]
}

fn state<'a>(tables: Vec<(&'a str, &'a Table)>, step: u64) -> CheckpointState<'a> {
    CheckpointState {
        tables,
        dense: None,
        step,
        position: InputPosition {
            epoch: 0,
            file_index: 1,
            byte_offset: step * 10,
            rows_consumed: step * 64,
            file: format!("part-{step}.tsv"),
            ..InputPosition::default()
        },
        job_config: "[job]",
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn full_plus_three_incrementals_restore_bit_identical() {
    for b in backends() {
        let ck = Checkpointer::new(b.storage.clone(), RetentionPolicy { keep_full: 0 });
        let emb = Table::new(table_config("emb")).unwrap();
        let wide = Table::new(sparta_table::TableConfig {
            dim: 1,
            ..table_config("wide")
        })
        .unwrap();
        let mut rng = Rng(17);
        let params: Vec<f32> = (0..500).map(|_| rng.unit()).collect();
        let mut opt = OptimizerState {
            step: 1,
            slot1: (0..500).map(|_| rng.unit().abs()).collect(),
            slot2: (0..500).map(|_| rng.unit()).collect(),
        };
        train(&emb, &mut rng, 20);
        train(&wide, &mut rng, 20);
        let mut ids = Vec::new();
        for i in 0..4u64 {
            if i > 0 {
                train(&emb, &mut rng, 3);
                train(&wide, &mut rng, 3);
                opt.step += 1;
            }
            let mut st = state(vec![("emb", &emb), ("wide", &wide)], 20 + 3 * i);
            st.dense = Some(DenseState {
                params: &params,
                optimizer: &opt,
            });
            ids.push(if i == 0 {
                ck.write_full(&st).unwrap()
            } else {
                ck.write_incremental(&st).unwrap()
            });
        }
        let report = inspect(&*b.storage).unwrap();
        assert_eq!(report.checkpoints.len(), 4, "{}", b.what);
        assert!(
            report.checkpoints.iter().all(|c| c.valid),
            "{}",
            report.to_text()
        );
        assert_eq!(report.checkpoints[0].kind, Some(CheckpointKind::Full));
        assert_eq!(report.location, b.storage.location());

        let check = |storage: &dyn Storage| {
            let r = restore_latest(storage, make_table)
                .unwrap()
                .expect("a checkpoint");
            assert_eq!(r.id, ids[3], "{}", b.what);
            assert_eq!(r.chain, ids);
            assert_eq!(r.step, 29);
            assert_eq!(r.position.file, "part-29.tsv");
            assert_same(&snapshot(r.table("emb").unwrap()), &snapshot(&emb));
            assert_same(&snapshot(r.table("wide").unwrap()), &snapshot(&wide));
            let d = r.dense.expect("dense state");
            assert_eq!(bits(&d.params), bits(&params));
            assert_eq!(d.optimizer.step, opt.step);
            assert_eq!(bits(&d.optimizer.slot1), bits(&opt.slot1));
            assert_eq!(bits(&d.optimizer.slot2), bits(&opt.slot2));
        };
        check(&*b.storage);
        if let Some(dir) = &b.dir {
            // Another process opening the same location sees the same checkpoints.
            check(&*open_storage(&file_url(dir.path())).unwrap());
        }
    }
}

/// Full + incremental + incremental; returns the ids and the table snapshot at each.
fn three_checkpoints(storage: &Arc<dyn Storage>) -> (Vec<CheckpointId>, Vec<Snapshot>) {
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let t = Table::new(table_config("emb")).unwrap();
    let mut rng = Rng(5);
    let (mut ids, mut snaps) = (Vec::new(), Vec::new());
    for i in 0..3 {
        train(&t, &mut rng, 8);
        let st = state(vec![("emb", &t)], 8 * (i + 1));
        ids.push(if i == 0 {
            ck.write_full(&st).unwrap()
        } else {
            ck.write_incremental(&st).unwrap()
        });
        snaps.push(snapshot(&t));
    }
    (ids, snaps)
}

/// Damages the newest checkpoint's table part with `damage`, then checks that the previous
/// checkpoint is chosen and `inspect` names the reason.
fn expect_fallback_after(damage: impl Fn(&mut Vec<u8>), reason: &str) {
    for b in backends() {
        let (ids, snaps) = three_checkpoints(&b.storage);
        let part = ids[2].file("table-emb.ps-0.rows");
        let mut bytes = b.storage.get(&part).unwrap();
        damage(&mut bytes);
        b.storage.put(&part, &bytes).unwrap();

        assert_eq!(
            newest_valid(&*b.storage).unwrap(),
            Some(ids[1]),
            "{}",
            b.what
        );
        let r = restore_latest(&*b.storage, make_table).unwrap().unwrap();
        assert_eq!(r.id, ids[1]);
        assert_same(&snapshot(r.table("emb").unwrap()), &snaps[1]);
        let rep = inspect(&*b.storage).unwrap();
        let c = rep.checkpoints.iter().find(|c| c.id == ids[2]).unwrap();
        assert!(!c.valid);
        let why = c.reason.as_deref().unwrap();
        assert!(why.contains(reason), "{}: `{why}` lacks `{reason}`", b.what);
        assert_eq!(rep.restorable, Some(ids[1]));
    }
}

#[test]
fn truncated_part_falls_back_to_the_previous_checkpoint() {
    expect_fallback_after(|b| b.truncate(b.len() - 100), "truncated");
}

#[test]
fn corrupted_part_falls_back_to_the_previous_checkpoint() {
    expect_fallback_after(
        |b| {
            let mid = b.len() / 2;
            b[mid] ^= 0x10;
        },
        "table-emb.ps-0.rows",
    );
}

#[test]
fn retention_deletes_old_chains() {
    for b in backends() {
        b.storage.put("notes.txt", b"not a checkpoint").unwrap();
        let ck = Checkpointer::new(b.storage.clone(), RetentionPolicy { keep_full: 2 });
        let t = Table::new(table_config("emb")).unwrap();
        let mut rng = Rng(11);
        let mut write = |full: bool| {
            train(&t, &mut rng, 3);
            let st = state(vec![("emb", &t)], 0);
            if full {
                ck.write_full(&st)
            } else {
                ck.write_incremental(&st)
            }
            .unwrap()
            .0
        };
        for full in [true, false, false, true, false] {
            write(full);
        }
        let ids = |s: &dyn Storage| list_ids(s).unwrap().iter().map(|i| i.0).collect::<Vec<_>>();
        assert_eq!(ids(&*b.storage), [1, 2, 3, 4, 5], "{}", b.what);
        assert_eq!(write(true), 6);
        assert_eq!(
            ids(&*b.storage),
            [4, 5, 6],
            "{}: chain of full 1 deleted",
            b.what
        );
        assert!(b.storage.list(&CheckpointId(1).dir()).unwrap().is_empty());
        assert_eq!(b.storage.get("notes.txt").unwrap(), b"not a checkpoint");
        if let Some(dir) = &b.dir {
            let gone = dir.path().join("ckpt").join(CheckpointId(2).dir());
            assert!(!gone.exists(), "empty directories removed");
        }
        let r = restore_latest(&*b.storage, make_table).unwrap().unwrap();
        assert_eq!(r.id, CheckpointId(6));
        assert_same(&snapshot(r.table("emb").unwrap()), &snapshot(&t));
    }
}

#[test]
fn uncommitted_leftovers_older_than_the_newest_commit_are_removed() {
    for b in backends() {
        let ck = Checkpointer::new(b.storage.clone(), RetentionPolicy { keep_full: 3 });
        let t = Table::new(table_config("emb")).unwrap();
        let mut rng = Rng(5);
        train(&t, &mut rng, 3);
        assert_eq!(ck.write_full(&state(vec![("emb", &t)], 1)).unwrap().0, 1);
        // A write interrupted before its commit: parts of checkpoint 2, no manifest. Kept
        // while it could still be a live writer's (nothing newer is committed).
        let leftover = CheckpointId(2).file("table-emb.ps-0.rows");
        b.storage.put(&leftover, b"partial").unwrap();
        b.storage
            .put(&CheckpointId(2).file("dense.worker-0.bin"), b"partial")
            .unwrap();
        ck.apply_retention().unwrap();
        assert_eq!(
            b.storage.list(&CheckpointId(2).dir()).unwrap().len(),
            2,
            "{}",
            b.what
        );
        // The next checkpoint commits (id 3): the leftovers of 2 go, the chain stays.
        train(&t, &mut rng, 3);
        assert_eq!(ck.write_full(&state(vec![("emb", &t)], 2)).unwrap().0, 3);
        let ids: Vec<u64> = list_ids(&*b.storage).unwrap().iter().map(|i| i.0).collect();
        assert_eq!(ids, [1, 3], "{}", b.what);
        assert!(b.storage.list(&CheckpointId(2).dir()).unwrap().is_empty());
        let r = restore_latest(&*b.storage, make_table).unwrap().unwrap();
        assert_eq!(r.id, CheckpointId(3));
    }
}

/// Every file under `dir`, relative, sorted (staging files included).
fn files_on_disk(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn unfinished_writes_leave_no_visible_blob() {
    // 11 MiB goes past the 10 MiB single-put buffer into a multipart upload.
    let big: Vec<u8> = (0..11u32 << 20).map(|i| (i * 7 + i / 4093) as u8).collect();
    for b in backends() {
        for data in [&b"half a blob"[..], &big] {
            let mut w = b.storage.create("a/blob.bin").unwrap();
            w.write_all(data).unwrap();
            drop(w);
            assert!(b.storage.list("").unwrap().is_empty(), "{}", b.what);
            assert!(matches!(
                b.storage.get("a/blob.bin"),
                Err(CheckpointError::NotFound(_))
            ));
            if let Some(dir) = &b.dir {
                assert_eq!(
                    files_on_disk(dir.path()),
                    Vec::<String>::new(),
                    "no staging files"
                );
            }
        }
        let mut w = b.storage.create("a/blob.bin").unwrap();
        for chunk in big.chunks(300_000) {
            w.write_all(chunk).unwrap();
        }
        w.finish().unwrap();
        let (mut r, size) = b.storage.open("a/blob.bin").unwrap();
        assert_eq!(size, big.len() as u64);
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut r, &mut back).unwrap();
        assert!(back == big, "{}: large blob round trip", b.what);
        // Replacing keeps the name, with the new contents.
        b.storage.put("a/blob.bin", b"small").unwrap();
        assert_eq!(b.storage.get("a/blob.bin").unwrap(), b"small");
    }
}

#[test]
fn list_and_delete_semantics() {
    for b in backends() {
        let s = &b.storage;
        for name in ["b/2", "a/1", "ab", "a/0/x", "c"] {
            s.put(name, name.as_bytes()).unwrap();
        }
        let names = |p: &str| {
            s.list(p)
                .unwrap()
                .into_iter()
                .map(|i| i.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(""), ["a/0/x", "a/1", "ab", "b/2", "c"], "{}", b.what);
        assert_eq!(names("a/"), ["a/0/x", "a/1"]);
        assert_eq!(names("a"), ["a/0/x", "a/1", "ab"]);
        assert!(names("zz").is_empty());
        assert_eq!(
            s.list("ab").unwrap(),
            [BlobInfo {
                name: "ab".into(),
                size: 2
            }]
        );
        s.delete("a/1").unwrap();
        s.delete("a/1").unwrap();
        s.delete("never/written").unwrap();
        assert_eq!(names("a"), ["a/0/x", "ab"]);
        assert!(matches!(s.get("a/1"), Err(CheckpointError::NotFound(_))));
        assert!(matches!(s.open("nope"), Err(CheckpointError::NotFound(_))));
    }
}

#[test]
fn prefixes_isolate_storages_on_one_store() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [Arc<dyn ObjectStore>; 2] = [
        Arc::new(InMemory::new()),
        Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap()),
    ];
    for store in stores {
        let a = ObjectStorage::new(store.clone(), "runs/a").unwrap();
        let a2 = ObjectStorage::new(store.clone(), "/runs/a/").unwrap();
        let ab = ObjectStorage::new(store.clone(), "runs/ab").unwrap();
        let root = ObjectStorage::new(store.clone(), "").unwrap();
        a.put("x/1", b"a").unwrap();
        ab.put("x/1", b"ab").unwrap();
        ab.put("y", b"ab").unwrap();
        assert_eq!(a.get("x/1").unwrap(), b"a");
        assert_eq!(ab.get("x/1").unwrap(), b"ab");
        assert_eq!(a.list("").unwrap().len(), 1, "{store}");
        assert_eq!(a2.get("x/1").unwrap(), b"a", "same prefix, same blobs");
        assert_eq!(ab.list("").unwrap().len(), 2);
        let all: Vec<_> = root.list("").unwrap().into_iter().map(|b| b.name).collect();
        assert_eq!(all, ["runs/a/x/1", "runs/ab/x/1", "runs/ab/y"]);
        a.delete("y").unwrap();
        assert_eq!(ab.get("y").unwrap(), b"ab", "delete stays in its prefix");
        for bad in ["../x", "a//b", "sp ace", "."] {
            assert!(ObjectStorage::new(store.clone(), bad).is_err(), "{bad:?}");
        }
    }
}

#[test]
fn invalid_names_are_refused() {
    for b in backends() {
        for bad in ["", "../x", "a//b", "/abs", "a/./b", "sp ace", "a/..", "x#1"] {
            let e = b.storage.put(bad, b"x").unwrap_err();
            assert!(
                matches!(e, CheckpointError::InvalidName(_)),
                "{}: {bad:?} -> {e}",
                b.what
            );
            assert!(b.storage.get(bad).is_err());
            assert!(b.storage.delete(bad).is_err());
        }
        assert!(b.storage.list("").unwrap().is_empty());
    }
}

#[test]
fn usable_and_droppable_inside_a_tokio_runtime() {
    // The PS calls storage from its tokio runtime (spawn_blocking) and may drop it there.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for b in backends() {
        rt.block_on(async move {
            b.storage.put("k", b"v").unwrap();
            assert_eq!(b.storage.get("k").unwrap(), b"v");
            let mut w = b.storage.create("unfinished").unwrap();
            w.write_all(b"x").unwrap();
            drop(w);
            assert_eq!(b.storage.list("").unwrap().len(), 1);
            drop(b);
        });
    }
}
