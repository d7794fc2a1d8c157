//! Work between steps and after the last one: table clock and eviction, checkpoints, hooks,
//! and the summary's totals.

use std::time::Instant;

use sparta_checkpoint::InputPosition;
use sparta_core::CoreError;
use sparta_data::ReadStats;

use sparta_core::CheckpointHook;
use sparta_nn::Model;

use super::Trainer;
use crate::live::Live;
use crate::online::{HookContext, StepHook};
use crate::progressive::ProgressiveMeter;
use crate::summary::{InputSummary, Summary};

impl Trainer {
    /// A divergence error (from the step after the `summary.steps` done) with the step and
    /// what is safe: nothing of that step was applied, and the last checkpoint holds the model
    /// from before it. Other errors pass unchanged.
    pub(super) fn explain_divergence(&self, e: CoreError, summary: &Summary) -> CoreError {
        let CoreError::Diverged(what) = e else {
            return e;
        };
        let step = self.start_step + summary.steps + 1;
        let last = summary
            .last_checkpoint
            .clone()
            .or_else(|| self.resumed_from.clone());
        let keep = match (&self.job.raw.train.checkpoint_dir, last) {
            (Some(dir), Some(id)) => format!(
                "the last good checkpoint is {id} in {} (resume from it with lower learning rates)",
                dir.display()
            ),
            (Some(dir), None) => format!("no checkpoint was written yet in {}", dir.display()),
            (None, _) => "no checkpoint directory is set (--checkpoint-dir keeps one)".into(),
        };
        CoreError::Diverged(format!(
            "step {step}: {what}; the step was not applied and no checkpoint or export was \
             written after it; {keep}"
        ))
    }

    /// After the last step: the final checkpoint (at `end`), the hooks' final work, and the
    /// summary's timing and totals. Fails, before writing anything, when the loss diverged.
    pub(super) fn finish_training(
        &mut self,
        summary: &mut Summary,
        start: Instant,
        loop_start: Instant,
        stats: &ReadStats,
        end: InputPosition,
    ) -> Result<(), CoreError> {
        if !summary.train_loss.is_finite() {
            return Err(self.explain_divergence(
                CoreError::Diverged(format!("the mean loss is {}", summary.train_loss)),
                summary,
            ));
        }
        let step = self.start_step + summary.steps;
        summary.progressive = self.progressive_report(step);
        if let Some(c) = self.checkpoints.as_mut() {
            if let Some(p) = summary.progressive.as_ref().filter(|_| c.wants_quality()) {
                c.set_quality(p);
            }
            if c.at_end() {
                if let Some(id) = c.write(step, end.clone(), &self.model)? {
                    if let Some(l) = &self.live {
                        l.checkpointed(&id, step);
                    }
                    summary.last_checkpoint = Some(id);
                }
            }
            c.finish(step, end.clone())?;
        }
        if !self.hooks.is_empty() {
            let ctx = HookContext {
                step,
                rows: end.rows_consumed,
                job_toml: &self.job_text,
                model: &self.model,
                tables: &self.tables,
                progressive: summary.progressive.as_ref(),
            };
            for h in self.hooks.iter_mut() {
                h.finish(&ctx)?;
            }
        }
        if let Some(l) = self.live.as_mut() {
            let version = export_version(&self.hooks, self.checkpoints.as_deref());
            l.finish(
                step,
                end.rows_consumed,
                summary.progressive.as_ref(),
                version,
            );
        }
        let loop_secs = loop_start.elapsed().as_secs_f64();
        summary.train_seconds = start.elapsed().as_secs_f64();
        summary.bad_lines = stats.bad_lines();
        summary.input = InputSummary::of(stats, summary.train_seconds);
        // Without the pipeline, time blocked on the reader is not training-loop time; with it,
        // reading overlaps and the wall time is what counts.
        let busy = if summary.pipeline {
            loop_secs
        } else {
            loop_secs - summary.stage_seconds.read
        };
        summary.train_samples_per_sec = summary.train_rows as f64 / summary.train_seconds.max(1e-9);
        summary.loop_samples_per_sec = summary.train_rows as f64 / busy.max(1e-9);
        summary.dense_mflop_per_sample = self.model.flops_per_sample() / 1e6;
        summary.dense_gflops = self.model.flops_per_sample() * summary.train_rows as f64
            / summary.stage_seconds.dense.max(1e-9)
            / 1e9;
        summary.samples_trained = self.start_position.rows_consumed + summary.train_rows;
        summary.resumed_from = self.resumed_from.clone();
        summary.model = format!("{:?}", self.job.model.kind).to_lowercase();
        summary.epochs = self.job.reader.epochs;
        summary.batch_size = self.job.reader.batch_size;
        summary.threads = self.job.threads;
        summary.evicted_rows = self.evictor.as_ref().map_or(0, |e| e.evicted);
        Ok(())
    }

