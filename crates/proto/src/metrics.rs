//! Prometheus metrics and a health check, per process, through `prometheus-client`: one
//! [`Registry`] per [`Metrics`], built from explicit handles (no global registry: the handle is
//! passed to whoever records or serves).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use axum::http::header;
use axum::routing::get;
use prometheus_client::encoding::{prometheus_text, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::error::ProtoError;
use crate::training_metrics::{TrainingGauges, TrainingStatus};
/// The RPCs that are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    /// `Info`.
    Info = 0,
    /// `Pull`.
    Pull,
    /// `Push`.
    Push,
    /// `DenseInit`.
    DenseInit,
    /// `DensePushPull`.
    DensePushPull,
    /// `DensePull`.
    DensePull,
    /// `DenseGetState` and `DenseSetState` (dense mode allreduce).
    DenseState,
    /// `WorkerDone`.
    WorkerDone,
    /// `Checkpoint` (barrier + part write).
    Checkpoint,
}

const RPCS: [(&str, Rpc); 9] = [
    ("info", Rpc::Info),
    ("pull", Rpc::Pull),
    ("push", Rpc::Push),
    ("dense_init", Rpc::DenseInit),
    ("dense_push_pull", Rpc::DensePushPull),
    ("dense_pull", Rpc::DensePull),
    ("dense_state", Rpc::DenseState),
    ("worker_done", Rpc::WorkerDone),
    ("checkpoint", Rpc::Checkpoint),
];

/// The barriers of a PS shard that can wait for workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierKind {
    /// The dense sync step barrier.
    Sync = 0,
    /// The checkpoint barrier.
    Checkpoint,
}

const BARRIERS: [(&str, BarrierKind); 2] = [
    ("sync", BarrierKind::Sync),
    ("checkpoint", BarrierKind::Checkpoint),
];

/// Upper bounds of the latency histogram buckets, seconds.
const BUCKETS: [f64; 12] = [
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0,
];

/// gRPC framing per message (compressed flag + length) added to the protobuf body.
pub const GRPC_FRAME_BYTES: u64 = 5;

