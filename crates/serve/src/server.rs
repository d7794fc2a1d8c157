//! The HTTP/1 JSON API (axum).
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/predict` | body `{"rows": [{"I1": 3, "C1": "68fd1e64"}, ...]}` or `{"tsv": ["line", ...]}` -> `{"version": V, "probabilities": [...]}` (several tasks: `{"ctr": [...], "ctcvr": [...]}`); 400 `{"error": reason}`; 413 for a body over the limit |
//! | `GET /v1/model` | version, full version, step, lineage, rows per hash table (`rows`), the job's logical tables (`tables`: `{name: {rows, dim, stored_in, wide}}`), age, load time, and the chain's state: `stale` (`null`, or `{since_version, reason, newest_on_disk, since_unix_ms}`), `newest_on_disk`, `bad_versions`, `step_went_back`; 503 `{"loaded": false, ...}` before the first export |
//! | `GET /metrics` | Prometheus text: requests by answer, rows, latency and batch-size histograms, model version and age, stale gauge, chain breaks, bad versions, lineage changes |
//! | `POST /v1/rollback` | serves the published version before the served one and pins it: 200 `{"version": V, "rolled_back_from": W, "pinned": V}`; 409 `{"error": ...}` when no earlier version loads; 403 when the server has no token (a rollback always needs one) |
//! | `POST /v1/unpin` | lets new versions load again: 200 `{"version": V, "pinned": null, "was_pinned": P}`; 403 without a server token |
//! | `GET /health` | 200 `{"status": "ok"}`; 200 `{"status": "degraded", "stale": {...}}` while newer versions exist that the served chain cannot reach (the model still answers: routing away from every replica at once would help nobody); 503 `{"status": "loading"}` before the first export is loaded |
//!
//! Before the first export `POST /v1/predict` answers 503 `{"error": ...}`; a body with a
//! `Content-Type` other than `application/json` (parameters allowed; no header is read as JSON)
//! 415. With a [`Security::token`] every route but `GET /health` (probes carry no token)
//! answers 401 `{"error": ...}` with `WWW-Authenticate: Bearer ...` unless the request carries
//! `Authorization: Bearer <token>` (see [`crate::auth`]); the admin routes (`/v1/rollback`,
//! `/v1/unpin`) answer 403 on a server started without a token. Every response is counted by
//! status (`sparta_serve_responses_total{code}`). With [`Security::tls`] the server
//! speaks HTTPS only ([`crate::tls`]). [`RunningServer::shutdown`] stops accepting, lets
//! in-flight requests finish and stops the poller.
//!
//! A client has [`ServeConfig::read_timeout`] to send a request's header (also the longest a
//! kept-alive connection idles) and again its body: a stalled header closes the connection,
//! a stalled body is answered 408 `{"error": ...}` and the connection closed, so slow or
//! silent sockets are not held.
//!
//! Scoring runs on the runtime's worker threads (a 100-row request takes well under a
//! millisecond of CPU, less than a hand-off to a blocking pool would cost).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;

use crate::auth::{BearerToken, Refusal};
use crate::metrics::{age_seconds, PredictAnswer, ServeMetrics, CONTENT_TYPE};
use crate::reload::ModelHandle;
use crate::request::is_json_content_type;
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
    /// Longest a client may take to send a request's header (from the moment the connection
    /// waits for one: also the idle limit of a kept-alive connection), and again its body:
    /// past it the connection is closed (a late body is answered 408 first).
    pub read_timeout: Duration,
}

/// [`ServeConfig::read_timeout`] by default.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 << 20,
            max_rows: 10_000,
            poll: Duration::from_secs(1),
            read_timeout: DEFAULT_READ_TIMEOUT,
        }
    }
}

/// Who may call the server and how it is reached. The default: no token, plain HTTP.
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// Required on every route but `GET /health`.
    pub token: Option<BearerToken>,
    /// Serve HTTPS with this config (see [`crate::tls::server_config`]).
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    handle: Arc<ModelHandle>,
    metrics: Arc<ServeMetrics>,
    cfg: ServeConfig,
    token: Option<BearerToken>,
}

impl AppState {
    /// State over a model handle, open to every caller.
    pub fn new(handle: Arc<ModelHandle>, cfg: ServeConfig) -> Self {
        Self {
            metrics: Arc::new(ServeMetrics::new(&handle)),
            handle,
            cfg,
            token: None,
        }
    }

    /// Requires `token` on every route but `GET /health`.
    pub fn with_token(mut self, token: Option<BearerToken>) -> Self {
        if token.is_some() {
            self.metrics.expect_refusals();
        }
        self.token = token;
        self
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<ServeMetrics> {
        &self.metrics
    }
}

/// The API's routes (with the state's token, all but `GET /health` behind it).
pub fn router(state: AppState) -> Router {
    let limit = state.cfg.max_body_bytes;
    let mut api = Router::new()
        .route("/v1/predict", post(predict))
        .route("/v1/model", get(model_info))
        .route("/v1/rollback", post(rollback))
        .route("/v1/unpin", post(unpin))
        .route("/metrics", get(metrics));
    if state.token.is_some() {
        api = api.route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    }
    let counted = Arc::clone(&state.metrics);
    api.route("/health", get(health))
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(counted, count_response))
        .with_state(state)
}

/// Counts every response by status, whatever answered it (a handler, a refusal, a 404).
async fn count_response(State(m): State<Arc<ServeMetrics>>, req: Request, next: Next) -> Response {
    let r = next.run(req).await;
    m.response(r.status().as_u16());
    r
}

/// The admin routes change what is served: refused (403) on a server that checks no token.
fn admin_refused(st: &AppState, endpoint: &'static str) -> Option<Response> {
    if st.token.is_some() {
        return None;
    }
    st.metrics.admin_request(endpoint, "403");
    Some(error(
        StatusCode::FORBIDDEN,
        &format!(
            "POST /v1/{endpoint} changes the served model and needs a server started with a \
             bearer token (--token-file or {})",
            crate::auth::TOKEN_ENV
        ),
    ))
}

/// `POST /v1/rollback`: the version before the served one, pinned.
async fn rollback(State(st): State<AppState>) -> Response {
    if let Some(r) = admin_refused(&st, "rollback") {
        return r;
    }
    let handle = Arc::clone(&st.handle);
    let done = tokio::task::spawn_blocking(move || handle.rollback()).await;
    match done {
        Ok(Ok(rb)) => {
            st.metrics.admin_request("rollback", "200");
            json_response(
                StatusCode::OK,
                json!({"version": rb.to, "rolled_back_from": rb.from, "pinned": rb.to}).to_string(),
            )
        }
        Ok(Err(e)) => {
            st.metrics.admin_request("rollback", "409");
            error(StatusCode::CONFLICT, &e.to_string())
        }
        Err(e) => {
            st.metrics.admin_request("rollback", "500");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("rollback failed: {e}"),
            )
        }
    }
}

/// `POST /v1/unpin`: new versions load again from the served one.
async fn unpin(State(st): State<AppState>) -> Response {
    if let Some(r) = admin_refused(&st, "unpin") {
        return r;
    }
    let was = st.handle.unpin();
    st.metrics.admin_request("unpin", "200");
    let version = st.handle.current().map(|s| s.version());
    json_response(
        StatusCode::OK,
        json!({"version": version, "pinned": null, "was_pinned": was}).to_string(),
    )
}

/// Answers 401 to a request without the state's bearer token.
async fn require_token(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = &st.token else {
        return next.run(req).await;
    };
    let refusal = match token.check_headers(req.headers()) {
        Ok(()) => return next.run(req).await,
        Err(r) => r,
    };
    let endpoint = match req.uri().path() {
        "/v1/predict" => "predict",
        "/v1/model" => "model",
        "/v1/rollback" => "rollback",
        "/v1/unpin" => "unpin",
        _ => "metrics",
    };
    st.metrics.unauthorized(endpoint);
    if refusal == Refusal::Wrong {
        tracing::debug!("{endpoint}: wrong bearer token");
    }
    let mut r = error(StatusCode::UNAUTHORIZED, &refusal.reason());
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static(refusal.challenge()),
    );
    r
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
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl RunningServer {
    /// Stops serving and polling at once (in-flight requests are dropped).
    pub fn abort(&self) {
        self.server.abort();
        self.poller.abort();
    }

    /// Graceful shutdown: stops the poller, stops accepting connections and waits for the
    /// requests in flight to be answered.
    pub async fn shutdown(mut self) {
        self.poller.abort();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.server).await;
        let _ = (&mut self.poller).await;
    }
}

/// Binds `listen` (port 0: a free one), starts the server and the export poller on the
/// current tokio runtime, open to every caller over plain HTTP. The handle may hold no
/// snapshot yet: the server answers 503 until the poller loads the first export.
pub async fn start(
    listen: &str,
    handle: Arc<ModelHandle>,
    cfg: ServeConfig,
) -> std::io::Result<RunningServer> {
    start_secured(listen, handle, cfg, Security::default()).await
}

/// [`start`] with a bearer token and/or TLS.
pub async fn start_secured(
    listen: &str,
    handle: Arc<ModelHandle>,
    cfg: ServeConfig,
    security: Security,
) -> std::io::Result<RunningServer> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let state = AppState::new(Arc::clone(&handle), cfg).with_token(security.token);
    let app = router(state.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let timeout = cfg.read_timeout;
    let server = match security.tls {
        None => spawn_server(listener, app, timeout, shutdown),
        Some(tls) => spawn_server(
            crate::tls::TlsListener::new(listener, tls)?,
            app,
            timeout,
            shutdown,
        ),
    };
    let poller = handle.spawn_poller(cfg.poll);
    Ok(RunningServer {
        addr,
        server,
        poller,
        state,
        stop: Some(stop),
    })
}

/// Serves `app` on `listener` until `shutdown`, then answers the requests in flight. Each
/// connection is HTTP/1 with a header read timeout of `read_timeout` (a client that sends
/// part of a header and stalls, or keeps an idle connection, is dropped past it).
fn spawn_server<L>(
    mut listener: L,
    app: Router,
    read_timeout: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    tokio::spawn(async move {
        // `stop` tells the connections to finish; each holds a `live` receiver until it ends.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let (live_tx, live_rx) = tokio::sync::watch::channel(());
        tokio::pin!(shutdown);
        loop {
            let (io, peer) = tokio::select! {
                c = listener.accept() => c,
                _ = &mut shutdown => break,
            };
            let service = TowerToHyperService::new(app.clone());
            let mut stop = stop_rx.clone();
            let live = live_rx.clone();
            tokio::spawn(async move {
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(read_timeout);
                let conn = builder.serve_connection(TokioIo::new(io), service);
                tokio::pin!(conn);
                let r = tokio::select! {
                    r = conn.as_mut() => r,
                    _ = async { stop.wait_for(|&s| s).await.map(|_| ()) } => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                };
                if let Err(e) = r {
                    tracing::debug!("connection {peer:?}: {e}");
                }
                drop(live);
            });
        }
        drop(listener);
        let _ = stop_tx.send(true);
        drop(live_rx);
        live_tx.closed().await;
    })
}

fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn error(status: StatusCode, reason: &str) -> Response {
    json_response(status, json!({ "error": reason }).to_string())
}

async fn predict(State(st): State<AppState>, req: Request) -> Response {
    let start = Instant::now();
    let m = &st.metrics;
    let content_type = req.headers().get(header::CONTENT_TYPE);
    if !is_json_content_type(content_type.map(|v| v.as_bytes())) {
        m.predict(PredictAnswer::UnsupportedMediaType, 0, 0.0);
        let got = content_type.map_or_else(String::new, |v| {
            String::from_utf8_lossy(v.as_bytes()).into_owned()
        });
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &format!("Content-Type {got:?}: expected application/json (e.g. curl -H 'content-type: application/json')"),
        );
    }
    let timeout = st.cfg.read_timeout;
    let body = match tokio::time::timeout(timeout, Bytes::from_request(req, &st)).await {
        Ok(b) => b,
        Err(_) => {
            m.predict(PredictAnswer::Timeout, 0, 0.0);
            let mut r = error(
                StatusCode::REQUEST_TIMEOUT,
                &format!("request body not received within {timeout:?}"),
            );
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return r;
        }
    };
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let status = e.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                m.predict(PredictAnswer::TooLarge, 0, 0.0);
                return error(
                    status,
                    &format!(
                        "request body over the limit of {} bytes",
                        st.cfg.max_body_bytes
                    ),
                );
            }
            m.predict(PredictAnswer::BadRequest, 0, 0.0);
            return error(StatusCode::BAD_REQUEST, &e.body_text());
        }
    };
    let Some(snap) = st.handle.current() else {
        m.predict(PredictAnswer::NoModel, 0, 0.0);
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "no model loaded yet: waiting for the first export in {}",
                st.handle.dir().display()
            ),
        );
    };
    let batch = match snap.requests().parse_body(&body, st.cfg.max_rows) {
        Ok(b) => b,
        Err(e) => {
            m.predict(PredictAnswer::BadRequest, 0, 0.0);
            return error(StatusCode::BAD_REQUEST, &e.0);
        }
    };
    let rows = batch.rows;
    let probs = snap.predict(batch);
    let out = encode(snap.version(), &snap.task_names(), &probs);
    m.predict(PredictAnswer::Ok, rows, start.elapsed().as_secs_f64());
    json_response(StatusCode::OK, out)
}

/// `{"version": v, "probabilities": [...]}` for one task, `{"version": v, "probabilities":
/// {"ctr": [...], "ctcvr": [...]}}` for several (`probs` row-major, `rows * tasks`); f32
/// printed in their shortest exact form, non-finite ones as null.
fn encode(version: u64, tasks: &[String], probs: &[f32]) -> String {
    use std::fmt::Write as _;
    let n = tasks.len().max(1);
    let mut s = String::with_capacity(40 + probs.len() * 12 + n * 16);
    let _ = write!(s, "{{\"version\":{version},\"probabilities\":");
    let list = |s: &mut String, t: usize| {
        s.push('[');
        for (i, p) in probs.iter().skip(t).step_by(n).enumerate() {
            if i > 0 {
                s.push(',');
            }
            if p.is_finite() {
                let _ = write!(s, "{p:?}");
            } else {
                s.push_str("null");
            }
        }
        s.push(']');
    };
    if n == 1 {
        list(&mut s, 0);
    } else {
        s.push('{');
        for (t, name) in tasks.iter().enumerate() {
            if t > 0 {
                s.push(',');
            }
            s.push_str(&serde_json::to_string(name).expect("a string encodes"));
            s.push(':');
            list(&mut s, t);
        }
        s.push('}');
    }
    s.push('}');
    s
}

/// The chain's state in `/v1/model` and `/health`.
fn chain_json(handle: &ModelHandle) -> serde_json::Value {
    let st = handle.status();
    json!({
        "status": if st.stale.is_some() { "degraded" } else { "ok" },
        "stale": st.stale,
        "newest_on_disk": st.newest_on_disk,
        "bad_versions": st.bad_versions,
        "step_went_back": st.step_went_back,
        "pinned": handle.pinned(),
    })
}

/// The `GET /v1/model` document (`None`: no model loaded yet).
pub fn model_json(snap: Option<&Snapshot>, handle: &ModelHandle) -> serde_json::Value {
    let mut doc = chain_json(handle);
    let o = doc.as_object_mut().expect("an object");
    o.insert("reloads".into(), json!(handle.reloads()));
    o.insert("reload_errors".into(), json!(handle.reload_errors()));
    let Some(snap) = snap else {
        o.insert("loaded".into(), json!(false));
        o.insert("status".into(), json!("loading"));
        o.insert(
            "error".into(),
            json!(format!(
                "no model loaded yet: waiting for the first export in {}",
                handle.dir().display()
            )),
        );
        return doc;
    };
    let rows: serde_json::Map<String, serde_json::Value> = snap
        .tables()
        .iter()
        .map(|(n, t)| (n.to_string(), json!(t.len())))
        .collect();
    // The job's logical tables: rows (ids), dim, the hash table holding them, and whether they
    // have first-order weights.
    let f = &snap.job().features;
    let tables: serde_json::Map<String, serde_json::Value> = f
        .tables
        .iter()
        .map(|lt| {
            let physical = &f.physical[lt.physical].config.name;
            let rows = snap
                .tables()
                .by_name(physical)
                .map_or(0, |m| m.rows_of_tag(lt.tag));
            let v = json!({"rows": rows, "dim": lt.dim, "stored_in": physical, "wide": lt.wide});
            (lt.name.clone(), v)
        })
        .collect();
    let loaded_unix = snap
        .loaded_at()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    for (k, v) in [
        ("loaded", json!(true)),
        ("version", json!(snap.version())),
        ("full_version", json!(snap.full_version())),
        ("step", json!(snap.step())),
        ("lineage", json!(format!("{:016x}", snap.lineage()))),
        (
            "model",
            json!(format!("{:?}", snap.job().model.kind).to_lowercase()),
        ),
        ("rows", json!(rows)),
        ("tables", json!(tables)),
        ("created_unix_ms", json!(snap.created_unix_ms())),
        ("age_seconds", json!(age_seconds(snap.created_unix_ms()))),
        ("loaded_at_unix", json!(loaded_unix)),
    ] {
        o.insert(k.into(), v);
    }
    doc
}

async fn model_info(State(st): State<AppState>) -> Response {
    st.metrics.model_request();
    let snap = st.handle.current();
    let status = if snap.is_some() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, model_json(snap.as_deref(), &st.handle).to_string())
}

