//! `sparta serve`: the HTTP JSON prediction API over an export directory, hot-reloading new
//! versions as they appear. It starts before the first export exists (not ready until it loads
//! one) and shuts down gracefully on SIGTERM or SIGINT (in-flight requests answered, exit 0).
//!
//! Security: a bearer token (`--token-file` or `SPARTA_SERVE_TOKEN`) guards every route but
//! `GET /health`; `--tls-cert`/`--tls-key` serve HTTPS. Without a token it listens on loopback
//! only, unless `--insecure-no-auth` says otherwise.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sparta_serve::auth::{listen_is_loopback, TOKEN_ENV};
use sparta_serve::{BearerToken, ModelHandle, Security, ServeConfig};

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
    /// Milliseconds a client may take to send a request's header (also the idle limit of a
    /// kept-alive connection), and again its body; a slower client is disconnected (a late
    /// body answered 408).
    #[arg(long, default_value_t = 10_000)]
    pub read_timeout_ms: u64,
    /// Server threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// File holding the bearer token every request but `GET /health` must carry
    /// (`Authorization: Bearer TOKEN`; trimmed, printable ASCII). Default: the
    /// SPARTA_SERVE_TOKEN environment variable; neither: no authentication (loopback only).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Serve without a token on a non-loopback --listen address (e.g. behind an
    /// authenticating proxy). Without it, `serve` refuses to start unauthenticated there.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Serve export version V exactly (its full export and the deltas up to it) and load no
    /// newer one until `POST /v1/unpin`. The version must be in --model.
    #[arg(long, value_name = "V")]
    pub pin_version: Option<u64>,
    /// PEM certificate chain: serve HTTPS (with --tls-key).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
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
    anyhow::ensure!(
        a.read_timeout_ms > 0,
        "--read-timeout-ms 0: expected at least 1 millisecond"
    );
    let security = security(&a)?;
    let scheme = if security.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let handle = match a.pin_version {
        Some(v) => ModelHandle::open_pinned(&a.model, v).with_context(|| {
            format!(
                "--pin-version {v}: loading it from the export directory {}",
                a.model.display()
            )
        })?,
        None => ModelHandle::open(&a.model)
            .with_context(|| format!("reading the export directory {}", a.model.display()))?,
    };
    let handle = Arc::new(handle);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = a.threads {
        rt.worker_threads(t.max(1));
    }
    let rt = rt.enable_all().build()?;
    let cfg = ServeConfig {
        max_body_bytes: a.max_body_bytes,
        max_rows: a.max_rows,
        poll: Duration::from_millis(a.poll_ms.max(1)),
        read_timeout: Duration::from_millis(a.read_timeout_ms),
    };
    rt.block_on(async move {
        let signal = crate::signals::first_signal()?;
        let server = sparta_serve::start_secured(&a.listen, handle, cfg, security)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        println!("listening on {scheme}://{}", server.addr);
        tracing::info!(
            "serving {} on {scheme}://{}",
            a.model.display(),
            server.addr
        );
        let signal = signal.await;
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

/// The token and TLS config from the flags, and the rule that a server without a token
/// listens on loopback only unless `--insecure-no-auth` is given.
fn security(a: &ServeArgs) -> Result<Security> {
    let env = match std::env::var(TOKEN_ENV) {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            anyhow::bail!("{TOKEN_ENV}: expected printable ASCII, found bytes that are not UTF-8")
        }
    };
    let token = BearerToken::load(a.token_file.as_deref(), env.as_deref())?;
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(sparta_serve::tls::server_config(cert, key)?),
        (None, None) => None,
        (Some(_), None) => anyhow::bail!(
            "--tls-cert given without --tls-key: pass both PEM files, or neither for plain HTTP"
        ),
        (None, Some(_)) => anyhow::bail!(
            "--tls-key given without --tls-cert: pass both PEM files, or neither for plain HTTP"
        ),
    };
    let loopback = listen_is_loopback(&a.listen)?;
    match (&token, loopback, a.insecure_no_auth) {
        (None, false, false) => anyhow::bail!(
            "refusing to serve {} without authentication: pass --token-file FILE (or set {TOKEN_ENV}), \
             or --insecure-no-auth to serve it open (e.g. behind an authenticating proxy)",
            a.listen
        ),
        (None, false, true) => tracing::warn!(
            "--insecure-no-auth: serving {} without authentication",
            a.listen
        ),
        (Some(_), false, _) if tls.is_none() => tracing::warn!(
            "the bearer token travels in clear text on {}: pass --tls-cert/--tls-key or terminate TLS in front",
            a.listen
        ),
        _ => {}
    }
    Ok(Security { token, tls })
}
