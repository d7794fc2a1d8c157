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
//! The engine behind it (feeder, parsers, assembler) is [`crate::engine`]; the rules for
//! start offsets, headers, overlong lines and bad files are in [`crate::feed`].

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::batch::Batch;
use crate::engine::{self, EngineConfig, Next, Running};
use crate::error::DataError;
use crate::feed::{check_ranged_start, BadFiles, FileJob, StartError};
use crate::input::{Input, InputKind, Opener};
use crate::parse::LineParser;
use crate::queue::FileRef;
use crate::schema::Schema;
use crate::stats::{ReadStats, ReadStatsSnapshot};

pub use crate::stats::MIN_LINES_FOR_RATIO;

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
    /// Byte offset in that file (of the decompressed text for gzip) where the next line starts;
    /// for a Parquet file, the number of rows of the file before the next row.
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
    /// What each line becomes (feature columns); `None` is the schema's legacy plan
    /// ([`crate::features::InputPlan::legacy`]).
    pub plan: Option<std::sync::Arc<crate::features::InputPlan>>,
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
    /// line-aligned byte range (of `count` near-equal ranges), each Parquet file its `index`-th
    /// run of row groups; gzip files, which cannot be split, are assigned whole, round-robin by
    /// their position in the input list.
    pub part: Option<(usize, usize)>,
    /// The client that reads object URLs (`s3://`, `file://`) among the inputs; `None`: one
    /// is made from the `AWS_*` environment variables when an URL is met.
    pub objects: Option<crate::input::ObjectClientRef>,
    /// How much lower than the caller's the reader threads' scheduling priority is: a nice
    /// increment, 0..=19 (see [`crate::priority`]). 0: the same priority.
    pub nice: i32,
}

