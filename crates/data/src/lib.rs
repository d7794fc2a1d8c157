//! Sparta data: click-log readers that turn Criteo-style TSV/CSV (plain or gzip) into
//! ready-to-train [`Batch`]es on several threads behind a bounded queue, plus a
//! deterministic synthetic data generator.
//!
//! * [`schema`] - column layout ([`Schema::criteo`], [`Schema::avazu`], or any TOML-described one).
//! * [`ids`] - stable 64-bit feature ids with the field in the top 8 bits.
//! * [`batch`] - the jagged columnar [`Batch`].
//! * [`reader`] - [`read_batches`] / [`read_batches_at`] / [`read_all`]: deterministic batches
//!   with [`ReadPosition`]s to resume at.
//! * [`follow`] - [`follow()`]: batches from files as they appear in a directory, with positions.
//! * [`kafka`] (feature `kafka`) - batches from a Kafka topic, with the next offset of every
//!   partition after each batch.
//! * [`input`] - input sources (plain, gzip, pipes); [`open_text`] opens one as text.
//! * `object` (feature `object-store`) - `s3://` and `file://` inputs: listing in name order,
//!   ranged reads issued ahead of the parsers, retries.
//! * `parquet` (feature `parquet`) - Parquet files as one more input kind of the engine, and
//!   the writer of `sparta convert`.
//!
//! Both readers run one engine: input sources -> feeder (line-aligned chunks, `feed`) ->
//! parser threads -> in-order assembler (`assemble`) -> positioned batches (`engine`).
//! * [`synth`] - [`write_synthetic`].

mod assemble;
pub mod batch;
mod engine;
pub mod error;
pub mod features;
mod feed;
pub mod follow;
pub mod ids;
pub mod input;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "object-store")]
pub mod object;
#[cfg(feature = "parquet")]
pub mod parquet;
pub mod parse;
pub mod priority;
mod queue;
pub mod reader;
pub mod schema;
pub mod stats;
pub mod synth;
pub mod synth_rich;

pub use batch::{log_transform, Batch, BatchBuilder};
pub use error::DataError;
pub use follow::{follow, FollowBatch, FollowConfig, FollowPosition, Follower};
pub use ids::{feature_id, field_of, missing_id};
pub use input::{is_url, open_text, ObjectClientRef, RangeRead};
pub use parse::{BadLine, LineParser};
pub use reader::{
    read_all, read_batches, read_batches_at, BatchStream, Positioned, PositionedBatch,
    ReadPosition, ReaderConfig,
};
pub use schema::{Column, ColumnKind, Schema};
pub use stats::{ReadStats, ReadStatsSnapshot};
pub use synth::{write_synthetic, SynthConfig};
pub use synth_rich::{rich_schema, write_rich, RichConfig};
