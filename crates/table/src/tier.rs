//! The SSD tier of one shard: rows beyond the shard's RAM budget ("cold" rows) live in a
//! local file of fixed-size records, one record per row: the row's metadata words
//! (`last_step`, `version`, the `min_count` counter if kept) then exactly its stored words (the
//! same bits as in RAM: a compact row stays compact, nothing is rounded again).
//!
//! RAM per cold row: its key (8 bytes, in an array indexed by record), one `u32` entry of the
//! same lean index the RAM rows use (4.7 bytes at load 0.85), a live bit and a 64th of a
//! block's largest version (what lets a delta skip the blocks nobody wrote since): 13-14
//! bytes for a table sized for its rows (`initial_capacity`; past that the key array grows by
//! a quarter, the index by half), against 16 + 4 x `row floats` + 5 bytes for a RAM row (149 at
//! dim 16 with Adagrad). The stamps are read from disk where they are needed: a promoted or
//! copied row's with its record, an eviction scan's a block of records at a time.
//!
//! The file is an unnamed temporary file in `disk_dir` (`O_TMPFILE`): it disappears with the
//! process, even after `kill -9`; a job's durable state is its checkpoints, which read cold
//! rows like RAM ones. Freed records (a row promoted back to RAM, evicted or removed) form a
//! free list through the key array, as the slab's free slots do, and new cold rows reuse them
//! first.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::hash::mix64;
use crate::index::{Index, SlotHasher};
use crate::slab::RowMeta;
use crate::slab::NO_SLOT;

/// Records per block: the unit of the version summaries and of the stamps read for a scan.
const BLOCK: usize = 64;
/// Blocks read per call when a whole tier is streamed (checkpoints, deltas).
const SCAN_BLOCKS: usize = 16;

struct Keys<'a>(&'a [u64]);

impl SlotHasher for Keys<'_> {
    #[inline]
    fn hash_of(&self, rec: u32) -> u64 {
        mix64(self.0[rec as usize])
    }
}

/// The stamps of one block of records, read for a scan (the last block read is kept).
struct StampCache {
    block: usize,
    metas: Vec<RowMeta>,
}

/// The cold rows of one shard.
pub(crate) struct ColdRows {
    file: File,
    /// Metadata words at the start of a record (2, or 3 with the pull counter).
    meta_words: usize,
    /// Stored words per record (the row's floats as stored).
    words: usize,
    index: Index,
    /// Key of each live record; a free record holds the next free record.
    keys: Vec<u64>,
    /// One bit per record: live.
    live_bits: Vec<u64>,
    /// Per block of `BLOCK` records: the largest version written to it (never lowered).
    block_version: Vec<u32>,
    free_head: u32,
    live: usize,
    stamps: RefCell<Option<StampCache>>,
}

impl ColdRows {
    /// An empty tier of records of `words` stored words, in a new unnamed file in `dir`, its
    /// index and key array sized for `expected` cold rows (no growth slack up to there).
    pub(crate) fn new(
        dir: &Path,
        words: usize,
        has_count: bool,
        expected: usize,
    ) -> io::Result<ColdRows> {
        Ok(ColdRows {
            file: tempfile::tempfile_in(dir)?,
            meta_words: 2 + has_count as usize,
            words,
            index: Index::with_expected(expected),
            keys: Vec::with_capacity(expected),
            live_bits: Vec::with_capacity(expected.div_ceil(64)),
            block_version: Vec::with_capacity(expected.div_ceil(BLOCK)),
            free_head: NO_SLOT,
            live: 0,
            stamps: RefCell::new(None),
        })
    }

    /// Rows held.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Records handed out (live and free): the scan bound.
    pub(crate) fn high(&self) -> u32 {
        self.keys.len() as u32
    }

    /// RAM held for the cold rows: keys, index, live bits, block summaries, the stamp cache.
    pub(crate) fn bytes(&self) -> usize {
        self.index.bytes()
            + self.keys.capacity() * 8
            + self.live_bits.capacity() * 8
            + self.block_version.capacity() * 4
            + BLOCK * std::mem::size_of::<RowMeta>()
    }

