//! Online learning on a PS cluster with real processes on loopback: `sparta launch --ps 2
//! --workers 2 --follow DIR --export-dir EX` while a shipper writes files; `sparta serve` on
//! EX advances its version; every shipped row is trained once; served scores equal `sparta
//! predict` on the same export and on an export of the final checkpoint; `kill -9` of a PS and
//! of a worker mid-stream roll back exactly and exports continue, their steps never going back.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::http::{model, predict};
use common::{cmd, gen, json, kill9, ok, predict_file, s, sparta, Proc};

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(240);
const ROWS_PER_FILE: u64 = 2000;

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, LIMIT, f)
}

/// Writes `rows` generated rows as `dir/name` the way a shipper does: a dotfile renamed
/// when complete (gzip when the name ends in `.gz`).
fn ship(dir: &Path, name: &str, rows: u64, seed: u64) -> PathBuf {
    let tmp = gen(dir, &format!(".{name}.part"), rows, seed);
    let p = dir.join(name);
    if name.ends_with(".gz") {
        let text = std::fs::read(&tmp).unwrap();
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, &text).unwrap();
        let gz = dir.join(format!(".{name}"));
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        std::fs::remove_file(&tmp).unwrap();
        std::fs::rename(&gz, &p).unwrap();
    } else {
        std::fs::rename(&tmp, &p).unwrap();
    }
    p
}

struct Job {
    config: PathBuf,
    input: PathBuf,
    ckpt: PathBuf,
    export: PathBuf,
    stop: PathBuf,
    summary: PathBuf,
}

impl Job {
    fn new(d: &Path) -> Job {
        let input = d.join("in");
        std::fs::create_dir(&input).unwrap();
        // Keep every export version (the tests read them all).
        let config = d.join("job.toml");
        std::fs::write(&config, "[export]\nkeep_full = 100\n").unwrap();
        Job {
            config,
            input,
            ckpt: d.join("ckpt"),
            export: d.join("export"),
            stop: d.join("STOP"),
            summary: d.join("job.json"),
        }
    }

    /// 2 PS + 2 sync workers following `input`, a checkpoint (and an export) every 4 steps.
    fn launch(&self) -> Proc {
        let mut c = cmd(&["launch", "--ps", "2", "--workers", "2", "--mode", "sync"]);
        c.args([
            "--config",
            s(&self.config),
            "--model",
            "wdl",
            "--batch-size",
            "256",
        ])
        .args(["--threads", "1", "--reader-threads", "1", "--seed", "7"])
        .args(["--follow", s(&self.input), "--stop-file", s(&self.stop)])
        .args(["--follow-poll-secs", "0.05", "--follow-settle-secs", "0"])
        .args([
            "--checkpoint-dir",
            s(&self.ckpt),
            "--checkpoint-every-steps",
            "4",
        ])
        .args(["--export-dir", s(&self.export)])
        .args(["--quiet", "--max-restarts", "4", "--ps-retry-secs", "20"])
        .args(["--summary-json", s(&self.summary)]);
        Proc::start(c)
    }
}

