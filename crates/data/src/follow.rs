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

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use flate2::read::MultiGzDecoder;
use memchr::memchr;
use memmap2::Mmap;

use crate::batch::{Batch, BatchBuilder};
use crate::error::DataError;
use crate::parse::{LineParser, MAX_LINE_BYTES};
use crate::reader::{account_lines, parse_chunk, too_many_bad, ReaderConfig};
use crate::source::{Chunk, ChunkData, Input, InputKind, GZ_BLOCK};
use crate::stats::ReadStats;

/// Largest piece handed to a parser thread (keeps a batch's id offsets far from `u32::MAX`).
const MAX_CHUNK_BYTES: usize = 256 << 20;

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
                    parse_chunk(&parser, &stats, &w.path, &w.chunk, &mut builder, |_| true)
                        .unwrap_or_default();
                let batch = builder.take();
                let r = match account_lines(&stats, seen, bad, w.chunk.bytes().len(), max) {
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

/// The thread that lists the directory and cuts complete files into batch-sized pieces.
struct Lister {
    dir: PathBuf,
    stop_file: Option<PathBuf>,
    settle: Duration,
    poll: Duration,
    batch_size: usize,
    header: bool,
    /// The last file started (empty: none yet).
    last: String,
    /// `Some(offset)`: `last` is not finished; continue it at `offset`.
    resume_offset: Option<u64>,
    /// (size, mtime) of waiting files and since when they were seen unchanged.
    observed: HashMap<String, (u64, Option<SystemTime>, Instant)>,
    /// Names sorting before `last` already seen (warned about when they arrive late).
    late: HashSet<String>,
    /// Whether the directory was listed before.
    listed_once: bool,
    stop: Arc<AtomicBool>,
    halt: Arc<AtomicBool>,
    stats: Arc<ReadStats>,
    ordered: Sender<Pending>,
    work: Sender<Work>,
    wake: Receiver<()>,
}

/// An eligible file of the directory.
struct Listed {
    name: String,
    len: u64,
    modified: Option<SystemTime>,
}

impl Lister {
    fn stopped(&self) -> bool {
        self.halt.load(Relaxed) || self.stop.load(Relaxed)
    }

    /// Lists, reads complete files, sleeps; returns when stopped or after the stop file.
    fn run(&mut self) -> Result<(), DataError> {
        loop {
            if self.stopped() {
                return Ok(());
            }
            // Look for the stop file before listing: every file written before it is listed.
            let stopping = self.stop_file.as_ref().is_some_and(|p| p.exists());
            let files = self.list()?;
            let pending: Vec<&Listed> = files
                .iter()
                .filter(|f| {
                    f.name > self.last || (f.name == self.last && self.resume_offset.is_some())
                })
                .collect();
            for f in files.iter().filter(|f| f.name < self.last) {
                if self.late.insert(f.name.clone()) && self.listed_once {
                    tracing::warn!(
                        "follow: {} sorts before {} (already read past): skipped",
                        f.name,
                        self.last
                    );
                }
            }
            let mut to_read = Vec::new();
            for (i, f) in pending.iter().enumerate() {
                if stopping || i + 1 < pending.len() || self.settled(f) {
                    to_read.push(f.name.clone());
                } else {
                    break;
                }
            }
            for name in to_read {
                let offset = if name == self.last {
                    self.resume_offset.unwrap_or(0)
                } else {
                    0
                };
                self.last = name.clone();
                self.resume_offset = Some(offset);
                if !self.read_file(&name, offset)? {
                    return Ok(());
                }
                self.resume_offset = None;
                self.observed.remove(&name);
                self.stats.add_file();
            }
            // Names before the start position present at the first listing are old files.
            self.listed_once = true;
            if stopping {
                tracing::info!("follow: stop file found; all files read");
                return Ok(());
            }
            match self.wake.recv_timeout(self.poll) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return Ok(()),
            }
        }
    }

    /// The eligible files of the directory, sorted by name.
    fn list(&self) -> Result<Vec<Listed>, DataError> {
        let io_err = |source| DataError::Io {
            path: self.dir.clone(),
            source,
        };
        let stop_name = self
            .stop_file
            .as_ref()
            .filter(|p| p.parent().is_some_and(|d| same_dir(d, &self.dir)))
            .and_then(|p| p.file_name())
            .map(|n| n.to_os_string());
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let Ok(name) = entry.file_name().into_string() else {
                tracing::warn!("follow: skipping non-UTF-8 name {:?}", entry.file_name());
                continue;
            };
            if name.starts_with('.')
                || name.ends_with(".tmp")
                || stop_name.as_deref() == Some(std::ffi::OsStr::new(&name))
            {
                continue;
            }
            // Follow symlinks: a shipper may link files in.
            let meta = match std::fs::metadata(entry.path()) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(DataError::Io {
                        path: entry.path(),
                        source,
                    })
                }
            };
            if !meta.is_file() {
                continue;
            }
            out.push(Listed {
                name,
                len: meta.len(),
                modified: meta.modified().ok(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Whether the newest file has stopped changing for `settle`.
    fn settled(&mut self, f: &Listed) -> bool {
        if self.settle.is_zero() {
            return true;
        }
        let old = f
            .modified
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .is_some_and(|age| age >= self.settle);
        let now = Instant::now();
        let entry = self
            .observed
            .entry(f.name.clone())
            .or_insert((f.len, f.modified, now));
        if (entry.0, entry.1) != (f.len, f.modified) {
            *entry = (f.len, f.modified, now);
        }
        old || now.duration_since(entry.2) >= self.settle
    }

    /// Cuts one file from `offset` into pieces. `Ok(false)` if it must stop.
    fn read_file(&mut self, name: &str, offset: u64) -> Result<bool, DataError> {
        let path = self.dir.join(name);
        let input = match Input::open(&path) {
            Ok(i) => i,
            Err(DataError::NotFound { .. }) => {
                tracing::warn!("follow: {} disappeared before it was read", path.display());
                return Ok(true);
            }
            Err(e) => return Err(e),
        };
        tracing::info!("follow: reading {name} from byte {offset}");
        let file: Arc<str> = Arc::from(name);
        let path = Arc::new(path);
        match &input.kind {
            InputKind::Empty => Ok(true),
            InputKind::Plain(map) => Ok(self.cut_mapped(&file, &path, map, offset)),
            InputKind::Gzip => self.cut_gzip(&file, &path, offset),
        }
    }

    /// Hands a piece to the parsers and queues its result slot in input order.
    fn send(&self, file: &Arc<str>, path: &Arc<PathBuf>, chunk: Chunk, end: u64) -> bool {
        if self.stopped() {
            return false;
        }
        let (reply, result) = bounded(1);
        let pending = Pending::Batch {
            result,
            file: Arc::clone(file),
            offset: end,
        };
        self.ordered.send(pending).is_ok()
            && self
                .work
                .send(Work {
                    chunk,
                    path: Arc::clone(path),
                    reply,
                })
                .is_ok()
    }

    fn cut_mapped(
        &self,
        file: &Arc<str>,
        path: &Arc<PathBuf>,
        map: &Arc<Mmap>,
        offset: u64,
    ) -> bool {
        let len = map.len();
        let mut start = offset as usize;
        if start > len {
            tracing::warn!(
                "follow: {} is shorter ({len} bytes) than the saved position {offset}: skipped",
                path.display()
            );
            return true;
        }
        if start == 0 && self.header {
            start = memchr(b'\n', map).map_or(len, |p| p + 1);
        }
        while start < len {
            let mut end = start;
            let mut lines = 0;
            while lines < self.batch_size && end < len && end - start < MAX_CHUNK_BYTES {
                let next = memchr(b'\n', &map[end..]).map_or(len, |p| end + p + 1);
                if !is_blank(&map[end..next]) {
                    lines += 1;
                }
                end = next;
            }
            let chunk = Chunk {
                file: 0,
                data: ChunkData::Mapped {
                    map: Arc::clone(map),
                    start,
                    end,
                },
                first_line: (start == 0).then_some(1),
            };
            if !self.send(file, path, chunk, end as u64) {
                return false;
            }
            start = end;
        }
        true
    }

    fn cut_gzip(
        &self,
        file: &Arc<str>,
        path: &Arc<PathBuf>,
        offset: u64,
    ) -> Result<bool, DataError> {
        let f = File::open(&**path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let dec = MultiGzDecoder::new(BufReader::with_capacity(GZ_BLOCK, f));
        let mut r = BufReader::with_capacity(GZ_BLOCK, dec);
        let mut line_no = 1u64;
        let gz_err = |line: u64, source: io::Error| DataError::Gzip {
            path: path.to_path_buf(),
            line,
            source,
        };
        let mut pos = 0u64;
        if offset > 0 {
            // Skip what was read before, counting lines for error reports.
            let mut skip = (&mut r).take(offset);
            let mut buf = vec![0u8; GZ_BLOCK];
            loop {
                let n = match skip.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(gz_err(line_no, e)),
                };
                line_no += memchr::memchr_iter(b'\n', &buf[..n]).count() as u64;
                pos += n as u64;
            }
            if pos < offset {
                tracing::warn!(
                    "follow: {} is shorter ({pos} bytes) than the saved position {offset}: skipped",
                    path.display()
                );
                return Ok(true);
            }
        } else if self.header {
            let mut head = Vec::new();
            let n = read_line_capped(&mut r, &mut head).map_err(|e| gz_err(1, e))?;
            pos += n as u64;
            line_no += 1;
        }
        loop {
            let mut buf = Vec::new();
            let first_line = line_no;
            let mut lines = 0;
            while lines < self.batch_size && buf.len() < MAX_CHUNK_BYTES {
                let at = buf.len();
                let n = read_line_capped(&mut r, &mut buf).map_err(|e| gz_err(line_no, e))?;
                if n == 0 {
                    break;
                }
                pos += n as u64;
                line_no += 1;
                if !is_blank(&buf[at..]) {
                    lines += 1;
                }
            }
            if buf.is_empty() {
                return Ok(true);
            }
            let chunk = Chunk {
                file: 0,
                data: ChunkData::Owned(buf),
                first_line: Some(first_line),
            };
            if !self.send(file, path, chunk, pos) {
                return Ok(false);
            }
        }
    }
}

/// An empty line or a lone `\r` (with or without its `\n`): skipped, not a row.
fn is_blank(line: &[u8]) -> bool {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.is_empty() || line == b"\r"
}

/// Appends one line (with its `\n`, if any) to `buf`, keeping at most `MAX_LINE_BYTES + 1`
/// bytes of it (a longer line is then rejected by the parser as too long). Returns the bytes
/// consumed from `r` (0 at the end).
fn read_line_capped(r: &mut impl BufRead, buf: &mut Vec<u8>) -> io::Result<usize> {
    let start = buf.len();
    let mut consumed = 0;
    loop {
        let avail = match r.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(consumed);
        }
        let (take, done) = match memchr(b'\n', avail) {
            Some(p) => (p + 1, true),
            None => (avail.len(), false),
        };
        let room = (MAX_LINE_BYTES + 1).saturating_sub(buf.len() - start);
        let keep = take.min(room);
        buf.extend_from_slice(&avail[..keep]);
        r.consume(take);
        consumed += take;
        if done {
            if keep < take {
                buf.push(b'\n');
            }
            return Ok(consumed);
        }
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
