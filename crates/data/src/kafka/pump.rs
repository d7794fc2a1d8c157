//! The engine's driver for a topic: fetched records -> line-aligned chunks for the parsers.
//!
//! Records of any partition, in the order they were fetched, become the lines of one text
//! (a record's value plus `\n`; one trailing `\n` of the value is dropped, so producers may
//! send lines with or without it). Chunks are cut at about [`CHUNK_BYTES`], or sooner when the
//! fetchers have nothing more ready (the parsers never wait for a chunk to fill). Before a
//! chunk goes out, where each of its records ends is logged for [`super::offsets`].
//!
//! * A record holding a `\n` (after the trailing one) cannot be one line: it is counted as a
//!   bad line, reported, and its offset still passes with the batch boundary after it.
//! * A record without a value (or an empty one) is a blank line: skipped, not counted.
//! * When nothing arrived for a `linger` pause, the rows of a partly filled batch go out as a
//!   short batch (online latency), as at the end of a followed file.
//! * Offsets that are no rows (control records, aborted records, offsets removed by
//!   compaction) pass with the records before them: the fetcher sends the partition's position
//!   after its records, logged where the last of them ends.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::Sender;

use crate::error::DataError;
use crate::feed::Feeder;
use crate::parse::BadLine;
use crate::queue::{Chunk, FileRef, Origin, Pending};

use super::offsets::RecordEnd;

/// Target size of a chunk of records.
pub(crate) const CHUNK_BYTES: usize = 1 << 20;

/// What the fetchers hand the driver.
#[derive(Debug)]
pub(crate) enum Fetched {
    /// Records of one partition, in offset order: `(offset, value)`, and the partition's
    /// position after them (at least the offset after the last; more when offsets after it
    /// hold no records to train).
    Records {
        partition: i32,
        records: Vec<(i64, Option<Bytes>)>,
        next: i64,
    },
    /// The source failed: the reader stops with this error.
    Err(DataError),
}

/// What a poll of the source got.
pub(crate) enum Poll {
    Ready(Fetched),
    /// Nothing within the wait.
    Empty,
    /// The source ended (every partition read to its end, or stopped).
    Closed,
}

/// Cuts the records `next` returns into chunks for `feeder` until the source closes or the
/// engine stops. `next(wait)` waits at most `wait` for a record; `ends` gets the record ends
/// of each chunk before the chunk goes out.
pub(crate) fn pump(
    feeder: &Feeder,
    file: &Arc<FileRef>,
    linger: Duration,
    mut next: impl FnMut(Duration) -> Poll,
    ends: &Sender<Vec<RecordEnd>>,
) {
    let mut cut = Cutter {
        feeder,
        file,
        ends,
        buf: feeder.buffer(CHUNK_BYTES),
        len: 0,
        base: 0,
        lines: 0,
        logged: Vec::new(),
        chunk_lines: 0,
        rows_since_flush: false,
    };
    loop {
        if feeder.shared.stopped() {
            return;
        }
        // Nothing buffered: wait up to `linger`; else only take what is ready.
        let wait = if cut.len == 0 { linger } else { Duration::ZERO };
        let ok = match next(wait) {
            Poll::Ready(Fetched::Records {
                partition,
                records,
                next,
            }) => cut.records(partition, records, next),
            Poll::Ready(Fetched::Err(e)) => {
                cut.chunk();
                let _ = feeder.ordered.send(Pending::Err(e));
                return;
            }
            Poll::Empty if cut.len > 0 => cut.chunk(),
            // Quiet for `linger`: hand out a partly filled batch.
            Poll::Empty => cut.flush_batch(),
            Poll::Closed => {
                cut.chunk();
                return;
            }
        };
        if !ok {
            return;
        }
    }
}

