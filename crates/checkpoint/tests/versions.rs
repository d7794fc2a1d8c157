//! Format version 2: admission sketches travel with table parts; version-1 files still load;
//! coordinated (several-writer) checkpoints restore one part at a time.

mod common;

use std::sync::Arc;

use common::{assert_same, make_table, snapshot, table_config, train, train_where, Rng};
use sparta_checkpoint::format::{FOOTER_LEN, HEADER_LEN};
use sparta_checkpoint::{
    newest_valid, restore_at, restore_latest, restore_merged_at, CheckpointKind, CheckpointState,
    Checkpointer, ClusterState, InputPosition, LocalDir, Manifest, RetentionPolicy, Storage,
};
use sparta_table::{Admission, Table, TableConfig};

fn state<'a>(tables: Vec<(&'a str, &'a Table)>, step: u64) -> CheckpointState<'a> {
    CheckpointState {
        tables,
        dense: None,
        step,
        position: InputPosition::default(),
        job_config: "job",
    }
}

fn counting(min_count: u32) -> TableConfig {
    TableConfig {
        admission: Admission::Count { min_count },
        eviction: None,
        ..table_config("emb")
    }
}

#[test]
fn count_admission_remembers_sightings_across_a_restore() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let t = Table::new(counting(3)).unwrap();
    let keys: Vec<u64> = (1..=500).collect();
    let mut out = vec![0f32; keys.len() * t.dim()];
    // Two sightings each: below min_count 3, nothing admitted yet.
    t.pull(&keys, &mut out);
    t.pull(&keys, &mut out);
    assert_eq!(t.len(), 0);
    ck.write_full(&state(vec![("emb", &t)], 2)).unwrap();
    let r = restore_latest(&*storage, make_table).unwrap().unwrap();
    let back = r.table("emb").unwrap();
    assert_eq!(back.len(), 0);
    // The third sighting admits every key, as it does on the original table.
    back.pull(&keys, &mut out);
    t.pull(&keys, &mut out);
    assert_eq!(
        back.len(),
        keys.len(),
        "restored sketch forgot the sightings"
    );
    assert_same(&snapshot(back), &snapshot(&t));
    // A fresh table (no sketch) would need three more sightings.
    let fresh = Table::new(counting(3)).unwrap();
    fresh.pull(&keys, &mut out);
    assert_eq!(fresh.len(), 0);
}

#[test]
fn incremental_parts_carry_the_latest_sketch() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let t = Table::new(counting(2)).unwrap();
    let mut rng = Rng(3);
    train(&t, &mut rng, 5);
    ck.write_full(&state(vec![("emb", &t)], 5)).unwrap();
    let late: Vec<u64> = (1u64 << 50..(1u64 << 50) + 200).collect();
    let mut out = vec![0f32; late.len() * t.dim()];
    t.pull(&late, &mut out); // first sighting, after the full checkpoint
    let id = ck.write_incremental(&state(vec![("emb", &t)], 6)).unwrap();
    assert_eq!(
        Manifest::read(&*storage, id).unwrap().kind,
        CheckpointKind::Incremental
    );
    let r = restore_latest(&*storage, make_table).unwrap().unwrap();
    let back = r.table("emb").unwrap();
    let before = back.len();
    back.pull(&late, &mut out);
    assert_eq!(back.len(), before + late.len());
}

/// Rewrites a file as version 1 wrote it: the header's version 1, a table part's prelude
/// without the dim word of version 3 (an f32 table's records are as they were), the footer's
/// length and checksum to match; returns the new checksum and size.
fn downgrade(storage: &dyn Storage, name: &str) -> (u64, u64) {
    let mut bytes = storage.get(name).unwrap();
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    if name.ends_with(".rows") {
        // header | table name | part name | stride | precision (0: f32) | dim
        let mut at = HEADER_LEN as usize;
        for _ in 0..2 {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            at += 4 + len;
        }
        assert_eq!(&bytes[at + 4..at + 8], &0u32.to_le_bytes(), "an f32 table");
        bytes.drain(at + 8..at + 12);
        let payload = (bytes.len() as u64 - HEADER_LEN - FOOTER_LEN).to_le_bytes();
        let end = bytes.len() - FOOTER_LEN as usize;
        bytes[end..end + 8].copy_from_slice(&payload);
    }
    let end = bytes.len() - FOOTER_LEN as usize;
    let sum = xxhash_rust::xxh3::xxh3_64(&bytes[..end]);
    bytes[end + 8..end + 16].copy_from_slice(&sum.to_le_bytes());
    storage.put(name, &bytes).unwrap();
    (sum, bytes.len() as u64)
}

