//! The worker's side: [`RemoteStore`] implements `SparseStore` and `DenseStore` over gRPC
//! clients to every PS shard. One request per shard per step and direction for all tables, sent to all shards in
//! parallel; unreachable shards are retried with exponential backoff, then reported by address.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use sparta_core::{
    check_len, CoreError, Job, KeyParts, PullInto, PushFrom, Routing, SparseStore, TableId,
};
use sparta_nn::Model;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};

use sparta_proto::auth::{restarted_message, AddToken};
use sparta_proto::headers::NON_FINITE;
use sparta_proto::metrics::{Metrics, Rpc, GRPC_FRAME_BYTES};
use sparta_proto::pb;
use sparta_proto::pb::parameter_server_client::ParameterServerClient;
use sparta_proto::status::{classify, Cause};
use sparta_proto::tls::ClientTls;
use sparta_proto::wire::{self, Compression};
use sparta_proto::ProtoError;

mod ckpt_rpc;
mod dense;
mod forget;
mod job_over;
pub(crate) mod requests;
mod retry;
pub mod route;
mod shards;

use route::{primary_moved, Routes};

type Client = ParameterServerClient<InterceptedService<Channel, AddToken>>;

/// What a request does first at a shard's new primary (see [`RemoteStore::fan_out_with`]).
type AtNewPrimary<Req> = Arc<
    dyn Fn(Client, &Req) -> Pin<Box<dyn Future<Output = Result<(), Status>> + Send>> + Send + Sync,
>;

/// How often the shards (and the coordinator) are asked again while the cluster starts.
const START_POLL: Duration = Duration::from_millis(100);

/// The next delay of an endless backoff.
fn next(delays: &mut impl Iterator<Item = Duration>) -> Duration {
    delays.next().unwrap_or(Duration::from_secs(1))
}

/// How often a call waiting on a shard asks the coordinator whether its primary moved.
const MOVED_POLL: Duration = Duration::from_millis(500);

/// How a worker reaches the cluster.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host:port` of every shard, in shard order.
    pub addrs: Vec<String>,
    /// The shared token.
    pub token: String,
    /// This worker's rank.
    pub rank: usize,
    /// Workers in the job.
    pub num_workers: usize,
    /// Encoding of embedding values (pulled rows and pushed gradients).
    pub compression: Compression,
    /// Largest message accepted or sent, bytes.
    pub max_message_bytes: usize,
    /// Deadline of one RPC (a sync barrier waits inside one).
    pub rpc_timeout: Duration,
    /// Retries of an RPC that found its shard unreachable, at least (see `retry_wait`).
    pub retries: u32,
    /// How long an unreachable shard is retried (backoff from 50 ms, at most 1 s apart)
    /// before the step fails with an error naming its address.
    pub retry_wait: Duration,
    /// How long to wait for every shard to come up at start.
    pub connect_wait: Duration,
    /// A call waiting longer than this on a shard logs a warning naming it, again at this
    /// interval while it lasts (the job's `[train] barrier_warn_secs`).
    pub warn_after: Duration,
    /// TLS to the shards (plain gRPC when `None`).
    pub tls: Option<ClientTls>,
    /// The coordinator of a replicated cluster (`sparta coordinator`): requests follow
    /// each shard's primary through failovers.
    pub coordinator: Option<String>,
}

impl ClientConfig {
    /// Defaults: no compression, 256 MiB messages, 300 s RPC deadline, 4 retries, 60 s of
    /// retrying an unreachable shard, 30 s wait at start.
    pub fn new(addrs: Vec<String>, token: String, rank: usize, num_workers: usize) -> Self {
        Self {
            addrs,
            token,
            rank,
            num_workers,
            compression: Compression::None,
            max_message_bytes: sparta_proto::DEFAULT_MAX_MESSAGE_BYTES,
            rpc_timeout: Duration::from_secs(300),
            retries: 4,
            retry_wait: Duration::from_secs(60),
            connect_wait: Duration::from_secs(30),
            warn_after: Duration::from_secs(10),
            tls: None,
            coordinator: None,
        }
    }
}

#[derive(Clone)]
struct ShardClient {
    addr: String,
    client: Client,
    /// Its interceptor: sends the token and, once known, the incarnation expected.
    token: AddToken,
    dense_offset: usize,
    dense_len: usize,
    /// What the shard said about its start (incarnation, restored checkpoint).
    origin: pb::OriginResponse,
    /// Steps (sparse pushes) not yet reported to it. A push request to it carries them
    /// (`PushRequest.steps`: the shard's clock advances by them) and resets the count; a
    /// shard that gets no keys in a step hears of it with its next push.
    unsent_steps: Arc<AtomicU32>,
}

