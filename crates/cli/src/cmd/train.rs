//! `sparta train`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use sparta_worker::config::Format;
use sparta_worker::{JobConfig, RunOptions, Summary, Trainer};

/// Flags of `sparta train`; each overrides the same setting of `--config`.
#[derive(Args, Debug, Clone, Default)]
pub struct TrainArgs {
    /// Job config (TOML); flags override its values.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Model: wdl, deepfm or dcn.
    #[arg(long)]
    pub model: Option<String>,
    /// Training files (plain or gzip), read in order.
    #[arg(long, num_args = 1.., required = true)]
    pub train: Vec<PathBuf>,
    /// Test files to evaluate on after training.
    #[arg(long, num_args = 1..)]
    pub test: Vec<PathBuf>,
    /// Input layout: criteo or avazu (a custom layout goes in the config's [data.schema]).
    #[arg(long)]
    pub format: Option<String>,
    /// Samples per step.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Passes over the training files.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Compute threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Parser threads (default: one per core).
    #[arg(long)]
    pub reader_threads: Option<usize>,
    /// Seed of all initialisers.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Parse all training data into memory first (to time the training loop alone).
    #[arg(long)]
    pub preload: bool,
    /// Stop after this many training rows per epoch.
    #[arg(long)]
    pub max_rows: Option<u64>,
    /// Write checkpoints into this directory.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (default: only at the end of training).
    #[arg(long)]
    pub checkpoint_every_steps: Option<u64>,
    /// Continue from the newest valid checkpoint in this directory (and keep checkpointing
    /// there unless --checkpoint-dir says otherwise).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Overlap embedding lookups and pushes with the dense compute.
    #[arg(long)]
    pub pipeline: bool,
    /// Write the run summary as JSON here.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// No progress bar or progress log lines.
    #[arg(long)]
    pub quiet: bool,
}

/// Builds the job config from `--config` plus flag overrides.
pub fn job_config(a: &TrainArgs) -> Result<JobConfig> {
    let mut cfg = match &a.config {
        Some(p) => JobConfig::from_file(p)?,
        None => JobConfig::default(),
    };
    if let Some(m) = &a.model {
        cfg.model.kind = serde_json::from_value(serde_json::Value::String(m.clone()))
            .map_err(|_| anyhow::anyhow!("--model {m:?}: expected wdl, deepfm or dcn"))?;
    }
    if let Some(f) = &a.format {
        cfg.data.format = match f.as_str() {
            "criteo" => Format::Criteo,
            "avazu" => Format::Avazu,
            other => anyhow::bail!(
                "--format {other:?}: expected criteo or avazu (custom layouts: [data.schema] in --config)"
            ),
        };
    }
    if let Some(v) = a.batch_size {
        cfg.data.batch_size = v;
    }
    if let Some(v) = a.epochs {
        cfg.train.epochs = v;
    }
    if let Some(v) = a.threads {
        cfg.train.threads = v;
    }
    if let Some(v) = a.reader_threads {
        cfg.data.reader_threads = v;
    }
    if let Some(v) = a.seed {
        cfg.train.seed = v;
    }
    if a.preload {
        cfg.train.preload = true;
    }
    if a.max_rows.is_some() {
        cfg.train.max_rows = a.max_rows;
    }
    if a.pipeline {
        cfg.train.pipeline = true;
    }
    if let Some(d) = a.checkpoint_dir.as_ref().or(a.resume.as_ref()) {
        cfg.train.checkpoint_dir = Some(d.clone());
    }
    if let Some(k) = a.checkpoint_every_steps {
        cfg.train.checkpoint_every_steps = k;
    }
    Ok(cfg)
}

/// Trains, evaluates, prints and writes the summary.
pub fn train_and_report(a: &TrainArgs) -> Result<Summary> {
    let job = job_config(a)?.validate()?;
    tracing::info!(
        "training {:?} on {} file(s), batch {}, {} thread(s)",
        job.model.kind,
        a.train.len(),
        job.reader.batch_size,
        job.threads
    );
    let mut trainer = match &a.resume {
        Some(dir) => Trainer::embedded_resume(job, dir)?,
        None => Trainer::embedded(job)?,
    };
    let summary = trainer.run(&RunOptions {
        train: a.train.clone(),
        test: a.test.clone(),
        progress: !a.quiet,
    })?;
    print_summary(&summary);
    if let Some(path) = &a.summary_json {
        let text = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("writing summary to {}", path.display()))?;
    }
    Ok(summary)
}

/// The human-readable end-of-run report.
pub fn print_summary(s: &Summary) {
    println!(
        "model {}: {} train rows in {:.2}s ({:.0} samples/s end to end, {:.0} samples/s training loop, dense {:.1} GFLOP/s)",
        s.model, s.train_rows, s.train_seconds, s.train_samples_per_sec, s.loop_samples_per_sec, s.dense_gflops
    );
    println!(
        "stages: read {:.2}s pull {:.2}s dense {:.2}s push {:.2}s | {} table rows, peak RSS {:.0} MiB, {} bad lines",
        s.stage_seconds.read,
        s.stage_seconds.pull,
        s.stage_seconds.dense,
        s.stage_seconds.push,
        s.table_rows,
        s.peak_rss_bytes as f64 / (1 << 20) as f64,
        s.bad_lines
    );
    if let (Some(auc), Some(ll)) = (s.test_auc, s.test_logloss) {
        println!(
            "test: {} rows, AUC {:.4}, logloss {:.4}, positive rate {:.4}, calibration {:.3}",
            s.test_rows,
            auc,
            ll,
            s.test_positive_rate.unwrap_or(f64::NAN),
            s.test_calibration.unwrap_or(f64::NAN)
        );
    }
}

/// `sparta train`.
pub fn run(a: TrainArgs) -> Result<()> {
    train_and_report(&a).map(|_| ())
}
