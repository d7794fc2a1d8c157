//! Writing checkpoints: [`Checkpointer`] (full / incremental, retention) and
//! [`PendingCheckpoint`] (several writers, one part each, then one commit).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use sparta_table::{RowMeta, Table, TableConfig};

use crate::error::{CheckpointError, Result};
use crate::format::FORMAT_VERSION;
use crate::manifest::{
    check_name, list_checkpoints, list_ids, CheckpointId, CheckpointKind, ClusterState, Manifest,
    PartContent, PartEntry, TableEntry, TableMember, MANIFEST_FILE,
};
use crate::position::InputPosition;
use crate::retry::RetryPolicy;
use crate::rows::{write_part, RowLayout, WriteOptions};
use crate::state::{write_dense, CheckpointState, DenseState, Restored};
use crate::storage::Storage;

mod coordinated;

/// Part name used by the single-writer API ([`Checkpointer::write_full`] and friends).
pub const DEFAULT_PART: &str = "ps-0";

/// Which checkpoints to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RetentionPolicy {
    /// Keep the newest `keep_full` full checkpoints (with readable manifests) and every
    /// checkpoint after the oldest of them (their incrementals); delete everything older.
    /// 0 keeps everything.
    pub keep_full: usize,
}

/// Where an incremental chain stands for one (table, part).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    version: u64,
    step: u32,
}

type PartKey = (String, String);

/// Which rows of a table go into a part file.
type RowFilter = Box<dyn Fn(&RowMeta) -> bool>;

/// The logical tables of each physical table, by physical table name.
pub type Members = HashMap<String, Vec<TableMember>>;

/// The chain this process is extending.
#[derive(Clone, Debug)]
struct Chain {
    base: CheckpointId,
    last: CheckpointId,
    cursors: HashMap<PartKey, Cursor>,
}

/// Writes checkpoints to one storage and applies the retention policy after each commit.
///
/// The incremental chain lives in memory: after a restart, [`Checkpointer::resume`] continues
/// the restored chain, otherwise the first [`Checkpointer::write_incremental`] writes a full
/// checkpoint.
pub struct Checkpointer {
    storage: Arc<dyn Storage>,
    policy: RetentionPolicy,
    opts: WriteOptions,
    retry: RetryPolicy,
    chain: Mutex<Option<Chain>>,
    members: Mutex<Members>,
}

impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointer")
            .field("storage", &self.storage)
            .field("policy", &self.policy)
            .field("opts", &self.opts)
            .finish()
    }
}

impl Checkpointer {
    /// A checkpointer with default [`WriteOptions`].
    pub fn new(storage: Arc<dyn Storage>, policy: RetentionPolicy) -> Checkpointer {
        Checkpointer {
            storage,
            policy,
            opts: WriteOptions::default(),
            retry: RetryPolicy::default(),
            chain: Mutex::new(None),
            members: Mutex::new(HashMap::new()),
        }
    }

    /// The logical tables of each physical table (by its name), recorded in the manifest
    /// entry of every table this checkpointer's checkpoints hold (tables without an entry
    /// get none). See [`Checkpointer::set_members`].
    pub fn with_members(self, members: Members) -> Checkpointer {
        *self.members.lock() = members;
        self
    }

    /// Replaces the logical tables recorded for the checkpoints begun from now on. The
    /// coordinator of a cluster checkpoint (the one that commits the manifest) is the one
    /// that needs them; PS shards that set them also send them with their parts.
    pub fn set_members(&self, members: Members) {
        *self.members.lock() = members;
    }

