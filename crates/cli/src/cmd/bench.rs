//! `sparta bench ...`: the benchmarks behind the figures in BENCHMARKS.md.

use anyhow::Result;
use clap::Subcommand;

/// Benchmarks.
#[derive(Subcommand, Debug, Clone)]
pub enum BenchCommand {
    /// The embedding table against dashmap and scc on a power-law pull/push workload (needs
    /// `--features bench`).
    #[cfg(feature = "bench")]
    Table(super::bench_table::TableBenchArgs),
    /// The reading engine: rows/s and bytes read of text or Parquet inputs.
    Read(super::bench_read::ReadBenchArgs),
    /// Every model's dense step alone and whole training loop on generated data: samples/s,
    /// GFLOP/s and the share of this machine's measured GEMM peak, as JSON.
    Train(super::bench_train::TrainBenchArgs),
}

/// Runs a benchmark.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        #[cfg(feature = "bench")]
        BenchCommand::Table(a) => super::bench_table::run(a),
        BenchCommand::Read(a) => super::bench_read::run(a),
        BenchCommand::Train(a) => super::bench_train::run(a),
    }
}
