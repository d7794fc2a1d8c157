//! Training data from a Kafka topic: every partition consumed (or this reader's share of
//! them), one record = one line of the job's schema layout (TSV/CSV text, exactly as a line of
//! a file), with the next offset of every partition after each batch.
//!
//! # Client
//!
//! A thin async client of the Kafka protocol on [`kafka_protocol`]'s messages over tokio TCP
//! streams (`wire`): ApiVersions (each API at the newest version both sides speak), Metadata
//! (partitions and the leader of each, several brokers; `brokers`), ListOffsets, Fetch and
//! Produce. Record batches of every codec are read: gzip, snappy, lz4 and zstd (`batches`).
//!
//! # Reading
//!
//! One fetch task per partition (`fetch`, on a small tokio runtime of its own) keeps up to
//! [`FETCH_AHEAD`] answers of about `fetch_bytes` each waiting for the driver, so the broker
//! is asked for more while the parsers work. The driver lays the records end to end as the
//! lines of one text and cuts it into chunks (`pump`); the one reading engine parses them on
//! `threads` threads and assembles batches of `batch_size` rows in that order. When nothing
//! arrives for `linger`, a partly filled batch goes out short (online latency), as at the end
//! of a followed file. Rules per record: see `pump`.
//!
//! Failures: a lost or timed-out connection, a leader that moved and other transient broker
//! errors are logged and retried after a pause (the leader asked for again). A record batch
//! that cannot be read (corrupt, a bad CRC, an unknown codec, an undecodable control record),
//! an offset out of range, or a broker error Kafka calls final stop the stream with
//! [`DataError::Kafka`] naming the topic, partition and offset: reading it again gives the
//! same bytes.
//!
//! # Transactions (read committed)
//!
//! Only committed records are trained, decided by this client from the transaction markers
//! (`txn`): the records of a transactional batch wait for their producer's next control batch
//! on the partition; COMMIT releases them, ABORT drops them; control records are never
//! trained. Records are released strictly in offset order, so records after an undecided
//! transactional record wait behind it and a saved position never passes an undecided
//! record. Fetches also ask for `read_committed`: Apache Kafka then stops them at the last
//! stable offset; brokers that do not (Tansu 0.6) are filtered all the same.
//!
//! # Assignment
//!
//! [`KafkaConfig::assign`] = `Some(Assignment { rank, workers })` reads only the partitions
//! `p` with `p % workers == rank` (also among partitions discovered later), so `workers`
//! readers share a topic without overlap; `None` reads every partition. The positions of a
//! reader hold its own partitions only.
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
//! # Sharing a topic
//!
//! With [`KafkaConfig::assign`] a reader takes only partition `p` where
//! `p % workers == rank` (cluster workers, each with its own rank), partitions found later
//! included; its positions list only those partitions.
//!
//! # Ending
//!
//! A stream follows the topic until its stop flag is set; with `drain` it ends once every
//! partition is read up to the end it had when the stream started (a backfill); records whose
//! transaction marker lies past that end (and records behind them) are not read, and the
//! positions stay before them.
//!
//! # Lag
//!
//! [`KafkaStream::lag_meter`] hands out a [`LagMeter`]: per partition, the high watermark of
//! the newest fetch response minus the next offset of the stream's position.

mod batches;
mod brokers;
mod client;
mod fetch;
mod offsets;
mod produce;
mod pump;
mod txn;
mod wire;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
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

use offsets::{Offsets, RecordEnd};
pub use produce::{produce_lines, Compression, ProduceReport, ProducerConfig};
#[cfg(test)]
use pump::{Fetched, Poll};

/// What [`fuzz_read_answer`] read: for the fuzz targets only.
#[doc(hidden)]
#[derive(Debug)]
pub struct FuzzAnswer {
    /// The offsets of the records released (committed or not transactional), in order.
    pub released: Vec<i64>,
    /// Records held for their transaction's marker.
    pub held: usize,
    /// The position after what was released (where a restart reads from).
    pub position: i64,
    /// The offset the next fetch asks for.
    pub next_fetch: i64,
    /// The size of a batch cut short at the end of the answer.
    pub cut_short: Option<usize>,
}

/// For the fuzz targets only (not an API): reads one fetch answer's record bytes, fetched at
/// `from` (to `end`), exactly as a partition's fetch task reads them; an error is a batch
/// that cannot be read.
#[doc(hidden)]
pub fn fuzz_read_answer(records: &[u8], from: i64, end: Option<i64>) -> Result<FuzzAnswer, String> {
    let mut filter = txn::Committed::new(from);
    let mut offset = from;
    let cut_short = fetch::read_answer(
        bytes::Bytes::copy_from_slice(records),
        &mut offset,
        end,
        &mut filter,
    )
    .map_err(|b| format!("offset {}: {}", b.offset, b.reason))?;
    let held = filter.held();
    let (released, position) = filter.take();
    Ok(FuzzAnswer {
        released: released.into_iter().map(|(o, _)| o).collect(),
        held,
        position,
        next_fetch: offset,
        cut_short,
    })
}

