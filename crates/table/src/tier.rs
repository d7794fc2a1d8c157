//! The SSD tier of one shard: rows beyond the shard's RAM budget ("cold" rows) live in a
//! local file of fixed-size records, one record per row holding exactly the row's stored
//! words (the same bits as in RAM: a compact row stays compact, nothing is rounded again).
//!
//! RAM per cold row: its metadata (`key`, `last_step`, `version`: 16 bytes, 20 with the
//! `min_count` counter) in a dense array indexed by record, and one `u32` entry of the same
//! lean index the RAM rows use (4.7 bytes at load 0.85): 21 bytes for a table sized for its
//! rows (`initial_capacity`), up to 27 past that (the array grows by a quarter, the index by
//! half), against 16 + 4 x `row floats` + 5 bytes for a RAM row (149 at dim 16 with Adagrad). The file is an unnamed
//! temporary file in `disk_dir` (`O_TMPFILE`): it disappears with the process, even after
//! `kill -9`; a job's durable state is its checkpoints, which read cold rows like RAM ones.
//!
//! Freed records (a row promoted back to RAM, evicted or removed) form a free list through
//! their metadata, as the slab's free slots do, and new cold rows reuse them first.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::hash::mix64;
use crate::index::{Index, SlotHasher};
use crate::shard::RowMeta;
use crate::slab::{FREE_STEP, NO_SLOT};

/// Records read per call when a whole tier is streamed (checkpoints, deltas).
const SCAN_RECORDS: usize = 1024;

/// Metadata of one record: `[key_lo, key_hi, last_step, version]`; a free record has
/// `last_step == FREE_STEP` and the next free record in its first word.
type Meta = [u32; 4];

struct Metas<'a>(&'a [Meta]);

impl SlotHasher for Metas<'_> {
    #[inline]
    fn hash_of(&self, rec: u32) -> u64 {
        mix64(key_of(&self.0[rec as usize]))
    }
}

#[inline]
fn key_of(m: &Meta) -> u64 {
    m[0] as u64 | (m[1] as u64) << 32
}

/// The cold rows of one shard.
pub(crate) struct ColdRows {
    file: File,
    /// Stored words per record (the row without its metadata words).
    words: usize,
    index: Index,
    meta: Vec<Meta>,
    /// Pull counters per record (only when eviction uses `min_count`).
    counts: Option<Vec<u32>>,
    free_head: u32,
    live: usize,
}

impl ColdRows {
    /// An empty tier of records of `words` stored words, in a new unnamed file in `dir`, its
    /// index and metadata sized for `expected` cold rows (no growth slack up to there).
    pub(crate) fn new(
        dir: &Path,
        words: usize,
        has_count: bool,
        expected: usize,
    ) -> io::Result<ColdRows> {
        Ok(ColdRows {
            file: tempfile::tempfile_in(dir)?,
            words,
            index: Index::with_expected(expected),
            meta: Vec::with_capacity(expected),
            counts: has_count.then(|| Vec::with_capacity(expected)),
            free_head: NO_SLOT,
            live: 0,
        })
    }

    /// Rows held.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Records handed out (live and free): the scan bound.
    pub(crate) fn high(&self) -> u32 {
        self.meta.len() as u32
    }

    /// RAM held for the cold rows: their metadata and index.
    pub(crate) fn bytes(&self) -> usize {
        self.index.bytes()
            + self.meta.capacity() * std::mem::size_of::<Meta>()
            + self.counts.as_ref().map_or(0, |c| c.capacity() * 4)
    }

    /// Bytes of the file (every record handed out, live or free).
    pub(crate) fn disk_bytes(&self) -> u64 {
        self.meta.len() as u64 * self.record_bytes()
    }

    fn record_bytes(&self) -> u64 {
        self.words as u64 * 4
    }

    /// Whether record `rec` holds a row.
    pub(crate) fn is_live(&self, rec: u32) -> bool {
        self.meta[rec as usize][2] != FREE_STEP
    }

    /// Key of a live record.
    pub(crate) fn key(&self, rec: u32) -> u64 {
        key_of(&self.meta[rec as usize])
    }

    /// Metadata of a live record.
    pub(crate) fn meta(&self, rec: u32) -> RowMeta {
        let m = &self.meta[rec as usize];
        RowMeta {
            last_step: m[2],
            version: m[3],
            count: self.counts.as_ref().map_or(0, |c| c[rec as usize]),
        }
    }