/// Sparse and dense parameters on a PS cluster.
pub struct RemoteStore {
    rt: tokio::runtime::Runtime,
    /// The cluster's shards in shard order (see [`RemoteStore::shards`]): replaced when they
    /// change at a round (`store::shards`).
    shards: parking_lot::RwLock<Arc<Vec<ShardClient>>>,
    cfg: ClientConfig,
    dims: Vec<usize>,
    names: Vec<String>,
    dense_total: usize,
    step: AtomicU64,
    /// Names this store's pushes apart from any earlier store's of the same rank (a
    /// restarted worker), so shards apply each push once even when it is sent twice.
    session: u64,
    /// Sparse pushes sent so far: the next one's sequence number.
    push_seq: AtomicU64,
    metrics: Arc<Metrics>,
    /// Where each shard's requests go (moved by the coordinator on failover).
    routes: Arc<Routes>,
    /// With a coordinator: for each pull that created rows and is not pushed yet, oldest
    /// first, the primary of each shard that answered it (a push sent to another one pulls
    /// its keys there first: see [`pull_again`]).
    pulled_at: parking_lot::Mutex<VecDeque<Vec<Option<String>>>>,
    /// Which shard holds each key, and the table's epoch: the newest slot table the shards
    /// told (at connect, and after every checkpoint round, where slot moves switch; see
    /// `sparta_core::routing`).
    routing: parking_lot::RwLock<(u64, Routing)>,
    /// Builds a client of the PS at an address (a shard added while training).
    connect: Arc<route::Connect>,
    /// Shards holding the dense vector (the first ones; shard 0's `Info`).
    dense_shards: usize,
}

/// Pulls remembered in [`RemoteStore::pulled_at`], at most: a pipelined worker pulls one
/// batch ahead of its push; a pull never pushed (an aborted step) ages out.
const PULLS_AHEAD: usize = 8;

/// Does a failed call deserve another try (the shard was not reached, or the connection
/// broke under it)?
fn retryable(s: &Status) -> bool {
    matches!(
        classify(s.code(), s.message(), false),
        Cause::Refused | Cause::Unreachable | Cause::ConnectionLost
    ) || (s.code() == Code::Unknown && !s.message().contains("token"))
}

fn transport(msg: String) -> CoreError {
    CoreError::Transport(msg)
}

/// Checks that the shard behind `client` is still the process first connected to (the
/// client's interceptor sends the incarnation it expects; the shard refuses another).
async fn same_incarnation(mut client: Client, incarnation: u64) -> Result<(), Status> {
    let o = client.origin(pb::OriginRequest {}).await?.into_inner();
    if incarnation != 0 && o.incarnation != incarnation {
        return Err(Status::aborted(restarted_message(&o)));
    }
    Ok(())
}

/// A random number per call (std's per-process random hash keys, which also differ between
/// calls in one process, mixed with the time): a store's push session.
fn session_nonce() -> u64 {
    use std::hash::BuildHasher;
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    std::collections::hash_map::RandomState::new().hash_one((t, std::process::id()))
}

impl RemoteStore {
    /// The id of this store's push `seq` (the same on every attempt of the push).
    fn push_id(&self, seq: u64) -> pb::PushId {
        pb::PushId {
            rank: self.cfg.rank as u32,
            session: self.session,
            seq,
        }
    }

