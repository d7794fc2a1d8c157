//! Serving exports as a step hook: `sparta train --export-dir` and the Python package's
//! `train(..., export_dir=...)`.
//!
//! Each version carries the progressive window metrics it was trained on (when the run keeps
//! them); with `[export] gate` a version worse than the recent published ones is held back
//! (`sparta_export::gate`): nothing of it is written, so the next version published is a
//! delta over the last published one (or full, by the usual rules).

use std::time::{Duration, Instant};

use sparta_core::config::ExportConfig;
use sparta_core::CoreError;
use sparta_export::gate::{Gate, GateRule};
use sparta_export::{ExportKind, ExportOptions, ExportQuality, Exporter};

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
    /// `[export] gate`: holds back versions worse than the recent published ones.
    gate: Option<Gate>,
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
            gate: cfg.gate.as_ref().map(|g| Gate::new(GateRule::from(g))),
        })
    }

    /// Whether the gate holds this version back (logged and counted when it does).
    fn held_back(&mut self, quality: Option<&ExportQuality>, step: u64) -> bool {
        let last = self.report.last_version;
        let held = self
            .gate
            .as_mut()
            .is_some_and(|g| g.holds_back(quality, "export", step, last));
        self.report.held_back += u64::from(held);
        held
    }

    fn export(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        let quality = ctx.progressive.map(ExportQuality::from_progressive);
        if self.held_back(quality.as_ref(), ctx.step) {
            // Counted as an attempt: the next one comes on the usual schedule.
            self.last_export = Instant::now();
            self.last_step = Some(ctx.step);
            return Ok(());
        }
        let tables = ctx.table_refs();
        let info = self
            .exporter
            .export_with_quality(ctx.job_toml, ctx.model, &tables, ctx.step, quality.clone())
            .map_err(|e| CoreError::Training(format!("export at step {}: {e}", ctx.step)))?;
        if let Some(g) = self.gate.as_mut() {
            g.published(quality.as_ref());
        }
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

    fn last_export_version(&self) -> Option<u64> {
        self.report.last_version
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sparta_core::JobConfig;
    use sparta_export::format::read_manifest;
    use sparta_nn::metrics::{EvalSummary, Progressive, TaskProgressive};
    use sparta_nn::Model;
    use sparta_table::Table;

    use super::*;

    fn window(auc: f64, logloss: f64) -> Progressive {
        let s = EvalSummary {
            auc,
            logloss,
            positive_rate: 0.2,
            mean_prediction: 0.2,
            calibration: 1.0,
            rows: 4096,
            gauc: None,
        };
        Progressive {
            window: 4096,
            step: 0,
            tasks: vec![TaskProgressive {
                task: "click".into(),
                window: s.clone(),
                cumulative: s,
            }],
        }
    }

    #[test]
    fn a_collapsed_window_is_held_back_and_the_next_good_version_is_a_delta_on_the_last_published()
    {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[model]\nkind = \"wdl\"\nhidden = [8]\n[embedding]\ndim = 4\n[export]\ndir = {:?}\n\
             gate = {{ max_auc_drop = 0.01, max_logloss_rise = 0.02, min_rows = 1000 }}\n",
            dir.path().display().to_string()
        );
        let job = JobConfig::from_toml(&text).unwrap().validate().unwrap();
        let model = Model::new(job.model.clone()).unwrap();
        let tables: Vec<(String, Arc<Table>)> = job
            .features
            .physical
            .iter()
            .map(|p| {
                (
                    p.config.name.clone(),
                    Arc::new(Table::new(p.config.clone()).unwrap()),
                )
            })
            .collect();
        let mut hook = ExportHook::open(&job.raw.export, Default::default()).unwrap();
        // (auc, logloss) of the window before each export: good, good, collapsed, recovered.
        let windows = [(0.75, 0.45), (0.76, 0.44), (0.60, 0.60), (0.755, 0.445)];
        let mut keys = 0u64;
        for (i, &(auc, ll)) in windows.iter().enumerate() {
            let step = 10 * (i as u64 + 1);
            // Rows change between exports, so every delta has something to carry.
            let (_, emb) = &tables[0];
            let new: Vec<u64> = (keys..keys + 5).collect();
            keys += 5;
            let mut rows = vec![0f32; new.len() * emb.dim()];
            emb.pull(&new, &mut rows);
            let p = window(auc, ll);
            let ctx = HookContext {
                step,
                rows: step * 64,
                job_toml: &text,
                model: &model,
                tables: &tables,
                progressive: Some(&p),
            };
            hook.after_step(&ctx).unwrap();
        }
        let r = &hook.report;
        assert_eq!((r.count, r.held_back, r.last_version), (3, 1, Some(3)));
        let storage = sparta_checkpoint::LocalDir::new(dir.path()).unwrap();
        let m3 = read_manifest(&storage, 3).unwrap();
        // Published after the held-back one: a delta on version 2, the last published.
        assert_eq!(
            (m3.kind, m3.base, m3.step),
            (ExportKind::Delta, Some(2), 40)
        );
        let q = m3.quality.as_ref().unwrap();
        assert_eq!(q.tasks[0].auc, Some(0.755));
        assert_eq!(
            sparta_export::list_versions(dir.path()).unwrap(),
            vec![1, 2, 3],
            "nothing of the held-back version is on disk"
        );
        // The delta over version 2 holds every row created since version 2 (the held-back
        // window's rows too), so the chain 1, 2, 3 holds every row.
        let rows: u64 = (1..=3)
            .map(|v| read_manifest(&storage, v).unwrap().rows())
            .sum();
        assert_eq!(rows, 20);
    }
}
