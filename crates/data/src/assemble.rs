//! The ordered half of the engine: parser threads turn whole chunks into row [`Block`]s, and
//! the assembler thread takes them back in input order and cuts them into batches of exactly
//! `batch_size` rows, each with the position (file, byte offset, rows) after its last row.
//!
//! Order is kept without sequence numbers: for every chunk the feeder queues a one-shot reply
//! receiver on the bounded `ordered` channel (in input order) before it hands the chunk to the
//! parsers, and the assembler waits on the replies in that order. The `ordered` capacity bounds
//! the chunks between the feeder and the assembler, so a slow parser stalls the feeder instead
//! of growing a reorder buffer.
//!
//! The bad-line rule lives here once: blank lines are skipped, malformed lines are counted
//! and reported with their file and line, and the ratio of bad to seen lines is checked in
//! input order ([`crate::stats::too_many_bad`]).

use std::path::Path;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::batch::{Batch, BatchBuilder};
use crate::error::DataError;
use crate::feed::BadFiles;
use crate::parse::LineParser;
use crate::queue::{Block, Chunk, FileRef, Item, Pending, Shared, Spare, Work};
use crate::stats::{account_lines, ReadStats};

/// A batch is flushed early once its ids reach this count (far from the `u32` offset limit).
pub(crate) const MAX_BATCH_IDS: usize = (u32::MAX / 2) as usize;

/// A batch and the position after its last row.
pub(crate) struct Assembled {
    pub batch: Batch,
    /// The file of the last row.
    pub file: Arc<FileRef>,
    /// Where the next line of `file` starts.
    pub offset: u64,
    /// Rows handed out since the start of the job (including before a resume).
    pub rows: u64,
}

/// Parses every line of `chunk` into `builder`: blank lines are skipped, malformed ones
/// counted and reported with their file and line. `after_row` gets the offset in the chunk
/// just after each good row's line. Returns the lines `(seen, bad)`.
fn parse_chunk(
    parser: &LineParser,
    stats: &ReadStats,
    path: &Path,
    chunk: &Chunk,
    builder: &mut BatchBuilder,
    mut after_row: impl FnMut(usize),
) -> (u64, u64) {
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
            } else {
                after_row((end + 1).min(data.len()));
            }
        }
        start = end + 1;
        index += 1;
    }
    (seen, bad)
}

/// Parser thread body: every chunk becomes one [`Block`] (a Parquet row range one per 16 Ki
/// good rows, and one with the rest), built in recycled buffers when the assembler has
/// handed some back on `spares`.
pub(crate) fn parse_blocks(
    shared: &Shared,
    parser: &LineParser,
    work: &Receiver<Work>,
    spares: &Receiver<Spare>,
    spare_text: &Sender<Vec<u8>>,
) {
    let mut builder = parser.builder(0);
    let mut ends = Vec::new();
    while let Ok(w) = work.recv() {
        if shared.stopped() {
            return;
        }
        let (seen, bad, bytes, fault) = match w.item {
            Item::Text(chunk) => {
                let base = chunk.base;
                let (seen, bad) = parse_chunk(
                    parser,
                    &shared.stats,
                    &chunk.file.path,
                    &chunk,
                    &mut builder,
                    |end| ends.push(base + end as u64),
                );
                let bytes = chunk.len as u64;
                // Full: the feeder allocates instead.
                let _ = spare_text.try_send(chunk.data);
                (seen, bad, bytes, None)
            }
            #[cfg(feature = "parquet")]
            Item::Rows(range) => {
                // A piece of the range: bytes and a fault come with its last block.
                let piece = |builder: &mut BatchBuilder, ends: &mut Vec<u64>, seen, bad| {
                    let (rows, ends) = take_rows(builder, ends, spares);
                    let block = Block {
                        rows,
                        ends,
                        seen,
                        bad,
                        bytes: 0,
                        fault: None,
                        more: true,
                    };
                    w.reply.send(block).is_ok()
                };
                let d = range.decode(parser, &shared.stats, &mut builder, &mut ends, piece);
                (d.seen, d.bad, d.bytes, d.fault)
            }
        };
        let (rows, ends) = take_rows(&mut builder, &mut ends, spares);
        let block = Block {
            rows,
            ends,
            seen,
            bad,
            bytes,
            fault,
            more: false,
        };
        // The assembler may be gone (stopped); the next `recv` or check ends this thread.
        let _ = w.reply.send(block);
    }
}

