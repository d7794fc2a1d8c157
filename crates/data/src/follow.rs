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
//!   when it appears is skipped with a warning (late arrival).
//! * Every file is a standalone input: plain or gzip (detected by content), with its own header
//!   line when the schema has one.
//!
//! # Batches and positions
//!
//! A batch never spans two files: each file is cut into pieces of `batch_size` lines (the last
//! piece of a file may be shorter; malformed lines make a batch shorter), so every batch comes
//! with the exact [`FollowPosition`] after it: the file name and the byte offset of the next
//! unread line (of the decompressed text for gzip files). Starting a follower at a saved
//! position continues with exactly the next unread line: nothing is skipped or read twice.
//!
//! # Stopping
//!
//! * the stop flag ([`FollowConfig::stop`], set e.g. by a SIGINT/SIGTERM handler): the iterator
//!   ends before its next batch; the position is that of the last batch returned;
//! * the stop file: when it appears, the files present are read to their ends, then the
//!   iterator ends;
//! * otherwise it follows forever.
//!
//! Parsing runs on `threads` parser threads (the same [`LineParser`] and bad-line accounting as
//! [`crate::read_batches`]); batches are returned in input order.

mod lister;

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use crate::batch::{Batch, BatchBuilder};
use crate::error::DataError;
use crate::parse::LineParser;
use crate::reader::{account_lines, parse_chunk, too_many_bad, ReaderConfig};
use crate::source::Chunk;
use crate::stats::ReadStats;
use lister::Lister;

/// How often the consumer re-checks the stop flag while it waits for input.
const STOP_CHECK: Duration = Duration::from_millis(50);

/// Where a follower stands: the next unread line is at `offset` of `file`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FollowPosition {
    /// File name (inside the followed directory) of the last batch; empty before the first.
    pub file: String,
    /// Byte offset of the next unread line of `file` (decompressed bytes for gzip).
    pub offset: u64,
    /// Rows delivered since the start of the stream (including before a restart).
    pub rows: u64,
}

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

/// One piece of work in input order: its parse result arrives on `result`.
enum Pending {
    Batch {
        result: Receiver<Result<Batch, DataError>>,
        file: Arc<str>,
        offset: u64,
    },
    Err(DataError),
}

struct Work {
    chunk: Chunk,
    path: Arc<PathBuf>,
    reply: Sender<Result<Batch, DataError>>,
}

/// Iterator over the batches of a followed directory (see the module docs).
///
/// Yields `Ok(batch)` until stopped; after an `Err` it yields `None`. Dropping it stops and
/// joins its threads.
pub struct Follower {
    ordered: Option<Receiver<Pending>>,
    stats: Arc<ReadStats>,
    stop: Arc<AtomicBool>,
    /// Stops this follower's own threads (set on drop / error).
    halt: Arc<AtomicBool>,
    /// Dropped to wake the lister from its poll sleep.
    wake: Option<Sender<()>>,
    handles: Vec<JoinHandle<()>>,
    position: FollowPosition,
    max_bad_line_ratio: f64,
    done: bool,
}

impl Follower {
    /// Live counters (rows, lines, bad lines, bytes, files read).
    pub fn stats(&self) -> Arc<ReadStats> {
        Arc::clone(&self.stats)
    }

    /// The position after the last batch returned (the start position before the first).
    pub fn position(&self) -> &FollowPosition {
        &self.position
    }

    fn shutdown(&mut self) -> Option<DataError> {
        self.done = true;
        self.halt.store(true, Relaxed);
        self.ordered = None;
        self.wake = None;
        let mut panicked = None;
        for h in self.handles.drain(..) {
            if h.join().is_err() {
                panicked = Some(DataError::Internal("a follower thread panicked".into()));
            }
        }
        panicked
    }

    fn fail(&mut self, e: DataError) -> Option<Result<FollowBatch, DataError>> {
        self.shutdown();
        Some(Err(e))
    }
}

