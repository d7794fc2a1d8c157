//! Dense mode allreduce end to end: real `sparta launch` clusters on loopback whose workers
//! average dense gradients over a ring while the sparse rows stay on the PS shards. Compared
//! with PS sync mode on the same `sparta gen-data` rows; a worker killed with `kill -9` is
//! recovered by the coordinated rollback.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{cmd, committed, count_lines, gen_split, json, kill9, s, start_ps, Proc, TRAIN_FLAGS};

const LONG: Duration = Duration::from_secs(400);
/// The epochs of `common::TRAIN_FLAGS`.
const EPOCHS: u64 = 2;

/// A 2 PS job of `workers` workers in dense `mode`; `extra` flags after the common ones.
fn launch(
    workers: usize,
    mode: &str,
    train: &Path,
    test: &Path,
    out: &Path,
    extra: &[&str],
) -> Proc {
    let mut c = cmd(&["launch", "--ps", "2", "--workers", &workers.to_string()]);
    c.args(["--mode", mode, "--model", "wdl"])
        .args(TRAIN_FLAGS)
        .args(["--train", s(train), "--test", s(test), "--quiet"])
        .args(["--summary-json", s(out)])
        .args(extra);
    Proc::start(c)
}

fn run(workers: usize, mode: &str, train: &Path, test: &Path, out: &Path, extra: &[&str]) {
    let (ok, log) = launch(workers, mode, train, test, out, extra).wait(LONG);
    assert!(ok, "{mode} with {workers} workers: {log}");
}

fn auc(j: &serde_json::Value) -> f64 {
    j["test_auc"].as_f64().expect("test_auc")
}

/// Every worker reports the same dense checksum (bit-identical copies) and its ring traffic.
fn check_ring(j: &serde_json::Value, workers: usize, compression: &str) -> f64 {
    let per = j["per_worker"].as_array().unwrap();
    assert_eq!(per.len(), workers, "{j}");
    let sum0 = per[0]["dense"]["checksum"]
        .as_str()
        .expect("dense checksum");
    for w in per {
        assert_eq!(w["dense"]["mode"], "allreduce", "{w}");
        assert_eq!(w["dense"]["ring_compression"], compression, "{w}");
        assert_eq!(
            w["dense"]["checksum"].as_str(),
            Some(sum0),
            "dense copies differ between workers: {j}"
        );
    }
    per[0]["wire"]["dense_bytes_per_sample"].as_f64().unwrap()
}

#[test]
fn allreduce_with_two_workers_matches_sync_and_fp16_matches_fp32() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let rows = count_lines(&train) * EPOCHS;
    let [sync, ring, half] = ["sync.json", "ring.json", "fp16.json"].map(|f| dir.path().join(f));
    run(2, "sync", &train, &test, &sync, &[]);
    run(2, "allreduce", &train, &test, &ring, &[]);
    run(
        2,
        "allreduce",
        &train,
        &test,
        &half,
        &["--ring-compression", "fp16"],
    );
    let (sj, rj, hj) = (json(&sync), json(&ring), json(&half));
    for j in [&sj, &rj, &hj] {
        assert_eq!(j["train_rows"], rows, "{j}");
    }
    let (sa, ra, ha) = (auc(&sj), auc(&rj), auc(&hj));
    let f32_bytes = check_ring(&rj, 2, "none");
    let f16_bytes = check_ring(&hj, 2, "fp16");
    let sync_bytes = sj["per_worker"][0]["wire"]["dense_bytes_per_sample"]
        .as_f64()
        .unwrap();
    eprintln!(
        "2 workers: AUC sync {sa:.5}, allreduce {ra:.5}, allreduce fp16 {ha:.5}; dense bytes \
         per sample per worker: PS sync {sync_bytes:.0}, ring {f32_bytes:.0}, ring fp16 {f16_bytes:.0}"
    );
    assert!(sa > 0.75, "sync AUC {sa}");
    assert!((ra - sa).abs() < 0.003, "allreduce AUC {ra} vs sync {sa}");
    assert!((ha - ra).abs() < 0.003, "fp16 ring AUC {ha} vs fp32 {ra}");
    // Two workers: each sends half the vector twice and receives as much (the PS: the whole
    // vector each way); fp16 halves the values.
    assert!(
        f32_bytes > 0.9 * sync_bytes && f32_bytes < 1.1 * sync_bytes,
        "{f32_bytes} vs {sync_bytes}"
    );
    assert!(
        f16_bytes > 0.45 * f32_bytes && f16_bytes < 0.55 * f32_bytes,
        "{f16_bytes} vs {f32_bytes}"
    );
}

