//! `sparta.train_worker`: one training worker of a PS cluster (`sparta ps` shards), the same
//! entry point as the CLI's `sparta worker`: arguments -> `sparta_cluster` options ->
//! `ClusterWorker::connect(..)?.run()`.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use sparta_cluster::{ClientConfig, ClusterWorker, RingOptions, RingTlsFiles, WorkerOptions};
use sparta_proto::{ClientTls, Compression, ProtoError};

use crate::errors::{guard, Error};
use crate::job::Job;
use crate::run::interruptible;

/// `what` as a compression name (`none`, `fp16`, `bf16`).
fn compression(what: &str, name: &str) -> Result<Compression, Error> {
    Compression::parse(name).map_err(|e| Error::Value(format!("{what}: {e}")))
}

/// `secs` seconds as a duration (`what` names the argument).
fn seconds(what: &str, secs: f64) -> Result<Duration, Error> {
    if secs.is_finite() && secs > 0.0 {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(Error::Value(format!("{what} {secs}: expected seconds > 0")))
    }
}

/// The token: `token`, else `SPARTA_TOKEN` (as every PS and worker of the cluster reads it).
fn load_token(token: Option<String>) -> Result<String, Error> {
    match token {
        Some(t) if t.trim().is_empty() => Err(Error::Value(
            "token is empty: pass the cluster's shared token (or leave it out for SPARTA_TOKEN)"
                .into(),
        )),
        Some(t) => Ok(t.trim().to_string()),
        None => sparta_proto::auth::load_token(None).map_err(|e| match e {
            ProtoError::Auth(m) if m.starts_with("no token") => Error::Value(format!(
                "no token: pass token= or set {} (the same on every PS and worker)",
                sparta_proto::auth::TOKEN_ENV
            )),
            e => Error::from(sparta_cluster::ClusterError::from(e)),
        }),
    }
}

/// Trains worker `rank` of `num_workers` against the PS shards `ps` (in shard order) on its
/// part of `train`; rank 0 then waits for every worker, writes the end-of-job checkpoint and
/// evaluates on `test`. Returns the summary as JSON text (what `sparta worker --summary-json`
/// writes: the training summary plus `rank`, `workers`, `ps_shards`, `wire`, `dense`).
#[pyfunction]
#[pyo3(signature = (
    job,
    ps,
    rank,
    num_workers,
    train=Vec::new(),
    test=Vec::new(),
    token=None,
    coordinator=None,
    wire_compression="none",
    ring=Vec::new(),
    ring_compression="none",
    ring_tls_cert=None,
    ring_tls_key=None,
    max_message_mb=256,
    rpc_timeout_secs=300.0,
    retries=4,
    ps_retry_secs=None,
    metrics_listen=None,
    tls_ca=None,
    tls_domain=None,
    quiet=false,
))]
#[allow(clippy::too_many_arguments)]
pub fn train_worker(
    py: Python<'_>,
    job: &Job,
    ps: Vec<String>,
    rank: usize,
    num_workers: usize,
    train: Vec<PathBuf>,
    test: Vec<PathBuf>,
    token: Option<String>,
    coordinator: Option<String>,
    wire_compression: &str,
    ring: Vec<String>,
    ring_compression: &str,
    ring_tls_cert: Option<PathBuf>,
    ring_tls_key: Option<PathBuf>,
    max_message_mb: usize,
    rpc_timeout_secs: f64,
    retries: u32,
    ps_retry_secs: Option<f64>,
    metrics_listen: Option<String>,
    tls_ca: Option<PathBuf>,
    tls_domain: Option<String>,
    quiet: bool,
) -> PyResult<String> {
    guard(|| {
        let job = job.validated()?;
        if train.is_empty() {
            return Err(Error::Value("train: no files given".into()));
        }
        if tls_domain.is_some() && tls_ca.is_none() {
            return Err(Error::Value("tls_domain needs tls_ca".into()));
        }
        let ring_tls = match (ring_tls_cert, ring_tls_key, &tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(RingTlsFiles {
                cert,
                key,
                ca: ca.clone(),
                domain: tls_domain.clone(),
            }),
            (None, None, _) => None,
            _ => {
                return Err(Error::Value(
                    "TLS on the ring needs ring_tls_cert, ring_tls_key and tls_ca".into(),
                ))
            }
        };
        let mut client = ClientConfig::new(ps, load_token(token)?, rank, num_workers);
        client.compression = compression("wire_compression", wire_compression)?;
        client.max_message_bytes = max_message_mb << 20;
        client.rpc_timeout = seconds("rpc_timeout_secs", rpc_timeout_secs)?;
        client.retries = retries;
        client.coordinator = coordinator;
        client.tls = ClientTls::from_flag(tls_ca.as_deref(), tls_domain)
            .map_err(sparta_cluster::ClusterError::from)?;
        client.retry_wait = match ps_retry_secs {
            Some(s) => seconds("ps_retry_secs", s)?,
            None => Duration::from_secs(job.raw.train.ps_retry_secs),
        };
        let opts = WorkerOptions {
            ring: RingOptions {
                peers: ring,
                compression: compression("ring_compression", ring_compression)?,
                tls: ring_tls,
                online: false,
            },
            metrics_listen,
            train,
            test,
            progress: !quiet,
            ..WorkerOptions::new(client)
        };
        // Ctrl-C stops training after the current step; the worker then leaves as at the end
        // of its input (rank 0 still finishes the job) and the exception is raised.
        let stop = Arc::new(AtomicBool::new(false));
        let opts = WorkerOptions {
            stop: Some(Arc::clone(&stop)),
            ..opts
        };
        let report = interruptible(py, Some(&stop), move || {
            let worker = ClusterWorker::connect(job, opts)?;
            if let Some(bound) = worker.metrics_addr() {
                tracing::info!("sparta worker {rank} metrics on http://{bound}/metrics");
            }
            Ok(worker.run()?)
        })?;
        tracing::info!("{}", report.wire_line);
        serde_json::to_string(&report.json).map_err(|e| Error::Value(format!("summary: {e}")))
    })
}
