//! The manifest: one JSON document per checkpoint, written last (its presence marks the
//! checkpoint complete), listing every part file with its size and checksum.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sparta_table::TableConfig;

use crate::error::{CheckpointError, MemberMismatch, Result};
use crate::format::{read_small, write_small, FileKind};
use crate::position::InputPosition;
use crate::storage::Storage;

/// Name of the manifest file inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.ckpt";
/// Prefix of checkpoint directory names (`ckpt-` + 16-digit id).
pub const DIR_PREFIX: &str = "ckpt-";
/// Largest manifest accepted by readers.
const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// A checkpoint's id: increases with every checkpoint written to a storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CheckpointId(pub u64);

impl CheckpointId {
    /// The checkpoint's directory name (`ckpt-0000000000000042`).
    pub fn dir(self) -> String {
        format!("{DIR_PREFIX}{:016}", self.0)
    }

    /// Name of a file inside the checkpoint's directory.
    pub fn file(self, name: &str) -> String {
        format!("{}/{name}", self.dir())
    }

    /// Parses the id from a blob name starting with a checkpoint directory.
    pub fn from_blob_name(name: &str) -> Option<CheckpointId> {
        let dir = name.split('/').next()?;
        let digits = dir.strip_prefix(DIR_PREFIX)?;
        if digits.len() != 16 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok().map(CheckpointId)
    }
}

impl std::fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.dir())
    }
}

/// Full or incremental.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// Every row of every table.
    Full,
    /// Rows changed (and keys removed) since the previous checkpoint of the chain.
    Incremental,
}

/// What a part file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PartContent {
    /// Rows of one part (PS shard) of a table.
    Table {
        /// Table name.
        table: String,
        /// Floats per row.
        row_stride: usize,
        /// Table version when the part was written (the next incremental starts here).
        version: u64,
        /// Table clock (`Table::step`) when the part was written.
        table_step: u32,
        /// Rows the table held when the part was written.
        table_rows: u64,
        /// For incremental parts: the version changes are counted from.
        since_version: Option<u64>,
    },
    /// Dense parameters and dense optimizer state.
    Dense {
        /// Parameter count.
        params: usize,
    },
}

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartEntry {
    /// File name inside the checkpoint directory.
    pub file: String,
    /// Writer (PS shard / worker) that produced it, e.g. `ps-0`.
    pub part: String,
    /// Contents.
    pub content: PartContent,
    /// File size in bytes.
    pub bytes: u64,
    /// xxh3-64 of header + payload, as 16 hex digits.
    pub checksum: String,
    /// Rows stored (table parts).
    pub rows: u64,
    /// Removed keys stored (incremental table parts).
    pub removed: u64,
    /// Rows stored per key tag (the key's top 8 bits: its logical table), tags without rows
    /// left out: every row of the part for a full checkpoint, the rows written for an
    /// incremental one. Empty in checkpoints written before logical tables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tag_rows: BTreeMap<u8, u64>,
}

impl PartEntry {
    /// Table name for table parts.
    pub fn table(&self) -> Option<&str> {
        match &self.content {
            PartContent::Table { table, .. } => Some(table),
            PartContent::Dense { .. } => None,
        }
    }
}

/// One logical table (a key space: every key whose top 8 bits are `tag`) stored in a
/// physical table.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableMember {
    /// The logical table's name (`[[tables]] name`).
    pub name: String,
    /// Its tag: the top 8 bits of its keys.
    pub tag: u8,
    /// Its row width.
    pub dim: usize,
}

/// Configuration of a table as saved, so a restore can rebuild it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableEntry {
    /// Table name.
    pub name: String,
    /// Its configuration.
    pub config: TableConfig,
    /// The logical tables it stores, by tag. Empty in checkpoints written before logical
    /// tables (and by writers that set none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<TableMember>,
}

