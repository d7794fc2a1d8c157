//! `sparta.Job`: a job config from a TOML path, TOML text or a dict (as JSON text from the
//! Python side), checked as the CLI checks `--config`: the same messages, naming the field.

use std::path::PathBuf;

use pyo3::prelude::*;
use sparta_core::JobConfig;

use crate::errors::{guard, Error};

/// A validated job config (immutable: `with_overrides` makes a new one).
#[pyclass(module = "sparta._sparta", frozen, name = "Job")]
#[derive(Clone)]
pub struct Job {
    pub(crate) cfg: JobConfig,
}

impl Job {
    /// A job of `cfg` once it validates.
    pub(crate) fn checked(cfg: JobConfig) -> Result<Job, Error> {
        cfg.validate()?;
        Ok(Job { cfg })
    }

    /// The validated job (the trainer's and the readers' settings).
    pub(crate) fn validated(&self) -> Result<sparta_core::Job, Error> {
        Ok(self.cfg.validate()?)
    }
}

/// TOML text of a JSON object (a Python dict): `null` has no TOML form.
fn toml_of_json(text: &str) -> Result<String, Error> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::Value(format!("job dict: {e}")))?;
    if !v.is_object() {
        return Err(Error::Value(
            "a job dict must be a mapping of sections".into(),
        ));
    }
    let t = toml::Value::try_from(&v).map_err(|e| {
        Error::Value(format!(
            "job dict: {e} (None has no TOML form: leave the key out for its default)"
        ))
    })?;
    toml::to_string(&t).map_err(|e| Error::Value(format!("job dict: {e}")))
}

/// `base` with the tables of `over` merged in, key by key (a table into a table; any other
/// value replaces).
fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(b), toml::Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

#[pymethods]
impl Job {
    /// A job from TOML text.
    #[staticmethod]
    fn from_toml(text: &str) -> PyResult<Job> {
        guard(|| Job::checked(JobConfig::from_toml(text)?))
    }

    /// A job from a TOML file.
    #[staticmethod]
    fn from_path(path: PathBuf) -> PyResult<Job> {
        guard(|| {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                Error::Py(pyo3::exceptions::PyOSError::new_err((
                    e.raw_os_error().unwrap_or(0),
                    format!("cannot read config {}: {e}", path.display()),
                    path.display().to_string(),
                )))
            })?;
            let cfg = JobConfig::from_toml(&text)
                .map_err(|e| Error::Value(format!("{}: {e}", path.display())))?;
            Job::checked(cfg).map_err(|e| match e {
                Error::Core(c) => Error::Value(format!("{}: {c}", path.display())),
                e => e,
            })
        })
    }

    /// A job from the JSON text of a dict of sections (`{"model": {"kind": "dcn"}}`).
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Job> {
        guard(|| Job::checked(JobConfig::from_toml(&toml_of_json(text)?)?))
    }

    /// This job with the sections of the JSON dict `text` merged in, key by key.
    fn with_overrides(&self, text: &str) -> PyResult<Job> {
        guard(|| {
            let mut base =
                toml::Value::try_from(&self.cfg).map_err(|e| Error::Value(format!("job: {e}")))?;
            let over: toml::Value = toml::from_str(&toml_of_json(text)?)
                .map_err(|e| Error::Value(format!("overrides: {e}")))?;
            merge(&mut base, over);
            let text = toml::to_string(&base).map_err(|e| Error::Value(format!("job: {e}")))?;
            Job::checked(JobConfig::from_toml(&text)?)
        })
    }

    /// The job as TOML text (what `--config` reads).
    fn to_toml(&self) -> PyResult<String> {
        guard(|| toml::to_string(&self.cfg).map_err(|e| Error::Value(format!("job: {e}"))))
    }

    /// The job as JSON text (every section, defaults included).
    fn to_json(&self) -> PyResult<String> {
        guard(|| serde_json::to_string(&self.cfg).map_err(|e| Error::Value(format!("job: {e}"))))
    }

    /// The input columns: (name, kind) in line order (`label`, `weight`, `dense`, `sparse`,
    /// `multi_sparse`, `ignore`).
    fn columns(&self) -> PyResult<Vec<(String, String)>> {
        guard(|| {
            let job = self.validated()?;
            Ok(job
                .schema
                .columns
                .iter()
                .map(|c| {
                    let kind = serde_json::to_value(&c.kind)
                        .ok()
                        .and_then(|v| v.get("kind").and_then(|k| k.as_str().map(String::from)))
                        .unwrap_or_default();
                    (c.name.clone(), kind)
                })
                .collect())
        })
    }

    /// The model's task names, in output order.
    fn task_names(&self) -> PyResult<Vec<String>> {
        guard(|| Ok(self.validated()?.model.task_names()))
    }

    fn __repr__(&self) -> String {
        let kind = self
            .cfg
            .validate()
            .map_or_else(|_| "?".to_string(), |j| j.model.kind.name().to_string());
        format!("Job(model={kind})")
    }
}
