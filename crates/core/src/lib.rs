//! The contract that Sparta's trainer, parameter servers and serving share:
//!
//! * [`config`]: the job as written in TOML ([`JobConfig`]) and validated ([`Job`]);
//! * [`store`]: the [`SparseStore`] / [`DenseStore`] traits with their pull/push buffers
//!   ([`PullInto`], [`PushFrom`], [`TableId`]) and the embedded [`LocalStore`];
//! * [`routing`]: stable key -> slot -> shard routing ([`Routing`]) that a checkpoint records
//!   and a restore on another shard count re-cuts;
//! * [`dedup`]: the fused Unique + Partition by shard ([`Deduper`]);
//! * [`pool`]: the pooling of looked-up rows into the dense model's inputs ([`pool::gather`])
//!   and its backward pass ([`pool::scatter`]), side by side;
//! * [`range`]: whether streamed values are finite or within a bound, in one vectorized pass
//!   or folded into a loop that reads them anyway;
//! * [`step`]: a batch's lookup (dedup, pull, gather) and the forward pass ([`step::predict`])
//!   that evaluation, prediction and serving share;
//! * [`checkpoint`]: the [`CheckpointHook`] the training loop calls at step boundaries (written
//!   by the embedded checkpointer and by a PS cluster's coordinator) and the embedded restore;
//! * [`forget`]: a raw feature value mapped to the (table, key) pairs training gave it rows
//!   under (`sparta forget`);
//! * [`error`]: the one error type of all of it.

pub mod checkpoint;
pub mod config;
pub mod dedup;
pub mod error;
pub mod features;
pub mod forget;
pub mod pool;
pub mod range;
pub mod routing;
pub mod step;
pub mod store;

pub use checkpoint::CheckpointHook;
pub use config::{Job, JobConfig};
pub use dedup::{Deduper, KeyParts, UniqueIds};
pub use error::CoreError;
pub use routing::Routing;
pub use step::Lookup;
pub use store::{check_len, DenseStore, LocalStore, PullInto, PushFrom, SparseStore, TableId};
