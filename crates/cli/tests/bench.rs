//! `sparta bench train`: one JSON object with the machine's GEMM peak and, per model, the dense
//! step alone and the whole training loop, with figures that agree with each other.

mod common;

use common::{cmd, json, s};

#[test]
fn bench_train_reports_every_asked_model_against_the_gemm_peak() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench.json");
    let o = cmd(&["bench", "train", "--models", "wdl,esmm"])
        .args([
            "--rows",
            "3000",
            "--test-rows",
            "1000",
            "--batch-size",
            "256",
        ])
        .args(["--iters", "1", "--threads", "2"])
        .args(["--dir", s(dir.path()), "--out", s(&out)])
        .output()
        .unwrap();
    common::ok(&o, "bench train");
    let j = json(&out);
    // stdout holds the same object, and nothing else
    let printed: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout is JSON");
    assert_eq!(printed, j);
    let peaks = j["gemm_peak"].as_array().unwrap();
    assert_eq!(peaks.len(), 2, "{j}");
    let peak_2 = peaks[1]["gflops"].as_f64().unwrap();
    assert!(peak_2 > 0.0, "{j}");
    assert!(j["machine"]["cores"].as_u64().unwrap() >= 1, "{j}");
    let models = j["models"].as_array().unwrap();
    let names: Vec<&str> = models
        .iter()
        .map(|m| m["model"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["wdl", "esmm"]);
    for m in models {
        let loop_ = &m["training_loop"];
        assert_eq!(loop_["rows"], 3000, "{m}");
        assert_eq!(loop_["pipeline"], true, "{m}");
        let (sps, gflops) = (
            loop_["samples_per_sec"].as_f64().unwrap(),
            loop_["gflops"].as_f64().unwrap(),
        );
        let mflop = m["mflop_per_sample"].as_f64().unwrap();
        assert!(mflop > 0.1, "{m}");
        // GFLOP/s = samples/s x FLOPs per sample; % of peak against the 2-thread peak.
        assert!((gflops - sps * mflop / 1e3).abs() <= 1e-6 * gflops, "{m}");
        let pct = loop_["pct_of_peak"].as_f64().unwrap();
        assert!((pct - 100.0 * gflops / peak_2).abs() < 1e-6, "{m}");
        let step = &m["dense_step"];
        for t in ["threads_1", "threads_n"] {
            assert!(step[t]["samples_per_sec"].as_f64().unwrap() > 0.0, "{m}");
        }
    }
    // esmm trains on the rich profile with two tasks
    let esmm = &models[1]["test"];
    assert!(esmm["ctr"]["auc"].as_f64().is_some() && esmm["ctcvr"]["auc"].as_f64().is_some());
    // the generated data stays in --dir for the next run
    assert!(dir.path().join("rich.toml").exists());
}

#[test]
fn bench_train_refuses_an_unknown_model() {
    let o = cmd(&["bench", "train", "--models", "wdl,nope"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = common::stderr(&o);
    assert!(
        e.contains("--models \"nope\": expected some of wdl,"),
        "{e}"
    );
}
