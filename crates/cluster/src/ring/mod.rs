//! Dense mode allreduce on a cluster worker: forming the ring of the job's workers
//! ([`setup`]) and the dense store over it ([`RingDense`], in [`dense`]).

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sparta_core::Job;
use sparta_ring::{form_ring, Compression, RingConfig, RingTls};

use crate::error::ClusterError;
use crate::store::RemoteStore;

pub mod dense;

pub use dense::RingDense;

/// TLS on the ring: this worker's certificate chain and key (PEM) for the link it accepts;
/// the next worker's certificate is checked against `ca` (and named `domain`, else the IP
/// address of its ring entry).
#[derive(Clone, Debug)]
pub struct RingTlsFiles {
    /// Certificate chain (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
    /// CA certificate the peers' certificates are checked against (PEM).
    pub ca: PathBuf,
    /// Name the peers' certificates must carry.
    pub domain: Option<String>,
}

/// How this worker joins the dense all-reduce ring.
#[derive(Clone, Debug, Default)]
pub struct RingOptions {
    /// The ring address of every worker in rank order (`host:port`); this worker listens on
    /// its own. Empty: the PS shards hold the dense parameters (no ring).
    pub peers: Vec<String>,
    /// Dense gradient chunks on the ring (summed in f32).
    pub compression: Compression,
    /// TLS on every link of the ring.
    pub tls: Option<RingTlsFiles>,
    /// Whether the job reads online input (`--follow`, Kafka): refused with a ring.
    pub online: bool,
}

/// Deadlines of the ring: forming it, and one read or write on a link.
#[derive(Clone, Copy, Debug)]
pub struct RingTimes {
    /// How long the ring may take to form.
    pub form: Duration,
    /// Deadline of one read or write.
    pub io: Duration,
}

fn setup_err(m: impl Into<String>) -> ClusterError {
    ClusterError::Setup(m.into())
}

/// When the PS shards run dense mode allreduce: takes the cluster's dense state (fresh or
/// restored from a checkpoint) into `params` (the model's dense parameters), forms the ring
/// with the other workers and returns the dense store over it. `None` in the PS dense modes.
pub fn setup(
    o: &RingOptions,
    times: RingTimes,
    job: &Job,
    store: &Arc<RemoteStore>,
    params: &mut [f32],
) -> Result<Option<Arc<RingDense>>, ClusterError> {
    let (rank, workers) = (store.rank(), store.num_workers());
    let mode = store.mode()?;
    match (mode == "allreduce", o.peers.is_empty()) {
        (false, true) => return Ok(None),
        (false, false) => {
            return Err(setup_err(format!(
                "--ring is for dense mode allreduce, but the PS shards run dense mode {mode} \
                 (start them with --mode allreduce)"
            )))
        }
        (true, true) => {
            return Err(setup_err(
                "the PS shards run dense mode allreduce: give every worker --ring with the ring \
                 address of every worker, in rank order",
            ))
        }
        (true, false) => {}
    }
    if o.peers.len() != workers {
        return Err(setup_err(format!(
            "--ring lists {} address(es) for {} worker(s) (--num-workers): one per worker, \
             in rank order",
            o.peers.len(),
            workers
        )));
    }
    if o.online {
        return Err(setup_err(
            "dense mode allreduce steps every worker together, which online input (--follow, \
             --kafka) does not: a worker waiting for data would hold the ring; use --mode sync",
        ));
    }
    let peers = o
        .peers
        .iter()
        .map(|s| resolve(s))
        .collect::<Result<Vec<SocketAddr>, _>>()?;
    let listener = TcpListener::bind(peers[rank]).map_err(|e| {
        setup_err(format!(
            "worker {rank} listening for the ring on {} (--ring entry {rank}): {e}",
            peers[rank]
        ))
    })?;
    let tls = match &o.tls {
        Some(t) => Some(RingTls::from_pem_files(
            &t.cert,
            &t.key,
            &t.ca,
            t.domain.clone(),
        )?),
        None => None,
    };
    let opt = store.dense_state(params)?;
    let cfg = RingConfig {
        rank,
        peers,
        token: store.token().to_string(),
        compression: o.compression,
        form_timeout: times.form,
        io_timeout: times.io,
        tls,
    };
    let ring = form_ring(&cfg, listener).map_err(|e| {
        ClusterError::from(e).context(format!("worker {rank}: forming the dense all-reduce ring"))
    })?;
    tracing::info!(
        "worker {rank}: dense all-reduce ring of {workers} formed ({:?} on the wire, {})",
        o.compression,
        if o.tls.is_some() { "TLS" } else { "plain TCP" }
    );
    let dense = RingDense::new(ring, job.model.optimizer, params, opt)?;
    Ok(Some(Arc::new(dense)))
}

fn resolve(s: &str) -> Result<SocketAddr, ClusterError> {
    s.to_socket_addrs()
        .map_err(|e| setup_err(format!("--ring address {s:?}: expected host:port: {e}")))?
        .next()
        .ok_or_else(|| setup_err(format!("--ring address {s:?} resolves to nothing")))
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
