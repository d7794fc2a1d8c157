//! Prometheus metrics of the prediction server through `prometheus-client`: one registry per
//! server (no global state), rendered in the Prometheus text format (0.0.4).
//!
//! Counters of the model handle (reloads, chain breaks, bad versions, lineage changes) are the
//! handle's own `Counter`s, registered here; gauges about the live model are set at each scrape.

use std::sync::atomic::AtomicU64;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::reload::ModelHandle;

/// Upper bounds of the latency buckets, seconds.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 10.0,
];
/// Upper bounds of the rows-per-request buckets.
const ROW_BUCKETS: [f64; 8] = [1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0];

/// The Content-Type of [`ServeMetrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Labels of `sparta_serve_requests_total`: endpoint and HTTP status.
type Labels = [(&'static str, &'static str); 2];

/// A gauge of float values.
type FloatGauge = Gauge<f64, AtomicU64>;

/// The metrics of one server and its registry.
pub struct ServeMetrics {
    registry: Registry,
    started: Instant,
    requests: Family<Labels, Counter>,
    responses: Family<[(&'static str, String); 1], Counter>,
    pinned_version: Gauge,
    errors: Counter,
    rows: Counter,
    latency: Histogram,
    batch_rows: Histogram,
    model_version: Gauge,
    model_age: FloatGauge,
    model_rows: Gauge,
    table_rows: Family<Vec<(String, String)>, Gauge>,
    model_loaded: Gauge,
    stale: Gauge,
    newest_on_disk: Gauge,
    uptime: FloatGauge,
}

/// Answers of `POST /v1/predict` that are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredictAnswer {
    /// 200.
    Ok,
    /// 400.
    BadRequest,
    /// 401: no or a wrong bearer token.
    Unauthorized,
    /// 408: the body did not arrive within the read timeout.
    Timeout,
    /// 413.
    TooLarge,
    /// 415: a Content-Type other than JSON.
    UnsupportedMediaType,
    /// 503: no model loaded yet.
    NoModel,
}

impl PredictAnswer {
    fn code(self) -> &'static str {
        match self {
            PredictAnswer::Ok => "200",
            PredictAnswer::BadRequest => "400",
            PredictAnswer::Unauthorized => "401",
            PredictAnswer::Timeout => "408",
            PredictAnswer::TooLarge => "413",
            PredictAnswer::UnsupportedMediaType => "415",
            PredictAnswer::NoModel => "503",
        }
    }
}

fn labels(endpoint: &'static str, code: &'static str) -> Labels {
    [("endpoint", endpoint), ("code", code)]
}

