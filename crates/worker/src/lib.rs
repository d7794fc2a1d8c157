//! The Sparta worker: reads batches, looks up their embeddings (fused dedup + partition by
//! shard, one pull per shard per step for all fields), runs the dense network forward and
//! backward, pushes the gradients summed per distinct id, and evaluates.

pub mod checkpointing;
pub mod config;
pub mod dedup;
pub mod error;
pub mod online;
pub mod pipeline;
pub mod progress;
pub mod step;
pub mod store;
pub mod summary;
pub mod trainer;

pub use config::{Job, JobConfig};
pub use error::WorkerError;
pub use online::{ExportReport, FollowOptions, HookContext, StepHook};
pub use store::{DenseStore, LocalStore, PullInto, PushFrom, SparseStore, TableId};
pub use summary::Summary;
pub use trainer::{RunOptions, Trainer};