    /// Bytes of the file (every record handed out, live or free).
    pub(crate) fn disk_bytes(&self) -> u64 {
        self.keys.len() as u64 * self.record_bytes()
    }

    fn record_words(&self) -> usize {
        self.meta_words + self.words
    }

    fn record_bytes(&self) -> u64 {
        self.record_words() as u64 * 4
    }

    /// Whether record `rec` holds a row.
    pub(crate) fn is_live(&self, rec: u32) -> bool {
        self.live_bits[rec as usize / 64] >> (rec % 64) & 1 == 1
    }

    fn set_live(&mut self, rec: u32, live: bool) {
        let (w, b) = (rec as usize / 64, rec % 64);
        if live {
            self.live_bits[w] |= 1 << b;
        } else {
            self.live_bits[w] &= !(1 << b);
        }
    }

    /// Key of a live record.
    pub(crate) fn key(&self, rec: u32) -> u64 {
        self.keys[rec as usize]
    }

    /// Metadata of a live record, read from disk with the rest of its block's (a scan over
    /// records in order reads each block once).
    pub(crate) fn meta(&self, rec: u32) -> io::Result<RowMeta> {
        let block = rec as usize / BLOCK;
        let mut cache = self.stamps.borrow_mut();
        if cache.as_ref().is_none_or(|c| c.block != block) {
            let mut metas = Vec::with_capacity(BLOCK);
            self.read_block(block, |_, m, _| metas.push(m), &mut Vec::new())?;
            *cache = Some(StampCache { block, metas });
        }
        let c = cache.as_ref().expect("filled above");
        Ok(c.metas[rec as usize % BLOCK])
    }

    /// `(index position, record)` of `key` (mixed hash `h`), if cold.
    pub(crate) fn find(&self, key: u64, h: u64) -> Option<(usize, u32)> {
        let keys = &self.keys;
        self.index.find(h, key, |r| keys[r as usize])
    }

    /// Writes a row (its metadata and stored words) as a new cold row; the key must not be
    /// cold already.
    #[cfg(test)]
    pub(crate) fn put(
        &mut self,
        key: u64,
        h: u64,
        meta: RowMeta,
        stored: &[u32],
    ) -> io::Result<()> {
        match self.put_batch(&[(key, h, meta)], stored) {
            (1, _) => Ok(()),
            (_, e) => Err(e.expect("a row not written has its error")),
        }
    }

    /// Writes rows `rows[i] = (key, hash, meta)` with stored words `stored[i * words..]` as new
    /// cold rows (no key cold already), records taken from the free list first, then at the
    /// end of the file; records that follow each other go out in one write. Returns how many
    /// rows, from the first, were written, and the error that stopped the rest (their records
    /// go back to the free list: those rows stay with the caller).
    pub(crate) fn put_batch(
        &mut self,
        rows: &[(u64, u64, RowMeta)],
        stored: &[u32],
    ) -> (usize, Option<io::Error>) {
        debug_assert_eq!(stored.len(), rows.len() * self.words);
        let recs: Vec<u32> = rows
            .iter()
            .map(|_| {
                if self.free_head != NO_SLOT {
                    let rec = self.free_head;
                    self.free_head = self.keys[rec as usize] as u32;
                    rec
                } else {
                    self.grow();
                    self.keys.len() as u32 - 1
                }
            })
            .collect();
        let rw = self.record_words();
        let mut buf = Vec::with_capacity(rows.len() * rw);
        for (i, (_, _, meta)) in rows.iter().enumerate() {
            buf.extend_from_slice(&[meta.last_step, meta.version, meta.count][..self.meta_words]);
            buf.extend_from_slice(&stored[i * self.words..(i + 1) * self.words]);
        }
        // Runs of consecutive records, one write each.
        let (mut written, mut error) = (0, None);
        while written < rows.len() {
            let mut end = written + 1;
            while end < rows.len() && recs[end] == recs[end - 1] + 1 {
                end += 1;
            }
            let at = recs[written] as u64 * self.record_bytes();
            if let Err(e) = self
                .file
                .write_all_at(bytemuck::cast_slice(&buf[written * rw..end * rw]), at)
            {
                error = Some(e);
                break;
            }
            written = end;
        }
        for (&rec, &(key, h, meta)) in recs.iter().zip(rows).take(written) {
            self.keys[rec as usize] = key;
            self.set_live(rec, true);
            let b = &mut self.block_version[rec as usize / BLOCK];
            *b = (*b).max(meta.version);
            let stamps = self.stamps.get_mut();
            if stamps
                .as_ref()
                .is_some_and(|c| c.block == rec as usize / BLOCK)
            {
                // The cached stamps of this block are stale now (or shorter than it).
                *stamps = None;
            }
            self.index.insert(h, rec, &Keys(&self.keys));
            self.live += 1;
        }
        for &rec in recs[written..].iter().rev() {
            self.keys[rec as usize] = self.free_head as u64;
            self.free_head = rec;
        }
        (written, error)
    }

