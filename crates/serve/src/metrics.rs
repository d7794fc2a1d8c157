//! Prometheus text metrics of the prediction server (hand-rolled, like `sparta ps`'s: atomic
//! counters and fixed-bucket histograms, no global registry).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Upper bounds of the latency buckets, seconds.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 10.0,
];
/// Upper bounds of the rows-per-request buckets.
const ROW_BUCKETS: [f64; 8] = [1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0];

/// A cumulative histogram with fixed buckets.
pub struct Histogram<const N: usize> {
    bounds: [f64; N],
    counts: [AtomicU64; N],
    over: AtomicU64,
    /// Sum of observations, in millionths.
    sum_micro: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: [f64; N]) -> Self {
        Self {
            bounds,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            over: AtomicU64::new(0),
            sum_micro: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, x: f64) {
        match self.bounds.iter().position(|&b| x <= b) {
            Some(i) => self.counts[i].fetch_add(1, Relaxed),
            None => self.over.fetch_add(1, Relaxed),
        };
        self.sum_micro.fetch_add((x * 1e6) as u64, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum::<u64>() + self.over.load(Relaxed)
    }

    fn render(&self, s: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c.load(Relaxed);
            let _ = writeln!(s, "{name}_bucket{{{labels}le=\"{b}\"}} {cum}");
        }
        let inner = labels.trim_end_matches(',');
        let braces = if inner.is_empty() {
            String::new()
        } else {
            format!("{{{inner}}}")
        };
        let _ = writeln!(
            s,
            "{name}_bucket{{{labels}le=\"+Inf\"}} {}\n{name}_sum{braces} {}\n{name}_count{braces} {}",
            self.count(),
            self.sum_micro.load(Relaxed) as f64 / 1e6,
            self.count()
        );
    }
}

/// Counters of one server.
pub struct ServeMetrics {
    started: Instant,
    /// Prediction requests answered 200.
    pub predict_ok: AtomicU64,
    /// Prediction requests answered 400.
    pub predict_bad_request: AtomicU64,
    /// Prediction requests answered 413.
    pub predict_too_large: AtomicU64,
    /// Rows scored.
    pub rows: AtomicU64,
    /// Latency of answered prediction requests (parse + score + encode).
    pub latency: Histogram<16>,
    /// Rows per scored request.
    pub batch_rows: Histogram<8>,
    /// `GET /v1/model` requests.
    pub model_requests: AtomicU64,
}

impl Default for ServeMetrics {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            predict_ok: AtomicU64::new(0),
            predict_bad_request: AtomicU64::new(0),
            predict_too_large: AtomicU64::new(0),
            rows: AtomicU64::new(0),
            latency: Histogram::new(LATENCY_BUCKETS),
            batch_rows: Histogram::new(ROW_BUCKETS),
            model_requests: AtomicU64::new(0),
        }
    }
}

/// Model facts shown beside the counters.
pub struct ModelGauges {
    /// Live version.
    pub version: u64,
    /// Seconds since the live version was exported.
    pub age_seconds: f64,
    /// Rows over all tables.
    pub rows: u64,
    /// Versions installed since start.
    pub reloads: u64,
    /// Failed polls since start.
    pub reload_errors: u64,
}

impl ServeMetrics {
    /// The Prometheus text exposition.
    pub fn render(&self, g: &ModelGauges) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# HELP sparta_serve_requests_total Prediction requests by answer.\n# TYPE sparta_serve_requests_total counter"
        );
        for (code, c) in [
            ("200", &self.predict_ok),
            ("400", &self.predict_bad_request),
            ("413", &self.predict_too_large),
        ] {
            let _ = writeln!(
                s,
                "sparta_serve_requests_total{{endpoint=\"predict\",code=\"{code}\"}} {}",
                c.load(Relaxed)
            );
        }
        let _ = writeln!(
            s,
            "sparta_serve_requests_total{{endpoint=\"model\",code=\"200\"}} {}",
            self.model_requests.load(Relaxed)
        );
        let errors = self.predict_bad_request.load(Relaxed) + self.predict_too_large.load(Relaxed);
        let _ = writeln!(
            s,
            "# HELP sparta_serve_errors_total Prediction requests refused.\n# TYPE sparta_serve_errors_total counter\nsparta_serve_errors_total {errors}"
        );
        let _ = writeln!(
            s,
            "# HELP sparta_serve_rows_total Rows scored.\n# TYPE sparta_serve_rows_total counter\nsparta_serve_rows_total {}",
            self.rows.load(Relaxed)
        );
        self.latency.render(
            &mut s,
            "sparta_serve_predict_latency_seconds",
            "Prediction request latency (parse, score, encode).",
            "",
        );
        self.batch_rows.render(
            &mut s,
            "sparta_serve_predict_rows",
            "Rows per prediction request.",
            "",
        );
        for (name, kind, help, v) in [
            (
                "model_version",
                "gauge",
                "Live export version.",
                g.version as f64,
            ),
            (
                "model_age_seconds",
                "gauge",
                "Seconds since the live version was exported.",
                g.age_seconds,
            ),
            (
                "model_rows",
                "gauge",
                "Rows over all tables.",
                g.rows as f64,
            ),
            (
                "model_reloads_total",
                "counter",
                "Versions installed since start.",
                g.reloads as f64,
            ),
            (
                "model_reload_errors_total",
                "counter",
                "Failed polls of the export directory.",
                g.reload_errors as f64,
            ),
            (
                "uptime_seconds",
                "gauge",
                "Seconds since the server started.",
                self.started.elapsed().as_secs_f64(),
            ),
        ] {
            let _ = writeln!(
                s,
                "# HELP sparta_serve_{name} {help}\n# TYPE sparta_serve_{name} {kind}\nsparta_serve_{name} {v}"
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let h = Histogram::new([1.0, 2.0]);
        for x in [0.5, 1.5, 1.7, 9.0] {
            h.observe(x);
        }
        let mut s = String::new();
        h.render(&mut s, "x", "help", "");
        assert!(s.contains("x_bucket{le=\"1\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"2\"} 3\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 4\n"), "{s}");
        assert!(s.contains("x_count 4"), "{s}");
    }
}
