//! Memory: each physical table built as the job builds it, filled with rows, its bytes read back
//! (`Table::stats`), and the PS count whose shards hold their share under the memory cap.

use anyhow::{bail, Result};
use sparta_core::routing::SLOTS;
use sparta_core::Routing;
use sparta_table::{RowMeta, Table, TableConfig};

/// Rows a table is measured with at most: enough that a shard's fixed costs (its first blocks,
/// the arena's first regions, the pre-sized index) weigh little, small enough to take a
/// fraction of a second (the default job's `embedding` table: 163 bytes a row at 200k rows,
/// 155 at 1M, 151-152 at 4M and 10M; `wide`: 37.5, 33, 29.5-31).
pub const MAX_SAMPLE_ROWS: u64 = 1_000_000;

/// One physical table's bytes, measured.
#[derive(Clone, Debug)]
pub struct TableBytes {
    /// Rows it was measured with.
    pub rows: u64,
    /// `Table::stats().bytes_per_row`: every byte the table holds (rows, free slots, index,
    /// block tables, sketches, tombstones) over its rows.
    pub bytes_per_row: f64,
    /// Bytes of one row's payload: key and floats (weights + optimizer state).
    pub payload_bytes_per_row: usize,
    /// What the memory cap counts beyond the table's bytes (`Table::used_bytes` less
    /// `Table::bytes` of a table that removed nothing: the tombstone log at its cap).
    pub reserve_bytes: u64,
}

/// Builds the table `cfg` describes (`Table::new`, as a PS shard builds its part) and inserts
/// `rows` rows (`insert_raw`: admission does not apply, the rows are what a shard holds
/// after admitting them) with distinct keys of the logical tables `tags`, round robin.
pub fn measure_table(cfg: &TableConfig, tags: &[u8], rows: u64) -> Result<TableBytes> {
    let table = Table::new(cfg.clone())?;
    let row = vec![0.0f32; table.row_stride()];
    let tags: &[u8] = if tags.is_empty() { &[0] } else { tags };
    for i in 0..rows {
        let tag = u64::from(tags[(i % tags.len() as u64) as usize]);
        // The low 56 bits of a key are a hash of the feature value, never all zero.
        let low = (sparta_table::mix64(i) & ((1 << 56) - 1)).max(1);
        table.insert_raw((tag << 56) | low, &row, RowMeta::default())?;
    }
    let stats = table.stats();
    Ok(TableBytes {
        rows: stats.rows as u64,
        bytes_per_row: stats.bytes_per_row,
        payload_bytes_per_row: stats.payload_bytes_per_row,
        reserve_bytes: table.used_bytes().saturating_sub(stats.bytes) as u64,
    })
}

/// What one shard holds, for a PS count: the part of every table routed to it and its slice
/// of the dense parameters, as the cap counts them.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardBytes {
    /// Per table: rows of the largest shard (the routing's slots spread over the shards).
    pub rows: Vec<u64>,
    /// Per table: those rows times the table's bytes per row.
    pub table_bytes: Vec<u64>,
    /// The tables' reserves (see [`TableBytes::reserve_bytes`]).
    pub reserve_bytes: u64,
    /// The dense slice, at `sparta_ps::server::DENSE_BYTES_PER_PARAM` per parameter.
    pub dense_bytes: u64,
}

impl ShardBytes {
    /// Everything the cap counts.
    pub fn total(&self) -> u64 {
        self.table_bytes.iter().sum::<u64>() + self.reserve_bytes + self.dense_bytes
    }
}

/// Share of the keys the fullest of `n` shards holds: its slots over all slots
/// ([`Routing::even`]: contiguous runs of slots, some one longer than others).
fn largest_share(n: usize) -> f64 {
    let slots = Routing::even(n).slots_per_shard();
    slots.into_iter().max().unwrap_or(SLOTS) as f64 / SLOTS as f64
}