#[test]
fn version_1_files_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let t = Table::new(table_config("emb")).unwrap(); // admission `always`: no sketch records
    train(&t, &mut Rng(5), 10);
    let id = ck.write_full(&state(vec![("emb", &t)], 10)).unwrap();
    let mut m = Manifest::read(&*storage, id).unwrap();
    for p in &mut m.parts {
        let (sum, bytes) = downgrade(&*storage, &id.file(&p.file));
        p.checksum = format!("{sum:016x}");
        p.bytes = bytes;
    }
    m.format_version = 1;
    let mut json = serde_json::to_value(&m).unwrap();
    json.as_object_mut().unwrap().remove("cluster");
    let payload = serde_json::to_vec(&json).unwrap();
    // A version-1 manifest: header version 1, no cluster section.
    let mut file = Vec::new();
    file.extend_from_slice(b"SPARTACK");
    file.extend_from_slice(&1u32.to_le_bytes());
    file.extend_from_slice(&3u32.to_le_bytes());
    file.extend_from_slice(&payload);
    let sum = xxhash_rust::xxh3::xxh3_64(&file);
    file.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    file.extend_from_slice(&sum.to_le_bytes());
    file.extend_from_slice(b"SPCKEND\0");
    assert_eq!(
        file.len() as u64,
        HEADER_LEN + payload.len() as u64 + FOOTER_LEN
    );
    storage.put(&id.file("manifest.ckpt"), &file).unwrap();
    let r = restore_latest(&*storage, make_table).unwrap().unwrap();
    assert_eq!(r.id, id);
    assert!(r.manifest.cluster.is_none());
    assert_same(&snapshot(r.table("emb").unwrap()), &snapshot(&t));
}

/// One checkpoint of a 2-shard cluster: `coord` begins it (full at round 0, incremental
/// after), each shard `(checkpointer, table)` runs `before(shard, table)` then writes its part
/// `ps-<i>`, and `coord` commits the manifest.
fn coordinated_round(
    coord: &Checkpointer,
    shards: &[(Checkpointer, Table)],
    round: u64,
    mut before: impl FnMut(usize, &Table),
) -> sparta_checkpoint::CheckpointId {
    let kind = if round == 0 {
        CheckpointKind::Full
    } else {
        CheckpointKind::Incremental
    };
    let pending = coord.begin(kind).unwrap();
    for (i, (ck, t)) in shards.iter().enumerate() {
        before(i, t);
        let p = ck
            .begin_at(pending.id(), kind, pending.base(), pending.prev())
            .unwrap();
        p.write_table(&format!("ps-{i}"), "emb", t).unwrap();
        let (parts, tables) = p.into_parts();
        for e in parts {
            pending.add_part(e, Some(&tables[0].config)).unwrap();
        }
    }
    let cluster = ClusterState {
        num_shards: 2,
        ..ClusterState::default()
    };
    pending
        .commit_with(round, InputPosition::default(), "job", Some(cluster))
        .unwrap()
}

