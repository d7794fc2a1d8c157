//! The files of one export version, in the checkpoint crate's checksummed envelope
//! ([`sparta_checkpoint::format`]: magic header, payload, footer with length and xxh3).
//!
//! ```text
//! v0000000007/                    one directory per version
//!   table-<name>.rows             FileKind::TableRows, payload:
//!       "SPEXROWS" | dtype u32 | dim u32 | n_removed u64
//!       | removed keys [u64; n_removed] | records (key u64, weights) to the payload end
//!   dense.bin                     FileKind::Dense, payload: "SPEXDENS" | n u64 | [f32; n]
//!   manifest.json                 FileKind::Manifest, JSON [`ExportManifest`], written last
//! ```
//! All numbers little-endian. Rows hold weights only (no optimizer state, no row metadata),
//! in the form of the dtype ([`sparta_table::RowPrecision::code`], [`WeightBytes`]): 0 = f32
//! (`dim` f32), 1 = f16 (`dim` IEEE halves), 2 = bf16 (`dim` bfloat16), 3 = int8 (the row's
//! power-of-two scale f32, then `dim` signed bytes: weight = byte x scale). A compact table
//! (`precision = "f16" | "bf16" | "int8"`) is exported in its own stored form, its values as
//! they are; an f32 table in f32, or with `[export] fp16` in f16 rounded to nearest. The
//! manifest names each table file's dtype (layout 3; before it, `fp16` said f16 or f32).
//! A version is visible only once its manifest exists; the manifest names every file with
//! its size and checksum, and a reader checks both.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sparta_checkpoint::format::{read_small, write_small, FileKind, FileReader, FileWriter};
use sparta_checkpoint::{Storage, TableMember};
use sparta_table::{RowPrecision, WeightBytes};

use crate::error::ExportError;
use crate::quality::ExportQuality;

/// Version of the export layout written by this crate (2: tables may come in parts, one per
/// PS shard, and the manifest names the trainer's lineage; 3: rows files of the dtypes bf16
/// and int8, and each table's dtype in the manifest).
pub const EXPORT_FORMAT: u32 = 3;
/// Oldest layout version this crate reads.
pub const EXPORT_FORMAT_MIN: u32 = 1;
/// Name of the manifest inside a version directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Name of the dense-parameter file inside a version directory.
pub const DENSE_FILE: &str = "dense.bin";
const ROWS_MAGIC: [u8; 8] = *b"SPEXROWS";
const DENSE_MAGIC: [u8; 8] = *b"SPEXDENS";
/// Largest manifest accepted (the job config text is inside).
const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// Bytes buffered before a write to the file.
const WRITE_CHUNK: usize = 1 << 20;

/// Directory name of version `v`.
pub fn version_dir(v: u64) -> String {
    format!("v{v:010}")
}

/// The version a directory name stands for (`v0000000007` -> 7).
pub fn parse_version_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix('v')?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether a version holds every row (a starting point) or the changes since its base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportKind {
    /// Every row of every table.
    Full,
    /// Rows changed and keys removed since the previous version.
    Delta,
}

/// One file of a version, as the manifest records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name inside the version directory.
    pub file: String,
    /// Size in bytes (header + payload + footer).
    pub bytes: u64,
    /// xxh3-64 of header + payload (the footer's checksum).
    pub checksum: u64,
}

/// One table of a version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableFile {
    /// Table name (`embedding`, `wide`).
    pub name: String,
    /// Weights per row.
    pub dim: usize,
    /// How the rows file stores the weights (layout 3); absent in older manifests, whose
    /// `fp16` says it ([`TableFile::dtype_in`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<RowPrecision>,
    /// Rows written (all rows of a full export, changed rows of a delta).
    pub rows: u64,
    /// Keys removed since the base version (always 0 in a full export).
    pub removed: u64,
    /// The training table's version this export is complete up to.
    pub table_version: u64,
    /// The rows file.
    pub file: FileEntry,
    /// The PS shard whose rows these are, when the table is written in parts (one per
    /// shard, keys disjoint); `None` when one file holds the whole table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<u32>,
    /// The logical tables this (physical) table stores, by tag (the top 8 bits of their
    /// keys). Empty in exports written before logical tables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<TableMember>,
    /// Rows written to this file per key tag (tags without rows left out): of a full
    /// export every row, of a delta the rows changed. Empty in exports written before
    /// logical tables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tag_rows: BTreeMap<u8, u64>,
}

