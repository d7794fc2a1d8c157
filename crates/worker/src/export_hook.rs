//! Serving exports as a step hook: `sparta train --export-dir` and the Python package's
//! `train(..., export_dir=...)`.

use std::time::{Duration, Instant};

use sparta_core::config::ExportConfig;
use sparta_core::CoreError;
use sparta_export::{ExportKind, ExportOptions, Exporter};

use crate::online::{ExportReport, HookContext, StepHook};
use crate::summary::Summary;

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
    pub fn open(
        cfg: &ExportConfig,
        members: sparta_checkpoint::Members,
    ) -> Result<ExportHook, CoreError> {
        let dir = cfg
            .dir
            .as_deref()
            .ok_or_else(|| CoreError::Config("export.dir: no export directory".into()))?;
        let mut exporter = Exporter::open(dir, ExportOptions::from(cfg)).map_err(|e| {
            CoreError::Training(format!(
                "opening the export directory {}: {e}",
                dir.display()
            ))
        })?;
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
