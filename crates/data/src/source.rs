//! Input files and the feeder that cuts them into line-aligned chunks for the parser
//! threads: plain files are memory-mapped and split into byte ranges; gzip files are
//! decompressed on the feeder thread and handed over in owned chunks.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use crossbeam_channel::{bounded, Sender};
use flate2::read::MultiGzDecoder;
use memchr::{memchr, memrchr};
use memmap2::Mmap;

use crate::assemble::{Pending, Work};
use crate::error::DataError;
use crate::parse::{BadLine, MAX_LINE_BYTES};
use crate::reader::{PositionedBatch, ReadPosition};
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
    pub fn fail(&self, out: &Sender<Result<PositionedBatch, DataError>>, err: DataError) {
        if !self.failed.swap(true, Relaxed) {
            let _ = out.send(Err(err));
        }
        self.stop();
    }

    /// Makes every thread stop at its next check.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }
}

/// What the feeder reads.
pub(crate) struct FeedPlan {
    pub epochs: u64,
    /// Skip the first line of a file started at offset 0.
    pub header: bool,
    pub part: Option<(usize, usize)>,
    /// Target size of a plain-file chunk.
    pub chunk_bytes: usize,
    /// Where to begin (epoch, file, byte offset).
    pub start: ReadPosition,
}

/// Hands chunks to the parsers, queueing each chunk's reply slot in input order first.
pub(crate) struct Feed<'a> {
    shared: &'a Shared,
    ordered: &'a Sender<Pending>,
    work: &'a Sender<Work>,
    epoch: u64,
}

impl Feed<'_> {
    /// Sends `chunk`, whose first byte is at `base` of its file. False if it must stop.
    fn send(&self, chunk: Chunk, base: u64) -> bool {
        if self.shared.stopped() {
            return false;
        }
        let (reply, rx) = bounded(1);
        let pending = Pending::Block {
            epoch: self.epoch,
            file: chunk.file as u64,
            reply: rx,
        };
        self.ordered.send(pending).is_ok() && self.work.send(Work { chunk, base, reply }).is_ok()
    }
}

