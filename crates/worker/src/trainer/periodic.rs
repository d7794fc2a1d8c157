//! Evaluation on the test set during training (`--eval-every-steps`, `--eval-every-secs`):
//! between two steps, the model as trained so far scores the test files (with
//! [`Trainer::evaluate`] on a copy of the dense parameters, no rows created), each evaluation
//! logged and recorded in the summary's `evaluations`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sparta_core::config::Job;
use sparta_core::store::SparseStore;
use sparta_core::CoreError;
use sparta_nn::Model;

use super::Trainer;
use crate::summary::{PeriodicEvaluation, Summary};

/// When to evaluate during a run, and on what.
#[derive(Clone, Debug)]
pub(super) struct PeriodicEval {
    test: Vec<PathBuf>,
    every_steps: u64,
    every: Option<Duration>,
    last: Instant,
}

impl PeriodicEval {
    /// An evaluation on `test` after every `every_steps` job steps and every `every_secs`
    /// seconds (0: not by that; `None` when neither is set); an error when one is set without
    /// test files or with a bad interval.
    pub(super) fn new(
        test: &[PathBuf],
        every_steps: u64,
        secs: f64,
    ) -> Result<Option<Self>, CoreError> {
        if !(secs.is_finite() && secs >= 0.0) {
            return Err(CoreError::Config(format!(
                "--eval-every-secs {secs}: expected a number of seconds >= 0"
            )));
        }
        if every_steps == 0 && secs == 0.0 {
            return Ok(None);
        }
        if test.is_empty() {
            return Err(CoreError::Config(
                "--eval-every-steps / --eval-every-secs evaluate on the test files: give --test"
                    .into(),
            ));
        }
        Ok(Some(PeriodicEval {
            test: test.to_vec(),
            every_steps,
            every: (secs > 0.0).then(|| Duration::from_secs_f64(secs)),
            last: Instant::now(),
        }))
    }

    /// Whether an evaluation is due after job step `step`: by steps, or by the time since
    /// the last one (or the start), which [`PeriodicEval::evaluate`] restarts.
    pub(super) fn is_due(&self, step: u64) -> bool {
        let by_steps = self.every_steps > 0 && step.is_multiple_of(self.every_steps);
        by_steps || self.every.is_some_and(|d| self.last.elapsed() >= d)
    }

    /// Evaluates `model` (over `store`'s rows) on the test files after job step `step` with
    /// `train_rows` rows consumed: logs a line and records it in `summary.evaluations`.
    pub(super) fn evaluate(
        &mut self,
        job: &Job,
        store: &Arc<dyn SparseStore>,
        model: &Model,
        step: u64,
        train_rows: u64,
        summary: &mut Summary,
    ) -> Result<(), CoreError> {
        // All of the test files, also on a cluster worker that trains on its part.
        let mut job = job.clone();
        job.reader.part = None;
        let mut eval = Trainer::with_store(job, Arc::clone(store))?;
        eval.model
            .param_values_mut()
            .copy_from_slice(model.param_values());
        let e = eval.evaluate(&self.test)?;
        let r = PeriodicEvaluation::of(step, train_rows, &e);
        tracing::info!(
            "evaluation after step {step} ({train_rows} rows trained): auc {:.4} logloss {:.4} \
             calibration {:.3} on {} test rows ({:.1}s)",
            r.first.auc,
            r.first.logloss,
            r.first.calibration,
            r.rows,
            r.seconds
        );
        summary.evaluations.push(r);
        self.last = Instant::now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_due_by_steps_and_needs_test_files_and_a_good_interval() {
        let test = [PathBuf::from("t.tsv")];
        assert!(PeriodicEval::new(&test, 0, 0.0).unwrap().is_none());
        let p = PeriodicEval::new(&test, 10, 0.0).unwrap().unwrap();
        let due: Vec<u64> = (1..=35).filter(|&s| p.is_due(s)).collect();
        assert_eq!(due, vec![10, 20, 30]);
        // By time only: not before the interval has passed, whatever the step.
        let hourly = PeriodicEval::new(&test, 0, 3600.0).unwrap().unwrap();
        assert!(!(1..=100).any(|s| hourly.is_due(s)));
        let e = PeriodicEval::new(&[], 5, 0.0).unwrap_err().to_string();
        assert!(e.contains("--test"), "{e}");
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(PeriodicEval::new(&test, 0, bad).is_err(), "{bad}");
        }
    }
}
