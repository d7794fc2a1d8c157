//! The sparse side of a snapshot: per table a hash map key -> row of weights kept in the
//! export's stored form (f32, f16, bf16 or int8 with its scale: a compact table takes its
//! compact bytes in RAM here too) and decoded when a request pulls it, and the worker's
//! [`SparseStore`] over them (an absent id reads as zeros, exactly what the trainer's
//! `Table::pull_readonly` returns in evaluation).

use hashbrown::HashMap;
use sparta_core::{check_len, CoreError, KeyParts, PullInto, PushFrom, SparseStore, TableId};
use sparta_table::{RowPrecision, WeightBytes};

use sparta_export::format::TableData;

type FixedMap = HashMap<u64, u32, foldhash::fast::FixedState>;

/// One table's weights: key -> row of `dim` weights in their stored form (rows in one
/// buffer, freed slots reused).
#[derive(Clone, Debug)]
pub struct RowMap {
    dim: usize,
    codec: WeightBytes,
    /// Bytes of one row's stored weights.
    row_bytes: usize,
    index: FixedMap,
    rows: Vec<u8>,
    free: Vec<u32>,
    /// Rows per key tag (the logical table in the top 8 bits of a key).
    tag_rows: Box<[u64; 256]>,
}

impl RowMap {
    /// An empty map of f32 rows `dim` wide.
    pub fn new(dim: usize) -> RowMap {
        RowMap::with_dtype(dim, RowPrecision::F32)
    }

