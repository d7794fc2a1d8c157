//! The sparse side of a snapshot: per table a hash map key -> row of weights, and the
//! worker's [`SparseStore`] over them (an absent id reads as zeros, exactly what the trainer's
//! `Table::pull_readonly` returns in evaluation).

use hashbrown::HashMap;
use sparta_core::{check_len, CoreError, KeyParts, PullInto, PushFrom, SparseStore, TableId};

use sparta_export::format::TableData;

type FixedMap = HashMap<u64, u32, foldhash::fast::FixedState>;

/// One table's weights: key -> row of `dim` floats (rows in one buffer, freed slots reused).
#[derive(Clone, Debug)]
pub struct RowMap {
    dim: usize,
    index: FixedMap,
    rows: Vec<f32>,
    free: Vec<u32>,
    /// Rows per key tag (the logical table in the top 8 bits of a key).
    tag_rows: Box<[u64; 256]>,
}

impl RowMap {
    /// An empty map of rows `dim` wide.
    pub fn new(dim: usize) -> RowMap {
        RowMap {
            dim,
            index: FixedMap::default(),
            rows: Vec::new(),
            free: Vec::new(),
            tag_rows: Box::new([0; 256]),
        }
    }

    /// Weights per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Rows whose key has tag `tag` (the rows of one logical table).
    pub fn rows_of_tag(&self, tag: u8) -> u64 {
        self.tag_rows[tag as usize]
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no rows are held.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The weights of `key`.
    pub fn get(&self, key: u64) -> Option<&[f32]> {
        self.index.get(&key).map(|&s| {
            let s = s as usize * self.dim;
            &self.rows[s..s + self.dim]
        })
    }

    /// Inserts or overwrites `key`.
    pub fn upsert(&mut self, key: u64, weights: &[f32]) {
        let dim = self.dim;
        let slot = match self.index.get(&key) {
            Some(&s) => s,
            None => {
                let s = match self.free.pop() {
                    Some(s) => s,
                    None => {
                        self.rows.resize(self.rows.len() + dim, 0.0);
                        (self.rows.len() / dim - 1) as u32
                    }
                };
                self.index.insert(key, s);
                self.tag_rows[(key >> 56) as usize] += 1;
                s
            }
        };
        let s = slot as usize * dim;
        self.rows[s..s + dim].copy_from_slice(weights);
    }

    /// Removes `key`; returns whether it was present.
    pub fn remove(&mut self, key: u64) -> bool {
        match self.index.remove(&key) {
            Some(s) => {
                self.free.push(s);
                self.tag_rows[(key >> 56) as usize] -= 1;
                true
            }
            None => false,
        }
    }

    /// Applies one table of a version: removals first, then upserts.
    pub fn apply(&mut self, t: &TableData) {
        for &k in &t.removed {
            self.remove(k);
        }
        self.index
            .reserve(t.keys.len().saturating_sub(self.free.len()));
        for (&k, w) in t.keys.iter().zip(t.weights.chunks_exact(self.dim)) {
            self.upsert(k, w);
        }
    }

    /// Calls `f(key, weights)` for every row.
    pub fn for_each(&self, mut f: impl FnMut(u64, &[f32])) {
        for (&k, &s) in &self.index {
            let s = s as usize * self.dim;
            f(k, &self.rows[s..s + self.dim]);
        }
    }

    /// Bytes held (index + rows).
    pub fn bytes(&self) -> usize {
        self.index.allocation_size() + self.rows.capacity() * 4 + self.free.capacity() * 4
    }
}

/// The sparse side of a snapshot, as the worker's lookup code sees it: the job's physical
/// tables in [`TableId`] order, by name.
#[derive(Clone, Debug, Default)]
pub struct Tables {
    maps: Vec<(String, RowMap)>,
}

impl Tables {
    /// Empty maps for the named tables of the given dims, in [`TableId`] order.
    pub fn new(tables: impl IntoIterator<Item = (String, usize)>) -> Tables {
        Tables {
            maps: tables
                .into_iter()
                .map(|(n, dim)| (n, RowMap::new(dim)))
                .collect(),
        }
    }

    fn get(&self, table: TableId) -> Result<&RowMap, CoreError> {
        self.maps
            .get(table.index())
            .map(|(_, m)| m)
            .ok_or_else(|| CoreError::Training(format!("this export has no table {}", table.0)))
    }

    /// The table named `name`.
    pub fn by_name(&self, name: &str) -> Option<&RowMap> {
        self.maps.iter().find(|(n, _)| n == name).map(|(_, m)| m)
    }

    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut RowMap> {
        self.maps
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, m)| m)
    }

    /// (name, map) of every table, in [`TableId`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &RowMap)> {
        self.maps.iter().map(|(n, m)| (n.as_str(), m))
    }
}

impl SparseStore for Tables {
    fn routing(&self) -> sparta_core::Routing {
        sparta_core::Routing::single()
    }

    fn dim(&self, table: TableId) -> usize {
        self.get(table).map_or(0, RowMap::dim)
    }

    fn pull(
        &self,
        keys: &KeyParts<'_>,
        into: &mut [PullInto<'_>],
        _create: bool,
    ) -> Result<(), CoreError> {
        for p in into.iter_mut() {
            let t = self.get(p.table)?;
            let dim = t.dim;
            check_len(p.table, p.values.len(), keys.total(p.classes), dim)?;
            let mut rows = p.values.chunks_exact_mut(dim);
            for s in 0..keys.num_shards() {
                for r in keys.ranges(s, p.classes) {
                    for (&k, dst) in keys.keys[r].iter().zip(&mut rows) {
                        match t.get(k) {
                            Some(w) => dst.copy_from_slice(w),
                            // What `Table::pull_readonly` returns for an absent id.
                            None => dst.fill(0.0),
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn push(&self, _keys: &KeyParts<'_>, _from: &[PushFrom<'_>]) -> Result<(), CoreError> {
        Err(CoreError::Training(
            "a serving snapshot is read-only".into(),
        ))
    }

    fn table_rows(&self) -> u64 {
        self.iter().map(|(_, t)| t.len() as u64).sum()
    }
}
