//! Cluster faults with real processes (issue 21): the backup-worker step barrier and the
//! checkpoint barrier together, a PS restarted under paused workers, checkpoint writes that
//! fail.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{cmd, committed, gen, json, s, signal, start_ps, Proc};

/// 3 workers, 1 backup worker, checkpoints every 3 steps: the two barriers compose (this
/// deadlocked: the late worker's push waited for workers parked in the checkpoint barrier,
/// which waited for it), and every sample is trained once.
#[test]
fn sync_with_a_backup_worker_and_checkpoints_finishes_with_every_sample() {
    let t = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let rows = 12_000;
    let train = gen(dir.path(), "train.tsv", rows, 3);
    let (ckpt, summary) = (dir.path().join("ckpt"), dir.path().join("job.json"));
    let mut c = cmd(&["launch", "--ps", "2", "--workers", "3", "--mode", "sync"]);
    c.args([
        "--backup-workers",
        "1",
        "--train",
        s(&train),
        "--epochs",
        "2",
    ])
    .args(["--batch-size", "128", "--threads", "1", "--quiet"])
    .args([
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every-steps",
        "3",
    ])
    .args(["--max-restarts", "0", "--summary-json", s(&summary)]);
    let (ok, log) = Proc::start(c).wait(Duration::from_secs(120));
    assert!(ok, "{log}");
    let j = json(&summary);
    assert_eq!(j["samples_trained"], rows * 2, "{j}");
    assert_eq!(j["restarts"], serde_json::json!({"ps": 0, "worker": 0}));
    // Checkpoints were written all along, not only at the end.
    let ids = committed(&ckpt);
    assert!(ids.len() >= 5, "{ids:?}");
    eprintln!(
        "backup worker + checkpoints: {} checkpoints, {:.1}s",
        ids.len(),
        t.elapsed().as_secs_f64()
    );
}

fn write_config(dir: &Path, ckpt: &Path, extra: &str) -> std::path::PathBuf {
    let p = dir.join("job.toml");
    std::fs::write(
        &p,
        format!(
            "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nhidden = [16]\n\
             [train]\nthreads = 1\ncheckpoint_dir = {:?}\ncheckpoint_every_steps = 4\n{extra}",
            s(ckpt)
        ),
    )
    .unwrap();
    p
}

fn checkpoint_number(name: &str) -> u64 {
    name.trim_start_matches("ckpt-").parse().unwrap()
}

/// Started by hand (as on Kubernetes): pause both workers, kill -9 a PS and restart it from
/// an older checkpoint on the same address, resume the workers: they must stop with the
/// documented error (the restarted shard lost their updates), never go on.
#[test]
fn workers_stop_when_a_ps_restarted_from_an_older_checkpoint_under_them() {
    let t = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 20_000, 5);
    let ckpt = dir.path().join("ckpt");
    let config = write_config(dir.path(), &ckpt, "");
    let ps_args = |shard: &str| {
        vec![
            "--shard".to_string(),
            shard.to_string(),
            "--num-shards".into(),
            "2".into(),
            "--workers".into(),
            "2".into(),
            "--mode".into(),
            "sync".into(),
            "--config".into(),
            s(&config).to_string(),
        ]
    };
    let args0 = ps_args("0");
    let args1 = ps_args("1");
    let a0: Vec<&str> = args0.iter().map(String::as_str).collect();
    let a1: Vec<&str> = args1.iter().map(String::as_str).collect();
    let (_ps0, addr0) = start_ps(&a0, Some("tok"));
    let (ps1, addr1) = start_ps(&a1, Some("tok"));
    let ps_list = format!("{addr0},{addr1}");
    let worker = |rank: &str| {
        let mut c = cmd(&["worker", "--rank", rank, "--num-workers", "2"]);
        c.args([
            "--ps",
            &ps_list,
            "--config",
            s(&config),
            "--train",
            s(&train),
        ])
        .args(["--epochs", "1000", "--ps-retry-secs", "20"])
        .env("SPARTA_TOKEN", "tok");
        Proc::start(c)
    };
    let (w0, w1) = (worker("0"), worker("1"));
    common::wait_for("3 committed checkpoints", Duration::from_secs(90), || {
        (committed(&ckpt).len() >= 3).then_some(())
    });
    signal(w0.pid(), "-STOP");
    signal(w1.pid(), "-STOP");
    let older = committed(&ckpt)[0].clone();
    common::kill9(ps1.pid());
    drop(ps1);
    let mut a1r = a1.clone();
    a1r.extend([
        "--listen",
        addr1.as_str(),
        "--resume",
        s(&ckpt),
        "--resume-id",
    ]);
    let id = checkpoint_number(&older).to_string();
    a1r.push(&id);
    let (_ps1b, addr1b) = start_ps(&a1r, Some("tok"));
    assert_eq!(addr1b, addr1);
    signal(w0.pid(), "-CONT");
    signal(w1.pid(), "-CONT");
    for w in [w0, w1] {
        let (ok, log) = w.wait(Duration::from_secs(60));
        assert!(!ok, "a worker went on after the PS restarted:\n{log}");
        assert!(
            log.contains(&format!(
                "PS shard 1 at {addr1} restarted while this worker was waiting"
            )) && log.contains(&format!("restarted from checkpoint {older}")),
            "{log}"
        );
    }
    eprintln!("restarted PS detected in {:.1}s", t.elapsed().as_secs_f64());
}

