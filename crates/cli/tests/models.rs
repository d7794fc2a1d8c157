//! The dense models end to end on `sparta gen-data` rows: `sparta train` with dcnv2 and dlrm
//! (and dcn as the baseline) reaching a useful AUC, wdl, dcn, dcnv2 and dlrm each on
//! a 2 PS + 2 worker cluster at the embedded AUC, and GAUC by a feature checked by
//! hand. (din, mmoe and esmm: `model_zoo.rs`.)

mod common;

use std::path::Path;

use common::{cmd, gen_split, json, s, TRAIN_FLAGS};

/// `sparta train` with `extra` flags; returns the test AUC from its summary.
fn train_auc(dir: &Path, train: &Path, test: &Path, name: &str, extra: &[&str]) -> f64 {
    let out = dir.join(format!("{name}.json"));
    let o = cmd(&["train"])
        .args(TRAIN_FLAGS)
        .args(extra)
        .args(["--train", s(train), "--test", s(test), "--quiet"])
        .args(["--summary-json", s(&out)])
        .output()
        .unwrap();
    common::ok(&o, name);
    let auc = json(&out)["test_auc"].as_f64().unwrap();
    eprintln!("{name}: test AUC {auc:.4}");
    auc
}

#[test]
fn dcnv2_and_dlrm_learn_the_generated_clicks() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let dcn = train_auc(dir.path(), &train, &test, "dcn", &["--model", "dcn"]);
    let dcnv2 = train_auc(dir.path(), &train, &test, "dcnv2", &["--model", "dcnv2"]);
    let dlrm = train_auc(dir.path(), &train, &test, "dlrm", &["--model", "dlrm"]);
    // low-rank mixture of experts, stacked, from a [model] section
    let cfg = dir.path().join("moe.toml");
    std::fs::write(
        &cfg,
        "[model]\nkind = \"dcnv2\"\ncross_rank = 32\ncross_experts = 4\n\
         cross_structure = \"stacked\"\nhidden = [256, 128]\n",
    )
    .unwrap();
    let moe = train_auc(
        dir.path(),
        &train,
        &test,
        "dcnv2-moe",
        &["--config", s(&cfg)],
    );
    eprintln!("AUC: dcn {dcn:.4}, dcnv2 {dcnv2:.4}, dcnv2 moe {moe:.4}, dlrm {dlrm:.4}");
    for (name, auc) in [
        ("dcn", dcn),
        ("dcnv2", dcnv2),
        ("dcnv2 moe", moe),
        ("dlrm", dlrm),
    ] {
        assert!(auc > 0.75, "{name}: test AUC {auc}");
    }
    assert!(dcnv2 >= dcn - 0.003, "dcnv2 {dcnv2} vs dcn {dcn}");
}

