//! Restoring the newest valid checkpoint chain (full + incrementals in order).

use std::collections::HashMap;

use sparta_table::{Table, TableConfig};

use crate::error::{CheckpointError, Result};
use crate::manifest::{list_ids, CheckpointId, CheckpointKind, Manifest, PartContent, PartEntry};
use crate::rows::{read_part, PartSinks, Rows};
use crate::state::{read_dense, Restored, RestoredDense, RestoredTable};
use crate::storage::Storage;

/// Why a checkpoint cannot be used: the checkpoint and the reason.
#[derive(Debug)]
pub(crate) struct Rejected {
    pub id: CheckpointId,
    pub error: CheckpointError,
}

/// Reads the chain ending at `id` (oldest first), or the first checkpoint that breaks it.
pub(crate) fn chain_of(
    storage: &dyn Storage,
    id: CheckpointId,
    manifests: &mut HashMap<CheckpointId, Result<Manifest, String>>,
) -> Result<Vec<Manifest>, (CheckpointId, String)> {
    let mut chain = Vec::new();
    let mut cur = id;
    let mut base = None;
    loop {
        let m = manifests
            .entry(cur)
            .or_insert_with(|| Manifest::read(storage, cur).map_err(|e| e.to_string()))
            .clone()
            .map_err(|reason| (cur, reason))?;
        if base.is_some_and(|b| b != m.base) {
            return Err((
                cur,
                format!(
                    "belongs to chain {} but {} expects {}",
                    m.base,
                    id,
                    base.expect("set")
                ),
            ));
        }
        base = Some(m.base);
        let prev = m.prev;
        let kind = m.kind;
        chain.push(m);
        match (kind, prev) {
            (CheckpointKind::Full, _) => break,
            (CheckpointKind::Incremental, Some(p)) => cur = p,
            (CheckpointKind::Incremental, None) => {
                return Err((cur, "incremental without prev".into()))
            }
        }
    }
    chain.reverse();
    Ok(chain)
}

