//! The checkpoint contract of a training job: the [`CheckpointHook`] the training loop calls at
//! step boundaries (implemented by the embedded checkpointer in `sparta-worker` and by a PS
//! cluster's coordinator in `sparta-ps`), and [`restore`], the newest valid checkpoint of an
//! embedded job (resume, export).

use std::path::Path;

use sparta_checkpoint::{
    missing_local_dir, nothing_to_resume, open_dir, restore_latest, InputPosition, Restored,
    RestoredTable, ResumePolicy,
};
use sparta_nn::Model;
use sparta_table::Table;

use crate::error::CoreError;
use crate::features::Features;

/// Checkpoints a job at step boundaries. The trainer calls [`CheckpointHook::write`] after a
/// step whose updates have all been applied (no push in flight), so the checkpoint holds
/// exactly the samples before `position`.
pub trait CheckpointHook: Send {
    /// Steps between checkpoints (0: none while training).
    fn every_steps(&self) -> u64;
    /// Whether a checkpoint is due after `step` (steps since the start of the job).
    fn due(&self, step: u64) -> bool {
        let k = self.every_steps();
        k > 0 && step > 0 && step % k == 0
    }
    /// Checkpoints after `step`; returns the checkpoint's id when this process wrote (or
    /// committed) one.
    fn write(
        &mut self,
        step: u64,
        position: InputPosition,
        model: &Model,
    ) -> Result<Option<String>, CoreError>;
    /// Whether to checkpoint once more when training ends.
    fn at_end(&self) -> bool;
    /// Training ended after `step` at `position`.
    fn finish(&mut self, _step: u64, _position: InputPosition) -> Result<(), CoreError> {
        Ok(())
    }
    /// While the input waits for data at `step`: the step of a checkpoint round that other
    /// processes wait in, when it is later than `step` (a PS cluster whose workers read Kafka
    /// partitions of uneven traffic). The trainer then counts its steps from there and joins
    /// that round, so a quiet worker never holds the others' checkpoints. `None` by default.
    fn pending_round(&mut self, _step: u64) -> Result<Option<u64>, CoreError> {
        Ok(None)
    }
    /// Whether this hook judges what it publishes by the run's progressive metrics (a PS
    /// cluster's worker 0 with gated exports at its checkpoint rounds): the trainer then
    /// calls [`CheckpointHook::set_quality`] before each [`CheckpointHook::write`] and
    /// [`CheckpointHook::finish`]. False by default (the report costs a sort of the window).
    fn wants_quality(&self) -> bool {
        false
    }
    /// The progressive validation of the steps so far, before a write or the finish.
    fn set_quality(&mut self, _progressive: &sparta_nn::metrics::Progressive) {}
    /// The last serving export version this hook published (exports riding its rounds).
    fn last_export_version(&self) -> Option<u64> {
        None
    }
}

/// Restores the newest valid checkpoint in `dir`, if any.
pub fn restore(dir: &Path) -> Result<Option<Restored>, CoreError> {
    let storage = open_dir(dir)?;
    let r = restore_latest(storage.as_ref(), |_, cfg| Table::new(cfg.clone()))?;
    if let Some(c) = r.as_ref().and_then(|r| r.manifest.cluster.as_ref()) {
        return Err(CoreError::Config(format!(
            "{} in {} was written by a PS cluster ({} shards, {} workers): resume it with \
             `sparta launch --resume` and the same --ps / --workers",
            r.as_ref().map_or(String::new(), |r| r.id.to_string()),
            dir.display(),
            c.num_shards,
            c.num_workers
        )));
    }
    Ok(r)
}

/// What `--resume DIR` restores: the newest valid checkpoint in `dir`, or `None` (start
/// fresh) only when `policy` is [`ResumePolicy::IfPresent`] and `dir` is missing or holds no
/// checkpoint at all. A missing directory or an empty one under [`ResumePolicy::Required`],
/// and written checkpoints none of which restores, are errors.
pub fn resume_from(dir: &Path, policy: ResumePolicy) -> Result<Option<Restored>, CoreError> {
    if missing_local_dir(&dir.to_string_lossy(), policy)? {
        return Ok(None);
    }
    if let Some(r) = restore(dir)? {
        return Ok(Some(r));
    }
    nothing_to_resume(open_dir(dir)?.as_ref(), policy)?;
    Ok(None)
}

/// Matches restored tables to the job's physical tables (in [`crate::TableId`] order), checking
/// that each has the job's dim. `what` names the checkpoint in errors. A restored table the job
/// does not have, or a job table the checkpoint lacks, is an error: tables cannot change across
/// a resume.
pub fn job_tables(
    features: &Features,
    restored: &mut Restored,
    what: &str,
) -> Result<Vec<Table>, CoreError> {
    let err = |m: String| Err(CoreError::Config(format!("{what}: {m}")));
    // The logical tables first: their errors name the table the user wrote.
    if let Err(e) = restored.check_members(&features.members()) {
        return err(e.to_string());
    }
    let mut restored: Vec<RestoredTable> = std::mem::take(&mut restored.tables);
    let mut out = Vec::with_capacity(features.physical.len());
    for p in &features.physical {
        let name = &p.config.name;
        let Some(i) = restored.iter().position(|t| t.name == *name) else {
            return err(format!(
                "has no table {name:?} ({}); the job's tables differ from the checkpoint's \
                 (changing tables across a resume is not supported)",
                describe_members(features, p)
            ));
        };
        let t = restored.swap_remove(i).table;
        if t.dim() != p.config.dim {
            return err(format!(
                "table {name:?} ({}) has dim {} in the checkpoint, the job says dim {}",
                describe_members(features, p),
                t.dim(),
                p.config.dim
            ));
        }
        out.push(t);
    }
    if let Some(t) = restored.first() {
        return err(format!(
            "holds table {:?}, which this job does not have (changing tables across a resume \
             is not supported)",
            t.name
        ));
    }
    Ok(out)
}

/// `tables user, item` or `the wide weights of user, item`.
fn describe_members(features: &Features, p: &crate::features::PhysicalTable) -> String {
    let names: Vec<&str> = p
        .members
        .iter()
        .map(|&m| features.tables[m].name.as_str())
        .collect();
    if p.config.dim == 1
        && features
            .wide_table
            .is_some_and(|w| features.physical[w] == *p)
    {
        format!("the wide weights of {}", names.join(", "))
    } else {
        format!("tables {}", names.join(", "))
    }
}
