//! Online learning end to end with the real binaries on loopback: `sparta train --follow`
//! trains on files as they are shipped into a directory and exports every K steps; a
//! `sparta serve` on the exports advances its version as files arrive; after the stop file,
//! the server, `sparta predict` on the final export and the trainer's own final model score
//! the same rows alike (to 1e-6).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cmd, gen, s, train_follow, Proc};

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(120);

/// Generates `rows` synthetic rows into `dir/name` as a shipper does: a temporary dotfile,
/// renamed when complete.
fn ship(dir: &Path, name: &str, rows: u64, seed: u64) -> PathBuf {
    let tmp = gen(dir, &format!(".{name}"), rows, seed);
    let p = dir.join(name);
    std::fs::rename(&tmp, &p).unwrap();
    p
}

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, LIMIT, f)
}

fn model_version(addr: SocketAddr) -> u64 {
    let m = common::http::model(addr).expect("a served model");
    m["version"].as_u64().unwrap()
}

#[test]
fn follow_export_serve_and_predict_agree() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let export = dir.path().join("export");
    let stop = dir.path().join("STOP");
    let summary = dir.path().join("summary.json");
    let trainer_preds = dir.path().join("trainer_preds.txt");
    let config = dir.path().join("job.toml");
    std::fs::write(&config, "[model]\nhidden = [64, 32]\n").unwrap();
    let staging = dir.path().join("staging");
    std::fs::create_dir(&staging).unwrap();
    let test = ship(&staging, "test.tsv", 300, 99);

    // 1000 rows per file, batches of 200: 5 steps per file, an export every 5 steps.
    let mut c = cmd(&["train", "--config", s(&config), "--model", "wdl"]);
    c.args(["--follow", s(&input), "--stop-file", s(&stop)])
        .args(["--follow-poll-secs", "0.05", "--follow-settle-secs", "0"])
        .args(["--export-dir", s(&export), "--export-every-steps", "5"])
        .args([
            "--batch-size",
            "200",
            "--threads",
            "1",
            "--reader-threads",
            "1",
        ])
        .args([
            "--predict-input",
            s(&test),
            "--predict-out",
            s(&trainer_preds),
        ])
        .args(["--summary-json", s(&summary), "--quiet"])
        .env("RUST_LOG", "info");
    let trainer = Proc::start(c);

    ship(&input, "2024-05-01T00.tsv", 1000, 1);
    wait_for("the first export", || {
        export
            .join("v0000000001")
            .join("manifest.json")
            .exists()
            .then_some(())
    });
    let mut c = cmd(&["serve", "--model", s(&export), "--listen", "127.0.0.1:0"]);
    c.args(["--poll-ms", "50", "--threads", "2"]);
    let mut server = Proc::start(c);
    let addr: SocketAddr = server.wait_line(LIMIT, |l| {
        l.trim()
            .strip_prefix("listening on http://")
            .map(|a| a.parse().unwrap())
    });
    let mut version = model_version(addr);
    assert!(version >= 1);

    // Every shipped file is trained on, exported and picked up by the server.
    for (i, seed) in [(1, 2), (2, 3)] {
        ship(&input, &format!("2024-05-01T{i:02}.tsv"), 1000, seed);
        let before = version;
        version = wait_for("the server's version to advance", || {
            let v = model_version(addr);
            (v > before).then_some(v)
        });
    }

    std::fs::write(&stop, b"").unwrap();
    let (done, err) = trainer.wait(LIMIT);
    assert!(done, "sparta train failed: {err}");
    let sum: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(sum["train_rows"], 3000);
    assert_eq!(sum["input_position"]["file"], "2024-05-01T02.tsv");
    let exports = &sum["exports"];
    let last = exports["last_version"].as_u64().unwrap();
    assert_eq!(exports["count"], 3, "{exports}");
    assert_eq!(exports["full"], 1, "later exports are deltas: {exports}");

    // All three score the final model alike.
    wait_for("the server to load the final export", || {
        (model_version(addr) == last).then_some(())
    });
    let text = std::fs::read_to_string(&test).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut served = Vec::new();
    for chunk in lines.chunks(100) {
        let (v, probs) = common::http::predict(addr, chunk);
        assert_eq!(v, last);
        served.extend(probs);
    }
    let offline_preds = dir.path().join("offline_preds.txt");
    let (_, offline) = common::predict_file(&export, &test, &offline_preds);
    let trained: Vec<f32> = std::fs::read_to_string(&trainer_preds)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(trained.len(), lines.len());
    assert_eq!(offline.len(), lines.len());
    assert_eq!(served.len(), lines.len());
    for i in 0..lines.len() {
        let (t, o, v) = (trained[i], offline[i], served[i]);
        assert!(
            (t - o).abs() <= 1e-6 && (t - v).abs() <= 1e-6,
            "row {i}: trainer {t}, predict {o}, serve {v}"
        );
    }
    // Not a constant model: the scores spread.
    let (lo, hi) = trained
        .iter()
        .fold((1f32, 0f32), |(lo, hi), &p| (lo.min(p), hi.max(p)));
    assert!(hi - lo > 0.1, "scores {lo}..{hi}");
    drop(server);
}