impl ServeMetrics {
    /// A registry with the server's metrics and the handle's counters.
    pub fn new(handle: &ModelHandle) -> ServeMetrics {
        let mut r = Registry::default();
        let requests = Family::<Labels, Counter>::default();
        for code in ["200", "400", "413", "415", "503"] {
            let _ = requests.get_or_create(&labels("predict", code));
        }
        let _ = requests.get_or_create(&labels("model", "200"));
        r.register(
            "sparta_serve_requests",
            "Requests by endpoint and answer",
            requests.clone(),
        );
        let responses = Family::<[(&'static str, String); 1], Counter>::default();
        r.register(
            "sparta_serve_responses",
            "Every response of the server by HTTP status (unknown routes, refusals and errors \
             included)",
            responses.clone(),
        );
        let errors = Counter::default();
        r.register(
            "sparta_serve_errors",
            "Prediction requests refused",
            errors.clone(),
        );
        let rows = Counter::default();
        r.register("sparta_serve_rows", "Rows scored", rows.clone());
        let latency = Histogram::new(LATENCY_BUCKETS);
        r.register(
            "sparta_serve_predict_latency_seconds",
            "Prediction request latency (parse, score, encode)",
            latency.clone(),
        );
        let batch_rows = Histogram::new(ROW_BUCKETS);
        r.register(
            "sparta_serve_predict_rows",
            "Rows per prediction request",
            batch_rows.clone(),
        );
        let gauge = |r: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            r.register(name, help, g.clone());
            g
        };
        let float_gauge = |r: &mut Registry, name: &str, help: &str| {
            let g = FloatGauge::default();
            r.register(name, help, g.clone());
            g
        };
        let model_version = gauge(&mut r, "sparta_serve_model_version", "Live export version");
        let model_age = float_gauge(
            &mut r,
            "sparta_serve_model_age_seconds",
            "Seconds since the live version was exported",
        );
        let model_rows = gauge(&mut r, "sparta_serve_model_rows", "Rows over all tables");
        let table_rows = Family::<Vec<(String, String)>, Gauge>::default();
        r.register(
            "sparta_serve_table_rows",
            "Rows (ids) of each of the job's tables in the live version",
            table_rows.clone(),
        );
        let model_loaded = gauge(
            &mut r,
            "sparta_serve_model_loaded",
            "1 once a model is loaded, 0 before the first export",
        );
        let stale = gauge(
            &mut r,
            "sparta_serve_stale",
            "1 while newer export versions exist that the served chain cannot reach",
        );
        let newest_on_disk = gauge(
            &mut r,
            "sparta_serve_newest_version_on_disk",
            "Newest complete export version in the export directory",
        );
        let pinned_version = gauge(
            &mut r,
            "sparta_serve_pinned_version",
            "The export version serving is pinned to (--pin-version, a rollback); 0: not pinned",
        );
        let uptime = float_gauge(
            &mut r,
            "sparta_serve_uptime_seconds",
            "Seconds since the server started",
        );
        let c = handle.counters();
        for (name, help, counter) in [
            (
                "sparta_serve_model_reloads",
                "Versions installed since start",
                &c.reloads,
            ),
            (
                "sparta_serve_model_reload_errors",
                "Failed polls of the export directory",
                &c.reload_errors,
            ),
            (
                "sparta_serve_chain_breaks",
                "Times the served chain could not reach newer versions on disk",
                &c.chain.chain_breaks,
            ),
            (
                "sparta_serve_bad_versions",
                "Export versions that failed verification and were skipped",
                &c.chain.bad_versions,
            ),
            (
                "sparta_serve_lineage_changes",
                "Versions of a new trainer lineage accepted with a lower step",
                &c.chain.lineage_changes,
            ),
            (
                "sparta_serve_rollbacks",
                "Rollbacks to an earlier export version (POST /v1/rollback)",
                &c.rollbacks,
            ),
        ] {
            r.register(name, help, counter.clone());
        }
        ServeMetrics {
            registry: r,
            started: Instant::now(),
            requests,
            responses,
            pinned_version,
            errors,
            rows,
            latency,
            batch_rows,
            model_version,
            model_age,
            model_rows,
            table_rows,
            model_loaded,
            stale,
            newest_on_disk,
            uptime,
        }
    }

    /// Counts one answered prediction request (`rows` and `seconds` only for 200).
    pub fn predict(&self, answer: PredictAnswer, rows: usize, seconds: f64) {
        self.requests
            .get_or_create(&labels("predict", answer.code()))
            .inc();
        if answer == PredictAnswer::Ok {
            self.rows.inc_by(rows as u64);
            self.batch_rows.observe(rows as f64);
            self.latency.observe(seconds);
        } else {
            self.errors.inc();
        }
    }

    /// Counts one response by its HTTP status.
    pub fn response(&self, status: u16) {
        self.responses
            .get_or_create(&[("code", status.to_string())])
            .inc();
    }

    /// Counts one answered `POST /v1/rollback` or `POST /v1/unpin` (`endpoint`).
    pub fn admin_request(&self, endpoint: &'static str, code: &'static str) {
        self.requests.get_or_create(&labels(endpoint, code)).inc();
    }

    /// Pre-creates the 401 series of the routes that require a token (all 0 until one is
    /// refused).
    pub fn expect_refusals(&self) {
        for endpoint in ["predict", "model", "metrics", "rollback", "unpin"] {
            let _ = self.requests.get_or_create(&labels(endpoint, "401"));
        }
    }

    /// Counts one request refused with 401 on `endpoint` (`predict`, `model`, `metrics`,
    /// `rollback` or `unpin`).
    pub fn unauthorized(&self, endpoint: &'static str) {
        if endpoint == "predict" {
            self.predict(PredictAnswer::Unauthorized, 0, 0.0);
        } else {
            self.requests.get_or_create(&labels(endpoint, "401")).inc();
        }
    }

    /// Counts one `GET /v1/model`.
    pub fn model_request(&self) {
        self.requests.get_or_create(&labels("model", "200")).inc();
    }

    /// The Prometheus text exposition, with the model gauges read from `handle` now.
    pub fn render(&self, handle: &ModelHandle) -> String {
        let status = handle.status();
        match handle.current() {
            Some(snap) => {
                self.model_loaded.set(1);
                self.model_version.set(snap.version() as i64);
                self.model_age.set(age_seconds(snap.created_unix_ms()));
                self.model_rows
                    .set(sparta_core::SparseStore::table_rows(snap.tables()) as i64);
                let f = &snap.job().features;
                for t in &f.tables {
                    let stored_in = &f.physical[t.physical].config.name;
                    let rows = snap
                        .tables()
                        .by_name(stored_in)
                        .map_or(0, |m| m.rows_of_tag(t.tag));
                    self.table_rows
                        .get_or_create(&vec![("table".to_string(), t.name.clone())])
                        .set(rows as i64);
                }
            }
            None => {
                self.model_loaded.set(0);
                self.model_version.set(0);
                self.model_age.set(0.0);
                self.model_rows.set(0);
            }
        }
        self.pinned_version
            .set(handle.pinned().map_or(0, |v| v as i64));
        self.stale.set(i64::from(status.stale.is_some()));
        self.newest_on_disk.set(status.newest_on_disk as i64);
        self.uptime.set(self.started.elapsed().as_secs_f64());
        let mut s = String::new();
        prometheus_text::encode(&mut s, &self.registry).expect("writing to a String");
        s
    }
}

/// Seconds since `created_unix_ms`.
pub fn age_seconds(created_unix_ms: u64) -> f64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    now.saturating_sub(created_unix_ms) as f64 / 1e3
}
