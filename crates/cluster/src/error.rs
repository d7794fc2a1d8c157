//! The cluster crate's one error type.

use thiserror::Error;

/// What stops a cluster worker.
#[derive(Debug, Error)]
pub enum ClusterError {
    /// The job, the store or a training step failed (the message says which; a diverged
    /// step and a failed job keep their kinds for the binary's exit status).
    #[error(transparent)]
    Core(#[from] sparta_core::CoreError),
    /// A token, TLS file, address or metrics endpoint could not be set up.
    #[error(transparent)]
    Proto(#[from] sparta_proto::ProtoError),
    /// Reading the checkpoint the shards resumed from failed.
    #[error(transparent)]
    Checkpoint(#[from] sparta_checkpoint::CheckpointError),
    /// Forming the dense all-reduce ring failed.
    #[error(transparent)]
    Ring(#[from] sparta_ring::RingError),
    /// Options that do not fit the cluster (or each other); the message names the flags.
    #[error("{0}")]
    Setup(String),
    /// A shard's answer to a checkpoint or export round that cannot be used.
    #[error("{0}")]
    Round(String),
    /// Writing a file (the summary) failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being written (names the file).
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl ClusterError {
    /// A job-level failure that a restart from the last checkpoint would not fix (a diverged
    /// step, checkpoints that keep failing): `sparta launch` stops instead of rolling back.
    pub fn is_job_failure(&self) -> bool {
        match self {
            ClusterError::Core(e) => e.is_job_failure(),
            ClusterError::Checkpoint(e) => {
                matches!(e, sparta_checkpoint::CheckpointError::GaveUp { .. })
            }
            _ => false,
        }
    }

    /// Adds what was being done in front of the message, keeping the kind where it matters
    /// (core errors: exit statuses follow them).
    pub fn context(self, what: impl std::fmt::Display) -> Self {
        match self {
            ClusterError::Setup(m) => ClusterError::Setup(format!("{what}: {m}")),
            ClusterError::Round(m) => ClusterError::Round(format!("{what}: {m}")),
            other => ClusterError::Setup(format!("{what}: {other}")),
        }
    }
}
