//! The export crate's one error type.

use thiserror::Error;

/// Everything that can fail while writing or reading an export.
#[derive(Debug, Error)]
pub enum ExportError {
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
    /// An export is internally inconsistent (a manifest disagrees with its files, a part is
    /// missing, ...).
    #[error("export {version}: {reason}")]
    Invalid {
        /// The version.
        version: u64,
        /// What is wrong.
        reason: String,
    },
    /// The job config in a checkpoint is invalid for this build.
    #[error(transparent)]
    Core(#[from] sparta_core::CoreError),
    /// The dense network could not be built or loaded.
    #[error(transparent)]
    Nn(#[from] sparta_nn::NnError),
    /// The caller asked for something the inputs cannot give (e.g. `min_count` on a table that
    /// does not count pulls).
    #[error("{0}")]
    Usage(String),
    /// An object-storage URL where an export directory is expected: exports are written to
    /// local (or mounted) directories only, so the URL is refused instead of being taken for
    /// a relative path (a folder named `s3:`).
    #[error(
        "{0}: exports are written to a local or mounted directory; object storage URLs are not \
         supported for exports (checkpoints take them): give a directory path"
    )]
    ObjectUrl(String),
}

impl ExportError {
    /// Shorthand for [`ExportError::Io`].
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        ExportError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    /// Shorthand for [`ExportError::Invalid`].
    pub fn invalid(version: u64, reason: impl Into<String>) -> Self {
        ExportError::Invalid {
            version,
            reason: reason.into(),
        }
    }
}
