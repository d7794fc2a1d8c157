//! Table maintenance: eviction, deletion, deltas, raw row access, stats.

use std::sync::atomic::Ordering::Relaxed;

use serde::Serialize;

use crate::delta::Delta;
use crate::error::TableError;
use crate::hash::mix64;
use crate::slab::RowMeta;
use crate::table::{Table, Tiering};

/// Table statistics.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TableStats {
    /// Table name.
    pub name: String,
    /// Rows held.
    pub rows: usize,
    /// All bytes held: row arena + block tables + index + sketches + tombstones + shards.
    pub bytes: usize,
    /// `bytes / rows`.
    pub bytes_per_row: f64,
    /// Payload per row: 8-byte key + 4 bytes per float of the row (weights + optimizer state).
    pub payload_bytes_per_row: usize,
    /// Rows created by admission.
    pub admitted: u64,
    /// Pull sightings of ids not admitted.
    pub rejected: u64,
    /// Rows removed by eviction (all reasons).
    pub evicted: u64,
    /// Rows removed by eviction, per reason.
    pub evicted_by: crate::evict::Evictions,
    /// Rows removed by `remove`.
    pub removed: u64,
    /// Pushes to absent ids (dropped).
    pub dropped_pushes: u64,
    /// Current version.
    pub version: u64,
    /// Current step.
    pub step: u32,
    /// Shards.
    pub shards: usize,
    /// Index entries allocated over all shards.
    pub index_capacity: usize,
    /// Slab slots handed out over all shards (live + free).
    pub slab_slots: usize,
    /// Rows in the SSD tier (counted in `rows`; their RAM in `bytes`).
    pub cold_rows: usize,
    /// Cold rows brought back to RAM by a pull or push.
    pub promoted: u64,
    /// RAM rows moved to the SSD tier.
    pub demoted: u64,
    /// RAM held for the cold rows: their metadata and index entries (counted in `bytes`).
    pub cold_ram_bytes: usize,
    /// Bytes of the SSD tier's files (cold records, live and free).
    pub disk_bytes: u64,
}

impl Table {
    /// Whether `key` has a row.
    pub fn contains(&self, key: u64) -> bool {
        let h = mix64(key);
        let sh = self.shards[self.shard_of(h)].0.lock();
        sh.lookup(key, h).is_some() || sh.cold.as_ref().is_some_and(|c| c.find(key, h).is_some())
    }

    /// Deletes `key`'s row (recorded as a tombstone); returns whether it existed.
    pub fn remove(&self, key: u64) -> bool {
        let h = mix64(key);
        let (found, stamp) = {
            let mut sh = self.shards[self.shard_of(h)].0.lock();
            (sh.remove(key, h), self.stamp())
        };
        if found {
            self.counters.removed.fetch_add(1, Relaxed);
            self.tombstones.lock().push(key, stamp as u64);
        }
        found
    }

    /// Rows written (pushed or created) after version `v`, and keys removed after `v`.
    /// Costs one scan of the slabs (no second map). Rows written concurrently are reported
    /// now or by the next call with `delta.version`.
    pub fn changed_since(&self, v: u64) -> Delta {
        let version = self.version.load(Relaxed);
        let stride = self.row_floats;
        let mut delta = Delta {
            row_stride: stride,
            version,
            ..Delta::default()
        };
        let changed = |m: &RowMeta| crate::delta::written_after(m.version, v);
        for s in self.shards.iter() {
            let sh = s.0.lock();
            for slot in 0..sh.slab.high_water() {
                if !sh.slab.is_live(slot) {
                    continue;
                }
                if changed(&sh.meta(slot)) {
                    delta.keys.push(sh.slab.key(slot));
                    let at = delta.rows.len();
                    delta.rows.resize(at + stride, 0.0);
                    self.codec.decode(sh.stored(slot), &mut delta.rows[at..]);
                }
            }
            if let Some(cold) = &sh.cold {
                let read = cold.for_each(Some(v), |key, stored, _| {
                    delta.keys.push(key);
                    let at = delta.rows.len();
                    delta.rows.resize(at + stride, 0.0);
                    self.codec.decode(stored, &mut delta.rows[at..]);
                });
                self.cold_read_or_die(read);
            }
        }
        let (removed, truncated) = self.tombstones.lock().since(v);
        delta.removed = removed;
        delta.removed_truncated = truncated;
        delta
    }

