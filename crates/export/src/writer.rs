//! Writing serving exports: a full export first, then deltas (rows changed and keys removed
//! since the previous version), a new full one every `full_every` deltas.
//!
//! Each version is a directory `v<10 digits>/` (layout: [`crate::format`]); its manifest is
//! written last, so a reader never sees a partial version. Rows hold weights only (the first
//! `dim` floats of a table row, no optimizer state), as f32 or f16; the dense parameters are
//! stored whole in every version (they are small next to the tables).
//!
//! Deltas come from [`Table::changed_since`] with the table versions the previous export
//! was complete up to (each export first bumps the table's version with
//! [`Table::bump_version`], so a removal or a pull-created row is in exactly one delta); if the table's tombstone log overflowed since then
//! (`removed_truncated`), a full export is written instead, so removals are never lost.
//!
//! Retention keeps the newest `keep_full` full exports and every version after the oldest of
//! them; a server applying a chain that just lost its base reloads the newest full export.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sparta_checkpoint::{LocalDir, Members, Storage as _};
use sparta_nn::Model;
use sparta_table::{RowPrecision, Table};

use crate::error::ExportError;
use crate::format::{
    parse_version_dir, read_manifest, version_dir, write_dense, write_manifest, ExportKind,
    ExportManifest, RowsWriter, TableFile, EXPORT_FORMAT,
};
use crate::quality::ExportQuality;

/// How exports are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportOptions {
    /// Store an f32 table's row weights as IEEE half floats (halves the size; scores move by
    /// ~1e-3). A compact table (`precision = "f16" | "bf16" | "int8"`) is always exported
    /// in its own stored form, exactly.
    pub fp16: bool,
    /// Export only rows pulled at least this often (0 or 1: all rows). Needs tables that
    /// count pulls (eviction with `min_count`).
    pub min_count: u32,
    /// A full export after this many deltas (0: only the first export is full).
    pub full_every: u32,
    /// Full exports kept, each with the deltas after it (at least 1).
    pub keep_full: usize,
    /// `fsync` files before publishing them (off: faster, not crash-durable).
    pub sync: bool,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            fp16: false,
            min_count: 0,
            full_every: 100,
            keep_full: 2,
            sync: true,
        }
    }
}

impl From<&sparta_core::config::ExportConfig> for ExportOptions {
    /// The job's `[export]` settings (files are `fsync`ed).
    fn from(cfg: &sparta_core::config::ExportConfig) -> Self {
        ExportOptions {
            fp16: cfg.fp16,
            min_count: cfg.min_count,
            full_every: cfg.full_every,
            keep_full: cfg.keep_full,
            ..ExportOptions::default()
        }
    }
}

/// What one export wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportInfo {
    /// The version written.
    pub version: u64,
    /// Full or delta.
    pub kind: ExportKind,
    /// Rows written over all tables.
    pub rows: u64,
    /// Keys removed (deltas).
    pub removed: u64,
    /// Bytes of the version's files, manifest included.
    pub bytes: u64,
    /// Bytes of its manifest alone (its size varies with the checksums it lists).
    pub manifest_bytes: u64,
    /// Wall time of the export.
    pub seconds: f64,
}

/// Writes the table files of versions: all of a model's tables (one process), or one PS
/// shard's part of each table (a cluster export, `part = Some(shard)`).
///
/// It remembers the table versions its previous files were complete up to, so the next
/// delta holds exactly the rows changed and keys removed since then.
pub struct TableExporter {
    storage: LocalDir,
    opts: ExportOptions,
    part: Option<u32>,
    /// The logical tables of each physical table, recorded in its manifest entries.
    members: Members,
    /// Per table (name, table version) the previous files are complete up to, and the export
    /// version they were written for.
    last: Option<(u64, Vec<(String, u64)>)>,
}

impl std::fmt::Debug for TableExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableExporter")
            .field("part", &self.part)
            .field("last", &self.last)
            .finish()
    }
}

