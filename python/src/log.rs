//! Rust logs and training progress into Python: `tracing` events go to the `logging` logger
//! `sparta` (level INFO and up, or as `SPARTA_LOG` says, e.g. `SPARTA_LOG=debug`); progress
//! goes to those log lines and, when given, to a callback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use sparta_worker::{LogProgress, Progress};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::frames::{keep, Raised};

/// Sends every event to `logging.getLogger("sparta")` (the GIL taken per event).
struct ToPythonLogging;

/// The message of an event, with its other fields as `key=value`.
#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for ToPythonLogging {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => 40,
            tracing::Level::WARN => 30,
            tracing::Level::INFO => 20,
            tracing::Level::DEBUG => 10,
            tracing::Level::TRACE => 5,
        };
        let mut m = Message::default();
        event.record(&mut m);
        Python::attach(|py| {
            let r = py
                .import("logging")
                .and_then(|l| l.call_method1("getLogger", ("sparta",)))
                .and_then(|l| l.call_method1("log", (level, m.0)));
            if let Err(e) = r {
                e.print(py);
            }
        });
    }
}

/// Installs the forwarding once per process (a second call, or another subscriber already
/// installed, leaves things as they are).
pub fn install() {
    let filter = EnvFilter::try_from_env("SPARTA_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::registry()
        .with(ToPythonLogging.with_filter(filter))
        .try_init();
}

/// Progress of a training run: log lines (every 5 s, as the CLI's `--quiet`-less runs
/// without a terminal) and a Python callback with a dict at most every `every`.
pub struct PyProgress {
    log: Option<LogProgress>,
    callback: Option<Py<PyAny>>,
    every: Duration,
    start: Instant,
    last: Option<Instant>,
    last_update: (u64, u64, f64),
    raised: Raised,
    stop: Arc<AtomicBool>,
}

impl PyProgress {
    /// Progress to the log (`log`) and to `callback`; an exception the callback raises stops
    /// training (after the step) and is kept in `raised`.
    pub fn new(
        log: bool,
        callback: Option<Py<PyAny>>,
        every: Duration,
        raised: Raised,
        stop: Arc<AtomicBool>,
    ) -> Self {
        PyProgress {
            log: log.then(LogProgress::default),
            callback,
            every,
            start: Instant::now(),
            last: None,
            last_update: (0, 0, f64::NAN),
            raised,
            stop,
        }
    }

    fn call(&mut self, done: bool) {
        let Some(cb) = self.callback.take() else {
            return;
        };
        let (bytes, samples, loss) = self.last_update;
        let secs = self.start.elapsed().as_secs_f64();
        Python::attach(|py| {
            let r = (|| -> PyResult<()> {
                let d = PyDict::new(py);
                d.set_item("samples", samples)?;
                d.set_item("loss", loss)?;
                d.set_item("bytes", bytes)?;
                d.set_item("seconds", secs)?;
                d.set_item("samples_per_sec", samples as f64 / secs.max(1e-9))?;
                d.set_item("done", done)?;
                cb.call1(py, (d,))?;
                Ok(())
            })();
            match r {
                Ok(()) => self.callback = Some(cb),
                Err(e) => {
                    // No more calls: training stops after this step.
                    keep(&self.raised, e);
                    self.stop.store(true, Ordering::Relaxed);
                }
            }
        });
    }
}

impl Progress for PyProgress {
    fn start(&mut self, total_bytes: u64) {
        self.start = Instant::now();
        if let Some(l) = &mut self.log {
            l.start(total_bytes);
        }
    }

    fn update(&mut self, bytes: u64, samples: u64, loss: f64, stages: &str) {
        if let Some(l) = &mut self.log {
            l.update(bytes, samples, loss, stages);
        }
        self.last_update = (bytes, samples, loss);
        if self.last.is_none_or(|t| t.elapsed() >= self.every) {
            self.last = Some(Instant::now());
            self.call(false);
        }
    }

    fn finish(&mut self) {
        if let Some(l) = &mut self.log {
            l.finish();
        }
        self.call(true);
    }
}
