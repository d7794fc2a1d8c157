//! End to end with the real binary: train with checkpoints and exports every few steps
//! (`--export-dir`: full + deltas), `sparta export` from the checkpoint, then
//! `sparta predict` on both == `sparta serve` == the trainer's own predictions (to 1e-6).

mod common;

use std::time::Duration;

use common::{gen, ok, sparta};

fn parse_probs(text: &str) -> Vec<f32> {
    text.lines().map(|l| l.parse().unwrap()).collect()
}

#[test]
fn predict_serve_and_trainer_agree() {
    agree("wdl");
}

#[test]
fn predict_serve_and_trainer_agree_on_dcnv2_and_dlrm() {
    agree("dcnv2");
    agree("dlrm");
}

/// A `model` job's checkpoint exported, its training-time exports, `sparta predict`, `sparta
/// serve` and the trainer itself all give the same probabilities (to 1e-6).
fn agree(model: &str) {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 4000, 1);
    let test = gen(dir.path(), "test.tsv", 600, 2);
    let ckpt = dir.path().join("ckpt");
    let export = dir.path().join("export");
    let train_export = dir.path().join("train-export");
    ok(
        &sparta(&[
            "train",
            "--model",
            model,
            "--train",
            train.to_str().unwrap(),
            "--batch-size",
            "256",
            "--threads",
            "1",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
            "--export-dir",
            train_export.to_str().unwrap(),
            "--export-every-steps",
            "4",
            "--quiet",
        ]),
        "train",
    );
    let o = sparta(&[
        "export",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--out",
        export.to_str().unwrap(),
    ]);
    ok(&o, "export");
    assert!(String::from_utf8_lossy(&o.stdout).contains("as version 1"));

    // Offline scores, with one malformed line in the middle (kept aligned as nan).
    let text = std::fs::read_to_string(&test).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut with_bad: Vec<&str> = lines.clone();
    with_bad.insert(100, "1\tnot enough columns");
    let input = dir.path().join("input.tsv");
    std::fs::write(&input, with_bad.join("\n") + "\n").unwrap();
    let preds = dir.path().join("preds.txt");
    let o = sparta(&[
        "predict",
        "--model",
        export.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--out",
        preds.to_str().unwrap(),
    ]);
    ok(&o, "predict");
    assert!(String::from_utf8_lossy(&o.stderr).contains("1 malformed"));
    let mut offline = parse_probs(&std::fs::read_to_string(&preds).unwrap());
    assert_eq!(offline.len(), lines.len() + 1);
    assert!(offline.remove(100).is_nan());
    assert!(offline.iter().all(|p| (0.0..=1.0).contains(p)));

    // The exports written while training (a full one, then deltas) end at the same model.
    let versions = std::fs::read_dir(&train_export).unwrap().count();
    assert!(versions > 2, "{versions} versions in the training export");
    let preds2 = dir.path().join("preds2.txt");
    ok(
        &sparta(&[
            "predict",
            "--model",
            train_export.to_str().unwrap(),
            "--input",
            test.to_str().unwrap(),
            "--out",
            preds2.to_str().unwrap(),
        ]),
        "predict on the training export",
    );
    let chained = parse_probs(&std::fs::read_to_string(&preds2).unwrap());
    assert_eq!(chained.len(), offline.len());
    for (i, (a, b)) in chained.iter().zip(&offline).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6,
            "line {i}: full+deltas {a}, checkpoint export {b}"
        );
    }

    // The trainer's own predictions, from the state it checkpointed.
    let trained = common::trainer_scores(&ckpt, &test);
    assert_eq!(trained.len(), offline.len());
    for (i, (a, b)) in trained.iter().zip(&offline).enumerate() {
        assert!((a - b).abs() <= 1e-6, "line {i}: trainer {a}, predict {b}");
    }

    // The server's answers, in batches of 100 lines.
    let (_server, addr) = common::serve(&export, 100, Duration::from_secs(60));
    let mut served = Vec::new();
    for chunk in lines.chunks(100) {
        let body = serde_json::json!({ "tsv": chunk }).to_string();
        let (code, text) = common::http::post(addr, "/v1/predict", &body);
        assert_eq!(code, 200, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["version"], 1);
        served.extend(
            v["probabilities"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_f64().unwrap() as f32),
        );
    }
    assert_eq!(served.len(), offline.len());
    for (i, (a, b)) in served.iter().zip(&offline).enumerate() {
        assert!((a - b).abs() <= 1e-6, "line {i}: served {a}, predict {b}");
    }
    let (code, text) = common::http::post(addr, "/v1/predict", "{\"tsv\": [\"1\\t2\"]}");
    assert_eq!(code, 400, "{text}");
}
