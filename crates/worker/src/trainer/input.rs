//! Input helpers of the loops: file-mode positions, skipping consumed rows, the loss meter.

use sparta_checkpoint::InputPosition;
use sparta_data::{Batch, DataError};

/// The input position saved in checkpoints: rows consumed since the start of training.
pub(super) fn position(rows: u64) -> InputPosition {
    InputPosition {
        rows_consumed: rows,
        ..InputPosition::default()
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