    /// Between two steps of the sequential loop: table clock and eviction, a due checkpoint
    /// (at the input position `pos` gives for the rows consumed), due hooks.
    pub(super) fn between_steps(
        &mut self,
        keys: usize,
        summary: &mut Summary,
        pos: &dyn Fn(u64) -> Result<InputPosition, CoreError>,
    ) -> Result<(), CoreError> {
        let step = self.start_step + summary.steps;
        let rows = self.start_position.rows_consumed + summary.train_rows;
        if let Some(e) = self.evictor.as_mut() {
            e.after_step(keys);
        }
        if let Some(c) = self.checkpoints.as_mut() {
            if c.due(step) {
                let meter = self.progressive.as_ref();
                let at = pos(rows)?;
                let live = self.live.as_ref();
                write_checkpoint(c.as_mut(), step, at, &self.model, meter, live, summary)?;
            }
        }
        self.run_due_hooks(step, rows)
    }
}

impl Trainer {
    /// While the input waits for data (an idle tick): a checkpoint round the other workers of
    /// a cluster wait in at a later step is joined ([`CheckpointHook::pending_round`]: this
    /// trainer's step count moves up to the round's, nothing being trained meanwhile), then
    /// the hooks due by now (exports by time) run at the current step, so the last steps
    /// before a pause are not held back.
    ///
    /// [`CheckpointHook::pending_round`]: sparta_core::CheckpointHook::pending_round
    pub(super) fn while_idle(
        &mut self,
        summary: &mut Summary,
        pos: &dyn Fn(u64) -> Result<InputPosition, CoreError>,
    ) -> Result<(), CoreError> {
        let step = self.start_step + summary.steps;
        let rows = self.start_position.rows_consumed + summary.train_rows;
        if let Some(c) = self.checkpoints.as_mut() {
            if let Some(round) = c.pending_round(step)?.filter(|&r| r > step) {
                tracing::info!(
                    "waiting for input at step {step}: joining the checkpoint round the other \
                     workers wait in after step {round} (steps {} to {round} skipped)",
                    step + 1
                );
                self.start_step += round - step;
                let meter = self.progressive.as_ref();
                let at = pos(rows)?;
                let live = self.live.as_ref();
                write_checkpoint(c.as_mut(), round, at, &self.model, meter, live, summary)?;
            }
        }
        if let Some(l) = self.live.as_mut() {
            let (meter, hooks) = (self.progressive.as_ref(), &self.hooks);
            let checkpoints = self.checkpoints.as_deref();
            l.refresh(step, meter, || export_version(hooks, checkpoints));
        }
        if summary.steps == 0 {
            return Ok(()); // nothing trained by this run yet
        }
        let step = self.start_step + summary.steps;
        let rows = self.start_position.rows_consumed + summary.train_rows;
        self.run_due_hooks(step, rows)
    }

    /// Runs the hooks due after `step` (`rows` consumed) at a consistent point.
    fn run_due_hooks(&mut self, step: u64, rows: u64) -> Result<(), CoreError> {
        let due = due_hooks(&mut self.hooks, step);
        if due.is_empty() {
            return Ok(());
        }
        let report = self.progressive_report(step);
        let ctx = HookContext {
            step,
            rows,
            job_toml: &self.job_text,
            model: &self.model,
            tables: &self.tables,
            progressive: report.as_ref(),
        };
        run_hooks(&mut self.hooks, &due, &ctx)
    }
}

/// Checkpoints after `step` at `at` through `c`, first giving it the progressive metrics when
/// it judges by them; records the checkpoint in `summary` and the live status.
pub(super) fn write_checkpoint(
    c: &mut dyn CheckpointHook,
    step: u64,
    at: InputPosition,
    model: &Model,
    meter: Option<&ProgressiveMeter>,
    live: Option<&Live>,
    summary: &mut Summary,
) -> Result<(), CoreError> {
    if let Some(m) = meter.filter(|_| c.wants_quality()) {
        c.set_quality(&m.report(step));
    }
    if let Some(id) = c.write(step, at, model)? {
        if let Some(l) = live {
            l.checkpointed(&id, step);
        }
        summary.last_checkpoint = Some(id);
    }
    Ok(())
}

/// The last serving export version published by a hook or by the checkpoint rounds.
pub(super) fn export_version(
    hooks: &[Box<dyn StepHook>],
    checkpoints: Option<&dyn CheckpointHook>,
) -> Option<u64> {
    hooks
        .iter()
        .find_map(|h| h.last_export_version())
        .or_else(|| checkpoints.and_then(|c| c.last_export_version()))
}

/// Indices of the hooks due after `step`.
pub(super) fn due_hooks(hooks: &mut [Box<dyn StepHook>], step: u64) -> Vec<usize> {
    hooks
        .iter_mut()
        .enumerate()
        .filter_map(|(i, h)| h.due(step).then_some(i))
        .collect()
}

/// Runs the hooks `which`.
pub(super) fn run_hooks(
    hooks: &mut [Box<dyn StepHook>],
    which: &[usize],
    ctx: &HookContext<'_>,
) -> Result<(), CoreError> {
    for &i in which {
        hooks[i].after_step(ctx)?;
    }
    Ok(())
}
