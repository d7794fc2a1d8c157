//! What a checkpoint saves and what a restore returns, and the dense-state file.

use sparta_nn::optim::OptimizerState;
use sparta_nn::Model;
use sparta_table::Table;

use crate::error::{CheckpointError, MemberMismatch, Result};
use crate::format::{read_small, write_small, FileKind};
use crate::manifest::{CheckpointId, Manifest};
use crate::position::InputPosition;
use crate::storage::Storage;

/// Borrowed dense parameters and dense optimizer state.
#[derive(Clone, Copy, Debug)]
pub struct DenseState<'a> {
    /// Flat parameter buffer (`Model::param_values`).
    pub params: &'a [f32],
    /// Optimizer state (`Model::optimizer_state`).
    pub optimizer: &'a OptimizerState,
}

impl<'a> DenseState<'a> {
    /// The dense state of a model.
    pub fn of(model: &'a Model) -> DenseState<'a> {
        DenseState {
            params: model.param_values(),
            optimizer: model.optimizer_state(),
        }
    }
}

/// Everything one checkpoint saves (single-writer API; see `PendingCheckpoint` for several).
#[derive(Clone)]
pub struct CheckpointState<'a> {
    /// Tables by name; each is written as part [`crate::DEFAULT_PART`].
    pub tables: Vec<(&'a str, &'a Table)>,
    /// Dense parameters and optimizer state, if any.
    pub dense: Option<DenseState<'a>>,
    /// Training step.
    pub step: u64,
    /// Worker input position.
    pub position: InputPosition,
    /// The job configuration text.
    pub job_config: &'a str,
}

/// Dense parameters and optimizer state read back from a checkpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestoredDense {
    /// Flat parameter buffer.
    pub params: Vec<f32>,
    /// Optimizer state.
    pub optimizer: OptimizerState,
}

impl RestoredDense {
    /// Loads parameters and optimizer state into a model of the same shape.
    pub fn apply_to(&self, model: &mut Model) -> Result<()> {
        let dst = model.param_values_mut();
        if dst.len() != self.params.len() {
            return Err(sparta_nn::NnError::Length {
                name: "dense params".into(),
                expected: dst.len(),
                got: self.params.len(),
            }
            .into());
        }
        dst.copy_from_slice(&self.params);
        model.set_optimizer_state(self.optimizer.clone())?;
        Ok(())
    }
}

/// One restored table part.
pub struct RestoredTable {
    /// Table name.
    pub name: String,
    /// Part (PS shard) name.
    pub part: String,
    /// The table, filled with the chain's rows; version and clock as when saved.
    pub table: Table,
}

impl std::fmt::Debug for RestoredTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoredTable")
            .field("name", &self.name)
            .field("part", &self.part)
            .field("rows", &self.table.len())
            .finish()
    }
}

/// The result of a restore.
#[derive(Debug)]
pub struct Restored {
    /// The checkpoint restored (the last of its chain).
    pub id: CheckpointId,
    /// Ids of the chain applied: the full checkpoint, then incrementals in order.
    pub chain: Vec<CheckpointId>,
    /// Training step.
    pub step: u64,
    /// Worker input position.
    pub position: InputPosition,
    /// Job configuration text.
    pub job_config: String,
    /// Restored tables, one per (table, part).
    pub tables: Vec<RestoredTable>,
    /// Dense state, if the checkpoint had one (the last dense part read).
    pub dense: Option<RestoredDense>,
    /// Every dense part restored, by part name (one per PS shard in a cluster checkpoint).
    pub dense_parts: Vec<(String, RestoredDense)>,
    /// The manifest of the restored checkpoint.
    pub manifest: Manifest,
}

impl Restored {
    /// The first restored part of table `name`.
    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables
            .iter()
            .find(|t| t.name == name)
            .map(|t| &t.table)
    }

    /// The logical tables the checkpoint saved in physical table `name` (empty for a
    /// checkpoint written before logical tables, or an unknown table): what
    /// [`crate::check_members`] compares with the job's.
    pub fn members(&self, name: &str) -> &[crate::TableMember] {
        self.manifest
            .tables
            .iter()
            .find(|t| t.name == name)
            .map_or(&[], |t| &t.members)
    }

    /// Checks every saved table's logical tables against the job's (`job`: by physical
    /// table name) with [`crate::check_members`]; the first mismatch. A checkpoint
    /// that records logical tables must also hold every physical table the job has.
    pub fn check_members(
        &self,
        job: &std::collections::HashMap<String, Vec<crate::TableMember>>,
    ) -> std::result::Result<(), MemberMismatch> {
        let tables = &self.manifest.tables;
        for t in tables {
            let want = job.get(&t.name).map_or(&[][..], Vec::as_slice);
            crate::check_members(&t.name, &t.members, want)?;
        }
        if tables.iter().any(|t| !t.members.is_empty()) {
            let mut missing: Vec<_> = job
                .iter()
                .filter(|(name, m)| !m.is_empty() && !tables.iter().any(|t| &t.name == *name))
                .collect();
            missing.sort_by_key(|(name, _)| name.as_str());
            if let Some((name, m)) = missing.first() {
                return Err(MemberMismatch::NotSaved {
                    table: name.to_string(),
                    name: m[0].name.clone(),
                });
            }
        }
        Ok(())
    }
}

/// Writes the dense file: `n_params u64 | opt_step u64 | n_slot1 u64 | n_slot2 u64 | floats`.
pub(crate) fn write_dense(
    storage: &dyn Storage,
    file: &str,
    d: &DenseState<'_>,
) -> Result<(u64, u64)> {
    let o = d.optimizer;
    let mut payload = Vec::with_capacity(32 + 4 * (d.params.len() + o.slot1.len() + o.slot2.len()));
    for v in [
        d.params.len() as u64,
        o.step,
        o.slot1.len() as u64,
        o.slot2.len() as u64,
    ] {
        payload.extend_from_slice(&v.to_le_bytes());
    }
    for s in [d.params, &o.slot1[..], &o.slot2[..]] {
        payload.extend_from_slice(bytemuck::cast_slice(s));
    }
    write_small(storage, file, FileKind::Dense, &payload)
}

/// Reads and verifies the dense file.
pub(crate) fn read_dense(storage: &dyn Storage, file: &str) -> Result<(RestoredDense, u64)> {
    let (payload, sum) = read_small(storage, file, FileKind::Dense, 16 << 30)?;
    let bad = |why: &str| CheckpointError::corrupt(file, why);
    if payload.len() < 32 {
        return Err(bad("dense header truncated"));
    }
    let word =
        |i: usize| u64::from_le_bytes(payload[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let (n, step, n1, n2) = (word(0), word(1), word(2), word(3));
    let total = n.checked_add(n1).and_then(|t| t.checked_add(n2));
    if total.and_then(|t| t.checked_mul(4)) != Some(payload.len() as u64 - 32) {
        return Err(bad("dense lengths do not match the payload size"));
    }
    let floats = |from: usize, len: u64| -> Vec<f32> {
        let mut v = vec![0f32; len as usize];
        bytemuck::cast_slice_mut::<f32, u8>(&mut v)
            .copy_from_slice(&payload[from..from + 4 * len as usize]);
        v
    };
    let p0 = 32;
    let p1 = p0 + 4 * n as usize;
    let p2 = p1 + 4 * n1 as usize;
    Ok((
        RestoredDense {
            params: floats(p0, n),
            optimizer: OptimizerState {
                step,
                slot1: floats(p1, n1),
                slot2: floats(p2, n2),
            },
        },
        sum,
    ))
}
