//! The HTTP/1 JSON API (axum).
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/predict` | body `{"rows": [{"I1": 3, "C1": "68fd1e64"}, ...]}` or `{"tsv": ["line", ...]}` -> `{"version": V, "probabilities": [...]}`; 400 `{"error": reason}`; 413 for a body over the limit |
//! | `GET /v1/model` | version, full version, step, rows per table, age, load time |
//! | `GET /metrics` | Prometheus text: requests by answer, rows, latency and batch-size histograms, model version and age |
//! | `GET /health` | `ok` |
//!
//! Scoring runs on the runtime's worker threads (a 100-row request takes well under a
//! millisecond of CPU, less than a hand-off to a blocking pool would cost).

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;

use crate::metrics::{ModelGauges, ServeMetrics};
use crate::reload::ModelHandle;
use crate::snapshot::Snapshot;

/// Limits and polling of a server.
#[derive(Clone, Copy, Debug)]
pub struct ServeConfig {
    /// Largest request body in bytes (larger: 413).
    pub max_body_bytes: usize,
    /// Most rows in one request (more: 400).
    pub max_rows: usize,
    /// How often the export directory is checked for new versions.
    pub poll: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 << 20,
            max_rows: 10_000,
            poll: Duration::from_secs(1),
        }
    }
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    handle: Arc<ModelHandle>,
    metrics: Arc<ServeMetrics>,
    cfg: ServeConfig,
}

impl AppState {
    /// State over a model handle.
    pub fn new(handle: Arc<ModelHandle>, cfg: ServeConfig) -> Self {
        Self {
            handle,
            metrics: Arc::new(ServeMetrics::default()),
            cfg,
        }
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<ServeMetrics> {
        &self.metrics
    }
}

/// The API's routes.
pub fn router(state: AppState) -> Router {
    let limit = state.cfg.max_body_bytes;
    Router::new()
        .route("/v1/predict", post(predict))
        .route("/v1/model", get(model_info))
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok\n" }))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// A running server.
pub struct RunningServer {
    /// The bound address.
    pub addr: SocketAddr,
    /// The HTTP server task.
    pub server: tokio::task::JoinHandle<()>,
    /// The export poller task.
    pub poller: tokio::task::JoinHandle<()>,
    /// The handlers' state (for its metrics).
    pub state: AppState,
}

impl RunningServer {
    /// Stops serving and polling.
    pub fn abort(&self) {
        self.server.abort();
        self.poller.abort();
    }
}

/// Binds `listen` (port 0: a free one), starts the server and the export poller on the
/// current tokio runtime.
pub async fn start(
    listen: &str,
    handle: Arc<ModelHandle>,
    cfg: ServeConfig,
) -> std::io::Result<RunningServer> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let state = AppState::new(Arc::clone(&handle), cfg);
    let app = router(state.clone());
    let server = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("server stopped: {e}");
        }
    });
    let poller = handle.spawn_poller(cfg.poll);
    Ok(RunningServer {
        addr,
        server,
        poller,
        state,
    })
}

fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn error(status: StatusCode, reason: &str) -> Response {
    json_response(status, json!({ "error": reason }).to_string())
}

async fn predict(State(st): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let start = Instant::now();
    let m = &st.metrics;
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let status = e.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                m.predict_too_large.fetch_add(1, Relaxed);
                return error(
                    status,
                    &format!(
                        "request body over the limit of {} bytes",
                        st.cfg.max_body_bytes
                    ),
                );
            }
            m.predict_bad_request.fetch_add(1, Relaxed);
            return error(StatusCode::BAD_REQUEST, &e.body_text());
        }
    };
    let snap = st.handle.current();
    let batch = match snap.requests().parse_body(&body, st.cfg.max_rows) {
        Ok(b) => b,
        Err(e) => {
            m.predict_bad_request.fetch_add(1, Relaxed);
            return error(StatusCode::BAD_REQUEST, &e.0);
        }
    };
    let rows = batch.rows;
    let probs = snap.predict(batch);
    let out = encode(snap.version(), &probs);
    m.predict_ok.fetch_add(1, Relaxed);
    m.rows.fetch_add(rows as u64, Relaxed);
    m.batch_rows.observe(rows as f64);
    m.latency.observe(start.elapsed().as_secs_f64());
    json_response(StatusCode::OK, out)
}

/// `{"version": v, "probabilities": [...]}` (f32 printed in their shortest exact form).
fn encode(version: u64, probs: &[f32]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(40 + probs.len() * 12);
    let _ = write!(s, "{{\"version\":{version},\"probabilities\":[");
    for (i, p) in probs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        if p.is_finite() {
            let _ = write!(s, "{p:?}");
        } else {
            s.push_str("null");
        }
    }
    s.push_str("]}");
    s
}

fn age_seconds(snap: &Snapshot) -> f64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    now.saturating_sub(snap.created_unix_ms()) as f64 / 1e3
}

/// The `GET /v1/model` document.
pub fn model_json(snap: &Snapshot, handle: &ModelHandle) -> serde_json::Value {
    let rows: serde_json::Map<String, serde_json::Value> = snap
        .tables()
        .iter()
        .map(|(n, t)| (n.to_string(), json!(t.len())))
        .collect();
    let loaded_unix = snap
        .loaded_at()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    json!({
        "version": snap.version(),
        "full_version": snap.full_version(),
        "step": snap.step(),
        "model": format!("{:?}", snap.job().model.kind).to_lowercase(),
        "rows": rows,
        "created_unix_ms": snap.created_unix_ms(),
        "age_seconds": age_seconds(snap),
        "loaded_at_unix": loaded_unix,
        "reloads": handle.reloads(),
        "reload_errors": handle.reload_errors(),
    })
}

async fn model_info(State(st): State<AppState>) -> Response {
    st.metrics.model_requests.fetch_add(1, Relaxed);
    let snap = st.handle.current();
    json_response(StatusCode::OK, model_json(&snap, &st.handle).to_string())
}

async fn metrics(State(st): State<AppState>) -> Response {
    let snap = st.handle.current();
    let g = ModelGauges {
        version: snap.version(),
        age_seconds: age_seconds(&snap),
        rows: sparta_core::SparseStore::table_rows(snap.tables()),
        reloads: st.handle.reloads(),
        reload_errors: st.handle.reload_errors(),
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(&g),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_probabilities_exactly() {
        let s = encode(3, &[0.25, 1.0 / 3.0, f32::NAN]);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["version"], 3);
        let p = v["probabilities"].as_array().unwrap();
        assert_eq!(p[1].as_f64().unwrap() as f32, 1.0f32 / 3.0);
        assert!(p[2].is_null());
    }
}
