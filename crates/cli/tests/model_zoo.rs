//! din, mmoe and esmm end to end on `sparta gen-data --profile rich` rows (a click label, a
//! conversion label after the click, a behaviour history with its categories): each trains
//! embedded and on a 2 PS + 2 worker cluster to the same AUC, resumes exactly from a
//! checkpoint, and scores the same through its export (`sparta predict`, `sparta serve`) as
//! in the trainer. Plus sample weights and the multi-task refusals.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cmd, gen_rich, json, ok, rich_toml, s, sparta, Proc};

/// Batches of 256, one compute and reader thread, seed 7, 1 epoch.
const FLAGS: [&str; 10] = [
    "--batch-size",
    "256",
    "--threads",
    "1",
    "--reader-threads",
    "1",
    "--seed",
    "7",
    "--epochs",
    "1",
];

/// The flags that make `model` a job on the rich profile.
fn model_flags(model: &str) -> Vec<&'static str> {
    match model {
        "din" => vec!["--model", "din"],
        "mmoe" => vec![
            "--model",
            "mmoe",
            "--task",
            "ctr=label",
            "--task",
            "ctcvr=conversion",
        ],
        "esmm" => vec![
            "--model",
            "esmm",
            "--task",
            "ctr=label",
            "--task",
            "ctcvr=conversion,after=ctr",
        ],
        other => panic!("no flags for {other}"),
    }
}

struct Data {
    _dir: tempfile::TempDir,
    train: PathBuf,
    test: PathBuf,
}

fn data(train_rows: u64, test_rows: u64) -> Data {
    let dir = tempfile::tempdir().unwrap();
    let train = gen_rich(dir.path(), "train.tsv", train_rows, 1);
    let test = gen_rich(dir.path(), "test.tsv", test_rows, 2);
    Data {
        _dir: dir,
        train,
        test,
    }
}

/// `sparta train` of `model` with `extra` flags; returns its summary.
fn train(d: &Data, dir: &Path, model: &str, extra: &[&str]) -> serde_json::Value {
    let out = dir.join(format!("{model}-{}.json", extra.len()));
    // FLAGS, less the batch size when `extra` sets its own
    let own_batch = extra.contains(&"--batch-size");
    let flags = FLAGS
        .chunks(2)
        .filter(|f| !(own_batch && f[0] == "--batch-size"));
    let o = cmd(&["train", "--config", s(&rich_toml())])
        .args(flags.flatten())
        .args(model_flags(model))
        .args(extra)
        .args(["--train", s(&d.train), "--test", s(&d.test), "--quiet"])
        .args(["--summary-json", s(&out)])
        .output()
        .unwrap();
    ok(&o, model);
    json(&out)
}

/// The AUC of `task` in a summary (the `test_auc` of a single-task job).
fn auc(j: &serde_json::Value, task: &str) -> f64 {
    match j.get("test_tasks") {
        Some(t) => t[task]["auc"].as_f64().unwrap(),
        None => j["test_auc"].as_f64().unwrap(),
    }
}

#[test]
fn din_mmoe_and_esmm_learn_the_generated_clicks_and_conversions() {
    let d = data(30_000, 6_000);
    let dir = tempfile::tempdir().unwrap();
    let din = train(&d, dir.path(), "din", &[]);
    let mmoe = train(&d, dir.path(), "mmoe", &[]);
    let esmm = train(&d, dir.path(), "esmm", &[]);
    let (din_auc, m_ctr, m_cvr, e_ctr, e_cvr) = (
        auc(&din, "ctr"),
        auc(&mmoe, "ctr"),
        auc(&mmoe, "ctcvr"),
        auc(&esmm, "ctr"),
        auc(&esmm, "ctcvr"),
    );
    eprintln!(
        "din {din_auc:.4}; mmoe ctr {m_ctr:.4} ctcvr {m_cvr:.4}; esmm ctr {e_ctr:.4} ctcvr {e_cvr:.4}"
    );
    for (what, a) in [
        ("din", din_auc),
        ("mmoe ctr", m_ctr),
        ("mmoe ctcvr", m_cvr),
        ("esmm ctr", e_ctr),
        ("esmm ctcvr", e_cvr),
    ] {
        assert!(a > 0.62, "{what}: test AUC {a}");
    }
    // Every task reports its metrics; the CTCVR target is rarer than the click.
    let t = &esmm["test_tasks"];
    assert!(
        t["ctcvr"]["positive_rate"].as_f64().unwrap() < t["ctr"]["positive_rate"].as_f64().unwrap()
    );
    assert!(t["ctr"]["logloss"].as_f64().unwrap().is_finite());
}

