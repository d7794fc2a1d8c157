//! Restoring the newest valid checkpoint chain (full + incrementals in order).

use std::collections::HashMap;
use std::sync::Arc;

use sparta_table::{Table, TableConfig};

use crate::error::{CheckpointError, Result};
use crate::manifest::{list_ids, CheckpointId, CheckpointKind, Manifest, PartContent, PartEntry};
use crate::rows::{read_part, PartSinks, Rows};
use crate::state::{read_dense, Restored, RestoredDense, RestoredTable};
use crate::storage::Storage;
use crate::verify::{check_entry, check_sizes, verify_all};

/// Why a checkpoint cannot be used: the checkpoint and the reason.
#[derive(Debug)]
pub(crate) struct Rejected {
    pub id: CheckpointId,
    pub error: CheckpointError,
}

/// Manifests read so far, by checkpoint (an unreadable one with its error), so chains that
/// share checkpoints read each manifest once.
type Manifests = HashMap<CheckpointId, Result<Manifest, Arc<CheckpointError>>>;

/// Why the chain ending at a checkpoint cannot be followed.
#[derive(Clone, Debug, thiserror::Error)]
enum ChainFault {
    /// A manifest of the chain is missing or unreadable.
    #[error(transparent)]
    Manifest(Arc<CheckpointError>),
    /// A checkpoint of the chain starts from another full checkpoint.
    #[error("belongs to chain {base} but {id} expects {expected}")]
    OtherChain {
        /// The full checkpoint it starts from.
        base: CheckpointId,
        /// The checkpoint whose chain is followed.
        id: CheckpointId,
        /// The full checkpoint that chain starts from.
        expected: CheckpointId,
    },
    /// An incremental checkpoint without a previous one.
    #[error("incremental without prev")]
    NoPrev,
}

/// The checkpoint that breaks a chain, and why.
#[derive(Debug)]
struct BrokenChain {
    at: CheckpointId,
    fault: ChainFault,
}

impl BrokenChain {
    /// The reason as logged for checkpoint `id` (whose chain it is).
    fn reason_for(&self, id: CheckpointId) -> String {
        if self.at == id {
            self.fault.to_string()
        } else {
            format!("chain broken at {}: {}", self.at, self.fault)
        }
    }
}