impl TableFile {
    /// The dtype of this table's rows in manifest `m`: its own, or (manifests before layout
    /// 3) f16 when `m.fp16`, else f32.
    pub fn dtype_in(&self, m: &ExportManifest) -> RowPrecision {
        self.dtype.unwrap_or(if m.fp16 {
            RowPrecision::F16
        } else {
            RowPrecision::F32
        })
    }
}

/// One logical table of a version: [`ExportManifest::logical_tables`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogicalTable {
    /// The physical table that stores it.
    pub table: String,
    /// Its name.
    pub name: String,
    /// Its tag (the top 8 bits of its keys).
    pub tag: u8,
    /// Its row width.
    pub dim: usize,
    /// Rows written for it, over all parts: every row of a full version, the rows changed
    /// of a delta.
    pub rows: u64,
}

/// The manifest of one version: written last, so its presence marks a complete version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportManifest {
    /// Layout version ([`EXPORT_FORMAT`]).
    pub format: u32,
    /// This version.
    pub version: u64,
    /// Full or delta.
    pub kind: ExportKind,
    /// The version a delta applies on top of (`None` for a full export).
    pub base: Option<u64>,
    /// The full export this version's chain starts at (itself for a full export).
    pub full: u64,
    /// Training step at export time.
    pub step: u64,
    /// Wall-clock time of the export, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Whether `[export] fp16` was set: an f32 table's weights are stored as IEEE halves
    /// (each table's [`TableFile::dtype`] says how its rows are stored).
    pub fp16: bool,
    /// Only rows pulled at least this often were exported (0 or 1: all rows).
    pub min_count: u32,
    /// The job config (TOML) the model was trained with: schema, model shape, tables.
    pub job_config: String,
    /// Number of dense parameters.
    pub dense_params: u64,
    /// The dense-parameter file.
    pub dense: FileEntry,
    /// One rows file per table, or one per table and part when `parts > 1`.
    pub tables: Vec<TableFile>,
    /// Parts each table is written in (a cluster export: one per PS shard); 0 or 1: one file
    /// per table.
    #[serde(default)]
    pub parts: u32,
    /// Identifies the run of the exporting trainer (a fresh random number each time a trainer
    /// or cluster starts exporting, e.g. after a `--resume`). A version whose lineage differs
    /// from the served one may carry an earlier step: the trainer went back to a checkpoint.
    #[serde(default)]
    pub lineage: u64,
    /// The progressive metrics of the window the version was trained on (what the export
    /// gate judged), when the run kept them. Absent in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<ExportQuality>,
}

impl ExportManifest {
    /// Rows written over all tables.
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|t| t.rows).sum()
    }

    /// Keys removed over all tables.
    pub fn removed(&self) -> u64 {
        self.tables.iter().map(|t| t.removed).sum()
    }

    /// Bytes of all files except the manifest.
    pub fn bytes(&self) -> u64 {
        self.dense.bytes + self.tables.iter().map(|t| t.file.bytes).sum::<u64>()
    }

    /// The logical tables of every physical table, in table then tag order, with their rows
    /// summed over the table's parts (one per PS shard in a cluster export). Empty for
    /// exports written before logical tables.
    pub fn logical_tables(&self) -> Vec<LogicalTable> {
        let mut out: Vec<LogicalTable> = Vec::new();
        for t in &self.tables {
            for m in &t.members {
                let rows = t.tag_rows.get(&m.tag).copied().unwrap_or(0);
                match out.iter_mut().find(|l| l.table == t.name && l.tag == m.tag) {
                    Some(l) => l.rows += rows,
                    None => out.push(LogicalTable {
                        table: t.name.clone(),
                        name: m.name.clone(),
                        tag: m.tag,
                        dim: m.dim,
                        rows,
                    }),
                }
            }
        }
        out.sort_by(|a, b| (&a.table, a.tag).cmp(&(&b.table, b.tag)));
        out
    }
}

/// Blob name of `file` in version `v`.
pub fn blob(v: u64, file: &str) -> String {
    format!("{}/{file}", version_dir(v))
}

