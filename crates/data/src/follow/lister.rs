//! The follower's lister thread: lists the directory, decides which files are complete and
//! cuts them into batch-sized, line-aligned pieces for the parser threads.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use flate2::read::MultiGzDecoder;
use memchr::memchr;
use memmap2::Mmap;

use super::{Pending, Work};
use crate::error::DataError;
use crate::parse::MAX_LINE_BYTES;
use crate::source::{Chunk, ChunkData, Input, InputKind, GZ_BLOCK};
use crate::stats::ReadStats;

/// Largest piece handed to a parser thread (keeps a batch's id offsets far from `u32::MAX`).
const MAX_CHUNK_BYTES: usize = 256 << 20;

/// The thread that lists the directory and cuts complete files into batch-sized pieces.
pub(super) struct Lister {
    pub(super) dir: PathBuf,
    pub(super) stop_file: Option<PathBuf>,
    pub(super) settle: Duration,
    pub(super) poll: Duration,
    pub(super) batch_size: usize,
    pub(super) header: bool,
    /// The last file started (empty: none yet).
    pub(super) last: String,
    /// `Some(offset)`: `last` is not finished; continue it at `offset`.
    pub(super) resume_offset: Option<u64>,
    /// (size, mtime) of waiting files and since when they were seen unchanged.
    pub(super) observed: HashMap<String, (u64, Option<SystemTime>, Instant)>,
    /// Names sorting before `last` already seen (warned about when they arrive late).
    pub(super) late: HashSet<String>,
    /// Whether the directory was listed before.
    pub(super) listed_once: bool,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) halt: Arc<AtomicBool>,
    pub(super) stats: Arc<ReadStats>,
    pub(super) ordered: Sender<Pending>,
    pub(super) work: Sender<Work>,
    pub(super) wake: Receiver<()>,
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
    pub(super) fn run(&mut self) -> Result<(), DataError> {
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
