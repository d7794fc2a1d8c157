//! Lean open-addressing index of one shard: `u32` entries (26-bit slab slot + 6-bit hash tag),
//! linear probing, backward-shift deletion (no tombstones), arbitrary (non power of two)
//! capacity via fast range reduction so the load factor stays high after growth.
//!
//! Keys live only in the slab; the tag filters ~63/64 of the slab reads on probe mismatches.

use crate::hash::fast_range;

const EMPTY: u32 = u32::MAX;
const TAG_BITS: u32 = 6;
const TAG_MASK: u32 = (1 << TAG_BITS) - 1;
/// Grow when `len > capacity * MAX_LOAD`.
pub const MAX_LOAD: f64 = 0.85;
/// Target load right after sizing or growth.
const GROWTH: f64 = 1.5;

/// Tag of a mixed hash (bits independent of shard choice and home position).
#[inline(always)]
pub fn tag_of(h: u64) -> u32 {
    ((h >> 32) as u32) & TAG_MASK
}

/// Home-position hash of a mixed hash.
#[inline(always)]
fn pos_hash(h: u64) -> u32 {
    h as u32
}

/// The slot → key-hash lookup the index needs for growth and deletion.
pub trait SlotHasher {
    /// Mixed hash of the key stored at `slot`.
    fn hash_of(&self, slot: u32) -> u64;
}

/// One shard's index.
pub struct Index {
    entries: Box<[u32]>,
    len: usize,
}

impl Index {
    /// Index sized for `expected` entries without growth. Keys spread binomially over shards,
    /// so 2 % headroom (many standard deviations at scale) keeps a shard from growing 1.5x
    /// just above its expected size.
    pub fn with_expected(expected: usize) -> Self {
        let want = if expected == 0 {
            0.0
        } else {
            expected as f64 * 1.02 + 64.0
        };
        let cap = ((want / MAX_LOAD).ceil() as usize + 1).max(16);
        Index {
            entries: vec![EMPTY; cap].into_boxed_slice(),
            len: 0,
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Entry capacity.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.entries.len() * 4
    }

    /// Pointer to the home entry of `h` (for prefetching only).
    #[inline(always)]
    pub fn home_ptr(&self, h: u64) -> *const u32 {
        let pos = fast_range(pos_hash(h), self.entries.len());
        // In bounds: fast_range returns < len.
        self.entries[pos..].as_ptr()
    }

    /// Finds `(position, slot)` of the entry whose slab key equals `key`.
    #[inline(always)]
    pub fn find(&self, h: u64, key: u64, key_of: impl Fn(u32) -> u64) -> Option<(usize, u32)> {
        let cap = self.entries.len();
        let tag = tag_of(h);
        let mut pos = fast_range(pos_hash(h), cap);
        loop {
            let e = self.entries[pos];
            if e == EMPTY {
                return None;
            }
            if e & TAG_MASK == tag {
                let slot = e >> TAG_BITS;
                if key_of(slot) == key {
                    return Some((pos, slot));
                }
            }
            pos += 1;
            if pos == cap {
                pos = 0;
            }
        }
    }

    /// Inserts a new entry (caller guarantees the key is absent); grows first if needed.
    pub fn insert(&mut self, h: u64, slot: u32, hasher: &impl SlotHasher) {
        if (self.len + 1) as f64 > self.entries.len() as f64 * MAX_LOAD {
            let new_cap = ((self.entries.len() as f64 * GROWTH) as usize).max(16);
            self.rehash(new_cap, hasher);
        }
        self.place(h, slot);
        self.len += 1;
    }

    fn place(&mut self, h: u64, slot: u32) {
        let cap = self.entries.len();
        let mut pos = fast_range(pos_hash(h), cap);
        while self.entries[pos] != EMPTY {
            pos += 1;
            if pos == cap {
                pos = 0;
            }
        }
        self.entries[pos] = (slot << TAG_BITS) | tag_of(h);
    }

    fn rehash(&mut self, new_cap: usize, hasher: &impl SlotHasher) {
        let old = std::mem::replace(&mut self.entries, vec![EMPTY; new_cap].into_boxed_slice());
        for &e in old.iter().filter(|&&e| e != EMPTY) {
            let slot = e >> TAG_BITS;
            self.place(hasher.hash_of(slot), slot);
        }
    }

    /// Removes the entry at `pos` by backward-shifting the rest of its probe run.
    pub fn remove_at(&mut self, pos: usize, hasher: &impl SlotHasher) {
        let cap = self.entries.len();
        let mut hole = pos;
        let mut j = pos;
        loop {
            j += 1;
            if j == cap {
                j = 0;
            }
            let e = self.entries[j];
            if e == EMPTY {
                break;
            }
            let home = fast_range(pos_hash(hasher.hash_of(e >> TAG_BITS)), cap);
            let dist = |a: usize, b: usize| if b >= a { b - a } else { b + cap - a };
            if dist(home, hole) < dist(home, j) {
                self.entries[hole] = e;
                hole = j;
            }
        }
        self.entries[hole] = EMPTY;
        self.len -= 1;
    }
}

impl Index {
    /// Slot of the first entry in `h`'s probe run whose tag matches, or `u32::MAX` if the run
    /// ends first. Reads only the index, so the row can be prefetched before the key check.
    #[inline(always)]
    pub fn candidate(&self, h: u64) -> u32 {
        let cap = self.entries.len();
        let tag = tag_of(h);
        let mut pos = fast_range(pos_hash(h), cap);
        loop {
            let e = self.entries[pos];
            if e == EMPTY {
                return u32::MAX;
            }
            if e & TAG_MASK == tag {
                return e >> TAG_BITS;
            }
            pos += 1;
            if pos == cap {
                pos = 0;
            }
        }
    }
}
