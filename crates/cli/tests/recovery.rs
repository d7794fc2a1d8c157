//! Recovery of a PS cluster with real processes on loopback: `sparta launch` with checkpoints,
//! `kill -9` of a PS and then of a worker mid-job, a truncated checkpoint file, a killed or
//! stopped launcher (its children die with it). `sparta gen-data` rows.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{alive, cmd, committed, count_lines, gen_split, json, kill9, s, start_ps, Proc};

const EPOCHS: u64 = 2;
const LONG: Duration = Duration::from_secs(300);

/// A 2 PS + 2 worker sync job checkpointing every 4 steps into `ckpt`.
fn launch(train: &Path, test: &Path, ckpt: &Path, summary: &Path, extra: &[&str]) -> Proc {
    let mut c = cmd(&["launch", "--ps", "2", "--workers", "2", "--mode", "sync"]);
    c.args(["--model", "wdl", "--batch-size", "256", "--epochs"])
        .arg(EPOCHS.to_string())
        .args(["--threads", "1", "--reader-threads", "2", "--seed", "7"])
        .args(["--train", s(train), "--test", s(test)])
        .args(["--checkpoint-dir", s(ckpt), "--checkpoint-every-steps", "4"])
        .args(["--quiet", "--max-restarts", "4", "--ps-retry-secs", "20"])
        .args(["--summary-json", s(summary)])
        .args(extra);
    Proc::start(c)
}

/// Waits until `dir` holds more than `n` committed checkpoints (while `job` runs).
fn wait_checkpoints(job: &mut Proc, dir: &Path, n: usize) -> Vec<String> {
    job.wait_until(&format!("checkpoint {}", n + 1), LONG, || {
        let c = committed(dir);
        (c.len() > n).then_some(c)
    })
}

#[test]
fn killed_ps_and_worker_are_recovered_without_losing_a_sample() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let rows = count_lines(&train);
    // Uninterrupted reference run (same data, same config, checkpoints on).
    let (ref_ckpt, ref_json) = (dir.path().join("ref-ckpt"), dir.path().join("ref.json"));
    let (ok, log) = launch(&train, &test, &ref_ckpt, &ref_json, &[]).wait(LONG);
    assert!(ok, "{log}");
    let r = json(&ref_json);
    assert_eq!(r["samples_trained"], rows * EPOCHS, "{r}");
    assert_eq!(r["train_rows"], rows * EPOCHS, "{r}");
    assert_eq!(r["restarts"], serde_json::json!({"ps": 0, "worker": 0}));
    // The end-of-job checkpoint holds the whole job: every worker finished, every sample.
    let o = cmd(&["checkpoint", "inspect", "--json", s(&ref_ckpt)])
        .output()
        .unwrap();
    common::ok(&o, "checkpoint inspect");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let last = report["checkpoints"].as_array().unwrap().last().unwrap();
    assert_eq!(last["valid"], true, "{last}");
    assert_eq!(report["restorable"], last["id"], "{report}");
    assert_eq!(last["cluster"]["workers_done"], 2, "{last}");
    assert_eq!(last["cluster"]["samples_trained"], rows * EPOCHS, "{last}");
    assert_eq!(r["last_checkpoint"], last["dir"], "{r}");

    // The same job, killed twice.
    let (ckpt, out) = (dir.path().join("ckpt"), dir.path().join("job.json"));
    let mut job = launch(&train, &test, &ckpt, &out, &[]);
    wait_checkpoints(&mut job, &ckpt, 1);
    let (ps1, w1_before) = (job.started_pid("ps1"), job.started_pid("w1"));
    kill9(ps1.unwrap());
    // Restarted from a checkpoint: once the new cluster commits a checkpoint, kill a worker.
    job.wait_started("ps1", ps1, LONG);
    let w1 = job.wait_started("w1", w1_before, LONG);
    let restarted = committed(&ckpt).len();
    wait_checkpoints(&mut job, &ckpt, restarted);
    kill9(w1);
    let (ok, log) = job.wait(LONG);
    assert!(ok, "{log}");
    assert!(
        log.contains("ps1 exited with signal: 9") && log.contains("w1 exited with signal: 9"),
        "{log}"
    );
    assert!(log.contains("launch: using checkpoint ckpt-"), "{log}");
    let j = json(&out);
    eprintln!(
        "uninterrupted: AUC {}, {} samples; killed twice: AUC {}, {} samples, resumed from {}",
        r["test_auc"], r["samples_trained"], j["test_auc"], j["samples_trained"], j["resumed_from"]
    );
    assert_eq!(
        j["restarts"],
        serde_json::json!({"ps": 1, "worker": 1}),
        "{j}"
    );
    assert_eq!(j["rollbacks"], 2);
    // Every training row of every epoch trained exactly once in the final model's lineage.
    assert_eq!(j["samples_trained"], rows * EPOCHS, "{j}");
    assert!(
        j["resumed_from"].as_str().unwrap().starts_with("ckpt-"),
        "{j}"
    );
    // The job's totals cover all three runs; each run has its own entry.
    assert_eq!(j["train_rows"], rows * EPOCHS, "{j}");
    let runs = j["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{j}");
    assert!(runs[0]["resumed_from"].is_null(), "{j}");
    assert!(runs[0]["ended_by"].as_str().unwrap().contains("ps1"), "{j}");
    assert!(runs[1]["ended_by"].as_str().unwrap().contains("w1"), "{j}");
    assert!(runs[2]["ended_by"].is_null(), "{j}");
    assert_eq!(runs[2]["resumed_from"], j["resumed_from"], "{j}");
    let last_run = runs[2]["train_rows"].as_u64().unwrap();
    let at_start = runs[2]["samples_at_start"].as_u64().unwrap();
    assert!(at_start > 0 && last_run < rows * EPOCHS, "{j}");
    assert_eq!(at_start + last_run, rows * EPOCHS, "{j}");
    let (ra, ja) = (
        r["test_auc"].as_f64().unwrap(),
        j["test_auc"].as_f64().unwrap(),
    );
    assert!(ra > 0.75, "reference AUC {ra}");
    assert!(
        (ra - ja).abs() < 0.003,
        "AUC {ja} after two kills vs {ra} uninterrupted"
    );
}