    /// `(index position, record)` of `key` (mixed hash `h`), if cold.
    pub(crate) fn find(&self, key: u64, h: u64) -> Option<(usize, u32)> {
        let meta = &self.meta;
        self.index.find(h, key, |r| key_of(&meta[r as usize]))
    }

    /// Writes a row (its stored words and metadata) as a new cold row; the key must not be
    /// cold already.
    pub(crate) fn put(
        &mut self,
        key: u64,
        h: u64,
        meta: RowMeta,
        stored: &[u32],
    ) -> io::Result<()> {
        debug_assert_eq!(stored.len(), self.words);
        let rec = if self.free_head != NO_SLOT {
            self.free_head
        } else {
            self.meta.len() as u32
        };
        self.file.write_all_at(
            bytemuck::cast_slice(stored),
            rec as u64 * self.record_bytes(),
        )?;
        let m = [key as u32, (key >> 32) as u32, meta.last_step, meta.version];
        if rec == self.free_head {
            self.free_head = self.meta[rec as usize][0];
            self.meta[rec as usize] = m;
        } else {
            if self.meta.len() == self.meta.capacity() {
                // Grow by a quarter, not double: the metadata is most of a cold row's RAM.
                self.meta.reserve_exact(self.meta.len() / 4 + 1024);
            }
            self.meta.push(m);
            if let Some(c) = &mut self.counts {
                c.reserve_exact(self.meta.capacity() - c.len());
                c.push(0);
            }
        }
        if let Some(c) = &mut self.counts {
            c[rec as usize] = meta.count;
        }
        self.index.insert(h, rec, &Metas(&self.meta));
        self.live += 1;
        Ok(())
    }

    /// Reads record `rec`'s stored words into `out`.
    pub(crate) fn read(&self, rec: u32, out: &mut [u32]) -> io::Result<()> {
        self.file.read_exact_at(
            bytemuck::cast_slice_mut(&mut out[..self.words]),
            rec as u64 * self.record_bytes(),
        )
    }

    /// Drops the cold row at index position `pos` (record `rec`): its record joins the free
    /// list. Returns its metadata.
    pub(crate) fn take(&mut self, pos: usize, rec: u32) -> RowMeta {
        let meta = self.meta(rec);
        self.index.remove_at(pos, &Metas(&self.meta));
        self.meta[rec as usize] = [self.free_head, 0, FREE_STEP, 0];
        self.free_head = rec;
        self.live -= 1;
        meta
    }

    /// Calls `f(key, stored words, meta)` for every live record with `keep(meta)`, reading the
    /// file in runs of records in file order (a checkpoint or a delta streams the tier without
    /// loading it).
    pub(crate) fn for_each(
        &self,
        mut keep: impl FnMut(&RowMeta) -> bool,
        mut f: impl FnMut(u64, &[u32], RowMeta),
    ) -> io::Result<()> {
        let mut buf = vec![0u32; SCAN_RECORDS * self.words];
        let high = self.meta.len();
        let mut at = 0;
        while at < high {
            let n = SCAN_RECORDS.min(high - at);
            let wanted: Vec<u32> = (at..at + n)
                .map(|r| r as u32)
                .filter(|&r| self.is_live(r) && keep(&self.meta(r)))
                .collect();
            if !wanted.is_empty() {
                // One read from the first to the last wanted record of the run.
                let (first, last) = (wanted[0] as usize, *wanted.last().unwrap() as usize);
                let span = &mut buf[..(last + 1 - first) * self.words];
                self.file.read_exact_at(
                    bytemuck::cast_slice_mut(span),
                    first as u64 * self.record_bytes(),
                )?;
                for r in wanted {
                    let o = (r as usize - first) * self.words;
                    f(self.key(r), &span[o..o + self.words], self.meta(r));
                }
            }
            at += n;
        }
        Ok(())
    }
}

impl crate::shard::Shard {
    /// Brings `key`'s cold row back into RAM (a pull or push of it): its record is read into a
    /// fresh slot with its metadata, and freed. `None` when the key is not cold (or the slab
    /// is full). The RAM budget is enforced later, by [`Shard::demote_over_budget`].
    pub(crate) fn promote(&mut self, key: u64, h: u64) -> Option<u32> {
        let (pos, rec) = self.cold.as_ref()?.find(key, h)?;
        let slot = self.slab.alloc(crate::config::MAX_ROWS_PER_SHARD)?;
        let mw = self.meta_words;
        let cold = self.cold.as_mut().expect("checked above");
        let row = self.slab.row_mut(slot);
        if let Err(e) = cold.read(rec, &mut row[mw..]) {
            // The file this process wrote cannot be read back: the row is lost, and training
            // on would silently reset it. Nothing sensible continues from here.
            panic!("SSD tier: reading a cold row back failed: {e}");
        }
        crate::slab::set_key(row, key);
        let meta = cold.take(pos, rec);
        self.set_meta(slot, meta);
        self.index.insert(h, slot, &self.slab);
        Some(slot)
    }

