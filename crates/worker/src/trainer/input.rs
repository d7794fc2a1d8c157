//! Input helpers of the loops: file-mode positions, skipping consumed rows, the loss meter.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

use sparta_checkpoint::InputPosition;
use sparta_data::{Batch, BatchStream, DataError, ReadPosition};

/// A position known only by the rows consumed since the start of training (checkpoints of
/// older versions; the reader's order is the same for any thread count, so skipping that many
/// rows is exact, only slower than starting at a byte offset).
pub(super) fn position(rows: u64) -> InputPosition {
    InputPosition {
        rows_consumed: rows,
        ..InputPosition::default()
    }
}

/// A reader position as saved in checkpoints.
pub(super) fn to_input(p: &ReadPosition) -> InputPosition {
    InputPosition {
        epoch: p.epoch,
        file_index: p.file_index,
        byte_offset: p.byte_offset,
        rows_consumed: p.rows,
        file: String::new(),
        ..InputPosition::default()
    }
}

/// Where a reader continues from a saved file-mode position: `None` for the start of the
/// input, or a position saved as a row count only (see [`position`]).
pub(super) fn read_start(p: &InputPosition) -> Option<ReadPosition> {
    let located = p.epoch > 0 || p.file_index > 0 || p.byte_offset > 0;
    (located && p.file.is_empty()).then_some(ReadPosition {
        epoch: p.epoch,
        file_index: p.file_index,
        byte_offset: p.byte_offset,
        rows: p.rows_consumed,
    })
}

/// Positions after the last batches read, by rows consumed: the loop asks for the position
/// after the rows it has trained, while its reader (the pipeline) may be a few batches ahead.
#[derive(Clone)]
pub(super) struct PositionTrail {
    kept: Arc<Mutex<VecDeque<ReadPosition>>>,
    cap: usize,
}

/// Positions kept while streaming: far more than any read-ahead (the pipeline holds a handful
/// of batches).
const TRAIL: usize = 1024;

impl PositionTrail {
    /// A trail starting at `start`; `all`: keep every position (the input is read whole
    /// before training, `train.preload`).
    pub(super) fn new(start: ReadPosition, all: bool) -> Self {
        let t = Self {
            kept: Arc::default(),
            cap: if all { usize::MAX } else { TRAIL },
        };
        t.record(start);
        t
    }

    fn record(&self, p: ReadPosition) {
        let mut q = self.kept.lock();
        if q.len() >= self.cap {
            q.pop_front();
        }
        q.push_back(p);
    }

    /// The position after `rows` rows consumed since the start of training.
    pub(super) fn at(&self, rows: u64) -> InputPosition {
        match self.kept.lock().iter().rev().find(|p| p.rows == rows) {
            Some(p) => to_input(p),
            None => {
                tracing::warn!(
                    "no reader position for {rows} rows consumed: saving the row count only \
                     (a resume re-reads and skips them)"
                );
                position(rows)
            }
        }
    }
}

/// The batches of a reader, recording the position after each in a [`PositionTrail`].
pub(super) struct Tracked {
    inner: BatchStream,
    trail: PositionTrail,
}

impl Tracked {
    pub(super) fn new(inner: BatchStream, trail: PositionTrail) -> Self {
        Self { inner, trail }
    }
}

impl Iterator for Tracked {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.inner.next_positioned()?.map(|b| {
            self.trail.record(b.position);
            b.batch
        }))
    }
}

/// Training loss over a run: the mean for the summary, a moving average for progress.
#[derive(Default)]
pub(super) struct LossMeter {
    sum: f64,
    steps: u64,
    recent: f64,
}

impl LossMeter {
    /// Records one step's loss; returns the moving average.
    pub(super) fn record(&mut self, loss: f32) -> f64 {
        let loss = loss as f64;
        self.sum += loss;
        self.steps += 1;
        self.recent = if self.steps == 1 {
            loss
        } else {
            0.95 * self.recent + 0.05 * loss
        };
        self.recent
    }

    pub(super) fn mean(&self) -> f64 {
        self.sum / self.steps.max(1) as f64
    }
}

/// Skips the first `n` rows of a batch stream (a resumed job's already-trained rows).
pub(super) struct SkipRows<I> {
    inner: I,
    left: u64,
}

impl<I> SkipRows<I> {
    pub(super) fn new(inner: I, left: u64) -> Self {
        Self { inner, left }
    }
}

impl<I: Iterator<Item = Result<Batch, DataError>>> Iterator for SkipRows<I> {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let batch = match self.inner.next()? {
                Ok(b) => b,
                Err(e) => return Some(Err(e)),
            };
            if self.left == 0 {
                return Some(Ok(batch));
            }
            let rows = batch.rows as u64;
            if rows <= self.left {
                self.left -= rows;
                continue;
            }
            let from = self.left as usize;
            self.left = 0;
            return Some(Ok(batch.slice(from..batch.rows)));
        }
    }
}

/// Ends a batch stream once `stop` is set: the loop finishes the step in progress, then
/// training ends as if the input had (final checkpoint, exports, summary).
pub(super) struct UntilStopped<I> {
    pub(super) inner: I,
    pub(super) stop: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl<I: Iterator> Iterator for UntilStopped<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        if self
            .stop
            .as_ref()
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed))
        {
            return None;
        }
        self.inner.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_stream_ends_at_the_first_item_after_a_stop() {
        let stop = Arc::new(AtomicBool::new(false));
        let mut s = UntilStopped {
            inner: 0..10,
            stop: Some(Arc::clone(&stop)),
        };
        assert_eq!((s.next(), s.next()), (Some(0), Some(1)));
        stop.store(true, Ordering::Relaxed);
        assert_eq!(s.next(), None);
        let all: Vec<_> = UntilStopped {
            inner: 0..3,
            stop: None,
        }
        .collect();
        assert_eq!(all, [0, 1, 2]);
    }
}