/// One metric per value of one label, every child created up front: a `Family` whose handles
/// are kept by the recorder (no map lookup per call) and whose lines come out in a fixed order.
#[derive(Debug)]
struct ByLabel<M> {
    key: &'static str,
    children: Vec<(&'static str, M)>,
}

impl<M: EncodeMetric + TypedMetric> EncodeMetric for ByLabel<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (value, m) in &self.children {
            m.encode(encoder.encode_family(&[(self.key, *value)])?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

/// The handles of one RPC kind.
struct RpcMetrics {
    requests: Counter,
    errors: Counter,
    rows: Counter,
    bytes_in: Counter,
    bytes_out: Counter,
    in_flight: Gauge,
    latency: Histogram,
}

impl RpcMetrics {
    fn new() -> Self {
        Self {
            requests: Counter::default(),
            errors: Counter::default(),
            rows: Counter::default(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            in_flight: Gauge::default(),
            latency: Histogram::new(BUCKETS),
        }
    }
}

/// Counters of one process (a PS shard: served RPCs; a worker: RPCs it sent), and the registry
/// that exposes them.
pub struct Metrics {
    registry: Registry,
    rpcs: Vec<RpcMetrics>,
    auth_failures: Counter,
    /// Pushes refused for NaN or infinite gradients.
    non_finite_pushes: Counter,
    /// Repeated pushes answered from the push log, not applied again: [push, dense].
    duplicate_pushes: [Counter; 2],
    sync_short_steps: Counter,
    barrier_waiting: [Gauge; BARRIERS.len()],
    barrier_slow_waits: [Counter; BARRIERS.len()],
    uptime: Gauge<f64, AtomicU64>,
    started: Instant,
    /// A worker's input files skipped: [bad, late] (a followed directory).
    input_files: [Counter; 2],
    /// A worker's input: [rows, text bytes, source bytes, source retries].
    input: [Counter; 4],
    /// Seconds a worker's reader waited on object storage.
    input_wait: Counter<f64, AtomicU64>,
    /// A worker's Kafka lag per partition (labels `topic`, `partition`).
    kafka_lag: Family<Vec<(String, String)>, Gauge>,
    /// Records a worker took from its Kafka partitions (label `topic`).
    kafka_records: Family<Vec<(String, String)>, Counter>,
    /// A PS shard's rows per logical table (label `table`).
    table_rows: Family<Vec<(String, String)>, Gauge>,
    /// A shard's bytes per physical table (label `table`).
    table_bytes: Family<Vec<(String, String)>, Gauge>,
    table_cold_rows: Family<Vec<(String, String)>, Gauge>,
    table_disk_bytes: Family<Vec<(String, String)>, Gauge>,
    /// A shard's evicted rows per physical table and reason (labels `table`, `reason`).
    evicted_rows: Family<Vec<(String, String)>, Counter>,
    /// A shard's slot moves, slots and rows moved (label `direction`: in, out).
    slot_moves: Family<Vec<(String, String)>, Counter>,
    slots_moved: Family<Vec<(String, String)>, Counter>,
    rows_moved: Family<Vec<(String, String)>, Counter>,
    /// A shard's slots owned and the epoch of its slot table.
    slots_owned: Gauge,
    routing_epoch: Gauge,
    /// The shards of the cluster by that table (shards added or removed while training).
    cluster_shards: Gauge,
    /// Resident set size of the process, bytes (read from /proc/self/status when rendered).
    resident: Gauge,
    replication_bytes: Counter,
    replication_ops: Counter,
    replication_latency: Histogram,
    rejoin_rows: Counter,
    rejoin_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    /// A training process's progress (`worker` and `train` roles).
    training: TrainingGauges,
}

/// One RPC in progress; [`Call::finish`] records it.
pub struct Call<'a> {
    m: &'a RpcMetrics,
    start: Instant,
    done: bool,
}

impl Call<'_> {
    /// Records the outcome: rows handled, bytes received and sent (protobuf bodies + framing).
    pub fn finish(mut self, ok: bool, rows: u64, bytes_in: u64, bytes_out: u64) {
        self.record(ok, rows, bytes_in, bytes_out);
    }

    fn record(&mut self, ok: bool, rows: u64, bytes_in: u64, bytes_out: u64) {
        if self.done {
            return;
        }
        self.done = true;
        let m = self.m;
        m.in_flight.dec();
        if !ok {
            m.errors.inc();
        }
        m.rows.inc_by(rows);
        m.bytes_in.inc_by(bytes_in);
        m.bytes_out.inc_by(bytes_out);
        m.latency.observe(self.start.elapsed().as_secs_f64());
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        // A handler that returned early (an error) still leaves the in-flight gauge.
        self.record(false, 0, 0, 0);
    }
}

/// Totals over all RPC kinds, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Requests.
    pub requests: u64,
    /// Failed requests.
    pub errors: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
}

/// Picks one counter of an RPC kind.
type RpcCounter = fn(&RpcMetrics) -> &Counter;

/// One child per RPC kind, labelled `rpc`, sharing the handles in `rpcs`.
fn by_rpc<M: Clone>(rpcs: &[RpcMetrics], f: impl Fn(&RpcMetrics) -> &M) -> ByLabel<M> {
    ByLabel {
        key: "rpc",
        children: RPCS
            .iter()
            .map(|&(name, k)| (name, f(&rpcs[k as usize]).clone()))
            .collect(),
    }
}

/// One child per barrier, labelled `barrier`, sharing the handles in `ms`.
fn by_barrier<M: Clone>(ms: &[M; BARRIERS.len()]) -> ByLabel<M> {
    ByLabel {
        key: "barrier",
        children: BARRIERS
            .iter()
            .map(|&(name, b)| (name, ms[b as usize].clone()))
            .collect(),
    }
}

impl Metrics {
    /// Fresh counters labelled with `role` (`ps`, `worker`, `coordinator`, or `train`: an
    /// embedded `sparta train`), registered in a registry of their own: the RPC families and
    /// barriers of every cluster process, a shard's replication and table rows, the input
    /// and training progress of a worker or an embedded trainer.
    pub fn new(role: &str) -> Self {
        let mut m = Self {
            registry: Registry::default(),
            rpcs: RPCS.iter().map(|_| RpcMetrics::new()).collect(),
            auth_failures: Counter::default(),
            non_finite_pushes: Counter::default(),
            duplicate_pushes: Default::default(),
            sync_short_steps: Counter::default(),
            barrier_waiting: Default::default(),
            barrier_slow_waits: Default::default(),
            uptime: Gauge::default(),
            started: Instant::now(),
            input_files: Default::default(),
            input: Default::default(),
            input_wait: Counter::default(),
            kafka_lag: Family::default(),
            kafka_records: Family::default(),
            table_rows: Family::default(),
            table_bytes: Family::default(),
            table_cold_rows: Family::default(),
            table_disk_bytes: Family::default(),
            evicted_rows: Family::default(),
            slot_moves: Family::default(),
            slots_moved: Family::default(),
            rows_moved: Family::default(),
            slots_owned: Gauge::default(),
            routing_epoch: Gauge::default(),
            cluster_shards: Gauge::default(),
            resident: Gauge::default(),
            replication_bytes: Counter::default(),
            replication_ops: Counter::default(),
            replication_latency: Histogram::new(BUCKETS),
            rejoin_rows: Counter::default(),
            rejoin_seconds: Counter::default(),
            training: TrainingGauges::default(),
        };
        // `role` is a constant label of every line; help texts get their final '.' from the
        // registry, counters their `_total` suffix.
        let mut r = Registry::with_labels(std::iter::once((
            Cow::Borrowed("role"),
            Cow::Owned(role.to_string()),
        )));
        if role != "train" {
            m.register_rpcs(&mut r);
        }
        if role == "ps" {
            m.register_pushes_and_replication(&mut r);
        }
        if role != "train" {
            m.register_barriers(&mut r);
        } else {
            m.register_uptime(&mut r);
        }
        if role == "worker" || role == "train" {
            m.register_input(&mut r);
            m.training.register(&mut r);
        }
        if role == "ps" {
            r.register(
                "sparta_table_rows",
                "Rows (ids) of each of the job's tables held by this shard",
                m.table_rows.clone(),
            );
            r.register(
                "sparta_table_bytes",
                "Bytes held by each of this shard's tables (rows and free row slots, index, \
                 admission sketches, tombstone log)",
                m.table_bytes.clone(),
            );
            r.register(
                "sparta_table_cold_rows",
                "Rows of each of this shard's tables in its SSD tier (counted in \
                 sparta_table_rows; 0 without a tier)",
                m.table_cold_rows.clone(),
            );
            r.register(
                "sparta_table_disk_bytes",
                "Bytes of the SSD tier files of each of this shard's tables",
                m.table_disk_bytes.clone(),
            );
            r.register(
                "sparta_evicted_rows",
                "Rows evicted from each of this shard's tables, by reason (idle_steps, \
                 idle_seconds, min_count, memory_limit)",
                m.evicted_rows.clone(),
            );
            r.register(
                "sparta_slot_moves",
                "Slot moves completed into (direction=in) and out of (out) this shard",
                m.slot_moves.clone(),
            );
            r.register(
                "sparta_slots_moved",
                "Slots this shard took in (direction=in) or gave away (out)",
                m.slots_moved.clone(),
            );
            r.register(
                "sparta_rows_moved",
                "Table rows this shard took in (direction=in) or gave away (out) with slots",
                m.rows_moved.clone(),
            );
            r.register(
                "sparta_slots_owned",
                "Slots (of 16384) whose keys this shard holds",
                m.slots_owned.clone(),
            );
            r.register(
                "sparta_routing_epoch",
                "Epoch of the slot table this shard routes by (one more per slot move)",
                m.routing_epoch.clone(),
            );
            r.register(
                "sparta_cluster_shards",
                "PS shards of the cluster by that slot table (changes as shards are added or \
                 removed while training)",
                m.cluster_shards.clone(),
            );
        }
        r.register(
            "sparta_process_resident_bytes",
            "Resident set size of this process",
            m.resident.clone(),
        );
        m.registry = r;
        m
    }

