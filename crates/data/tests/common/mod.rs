//! Helpers shared by the file-level tests.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use sparta_data::{Batch, ReaderConfig, Schema};

/// A real data sample from the shared folder, or `None` (with a note) when absent.
pub fn shared_sample(rel: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data")
        .join(rel);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("note: {} absent, skipping", p.display());
        None
    }
}

pub fn config(schema: Schema, batch_size: usize, threads: usize) -> ReaderConfig {
    ReaderConfig {
        batch_size,
        threads,
        queue_batches: 2 * threads + 2,
        ..ReaderConfig::new(schema)
    }
}

/// One row as comparable data: (first label, dense bits, ids).
pub type Row = (u32, Vec<u32>, Vec<u64>);

pub fn rows(batches: &[Batch]) -> Vec<Row> {
    let mut out = Vec::new();
    for b in batches {
        b.check_tags(&b.legacy_tags()).unwrap();
        for r in 0..b.rows {
            let ids = (0..b.num_fields)
                .flat_map(|f| b.ids_of(r, f).to_vec())
                .collect();
            let dense = b.dense_row(r).iter().map(|x| x.to_bits()).collect();
            out.push((b.labels_of(r)[0].to_bits(), dense, ids));
        }
    }
    out
}

pub fn sorted(mut v: Vec<Row>) -> Vec<Row> {
    v.sort();
    v
}

pub fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// A valid Criteo line with the given label and a value derived from `i`.
pub fn criteo_line(label: u8, i: usize) -> String {
    let mut cols = vec![label.to_string()];
    cols.extend((0..13).map(|j| {
        if (i + j) % 5 == 0 {
            String::new()
        } else {
            ((i * 7 + j) % 100).to_string()
        }
    }));
    cols.extend((0..26).map(|j| {
        if (i + j) % 7 == 0 {
            String::new()
        } else {
            format!("{:08x}", i * 31 + j)
        }
    }));
    cols.join("\t")
}

pub fn criteo_text(n: usize) -> String {
    (0..n)
        .map(|i| criteo_line((i % 4 == 0) as u8, i) + "\n")
        .collect()
}
