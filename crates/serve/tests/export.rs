//! Exports: full + deltas load back bit-for-bit, fp16 within tolerance, corrupt files are
//! detected, retention, min_count.

mod common;

use common::{assert_matches, batch_of, lines, Live};
use sparta_serve::format::{read_version, version_dir};
use sparta_serve::{ExportKind, ExportOptions, Exporter, ModelHandle, PollOutcome, Snapshot};

fn opts() -> ExportOptions {
    ExportOptions {
        sync: false,
        ..ExportOptions::default()
    }
}

fn keys(from: u64, n: u64) -> Vec<u64> {
    // Spread over fields (top byte) like real ids.
    (from..from + n)
        .map(|i| ((i % 26) << 56) | (i * 7919 + 1))
        .collect()
}

#[test]
fn full_then_deltas_load_back_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::new("wdl", "");
    live.touch(&keys(0, 3000));
    let mut ex = Exporter::open(dir.path(), opts()).unwrap();
    let full = ex
        .export(&live.text, &live.model, &live.tables(), 10)
        .unwrap();
    assert_eq!((full.version, full.kind), (1, ExportKind::Full));
    assert_eq!(full.rows, 6000);
    let handle = ModelHandle::open(dir.path()).unwrap();
    assert_matches(&handle.current().unwrap(), &live);

    for round in 0..3u64 {
        // Change 100 rows, create 50, remove 20 (from both tables).
        live.touch(&keys(round * 500, 100));
        live.touch(&keys(10_000 + round * 50, 50));
        let removed: Vec<u64> = keys(2000 + round * 20, 20);
        for &k in &removed {
            assert!(live.emb.remove(k));
            assert!(live.wide.as_ref().unwrap().remove(k));
        }
        let d = ex
            .export(&live.text, &live.model, &live.tables(), 20 + round)
            .unwrap();
        assert_eq!(d.kind, ExportKind::Delta);
        assert_eq!(d.version, 2 + round);
        assert_eq!(d.rows, 2 * 150, "changed rows only");
        assert_eq!(d.removed, 2 * 20);
        assert!(
            d.bytes * 5 < full.bytes,
            "delta {} vs full {}",
            d.bytes,
            full.bytes
        );
        assert_eq!(handle.poll().unwrap(), PollOutcome::Applied(d.version));
        let snap = handle.current().unwrap();
        assert_eq!(snap.version(), d.version);
        assert_eq!(snap.step(), 20 + round);
        assert_matches(&snap, &live);
        for &k in &removed {
            assert!(snap.tables().by_name("embedding").unwrap().get(k).is_none());
        }
    }
    // The spare copy took the deltas in place after the first one.
    assert!(
        handle.applied_in_place() >= 2,
        "{}",
        handle.applied_in_place()
    );
    assert_eq!(handle.poll().unwrap(), PollOutcome::Unchanged);
    // A fresh load of the chain gives the same state.
    let fresh = Snapshot::load_latest(dir.path()).unwrap();
    assert_eq!((fresh.version(), fresh.full_version()), (4, 1));
    assert_matches(&fresh, &live);
    // A new exporter on the same directory continues the numbering with a full export.
    let mut ex2 = Exporter::open(dir.path(), opts()).unwrap();
    let again = ex2
        .export(&live.text, &live.model, &live.tables(), 99)
        .unwrap();
    assert_eq!((again.version, again.kind), (5, ExportKind::Full));
    assert_eq!(handle.poll().unwrap(), PollOutcome::Reloaded(5));
    assert_matches(&handle.current().unwrap(), &live);
}