    /// Connects to every shard (waiting up to `connect_wait` for each to come up) and checks
    /// that each serves the job's tables and dense layout.
    pub fn connect(cfg: ClientConfig, job: &Job) -> Result<Self, CoreError> {
        if cfg.addrs.is_empty() {
            return Err(CoreError::Config("--ps lists no PS address".into()));
        }
        if cfg.num_workers == 0 || cfg.rank >= cfg.num_workers {
            return Err(CoreError::Config(format!(
                "--rank {} must be below --num-workers {}",
                cfg.rank, cfg.num_workers
            )));
        }
        let token = AddToken::new(&cfg.token).map_err(|e| CoreError::Config(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("sparta-rpc")
            .build()
            .map_err(|e| transport(format!("starting the tokio runtime: {e}")))?;
        let dense_total = Model::new(job.model.clone())?.num_params();
        let dims: Vec<usize> = job.features.physical.iter().map(|p| p.config.dim).collect();
        let names: Vec<String> = job
            .features
            .physical
            .iter()
            .map(|p| p.config.name.clone())
            .collect();
        let connect: Arc<route::Connect> = {
            let (tls, timeout, max) = (cfg.tls.clone(), cfg.rpc_timeout, cfg.max_message_bytes);
            Arc::new(move |addr: &str, token: AddToken| {
                let ep = sparta_proto::tls::endpoint(addr, tls.as_ref(), "PS")?
                    .connect_timeout(Duration::from_secs(2))
                    .timeout(timeout)
                    .tcp_nodelay(true);
                Ok(
                    ParameterServerClient::with_interceptor(ep.connect_lazy(), token)
                        .max_decoding_message_size(max)
                        .max_encoding_message_size(max),
                )
            })
        };
        let mut shards = Vec::with_capacity(cfg.addrs.len());
        let mut route = Vec::with_capacity(cfg.addrs.len());
        for (i, addr) in cfg.addrs.iter().enumerate() {
            let shard_token = match cfg.coordinator {
                Some(_) => token.for_copy(i as u32, 0),
                None => token.for_shard(),
            };
            let client = {
                let _g = rt.enter();
                connect(addr, shard_token.clone()).map_err(|e| CoreError::Config(e.to_string()))?
            };
            route.push((addr.clone(), client.clone(), shard_token.clone()));
            shards.push(ShardClient {
                addr: addr.clone(),
                client,
                token: shard_token,
                dense_offset: 0,
                dense_len: 0,
                origin: pb::OriginResponse::default(),
                unsent_steps: Arc::default(),
            });
        }
        let mut routes = Routes::fixed(route);
        if let Some(c) = &cfg.coordinator {
            let coord = {
                let _g = rt.enter();
                route::coordinator_client(c, &cfg.token, cfg.tls.as_ref())
                    .map_err(|e| CoreError::Config(e.to_string()))?
            };
            routes = routes.coordinated(coord, token.clone(), Arc::clone(&connect));
        }
        let n_shards = shards.len();
        let mut store = Self {
            rt,
            shards: parking_lot::RwLock::new(Arc::new(shards)),
            cfg,
            dims,
            names,
            dense_total,
            step: AtomicU64::new(0),
            session: session_nonce(),
            push_seq: AtomicU64::new(0),
            metrics: Arc::new(Metrics::new("worker")),
            routes: Arc::new(routes),
            pulled_at: parking_lot::Mutex::new(VecDeque::with_capacity(PULLS_AHEAD)),
            routing: parking_lot::RwLock::new((0, Routing::even(n_shards))),
            connect,
            dense_shards: n_shards,
        };
        store.check_cluster(job)?;
        if store.routes.follows_coordinator() {
            // The epoch of every primary: from now on a copy replaced by a newer one refuses
            // this worker, and a failover moves its requests.
            let deadline = Instant::now() + store.cfg.connect_wait;
            retry::poll_until(
                deadline,
                START_POLL,
                || store.rt.block_on(store.routes.refresh(0)),
                |_| true,
                |s| tracing::debug!("coordinator not reachable yet: {}", s.message()),
            )
            .map_err(|s| {
                transport(format!(
                    "the coordinator at {} did not answer: {}",
                    store.cfg.coordinator.as_deref().unwrap_or_default(),
                    s.message()
                ))
            })?;
        }
        Ok(store)
    }

    /// The cluster's shards as this store knows them now.
    fn shards(&self) -> Arc<Vec<ShardClient>> {
        Arc::clone(&self.shards.read())
    }

    /// This worker's rank.
    pub fn rank(&self) -> usize {
        self.cfg.rank
    }

    /// Workers in the job.
    pub fn num_workers(&self) -> usize {
        self.cfg.num_workers
    }

    /// The shared token (the ring's hello carries it too).
    pub fn token(&self) -> &str {
        &self.cfg.token
    }

    /// The worker-side RPC metrics (bytes, requests, latencies as seen by this worker).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Serves this worker's metrics on `addr` (port 0: a free one); returns the bound address.
    pub fn serve_metrics(&self, addr: &str) -> Result<std::net::SocketAddr, ProtoError> {
        self.rt.block_on(sparta_proto::metrics::serve_metrics(
            addr,
            Arc::clone(&self.metrics),
        ))
    }

    /// Waits for each shard's `Info` and checks shard order, table dims and the dense layout.
    fn check_cluster(&mut self, job: &Job) -> Result<(), CoreError> {
        let n = self.shards().len();
        for i in 0..n {
            let deadline = Instant::now() + self.cfg.connect_wait;
            let client = self.shards()[i].client.clone();
            let (warn_after, shown) = (self.cfg.warn_after, self.shards()[i].addr.clone());
            let info = retry::poll_until(
                deadline,
                START_POLL,
                || {
                    let mut c = client.clone();
                    let info = c.info(pb::InfoRequest {});
                    let info = retry::warn_while_waiting(info, warn_after, i, &shown, "connecting");
                    self.rt.block_on(info)
                },
                retryable,
                |_| {},
            )
            .map_err(|s| self.describe(i, "connecting", &s, 1, true))?
            .into_inner();
            let addr = self.shards()[i].addr.clone();
            let bad = |m: String| CoreError::Config(format!("PS shard {i} at {addr}: {m}"));
            let (off, len) = self.check_info(i, n, &info).map_err(bad)?;
            if i == 0 && info.dense_shards > 0 {
                self.dense_shards = info.dense_shards as usize;
            }
            let mut c = self.shards()[i].client.clone();
            let origin = match self.rt.block_on(c.origin(pb::OriginRequest {})) {
                Ok(o) => o.into_inner(),
                Err(s) => return Err(self.describe(i, "origin", &s, 1, false)),
            };
            let me = &mut Arc::make_mut(self.shards.get_mut())[i];
            me.dense_offset = off;
            me.dense_len = len;
            me.origin = origin;
            // Every later request names this instance: a restarted shard refuses it.
            me.token.expect_incarnation(me.origin.incarnation);
            tracing::debug!(
                "PS shard {i} at {addr}: mode {}, {} rows",
                info.mode,
                info.rows
            );
            if info.shard_addrs.len() > n {
                return Err(bad(format!(
                    "the cluster has {} shards ({}), --ps lists {n}",
                    info.shard_addrs.len(),
                    info.shard_addrs.join(",")
                )));
            }
            self.adopt_routing(info.routing_epoch, &info.slot_runs, &info.shard_addrs, &[])
                .map_err(|e| bad(e.to_string()))?;
        }
        let _ = job;
        Ok(())
    }

    /// Shards holding the dense vector (the cluster's count at its start or resume: a shard
    /// added while training holds none).
    pub fn dense_shards(&self) -> usize {
        self.dense_shards
    }

    /// The epoch of the slot table this store routes by (0: the even table of the start).
    pub fn routing_epoch(&self) -> u64 {
        self.routing.read().0
    }

    /// The error a failed call becomes: what happened, naming the shard and its address.
    /// `first_contact`: the shard has not answered this worker yet.
    fn describe(
        &self,
        shard: usize,
        what: &str,
        s: &Status,
        attempts: u32,
        first_contact: bool,
    ) -> CoreError {
        let addr = &self.routes.addr(shard);
        let msg = s.message();
        let cause = classify(s.code(), msg, first_contact && self.cfg.tls.is_none());
        if s.code() == Code::InvalidArgument && msg.starts_with(NON_FINITE) {
            // A refused diverged step: the trainer names the step and the last checkpoint.
            return CoreError::Diverged(format!(
                "PS shard {shard} at {addr} refused {what}: {msg}"
            ));
        }
        transport(match cause {
            Cause::TlsHandshake => format!(
                "PS shard {shard} at {addr}: TLS handshake failed ({what}): {msg}; check --tls-ca and --tls-domain"
            ),
            Cause::PlainToTls => format!(
                "PS shard {shard} at {addr} closed the connection before answering ({what}): {msg}; \
                 if it serves TLS, pass --tls-ca"
            ),
            // The shard's message says what to do (the cluster's --token-file / SPARTA_TOKEN).
            Cause::Token if msg.contains("--token-file") => {
                format!("PS shard {shard} at {addr} refused this worker's token: {msg}")
            }
            Cause::Token => format!(
                "PS shard {shard} at {addr} refused this worker's token ({msg}); use the cluster's --token-file / SPARTA_TOKEN"
            ),
            Cause::Restarted => format!(
                "PS shard {shard} at {addr} restarted while this worker was waiting for it \
                 ({msg}); its state no longer matches this worker's progress: restart the worker \
                 from the checkpoint the PS resumed from (sparta launch does this)"
            ),
            Cause::Timeout => format!(
                "PS shard {shard} at {addr} did not answer {what} within {} s (the RPC deadline, \
                 --rpc-timeout-secs): is it stopped or overloaded, or is another worker stuck?",
                self.cfg.rpc_timeout.as_secs_f64()
            ),
            Cause::Refused => format!(
                "PS shard {shard} at {addr} refused the connection ({what}, {attempts} attempt(s) \
                 over up to {} s): no PS is listening there (did it stop?): {msg}",
                self.cfg.retry_wait.as_secs_f64()
            ),
            Cause::Unreachable | Cause::ConnectionLost => format!(
                "PS shard {shard} at {addr} is unreachable ({what}, {attempts} attempt(s), retried \
                 for up to {} s; the connection {}): {msg}",
                self.cfg.retry_wait.as_secs_f64(),
                if cause == Cause::ConnectionLost {
                    "closed under the call"
                } else {
                    "could not be made"
                }
            ),
            Cause::Other => format!(
                "PS shard {shard} at {addr}: {what} failed ({:?}): {msg}",
                s.code()
            ),
        })
    }

    /// Runs one RPC to every shard in `reqs` (shard, request) in parallel, retrying
    /// unreachable shards with backoff; returns the responses in the same order.
    fn fan_out<Req, Resp, F, Fut>(
        &self,
        rpc: Rpc,
        what: &'static str,
        reqs: Vec<(usize, Req, u64)>,
        call: F,
    ) -> Result<Vec<(usize, Resp)>, CoreError>
    where
        Req: Message + Clone + Send + 'static,
        Resp: Message + Send + 'static,
        F: Fn(Client, Req) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>> + Send,
    {
        let resps = self.fan_out_with(rpc, what, reqs, call, None)?;
        Ok(resps.into_iter().map(|(i, r, _)| (i, r)).collect())
    }

    /// [`Self::fan_out`], also returning the address that answered each shard's request.
    /// With `at_new_primary` `(f, ready)`: a request to shard `i` is sent where its rows were
    /// made ready (`ready[i]`, the primary that answered the pull this push follows); sent to
    /// another primary (a failover since), `f` runs there first, its error counting as the
    /// attempt's.
    fn fan_out_with<Req, Resp, F, Fut>(
        &self,
        rpc: Rpc,
        what: &'static str,
        reqs: Vec<(usize, Req, u64)>,
        call: F,
        at_new_primary: Option<(AtNewPrimary<Req>, Vec<Option<String>>)>,
    ) -> Result<Vec<(usize, Resp, String)>, CoreError>
    where
        Req: Message + Clone + Send + 'static,
        Resp: Message + Send + 'static,
        F: Fn(Client, Req) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>> + Send,
    {
        let (retries, retry_wait, warn_after) =
            (self.cfg.retries, self.cfg.retry_wait, self.cfg.warn_after);
        let metrics = Arc::clone(&self.metrics);
        let mut set = tokio::task::JoinSet::new();
        for (shard, req, rows) in reqs {
            set.spawn_on(
                {
                    let routes = Arc::clone(&self.routes);
                    let incarnation = self.shards()[shard].origin.incarnation;
                    let call = call.clone();
                    let metrics = Arc::clone(&metrics);
                    let (prepare, mut ready_at) = match &at_new_primary {
                        Some((f, ready)) => (Some(Arc::clone(f)), ready[shard].clone()),
                        None => (None, None),
                    };
                    async move {
                        // Waits before the next attempt at a shard not reached, and before
                        // asking again where a moved primary went.
                        let mut unreached = retry::delays(Duration::from_secs(1));
                        let mut rerouted = retry::delays(Duration::from_millis(400));
                        let bytes_out = req.encoded_len() as u64 + GRPC_FRAME_BYTES;
                        let mut attempt = 0;
                        let started = Instant::now();
                        loop {
                            attempt += 1;
                            let (client, addr) = routes.current(shard);
                            if attempt > 1 && !routes.follows_coordinator() {
                                // The shard was unreachable: before sending again, make sure it
                                // is the same process (a restarted one resumed from a checkpoint).
                                match same_incarnation(client.clone(), incarnation).await {
                                    Ok(()) => {}
                                    Err(s) if retryable(&s) && started.elapsed() < retry_wait => {
                                        tokio::time::sleep(next(&mut unreached)).await;
                                        continue;
                                    }
                                    Err(s) => return (shard, Err(s), attempt, addr),
                                }
                            }
                            let first = match (&prepare, &ready_at) {
                                (Some(f), Some(at)) if *at != addr => {
                                    tracing::info!(
                                        "PS shard {shard}: {what} sent at its new primary {addr}, \
                                         its keys pulled there first"
                                    );
                                    Some(f(client.clone(), &req))
                                }
                                _ => None,
                            };
                            let m = metrics.start(rpc);
                            let shown = addr.clone();
                            let sent = (call.clone(), client.clone(), req.clone());
                            // Whether `first` ran (the rows are ready at `addr`), and the answer.
                            let attempt_call = async move {
                                if let Some(first) = first {
                                    if let Err(s) = first.await {
                                        return (false, Err(s));
                                    }
                                }
                                let (call, client, req) = sent;
                                (true, call(client, req).await)
                            };
                            let answer = retry::warn_while_waiting(
                                attempt_call,
                                warn_after,
                                shard,
                                &shown,
                                what,
                            );
                            let answer = if routes.follows_coordinator() {
                                // A primary that hangs (frozen, cut off) is left for the
                                // one the coordinator names instead.
                                let moved = routes.moved_from(shard, addr, MOVED_POLL);
                                tokio::select! {
                                    r = answer => r,
                                    () = moved => (false, Err(Status::unavailable(
                                        "connection given up: the coordinator named a new primary",
                                    ))),
                                }
                            } else {
                                answer.await
                            };
                            let (ready, answer) = answer;
                            if ready && ready_at.is_some() {
                                ready_at = Some(shown.clone());
                            }
                            match answer {
                                Ok(r) => {
                                    let r = r.into_inner();
                                    // Sent = request, received = response (worker's view).
                                    m.finish(
                                        true,
                                        rows,
                                        r.encoded_len() as u64 + GRPC_FRAME_BYTES,
                                        bytes_out,
                                    );
                                    return (shard, Ok(r), attempt, shown);
                                }
                                Err(s) => {
                                    m.finish(false, 0, 0, 0);
                                    let cause = classify(s.code(), s.message(), false);
                                    if routes.follows_coordinator()
                                        && primary_moved(&s, cause)
                                        && started.elapsed() < retry_wait
                                    {
                                        // Retried at once where the primary moved (the
                                        // push keeps its id: applied once).
                                        if !matches!(routes.refresh(shard).await, Ok(true)) {
                                            tokio::time::sleep(next(&mut rerouted)).await;
                                        }
                                        continue;
                                    }
                                    if retryable(&s)
                                        && (attempt <= retries || started.elapsed() < retry_wait)
                                    {
                                        tokio::time::sleep(next(&mut unreached)).await;
                                        continue;
                                    }
                                    return (shard, Err(s), attempt, shown);
                                }
                            }
                        }
                    }
                },
                self.rt.handle(),
            );
        }
        // The first shard that fails ends the call (the others are abandoned): a worker
        // must not wait on one shard's barrier after another shard refused it.
        let failed = self.rt.block_on(async {
            let mut out = Vec::with_capacity(set.len());
            while let Some(r) = set.join_next().await {
                match r {
                    Ok((shard, Ok(resp), _, addr)) => out.push((shard, resp, addr)),
                    Ok((shard, Err(s), attempts, _)) => {
                        set.abort_all();
                        return Err(Some((shard, s, attempts)));
                    }
                    Err(e) => {
                        set.abort_all();
                        tracing::debug!("an RPC task failed: {e}");
                        return Err(None);
                    }
                }
            }
            Ok(out)
        });
        match failed {
            Ok(mut resps) => {
                resps.sort_by_key(|(i, _, _)| *i);
                Ok(resps)
            }
            Err(Some((shard, s, attempts))) => Err(self.describe(shard, what, &s, attempts, false)),
            Err(None) => Err(transport(format!("{what}: an RPC task failed"))),
        }
    }

    /// Tells every shard this worker finished training (it leaves sync barriers and
    /// staleness bounds), and shard 0 what it trained (`tally`, summed into the job's totals
    /// by [`RemoteStore::wait_all_done`]).
    pub fn worker_done(&self, tally: pb::WorkerTally) -> Result<(), CoreError> {
        let rank = self.cfg.rank as u32;
        let reqs = (0..self.shards().len())
            .map(|i| {
                (
                    i,
                    pb::WorkerDoneRequest {
                        rank,
                        wait_all: false,
                        tally: (i == 0).then_some(tally),
                        job_over: false,
                    },
                    0,
                )
            })
            .collect();
        self.fan_out(
            Rpc::WorkerDone,
            "worker done",
            reqs,
            |mut c, r| async move { c.worker_done(r).await },
        )?;
        Ok(())
    }

    /// Waits until every worker reported done (counted on shard 0). Returns the tallies the
    /// workers reported, summed, and how many ranks reported one (fewer than the workers
    /// when shard 0 failed over to a copy that missed some).
    pub fn wait_all_done(&self) -> Result<(pb::WorkerTally, u32), CoreError> {
        let rank = self.cfg.rank as u32;
        loop {
            let reqs = vec![(
                0,
                pb::WorkerDoneRequest {
                    rank,
                    wait_all: true,
                    tally: None,
                    job_over: false,
                },
                0,
            )];
            let r = self.fan_out(
                Rpc::WorkerDone,
                "waiting for all workers",
                reqs,
                |mut c, r| async move { c.worker_done(r).await },
            )?;
            let (_, r) = &r[0];
            if r.done >= r.workers {
                return Ok((r.total.unwrap_or_default(), r.tallies));
            }
            tracing::info!("{} of {} workers done; waiting", r.done, r.workers);
        }
    }

    fn check_table(&self, table: TableId) -> Result<usize, CoreError> {
        self.dims
            .get(table.index())
            .copied()
            .ok_or_else(|| CoreError::Training(format!("this job has no table {}", table.0)))
    }

    fn check_parts(&self, keys: &KeyParts<'_>) -> Result<(), CoreError> {
        let n = self.shards().len();
        if keys.num_shards() != n || keys.offsets.last() != Some(&keys.keys.len()) {
            return Err(CoreError::Training(format!(
                "keys grouped for {} shards, the cluster has {n}",
                keys.num_shards()
            )));
        }
        Ok(())
    }
}

/// Before a push is sent again at a shard's new primary (its primary died and a backup took
/// over), pulls its keys there with `create`: rows the dead primary created for this batch's
/// pull were never replicated (a backup gets rows with the pushes that change them), and a
/// push finds no row to update where none exists (on purpose: a row evicted between a pull
/// and its push must not come back). A created row starts from the initializer's value for
/// its key, which is the value the dead primary created and the worker pulled; rows that
/// exist are only read. If the dead primary had applied and replicated this push already,
/// the push's id makes the new primary skip it.
fn pull_again(
    mut c: Client,
    push: &pb::PushRequest,
) -> impl Future<Output = Result<(), Status>> + Send + 'static {
    let pull = pb::PullRequest {
        keys: push.keys.clone(),
        tables: push
            .tables
            .iter()
            .map(|t| pb::TableSpec {
                table: t.table,
                dim: t.dim,
                classes: t.classes,
            })
            .collect(),
        create: true,
        compression: push.compression,
        class_offsets: push.class_offsets.clone(),
    };
    async move { c.pull(pull).await.map(|_| ()) }
}

impl SparseStore for RemoteStore {
    fn routing(&self) -> Routing {
        self.routing.read().1.clone()
    }