impl Iterator for Follower {
    type Item = Result<FollowBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            if self.stop.load(Relaxed) {
                tracing::info!("follow: stop requested");
                self.shutdown();
                return None;
            }
            let msg = self.ordered.as_ref()?.recv_timeout(STOP_CHECK);
            match msg {
                Ok(Pending::Batch {
                    result,
                    file,
                    offset,
                }) => {
                    let batch = match result.recv() {
                        Ok(Ok(b)) => b,
                        Ok(Err(e)) => return self.fail(e),
                        Err(_) => {
                            return self.fail(DataError::Internal(
                                "a parser thread stopped unexpectedly".into(),
                            ))
                        }
                    };
                    self.position.file.clear();
                    self.position.file.push_str(&file);
                    self.position.offset = offset;
                    self.position.rows += batch.rows as u64;
                    if batch.rows == 0 {
                        continue;
                    }
                    self.stats.add_rows(batch.rows as u64);
                    return Some(Ok(FollowBatch {
                        batch,
                        position: self.position.clone(),
                    }));
                }
                Ok(Pending::Err(e)) => return self.fail(e),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    // The lister finished (stop file): final bad-line check.
                    if let Some(e) = self.shutdown() {
                        return Some(Err(e));
                    }
                    let st = &self.stats;
                    return too_many_bad(
                        st.bad_lines(),
                        st.lines_seen(),
                        self.max_bad_line_ratio,
                        st,
                    )
                    .map(Err);
                }
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts following `cfg.dir` with the schema, batch size, parser threads, queue depth and
/// bad-line ratio of `reader` (its epochs, `max_rows` and `part` do not apply).
///
/// Fails up front for an invalid config or a missing directory.
pub fn follow(cfg: FollowConfig, reader: &ReaderConfig) -> Result<Follower, DataError> {
    reader.validate()?;
    match std::fs::metadata(&cfg.dir) {
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
    let stats = Arc::new(ReadStats::default());
    let halt = Arc::new(AtomicBool::new(false));
    let parser = Arc::new(LineParser::new(&reader.schema));
    let (ordered_tx, ordered_rx) = bounded::<Pending>(reader.queue_batches);
    let (work_tx, work_rx) = bounded::<Work>(reader.threads * 2);
    let (wake_tx, wake_rx) = bounded::<()>(0);
    let mut handles = Vec::with_capacity(reader.threads + 1);
    for t in 0..reader.threads {
        let (stats, parser, work_rx, halt) = (
            Arc::clone(&stats),
            Arc::clone(&parser),
            work_rx.clone(),
            Arc::clone(&halt),
        );
        let (batch_size, max) = (reader.batch_size, reader.max_bad_line_ratio);
        handles.push(spawn(format!("sparta-fparse-{t}"), move || {
            let mut builder =
                BatchBuilder::new(parser.num_fields(), parser.num_dense(), batch_size);
            for w in work_rx {
                if halt.load(Relaxed) {
                    return;
                }
                let (seen, bad) =
                    parse_chunk(&parser, &stats, &w.path, &w.chunk, &mut builder, |_, _| {
                        true
                    })
                    .unwrap_or_default();
                let batch = builder.take();
                let r = match account_lines(&stats, seen, bad, w.chunk.bytes().len() as u64, max) {
                    Some(e) => Err(e),
                    None => Ok(batch),
                };
                let _ = w.reply.send(r);
            }
        })?);
    }
    drop(work_rx);
    let mut lister = Lister {
        dir: cfg.dir.clone(),
        stop_file: cfg.stop_file.clone(),
        settle: cfg.settle,
        poll: cfg.poll,
        batch_size: reader.batch_size,
        header: reader.schema.header,
        last: cfg.start.file.clone(),
        resume_offset: (!cfg.start.file.is_empty()).then_some(cfg.start.offset),
        observed: HashMap::new(),
        late: HashSet::new(),
        listed_once: false,
        stop: Arc::clone(&cfg.stop),
        halt: Arc::clone(&halt),
        stats: Arc::clone(&stats),
        ordered: ordered_tx,
        work: work_tx,
        wake: wake_rx,
    };
    handles.push(spawn("sparta-follow".into(), move || {
        if let Err(e) = lister.run() {
            let _ = lister.ordered.send(Pending::Err(e));
        }
    })?);
    Ok(Follower {
        ordered: Some(ordered_rx),
        stats,
        stop: cfg.stop,
        halt,
        wake: Some(wake_tx),
        handles,
        position: cfg.start,
        max_bad_line_ratio: reader.max_bad_line_ratio,
        done: false,
    })
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, DataError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(|e| DataError::Internal(format!("cannot start follower thread: {e}")))
}
