//! The one error type of the job contract: config, stores, lookup, checkpoints.

use thiserror::Error;

/// Everything that can stop a training, evaluation or serving job.
#[derive(Debug, Error)]
pub enum CoreError {
    /// The job configuration is invalid; the message names the field.
    #[error("config: {0}")]
    Config(String),
    /// Reading input failed (file, line and reason in the message).
    #[error(transparent)]
    Data(#[from] sparta_data::DataError),
    /// Building or using a table failed.
    #[error(transparent)]
    Table(#[from] sparta_table::TableError),
    /// Building or running the dense network failed.
    #[error(transparent)]
    Nn(#[from] sparta_nn::NnError),
    /// Writing or restoring a checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] sparta_checkpoint::CheckpointError),
    /// Writing an output file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file being written.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Talking to a parameter server failed (after retries); the message names the server.
    #[error("transport: {0}")]
    Transport(String),
    /// Training diverged or produced no usable result.
    #[error("training: {0}")]
    Training(String),
    /// Training diverged: a non-finite loss or gradient. Nothing of the step was applied or
    /// saved; a restart from the last checkpoint would diverge again without a change (lower
    /// learning rates), so a supervisor must not roll back.
    #[error("training diverged: {0}")]
    Diverged(String),
    /// The job must stop for a reason that a restart from the last checkpoint would not fix
    /// (e.g. checkpoints keep failing): a supervisor must not roll back.
    #[error("{0}")]
    JobFailed(String),
}

impl CoreError {
    /// Whether this error stops the whole job (no rollback can fix it): [`CoreError::JobFailed`],
    /// [`CoreError::Diverged`] or a checkpoint write that gave up after its retries.
    pub fn is_job_failure(&self) -> bool {
        matches!(
            self,
            CoreError::JobFailed(_)
                | CoreError::Diverged(_)
                | CoreError::Checkpoint(sparta_checkpoint::CheckpointError::GaveUp { .. })
        )
    }
}
