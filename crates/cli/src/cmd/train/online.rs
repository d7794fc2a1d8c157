//! The online parts of `sparta train`: serving exports as a step hook, and SIGINT/SIGTERM
//! turning into a graceful stop (finish the step, checkpoint, export, exit 0).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sparta_core::config::ExportConfig;
use sparta_core::CoreError;
use sparta_serve::{ExportKind, ExportOptions, Exporter};
use sparta_worker::{ExportReport, HookContext, StepHook, Summary};

/// Writes a serving export every `every_steps` steps and/or `every` seconds, and once at the
/// end of training (unless the last step was just exported).
pub struct ExportHook {
    exporter: Exporter,
    every_steps: u64,
    every: Option<Duration>,
    last_export: Instant,
    last_step: Option<u64>,
    report: ExportReport,
}

impl ExportHook {
    /// Opens the export directory of `cfg` (which must name one).
    /// `members`: the job's logical tables per physical table, recorded in every export.
    pub fn open(cfg: &ExportConfig, members: sparta_checkpoint::Members) -> Result<ExportHook> {
        let dir = cfg.dir.as_deref().context("no export directory")?;
        let mut exporter = Exporter::open(dir, ExportOptions::from(cfg))
            .with_context(|| format!("opening the export directory {}", dir.display()))?;
        exporter.set_members(members);
        tracing::info!(
            "exporting to {} (next version {}){}{}",
            dir.display(),
            exporter.next_version(),
            if cfg.every_steps > 0 {
                format!(", every {} steps", cfg.every_steps)
            } else {
                String::new()
            },
            if cfg.every_secs > 0.0 {
                format!(", every {} s", cfg.every_secs)
            } else {
                String::new()
            }
        );
        Ok(ExportHook {
            exporter,
            every_steps: cfg.every_steps,
            every: (cfg.every_secs > 0.0).then(|| Duration::from_secs_f64(cfg.every_secs)),
            last_export: Instant::now(),
            last_step: None,
            report: ExportReport {
                dir: dir.display().to_string(),
                ..ExportReport::default()
            },
        })
    }

    fn export(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        let tables = ctx.table_refs();
        let info = self
            .exporter
            .export(ctx.job_toml, ctx.model, &tables, ctx.step)
            .map_err(|e| CoreError::Training(format!("export at step {}: {e}", ctx.step)))?;
        self.last_export = Instant::now();
        self.last_step = Some(ctx.step);
        let r = &mut self.report;
        r.count += 1;
        r.last_version = Some(info.version);
        r.full += u64::from(info.kind == ExportKind::Full);
        r.seconds += info.seconds;
        tracing::debug!(
            "export v{} ({:?}) at step {}: {} rows, {} removed, {} bytes in {:.2}s",
            info.version,
            info.kind,
            ctx.step,
            info.rows,
            info.removed,
            info.bytes,
            info.seconds
        );
        Ok(())
    }
}

impl StepHook for ExportHook {
    fn due(&mut self, step: u64) -> bool {
        // Asked again at the same step while the input waits: nothing new to export.
        if self.last_step == Some(step) {
            return false;
        }
        (self.every_steps > 0 && step.is_multiple_of(self.every_steps))
            || self.every.is_some_and(|d| self.last_export.elapsed() >= d)
    }

    fn after_step(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        self.export(ctx)
    }

    fn finish(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        if self.last_step == Some(ctx.step) {
            return Ok(());
        }
        self.export(ctx)
    }

    fn summarize(&self, summary: &mut Summary) {
        summary.exports = Some(self.report.clone());
    }
}

/// A flag set by the first SIGINT or SIGTERM (training then stops after its current step,
/// writes its final checkpoint, exports and summary, and exits normally); a second signal
/// exits at once (130).
pub fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal listener")?;
    // Register in this thread so a signal arriving right after this returns is caught.
    let mut signals = rt.block_on(async { Signals::new() })?;
    std::thread::Builder::new()
        .name("sparta-signals".into())
        .spawn(move || {
            rt.block_on(async move {
                signals.recv().await;
                tracing::warn!(
                    "stop requested: finishing the current step, then the final checkpoint and \
                     export (signal again to abort)"
                );
                flag.store(true, Ordering::Relaxed);
                signals.recv().await;
                eprintln!("aborted");
                std::process::exit(130);
            })
        })
        .context("starting the signal listener")?;
    Ok(stop)
}

/// SIGINT and SIGTERM as one stream.
struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                int: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
                term: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// Waits for the next signal of either kind.
    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            let (int, term) = (&mut self.int, &mut self.term);
            std::future::poll_fn(|cx| {
                if int.poll_recv(cx).is_ready() || term.poll_recv(cx).is_ready() {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            })
            .await
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Writes one probability per line (the format of `sparta predict`).
pub fn write_predictions(path: &Path, probs: &[f32], tasks: usize) -> Result<()> {
    use std::io::Write;
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(f);
    for row in probs.chunks(tasks.max(1)) {
        write_prediction(&mut out, row)?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// One scored line: a probability per task, tab-separated, in the model's task order.
pub fn write_prediction(out: &mut impl std::io::Write, row: &[f32]) -> std::io::Result<()> {
    for (t, p) in row.iter().enumerate() {
        if t > 0 {
            out.write_all(b"\t")?;
        }
        write!(out, "{p}")?;
    }
    out.write_all(b"\n")
}
