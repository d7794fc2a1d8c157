//! The serving crate's one error type.

use thiserror::Error;

/// Everything that can fail while exporting, loading or serving a model.
#[derive(Debug, Error)]
pub enum ServeError {
    /// Reading or writing an export file failed, or a file failed validation.
    #[error(transparent)]
    Checkpoint(#[from] sparta_checkpoint::CheckpointError),
    /// A filesystem operation outside the checksummed files failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
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
}

impl ServeError {
    /// Shorthand for [`ServeError::Io`].
    pub(crate) fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        ServeError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    /// Shorthand for [`ServeError::Invalid`].
    pub(crate) fn invalid(version: u64, reason: impl Into<String>) -> Self {
        ServeError::Invalid {
            version,
            reason: reason.into(),
        }
    }
}