#[test]
fn a_truncated_checkpoint_is_skipped_for_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let rows = count_lines(&train);
    let (ckpt, first) = (dir.path().join("ckpt"), dir.path().join("first.json"));
    let (ok, log) = launch(&train, &test, &ckpt, &first, &[]).wait(LONG);
    assert!(ok, "{log}");
    let ids = committed(&ckpt);
    assert!(ids.len() >= 2, "{ids:?}");
    let (prev, newest) = (&ids[ids.len() - 2], &ids[ids.len() - 1]);
    // Cut the newest checkpoint's embedding part of shard 1 in half.
    let part = ckpt.join(newest).join("table-embedding.ps-1.rows");
    let len = std::fs::metadata(&part).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&part)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let resumed = dir.path().join("resumed.json");
    let (ok, log) = launch(&train, &test, &ckpt, &resumed, &["--resume", s(&ckpt)]).wait(LONG);
    assert!(ok, "{log}");
    assert!(
        log.contains("skipping checkpoint")
            && log.contains(newest.as_str())
            && log.contains("truncated"),
        "{log}"
    );
    assert!(
        log.contains(&format!("launch: using checkpoint {prev}")),
        "{log}"
    );
    let j = json(&resumed);
    assert_eq!(j["resumed_from"], prev.as_str(), "{j}");
    assert_eq!(j["samples_trained"], rows * EPOCHS, "{j}");
    // This launch trained only what the checkpoint it resumed from lacked.
    let at_start = j["runs"][0]["samples_at_start"].as_u64().unwrap();
    assert_eq!(j["train_rows"], rows * EPOCHS - at_start, "{j}");
}

#[test]
fn a_worker_does_not_continue_on_a_ps_that_restarted_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("job.toml");
    std::fs::write(
        &config,
        "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nhidden = [16]\n[train]\nthreads = 1\n",
    )
    .unwrap();
    let data = common::gen(dir.path(), "train.tsv", 20_000, 1);
    let ps_args = [
        "--shard",
        "0",
        "--num-shards",
        "1",
        "--workers",
        "1",
        "--config",
        s(&config),
    ];
    let (ps, addr) = start_ps(&ps_args, Some("tok"));
    let mut c = cmd(&["worker", "--rank", "0", "--num-workers", "1", "--ps", &addr]);
    c.args(["--config", s(&config), "--train", s(&data)])
        .args(["--epochs", "1000", "--ps-retry-secs", "30"])
        .env("SPARTA_TOKEN", "tok")
        .env("RUST_LOG", "info");
    let mut worker = Proc::start(c);
    // Once the worker trains (a progress line), replace its PS by a new, empty one on the same
    // address: the worker must not push into it.
    worker.wait_line(Duration::from_secs(60), |l| {
        (l.contains(" train ") && l.contains(" samples,")).then_some(())
    });
    kill9(ps.pid());
    drop(ps);
    let (_ps2, _) = start_ps(&[&ps_args[..], &["--listen", &addr]].concat(), Some("tok"));
    let (ok, log) = worker.wait(Duration::from_secs(60));
    assert!(!ok, "{log}");
    assert!(
        log.contains(&format!(
            "PS shard 0 at {addr} restarted while this worker was waiting"
        )),
        "{log}"
    );
}

/// A long 2 PS + 2 worker job; returns it once every process runs, with their pids.
fn long_job(dir: &Path, tmp: &Path) -> (Proc, Vec<u32>) {
    let (train, _) = gen_split(dir, 20_000, 100);
    let mut c = cmd(&["launch", "--ps", "2", "--workers", "2", "--mode", "sync"]);
    c.args(["--train", s(&train), "--epochs", "1000", "--quiet"])
        .args([
            "--batch-size",
            "256",
            "--threads",
            "1",
            "--reader-threads",
            "1",
        ])
        .env("TMPDIR", tmp);
    let mut job = Proc::start(c);
    let pids = ["ps0", "ps1", "w0", "w1"]
        .map(|n| job.wait_started(n, None, LONG))
        .to_vec();
    (job, pids)
}

#[test]
fn the_children_die_with_a_killed_launcher() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let (job, pids) = long_job(dir.path(), &tmp);
    kill9(job.pid());
    let (ok, log) = job.wait(Duration::from_secs(30));
    assert!(!ok);
    common::wait_for("every child to die", Duration::from_secs(10), || {
        pids.iter().all(|p| !alive(*p)).then_some(())
    });
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn sigterm_stops_the_cluster_and_removes_the_temporary_folder() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let (job, pids) = long_job(dir.path(), &tmp);
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        1,
        "the job.toml folder"
    );
    common::signal(job.pid(), "-TERM");
    let (ok, log) = job.wait(Duration::from_secs(30));
    assert!(!ok, "{log}");
    assert!(log.contains("interrupted by a signal"), "{log}");
    assert!(pids.iter().all(|p| !alive(*p)), "{log}");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!log.contains("panicked"), "{log}");
}
