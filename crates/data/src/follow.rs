//! Following a directory: batches from files as a log shipper writes them, in name order,
//! with the exact input position after every batch.
//!
//! # Which files are read, and when
//!
//! * Regular files of the directory only; names starting with `.` and names ending in `.tmp`
//!   are ignored (the shipper convention: write `.name` or `name.tmp`, then rename), and so is
//!   the stop file when it lies in the directory.
//! * Files are read in byte order of their names (hourly/minutely names such as
//!   `2024-05-01T13.tsv` sort by time). A file is read once it is *complete*:
//!   - a file with a later name exists (the shipper moved on), or
//!   - its size and modification time have not changed for `settle` (or it was last modified
//!     more than `settle` ago), or
//!   - the stop file exists (the shipper is done: every file present is complete).
//! * A complete file is read once, to its end (a last line without `\n` included); bytes
//!   appended to it later are not read. A file whose name sorts before the file being read
//!   when it appears is skipped with a warning, once, and counted
//!   ([`crate::ReadStats::late_files_skipped`]): a late arrival.
//! * A bad file (a corrupt or truncated gzip file, a file that shrinks while it is read, or a
//!   saved offset that does not fit the file) does not stop the follower: the rows before the
//!   fault are delivered, the error is logged and counted ([`crate::ReadStats::bad_files`]),
//!   and reading goes on with the next file. The positions after the fault name the bad file
//!   (or an earlier one), so a restart from them meets the same fault, skips the file again
//!   and continues: a bad file never stops online training for good.
//! * Every file is a standalone input: plain or gzip (detected by content), with its own header
//!   line when the schema has one, or Parquet (read once it is settled *and* its footer is
//!   written; its positions count rows, see [`crate::parquet`]). A Parquet file whose footer
//!   or pages do not decode is a bad file.
//!
//! # Batches and positions
//!
//! A batch never spans two files: each file's rows are cut into batches of `batch_size` rows
//! (the last batch of a file may be shorter), so every batch comes
//! with the exact [`FollowPosition`] after it: the file name and the byte offset of the next
//! unread line (of the decompressed text for gzip files). Starting a follower at a saved
//! position continues with exactly the next unread line: nothing is skipped or read twice.
//!
//! # Deleted and renamed files
//!
//! A followed file is known by its identity as well as its name: device, inode, size and
//! modification time (a rename keeps them). Positions carry the identities of the last
//! [`RECENT_FILES`] files read ([`FollowPosition::recent`]), so nothing is lost or read twice
//! without a word:
//!
//! * a file already read that shows up under a later name (renamed after it was read, while
//!   following or while the job was down) is skipped with a warning and counted with the late
//!   files ([`crate::ReadStats::late_files_skipped`]), not read twice;
//! * resuming when the file of the position was renamed meanwhile continues the rest of it
//!   under its new name (the position keeps naming it by its first name);
//! * resuming when that file is gone: an error-level log naming it and the byte offset where
//!   its unread rest began, and it is counted as a bad file ([`crate::ReadStats::bad_files`]);
//!   a file gone before it was read is logged and counted the same way. (When the position
//!   was at the very end of the file nothing was lost; the log says so.)
//! * a symlink in the directory to a file outside it is skipped with a warning: following a
//!   directory reads only what lies inside it.
//!
//! # Stopping
//!
//! * the stop flag ([`FollowConfig::stop`], set e.g. by a SIGINT/SIGTERM handler): the iterator
//!   ends before its next batch; the position is that of the last batch returned;
//! * the stop file: when it appears, the files present are read to their ends, then the
//!   iterator ends;
//! * otherwise it follows forever.
//!
//! # Several workers
//!
//! With [`FollowConfig::part`] `= (index, count)`, worker `index` of `count` reads its share of
//! every file, by the same rule on every worker, so each row is read by exactly one of them:
//! * a plain file is cut into `count` line-aligned byte ranges of equal size (as the file
//!   readers cut a file for `part`), and the worker reads range `index`;
//! * a gzip file cannot be cut up front: every worker decompresses it and keeps the lines
//!   starting in its blocks of the text (the line at decompressed offset `o` belongs to worker
//!   `(o / 64 KiB) % count`), so every worker gets about its share of every file.
//!
//! Every worker decides that a file is complete by the same rules above, so a file is read by
//! all its workers or by none; a file must not grow after it is complete (the ranges would
//! differ between workers). Positions are per worker: each worker's (file, offset) lies inside
//! its own range.
//!
//! The files run through the same engine as [`crate::read_batches`] (one feeder, `threads`
//! parser threads, the in-order assembler); the directory is only its source of files.

