//! The crate's error type.

use std::io;
use std::path::PathBuf;

/// Errors produced while configuring or running a reader.
///
/// Messages name the file (and the 1-based line where one applies).
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An input path does not exist.
    #[error("{}: no such file", .path.display())]
    NotFound {
        /// The missing path.
        path: PathBuf,
    },
    /// An input path is a directory.
    #[error("{}: is a directory, expected a data file", .path.display())]
    IsDirectory {
        /// The offending path.
        path: PathBuf,
    },
    /// An input file could not be opened, mapped or read.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A gzip stream is corrupt or truncated.
    #[error("{}:{line}: gzip stream error: {source}", .path.display())]
    Gzip {
        /// The file.
        path: PathBuf,
        /// The first line (1-based, of the decompressed text) that could not be read.
        line: u64,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A start offset does not fit its file (past the end of its text, not at a line start,
    /// in an empty file or inside a pipe): the file is not the one the position was taken from.
    #[error("{}: cannot start at byte {offset}: {why}", .path.display())]
    BadStart {
        /// The file.
        path: PathBuf,
        /// The start offset.
        offset: u64,
        /// Why it does not fit.
        why: String,
    },
    /// A file changed under the reader (it shrank while it was read).
    #[error("{}: changed while read: {detail}", .path.display())]
    Changed {
        /// The file.
        path: PathBuf,
        /// What was found.
        detail: String,
    },
    /// A Parquet file cannot be read (not Parquet, corrupt or truncated, or a column the
    /// plan needs is missing or of a type that is not read).
    #[error("{}: Parquet: {detail}", .path.display())]
    Parquet {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The schema is inconsistent.
    #[error("invalid schema: {0}")]
    Schema(String),
    /// The reader configuration is inconsistent.
    #[error("invalid reader config: {0}")]
    Config(String),
    /// More than `max_bad_line_ratio` of the lines seen were malformed.
    #[error(
        "too many bad lines: {bad} of {seen} lines ({ratio:.4} > max {max}); first bad line: {first}"
    )]
    TooManyBadLines {
        /// Bad lines so far.
        bad: u64,
        /// Lines seen so far (good and bad).
        seen: u64,
        /// `bad / seen`.
        ratio: f64,
        /// The configured maximum ratio.
        max: f64,
        /// The first recorded bad line, as `file:line: reason: "text"`.
        first: String,
    },
    /// A record batch handed in (a DataFrame) lacks a column the input plan reads, or holds
    /// one of a type that is not read.
    #[error("input frame: {0}")]
    Frame(String),
    /// A Kafka broker or topic could not be used (`--kafka`, `--topic`).
    #[error("kafka: {0}")]
    Kafka(String),
    /// A reader thread died unexpectedly (a bug).
    #[error("reader thread failed: {0}")]
    Internal(String),
}

/// Why a [`Batch`](crate::Batch) breaks its invariants ([`Batch::check`](crate::Batch::check),
/// [`Batch::check_tags`](crate::Batch::check_tags)).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadBatch {
    /// `num_labels` is 0.
    #[error("num_labels is 0 (a batch has at least one label per row)")]
    NoLabels,
    /// The labels, dense values or offsets do not fit the rows.
    #[error(
        "bad lengths: rows {rows}, labels {labels} ({per_row} per row), dense {dense}, offsets {offsets}"
    )]
    Lengths {
        /// Rows.
        rows: usize,
        /// Labels held.
        labels: usize,
        /// Labels per row.
        per_row: usize,
        /// Dense values held.
        dense: usize,
        /// Offsets held.
        offsets: usize,
    },
    /// Sample weights that are neither empty nor one per row.
    #[error("{found} sample weights for {rows} rows (sample weights are empty or one per row)")]
    SampleWeights {
        /// Sample weights held.
        found: usize,
        /// Rows.
        rows: usize,
    },
    /// The offsets do not start at 0 or do not end at the number of ids.
    #[error("offsets do not span ids")]
    OffsetsSpan,
    /// Weights that are neither empty nor one per id.
    #[error("{found} weights for {ids} ids (weights are empty or one per id)")]
    Weights {
        /// Weights held.
        found: usize,
        /// Ids held.
        ids: usize,
    },
    /// A (row, field) slot without ids.
    #[error("slot {slot} has no ids")]
    EmptySlot {
        /// The slot (`row * num_fields + field`).
        slot: usize,
    },
    /// Not one tag per field.
    #[error("{tags} tags for {fields} fields")]
    TagCount {
        /// Tags given.
        tags: usize,
        /// Fields of the batch.
        fields: usize,
    },
    /// An id outside its field's tag.
    #[error("row {row} field {field} holds an id outside tag {tag}")]
    ForeignId {
        /// The row.
        row: usize,
        /// The field.
        field: usize,
        /// The field's tag.
        tag: u8,
    },
}