/// Feeder thread body: the epochs over all inputs, in order, from `plan.start`. Returns when
/// done, when stopped, or when the parsers or the assembler are gone. Errors go in order
/// through `ordered`.
pub(crate) fn feed(
    shared: &Shared,
    plan: &FeedPlan,
    ordered: &Sender<Pending>,
    work: &Sender<Work>,
) {
    let start = &plan.start;
    for epoch in start.epoch..plan.epochs {
        let feed = Feed {
            shared,
            ordered,
            work,
            epoch,
        };
        for (i, input) in shared.inputs.iter().enumerate() {
            let offset = match (epoch == start.epoch, (i as u64).cmp(&start.file_index)) {
                (true, std::cmp::Ordering::Less) => continue,
                (true, std::cmp::Ordering::Equal) => start.byte_offset,
                _ => 0,
            };
            if shared.stopped() {
                return;
            }
            let ok = match &input.kind {
                InputKind::Empty => true,
                InputKind::Plain(map) => feed_mapped(&feed, i, map, plan, offset as usize),
                InputKind::Gzip if plan.part.is_some_and(|(index, count)| i % count != index) => {
                    true
                }
                InputKind::Gzip => match feed_gzip(&feed, i, plan.header, offset) {
                    Ok(ok) => ok,
                    Err(e) => {
                        let _ = ordered.send(Pending::Err(e));
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

/// Splits a mapped file (or its part) into line-aligned ranges, from `offset` (a line start)
/// on. Returns false if it must stop.
fn feed_mapped(feed: &Feed, file: usize, map: &Arc<Mmap>, plan: &FeedPlan, offset: usize) -> bool {
    let mut len = map.len();
    let mut start = 0;
    if plan.header {
        start = memchr(b'\n', map).map_or(len, |p| p + 1);
    }
    if let Some((index, count)) = plan.part {
        (start, len) = part_range(map, start, index, count);
    }
    start = start.max(offset);
    while start < len {
        let mut end = (start + plan.chunk_bytes).min(len);
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
        if !feed.send(chunk, start as u64) {
            return false;
        }
        start = end;
    }
    true
}

/// Decompresses a gzip file and sends line-aligned chunks, from decompressed byte `offset`
/// (a line start) on; the bytes before it are decompressed and discarded. `Ok(false)` if it
/// must stop.
fn feed_gzip(feed: &Feed, file: usize, header: bool, offset: u64) -> Result<bool, DataError> {
    let shared = feed.shared;
    let path = &shared.inputs[file].path;
    let f = File::open(path).map_err(|source| DataError::Io {
        path: path.clone(),
        source,
    })?;
    let mut dec = MultiGzDecoder::new(io::BufReader::with_capacity(GZ_BLOCK, f));
    let bad_start = |why: String| {
        DataError::Config(format!(
            "start position: offset {offset} of {}: {why}",
            path.display()
        ))
    };
    // Lines completely handed over (or skipped) so far.
    let mut lines_done: u64 = 0;
    // Offset in the decompressed text of `pending[0]`.
    let mut consumed: u64 = 0;
    let mut pending: Vec<u8> = Vec::with_capacity(GZ_CHUNK + GZ_BLOCK);
    // Discarding up to the next '\n' (header, or the rest of an overlong line).
    let mut skipping = header && offset == 0;
    // The start offset was reached right after a byte other than '\n': an error unless the
    // text ends there.
    let mut mid_line = false;
    let send = |data: Vec<u8>, first_line: u64, base: u64| {
        let chunk = Chunk {
            file,
            data: ChunkData::Owned(data),
            first_line: Some(first_line),
        };
        feed.send(chunk, base)
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
        if consumed < offset {
            // Still before the start: discard (counting lines for reports).
            let cut = (offset - consumed).min(pending.len() as u64) as usize;
            lines_done += memchr::memchr_iter(b'\n', &pending[..cut]).count() as u64;
            if cut > 0 && consumed + cut as u64 == offset {
                mid_line = pending[cut - 1] != b'\n';
            }
            pending.drain(..cut);
            consumed += cut as u64;
            if consumed < offset {
                if n == 0 {
                    return Err(bad_start(format!(
                        "past the end of the decompressed text ({consumed} bytes)"
                    )));
                }
                continue;
            }
        }
        if mid_line && !pending.is_empty() {
            return Err(bad_start("not at a line start".into()));
        }
        if n == 0 {
            if !skipping && !pending.is_empty() {
                return Ok(send(pending, lines_done + 1, consumed));
            }
            return Ok(true);
        }
        if skipping {
            match memchr(b'\n', &pending) {
                Some(p) => {
                    pending.drain(..=p);
                    consumed += p as u64 + 1;
                    lines_done += 1;
                    skipping = false;
                }
                None => {
                    consumed += pending.len() as u64;
                    pending.clear();
                    continue;
                }
            }
        }
        let tail = memrchr(b'\n', &pending).map_or(0, |p| p + 1);
        if tail >= GZ_CHUNK || (pending.len() - tail > MAX_LINE_BYTES && tail > 0) {
            // Only the complete lines go out; the unfinished last line stays pending.
            let rest = pending[tail..].to_vec();
            let mut head = std::mem::replace(&mut pending, rest);
            head.truncate(tail);
            let count = memchr::memchr_iter(b'\n', &head).count() as u64;
            let head_len = head.len() as u64;
            if !send(head, lines_done + 1, consumed) {
                return Ok(false);
            }
            consumed += head_len;
            lines_done += count;
        }
        if pending.len() > MAX_LINE_BYTES {
            // `pending` is now one unfinished line that is already too long.
            let len = pending.len() as u64;
            let reason = BadLine::TooLong { len: pending.len() };
            shared
                .stats
                .report_bad(path, || lines_done + 1, &reason, &pending);
            let lines = Pending::Lines {
                seen: 1,
                bad: 1,
                bytes: len,
            };
            if feed.ordered.send(lines).is_err() {
                return Ok(false);
            }
            consumed += len;
            pending.clear();
            skipping = true;
        }
    }
}