    /// How failed writes are retried (default: not at all). [`Checkpointer::write_full`]
    /// and [`Checkpointer::write_incremental`] follow it; writers of a cluster checkpoint
    /// use [`Checkpointer::retry`] around their share.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Checkpointer {
        self.retry = retry;
        self
    }

    /// The retry policy.
    pub fn retry(&self) -> RetryPolicy {
        self.retry
    }

    /// Deletes every file of checkpoint `id` (the manifest first), e.g. a partial one.
    pub fn discard(&self, id: CheckpointId) -> Result<()> {
        self.storage.delete(&id.file(MANIFEST_FILE))?;
        for blob in self.storage.list(&format!("{}/", id.dir()))? {
            self.storage.delete(&blob.name)?;
        }
        self.storage.prune_dir(&id.dir())
    }

    /// Deletes the files of part `part` of checkpoint `id` (one shard's failed share).
    pub fn discard_part(&self, id: CheckpointId, part: &str) -> Result<()> {
        let (rows, dense) = (format!(".{part}.rows"), format!("dense.{part}.bin"));
        for blob in self.storage.list(&format!("{}/", id.dir()))? {
            let file = blob.name.rsplit('/').next().unwrap_or("");
            if file.ends_with(&rows) || file == dense {
                self.storage.delete(&blob.name)?;
            }
        }
        self.storage.prune_dir(&id.dir())
    }

    /// Deletes the checkpoints newer than the newest committed one (what failed writes of
    /// this single writer left); returns their ids.
    pub fn discard_uncommitted(&self) -> Result<Vec<CheckpointId>> {
        let (ids, committed) = crate::manifest::list_checkpoints(&*self.storage)?;
        let newest_committed = committed.last().copied();
        let mut gone = Vec::new();
        for id in ids {
            if Some(id) > newest_committed {
                self.discard(id)?;
                gone.push(id);
            }
        }
        Ok(gone)
    }

    /// Removes the temporary files unfinished writes left (a process killed mid-write) whose
    /// final name `select` picks: at start, a writer's own files (no live writer writes
    /// them). Returns how many were removed.
    pub fn remove_unfinished(&self, select: &dyn Fn(&str) -> bool) -> Result<usize> {
        let gone = self.storage.remove_unfinished(&|name, _| select(name))?;
        if !gone.is_empty() {
            tracing::info!(
                "removed {} unfinished checkpoint file(s) of a stopped writer in {}",
                gone.len(),
                self.storage.location()
            );
        }
        Ok(gone.len())
    }

    /// Replaces the write options.
    pub fn with_options(mut self, opts: WriteOptions) -> Checkpointer {
        self.opts = opts;
        self
    }

    /// The storage written to.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Continues the incremental chain of a restored checkpoint: the next incremental holds
    /// the changes since it (the restored tables carry the saved versions).
    pub fn resume(&self, restored: &Restored) {
        let mut cursors = HashMap::new();
        for p in &restored.manifest.parts {
            if let PartContent::Table {
                table,
                version,
                table_step,
                ..
            } = &p.content
            {
                let c = Cursor {
                    version: *version,
                    step: *table_step,
                };
                cursors.insert((table.clone(), p.part.clone()), c);
            }
        }
        // Parts not rewritten by later incrementals keep the cursor of the latest write:
        // restored tables were bumped to the latest saved version of their part.
        for t in &restored.tables {
            let key = (t.name.clone(), t.part.clone());
            cursors.entry(key).or_insert(Cursor {
                version: t.table.version(),
                step: t.table.step(),
            });
        }
        *self.chain.lock() = Some(Chain {
            base: restored.manifest.base,
            last: restored.id,
            cursors,
        });
    }

    /// Starts a checkpoint written by one or more writers. `Incremental` fails with
    /// [`CheckpointError::NeedFull`] when this process has no chain to extend.
    pub fn begin(&self, kind: CheckpointKind) -> Result<PendingCheckpoint<'_>> {
        let chain = self.chain.lock().clone();
        let last_listed = list_ids(&*self.storage)?.last().copied();
        let after = last_listed.max(chain.as_ref().map(|c| c.last));
        let id = CheckpointId(after.map_or(1, |i| i.0 + 1));
        let (base, prev, since) = match (kind, chain) {
            (CheckpointKind::Full, _) => (id, None, HashMap::new()),
            (CheckpointKind::Incremental, Some(c)) => (c.base, Some(c.last), c.cursors),
            (CheckpointKind::Incremental, None) => {
                return Err(CheckpointError::NeedFull {
                    table: String::new(),
                    part: String::new(),
                    reason: "no previous checkpoint in this process".into(),
                })
            }
        };
        Ok(PendingCheckpoint {
            ck: self,
            id,
            kind,
            base,
            prev,
            since,
            parts: Mutex::new(Vec::new()),
            tables: Mutex::new(Vec::new()),
            cursors: Mutex::new(HashMap::new()),
            members: Mutex::new(self.members.lock().clone()),
        })
    }

    /// Writes a full checkpoint of `state` (tables as part [`DEFAULT_PART`], dense as part
    /// `dense`) and applies retention.
    pub fn write_full(&self, state: &CheckpointState<'_>) -> Result<CheckpointId> {
        self.retrying("writing a full checkpoint", || {
            self.write_attempt(self.begin(CheckpointKind::Full)?, state)
        })
    }

    /// Runs `attempt` under the retry policy; each failure's partial checkpoint is removed.
    fn retrying(
        &self,
        what: &str,
        attempt: impl FnMut() -> Result<CheckpointId>,
    ) -> Result<CheckpointId> {
        self.retry.run(what, attempt, || {
            if let Err(e) = self.discard_uncommitted() {
                tracing::warn!("removing a partial checkpoint: {e}");
            }
        })
    }

    /// Writes the rows changed since the previous checkpoint of the chain (and the keys
    /// removed), the full dense state and the metadata. Falls back to a full checkpoint when
    /// there is no chain yet or a table lost tombstones (`Delta::removed_truncated`).
    pub fn write_incremental(&self, state: &CheckpointState<'_>) -> Result<CheckpointId> {
        let attempt = self.retrying("writing an incremental checkpoint", || {
            self.begin(CheckpointKind::Incremental)
                .and_then(|p| self.write_attempt(p, state))
        });
        match attempt {
            Err(CheckpointError::NeedFull {
                table,
                part,
                reason,
            }) => {
                tracing::info!(%table, %part, %reason, "writing a full checkpoint instead of an incremental one");
                self.write_full(state)
            }
            other => other,
        }
    }

    /// [`Checkpointer::write_state`]; a failure removes what the attempt wrote, its
    /// directory included (a write that failed on its first file lists no blob, so
    /// [`Checkpointer::discard_uncommitted`] alone would leave the directory behind).
    fn write_attempt(
        &self,
        p: PendingCheckpoint<'_>,
        st: &CheckpointState<'_>,
    ) -> Result<CheckpointId> {
        let id = p.id();
        self.write_state(p, st).inspect_err(|_| {
            if let Err(e) = self.discard(id) {
                tracing::warn!("removing the partial checkpoint {id}: {e}");
            }
        })
    }

    fn write_state(
        &self,
        p: PendingCheckpoint<'_>,
        st: &CheckpointState<'_>,
    ) -> Result<CheckpointId> {
        for (name, table) in &st.tables {
            p.write_table(DEFAULT_PART, name, table)?;
        }
        if let Some(d) = &st.dense {
            p.write_dense("dense", d)?;
        }
        p.commit(st.step, st.position.clone(), st.job_config)
    }

    /// Applies the retention policy now; returns the checkpoints deleted.
    pub fn apply_retention(&self) -> Result<Vec<CheckpointId>> {
        apply_retention(&*self.storage, self.policy)
    }
}

