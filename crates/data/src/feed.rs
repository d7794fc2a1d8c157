//! The feeder: cuts one input file after another into line-aligned chunks for the parser
//! threads, queueing each chunk's reply slot in input order for the assembler.
//!
//! Every source is cut by the same code ([`Feeder::cut`]): a ranged source (plain file) is
//! read from its start byte through `pread`, a stream (gzip, pipe) is read front to back. The
//! rules live here once:
//!
//! * **Start offsets.** A file started at byte `offset > 0` continues with the line starting
//!   there. An offset that does not fit the file's text (past its end, not right after a
//!   `\n`, in an empty file, or inside a pipe, which cannot be re-read) means the file is not
//!   the one the position was taken from: it is a *bad file* ([`DataError::BadStart`]).
//! * **Headers.** The first line is skipped only when a file is started at byte 0.
//! * **Overlong lines** (over [`MAX_LINE_BYTES`]) are counted as bad lines and skipped
//!   without being held in memory.
//! * **Bad files** (a corrupt or truncated gzip stream, a file that shrinks while read, a
//!   start offset that does not fit): under [`BadFiles::Fail`] (file lists) the reader stops
//!   with the error; under [`BadFiles::Skip`] (followed directories) the rows before the fault
//!   are kept, the file is skipped with the error logged and counted
//!   ([`crate::ReadStats::bad_files`]), and reading goes on with the next file.

use std::io::{self, Read};
use std::sync::Arc;

use crossbeam_channel::{unbounded, Receiver, Sender};
use memchr::{memchr, memrchr};

use crate::error::DataError;
use crate::input::{line_start_at, read_full_at, Input, InputKind, RangeRead, RangeReader, Shrunk};
#[cfg(feature = "parquet")]
use crate::parse::LineParser;
use crate::parse::{BadLine, MAX_LINE_BYTES};
use crate::queue::{Chunk, FileRef, Item, Origin, Pending, Shared, Work};

/// Target size of a chunk cut from a stream.
pub(crate) const STREAM_CHUNK: usize = 1 << 20;

/// What happens to a bad file (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadFiles {
    /// Stop reading with the error.
    Fail,
    /// Log, count and skip the file.
    Skip,
}

/// One file to read.
pub(crate) struct FileJob<'a> {
    pub file: Arc<FileRef>,
    pub input: &'a Input,
    /// Byte of the text to start at (a line start).
    pub offset: u64,
    /// Skip the first line when started at byte 0.
    pub header: bool,
    /// `Some((index, count))`: only that line-aligned part of a ranged file, or that share of
    /// the blocks of a text that cannot be cut up front (see [`SHARE_BLOCK`]).
    pub part: Option<(usize, usize)>,
    /// Target chunk size for a ranged file.
    pub chunk_bytes: usize,
}

/// Hands chunks to the parsers (see the module docs).
pub(crate) struct Feeder {
    pub shared: Arc<Shared>,
    pub ordered: Sender<Pending>,
    pub work: Sender<Work>,
    /// Text buffers of parsed chunks, for reuse.
    pub spare_text: Receiver<Vec<u8>>,
    pub bad_files: BadFiles,
    /// The parsers' parser (a Parquet file is projected onto the columns it reads).
    #[cfg(feature = "parquet")]
    pub parser: Arc<LineParser>,
}

/// Why cutting a file stopped early.
enum Stop {
    /// The reader is stopping (or a queue is gone).
    Halt,
    /// The file is bad.
    Bad(DataError),
}

impl Feeder {
    /// Reads one file to its end. False if the feeder must stop.
    pub fn file(&self, job: FileJob<'_>) -> bool {
        if self.shared.stopped() {
            return false;
        }
        match self.read(&job) {
            Ok(()) => {
                self.shared.stats.add_file();
                self.ordered.send(Pending::FileEnd).is_ok()
            }
            Err(Stop::Halt) => false,
            Err(Stop::Bad(error)) => match self.bad_files {
                BadFiles::Fail => {
                    let _ = self.ordered.send(Pending::Err(error));
                    false
                }
                BadFiles::Skip => self.ordered.send(Pending::Skipped { error }).is_ok(),
            },
        }
    }