/// A 2 PS + 2 worker sync cluster trains `model` to the embedded AUC within 0.003 on every
/// task, the embedded run seeing the rows in the cluster's order (batches of 512 = one batch of
/// 256 from each worker's half). In file order the conversion task (CTCVR) differs by ~0.007
/// (measured on esmm over 3 seeds, cluster ahead): one epoch remembers the last rows it saw best,
/// and the cluster's last rows are both halves' ends.
fn cluster_matches_embedded(model: &str, tasks: &[&str]) {
    let d = data(60_000, 10_000);
    let dir = tempfile::tempdir().unwrap();
    let ordered = dir.path().join("cluster-order.tsv");
    common::cluster_order(&d.train, 256, &ordered);
    let same_order = Data {
        _dir: tempfile::tempdir().unwrap(),
        train: ordered,
        test: d.test.clone(),
    };
    // The sequential loop, as a sync cluster runs.
    let emb = train(
        &same_order,
        dir.path(),
        model,
        &["--exact", "--batch-size", "512"],
    );
    let out = dir.path().join("cluster.json");
    let mut c = cmd(&["launch", "--ps", "2", "--workers", "2", "--mode", "sync"]);
    c.args(["--config", s(&rich_toml())])
        .args(FLAGS)
        .args(model_flags(model))
        .args(["--train", s(&d.train), "--test", s(&d.test), "--quiet"])
        .args(["--summary-json", s(&out)]);
    let (good, log) = Proc::start(c).wait(Duration::from_secs(500));
    assert!(good, "{log}");
    let j = json(&out);
    for task in tasks {
        let (a, b) = (auc(&emb, task), auc(&j, task));
        eprintln!("{model} {task}: embedded AUC {a:.5}, 2 PS + 2 workers {b:.5}");
        assert!(
            (a - b).abs() < 0.003,
            "{model} {task}: cluster {b} vs embedded {a}"
        );
    }
}

#[test]
fn din_on_a_cluster_matches_embedded() {
    cluster_matches_embedded("din", &["ctr"]);
}

#[test]
fn mmoe_on_a_cluster_matches_embedded() {
    cluster_matches_embedded("mmoe", &["ctr", "ctcvr"]);
}

#[test]
fn esmm_on_a_cluster_matches_embedded() {
    cluster_matches_embedded("esmm", &["ctr", "ctcvr"]);
}

/// Interrupted after 12 steps (checkpoints every 5) and resumed, `model` ends exactly as one
/// uninterrupted run: the same metrics, bit for bit (the sequential loop, `--exact`: a
/// pipelined run resumes exactly only from its checkpoint steps).
fn resumes_exactly(d: &Data, model: &str) {
    let dir = tempfile::tempdir().unwrap();
    let whole = train(d, dir.path(), model, &["--exact"]);
    let ckpt = dir.path().join("ckpt");
    let ck = [
        "--exact",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every-steps",
        "5",
    ];
    let mut first: Vec<&str> = ck.to_vec();
    first.extend(["--max-rows", "3072"]);
    train(d, dir.path(), model, &first);
    let resumed = train(
        d,
        dir.path(),
        model,
        &[
            "--exact",
            "--resume",
            s(&ckpt),
            "--checkpoint-every-steps",
            "5",
        ],
    );
    assert!(resumed["resumed_from"].is_string(), "{resumed}");
    for key in ["test_auc", "test_logloss", "test_tasks"] {
        assert_eq!(resumed[key], whole[key], "{model}: {key} after resume");
    }
}

#[test]
fn din_mmoe_and_esmm_resume_exactly() {
    let d = data(8_000, 2_000);
    for model in ["din", "mmoe", "esmm"] {
        resumes_exactly(&d, model);
    }
}

/// Each line's probabilities (tab-separated, one per task).
fn parse_rows(text: &str) -> Vec<Vec<f32>> {
    text.lines()
        .map(|l| l.split('\t').map(|x| x.parse().unwrap()).collect())
        .collect()
}

