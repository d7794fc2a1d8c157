//! One shard: index + slab (+ admission sketch), always used under the shard lock.

use std::sync::Arc;

use crate::arena::Arena;
use crate::config::MAX_ROWS_PER_SHARD;
use crate::hash::mix64;
use crate::index::{Index, SlotHasher};
use crate::sketch::Sketch;
use crate::slab::RowMeta;
use crate::slab::{set_key, Slab, W_COUNT, W_STEP, W_VERSION};

impl SlotHasher for Slab {
    #[inline]
    fn hash_of(&self, slot: u32) -> u64 {
        mix64(self.key(slot))
    }
}

/// One shard of a table.
pub struct Shard {
    /// Key → slot index.
    pub index: Index,
    /// Row pool.
    pub slab: Slab,
    /// Sightings of not-yet-admitted ids (admission policies other than `Always`).
    pub sketch: Option<Sketch>,
    /// Whether rows carry a pull counter word.
    pub has_count: bool,
    /// Words before the floats in a row.
    pub meta_words: usize,
    /// Live rows per key tag (the key's top 8 bits: its logical table), kept by
    /// [`Shard::create`] and [`Shard::remove`], the only paths that add or drop a row.
    /// `u32` suffices: a shard holds at most `MAX_ROWS_PER_SHARD` (< 2^26) rows.
    pub tag_rows: Box<[u32; 256]>,
    /// Rows beyond the RAM budget (the SSD tier), if the table has one.
    pub(crate) cold: Option<crate::tier::ColdRows>,
    /// Rows this shard keeps in RAM (`usize::MAX` without a tier).
    pub(crate) ram_budget: usize,
    /// The clock hand of demotion (the next slab slot it looks at).
    pub(crate) hand: u32,
    /// Recent rows the hand passed over since it last moved an older one.
    pub(crate) passed: u64,
}

/// Tag of a key: its top 8 bits (the logical table of a key space).
#[inline(always)]
pub fn key_tag(key: u64) -> usize {
    (key >> 56) as usize
}

impl Shard {
    /// Empty shard.
    pub fn new(
        stride_words: usize,
        meta_words: usize,
        expected: usize,
        sketch: Option<Sketch>,
        arena: Arc<Arena>,
    ) -> Self {
        Shard {
            index: Index::with_expected(expected),
            slab: Slab::new(stride_words, arena),
            sketch,
            has_count: meta_words > W_COUNT,
            meta_words,
            tag_rows: Box::new([0; 256]),
            cold: None,
            ram_budget: usize::MAX,
            hand: 0,
            passed: 0,
        }
    }

    /// Bytes held by this shard (its rows are counted by the arena; cold rows by their
    /// metadata and index, not their records on disk).
    pub fn bytes(&self) -> usize {
        self.cold.as_ref().map_or(0, |c| c.bytes())
            + self.index.bytes()
            + self.slab.bytes()
            + self.sketch.as_ref().map_or(0, Sketch::bytes)
            + std::mem::size_of::<[u32; 256]>()
    }

    /// Slot of `key` (hash `h`), if present.
    #[inline(always)]
    pub fn lookup(&self, key: u64, h: u64) -> Option<u32> {
        let slab = &self.slab;
        self.index.find(h, key, |s| slab.key(s)).map(|(_, s)| s)
    }

    /// Creates a row for an absent key; the caller fills the floats. `None` if the shard is full.
    pub fn create(&mut self, key: u64, h: u64, step: u32, version: u32) -> Option<u32> {
        let slot = self.slab.alloc(MAX_ROWS_PER_SHARD)?;
        let row = self.slab.row_mut(slot);
        set_key(row, key);
        row[W_STEP] = step;
        row[W_VERSION] = version;
        if self.has_count {
            row[W_COUNT] = 0;
        }
        self.index.insert(h, slot, &self.slab);
        self.tag_rows[key_tag(key)] += 1;
        Some(slot)
    }

    /// Removes `key` (in RAM or cold); returns whether it was present.
    pub fn remove(&mut self, key: u64, h: u64) -> bool {
        let slab = &self.slab;
        let found = match self.index.find(h, key, |s| slab.key(s)) {
            Some((pos, slot)) => {
                self.index.remove_at(pos, &self.slab);
                self.slab.free(slot);
                true
            }
            None => match self
                .cold
                .as_mut()
                .and_then(|c| c.find(key, h).map(|f| (c, f)))
            {
                Some((c, (pos, rec))) => {
                    c.take(pos, rec);
                    true
                }
                None => false,
            },
        };
        if found {
            self.tag_rows[key_tag(key)] -= 1;
        }
        found
    }

    /// Positions of rows: the slab's slots, then the SSD tier's records.
    pub(crate) fn positions(&self) -> u32 {
        self.slab.high_water() + self.cold.as_ref().map_or(0, |c| c.high())
    }

    /// Key and metadata of the row at position `pos` (see [`Shard::positions`]), if live.
    pub(crate) fn at_position(&self, pos: u32) -> Option<(u64, RowMeta)> {
        let hw = self.slab.high_water();
        if pos < hw {
            return self
                .slab
                .is_live(pos)
                .then(|| (self.slab.key(pos), self.meta(pos)));
        }
        let c = self.cold.as_ref()?;
        let rec = pos - hw;
        c.is_live(rec).then(|| {
            let meta = c
                .meta(rec)
                .unwrap_or_else(|e| panic!("SSD tier: reading cold rows' stamps failed: {e}"));
            (c.key(rec), meta)
        })
    }

    /// Rows held, in RAM and cold.
    pub fn rows(&self) -> usize {
        self.slab.live() + self.cold.as_ref().map_or(0, |c| c.len())
    }

