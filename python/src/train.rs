//! `sparta.Trainer`: an embedded trainer (fresh or resumed from a checkpoint) that trains once
//! on files or on frames handed in from Python, and evaluates on either.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use sparta_core::CoreError;
use sparta_data::parquet::{FrameBatches, RecordRows};
use sparta_data::{Batch, DataError, LineParser};
use sparta_worker::{Evaluation, ExportHook, RunOptions};
use std::sync::Mutex;

use crate::errors::{guard, Error};
use crate::frames::{take, PyFrames, Raised};
use crate::job::Job;
use crate::log::PyProgress;
use crate::run::interruptible;

/// An embedded trainer: tables and the dense model in this process.
#[pyclass(module = "sparta._sparta", name = "Trainer")]
pub struct Trainer {
    inner: Mutex<sparta_worker::Trainer>,
    job: sparta_core::Job,
    trained: AtomicBool,
}

/// Where the training or test rows come from.
enum Input {
    Files(Vec<PathBuf>),
    Frames(Py<PyAny>),
}

impl Input {
    fn of(files: Vec<PathBuf>, frames: Option<Py<PyAny>>, what: &str) -> Result<Input, Error> {
        match (files.is_empty(), frames) {
            (false, None) => Ok(Input::Files(files)),
            (true, Some(f)) => Ok(Input::Frames(f)),
            (true, None) => Err(Error::Value(format!(
                "{what}: no files and no frames given"
            ))),
            (false, Some(_)) => Err(Error::Value(format!(
                "{what}: give files or frames, not both"
            ))),
        }
    }
}

/// The batches of frames for `job` (the reader's batch size, bad-row ratio and row limit) and
/// their counters.
fn frame_batches(
    job: &sparta_core::Job,
    frames: Py<PyAny>,
    raised: &Raised,
    max_rows: Option<u64>,
) -> FrameBatches<PyFrames> {
    let parser = LineParser::for_plan(&job.schema, job.reader.plan.as_deref());
    FrameBatches::new(
        RecordRows::new(parser),
        PyFrames::new(frames, Arc::clone(raised)),
        job.reader.batch_size,
        job.reader.max_bad_line_ratio,
        max_rows,
    )
}

/// Runs `consume` on the batches of `frames` parsed on a second thread, a few batches ahead
/// (as the file reader's parser threads are).
fn with_frames<T>(
    job: &sparta_core::Job,
    frames: Py<PyAny>,
    raised: &Raised,
    max_rows: Option<u64>,
    consume: impl FnOnce(
        crossbeam_channel::IntoIter<Result<Batch, DataError>>,
        Arc<sparta_data::ReadStats>,
    ) -> Result<T, CoreError>,
) -> Result<T, Error> {
    let batches = frame_batches(job, frames, raised, max_rows);
    let stats = batches.stats();
    let depth = job.reader.queue_batches.max(2);
    let r = std::thread::scope(|s| {
        let (tx, rx) = crossbeam_channel::bounded(depth);
        std::thread::Builder::new()
            .name("sparta-frames".into())
            .spawn_scoped(s, move || {
                for b in batches {
                    if tx.send(b).is_err() {
                        break; // training stopped
                    }
                }
            })
            .map_err(|e| CoreError::Training(format!("starting the frame reader: {e}")))?;
        consume(rx.into_iter(), stats)
    });
    match (r, take(raised)) {
        (_, Some(e)) => Err(Error::Py(e)),
        (r, None) => Ok(r?),
    }
}

fn metrics_json(e: &Evaluation) -> serde_json::Value {
    let task = |m: &sparta_worker::TaskEvaluation| {
        let s = &m.metrics;
        let mut v = serde_json::json!({
            "auc": s.auc,
            "logloss": s.logloss,
            "positive_rate": s.positive_rate,
            "calibration": s.calibration,
            "rows": s.rows,
        });
        if let Some((g, groups)) = s.gauc {
            v["gauc"] = g.into();
            v["gauc_groups"] = groups.into();
        }
        (m.name.clone(), v)
    };
    let tasks: serde_json::Map<String, serde_json::Value> = e.tasks.iter().map(task).collect();
    let mut out = task(&e.tasks[0]).1;
    out["tasks"] = tasks.into();
    out["bad_lines"] = e.bad_lines.into();
    out["seconds"] = e.seconds.into();
    out
}

impl Trainer {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, sparta_worker::Trainer>, Error> {
        self.inner.try_lock().map_err(|_| {
            Error::Py(PyRuntimeError::new_err(
                "the trainer is busy (one call at a time)",
            ))
        })
    }

    fn evaluate_input(
        &self,
        t: &mut sparta_worker::Trainer,
        input: Input,
        raised: &Raised,
    ) -> Result<Evaluation, Error> {
        match input {
            Input::Files(paths) => Ok(t.evaluate(&paths)?),
            Input::Frames(f) => with_frames(&self.job, f, raised, None, |it, stats| {
                t.evaluate_batches(it, &stats)
            }),
        }
    }
}

