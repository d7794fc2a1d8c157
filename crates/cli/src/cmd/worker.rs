//! `sparta worker`: one training worker of a PS cluster.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sparta_core::SparseStore;
use sparta_ps::metrics::Rpc;
use sparta_ps::{ClientConfig, Compression, RemoteStore};
use sparta_worker::summary::peak_rss_bytes;
use sparta_worker::{ExportReport, InputStats, RunOptions, Summary, Trainer};

use super::train::{job_config, print_summary, TrainArgs};

/// Flags of `sparta worker` (plus every flag of `sparta train`).
#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// This worker's rank (0-based; rank 0 evaluates and writes the job summary).
    #[arg(long)]
    pub rank: usize,
    /// Workers in the job (each trains on a disjoint 1/M of the input).
    #[arg(long)]
    pub num_workers: usize,
    /// PS addresses in shard order, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ps: Vec<String>,
    /// The coordinator of a replicated cluster (`sparta coordinator`): requests follow each
    /// shard's primary through failovers.
    #[arg(long)]
    pub coordinator: Option<String>,
    /// File holding the shared token (default: the SPARTA_TOKEN environment variable).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Embedding values on the wire: none, fp16 or bf16.
    #[arg(long, default_value = "none")]
    pub wire_compression: String,
    /// Dense mode allreduce (the PS shards run `--mode allreduce`): the ring address of every
    /// worker in rank order, comma separated; this worker listens on its own.
    #[arg(long, value_delimiter = ',')]
    pub ring: Vec<String>,
    /// Dense gradient chunks on the ring: none (f32), fp16 or bf16 (summed in f32).
    #[arg(long, default_value = "none")]
    pub ring_compression: String,
    /// TLS on the ring: this worker's certificate chain (PEM) for the link it accepts; the
    /// next worker's certificate is checked against --tls-ca (and named --tls-domain, else
    /// the IP address of its --ring entry).
    #[arg(long, requires_all = ["ring_tls_key", "tls_ca"])]
    pub ring_tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --ring-tls-cert.
    #[arg(long, requires = "ring_tls_cert")]
    pub ring_tls_key: Option<PathBuf>,
    /// Largest gRPC message accepted or sent, MiB.
    #[arg(long, default_value_t = 256)]
    pub max_message_mb: usize,
    /// Deadline of one RPC, seconds.
    #[arg(long, default_value_t = 300)]
    pub rpc_timeout_secs: u64,
    /// Retries of an RPC whose PS is unreachable, at least (exponential backoff from 50 ms).
    #[arg(long, default_value_t = 4)]
    pub retries: u32,
    /// How long an unreachable PS is retried before the worker stops with an error naming
    /// it, seconds (default: `[train] ps_retry_secs`, 60).
    #[arg(long)]
    pub ps_retry_secs: Option<u64>,

    /// Serve Prometheus `/metrics` and `/health` here.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Talk TLS to the PS, trusting this CA certificate (PEM).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Name the PS certificates must carry (default: the host of each --ps address).
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
    /// Training flags, as for `sparta train`.
    #[command(flatten)]
    pub train: TrainArgs,
}