/// Writes the manifest of `m.version` (publishing the version); returns its size.
pub fn write_manifest(storage: &dyn Storage, m: &ExportManifest) -> Result<u64, ExportError> {
    let json = serde_json::to_vec_pretty(m).expect("manifest serializes");
    let (size, _) = write_small(
        storage,
        &blob(m.version, MANIFEST_FILE),
        FileKind::Manifest,
        &json,
    )?;
    Ok(size)
}

/// Reads and verifies the manifest of version `v`.
pub fn read_manifest(storage: &dyn Storage, v: u64) -> Result<ExportManifest, ExportError> {
    let name = blob(v, MANIFEST_FILE);
    let (payload, _) = read_small(storage, &name, FileKind::Manifest, MAX_MANIFEST_BYTES)?;
    let m: ExportManifest = serde_json::from_slice(&payload)
        .map_err(|e| ExportError::invalid(v, format!("{name}: {e}")))?;
    if !(EXPORT_FORMAT_MIN..=EXPORT_FORMAT).contains(&m.format) {
        return Err(ExportError::invalid(
            v,
            format!(
                "layout version {}, this build reads {EXPORT_FORMAT_MIN} to {EXPORT_FORMAT}",
                m.format
            ),
        ));
    }
    check_parts(&m)?;
    if m.version != v {
        return Err(ExportError::invalid(
            v,
            format!("manifest says version {}", m.version),
        ));
    }
    Ok(m)
}

/// Every table of a manifest in parts has exactly parts `0..parts`, each once; without parts,
/// every table name appears once.
fn check_parts(m: &ExportManifest) -> Result<(), ExportError> {
    let parts = m.parts.max(1);
    let mut names: Vec<&str> = m.tables.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let mut seen: Vec<u32> = m
            .tables
            .iter()
            .filter(|t| t.name == name)
            .map(|t| t.part.unwrap_or(0))
            .collect();
        seen.sort_unstable();
        if seen != (0..parts).collect::<Vec<_>>() {
            return Err(ExportError::invalid(
                m.version,
                format!("table `{name}` has parts {seen:?}, the manifest says {parts} part(s)"),
            ));
        }
    }
    Ok(())
}

/// Writes the dense file of version `v`.
pub fn write_dense(
    storage: &dyn Storage,
    v: u64,
    params: &[f32],
) -> Result<FileEntry, ExportError> {
    let mut payload = Vec::with_capacity(16 + 4 * params.len());
    payload.extend_from_slice(&DENSE_MAGIC);
    payload.extend_from_slice(&(params.len() as u64).to_le_bytes());
    payload.extend_from_slice(bytemuck::cast_slice(params));
    let (bytes, checksum) = write_small(storage, &blob(v, DENSE_FILE), FileKind::Dense, &payload)?;
    Ok(FileEntry {
        file: DENSE_FILE.into(),
        bytes,
        checksum,
    })
}

/// Reads and verifies the dense file a manifest names.
pub fn read_dense(storage: &dyn Storage, m: &ExportManifest) -> Result<Vec<f32>, ExportError> {
    let name = blob(m.version, &m.dense.file);
    check_size(storage, &name, &m.dense, m.version)?;
    let (payload, sum) = read_small(storage, &name, FileKind::Dense, 4 << 30)?;
    let bad = |why: String| ExportError::invalid(m.version, format!("{name}: {why}"));
    if sum != m.dense.checksum {
        return Err(bad("checksum differs from the manifest".into()));
    }
    if payload.len() < 16 || payload[..8] != DENSE_MAGIC {
        return Err(bad("not an export dense file".into()));
    }
    let n = u64::from_le_bytes(payload[8..16].try_into().expect("8 bytes"));
    if n != m.dense_params || (payload.len() - 16) as u64 != 4 * n {
        return Err(bad(format!(
            "{n} parameters in a payload of {} bytes, manifest says {}",
            payload.len(),
            m.dense_params
        )));
    }
    let mut out = vec![0f32; n as usize];
    bytemuck::cast_slice_mut::<f32, u8>(&mut out).copy_from_slice(&payload[16..]);
    Ok(out)
}

