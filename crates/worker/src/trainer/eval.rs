//! Evaluation and prediction with the current model (no rows are created).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use sparta_core::CoreError;
use sparta_data::{read_batches, Batch, DataError, ReadStats, ReaderConfig};
use sparta_nn::metrics::{GaucAccumulator, MetricsAccumulator};

use super::Trainer;
use crate::step;
use crate::summary::{Evaluation, TaskEvaluation};

impl Trainer {
    /// Scores `paths` with the current model (no rows are created) and computes every task's
    /// metrics, streamed batch by batch (AUC, log loss and calibration in fixed memory; GAUC
    /// keeps 20 bytes per test row).
    pub fn evaluate(&mut self, paths: &[PathBuf]) -> Result<Evaluation, CoreError> {
        let cfg = ReaderConfig {
            epochs: 1,
            max_rows: None,
            ..self.job.reader.clone()
        };
        let stream = read_batches(paths, &cfg)?;
        let stats = stream.stats();
        self.evaluate_batches(stream, &stats)
    }

    /// [`Trainer::evaluate`] on batches from any source (`stats`: its counters, for the bad
    /// lines).
    pub fn evaluate_batches(
        &mut self,
        batches: impl Iterator<Item = Result<Batch, DataError>>,
        stats: &ReadStats,
    ) -> Result<Evaluation, CoreError> {
        let start = Instant::now();
        let slot = self.job.gauc_slot();
        let names = self.model.config().task_names();
        let tasks = names.len();
        let mut acc = vec![MetricsAccumulator::new(); tasks];
        let mut gauc = vec![GaucAccumulator::default(); if slot.is_some() { tasks } else { 0 }];
        let model_cfg = self.model.config().clone();
        self.score_batches(batches, |batch, labels, probs| {
            let first = |r: usize, s: usize| crate::progressive::group_of(batch, r, s);
            for r in 0..batch.rows {
                let w = batch.sample_weight(r);
                let row = &labels[r * tasks..(r + 1) * tasks];
                for t in 0..tasks {
                    let (y, p) = (model_cfg.task_target(t, row), probs[r * tasks + t]);
                    acc[t].add(y, p, w);
                    if let Some(s) = slot {
                        gauc[t].add(first(r, s), y, p, w);
                    }
                }
            }
        })?;
        let bad_lines = stats.bad_lines();
        if acc[0].rows() == 0 {
            return Err(CoreError::Training(
                "the test input held no valid rows".into(),
            ));
        }
        let tasks: Vec<TaskEvaluation> = names
            .into_iter()
            .enumerate()
            .map(|(t, name)| {
                let mut metrics = acc[t].summary();
                if let Some(g) = gauc.get_mut(t) {
                    let (v, used, _) = g.finish();
                    metrics.gauc = Some((v, used));
                }
                TaskEvaluation { name, metrics }
            })
            .collect();
        Ok(Evaluation {
            metrics: tasks[0].metrics.clone(),
            tasks,
            bad_lines,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Predicts every row of `paths` in input order (with one reader thread) and returns
    /// (targets, probabilities, bad lines): `rows * tasks` each, row-major (each task's target
    /// as its loss sees it).
    pub fn predict_files(
        &mut self,
        paths: &[PathBuf],
        cfg: &ReaderConfig,
    ) -> Result<(Vec<f32>, Vec<f32>, u64), CoreError> {
        let model_cfg = self.model.config().clone();
        let tasks = model_cfg.num_tasks();
        let (mut targets, mut all) = (Vec::new(), Vec::new());
        let bad = self.score_files(paths, cfg, |batch, labels, probs| {
            for row in labels.chunks_exact(tasks).take(batch.rows) {
                targets.extend((0..tasks).map(|t| model_cfg.task_target(t, row)));
            }
            all.extend_from_slice(probs);
        })?;
        Ok((targets, all, bad))
    }

    /// Scores every batch of `paths` and hands `f` the batch, its task labels (`rows * tasks`)
    /// and the probabilities (`rows * tasks`). Returns the bad lines.
    fn score_files(
        &mut self,
        paths: &[PathBuf],
        cfg: &ReaderConfig,
        f: impl FnMut(&Batch, &[f32], &[f32]),
    ) -> Result<u64, CoreError> {
        let stream = read_batches(paths, cfg)?;
        let stats = stream.stats();
        self.score_batches(stream, f)?;
        Ok(stats.bad_lines())
    }

    /// Scores every batch of `batches` and hands `f` the batch, its task labels (`rows *
    /// tasks`) and the probabilities (`rows * tasks`).
    pub(super) fn score_batches(
        &mut self,
        batches: impl Iterator<Item = Result<Batch, DataError>>,
        mut f: impl FnMut(&Batch, &[f32], &[f32]),
    ) -> Result<(), CoreError> {
        let store = Arc::clone(&self.store);
        let features = Arc::clone(&self.job.features);
        let (mut out, mut labels) = (Vec::new(), Vec::new());
        for batch in batches {
            let batch = batch?;
            if batch.rows == 0 {
                continue;
            }
            step::lookup(
                store.as_ref(),
                &mut self.deduper,
                &features,
                batch,
                &mut self.lookup,
                false,
            )?;
            step::predict(&mut self.model, &features, &self.lookup, &mut out);
            let b = &self.lookup.batch;
            let l = sparta_core::step::task_labels(b, &features.task_labels, &mut labels);
            f(b, l, &out);
        }
        Ok(())
    }
}
