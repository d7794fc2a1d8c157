//! Table benchmark: the sparta table against `dashmap` and `scc` baselines on the same
//! Zipf-distributed batch workload (pull, push, and mixed pull-then-push as in training).
//!
//! Memory is measured, not estimated: live heap bytes via [`CountingAlloc`] when the binary
//! installs it as its global allocator, else the process RSS delta around the fill.

mod alloc;
mod baselines;
mod tier;
mod workload;

use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use alloc::CountingAlloc;
pub use baselines::{DashStore, SccStore, Store};
pub use tier::{rss, run_tier_bench, TierBenchConfig, TierBenchReport, WorkloadRates};
pub use workload::{key_of, zipf_batches, Zipf};

use crate::config::{Initializer, Optimizer, TableConfig};
use crate::maintain::TableStats;
use crate::Table;

/// Benchmark parameters.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchConfig {
    /// Distinct keys filled before measuring (all rows exist).
    pub keys: usize,
    /// Embedding dimension (optimizer: per-weight Adagrad).
    pub dim: usize,
    /// Largest thread count; runs use 1 and `threads` threads.
    pub threads: usize,
    /// Keys per batch (unique within a batch).
    pub batch: usize,
    /// Zipf exponent of the access distribution.
    pub zipf_s: f64,
    /// Batches each thread runs per measured operation.
    pub batches_per_thread: usize,
    /// Also run the dashmap and scc baselines.
    pub baselines: bool,
    /// Table shards (0 = auto).
    pub shards: usize,
    /// Repetitions per measurement; the best is reported (robust on a shared machine).
    pub reps: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            keys: 10_000_000,
            dim: 16,
            threads: 2,
            batch: 4096,
            zipf_s: 1.1,
            batches_per_thread: 200,
            baselines: true,
            shards: 0,
            reps: 3,
        }
    }
}

/// Results of one structure at one thread count.
#[derive(Clone, Debug, Serialize)]
pub struct StructureReport {
    /// `sparta_table`, `dashmap` or `scc`.
    pub structure: String,
    /// Threads used.
    pub threads: usize,
    /// Pulled keys per second.
    pub pull_per_sec: f64,
    /// Pushed keys per second.
    pub push_per_sec: f64,
    /// Keys per second of pull followed by push of the same batch.
    pub mixed_per_sec: f64,
    /// Measured bytes held per row after the fill.
    pub bytes_per_row: f64,
    /// 8-byte key + 4 bytes per float of the row (weights + optimizer state).
    pub payload_bytes_per_row: usize,
    /// Seconds to create all rows (single thread).
    pub fill_secs: f64,
}

/// Full benchmark report.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Parameters used.
    pub config: BenchConfig,
    /// How `bytes_per_row` was measured.
    pub memory_method: String,
    /// The table's own accounting after the fill.
    pub table_stats: TableStats,
    /// One entry per structure and thread count.
    pub results: Vec<StructureReport>,
    /// Table mixed throughput / best baseline mixed throughput, per thread count.
    pub mixed_speedup_vs_best_baseline: Vec<(usize, f64)>,
}

/// The table configuration the benchmark uses (Adagrad, uniform init).
pub fn bench_table_config(cfg: &BenchConfig) -> TableConfig {
    TableConfig {
        name: "bench".into(),
        dim: cfg.dim,
        optimizer: Optimizer::Adagrad {
            lr: 0.01,
            initial_accumulator: 0.1,
            eps: 1e-8,
        },
        init: Initializer::Uniform {
            low: -0.01,
            high: 0.01,
        },
        seed: 1,
        shards: cfg.shards,
        initial_capacity: cfg.keys,
        ..TableConfig::default()
    }
}

#[derive(Clone, Copy)]
enum Op {
    Pull,
    Push,
    Mixed,
}

