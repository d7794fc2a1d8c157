//! Export file readers (`read_manifest`, `read_dense`, `read_rows` through `read_version`):
//! a valid version is written to memory with the crate's writers, then one of its files is
//! replaced by the fuzz input (as a whole file, or as the payload of a well-formed envelope
//! with the manifest's size and checksum fixed to match, so the reader gets past them), and
//! the manifest's counts may be changed too. Reading gives an error or a consistent version,
//! never a panic or an allocation sized by an unchecked field.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparta_checkpoint::format::{write_small, FileKind};
use sparta_export::format::{
    blob, read_manifest, read_version, write_dense, write_manifest, FileEntry, RowsWriter,
    EXPORT_FORMAT, MANIFEST_FILE,
};
use sparta_export::{ExportKind, ExportManifest, TableFile};
use sparta_fuzz::{mutate, payload_of, Edit, MemStorage};
use sparta_table::RowPrecision;

const DIM: usize = 3;

/// A valid version 1: table `emb` (3 rows of `dtype`, 2 removed keys), 5 dense parameters.
fn valid(dtype: RowPrecision) -> (MemStorage, ExportManifest) {
    let s = MemStorage::default();
    let fp16 = dtype == RowPrecision::F16;
    let mut w = RowsWriter::new(&s, 1, "table-emb.rows", DIM, dtype, &[7, (1 << 56) | 9]).unwrap();
    for k in 0..3u64 {
        w.push((k << 56) | (k + 1), &[0.5, -1.0, k as f32]).unwrap();
    }
    let tag_rows = w.tag_rows();
    let (file, rows, removed) = w.finish().unwrap();
    let dense = write_dense(&s, 1, &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
    let m = ExportManifest {
        format: EXPORT_FORMAT,
        version: 1,
        kind: ExportKind::Delta,
        base: Some(0),
        full: 0,
        step: 10,
        created_unix_ms: 0,
        fp16,
        min_count: 0,
        job_config: "[job]".into(),
        dense_params: 5,
        dense,
        quality: None,
        tables: vec![TableFile {
            name: "emb".into(),
            dim: DIM,
            dtype: Some(dtype),
            rows,
            removed,
            table_version: 1,
            file,
            part: None,
            members: Vec::new(),
            tag_rows,
        }],
        parts: 0,
        lineage: 42,
    };
    write_manifest(&s, &m).unwrap();
    (s, m)
}

/// Changes file `name` of version 1 with the fuzz bytes (`pick`: which edit, whether the
/// payload is re-wrapped in a well-formed envelope); returns its new manifest entry.
fn change(s: &MemStorage, name: &str, kind: FileKind, pick: u8, fuzz: &[u8]) -> FileEntry {
    let full = blob(1, name);
    let original = s.bytes(&full).unwrap();
    let edit = Edit::from_bits(pick);
    let (bytes, checksum) = if pick & 4 == 0 {
        let b = mutate(&original, edit, fuzz);
        // The manifest trusts the checksum the footer claims.
        let sum = match b.len().checked_sub(16) {
            Some(at) if b.len() >= 24 => u64::from_le_bytes(b[at..at + 8].try_into().unwrap()),
            _ => 0,
        };
        let size = b.len() as u64;
        s.set(&full, b);
        (size, sum)
    } else {
        let payload = mutate(payload_of(&original), edit, fuzz);
        write_small(s, &full, kind, &payload).unwrap()
    };
    FileEntry {
        file: name.into(),
        bytes,
        checksum,
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (head, fuzz) = data.split_at(4);
    let (target, pick) = (head[0] % 4, head[0] >> 2);
    // f32, f16 (also what `fp16` meant before), bf16, int8 rows.
    let dtype = RowPrecision::from_code(u32::from(head[3] >> 6)).expect("codes 0..4");
    let (s, mut m) = valid(dtype);
    match target {
        0 => {
            // The manifest itself.
            change(&s, MANIFEST_FILE, FileKind::Manifest, pick, fuzz);
            let _ = read_manifest(&s, 1);
        }
        1 => {
            m.dense = change(&s, "dense.bin", FileKind::Dense, pick, fuzz);
            if head[1] & 1 == 1 {
                m.dense_params = u64::from(head[1] >> 1);
            }
        }
        _ => {
            let t = &mut m.tables[0];
            t.file = change(&s, "table-emb.rows", FileKind::TableRows, pick, fuzz);
            if target == 3 {
                // Counts that need not fit the file.
                t.dim = head[1] as usize % 9;
                t.rows = u64::from(head[2]);
                t.removed = u64::from(head[3] % 16);
            }
        }
    }
    if target != 0 {
        write_manifest(&s, &m).unwrap();
    }
    if let Ok(v) = read_version(&s, 1) {
        assert_eq!(v.dense.len() as u64, v.manifest.dense_params);
        for t in &v.tables {
            assert_eq!(
                t.keys.len() * t.row_bytes(),
                t.stored.len(),
                "table {}",
                t.name
            );
            assert_eq!(t.keys.len() * t.dim, t.weights().len(), "table {}", t.name);
            let f = v.manifest.tables.iter().find(|f| f.name == t.name).unwrap();
            assert_eq!(t.keys.len() as u64, f.rows);
            assert_eq!(t.removed.len() as u64, f.removed);
        }
    }
});