    /// Reads a cold row without promoting it (evaluation, serving, a primary's copy to its
    /// backups): its stored words into `out` and its metadata, or `None` when not cold.
    pub(crate) fn read_cold(&self, key: u64, h: u64, out: &mut [u32]) -> Option<RowMeta> {
        let cold = self.cold.as_ref()?;
        let (_, rec) = cold.find(key, h)?;
        if let Err(e) = cold.read(rec, out) {
            panic!("SSD tier: reading a cold row failed: {e}");
        }
        Some(cold.meta(rec))
    }

    /// Moves RAM rows to the tier until at most `ram_budget` remain, least recently pulled
    /// first, by a clock hand over the slab: a row pulled at step `step` or the one before
    /// (the rows of the batches in flight) is passed over; once the hand has passed over a
    /// whole lap of such rows without moving one, it moves every row it reaches until it
    /// finds an older one again (so a call costs O(rows moved) amortized, never a sweep per
    /// row). A row whose write fails stays in RAM (logged): the budget is exceeded, never a
    /// row lost.
    /// Returns the rows moved.
    pub(crate) fn demote_over_budget(&mut self, step: u32) -> u64 {
        if self.cold.is_none() || self.slab.live() <= self.ram_budget {
            return 0;
        }
        let mut moved = 0;
        let hw = self.slab.high_water();
        let mw = self.meta_words;
        while self.slab.live() > self.ram_budget {
            if self.hand >= hw {
                self.hand = 0;
            }
            let slot = self.hand;
            self.hand += 1;
            if !self.slab.is_live(slot) {
                continue;
            }
            let meta = self.meta(slot);
            let recent = meta.last_step.saturating_add(1) >= step;
            if recent && self.passed < hw as u64 {
                self.passed += 1;
                continue;
            }
            if !recent {
                self.passed = 0;
            }
            let key = self.slab.key(slot);
            let h = mix64(key);
            let cold = self.cold.as_mut().expect("checked above");
            if let Err(e) = cold.put(key, h, meta, &self.slab.row(slot)[mw..]) {
                tracing::error!(error = %e, "SSD tier: writing a cold row failed; it stays in RAM");
                return moved;
            }
            let slab = &self.slab;
            let (pos, _) = self
                .index
                .find(h, key, |s| slab.key(s))
                .expect("a live slab row is indexed");
            self.index.remove_at(pos, &self.slab);
            self.slab.free(slot);
            moved += 1;
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(step: u32, version: u32, count: u32) -> RowMeta {
        RowMeta {
            last_step: step,
            version,
            count,
        }
    }

    #[test]
    fn rows_written_read_back_and_records_are_reused() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ColdRows::new(dir.path(), 3, true, 0).unwrap();
        for k in 0..100u64 {
            let row = [k as u32, 2 * k as u32, 7];
            c.put(k, mix64(k), meta(k as u32, 1, 5), &row).unwrap();
        }
        assert_eq!(c.len(), 100);
        assert_eq!(c.disk_bytes(), 100 * 12);
        let mut out = [0u32; 3];
        let (pos, rec) = c.find(42, mix64(42)).unwrap();
        c.read(rec, &mut out).unwrap();
        assert_eq!(out, [42, 84, 7]);
        assert_eq!(c.meta(rec), meta(42, 1, 5));
        assert_eq!(c.take(pos, rec), meta(42, 1, 5));
        assert!(c.find(42, mix64(42)).is_none());
        // The freed record is the next one written: the file does not grow.
        c.put(1000, mix64(1000), meta(3, 4, 0), &[9, 9, 9]).unwrap();
        assert_eq!(c.disk_bytes(), 100 * 12);
        let (_, rec) = c.find(1000, mix64(1000)).unwrap();
        c.read(rec, &mut out).unwrap();
        assert_eq!(out, [9, 9, 9]);
        let mut seen = Vec::new();
        c.for_each(|m| m.version == 1, |k, row, _| seen.push((k, row[1])))
            .unwrap();
        seen.sort_unstable();
        let want: Vec<(u64, u32)> = (0..100u64)
            .filter(|&k| k != 42)
            .map(|k| (k, 2 * k as u32))
            .collect();
        assert_eq!(seen, want);
    }
}
