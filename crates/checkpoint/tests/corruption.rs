//! Truncated, corrupted and incomplete checkpoints are detected, reported and skipped; the
//! retention policy deletes exactly the old chains.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{assert_same, make_table, snapshot, table_config, train, Rng, Snapshot};
use sparta_checkpoint::{
    inspect, list_ids, restore_latest, CheckpointId, CheckpointState, Checkpointer, InputPosition,
    LocalDir, RetentionPolicy, Storage, MANIFEST_FILE,
};
use sparta_table::Table;

/// Writes full, incremental, incremental; returns the storage, ids and snapshots at each.
fn three_checkpoints(dir: &Path) -> (Arc<LocalDir>, Vec<CheckpointId>, Vec<Snapshot>) {
    let storage = Arc::new(LocalDir::new(dir).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let t = Table::new(table_config("emb")).unwrap();
    let mut rng = Rng(5);
    let (mut ids, mut snaps) = (Vec::new(), Vec::new());
    for i in 0..3 {
        train(&t, &mut rng, 8);
        let st = CheckpointState {
            tables: vec![("emb", &t)],
            dense: None,
            step: 8 * (i + 1),
            position: InputPosition::default(),
            job_config: "job",
        };
        ids.push(
            if i == 0 {
                ck.write_full(&st)
            } else {
                ck.write_incremental(&st)
            }
            .unwrap(),
        );
        snaps.push(snapshot(&t));
    }
    (storage, ids, snaps)
}

fn part_path(dir: &Path, id: CheckpointId) -> std::path::PathBuf {
    dir.join(id.file("table-emb.ps-0.rows"))
}

/// Restores, checks that `want` was chosen with the right contents and that `inspect`
/// marks `bad` invalid with a reason containing `reason`.
fn expect_fallback(
    storage: &LocalDir,
    want: usize,
    bad: CheckpointId,
    reason: &str,
    ids: &[CheckpointId],
    snaps: &[Snapshot],
) {
    let r = restore_latest(storage, make_table)
        .unwrap()
        .expect("an older valid checkpoint");
    assert_eq!(r.id, ids[want]);
    assert_same(&snapshot(r.table("emb").unwrap()), &snaps[want]);
    let rep = inspect(storage).unwrap();
    let c = rep.checkpoints.iter().find(|c| c.id == bad).unwrap();
    assert!(!c.valid);
    let why = c.reason.as_deref().unwrap();
    assert!(
        why.contains(reason),
        "reason `{why}` should mention `{reason}`"
    );
    assert_eq!(rep.restorable, Some(ids[want]));
    assert!(rep.to_text().contains("INVALID"));
}

#[test]
fn flipped_byte_is_detected_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, ids, snaps) = three_checkpoints(dir.path());
    let p = part_path(dir.path(), ids[2]);
    let mut bytes = std::fs::read(&p).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(&p, bytes).unwrap();
    expect_fallback(&storage, 1, ids[2], "table-emb.ps-0.rows", &ids, &snaps);
}

#[test]
fn truncated_file_is_detected_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, ids, snaps) = three_checkpoints(dir.path());
    let p = part_path(dir.path(), ids[2]);
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    expect_fallback(&storage, 1, ids[2], "truncated", &ids, &snaps);
}

#[test]
fn missing_manifest_is_detected_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, ids, snaps) = three_checkpoints(dir.path());
    std::fs::remove_file(dir.path().join(ids[2].file(MANIFEST_FILE))).unwrap();
    expect_fallback(&storage, 1, ids[2], "no manifest", &ids, &snaps);
}

#[test]
fn corrupt_middle_incremental_invalidates_the_rest_of_its_chain() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, ids, snaps) = three_checkpoints(dir.path());
    let p = part_path(dir.path(), ids[1]);
    let mut bytes = std::fs::read(&p).unwrap();
    let last = bytes.len() - 30;
    bytes[last] ^= 1;
    std::fs::write(&p, bytes).unwrap();
    expect_fallback(&storage, 0, ids[1], "corrupt checkpoint file", &ids, &snaps);
    let rep = inspect(&*storage).unwrap();
    let c = rep.checkpoints.iter().find(|c| c.id == ids[2]).unwrap();
    assert!(!c.valid && c.reason.as_deref().unwrap().contains(&ids[1].to_string()));
}

#[test]
fn corrupt_full_leaves_nothing_to_restore() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, ids, _) = three_checkpoints(dir.path());
    let p = dir.path().join(ids[0].file(MANIFEST_FILE));
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(&p, bytes).unwrap();
    assert!(restore_latest(&*storage, make_table).unwrap().is_none());
    let rep = inspect(&*storage).unwrap();
    assert!(rep.checkpoints.iter().all(|c| !c.valid));
    assert!(rep.restorable.is_none());
}

#[test]
fn retention_keeps_last_fulls_and_their_incrementals() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    std::fs::write(dir.path().join("notes.txt"), "not a checkpoint").unwrap();
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 2 });
    let t = Table::new(table_config("emb")).unwrap();
    let mut rng = Rng(11);
    let mut write = |full: bool| {
        train(&t, &mut rng, 3);
        let st = CheckpointState {
            tables: vec![("emb", &t)],
            dense: None,
            step: 0,
            position: InputPosition::default(),
            job_config: "",
        };
        if full {
            ck.write_full(&st)
        } else {
            ck.write_incremental(&st)
        }
        .unwrap()
        .0
    };
    // 1 F, 2 I, 3 I, 4 F, 5 I
    for full in [true, false, false, true, false] {
        write(full);
    }
    let ids = |s: &LocalDir| list_ids(s).unwrap().iter().map(|i| i.0).collect::<Vec<_>>();
    assert_eq!(
        ids(&storage),
        [1, 2, 3, 4, 5],
        "two fulls present: nothing deleted"
    );
    // An abandoned (manifest-less) checkpoint directory.
    storage
        .put(&CheckpointId(6).file("table-emb.ps-0.rows"), b"partial")
        .unwrap();
    assert_eq!(write(true), 7);
    assert_eq!(
        ids(&storage),
        [4, 5, 7],
        "chain of full 1 deleted, and the uncommitted 6 (older than the committed 7)"
    );
    assert!(!dir.path().join(CheckpointId(6).dir()).exists());
    assert_eq!(write(false), 8);
    assert_eq!(write(true), 9);
    assert_eq!(ids(&storage), [7, 8, 9], "chain of full 4 deleted");
    assert!(
        dir.path().join("notes.txt").exists(),
        "foreign files untouched"
    );
    assert!(
        !dir.path().join(CheckpointId(1).dir()).exists(),
        "empty directories removed"
    );
    let r = restore_latest(&*storage, make_table).unwrap().unwrap();
    assert_eq!(r.id, CheckpointId(9));
    assert_same(&snapshot(r.table("emb").unwrap()), &snapshot(&t));
}
