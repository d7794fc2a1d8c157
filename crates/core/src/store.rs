//! The worker's view of the parameter servers: pull and push of rows by key, per table.
//!
//! One trait, two homes: [`LocalStore`] calls the tables in this process directly (the embedded
//! cluster, the default); a networked client implements the same trait over gRPC, so the
//! training loop is one code path.

use std::sync::Arc;

use sparta_table::Table;

use crate::error::CoreError;

/// Which of a job's tables a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TableId {
    /// The deep embedding table (dim = `embedding.dim`).
    Embedding = 0,
    /// The first-order table (dim 1).
    Wide = 1,
}

/// One table's values in a multi-table pull: `values.len() == keys.len() * dim(table)`.
pub struct PullInto<'a> {
    /// The table read.
    pub table: TableId,
    /// Where its rows go, one per key.
    pub values: &'a mut [f32],
}

/// One table's gradients in a multi-table push: `grads.len() == keys.len() * dim(table)`.
pub struct PushFrom<'a> {
    /// The table updated.
    pub table: TableId,
    /// One gradient row per key.
    pub grads: &'a [f32],
}

/// Pull/push access to the sparse parameters, batched per step: one call carries the step's
/// distinct keys once and the rows of every table keyed by them, so a networked store sends
/// ONE request per PS per step and direction (sparse-domain aggregation).
pub trait SparseStore: Send + Sync {
    /// Number of PS shards keys are routed to (1 for an embedded store).
    fn num_shards(&self) -> usize;
    /// Row width of `table` (0 when the job has no such table).
    fn dim(&self, table: TableId) -> usize;
    /// Reads the rows of `keys` (distinct, grouped by shard as `shard_offsets` says) from each
    /// table of `into`. With `create`, unseen ids get rows (under each table's admission);
    /// without, they read as the table's default.
    fn pull(
        &self,
        keys: &[u64],
        shard_offsets: &[usize],
        into: &mut [PullInto<'_>],
        create: bool,
    ) -> Result<(), CoreError>;
    /// Applies gradients (one row per distinct key and table) with each table's optimizer.
    fn push(
        &self,
        keys: &[u64],
        shard_offsets: &[usize],
        from: &[PushFrom<'_>],
    ) -> Result<(), CoreError>;
    /// Rows held in all tables.
    fn table_rows(&self) -> u64;
}

/// Dense parameters held by the parameter servers (split into equal slices over all shards)
/// instead of by the worker.
pub trait DenseStore: Send + Sync {
    /// Pushes one step's dense gradients (of the batch-mean loss, flat in the model's parameter
    /// order) and pulls the current parameters into `params` (same layout). The server applies
    /// the dense optimizer; its mode (sync, async, bounded staleness) decides when this returns.
    fn push_pull(&self, grads: &[f32], params: &mut [f32]) -> Result<(), CoreError>;
}

/// Checks that a table's buffer holds one row per key.
pub fn check_len(table: TableId, len: usize, keys: usize, dim: usize) -> Result<(), CoreError> {
    if len != keys * dim {
        return Err(CoreError::Training(format!(
            "{table:?} buffer holds {len} values for {keys} keys of dim {dim}"
        )));
    }
    Ok(())
}

/// The embedded cluster: tables in this process, called directly.
pub struct LocalStore {
    embedding: Arc<Table>,
    wide: Option<Arc<Table>>,
}

impl LocalStore {
    /// A store over tables built by the caller.
    pub fn new(embedding: Arc<Table>, wide: Option<Arc<Table>>) -> Self {
        Self { embedding, wide }
    }

    /// The deep embedding table.
    pub fn embedding(&self) -> &Arc<Table> {
        &self.embedding
    }

    /// The wide table, if the model has one.
    pub fn wide(&self) -> Option<&Arc<Table>> {
        self.wide.as_ref()
    }

    fn table(&self, table: TableId) -> Result<&Table, CoreError> {
        match table {
            TableId::Embedding => Ok(&self.embedding),
            TableId::Wide => self
                .wide
                .as_deref()
                .ok_or_else(|| CoreError::Training("this model has no wide table".into())),
        }
    }
}

impl SparseStore for LocalStore {
    fn num_shards(&self) -> usize {
        1
    }

    fn dim(&self, table: TableId) -> usize {
        self.table(table).map_or(0, |t| t.dim())
    }

    fn pull(
        &self,
        keys: &[u64],
        _shard_offsets: &[usize],
        into: &mut [PullInto<'_>],
        create: bool,
    ) -> Result<(), CoreError> {
        for p in into.iter_mut() {
            let t = self.table(p.table)?;
            check_len(p.table, p.values.len(), keys.len(), t.dim())?;
            if create {
                t.pull(keys, p.values);
            } else {
                t.pull_readonly(keys, p.values);
            }
        }
        Ok(())
    }

    fn push(
        &self,
        keys: &[u64],
        _shard_offsets: &[usize],
        from: &[PushFrom<'_>],
    ) -> Result<(), CoreError> {
        for p in from {
            let t = self.table(p.table)?;
            check_len(p.table, p.grads.len(), keys.len(), t.dim())?;
            t.push(keys, p.grads);
        }
        Ok(())
    }

    fn table_rows(&self) -> u64 {
        (self.embedding.len() + self.wide.as_ref().map_or(0, |w| w.len())) as u64
    }
}
