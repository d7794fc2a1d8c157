//! "See the model learn" on the real binary: `sparta train` reports progressive validation
//! (each batch scored before the model trains on it) in its summary and progress lines, and
//! evaluates on `--test` during training with `--eval-every-steps`.

mod common;

use common::{gen, json, ok, s, sparta, stderr};

#[test]
fn train_reports_progressive_metrics_and_evaluations_during_training() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 6_000, 1);
    let test = gen(dir.path(), "test.tsv", 1_000, 2);
    let summary = dir.path().join("summary.json");
    let o = common::cmd(&[
        "train",
        "--train",
        s(&train),
        "--test",
        s(&test),
        "--batch-size",
        "200",
        "--threads",
        "1",
        "--eval-every-steps",
        "10",
        "--progress-every-secs",
        "0.000001",
        "--summary-json",
        s(&summary),
    ])
    .env("RUST_LOG", "info")
    .output()
    .unwrap();
    ok(&o, "train with --eval-every-steps");
    let sum = json(&summary);
    assert_eq!(sum["steps"], 30, "{sum}");

    // Progressive validation: the default window (100000 rows) holds the whole run.
    let p = &sum["progressive"];
    assert_eq!(p["window"], 100_000, "{p}");
    assert_eq!(p["step"], 30, "{p}");
    let task = &p["tasks"][0];
    assert_eq!(task["task"], "ctr", "{p}");
    for part in ["window", "cumulative"] {
        let m = &task[part];
        assert_eq!(m["rows"], 6_000, "{part}: {m}");
        let auc = m["auc"].as_f64().unwrap_or(f64::NAN);
        assert!(auc > 0.5 && auc <= 1.0, "{part} AUC {auc}: {m}");
        assert!(m["logloss"].as_f64().is_some_and(f64::is_finite), "{m}");
        assert!(m["calibration"].as_f64().is_some_and(f64::is_finite), "{m}");
    }

    // One evaluation after steps 10, 20 and 30, each on the whole test set.
    let evals = sum["evaluations"].as_array().expect("evaluations");
    let steps: Vec<u64> = evals.iter().map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![10, 20, 30], "{sum}");
    for e in evals {
        assert_eq!(e["rows"], 1_000, "{e}");
        assert!(
            e["auc"].as_f64().is_some_and(|a| a > 0.5 && a <= 1.0),
            "{e}"
        );
    }
    // The last one scored the final model, as the final evaluation did.
    assert_eq!(evals[2]["auc"], sum["test_auc"], "{sum}");

    // Logged: a line per evaluation, and progress lines with the window's metrics.
    let err = stderr(&o);
    assert_eq!(err.matches("evaluation after step").count(), 3, "{err}");
    assert!(err.contains("window auc"), "{err}");
}

#[test]
fn the_metrics_window_comes_from_the_job_config() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 3_000, 3);
    let cfg = dir.path().join("job.toml");
    std::fs::write(&cfg, "[metrics]\nwindow = 500\n").unwrap();
    let summary = dir.path().join("summary.json");
    let o = sparta(&[
        "train",
        "--config",
        s(&cfg),
        "--train",
        s(&train),
        "--batch-size",
        "200",
        "--threads",
        "1",
        "--quiet",
        "--summary-json",
        s(&summary),
    ]);
    ok(&o, "train with [metrics] window");
    let sum = json(&summary);
    let p = &sum["progressive"];
    assert_eq!(p["window"], 500, "{p}");
    assert_eq!(p["tasks"][0]["window"]["rows"], 500, "{p}");
    assert_eq!(p["tasks"][0]["cumulative"]["rows"], 3_000, "{p}");
    assert!(sum.get("evaluations").is_none(), "{sum}");

    std::fs::write(&cfg, "[metrics]\nwindow = 0\n").unwrap();
    let o = sparta(&[
        "train",
        "--config",
        s(&cfg),
        "--train",
        s(&train),
        "--quiet",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("metrics.window"), "{}", stderr(&o));
}

#[test]
fn eval_every_steps_needs_test_files() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 100, 4);
    let o = sparta(&["train", "--train", s(&train), "--eval-every-steps", "5"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--test"), "{}", stderr(&o));
}
