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
fn progressive_validation_can_be_turned_off_in_the_job_config() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 3_000, 3);
    let cfg = dir.path().join("job.toml");
    std::fs::write(&cfg, "[metrics]\nprogressive = false\n").unwrap();
    let summary = dir.path().join("summary.json");
    let o = sparta(&[
        "train",
        "--config",
        s(&cfg),
        "--train",
        s(&train),
        "--quiet",
        "--summary-json",
        s(&summary),
    ]);
    ok(&o, "train with [metrics] progressive = false");
    let sum = json(&summary);
    assert!(sum.get("progressive").is_none_or(|p| p.is_null()), "{sum}");
    assert_eq!(sum["train_rows"], 3_000, "{sum}");
}

#[test]
fn eval_every_steps_needs_test_files() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 100, 4);
    let o = sparta(&["train", "--train", s(&train), "--eval-every-steps", "5"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--test"), "{}", stderr(&o));
}

/// The manifest of export `v` in `dir`: the JSON object between the file's binary envelope
/// header and trailer (the first `{` from which one whole object with a `version` parses:
/// a header or checksum byte may itself be a `{` or `}`).
fn manifest(dir: &std::path::Path, v: u64) -> serde_json::Value {
    let b = std::fs::read(dir.join(format!("v{v:010}")).join("manifest.json")).unwrap();
    (0..b.len())
        .filter(|&i| b[i] == b'{')
        .find_map(|i| {
            let mut values =
                serde_json::Deserializer::from_slice(&b[i..]).into_iter::<serde_json::Value>();
            values
                .next()
                .and_then(Result::ok)
                .filter(|m| m["version"] == v)
        })
        .unwrap_or_else(|| panic!("no manifest JSON in v{v}"))
}

/// A stream whose labels flip for a while: 30,000 rows, then 20,000 with every label flipped
/// (steps 118 to 196 at batch 256), then 60,000 as the first; and a job config with a window
/// of 2,000 rows and a gate on a 0.05 AUC drop. Returns the three files and the config.
fn flipped_stream(d: &std::path::Path) -> ([std::path::PathBuf; 3], std::path::PathBuf) {
    let data = |name: &str, rows: &str, seed: &str| {
        let p = d.join(name);
        let o = sparta(&["gen-data", "--rows", rows, "--seed", seed, "--out", s(&p)]);
        ok(&o, "gen-data");
        p
    };
    let a = data("a.tsv", "30000", "1");
    let b0 = data("b0.tsv", "20000", "2");
    let c = data("c.tsv", "60000", "3");
    let flipped: String = std::fs::read_to_string(&b0)
        .unwrap()
        .lines()
        .map(|l| {
            let (label, rest) = l.split_once('\t').unwrap();
            format!("{}\t{rest}\n", if label == "1" { "0" } else { "1" })
        })
        .collect();
    let b = d.join("b.tsv");
    std::fs::write(&b, flipped).unwrap();
    let config = d.join("job.toml");
    std::fs::write(
        &config,
        "[metrics]\nwindow = 2000\n[export]\ngate = { max_auc_drop = 0.05, min_rows = 1000 }\n\
         [data]\nbatch_size = 256\n",
    )
    .unwrap();
    ([a, b, c], config)
}

/// What a gated run on [`flipped_stream`] must show: exports held back while the labels were
/// flipped (the steps named by the log's "export at step N held back" lines, counted in the
/// summary), then published again, the last manifest carrying its window's metrics.
fn assert_gated(log: &str, summary: &serde_json::Value, exports: &std::path::Path) {
    let held: Vec<u64> = log
        .lines()
        .filter_map(|l| l.split("export at step ").nth(1))
        .filter_map(|r| r.split(" held back by the quality gate").next())
        .map(|n| n.parse().unwrap())
        .collect();
    let ex = &summary["exports"];
    assert_eq!(ex["held_back"], held.len() as u64, "{ex}\n{log}");
    assert!(
        held.iter().any(|s| (118..=196).contains(s)),
        "no export held back while the labels were flipped: {held:?}\n{log}"
    );
    // Publishing resumed: the last version was trained after the last one held back.
    let last = ex["last_version"].as_u64().unwrap();
    let m = manifest(exports, last);
    let step = m["step"].as_u64().unwrap();
    assert!(step > *held.iter().max().unwrap(), "{m}\n{held:?}");
    let q = &m["quality"];
    assert_eq!(q["window"], 2000, "{m}");
    let auc = q["tasks"][0]["auc"].as_f64().unwrap();
    assert!(auc > 0.6, "{q}");
}

/// The quality gate on [`flipped_stream`]: the window AUC (last 2,000 rows) collapses when
/// the flip starts and the exports there are held back (the served model stays at the last
/// good version); once the model fits the labels again, exports are published again, each
/// manifest carrying its window's metrics.
#[test]
fn a_gated_export_is_held_back_while_the_labels_are_flipped_and_publishing_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ([a, b, c], config) = flipped_stream(d);
    let exports = d.join("exp");
    let summary = d.join("summary.json");
    let o = common::cmd(&[
        "train",
        "--config",
        s(&config),
        "--train",
        s(&a),
        s(&b),
        s(&c),
        "--export-dir",
        s(&exports),
        "--export-every-steps",
        "20",
        "--summary-json",
        s(&summary),
        "--quiet",
    ])
    .output()
    .unwrap();
    ok(&o, "train with an export gate");
    assert_gated(&stderr(&o), &json(&summary), &exports);
}

/// The same gate on a PS cluster (2 shards, 1 worker: the same steps as embedded): worker 0
/// judges each export of a checkpoint round by its progressive window before the shards
/// write their parts; a held-back version is not written and the next one published is a
/// valid delta over the last published one (`sparta serve` loads the chain).
#[test]
fn a_gated_cluster_export_is_held_back_while_the_labels_are_flipped_and_publishing_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ([a, b, c], config) = flipped_stream(d);
    let exports = d.join("exp");
    let summary = d.join("summary.json");
    let o = common::cmd(&[
        "launch",
        "--ps",
        "2",
        "--workers",
        "1",
        "--config",
        s(&config),
        "--train",
        s(&a),
        s(&b),
        s(&c),
        "--checkpoint-dir",
        s(&d.join("ckpt")),
        "--checkpoint-every-steps",
        "20",
        "--export-dir",
        s(&exports),
        "--export-every-steps",
        "20",
        "--summary-json",
        s(&summary),
        "--quiet",
    ])
    .output()
    .unwrap();
    ok(&o, "launch with an export gate");
    let log = stderr(&o) + &String::from_utf8_lossy(&o.stdout);
    assert_gated(&log, &json(&summary), &exports);
    // The chain stays valid across the versions held back: the predictions of the last
    // version load from it.
    let preds = d.join("preds.tsv");
    let p = sparta(&[
        "predict",
        "--model",
        s(&exports),
        "--input",
        s(&c),
        "--out",
        s(&preds),
    ]);
    ok(&p, "predict from the gated cluster export chain");
    let warned = stderr(&p);
    assert!(
        !warned.contains("although versions up to"),
        "the chain broke at a version held back: {warned}"
    );
}