mod lister;

use std::io;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::batch::Batch;
use crate::engine::{self, EngineConfig, Online, Polled};
use crate::error::DataError;
use crate::feed::BadFiles;
use crate::input::{is_url, Opener};
use crate::parse::LineParser;
use crate::queue::Pending;
use crate::reader::ReaderConfig;
use crate::stats::ReadStats;
use lister::Lister;

/// Where a follower stands: the next unread line is at `offset` of `file`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FollowPosition {
    /// File name (inside the followed directory) of the last batch; empty before the first.
    pub file: String,
    /// Byte offset of the next unread line of `file` (decompressed bytes for gzip; for a
    /// Parquet file, the number of its rows before the next one).
    pub offset: u64,
    /// Rows delivered since the start of the stream (including before a restart).
    pub rows: u64,
    /// The identities of the last files read up to `file` (at most [`RECENT_FILES`], `file`
    /// last), each as `dev:inode:size:mtime name`: a follower started here tells a file that
    /// was deleted or renamed meanwhile (see the module docs, "Deleted and renamed files").
    /// Empty for an object-store prefix and in positions saved before identities existed.
    pub recent: Arc<Vec<String>>,
}

/// How many file identities a position keeps ([`FollowPosition::recent`]).
pub const RECENT_FILES: usize = 64;

/// How to follow a directory.
#[derive(Clone, Debug)]
pub struct FollowConfig {
    /// The directory the shipper writes into.
    pub dir: PathBuf,
    /// Pause between directory listings when no complete file is waiting.
    pub poll: Duration,
    /// A file is complete once unchanged for this long (or once a later file exists).
    pub settle: Duration,
    /// When this file exists, the files present are read and the stream ends.
    pub stop_file: Option<PathBuf>,
    /// When set, the stream ends before its next batch (set it from a signal handler).
    pub stop: Arc<AtomicBool>,
    /// Where to start (a position returned with an earlier batch; default: the first file).
    pub start: FollowPosition,
    /// `Some((index, count))`: read only this worker's share of every file (see the module
    /// docs, "Several workers").
    pub part: Option<(usize, usize)>,
    /// While no complete file is waiting, yield an empty batch (0 rows, the position of the
    /// last batch) this often, so the consumer can do timed work (exports) while idle.
    pub idle_tick: Option<Duration>,
}

impl FollowConfig {
    /// Follows `dir` from its first file: polls every second, settle 10 s, no stop file.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FollowConfig {
            dir: dir.into(),
            poll: Duration::from_secs(1),
            settle: Duration::from_secs(10),
            stop_file: None,
            stop: Arc::new(AtomicBool::new(false)),
            start: FollowPosition::default(),
            part: None,
            idle_tick: None,
        }
    }
}

/// A batch and the position after it.
#[derive(Clone, Debug)]
pub struct FollowBatch {
    /// The rows (never empty; from one file).
    pub batch: Batch,
    /// The position after this batch: resume here to continue with the next one.
    pub position: FollowPosition,
}

/// Iterator over the batches of a followed directory (see the module docs).
///
/// Yields `Ok(batch)` until stopped; after an `Err` it yields `None`. Dropping it stops and
/// joins its threads.
pub struct Follower {
    online: Online,
    position: FollowPosition,
    /// The identities of the files the lister started, in order (see [`FollowPosition::recent`]).
    started: Arc<Mutex<Vec<String>>>,
}

