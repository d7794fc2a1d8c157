//! One PS shard: its part of every table of the job and its slice of the dense vector,
//! served over gRPC.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use sparta_core::step::all_finite;
use sparta_core::Job;
use sparta_export::{ExportKind, ExportOptions, TableExporter};
use sparta_nn::optim::OptimizerState;
use sparta_nn::Model;
use sparta_table::Table;
use tonic::service::Interceptor;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use sparta_checkpoint::{open_dir, Checkpointer, RetentionPolicy, RetryPolicy};

use crate::ckpt::{
    write_shard_part, Barrier, CheckpointConfig, ExportPart, Outcome, Parking, PartFailure,
    PartWriter, WrittenPart,
};
use crate::dense::{DenseRefusal, DenseSlice, Mode};
use crate::error::{PsError, Refusal};
use crate::fault::{dropped, FaultHook, When};
use crate::idle::Activity;
use crate::once::{Admit, PushId, PushLog, Refused};
use crate::replica::{Placement, Sequencer};
use crate::replicator::Replicator;
use crate::resume::restore_shard;
use crate::role::RoleCell;
use crate::stall::StallWatch;
use sparta_proto::auth::CheckToken;
use sparta_proto::ckpt::{worker_position, Order};
use sparta_proto::headers::{header, EPOCH_HEADER, NON_FINITE, SHARD_HEADER};
use sparta_proto::metrics::{Metrics, Rpc, GRPC_FRAME_BYTES};
use sparta_proto::pb;
use sparta_proto::pb::parameter_server_server::{ParameterServer, ParameterServerServer};
use sparta_proto::tls::{ClientTls, ServerTls};
use sparta_proto::wire::{self, Compression};

mod bounded;
mod copies;
mod files;
mod moves;
mod rpc;
mod run;
mod shards;

pub use bounded::{CAP_HIGH, CAP_LOW, DENSE_BYTES_PER_PARAM};
pub use moves::NOT_OWNED;
pub use rpc::Service;
pub use run::{
    run_blocking, run_blocking_with, serve, serve_watched, Listening, StopWhen, Stopped,
};

/// How a shard is started.
#[derive(Clone, Debug)]
pub struct PsConfig {
    /// This shard's index.
    pub shard: usize,
    /// Shards in the cluster.
    pub num_shards: usize,
    /// Shards that hold the dense vector, each a slice (`None`: all `num_shards`): the count
    /// the cluster started with once shards were added while it trained. A shard at or past
    /// it holds no dense slice; one that starts empty joins a running cluster (`SetShards`
    /// applies to it at once, see [`crate::server`]'s shard list).
    pub dense_shards: Option<usize>,
    /// Training workers (sync/staleness modes and the done count).
    pub workers: usize,
    /// Dense consistency mode.
    pub mode: Mode,
    /// The shared token every RPC must carry.
    pub token: String,
    /// Largest message accepted or sent, bytes.
    pub max_message_bytes: usize,
    /// TLS identity of the gRPC port (plain gRPC when `None`).
    pub tls: Option<ServerTls>,
    /// Cluster checkpoints (directory, resume), if any.
    pub checkpoint: Option<CheckpointConfig>,
    /// A barrier waiting longer than this logs which workers it waits for (and again at
    /// this interval).
    pub barrier_warn: Duration,
    /// Test hook: answers of pushes to drop after applying them (none by default).
    pub fault: FaultHook,
    /// Backups of shards on other PS processes (`--replicas`, `--peers`).
    pub replication: Replication,
}

/// `--replicas R --peers ADDR0,...`: every shard has a primary (on its own process) and
/// `R - 1` backups (on the next processes, see [`Placement`]).
#[derive(Clone, Debug)]
pub struct Replication {
    /// Copies of every shard (1: no backups, today's cost).
    pub replicas: usize,
    /// Every PS address in shard order, this one included (needed when `replicas > 1`).
    pub peers: Vec<String>,
    /// How this process verifies its peers' TLS certificates (`--tls-ca`; needed when
    /// `replicas > 1` and this PS serves TLS: the peers serve it too).
    pub tls: Option<ClientTls>,
}

impl PsConfig {
    /// Where the copies of shards are (see [`Placement`]).
    pub fn placement(&self) -> Result<Placement, Refusal> {
        Placement::with_base(
            self.replication.replicas,
            self.num_shards,
            self.dense_shards.unwrap_or(self.num_shards),
        )
    }
}

