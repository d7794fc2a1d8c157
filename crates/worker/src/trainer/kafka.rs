//! Training on a Kafka topic ([`sparta_data::kafka`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sparta_checkpoint::InputPosition;
use sparta_core::CoreError;
use sparta_data::kafka::{consume, Assignment, KafkaConfig, KafkaPosition, KafkaStream};
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
///
/// Invariant: every position the loop may still ask for (rows trained so far and after) is
/// kept. The loop asks for non-decreasing row counts, so a lookup drops the positions before
/// the one found; the cap ([`TRAIL`]) drops the oldest only if the loop falls that far behind
/// what it read. A position asked for but no longer (or never) kept is an error that stops
/// the run: saving any other position would make a resume train records twice or skip them.
#[derive(Clone, Default)]
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

    /// The position after `rows` rows (exact: every position of the trail is a batch end);
    /// an error when the trail does not hold it.
    fn at(&self, rows: u64) -> Result<InputPosition, CoreError> {
        let mut q = self.0.lock();
        match q.iter().rposition(|p| p.rows == rows) {
            Some(i) => {
                q.drain(..i); // never asked for again
                Ok(kafka_to_input(&q[0]))
            }
            None => Err(CoreError::Training(format!(
                "no Kafka position for {rows} rows consumed (positions kept: {}): stopping \
                 without a checkpoint, since any other position would make a resume train \
                 records twice or skip them",
                match (q.front(), q.back()) {
                    (Some(f), Some(b)) => format!("after {} to {} rows", f.rows, b.rows),
                    _ => "none".into(),
                }
            ))),
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
    /// batch; a resumed trainer continues every partition at exactly that record. A cluster
    /// worker (the reader's `part` is `(rank, workers)`) reads partition `p` when
    /// `p % workers == rank`.
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
        // A cluster worker reads partition p when p % workers == rank.
        let assign = self.job.reader.part.map(|(rank, workers)| Assignment {
            rank: rank as u32,
            workers: workers as u32,
        });
        if assign.is_some() && self.job.raw.train.pipeline == Some(true) {
            return Err(CoreError::Config(
                "train.pipeline (--pipeline) with a Kafka topic on a cluster: a worker whose \
                 partitions are quiet joins the other workers' checkpoint round between \
                 batches, which the pipelined loop does not do; use the sequential loop"
                    .into(),
            ));
        }
        let saved = input_to_kafka(&self.start_position);
        if self.resumed_from.is_some() && saved.topic.is_empty() && saved.rows > 0 {
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
            assign,
            ..KafkaConfig::new(k.brokers.clone(), k.topic.clone())
        };
        let start = Instant::now();
        let stream = consume(cfg, &self.job.reader)?;
        let stats = stream.stats();
        *self.input_stats.lock() = Some(Arc::clone(&stats));
        *self.kafka_lag.lock() = Some((k.topic.clone(), stream.lag_meter()));
        let trail = Trail::default();
        trail.record(stream.position().clone());
        let none_here = assign.filter(|_| stream.position().offsets.is_empty());
        if let Some(a) = none_here {
            tracing::warn!(
                "worker {} of {}: no partition of topic {} is this worker's (partition p goes \
                 to worker p mod {}): {}",
                a.rank,
                a.workers,
                k.topic,
                a.workers,
                if k.idle_without_partitions {
                    "training nothing until stopped (it joins the checkpoint rounds and reads \
                     a partition of its share added later)"
                } else {
                    "leaving at once, so that the other workers' steps do not wait for it"
                }
            );
        }
        let batches = Tracked {
            inner: stream,
            trail: trail.clone(),
        };
        let mut summary = Summary::default();
        let pos = |rows: u64| trail.at(rows);
        if none_here.is_none() || k.idle_without_partitions {
            self.train_reporting(
                self.job.raw.train.pipeline.unwrap_or(false),
                progress,
                0,
                batches,
                &mut summary,
                || stats.bytes(),
                &pos,
            )?;
        }
        let end = pos(self.start_position.rows_consumed + summary.train_rows)?;
        summary.input_position = Some(end.clone());
        // A followed topic ends only on the stop flag; a drained one, early, when stopped.
        summary.stopped_early = k.stop.load(std::sync::atomic::Ordering::Relaxed);
        if summary.steps == 0 {
            if none_here.is_none() {
                tracing::warn!("stopped before any record arrived: nothing trained");
            }
            summary.samples_trained = end.rows_consumed;
            summary.resumed_from = self.resumed_from.clone();
            if let Some(c) = self.checkpoints.as_mut() {
                // A cluster worker leaves the checkpoint rounds (embedded: nothing to do).
                c.finish(self.start_step, end)?;
            }
            return Ok(summary);
        }
        self.finish_training(&mut summary, start, start, &stats, end)?;
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position(rows: u64) -> KafkaPosition {
        KafkaPosition {
            topic: "clicks".into(),
            offsets: vec![(0, rows as i64)],
            rows,
        }
    }

    #[test]
    fn a_position_the_trail_no_longer_holds_stops_the_run_instead_of_saving_another() {
        let trail = Trail::default();
        // The loop fell more than TRAIL batches behind what it read: the position after the
        // rows it trained was dropped.
        for b in 0..=TRAIL as u64 {
            trail.record(position(b * 10));
        }
        let e = trail.at(0).unwrap_err().to_string();
        assert!(
            e.contains("no Kafka position for 0 rows") && e.contains("without a checkpoint"),
            "{e}"
        );
        // Rows that are no batch end are refused too.
        assert!(trail.at(15).is_err());
        // A position the trail holds is exact.
        let at = trail.at(20).unwrap();
        assert_eq!(at.rows_consumed, 20);
        assert_eq!(at, kafka_to_input(&position(20)));
    }

    #[test]
    fn a_lookup_drops_only_the_positions_before_it() {
        let trail = Trail::default();
        for rows in [0, 64, 128, 192] {
            trail.record(position(rows));
        }
        assert_eq!(trail.at(128).unwrap().rows_consumed, 128);
        // Asked again (the final position after a checkpoint at the same rows) and later.
        assert_eq!(trail.at(128).unwrap().rows_consumed, 128);
        assert_eq!(trail.at(192).unwrap().rows_consumed, 192);
        // Earlier ones are gone: the loop never asks for fewer rows than before.
        assert!(trail.at(64).is_err());
    }
}
