//! `sparta.Model`: an export loaded for scoring (its newest full version and the deltas after
//! it, as `sparta predict` and `sparta serve` load it), reloadable to the newest version.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use serde_json::{Map, Value};
use sparta_data::parquet::RecordRows;
use sparta_data::LineParser;
use sparta_serve::Snapshot;

use crate::errors::{guard, Error};
use crate::frames::record_batch;
use crate::run::interruptible;

/// Rows scored per call of the dense model.
const CHUNK: usize = 8192;

/// A loaded export.
#[pyclass(module = "sparta._sparta", frozen, name = "Model")]
pub struct Model {
    dir: PathBuf,
    snap: RwLock<Arc<Snapshot>>,
}

/// Loads the newest export chain of `dir`, warning when newer versions cannot be reached.
fn load(dir: &std::path::Path) -> Result<Snapshot, Error> {
    let (snap, chain) = Snapshot::load_latest_checked(dir)?;
    if let Some(st) = chain.stale() {
        tracing::warn!(
            "scoring with export version {} although versions up to {} exist in {}: they \
             cannot be reached ({})",
            snap.version(),
            st.newest_on_disk,
            dir.display(),
            st.reason
        );
    }
    Ok(snap)
}

/// Probabilities as native-endian f32 bytes (a mutable buffer numpy wraps without a copy).
fn probabilities(py: Python<'_>, probs: &[f32]) -> Py<PyByteArray> {
    let bytes: Vec<u8> = probs.iter().flat_map(|p| p.to_ne_bytes()).collect();
    PyByteArray::new(py, &bytes).unbind()
}

impl Model {
    fn current(&self) -> Arc<Snapshot> {
        Arc::clone(&self.snap.read().unwrap_or_else(|p| p.into_inner()))
    }
}

#[pymethods]
impl Model {
    /// Loads the export in `dir`.
    #[new]
    fn new(py: Python<'_>, dir: PathBuf) -> PyResult<Model> {
        guard(|| {
            let snap = interruptible(py, None, || load(&dir))?;
            Ok(Model {
                dir,
                snap: RwLock::new(Arc::new(snap)),
            })
        })
    }

    /// Loads the newest version of the export directory if it is newer than the one held;
    /// returns whether it was.
    fn reload(&self, py: Python<'_>) -> PyResult<bool> {
        guard(|| {
            let held = self.current().version();
            let snap = interruptible(py, None, || load(&self.dir))?;
            if snap.version() == held {
                return Ok(false);
            }
            *self.snap.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(snap);
            Ok(true)
        })
    }

    /// Scores an Arrow record batch (columns by the job's names; labels not needed): returns
    /// (probabilities as f32 bytes, rows, tasks), `nan` for a row that does not parse.
    fn predict_arrow(
        &self,
        py: Python<'_>,
        batch: &Bound<'_, PyAny>,
    ) -> PyResult<(Py<PyByteArray>, usize, usize)> {
        let rb = record_batch(batch)?;
        guard(|| {
            let snap = self.current();
            let probs = interruptible(py, None, || {
                let job = snap.job();
                let parser = LineParser::for_plan(&job.schema, job.reader.plan.as_deref());
                let rows = RecordRows::for_scoring(parser, &job.schema);
                let tasks = snap.task_names().len();
                let mut out = vec![f32::NAN; rb.num_rows() * tasks];
                let mut bad = 0usize;
                let mut first_bad = None;
                let mut b = rows.parser().builder(CHUNK);
                for start in (0..rb.num_rows()).step_by(CHUNK) {
                    let len = CHUNK.min(rb.num_rows() - start);
                    let chunk = rb.slice(start, len);
                    let got = rows.append(&chunk, &mut b, |r, why, _| {
                        first_bad.get_or_insert_with(|| format!("row {}: {why}", start + r));
                    })?;
                    bad += got.bad.len();
                    let p = snap.predict(b.take());
                    let mut p = p.chunks_exact(tasks);
                    let mut bad_rows = got.bad.iter().peekable();
                    for r in 0..len {
                        if bad_rows.next_if_eq(&&r).is_some() {
                            continue;
                        }
                        let row = p.next().expect("one probability per task per good row");
                        let at = (start + r) * tasks;
                        out[at..at + tasks].copy_from_slice(row);
                    }
                }
                if bad > 0 {
                    tracing::warn!(
                        "{bad} of {} rows did not parse (scored nan), first: {}",
                        rb.num_rows(),
                        first_bad.unwrap_or_default()
                    );
                }
                Ok((out, tasks))
            })?;
            let (out, tasks) = probs;
            Ok((probabilities(py, &out), rb.num_rows(), tasks))
        })
    }

    /// Scores rows given as the JSON text of a list of dicts (fields by column name, absent or
    /// None: missing), as `sparta serve` does; a bad row is a `ValueError`.
    fn predict_json(
        &self,
        py: Python<'_>,
        text: &str,
    ) -> PyResult<(Py<PyByteArray>, usize, usize)> {
        guard(|| {
            let snap = self.current();
            let (out, rows, tasks) = interruptible(py, None, || {
                let rows: Vec<Map<String, Value>> = serde_json::from_str(text)
                    .map_err(|e| Error::Value(format!("rows: expected a list of dicts: {e}")))?;
                let batch = snap
                    .requests()
                    .rows(&rows)
                    .map_err(|e| Error::Value(e.to_string()))?;
                Ok((snap.predict(batch), rows.len(), snap.task_names().len()))
            })?;
            Ok((probabilities(py, &out), rows, tasks))
        })
    }

    /// Logical tables: name -> (rows, dim, physical table, rows of first-order weights or
    /// None).
    #[allow(clippy::type_complexity)]
    fn tables(&self) -> Vec<(String, u64, usize, String, Option<u64>)> {
        let snap = self.current();
        let f = &snap.job().features;
        let rows_of = |physical: usize, tag: u8| {
            snap.tables()
                .by_name(&f.physical[physical].config.name)
                .map_or(0, |m| m.rows_of_tag(tag))
        };
        f.tables
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    rows_of(t.physical, t.tag),
                    t.dim,
                    f.physical[t.physical].config.name.clone(),
                    f.wide_table.filter(|_| t.wide).map(|w| rows_of(w, t.tag)),
                )
            })
            .collect()
    }

    /// The task names, in output order.
    fn task_names(&self) -> Vec<String> {
        self.current().task_names()
    }

    /// The export version held.
    #[getter]
    fn version(&self) -> u64 {
        self.current().version()
    }

    /// The training step of the version held.
    #[getter]
    fn step(&self) -> u64 {
        self.current().step()
    }

    /// The job the export was trained with, as TOML text.
    #[getter]
    fn job_toml(&self) -> String {
        self.current().job_text().to_string()
    }

    /// The export directory.
    #[getter]
    fn dir(&self) -> PathBuf {
        self.dir.clone()
    }
}