    /// Every process's RPC families (requests, errors, rows, bytes, in flight, latency) and
    /// refused tokens.
    fn register_rpcs(&self, r: &mut Registry) {
        let counters: [(&str, &str, RpcCounter); 5] = [
            ("sparta_rpc_requests", "RPCs started", |m| &m.requests),
            ("sparta_rpc_errors", "RPCs that failed", |m| &m.errors),
            (
                "sparta_rpc_rows",
                "Keys (sparse) or values (dense) handled",
                |m| &m.rows,
            ),
            ("sparta_rpc_bytes_in", "Message bytes received", |m| {
                &m.bytes_in
            }),
            ("sparta_rpc_bytes_out", "Message bytes sent", |m| {
                &m.bytes_out
            }),
        ];
        for (name, help, counter) in counters {
            r.register(name, help, by_rpc(&self.rpcs, counter));
        }
        r.register(
            "sparta_rpc_in_flight",
            "RPCs in progress",
            by_rpc(&self.rpcs, |m| &m.in_flight),
        );
        r.register(
            "sparta_rpc_latency_seconds",
            "RPC latency",
            by_rpc(&self.rpcs, |m| &m.latency),
        );
        r.register(
            "sparta_auth_failures",
            "Requests refused for a wrong or missing token",
            self.auth_failures.clone(),
        );
    }

