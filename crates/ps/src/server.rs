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

use crate::auth::CheckToken;
use crate::ckpt::{
    worker_position, write_shard_part, Barrier, CheckpointConfig, ExportPart, Order, Outcome,
    Parking, PartFailure, PartWriter, WrittenPart,
};
use crate::dense::{DenseRefusal, DenseSlice, Mode};
use crate::error::PsError;
use crate::fault::{dropped, FaultHook, When};
use crate::idle::Activity;
use crate::metrics::{Metrics, Rpc, GRPC_FRAME_BYTES};
use crate::once::{Admit, PushId, PushLog, Refused};
use crate::proto::parameter_server_server::{ParameterServer, ParameterServerServer};
use crate::proto::{self as pb};
use crate::replica::{Placement, Sequencer};
use crate::replicator::Replicator;
use crate::resume::restore_shard;
use crate::role::{header, RoleCell, EPOCH_HEADER, SHARD_HEADER};
use crate::stall::StallWatch;
use crate::tls::{ClientTls, ServerTls};
use crate::wire::{self, Compression};

mod copies;

/// How a shard is started.
#[derive(Clone, Debug)]
pub struct PsConfig {
    /// This shard's index.
    pub shard: usize,
    /// Shards in the cluster.
    pub num_shards: usize,
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
    /// The backup copies of other shards this process holds.
    backups: Vec<Arc<Shard>>,
    /// Primary, backup or deposed, at an epoch (failover).
    role: RoleCell,
    /// The checkpoint barrier's state as backups follow it: the last round (`checkpoint_step`,
    /// `checkpoint` the answer, `checkpoint_id` and `checkpoint_base` when written) and the
    /// workers that finished training (`left`). A worker repeating its call for that round
    /// (its answer lost, or its shard failed over since) gets the answer again; a joining
    /// backup gets it all with its copy.
    ckpt_answer: Arc<parking_lot::Mutex<pb::ReplicaOp>>,
}

/// Longest a `WorkerDone { wait_all }` call waits before answering with the current count.
const DONE_WAIT: Duration = Duration::from_secs(5);

/// Start of the status message of a push refused for NaN or infinite gradients.
pub const NON_FINITE: &str = "non-finite gradients";

