//! Training data from a Kafka topic: every partition consumed, one record = one line of the
//! job's schema layout (TSV/CSV text, exactly as a line of a file), with the next offset of
//! every partition after each batch.
//!
//! # Reading
//!
//! One fetch task per partition (an async [`rskafka`] client on a small tokio runtime of
//! its own) keeps up to [`FETCH_AHEAD`] fetches of about `fetch_bytes` each waiting for the
//! driver, so the broker is asked for more while the parsers work. The driver lays the
//! records end to end as the lines of one text and cuts it into chunks (`pump`); the one
//! reading engine parses them on `threads` threads and assembles batches of `batch_size` rows
//! in that order. When nothing arrives for `linger`, a partly filled batch goes out short
//! (online latency), as at the end of a followed file. Rules per record: see `pump`.
//!
//! # Positions (exact resume)
//!
//! Records of several partitions share batches, so every batch carries the next offset of
//! EVERY partition after it ([`KafkaPosition`]; bookkeeping in `offsets`). A stream started at
//! a position continues each partition at its offset: nothing skipped, nothing read twice. The
//! broker's committed offsets are not used. Partitions missing from the start position start
//! per [`StartAt`]; partitions added to the topic while reading are found within
//! [`DISCOVER_EVERY`] and read from their first record.
//!
//! # Ending
//!
//! A stream follows the topic until its stop flag is set; with `drain` it ends once every
//! partition is read up to the end it had when the stream started (a backfill).

mod client;
mod offsets;
mod pump;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::batch::Batch;
use crate::engine::{self, EngineConfig, Online, Polled};
use crate::error::DataError;
use crate::feed::BadFiles;
use crate::parse::LineParser;
use crate::queue::FileRef;
use crate::reader::ReaderConfig;
use crate::stats::ReadStats;

pub use client::{produce_lines, ProduceReport, ProducerConfig};
use offsets::{Offsets, RecordEnd};
#[cfg(test)]
use pump::{Fetched, Poll};

/// Fetches per partition waiting for the driver (the read-ahead).
pub const FETCH_AHEAD: usize = 4;

/// How often the topic's partition list is read again to find new partitions.
pub const DISCOVER_EVERY: Duration = Duration::from_secs(10);

/// Where a partition without a saved offset starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartAt {
    /// Its first record still kept by the broker.
    #[default]
    Earliest,
    /// After its last record when the stream starts (only new records).
    Latest,
}

/// Where a stream stands: the next unread offset of every partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KafkaPosition {
    /// The topic.
    pub topic: String,
    /// `(partition, next offset)`, by partition.
    pub offsets: Vec<(i32, i64)>,
    /// Rows delivered since the start of the stream (including before a restart).
    pub rows: u64,
}

/// How to read a topic.
#[derive(Clone, Debug)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// The topic.
    pub topic: String,
    /// Where partitions without an offset in `start` begin.
    pub from: StartAt,
    /// Where to start (a position returned with an earlier batch; default: per `from`).
    pub start: KafkaPosition,
    /// When set, the stream ends before its next batch.
    pub stop: Arc<AtomicBool>,
    /// End once every partition is read to the end it had at the start (see the module docs).
    pub drain: bool,
    /// While no record is waiting, yield an empty batch (0 rows, the last position) this
    /// often, so the consumer can do timed work (exports) while idle.
    pub idle_tick: Option<Duration>,
    /// Most bytes per fetch and partition.
    pub fetch_bytes: usize,
    /// Longest a fetch waits on the broker for records.
    pub max_wait: Duration,
    /// A partly filled batch goes out after this long without records.
    pub linger: Duration,
}

impl KafkaConfig {
    /// Reads `topic` on `brokers` from its earliest records, until stopped.
    pub fn new(brokers: Vec<String>, topic: impl Into<String>) -> Self {
        KafkaConfig {
            brokers,
            topic: topic.into(),
            from: StartAt::Earliest,
            start: KafkaPosition::default(),
            stop: Arc::new(AtomicBool::new(false)),
            drain: false,
            idle_tick: None,
            fetch_bytes: 1 << 20,
            max_wait: Duration::from_millis(200),
            linger: Duration::from_millis(100),
        }
    }
}

/// A batch and the position after it.
#[derive(Clone, Debug)]
pub struct KafkaBatch {
    /// The rows (empty only for an idle tick).
    pub batch: Batch,
    /// The position after this batch: resume here to continue with the next one.
    pub position: KafkaPosition,
}

/// Iterator over the batches of a topic (see the module docs). Yields `Ok(batch)` until it
/// ends; after an `Err` it yields `None`. Dropping it stops and joins its threads.
pub struct KafkaStream {
    online: Online,
    ends: Receiver<Vec<RecordEnd>>,
    offsets: Offsets,
    position: KafkaPosition,
    /// Nothing arrived since the last batch (logged once per quiet spell).
    quiet: bool,
}

