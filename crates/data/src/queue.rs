//! What travels between the engine's threads: work items (chunks of text, or row ranges of a
//! Parquet file) from the feeder to the parsers, parsed blocks (parsers -> assembler) and the in-order queue of pending work (feeder -> assembler),
//! and the state all of them share.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::batch::Batch;
use crate::error::DataError;
use crate::input::{lines_before, RangeRead};
use crate::stats::ReadStats;

/// One input file as the engine reports it in positions and messages.
#[derive(Debug)]
pub(crate) struct FileRef {
    pub path: PathBuf,
    /// Name inside a followed directory (empty for a file list).
    pub name: Arc<str>,
    /// Pass over a file list (0 when following).
    pub epoch: u64,
    /// Index in the file list (0 when following).
    pub index: u64,
}

/// Where the line count of a chunk starts.
pub(crate) enum Origin {
    /// The start of the text.
    Start,
    /// Byte `offset` of a ranged source, reached by seeking: the lines before it are counted
    /// on demand (only for reports).
    Seek {
        source: Arc<dyn RangeRead>,
        offset: u64,
    },
}

/// A line-aligned piece of one input's text: the unit of work of a parser thread.
pub(crate) struct Chunk {
    pub file: Arc<FileRef>,
    /// The text is `data[..len]` (the buffer is reused: its tail is stale).
    pub data: Vec<u8>,
    pub len: usize,
    /// Offset in the (decompressed) text of `data[0]`.
    pub base: u64,
    /// Lines between the origin and `base`.
    pub lines_before: u64,
    pub origin: Arc<Origin>,
}

impl Chunk {
    /// The chunk's text.
    pub fn bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }

    /// 1-based line number of the `index`-th line of this chunk (may read the file: call it
    /// only for reports).
    pub fn line_no(&self, index: u64) -> u64 {
        let skipped = match &*self.origin {
            Origin::Start => 0,
            Origin::Seek { source, offset } => lines_before(&**source, *offset),
        };
        1 + skipped + self.lines_before + index
    }
}

/// The rows of one parsed chunk.
pub(crate) struct Block {
    /// The chunk's good rows, in line order.
    pub rows: Batch,
    /// For each row, the byte offset in its file just after its line (where the next line starts).
    pub ends: Vec<u64>,
    /// Lines parsed (good and bad; blank lines excluded).
    pub seen: u64,
    /// Malformed lines.
    pub bad: u64,
    /// Bytes of text in the chunk (for Parquet: bytes read from the source).
    pub bytes: u64,
    /// The rest of the item could not be read (a corrupt Parquet page): `rows` are the good
    /// rows before the fault; the assembler treats the file as bad ([`Pending::Skipped`]).
    pub fault: Option<DataError>,
    /// More blocks of the same item follow on its reply (a Parquet row range is handed on in
    /// pieces); the last has `false`.
    pub more: bool,
}

/// What a parser thread turns into a [`Block`].
pub(crate) enum Item {
    /// Lines of text.
    Text(Chunk),
    /// Rows of one row group of a Parquet file.
    #[cfg(feature = "parquet")]
    Rows(crate::parquet::RowRange),
}

/// A work item for a parser thread and where to reply.
pub(crate) struct Work {
    pub item: Item,
    pub reply: Sender<Block>,
}

/// One entry of the in-order queue from the feeder to the assembler.
pub(crate) enum Pending {
    /// A chunk of `file`; its [`Block`]s (one for text) arrive on `reply`.
    Block {
        file: Arc<FileRef>,
        reply: Receiver<Block>,
    },
    /// Lines the feeder itself dropped (an overlong line).
    Lines { seen: u64, bad: u64, bytes: u64 },
    /// `file` was read to its end.
    FileEnd,
    /// `file` is bad (corrupt, changed while read, or the start offset does not fit it) and
    /// was skipped after the rows before the fault (follow mode).
    Skipped { error: DataError },
    /// The feeder failed here: the reader stops with this error.
    Err(DataError),
}

/// Buffers of a used [`Block`] (rows, ends), handed back to the parsers for reuse.
pub(crate) type Spare = (Batch, Vec<u64>);

/// State shared by the feeder, the parser threads, the assembler and the consumer.
pub(crate) struct Shared {
    pub stats: Arc<ReadStats>,
    /// Set to make every thread stop at its next check.
    pub stop: AtomicBool,
    /// Set by the first thread that sends an error.
    pub failed: AtomicBool,
}

impl Shared {
    /// Sends `err` unless another thread already failed, and stops everybody.
    pub fn fail<T>(&self, out: &Sender<Result<T, DataError>>, err: DataError) {
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
