//! Where the trainer reports progress on long work. The trainer only calls a [`Progress`]
//! handle; drawing (a terminal bar in the CLI) is the caller's concern. [`LogProgress`], the
//! default, writes a log line every few seconds.

use std::time::{Duration, Instant};

/// Receives a training run's progress, by input bytes consumed (so an ETA covers every epoch).
pub trait Progress: Send {
    /// A run starts over `total_bytes` of input (0: unknown size, e.g. a followed directory).
    fn start(&mut self, total_bytes: u64);
    /// Bytes read so far, samples trained so far, the recent loss and a line of stage times.
    fn update(&mut self, bytes: u64, samples: u64, loss: f64, stages: &str);
    /// [`Progress::update`] with the progressive validation of the run: `window` computes the
    /// first task's window metrics (exact over up to `[metrics] window` rows: call it only for
    /// a line that is shown). The default ignores it.
    fn update_with(
        &mut self,
        bytes: u64,
        samples: u64,
        loss: f64,
        stages: &str,
        window: &mut dyn FnMut() -> Option<WindowLine>,
    ) {
        let _ = window;
        self.update(bytes, samples, loss, stages);
    }
    /// The run ended.
    fn finish(&mut self) {}
}

/// Progress as `tracing` info lines, at most one per `every` (5 s by default).
pub struct LogProgress {
    start: Instant,
    last_log: Instant,
    every: Duration,
    total_bytes: u64,
}

impl Default for LogProgress {
    fn default() -> Self {
        Self::every(Duration::from_secs(5))
    }
}

impl LogProgress {
    /// A line at most every `every`.
    pub fn every(every: Duration) -> Self {
        let now = Instant::now();
        Self {
            start: now,
            last_log: now,
            every,
            total_bytes: 0,
        }
    }
}

/// The first task's progressive validation over its window (rows scored before being
/// trained on), as a progress line shows it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowLine {
    /// Exact AUC of the window.
    pub auc: f64,
    /// Log loss of the window.
    pub logloss: f64,
}

/// The message of a progress update: samples/s, loss, the progressive window's AUC and log
/// loss (when given) and the stage line.
pub fn rate_line(
    start: Instant,
    samples: u64,
    loss: f64,
    window: Option<WindowLine>,
    stages: &str,
) -> String {
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let rate = samples as f64 / secs;
    match window {
        Some(w) => format!(
            "{rate:.0} samples/s loss {loss:.4} window auc {:.4} logloss {:.4} | {stages}",
            w.auc, w.logloss
        ),
        None => format!("{rate:.0} samples/s loss {loss:.4} | {stages}"),
    }
}

impl Progress for LogProgress {
    fn start(&mut self, total_bytes: u64) {
        let now = Instant::now();
        self.start = now;
        self.last_log = now;
        self.total_bytes = total_bytes;
    }

    fn update(&mut self, bytes: u64, samples: u64, loss: f64, stages: &str) {
        self.update_with(bytes, samples, loss, stages, &mut || None);
    }

    fn update_with(
        &mut self,
        bytes: u64,
        samples: u64,
        loss: f64,
        stages: &str,
        window: &mut dyn FnMut() -> Option<WindowLine>,
    ) {
        if self.last_log.elapsed() < self.every {
            return;
        }
        self.last_log = Instant::now();
        let msg = rate_line(self.start, samples, loss, window(), stages);
        if self.total_bytes == 0 {
            tracing::info!("train {samples} samples, {msg}");
        } else {
            let pct = 100.0 * bytes.min(self.total_bytes) as f64 / self.total_bytes as f64;
            tracing::info!("train {pct:.1}% {samples} samples, {msg}");
        }
    }
}

/// The input bytes of the rows a reader has handed to training so far: its parsed bytes
/// scaled by the rows delivered over the lines parsed. The parser threads run ahead of
/// training (a queue of batches, chunks being parsed), so their bytes alone put the progress
/// percentage ahead of the rows trained (80 % shown at 55 % of the rows on a small file).
pub fn delivered_bytes(stats: &sparta_data::ReadStats) -> u64 {
    let (bytes, lines) = (stats.bytes(), stats.lines_seen());
    if lines == 0 {
        return 0;
    }
    let rows = stats.rows().min(lines);
    (u128::from(bytes) * u128::from(rows) / u128::from(lines)) as u64
}

/// Reports nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _total_bytes: u64) {}
    fn update(&mut self, _bytes: u64, _samples: u64, _loss: f64, _stages: &str) {}
}
