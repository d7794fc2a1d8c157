//! Checkpoints of Sparta training state: embedding tables (every row with its optimizer state
//! and [`sparta_table::RowMeta`]), table configs, dense parameters and dense optimizer state,
//! the worker's [`InputPosition`], the step and the job config text.
//!
//! # Writing
//! ```no_run
//! # use std::sync::Arc;
//! # use sparta_checkpoint::*;
//! # fn demo(table: &sparta_table::Table, model: &sparta_nn::Model) -> Result<()> {
//! let storage = Arc::new(LocalDir::new("/tmp/ckpt")?);
//! let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 2 });
//! let state = CheckpointState {
//!     tables: vec![("emb", table)],
//!     dense: Some(DenseState::of(model)),
//!     step: 1000,
//!     position: InputPosition::default(),
//!     job_config: "[job]\n...",
//! };
//! ck.write_full(&state)?;        // every row
//! ck.write_incremental(&state)?; // rows changed + keys removed since the last checkpoint
//! # Ok(()) }
//! ```
//! Several writers (one per PS shard) use [`Checkpointer::begin`]: each calls
//! [`PendingCheckpoint::write_table`] for its own part (in parallel), then one caller
//! [`PendingCheckpoint::commit`]s the manifest.
//!
//! # Logical tables
//! A physical table may store several logical tables (key spaces: the top 8 bits of a key
//! are its tag). [`Checkpointer::with_members`] / [`Checkpointer::set_members`] (or
//! [`PendingCheckpoint::set_members`] per checkpoint) name them per physical table; the
//! manifest records them in [`TableEntry::members`], and every table part its rows per tag
//! ([`PartEntry::tag_rows`]). A cluster coordinator passes the shards' entries on with
//! [`PendingCheckpoint::add_table_part`]. On resume, [`Restored::check_members`] (built on
//! [`check_members`]) refuses a job whose logical tables differ; checkpoints written before
//! logical tables (no members) pass.
//!
//! # Restoring
//! [`restore_latest`] finds the newest valid chain (last full checkpoint + later incrementals,
//! applied in order), skipping (with a `tracing::warn!` naming file and reason) checkpoints
//! that are incomplete (no manifest), truncated or corrupt. [`inspect`] verifies everything
//! and reports it.
//!
//! # Layout
//! One directory per checkpoint, `ckpt-<16-digit id>/`, with `table-<name>.<part>.rows`
//! files (format: [`rows`] module docs), `dense.<part>.bin` and `manifest.ckpt` (JSON),
//! written last. Every file has the header and checksummed footer of [`format`].
//!
//! # Storage
//! [`Storage`] with [`LocalDir`]; with the `object-store` feature, `ObjectStorage` for S3 and
//! other object stores. Processes open the configured location with [`open_storage`]:
//! a plain directory path, `file:///abs/dir` or `s3://bucket/prefix` (see [`Location`]).

mod error;
pub mod format;
mod inspect;
mod location;
mod manifest;
#[cfg(feature = "object-store")]
mod object;
mod position;
mod restore;
mod resume;
mod retry;
pub mod rows;
mod state;
mod storage;
mod verify;
mod writer;

pub use error::{CheckpointError, MemberMismatch, Result};
pub use inspect::{
    inspect, CheckpointReport, ClusterReport, FileReport, InspectReport, LogicalTableReport,
    TablePartReport,
};
pub use location::{open_dir, open_storage, parse_location, Location};
pub use manifest::{
    check_members, list_ids, CheckpointId, CheckpointKind, ClusterState, Manifest, PartContent,
    PartEntry, TableEntry, TableMember, WorkerState, MANIFEST_FILE,
};
#[cfg(feature = "object-store")]
pub use object::ObjectStorage;
/// The `object_store` crate, for building stores to pass to [`ObjectStorage::new`].
#[cfg(feature = "object-store")]
pub use object_store;
pub use position::InputPosition;
pub use restore::{newest_valid, restore_at, restore_latest, restore_merged_at};
pub use resume::{missing_local_dir, nothing_to_resume, ResumePolicy};
pub use retry::RetryPolicy;
pub use rows::{Compression, WriteOptions};
pub use state::{CheckpointState, DenseState, Restored, RestoredDense, RestoredTable};
pub use storage::{BlobInfo, BlobWriter, LocalDir, Storage};
pub use writer::{
    apply_retention, Checkpointer, Members, PendingCheckpoint, RetentionPolicy, DEFAULT_PART,
};