/// Reads the chain ending at `id` (oldest first), or the first checkpoint that breaks it.
fn chain_of(
    storage: &dyn Storage,
    id: CheckpointId,
    manifests: &mut Manifests,
) -> Result<Vec<Manifest>, BrokenChain> {
    let mut chain = Vec::new();
    let mut cur = id;
    let mut base = None;
    loop {
        let broken = |fault| BrokenChain { at: cur, fault };
        let m = manifests
            .entry(cur)
            .or_insert_with(|| Manifest::read(storage, cur).map_err(Arc::new))
            .clone()
            .map_err(|e| broken(ChainFault::Manifest(e)))?;
        if let Some(expected) = base.filter(|&b| b != m.base) {
            return Err(broken(ChainFault::OtherChain {
                base: m.base,
                id,
                expected,
            }));
        }
        base = Some(m.base);
        let prev = m.prev;
        let kind = m.kind;
        chain.push(m);
        match (kind, prev) {
            (CheckpointKind::Full, _) => break,
            (CheckpointKind::Incremental, Some(p)) => cur = p,
            (CheckpointKind::Incremental, None) => return Err(broken(ChainFault::NoPrev)),
        }
    }
    chain.reverse();
    Ok(chain)
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
            Err(broken) => {
                let reason = broken.reason_for(id);
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
        match load_chain(storage, &chain, &make_table, &|_| true, None) {
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
    let mut verified: HashMap<CheckpointId, Result<(), Arc<CheckpointError>>> = HashMap::new();
    for &id in ids.iter().rev() {
        let chain = match chain_of(storage, id, &mut manifests) {
            Ok(c) => c,
            Err(broken) => {
                let reason = broken.reason_for(id);
                tracing::warn!(checkpoint = %id, %reason, "skipping checkpoint");
                continue;
            }
        };
        let mut bad = None;
        for m in &chain {
            let r = verified
                .entry(m.id)
                .or_insert_with(|| verify_all(storage, m).map_err(Arc::new));
            if let Err(reason) = r {
                bad = Some(if m.id == id {
                    reason.to_string()
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

/// Restores the chain ending at checkpoint `id`, reading only the parts `keep` accepts (a PS
/// shard reads its own part). Unlike [`restore_latest`] nothing is skipped: an invalid
/// checkpoint is an error naming the file and the reason.
pub fn restore_at<E: std::fmt::Display>(
    storage: &dyn Storage,
    id: CheckpointId,
    keep: &dyn Fn(&PartEntry) -> bool,
    make_table: impl Fn(&str, &TableConfig) -> Result<Table, E>,
) -> Result<Restored> {
    load_chain_at(storage, id, &make_table, keep, None)
}

/// Restores the chain ending at checkpoint `id` into ONE table per table name, named part
/// `part`: the rows of every part `keep` accepts whose key `keep_key` accepts. What a PS shard
/// reads when it restores a checkpoint written by another layout (the old parts that held
/// keys it now owns, then only those keys). Admission sketches are merged (each counter the
/// larger of the parts'); each table's version and clock are the largest of its parts'.
/// Dense parts are returned per part as saved, for the caller to re-cut.
pub fn restore_merged_at<E: std::fmt::Display>(
    storage: &dyn Storage,
    id: CheckpointId,
    keep: &dyn Fn(&PartEntry) -> bool,
    keep_key: &(dyn Fn(u64) -> bool + Sync),
    part: &str,
    make_table: impl Fn(&str, &TableConfig) -> Result<Table, E>,
) -> Result<Restored> {
    let merge = Merge { keep_key, part };
    load_chain_at(storage, id, &make_table, keep, Some(&merge))
}

/// [`load_chain`] of the chain ending at `id`, nothing skipped: a broken link is an error
/// naming the manifest ([`restore_at`], [`restore_merged_at`]).
fn load_chain_at<E: std::fmt::Display>(
    storage: &dyn Storage,
    id: CheckpointId,
    make_table: &impl Fn(&str, &TableConfig) -> Result<Table, E>,
    keep: &dyn Fn(&PartEntry) -> bool,
    merge: Option<&Merge<'_>>,
) -> Result<Restored> {
    let mut manifests = HashMap::new();
    let chain = chain_of(storage, id, &mut manifests).map_err(|b| {
        CheckpointError::corrupt(
            &b.at.file(crate::manifest::MANIFEST_FILE),
            b.fault.to_string(),
        )
    })?;
    load_chain(storage, &chain, make_table, keep, merge).map_err(|r| r.error)
}

/// How a merged restore folds parts into one table per name ([`restore_merged_at`]).
struct Merge<'a> {
    keep_key: &'a (dyn Fn(u64) -> bool + Sync),
    /// The part name the merged tables take.
    part: &'a str,
}

/// Loads `chain` (oldest first): checks every file's size, then reads the parts `keep`
/// accepts, checkpoint by checkpoint, into fresh tables and dense state. An error names the
/// checkpoint it is about.
fn load_chain<E: std::fmt::Display>(
    storage: &dyn Storage,
    chain: &[Manifest],
    make_table: &impl Fn(&str, &TableConfig) -> Result<Table, E>,
    keep: &dyn Fn(&PartEntry) -> bool,
    merge: Option<&Merge<'_>>,
) -> Result<Restored, Rejected> {
    for m in chain {
        check_sizes(storage, m).map_err(|error| Rejected { id: m.id, error })?;
    }
    let mut loading = Loading {
        merge,
        ..Loading::default()
    };
    for m in chain {
        for p in m.parts.iter().filter(|p| keep(p)) {
            loading
                .part(storage, m, p, make_table)
                .map_err(|error| Rejected { id: m.id, error })?;
        }
    }
    Ok(loading.finish(chain))
}

/// What a chain restores, filled part by part (see [`load_chain`]).
#[derive(Default)]
struct Loading<'a> {
    tables: Vec<RestoredTable>,
    /// `(version, table_step)` of each of `tables` as last saved (the largest of its parts'
    /// in a merged restore).
    saved: Vec<(u64, u32)>,
    /// The version each (table, part) was last saved at: where its next increment continues.
    part_versions: HashMap<(String, String), u64>,
    dense: Option<RestoredDense>,
    dense_parts: Vec<(String, RestoredDense)>,
    /// Parts folded into one table per name ([`restore_merged_at`]).
    merge: Option<&'a Merge<'a>>,
}

impl Loading<'_> {
    /// Reads part `p` of checkpoint `m` and checks it against its manifest entry.
    fn part<E: std::fmt::Display>(
        &mut self,
        storage: &dyn Storage,
        m: &Manifest,
        p: &PartEntry,
        make_table: &impl Fn(&str, &TableConfig) -> Result<Table, E>,
    ) -> Result<()> {
        let name = m.id.file(&p.file);
        match &p.content {
            PartContent::Dense { params } => self.dense_part(storage, &name, p, *params),
            PartContent::Table {
                table,
                row_stride,
                version,
                table_step,
                since_version,
                ..
            } => {
                let idx = self.table_index(m, p, &name, table, *since_version, make_table)?;
                let t = &self.tables[idx].table;
                if t.row_stride() != *row_stride {
                    return Err(CheckpointError::MakeTable {
                        table: table.clone(),
                        reason: format!(
                            "row stride {} but the checkpoint has {row_stride}",
                            t.row_stride()
                        ),
                    });
                }
                read_table_part(storage, &name, p, (table, *row_stride), t, self.merge)?;
                self.part_versions
                    .insert((table.clone(), p.part.clone()), *version);
                let saved = &mut self.saved[idx];
                *saved = match self.merge {
                    None => (*version, *table_step),
                    Some(_) => (saved.0.max(*version), saved.1.max(*table_step)),
                };
                Ok(())
            }
        }
    }

    /// A dense part: the latest of its part name, and the latest of all.
    fn dense_part(
        &mut self,
        storage: &dyn Storage,
        name: &str,
        p: &PartEntry,
        params: usize,
    ) -> Result<()> {
        let (d, sum) = read_dense(storage, name)?;
        check_entry(name, p, 0, 0, sum)?;
        if d.params.len() != params {
            return Err(CheckpointError::corrupt(
                name,
                "dense parameter count differs from the manifest",
            ));
        }
        match self
            .dense_parts
            .iter_mut()
            .find(|(part, _)| *part == p.part)
        {
            Some((_, slot)) => *slot = d.clone(),
            None => self.dense_parts.push((p.part.clone(), d.clone())),
        }
        self.dense = Some(d);
        Ok(())
    }

    /// The index of `(table, p.part)` in `tables`: the one an earlier checkpoint of the chain
    /// filled (an incremental part must continue from its version), else a new table made
    /// from the manifest's config.
    fn table_index<E: std::fmt::Display>(
        &mut self,
        m: &Manifest,
        p: &PartEntry,
        name: &str,
        table: &str,
        since_version: Option<u64>,
        make_table: &impl Fn(&str, &TableConfig) -> Result<Table, E>,
    ) -> Result<usize> {
        let part = self.merge.map_or(p.part.as_str(), |m| m.part);
        if let Some(v) = since_version {
            let at = self.part_versions.get(&(table.to_string(), p.part.clone()));
            if at != Some(&v) {
                return Err(CheckpointError::corrupt(
                    name,
                    format!("changes since version {v}, chain is at {at:?}"),
                ));
            }
        }
        if let Some(i) = self
            .tables
            .iter()
            .position(|t| t.name == table && t.part == part)
        {
            return Ok(i);
        }
        let cfg = &m
            .tables
            .iter()
            .find(|t| t.name == table)
            .ok_or_else(|| {
                CheckpointError::corrupt(
                    name,
                    format!("no config for table `{table}` in the manifest"),
                )
            })?
            .config;
        let t = make_table(table, cfg).map_err(|e| CheckpointError::MakeTable {
            table: table.to_string(),
            reason: e.to_string(),
        })?;
        self.tables.push(RestoredTable {
            name: table.to_string(),
            part: part.to_string(),
            table: t,
        });
        self.saved.push((0, 0));
        Ok(self.tables.len() - 1)
    }

    /// Sets every table's clock and version to the saved ones; the result of the chain.
    fn finish(self, chain: &[Manifest]) -> Restored {
        for (t, &(version, step)) in self.tables.iter().zip(&self.saved) {
            t.table.set_step(step);
            while t.table.version() < version {
                t.table.bump_version();
            }
        }
        let last = chain.last().expect("non-empty chain").clone();
        Restored {
            id: last.id,
            chain: chain.iter().map(|m| m.id).collect(),
            step: last.step,
            position: last.position.clone(),
            job_config: last.job_config.clone(),
            tables: self.tables,
            dense: self.dense,
            dense_parts: self.dense_parts,
            manifest: last,
        }
    }
}

/// Reads table part `p` (file `name`) into `t`: removed keys removed, rows inserted, the
/// sketch restored; then checks it against its manifest entry.
fn read_table_part(
    storage: &dyn Storage,
    name: &str,
    p: &PartEntry,
    (table, row_stride): (&str, usize),
    t: &Table,
    merge: Option<&Merge<'_>>,
) -> Result<()> {
    let keep = |k: u64| merge.is_none_or(|m| (m.keep_key)(k));
    let stats = read_part(
        storage,
        name,
        (table, &p.part, row_stride),
        threads(),
        PartSinks {
            removed: |keys: &[u64]| {
                for &k in keys.iter().filter(|&&k| keep(k)) {
                    t.remove(k);
                }
                Ok(())
            },
            rows: |rows: Rows| {
                let s = row_stride;
                for (i, (&k, &meta)) in rows.keys.iter().zip(&rows.metas).enumerate() {
                    if keep(k) {
                        t.insert_raw(k, &rows.floats[i * s..(i + 1) * s], meta)?;
                    }
                }
                Ok(())
            },
            sketch: |shard: usize, counters: &[u16], increments: u64| {
                match merge {
                    None => t.restore_sketch(shard, counters, increments),
                    Some(_) => t.merge_sketch(shard, counters, increments),
                }
                .map_err(CheckpointError::from)
            },
        },
    )?;
    check_entry(name, p, stats.rows, stats.removed, stats.checksum)
}
