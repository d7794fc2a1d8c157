//! `inspect`: every checkpoint of a storage, each file verified, with the reason it is
//! unusable if it is.

use std::collections::HashMap;

use serde::Serialize;

use crate::error::{CheckpointError, Result};
use crate::manifest::{
    list_ids, CheckpointId, CheckpointKind, Manifest, PartContent, MANIFEST_FILE,
};
use crate::storage::Storage;
use crate::verify::verify_part;

/// One file's verification.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileReport {
    /// Blob name.
    pub file: String,
    /// Size in bytes as stored.
    pub bytes: u64,
    /// Whether it verified (header, records, footer checksum, manifest entry).
    pub valid: bool,
    /// Why not, if not.
    pub reason: Option<String>,
}

/// One table part of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TablePartReport {
    /// Table name.
    pub table: String,
    /// Part name.
    pub part: String,
    /// Rows stored in this checkpoint.
    pub rows: u64,
    /// Removed keys stored (incremental).
    pub removed: u64,
    /// Rows the table held when written.
    pub table_rows: u64,
}

/// One logical table (a key space) of a physical table in a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LogicalTableReport {
    /// The physical table holding it.
    pub table: String,
    /// The logical table's name.
    pub name: String,
    /// Its tag (the top 8 bits of its keys).
    pub tag: u8,
    /// Its row width.
    pub dim: usize,
    /// Rows it holds: a full checkpoint's (the sum over the table's parts); for an
    /// incremental checkpoint, those of its chain's full checkpoint (`base`), `None` when
    /// that one is unreadable.
    pub rows: Option<u64>,
    /// Incremental checkpoints only: rows written by this checkpoint (created or changed
    /// since the previous one, summed over the table's parts).
    pub rows_changed: Option<u64>,
}

/// The cluster section of a PS cluster's checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClusterReport {
    /// PS shards.
    pub num_shards: u32,
    /// Shards holding the dense vector (fewer than `num_shards` once shards were added while
    /// training).
    pub dense_shards: u32,
    /// Training workers.
    pub num_workers: u32,
    /// Workers that had finished training.
    pub workers_done: u32,
    /// Samples whose gradients are in the checkpoint, counted once each.
    pub samples_trained: u64,
    /// The dense consistency mode.
    pub mode: String,
    /// The slot table's epoch (one more per slot move; 0 at the cluster's start).
    pub routing_epoch: u64,
    /// The slot table as `[first slot, shard]` runs.
    pub slot_runs: Vec<[u32; 2]>,
}

/// One checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckpointReport {
    /// Id.
    pub id: CheckpointId,
    /// Directory name.
    pub dir: String,
    /// Full or incremental (unknown without a readable manifest).
    pub kind: Option<CheckpointKind>,
    /// The full checkpoint of its chain.
    pub base: Option<CheckpointId>,
    /// The checkpoint it applies on top of.
    pub prev: Option<CheckpointId>,
    /// Training step.
    pub step: Option<u64>,
    /// Creation time, ms since the Unix epoch.
    pub created_unix_ms: Option<u64>,
    /// Bytes of all its files.
    pub bytes: u64,
    /// Rows per table part.
    pub tables: Vec<TablePartReport>,
    /// The logical tables of each physical table, with their rows (empty for checkpoints
    /// written before logical tables).
    pub logical_tables: Vec<LogicalTableReport>,
    /// A PS cluster's checkpoint: shards, workers and samples trained.
    pub cluster: Option<ClusterReport>,
    /// Every file, verified.
    pub files: Vec<FileReport>,
    /// Whether it can be restored (its files and whole chain verify).
    pub valid: bool,
    /// Why not, if not.
    pub reason: Option<String>,
}

/// Every checkpoint of a storage, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InspectReport {
    /// Storage location.
    pub location: String,
    /// Checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointReport>,
    /// The checkpoint `restore_latest` would restore.
    pub restorable: Option<CheckpointId>,
}

