//! Serving exports of Sparta models: what the trainer (or a PS cluster) writes and
//! `sparta serve` reads.
//!
//! * [`format`]: the files of a version (the checkpoint crate's checksummed envelope), its
//!   manifest (written last: the commit point) and the verified reader.
//! * [`writer`]: [`TableExporter`] writes table files (whole tables, or one PS shard's part of
//!   each), [`Committer`] numbers versions and publishes them (dense file + manifest, retention),
//!   [`Exporter`] is both for one process; [`export_checkpoint`] exports a checkpoint.
//! * [`quality`]: the window metrics a version was trained on (its manifest's `quality`);
//!   [`gate`]: the rule that holds back a version worse than the recent published ones.
//!
//! A full version holds every row; a delta the rows changed and keys removed since its base.
//! A cluster export writes each table in parts (keys disjoint by shard); readers join them.

pub mod error;
pub mod format;
pub mod gate;
pub mod quality;
pub mod writer;

pub use error::ExportError;
pub use format::{ExportKind, ExportManifest, ExportVersion, LogicalTable, TableData, TableFile};
pub use gate::{Gate, GateRule, Verdict};
pub use quality::{ExportQuality, TaskQuality};
pub use writer::{
    export_checkpoint, list_versions, local_dir, Committer, ExportInfo, ExportOptions, Exporter,
    Plan, TableExporter, FULL_REQUEST_FILE,
};