/// Checks that the logical tables a checkpoint saved in physical table `table` are the ones
/// the job declares: same names, tags and dims. `saved` empty (a checkpoint written before
/// logical tables) passes. The error names the logical table (and both dims when only the
/// dim differs).
pub fn check_members(
    table: &str,
    saved: &[TableMember],
    job: &[TableMember],
) -> Result<(), MemberMismatch> {
    if saved.is_empty() {
        return Ok(());
    }
    for s in saved {
        let (table, name) = (table.to_string(), s.name.clone());
        match job.iter().find(|j| j.name == s.name) {
            None => return Err(MemberMismatch::NotDeclared { table, name }),
            Some(j) if j.tag != s.tag => {
                return Err(MemberMismatch::Tag {
                    table,
                    name,
                    saved: s.tag,
                    job: j.tag,
                })
            }
            Some(j) if j.dim != s.dim => {
                return Err(MemberMismatch::Dim {
                    name,
                    saved: s.dim,
                    job: j.dim,
                })
            }
            Some(_) => {}
        }
    }
    if let Some(j) = job.iter().find(|j| !saved.iter().any(|s| s.name == j.name)) {
        return Err(MemberMismatch::NotSaved {
            table: table.to_string(),
            name: j.name.clone(),
        });
    }
    Ok(())
}

/// Where one worker of a PS cluster stood when a cluster checkpoint was taken.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerState {
    /// The worker's rank.
    pub rank: u32,
    /// Steps the worker had finished (its sparse and dense updates all applied).
    pub step: u64,
    /// Its input position: every example before it has been trained on, none after it.
    pub position: InputPosition,
    /// Whether the worker had finished training.
    pub done: bool,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// The cluster section of a checkpoint written by a PS cluster (format version 2).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    /// PS shards: part `ps-<i>` holds shard i. A cluster of another count restores it by
    /// re-cutting the parts (each shard reads the keys it now owns from the old ones).
    pub num_shards: u32,
    /// Training workers.
    pub num_workers: u32,
    /// How keys are routed to shards (the name of the map; see `sparta_core::routing`).
    pub shard_map: String,
    /// The slot table of a slot map as `[first slot, shard]` runs in slot order (empty for
    /// the pre-slot map).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slot_runs: Vec<[u32; 2]>,
    /// The slot table's epoch: 0 at the cluster's start, one more per slot move (and per
    /// re-cut restore); a resumed cluster routes on from it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub routing_epoch: u64,
    /// Shards whose parts hold the dense vector, each a slice (0: all `num_shards`): fewer
    /// once shards were added while training (an added shard holds no dense slice).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub dense_shards: u32,
    /// The dense consistency mode.
    pub mode: String,
    /// Each worker's position, by rank.
    pub workers: Vec<WorkerState>,
    /// Samples whose gradients are in this checkpoint, counted once each.
    pub samples_trained: u64,
}

impl ClusterState {
    /// Shards whose parts hold the dense vector ([`ClusterState::dense_shards`], 0 read as
    /// every shard).
    pub fn dense_shard_count(&self) -> usize {
        match self.dense_shards {
            0 => self.num_shards as usize,
            n => n as usize,
        }
    }
}

/// The manifest of one checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// File-format version.
    pub format_version: u32,
    /// This checkpoint.
    pub id: CheckpointId,
    /// Full or incremental.
    pub kind: CheckpointKind,
    /// The full checkpoint this chain starts from (itself for a full one).
    pub base: CheckpointId,
    /// The checkpoint this one applies on top of (incremental only).
    pub prev: Option<CheckpointId>,
    /// Training step.
    pub step: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Where the worker's input stands.
    pub position: InputPosition,
    /// The job configuration text.
    pub job_config: String,
    /// Saved table configurations.
    pub tables: Vec<TableEntry>,
    /// Every file of the checkpoint except the manifest.
    pub parts: Vec<PartEntry>,
    /// Worker positions and layout of a PS-cluster checkpoint (absent in embedded ones and
    /// in format version 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterState>,
}

impl Manifest {
    /// Writes the manifest (the commit point of the checkpoint).
    pub fn write(&self, storage: &dyn Storage) -> Result<()> {
        let json = serde_json::to_vec_pretty(self)
            .map_err(|e| CheckpointError::Usage(format!("manifest serialization: {e}")))?;
        write_small(
            storage,
            &self.id.file(MANIFEST_FILE),
            FileKind::Manifest,
            &json,
        )?;
        Ok(())
    }

    /// Reads and verifies the manifest of checkpoint `id`.
    pub fn read(storage: &dyn Storage, id: CheckpointId) -> Result<Manifest> {
        let name = id.file(MANIFEST_FILE);
        let (json, _) = read_small(storage, &name, FileKind::Manifest, MAX_MANIFEST_BYTES)?;
        let m: Manifest = serde_json::from_slice(&json)
            .map_err(|e| CheckpointError::corrupt(&name, format!("manifest JSON: {e}")))?;
        if m.id != id {
            return Err(CheckpointError::corrupt(
                &name,
                format!("manifest of {} found in {}", m.id, id.dir()),
            ));
        }
        let chain_ok = match m.kind {
            CheckpointKind::Full => m.base == id && m.prev.is_none(),
            CheckpointKind::Incremental => m.prev.is_some_and(|p| p < id) && m.base < id,
        };
        if !chain_ok {
            return Err(CheckpointError::corrupt(
                &name,
                "inconsistent base / prev links",
            ));
        }
        Ok(m)
    }
}