impl Default for Replication {
    fn default() -> Self {
        Self {
            replicas: 1,
            peers: Vec::new(),
            tls: None,
        }
    }
}

/// The checkpoint side of a shard.
struct ShardCheckpoints {
    writer: Checkpointer,
    barrier: Barrier,
}

/// A shard's exporter: its directory, options and writer.
type ShardExporter = (std::path::PathBuf, ExportOptions, TableExporter);

/// The state of one shard.
pub struct Shard {
    cfg: PsConfig,
    tables: Vec<Arc<Table>>,
    dense: Arc<DenseSlice>,
    metrics: Arc<Metrics>,
    ckpt: Option<ShardCheckpoints>,
    origin: pb::OriginResponse,
    /// Writes this shard's parts of serving exports (export dir, options, writer), created
    /// by the first export order; it remembers the base of the next delta.
    exporter: parking_lot::Mutex<Option<ShardExporter>>,
    /// The job's logical tables per physical table (recorded in export parts).
    members: sparta_checkpoint::Members,
    /// The job's logical tables: (name, physical table, tag), for the rows gauge.
    logical: Vec<(String, usize, u8)>,
    /// Sparse pushes applied, per worker (a retry is answered, not applied again).
    pushes: PushLog<pb::PushResponse, Status>,
    /// Dense push-pulls applied, per worker, with the slice each was answered.
    dense_pushes: PushLog<pb::DenseResponse, Status>,
    /// Primary with backups: numbers and sends this shard's changes (shared with the dense
    /// slice's change callback).
    replicator: Arc<parking_lot::RwLock<Option<Arc<Replicator>>>>,
    /// The metrics the process serves (a backup copy's own are not served).
    process_metrics: Arc<Metrics>,
    /// Primary with backups: orders sparse pushes (apply, read the rows, queue them).
    order: parking_lot::Mutex<()>,
    /// Backup copy: the last replicated change applied.
    sequencer: Sequencer,
    /// The backup copies of other shards this process holds (more or fewer once shards are
    /// added or removed while training).
    backups: parking_lot::RwLock<Vec<Arc<Shard>>>,
    /// The job every copy is built from (a backup copy of an added shard is built later).
    job: Arc<Job>,
    /// The process's own shard's copy (it holds the process's backup copies); false for
    /// those.
    main: bool,
    /// Primary, backup or deposed, at an epoch (failover).
    role: RoleCell,
    /// The checkpoint barrier's state as backups follow it: the last round (`checkpoint_step`,
    /// `checkpoint` the answer, `checkpoint_id` and `checkpoint_base` when written) and the
    /// workers that finished training (`left`). A worker repeating its call for that round
    /// (its answer lost, or its shard failed over since) gets the answer again; a joining
    /// backup gets it all with its copy.
    ckpt_answer: Arc<parking_lot::Mutex<pb::ReplicaOp>>,
    /// What each worker rank trained, as it reported when done (`WorkerDone`): worker 0's
    /// job summary sums them.
    tallies: parking_lot::Mutex<std::collections::BTreeMap<u32, pb::WorkerTally>>,
    /// The memory cap of this shard (`[ps] memory_limit`, `--memory-limit`), bytes.
    memory_limit: Option<u64>,
    /// Held by the push that evicts for the memory cap (one at a time).
    capping: parking_lot::Mutex<()>,
    /// Worker 0's word that the job is over (`WorkerDone { job_over }`, to the process's
    /// primary copy): `sparta ps --exit-when-done` stops on it (see [`StopWhen`]).
    job_over: tokio::sync::Notify,
    /// The slot table it routes by and the slot moves into and out of it.
    moves: moves::MoveState,
}

/// Longest a `WorkerDone { wait_all }` call waits before answering with the current count.
const DONE_WAIT: Duration = Duration::from_secs(5);

impl Shard {
    /// The workers' tallies recorded so far, summed (`train_seconds`: the longest), and how
    /// many ranks they are.
    fn tallies_total(&self) -> (pb::WorkerTally, u32) {
        let tallies = self.tallies.lock();
        let mut sum = pb::WorkerTally::default();
        for t in tallies.values() {
            sum.train_rows += t.train_rows;
            sum.samples_trained += t.samples_trained;
            sum.steps += t.steps;
            sum.bad_lines += t.bad_lines;
            sum.train_seconds = sum.train_seconds.max(t.train_seconds);
        }
        (sum, tallies.len() as u32)
    }