    fn read(&self, job: &FileJob<'_>) -> Result<(), Stop> {
        let path = &job.input.path;
        let io_err = |source| {
            Stop::Bad(DataError::Io {
                path: path.clone(),
                source,
            })
        };
        let offset = job.offset;
        match &job.input.kind {
            InputKind::Empty if offset > 0 => Err(bad_start(job, "the file is empty".into())),
            InputKind::Empty => Ok(()),
            InputKind::Plain { source, len } => {
                check_ranged_start(&**source, *len, offset).map_err(|e| match e {
                    StartError::Io(e) => io_err(e),
                    StartError::Bad(why) => bad_start(job, why),
                })?;
                let len = *len;
                let mut start = 0;
                let mut end = len;
                if job.header {
                    start = line_start_at(&**source, 1, len).map_err(io_err)?;
                }
                if let Some((index, count)) = job.part {
                    let span = end - start;
                    let at = |j: usize| {
                        let pos = start + (span as u128 * j as u128 / count as u128) as u64;
                        line_start_at(&**source, pos, len)
                    };
                    (start, end) = (at(index).map_err(io_err)?, at(index + 1).map_err(io_err)?);
                }
                start = start.max(offset);
                if start >= end {
                    return Ok(());
                }
                let text = RangeReader::new(Arc::clone(source), start, end, len);
                let plan = Cut {
                    base: start,
                    skip_to: start,
                    header: false,
                    chunk: job.chunk_bytes,
                    block: job.chunk_bytes.min(STREAM_CHUNK),
                    gzip: false,
                    share: None,
                };
                self.cut(job, text, plan, Some(Arc::clone(source)))
            }
            InputKind::Parquet { source, len } => self.parquet(job, source, *len),
            InputKind::Gzip { .. } | InputKind::Stream => {
                if job.input.is_stream() && offset > 0 {
                    return Err(bad_start(
                        job,
                        "a pipe cannot be read again from the middle".into(),
                    ));
                }
                let text = match job.input.text_stream() {
                    Ok(Some(t)) => t,
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(io_err(e)),
                };
                let plan = Cut {
                    base: 0,
                    skip_to: offset,
                    header: job.header && offset == 0,
                    chunk: STREAM_CHUNK,
                    block: crate::input::STREAM_BLOCK,
                    gzip: matches!(job.input.kind, InputKind::Gzip { .. }),
                    share: job.part,
                };
                self.cut(job, text, plan, None)
            }
        }
    }

    /// Sends a chunk built by a source of its own (Kafka records). False if it must stop.
    #[cfg(feature = "kafka")]
    pub(crate) fn send_chunk(&self, chunk: Chunk) -> bool {
        self.send(chunk).is_ok()
    }

    /// Hands out the row ranges of a Parquet file (see [`crate::parquet`]): its footer is read
    /// here, the rows are decoded by the parsers. `job.offset` is a row number.
    #[cfg(feature = "parquet")]
    fn parquet(
        &self,
        job: &FileJob<'_>,
        source: &Arc<dyn RangeRead>,
        len: u64,
    ) -> Result<(), Stop> {
        use crate::parquet::{ParquetFile, RowRange};
        let path = &job.input.path;
        let file =
            ParquetFile::open(path, Arc::clone(source), len, &self.parser).map_err(Stop::Bad)?;
        let ranges = file
            .ranges(job.offset, job.part)
            .map_err(|why| bad_start(job, why.to_string()))?;
        // The footer's bytes count as read (no lines).
        let footer = Pending::Lines {
            seen: 0,
            bad: 0,
            bytes: file.footer_bytes,
        };
        if self.ordered.send(footer).is_err() {
            return Err(Stop::Halt);
        }
        let file = Arc::new(file);
        for (group, skip, take, first_row) in ranges {
            let range = RowRange {
                file: Arc::clone(&file),
                group,
                skip,
                take,
                first_row,
            };
            self.send_item(&job.file, Item::Rows(range))?;
        }
        Ok(())
    }

    #[cfg(not(feature = "parquet"))]
    fn parquet(&self, job: &FileJob<'_>, _: &Arc<dyn RangeRead>, _: u64) -> Result<(), Stop> {
        Err(Stop::Bad(DataError::Parquet {
            path: job.input.path.clone(),
            detail: "this build reads no Parquet (sparta-data feature `parquet`)".into(),
        }))
    }

    /// Sends a chunk. `Err(Halt)` if it must stop.
    fn send(&self, chunk: Chunk) -> Result<(), Stop> {
        let file = Arc::clone(&chunk.file);
        self.send_item(&file, Item::Text(chunk))
    }