/// (version, step, kind, lineage) of every complete export version, by version.
fn manifests(dir: &Path) -> Vec<(u64, u64, String, u64)> {
    common::export_manifests(dir)
        .into_iter()
        .map(|m| {
            (
                m["version"].as_u64().unwrap(),
                m["step"].as_u64().unwrap(),
                m["kind"].as_str().unwrap().to_string(),
                m["lineage"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_cluster_follows_a_directory_exports_and_serving_follows() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job = Job::new(d);
    let test = gen(d, "test.tsv", 300, 99);
    ship(&job.input, "2026-12-01T00.tsv", ROWS_PER_FILE, 1);
    let cluster = job.launch();
    wait_for("the first cluster export", || {
        (!manifests(&job.export).is_empty()).then_some(())
    });
    let (server, addr) = common::serve(&job.export, 50, LIMIT);
    let mut version = wait_for("a served model", || model(addr))["version"]
        .as_u64()
        .unwrap();
    // Each new file (plain, then gzip) is trained on, exported and served.
    for (i, name) in ["2026-12-01T01.tsv.gz", "2026-12-01T02.tsv"]
        .iter()
        .enumerate()
    {
        ship(&job.input, name, ROWS_PER_FILE, 2 + i as u64);
        let before = version;
        version = wait_for("the served version to advance", || {
            let v = model(addr)?["version"].as_u64()?;
            (v > before).then_some(v)
        });
    }
    std::fs::write(&job.stop, b"").unwrap();
    let (done, log) = cluster.wait(LIMIT);
    assert!(done, "{log}");
    let j = json(&job.summary);
    // Every shipped row trained exactly once, across both workers.
    assert_eq!(j["samples_trained"], 3 * ROWS_PER_FILE, "{j}");
    assert_eq!(j["train_rows"], 3 * ROWS_PER_FILE, "{j}");
    let ms = manifests(&job.export);
    let (last, last_step, _, lineage) = ms.last().cloned().unwrap();
    assert_eq!(ms[0].2, "full", "{ms:?}");
    assert!(ms[1..].iter().all(|m| m.2 == "delta"), "{ms:?}");
    assert!(ms.iter().all(|m| m.3 == lineage), "one lineage: {ms:?}");
    assert!(
        ms.windows(2).all(|w| w[0].1 < w[1].1),
        "steps go up: {ms:?}"
    );
    // The end-of-job checkpoint's step is exported.
    let o = cmd(&["checkpoint", "inspect", "--json", s(&job.ckpt)])
        .output()
        .unwrap();
    ok(&o, "checkpoint inspect");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let newest = report["checkpoints"].as_array().unwrap().last().unwrap();
    assert_eq!(newest["step"], last_step, "{newest}");

    // Served, offline and checkpoint-exported scores agree.
    wait_for("the server to load the last version", || {
        (model(addr)?["version"].as_u64()? == last).then_some(())
    });
    let text = std::fs::read_to_string(&test).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut served = Vec::new();
    for chunk in lines.chunks(100) {
        let (v, probs) = predict(addr, chunk);
        assert_eq!(v, last);
        served.extend(probs);
    }
    let offline = predict_file(&job.export, &test, &d.join("offline.txt")).1;
    let from_ckpt_dir = d.join("from-ckpt");
    ok(
        &sparta(&[
            "export",
            "--checkpoint",
            s(&job.ckpt),
            "--out",
            s(&from_ckpt_dir),
        ]),
        "export --checkpoint of a cluster checkpoint",
    );
    let from_ckpt = predict_file(&from_ckpt_dir, &test, &d.join("ckpt.txt")).1;
    assert_eq!(served.len(), lines.len());
    for i in 0..lines.len() {
        let (v, o, c) = (served[i], offline[i], from_ckpt[i]);
        assert!(
            (v - o).abs() <= 1e-6 && (o - c).abs() <= 1e-6,
            "row {i}: served {v}, predict {o}, checkpoint export {c}"
        );
    }
    let (lo, hi) = served
        .iter()
        .fold((1f32, 0f32), |(lo, hi), &p| (lo.min(p), hi.max(p)));
    assert!(hi - lo > 0.1, "scores {lo}..{hi}");
    drop(server);
}

#[test]
fn killed_ps_and_worker_mid_stream_roll_back_exactly_and_exports_continue() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job = Job::new(d);
    let mut shipped = 0;
    let mut next = 0u64;
    let mut ship_next = |job: &Job| {
        ship(
            &job.input,
            &format!("2026-12-01T{next:02}.tsv"),
            ROWS_PER_FILE,
            10 + next,
        );
        next += 1;
        ROWS_PER_FILE
    };
    shipped += ship_next(&job);
    let mut cluster = job.launch();
    cluster.wait_until("an export", LIMIT, || {
        (!manifests(&job.export).is_empty()).then_some(())
    });
    let ps1 = cluster.started_pid("ps1");
    kill9(ps1.unwrap());
    cluster.wait_started("ps1", ps1, LIMIT);
    shipped += ship_next(&job);
    // After the rollback the cluster exports again: then a worker dies.
    let n = manifests(&job.export).len();
    cluster.wait_until("an export after the restart", LIMIT, || {
        (manifests(&job.export).len() > n).then_some(())
    });
    let w1 = cluster.started_pid("w1");
    kill9(w1.unwrap());
    cluster.wait_started("w1", w1, LIMIT);
    shipped += ship_next(&job);
    std::fs::write(&job.stop, b"").unwrap();
    let (done, log) = cluster.wait(LIMIT);
    assert!(done, "{log}");
    assert!(
        log.contains("ps1 exited with signal: 9") && log.contains("w1 exited with signal: 9"),
        "{log}"
    );
    let j = json(&job.summary);
    assert_eq!(j["rollbacks"], 2, "{j}");
    // Exact: every shipped row is in the final model's lineage once.
    assert_eq!(j["samples_trained"], shipped, "{j}");
    // Exports continued after each rollback, under new lineages, and the exported step never
    // went back: an export is published only after its checkpoint.
    let ms = manifests(&job.export);
    let lineages: std::collections::BTreeSet<u64> = ms.iter().map(|m| m.3).collect();
    assert_eq!(lineages.len(), 3, "one lineage per run: {ms:?}");
    assert!(ms.windows(2).all(|w| w[0].1 <= w[1].1), "steps: {ms:?}");
    // Each run's first export is full (a restarted shard has no base for a delta).
    for w in ms.windows(2) {
        if w[0].3 != w[1].3 {
            assert_eq!(w[1].2, "full", "{ms:?}");
        }
    }
    // The final chain loads and scores.
    let test = gen(d, "test.tsv", 100, 98);
    let probs = predict_file(&job.export, &test, &d.join("p.txt")).1;
    assert_eq!(probs.len(), 100);
}

#[test]
fn a_deleted_delta_is_reported_and_the_cluster_writes_a_full_one_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job = Job::new(d);
    ship(&job.input, "2026-12-01T00.tsv", ROWS_PER_FILE, 1);
    let cluster = job.launch();
    ship(&job.input, "2026-12-01T01.tsv", ROWS_PER_FILE, 2);
    ship(&job.input, "2026-12-01T02.tsv", ROWS_PER_FILE, 3);
    // A full export and at least two deltas after it (a round every 4 steps, ~4 per file).
    let ms = wait_for("three export versions", || {
        let ms = manifests(&job.export);
        (ms.len() >= 3).then_some(ms)
    });
    assert_eq!(ms[0].2, "full", "{ms:?}");
    // A delta goes missing; a server started now can reach only the versions before it.
    let gone = ms[1].0;
    std::fs::remove_dir_all(job.export.join(format!("v{gone:010}"))).unwrap();
    let (server, addr) = common::serve(&job.export, 50, LIMIT);
    let m = wait_for("the gap reported", || {
        model(addr).filter(|m| m["stale"].is_object())
    });
    assert_eq!(m["version"], ms[0].0, "{m}");
    let (code, health) = common::http::get_json(addr, "/health");
    assert_eq!(
        (code, health["status"].as_str()),
        (200, Some("degraded")),
        "{health}"
    );
    // The server asked the trainer for a full export; the next one (after the next file) is
    // full and the server recovers by itself.
    assert!(job.export.join("full-request").exists());
    ship(&job.input, "2026-12-01T03.tsv", ROWS_PER_FILE, 4);
    let m = wait_for("recovery at the next full export", || {
        model(addr).filter(|m| m["stale"].is_null() && m["version"].as_u64() > Some(ms[2].0))
    });
    let after = manifests(&job.export);
    let recovered = after.iter().find(|v| v.0 > ms.last().unwrap().0).unwrap();
    assert_eq!(recovered.2, "full", "the requested full export: {after:?}");
    assert!(!job.export.join("full-request").exists());
    assert!(m["version"].as_u64().unwrap() >= recovered.0, "{m}");
    std::fs::write(&job.stop, b"").unwrap();
    let (done, log) = cluster.wait(LIMIT);
    assert!(done, "{log}");
    assert_eq!(json(&job.summary)["samples_trained"], 4 * ROWS_PER_FILE);
    drop(server);
}
