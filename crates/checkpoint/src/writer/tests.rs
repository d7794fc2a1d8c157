//! Logical tables in checkpoints: members recorded per table, rows per tag per part, the
//! cluster path (shards' entries to the coordinator's manifest), restore and inspect.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sparta_table::{Table, TableConfig};

use crate::manifest::{CheckpointKind, Manifest, TableMember};
use crate::position::InputPosition;
use crate::state::CheckpointState;
use crate::storage::{LocalDir, Storage};
use crate::writer::{Checkpointer, RetentionPolicy};

fn member(name: &str, tag: u8, dim: usize) -> TableMember {
    TableMember {
        name: name.into(),
        tag,
        dim,
    }
}

fn key(tag: u8, i: u64) -> u64 {
    ((tag as u64) << 56) | i
}

/// A table with `n` rows of tag 1 and `2n` rows of tag 3.
fn filled(n: u64) -> Table {
    let t = Table::new(TableConfig {
        name: "embedding".into(),
        dim: 4,
        shards: 3,
        ..TableConfig::default()
    })
    .unwrap();
    let keys: Vec<u64> = (0..n)
        .map(|i| key(1, i))
        .chain((0..2 * n).map(|i| key(3, i)))
        .collect();
    let mut out = vec![0.0; keys.len() * 4];
    t.pull(&keys, &mut out);
    t
}

fn members() -> HashMap<String, Vec<TableMember>> {
    HashMap::from([(
        "embedding".to_string(),
        vec![member("user", 1, 4), member("item", 3, 4)],
    )])
}

fn state<'a>(tables: Vec<(&'a str, &'a Table)>) -> CheckpointState<'a> {
    CheckpointState {
        tables,
        dense: None,
        step: 1,
        position: InputPosition::default(),
        job_config: "job",
    }
}

fn make(_: &str, cfg: &TableConfig) -> Result<Table, sparta_table::TableError> {
    Table::new(cfg.clone())
}

#[test]
fn full_and_incremental_parts_record_members_and_rows_per_tag() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap());
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 })
        .with_members(members());
    let t = filled(10);
    // Close the version the fill's rows carry (as a push batch does).
    t.bump_version();
    let full = ck.write_full(&state(vec![("embedding", &t)])).unwrap();
    let m = Manifest::read(&*storage, full).unwrap();
    assert_eq!(m.tables[0].members, members()["embedding"]);
    assert_eq!(m.parts[0].tag_rows, BTreeMap::from([(1, 10), (3, 20)]));
    assert_eq!(t.rows_by_tag()[1..4], [10, 0, 20]);

    // Incremental: only the rows written (5 new rows of tag 3, one pushed row of tag 1).
    let new: Vec<u64> = (100..105).map(|i| key(3, i)).collect();
    t.pull(&new, &mut [0.0; 5 * 4]);
    t.push(&[key(1, 0)], &[0.1; 4]);
    let inc = ck
        .write_incremental(&state(vec![("embedding", &t)]))
        .unwrap();
    let m = Manifest::read(&*storage, inc).unwrap();
    assert_eq!(m.kind, CheckpointKind::Incremental);
    assert_eq!(m.tables[0].members, members()["embedding"]);
    assert_eq!(m.parts[0].tag_rows, BTreeMap::from([(1, 1), (3, 5)]));

    // Restore exposes the saved members and checks them against the job's.
    let r = crate::restore_latest(&*storage, make).unwrap().unwrap();
    assert_eq!(r.members("embedding"), &members()["embedding"][..]);
    assert!(r.members("wide").is_empty());
    r.check_members(&members()).unwrap();
    let mut bigger = members();
    bigger.get_mut("embedding").unwrap()[1].dim = 8;
    let e = r.check_members(&bigger).unwrap_err().to_string();
    assert_eq!(
        e,
        "table \"item\": the checkpoint holds dim 4, the job says dim 8"
    );
    let mut more = members();
    more.insert("wide".into(), vec![member("user", 1, 1)]);
    let e = r.check_members(&more).unwrap_err().to_string();
    assert!(
        e.contains("\"user\" (in wide)") && e.contains("not supported"),
        "{e}"
    );

    // Inspect: rows per logical table, for the incremental the full checkpoint's plus the
    // rows changed.
    let rep = crate::inspect(&*storage).unwrap();
    let rows = |i: usize| -> Vec<(String, Option<u64>, Option<u64>)> {
        rep.checkpoints[i]
            .logical_tables
            .iter()
            .map(|l| (l.name.clone(), l.rows, l.rows_changed))
            .collect()
    };
    assert_eq!(
        rows(0),
        [
            ("user".into(), Some(10), None),
            ("item".into(), Some(20), None)
        ]
    );
    assert_eq!(
        rows(1),
        [
            ("user".into(), Some(10), Some(1)),
            ("item".into(), Some(20), Some(5))
        ]
    );
    let text = rep.to_text();
    assert!(
        text.contains("logical table item in embedding (tag 3, dim 4): 20 rows\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "logical table item in embedding (tag 3, dim 4): 5 rows changed; 20 rows in its \
             full checkpoint ckpt-0000000000000001"
        ),
        "{text}"
    );
}