/// Runs a `sparta train --follow` to its end; returns its summary.
fn train_to_end(input: &Path, extra: &[&str], dir: &Path, name: &str) -> serde_json::Value {
    let json = dir.join(format!("{name}.json"));
    let extra = [extra, &["--summary-json", s(&json)]].concat();
    let (ok, log) = train_follow(input, &extra).wait(LIMIT);
    assert!(ok, "{name}: {log}");
    summary(&json)
}

fn summary(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn sigterm_stops_gracefully_and_resume_continues_at_the_next_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("in");
    std::fs::create_dir(&input).unwrap();
    let config = d.join("job.toml");
    std::fs::write(&config, "[model]\nhidden = [64, 32]\n").unwrap();
    let test = ship(d, "test.tsv", 200, 99);
    let (ckpt, export, stop) = (d.join("ckpt"), d.join("export"), d.join("STOP"));
    let (resumed_preds, whole_preds) = (d.join("resumed.txt"), d.join("whole.txt"));

    ship(&input, "a.tsv", 1000, 1);
    let json1 = d.join("first.json");
    let first = train_follow(
        &input,
        &[
            "--config",
            s(&config),
            "--checkpoint-dir",
            s(&ckpt),
            "--export-dir",
            s(&export),
            "--export-every-steps",
            "5",
            "--summary-json",
            s(&json1),
        ],
    );
    // The file is trained on once its export exists; then the trainer idles, waiting.
    wait_for("the first export", || {
        let done = export.join("v0000000001").join("manifest.json").exists();
        done.then_some(())
    });
    common::signal(first.pid(), "-TERM");
    let (ok, err) = first.wait(LIMIT);
    assert!(ok, "SIGTERM must stop training cleanly: {err}");
    assert!(err.contains("stop requested"), "{err}");
    let s1 = summary(&json1);
    assert_eq!(s1["train_rows"], 1000);
    assert_eq!(s1["input_position"]["file"], "a.tsv");
    assert!(s1["last_checkpoint"].is_string(), "{s1}");

    // The shipper writes the next file and is done; the job resumes after a.tsv.
    ship(&input, "b.tsv", 1000, 2);
    std::fs::write(&stop, b"").unwrap();
    let common = [
        "--config",
        s(&config),
        "--stop-file",
        s(&stop),
        "--predict-input",
        s(&test),
        "--predict-out",
    ];
    let resumed = [&common[..], &[s(&resumed_preds), "--resume", s(&ckpt)]].concat();
    let s2 = train_to_end(&input, &resumed, d, "resumed");
    assert_eq!(s2["train_rows"], 1000, "only b.tsv is left: {s2}");
    assert_eq!(s2["samples_trained"], 2000);
    assert!(s2["resumed_from"].is_string());

    // The same two files without the interruption: the same model, score for score.
    let whole = [&common[..], &[s(&whole_preds)]].concat();
    let s3 = train_to_end(&input, &whole, d, "whole");
    assert_eq!(s3["train_rows"], 2000);
    let resumed = std::fs::read_to_string(&resumed_preds).unwrap();
    assert_eq!(resumed.lines().count(), 200);
    assert_eq!(
        resumed,
        std::fs::read_to_string(&whole_preds).unwrap(),
        "stopped + resumed must equal uninterrupted"
    );
}

