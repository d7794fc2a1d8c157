//! The Grafana dashboard shipped in `deploy/grafana/sparta-dashboard.json`: every metric its
//! queries name is one a Sparta process exposes (PS, worker, embedded trainer, coordinator,
//! serving, launcher), so a renamed metric fails here instead of leaving a panel empty.

use std::collections::BTreeSet;
use std::path::Path;

use sparta_proto::metrics::Metrics;
use sparta_proto::training_metrics::{ProgressiveStatus, TrainingStatus};

/// The sample names of an exposition (`name{labels} value` and `name value` lines).
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l[..l.find(['{', ' ']).unwrap_or(l.len())].to_string())
        .collect()
}

/// Every sample name the processes expose, the labelled families filled in once each (they
/// appear only after a first value).
fn exposed() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for role in ["ps", "worker", "train", "coordinator"] {
        let m = Metrics::new(role);
        m.set_kafka("clicks", &[(0, 1)], 1);
        m.set_table_rows("embedding", 1);
        m.set_table_bytes("embedding", 1);
        m.set_evicted_rows("embedding", "idle_steps", 1);
        m.set_training(&TrainingStatus {
            progressive: vec![ProgressiveStatus {
                task: "ctr".into(),
                over: "window",
                auc: 0.7,
                logloss: 0.5,
                calibration: 1.0,
                gauc: Some(0.6),
                rows: 1,
            }],
            ..TrainingStatus::default()
        });
        names.extend(sample_names(&m.render()));
    }
    let dir = tempfile::tempdir().unwrap();
    let handle = sparta_serve::ModelHandle::open(dir.path()).unwrap();
    let serve = sparta_serve::metrics::ServeMetrics::new(&handle);
    serve.response(200);
    names.extend(sample_names(&serve.render(&handle)));
    // `sparta launch --metrics-listen` adds it to its children's merged exposition.
    names.insert("sparta_launch_child_up".into());
    names
}

/// Every `sparta_...` metric name in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("sparta_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn every_dashboard_query_names_a_metric_sparta_exposes() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/sparta-dashboard.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let exposed = exposed();
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut checked = 0;
    for p in panels {
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{expr} names no sparta metric");
            for n in names {
                assert!(
                    exposed.contains(&n),
                    "panel {}: {n} is exposed by no Sparta process (query {expr})",
                    p["title"]
                );
                checked += 1;
            }
        }
    }
    // The gauges of the trainers are on the board.
    for n in [
        "sparta_train_step",
        "sparta_train_samples_total",
        "sparta_train_loss",
        "sparta_progressive_auc",
        "sparta_last_checkpoint_timestamp_seconds",
        "sparta_last_export_version",
        "sparta_kafka_lag_records",
        "sparta_serve_responses_total",
    ] {
        let on_board = panels.iter().any(|p| {
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| metric_names(t["expr"].as_str().unwrap()).contains(&n.to_string()))
        });
        assert!(on_board, "{n} is on no panel");
    }
    assert!(checked > 0);
}
