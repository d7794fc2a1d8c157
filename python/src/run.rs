//! Rust work run off the Python thread: the GIL released, a panic caught, and Ctrl-C turned
//! into the trainer's stop flag (the step finishes and the final checkpoint is written, as
//! SIGINT does for the CLI), then raised as `KeyboardInterrupt`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::{panic_message, Error};

/// How often the waiting Python thread looks for a pending signal.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// Runs `work` on a worker thread with the GIL released while this (Python) thread waits,
/// looking for signals every 100 ms. A signal whose handler raises (Ctrl-C:
/// `KeyboardInterrupt`) sets `stop` (when given); the work then ends as it does on a stop
/// request and the exception is raised once it has. A panic becomes a `RuntimeError`.
pub fn interruptible<T: Send>(
    py: Python<'_>,
    stop: Option<&Arc<AtomicBool>>,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> Result<T, Error> {
    py.detach(|| {
        std::thread::scope(|s| {
            let (done, finished) = crossbeam_channel::bounded::<()>(1);
            let handle = std::thread::Builder::new()
                .name("sparta-py".into())
                .spawn_scoped(s, move || {
                    let r = catch_unwind(AssertUnwindSafe(work));
                    let _ = done.send(());
                    r
                })
                .map_err(|e| {
                    Error::Py(PyRuntimeError::new_err(format!("starting a thread: {e}")))
                })?;
            let mut interrupted: Option<PyErr> = None;
            loop {
                match finished.recv_timeout(SIGNAL_POLL) {
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => {
                        if interrupted.is_some() {
                            continue;
                        }
                        if let Err(e) = Python::attach(|py| py.check_signals()) {
                            match stop {
                                Some(flag) => {
                                    tracing::warn!(
                                        "interrupted: finishing the current step, then the \
                                         final checkpoint and export"
                                    );
                                    flag.store(true, Ordering::Relaxed);
                                }
                                None => tracing::warn!("interrupted: finishing the current call"),
                            }
                            interrupted = Some(e);
                        }
                    }
                }
            }
            let r = match handle.join() {
                Ok(Ok(r)) => r,
                Ok(Err(p)) | Err(p) => Err(Error::Py(PyRuntimeError::new_err(format!(
                    "internal error in sparta (please report it): {}",
                    panic_message(p.as_ref())
                )))),
            };
            match interrupted {
                Some(e) => Err(Error::Py(e)),
                None => r,
            }
        })
    })
}
