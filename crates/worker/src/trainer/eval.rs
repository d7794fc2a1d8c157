//! Evaluation and prediction with the current model (no rows are created).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use sparta_core::CoreError;
use sparta_data::{read_batches, ReaderConfig};
use sparta_nn::metrics;

use super::{Evaluation, Trainer};
use crate::step;

impl Trainer {
    /// Scores `paths` with the current model (no rows are created) and computes the metrics.
    pub fn evaluate(&mut self, paths: &[PathBuf]) -> Result<Evaluation, CoreError> {
        let start = Instant::now();
        let cfg = ReaderConfig {
            epochs: 1,
            max_rows: None,
            ..self.job.reader.clone()
        };
        let slot = self.job.gauc_slot();
        let mut groups = Vec::new();
        let (labels, probs, bad_lines) =
            self.score_files(paths, &cfg, slot.map(|s| (s, &mut groups)))?;
        if labels.is_empty() {
            return Err(CoreError::Training(
                "the test input held no valid rows".into(),
            ));
        }
        let mut m = metrics::evaluate(&labels, &probs);
        if slot.is_some() {
            let (g, used, _) = metrics::gauc(&groups, &labels, &probs);
            m.gauc = Some((g, used));
        }
        Ok(Evaluation {
            metrics: m,
            bad_lines,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Predicts every row of `paths` in input order (with one reader thread) and returns
    /// (labels, probabilities, bad lines).
    pub fn predict_files(
        &mut self,
        paths: &[PathBuf],
        cfg: &ReaderConfig,
    ) -> Result<(Vec<f32>, Vec<f32>, u64), CoreError> {
        self.score_files(paths, cfg, None)
    }

    /// [`Trainer::predict_files`], also collecting each row's group (the first id of sparse
    /// slot `group.0`) into `group.1` when asked.
    fn score_files(
        &mut self,
        paths: &[PathBuf],
        cfg: &ReaderConfig,
        mut group: Option<(usize, &mut Vec<u64>)>,
    ) -> Result<(Vec<f32>, Vec<f32>, u64), CoreError> {
        let store = Arc::clone(&self.store);
        let features = Arc::clone(&self.job.features);
        let stream = read_batches(paths, cfg)?;
        let stats = stream.stats();
        let mut labels = Vec::new();
        let mut probs = Vec::new();
        let mut out = Vec::new();
        for batch in stream {
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
            step::predict(&mut self.model, &self.lookup, &mut out);
            if let Some((slot, groups)) = group.as_mut() {
                let b = &self.lookup.batch;
                let first = |r: usize| b.ids[b.offsets[r * b.num_fields + *slot] as usize];
                groups.extend((0..b.rows).map(first));
            }
            labels.extend_from_slice(&self.lookup.batch.labels);
            probs.extend_from_slice(&out);
        }
        Ok((labels, probs, stats.bad_lines()))
    }
}
