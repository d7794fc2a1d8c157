//! The worker's view of the parameter servers: pull and push of rows by key, per table.
//!
//! One trait, two homes: [`LocalStore`] calls the tables in this process directly (the embedded
//! cluster, the default); a networked client implements the same trait over gRPC, so the
//! training loop is one code path.

use std::sync::Arc;

use sparta_table::Table;

use crate::dedup::KeyParts;
use crate::error::CoreError;
use crate::features::Features;
use crate::routing::Routing;

/// Which of a job's physical tables a request is for: its index in the job's table list
/// ([`crate::features::Features::physical`]), the same in every process of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableId(pub u16);

impl TableId {
    /// The index as a `usize`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One table's values in a multi-table pull: one row per key of the classes in `classes`, in
/// (shard, class) order: `values.len() == keys.total(classes) * dim(table)`.
pub struct PullInto<'a> {
    /// The table read.
    pub table: TableId,
    /// Bit `c`: keys of class `c` have rows in this table.
    pub classes: u64,
    /// Where its rows go.
    pub values: &'a mut [f32],
}

/// One table's gradients in a multi-table push, laid out as [`PullInto`]'s values.
pub struct PushFrom<'a> {
    /// The table updated.
    pub table: TableId,
    /// Bit `c`: keys of class `c` have rows in this table.
    pub classes: u64,
    /// One gradient row per key of its classes.
    pub grads: &'a [f32],
}

impl<'a> PushFrom<'a> {
    /// One push part per physical table of `features`: table `t` takes `grads[t]`.
    pub fn per_table(grads: &'a [Vec<f32>], features: &Features) -> Vec<PushFrom<'a>> {
        grads
            .iter()
            .zip(&features.physical)
            .enumerate()
            .map(|(t, (g, p))| PushFrom {
                table: TableId(t as u16),
                classes: p.classes,
                grads: g,
            })
            .collect()
    }
}

/// Pull/push access to the sparse parameters, batched per step: one call carries the step's
/// distinct keys once and the rows of every table keyed by them, so a networked store sends
/// ONE request per PS per step and direction (sparse-domain aggregation).
pub trait SparseStore: Send + Sync {
    /// How keys are routed to PS shards ([`Routing::single`] for an embedded store).
    fn routing(&self) -> Routing;
    /// Number of PS shards keys are routed to (1 for an embedded store).
    fn num_shards(&self) -> usize {
        self.routing().num_shards()
    }
    /// Row width of `table` (0 when the job has no such table).
    fn dim(&self, table: TableId) -> usize;
    /// Reads the rows of `keys` (distinct, grouped by shard and class) from each table of
    /// `into`. With `create`, unseen ids get rows (under each table's admission); without, they
    /// read as the table's default.
    fn pull(
        &self,
        keys: &KeyParts<'_>,
        into: &mut [PullInto<'_>],
        create: bool,
    ) -> Result<(), CoreError>;
    /// Applies gradients (one row per key of the table's classes) with each table's optimizer.
    fn push(&self, keys: &KeyParts<'_>, from: &[PushFrom<'_>]) -> Result<(), CoreError>;
    /// [`SparseStore::pull`], leaving in `kept` (per table, index = [`TableId`]) what lets
    /// [`SparseStore::push_kept`] of the same keys find their rows sooner; a store may keep
    /// nothing (the default).
    fn pull_keeping(
        &self,
        keys: &KeyParts<'_>,
        into: &mut [PullInto<'_>],
        create: bool,
        kept: &mut Vec<Vec<u32>>,
    ) -> Result<(), CoreError> {
        kept.clear();
        self.pull(keys, into, create)
    }
    /// [`SparseStore::push`] of the keys of a [`SparseStore::pull_keeping`], with what it
    /// kept: the same result as `push` (what was kept only spares work).
    fn push_kept(
        &self,
        keys: &KeyParts<'_>,
        from: &[PushFrom<'_>],
        kept: &[Vec<u32>],
    ) -> Result<(), CoreError> {
        let _ = kept;
        self.push(keys, from)
    }
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
            "table {} buffer holds {len} values for {keys} keys of dim {dim}",
            table.0
        )));
    }
    Ok(())
}

/// The embedded cluster: tables in this process, called directly.
pub struct LocalStore {
    tables: Vec<Arc<Table>>,
}

impl LocalStore {
    /// A store over tables built by the caller, indexed by [`TableId`] in this order.
    pub fn new(tables: Vec<Arc<Table>>) -> Self {
        Self { tables }
    }