impl ReaderConfig {
    /// Defaults for `schema`: batches of 4096, 4 threads, queue of 10, 1% bad lines, 1 epoch.
    pub fn new(schema: Schema) -> Self {
        ReaderConfig {
            schema,
            plan: None,
            batch_size: 4096,
            threads: 4,
            queue_batches: 10,
            max_bad_line_ratio: 0.01,
            epochs: 1,
            max_rows: None,
            part: None,
            objects: None,
            nice: 0,
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
        if !(0..=19).contains(&self.nice) {
            return err("nice must be within 0..=19");
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
    running: Running,
    max_rows: Option<u64>,
    position: ReadPosition,
    done: bool,
}

impl BatchStream {
    /// Live counters of this reader (of what it read: not of the rows before its start).
    pub fn stats(&self) -> Arc<ReadStats> {
        Arc::clone(&self.running.shared.stats)
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
            self.done = true;
            self.running.shutdown();
            return None;
        }
        match self.running.next(None) {
            Next::Batch(b) => {
                self.position = ReadPosition {
                    epoch: b.file.epoch,
                    file_index: b.file.index,
                    byte_offset: b.offset,
                    rows: b.rows,
                };
                Some(Ok(PositionedBatch {
                    batch: b.batch,
                    position: self.position,
                }))
            }
            Next::Err(e) => {
                self.done = true;
                Some(Err(e))
            }
            Next::End | Next::Wait => {
                self.done = true;
                None
            }
        }
    }

    /// An iterator of the batches with their positions (see [`BatchStream::next_positioned`]).
    pub fn positioned(&mut self) -> Positioned<'_> {
        Positioned(self)
    }
}

impl Iterator for BatchStream {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_positioned().map(|r| r.map(|b| b.batch))
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

/// Starts reading `paths` (plain or gzip text, detected by magic bytes) in the background.
///
/// Fails up front for an invalid config, a missing path, a directory or an unreadable file;
/// empty files are fine. Files are read with `pread`, not mapped: a file that shrinks while
/// read stops the reader with [`DataError::Changed`] naming it. A pipe (FIFO) is read as a
/// stream, once: it needs `epochs = 1` and cannot be split into parts or resumed inside; the
/// reader waits for its writer like `cat` does.
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
/// offset past the end of a plain file, not at a line start, or inside a pipe
/// ([`DataError::BadStart`]). A gzip offset that is past the end of its text or not at a
/// line start gives the same error when the file is reached (the one start-offset rule of
/// [`crate::feed`]: such a file is not the one the position was taken from).
pub fn read_batches_at(
    paths: &[PathBuf],
    cfg: &ReaderConfig,
    start: ReadPosition,
) -> Result<BatchStream, DataError> {
    cfg.validate()?;
    let stats = Arc::new(ReadStats::default());
    let opener = Opener::new(Arc::clone(&stats), cfg.objects.as_ref());
    let inputs = opener.open_all(paths)?;
    check_start(&inputs, cfg, &start)?;
    let streams = inputs.iter().any(Input::is_stream);
    if streams && cfg.epochs > 1 {
        return Err(DataError::Config(format!(
            "a pipe is read once: epochs = {} needs regular files",
            cfg.epochs
        )));
    }
    let plain_bytes: u64 = inputs
        .iter()
        .map(|i| match i.kind {
            InputKind::Plain { len, .. } => len,
            _ => 0,
        })
        .sum();
    let chunk_bytes = (plain_bytes / (cfg.threads as u64 * 4)).clamp(64 << 10, 4 << 20) as usize;
    let (epochs, header, part) = (cfg.epochs as u64, cfg.schema.header, cfg.part);
    let engine_cfg = EngineConfig {
        parser: Arc::new(LineParser::for_plan(&cfg.schema, cfg.plan.as_deref())),
        threads: cfg.threads,
        queue_batches: cfg.queue_batches,
        max_bad_line_ratio: cfg.max_bad_line_ratio,
        batch_size: cfg.batch_size,
        rows_left: cfg.max_rows.map(|m| m.saturating_sub(start.rows)),
        start_rows: start.rows,
        flush_at_file_end: false,
        bad_files: BadFiles::Fail,
        detach_on_stop: streams,
        driver_name: "sparta-feed",
        nice: cfg.nice,
        stats,
    };
    let running = engine::start(engine_cfg, move |feeder, _wake| {
        for epoch in start.epoch..epochs {
            for (i, input) in inputs.iter().enumerate() {
                let offset = match (epoch == start.epoch, (i as u64).cmp(&start.file_index)) {
                    (true, std::cmp::Ordering::Less) => continue,
                    (true, std::cmp::Ordering::Equal) => start.byte_offset,
                    _ => 0,
                };
                let splittable = matches!(
                    input.kind,
                    InputKind::Plain { .. } | InputKind::Parquet { .. }
                );
                if !splittable && part.is_some_and(|(index, count)| i % count != index) {
                    // Whole files of other parts.
                    feeder.shared.stats.add_file();
                    continue;
                }
                let job = FileJob {
                    file: Arc::new(FileRef {
                        path: input.path.clone(),
                        name: Arc::from(""),
                        epoch,
                        index: i as u64,
                    }),
                    input,
                    offset,
                    header,
                    part: part.filter(|_| splittable),
                    chunk_bytes,
                };
                if !feeder.file(job) {
                    return;
                }
            }
        }
    })?;
    Ok(BatchStream {
        running,
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
    let bad_start = |why: String| {
        Err(DataError::BadStart {
            path: input.path.clone(),
            offset,
            why,
        })
    };
    match &input.kind {
        InputKind::Empty if offset > 0 => bad_start("the file is empty".into()),
        InputKind::Stream if offset > 0 => {
            bad_start("a pipe cannot be read again from the middle".into())
        }
        InputKind::Plain { source, len } => match check_ranged_start(&**source, *len, offset) {
            Ok(()) => Ok(()),
            Err(StartError::Bad(why)) => bad_start(why),
            Err(StartError::Io(source)) => Err(DataError::Io {
                path: input.path.clone(),
                source,
            }),
        },
        _ => Ok(()),
    }
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
