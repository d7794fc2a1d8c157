//! One shard: index + slab (+ admission sketch), always used under the shard lock.

use std::sync::Arc;

use crate::arena::Arena;
use crate::config::MAX_ROWS_PER_SHARD;
use crate::hash::mix64;
use crate::index::{Index, SlotHasher};
use crate::sketch::Sketch;
use crate::slab::{set_key, Slab, W_COUNT, W_STEP, W_VERSION};

impl SlotHasher for Slab {
    #[inline]
    fn hash_of(&self, slot: u32) -> u64 {
        mix64(self.key(slot))
    }
}

/// Row metadata kept beside the floats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RowMeta {
    /// Step of the last pull (eviction clock).
    pub last_step: u32,
    /// Version stamp of the last push or creation.
    pub version: u32,
    /// Pulls counted (only kept when eviction uses `min_count`, else 0).
    pub count: u32,
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
