//! Training on batches handed in from outside the reader (the Python package's DataFrames and
//! Arrow record batches, through `sparta_data::parquet::FrameBatches`).
//!
//! The loop, checkpoints, hooks, the stop flag and the summary are those of training on
//! files; only the input differs. Its position is a row count (a resume skips that many rows
//! of the batches handed in, which must then be the same rows in the same order).

use std::sync::Arc;
use std::time::Instant;

use sparta_core::CoreError;
use sparta_data::{Batch, DataError, ReadStats};

use super::input::{position, SkipRows, UntilStopped};
use super::{RunOptions, Trainer};
use crate::summary::Summary;

impl Trainer {
    /// Trains on `batches` (one pass: repeat them for more epochs), then evaluates on
    /// `opts.test` when given (`opts.train` and `opts.follow` are not read). `stats`: the
    /// counters of the source (rows, bad rows). A resumed trainer skips the rows its
    /// checkpoint consumed.
    pub fn run_batches(
        &mut self,
        batches: impl Iterator<Item = Result<Batch, DataError>> + Send,
        stats: Arc<ReadStats>,
        opts: &RunOptions,
    ) -> Result<Summary, CoreError> {
        self.periodic_from(opts)?;
        let summary = self.train_batches(batches, stats, opts.progress)?;
        self.complete_run(summary, opts)
    }

    fn train_batches(
        &mut self,
        batches: impl Iterator<Item = Result<Batch, DataError>> + Send,
        stats: Arc<ReadStats>,
        progress: bool,
    ) -> Result<Summary, CoreError> {
        self.refuse_kafka_position()?;
        let start = Instant::now();
        let start_rows = self.start_position.rows_consumed;
        *self.input_stats.lock() = Some(Arc::clone(&stats));
        let stream = UntilStopped {
            inner: SkipRows::new(batches, start_rows),
            stop: self.stop.clone(),
        };
        let mut summary = Summary::default();
        let loop_start = Instant::now();
        // Batches handed in train as a file's rows do (pipelined by default when embedded).
        self.train_reporting(
            self.pipelines_batches(),
            progress,
            0,
            stream,
            &mut summary,
            || stats.bytes(),
            &|rows| Ok(position(rows)),
        )?;
        let end = position(start_rows + summary.train_rows);
        self.end_batch_run(&mut summary, start, loop_start, &stats, end, start_rows)?;
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use sparta_core::JobConfig;
    use sparta_data::{read_batches, write_synthetic, SynthConfig};

    use super::*;

    fn data(dir: &std::path::Path, rows: u64, seed: u64) -> PathBuf {
        let mut text = Vec::new();
        let cfg = SynthConfig {
            rows,
            seed,
            ..SynthConfig::default()
        };
        write_synthetic(&cfg, &mut text).unwrap();
        let p = dir.join(format!("d{seed}.tsv"));
        std::fs::write(&p, text).unwrap();
        p
    }

    fn job() -> sparta_core::Job {
        let mut cfg = JobConfig::default();
        cfg.data.batch_size = 64;
        cfg.data.reader_threads = 1;
        cfg.train.threads = 1;
        cfg.validate().unwrap()
    }

    #[test]
    fn batches_handed_in_train_as_the_file_they_came_from() {
        let dir = tempfile::tempdir().unwrap();
        let (train, test) = (data(dir.path(), 1000, 1), data(dir.path(), 300, 2));
        let opts = RunOptions {
            train: vec![train.clone()],
            test: vec![test],
            ..RunOptions::default()
        };
        let from_file = Trainer::embedded(job()).unwrap().run(&opts).unwrap();
        let mut t = Trainer::embedded(job()).unwrap();
        let stream = read_batches(&[train], &t.job().reader).unwrap();
        let stats = stream.stats();
        let handed = t.run_batches(stream, stats, &opts).unwrap();
        assert_eq!(handed.train_rows, 1000);
        assert_eq!(handed.steps, from_file.steps);
        assert_eq!(handed.test_auc, from_file.test_auc);
        assert_eq!(handed.train_loss, from_file.train_loss);
        assert_eq!(handed.input_position.unwrap().rows_consumed, 1000);
    }
}