/// The trainer's `--predict-out`, `sparta predict` on its export and `sparta serve` give the
/// same probabilities per task (to 1e-6); a multi-task answer names its tasks.
fn agree(d: &Data, model: &str, tasks: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    let trained = dir.path().join("trained.txt");
    train(
        d,
        dir.path(),
        model,
        &[
            "--export-dir",
            s(&export),
            "--predict-input",
            s(&d.test),
            "--predict-out",
            s(&trained),
        ],
    );
    let trained = parse_rows(&std::fs::read_to_string(&trained).unwrap());
    let preds = dir.path().join("preds.txt");
    let o = sparta(&[
        "predict",
        "--model",
        s(&export),
        "--input",
        s(&d.test),
        "--out",
        s(&preds),
    ]);
    ok(&o, "predict");
    let offline = parse_rows(&std::fs::read_to_string(&preds).unwrap());
    assert_eq!(offline.len(), trained.len());
    for (i, (a, b)) in offline.iter().zip(&trained).enumerate() {
        assert_eq!(a.len(), tasks.len(), "line {i}: {a:?}");
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-6,
                "{model} line {i}: predict {a:?}, trainer {b:?}"
            );
        }
    }
    if model == "esmm" {
        // pCTCVR = pCTR x pCVR never exceeds pCTR
        assert!(offline.iter().all(|r| r[1] <= r[0]));
    }
    let text = std::fs::read_to_string(&d.test).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (_server, addr) = common::serve(&export, 100, Duration::from_secs(60));
    let mut served: Vec<Vec<f32>> = Vec::new();
    for chunk in lines.chunks(200) {
        let body = serde_json::json!({ "tsv": chunk }).to_string();
        let (code, text) = common::http::post(addr, "/v1/predict", &body);
        assert_eq!(code, 200, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let p = &v["probabilities"];
        let col = |t: &str| -> Vec<f32> {
            let list = if tasks.len() == 1 { p } else { &p[t] };
            list.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        };
        let cols: Vec<Vec<f32>> = tasks.iter().map(|t| col(t)).collect();
        for r in 0..chunk.len() {
            served.push(cols.iter().map(|c| c[r]).collect());
        }
    }
    assert_eq!(served.len(), offline.len());
    for (i, (a, b)) in served.iter().zip(&offline).enumerate() {
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-6,
                "{model} line {i}: served {a:?}, predict {b:?}"
            );
        }
    }
}

#[test]
fn din_mmoe_and_esmm_score_the_same_in_the_trainer_predict_and_serve() {
    let d = data(6_000, 1_000);
    agree(&d, "din", &["ctr"]);
    agree(&d, "mmoe", &["ctr", "ctcvr"]);
    agree(&d, "esmm", &["ctr", "ctcvr"]);
}

#[test]
fn multi_task_jobs_are_checked_against_the_schema_and_the_model() {
    let d = data(500, 100);
    let refused = |args: &[&str], want: &str| {
        let o = cmd(&["train", "--config", s(&rich_toml())])
            .args(args)
            .args(["--train", s(&d.train)])
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?} was accepted");
        let e = common::stderr(&o);
        assert!(e.contains(want), "{args:?}: {e}");
    };
    refused(&["--model", "esmm"], "needs two [[tasks]]");
    refused(
        &[
            "--model",
            "mmoe",
            "--task",
            "ctr=label",
            "--task",
            "ctcvr=bought",
        ],
        "label = \"bought\" is not a label column of the schema (label columns: label, conversion)",
    );
    refused(
        &[
            "--model",
            "wdl",
            "--task",
            "ctr=label",
            "--task",
            "ctcvr=conversion",
        ],
        "learns one objective",
    );
    refused(
        &[
            "--model",
            "esmm",
            "--task",
            "ctr=label",
            "--task",
            "ctcvr=conversion",
        ],
        "needs after = \"ctr\"",
    );
    refused(
        &["--model", "mmoe", "--task", "ctr"],
        "expected NAME=LABEL first",
    );
}