impl Shard {
    /// Builds the shard's tables and dense slice from the job (every shard of a cluster must
    /// be given the same job config).
    pub fn new(job: &Job, cfg: PsConfig, metrics: Arc<Metrics>) -> Result<Self, PsError> {
        let r = &cfg.replication;
        let placement = Placement::new(r.replicas, cfg.num_shards).map_err(PsError::Config)?;
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
        let mut shard = Self::copy(job, cfg.clone(), Arc::clone(&metrics), false)?;
        if placement.replicas > 1 {
            for s in placement.backups_on(cfg.shard) {
                let mut c = cfg.clone();
                c.shard = s;
                let m = Arc::new(Metrics::new("ps-backup"));
                let mut b = Self::copy(job, c, m, true)?;
                b.process_metrics = Arc::clone(&metrics);
                b.forward_dense_changes();
                shard.backups.push(Arc::new(b));
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
            }) => restore_shard(job, dir, *r, cfg.shard, cfg.num_shards, cfg.workers)?,
            _ => None,
        };
        let total = Model::new(job.model.clone())?.num_params();
        let (offset, len) = crate::dense_slice(total, cfg.shard, cfg.num_shards);
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
                let own = format!(".{}.", crate::ckpt::part_name(cfg.shard));
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
        let tables = match restored {
            Some(r) => {
                if let Some(c) = &ckpt {
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
            backups: Vec::new(),
            ckpt_answer: Arc::default(),
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
        .inspect(|s: &Shard| s.refresh_table_rows())
    }

    /// Writes this shard's part of checkpoint `order` (called at a checkpoint barrier), then
    /// its part of the serving export when one is ordered.
    fn write_part(
        &self,
        order: Order,
        export: Option<pb::ExportOrder>,
    ) -> Result<WrittenPart, PartFailure> {
        let ck = self
            .ckpt
            .as_ref()
            .ok_or_else(|| PartFailure::Skip("no checkpoint directory".into()))?;
        let tables = self.named_tables();
        let dense = self.dense.snapshot();
        let dense_values = dense.as_ref().map(|(v, _)| v.clone()).unwrap_or_default();
        let (parts, entries) = write_shard_part(&ck.writer, order, self.cfg.shard, &tables, dense)?;
        let export_order = export.clone();
        let export = export.map(|e| {
            self.write_export(&e, &tables)
                .map(|files| ExportPart {
                    files,
                    dense: dense_values,
                })
                .map_err(|why| {
                    tracing::warn!("PS shard {}: export v{}: {why}", self.cfg.shard, e.version);
                    why
                })
        });
        Ok(WrittenPart {
            order,
            parts,
            tables: entries,
            export,
            export_order,
        })
    }

    /// The tables this shard holds, by name.
    fn named_tables(&self) -> Vec<(&str, &Table)> {
        self.tables
            .iter()
            .map(|t| (t.config().name.as_str(), &**t))
            .collect()
    }

    /// This shard's exporter for the directory and options of `e` (a new one when they
    /// changed), locked.
    fn exporter_for(
        &self,
        e: &pb::ExportOrder,
    ) -> Result<parking_lot::MutexGuard<'_, Option<ShardExporter>>, String> {
        let dir = std::path::PathBuf::from(&e.dir);
        let opts = ExportOptions {
            fp16: e.fp16,
            min_count: e.min_count,
            sync: e.sync,
            ..ExportOptions::default()
        };
        let mut slot = self.exporter.lock();
        let reuse = slot
            .as_ref()
            .is_some_and(|(d, o, _)| *d == dir && *o == opts);
        if !reuse {
            let part = Some(self.cfg.shard as u32);
            let mut ex = TableExporter::new(&dir, opts, part).map_err(|e| e.to_string())?;
            ex.set_members(self.members.clone());
            *slot = Some((dir, opts, ex));
        }
        Ok(slot)
    }

    /// Writes this shard's rows as part `shard` of export version `e.version`: a delta on top
    /// of `e.base` when this shard wrote the base's part (else an error: the coordinator
    /// abandons the version and orders a full one next).
    fn write_export(
        &self,
        e: &pb::ExportOrder,
        tables: &[(&str, &Table)],
    ) -> Result<Vec<sparta_export::TableFile>, String> {
        let mut slot = self.exporter_for(e)?;
        let (_, _, ex) = slot.as_mut().expect("set by exporter_for");
        let base = (e.base != 0).then_some(e.base);
        let (kind, files) = ex
            .write(e.version, tables, base)
            .map_err(|err| err.to_string())?;
        if base.is_some() && kind != ExportKind::Delta {
            return Err(format!(
                "this shard cannot write a delta on top of version {} (it restarted, or that \
                 version was abandoned): the next export must be full",
                e.base
            ));
        }
        Ok(files)
    }

    /// The shard's metrics handle.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Sets the rows gauge of every logical table (after every push and `Info`: it takes each
    /// stripe lock of each table once, microseconds against a push's milliseconds).
    fn refresh_table_rows(&self) {
        let counts: Vec<Vec<u64>> = self.tables.iter().map(|t| t.rows_by_tag()).collect();
        for (name, physical, tag) in &self.logical {
            let rows = counts.get(*physical).map_or(0, |c| c[*tag as usize]);
            self.metrics.set_table_rows(name, rows);
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

/// The gRPC service over a shard.
#[derive(Clone)]
pub struct Service {
    shard: Arc<Shard>,
}

#[tonic::async_trait]
impl ParameterServer for Service {
    async fn info(
        &self,
        req: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::Info);
        let s = &shard;
        s.refresh_table_rows();
        let tables = s
            .tables
            .iter()
            .enumerate()
            .map(|(i, t)| pb::TableInfo {
                table: i as u32,
                dim: t.dim() as u32,
                name: t.config().name.clone(),
                tag_rows: t.rows_by_tag(),
            })
            .collect();
        let resp = pb::InfoResponse {
            shard: s.cfg.shard as u32,
            num_shards: s.cfg.num_shards as u32,
            tables,
            dense_total: s.dense.total() as u64,
            dense_offset: s.dense.offset() as u64,
            dense_len: s.dense.len() as u64,
            mode: s.cfg.mode.describe(),
            workers: s.cfg.workers as u32,
            rows: s.rows(),
        };
        call.finish(true, 0, size(req.get_ref()), size(&resp));
        Ok(Response::new(resp))
    }

    async fn pull(
        &self,
        req: Request<pb::PullRequest>,
    ) -> Result<Response<pb::PullResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::Pull);
        let r = req.into_inner();
        let bytes_in = size(&r);
        let c = Compression::from_proto(r.compression).map_err(Status::invalid_argument)?;
        let keys = wire::keys_from_bytes(&r.keys).map_err(Status::invalid_argument)?;
        let classes = ClassRanges::new(&r.class_offsets, keys.len())?;
        let mut values = Vec::with_capacity(r.tables.len());
        let mut out = Vec::new();
        for spec in &r.tables {
            let table = shard.table(spec.table, spec.dim)?;
            let dim = table.dim();
            out.clear();
            out.resize(classes.count(spec.classes) * dim, 0.0f32);
            let mut at = 0;
            for range in classes.ranges(spec.classes) {
                let (k, n) = (&keys[range.clone()], range.len() * dim);
                if r.create {
                    table.pull(k, &mut out[at..at + n]);
                } else {
                    table.pull_readonly(k, &mut out[at..at + n]);
                }
                at += n;
            }
            values.push(wire::values_to_bytes(&out, c));
        }
        let resp = pb::PullResponse {
            values,
            compression: c.to_proto() as i32,
        };
        call.finish(true, keys.len() as u64, bytes_in, size(&resp));
        Ok(Response::new(resp))
    }

    async fn push(
        &self,
        req: Request<pb::PushRequest>,
    ) -> Result<Response<pb::PushResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::Push);
        let r = req.into_inner();
        let bytes_in = size(&r);
        let c = Compression::from_proto(r.compression).map_err(Status::invalid_argument)?;
        let nkeys = wire::key_count(&r.keys).map_err(Status::invalid_argument)?;
        let classes = ClassRanges::new(&r.class_offsets, nkeys)?;
        // Decode and check every table before applying any, so a bad request changes nothing.
        let mut updates = Vec::with_capacity(r.tables.len());
        for (i, t) in r.tables.iter().enumerate() {
            if r.tables[..i].iter().any(|u| u.table == t.table) {
                return Err(Status::invalid_argument(format!(
                    "table {} appears twice in one push",
                    t.table
                )));
            }
            let dim = shard.table(t.table, t.dim)?.dim();
            let grads =
                wire::values_to_vec(&t.grads, c, classes.count(t.classes) * dim).map_err(|e| {
                    Status::invalid_argument(format!("grads of table {}: {e}", t.table))
                })?;
            shard.refuse_non_finite(&grads, || {
                format!(
                    "table {} of this push holds NaN or infinite gradients; nothing of the push \
                     was applied",
                    t.table
                )
            })?;
            updates.push((t.table as usize, t.classes, grads));
        }
        let copy = Arc::clone(&shard);
        let id = r.id;
        // The keys are decoded on the task that applies them (it owns the request).
        let apply = async move {
            let shard = copy;
            let keys = wire::keys_from_bytes(&r.keys).map_err(Status::invalid_argument)?;
            let classes = ClassRanges::new(&r.class_offsets, keys.len())?;
            let seq = {
                // With backups: one push at a time, so they get the rows in the order of the
                // pushes that left them.
                let rep = shard.replicator();
                let _order = rep.as_ref().map(|_| shard.order.lock());
                for (t, mask, grads) in &updates {
                    let table = &shard.tables[*t];
                    let mut at = 0;
                    for range in classes.ranges(*mask) {
                        let n = range.len() * table.dim();
                        table.push(&keys[range], &grads[at..at + n]);
                        at += n;
                    }
                }
                rep.as_ref().map(|rep| {
                    let tables = updates
                        .iter()
                        .map(|(t, mask, _)| {
                            let ks: Vec<u64> = classes
                                .ranges(*mask)
                                .into_iter()
                                .flat_map(|range| keys[range].iter().copied())
                                .collect();
                            crate::replica::rows_of(*t as u32, &shard.tables[*t], &ks)
                        })
                        .collect();
                    rep.submit(pb::ReplicaOp {
                        tables,
                        push: id,
                        ..pb::ReplicaOp::default()
                    })
                })
            };
            shard.refresh_table_rows();
            if let (Some(rep), Some(seq)) = (shard.replicator(), seq) {
                rep.wait(seq).await.map_err(|_| shard.fenced())?;
            }
            Ok(pb::PushResponse {})
        };
        let resp = self
            .once(&shard, Rpc::Push, &shard.pushes, id, apply)
            .await?;
        call.finish(true, nkeys as u64, bytes_in, size(&resp));
        Ok(Response::new(resp))
    }

    async fn dense_init(
        &self,
        req: Request<pb::DenseInitRequest>,
    ) -> Result<Response<pb::DenseResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::DenseInit);
        let r = req.into_inner();
        let values = wire::values_to_vec(&r.values, Compression::None, r.values.len() / 4)
            .map_err(Status::invalid_argument)?;
        let now = shard.dense.init(r.total, &values).map_err(refusal)?;
        shard.replicated().await?;
        let resp = pb::DenseResponse {
            values: wire::values_to_bytes(&now, Compression::None),
        };
        call.finish(true, now.len() as u64, size(&r), size(&resp));
        Ok(Response::new(resp))
    }

    async fn dense_push_pull(
        &self,
        req: Request<pb::DensePushPullRequest>,
    ) -> Result<Response<pb::DenseResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::DensePushPull);
        let r = req.into_inner();
        let grads = wire::values_to_vec(&r.grads, Compression::None, r.grads.len() / 4)
            .map_err(Status::invalid_argument)?;
        shard.refuse_non_finite(&grads, || {
            format!(
                "the dense gradients of worker {} at its step {} hold NaN or infinite values; \
                 nothing was applied",
                r.rank, r.step
            )
        })?;
        if r.id.is_some_and(|id| id.rank != r.rank) {
            return Err(Status::invalid_argument(format!(
                "dense push of worker {} carries the push id of worker {}",
                r.rank,
                r.id.map_or(0, |id| id.rank)
            )));
        }
        let bytes_in = size(&r);
        let copy = Arc::clone(&shard);
        let (rank, step, total, id) = (r.rank as usize, r.step, r.total, r.id);
        let apply = async move {
            let shard = copy;
            let now = shard
                .dense
                .push_pull_id(rank, step, total, &grads, id)
                .await
                .map_err(refusal)?;
            shard.replicated().await?;
            shard
                .metrics
                .set_sync_short_steps(shard.dense.short_steps());
            Ok(pb::DenseResponse {
                values: wire::values_to_bytes(&now, Compression::None),
            })
        };
        let resp = self
            .once(&shard, Rpc::DensePushPull, &shard.dense_pushes, r.id, apply)
            .await?;
        call.finish(true, resp.values.len() as u64 / 4, bytes_in, size(&resp));
        Ok(Response::new(resp))
    }

    async fn dense_pull(
        &self,
        req: Request<pb::DensePullRequest>,
    ) -> Result<Response<pb::DenseResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::DensePull);
        let r = req.into_inner();
        let now = shard.dense.pull(r.total).map_err(refusal)?;
        let resp = pb::DenseResponse {
            values: wire::values_to_bytes(&now, Compression::None),
        };
        call.finish(true, now.len() as u64, size(&r), size(&resp));
        Ok(Response::new(resp))
    }

    async fn dense_get_state(
        &self,
        req: Request<pb::DensePullRequest>,
    ) -> Result<Response<pb::DenseState>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::DenseState);
        let r = req.into_inner();
        let (values, opt) = shard.dense.state(r.total).map_err(refusal)?;
        let resp = pb::DenseState {
            values: wire::values_to_bytes(&values, Compression::None),
            slot1: wire::values_to_bytes(&opt.slot1, Compression::None),
            slot2: wire::values_to_bytes(&opt.slot2, Compression::None),
            step: opt.step,
        };
        call.finish(true, values.len() as u64, size(&r), size(&resp));
        Ok(Response::new(resp))
    }

    async fn dense_set_state(
        &self,
        req: Request<pb::DenseSetStateRequest>,
    ) -> Result<Response<pb::DenseSetStateResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::DenseState);
        let r = req.into_inner();
        let st = r
            .state
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("DenseSetState without a state"))?;
        let vec = |b: &[u8], what: &str| {
            wire::values_to_vec(b, Compression::None, b.len() / 4)
                .map_err(|e| Status::invalid_argument(format!("dense state {what}: {e}")))
        };
        let values = vec(&st.values, "values")?;
        let opt = OptimizerState {
            step: st.step,
            slot1: vec(&st.slot1, "slot1")?,
            slot2: vec(&st.slot2, "slot2")?,
        };
        shard.refuse_non_finite(&values, || {
            "the dense values a worker wrote hold NaN or infinite values; nothing was changed"
                .to_string()
        })?;
        shard
            .dense
            .set_state(r.total, &values, opt)
            .map_err(refusal)?;
        shard.replicated().await?;
        let resp = pb::DenseSetStateResponse {};
        call.finish(true, values.len() as u64, size(&r), size(&resp));
        Ok(Response::new(resp))
    }

    async fn worker_done(
        &self,
        req: Request<pb::WorkerDoneRequest>,
    ) -> Result<Response<pb::WorkerDoneResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::WorkerDone);
        let r = req.into_inner();
        let d = &shard.dense;
        let mut done = d.worker_done(r.rank as usize).map_err(refusal)?;
        shard.replicated().await?;
        if r.wait_all {
            done = d.wait_all_done(DONE_WAIT).await;
        }
        let resp = pb::WorkerDoneResponse {
            done: done as u32,
            workers: d.workers() as u32,
        };
        call.finish(true, 0, size(&r), size(&resp));
        Ok(Response::new(resp))
    }

    async fn checkpoint(
        &self,
        req: Request<pb::CheckpointRequest>,
    ) -> Result<Response<pb::CheckpointResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::Checkpoint);
        let r = req.into_inner();
        let bytes_in = size(&r);
        let resp = self.checkpoint_impl(&shard, r).await;
        match resp {
            Ok(resp) => {
                call.finish(true, 0, bytes_in, size(&resp));
                Ok(Response::new(resp))
            }
            Err(s) => {
                call.finish(false, 0, bytes_in, 0);
                Err(s)
            }
        }
    }

    async fn origin(
        &self,
        _req: Request<pb::OriginRequest>,
    ) -> Result<Response<pb::OriginResponse>, Status> {
        Ok(Response::new(self.shard.origin))
    }

    async fn replicate(
        &self,
        req: Request<pb::ReplicateRequest>,
    ) -> Result<Response<pb::ReplicateResponse>, Status> {
        let r = req.into_inner();
        let copy = self.copy_of(r.shard)?;
        copy.role
            .accept_replica(r.shard as usize, r.epoch)
            .map_err(Status::failed_precondition)?;
        let bad = |e: String| Status::failed_precondition(format!("shard {}: {e}", r.shard));
        let applied = if r.snapshot {
            // A joining copy's rows: applied as they come, the numbered changes follow.
            if copy.role.get().role != pb::Role::Joining {
                return Err(bad(
                    "a copy of the primary, but this copy is not joining".into()
                ));
            }
            copy.sequencer.reset(r.snapshot_base);
            for op in &r.ops {
                copy.apply_replica(op).map_err(bad)?;
            }
            r.snapshot_base
        } else {
            copy.sequencer
                .run(&r.ops, |o| o.seq, |o| copy.apply_replica(o))
                .map_err(bad)?
        };
        Ok(Response::new(pb::ReplicateResponse { applied }))
    }

    async fn checksum(
        &self,
        req: Request<pb::ChecksumRequest>,
    ) -> Result<Response<pb::ChecksumResponse>, Status> {
        let copy = self.copy_of(req.get_ref().shard)?;
        Ok(Response::new(copy.checksum()))
    }

    async fn roles(
        &self,
        _req: Request<pb::RolesRequest>,
    ) -> Result<Response<pb::RolesResponse>, Status> {
        Ok(Response::new(self.roles_now()))
    }

    async fn reconfigure(
        &self,
        req: Request<pb::ReconfigureRequest>,
    ) -> Result<Response<pb::RolesResponse>, Status> {
        let r = req.into_inner();
        self.copy_of(r.shard)?.reconfigure(&r)?;
        Ok(Response::new(self.roles_now()))
    }
}

