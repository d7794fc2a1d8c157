//! One mapping from the Rust errors to Python exceptions, and the guard that keeps a panic
//! from crossing into Python.
//!
//! `ValueError`: a job, argument or frame that is wrong (the message names the field or
//! column; for a cluster worker also a token, TLS setting or option that does not fit the
//! cluster); `FileNotFoundError` / `OSError`: files; `KeyboardInterrupt`: Ctrl-C;
//! `RuntimeError`: everything else (training failures, unreachable shards, corrupt
//! checkpoints, internal errors).

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::PyErr;
use sparta_checkpoint::CheckpointError;
use sparta_cluster::ClusterError;
use sparta_core::CoreError;
use sparta_data::DataError;
use sparta_proto::ProtoError;
use sparta_serve::ServeError;

/// A Rust error of the package, kept until it becomes a Python exception.
#[derive(Debug)]
pub enum Error {
    /// From the training core (config, data, tables, checkpoints).
    Core(CoreError),
    /// From serving (loading an export).
    Serve(ServeError),
    /// From checkpoint storage.
    Checkpoint(CheckpointError),
    /// From a PS-cluster worker (connecting, the ring, checkpoint rounds, training).
    Cluster(ClusterError),
    /// A wrong argument; the message names it.
    Value(String),
    /// A Python exception raised by user code (a frame iterator, a progress callback).
    Py(PyErr),
}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Self {
        Error::Core(e)
    }
}

impl From<DataError> for Error {
    fn from(e: DataError) -> Self {
        Error::Core(CoreError::Data(e))
    }
}

impl From<ServeError> for Error {
    fn from(e: ServeError) -> Self {
        Error::Serve(e)
    }
}

impl From<CheckpointError> for Error {
    fn from(e: CheckpointError) -> Self {
        Error::Checkpoint(e)
    }
}

impl From<ClusterError> for Error {
    fn from(e: ClusterError) -> Self {
        match e {
            // Training errors keep the one mapping of the core's.
            ClusterError::Core(c) => Error::Core(c),
            ClusterError::Checkpoint(c) => Error::Checkpoint(c),
            e => Error::Cluster(e),
        }
    }
}

impl From<PyErr> for Error {
    fn from(e: PyErr) -> Self {
        Error::Py(e)
    }
}

fn data(e: &DataError) -> PyErr {
    let msg = e.to_string();
    match e {
        DataError::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        DataError::IsDirectory { .. } | DataError::Io { .. } => PyOSError::new_err(msg),
        DataError::Frame(_)
        | DataError::Schema(_)
        | DataError::Config(_)
        | DataError::TooManyBadLines { .. } => PyValueError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

fn checkpoint(e: &CheckpointError) -> PyErr {
    let msg = e.to_string();
    match e {
        CheckpointError::NotFound(_) => PyFileNotFoundError::new_err(msg),
        CheckpointError::Io { .. } | CheckpointError::CreateDir { .. } => PyOSError::new_err(msg),
        CheckpointError::Usage(_) | CheckpointError::InvalidName(_) => PyValueError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

fn core(e: &CoreError) -> PyErr {
    match e {
        CoreError::Config(_) => PyValueError::new_err(e.to_string()),
        CoreError::Data(d) => data(d),
        CoreError::Io { .. } => PyOSError::new_err(e.to_string()),
        CoreError::Checkpoint(c) => checkpoint(c),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

fn cluster(e: &ClusterError) -> PyErr {
    let msg = e.to_string();
    match e {
        ClusterError::Core(c) => core(c),
        ClusterError::Checkpoint(c) => checkpoint(c),
        ClusterError::Proto(ProtoError::Io { .. }) | ClusterError::Io { .. } => {
            PyOSError::new_err(msg)
        }
        ClusterError::Proto(_) | ClusterError::Setup(_) => PyValueError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::Core(e) => core(&e),
            Error::Serve(ServeError::Core(c)) => core(&c),
            Error::Serve(ServeError::Checkpoint(c)) => checkpoint(&c),
            Error::Serve(e @ ServeError::NoExport(_)) => {
                PyFileNotFoundError::new_err(e.to_string())
            }
            Error::Serve(e @ ServeError::Usage(_)) => PyValueError::new_err(e.to_string()),
            Error::Serve(e) => PyRuntimeError::new_err(e.to_string()),
            Error::Checkpoint(e) => checkpoint(&e),
            Error::Cluster(e) => cluster(&e),
            Error::Value(m) => PyValueError::new_err(m),
            Error::Py(e) => e,
        }
    }
}

/// Runs `f`, turning a panic into a `RuntimeError` (never a `PanicException`, which Python
/// code does not expect and `except Exception` does not catch).
pub fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, PyErr> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(PyErr::from),
        Err(p) => Err(PyRuntimeError::new_err(format!(
            "internal error in sparta (please report it): {}",
            panic_message(p.as_ref())
        ))),
    }
}

/// The text of a panic payload.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}
