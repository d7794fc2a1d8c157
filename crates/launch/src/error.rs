//! The launcher's errors.

use sparta_checkpoint::CheckpointError;

/// Why a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// An I/O operation of the launcher itself failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Choosing the checkpoint to restart from failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A process could not be started (or did not come up).
    #[error("{0}")]
    Start(String),
    /// The job failed (the message says which process and why).
    #[error("{0}; stopped the other processes")]
    Failed(String),
    /// A process stopped the job for a reason a rollback would not fix (it exited with
    /// [`crate::EXIT_JOB_FAILED`]): `sparta launch` exits with that status too.
    #[error("{0}; stopped the other processes")]
    JobFailed(String),
    /// SIGINT or SIGTERM: every process was stopped.
    #[error("interrupted by a signal: stopped every process of the cluster")]
    Interrupted,
    /// The workers' summaries could not be read.
    #[error("{0}")]
    Summary(String),
}

impl LaunchError {
    /// Whether a process stopped the job for a reason a rollback would not fix: the launcher
    /// exits with [`crate::EXIT_JOB_FAILED`], as that process did.
    pub fn is_job_failure(&self) -> bool {
        matches!(self, LaunchError::JobFailed(_))
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        LaunchError::Io {
            what: what.into(),
            source,
        }
    }
}