/// The newest complete export's manifest in `dir`, if any.
fn newest_manifest(dir: &Path) -> Option<serde_json::Value> {
    common::export_manifests(dir).pop()
}

#[test]
fn exports_by_time_fire_while_the_trainer_waits_for_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("in");
    std::fs::create_dir(&input).unwrap();
    let export = d.join("export");
    // 1000 rows = 5 steps of 200, trained in well under the export period.
    ship(&input, "a.tsv", 1000, 1);
    let trainer = train_follow(
        &input,
        &["--export-dir", s(&export), "--export-every-secs", "2"],
    );
    // No further file comes: the last steps are exported by time, while waiting.
    let m = wait_for("an export of step 5 while idle", || {
        newest_manifest(&export).filter(|m| m["step"] == 5)
    });
    assert_eq!(m["step"], 5, "{m}");
    common::signal(trainer.pid(), "-TERM");
    let (ok, log) = trainer.wait(LIMIT);
    assert!(ok, "{log}");
}

#[test]
fn flags_without_effect_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data = gen(dir.path(), "t.tsv", 50, 1);
    for (flags, why) in [
        (
            &["--stop-file", "STOP"][..],
            "--stop-file has no effect without --follow",
        ),
        (
            &["--follow-settle-secs", "3"],
            "--follow-settle-secs has no effect",
        ),
        (
            &["--follow-poll-secs", "3"],
            "--follow-poll-secs has no effect",
        ),
        (
            &["--export-fp16"],
            "export.fp16 has no effect without an export directory",
        ),
        (
            &["--export-full-every", "3"],
            "export.full_every has no effect",
        ),
    ] {
        let mut c = cmd(&["train", "--train", s(&data), "--quiet"]);
        c.args(flags);
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} accepted");
        assert!(err.contains(why), "{flags:?}: {err}");
    }
}

#[test]
fn a_trainer_resumed_behind_its_last_export_is_served_as_a_new_lineage() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("in");
    std::fs::create_dir(&input).unwrap();
    let (ckpt, export) = (d.join("ckpt"), d.join("export"));
    // 1000 rows = 5 steps: checkpoints after step 3, exports after every step.
    ship(&input, "a.tsv", 1000, 1);
    let flags = [
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every-steps",
        "3",
        "--export-dir",
        s(&export),
        "--export-every-steps",
        "1",
    ];
    let first = train_follow(&input, &flags);
    wait_for("the export of step 5", || {
        newest_manifest(&export).filter(|m| m["step"] == 5)
    });
    let mut c = cmd(&["serve", "--model", s(&export), "--listen", "127.0.0.1:0"]);
    c.args(["--poll-ms", "50"]);
    let mut server = Proc::start(c);
    let addr: SocketAddr = server.wait_line(LIMIT, |l| {
        l.trim()
            .strip_prefix("listening on http://")
            .map(|a| a.parse().unwrap())
    });
    let served = wait_for("step 5 served", || {
        common::http::model(addr).filter(|m| m["step"] == 5)
    });
    // A crash: the newest checkpoint is at step 3, behind the export of step 5.
    common::kill9(first.pid());
    let _ = first.wait(LIMIT);
    let resumed = train_follow(&input, &[&flags[..], &["--resume", s(&ckpt)]].concat());
    // The resumed run exports step 4 under a new lineage: served, and said so.
    let m = wait_for("the new lineage served", || {
        common::http::model(addr).filter(|m| m["lineage"] != served["lineage"])
    });
    let back = &m["step_went_back"];
    assert_eq!(back["from_step"], 5, "{m}");
    assert_eq!(back["to_step"], 4, "{m}");
    // Training goes on: the resumed run reaches step 5 again.
    wait_for("step 5 of the new lineage", || {
        common::http::model(addr).filter(|m| m["step"] == 5 && m["lineage"] != served["lineage"])
    });
    common::signal(resumed.pid(), "-TERM");
    let (ok, log) = resumed.wait(LIMIT);
    assert!(ok, "{log}");
}