/// A compact embedding table (f16, bf16, int8) is exported in its stored form and served from
/// it: every row decodes to the table's weights bit for bit after the full export and after
/// each delta, the rows file is the compact size, and the scores are exactly those of the
/// same weights exported and served as f32 (what serving gave before compact exports).
#[test]
fn compact_tables_are_served_from_their_stored_rows_bit_for_bit() {
    for (precision, weight_bytes) in [("f16", 2), ("bf16", 2), ("int8", 1)] {
        let dir = tempfile::tempdir().unwrap();
        let mut live = Live::at_precision("wdl", precision);
        assert_eq!(live.emb.config().precision.name(), precision);
        live.touch(&keys(0, 2000));
        let mut ex = Exporter::open(dir.path(), opts()).unwrap();
        let full = ex
            .export(&live.text, &live.model, &live.tables(), 10)
            .unwrap();
        assert_eq!(full.kind, ExportKind::Full);
        let m = sparta_serve::format::read_manifest(
            &sparta_checkpoint::LocalDir::new(dir.path()).unwrap(),
            1,
        )
        .unwrap();
        let emb = m.tables.iter().find(|t| t.name == "embedding").unwrap();
        assert_eq!(emb.dtype.map(|d| d.name()), Some(precision));
        // 8-byte key + 4 weights (+ the int8 scale) a row, plus the envelope and header.
        let row = 8 + 4 * weight_bytes + if precision == "int8" { 4 } else { 0 };
        assert_eq!(emb.file.bytes, 16 + 24 + 24 + 2000 * row as u64);
        let handle = ModelHandle::open(dir.path()).unwrap();
        assert_matches(&handle.current().unwrap(), &live);
        for round in 0..2u64 {
            live.touch(&keys(round * 300, 100));
            live.touch(&keys(5000 + round * 50, 50));
            for k in keys(1500 + round * 10, 10) {
                assert!(live.emb.remove(k));
            }
            let d = ex
                .export(&live.text, &live.model, &live.tables(), 20 + round)
                .unwrap();
            assert_eq!(d.kind, ExportKind::Delta);
            assert_eq!(handle.poll().unwrap(), PollOutcome::Applied(d.version));
            assert_matches(&handle.current().unwrap(), &live);
        }
        let snap = handle.current().unwrap();
        assert_eq!(
            snap.tables().by_name("embedding").unwrap().dtype().name(),
            precision
        );

        // The same weights in an f32 table, exported and served as f32.
        let f32_dir = tempfile::tempdir().unwrap();
        let emb32 = sparta_table::Table::new(sparta_table::TableConfig {
            precision: sparta_table::RowPrecision::F32,
            ..live.emb.config().clone()
        })
        .unwrap();
        live.emb
            .for_each_row(|k, row, meta| emb32.insert_raw(k, row, meta).unwrap());
        let mut tables32 = live.tables();
        tables32[0] = ("embedding", &emb32);
        Exporter::open(f32_dir.path(), opts())
            .unwrap()
            .export(&live.text, &live.model, &tables32, 30)
            .unwrap();
        let snap32 = Snapshot::load_latest(f32_dir.path()).unwrap();
        assert_eq!(
            snap32.tables().by_name("embedding").unwrap().dtype(),
            sparta_table::RowPrecision::F32
        );
        let (batch, _) = batch_of(&lines(300, 4));
        let bits = |p: Vec<f32>| p.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(
            bits(snap.predict(batch.clone())),
            bits(snap32.predict(batch)),
            "{precision}"
        );
    }
}

#[test]
fn fp16_export_is_half_the_size_and_close() {
    let dir32 = tempfile::tempdir().unwrap();
    let dir16 = tempfile::tempdir().unwrap();
    let mut live = Live::new("deepfm", "");
    live.touch(&keys(0, 2000));
    let e32 = Exporter::open(dir32.path(), opts())
        .unwrap()
        .export(&live.text, &live.model, &live.tables(), 1)
        .unwrap();
    let e16 = Exporter::open(
        dir16.path(),
        ExportOptions {
            fp16: true,
            ..opts()
        },
    )
    .unwrap()
    .export(&live.text, &live.model, &live.tables(), 1)
    .unwrap();
    // Two bytes saved per weight: 2000 embedding rows of 4, 2000 wide rows of 1.
    let data = |e: &sparta_serve::ExportInfo| e.bytes - e.manifest_bytes;
    assert_eq!(data(&e32) - data(&e16), 2 * (2000 * 4 + 2000));
    let s32 = Snapshot::load_latest(dir32.path()).unwrap();
    let s16 = Snapshot::load_latest(dir16.path()).unwrap();
    s32.tables().by_name("embedding").unwrap().for_each(|k, w| {
        let h = s16.tables().by_name("embedding").unwrap().get(k).unwrap();
        for (a, b) in w.iter().zip(h) {
            assert!((a - b).abs() <= 1e-3 * a.abs().max(1e-2), "{a} vs {b}");
        }
    });
    let (batch, _) = batch_of(&lines(50, 3));
    let p32 = s32.predict(batch.clone());
    let p16 = s16.predict(batch);
    for (a, b) in p32.iter().zip(&p16) {
        assert!((a - b).abs() < 1e-3, "{a} vs {b}");
    }
}

