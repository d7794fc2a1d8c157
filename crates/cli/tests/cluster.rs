//! The PS cluster end to end: real `sparta ps` / `sparta worker` / `sparta launch` processes on
//! loopback, on `sparta gen-data` rows (the real Criteo sample is an extra case, skipped when
//! absent).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cmd, count_lines, gen, gen_split, json, s, start_ps, Proc};

/// `--model wdl` and the common training flags.
fn train_flags() -> impl Iterator<Item = &'static str> {
    ["--model", "wdl"].into_iter().chain(common::TRAIN_FLAGS)
}

/// Rows of the generated train and test files.
const TRAIN_ROWS: u64 = 20_000;
const TEST_ROWS: u64 = 4_000;

fn files(train: &Path, test: &Path, out: &Path) -> Vec<String> {
    [
        "--train",
        s(train),
        "--test",
        s(test),
        "--quiet",
        "--summary-json",
        s(out),
    ]
    .map(String::from)
    .to_vec()
}

/// Embedded training and a 2 PS + 2 worker sync cluster on the same files reach the same
/// AUC (above `min_auc`), with one sparse RPC per shard and direction per step.
fn cluster_matches_embedded(dir: &Path, train: &Path, test: &Path, min_auc: f64) {
    let (emb, job) = (dir.join("emb.json"), dir.join("job.json"));
    // The sequential loop, as a sync cluster runs.
    let o = cmd(&["train", "--exact"])
        .args(train_flags())
        .args(files(train, test, &emb))
        .output()
        .unwrap();
    common::ok(&o, "train");
    // Sync mode: one averaged dense step per global step, so the result does not depend on how
    // the two workers' RPCs interleave (sparse pushes are still applied on arrival).
    let mut c = cmd(&["launch", "--ps", "2", "--workers", "2", "--mode", "sync"]);
    c.args(train_flags()).args(files(train, test, &job));
    let (ok, log) = Proc::start(c).wait(Duration::from_secs(300));
    assert!(ok, "{log}");
    assert!(log.contains("[w1]") && log.contains("[ps1]"), "{log}");
    let (e, j) = (json(&emb), json(&job));
    assert_eq!(
        j["train_rows"], e["train_rows"],
        "the workers' parts must cover the data once per epoch"
    );
    assert_eq!(j["test_rows"], e["test_rows"]);
    assert_eq!(j["per_worker"].as_array().unwrap().len(), 2);
    assert_eq!(j["runs"].as_array().unwrap().len(), 1, "{j}");
    let (ea, ja) = (
        e["test_auc"].as_f64().unwrap(),
        j["test_auc"].as_f64().unwrap(),
    );
    eprintln!("embedded AUC {ea:.5}, 2 PS + 2 workers AUC {ja:.5}");
    assert!(ea > min_auc, "embedded AUC {ea}");
    assert!((ea - ja).abs() < 0.005, "cluster AUC {ja} vs embedded {ea}");
    // One pull and one push per shard per step for the embedding and wide tables together
    // (2 shards x 2 directions), plus one dense push-pull per shard.
    let w = &j["per_worker"][0]["wire"];
    let sparse = w["sparse_rpcs_per_step"].as_f64().unwrap();
    assert!(sparse > 3.5 && sparse <= 4.0, "{w}");
}

#[test]
fn two_ps_two_workers_match_the_embedded_auc() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), TRAIN_ROWS, TEST_ROWS);
    // Measured: embedded 0.7785, cluster 0.7787.
    cluster_matches_embedded(dir.path(), &train, &test, 0.75);
}

#[test]
#[ignore = "an extra case on the real Criteo sample: cargo test -- --ignored (needs ../shared/data)"]
fn two_ps_two_workers_match_the_embedded_auc_on_the_criteo_sample() {
    let src = common::criteo_sample().expect("the Criteo sample (../shared/data)");
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = common::split_file(dir.path(), &src);
    cluster_matches_embedded(dir.path(), &train, &test, 0.7);
}

#[test]
fn sync_steps_go_on_without_a_backup_worker_and_train_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), TRAIN_ROWS, TEST_ROWS);
    let out = dir.path().join("job.json");
    let launch = |backup: &str| {
        let mut c = cmd(&["launch", "--ps", "1", "--workers", "3", "--mode", "sync"]);
        c.args(["--backup-workers", backup])
            .args(train_flags())
            .args(files(&train, &test, &out));
        c
    };
    // A step needs one worker's gradients at least: refused before any process starts.
    let o = launch("3").output().unwrap();
    let err = common::stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("backup worker(s) of 3"), "{err}");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("launch: started"));
    // Each step waits for 2 of the 3 workers; the third's gradients join the next step, and
    // the job ends (no worker left waiting at a barrier) with every row trained.
    let (ok, log) = Proc::start(launch("1")).wait(Duration::from_secs(300));
    assert!(ok, "{log}");
    let j = json(&out);
    assert_eq!(j["train_rows"], 2 * count_lines(&train), "{j}");
    let auc = j["test_auc"].as_f64().unwrap();
    eprintln!("AUC with a backup worker: {auc:.5}");
    assert!(auc > 0.75, "AUC {auc} with a backup worker");
}

