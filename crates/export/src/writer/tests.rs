//! Logical tables in exports: members and rows per tag in the table entries, summed over the
//! parts of a cluster export; exports without them still load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sparta_checkpoint::{LocalDir, Members, TableMember};
use sparta_table::{Table, TableConfig};

use crate::format::{read_manifest, read_version, ExportKind, LogicalTable};
use crate::writer::{Committer, ExportOptions, Plan, TableExporter};

/// A directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!(
            "sparta-export-{what}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        Scratch(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn key(tag: u8, i: u64) -> u64 {
    ((tag as u64) << 56) | i
}

/// A table with `a` rows of tag 0 and `b` rows of tag 5.
fn filled(a: u64, b: u64) -> Table {
    let t = Table::new(TableConfig {
        name: "embedding".into(),
        dim: 2,
        shards: 2,
        ..TableConfig::default()
    })
    .unwrap();
    let keys: Vec<u64> = (0..a)
        .map(|i| key(0, i))
        .chain((0..b).map(|i| key(5, i)))
        .collect();
    t.pull(&keys, &mut vec![0.0; keys.len() * 2]);
    t
}

fn members() -> Members {
    Members::from([(
        "embedding".to_string(),
        vec![
            TableMember {
                name: "user".into(),
                tag: 0,
                dim: 2,
            },
            TableMember {
                name: "item".into(),
                tag: 5,
                dim: 2,
            },
        ],
    )])
}

fn logical(name: &str, tag: u8, rows: u64) -> LogicalTable {
    LogicalTable {
        table: "embedding".into(),
        name: name.into(),
        tag,
        dim: 2,
        rows,
    }
}

#[test]
fn cluster_parts_carry_members_and_sum_rows_per_tag() {
    let dir = Scratch::new("parts");
    let opts = ExportOptions::default();
    let mut committer = Committer::open(dir.path(), opts).unwrap();
    let plan = committer.claim();
    let (t0, t1) = (filled(3, 4), filled(10, 1));
    let mut files = Vec::new();
    for (k, t) in [&t0, &t1].into_iter().enumerate() {
        let mut part = TableExporter::new(dir.path(), opts, Some(k as u32)).unwrap();
        part.set_members(members());
        let (_, f) = part.write(plan.version, &[("embedding", t)], None).unwrap();
        files.extend(f);
    }
    assert_eq!(files[0].tag_rows, BTreeMap::from([(0, 3), (5, 4)]));
    committer
        .commit(
            Plan { base: None, ..plan },
            ExportKind::Full,
            2,
            files,
            &[0.5],
            "job",
            1,
        )
        .unwrap();
    let storage = LocalDir::new(dir.path()).unwrap();
    let m = read_manifest(&storage, plan.version).unwrap();
    assert_eq!(
        m.logical_tables(),
        [logical("user", 0, 13), logical("item", 5, 5)]
    );
    assert_eq!(
        read_version(&storage, plan.version).unwrap().tables[0]
            .keys
            .len(),
        18
    );
}

#[test]
fn an_exporter_records_members_and_delta_rows_per_tag() {
    let dir = Scratch::new("delta");
    let opts = ExportOptions::default();
    let mut committer = Committer::open(dir.path(), opts).unwrap();
    let mut ex = TableExporter::new(dir.path(), opts, None).unwrap();
    ex.set_members(members());
    let t = filled(6, 2);
    let tables = [("embedding", &t)];
    let plan = committer.claim();
    let (kind, files) = ex.write(plan.version, &tables, None).unwrap();
    assert_eq!(kind, ExportKind::Full);
    committer
        .commit(plan, kind, 1, files, &[0.5], "job", 1)
        .unwrap();
    // Two new item rows and one changed user row: a delta of 3 rows.
    t.pull(&[key(5, 100), key(5, 101)], &mut [0.0; 4]);
    t.push(&[key(0, 1)], &[0.1, 0.1]);
    let plan = committer.claim();
    let (kind, files) = ex.write(plan.version, &tables, plan.base).unwrap();
    assert_eq!(kind, ExportKind::Delta);
    committer
        .commit(plan, kind, 1, files, &[0.5], "job", 2)
        .unwrap();
    let storage = LocalDir::new(dir.path()).unwrap();
    let full = read_manifest(&storage, plan.version - 1).unwrap();
    assert_eq!(
        full.logical_tables(),
        [logical("user", 0, 6), logical("item", 5, 2)]
    );
    let delta = read_manifest(&storage, plan.version).unwrap();
    assert_eq!(
        delta.logical_tables(),
        [logical("user", 0, 1), logical("item", 5, 2)]
    );
}