/// Refuses an object-storage URL (`s3://...`, `file://...`) where an export directory is
/// expected: taken as a path it would be a relative folder named `s3:` and the bucket would
/// stay empty while the log names the URL.
pub fn local_dir(dir: &Path) -> Result<(), ExportError> {
    match dir.to_str() {
        Some(s) if sparta_blob::is_url(s) => Err(ExportError::ObjectUrl(s.to_string())),
        _ => Ok(()),
    }
}

impl TableExporter {
    /// Writes into the export directory `dir` (created if missing).
    pub fn new(dir: &Path, opts: ExportOptions, part: Option<u32>) -> Result<Self, ExportError> {
        local_dir(dir)?;
        let storage = LocalDir::new(dir)?.with_sync(opts.sync);
        Ok(TableExporter {
            storage,
            opts,
            part,
            members: Members::new(),
            last: None,
        })
    }

    /// The logical tables of each physical table (by its name), recorded in the manifest
    /// entries of the files written from now on (tables without an entry get none).
    pub fn set_members(&mut self, members: Members) {
        self.members = members;
    }

    /// The part this exporter writes (`None`: whole tables).
    pub fn part(&self) -> Option<u32> {
        self.part
    }

    /// Whether a delta on top of version `base` can be written: the previous files of this
    /// exporter were written for `base`, with the same tables.
    pub fn can_delta(&self, base: u64, tables: &[(&str, &Table)]) -> bool {
        matches!(&self.last, Some((v, last)) if *v == base
            && last.len() == tables.len()
            && last.iter().zip(tables).all(|((a, _), (b, _))| a == b))
    }

    /// Forgets the previous files (after a version was abandoned): the next write must be full.
    pub fn forget(&mut self) {
        self.last = None;
    }

    /// Continues after version `v`, whose files `files` another writer of the same part wrote
    /// from tables equal to these (a PS shard's backup copy following its primary's exports):
    /// the next write may be a delta on top of `v`, holding the rows changed after each
    /// file's `table_version`.
    pub fn resume_at(&mut self, v: u64, files: &[TableFile]) {
        self.last = Some((
            v,
            files
                .iter()
                .map(|t| (t.name.clone(), t.table_version))
                .collect(),
        ));
    }

    /// Writes the table files of version `v`: a delta on top of `base` when `base` is given
    /// and [`TableExporter::can_delta`] holds and no table lost tombstones since, else every
    /// row. Returns what was written; [`ExportKind::Full`] where a delta was asked for but
    /// could not be written (the caller decides whether that is acceptable).
    ///
    /// Call it between training steps (or with the shard's pushes stopped): rows pushed while
    /// it runs are exported now or by the next delta.
    pub fn write(
        &mut self,
        v: u64,
        tables: &[(&str, &Table)],
        base: Option<u64>,
    ) -> Result<(ExportKind, Vec<TableFile>), ExportError> {
        if self.opts.min_count > 1 {
            if let Some((name, _)) = tables.iter().find(|(_, t)| !counts_pulls(t)) {
                return Err(ExportError::Usage(format!(
                    "min_count {} needs pull counts, but table `{name}` keeps none (they are \
                     kept only when its eviction uses min_count)",
                    self.opts.min_count
                )));
            }
        }
        for (i, (name, _)) in tables.iter().enumerate() {
            if tables[..i].iter().any(|(n, _)| n == name) {
                return Err(ExportError::Usage(format!("table `{name}` given twice")));
            }
        }
        let since: Option<Vec<u64>> = match (base, &self.last) {
            (Some(b), Some((_, last))) if self.can_delta(b, tables) => {
                Some(last.iter().map(|(_, v)| *v).collect())
            }
            _ => None,
        };
        // Forget first: a failed write leaves no base behind.
        self.last = None;
        let deltas = match &since {
            Some(since) => {
                // Close the table version first: removals and row creations by pulls since
                // the last push carry the stamp `version + 1`; after the bump they are inside
                // this delta instead of being reported again by the next one.
                let ds: Vec<_> = tables
                    .iter()
                    .zip(since)
                    .map(|((_, t), &s)| {
                        t.bump_version();
                        t.changed_since(s)
                    })
                    .collect();
                if ds.iter().any(|d| d.removed_truncated) {
                    tracing::info!(
                        "tombstones were dropped since the last export: writing a full one"
                    );
                    None
                } else {
                    Some(ds)
                }
            }
            None => None,
        };
        let kind = if deltas.is_some() {
            ExportKind::Delta
        } else {
            ExportKind::Full
        };
        let mut files = Vec::with_capacity(tables.len());
        for (i, (name, table)) in tables.iter().enumerate() {
            let file = match self.part {
                Some(p) => format!("table-{name}.part{p:05}.rows"),
                None => format!("table-{name}.rows"),
            };
            let entry = match (&deltas, &since) {
                (Some(ds), Some(since)) => {
                    self.write_delta(v, &file, name, table, &ds[i], since[i])?
                }
                _ => self.write_full(v, &file, name, table)?,
            };
            files.push(entry);
        }
        self.last = Some((
            v,
            files
                .iter()
                .map(|t| (t.name.clone(), t.table_version))
                .collect(),
        ));
        Ok((kind, files))
    }