/// Makes every write of checkpoint `id`'s file `file` fail (a directory sits at its name, so
/// the final rename fails with EISDIR, for any user): a real write error from the OS.
fn block(ckpt: &Path, id: u64, file: &str) -> std::path::PathBuf {
    let d = ckpt.join(format!("ckpt-{id:016}"));
    std::fs::create_dir_all(d.join(file).join("blocker")).unwrap();
    d
}

/// Regular files under `dir` (the blocker directories hold none).
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// Embedded: checkpoint 2's second table cannot be written. Each attempt's partial checkpoint
/// is removed, and after `checkpoint_max_failures` attempts the job stops non-zero.
#[test]
fn an_embedded_job_stops_after_consecutive_checkpoint_failures() {
    let t = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 6_000, 7);
    let ckpt = dir.path().join("ckpt");
    let config = write_config(dir.path(), &ckpt, "checkpoint_max_failures = 2\n");
    let second = block(&ckpt, 2, "table-wide.ps-0.rows");
    let c = {
        let mut c = cmd(&["train", "--config", s(&config), "--train", s(&train)]);
        c.arg("--quiet").env("RUST_LOG", "warn");
        c
    };
    let (ok, log) = Proc::start(c).wait(Duration::from_secs(60));
    assert!(!ok, "{log}");
    assert!(
        log.contains("failed 2 times in a row") && log.contains("free space"),
        "{log}"
    );
    assert!(log.contains("1 of at most 2 consecutive failures"), "{log}");
    // The partial checkpoint (its first table) was removed; the first checkpoint stays.
    assert!(files(&second).is_empty(), "{:?}", files(&second));
    assert_eq!(committed(&ckpt), vec!["ckpt-0000000000000001".to_string()]);
    eprintln!(
        "embedded checkpoint failures: {:.1}s",
        t.elapsed().as_secs_f64()
    );
}

