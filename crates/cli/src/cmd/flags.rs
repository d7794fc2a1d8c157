//! Flag groups and value enums shared by several subcommands, declared once.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, ValueEnum};
use sparta_cluster::{ClientConfig, RingOptions, RingTlsFiles};
use sparta_proto::Compression;
use sparta_ps::Mode;

/// The cluster's shared token (`sparta ps`, `coordinator`, `worker`).
#[derive(Args, Debug, Clone, Default)]
pub struct TokenFlags {
    /// File holding the cluster's shared token (default: the SPARTA_TOKEN environment
    /// variable).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

impl TokenFlags {
    /// The token from `--token-file` or `SPARTA_TOKEN`.
    pub fn load(&self) -> Result<String> {
        Ok(sparta_proto::auth::load_token(self.token_file.as_deref())?)
    }
}

/// How a control command reaches a cluster's PS shards (`sparta move-slots`, `scale-ps`): the
/// token, and TLS when they serve it.
#[derive(Args, Debug, Clone, Default)]
pub struct PsClientFlags {
    #[command(flatten)]
    pub token: TokenFlags,
    /// Talk TLS to the PS, trusting this CA certificate (PEM); the PS processes reach each
    /// other the same way (they need their --tls-ca).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Name the PS certificates must carry (default: the host of each --ps address).
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
}

impl PsClientFlags {
    /// A mover of the shards at `ps` (in shard order).
    pub fn mover(&self, ps: Vec<String>) -> Result<sparta_ps::mover::Mover> {
        let token = self.token.load()?;
        let tls =
            sparta_proto::ClientTls::from_flag(self.tls_ca.as_deref(), self.tls_domain.clone())?;
        Ok(sparta_ps::mover::Mover::new(ps, token, tls))
    }
}

/// Dense consistency of a PS cluster (`sparta ps --mode`, `sparta launch --mode`).
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DenseMode {
    /// Apply each push on arrival.
    #[default]
    Async,
    /// A per-step barrier.
    Sync,
    /// The workers average dense gradients among themselves over a ring; the PS only keeps
    /// the dense state for start, checkpoints and evaluation.
    Allreduce,
}

impl DenseMode {
    /// The name on the command line (what `sparta launch` passes to its children).
    pub fn name(self) -> &'static str {
        match self {
            DenseMode::Async => "async",
            DenseMode::Sync => "sync",
            DenseMode::Allreduce => "allreduce",
        }
    }
}

/// The dense consistency of a PS cluster (`sparta ps`, `sparta launch`).
#[derive(Args, Debug, Clone)]
pub struct DenseModeFlags {
    /// Dense consistency: async (apply each push on arrival), sync (a PS barrier per step) or
    /// allreduce (the workers average dense gradients among themselves over a ring; the PS
    /// only keep the dense state for start, checkpoints and evaluation).
    #[arg(long, value_enum, default_value_t = DenseMode::Async)]
    pub mode: DenseMode,
    /// Bounded staleness K instead of --mode: a worker at step s waits while the slowest is
    /// below s-K (async pushes).
    #[arg(long, conflicts_with = "mode")]
    pub staleness: Option<u64>,
    /// Sync mode: a step goes on without the K slowest workers, whose gradients join the next
    /// step (default: the job config's `train.backup_workers`).
    #[arg(long)]
    pub backup_workers: Option<usize>,
}

impl DenseModeFlags {
    /// The PS's mode for a job of `workers` workers (`job_backup`: the job's
    /// `train.backup_workers`, unless `--backup-workers` is given).
    pub fn resolve(&self, job_backup: usize, workers: usize) -> Result<Mode> {
        let m = match (self.mode, self.staleness) {
            (_, Some(k)) => Mode::Staleness(k),
            (DenseMode::Async, None) => Mode::Async,
            (DenseMode::Allreduce, None) => Mode::Allreduce,
            (DenseMode::Sync, None) => Mode::Sync {
                backup: self.backup_workers.unwrap_or(job_backup),
            },
        };
        match m {
            Mode::Sync { backup } if backup >= workers.max(1) => anyhow::bail!(
                "{backup} backup worker(s) of {workers}: a sync step needs at least one worker's \
                 gradients (--backup-workers / train.backup_workers must be below --workers)"
            ),
            Mode::Sync { .. } => {}
            _ if self.backup_workers.is_some_and(|b| b > 0) => {
                anyhow::bail!("--backup-workers applies to --mode sync only")
            }
            _ => {}
        }
        Ok(m)
    }
}

/// How a worker reaches the PS shards (`sparta worker`).
#[derive(Args, Debug, Clone)]
pub struct ShardLinkFlags {
    /// PS addresses in shard order, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ps: Vec<String>,
    /// The coordinator of a replicated cluster (`sparta coordinator`): requests follow each
    /// shard's primary through failovers.
    #[arg(long)]
    pub coordinator: Option<String>,
    #[command(flatten)]
    pub token: TokenFlags,
    /// Embedding values on the wire.
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub wire_compression: Compression,
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
    /// How long to wait at start for every PS to answer, seconds (on Kubernetes: while the
    /// shards' pods are scheduled and their images pulled).
    #[arg(long, default_value_t = 30)]
    pub ps_connect_secs: u64,
    /// Talk TLS to the PS, trusting this CA certificate (PEM).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Name the PS certificates must carry (default: the host of each --ps address).
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
}