    /// Builds the shard's tables and dense slice from the job (every shard of a cluster must
    /// be given the same job config).
    pub fn new(job: &Job, cfg: PsConfig, metrics: Arc<Metrics>) -> Result<Self, PsError> {
        let r = &cfg.replication;
        let placement = cfg.placement()?;
        if r.replicas > 1 {
            if r.peers.len() != cfg.num_shards {
                return Err(PsError::Config(format!(
                    "--peers lists {} address(es); --replicas {} needs every PS address in shard \
                     order, this one included ({} for --num-shards {})",
                    r.peers.len(),
                    r.replicas,
                    cfg.num_shards,
                    cfg.num_shards
                )));
            }
            match (&cfg.tls, &r.tls) {
                (Some(_), None) => {
                    return Err(PsError::Config(
                        "--replicas > 1 with --tls-cert needs --tls-ca: the PS processes reach \
                         each other over TLS and verify each other's certificates with it"
                            .into(),
                    ))
                }
                (None, Some(_)) => {
                    return Err(PsError::Config(
                        "--tls-ca verifies the peers' TLS certificates, but this PS serves plain \
                         gRPC (no --tls-cert): so do its peers"
                            .into(),
                    ))
                }
                _ => {}
            }
        }
        let shard = Self::copy(job, cfg.clone(), Arc::clone(&metrics), false)?;
        if placement.replicas > 1 {
            for s in placement.backups_on(cfg.shard) {
                let mut c = cfg.clone();
                c.shard = s;
                shard.backups.write().push(Arc::new(shard.backup_copy(c)?));
            }
            let rep = Arc::new(Replicator::new(
                cfg.shard,
                1,
                placement.backups_of(cfg.shard),
            ));
            shard.forward_dense_changes();
            *shard.replicator.write() = Some(rep);
        }
        Ok(shard)
    }

    /// This process's backup copy of shard `s`, if it holds one.
    pub(crate) fn backup_of(&self, s: usize) -> Option<Arc<Shard>> {
        self.backups
            .read()
            .iter()
            .find(|b| b.cfg.shard == s)
            .cloned()
    }

    /// Refuses (and counts) gradients holding NaN or infinity, before anything is applied;
    /// `what` says which, after the [`NON_FINITE`] prefix the worker recognises.
    fn refuse_non_finite(
        &self,
        grads: &[f32],
        what: impl FnOnce() -> String,
    ) -> Result<(), Status> {
        if all_finite(grads) {
            return Ok(());
        }
        self.metrics.non_finite_push();
        Err(Status::invalid_argument(format!(
            "{NON_FINITE}: {}",
            what()
        )))
    }

    /// A backup copy (of shard `cfg.shard`) that this process holds.
    pub(crate) fn backup_copy(&self, cfg: PsConfig) -> Result<Self, PsError> {
        let m = Arc::new(Metrics::new("ps-backup"));
        let mut b = Self::copy(&self.job, cfg, m, true)?;
        b.process_metrics = Arc::clone(&self.process_metrics);
        b.forward_dense_changes();
        Ok(b)
    }

