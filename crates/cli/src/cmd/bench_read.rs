//! `sparta bench read`: how fast the reading engine turns inputs (text or Parquet) into
//! batches, and how many bytes it reads from them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use crate::cmd::train::{job_config, TrainArgs};

/// Flags of `sparta bench read`.
#[derive(Args, Debug, Clone)]
pub struct ReadBenchArgs {
    /// Job config (TOML) giving the layout and features (default: the Criteo layout).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Input layout: criteo or avazu (overrides the config's).
    #[arg(long)]
    pub format: Option<String>,
    /// Files to read (plain, gzip or Parquet), in order.
    #[arg(long, num_args = 1.., required = true)]
    pub input: Vec<PathBuf>,
    /// Parser threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 4096)]
    pub batch_size: usize,
    /// Read only the first half of the plan's sparse features and dense inputs (what column
    /// projection saves on Parquet).
    #[arg(long)]
    pub half_columns: bool,
}

/// Reads the inputs once and prints one JSON object.
pub fn run(a: ReadBenchArgs) -> Result<()> {
    anyhow::ensure!(
        a.threads > 0,
        "--threads 0: expected at least 1 parser thread"
    );
    anyhow::ensure!(a.batch_size > 0, "--batch-size 0: expected at least 1 row");
    let job = job_config(&TrainArgs {
        config: a.config.clone(),
        format: a.format.clone(),
        ..TrainArgs::default()
    })?
    .validate()?;
    let mut cfg = job.reader.clone();
    cfg.threads = a.threads;
    cfg.queue_batches = 2 * a.threads + 2;
    cfg.batch_size = a.batch_size;
    cfg.epochs = 1;
    cfg.max_rows = None;
    if a.half_columns {
        if let Some(plan) = cfg.plan.as_deref() {
            let mut half = plan.clone();
            half.slots.truncate(plan.slots.len().div_ceil(2));
            half.dense.truncate(plan.dense.len().div_ceil(2));
            cfg.plan = Some(std::sync::Arc::new(half));
        }
    }
    let input_bytes: u64 = a
        .input
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()
        .context("--input")?;
    let cpu0 = cpu_secs();
    let start = Instant::now();
    let mut stream = sparta_data::read_batches(&a.input, &cfg)?;
    let mut rows = 0u64;
    for b in stream.by_ref() {
        rows += b?.rows as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu0.and_then(|c0| cpu_secs().map(|c1| c1 - c0));
    let stats = stream.stats().snapshot();
    let out = json!({
        "inputs": a.input.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "threads": a.threads,
        "half_columns": a.half_columns,
        "rows": rows,
        "bad_rows": stats.bad_lines,
        "secs": secs,
        "rows_per_sec": rows as f64 / secs,
        "cpu_secs": cpu,
        "rows_per_cpu_sec": cpu.map(|c| rows as f64 / c),
        "input_bytes": input_bytes,
        // Text: bytes of (decompressed) text parsed; Parquet: bytes fetched from the file.
        "bytes_read": stats.bytes,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    println!("{out}");
    Ok(())
}

/// CPU seconds (user + system) this process used so far, from `/proc/self/stat` (Linux; at
/// the usual 100 ticks per second).
fn cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string(Path::new("/proc/self/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks = |i: usize| f.get(i)?.parse::<f64>().ok();
    // utime and stime are fields 14 and 15 of the line: 11 and 12 after the name.
    Some((ticks(11)? + ticks(12)?) / 100.0)
}