    fn write_full(
        &self,
        v: u64,
        file: &str,
        name: &str,
        table: &Table,
    ) -> Result<TableFile, ExportError> {
        // Rows written during the scan get a stamp above this and go into the next delta.
        let table_version = table.bump_version();
        let dim = table.dim();
        let min = self.opts.min_count;
        let dtype = self.dtype(table);
        let mut w = RowsWriter::new(&self.storage, v, file, dim, dtype, &[])?;
        let mut err = None;
        table.for_each_row(|key, row, meta| {
            if err.is_some() || (min > 1 && meta.count < min) {
                return;
            }
            if let Err(e) = w.push(key, &row[..dim]) {
                err = Some(e);
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        self.finish_file(w, name, dim, table_version)
    }

    /// How `table`'s rows are exported: in its own stored form, or an f32 table's in f16
    /// with `fp16`.
    fn dtype(&self, table: &Table) -> RowPrecision {
        match table.config().precision {
            RowPrecision::F32 if self.opts.fp16 => RowPrecision::F16,
            p => p,
        }
    }

    fn write_delta(
        &self,
        v: u64,
        file: &str,
        name: &str,
        table: &Table,
        delta: &sparta_table::Delta,
        since: u64,
    ) -> Result<TableFile, ExportError> {
        let dim = table.dim();
        let min = self.opts.min_count;
        // Pull counts of the changed rows (a delta carries no row metadata).
        let counts = (min > 1).then(|| {
            let mut m = hashbrown::HashMap::with_hasher(foldhash::fast::FixedState::default());
            table.for_each_row(|key, _, meta| {
                if meta.version as u64 > since || meta.version == u32::MAX {
                    m.insert(key, meta.count);
                }
            });
            m
        });
        let dtype = self.dtype(table);
        let mut w = RowsWriter::new(&self.storage, v, file, dim, dtype, &delta.removed)?;
        for (key, row) in delta.upserts() {
            if let Some(c) = &counts {
                if c.get(&key).is_none_or(|&n| n < min) {
                    continue;
                }
            }
            w.push(key, &row[..dim])?;
        }
        self.finish_file(w, name, dim, delta.version)
    }

    /// Publishes a table's rows file; its manifest entry, complete up to `table_version`.
    fn finish_file(
        &self,
        w: RowsWriter<'_>,
        name: &str,
        dim: usize,
        table_version: u64,
    ) -> Result<TableFile, ExportError> {
        let tag_rows = w.tag_rows();
        let dtype = w.dtype();
        let (file, rows, removed) = w.finish()?;
        Ok(TableFile {
            name: name.to_string(),
            dim,
            dtype: Some(dtype),
            rows,
            removed,
            table_version,
            file,
            part: self.part,
            members: self.members.get(name).cloned().unwrap_or_default(),
            tag_rows,
        })
    }
}

/// A file a reader (`sparta serve` that found a gap in the delta chain) creates in the export
/// directory to ask the exporting trainer for a full version: the next version claimed is
/// full, and the file is removed.
pub const FULL_REQUEST_FILE: &str = "full-request";

/// What the next version of an export directory will be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Its number.
    pub version: u64,
    /// The version a delta would apply on top of; `None`: it must be full.
    pub base: Option<u64>,
}

/// Numbers the versions of one export directory and publishes them: writes the dense file and
/// the manifest (the commit point), then applies retention. The single writer of a directory:
/// the trainer of an embedded job, worker 0 (the checkpoint coordinator) of a cluster job.
pub struct Committer {
    storage: LocalDir,
    root: PathBuf,
    opts: ExportOptions,
    next_version: u64,
    last_version: u64,
    last_full: u64,
    /// Deltas since the last full; `None` before this committer's first version.
    deltas_since_full: Option<u32>,
    lineage: u64,
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committer")
            .field("root", &self.root)
            .field("next_version", &self.next_version)
            .field("lineage", &self.lineage)
            .finish()
    }
}

/// A fresh random lineage number (never 0).
fn new_lineage() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish().max(1)
}

