//! Position bookkeeping: which Kafka offsets a batch boundary stands for.
//!
//! The records of all partitions are laid end to end as one text (one record = one line) in
//! the order the source cut them, so the engine sees a single input and reports, with every
//! batch, the byte of that text after the batch's last row. For every record the source logs
//! where its line ends in the text, its partition and the offset after it ([`RecordEnd`]),
//! in text order, before the record goes to the parsers. [`Offsets::advance`] applies every
//! logged record ending at or before a batch's byte: the records of every partition up to
//! that batch boundary, rows, blank and bad records alike. What remains logged belongs to
//! later batches.

use std::collections::{BTreeMap, VecDeque};

/// Where one record's line ends in the engine's text, and the offset after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordEnd {
    /// Byte of the text just after the record's line (a record dropped before parsing, such
    /// as one holding a newline, ends where it would have started).
    pub end: u64,
    pub partition: i32,
    /// The partition's offset after this record.
    pub next: i64,
}

/// The next offset of every partition at the last batch boundary applied.
#[derive(Debug, Default)]
pub(crate) struct Offsets {
    next: BTreeMap<i32, i64>,
    pending: VecDeque<RecordEnd>,
}

impl Offsets {
    /// Starts at `start` (partition, next offset).
    pub fn new(start: &[(i32, i64)]) -> Self {
        Offsets {
            next: start.iter().copied().collect(),
            pending: VecDeque::new(),
        }
    }

    /// Logs records the source cut (in text order, after those logged before).
    pub fn log(&mut self, ends: impl IntoIterator<Item = RecordEnd>) {
        self.pending.extend(ends);
    }

    /// Applies every logged record ending at or before byte `to` of the text.
    pub fn advance(&mut self, to: u64) {
        while let Some(r) = self.pending.front().filter(|r| r.end <= to) {
            self.next.insert(r.partition, r.next);
            self.pending.pop_front();
        }
    }

    /// `(partition, next offset)` for every partition, by partition.
    pub fn snapshot(&self) -> Vec<(i32, i64)> {
        self.next.iter().map(|(&p, &o)| (p, o)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(end: u64, partition: i32, next: i64) -> RecordEnd {
        RecordEnd {
            end,
            partition,
            next,
        }
    }

    #[test]
    fn a_boundary_applies_the_records_of_every_partition_before_it() {
        let mut o = Offsets::new(&[(0, 5), (1, 0), (2, 7)]);
        // Text: p0@5 [0,10) p1@0 [10,20) p0@6 [20,30) p1@1 [30,40).
        o.log([end(10, 0, 6), end(20, 1, 1), end(30, 0, 7), end(40, 1, 2)]);
        o.advance(0);
        assert_eq!(o.snapshot(), [(0, 5), (1, 0), (2, 7)]);
        // A batch of the first three rows: two partitions moved, the untouched one kept.
        o.advance(30);
        assert_eq!(o.snapshot(), [(0, 7), (1, 1), (2, 7)]);
        o.advance(39);
        assert_eq!(o.snapshot(), [(0, 7), (1, 1), (2, 7)]);
        o.advance(40);
        assert_eq!(o.snapshot(), [(0, 7), (1, 2), (2, 7)]);
    }

    #[test]
    fn a_partition_first_seen_later_joins_the_position() {
        let mut o = Offsets::new(&[(0, 0)]);
        o.log([end(4, 3, 11)]);
        o.advance(4);
        assert_eq!(o.snapshot(), [(0, 0), (3, 11)]);
    }

    #[test]
    fn a_dropped_record_at_a_boundary_goes_with_the_rows_before_it() {
        // A record dropped before parsing ends where it starts: a batch ending right before
        // it also passes it (it is no row: nothing is trained twice or skipped on resume).
        let mut o = Offsets::new(&[(0, 0)]);
        o.log([end(10, 0, 1), end(10, 0, 2), end(20, 0, 3)]);
        o.advance(10);
        assert_eq!(o.snapshot(), [(0, 2)]);
    }
}