#[test]
fn exports_without_members_write_and_load_as_before() {
    let dir = Scratch::new("old");
    let opts = ExportOptions::default();
    let mut committer = Committer::open(dir.path(), opts).unwrap();
    let mut ex = TableExporter::new(dir.path(), opts, None).unwrap();
    let t = filled(2, 2);
    let plan = committer.claim();
    let (kind, files) = ex.write(plan.version, &[("embedding", &t)], None).unwrap();
    committer
        .commit(plan, kind, 1, files, &[0.5], "job", 1)
        .unwrap();
    let storage = LocalDir::new(dir.path()).unwrap();
    let m = read_manifest(&storage, plan.version).unwrap();
    assert!(m.logical_tables().is_empty());
    let json = serde_json::to_string(&m.tables[0]).unwrap();
    assert!(!json.contains("members"), "{json}");
    // A table entry as format 2 wrote it before logical tables.
    let old = r#"{"name":"embedding","dim":2,"rows":4,"removed":0,"table_version":1,
        "file":{"file":"table-embedding.rows","bytes":10,"checksum":7}}"#;
    let t: crate::TableFile = serde_json::from_str(old).unwrap();
    assert!(t.members.is_empty() && t.tag_rows.is_empty());
}

#[test]
fn an_export_of_a_checkpoint_keeps_its_members() {
    let (ckpt, out) = (Scratch::new("ckpt-in"), Scratch::new("ckpt-out"));
    let toml = "[embedding]\ndim = 2\n[model]\nhidden = [4]\n";
    let job = sparta_core::JobConfig::from_toml(toml)
        .unwrap()
        .validate()
        .unwrap();
    let model = sparta_nn::Model::new(job.model.clone()).unwrap();
    let t = filled(3, 5);
    let storage = std::sync::Arc::new(LocalDir::new(ckpt.path()).unwrap());
    let ck = sparta_checkpoint::Checkpointer::new(
        storage,
        sparta_checkpoint::RetentionPolicy { keep_full: 0 },
    )
    .with_members(members());
    ck.write_full(&sparta_checkpoint::CheckpointState {
        tables: vec![("embedding", &t)],
        dense: Some(sparta_checkpoint::DenseState::of(&model)),
        step: 3,
        position: Default::default(),
        job_config: toml,
    })
    .unwrap();
    let (info, _) =
        crate::writer::export_checkpoint(ckpt.path(), out.path(), ExportOptions::default())
            .unwrap();
    let m = read_manifest(&LocalDir::new(out.path()).unwrap(), info.version).unwrap();
    assert_eq!(
        m.logical_tables(),
        [logical("user", 0, 3), logical("item", 5, 5)]
    );
}

/// A second writer of the same part (a PS shard's backup copy, promoted) continues a chain
/// from the first writer's files: its next write is a delta holding only the rows changed
/// after them.
#[test]
fn a_writer_resumed_at_another_writers_files_writes_the_next_delta() {
    let dir = Scratch::new("resume");
    let opts = ExportOptions::default();
    let mut committer = Committer::open(dir.path(), opts).unwrap();
    let mut first = TableExporter::new(dir.path(), opts, None).unwrap();
    let t = filled(6, 2);
    let tables = [("embedding", &t)];
    let plan = committer.claim();
    let (kind, files) = first.write(plan.version, &tables, None).unwrap();
    assert_eq!(kind, ExportKind::Full);
    let v1 = plan.version;
    committer
        .commit(plan, kind, 1, files.clone(), &[0.5], "job", 1)
        .unwrap();
    let mut second = TableExporter::new(dir.path(), opts, None).unwrap();
    assert!(!second.can_delta(v1, &tables));
    second.resume_at(v1, &files);
    assert!(second.can_delta(v1, &tables));
    t.push(&[key(0, 1), key(5, 0)], &[0.1; 4]);
    let plan = committer.claim();
    assert_eq!(plan.base, Some(v1));
    let (kind, files) = second.write(plan.version, &tables, plan.base).unwrap();
    assert_eq!(kind, ExportKind::Delta);
    assert_eq!(files[0].rows, 2);
}

#[test]
fn object_urls_are_refused_where_an_export_directory_goes() {
    for url in ["s3://bucket/exports", "file:///tmp/exports", "S3://b/e"] {
        let e = Committer::open(Path::new(url), ExportOptions::default()).unwrap_err();
        assert!(
            matches!(&e, crate::ExportError::ObjectUrl(u) if u == url),
            "{url}: {e}"
        );
        let e = TableExporter::new(Path::new(url), ExportOptions::default(), None).unwrap_err();
        assert!(e.to_string().starts_with(url), "{e}");
    }
    assert!(crate::writer::local_dir(Path::new("exports/s3")).is_ok());
    assert!(crate::writer::local_dir(Path::new("/abs/dir")).is_ok());
}
