//! Checkpoint inspection: every checkpoint of a directory, its files verified, and the one a
//! restore would use (`sparta checkpoint inspect --json`).

use std::path::PathBuf;

use pyo3::prelude::*;
use sparta_checkpoint::{inspect, open_dir};

use crate::errors::{guard, Error};
use crate::run::interruptible;

/// The inspection report of the checkpoint directory `dir` as JSON.
#[pyfunction]
pub fn inspect_checkpoints(py: Python<'_>, dir: PathBuf) -> PyResult<String> {
    guard(|| {
        if !dir.to_string_lossy().contains("://") && !dir.is_dir() {
            return Err(Error::Py(pyo3::exceptions::PyFileNotFoundError::new_err(
                format!("{} is not a directory", dir.display()),
            )));
        }
        interruptible(py, None, || {
            let storage = open_dir(&dir)?;
            let report = inspect(storage.as_ref())?;
            serde_json::to_string(&report).map_err(|e| Error::Value(format!("report: {e}")))
        })
    })
}
