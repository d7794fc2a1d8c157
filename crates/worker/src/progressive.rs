//! Progressive validation of a training run: every batch is scored by the model's forward pass
//! of its training step, before the update (no second forward pass), and each row's (target,
//! probability, sample weight, group) goes to a [`ProgressiveTracker`]: per task an exact
//! window over the last `[metrics] window` rows and a streamed accumulator since the run
//! started.

use sparta_core::config::Job;
use sparta_core::features::Features;
use sparta_data::Batch;
use sparta_nn::metrics::{Progressive, ProgressiveTracker};
use sparta_nn::ModelConfig;

use crate::progress::WindowLine;

/// What a trainer keeps of its scored batches.
pub(crate) struct ProgressiveMeter {
    tracker: ProgressiveTracker,
    /// The slot whose first id groups rows for GAUC (`train.gauc_by`).
    gauc_slot: Option<usize>,
    model: ModelConfig,
    labels: Vec<f32>,
}

impl ProgressiveMeter {
    /// A meter for `job`'s model (its tasks, and GAUC when the job has `train.gauc_by`).
    pub(crate) fn new(job: &Job) -> Self {
        let gauc_slot = job.gauc_slot();
        ProgressiveMeter {
            tracker: ProgressiveTracker::new(
                job.model.task_names(),
                job.raw.metrics.window,
                gauc_slot.is_some(),
            ),
            gauc_slot,
            model: job.model.clone(),
            labels: Vec::new(),
        }
    }

    /// Records a trained batch's rows with `probs` (`rows * tasks`), the probabilities its
    /// training step's forward pass scored.
    pub(crate) fn record(&mut self, features: &Features, batch: &Batch, probs: &[f32]) {
        let tasks = self.tracker.num_tasks();
        let labels = sparta_core::step::task_labels(batch, &features.task_labels, &mut self.labels);
        if labels.len() < batch.rows * tasks || probs.len() < batch.rows * tasks {
            return; // an unlabeled batch: nothing to score
        }
        for r in 0..batch.rows {
            let w = batch.sample_weight(r);
            let group = self.gauc_slot.map_or(0, |s| group_of(batch, r, s));
            let row = &labels[r * tasks..(r + 1) * tasks];
            for t in 0..tasks {
                let y = self.model.task_target(t, row);
                self.tracker.add(t, y, probs[r * tasks + t], w, group);
            }
        }
    }

    /// The report at job step `step`.
    pub(crate) fn report(&self, step: u64) -> Progressive {
        self.tracker.report(step)
    }

    /// The first task's window AUC and log loss, for a progress line.
    pub(crate) fn line(&self) -> Option<WindowLine> {
        if self.tracker.rows() == 0 {
            return None;
        }
        let s = self.tracker.window_summary(0);
        Some(WindowLine {
            auc: s.auc,
            logloss: s.logloss,
        })
    }
}

/// The group of row `r` for GAUC: the first id of its slot `slot` (the evaluation on a test
/// set groups rows the same way); 0 past the batch's ids.
pub(crate) fn group_of(batch: &Batch, r: usize, slot: usize) -> u64 {
    let at = batch.offsets[r * batch.num_fields + slot] as usize;
    batch.ids.get(at).copied().unwrap_or(0)
}