/// What the fullest of `n` shards holds when table `t` has `ids[t]` rows of `bytes[t]`.
pub fn shard_bytes(ids: &[u64], bytes: &[TableBytes], dense_params: usize, n: usize) -> ShardBytes {
    let share = largest_share(n);
    let rows: Vec<u64> = ids
        .iter()
        .map(|&i| (i as f64 * share).ceil() as u64)
        .collect();
    let table_bytes = rows
        .iter()
        .zip(bytes)
        .map(|(&r, b)| (r as f64 * b.bytes_per_row).ceil() as u64)
        .collect();
    ShardBytes {
        rows,
        table_bytes,
        reserve_bytes: bytes.iter().map(|b| b.reserve_bytes).sum(),
        dense_bytes: sparta_proto::dense_slice(dense_params, 0, n).1 as u64
            * sparta_ps::server::DENSE_BYTES_PER_PARAM,
    }
}

/// The fewest shards (at most [`SLOTS`]: a shard owns at least one slot) whose fullest holds
/// at most `budget` bytes.
pub fn fewest_shards(
    ids: &[u64],
    bytes: &[TableBytes],
    dense_params: usize,
    budget: u64,
) -> Result<usize> {
    let fixed = shard_bytes(&vec![0; ids.len()], bytes, dense_params, SLOTS);
    if fixed.total() > budget {
        bail!(
            "a shard needs {} before any row (the tables' tombstone reserves and its dense \
             slice), more than the {} it may fill: give the machines more memory",
            super::human_bytes(fixed.total()),
            super::human_bytes(budget)
        );
    }
    // The share shrinks as 1/n: start where the rows alone would fit, then walk up.
    let rows: f64 = ids
        .iter()
        .zip(bytes)
        .map(|(&i, b)| i as f64 * b.bytes_per_row)
        .sum();
    let room = (budget - fixed.total()).max(1) as f64;
    let mut n = ((rows / room).floor() as usize).clamp(1, SLOTS);
    while n > 1 && shard_bytes(ids, bytes, dense_params, n - 1).total() <= budget {
        n -= 1;
    }
    while shard_bytes(ids, bytes, dense_params, n).total() > budget {
        if n == SLOTS {
            bail!(
                "even {SLOTS} shards (one routing slot each) hold more than {} each: give the \
                 machines more memory",
                super::human_bytes(budget)
            );
        }
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(per_row: f64) -> TableBytes {
        TableBytes {
            rows: 1000,
            bytes_per_row: per_row,
            payload_bytes_per_row: 0,
            reserve_bytes: 1000,
        }
    }

    #[test]
    fn a_measured_table_counts_its_rows_and_the_tombstone_reserve() {
        let cfg = TableConfig {
            dim: 8,
            ..TableConfig::default()
        };
        let b = measure_table(&cfg, &[3, 4], 50_000).unwrap();
        assert_eq!(b.rows, 50_000);
        // Key, metadata, 8 weights and the optimizer's state at least; some index and slab
        // overhead on top.
        assert!(b.bytes_per_row > b.payload_bytes_per_row as f64, "{b:?}");
        assert!(
            b.bytes_per_row < 4.0 * b.payload_bytes_per_row as f64,
            "{b:?}"
        );
        assert!(b.reserve_bytes > 0, "{b:?}");
    }

    #[test]
    fn the_fewest_shards_are_the_first_count_that_fits() {
        let b = [bytes(100.0)];
        let ids = [1_000_000u64];
        // 100 MB of rows; a shard may fill 30 MB: 4 shards (25 MB each), not 3 (33 MB).
        let n = fewest_shards(&ids, &b, 0, 30_000_000).unwrap();
        assert_eq!(n, 4);
        assert!(shard_bytes(&ids, &b, 0, 4).total() <= 30_000_000);
        assert!(shard_bytes(&ids, &b, 0, 3).total() > 30_000_000);
        // Room for everything: one shard.
        assert_eq!(fewest_shards(&ids, &b, 0, 1 << 30).unwrap(), 1);
        // Not even the reserve fits.
        assert!(fewest_shards(&ids, &b, 0, 500).is_err());
    }

    #[test]
    fn the_fullest_shard_holds_its_slots_share() {
        let b = [bytes(1.0)];
        // 3 shards of 16384 slots: runs of 5461 or 5462 slots.
        let s = shard_bytes(&[16_384_000], &b, 30, 3);
        assert_eq!(s.rows, vec![5_462_000]);
        assert_eq!(s.dense_bytes, 10 * sparta_ps::server::DENSE_BYTES_PER_PARAM);
    }
}