/// Cluster: PS shard 1 cannot write its part of checkpoint 2. It retries, gives up, every
/// worker stops with the error and the partial checkpoint (shard 0's part) is removed. The
/// launcher stops the job instead of rolling back (restarts are left, but a rollback would
/// only fail the same way).
#[test]
fn a_cluster_job_stops_after_consecutive_checkpoint_failures() {
    let t = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 8_000, 9);
    let ckpt = dir.path().join("ckpt");
    let config = write_config(dir.path(), &ckpt, "checkpoint_max_failures = 2\n");
    let second = block(&ckpt, 2, "table-embedding.ps-1.rows");
    let mut c = cmd(&["launch", "--ps", "2", "--workers", "2", "--mode", "sync"]);
    c.args(["--config", s(&config), "--train", s(&train), "--quiet"])
        .args(["--max-restarts", "3"]);
    let (ok, log) = Proc::start(c).wait(Duration::from_secs(90));
    assert!(!ok, "{log}");
    assert!(
        log.contains("stopped the job for a reason a rollback would not fix"),
        "{log}"
    );
    assert_eq!(log.matches("launch: started w0 (pid").count(), 1, "{log}");
    assert!(
        log.contains("cluster checkpoint at step 8 failed on PS shard 1")
            && log.contains("failed 2 times in a row"),
        "{log}"
    );
    assert!(files(&second).is_empty(), "{:?}", files(&second));
    assert_eq!(committed(&ckpt), vec!["ckpt-0000000000000001".to_string()]);
    eprintln!(
        "cluster checkpoint failures: {:.1}s",
        t.elapsed().as_secs_f64()
    );
}

/// A PS that applies a push and then loses its answer (the hidden test hook, as if the
/// connection broke): a sparse push, and a dense push while it waits at the sync barrier. The
/// workers retry, the shard answers the retries from its push log without applying them
/// again (counted), and the job finishes with every sample trained.
#[test]
fn pushes_whose_answers_were_lost_are_retried_and_applied_once() {
    let t = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let rows = 4_000;
    let train = gen(dir.path(), "train.tsv", rows, 9);
    let config = write_config(dir.path(), &dir.path().join("ckpt"), "");
    let (mut ps, addr) = start_ps(
        &[
            "--shard",
            "0",
            "--num-shards",
            "1",
            "--workers",
            "2",
            "--mode",
            "sync",
            "--config",
            s(&config),
            "--metrics-listen",
            "127.0.0.1:0",
            "--test-drop-answer",
            "push:7",
            "--test-drop-answer",
            "dense_push_pull:5:applying",
        ],
        Some("tok"),
    );
    let metrics = ps.wait_line(Duration::from_secs(30), |l| {
        l.split("metrics on http://")
            .nth(1)
            .map(|a| a.trim().trim_end_matches("/metrics").to_string())
    });
    let worker = |rank: &str| {
        let summary = dir.path().join(format!("w{rank}.json"));
        let mut c = cmd(&["worker", "--rank", rank, "--num-workers", "2"]);
        c.args(["--ps", &addr, "--config", s(&config), "--train", s(&train)])
            .args(["--epochs", "1", "--quiet", "--summary-json", s(&summary)])
            .env("SPARTA_TOKEN", "tok");
        (Proc::start(c), summary)
    };
    let (w0, w1) = (worker("0"), worker("1"));
    let mut own = Vec::new();
    for (w, summary) in [w0, w1] {
        let (ok, log) = w.wait(Duration::from_secs(120));
        assert!(ok, "{log}");
        own.push(json(&summary));
    }
    // Rank 0's summary is the job's: its train_rows is both workers' (each reported once to
    // shard 0), its `worker` object rank 0's own share; the two shares add up to the file.
    let (j0, j1) = (&own[0], &own[1]);
    assert_eq!(j0["train_rows"], rows, "{j0}");
    assert_eq!(j0["workers_reported"], 2, "{j0}");
    let shares = j0["worker"]["train_rows"].as_u64().unwrap() + j1["train_rows"].as_u64().unwrap();
    assert_eq!(shares, rows, "{j0}\n{j1}");
    let (code, text) = common::http::http(
        metrics.parse().unwrap(),
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(code, 200);
    for rpc in ["push", "dense_push_pull"] {
        let line = format!("sparta_ps_duplicate_pushes_total{{role=\"ps\",rpc=\"{rpc}\"}} 1");
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    eprintln!(
        "lost answers retried once: {:.1}s",
        t.elapsed().as_secs_f64()
    );
}
