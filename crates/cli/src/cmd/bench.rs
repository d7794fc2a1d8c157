//! `sparta bench ...`: the benchmarks behind the figures in BENCHMARKS.md.

use anyhow::Result;
use clap::{Args, Subcommand};

/// Benchmarks.
#[derive(Subcommand, Debug, Clone)]
pub enum BenchCommand {
    /// The embedding table against dashmap and scc on a power-law pull/push workload.
    Table(TableBenchArgs),
}

/// Flags of `sparta bench table`.
#[derive(Args, Debug, Clone)]
pub struct TableBenchArgs {
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000_000)]
    pub keys: usize,
    /// Embedding dimension.
    #[arg(long, default_value_t = 16)]
    pub dim: usize,
    /// Threads pulling and pushing at once.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Print one JSON object only.
    #[arg(long)]
    pub json: bool,
}

/// Runs a benchmark.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Table(a) => {
            let cfg = sparta_table::bench::BenchConfig {
                keys: a.keys,
                dim: a.dim,
                threads: a.threads,
                ..Default::default()
            };
            let report = sparta_table::bench::run_table_bench(&cfg);
            let text = serde_json::to_string_pretty(&report)?;
            println!("{text}");
            Ok(())
        }
    }
}