/// Keys per second of `op` over `threads` threads, each running its own batches.
fn time_op(
    store: &dyn Store,
    batches: &[Vec<u64>],
    threads: usize,
    per_thread: usize,
    dim: usize,
    op: Op,
) -> f64 {
    let max_batch = batches.iter().map(Vec::len).max().unwrap_or(0);
    let mut bufs: Vec<(Vec<f32>, Vec<f32>)> = (0..threads)
        .map(|_| (vec![0.0; max_batch * dim], vec![0.001; max_batch * dim]))
        .collect();
    let start = Instant::now();
    let keys: usize = std::thread::scope(|s| {
        let handles: Vec<_> = bufs
            .iter_mut()
            .enumerate()
            .map(|(t, (out, grads))| {
                let mine = &batches[t * per_thread..(t + 1) * per_thread];
                s.spawn(move || {
                    let mut n = 0;
                    for b in mine {
                        let (o, g) = (&mut out[..b.len() * dim], &grads[..b.len() * dim]);
                        match op {
                            Op::Pull => store.pull(b, o),
                            Op::Push => store.push(b, g),
                            Op::Mixed => {
                                store.pull(b, o);
                                store.push(b, g);
                            }
                        }
                        n += b.len();
                    }
                    n
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .sum()
    });
    keys as f64 / start.elapsed().as_secs_f64()
}

/// Creates all `n` rows by pulling them in batches; returns seconds taken.
fn fill(store: &dyn Store, n: usize, batch: usize, dim: usize) -> f64 {
    let mut keys = Vec::with_capacity(batch);
    let mut out = vec![0.0; batch * dim];
    let start = Instant::now();
    let mut i = 0;
    while i < n {
        keys.clear();
        keys.extend((i..(i + batch).min(n)).map(|k| key_of(k as u64)));
        store.pull(&keys, &mut out[..keys.len() * dim]);
        i += batch;
    }
    start.elapsed().as_secs_f64()
}

/// Runs the benchmark on the table and (optionally) the baselines.
pub fn run_table_bench(cfg: &BenchConfig) -> BenchReport {
    let tcfg = bench_table_config(cfg);
    let dim = cfg.dim;
    let thread_counts: Vec<usize> = if cfg.threads > 1 {
        vec![1, cfg.threads]
    } else {
        vec![1]
    };
    let max_t = *thread_counts.last().unwrap_or(&1);
    let batches = zipf_batches(
        cfg.keys,
        cfg.zipf_s,
        cfg.batch,
        max_t * cfg.batches_per_thread,
        42,
    );
    let payload = 8 + 4 * tcfg.row_floats();
    let mut results = Vec::new();
    let table_stats;
    let measure = |name: &str,
                   store: &dyn Store,
                   before: alloc::MemReading,
                   results: &mut Vec<StructureReport>| {
        let fill_secs = fill(store, cfg.keys, cfg.batch, dim);
        let bytes = alloc::read().since(before).max(0) as f64;
        tracing::info!(
            structure = name,
            fill_secs,
            bytes_per_row = bytes / cfg.keys as f64,
            "filled"
        );
        for &t in &thread_counts {
            let run = |op| {
                (0..cfg.reps.max(1))
                    .map(|_| time_op(store, &batches, t, cfg.batches_per_thread, dim, op))
                    .fold(0.0, f64::max)
            };
            let (pull, push, mixed) = (run(Op::Pull), run(Op::Push), run(Op::Mixed));
            results.push(StructureReport {
                structure: name.into(),
                threads: t,
                pull_per_sec: pull,
                push_per_sec: push,
                mixed_per_sec: mixed,
                bytes_per_row: bytes / cfg.keys.max(1) as f64,
                payload_bytes_per_row: payload,
                fill_secs,
            });
        }
    };
    {
        let before = alloc::read();
        let table = Table::new(tcfg.clone()).expect("valid bench config");
        measure("sparta_table", &table, before, &mut results);
        table_stats = table.stats();
    }
    if cfg.baselines {
        {
            let before = alloc::read();
            let store = DashStore::new(&tcfg, cfg.keys);
            measure("dashmap", &store, before, &mut results);
        }
        let before = alloc::read();
        let store = SccStore::new(&tcfg, cfg.keys);
        measure("scc", &store, before, &mut results);
    }
    let mixed_speedup_vs_best_baseline = thread_counts
        .iter()
        .filter_map(|&t| {
            let mine = results
                .iter()
                .find(|r| r.threads == t && r.structure == "sparta_table")?
                .mixed_per_sec;
            let best = results
                .iter()
                .filter(|r| r.threads == t && r.structure != "sparta_table")
                .map(|r| r.mixed_per_sec)
                .fold(f64::NAN, f64::max);
            best.is_finite().then_some((t, mine / best))
        })
        .collect();
    BenchReport {
        config: cfg.clone(),
        memory_method: alloc::method().into(),
        table_stats,
        results,
        mixed_speedup_vs_best_baseline,
    }
}