    /// An empty map of rows of `dim` weights stored as `dtype`.
    pub fn with_dtype(dim: usize, dtype: RowPrecision) -> RowMap {
        RowMap {
            dim,
            codec: WeightBytes::new(dtype, dim),
            row_bytes: dtype.weight_bytes(dim),
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

    /// How the rows are stored.
    pub fn dtype(&self) -> RowPrecision {
        self.codec.precision()
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

    /// Whether `key` has a row.
    pub fn contains(&self, key: u64) -> bool {
        self.index.contains_key(&key)
    }

    /// The stored weights of `key`.
    pub fn get_stored(&self, key: u64) -> Option<&[u8]> {
        self.index.get(&key).map(|&s| self.slot(s))
    }

    /// The weights of `key` decoded into `out` (`dim` floats); false (and `out` untouched)
    /// when `key` has no row.
    #[inline]
    pub fn get_into(&self, key: u64, out: &mut [f32]) -> bool {
        match self.get_stored(key) {
            Some(b) => {
                self.codec.decode(b, out);
                true
            }
            None => false,
        }
    }

    /// The weights of `key`, decoded.
    pub fn get(&self, key: u64) -> Option<Vec<f32>> {
        let mut out = vec![0f32; self.dim];
        self.get_into(key, &mut out).then_some(out)
    }

    fn slot(&self, s: u32) -> &[u8] {
        let at = s as usize * self.row_bytes;
        &self.rows[at..at + self.row_bytes]
    }

    /// Inserts or overwrites `key` with stored weights `stored` (this map's dtype, one row).
    pub fn upsert_stored(&mut self, key: u64, stored: &[u8]) {
        debug_assert_eq!(stored.len(), self.row_bytes);
        let n = self.row_bytes;
        let slot = match self.index.get(&key) {
            Some(&s) => s,
            None => {
                let s = match self.free.pop() {
                    Some(s) => s,
                    None => {
                        self.rows.resize(self.rows.len() + n, 0);
                        (self.rows.len() / n.max(1) - 1) as u32
                    }
                };
                self.index.insert(key, s);
                self.tag_rows[(key >> 56) as usize] += 1;
                s
            }
        };
        let at = slot as usize * n;
        self.rows[at..at + n].copy_from_slice(stored);
    }

    /// Inserts or overwrites `key` with weights `weights` (`dim` floats), stored as this map
    /// stores its rows (a compact dtype rounds values that are not values of it).
    pub fn upsert(&mut self, key: u64, weights: &[f32]) {
        let mut bytes = Vec::with_capacity(self.row_bytes);
        self.codec.encode(weights, &mut bytes, key);
        self.upsert_stored(key, &bytes);
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

    /// Applies one table of a version: removals first, then upserts of its stored rows as
    /// they are. Fails, changing nothing, when `t`'s dim or dtype is not this map's.
    pub fn apply(&mut self, t: &TableData) -> Result<(), String> {
        if t.dim != self.dim || t.dtype != self.dtype() {
            return Err(format!(
                "table `{}` has dim {} / dtype {}, the loaded one {} / {}",
                t.name,
                t.dim,
                t.dtype.name(),
                self.dim,
                self.dtype().name()
            ));
        }
        for &k in &t.removed {
            self.remove(k);
        }
        let new_rows = t.keys.len().saturating_sub(self.free.len());
        self.index.reserve(new_rows);
        // At most this many rows more (an empty map: exactly the full export's rows).
        self.rows.reserve(new_rows * self.row_bytes);
        for (i, &k) in t.keys.iter().enumerate() {
            self.upsert_stored(k, t.stored_row(i));
        }
        Ok(())
    }

    /// Calls `f(key, weights)` for every row (decoded).
    pub fn for_each(&self, mut f: impl FnMut(u64, &[f32])) {
        let mut row = vec![0f32; self.dim];
        for (&k, &s) in &self.index {
            self.codec.decode(self.slot(s), &mut row);
            f(k, &row);
        }
    }

    /// Bytes held (index + rows).
    pub fn bytes(&self) -> usize {
        self.index.allocation_size() + self.rows.capacity() + self.free.capacity() * 4
    }
}

/// The sparse side of a snapshot, as the worker's lookup code sees it: the job's physical
/// tables in [`TableId`] order, by name.
#[derive(Clone, Debug, Default)]
pub struct Tables {
    maps: Vec<(String, RowMap)>,
}

impl Tables {
    /// Empty maps for the named tables of the given dims and dtypes, in [`TableId`] order.
    pub fn new(tables: impl IntoIterator<Item = (String, usize, RowPrecision)>) -> Tables {
        Tables {
            maps: tables
                .into_iter()
                .map(|(n, dim, dtype)| (n, RowMap::with_dtype(dim, dtype)))
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
                        if !t.get_into(k, dst) {
                            // What `Table::pull_readonly` returns for an absent id.
                            dst.fill(0.0);
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

#[cfg(test)]
mod tests {
    use super::*;

    const DTYPES: [RowPrecision; 4] = [
        RowPrecision::F32,
        RowPrecision::F16,
        RowPrecision::Bf16,
        RowPrecision::Int8,
    ];

    /// `n` rows of `dim` weights at `dtype` as an export holds them (stored bytes of values
    /// a table of that precision decodes to).
    fn table_data(dtype: RowPrecision, dim: usize, n: u64, removed: Vec<u64>) -> TableData {
        let mut codec = WeightBytes::new(dtype, dim);
        let mut stored = Vec::new();
        let keys: Vec<u64> = (0..n).map(|i| ((i % 7) << 56) | (i * 7919 + 1)).collect();
        for &k in &keys {
            let w: Vec<f32> = (0..dim)
                .map(|j| ((k as usize + 13 * j) % 211) as f32 * 0.011 - 1.1)
                .collect();
            codec.encode(&w, &mut stored, k);
        }
        TableData {
            name: "embedding".into(),
            dim,
            dtype,
            keys,
            stored,
            removed,
        }
    }

    /// Every dtype: the map keeps each row's stored bytes as they came and decodes a pulled
    /// row to exactly the values the export's decoding gives; a delta in the same form
    /// overwrites and removes; another dtype or dim is refused, changing nothing.
    #[test]
    fn rows_stay_in_their_stored_form_and_decode_bit_for_bit() {
        for dtype in DTYPES {
            let dim = 5;
            let full = table_data(dtype, dim, 300, Vec::new());
            let mut map = RowMap::with_dtype(dim, dtype);
            map.apply(&full).unwrap();
            assert_eq!(map.len(), 300);
            let want = full.weights();
            let mut row = vec![0f32; dim];
            for (i, &k) in full.keys.iter().enumerate() {
                assert_eq!(map.get_stored(k), Some(full.stored_row(i)));
                assert!(map.get_into(k, &mut row));
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&row), bits(&want[i * dim..(i + 1) * dim]), "{dtype:?}");
            }
            let mut delta = table_data(dtype, dim, 10, vec![full.keys[20], 12345]);
            delta.stored.reverse();
            map.apply(&delta).unwrap();
            assert_eq!(map.len(), 299);
            assert!(!map.contains(full.keys[20]));
            assert_eq!(map.get_stored(delta.keys[3]), Some(delta.stored_row(3)));
            let other = if dtype == RowPrecision::Bf16 {
                RowPrecision::F16
            } else {
                RowPrecision::Bf16
            };
            assert!(map.apply(&table_data(other, dim, 3, Vec::new())).is_err());
            assert!(map
                .apply(&table_data(dtype, dim + 1, 3, Vec::new()))
                .is_err());
            assert_eq!(map.len(), 299);
        }
    }

    /// Serving RAM per row by dtype, measured: the rows buffer and the whole map (index
    /// included) of 100,000 rows of dim 16, printed; the rows take 4, 2, 2 and 1 bytes a
    /// weight (int8 plus its 4-byte scale).
    #[test]
    fn compact_rows_take_their_stored_bytes_in_serving_ram() {
        let (dim, n) = (16, 100_000u64);
        let mut rows_bytes = Vec::new();
        for dtype in DTYPES {
            let mut map = RowMap::with_dtype(dim, dtype);
            map.apply(&table_data(dtype, dim, n, Vec::new())).unwrap();
            let rows = map.rows.capacity() as f64 / n as f64;
            let total = map.bytes() as f64 / n as f64;
            eprintln!(
                "serving RAM, dim {dim}, {n} rows, {}: rows {rows:.1} B/row, map {total:.1} B/row",
                dtype.name()
            );
            assert_eq!(map.rows.len(), n as usize * dtype.weight_bytes(dim));
            rows_bytes.push(map.rows.len());
        }
        assert_eq!(rows_bytes[0], 2 * rows_bytes[1]);
        assert_eq!(rows_bytes[1], rows_bytes[2]);
        assert_eq!(rows_bytes[3] * 64, rows_bytes[0] * 20);
    }
}
