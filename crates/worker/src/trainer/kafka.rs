//! Training on a Kafka topic ([`sparta_data::kafka`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sparta_checkpoint::InputPosition;
use sparta_core::CoreError;
use sparta_data::kafka::{consume, KafkaConfig, KafkaPosition, KafkaStream};
use sparta_data::{Batch, DataError};

use super::Trainer;
use crate::online::{input_to_kafka, kafka_to_input, KafkaOptions};
use crate::summary::Summary;

/// Longest pause between two idle ticks while the topic is quiet.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Positions kept: far more than the batches any loop reads ahead.
const TRAIL: usize = 1024;

/// The positions after the last batches read, by rows: the loop asks for the position after
/// the rows it has trained, while the pipelined loop may read a few batches ahead.
#[derive(Clone)]
struct Trail(Arc<Mutex<VecDeque<KafkaPosition>>>);

impl Trail {
    fn record(&self, p: KafkaPosition) {
        let mut q = self.0.lock();
        if q.back().is_some_and(|b| b.rows == p.rows) {
            q.pop_back(); // an idle tick repeats the position
        }
        if q.len() >= TRAIL {
            q.pop_front();
        }
        q.push_back(p);
    }

    /// The position after `rows` rows (exact: every position of the trail is a batch end).
    fn at(&self, rows: u64) -> InputPosition {
        let q = self.0.lock();
        match q.iter().rev().find(|p| p.rows == rows) {
            Some(p) => kafka_to_input(p),
            // Unreachable while the read-ahead is below TRAIL batches; saving the newest
            // position would skip rows, so the oldest known one is saved (rows repeat instead).
            None => {
                tracing::error!("no Kafka position for {rows} rows consumed");
                q.front().map(kafka_to_input).unwrap_or_default()
            }
        }
    }
}

/// The batches of a stream, each position recorded in the trail.
struct Tracked {
    inner: KafkaStream,
    trail: Trail,
}

impl Iterator for Tracked {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.inner.next()? {
            Ok(b) => {
                self.trail.record(b.position);
                Some(Ok(b.batch))
            }
            Err(e) => Some(Err(e)),
        }
    }
}

impl Trainer {
    /// Trains on `k.topic` until the stop flag (or, draining, the end the topic had at the
    /// start). Checkpoints save the next offset of every partition after the last trained
    /// batch; a resumed trainer continues every partition at exactly that record.
    pub(super) fn train_kafka(
        &mut self,
        k: &KafkaOptions,
        progress: bool,
    ) -> Result<Summary, CoreError> {
        let train = &self.job.raw.train;
        for (bad, what) in [
            (train.epochs != 1, "train.epochs"),
            (train.max_rows.is_some(), "train.max_rows"),
            (train.preload, "train.preload"),
        ] {
            if bad {
                return Err(CoreError::Config(format!(
                    "{what} does not apply to a Kafka topic (each record is trained on once; \
                     stop with a signal or --kafka-drain)"
                )));
            }
        }
        if self.job.reader.part.is_some() {
            return Err(CoreError::Config(
                "a Kafka topic is read by an embedded job only (not by cluster workers)".into(),
            ));
        }
        let saved = input_to_kafka(&self.start_position);
        if self.resumed_from.is_some() && saved.offsets.is_empty() && saved.rows > 0 {
            return Err(CoreError::Config(format!(
                "the checkpoint was written by a job reading files, not the Kafka topic {}: \
                 resume it with its own input, or start without --resume",
                k.topic
            )));
        }
        let cfg = KafkaConfig {
            from: k.from,
            start: saved,
            stop: Arc::clone(&k.stop),
            drain: k.drain,
            idle_tick: Some(IDLE_TICK),
            ..KafkaConfig::new(k.brokers.clone(), k.topic.clone())
        };
        let start = Instant::now();
        let stream = consume(cfg, &self.job.reader)?;
        let stats = stream.stats();
        *self.input_stats.lock() = Some(Arc::clone(&stats));
        let trail = Trail(Arc::default());
        trail.record(stream.position().clone());
        let batches = Tracked {
            inner: stream,
            trail: trail.clone(),
        };
        let mut summary = Summary::default();
        let pos = |rows: u64| trail.at(rows);
        self.train_reporting(
            self.job.raw.train.pipeline.unwrap_or(false),
            progress,
            0,
            batches,
            &mut summary,
            || stats.bytes(),
            &pos,
        )?;
        let end = pos(self.start_position.rows_consumed + summary.train_rows);
        summary.input_position = Some(end.clone());
        if summary.steps == 0 {
            tracing::warn!("stopped before any record arrived: nothing trained");
            summary.samples_trained = end.rows_consumed;
            return Ok(summary);
        }
        self.finish_training(&mut summary, start, start, &stats, end)?;
        Ok(summary)
    }
}