    /// Queues `item` of `file` for a parser and its reply slot for the assembler. `Err(Halt)`
    /// if it must stop.
    fn send_item(&self, file: &Arc<FileRef>, item: Item) -> Result<(), Stop> {
        if self.shared.stopped() {
            return Err(Stop::Halt);
        }
        // Unbounded: a parser hands on the pieces of a Parquet range as it decodes them,
        // while the assembler may still wait on earlier items (text: one block).
        let (reply, rx) = unbounded();
        let pending = Pending::Block {
            file: Arc::clone(file),
            reply: rx,
        };
        if self.ordered.send(pending).is_ok() && self.work.send(Work { item, reply }).is_ok() {
            Ok(())
        } else {
            Err(Stop::Halt)
        }
    }

    /// Sends `data[..len]` (text from offset `base`, `lines_before` lines before it) as one
    /// chunk, or only this reader's pieces of it when the plan shares the text.
    fn send_owned(
        &self,
        plan: &Cut,
        data: Vec<u8>,
        len: usize,
        lines_before: u64,
        base: u64,
        chunk: &dyn Fn(Vec<u8>, usize, u64, u64) -> Chunk,
    ) -> Result<(), Stop> {
        let Some(share) = plan.share.filter(|&(_, count)| count > 1) else {
            return self.send(chunk(data, len, lines_before, base));
        };
        let mut lines = lines_before;
        let mut at = 0;
        for (start, end) in owned_pieces(&data, len, base, share) {
            lines += memchr::memchr_iter(b'\n', &data[at..start]).count() as u64;
            let mut piece = self.buffer(end - start);
            piece[..end - start].copy_from_slice(&data[start..end]);
            self.send(chunk(piece, end - start, lines, base + start as u64))?;
            lines += memchr::memchr_iter(b'\n', &data[start..end]).count() as u64;
            at = end;
        }
        Ok(())
    }

    /// A buffer for chunk text: one the parsers handed back, or a new one.
    pub(crate) fn buffer(&self, size: usize) -> Vec<u8> {
        match self.spare_text.try_recv() {
            Ok(mut buf) => {
                // Recycled buffers are reused as they are (their bytes are initialized).
                if buf.len() < size {
                    buf.resize(size, 0);
                }
                buf
            }
            // Zeroed by the allocator (fresh pages for large buffers, no memset).
            Err(_) => vec![0u8; size],
        }
    }

    /// Cuts `text` (starting at byte `plan.base` of the file's text) into line-aligned
    /// chunks, from `plan.skip_to` on; the bytes before it are read and discarded. Each round
    /// reads a block ([`Feeder::read_block`]), discards what is before the start
    /// ([`CutState::reach_start`]) or in a skipped line ([`CutState::skip_line`]), and hands
    /// out the complete lines ([`Feeder::hand_out`]); the end hands out the rest.
    fn cut(
        &self,
        job: &FileJob<'_>,
        mut text: impl Read,
        plan: Cut,
        ranged: Option<Arc<dyn RangeRead>>,
    ) -> Result<(), Stop> {
        // Line numbers: counted here for streams; for a ranged source they are counted from
        // the file on demand (only reports need them), which saves a pass over the text.
        let mut st = CutState {
            buf: self.buffer(plan.chunk + plan.block),
            fill: 0,
            consumed: plan.base,
            lines_done: 0,
            skipping: plan.header,
            mid_line: false,
            count_lines: ranged.is_none(),
            overlong: None,
        };
        let chunk = chunk_maker(&job.file, ranged);
        loop {
            if self.shared.stopped() {
                return Err(Stop::Halt);
            }
            let n = match self.read_block(job, &mut text, &plan, &mut st, &chunk) {
                Ok(n) => n,
                Err(e) => {
                    self.end_overlong(job, &mut st)?;
                    return Err(e);
                }
            };
            if !st.reach_start(job, plan.skip_to, n)? {
                continue;
            }
            if st.mid_line && st.fill > 0 {
                return Err(bad_start(job, "not at a line start".into()));
            }
            if n == 0 {
                // An overlong last line without a `\n` ends here.
                if let Some(o) = st.overlong.as_mut() {
                    o.len += st.fill as u64;
                    st.fill = 0;
                }
                self.end_overlong(job, &mut st)?;
                if !st.skipping && st.fill > 0 {
                    let (fill, lines, at) = (st.fill, st.lines_done, st.consumed);
                    self.send_owned(&plan, st.buf, fill, lines, at, &chunk)?;
                }
                return Ok(());
            }
            if st.skipping {
                if !st.skip_line() {
                    continue;
                }
                self.end_overlong(job, &mut st)?;
            }
            self.hand_out(&plan, &mut st, &chunk)?;
        }
    }