impl Service {
    /// Every copy this process holds, with its role.
    fn roles_now(&self) -> pb::RolesResponse {
        let copies = std::iter::once(&self.shard)
            .chain(&self.shard.backups)
            .map(|c| {
                let r = c.role.get();
                let (in_sync, joining) = c.replicator().map(|r| r.backups()).unwrap_or_default();
                let procs = |v: Vec<usize>| v.into_iter().map(|p| p as u32).collect();
                pb::CopyRole {
                    shard: c.cfg.shard as u32,
                    epoch: r.epoch,
                    role: r.role as i32,
                    in_sync: procs(in_sync),
                    joining: procs(joining),
                }
            })
            .collect();
        pb::RolesResponse {
            incarnation: self.shard.origin.incarnation,
            copies,
        }
    }

    /// The copy a worker's request is for (`x-sparta-shard`, default this process's own
    /// shard), checked to be the shard's primary at the epoch it names (`x-sparta-epoch`).
    fn copy_for<T>(&self, req: &Request<T>) -> Result<Arc<Shard>, Status> {
        let meta = req.metadata();
        let s = &self.shard;
        let want = header(meta, SHARD_HEADER).map_or(s.cfg.shard, |v| v as usize);
        let copy = if want == s.cfg.shard {
            Arc::clone(s)
        } else {
            s.backups
                .iter()
                .find(|b| b.cfg.shard == want)
                .cloned()
                .ok_or_else(|| {
                    Status::failed_precondition(format!(
                        "{} this PS (shard {}) holds no copy of shard {want}",
                        crate::role::NOT_PRIMARY,
                        s.cfg.shard
                    ))
                })?
        };
        copy.serving(header(meta, EPOCH_HEADER).unwrap_or(0))?;
        Ok(copy)
    }

