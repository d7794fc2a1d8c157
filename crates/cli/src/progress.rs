//! Progress on long work: a bar with samples/s, loss and ETA when stderr is a terminal, the
//! trainer's plain log lines otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use sparta_worker::progress::rate_line;
use sparta_worker::{LogProgress, Progress, WindowLine};

/// The trainer's progress handle for this process: a bar on a terminal, log lines otherwise
/// (one every `every_secs`, default 5 s: `--progress-every-secs`).
pub fn for_stderr(every_secs: Option<f64>) -> anyhow::Result<Box<dyn Progress>> {
    if std::io::stderr().is_terminal() {
        return Ok(Box::new(Bar::default()));
    }
    Ok(Box::new(match every_secs {
        Some(s) if s.is_finite() && s > 0.0 => LogProgress::every(Duration::from_secs_f64(s)),
        Some(s) => anyhow::bail!("--progress-every-secs {s}: expected a number of seconds > 0"),
        None => LogProgress::default(),
    }))
}

/// How often the bar recomputes the progressive window's metrics (exact over the window's
/// rows, so not at every step).
const WINDOW_EVERY: Duration = Duration::from_secs(1);

/// A terminal bar by input bytes consumed (so the ETA covers every epoch).
struct Bar {
    bar: Option<ProgressBar>,
    start: Instant,
    total_bytes: u64,
    /// The window metrics shown and when they were computed.
    window: Option<WindowLine>,
    window_at: Option<Instant>,
}

impl Default for Bar {
    fn default() -> Self {
        Self {
            bar: None,
            start: Instant::now(),
            total_bytes: 0,
            window: None,
            window_at: None,
        }
    }
}

impl Progress for Bar {
    /// `total_bytes == 0` means an input of unknown size (a followed directory): no percentage
    /// and no ETA.
    fn start(&mut self, total_bytes: u64) {
        let bar = ProgressBar::new(total_bytes.max(1));
        let template = if total_bytes == 0 {
            "{spinner} [{elapsed_precise}] {msg}"
        } else {
            "{spinner} [{elapsed_precise}] {wide_bar} {percent}% ETA {eta} {msg}"
        };
        bar.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        self.bar = Some(bar);
        self.start = Instant::now();
        self.total_bytes = total_bytes;
        self.window = None;
        self.window_at = None;
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
        let Some(bar) = &self.bar else {
            return;
        };
        if self.window_at.is_none_or(|t| t.elapsed() >= WINDOW_EVERY) {
            self.window_at = Some(Instant::now());
            self.window = window();
        }
        bar.set_position(bytes.min(self.total_bytes));
        bar.set_message(rate_line(self.start, samples, loss, self.window, stages));
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
