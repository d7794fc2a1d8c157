//! Input files and the feeder that cuts them into line-aligned chunks for the parser
//! threads: plain files are memory-mapped and split into byte ranges; gzip files are
//! decompressed on the feeder thread and handed over in owned chunks.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use crossbeam_channel::Sender;
use flate2::read::MultiGzDecoder;
use memchr::{memchr, memrchr};
use memmap2::Mmap;

use crate::batch::Batch;
use crate::error::DataError;
use crate::parse::{BadLine, MAX_LINE_BYTES};
use crate::stats::ReadStats;

/// Target size of a decompressed gzip chunk.
const GZ_CHUNK: usize = 1 << 20;
/// Read size from the gzip decoder.
pub(crate) const GZ_BLOCK: usize = 256 << 10;

/// An opened input file.
#[derive(Debug)]
pub(crate) struct Input {
    pub path: PathBuf,
    pub kind: InputKind,
}

/// What an opened input holds.
#[derive(Debug)]
pub(crate) enum InputKind {
    /// No bytes.
    Empty,
    /// A memory-mapped plain text file.
    Plain(Arc<Mmap>),
    /// A gzip file (decompressed as a stream when read).
    Gzip,
}

impl Input {
    /// Opens (and for plain files maps) `path`; detects gzip by its magic bytes.
    pub fn open(path: &Path) -> Result<Input, DataError> {
        let io_err = |source| DataError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(DataError::NotFound {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(io_err(e)),
        };
        if meta.is_dir() {
            return Err(DataError::IsDirectory {
                path: path.to_path_buf(),
            });
        }
        let mut file = File::open(path).map_err(io_err)?;
        let mut magic = [0u8; 2];
        let n = read_up_to(&mut file, &mut magic).map_err(io_err)?;
        let kind = if n == 0 {
            InputKind::Empty
        } else if n == 2 && magic == [0x1f, 0x8b] {
            InputKind::Gzip
        } else {
            // SAFETY: the file is opened read-only and only read through the map. Another
            // process truncating or rewriting the file while it is read is outside this
            // crate's control (as with any mmap reader) and is documented on `read_batches`.
            let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
            if map.is_empty() {
                InputKind::Empty
            } else {
                InputKind::Plain(Arc::new(map))
            }
        };
        Ok(Input {
            path: path.to_path_buf(),
            kind,
        })
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Bytes of a chunk: a range of a mapped file, or decompressed text.
pub(crate) enum ChunkData {
    Mapped {
        map: Arc<Mmap>,
        start: usize,
        end: usize,
    },
    Owned(Vec<u8>),
}

/// Line-aligned piece of one input file, the unit of work of a parser thread.
pub(crate) struct Chunk {
    /// Index into the input list.
    pub file: usize,
    pub data: ChunkData,
    /// 1-based line number of the first line if known (gzip); computed lazily for maps.
    pub first_line: Option<u64>,
}

impl Chunk {
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            ChunkData::Mapped { map, start, end } => &map[*start..*end],
            ChunkData::Owned(v) => v,
        }
    }

    /// 1-based line number of the `index`-th line of this chunk. For mapped files this
    /// counts newlines from the start of the file, so call it only for reports.
    pub fn line_no(&self, index: u64) -> u64 {
        match (&self.data, self.first_line) {
            (_, Some(first)) => first + index,
            (ChunkData::Mapped { map, start, .. }, None) => {
                1 + memchr::memchr_iter(b'\n', &map[..*start]).count() as u64 + index
            }
            (ChunkData::Owned(_), None) => 1 + index,
        }
    }
}

/// State shared by the feeder, the parser threads and the consumer.
pub(crate) struct Shared {
    pub stats: Arc<ReadStats>,
    /// Set to make every thread stop at its next check.
    pub stop: AtomicBool,
    /// Set by the first thread that sends an error.
    pub failed: AtomicBool,
    pub inputs: Vec<Input>,
}

impl Shared {
    /// Sends `err` unless another thread already failed, and stops everybody.
    pub fn fail(&self, out: &Sender<Result<Batch, DataError>>, err: DataError) {
        if !self.failed.swap(true, Relaxed) {
            let _ = out.send(Err(err));
        }
        self.stop.store(true, Relaxed);
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }
}

/// Feeder thread body: all epochs over all inputs, in order. Returns when done, when
/// stopped, or when the parsers are gone.
pub(crate) fn feed(
    shared: &Shared,
    epochs: usize,
    header: bool,
    part: Option<(usize, usize)>,
    chunk_bytes: usize,
    work: &Sender<Chunk>,
    out: &Sender<Result<Batch, DataError>>,
) {
    for _ in 0..epochs {
        for (i, input) in shared.inputs.iter().enumerate() {
            if shared.stopped() {
                return;
            }
            let ok = match &input.kind {
                InputKind::Empty => true,
                InputKind::Plain(map) => {
                    feed_mapped(shared, i, map, header, part, chunk_bytes, work)
                }
                InputKind::Gzip if part.is_some_and(|(index, count)| i % count != index) => true,
                InputKind::Gzip => match feed_gzip(shared, i, header, work) {
                    Ok(ok) => ok,
                    Err(e) => {
                        shared.fail(out, e);
                        false
                    }
                },
            };
            if !ok {
                return;
            }
            shared.stats.add_file();
        }
    }
}

/// The first line start at or after `pos` (`len` if none): a part boundary.
fn line_start_at(map: &[u8], pos: usize) -> usize {
    if pos == 0 || pos >= map.len() || map[pos - 1] == b'\n' {
        return pos.min(map.len());
    }
    memchr(b'\n', &map[pos..]).map_or(map.len(), |p| pos + p + 1)
}

/// The byte range of part `index` of `count` of a body `[body, len)`: near-equal ranges whose
/// ends are moved to line starts, so the parts cover every line exactly once.
pub(crate) fn part_range(map: &[u8], body: usize, index: usize, count: usize) -> (usize, usize) {
    let span = map.len() - body;
    let at = |j: usize| {
        line_start_at(
            map,
            body + (span as u128 * j as u128 / count as u128) as usize,
        )
    };
    (at(index), at(index + 1))
}

/// Splits a mapped file (or its part) into line-aligned ranges. Returns false if it must stop.
fn feed_mapped(
    shared: &Shared,
    file: usize,
    map: &Arc<Mmap>,
    header: bool,
    part: Option<(usize, usize)>,
    chunk_bytes: usize,
    work: &Sender<Chunk>,
) -> bool {
    let mut len = map.len();
    let mut start = 0;
    if header {
        start = memchr(b'\n', map).map_or(len, |p| p + 1);
    }
    if let Some((index, count)) = part {
        (start, len) = part_range(map, start, index, count);
    }
    while start < len {
        if shared.stopped() {
            return false;
        }
        let mut end = (start + chunk_bytes).min(len);
        if end < len {
            end = memchr(b'\n', &map[end - 1..]).map_or(len, |p| end + p);
        }
        let chunk = Chunk {
            file,
            data: ChunkData::Mapped {
                map: Arc::clone(map),
                start,
                end,
            },
            first_line: if start == 0 { Some(1) } else { None },
        };
        if work.send(chunk).is_err() {
            return false;
        }
        start = end;
    }
    true
}

/// Decompresses a gzip file and sends line-aligned chunks. `Ok(false)` if it must stop.
fn feed_gzip(
    shared: &Shared,
    file: usize,
    header: bool,
    work: &Sender<Chunk>,
) -> Result<bool, DataError> {
    let path = &shared.inputs[file].path;
    let f = File::open(path).map_err(|source| DataError::Io {
        path: path.clone(),
        source,
    })?;
    let mut dec = MultiGzDecoder::new(io::BufReader::with_capacity(GZ_BLOCK, f));
    // Lines completely handed over (or skipped) so far.
    let mut lines_done: u64 = 0;
    let mut pending: Vec<u8> = Vec::with_capacity(GZ_CHUNK + GZ_BLOCK);
    // Discarding up to the next '\n' (header, or the rest of an overlong line).
    let mut skipping = header;
    let send = |data: Vec<u8>, first_line: u64| {
        work.send(Chunk {
            file,
            data: ChunkData::Owned(data),
            first_line: Some(first_line),
        })
        .is_ok()
    };
    loop {
        if shared.stopped() {
            return Ok(false);
        }
        let old = pending.len();
        pending.resize(old + GZ_BLOCK, 0);
        let n = loop {
            match dec.read(&mut pending[old..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    let line =
                        lines_done + 1 + memchr::memchr_iter(b'\n', &pending[..old]).count() as u64;
                    return Err(DataError::Gzip {
                        path: path.clone(),
                        line,
                        source,
                    });
                }
            }
        };
        pending.truncate(old + n);
        if n == 0 {
            if !skipping && !pending.is_empty() {
                return Ok(send(pending, lines_done + 1));
            }
            return Ok(true);
        }
        if skipping {
            match memchr(b'\n', &pending) {
                Some(p) => {
                    pending.drain(..=p);
                    lines_done += 1;
                    skipping = false;
                }
                None => {
                    pending.clear();
                    continue;
                }
            }
        }
        let tail = memrchr(b'\n', &pending).map_or(0, |p| p + 1);
        if tail >= GZ_CHUNK || (pending.len() - tail > MAX_LINE_BYTES && tail > 0) {
            let rest = pending[tail..].to_vec();
            let head = std::mem::replace(&mut pending, rest);
            let count = memchr::memchr_iter(b'\n', &head).count() as u64;
            if !send(head, lines_done + 1) {
                return Ok(false);
            }
            lines_done += count;
        }
        if pending.len() > MAX_LINE_BYTES {
            // `pending` is now one unfinished line that is already too long.
            let reason = BadLine::TooLong { len: pending.len() };
            shared
                .stats
                .report_bad(path, || lines_done + 1, &reason, &pending);
            shared.stats.add_lines(1, 1, pending.len() as u64);
            pending.clear();
            skipping = true;
        }
    }
}
