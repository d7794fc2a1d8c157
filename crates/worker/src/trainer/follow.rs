//! Training on a followed directory ([`sparta_data::follow`]).

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use sparta_core::CoreError;
use sparta_data::{follow, Batch, DataError, FollowConfig, FollowPosition, Follower};

use super::Trainer;
use crate::online::{follow_to_input, input_to_follow, FollowOptions};
use crate::summary::Summary;

/// Longest pause between two idle ticks of the follower while it waits for files.
const IDLE_TICK: std::time::Duration = std::time::Duration::from_secs(1);

/// The batches of a follower; the position after the last batch handed out goes to `at`.
struct Positioned {
    inner: Follower,
    at: Arc<Mutex<FollowPosition>>,
}

impl Iterator for Positioned {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.inner.next()? {
            Ok(b) => {
                *self.at.lock() = b.position;
                Some(Ok(b.batch))
            }
            Err(e) => Some(Err(e)),
        }
    }
}

impl Trainer {
    /// Trains on the files of `f.dir` as they appear until the stop file or the stop flag.
    /// Checkpoints save the file and byte offset after the last trained batch; a resumed
    /// trainer continues at exactly the next line.
    pub(super) fn train_follow(
        &mut self,
        f: &FollowOptions,
        progress: bool,
    ) -> Result<Summary, CoreError> {
        let train = &self.job.raw.train;
        if train.epochs != 1 {
            return Err(CoreError::Config(format!(
                "train.epochs = {} does not apply when following a directory (each file is \
                 trained on once)",
                train.epochs
            )));
        }
        if train.max_rows.is_some() {
            return Err(CoreError::Config(
                "train.max_rows does not apply when following a directory (stop it with the \
                 stop file or a signal)"
                    .into(),
            ));
        }
        if train.preload {
            return Err(CoreError::Config(
                "train.preload does not apply when following a directory".into(),
            ));
        }
        self.refuse_kafka_position()?;
        let mut start_at = input_to_follow(&self.start_position);
        if self.resumed_from.is_some() && start_at.file.is_empty() && start_at.rows > 0 {
            tracing::warn!(
                "the checkpoint was written by a job reading files, not following a directory: \
                 following {} from its first file",
                f.dir.display()
            );
        }
        start_at.offset = if start_at.file.is_empty() {
            0
        } else {
            start_at.offset
        };
        let cfg = FollowConfig {
            dir: f.dir.clone(),
            poll: f.poll,
            settle: f.settle,
            stop_file: f.stop_file.clone(),
            stop: Arc::clone(&f.stop),
            start: start_at,
            // A cluster worker reads its share of every file.
            part: self.job.reader.part,
            // Timed work (exports by time) while no file is waiting.
            idle_tick: Some(f.poll.min(IDLE_TICK)),
        };
        tracing::info!(
            "following {} from {}",
            f.dir.display(),
            if cfg.start.file.is_empty() {
                "its first file".to_string()
            } else {
                format!("byte {} of {}", cfg.start.offset, cfg.start.file)
            }
        );
        let start = Instant::now();
        let follower = follow(cfg, &self.job.reader)?;
        let stats = follower.stats();
        *self.input_stats.lock() = Some(Arc::clone(&stats));
        let at = Arc::new(Mutex::new(follower.position().clone()));
        let batches = Positioned {
            inner: follower,
            at: Arc::clone(&at),
        };
        let mut summary = Summary::default();
        let enabled = progress;
        let pos = |_rows: u64| Ok(follow_to_input(&at.lock()));
        self.train_reporting(
            self.job.raw.train.pipeline.unwrap_or(false),
            enabled,
            0,
            batches,
            &mut summary,
            || stats.bytes(),
            &pos,
        )?;
        let end = follow_to_input(&at.lock());
        summary.input_position = Some(end.clone());
        summary.bad_files = stats.bad_files();
        summary.late_files_skipped = stats.late_files_skipped();
        if summary.steps == 0 {
            tracing::warn!("stopped before any complete file arrived: nothing trained");
            summary.samples_trained = end.rows_consumed;
            return Ok(summary);
        }
        self.finish_training(&mut summary, start, start, &stats, end)?;
        Ok(summary)
    }
}
