//! `sparta worker`: one training worker of a PS cluster (flags -> `sparta_cluster` options
//! -> `ClusterWorker::connect(..)?.run()`).

use anyhow::{Context, Result};
use clap::Args;
use sparta_cluster::{ClusterWorker, WorkerOptions};

use super::flags::{RingFlags, ShardLinkFlags};
use super::train::{follow_options, job_config, kafka_options, print_summary, TrainArgs};

/// Flags of `sparta worker` (plus every flag of `sparta train`).
#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// This worker's rank (0-based; rank 0 evaluates and writes the job summary).
    #[arg(long)]
    pub rank: usize,
    /// Workers in the job (each trains on a disjoint 1/M of the input).
    #[arg(long)]
    pub num_workers: usize,
    #[command(flatten)]
    pub link: ShardLinkFlags,
    #[command(flatten)]
    pub ring: RingFlags,
    /// Training flags, as for `sparta train`.
    #[command(flatten)]
    pub train: TrainArgs,
}

/// Trains this worker's part; rank 0 then waits for all workers, evaluates and reports.
/// Returns the summary as written to `--summary-json`.
pub fn run_worker(a: &WorkerArgs) -> Result<serde_json::Value> {
    let t = &a.train;
    let job = job_config(t)?.validate()?;
    super::train::ensure_cluster_online(t, &job.raw, "sparta worker")?;
    let mut client = a
        .link
        .client(a.rank, a.num_workers, job.raw.train.ps_retry_secs)?;
    client.warn_after = std::time::Duration::from_secs_f64(job.raw.train.barrier_warn_secs);
    // Online input ends gracefully on SIGINT/SIGTERM (files end with the input).
    let stop = match t.follow.is_some() || !t.kafka.is_empty() {
        true => Some(crate::signals::stop_on_signals()?),
        false => None,
    };
    let follow = match &stop {
        Some(stop) => follow_options(t, stop)?,
        None => None,
    };
    let kafka = match &stop {
        Some(stop) => kafka_options(t, stop)?,
        None => None,
    };
    let opts = WorkerOptions {
        ring: a
            .ring
            .options(&a.link, t.follow.is_some() || !t.kafka.is_empty()),
        metrics_listen: t.metrics_listen.clone(),
        train: t.train.clone(),
        test: t.test.clone(),
        eval_every_steps: t.eval_every_steps.unwrap_or(0),
        eval_every_secs: t.eval_every_secs.unwrap_or(0.0),
        follow,
        kafka,
        progress: !t.quiet,
        progress_sink: Some(crate::progress::for_stderr(t.progress_every_secs)?),
        hooks: t.tensorboard.hook(Some(a.rank))?.into_iter().collect(),
        ..WorkerOptions::new(client)
    };
    let worker = ClusterWorker::connect(job, opts)?;
    if let Some(bound) = worker.metrics_addr() {
        println!("sparta worker {} metrics on http://{bound}/metrics", a.rank);
    }
    let report = worker.run()?;
    print_summary(&report.summary);
    println!("{}", report.wire_line);
    if let Some(path) = &t.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&report.json)? + "\n")
            .with_context(|| format!("writing summary to {}", path.display()))?;
    }
    Ok(report.json)
}

/// `sparta worker`.
pub fn run(a: WorkerArgs) -> Result<()> {
    run_worker(&a)
        .map(|_| ())
        .with_context(|| format!("worker {}", a.rank))
}
