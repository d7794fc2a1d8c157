//! The PS cluster end to end: real `sparta ps` / `sparta worker` / `sparta launch` processes on
//! loopback, on real Criteo rows (first 80% train, rest test; skipped when the sample is absent).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_sparta");

fn criteo_sample() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/criteo/criteo_kaggle_sample.tsv");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} not found", p.display());
        None
    }
}

/// Writes the first 80% and last 20% of the sample's lines to two files.
fn split(dir: &Path, src: &Path) -> (PathBuf, PathBuf) {
    let text = std::fs::read_to_string(src).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let cut = lines.len() * 8 / 10;
    let train = dir.join("train.tsv");
    let test = dir.join("test.tsv");
    std::fs::write(&train, lines[..cut].join("\n") + "\n").unwrap();
    std::fs::write(&test, lines[cut..].join("\n") + "\n").unwrap();
    (train, test)
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

const TRAIN_FLAGS: [&str; 12] = [
    "--model",
    "wdl",
    "--batch-size",
    "256",
    "--epochs",
    "2",
    "--threads",
    "1",
    "--reader-threads",
    "1",
    "--seed",
    "7",
];

#[test]
fn two_ps_two_workers_match_the_embedded_auc() {
    let Some(src) = criteo_sample() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = split(dir.path(), &src);
    let (emb, job) = (dir.path().join("emb.json"), dir.path().join("job.json"));
    let files = |out: &Path| {
        vec![
            "--train".to_string(),
            train.display().to_string(),
            "--test".into(),
            test.display().to_string(),
            "--quiet".into(),
            "--summary-json".into(),
            out.display().to_string(),
        ]
    };
    let o = Command::new(EXE)
        .arg("train")
        .args(TRAIN_FLAGS)
        .args(files(&emb))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Sync mode: one averaged dense step per global step, so the result does not depend on how
    // the two workers' RPCs interleave (sparse pushes are still applied on arrival).
    let o = Command::new(EXE)
        .args(["launch", "--ps", "2", "--workers", "2", "--mode", "sync"])
        .args(TRAIN_FLAGS)
        .args(files(&job))
        .env("RUST_LOG", "warn")
        .env_remove("SPARTA_TOKEN")
        .output()
        .unwrap();
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{log}");
    assert!(log.contains("[w1]") && log.contains("[ps1]"), "{log}");
    let (e, j) = (json(&emb), json(&job));
    assert_eq!(
        j["train_rows"], e["train_rows"],
        "the workers' parts must cover the data once per epoch"
    );
    assert_eq!(j["test_rows"], e["test_rows"]);
    assert_eq!(j["per_worker"].as_array().unwrap().len(), 2);
    let (ea, ja) = (
        e["test_auc"].as_f64().unwrap(),
        j["test_auc"].as_f64().unwrap(),
    );
    eprintln!("embedded AUC {ea:.5}, 2 PS + 2 workers AUC {ja:.5}");
    assert!(ea > 0.7, "embedded AUC {ea}");
    assert!((ea - ja).abs() < 0.005, "cluster AUC {ja} vs embedded {ea}");
    // One pull and one push per shard per step for the embedding and wide tables together
    // (2 shards x 2 directions), plus one dense push-pull per shard.
    let w = &j["per_worker"][0]["wire"];
    let sparse = w["sparse_rpcs_per_step"].as_f64().unwrap();
    assert!(sparse > 3.5 && sparse <= 4.0, "{w}");
}

/// Starts `sparta ps` on a free port; returns the child and its address.
#[test]
fn sync_steps_go_on_without_a_backup_worker_and_train_every_row() {
    let Some(src) = criteo_sample() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = split(dir.path(), &src);
    let out = dir.path().join("job.json");
    let launch = |backup: &str| {
        let mut c = Command::new(EXE);
        c.args(["launch", "--ps", "1", "--workers", "3", "--mode", "sync"])
            .args(["--backup-workers", backup])
            .args(TRAIN_FLAGS)
            .arg("--train")
            .arg(&train)
            .arg("--test")
            .arg(&test)
            .args(["--quiet", "--summary-json"])
            .arg(&out)
            .env("RUST_LOG", "warn")
            .env_remove("SPARTA_TOKEN");
        c
    };
    // A step needs one worker's gradients at least: refused before any process starts.
    let o = launch("3").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("backup worker(s) of 3"), "{err}");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("launch: started"));
    // Each step waits for 2 of the 3 workers; the third's gradients join the next step, and
    // the job ends (no worker left waiting at a barrier) with every row trained.
    let o = launch("1").output().unwrap();
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{log}");
    let j = json(&out);
    let rows = std::fs::read_to_string(&train).unwrap().lines().count() as u64;
    assert_eq!(j["train_rows"], 2 * rows, "{j}");
    let auc = j["test_auc"].as_f64().unwrap();
    assert!(auc > 0.7, "AUC {auc} with a backup worker");
}