#[test]
fn an_unknown_model_lists_the_kinds() {
    let o = cmd(&["train", "--model", "dcn3", "--train", "x.tsv"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = common::stderr(&o);
    assert!(
        e.contains("--model \"dcn3\": expected wdl, deepfm, dcn, dcnv2, dlrm, din, mmoe or esmm"),
        "{e}"
    );
}

/// A 2 PS + 2 worker sync cluster trains `model` to the embedded AUC within `tolerance`, the
/// embedded run seeing the rows in the cluster's order (batches of 512 = one batch of 256 from
/// each worker's half; see `common::cluster_order`).
fn cluster_matches_embedded(model: &str, tolerance: f64) {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let ordered = dir.path().join("cluster-order.tsv");
    common::cluster_order(&train, 256, &ordered);
    let flags = TRAIN_FLAGS.map(|f| if f == "256" { "512" } else { f });
    let out = dir.path().join(format!("{model}-emb.json"));
    // The sequential loop, as a sync cluster runs.
    let o = cmd(&["train", "--exact", "--model", model])
        .args(flags)
        .args(["--train", s(&ordered), "--test", s(&test), "--quiet"])
        .args(["--summary-json", s(&out)])
        .output()
        .unwrap();
    common::ok(&o, model);
    let emb = json(&out)["test_auc"].as_f64().unwrap();
    let out = dir.path().join("cluster.json");
    let mut c = cmd(&["launch", "--ps", "2", "--workers", "2", "--mode", "sync"]);
    c.args(["--model", model])
        .args(TRAIN_FLAGS)
        .args(["--train", s(&train), "--test", s(&test), "--quiet"])
        .args(["--summary-json", s(&out)]);
    let (ok, log) = common::Proc::start(c).wait(std::time::Duration::from_secs(400));
    assert!(ok, "{log}");
    let j = json(&out);
    let auc = j["test_auc"].as_f64().unwrap();
    eprintln!("{model}: embedded AUC {emb:.5}, 2 PS + 2 workers {auc:.5}");
    assert!(
        (auc - emb).abs() < tolerance,
        "{model}: cluster {auc} vs embedded {emb}"
    );
}

#[test]
fn dcnv2_on_a_cluster_matches_embedded() {
    cluster_matches_embedded("dcnv2", 0.003);
}

/// dlrm within 0.005. The cluster run is not deterministic, by design of sync mode: the dense
/// gradients are averaged at a barrier, but each worker's sparse push is applied by the shard
/// on arrival (as TensorFlow's PS and PERSIA do), so two workers' Adagrad updates of a shared
/// row land in either order, and the run drifts from the embedded one by an amount that
/// differs each run. Three cluster runs on this data measured 0.77041, 0.77293 and 0.77273
/// against the embedded 0.76993 (+0.0005, +0.0030, +0.0028); dlrm, whose only first-order
/// path is its embeddings, drifts most. 0.005 is well under the test AUC's standard error on
/// these 4,000 rows (~0.009), i.e. it still catches a cluster that trains a different model.
#[test]
fn dlrm_on_a_cluster_matches_embedded() {
    cluster_matches_embedded("dlrm", 0.005);
}

/// (Not deepfm: three cluster runs of it on this data measured 0.7646, 0.7665 and 0.7699
/// against the embedded 0.7671, their sparse pushes interleaving differently each run; a
/// 0.003 bound would fail by chance.)
#[test]
fn wdl_and_dcn_on_a_cluster_match_embedded() {
    for model in ["wdl", "dcn"] {
        cluster_matches_embedded(model, 0.003);
    }
}

/// GAUC by hand: per group (the raw column value), the share of (positive, negative) pairs
/// ranked right (ties half), weighted by the group's rows; one-class groups skipped.
fn gauc_by_hand(groups: &[String], labels: &[f32], probs: &[f32]) -> (f64, usize) {
    let mut by: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (i, g) in groups.iter().enumerate() {
        by.entry(g.as_str()).or_default().push(i);
    }
    let (mut sum, mut rows, mut used) = (0.0, 0usize, 0usize);
    for rows_of in by.values() {
        let (mut wins, mut pairs) = (0.0, 0.0);
        for &i in rows_of {
            for &j in rows_of {
                if labels[i] == 1.0 && labels[j] == 0.0 {
                    pairs += 1.0;
                    wins += match probs[i].partial_cmp(&probs[j]).unwrap() {
                        std::cmp::Ordering::Greater => 1.0,
                        std::cmp::Ordering::Equal => 0.5,
                        std::cmp::Ordering::Less => 0.0,
                    };
                }
            }
        }
        if pairs > 0.0 {
            sum += wins / pairs * rows_of.len() as f64;
            rows += rows_of.len();
            used += 1;
        }
    }
    (sum / rows as f64, used)
}

#[test]
fn gauc_groups_the_test_rows_by_a_feature() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 10_000, 3_000);
    let cfg = dir.path().join("gauc.toml");
    std::fs::write(&cfg, "[train]\ngauc_by = \"C1\"\n").unwrap();
    let (out, preds) = (dir.path().join("s.json"), dir.path().join("p.txt"));
    let o = cmd(&["train", "--config", s(&cfg), "--model", "wdl"])
        .args(TRAIN_FLAGS)
        .args(["--train", s(&train), "--test", s(&test), "--quiet"])
        .args(["--predict-input", s(&test), "--predict-out", s(&preds)])
        .args(["--summary-json", s(&out)])
        .output()
        .unwrap();
    common::ok(&o, "train with gauc_by");
    assert!(String::from_utf8_lossy(&o.stdout).contains("GAUC"));
    let j = json(&out);
    let (gauc, groups) = (
        j["test_gauc"].as_f64().expect("test_gauc"),
        j["test_gauc_groups"].as_u64().unwrap() as usize,
    );
    // The same from the predictions and the file's C1 column (index 14: label, I1-I13, C1, ...).
    let text = std::fs::read_to_string(&test).unwrap();
    let (mut g, mut l) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        l.push(cols[0].parse::<f32>().unwrap());
        g.push(cols[14].to_string());
    }
    let p: Vec<f32> = std::fs::read_to_string(&preds)
        .unwrap()
        .lines()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(p.len(), l.len());
    let (want, want_groups) = gauc_by_hand(&g, &l, &p);
    eprintln!(
        "GAUC by C1 {gauc:.5} over {groups} groups (by hand {want:.5}), AUC {}",
        j["test_auc"]
    );
    assert_eq!(groups, want_groups);
    assert!((gauc - want).abs() < 1e-6, "GAUC {gauc} vs {want} by hand");
    // An unknown feature is refused, naming the field.
    std::fs::write(&cfg, "[train]\ngauc_by = \"user\"\n").unwrap();
    let o = cmd(&["train", "--config", s(&cfg), "--train", s(&train)])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = common::stderr(&o);
    assert!(
        e.contains("train.gauc_by = \"user\": no sparse feature"),
        "{e}"
    );
}