    /// Reads the next block of text after `st.buf[..st.fill]`; its length, 0 at the end. A
    /// read error hands out the complete lines before it (they are good), then stops with
    /// the bad file.
    fn read_block(
        &self,
        job: &FileJob<'_>,
        text: &mut impl Read,
        plan: &Cut,
        st: &mut CutState,
        chunk: &MakeChunk<'_>,
    ) -> Result<usize, Stop> {
        if st.buf.len() < st.fill + plan.block {
            st.buf.resize(st.fill + plan.block, 0);
        }
        loop {
            match text.read(&mut st.buf[st.fill..st.fill + plan.block]) {
                Ok(n) => {
                    st.fill += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    let fill = st.fill;
                    let line = st.lines_done
                        + 1
                        + memchr::memchr_iter(b'\n', &st.buf[..fill]).count() as u64;
                    let tail = memrchr(b'\n', &st.buf[..fill]).map_or(0, |p| p + 1);
                    if tail > 0 && !st.skipping && st.consumed >= plan.skip_to {
                        let buf = std::mem::take(&mut st.buf);
                        self.send_owned(plan, buf, tail, st.lines_done, st.consumed, chunk)?;
                    }
                    return Err(Stop::Bad(read_error(
                        &job.input.path,
                        line,
                        plan.gzip,
                        source,
                    )));
                }
            }
        }
    }

    /// Hands out the complete lines of `st.buf[..st.fill]` once there are a chunk's worth (or
    /// the unfinished last line is already overlong: then that line is skipped, see
    /// [`Feeder::skip_overlong`]).
    fn hand_out(&self, plan: &Cut, st: &mut CutState, chunk: &MakeChunk<'_>) -> Result<(), Stop> {
        let tail = memrchr(b'\n', &st.buf[..st.fill]).map_or(0, |p| p + 1);
        let overlong = st.fill - tail > MAX_LINE_BYTES;
        if tail >= plan.chunk || (overlong && tail > 0) {
            // Only the complete lines go out; the unfinished last line stays pending.
            let mut next = self.buffer(plan.chunk + plan.block);
            let rest = st.fill - tail;
            if next.len() < rest {
                next.resize(rest, 0);
            }
            next[..rest].copy_from_slice(&st.buf[tail..st.fill]);
            let head = std::mem::replace(&mut st.buf, next);
            let count = if st.count_lines {
                memchr::memchr_iter(b'\n', &head[..tail]).count() as u64
            } else {
                0
            };
            self.send_owned(plan, head, tail, st.lines_done, st.consumed, chunk)?;
            st.consumed += tail as u64;
            st.lines_done += count;
            st.fill = rest;
        }
        if overlong {
            self.skip_overlong(st, chunk);
        }
        Ok(())
    }

    /// `st.buf[..st.fill]` is one unfinished line that is already too long: its start is kept
    /// for the report, the rest of it is skipped (not held in memory); it is reported and
    /// counted as one bad line with its real length once its end is reached
    /// ([`Feeder::end_overlong`]).
    fn skip_overlong(&self, st: &mut CutState, chunk: &MakeChunk<'_>) {
        let fill = st.fill;
        st.overlong = Some(Overlong {
            at: chunk(Vec::new(), 0, st.lines_done, st.consumed),
            head: st.buf[..fill.min(OVERLONG_HEAD)].to_vec(),
            len: fill as u64,
            newline: false,
        });
        st.consumed += fill as u64;
        st.fill = 0;
        st.skipping = true;
    }

    /// The overlong line being skipped has ended (at its `\n`, the end of the text or a read
    /// error): reported with its length and counted as a bad line.
    fn end_overlong(&self, job: &FileJob<'_>, st: &mut CutState) -> Result<(), Stop> {
        let Some(o) = st.overlong.take() else {
            return Ok(());
        };
        let reason = BadLine::TooLong {
            len: usize::try_from(o.len).unwrap_or(usize::MAX),
        };
        self.shared
            .stats
            .report_bad(&job.input.path, || o.at.line_no(0), &reason, &o.head);
        let lines = Pending::Lines {
            seen: 1,
            bad: 1,
            bytes: o.len + u64::from(o.newline),
        };
        if self.ordered.send(lines).is_err() {
            return Err(Stop::Halt);
        }
        Ok(())
    }
}

