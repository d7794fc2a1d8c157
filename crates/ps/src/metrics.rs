//! Prometheus text metrics and a health check, per process (no global registry: the handle is
//! passed to whoever records or serves).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use axum::routing::get;

use crate::error::PsError;

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
    /// `WorkerDone`.
    WorkerDone,
    /// `Checkpoint` (barrier + part write).
    Checkpoint,
}

const RPCS: [(&str, Rpc); 8] = [
    ("info", Rpc::Info),
    ("pull", Rpc::Pull),
    ("push", Rpc::Push),
    ("dense_init", Rpc::DenseInit),
    ("dense_push_pull", Rpc::DensePushPull),
    ("dense_pull", Rpc::DensePull),
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

#[derive(Default)]
struct RpcMetrics {
    requests: AtomicU64,
    errors: AtomicU64,
    rows: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    in_flight: AtomicI64,
    latency_us: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
}

/// Counters of one process (a PS shard: served RPCs; a worker: RPCs it sent).
pub struct Metrics {
    role: String,
    rpcs: [RpcMetrics; RPCS.len()],
    auth_failures: AtomicU64,
    sync_short_steps: AtomicU64,
    barrier_waiting: [AtomicU64; BARRIERS.len()],
    barrier_slow_waits: [AtomicU64; BARRIERS.len()],
    started: Instant,
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
        m.in_flight.fetch_sub(1, Relaxed);
        if !ok {
            m.errors.fetch_add(1, Relaxed);
        }
        m.rows.fetch_add(rows, Relaxed);
        m.bytes_in.fetch_add(bytes_in, Relaxed);
        m.bytes_out.fetch_add(bytes_out, Relaxed);
        let secs = self.start.elapsed().as_secs_f64();
        m.latency_us.fetch_add((secs * 1e6) as u64, Relaxed);
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            m.buckets[i].fetch_add(1, Relaxed);
        }
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

impl Metrics {
    /// Fresh counters labelled with `role` (`ps` or `worker`).
    pub fn new(role: &str) -> Self {
        Self {
            role: role.to_string(),
            rpcs: Default::default(),
            auth_failures: AtomicU64::new(0),
            sync_short_steps: AtomicU64::new(0),
            barrier_waiting: Default::default(),
            barrier_slow_waits: Default::default(),
            started: Instant::now(),
        }
    }

    /// Sets the count of sync steps that went on without every worker (backup workers).
    pub fn set_sync_short_steps(&self, n: u64) {
        self.sync_short_steps.store(n, Relaxed);
    }

    /// Sets how many workers a slow barrier is waiting for (0 once it completes).
    pub fn set_barrier_waiting(&self, b: BarrierKind, workers: u64) {
        self.barrier_waiting[b as usize].store(workers, Relaxed);
    }

    /// Counts a barrier wait that took longer than the warning threshold.
    pub fn slow_barrier_wait(&self, b: BarrierKind) {
        self.barrier_slow_waits[b as usize].fetch_add(1, Relaxed);
    }

    /// Workers a slow barrier waits for now.
    pub fn barrier_waiting(&self, b: BarrierKind) -> u64 {
        self.barrier_waiting[b as usize].load(Relaxed)
    }

    /// Barrier waits that took longer than the warning threshold so far.
    pub fn barrier_slow_waits(&self, b: BarrierKind) -> u64 {
        self.barrier_slow_waits[b as usize].load(Relaxed)
    }

    /// Starts measuring one RPC.
    pub fn start(&self, rpc: Rpc) -> Call<'_> {
        let m = &self.rpcs[rpc as usize];
        m.requests.fetch_add(1, Relaxed);
        m.in_flight.fetch_add(1, Relaxed);
        Call {
            m,
            start: Instant::now(),
            done: false,
        }
    }

    /// Counts a request refused for its token.
    pub fn auth_failure(&self) {
        self.auth_failures.fetch_add(1, Relaxed);
    }

    /// Requests of one kind so far.
    pub fn requests(&self, rpc: Rpc) -> u64 {
        self.rpcs[rpc as usize].requests.load(Relaxed)
    }

    /// Rows (keys or values) handled by one kind so far.
    pub fn rows(&self, rpc: Rpc) -> u64 {
        self.rpcs[rpc as usize].rows.load(Relaxed)
    }

    /// Bytes received plus sent by one kind so far.
    pub fn bytes(&self, rpc: Rpc) -> u64 {
        let m = &self.rpcs[rpc as usize];
        m.bytes_in.load(Relaxed) + m.bytes_out.load(Relaxed)
    }

    /// Totals over all kinds.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for m in &self.rpcs {
            t.requests += m.requests.load(Relaxed);
            t.errors += m.errors.load(Relaxed);
            t.bytes_in += m.bytes_in.load(Relaxed);
            t.bytes_out += m.bytes_out.load(Relaxed);
        }
        t
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let role = &self.role;
        let counter = |s: &mut String, name: &str, help: &str, f: &dyn Fn(&RpcMetrics) -> u64| {
            let _ = writeln!(
                s,
                "# HELP sparta_rpc_{name} {help}\n# TYPE sparta_rpc_{name} counter"
            );
            for (rpc, k) in RPCS {
                let _ = writeln!(
                    s,
                    "sparta_rpc_{name}{{role=\"{role}\",rpc=\"{rpc}\"}} {}",
                    f(&self.rpcs[k as usize])
                );
            }
        };
        counter(&mut s, "requests_total", "RPCs started.", &|m| {
            m.requests.load(Relaxed)
        });
        counter(&mut s, "errors_total", "RPCs that failed.", &|m| {
            m.errors.load(Relaxed)
        });
        counter(
            &mut s,
            "rows_total",
            "Keys (sparse) or values (dense) handled.",
            &|m| m.rows.load(Relaxed),
        );
        counter(&mut s, "bytes_in_total", "Message bytes received.", &|m| {
            m.bytes_in.load(Relaxed)
        });
        counter(&mut s, "bytes_out_total", "Message bytes sent.", &|m| {
            m.bytes_out.load(Relaxed)
        });
        let _ = writeln!(
            s,
            "# HELP sparta_rpc_in_flight RPCs in progress.\n# TYPE sparta_rpc_in_flight gauge"
        );
        for (rpc, k) in RPCS {
            let _ = writeln!(
                s,
                "sparta_rpc_in_flight{{role=\"{role}\",rpc=\"{rpc}\"}} {}",
                self.rpcs[k as usize].in_flight.load(Relaxed)
            );
        }
        let _ = writeln!(
            s,
            "# HELP sparta_rpc_latency_seconds RPC latency.\n# TYPE sparta_rpc_latency_seconds histogram"
        );
        for (rpc, k) in RPCS {
            let m = &self.rpcs[k as usize];
            let mut cum = 0;
            for (b, c) in BUCKETS.iter().zip(&m.buckets) {
                cum += c.load(Relaxed);
                let _ = writeln!(
                    s,
                    "sparta_rpc_latency_seconds_bucket{{role=\"{role}\",rpc=\"{rpc}\",le=\"{b}\"}} {cum}"
                );
            }
            let _ = writeln!(
                s,
                "sparta_rpc_latency_seconds_bucket{{role=\"{role}\",rpc=\"{rpc}\",le=\"+Inf\"}} {}\nsparta_rpc_latency_seconds_sum{{role=\"{role}\",rpc=\"{rpc}\"}} {}\nsparta_rpc_latency_seconds_count{{role=\"{role}\",rpc=\"{rpc}\"}} {}",
                m.requests.load(Relaxed) - m.in_flight.load(Relaxed).max(0) as u64,
                m.latency_us.load(Relaxed) as f64 / 1e6,
                m.requests.load(Relaxed) - m.in_flight.load(Relaxed).max(0) as u64,
            );
        }
        let _ = writeln!(
            s,
            "# HELP sparta_auth_failures_total Requests refused for a wrong or missing token.\n# TYPE sparta_auth_failures_total counter\nsparta_auth_failures_total{{role=\"{role}\"}} {}",
            self.auth_failures.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP sparta_sync_short_steps_total Sync steps completed without the slowest (backup) workers.\n# TYPE sparta_sync_short_steps_total counter\nsparta_sync_short_steps_total{{role=\"{role}\"}} {}",
            self.sync_short_steps.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP sparta_barrier_waiting_workers Workers a barrier has waited for longer than the warning threshold.\n# TYPE sparta_barrier_waiting_workers gauge"
        );
        for (name, b) in BARRIERS {
            let _ = writeln!(
                s,
                "sparta_barrier_waiting_workers{{role=\"{role}\",barrier=\"{name}\"}} {}",
                self.barrier_waiting(b)
            );
        }
        let _ = writeln!(
            s,
            "# HELP sparta_barrier_slow_waits_total Barrier waits longer than the warning threshold.\n# TYPE sparta_barrier_slow_waits_total counter"
        );
        for (name, b) in BARRIERS {
            let _ = writeln!(
                s,
                "sparta_barrier_slow_waits_total{{role=\"{role}\",barrier=\"{name}\"}} {}",
                self.barrier_slow_waits(b)
            );
        }
        let _ = writeln!(
            s,
            "# HELP sparta_uptime_seconds Seconds since the process started serving.\n# TYPE sparta_uptime_seconds gauge\nsparta_uptime_seconds{{role=\"{role}\"}} {:.3}",
            self.started.elapsed().as_secs_f64()
        );
        s
    }
}

/// Binds `addr` and serves `/metrics` and `/health` until the runtime stops. Returns the bound
/// address (use port 0 for a free one).
pub async fn serve_metrics(addr: &str, metrics: Arc<Metrics>) -> Result<SocketAddr, PsError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| PsError::Io {
            what: format!("binding --metrics-listen {addr}"),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| PsError::Io {
        what: "metrics listener address".into(),
        source,
    })?;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = Arc::clone(&metrics);
                async move { m.render() }
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