impl Follower {
    /// Live counters (rows, lines, bad lines, bytes, files read, bad and late files skipped).
    pub fn stats(&self) -> Arc<ReadStats> {
        Arc::clone(&self.online.running.shared.stats)
    }

    /// The position after the last batch returned (the start position before the first).
    pub fn position(&self) -> &FollowPosition {
        &self.position
    }
}

impl Iterator for Follower {
    type Item = Result<FollowBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.online.poll("follow") {
                Polled::Batch(b) => {
                    if self.position.file != *b.file.name {
                        self.position.recent = recent_up_to(&self.started, &b.file.name);
                    }
                    self.position.file.clear();
                    self.position.file.push_str(&b.file.name);
                    self.position.offset = b.offset;
                    self.position.rows = b.rows;
                    return Some(Ok(FollowBatch {
                        batch: b.batch,
                        position: self.position.clone(),
                    }));
                }
                Polled::Idle => {
                    return Some(Ok(FollowBatch {
                        batch: Batch::default(),
                        position: self.position.clone(),
                    }))
                }
                Polled::Waiting => {}
                Polled::End(e) => return e.map(Err),
            }
        }
    }
}

/// The identities the lister started up to (and including) the file `name`, the last
/// [`RECENT_FILES`] of them: files the lister started after it are not read yet for the
/// consumer of the position.
fn recent_up_to(started: &Mutex<Vec<String>>, name: &str) -> Arc<Vec<String>> {
    let started = started.lock().unwrap_or_else(|e| e.into_inner());
    let Some(end) = started
        .iter()
        .rposition(|e| e.split_once(' ').is_some_and(|(_, n)| n == name))
    else {
        return Arc::default();
    };
    let from = (end + 1).saturating_sub(RECENT_FILES);
    Arc::new(started[from..=end].to_vec())
}

/// Starts following `cfg.dir` with the schema, batch size, parser threads, queue depth and
/// bad-line ratio of `reader` (its epochs, `max_rows` and `part` do not apply).
///
/// Fails up front for an invalid config or a missing directory.
pub fn follow(cfg: FollowConfig, reader: &ReaderConfig) -> Result<Follower, DataError> {
    reader.validate()?;
    let stats = Arc::new(ReadStats::default());
    let opener = Opener::new(Arc::clone(&stats), reader.objects.as_ref());
    match std::fs::metadata(&cfg.dir) {
        _ if is_url(&cfg.dir) => {}
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(DataError::Config(format!(
                "follow: {} is not a directory",
                cfg.dir.display()
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(DataError::NotFound { path: cfg.dir })
        }
        Err(source) => {
            return Err(DataError::Io {
                path: cfg.dir,
                source,
            })
        }
    }
    if cfg.poll.is_zero() {
        return Err(DataError::Config(
            "follow: poll interval must be positive".into(),
        ));
    }
    if let Some((index, count)) = cfg.part {
        if index >= count {
            return Err(DataError::Config(format!(
                "follow: part {index} of {count}: the index must be below the count"
            )));
        }
    }
    let started = Arc::new(Mutex::new(cfg.start.recent.to_vec()));
    let mut lister = Lister::new(&cfg, reader.schema.header, opener, Arc::clone(&started));
    let engine_cfg = EngineConfig {
        parser: Arc::new(LineParser::for_plan(&reader.schema, reader.plan.as_deref())),
        threads: reader.threads,
        queue_batches: reader.queue_batches,
        max_bad_line_ratio: reader.max_bad_line_ratio,
        batch_size: reader.batch_size,
        rows_left: None,
        start_rows: cfg.start.rows,
        flush_at_file_end: true,
        bad_files: BadFiles::Skip,
        detach_on_stop: false,
        driver_name: "sparta-follow",
        nice: reader.nice,
        stats,
    };
    let running = engine::start(engine_cfg, move |feeder, wake| {
        if let Err(e) = lister.run(&feeder, &wake) {
            let _ = feeder.ordered.send(Pending::Err(e));
        }
    })?;
    Ok(Follower {
        online: Online::new(running, cfg.stop, cfg.idle_tick),
        position: cfg.start,
        started,
    })
}