fn check_size(
    storage: &dyn Storage,
    name: &str,
    entry: &FileEntry,
    v: u64,
) -> Result<(), ExportError> {
    let (_, size) = storage.open(name)?;
    if size != entry.bytes {
        return Err(ExportError::invalid(
            v,
            format!(
                "{name}: {size} bytes, manifest says {} (truncated or replaced)",
                entry.bytes
            ),
        ));
    }
    Ok(())
}

/// Streams one table's rows into a rows file.
pub struct RowsWriter<'s> {
    w: FileWriter<'s>,
    buf: Vec<u8>,
    dim: usize,
    dtype: RowPrecision,
    codec: WeightBytes,
    rows: u64,
    removed: u64,
    file: String,
    tag_rows: Box<[u64; 256]>,
}

impl<'s> RowsWriter<'s> {
    /// Starts `file` of version `v`, rows of `dim` weights stored as `dtype`, with the
    /// removed keys up front.
    pub fn new(
        storage: &'s dyn Storage,
        v: u64,
        file: &str,
        dim: usize,
        dtype: RowPrecision,
        removed: &[u64],
    ) -> Result<Self, ExportError> {
        let name = blob(v, file);
        let mut w = FileWriter::new(storage.create(&name)?, &name, FileKind::TableRows)?;
        let mut head = Vec::with_capacity(24 + 8 * removed.len());
        head.extend_from_slice(&ROWS_MAGIC);
        head.extend_from_slice(&dtype.code().to_le_bytes());
        head.extend_from_slice(&(dim as u32).to_le_bytes());
        head.extend_from_slice(&(removed.len() as u64).to_le_bytes());
        head.extend_from_slice(bytemuck::cast_slice(removed));
        w.write(&head)?;
        Ok(Self {
            w,
            buf: Vec::with_capacity(WRITE_CHUNK + 8 + 4 * dim + 4),
            dim,
            dtype,
            codec: WeightBytes::new(dtype, dim),
            rows: 0,
            removed: removed.len() as u64,
            file: file.to_string(),
            tag_rows: Box::new([0; 256]),
        })
    }