    /// A shard's refused and repeated pushes, and its replication to backups.
    fn register_pushes_and_replication(&self, r: &mut Registry) {
        r.register(
            "sparta_push_non_finite",
            "Pushes (sparse or dense) refused because a gradient was NaN or infinite; \
             nothing of them was applied",
            self.non_finite_pushes.clone(),
        );
        r.register(
            "sparta_replication_bytes",
            "Message bytes a primary sent to its backups (--replicas), every backup counted",
            self.replication_bytes.clone(),
        );
        r.register(
            "sparta_replication_ops",
            "Changes (a push's rows, the dense slice) a primary sent, every backup counted",
            self.replication_ops.clone(),
        );
        r.register(
            "sparta_rejoin_copied_rows",
            "Rows a primary copied to joining backups (a restarted PS rejoining)",
            self.rejoin_rows.clone(),
        );
        r.register(
            "sparta_rejoin_copy_seconds",
            "Time a primary spent copying its shard to joining backups",
            self.rejoin_seconds.clone(),
        );
        r.register(
            "sparta_replication_latency_seconds",
            "Time from a change's sending to its backup's acknowledgement, per batch",
            self.replication_latency.clone(),
        );
        r.register(
            "sparta_ps_duplicate_pushes",
            "Repeated pushes (a worker's retry after a broken connection) answered with \
             their first answer, not applied again",
            ByLabel {
                key: "rpc",
                children: vec![
                    ("push", self.duplicate_pushes[0].clone()),
                    ("dense_push_pull", self.duplicate_pushes[1].clone()),
                ],
            },
        );
    }

    /// Barriers (sync steps, checkpoint rounds) and uptime.
    fn register_barriers(&self, r: &mut Registry) {
        r.register(
            "sparta_sync_short_steps",
            "Sync steps completed without the slowest (backup) workers",
            self.sync_short_steps.clone(),
        );
        r.register(
            "sparta_barrier_waiting_workers",
            "Workers a barrier has waited for longer than the warning threshold",
            by_barrier(&self.barrier_waiting),
        );
        r.register(
            "sparta_barrier_slow_waits",
            "Barrier waits longer than the warning threshold",
            by_barrier(&self.barrier_slow_waits),
        );
        self.register_uptime(r);
    }

    fn register_uptime(&self, r: &mut Registry) {
        r.register(
            "sparta_uptime_seconds",
            "Seconds since the process started serving",
            self.uptime.clone(),
        );
    }

    /// Sets a training process's progress gauges (a worker's or an embedded trainer's).
    pub fn set_training(&self, status: &TrainingStatus) {
        self.training.set(status);
    }

    /// A worker's input: skipped files, rows and bytes read, object-storage retries and waits.
    fn register_input(&self, r: &mut Registry) {
        r.register(
            "sparta_input_bad_files",
            "Input files skipped as bad (corrupt or truncated gzip, shrunk while read)",
            self.input_files[0].clone(),
        );
        r.register(
            "sparta_input_late_files_skipped",
            "Files of a followed directory skipped because they arrived after a file that \
             sorts after them was started",
            self.input_files[1].clone(),
        );
        let inputs = [
            ("sparta_input_rows", "Training rows read"),
            (
                "sparta_input_text_bytes",
                "Bytes of (decompressed) input text parsed",
            ),
            (
                "sparta_input_source_bytes",
                "Bytes fetched from object storage, as stored",
            ),
            (
                "sparta_input_source_retries",
                "Object-storage requests retried after a transient error",
            ),
        ];
        for ((name, help), c) in inputs.into_iter().zip(&self.input) {
            r.register(name, help, c.clone());
        }
        r.register(
            "sparta_input_source_wait_seconds",
            "Seconds the reader waited on object storage",
            self.input_wait.clone(),
        );
        r.register(
            "sparta_kafka_lag_records",
            "Records of each of this worker's Kafka partitions not yet handed to training (the \
             high watermark of the newest fetch minus the next offset)",
            self.kafka_lag.clone(),
        );
        r.register(
            "sparta_kafka_records",
            "Records of a Kafka topic handed to training by this worker",
            self.kafka_records.clone(),
        );
    }

