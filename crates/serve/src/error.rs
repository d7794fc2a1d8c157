//! The serving crate's one error type.

use thiserror::Error;

/// Everything that can fail while exporting, loading or serving a model.
#[derive(Debug, Error)]
pub enum ServeError {
    /// Reading or writing an export file failed, or a file failed validation.
    #[error(transparent)]
    Checkpoint(#[from] sparta_checkpoint::CheckpointError),
    /// An export could not be written, read or verified.
    #[error(transparent)]
    Export(#[from] sparta_export::ExportError),
    /// The export directory holds no loadable version.
    #[error("no valid export in {0}")]
    NoExport(String),
    /// An export is internally inconsistent (a manifest disagrees with its files, a delta does
    /// not follow the loaded version, ...).
    #[error("export {version}: {reason}")]
    Invalid {
        /// The version.
        version: u64,
        /// What is wrong.
        reason: String,
    },
    /// The export's job config is invalid for this build, or a lookup failed.
    #[error(transparent)]
    Core(#[from] sparta_core::CoreError),
    /// The dense network could not be built or loaded.
    #[error(transparent)]
    Nn(#[from] sparta_nn::NnError),
    /// The caller asked for something the inputs cannot give (e.g. `min_count` on a table that
    /// does not count pulls).
    #[error("{0}")]
    Usage(String),
    /// The bearer token could not be read or is unusable.
    #[error("{0}")]
    Auth(String),
    /// The TLS certificate or key could not be read or do not make a server config.
    #[error("{0}")]
    Tls(String),
    /// A version asked for (a pin, a rollback) cannot be served: absent, or none before it.
    #[error("{0}")]
    NoSuchVersion(String),
}

impl ServeError {
    /// Shorthand for [`ServeError::Invalid`].
    pub(crate) fn invalid(version: u64, reason: impl Into<String>) -> Self {
        ServeError::Invalid {
            version,
            reason: reason.into(),
        }
    }
}
