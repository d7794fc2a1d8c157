//! Error type of the table crate.

/// Errors returned by table construction, validation and raw row access.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TableError {
    /// A configuration value is out of range or inconsistent.
    #[error("invalid table config `{table}`: {reason}")]
    InvalidConfig {
        /// Table name.
        table: String,
        /// What is wrong.
        reason: String,
    },
    /// A raw row passed to `insert_raw` has the wrong number of floats.
    #[error("raw row has {got} floats, table row stride is {expected}")]
    RowLength {
        /// Expected floats per row (`row_stride()`).
        expected: usize,
        /// Floats passed.
        got: usize,
    },
    /// A shard ran out of addressable row slots.
    #[error("shard {shard} is full ({rows} rows); use more shards")]
    ShardFull {
        /// Shard index.
        shard: usize,
        /// Rows in the shard.
        rows: usize,
    },
    /// The SSD tier's file could not be made, written or read.
    #[error("table `{table}`: SSD tier: {reason}")]
    Disk {
        /// Table name.
        table: String,
        /// What failed (the OS error included).
        reason: String,
    },
}