#[test]
fn each_writer_restores_only_its_part_of_a_coordinated_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    // Two "shards" with their own checkpointers, one coordinator.
    let shards: Vec<(Checkpointer, Table)> = (0..2)
        .map(|i| {
            let t = Table::new(counting(2)).unwrap();
            train(&t, &mut Rng(10 + i), 6);
            (
                Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 }),
                t,
            )
        })
        .collect();
    let coord = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let mut last = None;
    for round in 0..3 {
        last = Some(coordinated_round(&coord, &shards, round, |_, t| {
            train(t, &mut Rng(100 + round), 2)
        }));
    }
    let id = newest_valid(&*storage).unwrap().unwrap();
    assert_eq!(Some(id), last);
    for (i, (_, t)) in shards.iter().enumerate() {
        let part = format!("ps-{i}");
        let r = restore_at(&*storage, id, &|p| p.part == part, make_table).unwrap();
        assert_eq!(r.tables.len(), 1);
        assert_eq!(r.tables[0].part, part);
        assert_same(&snapshot(&r.tables[0].table), &snapshot(t));
        assert_eq!(r.manifest.cluster.as_ref().unwrap().num_shards, 2);
    }
    // A shard whose chain does not end where the coordinator's does must write a full part.
    let pending = coord.begin(CheckpointKind::Incremental).unwrap();
    let stranger = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    assert!(stranger
        .begin_at(
            pending.id(),
            CheckpointKind::Incremental,
            pending.base(),
            pending.prev()
        )
        .is_err());
}

/// What a PS shard of another layout reads: the kept keys of every part read, folded into
/// one table per name through an incremental chain, with the parts' sketches merged.
#[test]
fn a_merged_restore_holds_the_kept_keys_of_every_part_and_their_sightings() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    // Two shards owning the even and the odd keys, admitting a key at its second sighting.
    let shards: Vec<(Checkpointer, Table)> = (0..2u64)
        .map(|_| {
            (
                Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 }),
                Table::new(counting(2)).unwrap(),
            )
        })
        .collect();
    let coord = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    // Keys each shard sees once (not admitted) before the last checkpoint.
    let once: Vec<u64> = (0..2u64).map(|i| 0x00ab_cdef_0000_0000 | (4 + i)).collect();
    let mut id = None;
    for round in 0..4u64 {
        id = Some(coordinated_round(&coord, &shards, round, |i, t| {
            train_where(t, &mut Rng(100 * round + i as u64), 6, |k| {
                k % 2 == i as u64
            });
            if round == 3 {
                let before = t.len();
                t.pull(&once[i..=i], &mut vec![0f32; t.dim()]);
                assert_eq!(t.len(), before, "admitted at the first sighting");
            }
        }));
    }
    let kept = |k: u64| !k.is_multiple_of(3);
    assert!(once.iter().all(|&k| kept(k)));
    let r =
        restore_merged_at(&*storage, id.unwrap(), &|_| true, &kept, "ps-9", make_table).unwrap();
    assert_eq!(r.tables.len(), 1);
    assert_eq!(r.tables[0].part, "ps-9");
    let merged = &r.tables[0].table;
    let want = Table::new(counting(2)).unwrap();
    for (_, t) in &shards {
        t.for_each_row(|k, row, meta| {
            if kept(k) {
                want.insert_raw(k, row, meta).unwrap();
            }
        });
    }
    assert!(want.len() > 100, "{}", want.len());
    assert_same(&snapshot(merged), &snapshot(&want));
    assert_eq!(
        merged.version(),
        shards.iter().map(|(_, t)| t.version()).max().unwrap()
    );
    // Both keys seen once on their old shards are admitted at their next sighting: each old
    // shard's sketch travelled into the merged one.
    let before = merged.len();
    merged.pull(&once, &mut vec![0f32; 2 * merged.dim()]);
    assert_eq!(
        merged.len(),
        before + 2,
        "the merged sketch forgot a sighting"
    );
}

#[test]
fn newest_valid_skips_a_checkpoint_with_a_truncated_part() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let t = Table::new(table_config("emb")).unwrap();
    train(&t, &mut Rng(1), 4);
    let a = ck.write_full(&state(vec![("emb", &t)], 4)).unwrap();
    train(&t, &mut Rng(2), 4);
    let b = ck.write_full(&state(vec![("emb", &t)], 8)).unwrap();
    assert_eq!(newest_valid(&*storage).unwrap(), Some(b));
    let name = b.file("table-emb.ps-0.rows");
    let bytes = storage.get(&name).unwrap();
    storage.put(&name, &bytes[..bytes.len() - 10]).unwrap();
    assert_eq!(newest_valid(&*storage).unwrap(), Some(a));
    let err = restore_at(&*storage, b, &|_| true, make_table).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
}