/// Sample weights: a `weight` column counts a row as often as its weight, in the metrics and
/// in training. Metrics: a test file whose rows carry weights 0, 1, 2, 3 scores as the file
/// with each row repeated that many times. Training (the sequential loop, batches of 256):
/// pairs of identical rows at weights 2 and 0 train as the same pairs at weights 1 and 1 (the
/// same rows in the same batches, so the same ids, batch sizes and loss denominators).
#[test]
fn a_weight_column_counts_a_row_as_often_as_its_weight() {
    let dir = tempfile::tempdir().unwrap();
    let train_f = common::gen(dir.path(), "train.tsv", 6000, 1);
    let test_f = common::gen(dir.path(), "test.tsv", 2000, 2);
    let train_text = std::fs::read_to_string(&train_f).unwrap();
    let test_text = std::fs::read_to_string(&test_f).unwrap();
    // The Criteo layout plus a weight column at the end.
    let write = |name: &str, rows: Vec<String>| {
        let p = dir.path().join(name);
        std::fs::write(&p, rows.concat()).unwrap();
        p
    };
    let mut cols = vec!["{ name = \"label\", kind = \"label\" }".to_string()];
    cols.extend((1..=13).map(|i| format!("{{ name = \"I{i}\", kind = \"dense\" }}")));
    cols.extend((1..=26).map(|i| format!("{{ name = \"C{i}\", kind = \"sparse\" }}")));
    cols.push("{ name = \"w\", kind = \"weight\" }".into());
    let cfg = dir.path().join("weighted.toml");
    std::fs::write(
        &cfg,
        format!(
            "[data]\nformat = \"custom\"\n[data.schema]\nseparator = \"\\t\"\nheader = false\n\
             columns = [{}]\n",
            cols.join(", ")
        ),
    )
    .unwrap();
    let run = |train: &Path, test: &Path, name: &str| {
        let out = dir.path().join(format!("{name}.json"));
        let o = cmd(&["train", "--exact", "--config", s(&cfg)])
            .args(FLAGS)
            .args(["--train", s(train), "--test", s(test), "--quiet"])
            .args(["--summary-json", s(&out)])
            .output()
            .unwrap();
        ok(&o, name);
        json(&out)
    };
    let metrics = [
        "test_auc",
        "test_logloss",
        "test_positive_rate",
        "test_calibration",
    ];

    // Metrics: weight k == k copies (rows with weight 0 left out entirely).
    let ones: Vec<String> = train_text.lines().map(|l| format!("{l}\t1\n")).collect();
    let ones = write("ones.tsv", ones);
    let weighted_test: Vec<String> = test_text
        .lines()
        .enumerate()
        .map(|(i, l)| format!("{l}\t{}\n", i % 4))
        .collect();
    let repeated_test: Vec<String> = test_text
        .lines()
        .enumerate()
        .flat_map(|(i, l)| std::iter::repeat_n(format!("{l}\t1\n"), i % 4))
        .collect();
    let a = run(&ones, &write("test-w.tsv", weighted_test), "test-weighted");
    let b = run(
        &ones,
        &write("test-rep.tsv", repeated_test),
        "test-repeated",
    );
    assert_eq!(a["train_loss"], b["train_loss"], "the same training");
    // (to 1e-6: the rows are scored in other batches, which may round differently)
    for key in metrics {
        let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
        eprintln!("{key}: weights {x}, repeated rows {y}");
        assert!(
            (x - y).abs() < 1e-6,
            "{key}: weights {x}, repeated rows {y}"
        );
    }

    // Training: each row twice, at weights (2, 0) or (1, 1).
    let pairs = |w: [u32; 2]| -> Vec<String> {
        train_text
            .lines()
            .flat_map(|l| w.map(|w| format!("{l}\t{w}\n")))
            .collect()
    };
    let test_ones: Vec<String> = test_text.lines().map(|l| format!("{l}\t1\n")).collect();
    let test_ones = write("test-ones.tsv", test_ones);
    let w = run(
        &write("pairs-2-0.tsv", pairs([2, 0])),
        &test_ones,
        "pairs-2-0",
    );
    let d = run(
        &write("pairs-1-1.tsv", pairs([1, 1])),
        &test_ones,
        "pairs-1-1",
    );
    assert_eq!(w["table_rows"], d["table_rows"], "the same ids");
    // Within 1e-6, not bit for bit: a batch's gradient sums `2g + 0` where the other sums
    // `g + g`, which round differently inside the GEMMs (measured: AUC equal, logloss 1.7e-9
    // apart; both runs are deterministic, the difference is the same in every run).
    for key in metrics.into_iter().chain(["train_loss"]) {
        let (x, y) = (w[key].as_f64().unwrap(), d[key].as_f64().unwrap());
        eprintln!("{key}: weight 2 {x}, two rows {y}");
        assert!((x - y).abs() < 1e-6, "{key}: weight 2 {x}, two rows {y}");
    }
}
