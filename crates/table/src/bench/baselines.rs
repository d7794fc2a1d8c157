//! Baseline stores (`dashmap`, `scc`) holding `key -> row` with the same optimizer math.

use crate::config::{Optimizer, TableConfig};
use crate::init::init_row;
use crate::{optim, Table};

type Hasher = foldhash::fast::FixedState;

/// The operations the benchmark drives on every structure.
pub trait Store: Sync {
    /// Lookup-or-create and copy weights.
    fn pull(&self, keys: &[u64], out: &mut [f32]);
    /// Apply gradients in place.
    fn push(&self, keys: &[u64], grads: &[f32]);
}

impl Store for Table {
    fn pull(&self, keys: &[u64], out: &mut [f32]) {
        Table::pull(self, keys, out)
    }
    fn push(&self, keys: &[u64], grads: &[f32]) {
        Table::push(self, keys, grads)
    }
}

/// Shared row parameters of the baselines.
struct RowSpec {
    cfg: TableConfig,
    floats: usize,
}

impl RowSpec {
    fn new_row(&self, key: u64) -> Vec<f32> {
        let mut row = vec![0.0; self.floats];
        init_row(
            &self.cfg.init,
            &self.cfg.optimizer,
            key,
            self.cfg.seed,
            self.cfg.dim,
            &mut row,
        );
        row
    }
}

/// `DashMap<u64, Vec<f32>>` (foldhash).
pub struct DashStore {
    map: dashmap::DashMap<u64, Vec<f32>, Hasher>,
    spec: RowSpec,
}

impl DashStore {
    /// Empty store sized for `capacity` rows.
    pub fn new(cfg: &TableConfig, capacity: usize) -> Self {
        DashStore {
            map: dashmap::DashMap::with_capacity_and_hasher(capacity, Hasher::default()),
            spec: RowSpec {
                cfg: cfg.clone(),
                floats: cfg.row_floats(),
            },
        }
    }
}

impl Store for DashStore {
    fn pull(&self, keys: &[u64], out: &mut [f32]) {
        let d = self.spec.cfg.dim;
        for (k, o) in keys.iter().zip(out.chunks_exact_mut(d)) {
            if let Some(r) = self.map.get(k) {
                o.copy_from_slice(&r[..d]);
                continue;
            }
            let r = self.map.entry(*k).or_insert_with(|| self.spec.new_row(*k));
            o.copy_from_slice(&r[..d]);
        }
    }
    fn push(&self, keys: &[u64], grads: &[f32]) {
        let d = self.spec.cfg.dim;
        let opt: &Optimizer = &self.spec.cfg.optimizer;
        for (k, g) in keys.iter().zip(grads.chunks_exact(d)) {
            if let Some(mut r) = self.map.get_mut(k) {
                optim::apply(opt, &mut r, g);
            }
        }
    }
}

/// `scc::HashMap<u64, Box<[f32]>>` (foldhash).
pub struct SccStore {
    map: scc::HashMap<u64, Box<[f32]>, Hasher>,
    spec: RowSpec,
}

impl SccStore {
    /// Empty store sized for `capacity` rows.
    pub fn new(cfg: &TableConfig, capacity: usize) -> Self {
        SccStore {
            map: scc::HashMap::with_capacity_and_hasher(capacity, Hasher::default()),
            spec: RowSpec {
                cfg: cfg.clone(),
                floats: cfg.row_floats(),
            },
        }
    }
}

impl Store for SccStore {
    fn pull(&self, keys: &[u64], out: &mut [f32]) {
        let d = self.spec.cfg.dim;
        for (k, o) in keys.iter().zip(out.chunks_exact_mut(d)) {
            if self
                .map
                .read_sync(k, |_, r| o.copy_from_slice(&r[..d]))
                .is_some()
            {
                continue;
            }
            let e = self
                .map
                .entry_sync(*k)
                .or_insert_with(|| self.spec.new_row(*k).into_boxed_slice());
            o.copy_from_slice(&e.get()[..d]);
        }
    }
    fn push(&self, keys: &[u64], grads: &[f32]) {
        let d = self.spec.cfg.dim;
        let opt: &Optimizer = &self.spec.cfg.optimizer;
        for (k, g) in keys.iter().zip(grads.chunks_exact(d)) {
            self.map.update_sync(k, |_, r| optim::apply(opt, r, g));
        }
    }
}
