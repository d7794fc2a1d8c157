//! `sparta serve`: the HTTP JSON prediction API over an export directory, hot-reloading new
//! versions as they appear. It starts before the first export exists (not ready until it loads
//! one) and shuts down gracefully on SIGTERM or SIGINT (in-flight requests answered, exit 0).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sparta_serve::{ModelHandle, ServeConfig};

/// Flags of `sparta serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Export directory: the newest full export and its deltas are loaded, newer versions are
    /// applied as they appear. It may be missing or empty: the server answers 503 until the
    /// first export appears.
    #[arg(long)]
    pub model: PathBuf,
    /// Address to listen on (port 0: a free one, printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Milliseconds between checks for new versions.
    #[arg(long, default_value_t = 1000)]
    pub poll_ms: u64,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Most rows in one request (more: 400).
    #[arg(long, default_value_t = 10_000)]
    pub max_rows: usize,
    /// Server threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Longest wait for the requests in flight at shutdown.
const DRAIN: Duration = Duration::from_secs(30);

/// Runs `sparta serve` until SIGTERM or SIGINT.
pub fn run(a: ServeArgs) -> Result<()> {
    anyhow::ensure!(
        a.max_rows > 0,
        "--max-rows 0: expected at least 1 row per request"
    );
    anyhow::ensure!(
        a.max_body_bytes > 0,
        "--max-body-bytes 0: expected at least 1 byte per request body"
    );
    let handle = Arc::new(
        ModelHandle::open(&a.model)
            .with_context(|| format!("reading the export directory {}", a.model.display()))?,
    );
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = a.threads {
        rt.worker_threads(t.max(1));
    }
    let rt = rt.enable_all().build()?;
    let cfg = ServeConfig {
        max_body_bytes: a.max_body_bytes,
        max_rows: a.max_rows,
        poll: Duration::from_millis(a.poll_ms.max(1)),
    };
    rt.block_on(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let server = sparta_serve::start(&a.listen, handle, cfg)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        println!("listening on http://{}", server.addr);
        tracing::info!("serving {} on http://{}", a.model.display(), server.addr);
        let signal = tokio::select! {
            r = tokio::signal::ctrl_c() => { r?; "SIGINT" }
            _ = term.recv() => "SIGTERM",
        };
        tracing::info!("{signal}: shutting down (answering the requests in flight)");
        if tokio::time::timeout(DRAIN, server.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("requests still in flight after {DRAIN:?}: stopping anyway");
        }
        Ok(())
    })
}
