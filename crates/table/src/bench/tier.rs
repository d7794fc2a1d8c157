//! The SSD tier benchmark: a table of `keys` rows keeping `ram_rows` in RAM, filled, then
//! pulled and pushed in batches of keys drawn Zipf(s) and uniformly, as one training thread
//! does (pull, push, clock step). Reports rates, how often a batch found its rows cold, the
//! process RSS and the bytes per row in RAM and on disk.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::workload::{key_of, zipf_batches};
use crate::codec::RowPrecision;
use crate::config::{Initializer, Optimizer, Storage, TableConfig};
use crate::hash::RowRng;
use crate::Table;

/// Parameters of the tier benchmark.
#[derive(Clone, Debug)]
pub struct TierBenchConfig {
    /// Rows filled before measuring.
    pub keys: usize,
    /// Rows kept in RAM (`None`: the all-RAM table, for comparison).
    pub ram_rows: Option<u64>,
    /// Directory of the tier's files.
    pub disk_dir: PathBuf,
    /// Embedding dimension.
    pub dim: usize,
    /// How weights are stored.
    pub precision: RowPrecision,
    /// Row optimizer (its state is part of every record).
    pub optimizer: Optimizer,
    /// Keys per batch (unique within a batch).
    pub batch: usize,
    /// Batches per measured workload.
    pub batches: usize,
    /// Zipf exponent of the skewed workload.
    pub zipf_s: f64,
}

/// Rates of one workload.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadRates {
    /// The workload: `zipf` or `uniform`.
    pub keys: String,
    /// Keys pulled per second.
    pub pull_per_sec: f64,
    /// Keys pushed per second (after their pull).
    pub push_per_sec: f64,
    /// Share of pulled keys whose rows were cold (brought back from disk).
    pub cold_share: f64,
}

/// What the tier benchmark measured.
#[derive(Clone, Debug, Serialize)]
pub struct TierBenchReport {
    /// Rows in the table.
    pub rows: usize,
    /// Rows in RAM at the end.
    pub ram_rows: usize,
    /// Rows created per second while filling.
    pub fill_rows_per_sec: f64,
    /// The workloads' rates.
    pub workloads: Vec<WorkloadRates>,
    /// Resident memory of the process at the end, bytes (`VmRSS`).
    pub rss_bytes: u64,
    /// Peak resident memory of the process, bytes (`VmHWM`).
    pub peak_rss_bytes: u64,
    /// Bytes the table holds in RAM.
    pub table_bytes: usize,
    /// RAM per cold row (metadata and index entry), bytes.
    pub ram_bytes_per_cold_row: f64,
    /// File bytes per cold row.
    pub disk_bytes_per_cold_row: f64,
    /// Key and stored floats of a row, bytes.
    pub payload_bytes_per_row: usize,
}

/// `VmRSS` and `VmHWM` of this process from `/proc/self/status` (0 where unreadable).
pub fn rss() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Runs the tier benchmark.
pub fn run_tier_bench(cfg: &TierBenchConfig) -> Result<TierBenchReport, crate::TableError> {
    let table = Table::new(TableConfig {
        name: "bench".into(),
        dim: cfg.dim,
        optimizer: cfg.optimizer.clone(),
        init: Initializer::Uniform {
            low: -0.01,
            high: 0.01,
        },
        seed: 1,
        precision: cfg.precision,
        initial_capacity: cfg.keys,
        storage: cfg.ram_rows.map(|r| Storage {
            ram_rows: Some(r),
            ram_bytes: None,
            disk_dir: cfg.disk_dir.clone(),
        }),
        ..TableConfig::default()
    })?;
    let dim = cfg.dim;
    let mut out = vec![0f32; cfg.batch * dim];
    let grads = vec![0.001f32; cfg.batch * dim];
    let start = Instant::now();
    let mut keys = Vec::with_capacity(cfg.batch);
    for lo in (0..cfg.keys).step_by(cfg.batch) {
        keys.clear();
        keys.extend((lo..(lo + cfg.batch).min(cfg.keys)).map(|i| key_of(i as u64)));
        table.pull(&keys, &mut out[..keys.len() * dim]);
        table.advance_step();
    }
    let fill_rows_per_sec = cfg.keys as f64 / start.elapsed().as_secs_f64();
    let zipf = zipf_batches(cfg.keys, cfg.zipf_s, cfg.batch, cfg.batches, 7);
    let mut rng = RowRng::new(3, 9);
    let uniform: Vec<Vec<u64>> = (0..cfg.batches)
        .map(|_| {
            let mut b: Vec<u64> = (0..cfg.batch)
                .map(|_| key_of(rng.next_u64() % cfg.keys as u64))
                .collect();
            b.sort_unstable();
            b.dedup();
            b
        })
        .collect();
    let mut workloads = Vec::new();
    for (name, batches) in [("zipf", &zipf), ("uniform", &uniform)] {
        let (mut pull_s, mut push_s, mut n) = (0f64, 0f64, 0usize);
        let promoted_before = table.stats().promoted;
        for b in batches.iter() {
            let t = Instant::now();
            table.pull(b, &mut out[..b.len() * dim]);
            pull_s += t.elapsed().as_secs_f64();
            let t = Instant::now();
            table.push(b, &grads[..b.len() * dim]);
            push_s += t.elapsed().as_secs_f64();
            table.advance_step();
            n += b.len();
        }
        workloads.push(WorkloadRates {
            keys: name.into(),
            pull_per_sec: n as f64 / pull_s,
            push_per_sec: n as f64 / push_s,
            cold_share: (table.stats().promoted - promoted_before) as f64 / n as f64,
        });
    }
    let st = table.stats();
    let (rss_bytes, peak_rss_bytes) = rss();
    let per_cold = |x: f64| {
        if st.cold_rows == 0 {
            0.0
        } else {
            x / st.cold_rows as f64
        }
    };
    Ok(TierBenchReport {
        rows: st.rows,
        ram_rows: st.rows - st.cold_rows,
        fill_rows_per_sec,
        workloads,
        rss_bytes,
        peak_rss_bytes,
        table_bytes: st.bytes,
        ram_bytes_per_cold_row: per_cold(st.cold_ram_bytes as f64),
        disk_bytes_per_cold_row: per_cold(st.disk_bytes as f64),
        payload_bytes_per_row: st.payload_bytes_per_row,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tier_bench_keeps_its_budget_and_finds_cold_rows() {
        let dir = tempfile::tempdir().unwrap();
        let r = run_tier_bench(&TierBenchConfig {
            keys: 20_000,
            ram_rows: Some(2_000),
            disk_dir: dir.path().into(),
            dim: 8,
            precision: RowPrecision::F16,
            optimizer: Optimizer::Sgd { lr: 0.1 },
            batch: 512,
            batches: 10,
            zipf_s: 1.1,
        })
        .unwrap();
        assert_eq!((r.rows, r.ram_rows), (20_000, 2_000));
        // Uniform keys over 10x the budget: most pulls find their row cold.
        let uniform = &r.workloads[1];
        assert!(uniform.cold_share > 0.8, "{r:?}");
        assert!(r.workloads[0].cold_share < uniform.cold_share, "{r:?}");
        // f16 dim 8 with SGD: 2 stamps and 4 words of weights a record.
        assert_eq!(r.disk_bytes_per_cold_row, 24.0);
    }
}