/// The bytes of an overlong line kept for its report.
const OVERLONG_HEAD: usize = 200;

/// An overlong line being skipped.
struct Overlong {
    /// Where it starts (an empty chunk: its line number is counted only for a report).
    at: Chunk,
    /// Its first bytes (for the report).
    head: Vec<u8>,
    /// Its length so far (bytes, without the `\n`).
    len: u64,
    /// It ended at a `\n` (not at the end of the text).
    newline: bool,
}

/// Makes a chunk of a text: `(data, len, lines_before, base)` (see [`chunk_maker`]).
type MakeChunk<'a> = dyn Fn(Vec<u8>, usize, u64, u64) -> Chunk + 'a;

/// The chunks of `file`: a ranged source's name their offset (line numbers are counted from
/// the file when a report needs them), a stream's carry the lines before them.
fn chunk_maker(
    file: &Arc<FileRef>,
    ranged: Option<Arc<dyn RangeRead>>,
) -> impl Fn(Vec<u8>, usize, u64, u64) -> Chunk + '_ {
    let start = Arc::new(Origin::Start);
    move |data: Vec<u8>, len: usize, lines_before: u64, base: u64| Chunk {
        file: Arc::clone(file),
        data,
        len,
        base,
        lines_before: if ranged.is_some() { 0 } else { lines_before },
        origin: match &ranged {
            Some(source) => Arc::new(Origin::Seek {
                source: Arc::clone(source),
                offset: base,
            }),
            None => Arc::clone(&start),
        },
    }
}

/// Where [`Feeder::cut`] stands in one text.
struct CutState {
    /// `buf[..fill]` is text not handed out yet.
    buf: Vec<u8>,
    fill: usize,
    /// Offset in the text of `buf[0]`.
    consumed: u64,
    /// Lines completely handed over (or skipped) since the origin.
    lines_done: u64,
    /// Discarding up to the next '\n' (header, or the rest of an overlong line).
    skipping: bool,
    /// The start offset was reached right after a byte other than '\n'.
    mid_line: bool,
    /// Lines are counted here (a stream), not from the file on demand (a ranged source).
    count_lines: bool,
    /// The overlong line being skipped (reported at its end).
    overlong: Option<Overlong>,
}

impl CutState {
    /// Before the start offset `skip_to`: discards what was read up to it (counting its lines
    /// for reports). `Ok(false)` while it is not reached yet (read on); a text that ends
    /// before it (`n == 0`: the last read was the end) is a bad start.
    fn reach_start(&mut self, job: &FileJob<'_>, skip_to: u64, n: usize) -> Result<bool, Stop> {
        if self.consumed >= skip_to {
            return Ok(true);
        }
        let cut = (skip_to - self.consumed).min(self.fill as u64) as usize;
        self.lines_done += memchr::memchr_iter(b'\n', &self.buf[..cut]).count() as u64;
        if cut > 0 && self.consumed + cut as u64 == skip_to {
            self.mid_line = self.buf[cut - 1] != b'\n';
        }
        self.buf.copy_within(cut..self.fill, 0);
        self.fill -= cut;
        self.consumed += cut as u64;
        if self.consumed < skip_to {
            if n == 0 {
                return Err(bad_start(
                    job,
                    format!("past the end of the text ({} bytes)", self.consumed),
                ));
            }
            return Ok(false);
        }
        Ok(true)
    }

    /// While skipping: drops the text up to and including the next '\n'. False when none was
    /// read yet (all of it dropped, still skipping).
    fn skip_line(&mut self) -> bool {
        match memchr(b'\n', &self.buf[..self.fill]) {
            Some(p) => {
                if let Some(o) = self.overlong.as_mut() {
                    o.len += p as u64;
                    o.newline = true;
                }
                self.buf.copy_within(p + 1..self.fill, 0);
                self.fill -= p + 1;
                self.consumed += p as u64 + 1;
                self.lines_done += 1;
                self.skipping = false;
                true
            }
            None => {
                if let Some(o) = self.overlong.as_mut() {
                    o.len += self.fill as u64;
                }
                self.consumed += self.fill as u64;
                self.fill = 0;
                false
            }
        }
    }
}