    /// The slot of `key`'s row for a write that replaces it whole (restore, replication, a slot
    /// move), with `meta` set: the row found, brought back from the SSD tier, or made; the
    /// error names this part as `part` when it is full.
    pub(crate) fn slot_to_overwrite(
        &mut self,
        key: u64,
        h: u64,
        meta: RowMeta,
        part: usize,
    ) -> Result<u32, crate::error::TableError> {
        let slot = match self.lookup(key, h).or_else(|| self.promote(key, h)) {
            Some(s) => s,
            None => self.create(key, h, meta.last_step, meta.version).ok_or(
                crate::error::TableError::ShardFull {
                    shard: part,
                    rows: self.slab.live(),
                },
            )?,
        };
        self.set_meta(slot, meta);
        Ok(slot)
    }

    /// Metadata of a live row.
    #[inline]
    pub fn meta(&self, slot: u32) -> RowMeta {
        let r = self.slab.row(slot);
        RowMeta {
            last_step: r[W_STEP],
            version: r[W_VERSION],
            count: if self.has_count { r[W_COUNT] } else { 0 },
        }
    }

    /// Overwrites the metadata of a live row.
    pub fn set_meta(&mut self, slot: u32, meta: RowMeta) {
        let has_count = self.has_count;
        let r = self.slab.row_mut(slot);
        r[W_STEP] = meta.last_step.min(crate::slab::FREE_STEP - 1);
        r[W_VERSION] = meta.version;
        if has_count {
            r[W_COUNT] = meta.count;
        }
    }

    /// The stored floats (weights + optimizer state, see [`crate::codec`]) of a row.
    #[inline(always)]
    pub fn stored(&self, slot: u32) -> &[u32] {
        &self.slab.row(slot)[self.meta_words..]
    }

    /// Meta words and stored floats of a row, mutable.
    #[inline(always)]
    pub fn row_parts_mut(&mut self, slot: u32) -> (&mut [u32], &mut [u32]) {
        let mw = self.meta_words;
        self.slab.row_mut(slot).split_at_mut(mw)
    }
}

/// The SSD tier seen from the shard: rows move between the slab and [`crate::tier::ColdRows`].
impl Shard {
    /// Brings `key`'s cold row back into RAM (a pull or push of it): its record is read into a
    /// fresh slot with its metadata, and freed. `None` when the key is not cold (or the slab
    /// is full). The RAM budget is enforced later, by [`Shard::demote_over_budget`].
    pub(crate) fn promote(&mut self, key: u64, h: u64) -> Option<u32> {
        let (pos, rec) = self.cold.as_ref()?.find(key, h)?;
        let slot = self.slab.alloc(crate::config::MAX_ROWS_PER_SHARD)?;
        let mw = self.meta_words;
        let cold = self.cold.as_mut().expect("checked above");
        let row = self.slab.row_mut(slot);
        // The file this process wrote cannot be read back: the row is lost, and training on
        // would silently reset it. Nothing sensible continues from here.
        let meta = cold
            .read(rec, &mut row[mw..])
            .unwrap_or_else(|e| panic!("SSD tier: reading a cold row back failed: {e}"));
        crate::slab::set_key(row, key);
        cold.take(pos, rec);
        self.set_meta(slot, meta);
        self.index.insert(h, slot, &self.slab);
        Some(slot)
    }

    /// Reads a cold row without promoting it (evaluation, serving, a primary's copy to its
    /// backups): its stored words into `out` and its metadata, or `None` when not cold.
    pub(crate) fn read_cold(&self, key: u64, h: u64, out: &mut [u32]) -> Option<RowMeta> {
        let cold = self.cold.as_ref()?;
        let (_, rec) = cold.find(key, h)?;
        let meta = cold
            .read(rec, out)
            .unwrap_or_else(|e| panic!("SSD tier: reading a cold row failed: {e}"));
        Some(meta)
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
        let hw = self.slab.high_water();
        let mw = self.meta_words;
        let want = self.slab.live() - self.ram_budget;
        let mut victims: Vec<u32> = Vec::with_capacity(want);
        // Rows stay in the slab until written: past one lap the hand meets chosen ones again.
        let (mut looked, mut chosen) = (0u64, None::<hashbrown::HashSet<u32>>);
        while victims.len() < want {
            if self.hand >= hw {
                self.hand = 0;
            }
            let slot = self.hand;
            self.hand += 1;
            looked += 1;
            if !self.slab.is_live(slot) {
                continue;
            }
            if looked > hw as u64 {
                let seen = chosen.get_or_insert_with(|| victims.iter().copied().collect());
                if seen.contains(&slot) {
                    continue;
                }
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
            if let Some(seen) = &mut chosen {
                seen.insert(slot);
            }
            victims.push(slot);
        }
        let mut rows = Vec::with_capacity(want);
        let mut stored = Vec::with_capacity(want * (self.slab.row(victims[0]).len() - mw));
        for &slot in &victims {
            let key = self.slab.key(slot);
            rows.push((key, mix64(key), self.meta(slot)));
            stored.extend_from_slice(&self.slab.row(slot)[mw..]);
        }
        let cold = self.cold.as_mut().expect("checked above");
        let (written, error) = cold.put_batch(&rows, &stored);
        if let Some(e) = error {
            tracing::error!(error = %e, "SSD tier: writing cold rows failed; they stay in RAM");
        }
        for (&slot, &(key, h, _)) in victims.iter().zip(&rows).take(written) {
            let slab = &self.slab;
            let (pos, _) = self
                .index
                .find(h, key, |s| slab.key(s))
                .expect("a live slab row is indexed");
            self.index.remove_at(pos, &self.slab);
            self.slab.free(slot);
        }
        written as u64
    }
}