    /// One copy of shard `cfg.shard`: the primary, or (`backup`) a backup copy, which
    /// restores as the primary does and writes the shard's checkpoint parts once promoted.
    fn copy(
        job: &Job,
        cfg: PsConfig,
        metrics: Arc<Metrics>,
        backup: bool,
    ) -> Result<Self, PsError> {
        if cfg.num_shards == 0 || cfg.shard >= cfg.num_shards {
            return Err(PsError::Config(format!(
                "--shard {} must be below --num-shards {}",
                cfg.shard, cfg.num_shards
            )));
        }
        if cfg.workers == 0 {
            return Err(PsError::Config("--workers must be at least 1".into()));
        }
        if cfg.max_message_bytes < 1024 {
            return Err(PsError::Config(format!(
                "max message size {} bytes is too small",
                cfg.max_message_bytes
            )));
        }
        let restored = match &cfg.checkpoint {
            Some(CheckpointConfig {
                dir,
                resume: Some(r),
                ..
            }) => restore_shard(
                job,
                dir,
                *r,
                cfg.shard,
                (cfg.num_shards, cfg.dense_shards.unwrap_or(cfg.num_shards)),
                cfg.workers,
            )?,
            _ => None,
        };
        let dense_shards = cfg.dense_shards.unwrap_or(cfg.num_shards);
        if dense_shards == 0 || dense_shards > cfg.num_shards {
            return Err(PsError::Config(format!(
                "--dense-shards {dense_shards} must be between 1 and --num-shards {}",
                cfg.num_shards
            )));
        }
        let total = Model::new(job.model.clone())?.num_params();
        let (offset, len) = if cfg.shard < dense_shards {
            sparta_proto::dense_slice(total, cfg.shard, dense_shards)
        } else {
            (total, 0)
        };
        let stall = StallWatch::new(cfg.barrier_warn, Some(Arc::clone(&metrics)));
        let dense = Arc::new(
            DenseSlice::new(
                total,
                offset,
                len,
                job.model.optimizer,
                cfg.mode,
                cfg.workers,
            )
            .with_stall(stall.clone()),
        );
        let mut origin = pb::OriginResponse {
            incarnation: incarnation(),
            resumed_from: 0,
            resumed_step: 0,
        };
        let ckpt = match &cfg.checkpoint {
            Some(c) => {
                let storage = open_dir(&c.dir).map_err(|e| PsError::Checkpoint(e.to_string()))?;
                storage
                    .check_writable()
                    .map_err(|e| PsError::Checkpoint(e.to_string()))?;
                let writer = Checkpointer::new(
                    storage,
                    RetentionPolicy {
                        keep_full: c.keep_full,
                    },
                )
                .with_retry(RetryPolicy::new(c.max_failures));
                // What an earlier process of this shard left mid-write (no one else writes
                // this part). A backup copy leaves them: its primary may be writing. It
                // writes the shard's parts only once promoted (checkpoint calls reach
                // primaries only). With replicas, neither does a primary copy that starts:
                // it may be a restarted process whose shard failed over to a copy that is
                // writing the part right now (it rejoins as a backup).
                let own = format!(".{}.", sparta_proto::ckpt::part_name(cfg.shard));
                if !backup && cfg.replication.replicas <= 1 {
                    if let Err(e) = writer.remove_unfinished(&|name| name.contains(&own)) {
                        tracing::warn!("PS shard {}: removing unfinished files: {e}", cfg.shard);
                    }
                }
                let parking: Arc<dyn Parking> = dense.clone();
                Some(ShardCheckpoints {
                    writer,
                    barrier: Barrier::new(
                        cfg.workers,
                        restored.as_ref().map_or(&[][..], |r| &r.workers[..]),
                    )
                    .with_parking(parking)
                    .with_stall(stall),
                })
            }
            _ => None,
        };
        let moves = match &restored {
            Some(r) => moves::MoveState::new(r.routing_epoch, r.routing.clone(), false),
            None if cfg.shard < dense_shards => {
                moves::MoveState::new(0, sparta_core::Routing::even(cfg.num_shards), false)
            }
            // A shard past the dense ones that starts empty joins a running cluster: it owns
            // no slot until it is told the cluster's shards (`SetShards`).
            None => moves::MoveState::new(0, sparta_core::Routing::even(dense_shards), true),
        };
        let tables = match restored {
            Some(r) => {
                // A shard re-cut from another layout starts a new chain (the coordinator's
                // next order is full).
                if let (Some(c), false) = (&ckpt, r.resharded) {
                    c.writer.resume(&r.restored);
                }
                if let Some(d) = &r.dense {
                    dense
                        .restore(&d.params, d.optimizer.clone(), r.step)
                        .map_err(|e| PsError::Checkpoint(format!("{}: {e:?}", r.id)))?;
                }
                origin.resumed_from = r.id.0;
                origin.resumed_step = r.step;
                r.tables.into_iter().map(Arc::new).collect()
            }
            None => job
                .features
                .physical
                .iter()
                .map(|p| Table::new(p.config.clone()).map(Arc::new))
                .collect::<Result<Vec<_>, _>>()?,
        };
        Ok(Self {
            pushes: PushLog::new(cfg.workers),
            dense_pushes: PushLog::new(cfg.workers),
            replicator: Arc::new(parking_lot::RwLock::new(None)),
            process_metrics: Arc::clone(&metrics),
            order: parking_lot::Mutex::new(()),
            sequencer: Sequencer::default(),
            backups: parking_lot::RwLock::new(Vec::new()),
            job: Arc::new(job.clone()),
            main: !backup,
            ckpt_answer: Arc::default(),
            tallies: Default::default(),
            memory_limit: job
                .raw
                .ps
                .memory_limit_bytes()
                .map_err(|e| PsError::Config(e.to_string()))?,
            capping: parking_lot::Mutex::new(()),
            job_over: tokio::sync::Notify::new(),
            moves,
            role: RoleCell::new(if backup {
                pb::Role::Backup
            } else {
                pb::Role::Primary
            }),
            cfg,
            tables,
            dense,
            metrics,
            ckpt,
            origin,
            exporter: parking_lot::Mutex::new(None),
            members: job.features.members(),
            logical: job
                .features
                .tables
                .iter()
                .map(|t| (t.name.clone(), t.physical, t.tag))
                .collect(),
        })
        .inspect(|s: &Shard| {
            s.refresh_table_rows();
            s.routing_changed();
        })
    }