/// How [`Feeder::cut`] reads one text.
struct Cut {
    /// Offset in the text of the first byte read.
    base: u64,
    /// Offset to start handing out lines (a line start).
    skip_to: u64,
    /// Skip the first line.
    header: bool,
    /// Target chunk size.
    chunk: usize,
    /// Read size.
    block: usize,
    /// Read errors are gzip stream errors.
    gzip: bool,
    /// `Some((index, count))`: hand out only this reader's share of a text that cannot be cut
    /// into ranges up front (see [`SHARE_BLOCK`]).
    share: Option<(usize, usize)>,
}

/// A text read by several workers that cannot be cut into byte ranges up front (gzip, a
/// stream) is shared by blocks of its (decompressed) bytes: the line starting at offset `o`
/// belongs to worker `(o / SHARE_BLOCK) % count`. Each worker reads the whole text and keeps
/// its lines; the rule depends only on offsets, so a worker resumed at any of its positions
/// goes on with exactly its lines.
pub(crate) const SHARE_BLOCK: u64 = 64 << 10;

/// The pieces of `data[..len]` (lines from text offset `base`, starting at a line start) that
/// belong to share `index` of `count`: `(start, end)` in `data`, each a run of whole lines.
fn owned_pieces(
    data: &[u8],
    len: usize,
    base: u64,
    (index, count): (usize, usize),
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < len {
        let o = base + pos as u64;
        let block = o / SHARE_BLOCK;
        // The first line start at or after the next block boundary ends this piece.
        let boundary = ((block + 1) * SHARE_BLOCK - base) as usize;
        let end = if boundary >= len {
            len
        } else {
            match memchr(b'\n', &data[boundary - 1..len]) {
                Some(p) => boundary + p,
                None => len,
            }
        };
        if (block % count as u64) as usize == index {
            out.push((pos, end));
        }
        pos = end;
    }
    out
}

fn bad_start(job: &FileJob<'_>, why: String) -> Stop {
    Stop::Bad(DataError::BadStart {
        path: job.input.path.clone(),
        offset: job.offset,
        why,
    })
}

/// The error for a failed read at 1-based `line`.
fn read_error(path: &std::path::Path, line: u64, gzip: bool, source: io::Error) -> DataError {
    if let Some(s) = source.get_ref().and_then(|e| e.downcast_ref::<Shrunk>()) {
        return DataError::Changed {
            path: path.to_path_buf(),
            detail: s.to_string(),
        };
    }
    if gzip {
        DataError::Gzip {
            path: path.to_path_buf(),
            line,
            source,
        }
    } else {
        DataError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Why a start offset does not fit a ranged file.
pub(crate) enum StartError {
    Io(io::Error),
    Bad(String),
}

/// The start-offset rule for a ranged file of `len` bytes (see the module docs).
pub(crate) fn check_ranged_start(
    source: &dyn RangeRead,
    len: u64,
    offset: u64,
) -> Result<(), StartError> {
    if offset == 0 {
        return Ok(());
    }
    if offset > len {
        return Err(StartError::Bad(format!(
            "past the end of the text ({len} bytes)"
        )));
    }
    let mut before = [0u8; 1];
    let n = read_full_at(source, &mut before, offset - 1).map_err(StartError::Io)?;
    if n == 1 && before[0] != b'\n' && offset < len {
        return Err(StartError::Bad("not at a line start".into()));
    }
    Ok(())
}

#[cfg(test)]
mod share_tests {
    use super::*;

    #[test]
    fn owned_pieces_split_at_the_first_line_start_of_each_block_and_cover_the_text() {
        // Lines of 100 bytes: block boundaries fall inside lines.
        let line = format!("{}\n", "x".repeat(99));
        let text = line.repeat(3000);
        for base in [0u64, 100, 65_500] {
            let len = text.len();
            let mut seen = vec![0u8; len];
            for index in 0..3 {
                for (a, b) in owned_pieces(text.as_bytes(), len, base, (index, 3)) {
                    assert!(a == 0 || text.as_bytes()[a - 1] == b'\n');
                    assert!(text.as_bytes()[b - 1] == b'\n');
                    let o = base + a as u64;
                    assert_eq!(((o / SHARE_BLOCK) % 3) as usize, index);
                    for s in &mut seen[a..b] {
                        *s += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&s| s == 1),
                "every byte in exactly one share"
            );
        }
    }
}
