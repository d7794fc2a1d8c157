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

/// `key -> weights bits` of every row of `t` (decoded, as training's evaluation reads them).
fn table_weights(t: &Table) -> BTreeMap<u64, Vec<u32>> {
    let dim = t.dim();
    let mut m = BTreeMap::new();
    t.for_each_row(|k, row, _| {
        m.insert(k, row[..dim].iter().map(|x| x.to_bits()).collect());
    });
    m
}

/// `key -> weights bits` of a loaded table, decoded from its stored form.
fn export_weights(d: &crate::format::TableData) -> BTreeMap<u64, Vec<u32>> {
    let w = d.weights();
    d.keys
        .iter()
        .zip(w.chunks_exact(d.dim))
        .map(|(&k, r)| (k, r.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

/// A compact table (f16, bf16, int8; dim 3, odd) is exported in its stored form, whole and in
/// parts, full and delta: the decoded weights are the table's bit for bit, the manifest names
/// the dtype, and the rows take the stored bytes (2 a weight, or 1 + the scale). `fp16` on an
/// f32 table keeps its meaning (f16, rounded to nearest) and does not change a compact one.
#[test]
fn compact_tables_export_their_stored_values_bit_for_bit() {
    use sparta_table::RowPrecision;
    for (precision, fp16, dtype) in [
        (RowPrecision::F32, false, RowPrecision::F32),
        (RowPrecision::F32, true, RowPrecision::F16),
        (RowPrecision::F16, false, RowPrecision::F16),
        (RowPrecision::Bf16, false, RowPrecision::Bf16),
        (RowPrecision::Bf16, true, RowPrecision::Bf16),
        (RowPrecision::Int8, true, RowPrecision::Int8),
    ] {
        for part in [None, Some(1u32)] {
            let dir = Scratch::new("compact");
            let opts = ExportOptions {
                fp16,
                ..ExportOptions::default()
            };
            let mut committer = Committer::open(dir.path(), opts).unwrap();
            let mut ex = TableExporter::new(dir.path(), opts, part).unwrap();
            let t = Table::new(TableConfig {
                name: "embedding".into(),
                dim: 3,
                shards: 2,
                precision,
                ..TableConfig::default()
            })
            .unwrap();
            let keys: Vec<u64> = (0..50).map(|i| key((i % 3) as u8, i)).collect();
            t.pull(&keys, &mut vec![0.0; keys.len() * 3]);
            let grads: Vec<f32> = (0..keys.len() * 3)
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            t.push(&keys, &grads);
            let tables = [("embedding", &t)];
            let parts = if part.is_some() { 2 } else { 1 };
            let storage = LocalDir::new(dir.path()).unwrap();
            for round in 0..2 {
                if round == 1 {
                    t.push(&keys[..7], &grads[..21]);
                    t.remove(keys[9]);
                }
                let plan = committer.claim();
                let (kind, mut files) = ex.write(plan.version, &tables, plan.base).unwrap();
                assert_eq!(kind, [ExportKind::Full, ExportKind::Delta][round]);
                assert_eq!(files[0].dtype, Some(dtype));
                if let Some(p) = part {
                    // The other part: an empty table of the same precision.
                    let other = Table::new(t.config().clone()).unwrap();
                    let mut ex0 = TableExporter::new(dir.path(), opts, Some(1 - p)).unwrap();
                    let (_, f) = ex0
                        .write(plan.version, &[("embedding", &other)], None)
                        .unwrap();
                    files.extend(f);
                }
                committer
                    .commit(plan, kind, parts, files, &[0.5], "job", 1 + round as u64)
                    .unwrap();
                let v = read_version(&storage, plan.version).unwrap();
                let d = &v.tables[0];
                assert_eq!(d.dtype, dtype);
                let got = export_weights(d);
                let want = table_weights(&t);
                if fp16 && precision == RowPrecision::F32 {
                    // Rounded to nearest, as before.
                    for (k, w) in &got {
                        let r: Vec<u32> = want[k]
                            .iter()
                            .map(|&b| half::f16::from_f32(f32::from_bits(b)).to_f32().to_bits())
                            .collect();
                        assert_eq!(w, &r);
                    }
                } else if round == 0 {
                    assert_eq!(got, want, "{precision:?} part {part:?}");
                } else {
                    assert_eq!(d.removed, [keys[9]]);
                    assert_eq!(got.len(), 7);
                    for (k, w) in &got {
                        assert_eq!(w, &want[k], "{precision:?} delta");
                    }
                }
                assert_eq!(d.stored.len(), d.keys.len() * dtype.weight_bytes(3));
            }
        }
    }
}