    fn num_shards(&self) -> usize {
        self.shards().len()
    }

    fn dim(&self, table: TableId) -> usize {
        self.dims.get(table.index()).copied().unwrap_or(0)
    }

    fn pull(
        &self,
        keys: &KeyParts<'_>,
        into: &mut [PullInto<'_>],
        create: bool,
    ) -> Result<(), CoreError> {
        self.check_parts(keys)?;
        let mut tables = Vec::with_capacity(into.len());
        for p in into.iter() {
            let dim = self.check_table(p.table)?;
            check_len(p.table, p.values.len(), keys.total(p.classes), dim)?;
            tables.push(pb::TableSpec {
                table: p.table.0 as u32,
                dim: dim as u32,
                classes: p.classes,
            });
        }
        let c = self.cfg.compression;
        let reqs = (0..self.shards().len())
            .filter(|&i| !keys.shard_range(i).is_empty())
            .map(|i| {
                let r = requests::pull(keys, i, &tables, create, c);
                (i, r, keys.shard_range(i).len() as u64)
            })
            .collect();
        let resps = self.fan_out_with(
            Rpc::Pull,
            "pull",
            reqs,
            |mut c, r| async move { c.pull(r).await },
            None,
        )?;
        if create && self.routes.follows_coordinator() {
            let mut at = vec![None; self.shards().len()];
            for (i, _, addr) in &resps {
                at[*i] = Some(addr.clone());
            }
            let mut pulled = self.pulled_at.lock();
            if pulled.len() == PULLS_AHEAD {
                pulled.pop_front();
            }
            pulled.push_back(at);
        }
        // Where each shard's rows of each table start in the table's buffer.
        let starts: Vec<Vec<usize>> = into
            .iter()
            .map(|p| {
                let mut at = 0;
                (0..self.shards().len())
                    .map(|i| {
                        let s = at;
                        at += keys.count(i, p.classes);
                        s
                    })
                    .collect()
            })
            .collect();
        for (i, r, _) in resps {
            let bad = |e: String| {
                transport(format!(
                    "PS shard {i} at {}: pull reply: {e}",
                    self.shards()[i].addr
                ))
            };
            if r.values.len() != into.len() {
                return Err(bad(format!(
                    "{} tables answered, {} asked",
                    r.values.len(),
                    into.len()
                )));
            }
            let rc =
                Compression::from_proto(r.compression).map_err(|e| transport(e.to_string()))?;
            for ((p, v), start) in into.iter_mut().zip(&r.values).zip(&starts) {
                let dim = self.dims[p.table.index()];
                let lo = start[i] * dim;
                let hi = lo + keys.count(i, p.classes) * dim;
                wire::values_into(v, rc, &mut p.values[lo..hi]).map_err(|e| bad(e.to_string()))?;
            }
        }
        Ok(())
    }

    fn push(&self, keys: &KeyParts<'_>, from: &[PushFrom<'_>]) -> Result<(), CoreError> {
        self.check_parts(keys)?;
        let mut dims = Vec::with_capacity(from.len());
        for p in from {
            let dim = self.check_table(p.table)?;
            check_len(p.table, p.grads.len(), keys.total(p.classes), dim)?;
            dims.push(dim);
        }
        let c = self.cfg.compression;
        // Where this push's rows were created: the primaries that answered its pull (the
        // oldest pull not pushed yet: a worker pushes its batches in the order it pulled them).
        let at_new_primary = self.routes.follows_coordinator().then(|| {
            let ready = self.pulled_at.lock().pop_front();
            let ready = ready.unwrap_or_else(|| vec![None; self.shards().len()]);
            let f: AtNewPrimary<pb::PushRequest> = Arc::new(|c, r| Box::pin(pull_again(c, r)));
            (f, ready)
        });
        // One id for every shard's part of this push: each shard applies its part once.
        let id = Some(self.push_id(self.push_seq.fetch_add(1, Relaxed)));
        // This push is one step of this worker for every shard's clock.
        let shards = self.shards();
        for s in shards.iter() {
            s.unsent_steps.fetch_add(1, Relaxed);
        }
        let mut at = vec![0usize; from.len()];
        let reqs = (0..self.shards().len())
            .filter(|&i| !keys.shard_range(i).is_empty())
            .map(|i| {
                let range = keys.shard_range(i);
                let tables = from
                    .iter()
                    .zip(&dims)
                    .zip(at.iter_mut())
                    .map(|((p, &dim), at)| {
                        let n = keys.count(i, p.classes);
                        let g = &p.grads[*at * dim..(*at + n) * dim];
                        *at += n;
                        requests::table_grads(p.table, dim, p.classes, g, c)
                    })
                    .collect();
                let steps = shards[i].unsent_steps.swap(0, Relaxed);
                let r = requests::push(keys, i, tables, c, id, steps);
                (i, r, range.len() as u64)
            })
            .collect();
        self.fan_out_with(
            Rpc::Push,
            "push",
            reqs,
            |mut c, r| async move { c.push(r).await },
            at_new_primary,
        )?;
        Ok(())
    }