    /// Counts one copy of a shard to a joining backup: `rows` in `seconds`.
    pub fn rejoin_copied(&self, rows: u64, seconds: f64) {
        self.rejoin_rows.inc_by(rows);
        self.rejoin_seconds.inc_by(seconds);
    }

    /// Counts one batch of `ops` changes (`bytes` on the wire) acknowledged by a backup
    /// `seconds` after it was sent.
    pub fn replicated(&self, ops: u64, bytes: u64, seconds: f64) {
        self.replication_ops.inc_by(ops);
        self.replication_bytes.inc_by(bytes);
        self.replication_latency.observe(seconds);
    }

    /// Bytes sent to backups so far (every backup counted).
    pub fn replication_bytes(&self) -> u64 {
        self.replication_bytes.get()
    }

    /// Sets the count of sync steps that went on without every worker (backup workers): the
    /// dense slice's own count, so the counter only ever moves up to it.
    pub fn set_sync_short_steps(&self, n: u64) {
        self.sync_short_steps.inner().fetch_max(n, Relaxed);
    }

    /// Sets the rows this shard holds of logical table `table`.
    pub fn set_table_rows(&self, table: &str, rows: u64) {
        self.table_rows
            .get_or_create(&vec![("table".to_string(), table.to_string())])
            .set(rows as i64);
    }

    /// Sets the bytes this shard holds of physical table `table`.
    pub fn set_table_bytes(&self, table: &str, bytes: u64) {
        self.table_bytes
            .get_or_create(&vec![("table".to_string(), table.to_string())])
            .set(bytes as i64);
    }

    /// Sets the cold rows (in the SSD tier) and the tier's file bytes of physical table
    /// `table`.
    pub fn set_table_tier(&self, table: &str, cold_rows: u64, disk_bytes: u64) {
        let label = vec![("table".to_string(), table.to_string())];
        self.table_cold_rows
            .get_or_create(&label)
            .set(cold_rows as i64);
        self.table_disk_bytes
            .get_or_create(&label)
            .set(disk_bytes as i64);
    }

    /// Counts one slot move of `slots` slots and `rows` rows, `direction` `in` or `out`.
    pub fn slot_move(&self, direction: &str, slots: u64, rows: u64) {
        let label = vec![("direction".to_string(), direction.to_string())];
        self.slot_moves.get_or_create(&label).inc();
        self.slots_moved.get_or_create(&label).inc_by(slots);
        self.rows_moved.get_or_create(&label).inc_by(rows);
    }

    /// Sets the slots this shard owns and the epoch of its slot table.
    pub fn set_routing(&self, epoch: u64, slots_owned: u64, shards: u64) {
        self.routing_epoch.set(epoch as i64);
        self.slots_owned.set(slots_owned as i64);
        self.cluster_shards.set(shards as i64);
    }

    /// Raises the count of rows evicted from physical table `table` for `reason` to `total`
    /// (the table's own count: the counter only ever moves up to it).
    pub fn set_evicted_rows(&self, table: &str, reason: &str, total: u64) {
        self.evicted_rows
            .get_or_create(&vec![
                ("table".to_string(), table.to_string()),
                ("reason".to_string(), reason.to_string()),
            ])
            .inner()
            .fetch_max(total, Relaxed);
    }

    /// Raises the input-file counters of a worker to the reader's totals (`bad` files skipped,
    /// `late` files of a followed directory skipped); they only ever move up.
    pub fn set_input_files(&self, bad: u64, late: u64) {
        self.input_files[0].inner().fetch_max(bad, Relaxed);
        self.input_files[1].inner().fetch_max(late, Relaxed);
    }

    /// Raises the input counters of a worker to the reader's totals (rows, text bytes, source
    /// bytes, source retries, seconds waited on the source).
    pub fn set_input(&self, totals: [u64; 4], wait_seconds: f64) {
        for (c, v) in self.input.iter().zip(totals) {
            c.inner().fetch_max(v, Relaxed);
        }
        let seen = self.input_wait.get();
        if wait_seconds > seen {
            self.input_wait.inc_by(wait_seconds - seen);
        }
    }