/// For the fuzz targets only (not an API): a fetch answer's record bytes built from
/// arbitrary `input` (valid batches of every codec, transactional or not, markers; then some
/// bytes flipped).
#[doc(hidden)]
pub fn fuzz_build_answer(input: &[u8]) -> Vec<u8> {
    batches::build::answer(input)
}

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

/// This reader's share of a topic's partitions (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// This reader's number, `0..workers`.
    pub rank: u32,
    /// How many readers share the topic.
    pub workers: u32,
}

impl Assignment {
    /// Whether this reader takes partition `p` (`p % workers == rank`).
    pub fn takes(self, p: i32) -> bool {
        u32::try_from(p).is_ok_and(|p| self.workers > 0 && p % self.workers == self.rank)
    }
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
    /// This reader's partitions (`None`: all of them).
    pub assign: Option<Assignment>,
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
            assign: None,
        }
    }
}

/// Per-partition lag of a stream, shared with whoever reports it (a metrics thread): the
/// high watermark of the newest fetch response minus the stream's next offset.
#[derive(Clone, Debug, Default)]
pub struct LagMeter(Arc<Mutex<LagState>>);

#[derive(Debug, Default)]
struct LagState {
    /// Partition -> high watermark of its newest fetch response.
    high: BTreeMap<i32, i64>,
    /// Partition -> next offset of the stream's position (or where its fetches started).
    next: BTreeMap<i32, i64>,
    /// Records handed out by the stream (rows of its batches).
    rows: u64,
}

impl LagMeter {
    /// `(partition, high watermark - next offset)` of every partition fetched so far.
    pub fn lag(&self) -> Vec<(i32, i64)> {
        let st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        st.high
            .iter()
            .map(|(&p, &h)| (p, (h - st.next.get(&p).copied().unwrap_or(h)).max(0)))
            .collect()
    }

    /// Rows the stream handed out since it started (this process).
    pub fn rows(&self) -> u64 {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).rows
    }

    fn with(&self, f: impl FnOnce(&mut LagState)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// A fetch task starts reading `partition` at `offset`.
    pub(crate) fn started(&self, partition: i32, offset: i64) {
        self.with(|st| {
            st.next.entry(partition).or_insert(offset);
        });
    }

    /// A fetch response of `partition` reported `high_watermark`.
    pub(crate) fn high_watermark(&self, partition: i32, high_watermark: i64) {
        self.with(|st| {
            st.high.insert(partition, high_watermark);
        });
    }

    /// The stream handed out a batch of `rows` ending at `offsets`.
    fn advanced(&self, offsets: &[(i32, i64)], rows: u64) {
        self.with(|st| {
            st.next.extend(offsets.iter().copied());
            st.rows += rows;
        });
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
    lag: LagMeter,
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

    /// The stream's per-partition lag, readable from other threads while it runs.
    pub fn lag_meter(&self) -> LagMeter {
        self.lag.clone()
    }

    /// `(partition, high watermark - next offset)` of every partition fetched so far.
    pub fn lag(&self) -> Vec<(i32, i64)> {
        self.lag.lag()
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
                    self.lag
                        .advanced(&self.position.offsets, b.batch.rows as u64);
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
    if let Some(a) = cfg.assign.filter(|a| a.rank >= a.workers) {
        return Err(DataError::Kafka(format!(
            "partition assignment: reader {} of {} (expected a rank below the number of readers)",
            a.rank, a.workers
        )));
    }
    if !cfg.start.topic.is_empty() && cfg.start.topic != cfg.topic {
        return Err(DataError::Kafka(format!(
            "the saved position is of topic {:?}, not {:?}: start without --resume, or read {:?}",
            cfg.start.topic, cfg.topic, cfg.start.topic
        )));
    }
    let lag = LagMeter::default();
    let source = client::Source::connect(&cfg, lag.clone())?;
    let start = KafkaPosition {
        topic: cfg.topic.clone(),
        offsets: source.start_offsets(),
        rows: cfg.start.rows,
    };
    let linger = cfg.linger;
    let mut stream = start_stream(&cfg, reader, start, move |feeder, file, ends| {
        source.run(feeder, file, linger, ends)
    })?;
    stream.lag = lag;
    Ok(stream)
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
        nice: reader.nice,
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
        lag: LagMeter::default(),
    })
}

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