/// The rows of `builder` and their `ends`, both continued in a spare's buffers when the
/// assembler has handed one back (else in fresh ones).
fn take_rows(
    builder: &mut BatchBuilder,
    ends: &mut Vec<u64>,
    spares: &Receiver<Spare>,
) -> (Batch, Vec<u64>) {
    let (rows, next_ends) = match spares.try_recv() {
        Ok((batch, mut spare_ends)) => {
            spare_ends.clear();
            (builder.take_reusing(batch), spare_ends)
        }
        Err(_) => (builder.take(), Vec::with_capacity(ends.len())),
    };
    (rows, std::mem::replace(ends, next_ends))
}

/// Cuts an in-order stream of blocks into batches of exactly `batch_size` rows (fewer only
/// for the last batch, the last batch of a file when `flush_at_file_end`, or when a batch
/// reaches `max_ids` ids), tracking the position.
pub(crate) struct Assembler {
    batch_size: usize,
    max_ids: usize,
    /// Rows still to hand out (`max_rows` minus rows before the start).
    rows_left: Option<u64>,
    /// A batch never spans two files (follow mode).
    flush_at_file_end: bool,
    current: Batch,
    /// Rows handed out or in `current`.
    rows: u64,
    /// The file and offset after the last row added to `current`.
    last: Option<(Arc<FileRef>, u64)>,
}

impl Assembler {
    pub fn new(
        batch_size: usize,
        max_ids: usize,
        rows_left: Option<u64>,
        start_rows: u64,
        flush_at_file_end: bool,
    ) -> Self {
        Assembler {
            batch_size,
            max_ids,
            rows_left,
            flush_at_file_end,
            current: Batch::default(),
            rows: start_rows,
            last: None,
        }
    }

    /// True once `max_rows` rows were handed out.
    pub fn exhausted(&self) -> bool {
        self.rows_left == Some(0)
    }

    /// Adds the rows of `block` (of `file`), calling `emit` with every completed batch.
    /// Returns false as soon as `emit` does or the row limit is reached.
    pub fn push(
        &mut self,
        file: &Arc<FileRef>,
        block: &mut Block,
        emit: &mut impl FnMut(Assembled) -> bool,
    ) -> bool {
        let n = block.rows.rows;
        let rows = &mut block.rows;
        let mut r = 0;
        while r < n {
            if self.exhausted() {
                return false;
            }
            let mut take = (self.batch_size - self.current.rows).min(n - r);
            if let Some(left) = self.rows_left {
                take = take.min(usize::try_from(left).unwrap_or(usize::MAX));
            }
            let mut full = self.current.rows + take == self.batch_size;
            // Like a row-by-row builder: flush right after the row that reaches `max_ids`.
            let have = self.current.ids.len();
            let base = rows.ids_before(r);
            if have + rows.ids_before(r + take) - base >= self.max_ids {
                // The fewest rows that reach it (`take` rows do).
                let (mut lo, mut hi) = (1, take);
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if have + rows.ids_before(r + mid) - base >= self.max_ids {
                        hi = mid;
                    } else {
                        lo = mid + 1;
                    }
                }
                take = lo;
                full = true;
            }
            if self.current.rows == 0 && r == 0 && take == n {
                // The whole block is the start of a batch: move it, no copy.
                self.current = std::mem::take(rows);
            } else {
                if self.current.rows == 0 {
                    self.current = self.fresh_batch(rows);
                }
                self.current.append_rows(rows, r..r + take);
            }
            r += take;
            self.rows += take as u64;
            match &mut self.last {
                Some((f, offset)) if Arc::ptr_eq(f, file) => *offset = block.ends[r - 1],
                last => *last = Some((Arc::clone(file), block.ends[r - 1])),
            }
            if let Some(left) = self.rows_left.as_mut() {
                *left -= take as u64;
                full |= *left == 0;
            }
            if full && !emit(self.take()) {
                return false;
            }
        }
        !self.exhausted()
    }

    /// The current file ended: hands out its last batch in follow mode. False if `emit` did.
    pub fn file_end(&mut self, emit: &mut impl FnMut(Assembled) -> bool) -> bool {
        if self.flush_at_file_end && self.current.rows > 0 {
            return emit(self.take());
        }
        true
    }

    /// Hands out the last, short batch if any rows are left.
    pub fn finish(&mut self, emit: &mut impl FnMut(Assembled) -> bool) {
        if self.current.rows > 0 {
            emit(self.take());
        }
    }

    /// An empty batch shaped like `block` with room for `batch_size` rows like its rows.
    fn fresh_batch(&self, block: &Batch) -> Batch {
        let (f, d) = (block.num_fields, block.num_dense);
        let rows = self.batch_size.min(1 << 20);
        let ids_per_row = block.ids.len().div_ceil(block.rows.max(1)).max(f);
        let mut b = Batch::empty_with_labels(f, d, block.num_labels);
        b.labels.reserve_exact(rows * block.num_labels);
        if block.has_sample_weights() {
            b.sample_weights.reserve_exact(rows);
        }
        b.dense.reserve_exact(rows * d);
        b.ids.reserve(rows * ids_per_row);
        b.offsets.reserve_exact(rows * f);
        b
    }

    fn take(&mut self) -> Assembled {
        let (file, offset) = self.last.clone().expect("a batch with rows has a last row");
        Assembled {
            batch: std::mem::take(&mut self.current),
            file,
            offset,
            rows: self.rows,
        }
    }
}

