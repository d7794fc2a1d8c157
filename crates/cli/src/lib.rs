//! `sparta`: the command-line front end. Thin: it parses flags, loads and validates the job
//! config, wires the components together and reports errors with context.
//!
//! A library with a two-line binary (`main.rs`: the allocator, then [`run`]): a library
//! compiles as soon as its dependencies' metadata exists, so the front end builds while the
//! crates under it still generate code, and a first build ends sooner.

use clap::{Parser, Subcommand};

mod cmd;
mod dry_run;
mod progress;
mod signals;

/// Train sparse CTR models (Wide&Deep, DeepFM, DCN) on dynamic embedding tables.
#[derive(Parser)]
#[command(name = "sparta", version, about, long_about = None)]
struct Cli {
    /// Check the command line and the job config it names (`--config`, when the file
    /// exists), print what would run and exit without starting anything.
    #[arg(long, global = true, display_order = 10_000)]
    dry_run: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model on click logs and evaluate it.
    Train(cmd::train::TrainArgs),
    /// Generate a small synthetic data set, train on it and evaluate: the whole loop in one command.
    Demo(cmd::demo::DemoArgs),
    /// Write synthetic click logs in the Criteo layout.
    GenData(cmd::gen_data::GenDataArgs),
    /// Write the lines of files to a Kafka topic, one record per line.
    KafkaProduce(cmd::kafka_produce::KafkaProduceArgs),
    /// Convert text click logs (TSV/CSV, plain or gzip) into a Parquet file.
    Convert(cmd::convert::ConvertArgs),
    /// Benchmarks users can run on their own machines (`table` needs `--features bench`).
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Inspect checkpoints.
    #[command(subcommand)]
    Checkpoint(cmd::checkpoint::CheckpointCommand),
    /// Show the job a config means, with its tables and features written out.
    #[command(subcommand)]
    Config(cmd::config::ConfigCommand),
    /// Run one parameter-server shard.
    Ps(cmd::ps::PsArgs),
    /// Run one training worker of a PS cluster.
    Worker(cmd::worker::WorkerArgs),
    /// Watch a replicated PS cluster and fail its shards over to their backups.
    Coordinator(cmd::coordinator::CoordinatorArgs),
    /// Run a whole PS cluster (N PS + M workers) on this machine.
    Launch(cmd::launch::LaunchArgs),
    /// Move slots (and their rows) from one PS shard to another while the job trains.
    MoveSlots(cmd::move_slots::MoveSlotsArgs),
    /// Add PS shards to a training cluster, or remove shards added earlier (their slots move
    /// onto the others first).
    ScalePs(cmd::scale_ps::ScalePsArgs),
    /// Size a PS cluster for a job: PS count and memory limit, wire bytes, workers, from costs
    /// measured here (the job's tables, its reader and dedup, a short training run).
    Plan(cmd::plan::PlanArgs),
    /// Write a serving export (full) from the newest valid checkpoint.
    Export(cmd::export::ExportArgs),
    /// Remove given raw feature values (right to erasure) from a cluster's shards, or from a
    /// checkpoint directory and a serving export.
    Forget(cmd::forget::ForgetArgs),
    /// Score a file offline with a serving export: one probability per line.
    Predict(cmd::predict::PredictArgs),
    /// Serve a model export over HTTP (JSON), hot-reloading new versions.
    Serve(cmd::serve::ServeArgs),
}

impl Cli {
    /// The command line, with the flags of `sparta train` that `worker` and `launch` refuse
    /// left out of their `--help` ([`cmd::train::hide_cluster_refused`]).
    fn command_with_cluster_help() -> clap::Command {
        use clap::CommandFactory;
        Cli::command()
            .mut_subcommand("worker", cmd::train::hide_cluster_refused)
            .mut_subcommand("launch", cmd::train::hide_cluster_refused)
    }