/// Cheap pre-check of a checkpoint: every listed file exists with the listed size.
pub(crate) fn check_sizes(storage: &dyn Storage, m: &Manifest) -> Result<()> {
    let present: HashMap<String, u64> = storage
        .list(&format!("{}/", m.id.dir()))?
        .into_iter()
        .map(|b| (b.name, b.size))
        .collect();
    for p in &m.parts {
        let name = m.id.file(&p.file);
        match present.get(&name) {
            None => return Err(CheckpointError::corrupt(&name, "missing part file")),
            Some(&s) if s != p.bytes => {
                return Err(CheckpointError::corrupt(
                    &name,
                    format!(
                        "{s} bytes, manifest says {} (truncated or overwritten)",
                        p.bytes
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Checks a read part against its manifest entry.
pub(crate) fn check_entry(
    name: &str,
    p: &PartEntry,
    rows: u64,
    removed: u64,
    sum: u64,
) -> Result<()> {
    let want = format!("{sum:016x}");
    if want != p.checksum {
        return Err(CheckpointError::corrupt(
            name,
            format!("checksum {want}, manifest says {}", p.checksum),
        ));
    }
    if rows != p.rows || removed != p.removed {
        return Err(CheckpointError::corrupt(
            name,
            format!(
                "{rows} rows / {removed} removed, manifest says {} / {}",
                p.rows, p.removed
            ),
        ));
    }
    Ok(())
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Restores the newest valid checkpoint chain of `storage`, or `None` if there is none.
///
/// Checkpoints are tried newest first. One without a manifest (incomplete), with a corrupt
/// or truncated file, or whose chain (base full + earlier incrementals) has such a
/// checkpoint, is logged with `tracing::warn!` (file and reason) and skipped for the previous
/// one. `make_table(name, config)` builds a fresh, empty table for each (table, part) of the
/// chain from the saved config; a failed attempt's tables are dropped and made anew. The
/// restored tables hold every row bit-identically (floats incl. optimizer state, and
/// [`sparta_table::RowMeta`]), their clock set to and version raised to the saved values.
pub fn restore_latest<E: std::fmt::Display>(
    storage: &dyn Storage,
    make_table: impl Fn(&str, &TableConfig) -> Result<Table, E>,
) -> Result<Option<Restored>> {
    let ids = list_ids(storage)?;
    let mut manifests = HashMap::new();
    let mut bad: HashMap<CheckpointId, String> = HashMap::new();
    for &id in ids.iter().rev() {
        if bad.contains_key(&id) {
            continue;
        }
        let chain = match chain_of(storage, id, &mut manifests) {
            Ok(c) => c,
            Err((at, reason)) => {
                let reason = if at == id {
                    reason
                } else {
                    format!("chain broken at {at}: {reason}")
                };
                tracing::warn!(checkpoint = %id, %reason, "skipping checkpoint");
                bad.insert(id, reason);
                continue;
            }
        };
        if let Some(m) = chain.iter().find(|m| bad.contains_key(&m.id)) {
            let reason = format!("chain includes invalid checkpoint {}", m.id);
            tracing::warn!(checkpoint = %id, %reason, "skipping checkpoint");
            bad.insert(id, reason);
            continue;
        }
        match load_chain(storage, &chain, &make_table, &|_| true) {
            Ok(r) => {
                tracing::info!(checkpoint = %id, chain = chain.len(), step = r.step, "checkpoint restored");
                return Ok(Some(r));
            }
            Err(Rejected { id: at, error }) if error.is_data_error() => {
                tracing::warn!(checkpoint = %at, reason = %error, "skipping invalid checkpoint");
                bad.insert(at, error.to_string());
                if at != id {
                    bad.insert(id, format!("chain includes invalid checkpoint {at}"));
                }
            }
            Err(Rejected { error, .. }) => return Err(error),
        }
    }
    Ok(None)
}

/// The newest checkpoint whose whole chain verifies (every file of every part read and its
/// checksum checked, not only this process's part), or `None`. Every checkpoint skipped is
/// logged with `tracing::warn!` naming the file and the reason. All processes of a cluster
/// that call this on the same storage agree on the answer, so each can then load only its own
/// part with [`restore_at`].
pub fn newest_valid(storage: &dyn Storage) -> Result<Option<CheckpointId>> {
    let ids = list_ids(storage)?;
    let mut manifests = HashMap::new();
    let mut verified: HashMap<CheckpointId, Result<(), String>> = HashMap::new();
    for &id in ids.iter().rev() {
        let chain = match chain_of(storage, id, &mut manifests) {
            Ok(c) => c,
            Err((at, reason)) => {
                let reason = if at == id {
                    reason
                } else {
                    format!("chain broken at {at}: {reason}")
                };
                tracing::warn!(checkpoint = %id, %reason, "skipping checkpoint");
                continue;
            }
        };
        let mut bad = None;
        for m in &chain {
            let r = verified
                .entry(m.id)
                .or_insert_with(|| verify_all(storage, m).map_err(|e| e.to_string()));
            if let Err(reason) = r {
                bad = Some(if m.id == id {
                    reason.clone()
                } else {
                    format!("chain includes invalid checkpoint {}: {reason}", m.id)
                });
                break;
            }
        }
        match bad {
            None => return Ok(Some(id)),
            Some(reason) => tracing::warn!(checkpoint = %id, %reason, "skipping checkpoint"),
        }
    }
    Ok(None)
}

fn verify_all(storage: &dyn Storage, m: &Manifest) -> Result<()> {
    check_sizes(storage, m)?;
    for p in &m.parts {
        crate::inspect::verify_part(storage, m, p)?;
    }
    Ok(())
}

/// Restores the chain ending at checkpoint `id`, reading only the parts `keep` accepts (a PS
/// shard reads its own part). Unlike [`restore_latest`] nothing is skipped: an invalid
/// checkpoint is an error naming the file and the reason.
pub fn restore_at<E: std::fmt::Display>(
    storage: &dyn Storage,
    id: CheckpointId,
    keep: &dyn Fn(&PartEntry) -> bool,
    make_table: impl Fn(&str, &TableConfig) -> Result<Table, E>,
) -> Result<Restored> {
    let mut manifests = HashMap::new();
    let chain = chain_of(storage, id, &mut manifests).map_err(|(at, reason)| {
        CheckpointError::corrupt(&at.file(crate::manifest::MANIFEST_FILE), reason)
    })?;
    load_chain(storage, &chain, &make_table, keep).map_err(|r| r.error)
}

fn load_chain<E: std::fmt::Display>(
    storage: &dyn Storage,
    chain: &[Manifest],
    make_table: &impl Fn(&str, &TableConfig) -> Result<Table, E>,
    keep: &dyn Fn(&PartEntry) -> bool,
) -> Result<Restored, Rejected> {
    for m in chain {
        check_sizes(storage, m).map_err(|error| Rejected { id: m.id, error })?;
    }
    let mut tables: Vec<RestoredTable> = Vec::new();
    let mut saved: Vec<(u64, u32)> = Vec::new();
    let mut dense: Option<RestoredDense> = None;
    let mut dense_parts: Vec<(String, RestoredDense)> = Vec::new();
    for m in chain {
        let rej = |error| Rejected { id: m.id, error };
        for p in m.parts.iter().filter(|p| keep(p)) {
            let name = m.id.file(&p.file);
            match &p.content {
                PartContent::Dense { params } => {
                    let (d, sum) = read_dense(storage, &name).map_err(rej)?;
                    check_entry(&name, p, 0, 0, sum).map_err(rej)?;
                    if d.params.len() != *params {
                        return Err(rej(CheckpointError::corrupt(
                            &name,
                            "dense parameter count differs from the manifest",
                        )));
                    }
                    match dense_parts.iter_mut().find(|(part, _)| *part == p.part) {
                        Some((_, slot)) => *slot = d.clone(),
                        None => dense_parts.push((p.part.clone(), d.clone())),
                    }
                    dense = Some(d);
                }
                PartContent::Table {
                    table,
                    row_stride,
                    version,
                    table_step,
                    since_version,
                    ..
                } => {
                    let idx = match tables
                        .iter()
                        .position(|t| t.name == *table && t.part == p.part)
                    {
                        Some(i) => {
                            if since_version.is_some_and(|v| v != saved[i].0) {
                                return Err(rej(CheckpointError::corrupt(
                                    &name,
                                    format!(
                                        "changes since version {since_version:?}, chain is at {}",
                                        saved[i].0
                                    ),
                                )));
                            }
                            i
                        }
                        None => {
                            let cfg = &m
                                .tables
                                .iter()
                                .find(|t| t.name == *table)
                                .ok_or_else(|| {
                                    rej(CheckpointError::corrupt(
                                        &name,
                                        format!("no config for table `{table}` in the manifest"),
                                    ))
                                })?
                                .config;
                            let t = make_table(table, cfg).map_err(|e| {
                                rej(CheckpointError::MakeTable {
                                    table: table.clone(),
                                    reason: e.to_string(),
                                })
                            })?;
                            tables.push(RestoredTable {
                                name: table.clone(),
                                part: p.part.clone(),
                                table: t,
                            });
                            saved.push((0, 0));
                            tables.len() - 1
                        }
                    };
                    let t = &tables[idx].table;
                    if t.row_stride() != *row_stride {
                        return Err(rej(CheckpointError::MakeTable {
                            table: table.clone(),
                            reason: format!(
                                "row stride {} but the checkpoint has {row_stride}",
                                t.row_stride()
                            ),
                        }));
                    }
                    let stats = read_part(
                        storage,
                        &name,
                        (table, &p.part, *row_stride),
                        threads(),
                        PartSinks {
                            removed: |keys: &[u64]| {
                                for &k in keys {
                                    t.remove(k);
                                }
                                Ok(())
                            },
                            rows: |rows: Rows| {
                                let s = *row_stride;
                                for (i, (&k, &meta)) in
                                    rows.keys.iter().zip(&rows.metas).enumerate()
                                {
                                    t.insert_raw(k, &rows.floats[i * s..(i + 1) * s], meta)?;
                                }
                                Ok(())
                            },
                            sketch: |shard: usize, counters: &[u16], increments: u64| {
                                t.restore_sketch(shard, counters, increments)
                                    .map_err(CheckpointError::from)
                            },
                        },
                    )
                    .map_err(rej)?;
                    check_entry(&name, p, stats.rows, stats.removed, stats.checksum)
                        .map_err(rej)?;
                    saved[idx] = (*version, *table_step);
                }
            }
        }
    }
    for (t, &(version, step)) in tables.iter().zip(&saved) {
        t.table.set_step(step);
        while t.table.version() < version {
            t.table.bump_version();
        }
    }
    let last = chain.last().expect("non-empty chain").clone();
    Ok(Restored {
        id: last.id,
        chain: chain.iter().map(|m| m.id).collect(),
        step: last.step,
        position: last.position.clone(),
        job_config: last.job_config.clone(),
        tables,
        dense,
        dense_parts,
        manifest: last,
    })
}
