//! Multi-threaded batch reader: a feeder thread cuts the inputs into line-aligned chunks,
//! `threads` parser threads turn them into [`Batch`]es, and a bounded queue of
//! `queue_batches` batches decouples them from the trainer.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::batch::{Batch, BatchBuilder};
use crate::error::DataError;
use crate::parse::LineParser;
use crate::schema::Schema;
use crate::source::{feed, Chunk, Input, Shared};
use crate::stats::{ReadStats, ReadStatsSnapshot};

/// Lines that must be seen before the bad-line ratio is enforced mid-stream.
pub const MIN_LINES_FOR_RATIO: u64 = 1000;

/// Flush a batch early if its ids come close to the `u32` offset limit.
const MAX_BATCH_IDS: usize = (u32::MAX / 2) as usize;

/// How to read a data set.
#[derive(Clone, Debug)]
pub struct ReaderConfig {
    /// Column layout.
    pub schema: Schema,
    /// Rows per batch (the last batches of a parser thread may be smaller).
    pub batch_size: usize,
    /// Parser threads (>= 1). With 1, batch order and content are deterministic.
    pub threads: usize,
    /// Depth of the bounded batch queue (e.g. `2 * threads + 2`).
    pub queue_batches: usize,
    /// Largest tolerated `bad / seen` line ratio (checked once 1000 lines were seen, and at the end).
    pub max_bad_line_ratio: f64,
    /// Passes over the input.
    pub epochs: usize,
    /// Stop after this many rows in total.
    pub max_rows: Option<u64>,
    /// `Some((index, count))`: read only part `index` of `count` disjoint parts of the input
    /// (worker `index` of `count` in a cluster). Each plain file contributes its `index`-th
    /// line-aligned byte range (of `count` near-equal ranges); gzip files, which cannot be
    /// split, are assigned whole, round-robin by their position in the input list.
    pub part: Option<(usize, usize)>,
}

impl ReaderConfig {
    /// Defaults for `schema`: batches of 4096, 4 threads, queue of 10, 1% bad lines, 1 epoch.
    pub fn new(schema: Schema) -> Self {
        ReaderConfig {
            schema,
            batch_size: 4096,
            threads: 4,
            queue_batches: 10,
            max_bad_line_ratio: 0.01,
            epochs: 1,
            max_rows: None,
            part: None,
        }
    }

    /// Checks the config (and its schema).
    pub fn validate(&self) -> Result<(), DataError> {
        self.schema.validate()?;
        let err = |m: &str| Err(DataError::Config(m.to_string()));
        if self.batch_size == 0 {
            return err("batch_size must be at least 1");
        }
        if self.threads == 0 {
            return err("threads must be at least 1");
        }
        if self.queue_batches == 0 {
            return err("queue_batches must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.max_bad_line_ratio) {
            return err("max_bad_line_ratio must be within [0, 1]");
        }
        if let Some((index, count)) = self.part {
            if count == 0 || index >= count {
                return Err(DataError::Config(format!(
                    "part {index} of {count}: the index must be below the count (at least 1)"
                )));
            }
        }
        Ok(())
    }
}

/// Iterator over the batches of a running reader.
///
/// Yields `Ok(batch)` until the input is exhausted; after an `Err` it yields `None`.
/// Dropping it stops and joins the reader threads.
pub struct BatchStream {
    rx: Option<Receiver<Result<Batch, DataError>>>,
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    max_bad_line_ratio: f64,
    rows_left: Option<u64>,
    done: bool,
}

impl BatchStream {
    /// Live counters of this reader.
    pub fn stats(&self) -> Arc<ReadStats> {
        Arc::clone(&self.shared.stats)
    }

    fn shutdown(&mut self) -> Option<DataError> {
        self.done = true;
        self.shared.stop.store(true, Relaxed);
        self.rx = None;
        let mut panicked = None;
        for h in self.handles.drain(..) {
            if h.join().is_err() {
                panicked = Some(DataError::Internal("a reader thread panicked".into()));
            }
        }
        panicked
    }

    /// End of input: join the threads and apply the final bad-line check.
    fn finish(&mut self) -> Option<DataError> {
        if let Some(e) = self.shutdown() {
            return Some(e);
        }
        let st = &self.shared.stats;
        let (bad, seen) = (st.bad_lines(), st.lines_seen());
        too_many_bad(bad, seen, self.max_bad_line_ratio, st)
    }
}

impl Iterator for BatchStream {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.rows_left == Some(0) {
            self.shutdown();
            return None;
        }
        let msg = self.rx.as_ref()?.recv();
        match msg {
            Ok(Ok(mut batch)) => {
                if let Some(left) = self.rows_left.as_mut() {
                    if batch.rows as u64 >= *left {
                        batch = batch.slice(0..*left as usize);
                    }
                    *left -= batch.rows as u64;
                }
                self.shared.stats.add_rows(batch.rows as u64);
                Some(Ok(batch))
            }
            Ok(Err(e)) => {
                self.shutdown();
                Some(Err(e))
            }
            Err(_) => self.finish().map(Err),
        }
    }
}

