//! Serving Sparta models.
//!
//! * `sparta_export::Exporter` writes versioned exports of a training job (weights only, f32 or
//!   f16, optionally only rows pulled at least N times): a full version, then deltas of the
//!   rows changed and keys removed since the previous version, so a version a minute is cheap.
//! * [`snapshot`]: [`Snapshot`] loads an export chain and scores batches with the trainer's own
//!   lookup and dense code (served and offline scores equal the trainer's).
//! * [`chain`]: the chain rules: deltas that follow on, bad versions skipped, gaps reported
//!   (stale), lineage changes accepted with a warning; recovery at the next full export.
//! * [`reload`]: [`ModelHandle`] (no snapshot until the first export appears) polls the export directory and installs new versions whole,
//!   applying deltas in place to a spare copy (O(delta) per version, 2x the weights in memory).
//!   It can be pinned to a version and rolled back to the previous one without a restart.
//! * [`server`]: the HTTP JSON API (`POST /v1/predict`, `GET /v1/model`, `POST /v1/rollback`,
//!   `POST /v1/unpin`, `/metrics`, `/health`);
//!   [`auth`]: the optional bearer token (all but `/health`); [`tls`]: optional HTTPS (rustls).
//! * exports ([`Exporter`], [`format`]) are written and read by the `sparta-export` crate.
//!
//! Ids the export does not hold read as zeros, the value the trainer's evaluation
//! (`Table::pull_readonly`) gives them, so a served score equals the trainer's score.

pub mod auth;
pub mod chain;
pub mod error;
pub mod metrics;
pub mod reload;
pub mod request;
pub mod server;
pub mod snapshot;
pub mod tables;
pub mod tls;

pub use auth::BearerToken;
pub use chain::{Stale, StepWentBack};
pub use error::ServeError;
pub use reload::{ChainStatus, ModelHandle, PollOutcome, Rollback};
pub use request::{BadRequest, RequestParser};
pub use server::{start, start_secured, Security, ServeConfig};
pub use snapshot::Snapshot;
/// The export layout and writer live in `sparta-export`; re-exported for callers of serving.
pub use sparta_export::{
    export_checkpoint, format, list_versions, writer as export, ExportError, ExportInfo,
    ExportKind, ExportManifest, ExportOptions, ExportVersion, Exporter,
};
pub use tables::{RowMap, Tables};