/// Trains this worker's part; rank 0 then waits for all workers, evaluates and reports.
/// Returns the summary as written to `--summary-json`.
pub fn run_worker(a: &WorkerArgs) -> Result<serde_json::Value> {
    let mut job = job_config(&a.train)?.validate()?;
    super::train::ensure_cluster_online(&a.train, &job.raw, "sparta worker")?;
    let follow = match a.train.follow {
        Some(_) => super::train::follow_options(&a.train, &super::train::stop_on_signals()?)?,
        None => None,
    };
    let m = a.num_workers.max(1);
    job.reader.part = Some((a.rank, m));
    // `--max-rows` counts rows of the whole job: each worker reads its share.
    job.reader.max_rows = job.reader.max_rows.map(|r| r.div_ceil(m as u64));
    let token = sparta_ps::auth::load_token(a.token_file.as_deref())?;
    let mut cc = ClientConfig::new(a.ps.clone(), token.clone(), a.rank, a.num_workers);
    cc.compression = Compression::parse(&a.wire_compression).map_err(anyhow::Error::msg)?;
    cc.max_message_bytes = a.max_message_mb << 20;
    cc.rpc_timeout = Duration::from_secs(a.rpc_timeout_secs);
    cc.retries = a.retries;
    cc.coordinator = a.coordinator.clone();
    cc.tls = sparta_ps::ClientTls::from_flag(a.tls_ca.as_deref(), a.tls_domain.clone())?;
    cc.retry_wait = Duration::from_secs(a.ps_retry_secs.unwrap_or(job.raw.train.ps_retry_secs));
    let store = Arc::new(RemoteStore::connect(cc, &job)?);
    if let Some(addr) = &a.metrics_listen {
        let bound = store.serve_metrics(addr)?;
        println!("sparta worker {} metrics on http://{bound}/metrics", a.rank);
    }
    let mut trainer = Trainer::with_store(job.clone(), store.clone())?;
    if a.metrics_listen.is_some() {
        publish_input_stats(trainer.input_stats(), Arc::clone(store.metrics()));
    }
    trainer.set_progress(crate::progress::for_stderr());
    store.init_dense(trainer.model_mut().param_values_mut())?;
    let ring = super::worker_ring::setup(
        a,
        &job,
        &store,
        &token,
        trainer.model_mut().param_values_mut(),
    )?;
    match &ring {
        Some(r) => trainer.set_dense_store(r.clone()),
        None => trainer.set_dense_store(store.clone()),
    }
    let coordinator = super::worker_ckpt::setup(&mut trainer, &store, &job, a.rank, m, &ring)?;
    tracing::info!(
        "worker {} of {}: {:?} on part {} of {} of {} file(s), {} PS shard(s)",
        a.rank,
        m,
        job.model.kind,
        a.rank,
        m,
        a.train.train.len(),
        a.ps.len()
    );
    let mut summary = match &follow {
        // Every worker follows the directory and reads its share of each file.
        Some(f) => trainer.run(&RunOptions {
            follow: Some(f.clone()),
            progress: !a.train.quiet,
            ..RunOptions::default()
        })?,
        None => trainer.train(&a.train.train, !a.train.quiet)?,
    };
    let steps = summary.steps.max(1);
    let met = store.metrics();
    let rpc_train = met.totals();
    // Distinct ids pulled in training (one pull carries them once for all tables).
    let unique = met.rows(Rpc::Pull);
    // Floats per key: its table's dim (+1 when it has a wide weight); with tables of several
    // dims, their mean (the figure is then approximate).
    let tables = &job.features.tables;
    let floats: usize = tables.iter().map(|t| t.dim + usize::from(t.wide)).sum();
    let row_bytes = (4 * floats / tables.len().max(1)) as u64;
    let sparse_bytes = met.bytes(Rpc::Pull) + met.bytes(Rpc::Push);
    let sparse_rpcs = met.requests(Rpc::Pull) + met.requests(Rpc::Push);
    store.worker_done()?;
    let mut dense_wire = met.bytes(Rpc::DensePushPull);
    if let Some(r) = &ring {
        // Join the ring with zero gradients until every worker's input has ended, then the
        // shards get the final dense state (evaluation, the end-of-job checkpoint, exports).
        let calls = r.drain()?;
        tracing::debug!(
            "worker {}: {calls} ring call(s) after its input ended",
            a.rank
        );
        let (sent, received) = r.bytes();
        dense_wire = sent + received;
        if a.rank == 0 {
            let (params, opt) = r.state();
            store.set_dense_state(&params, &opt)?;
        }
    }
    if a.rank == 0 && (coordinator.is_some() || !a.train.test.is_empty()) {
        store.wait_all_done()?;
    }
    if let Some(c) = &coordinator {
        // Every worker has finished: the cluster's final state, for `--resume`, `sparta
        // export --checkpoint` or a follow-up job.
        let mut hook = c.0.lock();
        if let Some(id) = hook.write_last()? {
            summary.last_checkpoint = Some(id);
        }
        if let Some(t) = hook.export_tally() {
            summary.exports = Some(ExportReport {
                dir: t.dir,
                count: t.count,
                last_version: t.last_version,
                full: t.full,
                seconds: t.seconds,
            });
        }
    }
    if a.rank == 0 && !a.train.test.is_empty() {
        evaluate(&mut summary, &job, &store, &a.train.test)?;
    }
    summary.table_rows = store.table_rows();
    if a.rank == 0 {
        summary.tables =
            sparta_worker::TableSummary::from_counts(&job.features, &store.rows_by_tag()?);
    }
    summary.peak_rss_bytes = peak_rss_bytes();
    print_summary(&summary);
    let samples = summary.train_rows.max(1) as f64;
    let wire = serde_json::json!({
        "unique_ids": unique,
        "sparse_bytes_per_sample": sparse_bytes as f64 / samples,
        "sparse_min_bytes_per_sample": (unique * (8 + 2 * row_bytes)) as f64 / samples,
        "dense_bytes_per_sample": dense_wire as f64 / samples,
        "bytes_sent": rpc_train.bytes_out,
        "bytes_received": rpc_train.bytes_in,
        "rpcs": rpc_train.requests,
        "rpcs_per_step": rpc_train.requests as f64 / steps as f64,
        "sparse_rpcs_per_step": sparse_rpcs as f64 / steps as f64,
        "bytes_per_sample": (rpc_train.bytes_out + rpc_train.bytes_in) as f64 / samples,
    });
    println!(
        "worker {}: {} RPCs ({:.2}/step, {:.2} sparse), bytes per sample on the wire: {:.0} sparse (minimum {:.0}) + {:.0} dense",
        a.rank,
        rpc_train.requests,
        rpc_train.requests as f64 / steps as f64,
        sparse_rpcs as f64 / steps as f64,
        sparse_bytes as f64 / samples,
        (unique * (8 + 2 * row_bytes)) as f64 / samples,
        dense_wire as f64 / samples,
    );
    let mut v = serde_json::to_value(&summary)?;
    v["rank"] = a.rank.into();
    v["workers"] = m.into();
    v["ps_shards"] = a.ps.len().into();
    v["wire"] = wire;
    if let Some(r) = &ring {
        let (params, _) = r.state();
        v["dense"] = serde_json::json!({
            "mode": "allreduce",
            "ring_compression": a.ring_compression,
            "tls": a.ring_tls_cert.is_some(),
            "params": params.len(),
            "checksum": super::worker_ring::checksum(&params),
        });
    }
    if let Some(path) = &a.train.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("writing summary to {}", path.display()))?;
    }
    Ok(v)
}

