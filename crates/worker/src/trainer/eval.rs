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
        let (labels, probs, bad_lines) = self.predict_files(paths, &cfg)?;
        if labels.is_empty() {
            return Err(CoreError::Training(
                "the test input held no valid rows".into(),
            ));
        }
        Ok(Evaluation {
            metrics: metrics::evaluate(&labels, &probs),
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
            labels.extend_from_slice(&self.lookup.batch.labels);
            probs.extend_from_slice(&out);
        }
        Ok((labels, probs, stats.bad_lines()))
    }
}