    /// The shard's metrics handle.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Sets the rows gauge of every logical table, and the bytes gauge and eviction counters of
    /// every physical table (after every push and `Info`: it takes each stripe lock of each
    /// table a few times, microseconds against a push's milliseconds).
    fn refresh_table_rows(&self) {
        let counts: Vec<Vec<u64>> = self.tables.iter().map(|t| t.rows_by_tag()).collect();
        for (name, physical, tag) in &self.logical {
            let rows = counts.get(*physical).map_or(0, |c| c[*tag as usize]);
            self.metrics.set_table_rows(name, rows);
        }
        // Bytes and evictions per physical table (one lock per stripe, no scan of rows).
        for t in &self.tables {
            let name = &t.config().name;
            let st = t.stats();
            self.metrics.set_table_bytes(name, st.bytes as u64);
            self.metrics
                .set_table_tier(name, st.cold_rows as u64, st.disk_bytes);
            let ev = t.evictions();
            for reason in sparta_table::EvictReason::ALL {
                self.metrics
                    .set_evicted_rows(name, reason.label(), ev.get(reason));
            }
        }
    }

    /// Rows held in all tables of this shard.
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|t| t.len() as u64).sum()
    }

    fn table(&self, id: u32, dim: u32) -> Result<&Table, Status> {
        let t = self.tables.get(id as usize).ok_or_else(|| {
            Status::invalid_argument(format!(
                "this PS has no table {id} (it holds {}); do the worker and the PS use the same job config?",
                self.tables.len()
            ))
        })?;
        let name = &t.config().name;
        if t.dim() != dim as usize {
            return Err(Status::invalid_argument(format!(
                "table {name} has dim {} on this PS but the request has dim {dim}; do the worker and the PS use the same job config?",
                t.dim()
            )));
        }
        Ok(t)
    }
}

/// A request's keys grouped by class (`class_offsets`; empty: one class of every key).
struct ClassRanges<'a> {
    offsets: &'a [u32],
    keys: usize,
}

impl<'a> ClassRanges<'a> {
    fn new(offsets: &'a [u32], keys: usize) -> Result<Self, Status> {
        let ok = offsets.is_empty()
            || (offsets.len() <= 65
                && offsets[0] == 0
                && *offsets.last().expect("not empty") as usize == keys
                && offsets.windows(2).all(|w| w[0] <= w[1]));
        if !ok {
            return Err(Status::invalid_argument(format!(
                "class offsets {offsets:?} do not split {keys} keys"
            )));
        }
        Ok(ClassRanges { offsets, keys })
    }

    /// Ranges of the keys of the classes in `mask` (0: every key), in class order.
    fn ranges(&self, mask: u64) -> Vec<std::ops::Range<usize>> {
        if self.offsets.is_empty() || mask == 0 {
            return std::iter::once(0..self.keys).collect();
        }
        (0..self.offsets.len() - 1)
            .filter(|c| mask >> c & 1 == 1)
            .map(|c| self.offsets[c] as usize..self.offsets[c + 1] as usize)
            .filter(|r| !r.is_empty())
            .collect()
    }

    fn count(&self, mask: u64) -> usize {
        self.ranges(mask).iter().map(|r| r.len()).sum()
    }
}

/// A number that differs between two starts of a shard (so workers notice a restart).
fn incarnation() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    sparta_table::mix64(t ^ (u64::from(std::process::id()) << 32)) | 1
}

fn refusal(r: DenseRefusal) -> Status {
    match r {
        DenseRefusal::Invalid(m) => Status::invalid_argument(m),
        DenseRefusal::NotInitialized => Status::failed_precondition(
            "dense parameters are not initialised yet (a worker must call DenseInit first)",
        ),
    }
}

fn size(m: &impl Message) -> u64 {
    m.encoded_len() as u64 + GRPC_FRAME_BYTES
}
