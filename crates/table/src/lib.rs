//! Sparse embedding tables for CTR training: billions of u64 ids → fixed-stride rows of
//! weights + optimizer state, stored in pooled slabs behind a lean sharded hash index.
//!
//! * [`Table::pull`] / [`Table::push`]: batch lookup-or-create and in-place optimizer updates,
//!   grouped by shard (one lock per shard per batch) with software prefetch.
//! * Admission (count-min sketch or hashed probability), incremental eviction, version-stamped
//!   deltas, raw row access for checkpoints, memory statistics.
//! * `bench` (with the non-default `bench` feature): the table benchmark against `dashmap` and
//!   `scc` baselines, run by `cargo run --release -p sparta-table --features bench --example
//!   table_bench`.
//!
//! # Layout
//! A key is mixed (murmur3 `fmix64`) before any use, since its top byte is the feature field.
//! The high 32 bits of the mix pick the shard (fast range) and a 6-bit tag; the low 32 bits the
//! home position in the shard's index. The index is a linear-probing array of `u32` entries
//! (`slot << 6 | tag`, ~4.7 bytes per row at load 0.85, arbitrary capacity so growth keeps the
//! load high; backward-shift deletion, no tombstones). The key itself lives only in the row:
//! `[key: 2 words][last_step][version][count, only if eviction uses min_count][floats]`.
//! Rows come in power-of-two blocks (~32 KiB) from one arena per table made of large 2 MiB
//! aligned regions advised for transparent huge pages; freed rows form an intrusive free list.
//!
//! # Concurrency
//! One `parking_lot::Mutex` per shard (64 by default), each on its own cache lines. A batch
//! takes each shard's lock once; with 4096-key batches that is 64 uncontended lock pairs
//! (~1-2 µs) against ~1 ms of row work per batch, so the lock costs < 0.5 %, and a shard is
//! held only for its ~64 keys. Each pull/push of one key is atomic; concurrent pushes of one
//! key serialize (no lost updates).
//!
//! # Versions
//! Rows are stamped `version() + 1` (read under the shard lock, `u32`, saturating: saturated
//! stamps are always reported) on creation and push; `version()` increments after each push
//! batch. `changed_since(v)` returns rows with stamp `> v` and tombstones logged after `v`.

mod arena;
#[cfg(feature = "bench")]
pub mod bench;
mod clock;
mod codec;
mod config;
mod delta;
mod error;
mod evict;
mod hash;
mod index;
mod init;
mod maintain;
pub mod optim;
mod prefetch;
mod shard;
mod sketch;
mod slab;
mod table;
mod tier;
mod transfer;

pub use codec::{RowPrecision, WeightBytes};
pub use config::{
    Admission, Eviction, Initializer, Optimizer, Storage, TableConfig, MAX_ROWS_PER_SHARD,
};
pub use delta::Delta;
pub use error::TableError;
pub use evict::{EvictReason, EvictStats, Evictions, EVICT_SCAN_MIN, EVICT_SCAN_PER_KEY};
pub use hash::mix64;
pub use init::init_row;
pub use maintain::TableStats;
pub use slab::RowMeta;
pub use table::Table;