fn report_one(
    storage: &dyn Storage,
    id: CheckpointId,
) -> Result<(CheckpointReport, Option<Manifest>)> {
    let blobs = storage.list(&format!("{}/", id.dir()))?;
    let sizes: HashMap<&str, u64> = blobs.iter().map(|b| (b.name.as_str(), b.size)).collect();
    let mut r = CheckpointReport {
        id,
        dir: id.dir(),
        kind: None,
        base: None,
        prev: None,
        step: None,
        created_unix_ms: None,
        bytes: blobs.iter().map(|b| b.size).sum(),
        tables: Vec::new(),
        logical_tables: Vec::new(),
        cluster: None,
        files: Vec::new(),
        valid: false,
        reason: None,
    };
    let mname = id.file(MANIFEST_FILE);
    let manifest = match Manifest::read(storage, id) {
        Ok(m) => m,
        Err(CheckpointError::NotFound(_)) => {
            r.reason =
                Some("incomplete: no manifest (writing was interrupted or is in progress)".into());
            return Ok((r, None));
        }
        Err(e) => {
            r.files.push(FileReport {
                file: mname.clone(),
                bytes: sizes.get(mname.as_str()).copied().unwrap_or(0),
                valid: false,
                reason: Some(e.to_string()),
            });
            r.reason = Some(format!("manifest unreadable: {e}"));
            return Ok((r, None));
        }
    };
    r.kind = Some(manifest.kind);
    r.base = Some(manifest.base);
    r.prev = manifest.prev;
    r.step = Some(manifest.step);
    r.created_unix_ms = Some(manifest.created_unix_ms);
    r.cluster = manifest.cluster.as_ref().map(|c| ClusterReport {
        num_shards: c.num_shards,
        dense_shards: c.dense_shard_count() as u32,
        num_workers: c.num_workers,
        workers_done: c.workers.iter().filter(|w| w.done).count() as u32,
        samples_trained: c.samples_trained,
        mode: c.mode.clone(),
        routing_epoch: c.routing_epoch,
        slot_runs: c.slot_runs.clone(),
    });
    r.files.push(FileReport {
        file: mname.clone(),
        bytes: sizes.get(mname.as_str()).copied().unwrap_or(0),
        valid: true,
        reason: None,
    });
    for p in &manifest.parts {
        if let PartContent::Table {
            table, table_rows, ..
        } = &p.content
        {
            r.tables.push(TablePartReport {
                table: table.clone(),
                part: p.part.clone(),
                rows: p.rows,
                removed: p.removed,
                table_rows: *table_rows,
            });
        }
        let name = id.file(&p.file);
        let res = verify_part(storage, &manifest, p);
        if let (Err(e), None) = (&res, &r.reason) {
            r.reason = Some(e.to_string());
        }
        r.files.push(FileReport {
            bytes: sizes.get(name.as_str()).copied().unwrap_or(0),
            file: name,
            valid: res.is_ok(),
            reason: res.err().map(|e| e.to_string()),
        });
    }
    r.logical_tables = logical_tables(&manifest);
    r.valid = r.reason.is_none();
    Ok((r, Some(manifest)))
}

/// The logical tables of a manifest's tables with the rows its parts record per tag.
fn logical_tables(m: &Manifest) -> Vec<LogicalTableReport> {
    let mut out = Vec::new();
    for t in &m.tables {
        for member in &t.members {
            let rows: u64 = m
                .parts
                .iter()
                .filter(|p| p.table() == Some(t.name.as_str()))
                .filter_map(|p| p.tag_rows.get(&member.tag))
                .sum();
            let full = m.kind == CheckpointKind::Full;
            out.push(LogicalTableReport {
                table: t.name.clone(),
                name: member.name.clone(),
                tag: member.tag,
                dim: member.dim,
                rows: full.then_some(rows),
                rows_changed: (!full).then_some(rows),
            });
        }
    }
    out
}