impl Committer {
    /// Publishes into `dir` (created if missing), continuing its version numbering, under a
    /// fresh lineage. Unfinished versions (no manifest) are removed. The first version of a
    /// committer is always full.
    pub fn open(dir: &Path, opts: ExportOptions) -> Result<Committer, ExportError> {
        local_dir(dir)?;
        let storage = LocalDir::new(dir)?.with_sync(opts.sync);
        // Found now, not after training (when the export would be lost).
        storage.check_writable()?;
        let versions = list_versions(dir)?;
        for &v in &versions {
            if !dir
                .join(version_dir(v))
                .join(crate::format::MANIFEST_FILE)
                .exists()
            {
                tracing::warn!("removing unfinished export version {}", version_dir(v));
                let p = dir.join(version_dir(v));
                std::fs::remove_dir_all(&p).map_err(|e| ExportError::io(&p, e))?;
            }
        }
        let next_version = versions.last().map_or(1, |v| v + 1);
        Ok(Committer {
            storage,
            root: dir.to_path_buf(),
            opts: ExportOptions {
                keep_full: opts.keep_full.max(1),
                ..opts
            },
            next_version,
            last_version: 0,
            last_full: 0,
            deltas_since_full: None,
            lineage: new_lineage(),
        })
    }

    /// The export directory.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// The options.
    pub fn options(&self) -> &ExportOptions {
        &self.opts
    }

    /// This committer's lineage number (in every manifest it writes).
    pub fn lineage(&self) -> u64 {
        self.lineage
    }

    /// The version the next export will get.
    pub fn next_version(&self) -> u64 {
        self.next_version
    }

    /// Claims the next version: its number, and its base when a delta is allowed (not the
    /// first version of this committer, not after `full_every` deltas). A claimed version
    /// that is not committed is abandoned: the next claim gets a new number.
    pub fn claim(&mut self) -> Plan {
        let version = self.next_version;
        self.next_version += 1;
        let requested = self.root.join(FULL_REQUEST_FILE);
        let full_requested = requested.exists();
        if full_requested {
            tracing::info!(
                "a reader asked for a full export ({}): writing v{version} full",
                requested.display()
            );
            // Removed before the version is written: a request made while it is written
            // asks for the next one.
            if let Err(e) = std::fs::remove_file(&requested) {
                tracing::warn!("removing {}: {e}", requested.display());
            }
        }
        let base = match self.deltas_since_full {
            Some(n)
                if !(full_requested || self.opts.full_every > 0 && n >= self.opts.full_every) =>
            {
                Some(self.last_version)
            }
            _ => None,
        };
        Plan { version, base }
    }