    /// One more record at the end (free until written).
    fn grow(&mut self) {
        if self.keys.len() == self.keys.capacity() {
            // Grow by a quarter, not double: the keys are most of a cold row's RAM.
            self.keys.reserve_exact(self.keys.len() / 4 + 1024);
        }
        self.keys.push(NO_SLOT as u64);
        if self.live_bits.len() * 64 < self.keys.len() {
            self.live_bits.push(0);
        }
        if self.block_version.len() * BLOCK < self.keys.len() {
            self.block_version.push(0);
        }
    }

    /// Reads record `rec`: its stored words into `out`, its metadata returned.
    pub(crate) fn read(&self, rec: u32, out: &mut [u32]) -> io::Result<RowMeta> {
        let mut record = vec![0u32; self.record_words()];
        self.file.read_exact_at(
            bytemuck::cast_slice_mut(&mut record),
            rec as u64 * self.record_bytes(),
        )?;
        out[..self.words].copy_from_slice(&record[self.meta_words..]);
        Ok(self.meta_of(&record))
    }

    fn meta_of(&self, record: &[u32]) -> RowMeta {
        RowMeta {
            last_step: record[0],
            version: record[1],
            count: if self.meta_words > 2 { record[2] } else { 0 },
        }
    }

    /// Drops the cold row at index position `pos` (record `rec`): its record joins the free
    /// list.
    pub(crate) fn take(&mut self, pos: usize, rec: u32) {
        self.index.remove_at(pos, &Keys(&self.keys));
        self.keys[rec as usize] = self.free_head as u64;
        self.set_live(rec, false);
        self.free_head = rec;
        self.live -= 1;
    }

    /// Reads the records of block `block` in one call: `f(record, meta, stored words)` for
    /// each record handed out in it, live or not (`buf` is scratch).
    fn read_block(
        &self,
        block: usize,
        mut f: impl FnMut(u32, RowMeta, &[u32]),
        buf: &mut Vec<u32>,
    ) -> io::Result<()> {
        let first = block * BLOCK;
        let n = BLOCK.min(self.keys.len() - first);
        let rw = self.record_words();
        buf.resize(n * rw, 0);
        self.file.read_exact_at(
            bytemuck::cast_slice_mut(&mut buf[..]),
            first as u64 * self.record_bytes(),
        )?;
        for (i, record) in buf.chunks(rw).enumerate() {
            f(
                (first + i) as u32,
                self.meta_of(record),
                &record[self.meta_words..],
            );
        }
        Ok(())
    }