fn small_config(dir: &Path) -> PathBuf {
    let p = dir.join("job.toml");
    std::fs::write(
        &p,
        "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nhidden = [16]\n[train]\nthreads = 1\n",
    )
    .unwrap();
    p
}

/// `sparta ps` shard `shard` of `shards` for one worker, with `config` and `token`.
fn ps(shard: usize, shards: usize, config: &Path, token: &str) -> (Proc, String) {
    start_ps(
        &[
            "--workers",
            "1",
            "--shard",
            &shard.to_string(),
            "--num-shards",
            &shards.to_string(),
            "--config",
            s(config),
        ],
        Some(token),
    )
}

#[test]
fn a_wrong_token_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path());
    let data = gen(dir.path(), "train.tsv", 500, 1);
    let (ps, addr) = ps(0, 1, &config, "right-token");
    let o = cmd(&["worker", "--rank", "0", "--num-workers", "1", "--ps", &addr])
        .args(["--config", s(&config), "--train", s(&data)])
        .args(["--quiet", "--max-rows", "100"])
        .env("SPARTA_TOKEN", "wrong-token")
        .output()
        .unwrap();
    drop(ps);
    let err = common::stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("refused this worker's token") && err.contains(&addr),
        "{err}"
    );
    assert!(err.contains("wrong token"), "{err}");
    // The hint once, not once from the PS and again from the worker.
    assert_eq!(err.matches("--token-file").count(), 1, "{err}");
}

/// A worker's progress line ("train 8.3% 3392 samples, ..."): it has trained steps.
fn progress(l: &str) -> Option<()> {
    (l.contains(" train ") && l.contains(" samples,")).then_some(())
}

#[test]
fn a_killed_ps_gives_the_worker_a_clear_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path());
    let data = gen(dir.path(), "train.tsv", 20_000, 1);
    let (_ps0, a0) = ps(0, 2, &config, "tok");
    let (ps1, a1) = ps(1, 2, &config, "tok");
    let mut c = cmd(&["worker", "--rank", "0", "--num-workers", "1"]);
    c.args(["--ps", &format!("{a0},{a1}")])
        .args(["--config", s(&config), "--train", s(&data)])
        .args(["--epochs", "1000", "--retries", "3", "--ps-retry-secs", "3"])
        .env("SPARTA_TOKEN", "tok")
        .env("RUST_LOG", "info");
    let mut worker = Proc::start(c);
    // Once the worker trains, kill PS 1 hard. Without checkpoints nothing restarts it: the
    // worker retries for the bounded wait (3 s here), then stops with a clear error.
    worker.wait_line(Duration::from_secs(60), progress);
    common::kill9(ps1.pid());
    let t = std::time::Instant::now();
    let (ok, err) = worker.wait(Duration::from_secs(60));
    assert!(!ok, "{err}");
    assert!(
        err.contains(&format!("PS shard 1 at {a1}")) && err.contains("unreachable"),
        "{err}"
    );
    assert!(err.contains("retried for up to 3 s"), "{err}");
    assert!(
        t.elapsed() >= Duration::from_secs(3),
        "the worker gave up before the bounded wait"
    );
}

#[test]
fn pipelined_worker_over_grpc_matches_the_embedded_auc() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), TRAIN_ROWS, TEST_ROWS);
    let mut aucs = Vec::new();
    for (i, args) in [
        vec!["train"],
        vec!["launch", "--ps", "1", "--workers", "1", "--pipeline"],
    ]
    .into_iter()
    .enumerate()
    {
        let out = dir.path().join(format!("s{i}.json"));
        let mut c = cmd(&args);
        c.args(train_flags()).args(files(&train, &test, &out));
        let (ok, log) = Proc::start(c).wait(Duration::from_secs(300));
        assert!(ok, "{log}");
        let s = json(&out);
        if i == 1 {
            let w = &s["per_worker"][0];
            assert_eq!(w["pipeline"], true, "{s}");
            assert!(w["stage_seconds"]["pull"].as_f64().unwrap() > 0.0, "{s}");
        }
        aucs.push(s["test_auc"].as_f64().unwrap());
    }
    eprintln!(
        "embedded AUC {:.5}, pipelined 1 PS + 1 worker AUC {:.5}",
        aucs[0], aucs[1]
    );
    assert!(aucs[0] > 0.75, "{aucs:?}");
    assert!((aucs[0] - aucs[1]).abs() < 0.005, "{aucs:?}");
}

#[test]
fn a_ps_nobody_talks_to_exits_after_the_idle_limit() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path());
    let mut c = cmd(&["ps", "--shard", "0", "--num-shards", "1"]);
    c.args(["--listen", "127.0.0.1:0", "--config", s(&config)])
        .args(["--idle-exit-secs", "2"])
        .env("SPARTA_TOKEN", "tok");
    let t = std::time::Instant::now();
    let (ok, log) = Proc::start(c).wait(Duration::from_secs(60));
    assert!(!ok, "{log}");
    assert!(
        log.contains("no worker or coordinator request for 2 s (--idle-exit-secs 2): exiting"),
        "{log}"
    );
    assert!(t.elapsed() >= Duration::from_secs(2), "{log}");
}
