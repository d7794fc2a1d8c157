//! The SSD tier (`[embedding] storage = { ram_rows, disk_dir }`) through the real binary: a job
//! whose tables keep a tenth of their rows in RAM trains, checkpoints, exports and serves as
//! the all-RAM job does, and a run killed with `kill -9` and resumed ends as one uninterrupted
//! run. `sparta gen-data` rows.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{cmd, committed, export_scores, gen, json, kill9, s, Proc};

/// A job config: the default embedding, with an SSD tier of `ram_rows` rows in `disk` if
/// given.
fn config(dir: &Path, name: &str, tier: Option<(u64, &Path)>) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let text = match tier {
        Some((rows, disk)) => format!(
            "[embedding]\nstorage = {{ ram_rows = {rows}, disk_dir = {:?} }}\n",
            s(disk)
        ),
        None => String::new(),
    };
    std::fs::write(&path, text).unwrap();
    path
}

/// `sparta train` (WDL, sequential loop, one thread) on `train`, tested on `test`.
fn train(config: &Path, train: &Path, test: &Path, summary: &Path, extra: &[&str]) -> Command {
    let mut c = cmd(&["train", "--config", s(config), "--model", "wdl", "--exact"]);
    c.args(["--train", s(train), "--test", s(test), "--quiet"])
        .args(["--batch-size", "256", "--threads", "1"])
        .args(["--summary-json", s(summary)])
        .args(extra);
    c
}

fn run(mut c: Command) {
    let o = c.output().unwrap();
    common::ok(&o, "train");
}

#[test]
fn a_tiered_job_trains_checkpoints_exports_and_serves_as_the_all_ram_job() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (tr, te) = (gen(d, "train.tsv", 30_000, 1), gen(d, "test.tsv", 5_000, 2));
    let disk = d.join("disk");
    std::fs::create_dir(&disk).unwrap();
    let mut want = None;
    for (name, tier) in [("ram", None), ("tier", Some((3_000, disk.as_path())))] {
        let ckpt = d.join(format!("{name}-ckpt"));
        let summary = d.join(format!("{name}.json"));
        run(train(
            &config(d, name, tier),
            &tr,
            &te,
            &summary,
            &[
                "--checkpoint-dir",
                s(&ckpt),
                "--checkpoint-every-steps",
                "20",
            ],
        ));
        let j = json(&summary);
        let got = export_scores(&ckpt, &te, &d.join(format!("{name}.scores")));
        match &want {
            None => {
                assert_eq!(j["table_cold_rows"], 0, "{j}");
                want = Some((j, got));
            }
            Some((w, w_scores)) => {
                let rows = j["table_rows"].as_u64().unwrap();
                let cold = j["table_cold_rows"].as_u64().unwrap();
                // The embedding table keeps 3000 rows in RAM; the wide table, one row per id
                // as the embedding table, all of its own.
                assert_eq!(rows - cold, 3_000 + rows / 2, "{j}");
                assert!(j["table_disk_bytes"].as_u64().unwrap() >= cold * 128, "{j}");
                for key in ["test_auc", "test_logloss", "table_rows", "train_loss"] {
                    assert_eq!(j[key], w[key], "{key}");
                }
                let same = got
                    .iter()
                    .zip(w_scores)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same && got.len() == 5_000, "export scores differ");
            }
        }
    }
}

#[test]
fn a_tiered_run_killed_and_resumed_ends_as_one_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (tr, te) = (gen(d, "train.tsv", 40_000, 1), gen(d, "test.tsv", 4_000, 2));
    let disk = d.join("disk");
    std::fs::create_dir(&disk).unwrap();
    let cfg = config(d, "tier", Some((1_000, disk.as_path())));
    let epochs = ["--epochs", "2"];
    let whole = d.join("whole.json");
    run(train(&cfg, &tr, &te, &whole, &epochs));
    let whole = json(&whole);
    // gen-data ids: about 8200 embedding rows, most of them cold.
    assert!(
        whole["table_cold_rows"].as_u64().unwrap() > 6_000,
        "{whole}"
    );

    let ckpt = d.join("ckpt");
    let every = [
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every-steps",
        "5",
    ];
    let killed = d.join("killed.json");
    let mut c = train(&cfg, &tr, &te, &killed, &epochs);
    c.args(every);
    let job = Proc::start(c);
    common::wait_for("a checkpoint", Duration::from_secs(120), || {
        (!committed(&ckpt).is_empty()).then_some(())
    });
    kill9(job.pid());
    let (_, log) = job.wait(Duration::from_secs(30));
    assert!(
        !killed.exists(),
        "the run ended before it was killed: {log}"
    );
    // The tier's files were unnamed: nothing is left in the directory.
    assert_eq!(std::fs::read_dir(&disk).unwrap().count(), 0);

    let resumed = d.join("resumed.json");
    let mut c = train(&cfg, &tr, &te, &resumed, &epochs);
    c.args(["--resume", s(&ckpt)]).args(every);
    run(c);
    let resumed = json(&resumed);
    assert!(resumed["resumed_from"].is_string(), "{resumed}");
    for key in [
        "test_auc",
        "test_logloss",
        "table_rows",
        "table_cold_rows",
        "samples_trained",
    ] {
        assert_eq!(resumed[key], whole[key], "{key} after resume");
    }
}

/// `sparta launch --ps 2 --workers 1` with the tier (each PS shard keeps its 1500 rows in RAM):
/// the same test AUC and rows as the all-RAM cluster, the shards report their cold rows and
/// tier bytes in the summary.
#[test]
fn a_cluster_whose_shards_keep_cold_rows_on_disk_trains_as_the_all_ram_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (tr, te) = (gen(d, "train.tsv", 20_000, 1), gen(d, "test.tsv", 2_000, 2));
    let disk = d.join("disk");
    std::fs::create_dir(&disk).unwrap();
    let mut runs = Vec::new();
    for (name, tier) in [("ram", None), ("tier", Some((1_500, disk.as_path())))] {
        let summary = d.join(format!("cluster-{name}.json"));
        let o = cmd(&["launch", "--ps", "2", "--workers", "1", "--mode", "sync"])
            .args([
                "--config",
                s(&config(d, name, tier)),
                "--quiet",
                "--seed",
                "7",
            ])
            .args(["--train", s(&tr), "--test", s(&te)])
            .args(["--summary-json", s(&summary)])
            .output()
            .unwrap();
        common::ok(&o, "launch");
        runs.push(json(&summary));
    }
    let (ram, tier) = (&runs[0], &runs[1]);
    for key in ["test_auc", "test_logloss", "samples_trained"] {
        assert_eq!(tier[key], ram[key], "{key}");
    }
    let shards = tier["shard_tables"].as_array().unwrap();
    assert_eq!(shards.len(), 2, "{tier}");
    for sh in shards {
        let emb = &sh["tables"]["embedding"];
        let (rows, cold) = (
            emb["rows"].as_u64().unwrap(),
            emb["cold_rows"].as_u64().unwrap(),
        );
        assert_eq!(rows - cold, 1_500, "{sh}");
        assert!(emb["disk_bytes"].as_u64().unwrap() >= cold * 128, "{sh}");
        assert_eq!(sh["tables"]["wide"]["cold_rows"], 0, "{sh}");
    }
    let rows = |j: &serde_json::Value| -> Vec<u64> {
        j["shard_tables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|sh| sh["tables"]["embedding"]["rows"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(rows(tier), rows(ram));
}
