//! `sparta coordinator`: failover for a replicated PS cluster (see `sparta_ps::failover`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::flags::TokenFlags;

/// Flags of `sparta coordinator`.
#[derive(Args, Debug)]
pub struct CoordinatorArgs {
    /// Every PS address in shard order, comma separated (as the workers' --ps).
    #[arg(long, value_delimiter = ',', required = true)]
    pub ps: Vec<String>,
    /// Copies of every shard, as given to every PS (`sparta ps --replicas`).
    #[arg(long)]
    pub replicas: usize,
    /// The shards the cluster started with, when --ps lists shards added while it trained
    /// (as given to every PS: `sparta ps --dense-shards`); the coordinator follows shards
    /// added and removed later by itself.
    #[arg(long)]
    pub dense_shards: Option<usize>,
    /// Address to serve the workers' route lookups on (they get it as --coordinator).
    #[arg(long, default_value = "0.0.0.0:7069")]
    pub listen: String,
    /// How often each PS is asked for its roles (its heartbeat), milliseconds.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_ms: u64,
    /// Silence after which a PS is dead and its shards fail over, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub dead_after_ms: u64,
    #[command(flatten)]
    pub token: TokenFlags,
    /// Keep the shard map here as JSON (failovers, rejoins, every shard's primary), replaced
    /// after every change.
    #[arg(long)]
    pub state_file: Option<PathBuf>,
    /// Start from the shard map in --state-file when the file exists: a restarted
    /// coordinator of the same cluster carries on (failovers, epochs, the processes it knew;
    /// one restarted meanwhile is seen as such). Without it the map starts afresh.
    #[arg(long, requires = "state_file")]
    pub restore: bool,
    /// Serve the workers' route lookups over TLS with this certificate chain (PEM), and reach
    /// the PS processes (which serve TLS) verifying them with --tls-ca; needs --tls-key and
    /// --tls-ca. The workers' --tls-ca verifies this certificate too.
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA certificate (PEM) the PS processes' certificates are verified with.
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Name the PS certificates must carry (default: the host of each --ps address).
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
}

/// Runs the coordinator until SIGINT (Ctrl-C) or SIGTERM.
pub fn run(a: CoordinatorArgs) -> Result<()> {
    let token = a.token.load()?;
    let cfg = sparta_ps::failover::CoordinatorConfig {
        addrs: a.ps.clone(),
        replicas: a.replicas,
        start_shards: a.dense_shards,
        token,
        interval: Duration::from_millis(a.heartbeat_ms.max(10)),
        dead_after: Duration::from_millis(a.dead_after_ms.max(1)),
        state_file: a.state_file.clone(),
        restore: a.restore,
        tls: sparta_proto::ServerTls::from_flags(a.tls_cert.as_deref(), a.tls_key.as_deref())?,
        ps_tls: sparta_proto::ClientTls::from_flag(a.tls_ca.as_deref(), a.tls_domain.clone())?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&a.listen)
            .await
            .with_context(|| format!("binding --listen {}", a.listen))?;
        let addr = listener.local_addr()?;
        // Handled from here on: a signal sent once it says it listens stops it cleanly.
        let signal = crate::signals::first_signal()?;
        println!(
            "sparta coordinator listening on {addr}: {} PS, {} copies of every shard",
            cfg.addrs.len(),
            cfg.replicas
        );
        let stop = async move {
            signal.await;
        };
        sparta_ps::failover::run(cfg, listener, stop)
            .await
            .map_err(anyhow::Error::msg)
    })
}