impl KafkaStream {
    /// Live counters (rows, lines, bad lines, bytes).
    pub fn stats(&self) -> Arc<ReadStats> {
        Arc::clone(&self.online.running.shared.stats)
    }

    /// The position after the last batch returned (the start position before the first).
    pub fn position(&self) -> &KafkaPosition {
        &self.position
    }
}

impl Iterator for KafkaStream {
    type Item = Result<KafkaBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.online.poll("kafka") {
                Polled::Batch(b) => {
                    self.quiet = false;
                    // The driver logs a chunk's record ends before sending the chunk.
                    self.offsets.log(self.ends.try_iter().flatten());
                    self.offsets.advance(b.offset);
                    self.position.offsets = self.offsets.snapshot();
                    self.position.rows = b.rows;
                    return Some(Ok(KafkaBatch {
                        batch: b.batch,
                        position: self.position.clone(),
                    }));
                }
                Polled::Idle => {
                    self.note_quiet();
                    return Some(Ok(KafkaBatch {
                        batch: Batch::default(),
                        position: self.position.clone(),
                    }));
                }
                Polled::Waiting => self.note_quiet(),
                Polled::End(e) => return e.map(Err),
            }
        }
    }
}

impl KafkaStream {
    /// Logs the start of a quiet spell (once, until the next batch).
    fn note_quiet(&mut self) {
        if !std::mem::replace(&mut self.quiet, true) {
            tracing::info!(
                "kafka: caught up after {} rows; waiting for records (next offsets {:?})",
                self.position.rows,
                self.position.offsets
            );
        }
    }
}

/// Connects to `cfg.brokers` and starts reading `cfg.topic` with the schema, batch size,
/// parser threads, queue depth and bad-line ratio of `reader` (its epochs, `max_rows` and
/// `part` do not apply).
///
/// Fails up front for an invalid config, an unreachable broker, a missing topic, or a start
/// position of another topic or past a partition's end.
pub fn consume(cfg: KafkaConfig, reader: &ReaderConfig) -> Result<KafkaStream, DataError> {
    reader.validate()?;
    if cfg.brokers.is_empty() {
        return Err(DataError::Kafka(
            "--kafka: expected at least one broker as host:port".into(),
        ));
    }
    if cfg.topic.is_empty() {
        return Err(DataError::Kafka("--topic: expected a topic name".into()));
    }
    if !cfg.start.topic.is_empty() && cfg.start.topic != cfg.topic {
        return Err(DataError::Kafka(format!(
            "the saved position is of topic {:?}, not {:?}: start without --resume, or read {:?}",
            cfg.start.topic, cfg.topic, cfg.start.topic
        )));
    }
    let source = client::Source::connect(&cfg)?;
    let start = KafkaPosition {
        topic: cfg.topic.clone(),
        offsets: source.start_offsets(),
        rows: cfg.start.rows,
    };
    let linger = cfg.linger;
    start_stream(&cfg, reader, start, move |feeder, file, ends| {
        source.run(feeder, file, linger, ends)
    })
}

/// Starts the engine on `drive` (the Kafka source, or a fake one in tests).
pub(crate) fn start_stream(
    cfg: &KafkaConfig,
    reader: &ReaderConfig,
    start: KafkaPosition,
    drive: impl FnOnce(&crate::feed::Feeder, &Arc<FileRef>, &crossbeam_channel::Sender<Vec<RecordEnd>>)
        + Send
        + 'static,
) -> Result<KafkaStream, DataError> {
    let (ends_tx, ends_rx) = crossbeam_channel::unbounded();
    let file = Arc::new(FileRef {
        path: PathBuf::from(format!("kafka:{}", cfg.topic)),
        name: Arc::from(cfg.topic.as_str()),
        epoch: 0,
        index: 0,
    });
    let engine_cfg = EngineConfig {
        parser: Arc::new(LineParser::for_plan(&reader.schema, reader.plan.as_deref())),
        threads: reader.threads,
        queue_batches: reader.queue_batches,
        max_bad_line_ratio: reader.max_bad_line_ratio,
        batch_size: reader.batch_size,
        rows_left: None,
        start_rows: start.rows,
        // A partly filled batch goes out when the topic is quiet (see `pump`).
        flush_at_file_end: true,
        bad_files: BadFiles::Fail,
        detach_on_stop: false,
        driver_name: "sparta-kafka",
        stats: Arc::new(crate::stats::ReadStats::default()),
    };
    let running = engine::start(engine_cfg, move |feeder, _wake| {
        drive(&feeder, &file, &ends_tx)
    })?;
    Ok(KafkaStream {
        online: Online::new(running, Arc::clone(&cfg.stop), cfg.idle_tick),
        ends: ends_rx,
        offsets: Offsets::new(&start.offsets),
        position: start,
        // The first quiet spell is logged only after a batch.
        quiet: true,
    })
}

#[cfg(test)]
mod tests;
