//! The Sparta training loop, on top of the job contract in `sparta-core`: reads batches, looks up
//! their embeddings (fused dedup + partition by shard, one pull per shard per step for all
//! fields), runs the dense network forward and backward, pushes the gradients summed per
//! distinct id, checkpoints, evaluates, and reports progress through a [`Progress`] handle.

pub mod board_hook;
pub mod checkpointing;
pub mod export_hook;
pub mod live;
pub mod online;
pub mod pipeline;
pub mod progress;
mod progressive;
pub mod step;
pub mod summary;
pub mod trainer;

pub use board_hook::BoardHook;
pub use export_hook::ExportHook;
pub use live::{LastCheckpoint, LiveHandle, LiveStatus};
#[cfg(feature = "kafka")]
pub use online::KafkaOptions;
pub use online::{ExportReport, FollowOptions, HookContext, StepHook};
pub use progress::{LogProgress, Progress, WindowLine};
pub use summary::{Evaluation, InputSummary, Summary, TableSummary, TaskEvaluation, TaskMetrics};
#[cfg(feature = "kafka")]
pub use trainer::KafkaLag;
pub use trainer::{InputStats, RunOptions, Trainer};

// The job contract moved to `sparta-core`; these keep the old paths of the binary working.
pub use sparta_core::{CoreError, Job, JobConfig, SparseStore};