    /// Calls `f(key, stored words, meta)` for every live record, or with `since = Some(v)`
    /// only those written after version `v` (stamp above `v`, or saturated), reading the file
    /// in runs of blocks in file order and skipping the blocks no write since `v` touched (a
    /// checkpoint or a delta streams the tier without loading it).
    pub(crate) fn for_each(
        &self,
        since: Option<u64>,
        mut f: impl FnMut(u64, &[u32], RowMeta),
    ) -> io::Result<()> {
        let changed = |version: u32| since.is_none_or(|v| crate::delta::written_after(version, v));
        let mut buf = Vec::new();
        let blocks = self.keys.len().div_ceil(BLOCK);
        let mut b = 0;
        while b < blocks {
            // A run of wanted blocks, read in one call.
            if !changed(self.block_version[b]) || self.block_is_empty(b) {
                b += 1;
                continue;
            }
            let mut end = b + 1;
            while end < blocks && end - b < SCAN_BLOCKS && changed(self.block_version[end]) {
                end += 1;
            }
            let (first, last) = (b * BLOCK, (end * BLOCK).min(self.keys.len()));
            let rw = self.record_words();
            buf.resize((last - first) * rw, 0);
            self.file.read_exact_at(
                bytemuck::cast_slice_mut(&mut buf[..]),
                first as u64 * self.record_bytes(),
            )?;
            for (i, record) in buf.chunks(rw).enumerate() {
                let rec = (first + i) as u32;
                let meta = self.meta_of(record);
                if self.is_live(rec) && changed(meta.version) {
                    f(self.keys[rec as usize], &record[self.meta_words..], meta);
                }
            }
            b = end;
        }
        Ok(())
    }

    fn block_is_empty(&self, block: usize) -> bool {
        const _: () = assert!(BLOCK == 64, "one word of live bits per block");
        self.live_bits[block] == 0
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
            c.put(k, mix64(k), meta(k as u32, 1 + (k / 64) as u32, 5), &row)
                .unwrap();
        }
        assert_eq!(c.len(), 100);
        // Three stamps and three stored words a record.
        assert_eq!(c.disk_bytes(), 100 * 24);
        let mut out = [0u32; 3];
        let (pos, rec) = c.find(42, mix64(42)).unwrap();
        assert_eq!(c.read(rec, &mut out).unwrap(), meta(42, 1, 5));
        assert_eq!(out, [42, 84, 7]);
        assert_eq!(c.meta(rec).unwrap(), meta(42, 1, 5));
        assert_eq!(
            c.meta(70).unwrap(),
            meta(70, 2, 5),
            "another block's stamps"
        );
        c.take(pos, rec);
        assert!(c.find(42, mix64(42)).is_none() && !c.is_live(rec));
        // The freed record is the next one written: the file does not grow.
        c.put(1000, mix64(1000), meta(3, 4, 0), &[9, 9, 9]).unwrap();
        assert_eq!(c.disk_bytes(), 100 * 24);
        let (_, rec) = c.find(1000, mix64(1000)).unwrap();
        assert_eq!(c.read(rec, &mut out).unwrap(), meta(3, 4, 0));
        assert_eq!(out, [9, 9, 9]);
        assert_eq!(
            c.meta(rec).unwrap(),
            meta(3, 4, 0),
            "the cached block sees the write"
        );
        let mut seen = Vec::new();
        c.for_each(None, |k, row, _| seen.push((k, row[1])))
            .unwrap();
        seen.sort_unstable();
        let mut want: Vec<(u64, u32)> = (0..100u64)
            .filter(|&k| k != 42)
            .map(|k| (k, 2 * k as u32))
            .collect();
        want.push((1000, 9));
        assert_eq!(seen, want);
        // Since version 1: the second block's rows (version 2) and the rewritten record.
        let mut since = Vec::new();
        c.for_each(Some(1), |k, _, m| since.push((k, m.version)))
            .unwrap();
        since.sort_unstable();
        let mut want: Vec<(u64, u32)> = (64..100u64).map(|k| (k, 2)).collect();
        want.push((1000, 4));
        assert_eq!(since, want);
    }
}