    /// This process's copy (primary or backup) of shard `shard`.
    fn copy_of(&self, shard: u32) -> Result<&Shard, Status> {
        let s = &self.shard;
        if s.cfg.shard == shard as usize {
            return Ok(s);
        }
        s.backups
            .iter()
            .find(|b| b.cfg.shard == shard as usize)
            .map(|b| &**b)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "this PS (shard {}) holds no copy of shard {shard}",
                    s.cfg.shard
                ))
            })
    }
    /// Applies a push once per push id: a new id is applied (on a task of its own, so a
    /// broken connection cannot stop it halfway, e.g. while it waits at the sync barrier) and
    /// its answer kept in `log`; a repeat (the worker's retry) waits for and gets that answer,
    /// counted as a duplicate. Without an id (an old client) it is applied on every attempt.
    /// The fault hook may drop the answer after (or while) applying.
    async fn once<R>(
        &self,
        shard: &Shard,
        rpc: Rpc,
        log: &PushLog<R, Status>,
        id: Option<pb::PushId>,
        apply: impl Future<Output = Result<R, Status>> + Send + 'static,
    ) -> Result<R, Status>
    where
        R: Clone + Send + Sync + 'static,
    {
        let fault = &shard.cfg.fault;
        let Some(id) = id else {
            let r = apply.await?;
            return match fault.on_apply(rpc) {
                Some(_) => Err(dropped(rpc)),
                None => Ok(r),
            };
        };
        let id = PushId {
            rank: id.rank,
            session: id.session,
            seq: id.seq,
        };
        let ticket = match log.admit(id) {
            Ok(Admit::Apply(t)) => t,
            Ok(Admit::Repeat(first)) => {
                shard.metrics.duplicate_push(rpc);
                tracing::debug!("{rpc:?} {id:?} repeated: answered with its first answer");
                return first.outcome().await.unwrap_or_else(|| {
                    Err(Status::aborted(format!(
                        "push {} of worker {} (session {:#018x}): its first attempt stopped \
                         unfinished on this PS; whether it was applied is unknown",
                        id.seq, id.rank, id.session
                    )))
                });
            }
            Err(e @ Refused::Rank { .. }) => return Err(Status::invalid_argument(e.to_string())),
            Err(e) => return Err(Status::failed_precondition(e.to_string())),
        };
        let when = fault.on_apply(rpc);
        let task = tokio::spawn(async move {
            let r = apply.await;
            ticket.finish(r.clone());
            r
        });
        if when == Some(When::Applying) {
            return Err(dropped(rpc));
        }
        let r = task
            .await
            .map_err(|e| Status::internal(format!("applying {rpc:?} {id:?} failed: {e}")))??;
        match when {
            Some(_) => Err(dropped(rpc)),
            None => Ok(r),
        }
    }

    async fn checkpoint_impl(
        &self,
        shard: &Arc<Shard>,
        r: pb::CheckpointRequest,
    ) -> Result<pb::CheckpointResponse, Status> {
        let ck = shard.ckpt.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "this PS has no checkpoint directory: give every process the same job config \
                 with [train] checkpoint_dir (or sparta ps --checkpoint-dir)",
            )
        })?;
        // A repeat of a completed round's call is answered as the round was.
        let round = r
            .position
            .as_ref()
            .filter(|_| !r.leaving && !r.last)
            .map(|p| p.step);
        if let Some(step) = round {
            let done = shard.ckpt_answer.lock().clone();
            if let Some(answer) = done.checkpoint.filter(|_| done.checkpoint_step == step) {
                if ck.barrier.waiting_for().is_none_or(|(s, _)| s != step) {
                    return Ok(answer);
                }
            }
        }
        let copy = Arc::clone(shard);
        let write: PartWriter = Arc::new(move |order, export| copy.write_part(order, export));
        let outcome = ck
            .barrier
            .arrive(&r, write)
            .await
            .map_err(Status::failed_precondition)?;
        let answer = Self::checkpoint_answer(&outcome);
        if let Some(step) = round {
            let (order, export) = match &*outcome {
                Outcome::Written { part, .. } => (
                    Some(part.order),
                    part.export_order
                        .clone()
                        .filter(|_| matches!(part.export, Some(Ok(_)))),
                ),
                _ => (None, None),
            };
            shard.round_answered(step, &answer, order, export).await?;
        } else if r.leaving {
            shard.worker_left(r.position.as_ref()).await?;
        }
        Ok(answer)
    }

    /// What a worker is told of a checkpoint round's outcome.
    fn checkpoint_answer(outcome: &Outcome) -> pb::CheckpointResponse {
        match outcome {
            Outcome::Written { part, workers } => {
                let (export_json, export_error, export_dense) = match &part.export {
                    None => Default::default(),
                    Some(Ok(e)) => (
                        serde_json::to_string(&e.files).unwrap_or_default(),
                        String::new(),
                        wire::values_to_bytes(&e.dense, Compression::None),
                    ),
                    Some(Err(why)) => (String::new(), why.clone(), Default::default()),
                };
                pb::CheckpointResponse {
                    written: true,
                    failed: false,
                    reason: String::new(),
                    parts_json: serde_json::to_string(&part.parts).unwrap_or_default(),
                    tables_json: serde_json::to_string(&part.tables).unwrap_or_default(),
                    workers: workers.iter().map(worker_position).collect(),
                    export_json,
                    export_error,
                    export_dense,
                }
            }
            Outcome::Skipped(why) => pb::CheckpointResponse {
                written: false,
                reason: why.clone(),
                ..Default::default()
            },
            Outcome::Failed(why) => pb::CheckpointResponse {
                written: false,
                failed: true,
                reason: why.clone(),
                ..Default::default()
            },
        }
    }
}

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
    /// Ctrl-C.
    Interrupted,
    /// No request for this long (the idle limit).
    Idle(Duration),
}