#[pymethods]
impl Trainer {
    /// A trainer for `job`; with `resume`, restored from the newest valid checkpoint there
    /// (none there is an error unless `resume_if_present`).
    #[new]
    #[pyo3(signature = (job, resume=None, resume_if_present=false))]
    fn new(
        py: Python<'_>,
        job: &Job,
        resume: Option<PathBuf>,
        resume_if_present: bool,
    ) -> PyResult<Trainer> {
        let mut cfg = job.cfg.clone();
        if let Some(dir) = &resume {
            cfg.train.checkpoint_dir.get_or_insert_with(|| dir.clone());
        }
        guard(|| {
            let job = Job::checked(cfg)?.validated()?;
            let policy = if resume_if_present {
                sparta_checkpoint::ResumePolicy::IfPresent
            } else {
                sparta_checkpoint::ResumePolicy::Required
            };
            let j = job.clone();
            let t = interruptible(py, None, move || {
                let export = j.raw.export.clone();
                let members = j.features.members();
                let mut t = match &resume {
                    Some(dir) => sparta_worker::Trainer::embedded_resume(j, dir, policy)?,
                    None => sparta_worker::Trainer::embedded(j)?,
                };
                if export.dir.is_some() {
                    t.add_hook(Box::new(ExportHook::open(&export, members)?))?;
                }
                Ok(t)
            })?;
            Ok(Trainer {
                inner: Mutex::new(t),
                job,
                trained: AtomicBool::new(false),
            })
        })
    }

    /// Trains once (on `files`, or on the Python iterator `frames` of Arrow record batches),
    /// then evaluates on the test files or frames when given. Returns the summary as JSON.
    #[pyo3(signature = (files=Vec::new(), frames=None, test_files=Vec::new(), test_frames=None, progress=None, progress_every=1.0, log_progress=true))]
    #[allow(clippy::too_many_arguments)]
    fn train(
        &self,
        py: Python<'_>,
        files: Vec<PathBuf>,
        frames: Option<Py<PyAny>>,
        test_files: Vec<PathBuf>,
        test_frames: Option<Py<PyAny>>,
        progress: Option<Py<PyAny>>,
        progress_every: f64,
        log_progress: bool,
    ) -> PyResult<String> {
        guard(|| {
            let input = Input::of(files, frames, "train")?;
            let test = match (test_files.is_empty(), test_frames) {
                (true, None) => None,
                (f, t) => Some(Input::of(
                    if f { Vec::new() } else { test_files },
                    t,
                    "test",
                )?),
            };
            if !(progress_every.is_finite() && progress_every >= 0.0) {
                return Err(Error::Value(format!(
                    "progress_every {progress_every}: expected seconds >= 0"
                )));
            }
            if self.trained.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::Py(PyRuntimeError::new_err(
                    "this Trainer has trained already: make a new one (resume=CHECKPOINT_DIR \
                     continues from its checkpoint)",
                )));
            }
            let mut t = self.lock()?;
            let stop = Arc::new(AtomicBool::new(false));
            let raised = Raised::default();
            t.stop_on(Arc::clone(&stop));
            t.set_progress(Box::new(PyProgress::new(
                log_progress,
                progress,
                Duration::from_secs_f64(progress_every),
                Arc::clone(&raised),
                Arc::clone(&stop),
            )));
            let opts = RunOptions {
                progress: true,
                ..RunOptions::default()
            };
            let j = &self.job;
            let what = match &input {
                Input::Files(p) => format!("{} file(s)", p.len()),
                Input::Frames(_) => "frames".to_string(),
            };
            tracing::info!(
                "training {} on {what}, batch {}, {} thread(s)",
                j.model.kind.name(),
                j.reader.batch_size,
                j.threads
            );
            let t = &mut *t;
            let summary = interruptible(py, Some(&stop), || {
                let mut summary = match input {
                    Input::Files(paths) => t.run(&RunOptions {
                        train: paths,
                        ..opts
                    })?,
                    Input::Frames(f) => {
                        let max_rows = self.job.reader.max_rows;
                        with_frames(&self.job, f, &raised, max_rows, |it, stats| {
                            t.run_batches(it, stats, &opts)
                        })?
                    }
                };
                if let Some(e) = take(&raised) {
                    return Err(Error::Py(e));
                }
                if let Some(test) = test {
                    let e = self.evaluate_input(t, test, &raised)?;
                    summary.record_eval(&e);
                }
                serde_json::to_string(&summary).map_err(|e| Error::Value(format!("summary: {e}")))
            })?;
            Ok(summary)
        })
    }

    /// Metrics of the current model on `files` or `frames` (as JSON): AUC, log loss, positive
    /// rate, calibration, GAUC (with `train.gauc_by`), per task under `tasks`.
    #[pyo3(signature = (files=Vec::new(), frames=None))]
    fn evaluate(
        &self,
        py: Python<'_>,
        files: Vec<PathBuf>,
        frames: Option<Py<PyAny>>,
    ) -> PyResult<String> {
        guard(|| {
            let input = Input::of(files, frames, "evaluate")?;
            let mut t = self.lock()?;
            let t = &mut *t;
            let raised = Raised::default();
            interruptible(py, None, || {
                let e = self.evaluate_input(t, input, &raised)?;
                Ok(metrics_json(&e).to_string())
            })
        })
    }

    /// The job, validated.
    #[getter]
    fn job_toml(&self) -> String {
        toml::to_string(&self.job.raw).unwrap_or_default()
    }
}