    /// Calls `f(key, full_row, meta)` for every row (shard by shard, under each shard's lock;
    /// `f` must not call back into this table's shard-locking methods).
    pub fn for_each_row(&self, mut f: impl FnMut(u64, &[f32], RowMeta)) {
        for part in 0..self.shards.len() {
            self.for_each_row_in(part, &mut f);
        }
    }

    /// [`Table::for_each_row`] over internal shard `part` only (`< num_shards()`): a copy
    /// of the table streamed part by part, each part's lock held only while it is read.
    pub fn for_each_row_in(&self, part: usize, mut f: impl FnMut(u64, &[f32], RowMeta)) {
        let sh = self.shards[part].0.lock();
        let mut row = vec![0f32; self.row_floats];
        for slot in 0..sh.slab.high_water() {
            if sh.slab.is_live(slot) {
                self.codec.decode(sh.stored(slot), &mut row);
                f(sh.slab.key(slot), &row, sh.meta(slot));
            }
        }
        if let Some(cold) = &sh.cold {
            let read = cold.for_each(None, |key, stored, meta| {
                self.codec.decode(stored, &mut row);
                f(key, &row, meta);
            });
            self.cold_read_or_die(read);
        }
    }

    /// Keys removed after version `v` (evicted, forgotten or removed), and whether old
    /// tombstones were dropped so the answer may miss some (see [`Table::changed_since`]).
    pub fn removed_since(&self, v: u64) -> (Vec<u64>, bool) {
        self.tombstones.lock().since(v)
    }

    /// [`Table::for_each_row_in`] for the rows of `part` written after version `v` (`None`:
    /// every row) whose key `keep` accepts (a slot move's copy: `keep` tests the slot before
    /// the row is decoded).
    pub fn for_each_changed_in(
        &self,
        part: usize,
        v: Option<u64>,
        keep: impl Fn(u64) -> bool,
        mut f: impl FnMut(u64, &[f32], RowMeta),
    ) {
        let sh = self.shards[part].0.lock();
        let mut row = vec![0f32; self.row_floats];
        for slot in 0..sh.slab.high_water() {
            if !sh.slab.is_live(slot) {
                continue;
            }
            let (key, meta) = (sh.slab.key(slot), sh.meta(slot));
            if v.is_none_or(|v| crate::delta::written_after(meta.version, v)) && keep(key) {
                self.codec.decode(sh.stored(slot), &mut row);
                f(key, &row, meta);
            }
        }
        if let Some(cold) = &sh.cold {
            let read = cold.for_each(v, |key, stored, meta| {
                if keep(key) {
                    self.codec.decode(stored, &mut row);
                    f(key, &row, meta);
                }
            });
            self.cold_read_or_die(read);
        }
    }

    /// A failed read of the tier's own file: the rows are lost to this process, and a copy
    /// (checkpoint, delta) that skipped them would silently drop them.
    pub(crate) fn cold_read_or_die(&self, read: std::io::Result<()>) {
        if let Err(e) = read {
            panic!(
                "table {}: SSD tier: reading cold rows failed: {e}",
                self.cfg.name
            );
        }
    }

    /// Removes every row (a backup about to receive a fresh copy of its primary).
    pub fn clear(&self) {
        for part in 0..self.shards.len() {
            let mut keys = Vec::new();
            self.for_each_row_in(part, |k, _, _| keys.push(k));
            for k in keys {
                self.remove(k);
            }
        }
    }