    fn table_rows(&self) -> u64 {
        let reqs = (0..self.shards().len())
            .map(|i| (i, pb::InfoRequest {}, 0))
            .collect();
        self.fan_out(Rpc::Info, "info", reqs, |mut c, r| async move {
            c.info(r).await
        })
        .map_or(0, |v| v.iter().map(|(_, r)| r.rows).sum())
    }
}

impl RemoteStore {
    /// Every shard's tables (rows, bytes, evictions by reason) and its PS process's memory,
    /// from one `Info` call per shard.
    pub fn shard_reports(&self) -> Result<Vec<sparta_worker::summary::PsShardSummary>, CoreError> {
        let reqs = (0..self.shards().len())
            .map(|i| (i, pb::InfoRequest {}, 0))
            .collect();
        let infos = self.fan_out(Rpc::Info, "info", reqs, |mut c, r| async move {
            c.info(r).await
        })?;
        let mut out: Vec<_> = infos
            .into_iter()
            .map(|(i, info)| sparta_worker::summary::PsShardSummary {
                shard: i as u32,
                slots: Routing::from_flat_runs(&info.slot_runs, self.shards().len())
                    .ok()
                    .and_then(|r| r.slots_per_shard().get(i).copied())
                    .unwrap_or_default() as u64,
                routing_epoch: info.routing_epoch,
                moves_in: info.moves_in,
                moves_out: info.moves_out,
                resident_bytes: info.resident_bytes,
                peak_rss_bytes: info.peak_resident_bytes,
                tables: info
                    .tables
                    .iter()
                    .map(|t| {
                        let ev = |k: usize| t.evicted.get(k).copied().unwrap_or(0);
                        let table = sparta_worker::summary::PsTableSummary {
                            rows: t.tag_rows.iter().sum(),
                            bytes: t.bytes,
                            cold_rows: t.cold_rows,
                            disk_bytes: t.disk_bytes,
                            evicted: sparta_worker::summary::Evictions {
                                idle_steps: ev(0),
                                idle_seconds: ev(1),
                                min_count: ev(2),
                                memory_limit: ev(3),
                            },
                        };
                        (t.name.clone(), table)
                    })
                    .collect(),
            })
            .collect();
        out.sort_by_key(|s| s.shard);
        Ok(out)
    }

    /// Rows per key tag of every table (in `TableId` order), summed over the shards: the rows
    /// of each logical table.
    pub fn rows_by_tag(&self) -> Result<Vec<Vec<u64>>, CoreError> {
        let reqs = (0..self.shards().len())
            .map(|i| (i, pb::InfoRequest {}, 0))
            .collect();
        let infos = self.fan_out(Rpc::Info, "info", reqs, |mut c, r| async move {
            c.info(r).await
        })?;
        let mut out = vec![vec![0u64; 256]; self.dims.len()];
        for (_, info) in infos {
            for t in info.tables {
                if let Some(acc) = out.get_mut(t.table as usize) {
                    for (a, n) in acc.iter_mut().zip(&t.tag_rows) {
                        *a += n;
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreached_shards_and_lost_connections_are_retried() {
        // Retried: not reached or connection lost; never a timeout or a restart.
        assert!(retryable(&Status::unavailable("Connection refused")));
        assert!(retryable(&Status::cancelled("connection closed")));
        assert!(!retryable(&Status::cancelled("Timeout expired")));
        assert!(!retryable(&Status::aborted("restarted empty")));
    }
}