    /// Appends one row (`weights` is `dim` long). A compact table's decoded weights are
    /// stored exactly as the table stores them (they are values of its precision); f16
    /// rounds any other value to nearest (`[export] fp16` on an f32 table).
    pub fn push(&mut self, key: u64, weights: &[f32]) -> Result<(), ExportError> {
        debug_assert_eq!(weights.len(), self.dim);
        self.buf.extend_from_slice(&key.to_le_bytes());
        match self.dtype {
            RowPrecision::F32 => self.buf.extend_from_slice(bytemuck::cast_slice(weights)),
            RowPrecision::F16 => {
                for &x in weights {
                    self.buf
                        .extend_from_slice(&half::f16::from_f32(x).to_le_bytes());
                }
            }
            RowPrecision::Bf16 | RowPrecision::Int8 => {
                self.codec.encode(weights, &mut self.buf, key);
            }
        }
        self.rows += 1;
        self.tag_rows[(key >> 56) as usize] += 1;
        if self.buf.len() >= WRITE_CHUNK {
            self.w.write(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// How the rows store their weights.
    pub fn dtype(&self) -> RowPrecision {
        self.dtype
    }

    /// Rows pushed so far per key tag (the top 8 bits of the key), tags without rows left out.
    pub fn tag_rows(&self) -> BTreeMap<u8, u64> {
        (0..=255u8)
            .zip(self.tag_rows.iter())
            .filter(|(_, &n)| n > 0)
            .map(|(t, &n)| (t, n))
            .collect()
    }

    /// Publishes the file; returns its manifest entry, rows and removed keys written.
    pub fn finish(mut self) -> Result<(FileEntry, u64, u64), ExportError> {
        if !self.buf.is_empty() {
            self.w.write(&self.buf)?;
        }
        let (bytes, checksum) = self.w.finish()?;
        Ok((
            FileEntry {
                file: self.file,
                bytes,
                checksum,
            },
            self.rows,
            self.removed,
        ))
    }
}

/// One table of a loaded version: upserted rows (weights in the file's stored form) and
/// removed keys.
#[derive(Clone, Debug, PartialEq)]
pub struct TableData {
    /// Table name.
    pub name: String,
    /// Weights per row.
    pub dim: usize,
    /// How `stored` holds each row's weights.
    pub dtype: RowPrecision,
    /// Keys of the rows.
    pub keys: Vec<u64>,
    /// `keys.len()` rows of `dtype.weight_bytes(dim)` bytes: each row's weights as stored.
    pub stored: Vec<u8>,
    /// Keys removed since the base version (apply before the rows).
    pub removed: Vec<u64>,
}

impl TableData {
    /// Bytes of one row's stored weights.
    pub fn row_bytes(&self) -> usize {
        self.dtype.weight_bytes(self.dim)
    }

    /// The stored weights of row `i`.
    pub fn stored_row(&self, i: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.stored[i * n..(i + 1) * n]
    }

    /// Every row's weights decoded to f32 (`keys.len() * dim`).
    pub fn weights(&self) -> Vec<f32> {
        let codec = WeightBytes::new(self.dtype, self.dim);
        let mut out = vec![0f32; self.keys.len() * self.dim];
        for (i, row) in out.chunks_exact_mut(self.dim.max(1)).enumerate() {
            codec.decode(self.stored_row(i), row);
        }
        out
    }
}

/// Reads and verifies one table's rows file.
pub fn read_rows(
    storage: &dyn Storage,
    m: &ExportManifest,
    t: &TableFile,
) -> Result<TableData, ExportError> {
    let v = m.version;
    let name = blob(v, &t.file.file);
    check_size(storage, &name, &t.file, v)?;
    let bad = |why: String| ExportError::invalid(v, format!("{name}: {why}"));
    let (r, size) = storage.open(&name)?;
    let mut fr = FileReader::new(r, size, &name, FileKind::TableRows)?;
    let mut head = [0u8; 24];
    fr.read(&mut head)?;
    if head[..8] != ROWS_MAGIC {
        return Err(bad("not an export rows file".into()));
    }
    let dtype = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    let dim = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes")) as usize;
    let n_removed = u64::from_le_bytes(head[16..24].try_into().expect("8 bytes"));
    let want = t.dtype_in(m);
    if dtype != want.code() || dim != t.dim || dim == 0 {
        return Err(bad(format!(
            "dtype {dtype} / dim {dim}, manifest says {} / dim {}",
            want.name(),
            t.dim
        )));
    }
    if n_removed != t.removed || n_removed.saturating_mul(8) > fr.remaining() {
        return Err(bad(format!(
            "{n_removed} removed keys, manifest says {}",
            t.removed
        )));
    }
    let mut removed = vec![0u64; n_removed as usize];
    fr.read(bytemuck::cast_slice_mut(&mut removed))?;
    let row_bytes = want.weight_bytes(dim);
    let record = (8 + row_bytes) as u64;
    if fr.remaining() % record != 0 || fr.remaining() / record != t.rows {
        return Err(bad(format!(
            "{} record bytes for {} rows of {record} bytes",
            fr.remaining(),
            t.rows
        )));
    }
    let rows = t.rows as usize;
    let mut keys = Vec::with_capacity(rows);
    let mut stored = Vec::with_capacity(rows * row_bytes);
    let per_chunk = (WRITE_CHUNK / record as usize).max(1);
    let mut buf = Vec::new();
    let mut left = rows;
    while left > 0 {
        let n = left.min(per_chunk);
        buf.resize(n * record as usize, 0);
        fr.read(&mut buf)?;
        for rec in buf.chunks_exact(record as usize) {
            keys.push(u64::from_le_bytes(rec[..8].try_into().expect("8 bytes")));
            stored.extend_from_slice(&rec[8..]);
        }
        left -= n;
    }
    let sum = fr.finish()?;
    if sum != t.file.checksum {
        return Err(bad("checksum differs from the manifest".into()));
    }
    Ok(TableData {
        name: t.name.clone(),
        dim,
        dtype: want,
        keys,
        stored,
        removed,
    })
}

/// A whole version read into memory and verified.
#[derive(Clone, Debug)]
pub struct ExportVersion {
    /// Its manifest.
    pub manifest: ExportManifest,
    /// Dense parameters.
    pub dense: Vec<f32>,
    /// One entry per table (its parts joined).
    pub tables: Vec<TableData>,
}

/// Reads and verifies every file of version `v`.
pub fn read_version(storage: &dyn Storage, v: u64) -> Result<ExportVersion, ExportError> {
    let manifest = read_manifest(storage, v)?;
    let dense = read_dense(storage, &manifest)?;
    let mut tables: Vec<TableData> = Vec::new();
    for t in &manifest.tables {
        let data = read_rows(storage, &manifest, t)?;
        // The parts of a table hold disjoint keys: one entry per table for the reader.
        match tables.iter_mut().find(|d| d.name == data.name) {
            Some(d) if d.dim == data.dim && d.dtype == data.dtype => {
                d.keys.extend_from_slice(&data.keys);
                d.stored.extend_from_slice(&data.stored);
                d.removed.extend_from_slice(&data.removed);
            }
            Some(_) => {
                return Err(ExportError::invalid(
                    v,
                    format!("the parts of table `{}` differ in dim or dtype", t.name),
                ))
            }
            None => tables.push(data),
        }
    }
    Ok(ExportVersion {
        manifest,
        dense,
        tables,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quality::TaskQuality;
    use sparta_checkpoint::LocalDir;

    fn manifest(quality: Option<ExportQuality>) -> ExportManifest {
        ExportManifest {
            format: EXPORT_FORMAT,
            version: 3,
            kind: ExportKind::Delta,
            base: Some(2),
            full: 1,
            step: 30,
            created_unix_ms: 1,
            fp16: false,
            min_count: 0,
            job_config: String::new(),
            dense_params: 0,
            dense: FileEntry {
                file: DENSE_FILE.into(),
                bytes: 0,
                checksum: 0,
            },
            tables: Vec::new(),
            parts: 0,
            lineage: 7,
            quality,
        }
    }

    #[test]
    fn a_manifest_round_trips_with_and_without_quality() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalDir::new(dir.path()).unwrap();
        let q = ExportQuality {
            window: 1000,
            step: 30,
            tasks: vec![TaskQuality {
                task: "ctr".into(),
                auc: None,
                logloss: Some(0.5),
                calibration: Some(1.1),
                rows: 1000,
            }],
        };
        for m in [manifest(None), manifest(Some(q))] {
            write_manifest(&storage, &m).unwrap();
            assert_eq!(read_manifest(&storage, 3).unwrap(), m);
        }
        // A manifest written before quality existed (no field) still loads.
        let json = serde_json::to_string(&manifest(None)).unwrap();
        assert!(!json.contains("quality"), "{json}");
        let old: ExportManifest = serde_json::from_str(&json).unwrap();
        assert_eq!(old.quality, None);
    }

    /// One table file of `rows` (key, weights bits) at `dtype`, in version 3, with its entry.
    fn rows_file(
        storage: &LocalDir,
        dtype: RowPrecision,
        dim: usize,
        rows: &[(u64, Vec<f32>)],
        removed: &[u64],
    ) -> TableFile {
        let mut w = RowsWriter::new(storage, 3, "table-t.rows", dim, dtype, removed).unwrap();
        for (k, row) in rows {
            w.push(*k, row).unwrap();
        }
        let (file, n, r) = w.finish().unwrap();
        TableFile {
            name: "t".into(),
            dim,
            dtype: Some(dtype),
            rows: n,
            removed: r,
            table_version: 1,
            file,
            part: None,
            members: Vec::new(),
            tag_rows: BTreeMap::new(),
        }
    }

    /// Rows of a table storing `dim` weights at `dtype`: the values its decoding gives.
    fn stored_values(dtype: RowPrecision, dim: usize, seeds: &[u32]) -> Vec<f32> {
        let mut wb = WeightBytes::new(dtype, dim);
        let w: Vec<f32> = (0..dim)
            .map(|j| {
                let b = seeds[j % seeds.len()].rotate_left(j as u32);
                let x = f32::from_bits(b);
                if x.is_finite() {
                    x.clamp(-6e4, 6e4)
                } else {
                    0.5
                }
            })
            .collect();
        let mut bytes = Vec::new();
        wb.encode(&w, &mut bytes, 3);
        let mut out = vec![0f32; dim];
        wb.decode(&bytes, &mut out);
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]
        /// Rows of every dtype read back as written: the stored bytes, and the decoded values
        /// bit for bit; each row takes `8 + weight_bytes(dim)` bytes.
        #[test]
        fn rows_of_every_dtype_round_trip_bit_for_bit(
            code in 0u32..4,
            dim in 1usize..9,
            seeds in proptest::collection::vec(proptest::prelude::any::<u32>(), 1..40),
            removed in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..4),
        ) {
            let dtype = RowPrecision::from_code(code).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let storage = LocalDir::new(dir.path()).unwrap();
            let rows: Vec<(u64, Vec<f32>)> = seeds
                .chunks(2)
                .enumerate()
                .map(|(i, s)| (i as u64 * 977, stored_values(dtype, dim, s)))
                .collect();
            let t = rows_file(&storage, dtype, dim, &rows, &removed);
            let mut m = manifest(None);
            m.tables = vec![t.clone()];
            let d = read_rows(&storage, &m, &t).unwrap();
            proptest::prop_assert_eq!(d.dtype, dtype);
            proptest::prop_assert_eq!(&d.removed, &removed);
            proptest::prop_assert_eq!(d.stored.len(), rows.len() * dtype.weight_bytes(dim));
            let w = d.weights();
            for (i, (k, row)) in rows.iter().enumerate() {
                proptest::prop_assert_eq!(d.keys[i], *k);
                let got: Vec<u32> = w[i * dim..(i + 1) * dim].iter().map(|x| x.to_bits()).collect();
                let want: Vec<u32> = row.iter().map(|x| x.to_bits()).collect();
                proptest::prop_assert_eq!(got, want);
            }
        }

        /// A rows file cut short or with a byte changed (its manifest entry made to match)
        /// is an error, never a panic.
        #[test]
        fn a_damaged_rows_file_is_an_error_not_a_panic(
            code in 0u32..4,
            dim in 1usize..6,
            at in proptest::prelude::any::<proptest::sample::Index>(),
            flip in 1u8..=255,
            cut in proptest::prelude::any::<bool>(),
        ) {
            let dtype = RowPrecision::from_code(code).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let storage = LocalDir::new(dir.path()).unwrap();
            let rows: Vec<(u64, Vec<f32>)> =
                (0..5u32).map(|i| (i as u64, stored_values(dtype, dim, &[i * 7919 + 1]))).collect();
            let mut t = rows_file(&storage, dtype, dim, &rows, &[4]);
            let path = dir.path().join(blob(3, "table-t.rows"));
            let mut bytes = std::fs::read(&path).unwrap();
            let i = at.index(bytes.len());
            if cut {
                bytes.truncate(i);
            } else {
                bytes[i] ^= flip;
            }
            std::fs::write(&path, &bytes).unwrap();
            t.file.bytes = bytes.len() as u64;
            let mut m = manifest(None);
            m.tables = vec![t.clone()];
            proptest::prop_assert!(read_rows(&storage, &m, &t).is_err());
        }
    }

    /// An export before layout 3: no dtype in its table entries, the manifest's `fp16` says
    /// f16 or f32; its rows files (dtype 1 or 0) still load.
    #[test]
    fn a_layout_2_export_without_dtypes_still_loads() {
        for fp16 in [false, true] {
            let dtype = if fp16 {
                RowPrecision::F16
            } else {
                RowPrecision::F32
            };
            let dir = tempfile::tempdir().unwrap();
            let storage = LocalDir::new(dir.path()).unwrap();
            let rows = vec![(7u64, vec![0.5f32, -2.0]), (9, vec![1.25, 3.0])];
            let mut t = rows_file(&storage, dtype, 2, &rows, &[]);
            t.dtype = None;
            let mut m = manifest(None);
            m.format = 2;
            m.fp16 = fp16;
            m.tables = vec![t];
            let json = serde_json::to_string(&m).unwrap();
            assert!(!json.contains("dtype"), "{json}");
            write_manifest(&storage, &m).unwrap();
            let back = read_manifest(&storage, 3).unwrap();
            let d = read_rows(&storage, &back, &back.tables[0]).unwrap();
            assert_eq!(d.dtype, dtype);
            assert_eq!(d.weights(), [0.5, -2.0, 1.25, 3.0]);
        }
    }

    #[test]
    fn version_dir_names_round_trip() {
        assert_eq!(version_dir(7), "v0000000007");
        assert_eq!(parse_version_dir("v0000000007"), Some(7));
        for bad in ["v7", "x0000000007", "v00000000a7", "v00000000007"] {
            assert_eq!(parse_version_dir(bad), None, "{bad}");
        }
    }
}
