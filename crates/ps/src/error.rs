//! The PS crate's one error type.

use thiserror::Error;

/// Everything that can stop a PS shard or a remote store from starting.
#[derive(Debug, Error)]
pub enum PsError {
    /// Invalid settings; the message names the flag or field.
    #[error("config: {0}")]
    Config(String),
    /// No usable token.
    #[error("auth: {0}")]
    Auth(String),
    /// Building a table failed.
    #[error(transparent)]
    Table(#[from] sparta_table::TableError),
    /// Building the dense model (to size the dense vector) failed.
    #[error(transparent)]
    Nn(#[from] sparta_nn::NnError),
    /// Binding or serving a socket failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (names the address).
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Restoring or writing a checkpoint failed; the message names the checkpoint and why.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The gRPC server failed.
    #[error("serving: {0}")]
    Serve(String),
}