#[test]
fn corrupt_or_truncated_files_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::new("dcn", "");
    live.touch(&keys(0, 500));
    let mut ex = Exporter::open(dir.path(), opts()).unwrap();
    ex.export(&live.text, &live.model, &live.tables(), 1)
        .unwrap();
    live.touch(&keys(0, 50));
    ex.export(&live.text, &live.model, &live.tables(), 2)
        .unwrap();
    let storage = sparta_checkpoint::LocalDir::new(dir.path()).unwrap();
    assert!(read_version(&storage, 2).is_ok());

    // Truncate the delta's rows file: reading it fails, loading stops at version 1.
    let rows = dir.path().join(version_dir(2)).join("table-embedding.rows");
    let bytes = std::fs::read(&rows).unwrap();
    std::fs::write(&rows, &bytes[..bytes.len() - 30]).unwrap();
    let e = read_version(&storage, 2).unwrap_err().to_string();
    assert!(e.contains("manifest says"), "{e}");
    assert_eq!(Snapshot::load_latest(dir.path()).unwrap().version(), 1);

    // Same length, one flipped byte: the checksum catches it.
    let mut flipped = bytes.clone();
    flipped[40] ^= 0x10;
    std::fs::write(&rows, &flipped).unwrap();
    let e = read_version(&storage, 2).unwrap_err().to_string();
    assert!(e.contains("checksum"), "{e}");

    // A corrupt full export and nothing older: no export to load.
    let full_rows = dir.path().join(version_dir(1)).join("table-embedding.rows");
    let mut b = std::fs::read(&full_rows).unwrap();
    b[100] ^= 1;
    std::fs::write(&full_rows, &b).unwrap();
    let e = Snapshot::load_latest(dir.path()).unwrap_err().to_string();
    assert!(e.contains("no valid export"), "{e}");
}

#[test]
fn full_every_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::new("wdl", "");
    let mut ex = Exporter::open(
        dir.path(),
        ExportOptions {
            full_every: 2,
            keep_full: 1,
            ..opts()
        },
    )
    .unwrap();
    let mut kinds = Vec::new();
    for i in 0..6 {
        live.touch(&keys(i * 10, 100));
        kinds.push(
            ex.export(&live.text, &live.model, &live.tables(), i)
                .unwrap()
                .kind,
        );
    }
    use ExportKind::{Delta, Full};
    assert_eq!(kinds, [Full, Delta, Delta, Full, Delta, Delta]);
    // Only the newest full (4) and its deltas are kept.
    assert_eq!(
        sparta_serve::export::list_versions(dir.path()).unwrap(),
        [4, 5, 6]
    );
    let snap = Snapshot::load_latest(dir.path()).unwrap();
    assert_eq!((snap.version(), snap.full_version()), (6, 4));
    assert_matches(&snap, &live);
}

#[test]
fn min_count_exports_only_rows_seen_often_enough() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::with_counts("wdl", "", true);
    live.touch(&keys(0, 100));
    live.touch(&keys(0, 40)); // pulled twice
    let mut ex = Exporter::open(
        dir.path(),
        ExportOptions {
            min_count: 2,
            ..opts()
        },
    )
    .unwrap();
    let full = ex
        .export(&live.text, &live.model, &live.tables(), 1)
        .unwrap();
    assert_eq!(full.rows, 2 * 40);
    live.touch(&keys(40, 10)); // now seen twice: enter the delta
    live.touch(&keys(200, 10)); // new, seen once: left out
    let d = ex
        .export(&live.text, &live.model, &live.tables(), 2)
        .unwrap();
    assert_eq!((d.kind, d.rows), (ExportKind::Delta, 2 * 10));
    let snap = Snapshot::load_latest(dir.path()).unwrap();
    assert_eq!(snap.tables().by_name("embedding").unwrap().len(), 50);
    for k in keys(0, 50) {
        assert!(snap.tables().by_name("embedding").unwrap().get(k).is_some());
    }

    // Tables without pull counts cannot filter by count.
    let plain = Live::new("wdl", "");
    let e = Exporter::open(
        tempfile::tempdir().unwrap().path(),
        ExportOptions {
            min_count: 2,
            ..opts()
        },
    )
    .unwrap()
    .export(&plain.text, &plain.model, &plain.tables(), 1)
    .unwrap_err()
    .to_string();
    assert!(e.contains("pull counts"), "{e}");
}