    /// Sets a worker's Kafka figures: `lag` per partition of `topic` (high watermark minus
    /// next offset) and the `records` it handed to training so far (the counter only ever
    /// moves up to it).
    pub fn set_kafka(&self, topic: &str, lag: &[(i32, i64)], records: u64) {
        for &(p, l) in lag {
            self.kafka_lag
                .get_or_create(&vec![
                    ("topic".to_string(), topic.to_string()),
                    ("partition".to_string(), p.to_string()),
                ])
                .set(l);
        }
        self.kafka_records
            .get_or_create(&vec![("topic".to_string(), topic.to_string())])
            .inner()
            .fetch_max(records, Relaxed);
    }

    /// Sets how many workers a slow barrier is waiting for (0 once it completes).
    pub fn set_barrier_waiting(&self, b: BarrierKind, workers: u64) {
        self.barrier_waiting[b as usize].set(i64::try_from(workers).unwrap_or(i64::MAX));
    }

    /// Counts a barrier wait that took longer than the warning threshold.
    pub fn slow_barrier_wait(&self, b: BarrierKind) {
        self.barrier_slow_waits[b as usize].inc();
    }

    /// Workers a slow barrier waits for now.
    pub fn barrier_waiting(&self, b: BarrierKind) -> u64 {
        self.barrier_waiting[b as usize].get().max(0) as u64
    }

    /// Barrier waits that took longer than the warning threshold so far.
    pub fn barrier_slow_waits(&self, b: BarrierKind) -> u64 {
        self.barrier_slow_waits[b as usize].get()
    }

    /// Starts measuring one RPC.
    pub fn start(&self, rpc: Rpc) -> Call<'_> {
        let m = &self.rpcs[rpc as usize];
        m.requests.inc();
        m.in_flight.inc();
        Call {
            m,
            start: Instant::now(),
            done: false,
        }
    }

    /// Counts a push refused for a NaN or infinite gradient.
    pub fn non_finite_push(&self) {
        self.non_finite_pushes.inc();
    }

    /// Pushes refused for NaN or infinite gradients so far.
    pub fn non_finite_pushes(&self) -> u64 {
        self.non_finite_pushes.get()
    }

    /// Counts a repeated push answered from the push log (`rpc`: `Push` or
    /// `DensePushPull`; others are not counted).
    pub fn duplicate_push(&self, rpc: Rpc) {
        if let Some(c) = Self::duplicate_index(rpc).map(|i| &self.duplicate_pushes[i]) {
            c.inc();
        }
    }

    /// Repeated pushes of `rpc` answered from the push log so far.
    pub fn duplicate_pushes(&self, rpc: Rpc) -> u64 {
        Self::duplicate_index(rpc).map_or(0, |i| self.duplicate_pushes[i].get())
    }

    fn duplicate_index(rpc: Rpc) -> Option<usize> {
        match rpc {
            Rpc::Push => Some(0),
            Rpc::DensePushPull => Some(1),
            _ => None,
        }
    }

    /// Counts a request refused for its token.
    pub fn auth_failure(&self) {
        self.auth_failures.inc();
    }

    /// Requests of one kind so far.
    pub fn requests(&self, rpc: Rpc) -> u64 {
        self.rpcs[rpc as usize].requests.get()
    }

    /// Rows (keys or values) handled by one kind so far.
    pub fn rows(&self, rpc: Rpc) -> u64 {
        self.rpcs[rpc as usize].rows.get()
    }

    /// Bytes received plus sent by one kind so far.
    pub fn bytes(&self, rpc: Rpc) -> u64 {
        let m = &self.rpcs[rpc as usize];
        m.bytes_in.get() + m.bytes_out.get()
    }

    /// Totals over all kinds.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for m in &self.rpcs {
            t.requests += m.requests.get();
            t.errors += m.errors.get();
            t.bytes_in += m.bytes_in.get();
            t.bytes_out += m.bytes_out.get();
        }
        t
    }

    /// The Prometheus text exposition (format 0.0.4, [`prometheus_text::CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        self.uptime.set(self.started.elapsed().as_secs_f64());
        if let Some(rss) = resident_bytes() {
            self.resident.set(rss as i64);
        }
        let mut s = String::new();
        if let Err(e) = prometheus_text::encode(&mut s, &self.registry) {
            tracing::warn!("encoding metrics: {e}");
        }
        s
    }
}

/// The resident set size of this process, bytes (`VmRSS` of `/proc/self/status`; `None`
/// where there is no such file).
pub fn resident_bytes() -> Option<u64> {
    proc_status_kib("VmRSS").map(|k| k << 10)
}