/// Assembler thread body: takes the blocks in input order, accounts their lines (so the
/// bad-line ratio is checked in input order), and sends the batches to the consumer.
///
/// A block with a fault (a Parquet row group that could not be decoded) makes its file bad
/// after its good rows: under [`BadFiles::Fail`] the reader stops with the error, under
/// [`BadFiles::Skip`] the file's remaining blocks are dropped, as for a bad file the feeder
/// finds ([`Pending::Skipped`]).
pub(crate) fn assemble(
    shared: &Shared,
    mut asm: Assembler,
    max_ratio: f64,
    bad_files: BadFiles,
    ordered: &Receiver<Pending>,
    spares: &Sender<Spare>,
    out: &Sender<Result<Assembled, DataError>>,
) {
    let mut emit = |b: Assembled| out.send(Ok(b)).is_ok();
    // A file skipped after a faulty block: its remaining blocks (and its end) are dropped.
    let mut skipping: Option<Arc<FileRef>> = None;
    while let Ok(pending) = ordered.recv() {
        if shared.stopped() {
            return;
        }
        if let Some(bad) = &skipping {
            match &pending {
                Pending::Block { file, .. } if Arc::ptr_eq(file, bad) => continue,
                // The skipped file's own end (its file end was handled with the fault).
                Pending::FileEnd => {
                    skipping = None;
                    continue;
                }
                _ => skipping = None,
            }
        }
        match pending {
            Pending::Err(e) => return shared.fail(out, e),
            Pending::Lines { seen, bad, bytes } => {
                if let Some(e) = account_lines(&shared.stats, seen, bad, bytes, max_ratio) {
                    return shared.fail(out, e);
                }
            }
            Pending::FileEnd => {
                if !asm.file_end(&mut emit) {
                    return shared.stop();
                }
            }
            Pending::Skipped { error } => {
                tracing::error!("{error}: file skipped");
                shared.stats.add_bad_file();
                if !asm.file_end(&mut emit) {
                    return shared.stop();
                }
            }
            Pending::Block { file, reply } => loop {
                // A parser only drops a reply when the reader is stopping.
                let Ok(mut block) = reply.recv() else { return };
                let (seen, bad, bytes) = (block.seen, block.bad, block.bytes);
                if let Some(e) = account_lines(&shared.stats, seen, bad, bytes, max_ratio) {
                    return shared.fail(out, e);
                }
                if !asm.push(&file, &mut block, &mut emit) {
                    // Row limit reached (or the consumer is gone): stop the other threads.
                    shared.stop();
                    return;
                }
                if let Some(error) = block.fault.take() {
                    if bad_files == BadFiles::Fail {
                        return shared.fail(out, error);
                    }
                    tracing::error!("{error}: file skipped");
                    shared.stats.add_bad_file();
                    if !asm.file_end(&mut emit) {
                        return shared.stop();
                    }
                    skipping = Some(file);
                    break;
                }
                if block.rows.labels.capacity() > 0 {
                    // Full: the parsers allocate instead.
                    let _ = spares.try_send((block.rows, block.ends));
                }
                if !block.more {
                    break;
                }
            },
        }
    }
    if !shared.stopped() {
        asm.finish(&mut emit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::feature_id;

    /// A block of `n` rows with 2 fields (row `i` of field 1 has `1 + i % 3` ids), ends
    /// `first_end + 10 * i`.
    fn block(n: usize, label0: usize, first_end: u64) -> Block {
        let mut b = BatchBuilder::new(2, 1, n);
        for i in 0..n {
            b.begin_row();
            b.push_label(((label0 + i) % 2) as f32);
            b.push_dense((label0 + i) as f32);
            b.push_id(feature_id(0, format!("{}", label0 + i).as_bytes()));
            b.end_field();
            for k in 0..1 + i % 3 {
                b.push_id(feature_id(1, &[k as u8]));
            }
            b.end_field();
            b.end_row();
        }
        Block {
            rows: b.take(),
            ends: (0..n as u64).map(|i| first_end + 10 * i).collect(),
            seen: n as u64,
            bad: 0,
            bytes: 10 * n as u64,
            fault: None,
            more: false,
        }
    }

    fn file(index: u64) -> Arc<FileRef> {
        Arc::new(FileRef {
            path: format!("f{index}").into(),
            name: Arc::from(""),
            epoch: 0,
            index,
        })
    }

    fn run(asm: &mut Assembler, blocks: Vec<(u64, Block)>) -> Vec<Assembled> {
        let files = [file(0), file(1)];
        let mut out = Vec::new();
        let mut emit = |b: Assembled| {
            out.push(b);
            true
        };
        let mut prev = None;
        for (f, mut b) in blocks {
            if prev.is_some_and(|p| p != f) {
                asm.file_end(&mut emit);
            }
            prev = Some(f);
            if !asm.push(&files[f as usize], &mut b, &mut emit) {
                return out;
            }
        }
        asm.finish(&mut emit);
        out
    }

    fn blocks() -> Vec<(u64, Block)> {
        vec![
            (0, block(3, 0, 10)),
            (0, block(0, 3, 40)),
            (1, block(6, 3, 5)),
            (1, block(1, 9, 65)),
        ]
    }

    #[test]
    fn cuts_exact_batches_across_blocks() {
        let all = Batch::concat(
            &blocks()
                .iter()
                .map(|(_, b)| b.rows.clone())
                .collect::<Vec<_>>(),
        );
        let mut asm = Assembler::new(4, MAX_BATCH_IDS, None, 0, false);
        let out = run(&mut asm, blocks());
        let sizes: Vec<_> = out.iter().map(|b| b.batch.rows).collect();
        assert_eq!(sizes, [4, 4, 2]);
        let got = Batch::concat(&out.iter().map(|b| b.batch.clone()).collect::<Vec<_>>());
        assert_eq!(got, all);
        let pos: Vec<_> = out
            .iter()
            .map(|b| (b.file.index, b.offset, b.rows))
            .collect();
        // the 4th row ends batch 1; the 8th is the 5th of file 1 (end 5 + 40)
        assert_eq!(pos, [(1, 5, 4), (1, 45, 8), (1, 65, 10)]);
    }

    #[test]
    fn follow_mode_never_spans_files() {
        let mut asm = Assembler::new(4, MAX_BATCH_IDS, None, 100, true);
        let out = run(&mut asm, blocks());
        let pos: Vec<_> = out
            .iter()
            .map(|b| (b.batch.rows, b.file.index, b.offset, b.rows))
            .collect();
        assert_eq!(pos, [(3, 0, 30, 103), (4, 1, 35, 107), (3, 1, 65, 110)]);
    }

    #[test]
    fn row_limit_and_id_limit() {
        let mut asm = Assembler::new(4, MAX_BATCH_IDS, Some(5), 0, false);
        let out = run(&mut asm, vec![(0, block(3, 0, 10)), (0, block(3, 3, 40))]);
        let sizes: Vec<_> = out.iter().map(|b| b.batch.rows).collect();
        assert_eq!(sizes, [4, 1]);
        assert_eq!(out[1].offset, 50);
        assert!(asm.exhausted());

        // ids per row: 2, 3, 4, 2, 3, 4: a batch is flushed after the row that reaches 6 ids.
        let mut asm = Assembler::new(100, 6, None, 0, false);
        let out = run(&mut asm, vec![(0, block(6, 0, 10))]);
        let sizes: Vec<_> = out.iter().map(|b| b.batch.rows).collect();
        assert_eq!(sizes, [3, 3]);
        for b in &out {
            b.batch.check_tags(&b.batch.legacy_tags()).unwrap();
        }
    }
}