/// Lists and verifies every checkpoint of `storage` (reads every file once). A checkpoint is
/// valid when all its files verify and so does every checkpoint its chain depends on.
pub fn inspect(storage: &dyn Storage) -> Result<InspectReport> {
    let mut checkpoints = Vec::new();
    let mut valid: HashMap<CheckpointId, bool> = HashMap::new();
    for id in list_ids(storage)? {
        let (mut r, m) = report_one(storage, id)?;
        if let Some(base) = r.base.filter(|&b| b != id) {
            // An incremental checkpoint's rows: those of its chain's full checkpoint.
            let base_report = checkpoints
                .iter()
                .find(|c: &&CheckpointReport| c.id == base);
            for l in &mut r.logical_tables {
                l.rows = base_report.and_then(|b| {
                    b.logical_tables
                        .iter()
                        .find(|x| x.table == l.table && x.name == l.name)
                        .and_then(|x| x.rows)
                });
            }
        }
        if let (true, Some(m)) = (r.valid, m) {
            let deps = [Some(m.base).filter(|&b| b != id), m.prev];
            for dep in deps.into_iter().flatten() {
                if !valid.get(&dep).copied().unwrap_or(false) {
                    r.valid = false;
                    r.reason = Some(format!("depends on {dep}, which is missing or invalid"));
                    break;
                }
            }
        }
        valid.insert(id, r.valid);
        checkpoints.push(r);
    }
    let restorable = checkpoints.iter().rev().find(|c| c.valid).map(|c| c.id);
    Ok(InspectReport {
        location: storage.location(),
        checkpoints,
        restorable,
    })
}

impl InspectReport {
    /// A human-readable table.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "checkpoints in {}", self.location);
        for c in &self.checkpoints {
            let kind = c.kind.map_or("?", |k| match k {
                CheckpointKind::Full => "full",
                CheckpointKind::Incremental => "incremental",
            });
            let step = c.step.map_or("?".to_string(), |s| s.to_string());
            let _ = write!(
                s,
                "{}  {kind:<11} step {step:<10} {:>12} bytes  ",
                c.dir, c.bytes
            );
            match &c.reason {
                None => {
                    let _ = writeln!(s, "OK");
                }
                Some(r) => {
                    let _ = writeln!(s, "INVALID: {r}");
                }
            }
            if let Some(k) = &c.cluster {
                let _ = writeln!(
                    s,
                    "    cluster: {} PS ({} with the dense vector), {} worker(s) ({} finished), mode \
                     {}, {} samples trained, slot table epoch {}",
                    k.num_shards,
                    k.dense_shards,
                    k.num_workers,
                    k.workers_done,
                    k.mode,
                    k.samples_trained,
                    k.routing_epoch
                );
            }
            for t in &c.tables {
                let _ = writeln!(
                    s,
                    "    table {} part {}: {} rows, {} removed (table had {} rows)",
                    t.table, t.part, t.rows, t.removed, t.table_rows
                );
            }
            for l in &c.logical_tables {
                let rows = match (l.rows, l.rows_changed, c.base) {
                    (Some(n), None, _) => format!("{n} rows"),
                    (held, Some(changed), base) => {
                        let base = base.map_or("?".to_string(), |b| b.dir());
                        match held {
                            Some(n) => format!(
                                "{changed} rows changed; {n} rows in its full checkpoint {base}"
                            ),
                            None => format!(
                                "{changed} rows changed; its full checkpoint {base} unreadable"
                            ),
                        }
                    }
                    (None, None, _) => "? rows".to_string(),
                };
                let _ = writeln!(
                    s,
                    "    logical table {} in {} (tag {}, dim {}): {rows}",
                    l.name, l.table, l.tag, l.dim
                );
            }
        }
        let _ = match self.restorable {
            Some(id) => writeln!(s, "restorable: {id}"),
            None => writeln!(s, "restorable: none"),
        };
        s
    }
}