#[test]
fn allreduce_with_three_workers_matches_sync() {
    let dir = tempfile::tempdir().unwrap();
    // Rows not divisible by 3 workers x 256: the workers' inputs end at different steps.
    let (train, test) = gen_split(dir.path(), 20_011, 4_000);
    let rows = count_lines(&train) * EPOCHS;
    let [sync, ring] = ["sync.json", "ring.json"].map(|f| dir.path().join(f));
    run(3, "sync", &train, &test, &sync, &[]);
    run(3, "allreduce", &train, &test, &ring, &[]);
    let (sj, rj) = (json(&sync), json(&ring));
    assert_eq!(sj["train_rows"], rows, "{sj}");
    assert_eq!(rj["train_rows"], rows, "{rj}");
    check_ring(&rj, 3, "none");
    let (sa, ra) = (auc(&sj), auc(&rj));
    eprintln!("3 workers: AUC sync {sa:.5}, allreduce {ra:.5}");
    assert!(sa > 0.75, "sync AUC {sa}");
    assert!((ra - sa).abs() < 0.003, "allreduce AUC {ra} vs sync {sa}");
}

#[test]
fn a_killed_allreduce_worker_is_rolled_back_without_losing_a_sample() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let rows = count_lines(&train) * EPOCHS;
    let ckpt_flags = |d: &Path| {
        [
            "--checkpoint-dir",
            s(d),
            "--checkpoint-every-steps",
            "4",
            "--max-restarts",
            "3",
            "--ps-retry-secs",
            "20",
        ]
        .map(String::from)
    };
    let (ref_ckpt, ref_json) = (dir.path().join("ref-ckpt"), dir.path().join("ref.json"));
    let flags = ckpt_flags(&ref_ckpt);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    run(2, "allreduce", &train, &test, &ref_json, &flags);
    let r = json(&ref_json);
    assert_eq!(r["samples_trained"], rows, "{r}");

    let (ckpt, out) = (dir.path().join("ckpt"), dir.path().join("job.json"));
    let flags = ckpt_flags(&ckpt);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut job = launch(2, "allreduce", &train, &test, &out, &flags);
    job.wait_until("two checkpoints", LONG, || {
        (committed(&ckpt).len() >= 2).then_some(())
    });
    let w1 = job.started_pid("w1").expect("w1 started");
    kill9(w1);
    let (ok, log) = job.wait(LONG);
    assert!(ok, "{log}");
    assert!(log.contains("w1 exited with signal: 9"), "{log}");
    assert!(log.contains("launch: using checkpoint ckpt-"), "{log}");
    let j = json(&out);
    assert_eq!(j["rollbacks"], 1, "{j}");
    // Every row of every epoch trained once in the final model's lineage.
    assert_eq!(j["samples_trained"], rows, "{j}");
    let runs = j["runs"].as_array().unwrap();
    let (at_start, last_run) = (
        runs[1]["samples_at_start"].as_u64().unwrap(),
        runs[1]["train_rows"].as_u64().unwrap(),
    );
    assert!(at_start > 0, "{j}");
    assert_eq!(at_start + last_run, rows, "{j}");
    check_ring(&j, 2, "none");
    let (ra, ja) = (auc(&r), auc(&j));
    eprintln!("allreduce: uninterrupted AUC {ra:.5}, after kill -9 of a worker {ja:.5}");
    assert!(ra > 0.75, "reference AUC {ra}");
    assert!((ra - ja).abs() < 0.003, "AUC {ja} after the kill vs {ra}");
}

#[test]
fn a_worker_and_the_ps_must_agree_on_the_dense_mode() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_split(dir.path(), 600, 10);
    let worker = |ps: &str, ring: &[&str]| {
        let mut c = cmd(&["worker", "--rank", "0", "--num-workers", "1", "--ps", ps]);
        c.args(["--train", s(&train), "--quiet"])
            .args(ring)
            .env("SPARTA_TOKEN", "tok");
        let o = c.output().unwrap();
        assert!(!o.status.success());
        common::stderr(&o)
    };
    let (mut ring_ps, addr) = start_ps(
        &["--shard", "0", "--num-shards", "1", "--mode", "allreduce"],
        Some("tok"),
    );
    let err = worker(&addr, &[]);
    assert!(
        err.contains("run dense mode allreduce: give every worker --ring"),
        "{err}"
    );
    let err = worker(&addr, &["--ring", "127.0.0.1:1,127.0.0.1:2"]);
    assert!(err.contains("2 address(es) for 1 worker(s)"), "{err}");
    let _ = ring_ps.child.kill();
    let (mut sync_ps, addr) = start_ps(
        &["--shard", "0", "--num-shards", "1", "--mode", "sync"],
        Some("tok"),
    );
    let err = worker(&addr, &["--ring", "127.0.0.1:1"]);
    assert!(err.contains("PS shards run dense mode sync"), "{err}");
    let _ = sync_ps.child.kill();
}

#[test]
fn an_allreduce_job_over_tls_encrypts_the_ring_too() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (crt, key) = common::self_signed(d);
    let (train, test) = gen_split(d, 3_000, 500);
    let out = d.join("tls.json");
    let tls = [
        "--tls-cert",
        s(&crt),
        "--tls-key",
        s(&key),
        "--tls-ca",
        s(&crt),
        "--tls-domain",
        "localhost",
    ];
    run(2, "allreduce", &train, &test, &out, &tls);
    let j = json(&out);
    assert_eq!(j["train_rows"], count_lines(&train) * EPOCHS, "{j}");
    check_ring(&j, 2, "none");
    for w in j["per_worker"].as_array().unwrap() {
        assert_eq!(w["dense"]["tls"], true, "{w}");
    }
}