/// The chunk being filled.
struct Cutter<'a> {
    feeder: &'a Feeder,
    file: &'a Arc<FileRef>,
    ends: &'a Sender<Vec<RecordEnd>>,
    buf: Vec<u8>,
    len: usize,
    /// Byte of the text at `buf[0]`.
    base: u64,
    /// Lines (records with a line) before `buf[0]`, for bad-line reports.
    lines: u64,
    /// Record ends of the chunk being filled (and positions passed after its records).
    logged: Vec<RecordEnd>,
    /// Lines in the chunk being filled.
    chunk_lines: u64,
    /// Records went out since the last batch flush.
    rows_since_flush: bool,
}

impl Cutter<'_> {
    /// Adds one partition's records, then its position `next` after them. False if the
    /// engine stops.
    fn records(&mut self, partition: i32, records: Vec<(i64, Option<Bytes>)>, next: i64) -> bool {
        let passed = records.last().is_none_or(|&(last, _)| next > last + 1);
        for (offset, value) in records {
            let value = value.unwrap_or_default();
            let line = value.strip_suffix(b"\n").unwrap_or(&value);
            if memchr::memchr(b'\n', line).is_some() {
                if !self.bad_record(partition, offset, line) {
                    return false;
                }
                continue;
            }
            let need = self.len + line.len() + 1;
            if self.buf.len() < need {
                self.buf.resize(need.max(2 * self.buf.len()), 0);
            }
            self.buf[self.len..self.len + line.len()].copy_from_slice(line);
            self.buf[self.len + line.len()] = b'\n';
            self.len = need;
            self.chunk_lines += 1;
            self.logged.push(RecordEnd {
                end: self.base + self.len as u64,
                partition,
                next: offset + 1,
            });
            if self.len >= CHUNK_BYTES && !self.chunk() {
                return false;
            }
        }
        if passed {
            // Offsets without rows: they go with the batch boundary after the last record.
            self.logged.push(RecordEnd {
                end: self.base + self.len as u64,
                partition,
                next,
            });
        }
        true
    }

    /// A record that is not one line: counted bad, its offset passed with the next boundary.
    fn bad_record(&mut self, partition: i32, offset: i64, text: &[u8]) -> bool {
        if !self.chunk() {
            return false;
        }
        let stats = &self.feeder.shared.stats;
        // Reported as `kafka:TOPIC partition P offset:O`.
        let path = std::path::PathBuf::from(format!(
            "{} partition {partition} offset",
            self.file.path.display()
        ));
        stats.report_bad(&path, || offset as u64, &BadLine::MultiLine, text);
        // Logged first: the record ends where the next one starts.
        let _ = self.ends.send(vec![RecordEnd {
            end: self.base,
            partition,
            next: offset + 1,
        }]);
        let bytes = text.len() as u64 + 1;
        self.rows_since_flush = true;
        self.feeder
            .ordered
            .send(Pending::Lines {
                seen: 1,
                bad: 1,
                bytes,
            })
            .is_ok()
    }

    /// Sends the chunk being filled (if any), after what was logged for it. False if the
    /// engine stops.
    fn chunk(&mut self) -> bool {
        if self.len == 0 {
            // Positions passed with no record since the last chunk: logged in text order.
            return self.logged.is_empty()
                || self.ends.send(std::mem::take(&mut self.logged)).is_ok();
        }
        let lines = std::mem::take(&mut self.chunk_lines);
        if self.ends.send(std::mem::take(&mut self.logged)).is_err() {
            return false;
        }
        let data = std::mem::replace(&mut self.buf, self.feeder.buffer(CHUNK_BYTES));
        let chunk = Chunk {
            file: Arc::clone(self.file),
            data,
            len: self.len,
            base: self.base,
            lines_before: self.lines,
            origin: Arc::new(Origin::Start),
        };
        self.base += self.len as u64;
        self.lines += lines;
        self.len = 0;
        self.rows_since_flush = true;
        self.feeder.send_chunk(chunk)
    }

    /// Ends the batch being assembled (if it has rows): nothing more is coming for now.
    fn flush_batch(&mut self) -> bool {
        if !std::mem::take(&mut self.rows_since_flush) {
            return true;
        }
        self.feeder.ordered.send(Pending::FileEnd).is_ok()
    }
}