    /// Continues after version `m` of this directory (its newest, written by another
    /// committer): the next claim may be a delta on top of it, in its lineage, so a reader
    /// serving that chain takes it as the next version (`sparta forget --export-dir`).
    pub fn continue_after(&mut self, m: &ExportManifest) {
        self.next_version = self.next_version.max(m.version + 1);
        self.last_version = m.version;
        self.last_full = m.full;
        self.deltas_since_full = Some(0);
        self.lineage = m.lineage;
    }

    /// Abandons a claimed version: removes what was written of it; the next claim is full.
    pub fn abandon(&mut self, version: u64) {
        self.deltas_since_full = None;
        let p = self.root.join(version_dir(version));
        if let Err(e) = std::fs::remove_dir_all(&p) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("removing abandoned export {}: {e}", p.display());
            }
        }
    }

    /// Publishes claimed version `plan.version` from its table files (`parts` per table):
    /// writes the dense file and the manifest, then applies retention.
    #[allow(clippy::too_many_arguments)]
    pub fn commit(
        &mut self,
        plan: Plan,
        kind: ExportKind,
        parts: u32,
        tables: Vec<TableFile>,
        dense: &[f32],
        job_toml: &str,
        step: u64,
    ) -> Result<ExportInfo, ExportError> {
        self.commit_with_quality(plan, kind, parts, tables, dense, job_toml, step, None)
    }

    /// [`Committer::commit`], recording `quality` (the window metrics the version was trained
    /// on) in the manifest.
    #[allow(clippy::too_many_arguments)]
    pub fn commit_with_quality(
        &mut self,
        plan: Plan,
        kind: ExportKind,
        parts: u32,
        tables: Vec<TableFile>,
        dense: &[f32],
        job_toml: &str,
        step: u64,
        quality: Option<ExportQuality>,
    ) -> Result<ExportInfo, ExportError> {
        let start = Instant::now();
        let v = plan.version;
        if kind == ExportKind::Delta && plan.base.is_none() {
            return Err(ExportError::invalid(v, "a delta without a base"));
        }
        let dense_entry = write_dense(&self.storage, v, dense)?;
        let manifest = ExportManifest {
            format: EXPORT_FORMAT,
            version: v,
            kind,
            base: if kind == ExportKind::Delta {
                plan.base
            } else {
                None
            },
            full: if kind == ExportKind::Full {
                v
            } else {
                self.last_full
            },
            step,
            created_unix_ms: unix_ms(),
            fp16: self.opts.fp16,
            min_count: self.opts.min_count,
            job_config: job_toml.to_string(),
            dense_params: dense.len() as u64,
            dense: dense_entry,
            tables,
            parts: if parts > 1 { parts } else { 0 },
            lineage: self.lineage,
            quality,
        };
        let manifest_bytes = write_manifest(&self.storage, &manifest)?;
        self.last_version = v;
        if kind == ExportKind::Full {
            self.last_full = v;
            self.deltas_since_full = Some(0);
        } else {
            self.deltas_since_full = Some(self.deltas_since_full.unwrap_or(0) + 1);
        }
        self.apply_retention()?;
        let info = ExportInfo {
            version: v,
            kind,
            rows: manifest.rows(),
            removed: manifest.removed(),
            bytes: manifest.bytes() + manifest_bytes,
            manifest_bytes,
            seconds: start.elapsed().as_secs_f64(),
        };
        tracing::info!(
            "export {} ({:?}) at step {step}: {} rows, {} removed, {} bytes",
            version_dir(v),
            kind,
            info.rows,
            info.removed,
            info.bytes,
        );
        Ok(info)
    }

    /// Deletes versions before the oldest of the newest `keep_full` full exports.
    fn apply_retention(&self) -> Result<(), ExportError> {
        let versions = list_versions(&self.root)?;
        let mut fulls = Vec::new();
        for &v in versions.iter().rev() {
            if let Ok(m) = read_manifest(&self.storage, v) {
                if m.kind == ExportKind::Full {
                    fulls.push(v);
                    if fulls.len() == self.opts.keep_full {
                        break;
                    }
                }
            }
        }
        if fulls.len() < self.opts.keep_full {
            return Ok(());
        }
        let oldest_kept = *fulls.last().expect("keep_full >= 1");
        for v in versions.into_iter().filter(|&v| v < oldest_kept) {
            let p = self.root.join(version_dir(v));
            match std::fs::remove_dir_all(&p) {
                Ok(()) => tracing::debug!("retention: removed {}", p.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ExportError::io(&p, e)),
            }
        }
        Ok(())
    }
}