    /// Parses this process's arguments (exits on `--help`, `--version` and flag errors), with
    /// the matches they came from (what `--dry-run` reads).
    fn parse_with_cluster_help() -> (Self, clap::ArgMatches) {
        use clap::FromArgMatches;
        let matches = Cli::command_with_cluster_help().get_matches();
        let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        (cli, matches)
    }
}

/// mimalloc's option `purge_delay` (its position in `mi_option_e`, mimalloc v3's
/// `include/mimalloc.h`; libmimalloc-sys names no constant for it).
pub(crate) const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory in the process instead of handing it back to the kernel a second later
/// (mimalloc's default): a training step frees and allocates the same buffers (activations,
/// GEMM packing, batches) every few milliseconds, and each purge made the next step fault in
/// and zero fresh 2 MiB pages: 20 GB zeroed in a 300k-row run, about a quarter of its CPU time
/// (measured with `perf`; see BENCHMARKS.md). Memory then stays at its peak, which a
/// training process reaches in its first steps anyway. `MIMALLOC_PURGE_DELAY` in the
/// environment still decides when set.
fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: mi_option_get/mi_option_set read and write one mimalloc option; they are called
    // here before any thread but the main one exists (the functions are not thread safe).
    unsafe {
        // A default (1000 ms in mimalloc v3, 10 in v2) confirms the option's position before
        // it is changed.
        let delay = libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY);
        if delay == 1000 || delay == 10 {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
    }
}

/// Runs the command line of this process and exits with its status on an error.
pub fn run() {
    keep_freed_memory();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour_logs())
        .with_target(false)
        .init();
    let (cli, matches) = Cli::parse_with_cluster_help();
    let result = match cli.command {
        _ if cli.dry_run => dry_run::report(&matches),
        Command::Train(a) => cmd::train::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::GenData(a) => cmd::gen_data::run(a),
        Command::KafkaProduce(a) => cmd::kafka_produce::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::Bench(b) => cmd::bench::run(b),
        Command::Checkpoint(c) => cmd::checkpoint::run(c),
        Command::Config(c) => cmd::config::run(c),
        Command::Ps(a) => cmd::ps::run(a),
        Command::Worker(a) => cmd::worker::run(a),
        Command::Coordinator(a) => cmd::coordinator::run(a),
        Command::Launch(a) => cmd::launch::run(a),
        Command::MoveSlots(a) => cmd::move_slots::run(a),
        Command::ScalePs(a) => cmd::scale_ps::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Forget(a) => cmd::forget::run(a),
        Command::Predict(a) => cmd::predict::run(a),
        Command::Serve(a) => cmd::serve::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {}", render(&e));
        std::process::exit(exit_code(&e));
    }
}

/// Colour in the log lines only on a terminal, and not when `NO_COLOR` is set (to anything
/// non-empty, <https://no-color.org>): a log piped to a file or a collector stays plain text.
fn colour_logs() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The error and its causes, `: `-separated, each cause once: many error types already include
/// their source's text in their own message (`storage error on X: Not a directory (os error
/// 20)`), and printing the chain again would repeat it.
fn render(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

/// 1 for an error, [`sparta_launch::EXIT_JOB_FAILED`] for a job-level failure that a restart
/// from the last checkpoint would not fix (`sparta launch` stops instead of rolling back).
fn exit_code(e: &anyhow::Error) -> i32 {
    let job_failure = e.chain().any(|c| {
        c.downcast_ref::<sparta_core::CoreError>()
            .is_some_and(|e| e.is_job_failure())
            || matches!(
                c.downcast_ref::<sparta_checkpoint::CheckpointError>(),
                Some(sparta_checkpoint::CheckpointError::GaveUp { .. })
            )
            || c.downcast_ref::<sparta_cluster::ClusterError>()
                .is_some_and(|e| e.is_job_failure())
            || c.downcast_ref::<sparta_launch::LaunchError>()
                .is_some_and(|e| e.is_job_failure())
    });
    if job_failure {
        sparta_launch::EXIT_JOB_FAILED
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command_with_cluster_help().debug_assert();
    }
}
