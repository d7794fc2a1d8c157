//! Progress on long work: a bar with samples/s, loss and ETA on a terminal, plain log lines
//! otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Reports training progress by input bytes consumed (so the ETA covers every epoch).
pub struct Progress {
    bar: Option<ProgressBar>,
    start: Instant,
    last_log: Instant,
    every: Duration,
    total_bytes: u64,
}

impl Progress {
    /// A bar when stderr is a terminal and `enabled`, log lines every few seconds otherwise.
    /// `total_bytes == 0` means an input of unknown size (a followed directory): no percentage
    /// and no ETA.
    pub fn new(total_bytes: u64, enabled: bool) -> Self {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(total_bytes.max(1));
            let template = if total_bytes == 0 {
                "{spinner} [{elapsed_precise}] {msg}"
            } else {
                "{spinner} [{elapsed_precise}] {wide_bar} {percent}% ETA {eta} {msg}"
            };
            bar.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        let now = Instant::now();
        Self {
            bar,
            start: now,
            last_log: now,
            every: Duration::from_secs(5),
            total_bytes,
        }
    }

    /// Updates with bytes read so far, samples trained so far, the recent loss and a stage line.
    pub fn update(&mut self, bytes: u64, samples: u64, loss: f64, stages: &str) {
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let rate = samples as f64 / secs;
        let msg = format!("{rate:.0} samples/s loss {loss:.4} | {stages}");
        if let Some(bar) = &self.bar {
            bar.set_position(bytes.min(self.total_bytes));
            bar.set_message(msg);
        } else if self.last_log.elapsed() >= self.every {
            self.last_log = Instant::now();
            if self.total_bytes == 0 {
                tracing::info!("train {samples} samples, {msg}");
            } else {
                let pct = 100.0 * bytes as f64 / self.total_bytes as f64;
                tracing::info!("train {pct:.1}% {samples} samples, {msg}");
            }
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