/// The peak resident set size of this process, bytes (`VmHWM` of `/proc/self/status`).
pub fn peak_resident_bytes() -> Option<u64> {
    proc_status_kib("VmHWM").map(|k| k << 10)
}

/// A `kB` field of `/proc/self/status`.
fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find(|l| l.split(':').next() == Some(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Binds `addr` and serves `/metrics` and `/health` until the runtime stops. Returns the bound
/// address (use port 0 for a free one).
pub async fn serve_metrics(addr: &str, metrics: Arc<Metrics>) -> Result<SocketAddr, ProtoError> {
    serve_exposition(addr, Arc::new(move || metrics.render())).await
}

/// Binds `addr` and serves `/metrics` with what `render` writes (a Prometheus text
/// exposition, rendered on a blocking thread: it may wait on I/O, as a launcher fetching its
/// children's does) and `/health`, until the runtime stops. Returns the bound address.
pub async fn serve_exposition(
    addr: &str,
    render: Arc<dyn Fn() -> String + Send + Sync>,
) -> Result<SocketAddr, ProtoError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ProtoError::Io {
            what: format!("binding --metrics-listen {addr}"),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ProtoError::Io {
        what: "metrics listener address".into(),
        source,
    })?;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let render = Arc::clone(&render);
                async move {
                    let text = tokio::task::spawn_blocking(move || render())
                        .await
                        .unwrap_or_default();
                    (
                        [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
                        text,
                    )
                }
            }),
        )
        .route("/health", get(|| async { "ok\n" }));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!("metrics server stopped: {e}");
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_reports_its_slot_table_epoch_slots_and_the_clusters_shard_count() {
        let m = Metrics::new("ps");
        m.set_routing(3, 5461, 3);
        let text = m.render();
        for line in [
            "sparta_routing_epoch{role=\"ps\"} 3",
            "sparta_slots_owned{role=\"ps\"} 5461",
            "sparta_cluster_shards{role=\"ps\"} 3",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn a_worker_reports_its_input_totals_once_each() {
        let m = Metrics::new("worker");
        m.set_input([100, 5000, 2000, 1], 0.25);
        // Totals, not increments: the same totals again change nothing.
        m.set_input([100, 5000, 2000, 1], 0.25);
        m.set_input([150, 7000, 2600, 1], 0.5);
        let text = m.render();
        for line in [
            "sparta_input_rows_total{role=\"worker\"} 150",
            "sparta_input_text_bytes_total{role=\"worker\"} 7000",
            "sparta_input_source_bytes_total{role=\"worker\"} 2600",
            "sparta_input_source_retries_total{role=\"worker\"} 1",
            "sparta_input_source_wait_seconds_total{role=\"worker\"} 0.5",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert!(!Metrics::new("ps").render().contains("sparta_input_rows"));
    }

    #[test]
    fn a_worker_reports_its_kafka_lag_per_partition_and_its_records() {
        let m = Metrics::new("worker");
        m.set_kafka("clicks", &[(0, 120), (2, 0)], 500);
        m.set_kafka("clicks", &[(0, 3), (2, 0)], 617);
        let text = m.render();
        for line in [
            "sparta_kafka_lag_records{role=\"worker\",topic=\"clicks\",partition=\"0\"} 3",
            "sparta_kafka_lag_records{role=\"worker\",topic=\"clicks\",partition=\"2\"} 0",
            "sparta_kafka_records_total{role=\"worker\",topic=\"clicks\"} 617",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn render_counts_requests_bytes_and_in_flight() {
        let m = Metrics::new("ps");
        let c = m.start(Rpc::Pull);
        let pending = m.start(Rpc::Push);
        c.finish(true, 10, 100, 200);
        let text = m.render();
        assert!(text.contains("sparta_rpc_requests_total{role=\"ps\",rpc=\"pull\"} 1"));
        assert!(text.contains("sparta_rpc_bytes_out_total{role=\"ps\",rpc=\"pull\"} 200"));
        assert!(text.contains("sparta_rpc_in_flight{role=\"ps\",rpc=\"push\"} 1"));
        drop(pending);
        assert!(m
            .render()
            .contains("sparta_rpc_errors_total{role=\"ps\",rpc=\"push\"} 1"));
        assert_eq!(m.totals().bytes_in, 100);
    }
}
