//! Multi-threaded batch reader: a feeder thread cuts the inputs into line-aligned chunks,
//! `threads` parser threads parse them, an assembler thread puts the parsed rows back in input
//! order and cuts them into [`Batch`]es, and a bounded queue of `queue_batches` batches
//! decouples them from the trainer.
//!
//! # Order and positions
//!
//! The batches do not depend on `threads`: all rows of all epochs, in input order (files in
//! list order, lines in file order), are cut into batches of exactly `batch_size` rows; a
//! batch may span chunks, files and epochs, only the last batch is shorter (or a batch whose
//! ids reach 2^31, far beyond any real batch). Blank and malformed lines are skipped and do
//! not count as rows. This is what the single-threaded reader always did.
//!
//! Every batch comes with the [`ReadPosition`] after its last row
//! ([`BatchStream::next_positioned`]). A reader started at that position
//! ([`read_batches_at`]) yields exactly the remaining rows, cut the same way: since a
//! position is always a batch boundary, its batches are exactly the remaining batches of the
//! first reader. Only the first few bad lines kept in [`ReadStats::first_bad_lines`] may come
//! in a different order with several threads.
//!
//! # Memory
//!
//! Parsed chunks wait for the assembler in a bounded queue of `2 * threads + 2` chunks (plain
//! chunks are up to 4 MiB of text, gzip ones about 1 MiB), then `queue_batches` batches wait
//! for the consumer: a slow parser stalls the feeder, nothing grows without bound.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver};
use serde::{Deserialize, Serialize};

use crate::assemble::{assemble, parse_blocks, Assembler, Pending, Spare, Work, MAX_BATCH_IDS};
use crate::batch::{Batch, BatchBuilder};
use crate::error::DataError;
use crate::parse::LineParser;
use crate::schema::Schema;
use crate::source::{feed, Chunk, FeedPlan, Input, InputKind, Shared};
use crate::stats::{ReadStats, ReadStatsSnapshot};

/// Lines that must be seen before the bad-line ratio is enforced mid-stream.
pub const MIN_LINES_FOR_RATIO: u64 = 1000;

/// Where a reader stands: the next unread row is the first row at or after `byte_offset` of
/// input `file_index` in pass `epoch` (all 0-based).
///
/// Returned with every batch ([`BatchStream::next_positioned`]), it is the position right after
/// the batch's last row; give it to [`read_batches_at`] (with the same inputs and config) to
/// continue with exactly the next unread row. The default is the start of the job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReadPosition {
    /// Pass over the input (`0..epochs`).
    pub epoch: u64,
    /// Index of the input file in the path list.
    pub file_index: u64,
    /// Byte offset in that file (of the decompressed text for gzip) where the next line starts.
    pub byte_offset: u64,
    /// Rows handed out since the start of the job, including those before a resume.
    pub rows: u64,
}

/// A batch and the position after it.
#[derive(Clone, Debug)]
pub struct PositionedBatch {
    /// The rows (never empty).
    pub batch: Batch,
    /// The position after this batch's last row: start there to continue with the next one.
    pub position: ReadPosition,
}

/// How to read a data set.
#[derive(Clone, Debug)]
pub struct ReaderConfig {
    /// Column layout.
    pub schema: Schema,
    /// Rows per batch (only the last batch may be smaller).
    pub batch_size: usize,
    /// Parser threads (>= 1). The batches are the same for any number (see the module docs).
    pub threads: usize,
    /// Depth of the bounded batch queue (e.g. `2 * threads + 2`).
    pub queue_batches: usize,
    /// Largest tolerated `bad / seen` line ratio (checked once 1000 lines were seen, and at the end).
    pub max_bad_line_ratio: f64,
    /// Passes over the input.
    pub epochs: usize,
    /// Stop after this many rows in total, over the whole job: a reader started at a
    /// [`ReadPosition`] with `rows` rows hands out at most `max_rows - rows` more.
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
/// [`BatchStream::next_positioned`] (or [`BatchStream::positioned`]) yields each batch with
/// the [`ReadPosition`] after it. Dropping it stops and joins the reader threads.
pub struct BatchStream {
    rx: Option<Receiver<Result<PositionedBatch, DataError>>>,
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    max_bad_line_ratio: f64,
    max_rows: Option<u64>,
    position: ReadPosition,
    done: bool,
}

impl BatchStream {
    /// Live counters of this reader (of what it read: not of the rows before its start).
    pub fn stats(&self) -> Arc<ReadStats> {
        Arc::clone(&self.shared.stats)
    }

