//! Serving a shard: the tonic server on a listener (TLS, token, idle exit) and the blocking
//! entry points `sparta ps` calls.

use super::*;

/// Serves `shard` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shard: Arc<Shard>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), PsError> {
    serve_watched(listener, shard, Arc::default(), shutdown).await
}

/// [`serve`], noting every request received in `activity` (for the idle exit).
pub async fn serve_watched(
    listener: tokio::net::TcpListener,
    shard: Arc<Shard>,
    activity: Arc<Activity>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), PsError> {
    let max = shard.cfg.max_message_bytes;
    shard.start_replication()?;
    let mut token =
        CheckToken::new(&shard.cfg.token, Arc::clone(&shard.metrics)).with_origin(shard.origin);
    let check = move |req: Request<()>| {
        activity.touch();
        token.call(req)
    };
    let svc = ParameterServerServer::new(Service {
        shard: Arc::clone(&shard),
    })
    .max_decoding_message_size(max)
    .max_encoding_message_size(max);
    let svc = tonic::service::interceptor::InterceptedService::new(svc, check);
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &shard.cfg.tls {
        builder = builder
            .tls_config(tls.config())
            .map_err(|e| PsError::Config(format!("TLS certificate or key: {e}")))?;
    }
    builder
        .tcp_nodelay(true)
        .add_service(svc)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown)
        .await
        .map_err(|e| PsError::Serve(e.to_string()))
}

/// What [`run_blocking`] reports once the shard listens.
#[derive(Clone, Debug)]
pub struct Listening {
    /// The gRPC address.
    pub addr: SocketAddr,
    /// The metrics address, when serving metrics.
    pub metrics: Option<SocketAddr>,
}

/// Why a shard stopped serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// SIGINT (Ctrl-C) or SIGTERM.
    Interrupted,
    /// No request for this long (the idle limit).
    Idle(Duration),
    /// Worker 0 reported the job over ([`StopWhen::job_over`]).
    JobOver,
    /// The shard was left out of the cluster's shards ([`StopWhen::retired`]).
    Retired,
}

/// When [`run_blocking_with`] stops besides SIGINT and SIGTERM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopWhen {
    /// No request has arrived for this long (see [`crate::idle`]).
    pub idle: Option<Duration>,
    /// Worker 0 reported the job over (`WorkerDone { job_over }`, sent once every worker is
    /// done and the end-of-job checkpoint, evaluation and table counts are through):
    /// `sparta ps --exit-when-done`. Requests in flight are answered first.
    pub job_over: bool,
    /// The shard was left out of the cluster's shards (`SetShards`, switched at a round):
    /// `sparta ps --exit-when-retired`. That round's answers (in flight: every worker waits
    /// in it) are sent first; no worker sends it anything after them.
    pub retired: bool,
}

/// Builds the shard, binds `listen` (port 0: a free one), optionally serves metrics on
/// `metrics_listen`, calls `ready` once listening, and serves until SIGINT (Ctrl-C) or
/// SIGTERM. Blocks the calling thread (owns its tokio runtime).
pub fn run_blocking(
    job: &Job,
    cfg: PsConfig,
    listen: &str,
    metrics_listen: Option<&str>,
    threads: usize,
    ready: impl FnOnce(&Listening),
) -> Result<(), PsError> {
    let never = StopWhen::default();
    run_blocking_with(job, cfg, listen, metrics_listen, threads, never, ready).map(|_| ())
}

/// [`run_blocking`], also stopping as `stop_when` says (idle, the job over); says why it
/// stopped.
pub fn run_blocking_with(
    job: &Job,
    cfg: PsConfig,
    listen: &str,
    metrics_listen: Option<&str>,
    threads: usize,
    stop_when: StopWhen,
    ready: impl FnOnce(&Listening),
) -> Result<Stopped, PsError> {
    let metrics = Arc::new(Metrics::new("ps"));
    let shard = Arc::new(Shard::new(job, cfg, Arc::clone(&metrics))?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .thread_name("sparta-ps")
        .build()
        .map_err(|source| PsError::Io {
            what: "starting the tokio runtime".into(),
            source,
        })?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| PsError::Io {
                what: format!("binding --listen {listen}"),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| PsError::Io {
            what: "listener address".into(),
            source,
        })?;
        let maddr = match metrics_listen {
            Some(m) => Some(sparta_proto::metrics::serve_metrics(m, Arc::clone(&metrics)).await?),
            None => None,
        };
        let started = Instant::now();
        // Handled from here on: a signal sent once the shard says it listens stops it cleanly.
        let interrupted = interrupted()?;
        ready(&Listening {
            addr,
            metrics: maddr,
        });
        let activity = Arc::new(Activity::default());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let watch = Arc::clone(&activity);
        let told = Arc::clone(&shard);
        let shutdown = async move {
            let why = tokio::select! {
                () = interrupted => Stopped::Interrupted,
                idle = async {
                    match stop_when.idle {
                        Some(limit) => crate::idle::idle_exit(watch, limit).await,
                        None => std::future::pending().await,
                    }
                } => Stopped::Idle(idle),
                () = async {
                    match stop_when.job_over {
                        true => told.job_over.notified().await,
                        false => std::future::pending().await,
                    }
                } => Stopped::JobOver,
                () = async {
                    match stop_when.retired {
                        true => told.moves.retired.notified().await,
                        false => std::future::pending().await,
                    }
                } => Stopped::Retired,
            };
            let _ = tx.send(why);
        };
        let r = serve_watched(listener, Arc::clone(&shard), activity, shutdown).await;
        let why = rx.await.unwrap_or(Stopped::Interrupted);
        tracing::info!(
            "PS shard {} stopped after {:.1}s, {} rows",
            shard.cfg.shard,
            started.elapsed().as_secs_f64(),
            shard.rows()
        );
        r.map(|()| why)
    })
}

/// Resolves on the first SIGINT or SIGTERM that arrives after this returns (the handlers are
/// registered here, not on the first poll). A thread waits for the signal (signal-hook's
/// iterator); dropping the future ends it and unregisters the handlers.
fn interrupted() -> Result<Interrupt, PsError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let io = |source| PsError::Io {
        what: "installing the SIGINT/SIGTERM handler".into(),
        source,
    };
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(io)?;
    let handle = signals.handle();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("sparta-ps-signals".into())
        .spawn(move || {
            // `None`: closed by the future's drop.
            if let Some(sig) = signals.forever().next() {
                let _ = tx.send(sig);
            }
        })
        .map_err(io)?;
    Ok(Interrupt { rx, handle })
}

/// The future of [`interrupted`].
struct Interrupt {
    rx: tokio::sync::oneshot::Receiver<std::ffi::c_int>,
    handle: signal_hook::iterator::Handle,
}

impl std::future::Future for Interrupt {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        std::pin::Pin::new(&mut self.rx).poll(cx).map(|_| ())
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        self.handle.close();
    }
}