fn start_ps(shard: usize, shards: usize, token: &str, config: &Path) -> (Child, String) {
    let mut child = Command::new(EXE)
        .args(["ps", "--listen", "127.0.0.1:0", "--workers", "1"])
        .args([
            "--shard",
            &shard.to_string(),
            "--num-shards",
            &shards.to_string(),
        ])
        .arg("--config")
        .arg(config)
        .env("SPARTA_TOKEN", token)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    for line in out.lines() {
        let line = line.unwrap();
        if let Some(a) = line.split("listening on ").nth(1) {
            return (child, a.trim().to_string());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("ps exited without listening");
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

#[test]
fn a_wrong_token_is_refused_with_a_clear_error() {
    let Some(src) = criteo_sample() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path());
    let (mut ps, addr) = start_ps(0, 1, "right-token", &config);
    let o = Command::new(EXE)
        .args(["worker", "--rank", "0", "--num-workers", "1", "--ps", &addr])
        .arg("--config")
        .arg(&config)
        .arg("--train")
        .arg(&src)
        .args(["--quiet", "--max-rows", "100"])
        .env("SPARTA_TOKEN", "wrong-token")
        .output()
        .unwrap();
    let _ = ps.kill();
    let _ = ps.wait();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("refused this worker's token") && err.contains(&addr),
        "{err}"
    );
    assert!(err.contains("wrong token"), "{err}");
}

#[test]
fn a_killed_ps_gives_the_worker_a_clear_error_naming_it() {
    let Some(src) = criteo_sample() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path());
    let (mut ps0, a0) = start_ps(0, 2, "tok", &config);
    let (mut ps1, a1) = start_ps(1, 2, "tok", &config);
    let mut worker = Command::new(EXE)
        .args([
            "worker",
            "--rank",
            "0",
            "--num-workers",
            "1",
            "--ps",
            &format!("{a0},{a1}"),
        ])
        .arg("--config")
        .arg(&config)
        .arg("--train")
        .arg(&src)
        .args(["--epochs", "1000", "--retries", "3", "--ps-retry-secs", "3"])
        .env("SPARTA_TOKEN", "tok")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let err = BufReader::new(worker.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in err.lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    // Wait until the worker trains, then kill PS 1 hard. Without checkpoints nothing restarts
    // it: the worker retries for the bounded wait (3 s here), then stops with a clear error.
    assert!(
        rx.iter().any(|l| l.contains("worker 0 of 1")),
        "the worker never started"
    );
    std::thread::sleep(Duration::from_millis(500));
    ps1.kill().unwrap();
    let _ = ps1.wait();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = worker.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = worker.kill();
            panic!("the worker hung after its PS died");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = ps0.kill();
    let _ = ps0.wait();
    let rest: Vec<String> = rx.try_iter().collect();
    let err = rest.join("\n");
    assert!(!status.success());
    assert!(
        err.contains(&format!("PS shard 1 at {a1}")) && err.contains("unreachable"),
        "{err}"
    );
    assert!(err.contains("retried for up to 3s"), "{err}");
    assert!(
        t.elapsed() >= Duration::from_secs(3),
        "the worker gave up before the bounded wait"
    );
}

#[test]
fn pipelined_worker_over_grpc_matches_the_embedded_auc() {
    let Some(src) = criteo_sample() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = split(dir.path(), &src);
    let mut aucs = Vec::new();
    for (i, args) in [
        vec!["train"],
        vec!["launch", "--ps", "1", "--workers", "1", "--pipeline"],
    ]
    .into_iter()
    .enumerate()
    {
        let out = dir.path().join(format!("s{i}.json"));
        let o = Command::new(EXE)
            .args(&args)
            .args(TRAIN_FLAGS)
            .args([
                "--train",
                train.to_str().unwrap(),
                "--test",
                test.to_str().unwrap(),
            ])
            .args(["--quiet", "--summary-json", out.to_str().unwrap()])
            .env("RUST_LOG", "warn")
            .env_remove("SPARTA_TOKEN")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
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
    assert!((aucs[0] - aucs[1]).abs() < 0.005, "{aucs:?}");
}