    /// The position after the last batch returned (the start position before the first).
    pub fn position(&self) -> ReadPosition {
        self.position
    }

    /// The next batch with the position after it; `None` at the end (and after an `Err`).
    pub fn next_positioned(&mut self) -> Option<Result<PositionedBatch, DataError>> {
        if self.done {
            return None;
        }
        if self.max_rows.is_some_and(|m| self.position.rows >= m) {
            self.shutdown();
            return None;
        }
        let msg = self.rx.as_ref()?.recv();
        match msg {
            Ok(Ok(b)) => {
                self.position = b.position;
                self.shared.stats.add_rows(b.batch.rows as u64);
                Some(Ok(b))
            }
            Ok(Err(e)) => {
                self.shutdown();
                Some(Err(e))
            }
            Err(_) => self.finish().map(Err),
        }
    }

    /// An iterator of the batches with their positions (see [`BatchStream::next_positioned`]).
    pub fn positioned(&mut self) -> Positioned<'_> {
        Positioned(self)
    }

    fn shutdown(&mut self) -> Option<DataError> {
        self.done = true;
        self.shared.stop();
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
        self.next_positioned().map(|r| r.map(|b| b.batch))
    }
}

impl Drop for BatchStream {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Iterator of a [`BatchStream`]'s batches with their positions ([`BatchStream::positioned`]).
pub struct Positioned<'a>(&'a mut BatchStream);

impl Iterator for Positioned<'_> {
    type Item = Result<PositionedBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_positioned()
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
    read_batches_at(paths, cfg, ReadPosition::default())
}

/// Like [`read_batches`], but starts at `start`: a position returned with a batch of an
/// earlier reader of the same inputs and config ([`ReadPosition::default`] is the beginning).
///
/// Earlier epochs, files and bytes are skipped without parsing them (a gzip file is
/// decompressed up to the offset and the bytes discarded); with `part`, reading starts at the
/// later of the part's start and the offset. A header line is only skipped when a file is
/// started at offset 0. `max_rows` counts from the start of the job: at most
/// `max_rows - start.rows` more rows are read. The reader's stats cover only what it reads.
///
/// Besides the errors of [`read_batches`], fails up front for a start that does not fit:
/// an epoch not below `epochs`, `rows` above `max_rows`, a file index out of range, an
/// offset past the end of a plain file or not at a line start. A gzip offset that is past the
/// end of its text or not at a line start gives an error when the file is reached.
pub fn read_batches_at(
    paths: &[PathBuf],
    cfg: &ReaderConfig,
    start: ReadPosition,
) -> Result<BatchStream, DataError> {
    cfg.validate()?;
    let inputs = paths
        .iter()
        .map(|p| Input::open(p))
        .collect::<Result<Vec<_>, _>>()?;
    check_start(&inputs, cfg, &start)?;
    let shared = Arc::new(Shared {
        stats: Arc::new(ReadStats::default()),
        stop: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        inputs,
    });
    let parser = Arc::new(LineParser::new(&cfg.schema));
    let (out_tx, out_rx) = bounded(cfg.queue_batches);
    let (work_tx, work_rx) = bounded::<Work>(cfg.threads);
    let (ordered_tx, ordered_rx) = bounded::<Pending>(2 * cfg.threads + 2);
    let (spare_tx, spare_rx) = bounded::<Spare>(cfg.threads + 1);
    let mut handles = Vec::with_capacity(cfg.threads + 2);
    for t in 0..cfg.threads {
        let (shared, parser, work_rx, spare_rx) = (
            Arc::clone(&shared),
            Arc::clone(&parser),
            work_rx.clone(),
            spare_rx.clone(),
        );
        handles.push(spawn(format!("sparta-parse-{t}"), move || {
            parse_blocks(&shared, &parser, &work_rx, &spare_rx)
        })?);
    }
    drop(work_rx);
    let rows_left = cfg.max_rows.map(|m| m.saturating_sub(start.rows));
    let asm = Assembler::new(cfg.batch_size, MAX_BATCH_IDS, rows_left, start);
    let (asm_shared, max) = (Arc::clone(&shared), cfg.max_bad_line_ratio);
    handles.push(spawn("sparta-assemble".into(), move || {
        assemble(&asm_shared, asm, max, &ordered_rx, &spare_tx, &out_tx)
    })?);
    let chunk_bytes =
        (total_plain_bytes(paths) / (cfg.threads as u64 * 4)).clamp(64 << 10, 4 << 20);
    let plan = FeedPlan {
        epochs: cfg.epochs as u64,
        header: cfg.schema.header,
        part: cfg.part,
        chunk_bytes: chunk_bytes as usize,
        start,
    };
    let feeder_shared = Arc::clone(&shared);
    handles.push(spawn("sparta-feed".into(), move || {
        feed(&feeder_shared, &plan, &ordered_tx, &work_tx)
    })?);
    Ok(BatchStream {
        rx: Some(out_rx),
        shared,
        handles,
        max_bad_line_ratio: cfg.max_bad_line_ratio,
        max_rows: cfg.max_rows,
        position: start,
        done: false,
    })
}

