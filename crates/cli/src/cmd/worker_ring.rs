//! `sparta worker` in dense mode allreduce: forming the ring of the job's workers and the
//! dense store over it (see `sparta_worker::RingDense`).

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use sparta_core::Job;
use sparta_ps::RemoteStore;
use sparta_ring::{form_ring, Compression, RingConfig, RingTls};
use sparta_worker::RingDense;

use super::worker::WorkerArgs;

/// When the PS shards run dense mode allreduce: takes the cluster's dense state (fresh or
/// restored from a checkpoint) into `params` (the model's dense parameters), forms the ring with the other workers and
/// returns the dense store over it. `None` in the PS dense modes.
pub fn setup(
    a: &WorkerArgs,
    job: &Job,
    store: &Arc<RemoteStore>,
    token: &str,
    params: &mut [f32],
) -> Result<Option<Arc<RingDense>>> {
    let mode = store.mode()?;
    match (mode == "allreduce", a.ring.is_empty()) {
        (false, true) => return Ok(None),
        (false, false) => bail!(
            "--ring is for dense mode allreduce, but the PS shards run dense mode {mode} \
             (start them with --mode allreduce)"
        ),
        (true, true) => bail!(
            "the PS shards run dense mode allreduce: give every worker --ring with the ring \
             address of every worker, in rank order"
        ),
        (true, false) => {}
    }
    if a.ring.len() != a.num_workers {
        bail!(
            "--ring lists {} address(es) for {} worker(s) (--num-workers): one per worker, \
             in rank order",
            a.ring.len(),
            a.num_workers
        );
    }
    if a.train.follow.is_some() || !a.train.kafka.is_empty() {
        bail!(
            "dense mode allreduce steps every worker together, which online input (--follow, \
             --kafka) does not: a worker waiting for data would hold the ring; use --mode sync"
        );
    }
    let peers = a
        .ring
        .iter()
        .map(|s| resolve(s))
        .collect::<Result<Vec<SocketAddr>>>()?;
    let listener = TcpListener::bind(peers[a.rank]).with_context(|| {
        format!(
            "worker {} listening for the ring on {} (--ring entry {})",
            a.rank, peers[a.rank], a.rank
        )
    })?;
    let compression = Compression::parse(&a.ring_compression)
        .map_err(|e| anyhow::anyhow!("--ring-compression: {e}"))?;
    let tls = match (&a.ring_tls_cert, &a.ring_tls_key, &a.tls_ca) {
        (Some(cert), Some(key), Some(ca)) => Some(RingTls::from_pem_files(
            cert,
            key,
            ca,
            a.tls_domain.clone(),
        )?),
        _ => None,
    };
    let opt = store.dense_state(params)?;
    let cfg = RingConfig {
        rank: a.rank,
        peers,
        token: token.to_string(),
        compression,
        form_timeout: Duration::from_secs(a.ps_retry_secs.unwrap_or(job.raw.train.ps_retry_secs)),
        io_timeout: Duration::from_secs(a.rpc_timeout_secs),
        tls,
    };
    let ring = form_ring(&cfg, listener)
        .with_context(|| format!("worker {}: forming the dense all-reduce ring", a.rank))?;
    tracing::info!(
        "worker {}: dense all-reduce ring of {} formed ({compression:?} on the wire, {})",
        a.rank,
        a.num_workers,
        if a.ring_tls_cert.is_some() {
            "TLS"
        } else {
            "plain TCP"
        }
    );
    let dense = RingDense::new(ring, job.model.optimizer, params, opt)?;
    Ok(Some(Arc::new(dense)))
}

fn resolve(s: &str) -> Result<SocketAddr> {
    s.to_socket_addrs()
        .with_context(|| format!("--ring address {s:?}: expected host:port"))?
        .next()
        .with_context(|| format!("--ring address {s:?} resolves to nothing"))
}

/// A checksum of the dense parameters' bits (equal on every worker: the copies are
/// bit-identical), as 16 hex digits.
pub fn checksum(params: &[f32]) -> String {
    // xxh3-64 (as the checkpoint files use) over the little-endian bytes: stable across runs
    // and machines.
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for v in params {
        h.update(&v.to_le_bytes());
    }
    format!("{:016x}", h.digest())
}