    /// Calls `f(position, key, full_row, meta)` for each present key of `keys` (grouped by
    /// shard, under each shard's lock; absent keys are skipped): the rows a push left, as a
    /// primary sends them to its backups.
    pub fn read_raw(&self, keys: &[u64], mut f: impl FnMut(usize, u64, &[f32], RowMeta)) {
        let mut row = vec![0f32; self.row_floats];
        let mut cold = vec![0u32; self.codec.stored_words()];
        self.for_each_group(keys, Tiering::Read, |table, sh, i, slot| match slot {
            Some(s) => {
                table.codec.decode(sh.stored(s), &mut row);
                f(i, keys[i], &row, sh.meta(s));
            }
            None => {
                if let Some(meta) = sh.read_cold(keys[i], mix64(keys[i]), &mut cold) {
                    table.codec.decode(&cold, &mut row);
                    f(i, keys[i], &row, meta);
                }
            }
        });
    }

    /// Inserts or overwrites a full row (weights + optimizer state) and its metadata,
    /// bypassing admission (checkpoint restore). Restored rows are bit-identical.
    pub fn insert_raw(&self, key: u64, row: &[f32], meta: RowMeta) -> Result<(), TableError> {
        if row.len() != self.row_floats {
            return Err(TableError::RowLength {
                expected: self.row_floats,
                got: row.len(),
            });
        }
        let h = mix64(key);
        let shard = self.shard_of(h);
        let mut sh = self.shards[shard].0.lock();
        let slot = sh.slot_to_overwrite(key, h, meta, shard)?;
        self.shards[shard].1.publish(&sh);
        let seed = crate::table::rounding_seed(key, meta.last_step);
        self.codec.encode(row, sh.row_parts_mut(slot).1, seed);
        let moved = sh.demote_over_budget(self.step.load(Relaxed));
        self.counters.demoted.fetch_add(moved, Relaxed);
        Ok(())
    }

    /// Calls `f(shard, counters, increments)` with the admission sketch of every shard (the
    /// counts of ids seen but not yet admitted); nothing when admission is `Always`.
    pub fn for_each_sketch(&self, mut f: impl FnMut(usize, &[u16], u64)) {
        for (i, s) in self.shards.iter().enumerate() {
            let sh = s.0.lock();
            if let Some(sk) = &sh.sketch {
                let (c, inc) = sk.state();
                f(i, c, inc);
            }
        }
    }

    /// Restores shard `shard`'s admission sketch saved by [`Table::for_each_sketch`] (checkpoint
    /// restore). Fails when this table has no such shard or sketch, or the sizes differ (the
    /// table config changed).
    pub fn restore_sketch(
        &self,
        shard: usize,
        counters: &[u16],
        increments: u64,
    ) -> Result<(), TableError> {
        self.with_sketch(shard, |sk| sk.set_state(counters, increments))
    }

    /// Like [`Table::restore_sketch`], folding the saved sketch into the one already there
    /// (each counter the larger): a shard restored from several old shards' parts.
    pub fn merge_sketch(
        &self,
        shard: usize,
        counters: &[u16],
        increments: u64,
    ) -> Result<(), TableError> {
        self.with_sketch(shard, |sk| sk.merge_state(counters, increments))
    }

    /// Runs `f` on the admission sketch of internal shard `shard`.
    fn with_sketch(
        &self,
        shard: usize,
        f: impl FnOnce(&mut crate::sketch::Sketch) -> Result<(), crate::sketch::SketchSizeMismatch>,
    ) -> Result<(), TableError> {
        let bad = |reason: String| TableError::InvalidConfig {
            table: self.cfg.name.clone(),
            reason,
        };
        let s = self.shards.get(shard).ok_or_else(|| {
            bad(format!(
                "saved admission sketch of shard {shard}, the table has {} shards",
                self.shards.len()
            ))
        })?;
        let mut sh = s.0.lock();
        let sk = sh
            .sketch
            .as_mut()
            .ok_or_else(|| bad("saved admission sketch, but admission is `always`".into()))?;
        f(sk).map_err(|e| bad(e.to_string()))
    }

