//! Table benchmark (release): `cargo run --release -p sparta-table --features bench --example
//! table_bench -- --keys 10000000 --threads 2 [--dim 16] [--batches 200] [--reps 3] [--shards 0]
//! [--no-baselines] [--json]`.
//!
//! Also `--fill-only` with `--rowwise` fills a row-wise Adagrad table and reports bytes/row and
//! pull throughput (the 100M-row check).

use std::time::Instant;

use sparta_table::bench::{key_of, run_table_bench, zipf_batches, BenchConfig, CountingAlloc};
use sparta_table::{Optimizer, Table, TableConfig};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc(std::alloc::System);

fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut cfg = BenchConfig::default();
    cfg.keys = arg(&args, "--keys").unwrap_or(cfg.keys);
    cfg.dim = arg(&args, "--dim").unwrap_or(cfg.dim);
    cfg.threads = arg(&args, "--threads").unwrap_or(cfg.threads);
    cfg.batches_per_thread = arg(&args, "--batches").unwrap_or(cfg.batches_per_thread);
    cfg.shards = arg(&args, "--shards").unwrap_or(cfg.shards);
    cfg.reps = arg(&args, "--reps").unwrap_or(cfg.reps);
    cfg.baselines = !args.iter().any(|a| a == "--no-baselines");
    if args.iter().any(|a| a == "--fill-only") {
        fill_only(&cfg);
        return;
    }
    let report = run_table_bench(&cfg);
    if args.iter().any(|a| a == "--json") {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serializes")
        );
        return;
    }
    println!("memory: {}", report.memory_method);
    println!(
        "{:<13} {:>3} {:>12} {:>12} {:>12} {:>10} {:>8} {:>8}",
        "structure", "thr", "pull/s", "push/s", "mixed/s", "bytes/row", "payload", "fill_s"
    );
    for r in &report.results {
        println!(
            "{:<13} {:>3} {:>12.0} {:>12.0} {:>12.0} {:>10.1} {:>8} {:>8.2}",
            r.structure,
            r.threads,
            r.pull_per_sec,
            r.push_per_sec,
            r.mixed_per_sec,
            r.bytes_per_row,
            r.payload_bytes_per_row,
            r.fill_secs
        );
    }
    println!(
        "mixed speedup vs best baseline: {:?}",
        report.mixed_speedup_vs_best_baseline
    );
    println!(
        "table self-reported bytes/row: {:.1}",
        report.table_stats.bytes_per_row
    );
}

/// Fills `keys` rows of row-wise Adagrad and measures memory and pull throughput.
fn fill_only(cfg: &BenchConfig) {
    let tcfg = TableConfig {
        dim: cfg.dim,
        optimizer: Optimizer::RowWiseAdagrad {
            lr: 0.01,
            initial_accumulator: 0.1,
            eps: 1e-8,
        },
        initial_capacity: cfg.keys,
        shards: cfg.shards,
        ..TableConfig::default()
    };
    let table = Table::new(tcfg).expect("config");
    let batch = cfg.batch;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..cfg.threads {
            let table = &table;
            s.spawn(move || {
                let mut keys = Vec::with_capacity(batch);
                let mut out = vec![0.0; batch * cfg.dim];
                let mut i = t * batch;
                while i < cfg.keys {
                    keys.clear();
                    keys.extend((i..(i + batch).min(cfg.keys)).map(|k| key_of(k as u64)));
                    table.pull(&keys, &mut out[..keys.len() * cfg.dim]);
                    i += batch * cfg.threads;
                }
            });
        }
    });
    let fill_s = start.elapsed().as_secs_f64();
    let st = table.stats();
    println!(
        "filled {} rows in {:.1}s ({:.0} rows/s); bytes/row {:.1} (payload {}), total {:.2} GB",
        st.rows,
        fill_s,
        st.rows as f64 / fill_s,
        st.bytes_per_row,
        st.payload_bytes_per_row,
        st.bytes as f64 / 1e9
    );
    let batches = zipf_batches(cfg.keys, cfg.zipf_s, batch, 200, 7);
    let mut out = vec![0.0; batch * cfg.dim];
    let start = Instant::now();
    let mut n = 0;
    for b in &batches {
        table.pull(b, &mut out[..b.len() * cfg.dim]);
        n += b.len();
    }
    println!(
        "zipf pull (1 thread): {:.0} keys/s",
        n as f64 / start.elapsed().as_secs_f64()
    );
}