/// Checks that `start` fits the config and the opened inputs.
fn check_start(
    inputs: &[Input],
    cfg: &ReaderConfig,
    start: &ReadPosition,
) -> Result<(), DataError> {
    let bad = |why: String| {
        Err(DataError::Config(format!(
            "start position {start:?}: {why}"
        )))
    };
    if start.epoch >= cfg.epochs.max(1) as u64 {
        return bad(format!(
            "epoch {} is not below the {} epoch(s)",
            start.epoch, cfg.epochs
        ));
    }
    if let Some(max) = cfg.max_rows.filter(|&m| start.rows > m) {
        return bad(format!(
            "{} rows already read exceed max_rows {max}",
            start.rows
        ));
    }
    let (file, offset) = (start.file_index, start.byte_offset);
    let Some(input) = usize::try_from(file).ok().and_then(|i| inputs.get(i)) else {
        if file == 0 && offset == 0 {
            return Ok(()); // the start of an empty input list
        }
        return bad(format!(
            "file index {file} is out of range (0..{})",
            inputs.len()
        ));
    };
    let path = input.path.display();
    match &input.kind {
        InputKind::Empty if offset > 0 => bad(format!("{path} is empty")),
        InputKind::Plain(map) if offset > map.len() as u64 => bad(format!(
            "offset {offset} is past the end of {path} ({} bytes)",
            map.len()
        )),
        InputKind::Plain(map)
            if offset > 0 && offset < map.len() as u64 && map[offset as usize - 1] != b'\n' =>
        {
            bad(format!("offset {offset} of {path} is not at a line start"))
        }
        _ => Ok(()),
    }
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

/// Parses every line of `chunk` (a file's line-aligned piece) into `builder`: blank lines are
/// skipped, malformed ones counted and reported with their file and line. After each good row
/// `after_row` gets the builder and the offset in the chunk just after the row's line (where
/// the next line starts); when it returns false parsing stops and this returns `None`.
/// Otherwise returns the lines `(seen, bad)`.
pub(crate) fn parse_chunk(
    parser: &LineParser,
    stats: &ReadStats,
    path: &std::path::Path,
    chunk: &Chunk,
    builder: &mut BatchBuilder,
    mut after_row: impl FnMut(&mut BatchBuilder, usize) -> bool,
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
            } else if !after_row(builder, (end + 1).min(data.len())) {
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
    bytes: u64,
    max_ratio: f64,
) -> Option<DataError> {
    let (bad_total, seen_total) = stats.add_lines(seen, bad, bytes);
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