/// Ids of every checkpoint directory present (complete or not), ascending.
pub fn list_ids(storage: &dyn Storage) -> Result<Vec<CheckpointId>> {
    Ok(list_checkpoints(storage)?.0)
}

/// One listing: the ids of every checkpoint directory present, and of those committed (their
/// manifest written), both ascending.
pub(crate) fn list_checkpoints(
    storage: &dyn Storage,
) -> Result<(Vec<CheckpointId>, Vec<CheckpointId>)> {
    let blobs = storage.list(DIR_PREFIX)?;
    let ids_of = |only_manifests: bool| {
        let manifest = format!("/{MANIFEST_FILE}");
        let mut ids: Vec<CheckpointId> = blobs
            .iter()
            .filter(|b| !only_manifests || b.name.ends_with(&manifest))
            .filter_map(|b| CheckpointId::from_blob_name(&b.name))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    Ok((ids_of(false), ids_of(true)))
}

/// Checks that a table or part name can be used in file names.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(CheckpointError::InvalidName(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, tag: u8, dim: usize) -> TableMember {
        TableMember {
            name: name.into(),
            tag,
            dim,
        }
    }

    #[test]
    fn check_members_names_the_table_that_differs() {
        let saved = [m("user", 0, 16), m("item", 1, 32)];
        assert_eq!(check_members("embedding", &saved, &saved), Ok(()));
        // An old checkpoint (no members) passes.
        assert_eq!(check_members("embedding", &[], &saved), Ok(()));
        assert_eq!(
            check_members("embedding", &saved, &[m("user", 0, 16), m("item", 1, 64)])
                .map_err(|e| e.to_string()),
            Err("table \"item\": the checkpoint holds dim 32, the job says dim 64".into())
        );
        let unsupported = "changing the tables across a resume is not supported";
        for (job, named) in [
            (vec![m("user", 0, 16), m("item", 2, 32)], "\"item\""),
            (vec![m("user", 0, 16)], "\"item\""),
            (
                vec![m("user", 0, 16), m("item", 1, 32), m("cat", 2, 32)],
                "\"cat\"",
            ),
        ] {
            let e = check_members("embedding", &saved, &job)
                .unwrap_err()
                .to_string();
            assert!(e.contains(named) && e.contains("embedding"), "{e}");
            assert!(e.contains(unsupported), "{e}");
        }
    }

    #[test]
    fn entries_without_members_or_tag_rows_load_and_write_as_before() {
        // A table entry and a part entry as written before logical tables.
        let table = r#"{"name":"embedding","config":{"name":"embedding","dim":8}}"#;
        let t: TableEntry = serde_json::from_str(table).unwrap();
        assert!(t.members.is_empty());
        assert!(!serde_json::to_string(&t).unwrap().contains("members"));
        let part = r#"{"file":"table-embedding.ps-0.rows","part":"ps-0",
            "content":{"type":"table","table":"embedding","row_stride":16,"version":3,
            "table_step":2,"table_rows":5,"since_version":null},
            "bytes":100,"checksum":"00000000000000ff","rows":5,"removed":0}"#;
        let p: PartEntry = serde_json::from_str(part).unwrap();
        assert!(p.tag_rows.is_empty());
        assert!(!serde_json::to_string(&p).unwrap().contains("tag_rows"));
        // And with them, they round-trip (tags as JSON object keys).
        let p2 = PartEntry {
            tag_rows: BTreeMap::from([(0, 3), (255, 2)]),
            ..p
        };
        let text = serde_json::to_string(&p2).unwrap();
        assert!(text.contains(r#""tag_rows":{"0":3,"255":2}"#), "{text}");
        assert_eq!(serde_json::from_str::<PartEntry>(&text).unwrap(), p2);
        let t2 = TableEntry {
            members: vec![m("user", 0, 8)],
            ..t
        };
        let text = serde_json::to_string(&t2).unwrap();
        assert_eq!(serde_json::from_str::<TableEntry>(&text).unwrap(), t2);
    }
}