/// A checkpoint being written: parts from one or several writers (each `&self` call may run
/// on its own thread), then [`PendingCheckpoint::commit`] writes the manifest. Dropped
/// without commit, it leaves an incomplete checkpoint that restore skips and retention
/// deletes.
pub struct PendingCheckpoint<'c> {
    ck: &'c Checkpointer,
    id: CheckpointId,
    kind: CheckpointKind,
    base: CheckpointId,
    prev: Option<CheckpointId>,
    since: HashMap<PartKey, Cursor>,
    parts: Mutex<Vec<PartEntry>>,
    tables: Mutex<Vec<TableEntry>>,
    cursors: Mutex<HashMap<PartKey, Cursor>>,
    members: Mutex<Members>,
}

impl PendingCheckpoint<'_> {
    /// The id this checkpoint will have.
    pub fn id(&self) -> CheckpointId {
        self.id
    }

    /// Full or incremental.
    pub fn kind(&self) -> CheckpointKind {
        self.kind
    }

    /// Moves this process's incremental chain on to this checkpoint: the cursors of the parts
    /// written now, plus (incremental) the earlier cursors of the parts not rewritten. A later
    /// incremental checkpoint then holds the changes since this one.
    fn advance_chain(&mut self) {
        let written = std::mem::take(self.cursors.get_mut());
        let cursors = match self.kind {
            CheckpointKind::Full => written,
            CheckpointKind::Incremental => {
                let mut c = std::mem::take(&mut self.since);
                c.extend(written);
                c
            }
        };
        *self.ck.chain.lock() = Some(Chain {
            base: self.base,
            last: self.id,
            cursors,
        });
    }

    /// The full checkpoint this chain starts from (the id itself for a full one).
    pub fn base(&self) -> CheckpointId {
        self.base
    }

    /// The checkpoint an incremental one applies on top of.
    pub fn prev(&self) -> Option<CheckpointId> {
        self.prev
    }

    /// For an incremental checkpoint: the table version the part's changes are counted from
    /// (what a remote PS shard passes to `Table::changed_since`).
    pub fn since_version(&self, table: &str, part: &str) -> Option<u64> {
        self.since
            .get(&(table.to_string(), part.to_string()))
            .map(|c| c.version)
    }

    /// Sets the logical tables recorded for physical table `table` in this checkpoint
    /// (overrides what the checkpointer was given).
    pub fn set_members(&self, table: &str, members: Vec<TableMember>) {
        self.members.lock().insert(table.to_string(), members);
    }

    fn record_table(&self, name: &str, config: &TableConfig) -> Result<()> {
        let mut tables = self.tables.lock();
        match tables.iter().find(|t| t.name == name) {
            Some(t) if t.config != *config => Err(CheckpointError::Usage(format!(
                "parts of table `{name}` have different configs"
            ))),
            Some(_) => Ok(()),
            None => {
                tables.push(TableEntry {
                    name: name.to_string(),
                    config: config.clone(),
                    members: Vec::new(),
                });
                Ok(())
            }
        }
    }

    /// The table entries, each with its logical tables: those set on this checkpoint (or its
    /// checkpointer) for it, else those a part's writer sent with it
    /// ([`PendingCheckpoint::add_table_part`]).
    fn take_tables(&mut self) -> Vec<TableEntry> {
        let members = self.members.get_mut();
        let mut tables = std::mem::take(self.tables.get_mut());
        for t in &mut tables {
            if let Some(m) = members.get(&t.name) {
                t.members = m.clone();
            }
        }
        tables
    }

    fn add(&self, entry: PartEntry) -> Result<PartEntry> {
        let mut parts = self.parts.lock();
        if parts.iter().any(|p| p.file == entry.file) {
            return Err(CheckpointError::Usage(format!(
                "part file `{}` written twice",
                entry.file
            )));
        }
        parts.push(entry.clone());
        Ok(entry)
    }

    /// Writes part `part` of table `name`: every row for a full checkpoint, for an
    /// incremental one the rows written (or, if the table clock moves, pulled) since the
    /// previous checkpoint plus the keys removed since. Rows are saved with their optimizer
    /// state and [`RowMeta`].
    pub fn write_table(&self, part: &str, name: &str, table: &Table) -> Result<PartEntry> {
        check_name(part)?;
        check_name(name)?;
        self.record_table(name, table.config())?;
        let key = (name.to_string(), part.to_string());
        let since = match self.kind {
            CheckpointKind::Full => None,
            CheckpointKind::Incremental => self.since.get(&key).copied(),
        };
        let (version, removed, filter): (u64, Vec<u64>, RowFilter) = match since {
            None => (table.version(), Vec::new(), Box::new(|_: &RowMeta| true)),
            Some(c) => {
                let delta = table.changed_since(c.version);
                if delta.removed_truncated {
                    return Err(CheckpointError::NeedFull {
                        table: name.to_string(),
                        part: part.to_string(),
                        reason: "the table dropped tombstones older than the previous checkpoint"
                            .into(),
                    });
                }
                let clock_moves = table.step() > 0;
                let filter = move |m: &RowMeta| {
                    m.version as u64 > c.version
                        || m.version == u32::MAX
                        || (clock_moves && m.last_step >= c.step)
                };
                (delta.version, delta.removed, Box::new(filter))
            }
        };
        let table_step = table.step();
        let file = format!("table-{name}.{part}.rows");
        let mut tag_counts = [0u64; 256];
        let stats = write_part(
            &*self.ck.storage,
            &self.id.file(&file),
            name,
            part,
            RowLayout {
                precision: table.config().precision,
                dim: table.dim(),
                stride: table.row_stride(),
            },
            &removed,
            |sink| {
                table.for_each_row(|k, row, m| {
                    if filter(&m) {
                        tag_counts[(k >> 56) as usize] += 1;
                        sink(k, row, m)
                    }
                })
            },
            &|sink| table.for_each_sketch(|i, c, n| sink(i, c, n)),
            &self.ck.opts,
        )?;
        self.cursors.lock().insert(
            key,
            Cursor {
                version,
                step: table_step,
            },
        );
        tracing::debug!(checkpoint = %self.id, table = name, part, rows = stats.rows, removed = stats.removed, sketches = stats.sketches, bytes = stats.bytes, "table part written");
        self.add(PartEntry {
            file,
            part: part.to_string(),
            content: PartContent::Table {
                table: name.to_string(),
                row_stride: table.row_stride(),
                version,
                table_step,
                table_rows: table.len() as u64,
                since_version: since.map(|c| c.version),
            },
            bytes: stats.bytes,
            checksum: format!("{:016x}", stats.checksum),
            rows: stats.rows,
            removed: stats.removed,
            tag_rows: tag_map(&tag_counts),
        })
    }

    /// Writes the dense parameters and optimizer state as part `part`.
    pub fn write_dense(&self, part: &str, dense: &DenseState<'_>) -> Result<PartEntry> {
        check_name(part)?;
        let file = format!("dense.{part}.bin");
        let (bytes, sum) = write_dense(&*self.ck.storage, &self.id.file(&file), dense)?;
        self.add(PartEntry {
            file,
            part: part.to_string(),
            content: PartContent::Dense {
                params: dense.params.len(),
            },
            bytes,
            checksum: format!("{sum:016x}"),
            rows: 0,
            removed: 0,
            tag_rows: BTreeMap::new(),
        })
    }

    /// Adds a part written elsewhere (e.g. by a remote PS shard into the same storage) with
    /// its table's config.
    pub fn add_part(&self, entry: PartEntry, config: Option<&TableConfig>) -> Result<()> {
        check_name(&entry.part)?;
        if let (Some(t), Some(cfg)) = (entry.table(), config) {
            self.record_table(t, cfg)?;
            if let PartContent::Table {
                version,
                table_step,
                ..
            } = &entry.content
            {
                let c = Cursor {
                    version: *version,
                    step: *table_step,
                };
                self.cursors
                    .lock()
                    .insert((t.to_string(), entry.part.clone()), c);
            }
        } else if entry.table().is_some() {
            return Err(CheckpointError::Usage(
                "a table part needs its table config".into(),
            ));
        }
        self.add(entry).map(drop)
    }

    /// [`PendingCheckpoint::add_part`] for a table part written elsewhere, with its table's
    /// entry as that writer recorded it (`into_parts`): the config, and the logical tables
    /// unless this checkpoint (or its checkpointer) sets them for the table.
    pub fn add_table_part(&self, entry: PartEntry, table: &TableEntry) -> Result<()> {
        if entry.table() != Some(table.name.as_str()) {
            return Err(CheckpointError::Usage(format!(
                "part `{}` is not a part of table `{}`",
                entry.file, table.name
            )));
        }
        self.add_part(entry, Some(&table.config))?;
        if !table.members.is_empty() {
            let mut members = self.members.lock();
            let m = members.entry(table.name.clone()).or_default();
            if m.is_empty() {
                *m = table.members.clone();
            }
        }
        Ok(())
    }

    /// Writes the manifest (the checkpoint is complete from here on), extends this process's
    /// chain and applies the retention policy (failures there are logged, not returned).
    pub fn commit(
        self,
        step: u64,
        position: InputPosition,
        job_config: &str,
    ) -> Result<CheckpointId> {
        self.commit_with(step, position, job_config, None)
    }

    /// [`PendingCheckpoint::commit`] with the cluster section of the manifest (worker
    /// positions, shard count, samples trained) of a PS-cluster checkpoint.
    pub fn commit_with(
        mut self,
        step: u64,
        position: InputPosition,
        job_config: &str,
        cluster: Option<ClusterState>,
    ) -> Result<CheckpointId> {
        let mut parts = std::mem::take(self.parts.get_mut());
        parts.sort_by(|a, b| a.file.cmp(&b.file));
        let mut tables = self.take_tables();
        tables.sort_by(|a, b| a.name.cmp(&b.name));
        let created_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            id: self.id,
            kind: self.kind,
            base: self.base,
            prev: self.prev,
            step,
            created_unix_ms,
            position,
            job_config: job_config.to_string(),
            tables,
            parts,
            cluster,
        };
        manifest.write(&*self.ck.storage)?;
        self.advance_chain();
        let bytes: u64 = manifest.parts.iter().map(|p| p.bytes).sum();
        tracing::info!(checkpoint = %self.id, kind = ?self.kind, step, bytes, "checkpoint committed");
        if let Err(e) = self.ck.apply_retention() {
            tracing::warn!(error = %e, "checkpoint retention failed");
        }
        Ok(self.id)
    }
}

