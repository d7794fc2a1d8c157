//! Error type of the checkpoint crate.

/// Errors of checkpoint writing, reading, restoring and storage access.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A storage operation failed.
    #[error("storage error on `{name}`: {source}")]
    Io {
        /// Blob (or directory) name.
        name: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A local directory could not be created (a missing or read-only parent, a file in the
    /// way).
    #[error("cannot create the directory {dir}: {source}")]
    CreateDir {
        /// The directory.
        dir: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A blob does not exist.
    #[error("`{0}` not found")]
    NotFound(String),
    /// A file failed validation (bad magic, checksum, length, truncated, undecodable).
    #[error("corrupt checkpoint file `{file}`: {reason}")]
    Corrupt {
        /// Blob name.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A table or part name is not usable in a file name.
    #[error("invalid name `{0}`: use 1-64 characters of [A-Za-z0-9_.-], not starting with `.`")]
    InvalidName(String),
    /// The API was used inconsistently (duplicate part, mismatched row stride, ...).
    #[error("checkpoint usage error: {0}")]
    Usage(String),
    /// An incremental checkpoint cannot be written (missing tombstones); write a full one.
    #[error("incremental checkpoint impossible for table `{table}` part `{part}`: {reason}")]
    NeedFull {
        /// Table name.
        table: String,
        /// Part name.
        part: String,
        /// Why.
        reason: String,
    },
    /// A checkpoint location (`open_storage`) is malformed or not supported by this build.
    #[error("checkpoint location `{location}`: {reason}")]
    Location {
        /// The location as given.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// A table operation failed during restore.
    #[error(transparent)]
    Table(#[from] sparta_table::TableError),
    /// Dense state does not fit the model.
    #[error(transparent)]
    Nn(#[from] sparta_nn::NnError),
    /// A checkpoint write failed `failures` times in a row (each partial checkpoint removed);
    /// the job should stop rather than train on without checkpoints.
    #[error(
        "{what} failed {failures} times in a row (each partial checkpoint was removed): {last}; \
         free space in (or repair) the checkpoint location, then resume from the last checkpoint"
    )]
    GaveUp {
        /// The write (names the checkpoint).
        what: String,
        /// Consecutive failed attempts.
        failures: u32,
        /// The last attempt's error.
        last: Box<CheckpointError>,
    },
    /// A resume found no checkpoint to restore (see [`crate::ResumePolicy`]).
    #[error("nothing to resume from in {location}: {reason}")]
    NothingToResume {
        /// The checkpoint location.
        location: String,
        /// Why, and what to do.
        reason: String,
    },
    /// The job's logical tables differ from those a checkpoint saved.
    #[error(transparent)]
    Members(#[from] MemberMismatch),
    /// The caller's table factory failed.
    #[error("making table `{table}`: {reason}")]
    MakeTable {
        /// Table name.
        table: String,
        /// The factory's error text.
        reason: String,
    },
}

impl CheckpointError {
    /// Shorthand for a [`CheckpointError::Corrupt`].
    pub(crate) fn corrupt(file: &str, reason: impl Into<String>) -> Self {
        CheckpointError::Corrupt {
            file: file.to_string(),
            reason: reason.into(),
        }
    }

    /// Shorthand for a [`CheckpointError::Io`].
    pub(crate) fn io(name: &str, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            return CheckpointError::NotFound(name.to_string());
        }
        CheckpointError::Io {
            name: name.to_string(),
            source,
        }
    }

    /// Whether the error says something about the stored data (so the checkpoint is skipped)
    /// rather than about the caller or the tables being filled.
    pub(crate) fn is_data_error(&self) -> bool {
        matches!(
            self,
            CheckpointError::Io { .. }
                | CheckpointError::NotFound(_)
                | CheckpointError::Corrupt { .. }
        )
    }
}

/// How the logical tables a job declares differ from those a checkpoint saved in a physical
/// table ([`crate::check_members`]): tables cannot change across a resume. Each names the
/// logical table (and the physical one, `table`, where the difference is one of presence or
/// tag).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemberMismatch {
    /// The checkpoint holds a logical table the job does not declare.
    #[error(
        "table \"{name}\" (in {table}): the checkpoint holds it, the job does not declare it; \
         changing the tables across a resume is not supported"
    )]
    NotDeclared {
        /// The physical table.
        table: String,
        /// The logical table.
        name: String,
    },
    /// The job declares a logical table the checkpoint does not hold.
    #[error(
        "table \"{name}\" (in {table}): the job declares it, the checkpoint does not hold it; \
         changing the tables across a resume is not supported"
    )]
    NotSaved {
        /// The physical table.
        table: String,
        /// The logical table.
        name: String,
    },
    /// The logical table is stored under another tag.
    #[error(
        "table \"{name}\" (in {table}): the checkpoint stores it under tag {saved}, the job \
         under tag {job}; changing the tables across a resume is not supported"
    )]
    Tag {
        /// The physical table.
        table: String,
        /// The logical table.
        name: String,
        /// Its tag in the checkpoint.
        saved: u8,
        /// Its tag in the job.
        job: u8,
    },
    /// The logical table has another dim.
    #[error("table \"{name}\": the checkpoint holds dim {saved}, the job says dim {job}")]
    Dim {
        /// The logical table.
        name: String,
        /// Its dim in the checkpoint.
        saved: usize,
        /// Its dim in the job.
        job: usize,
    },
}

/// Result alias of this crate.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;