/// `GET /health`: 503 loading before the first export, 200 degraded while stale, 200 ok.
async fn health(State(st): State<AppState>) -> Response {
    let Some(snap) = st.handle.current() else {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "loading", "newest_on_disk": st.handle.status().newest_on_disk})
                .to_string(),
        );
    };
    let mut doc = chain_json(&st.handle);
    doc["version"] = json!(snap.version());
    json_response(StatusCode::OK, doc.to_string())
}

async fn metrics(State(st): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        st.metrics.render(&st.handle),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_probabilities_exactly() {
        let s = encode(3, &["ctr".into()], &[0.25, 1.0 / 3.0, f32::NAN]);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["version"], 3);
        let p = v["probabilities"].as_array().unwrap();
        assert_eq!(p[1].as_f64().unwrap() as f32, 1.0f32 / 3.0);
        assert!(p[2].is_null());
    }

    #[test]
    fn several_tasks_answer_one_list_per_task() {
        let tasks = ["ctr".to_string(), "ctcvr".to_string()];
        // rows x tasks: (0.5, 0.1), (0.25, 0.125)
        let s = encode(7, &tasks, &[0.5, 0.1, 0.25, 0.125]);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["version"], 7);
        let p = &v["probabilities"];
        let got = |t: &str| -> Vec<f32> {
            p[t].as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        };
        assert_eq!(got("ctr"), vec![0.5, 0.25]);
        assert_eq!(got("ctcvr"), vec![0.1, 0.125]);
    }
}