impl ShardLinkFlags {
    /// The client settings of worker `rank` of `workers`; `retry_secs`: the job's
    /// `[train] ps_retry_secs`, unless `--ps-retry-secs` is given.
    pub fn client(&self, rank: usize, workers: usize, retry_secs: u64) -> Result<ClientConfig> {
        let mut c = ClientConfig::new(self.ps.clone(), self.token.load()?, rank, workers);
        c.compression = self.wire_compression;
        c.max_message_bytes = self.max_message_mb << 20;
        c.rpc_timeout = Duration::from_secs(self.rpc_timeout_secs);
        c.retries = self.retries;
        c.coordinator = self.coordinator.clone();
        c.tls =
            sparta_proto::ClientTls::from_flag(self.tls_ca.as_deref(), self.tls_domain.clone())?;
        c.retry_wait = Duration::from_secs(self.ps_retry_secs.unwrap_or(retry_secs));
        c.connect_wait = Duration::from_secs(self.ps_connect_secs);
        Ok(c)
    }
}

/// Dense mode allreduce: the ring of the workers (`sparta worker`).
#[derive(Args, Debug, Clone)]
pub struct RingFlags {
    /// Dense mode allreduce (the PS shards run `--mode allreduce`): the ring address of every
    /// worker in rank order, comma separated; this worker listens on its own.
    #[arg(long, value_delimiter = ',')]
    pub ring: Vec<String>,
    /// Dense gradient chunks on the ring (summed in f32).
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub ring_compression: Compression,
    /// TLS on the ring: this worker's certificate chain (PEM) for the link it accepts; the
    /// next worker's certificate is checked against --tls-ca (and named --tls-domain, else
    /// the IP address of its --ring entry).
    #[arg(long, requires_all = ["ring_tls_key", "tls_ca"])]
    pub ring_tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --ring-tls-cert.
    #[arg(long, requires = "ring_tls_cert")]
    pub ring_tls_key: Option<PathBuf>,
}

impl RingFlags {
    /// The ring settings; `link` gives the CA and name the peers' certificates are checked
    /// with; `online`: the job reads a followed directory or a topic (refused with a ring).
    pub fn options(&self, link: &ShardLinkFlags, online: bool) -> RingOptions {
        let tls = match (&self.ring_tls_cert, &self.ring_tls_key, &link.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(RingTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
                domain: link.tls_domain.clone(),
            }),
            _ => None,
        };
        RingOptions {
            peers: self.ring.clone(),
            compression: self.ring_compression,
            tls,
            online,
        }
    }
}

/// TensorBoard scalars (`sparta train`, `sparta worker`, `sparta launch`).
#[derive(Args, Debug, Clone, Default)]
pub struct TensorboardFlags {
    /// Write TensorBoard scalars (rows, samples/s, table rows/bytes/evictions, progressive
    /// metrics) here: `sparta train` into this run directory, `sparta worker` into
    /// DIR/worker-<rank> (`sparta launch`: one run per worker). View with `tensorboard
    /// --logdir DIR`.
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    /// With --tensorboard: steps between writes (and one at the end of training)
    /// [default: 100].
    #[arg(
        long,
        requires = "tensorboard",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub tensorboard_every_steps: Option<u64>,
}

impl TensorboardFlags {
    /// The run directory: `--tensorboard` itself, or for a cluster worker of `rank` its
    /// `worker-<rank>` subdirectory.
    pub fn run_dir(&self, rank: Option<usize>) -> Option<PathBuf> {
        let dir = self.tensorboard.as_ref()?;
        Some(match rank {
            None => dir.clone(),
            Some(r) => dir.join(format!("worker-{r}")),
        })
    }

    /// The hook writing the scalars, when `--tensorboard` is given (see [`Self::run_dir`]).
    pub fn hook(&self, rank: Option<usize>) -> Result<Option<Box<dyn sparta_worker::StepHook>>> {
        let Some(dir) = self.run_dir(rank) else {
            return Ok(None);
        };
        let every = self
            .tensorboard_every_steps
            .unwrap_or(sparta_worker::board_hook::DEFAULT_EVERY_STEPS);
        Ok(Some(Box::new(sparta_worker::BoardHook::create(
            &dir, every,
        )?)))
    }

    /// The flags as given, for the workers `sparta launch` starts.
    pub fn forward(&self) -> Vec<std::ffi::OsString> {
        let mut v = Vec::new();
        if let Some(d) = &self.tensorboard {
            v.extend(["--tensorboard".into(), d.into()]);
        }
        if let Some(k) = self.tensorboard_every_steps {
            v.extend(["--tensorboard-every-steps".into(), k.to_string().into()]);
        }
        v
    }
}