/// The shard parts of `live`'s tables: rows of each table split by `shard_of`, as PS shards
/// hold them.
fn split_by_shard(live: &Live, shards: usize) -> Vec<Vec<(String, sparta_table::Table)>> {
    (0..shards)
        .map(|s| {
            live.tables()
                .into_iter()
                .map(|(name, t)| {
                    let part = sparta_table::Table::new(t.config().clone()).unwrap();
                    t.for_each_row(|key, row, meta| {
                        if sparta_core::Routing::even(shards).shard_of(key) == s {
                            let meta = sparta_table::RowMeta { version: 0, ..meta };
                            part.insert_raw(key, row, meta).unwrap();
                        }
                    });
                    (name.to_string(), part)
                })
                .collect()
        })
        .collect()
}

#[test]
fn an_export_in_parts_loads_as_the_whole_tables() {
    use sparta_export::{Committer, TableExporter};
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::new("wdl", "");
    live.touch(&keys(0, 2000));
    let shards = split_by_shard(&live, 3);
    let mut parts: Vec<TableExporter> = (0..3)
        .map(|s| TableExporter::new(dir.path(), opts(), Some(s)).unwrap())
        .collect();
    let mut committer = Committer::open(dir.path(), opts()).unwrap();
    let plan = committer.claim();
    assert_eq!(plan.base, None, "the first version is full");
    let mut files = Vec::new();
    for (p, tables) in parts.iter_mut().zip(&shards) {
        let t: Vec<(&str, &sparta_table::Table)> =
            tables.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let (kind, f) = p.write(plan.version, &t, plan.base).unwrap();
        assert_eq!(kind, ExportKind::Full);
        files.extend(f);
    }
    let info = committer
        .commit(
            plan,
            ExportKind::Full,
            3,
            files,
            live.model.param_values(),
            &live.text,
            7,
        )
        .unwrap();
    assert_eq!(info.rows, 4000);
    let handle = ModelHandle::open(dir.path()).unwrap();
    assert_matches(&handle.current().unwrap(), &live);
    // A delta: the same gradients pushed to 50 rows of the whole tables and of the parts.
    for &k in &keys(100, 50) {
        let s = sparta_core::Routing::even(3).shard_of(k);
        for (name, t) in &shards[s] {
            let whole = if name == "embedding" {
                &live.emb
            } else {
                live.wide.as_ref().unwrap()
            };
            let g: Vec<f32> = (0..t.dim()).map(|i| 0.25 - i as f32 * 0.1).collect();
            t.push(&[k], &g);
            whole.push(&[k], &g);
        }
    }
    let plan = committer.claim();
    assert_eq!(plan.base, Some(info.version));
    let mut files = Vec::new();
    for (p, tables) in parts.iter_mut().zip(&shards) {
        let t: Vec<(&str, &sparta_table::Table)> =
            tables.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let (kind, f) = p.write(plan.version, &t, plan.base).unwrap();
        assert_eq!(kind, ExportKind::Delta);
        files.extend(f);
    }
    let d = committer
        .commit(
            plan,
            ExportKind::Delta,
            3,
            files,
            live.model.param_values(),
            &live.text,
            8,
        )
        .unwrap();
    assert_eq!(d.rows, 2 * 50, "changed rows only");
    assert_eq!(handle.poll().unwrap(), PollOutcome::Applied(d.version));
    assert_matches(&handle.current().unwrap(), &live);
    let m = read_version(
        &sparta_checkpoint::LocalDir::new(dir.path()).unwrap(),
        d.version,
    )
    .unwrap()
    .manifest;
    assert_eq!(m.parts, 3);
    assert_eq!(m.lineage, committer.lineage());
}

#[test]
fn a_reader_can_ask_for_the_next_version_to_be_full() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::new("wdl", "");
    live.touch(&keys(0, 500));
    let mut ex = Exporter::open(dir.path(), opts()).unwrap();
    let kinds = |ex: &mut Exporter, live: &mut Live, step| {
        live.touch(&keys(step * 10, 20));
        ex.export(&live.text, &live.model, &live.tables(), step)
            .unwrap()
            .kind
    };
    assert_eq!(kinds(&mut ex, &mut live, 1), ExportKind::Full);
    assert_eq!(kinds(&mut ex, &mut live, 2), ExportKind::Delta);
    let request = dir.path().join(sparta_export::FULL_REQUEST_FILE);
    std::fs::write(&request, b"").unwrap();
    assert_eq!(kinds(&mut ex, &mut live, 3), ExportKind::Full);
    assert!(!request.exists(), "the request is consumed");
    assert_eq!(kinds(&mut ex, &mut live, 4), ExportKind::Delta);
    let fresh = Snapshot::load_latest(dir.path()).unwrap();
    assert_eq!((fresh.version(), fresh.full_version()), (4, 3));
    assert_matches(&fresh, &live);
}