    /// Builds (empty) tables from their configurations.
    pub fn from_configs(configs: &[sparta_table::TableConfig]) -> Result<Self, CoreError> {
        let tables = configs
            .iter()
            .map(|c| {
                Table::new(c.clone())
                    .map(Arc::new)
                    .map_err(|e| CoreError::Config(format!("table {:?}: {e}", c.name)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(tables))
    }

    /// Every table, by [`TableId`].
    pub fn tables(&self) -> &[Arc<Table>] {
        &self.tables
    }

    /// The table named `name`.
    pub fn by_name(&self, name: &str) -> Option<&Arc<Table>> {
        self.tables.iter().find(|t| t.config().name == name)
    }

    fn table(&self, table: TableId) -> Result<&Table, CoreError> {
        self.tables
            .get(table.index())
            .map(|t| &**t)
            .ok_or_else(|| CoreError::Training(format!("no table {} in this job", table.0)))
    }
}

impl LocalStore {
    /// The pull, keeping each key's slot per table when `kept` is given (only where rows
    /// are created: a read-only pull finds no slot to keep).
    fn pull_into(
        &self,
        keys: &KeyParts<'_>,
        into: &mut [PullInto<'_>],
        create: bool,
        mut kept: Option<&mut Vec<Vec<u32>>>,
    ) -> Result<(), CoreError> {
        if let Some(k) = kept.as_deref_mut() {
            k.resize_with(self.tables.len(), Vec::new);
            k.iter_mut().for_each(Vec::clear);
        }
        for p in into.iter_mut() {
            let t = self.table(p.table)?;
            let dim = t.dim();
            let total = keys.total(p.classes);
            check_len(p.table, p.values.len(), total, dim)?;
            let mut slots = match kept.as_deref_mut() {
                Some(k) if create => {
                    let slots = &mut k[p.table.index()];
                    slots.resize(total, u32::MAX);
                    Some(&mut slots[..])
                }
                _ => None,
            };
            let mut at = 0;
            for s in 0..keys.num_shards() {
                for r in keys.ranges(s, p.classes) {
                    let (n, m) = (r.len(), r.len() * dim);
                    let out = &mut p.values[at * dim..at * dim + m];
                    match (create, slots.as_deref_mut()) {
                        (true, Some(k)) => t.pull_keeping(&keys.keys[r], out, &mut k[at..at + n]),
                        (true, None) => t.pull(&keys.keys[r], out),
                        (false, _) => t.pull_readonly(&keys.keys[r], out),
                    }
                    at += n;
                }
            }
        }
        Ok(())
    }

    /// The push, with each table's kept slots as hints where `kept` holds them for exactly
    /// its keys.
    fn push_from(
        &self,
        keys: &KeyParts<'_>,
        from: &[PushFrom<'_>],
        kept: &[Vec<u32>],
    ) -> Result<(), CoreError> {
        for p in from {
            let t = self.table(p.table)?;
            let dim = t.dim();
            let total = keys.total(p.classes);
            check_len(p.table, p.grads.len(), total, dim)?;
            let hints = kept.get(p.table.index()).filter(|k| k.len() == total);
            let mut at = 0;
            for s in 0..keys.num_shards() {
                for r in keys.ranges(s, p.classes) {
                    let (n, m) = (r.len(), r.len() * dim);
                    let grads = &p.grads[at * dim..at * dim + m];
                    match hints {
                        Some(k) => t.push_at(&keys.keys[r], grads, &k[at..at + n]),
                        None => t.push(&keys.keys[r], grads),
                    }
                    at += n;
                }
            }
        }
        Ok(())
    }
}

impl SparseStore for LocalStore {
    fn routing(&self) -> Routing {
        Routing::single()
    }

    fn dim(&self, table: TableId) -> usize {
        self.table(table).map_or(0, |t| t.dim())
    }

    fn pull(
        &self,
        keys: &KeyParts<'_>,
        into: &mut [PullInto<'_>],
        create: bool,
    ) -> Result<(), CoreError> {
        self.pull_into(keys, into, create, None)
    }

    fn push(&self, keys: &KeyParts<'_>, from: &[PushFrom<'_>]) -> Result<(), CoreError> {
        self.push_from(keys, from, &[])
    }

    /// Keeps, per table, the slot of each key's row ([`Table::pull_keeping`]), in the order
    /// of the table's pulled rows.
    fn pull_keeping(
        &self,
        keys: &KeyParts<'_>,
        into: &mut [PullInto<'_>],
        create: bool,
        kept: &mut Vec<Vec<u32>>,
    ) -> Result<(), CoreError> {
        self.pull_into(keys, into, create, Some(kept))
    }

    fn push_kept(
        &self,
        keys: &KeyParts<'_>,
        from: &[PushFrom<'_>],
        kept: &[Vec<u32>],
    ) -> Result<(), CoreError> {
        self.push_from(keys, from, kept)
    }

    fn table_rows(&self) -> u64 {
        self.tables.iter().map(|t| t.len() as u64).sum()
    }
}
