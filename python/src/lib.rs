//! `sparta._sparta`: the Rust side of the Python package `sparta` (see `python/README`
//! section of the repository README and `sparta/__init__.py` for the Python API).
//!
//! * [`job`] - `Job`: a config from TOML text, a path or a dict, validated as the CLI does;
//! * [`train`] - `Trainer`: training on files or frames, evaluation;
//! * [`frames`] - Arrow record batches from Python (C Data Interface, no copy);
//! * [`predict`] - `Model`: an export for scoring, reloadable;
//! * [`checkpoint`] - checkpoint inspection;
//! * [`cluster`] - `train_worker`: a PS-cluster worker (the CLI's `sparta worker`);
//! * [`run`] - work off the Python thread: GIL released, Ctrl-C, panics caught;
//! * [`log`] - `tracing` into Python `logging`, progress callbacks;
//! * [`errors`] - the one Rust error -> Python exception mapping.

mod checkpoint;
mod cluster;
mod errors;
mod frames;
mod job;
mod log;
mod predict;
mod run;
mod train;

use pyo3::prelude::*;

#[pymodule]
fn _sparta(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log::install();
    m.add_class::<job::Job>()?;
    m.add_class::<train::Trainer>()?;
    m.add_class::<predict::Model>()?;
    m.add_function(wrap_pyfunction!(checkpoint::inspect_checkpoints, m)?)?;
    m.add_function(wrap_pyfunction!(cluster::train_worker, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