/// Removes temporary files of unfinished writes older than the newest committed checkpoint:
/// every writer of a later checkpoint started after that commit, so these belong to no live
/// writer (a process killed mid-write left them). Best effort: failures are logged.
fn remove_stale_unfinished(storage: &dyn Storage, ids: &[CheckpointId]) {
    let Some(newest) = ids
        .iter()
        .rev()
        .find_map(|&id| Manifest::read(storage, id).ok())
    else {
        return;
    };
    let committed = UNIX_EPOCH + std::time::Duration::from_millis(newest.created_unix_ms);
    match storage.remove_unfinished(&|_, modified| modified < committed) {
        Ok(gone) if !gone.is_empty() => tracing::info!(
            "removed {} unfinished checkpoint file(s) older than {}: {}",
            gone.len(),
            newest.id,
            gone.join(", ")
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("removing unfinished checkpoint files: {e}"),
    }
}

/// Deletes every checkpoint directory without a manifest whose id is below the newest
/// committed checkpoint's: a write interrupted before its commit (a killed process, an
/// object store that lost a writer) left those blobs, and no live writer works on an id
/// below a committed one. In object storage nothing else ever removes them. Best effort:
/// failures are logged.
fn remove_uncommitted(storage: &dyn Storage, ids: &[CheckpointId], committed: &[CheckpointId]) {
    let Some(&newest) = committed.last() else {
        return;
    };
    for &id in ids.iter().filter(|&&id| id < newest) {
        if committed.binary_search(&id).is_ok() {
            continue;
        }
        let removed = storage.list(&format!("{}/", id.dir())).and_then(|blobs| {
            for b in &blobs {
                storage.delete(&b.name)?;
            }
            storage.prune_dir(&id.dir())?;
            Ok(blobs.len())
        });
        match removed {
            Ok(n) => tracing::info!(
                checkpoint = %id,
                "removed {n} file(s) of an uncommitted checkpoint older than {newest}"
            ),
            Err(e) => tracing::warn!(checkpoint = %id, "removing an uncommitted checkpoint: {e}"),
        }
    }
}

/// Keeps the newest `policy.keep_full` full checkpoints with readable manifests and all
/// later checkpoints; deletes every checkpoint directory older than the oldest kept full one
/// (incomplete ones included). Returns the ids deleted.
pub fn apply_retention(
    storage: &dyn Storage,
    policy: RetentionPolicy,
) -> Result<Vec<CheckpointId>> {
    if policy.keep_full == 0 {
        return Ok(Vec::new());
    }
    let (ids, committed) = list_checkpoints(storage)?;
    remove_uncommitted(storage, &ids, &committed);
    let fulls: Vec<CheckpointId> = ids
        .iter()
        .rev()
        .filter(|&&id| Manifest::read(storage, id).is_ok_and(|m| m.kind == CheckpointKind::Full))
        .take(policy.keep_full)
        .copied()
        .collect();
    remove_stale_unfinished(storage, &ids);
    if fulls.len() < policy.keep_full {
        return Ok(Vec::new());
    }
    let oldest = *fulls.last().expect("keep_full > 0");
    let mut deleted = Vec::new();
    for &id in ids.iter().filter(|&&id| id < oldest) {
        // Manifest first: an interrupted deletion leaves an incomplete checkpoint, never a
        // complete-looking one with missing parts.
        storage.delete(&id.file(MANIFEST_FILE))?;
        for blob in storage.list(&format!("{}/", id.dir()))? {
            storage.delete(&blob.name)?;
        }
        tracing::info!(checkpoint = %id, "checkpoint deleted by retention");
        deleted.push(id);
    }
    Ok(deleted)
}

/// The non-zero entries of per-tag row counts.
pub(crate) fn tag_map(counts: &[u64; 256]) -> BTreeMap<u8, u64> {
    (0..=255u8)
        .zip(counts.iter())
        .filter(|(_, &n)| n > 0)
        .map(|(t, &n)| (t, n))
        .collect()
}

#[cfg(test)]
mod tests;
