//! `sparta bench table`: the embedding table against dashmap and scc (feature `bench`).

use anyhow::Result;
use clap::Args;
use serde_json::{json, Map, Value};

/// Flags of `sparta bench table`.
#[derive(Args, Debug, Clone)]
pub struct TableBenchArgs {
    /// Distinct keys (rows of the table; `--rows` says the same).
    #[arg(long, alias = "rows", default_value_t = 10_000_000)]
    pub keys: usize,
    /// Embedding dimension.
    #[arg(long, default_value_t = 16)]
    pub dim: usize,
    /// Threads pulling and pushing at once (runs use 1 and this many).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Batches per thread per measurement.
    #[arg(long, default_value_t = 200)]
    pub batches: usize,
    /// Print only the JSON object (no table).
    #[arg(long)]
    pub json: bool,
    /// The SSD tier benchmark instead: keep this many of the `--keys` rows in RAM, the rest
    /// in `--disk-dir` (0: all in RAM, the same workload for comparison).
    #[arg(long)]
    pub ram_rows: Option<u64>,
    /// Directory of the tier's files (`--ram-rows`).
    #[arg(long, default_value = ".")]
    pub disk_dir: std::path::PathBuf,
    /// How the weights are stored (`--ram-rows`): f32, f16, bf16 or int8.
    #[arg(long, default_value = "f32")]
    pub precision: String,
    /// Row optimizer (`--ram-rows`): adagrad (per-weight state) or sgd (none).
    #[arg(long, default_value = "adagrad")]
    pub optimizer: String,
}

/// `sparta bench table --ram-rows M`: the SSD tier benchmark, one JSON object.
fn run_tier(a: &TableBenchArgs, ram_rows: u64) -> Result<()> {
    use sparta_table::{Optimizer, RowPrecision};
    let precision = match a.precision.as_str() {
        "f32" => RowPrecision::F32,
        "f16" => RowPrecision::F16,
        "bf16" => RowPrecision::Bf16,
        "int8" => RowPrecision::Int8,
        p => anyhow::bail!("--precision {p}: expected f32, f16, bf16 or int8"),
    };
    let optimizer = match a.optimizer.as_str() {
        "adagrad" => Optimizer::Adagrad {
            lr: 0.01,
            initial_accumulator: 0.1,
            eps: 1e-8,
        },
        "sgd" => Optimizer::Sgd { lr: 0.01 },
        o => anyhow::bail!("--optimizer {o}: expected adagrad or sgd"),
    };
    let cfg = sparta_table::bench::TierBenchConfig {
        keys: a.keys,
        ram_rows: (ram_rows > 0).then_some(ram_rows),
        disk_dir: a.disk_dir.clone(),
        dim: a.dim,
        precision,
        optimizer,
        batch: 4096,
        batches: a.batches,
        zipf_s: 1.1,
    };
    let report = sparta_table::bench::run_tier_bench(&cfg)?;
    let mut out = serde_json::to_value(&report)?;
    out["precision"] = json!(a.precision);
    out["optimizer"] = json!(a.optimizer);
    out["dim"] = json!(a.dim);
    println!("{out}");
    Ok(())
}

pub fn run(a: TableBenchArgs) -> Result<()> {
    anyhow::ensure!(
        a.keys > 0 && a.dim > 0 && a.threads > 0,
        "--keys, --dim and --threads must be positive"
    );
    if let Some(r) = a.ram_rows {
        return run_tier(&a, r);
    }
    let cfg = sparta_table::bench::BenchConfig {
        keys: a.keys,
        dim: a.dim,
        threads: a.threads,
        batches_per_thread: a.batches,
        ..Default::default()
    };
    let report = sparta_table::bench::run_table_bench(&cfg);
    // One object keyed by structure, at the requested thread count; all runs under "runs".
    let mut by_structure = Map::new();
    for r in report.results.iter().filter(|r| r.threads == a.threads) {
        let name = if r.structure.starts_with("sparta") {
            "sparta"
        } else {
            r.structure.as_str()
        };
        by_structure.insert(
            name.to_string(),
            json!({
                "pull_per_sec": r.pull_per_sec,
                "push_per_sec": r.push_per_sec,
                "mixed_per_sec": r.mixed_per_sec,
                "bytes_per_row": r.bytes_per_row,
                "payload_bytes_per_row": r.payload_bytes_per_row,
            }),
        );
    }
    let mut out = Map::new();
    out.insert("keys".into(), json!(a.keys));
    out.insert("dim".into(), json!(a.dim));
    out.insert("threads".into(), json!(a.threads));
    out.insert("memory_method".into(), json!(report.memory_method));
    out.extend(by_structure);
    out.insert("runs".into(), serde_json::to_value(&report.results)?);
    out.insert(
        "mixed_speedup_vs_best_baseline".into(),
        json!(report.mixed_speedup_vs_best_baseline),
    );
    let out = Value::Object(out);
    if a.json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "{:<14} {:>7} {:>14} {:>14} {:>14} {:>11} {:>9}",
        "structure",
        "threads",
        "pull keys/s",
        "push keys/s",
        "mixed keys/s",
        "bytes/row",
        "payload"
    );
    for r in &report.results {
        println!(
            "{:<14} {:>7} {:>14.0} {:>14.0} {:>14.0} {:>11.1} {:>9}",
            r.structure,
            r.threads,
            r.pull_per_sec,
            r.push_per_sec,
            r.mixed_per_sec,
            r.bytes_per_row,
            r.payload_bytes_per_row
        );
    }
    println!("memory: {}", report.memory_method);
    for (t, x) in &report.mixed_speedup_vs_best_baseline {
        println!("mixed speed-up vs best baseline at {t} thread(s): {x:.2}x");
    }
    Ok(())
}