/// Copies the reader's counts (bad and late files, rows, bytes, source waits) into the
/// worker's metrics once a second
/// (a detached thread: it ends with the process).
fn publish_input_stats(stats: InputStats, metrics: Arc<sparta_ps::metrics::Metrics>) {
    let spawned = std::thread::Builder::new()
        .name("sparta-input-metrics".into())
        .spawn(move || loop {
            if let Some(s) = stats.lock().clone() {
                metrics.set_input_files(s.bad_files(), s.late_files_skipped());
                metrics.set_input(
                    [s.rows(), s.bytes(), s.source_bytes(), s.source_retries()],
                    s.source_wait_seconds(),
                );
            }
            std::thread::sleep(Duration::from_secs(1));
        });
    if let Err(e) = spawned {
        tracing::warn!("input file metrics off: {e}");
    }
}

/// Evaluates the cluster's final model on all of `test` (no part restriction).
fn evaluate(
    summary: &mut Summary,
    job: &sparta_core::Job,
    store: &Arc<RemoteStore>,
    test: &[PathBuf],
) -> Result<()> {
    let mut eval_job = job.clone();
    eval_job.reader.part = None;
    let mut eval = Trainer::with_store(eval_job, store.clone())?;
    store.pull_dense(eval.model_mut().param_values_mut())?;
    summary.record_eval(&eval.evaluate(test)?);
    Ok(())
}

/// `sparta worker`.
pub fn run(a: WorkerArgs) -> Result<()> {
    run_worker(&a)
        .map(|_| ())
        .with_context(|| format!("worker {}", a.rank))
}
