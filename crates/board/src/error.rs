//! The crate's one error type.

use std::path::PathBuf;

/// Writing an event file failed.
#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    /// Creating the run directory or the event file.
    #[error("creating the TensorBoard event file in {dir}: {source}")]
    Create {
        /// The run directory.
        dir: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// Writing or flushing records.
    #[error("writing the TensorBoard event file {path}: {source}")]
    Write {
        /// The event file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// Reading an event file back.
    #[error("reading the TensorBoard event file {path}: {source}")]
    Read {
        /// The event file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// An event file's bytes are not valid records of events.
    #[error("the TensorBoard event file {path}: {bad}")]
    Corrupt {
        /// The event file.
        path: PathBuf,
        /// What is wrong, where.
        bad: crate::read::Bad,
    },
}