/// Builds the shard, binds `listen` (port 0: a free one), optionally serves metrics on
/// `metrics_listen`, calls `ready` once listening, and serves until Ctrl-C / SIGTERM-less
/// process end. Blocks the calling thread (owns its tokio runtime).
pub fn run_blocking(
    job: &Job,
    cfg: PsConfig,
    listen: &str,
    metrics_listen: Option<&str>,
    threads: usize,
    ready: impl FnOnce(&Listening),
) -> Result<(), PsError> {
    run_blocking_with(job, cfg, listen, metrics_listen, threads, None, ready).map(|_| ())
}

/// [`run_blocking`], also stopping once no request has arrived for `idle_exit` (see
/// [`crate::idle`]); says why it stopped.
pub fn run_blocking_with(
    job: &Job,
    cfg: PsConfig,
    listen: &str,
    metrics_listen: Option<&str>,
    threads: usize,
    idle_exit: Option<Duration>,
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
            Some(m) => Some(crate::metrics::serve_metrics(m, Arc::clone(&metrics)).await?),
            None => None,
        };
        let started = Instant::now();
        ready(&Listening {
            addr,
            metrics: maddr,
        });
        let activity = Arc::new(Activity::default());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let watch = Arc::clone(&activity);
        let shutdown = async move {
            let why = tokio::select! {
                _ = tokio::signal::ctrl_c() => Stopped::Interrupted,
                idle = async {
                    match idle_exit {
                        Some(limit) => crate::idle::idle_exit(watch, limit).await,
                        None => std::future::pending().await,
                    }
                } => Stopped::Idle(idle),
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
