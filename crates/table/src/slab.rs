//! Pooled row storage: fixed-stride rows in blocks drawn from the table's huge-page arena,
//! with an intrusive free list.
//!
//! A row is `stride` `u32` words: `[key_lo, key_hi, last_step, version, (count), floats...]`.
//! A free slot has `last_step == FREE_STEP` and keeps the next free slot in its first word,
//! so the free list costs no memory beyond the rows themselves.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::arena::Arena;

/// `last_step` value marking a free slot (the step clock saturates below it).
pub const FREE_STEP: u32 = u32::MAX;
/// No slot.
pub const NO_SLOT: u32 = u32::MAX;

/// Word offsets inside a row.
pub const W_KEY: usize = 0;
/// Offset of the last-pull step stamp.
pub const W_STEP: usize = 2;
/// Offset of the version stamp.
pub const W_VERSION: usize = 3;
/// Offset of the pull counter (present only when eviction uses `min_count`).
pub const W_COUNT: usize = 4;

/// Target bytes per block (a block is `2^k` rows).
const BLOCK_TARGET_BYTES: usize = 32 << 10;

/// Rows per block for a row of `stride` words (a power of two).
pub fn block_rows(stride: usize) -> usize {
    let rows = (BLOCK_TARGET_BYTES / (stride * 4)).max(1);
    1 << rows.ilog2()
}

/// One shard's row pool: blocks taken from the table's shared [`Arena`].
pub struct Slab {
    stride: usize,
    arena: Arc<Arena>,
    block_shift: u32,
    blocks: Vec<NonNull<u32>>,
    high_water: u32,
    free_head: u32,
    live: usize,
}

// SAFETY: the blocks are disjoint memory owned by this slab for the arena's lifetime (the Arc
// keeps the arena alive); the slab is only accessed through `&`/`&mut`, like a `Vec`.
unsafe impl Send for Slab {}
// SAFETY: shared access only reads (`&self` methods never write through the block pointers).
unsafe impl Sync for Slab {}

impl Slab {
    /// Empty pool of rows with `stride` words each, drawing blocks from `arena`.
    pub fn new(stride: usize, arena: Arc<Arena>) -> Self {
        let block_shift = block_rows(stride).trailing_zeros();
        Slab {
            stride,
            arena,
            block_shift,
            blocks: Vec::new(),
            high_water: 0,
            free_head: NO_SLOT,
            live: 0,
        }
    }

    /// Rows in use.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Slots ever handed out (scan bound; includes free ones).
    pub fn high_water(&self) -> u32 {
        self.high_water
    }

    /// Bytes held by this slab's block table (the blocks are counted by the arena).
    pub fn bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<NonNull<u32>>()
    }

    /// Takes a slot from the free list or the end of the pool; `None` when `max_slots` reached.
    pub fn alloc(&mut self, max_slots: usize) -> Option<u32> {
        let slot = if self.free_head != NO_SLOT {
            let slot = self.free_head;
            self.free_head = self.row(slot)[W_KEY];
            slot
        } else {
            if self.high_water as usize >= max_slots {
                return None;
            }
            let slot = self.high_water;
            if (slot as usize >> self.block_shift) == self.blocks.len() {
                self.blocks.push(self.arena.block());
            }
            // SAFETY: `slot` lies in the block just ensured; the row's `stride` words are inside
            // that block and owned by this slab. Zeroing initialises them before any reference
            // to the row is formed.
            unsafe { std::ptr::write_bytes(self.row_raw(slot), 0, self.stride) };
            self.high_water += 1;
            slot
        };
        self.live += 1;
        Some(slot)
    }

    /// Raw pointer to a row (slot must be below the allocated blocks).
    #[inline(always)]
    fn row_raw(&self, slot: u32) -> *mut u32 {
        let s = slot as usize;
        let block = self.blocks[s >> self.block_shift];
        block
            .as_ptr()
            .wrapping_add((s & ((1 << self.block_shift) - 1)) * self.stride)
    }

    /// Returns a slot to the free list.
    pub fn free(&mut self, slot: u32) {
        let head = self.free_head;
        let row = self.row_mut(slot);
        row[W_STEP] = FREE_STEP;
        row[W_KEY] = head;
        self.free_head = slot;
        self.live -= 1;
    }

    /// Whether `slot` holds a live row.
    #[inline]
    pub fn is_live(&self, slot: u32) -> bool {
        self.row(slot)[W_STEP] != FREE_STEP
    }

    /// The words of one row (`slot < high_water()`).
    #[inline(always)]
    pub fn row(&self, slot: u32) -> &[u32] {
        assert!(slot < self.high_water, "slot out of range");
        // SAFETY: slots below `high_water` are initialised rows inside blocks owned by this
        // slab (alive while `self.arena` is); `&self` guarantees no concurrent `&mut`.
        unsafe { std::slice::from_raw_parts(self.row_raw(slot), self.stride) }
    }

    /// The words of one row, mutable (`slot < high_water()`).
    #[inline(always)]
    pub fn row_mut(&mut self, slot: u32) -> &mut [u32] {
        assert!(slot < self.high_water, "slot out of range");
        // SAFETY: as in `row`; `&mut self` guarantees exclusive access, and rows of distinct
        // slots never overlap.
        unsafe { std::slice::from_raw_parts_mut(self.row_raw(slot), self.stride) }
    }

    /// Pointer to the start of a row (for prefetching only).
    #[inline(always)]
    pub fn row_ptr(&self, slot: u32) -> *const u32 {
        self.row_raw(slot)
    }

    /// Key stored in a row.
    #[inline(always)]
    pub fn key(&self, slot: u32) -> u64 {
        let r = self.row(slot);
        r[W_KEY] as u64 | ((r[W_KEY + 1] as u64) << 32)
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

/// Writes a key into row words.
#[inline(always)]
pub fn set_key(row: &mut [u32], key: u64) {
    row[W_KEY] = key as u32;
    row[W_KEY + 1] = (key >> 32) as u32;
}
