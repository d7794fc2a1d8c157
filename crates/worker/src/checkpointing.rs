//! Checkpoints of an embedded job: every K steps a full or incremental checkpoint (tables with
//! optimizer state, dense parameters and optimizer state, step, input position, job config), and
//! resume from the newest valid one.
//!
//! Input position: the number of training rows consumed (and the epoch). A resumed job skips
//! exactly those rows of the input. Row order is deterministic with `reader_threads = 1`; with
//! more parser threads batches interleave differently from run to run, so a resume trains on
//! the right number of rows but not necessarily on exactly the unread ones (a warning says so).

use std::path::Path;
use std::sync::Arc;

use sparta_checkpoint::{
    open_dir, CheckpointState, Checkpointer, DenseState, InputPosition, Restored, RetentionPolicy,
    RetryPolicy,
};
pub use sparta_core::checkpoint::{restore, CheckpointHook};
use sparta_core::config::TrainConfig;
use sparta_core::CoreError;
use sparta_nn::Model;
use sparta_table::Table;

/// Writes an embedded job's checkpoints.
pub struct Checkpoints {
    writer: Checkpointer,
    every_steps: u64,
    full_every: u64,
    written: u64,
    job_text: String,
    tables: Vec<(String, Arc<Table>)>,
}

impl Checkpoints {
    /// Checkpoints `tables` into `dir` (created if missing) as `[train]` says, recording the
    /// logical tables of each (`members`).
    pub fn new(
        dir: &Path,
        train: &TrainConfig,
        job_text: String,
        tables: Vec<(String, Arc<Table>)>,
        members: sparta_checkpoint::Members,
    ) -> Result<Self, CoreError> {
        let storage = open_dir(dir)?;
        storage.check_writable()?;
        let writer = Checkpointer::new(
            storage,
            RetentionPolicy {
                keep_full: train.checkpoint_keep_full,
            },
        )
        .with_retry(RetryPolicy::new(train.checkpoint_max_failures))
        .with_members(members);
        // This job is the only writer: whatever an earlier run left mid-write is garbage.
        writer.remove_unfinished(&|_| true)?;
        Ok(Self {
            writer,
            every_steps: train.checkpoint_every_steps,
            full_every: train.checkpoint_full_every.max(1),
            written: 0,
            job_text,
            tables,
        })
    }

    /// Continues the chain of a restored checkpoint (the next one may be incremental).
    pub fn resume(&mut self, restored: &Restored) {
        self.writer.resume(restored);
        self.written = 1;
    }

    /// Writes a checkpoint now: full every `full_every`-th time (and the first time), else
    /// incremental. Returns its id as text.
    pub fn write_now(
        &mut self,
        model: &Model,
        step: u64,
        position: InputPosition,
    ) -> Result<String, CoreError> {
        let state = CheckpointState {
            tables: self
                .tables
                .iter()
                .map(|(n, t)| (n.as_str(), t.as_ref()))
                .collect(),
            dense: Some(DenseState::of(model)),
            step,
            position,
            job_config: &self.job_text,
        };
        let full = self.written.is_multiple_of(self.full_every);
        let id = if full {
            self.writer.write_full(&state)?
        } else {
            match self.writer.write_incremental(&state) {
                Ok(id) => id,
                Err(sparta_checkpoint::CheckpointError::NeedFull { .. }) => {
                    self.writer.write_full(&state)?
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.written += 1;
        self.writer.apply_retention()?;
        tracing::info!(
            "checkpoint {id} ({}) at step {step}",
            if full { "full" } else { "incremental" }
        );
        Ok(id.to_string())
    }
}

impl CheckpointHook for Checkpoints {
    fn every_steps(&self) -> u64 {
        self.every_steps
    }

    fn write(
        &mut self,
        step: u64,
        position: InputPosition,
        model: &Model,
    ) -> Result<Option<String>, CoreError> {
        self.write_now(model, step, position).map(Some)
    }

    fn at_end(&self) -> bool {
        true
    }
}