    /// Live rows per key tag: entry `t` counts the rows whose key has top byte `t` (the
    /// logical table of a key space), 256 entries. Counted incrementally under the shard
    /// locks wherever a row is created or removed (pull, admission, `insert_raw` restore,
    /// eviction, `remove`), so a read costs 256 additions per shard, never a scan of the rows.
    /// Each shard is read under its lock: exact when the table is quiescent, otherwise a
    /// per-shard-consistent snapshot (like [`Table::len`]).
    pub fn rows_by_tag(&self) -> Vec<u64> {
        let mut out = vec![0u64; 256];
        for s in self.shards.iter() {
            let sh = s.0.lock();
            for (o, &n) in out.iter_mut().zip(sh.tag_rows.iter()) {
                *o += n as u64;
            }
        }
        out
    }

    /// Statistics, including all memory held.
    pub fn stats(&self) -> TableStats {
        let mut st = TableStats {
            name: self.cfg.name.clone(),
            payload_bytes_per_row: self.cfg.payload_bytes_per_row(),
            shards: self.shards.len(),
            ..TableStats::default()
        };
        for s in self.shards.iter() {
            let sh = s.0.lock();
            st.rows += sh.rows();
            if let Some(c) = &sh.cold {
                st.cold_rows += c.len();
                st.cold_ram_bytes += c.bytes();
                st.disk_bytes += c.disk_bytes();
            }
            st.index_capacity += sh.index.capacity();
            st.slab_slots += sh.slab.high_water() as usize;
        }
        st.bytes = self.bytes();
        st.bytes_per_row = if st.rows == 0 {
            0.0
        } else {
            st.bytes as f64 / st.rows as f64
        };
        st.admitted = self.counters.admitted.load(Relaxed);
        st.rejected = self.counters.rejected.load(Relaxed);
        st.evicted = self.counters.evicted.load(Relaxed);
        st.evicted_by = self.evictions();
        st.removed = self.counters.removed.load(Relaxed);
        st.dropped_pushes = self.counters.dropped_pushes.load(Relaxed);
        st.promoted = self.counters.promoted.load(Relaxed);
        st.demoted = self.counters.demoted.load(Relaxed);
        st.version = self.version();
        st.step = self.step();
        st
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::config::{Admission, Eviction, TableConfig};
    use crate::slab::RowMeta;
    use crate::table::Table;

    #[derive(Clone, Debug)]
    enum Op {
        Pull(Vec<u16>),
        Advance,
        Evict(usize),
        Remove(u16),
        Restore(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => prop::collection::vec(0u16..400, 1..40).prop_map(Op::Pull),
            2 => Just(Op::Advance),
            1 => (1usize..200).prop_map(Op::Evict),
            2 => (0u16..400).prop_map(Op::Remove),
            2 => (0u16..400).prop_map(Op::Restore),
        ]
    }

    /// Keys of 5 tags, a few of them at the extremes (0 and 255).
    fn key(k: u16) -> u64 {
        let tag = [0u64, 1, 7, 200, 255][k as usize % 5];
        (tag << 56) | (k as u64).wrapping_mul(0x9e37_79b9)
    }

    #[test]
    fn changed_rows_of_kept_keys_and_removals_since_a_version_are_what_a_slot_copy_reads() {
        let t = Table::new(TableConfig {
            dim: 2,
            ..TableConfig::default()
        })
        .unwrap();
        let keys: Vec<u64> = (0..300u16).map(key).collect();
        let mut out = vec![0.0; keys.len() * 2];
        t.pull(&keys, &mut out);
        let v = t.bump_version();
        let keep = |k: u64| k.is_multiple_of(3);
        let rows_of = |since: Option<u64>| {
            let mut seen = Vec::new();
            for part in 0..t.num_shards() {
                t.for_each_changed_in(part, since, keep, |k, row, m| {
                    assert_eq!(row.len(), t.row_stride());
                    assert!(since.is_none_or(|v| m.version as u64 > v));
                    seen.push(k);
                });
            }
            seen.sort_unstable();
            seen
        };
        let mut kept: Vec<u64> = keys.iter().copied().filter(|&k| keep(k)).collect();
        kept.sort_unstable();
        assert_eq!(rows_of(None), kept);
        assert_eq!(rows_of(Some(v)), Vec::<u64>::new());
        // Written after v: a push to 10 keys; removed after v: 2 others.
        let pushed = &keys[..10];
        t.push(pushed, &[0.5; 20]);
        assert!(t.remove(keys[20]) && t.remove(keys[21]));
        let mut want: Vec<u64> = pushed.iter().copied().filter(|&k| keep(k)).collect();
        want.sort_unstable();
        assert_eq!(rows_of(Some(v)), want);
        assert_eq!(t.removed_since(v), (vec![keys[20], keys[21]], false));
        assert_eq!(t.removed_since(t.version() + 1), (vec![], false));
    }

    #[test]
    fn parts_cover_every_row_once_and_clear_empties_the_table() {
        let t = Table::new(TableConfig {
            dim: 2,
            ..TableConfig::default()
        })
        .unwrap();
        let keys: Vec<u64> = (0..500u16).map(key).collect();
        let mut out = vec![0.0; keys.len() * 2];
        t.pull(&keys, &mut out);
        let mut seen = Vec::new();
        for part in 0..t.num_shards() {
            t.for_each_row_in(part, |k, row, _| {
                assert_eq!(row.len(), t.row_stride());
                seen.push(k);
            });
        }
        seen.sort_unstable();
        let mut want = keys.clone();
        want.sort_unstable();
        assert_eq!(seen, want);
        t.clear();
        assert_eq!(t.len(), 0);
        assert!(keys.iter().all(|&k| !t.contains(k)));
    }

    fn scan(t: &Table) -> Vec<u64> {
        let mut want = vec![0u64; 256];
        t.for_each_row(|k, _, _| want[(k >> 56) as usize] += 1);
        want
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
        /// `rows_by_tag` equals a scan of the keys after random pulls (with admission),
        /// evictions, removals and restores (`insert_raw` of new and existing keys).
        #[test]
        fn rows_by_tag_matches_a_scan(shards in 1usize..5, count_admission in any::<bool>(),
                                      ops in prop::collection::vec(op(), 1..80)) {
            let cfg = TableConfig {
                dim: 2,
                shards,
                admission: if count_admission {
                    Admission::Count { min_count: 2 }
                } else {
                    Admission::Always
                },
                eviction: Some(Eviction { max_idle_steps: Some(1), ..Eviction::default() }),
                ..TableConfig::default()
            };
            let t = Table::new(cfg).unwrap();
            let row = vec![0.5f32; t.row_stride()];
            for op in ops {
                match op {
                    Op::Pull(ks) => {
                        let keys: Vec<u64> = ks.iter().map(|&k| key(k)).collect();
                        let mut out = vec![0.0; keys.len() * 2];
                        t.pull(&keys, &mut out);
                    }
                    Op::Advance => {
                        t.advance_step();
                    }
                    Op::Evict(n) => {
                        t.evict(n);
                    }
                    Op::Remove(k) => {
                        t.remove(key(k));
                    }
                    Op::Restore(k) => {
                        t.insert_raw(key(k), &row, RowMeta { last_step: t.step(), ..RowMeta::default() })
                            .unwrap();
                    }
                }
                prop_assert_eq!(t.rows_by_tag(), scan(&t));
            }
            prop_assert_eq!(t.rows_by_tag().iter().sum::<u64>(), t.len() as u64);
            // A restore into a fresh table counts the same rows.
            let fresh = Table::new(t.config().clone()).unwrap();
            t.for_each_row(|k, r, m| fresh.insert_raw(k, r, m).unwrap());
            prop_assert_eq!(fresh.rows_by_tag(), scan(&t));
        }
    }
}