impl Drop for BatchStream {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub(crate) fn too_many_bad(bad: u64, seen: u64, max: f64, stats: &ReadStats) -> Option<DataError> {
    if seen == 0 {
        return None;
    }
    let ratio = bad as f64 / seen as f64;
    (ratio > max).then(|| DataError::TooManyBadLines {
        bad,
        seen,
        ratio,
        max,
        first: stats
            .first_bad_lines()
            .into_iter()
            .next()
            .unwrap_or_default(),
    })
}

/// Starts reading `paths` (plain or gzip text, detected by magic bytes) in the background.
///
/// Fails up front for an invalid config, a missing path, a directory or an unreadable file;
/// empty files are fine. Plain files are memory-mapped: they must not be truncated while read.
pub fn read_batches(paths: &[PathBuf], cfg: &ReaderConfig) -> Result<BatchStream, DataError> {
    cfg.validate()?;
    let inputs = paths
        .iter()
        .map(|p| Input::open(p))
        .collect::<Result<Vec<_>, _>>()?;
    let shared = Arc::new(Shared {
        stats: Arc::new(ReadStats::default()),
        stop: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        inputs,
    });
    let parser = Arc::new(LineParser::new(&cfg.schema));
    let (out_tx, out_rx) = bounded(cfg.queue_batches);
    let (work_tx, work_rx) = bounded::<Chunk>(cfg.threads * 2);
    let mut handles = Vec::with_capacity(cfg.threads + 1);
    for t in 0..cfg.threads {
        let (shared, parser, work_rx, out_tx) = (
            Arc::clone(&shared),
            Arc::clone(&parser),
            work_rx.clone(),
            out_tx.clone(),
        );
        let (batch_size, max) = (cfg.batch_size, cfg.max_bad_line_ratio);
        handles.push(spawn(format!("sparta-parse-{t}"), move || {
            parse_worker(&shared, &parser, batch_size, max, &work_rx, &out_tx)
        })?);
    }
    drop(work_rx);
    let chunk_bytes =
        (total_plain_bytes(paths) / (cfg.threads as u64 * 4)).clamp(64 << 10, 4 << 20);
    let (epochs, header, part) = (cfg.epochs, cfg.schema.header, cfg.part);
    let feeder_shared = Arc::clone(&shared);
    handles.push(spawn("sparta-feed".into(), move || {
        feed(
            &feeder_shared,
            epochs,
            header,
            part,
            chunk_bytes as usize,
            &work_tx,
            &out_tx,
        )
    })?);
    Ok(BatchStream {
        rx: Some(out_rx),
        shared,
        handles,
        max_bad_line_ratio: cfg.max_bad_line_ratio,
        rows_left: cfg.max_rows,
        done: false,
    })
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, DataError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(|e| DataError::Internal(format!("cannot start reader thread: {e}")))
}

fn total_plain_bytes(paths: &[PathBuf]) -> u64 {
    paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// Parser thread body.
fn parse_worker(
    shared: &Shared,
    parser: &LineParser,
    batch_size: usize,
    max_ratio: f64,
    work: &Receiver<Chunk>,
    out: &Sender<Result<Batch, DataError>>,
) {
    let mut builder = BatchBuilder::new(parser.num_fields(), parser.num_dense(), batch_size);
    while let Ok(chunk) = work.recv() {
        if shared.stopped() {
            return;
        }
        let path = &shared.inputs[chunk.file].path;
        let parsed = parse_chunk(parser, &shared.stats, path, &chunk, &mut builder, |b| {
            !(b.rows() >= batch_size || b.num_ids() >= MAX_BATCH_IDS)
                || out.send(Ok(b.take())).is_ok()
        });
        let Some((seen, bad)) = parsed else { return };
        if let Some(e) = account_lines(&shared.stats, seen, bad, chunk.bytes().len(), max_ratio) {
            shared.fail(out, e);
            return;
        }
    }
    if builder.rows() > 0 && !shared.stopped() {
        let _ = out.send(Ok(builder.take()));
    }
}

/// Parses every line of `chunk` (a file's line-aligned piece) into `builder`: blank lines are
/// skipped, malformed ones counted and reported with their file and line. After each good row
/// `after_row` may flush the builder; when it returns false parsing stops and this returns
/// `None`. Otherwise returns the lines `(seen, bad)`.
pub(crate) fn parse_chunk(
    parser: &LineParser,
    stats: &ReadStats,
    path: &std::path::Path,
    chunk: &Chunk,
    builder: &mut BatchBuilder,
    mut after_row: impl FnMut(&mut BatchBuilder) -> bool,
) -> Option<(u64, u64)> {
    let data = chunk.bytes();
    let (mut seen, mut bad) = (0u64, 0u64);
    let mut start = 0;
    let mut index = 0u64;
    while start < data.len() {
        let end = memchr::memchr(b'\n', &data[start..]).map_or(data.len(), |p| start + p);
        let line = &data[start..end];
        if !(line.is_empty() || line == b"\r") {
            seen += 1;
            if let Err(reason) = parser.parse_line(line, builder) {
                bad += 1;
                stats.report_bad(path, || chunk.line_no(index), &reason, line);
            } else if !after_row(builder) {
                return None;
            }
        }
        start = end + 1;
        index += 1;
    }
    Some((seen, bad))
}

/// Adds a parsed chunk's line counts to `stats`; returns the error when the bad-line ratio is
/// exceeded (checked once [`MIN_LINES_FOR_RATIO`] lines were seen).
pub(crate) fn account_lines(
    stats: &ReadStats,
    seen: u64,
    bad: u64,
    bytes: usize,
    max_ratio: f64,
) -> Option<DataError> {
    let (bad_total, seen_total) = stats.add_lines(seen, bad, bytes as u64);
    if seen_total < MIN_LINES_FOR_RATIO {
        return None;
    }
    too_many_bad(bad_total, seen_total, max_ratio, stats)
}

/// Reads the whole data set into memory.
pub fn read_all(
    paths: &[PathBuf],
    cfg: &ReaderConfig,
) -> Result<(Vec<Batch>, ReadStatsSnapshot), DataError> {
    let mut stream = read_batches(paths, cfg)?;
    let mut batches = Vec::new();
    for b in stream.by_ref() {
        batches.push(b?);
    }
    let stats = stream.stats().snapshot();
    Ok((batches, stats))
}
