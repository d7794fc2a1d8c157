//! The pipelined loop ([`crate::pipeline`]) with the trainer's between-step work.

use std::sync::Arc;
use std::time::Instant;

use sparta_checkpoint::InputPosition;
use sparta_core::CoreError;
use sparta_data::{Batch, DataError};

use super::input::LossMeter;
use super::steps::{due_hooks, export_version, run_hooks, write_checkpoint};
use super::Trainer;
use crate::online::HookContext;
use crate::pipeline::{self, PipelineConfig};
use crate::progress::Progress;
use crate::progressive::ProgressiveMeter;
use crate::summary::StepClock;
use crate::summary::Summary;

impl Trainer {
    pub(super) fn train_pipelined(
        &mut self,
        batches: impl Iterator<Item = Result<Batch, DataError>> + Send,
        summary: &mut Summary,
        progress: &mut dyn Progress,
        bytes_read: impl Fn() -> u64,
        pos: &dyn Fn(u64) -> Result<InputPosition, CoreError>,
    ) -> Result<(), CoreError> {
        let cfg = PipelineConfig {
            staleness: self.job.raw.train.pipeline_staleness,
            sparse_loss: self.job.raw.train.sparse_loss,
            quiesce_every: self.checkpoints.as_ref().map_or(0, |c| c.every_steps()),
            start_step: self.start_step,
            nice: self.job.raw.train.pipeline_nice,
        };
        let store = Arc::clone(&self.store);
        let dense_store = self.dense_store.clone();
        let mut losses = LossMeter::default();
        let mut clock = StepClock::default();
        let mut diverged = None;
        let start = Instant::now();
        let (start_step, start_rows) = (self.start_step, self.start_position.rows_consumed);
        let hooks = &mut self.hooks;
        let checkpoints = &mut self.checkpoints;
        let evictor = &mut self.evictor;
        let tables = &self.tables;
        let job_toml = self.job_text.as_str();
        let features = Arc::clone(&self.job.features);
        let meter = &mut self.progressive;
        let periodic = &mut self.periodic;
        let live = &mut self.live;
        let job = &self.job;
        let stages = pipeline::run(
            store.as_ref(),
            dense_store.as_deref(),
            &mut self.model,
            &features,
            batches,
            cfg,
            |r, ctl| {
                summary.steps += 1;
                summary.train_rows += r.samples as u64;
                let recent = losses.record(r.loss);
                if !r.loss.is_finite() {
                    diverged = Some(r.loss as f64);
                    return Ok(false);
                }
                if let Some(m) = meter.as_mut() {
                    m.record(&features, ctl.batch(), ctl.scored());
                }
                if let Some(e) = evictor.as_mut() {
                    e.after_step(r.keys);
                }
                let step = start_step + summary.steps;
                clock.tick(step);
                if let Some(c) = checkpoints.as_mut() {
                    // The pipeline quiesces at every checkpoint step (`quiesce_every`): all
                    // pushes landed and nothing of the following batches was pulled.
                    if ctl.quiescent() && c.due(step) {
                        let at = pos(start_rows + summary.train_rows)?;
                        let (m, l) = (meter.as_ref(), live.as_ref());
                        write_checkpoint(c.as_mut(), step, at, ctl.model(), m, l, summary)?;
                    }
                }
                let due = due_hooks(hooks, step);
                if !due.is_empty() {
                    // Hooks see every push of the steps so far applied.
                    ctl.drain()?;
                    let report = meter.as_ref().map(|m| m.report(step));
                    let ctx = HookContext {
                        step,
                        rows: start_rows + summary.train_rows,
                        job_toml,
                        model: ctl.model(),
                        tables,
                        progressive: report.as_ref(),
                    };
                    run_hooks(hooks, &due, &ctx)?;
                }
                if let Some(p) = periodic.as_mut().filter(|p| p.is_due(step)) {
                    // The model of the steps so far, every push of them applied.
                    ctl.drain()?;
                    let rows = start_rows + summary.train_rows;
                    p.evaluate(job, &store, ctl.model(), step, rows, summary)?;
                    clock.restart();
                }
                if let Some(l) = live.as_mut() {
                    let (rows, m) = (start_rows + summary.train_rows, meter.as_ref());
                    l.step(step, rows, recent, m, || {
                        export_version(hooks, checkpoints.as_deref())
                    });
                }
                let meter = meter.as_ref();
                progress.update_with(
                    bytes_read(),
                    summary.train_rows,
                    recent,
                    &format!(
                    "pipeline {:.1}s: read {:.1}s pull {:.1}s dense {:.1}s push {:.1}s wait {:.1}s",
                    start.elapsed().as_secs_f64(),
                    r.stages.read,
                    r.stages.pull,
                    r.stages.dense,
                    r.stages.push,
                    r.stages.wait
                ),
                    &mut || meter.and_then(ProgressiveMeter::line),
                );
                Ok(true)
            },
        )?;
        summary.train_loss = diverged.unwrap_or(losses.mean());
        summary.stage_seconds = stages;
        summary.step_seconds_median = clock.median();
        summary.slowest_steps = clock.slowest();
        summary.pipeline = true;
        Ok(())
    }
}