/// Writes the versions of one export directory from one process's tables and model: a
/// [`Committer`] and a whole-table [`TableExporter`].
pub struct Exporter {
    committer: Committer,
    tables: TableExporter,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("committer", &self.committer)
            .finish()
    }
}

/// Versions present in `dir` (directories named `v<10 digits>`, complete or not), ascending.
pub fn list_versions(dir: &Path) -> Result<Vec<u64>, ExportError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ExportError::io(dir, e)),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|e| ExportError::io(dir, e))?;
        if let Some(v) = e.file_name().to_str().and_then(parse_version_dir) {
            out.push(v);
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Exporter {
    /// Exports into `dir` (created if missing), continuing its version numbering. The first
    /// export of an exporter is always full. Unfinished versions (no manifest) are removed.
    pub fn open(dir: &Path, opts: ExportOptions) -> Result<Exporter, ExportError> {
        let committer = Committer::open(dir, opts)?;
        let tables = TableExporter::new(dir, *committer.options(), None)?;
        Ok(Exporter { committer, tables })
    }

    /// The export directory.
    pub fn dir(&self) -> &Path {
        self.committer.dir()
    }

    /// The version the next export will get.
    pub fn next_version(&self) -> u64 {
        self.committer.next_version()
    }

    /// This exporter's lineage number.
    pub fn lineage(&self) -> u64 {
        self.committer.lineage()
    }

    /// The logical tables of each physical table (by its name), recorded in the manifests of
    /// the versions written from now on ([`TableExporter::set_members`]).
    pub fn set_members(&mut self, members: Members) {
        self.tables.set_members(members);
    }

    /// Writes the next version: full the first time, after `full_every` deltas, when the set
    /// of tables changed or a table lost tombstones; a delta otherwise.
    ///
    /// `tables` are (name, table) pairs (`embedding`, and `wide` when the model has one);
    /// `job_toml` is the job config the model was trained with. Call it between training
    /// steps: rows pushed while it runs are exported now or by the next delta.
    pub fn export(
        &mut self,
        job_toml: &str,
        model: &Model,
        tables: &[(&str, &Table)],
        step: u64,
    ) -> Result<ExportInfo, ExportError> {
        self.export_with_quality(job_toml, model, tables, step, None)
    }

    /// [`Exporter::export`], recording `quality` (the window metrics the model was trained
    /// on) in the manifest.
    pub fn export_with_quality(
        &mut self,
        job_toml: &str,
        model: &Model,
        tables: &[(&str, &Table)],
        step: u64,
        quality: Option<ExportQuality>,
    ) -> Result<ExportInfo, ExportError> {
        let start = Instant::now();
        let plan = self.committer.claim();
        let written = self.tables.write(plan.version, tables, plan.base);
        let (kind, files) = match written {
            Ok(w) => w,
            Err(e) => {
                self.committer.abandon(plan.version);
                return Err(e);
            }
        };
        match self.committer.commit_with_quality(
            plan,
            kind,
            1,
            files,
            model.param_values(),
            job_toml,
            step,
            quality,
        ) {
            Ok(mut info) => {
                info.seconds = start.elapsed().as_secs_f64();
                Ok(info)
            }
            Err(e) => {
                self.tables.forget();
                self.committer.abandon(plan.version);
                Err(e)
            }
        }
    }
}

fn counts_pulls(t: &Table) -> bool {
    t.config()
        .eviction
        .as_ref()
        .is_some_and(|e| e.min_count.is_some())
}

/// Writes a full export of the newest valid checkpoint in `checkpoint_dir` into `out`: an
/// embedded job's checkpoint as whole tables, a PS cluster's in parts (one per shard, its
/// dense slices joined in shard order). Returns the export's info and the checkpoint it came
/// from.
pub fn export_checkpoint(
    checkpoint_dir: &Path,
    out: &Path,
    opts: ExportOptions,
) -> Result<(ExportInfo, String), ExportError> {
    local_dir(out)?;
    let storage = sparta_checkpoint::open_dir(checkpoint_dir)?;
    let restored =
        sparta_checkpoint::restore_latest(storage.as_ref(), |_, cfg| Table::new(cfg.clone()))?
            .ok_or_else(|| {
                ExportError::Usage(format!(
                    "no valid checkpoint in {}",
                    checkpoint_dir.display()
                ))
            })?;
    let job = sparta_core::JobConfig::from_toml(&restored.job_config)?.validate()?;
    let no_dense = || {
        ExportError::Usage(format!(
            "checkpoint {} has no dense parameters",
            restored.id
        ))
    };
    let id = restored.id.to_string();
    let Some(cluster) = restored.manifest.cluster.as_ref() else {
        let mut cfg = job.model.clone();
        cfg.threads = 1;
        let mut model = Model::new(cfg)?;
        restored
            .dense
            .as_ref()
            .ok_or_else(no_dense)?
            .apply_to(&mut model)?;
        let tables: Vec<(&str, &Table)> = restored
            .tables
            .iter()
            .map(|t| (t.name.as_str(), &t.table))
            .collect();
        let mut ex = Exporter::open(out, opts)?;
        ex.set_members(saved_members(&restored));
        let info = ex.export(&restored.job_config, &model, &tables, restored.step)?;
        return Ok((info, id));
    };
    // A cluster checkpoint: part `ps-<k>` of every table and of the dense vector per shard.
    let shards = cluster.num_shards;
    let shard_of_part = |part: &str| -> Result<u32, ExportError> {
        part.strip_prefix("ps-")
            .and_then(|k| k.parse::<u32>().ok())
            .filter(|&k| k < shards)
            .ok_or_else(|| {
                ExportError::Usage(format!(
                    "checkpoint {id}: part `{part}` is not a PS shard of {shards}"
                ))
            })
    };
    let mut dense_parts = Vec::new();
    for (part, d) in &restored.dense_parts {
        dense_parts.push((shard_of_part(part)?, d));
    }
    dense_parts.sort_by_key(|(k, _)| *k);
    // The first `dense_shards` shards hold the dense vector (all of them but the shards
    // added while the job trained, which hold none).
    let holders = cluster.dense_shard_count() as u32;
    if (0..holders).any(|k| !dense_parts.iter().any(|(p, _)| *p == k)) {
        return Err(no_dense());
    }
    let dense: Vec<f32> = dense_parts
        .iter()
        .flat_map(|(_, d)| d.params.iter().copied())
        .collect();
    let mut committer = Committer::open(out, opts)?;
    let plan = committer.claim();
    let mut files = Vec::new();
    for k in 0..shards {
        let mut tables = Vec::new();
        for t in &restored.tables {
            if shard_of_part(&t.part)? == k {
                tables.push((t.name.as_str(), &t.table));
            }
        }
        let mut part = TableExporter::new(out, *committer.options(), Some(k))?;
        part.set_members(saved_members(&restored));
        match part.write(plan.version, &tables, None) {
            Ok((_, f)) => files.extend(f),
            Err(e) => {
                committer.abandon(plan.version);
                return Err(e);
            }
        }
    }
    let info = committer.commit(
        Plan { base: None, ..plan },
        ExportKind::Full,
        shards,
        files,
        &dense,
        &restored.job_config,
        restored.step,
    )?;
    Ok((info, id))
}

/// The logical tables a checkpoint saved, by physical table.
fn saved_members(restored: &sparta_checkpoint::Restored) -> Members {
    restored
        .manifest
        .tables
        .iter()
        .filter(|t| !t.members.is_empty())
        .map(|t| (t.name.clone(), t.members.clone()))
        .collect()
}

#[cfg(test)]
mod tests;
