//! Deltas: rows changed and keys removed since a version.

use std::collections::VecDeque;

/// Whether a row stamped `version` was written after version `v`: its stamp is above `v`, or
/// saturated (`u32::MAX`: such rows are always reported).
#[inline]
pub(crate) fn written_after(version: u32, v: u64) -> bool {
    version as u64 > v || version == u32::MAX
}

/// Most tombstones kept; older ones are dropped and flagged via `Delta::removed_truncated`.
pub const MAX_TOMBSTONES: usize = 1 << 20;

/// Bounded log of removed keys with the version stamp of their removal.
#[derive(Default)]
pub struct TombstoneLog {
    entries: VecDeque<(u64, u64)>,
    /// Highest stamp dropped from the log (queries at older versions are incomplete).
    dropped_up_to: Option<u64>,
}

impl TombstoneLog {
    /// Records a removal.
    pub fn push(&mut self, key: u64, stamp: u64) {
        if self.entries.len() >= MAX_TOMBSTONES {
            if let Some((_, v)) = self.entries.pop_front() {
                self.dropped_up_to = Some(self.dropped_up_to.map_or(v, |d| d.max(v)));
            }
        }
        self.entries.push_back((key, stamp));
    }

    /// Keys removed with stamp `> v`, and whether the answer may be incomplete.
    pub fn since(&self, v: u64) -> (Vec<u64>, bool) {
        let keys = self
            .entries
            .iter()
            .filter(|&&(_, s)| s > v)
            .map(|&(k, _)| k)
            .collect();
        (keys, self.dropped_up_to.is_some_and(|d| d > v))
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.entries.capacity() * 16
    }
}

/// Changes since a version. Apply `removed` first, then `upserts` (a key evicted and then
/// re-created appears in both).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Delta {
    /// Keys of changed or created rows.
    pub keys: Vec<u64>,
    /// Packed full rows (weights + optimizer state), `row_stride` floats per key.
    pub rows: Vec<f32>,
    /// Floats per row in `rows`.
    pub row_stride: usize,
    /// Keys removed (evicted or deleted).
    pub removed: Vec<u64>,
    /// The table version this delta is complete up to; pass it to the next `changed_since`.
    pub version: u64,
    /// True if old tombstones were dropped and `removed` may miss keys (take a full snapshot).
    pub removed_truncated: bool,
}

impl Delta {
    /// Iterates `(key, full_row)` pairs.
    pub fn upserts(&self) -> impl Iterator<Item = (u64, &[f32])> {
        self.keys
            .iter()
            .copied()
            .zip(self.rows.chunks_exact(self.row_stride.max(1)))
    }
}