#[test]
fn a_checkpointer_without_members_writes_the_old_entries() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap());
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 });
    let t = filled(3);
    let id = ck.write_full(&state(vec![("embedding", &t)])).unwrap();
    let m = Manifest::read(&*storage, id).unwrap();
    assert!(m.tables[0].members.is_empty());
    let json = serde_json::to_string(&m.tables[0]).unwrap();
    assert!(!json.contains("members"), "{json}");
    // Old checkpoints (no members) pass any job's members.
    let r = crate::restore_latest(&*storage, make).unwrap().unwrap();
    r.check_members(&members()).unwrap();
    assert!(crate::inspect(&*storage).unwrap().checkpoints[0]
        .logical_tables
        .is_empty());
}

#[test]
fn cluster_shards_send_members_to_the_coordinators_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(LocalDir::new(dir.path()).unwrap());
    let policy = RetentionPolicy { keep_full: 0 };
    let coord = Checkpointer::new(storage.clone(), policy);
    let id = coord.begin(CheckpointKind::Full).unwrap().id();
    let (t0, t1) = (filled(4), filled(6));
    let mut answers = Vec::new();
    for (i, t) in [&t0, &t1].into_iter().enumerate() {
        let shard = Checkpointer::new(storage.clone(), policy);
        let p = shard.begin_at(id, CheckpointKind::Full, id, None).unwrap();
        p.set_members("embedding", members()["embedding"].clone());
        p.write_table(&format!("ps-{i}"), "embedding", t).unwrap();
        answers.push(p.into_parts());
    }
    assert_eq!(answers[0].1[0].members, members()["embedding"]);
    let pending = coord.begin_at(id, CheckpointKind::Full, id, None).unwrap();
    for (parts, tables) in &answers {
        for p in parts {
            pending.add_table_part(p.clone(), &tables[0]).unwrap();
        }
    }
    pending.commit(1, InputPosition::default(), "job").unwrap();
    let m = Manifest::read(&*storage, id).unwrap();
    assert_eq!(m.tables[0].members, members()["embedding"]);
    let rep = crate::inspect(&*storage).unwrap();
    let rows: Vec<_> = rep.checkpoints[0]
        .logical_tables
        .iter()
        .map(|l| (l.name.as_str(), l.rows))
        .collect();
    assert_eq!(rows, [("user", Some(10)), ("item", Some(20))]);

    // A part of another table is refused.
    let other = coord
        .begin_at(
            crate::CheckpointId(id.0 + 1),
            CheckpointKind::Full,
            crate::CheckpointId(id.0 + 1),
            None,
        )
        .unwrap();
    let mut wrong = answers[0].1[0].clone();
    wrong.name = "wide".into();
    assert!(other
        .add_table_part(answers[0].0[0].clone(), &wrong)
        .is_err());
}
