//! End-to-end tests of the `sparta` binary: real process, real files.

mod common;

use std::path::Path;

use common::{cmd, gen, sparta, stderr};

#[test]
fn train_writes_a_complete_summary() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 6000, 1);
    let test = gen(dir.path(), "test.tsv", 2000, 2);
    let summary = dir.path().join("summary.json");
    let o = sparta(&[
        "train",
        "--model",
        "wdl",
        "--train",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
        "--batch-size",
        "512",
        "--threads",
        "1",
        "--quiet",
        "--summary-json",
        summary.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "train failed: {}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    for key in [
        "model",
        "train_rows",
        "test_rows",
        "test_auc",
        "test_logloss",
        "train_seconds",
        "train_samples_per_sec",
        "bad_lines",
        "table_rows",
        "peak_rss_bytes",
        "stage_seconds",
    ] {
        assert!(s.get(key).is_some(), "summary lacks {key}: {s}");
    }
    assert_eq!(s["model"], "wdl");
    assert_eq!(s["train_rows"], 6000);
    assert_eq!(s["test_rows"], 2000);
    assert_eq!(s["bad_lines"], 0);
    let auc = s["test_auc"].as_f64().unwrap();
    assert!(
        auc > 0.6,
        "synthetic data should be learnable, got AUC {auc}"
    );
    assert!(s["table_rows"].as_u64().unwrap() > 1000);
    assert!(s["peak_rss_bytes"].as_u64().unwrap() > 0);
}

/// `--precision bf16` (AMX tiles where the CPU has them) trains the same model as f32 on the
/// same rows: another arithmetic (the metrics differ) with an AUC within 0.01.
#[test]
fn bf16_precision_trains_as_f32_does() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 20000, 1);
    let test = gen(dir.path(), "test.tsv", 5000, 2);
    let run = |precision: &str| {
        let summary = dir.path().join(format!("{precision}.json"));
        let o = sparta(&[
            "train",
            "--train",
            train.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--batch-size",
            "1024",
            "--threads",
            "2",
            "--precision",
            precision,
            "--quiet",
            "--summary-json",
            summary.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{precision}: {}", stderr(&o));
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
        (
            s["test_auc"].as_f64().unwrap(),
            s["test_logloss"].as_f64().unwrap(),
        )
    };
    let (auc32, loss32) = run("f32");
    let (auc16, loss16) = run("bf16");
    assert!(auc32 > 0.65, "f32 AUC {auc32}");
    assert_ne!(loss32, loss16, "bf16 changes the arithmetic");
    assert!(
        (auc16 - auc32).abs() < 0.01,
        "AUC bf16 {auc16} vs f32 {auc32}"
    );
}

#[test]
fn missing_file_is_a_clear_error() {
    let o = sparta(&["train", "--train", "/nonexistent/file.tsv", "--quiet"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("/nonexistent/file.tsv"),
        "error must name the file: {e}"
    );
    assert!(!e.contains("panicked"), "{e}");
}

/// An object URL where an export directory goes is refused, naming it, before anything runs:
/// it is not taken for a relative folder named `s3:` (exports were logged as written to a
/// bucket that stayed empty), and `serve` / `predict` refuse it instead of waiting for a
/// version that never comes.
#[test]
fn exports_and_serving_refuse_object_urls_instead_of_writing_a_folder_named_s3() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 2_000, 1);
    let train = train.to_str().unwrap();
    let work = dir.path().join("cwd");
    std::fs::create_dir(&work).unwrap();
    let url = "s3://b/exports";
    let runs: [&[&str]; 4] = [
        &["train", "--train", train, "--export-dir", url, "--quiet"],
        &["export", "--checkpoint", "ckpt", "--out", url],
        &["serve", "--model", url, "--listen", "127.0.0.1:0"],
        &[
            "predict", "--model", url, "--input", train, "--out", "p.tsv",
        ],
    ];
    for args in runs {
        let o = cmd(args).current_dir(&work).output().unwrap();
        let e = stderr(&o);
        assert!(!o.status.success(), "{args:?}: {e}");
        assert!(
            e.contains(url) && e.contains("not supported for exports"),
            "{args:?}: {e}"
        );
        assert!(!e.contains("panicked"), "{e}");
    }
    let left: Vec<_> = std::fs::read_dir(&work).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = sparta(&["train", "--train", dir.path().to_str().unwrap(), "--quiet"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains(dir.path().to_str().unwrap()), "{e}");
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn garbage_input_stops_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("garbage.bin");
    let bytes: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&p, bytes).unwrap();
    let o = sparta(&["train", "--train", p.to_str().unwrap(), "--quiet"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("garbage.bin"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn empty_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("empty.tsv");
    std::fs::write(&p, "").unwrap();
    let o = sparta(&["train", "--train", p.to_str().unwrap(), "--quiet"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("no valid rows"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn a_few_bad_lines_are_counted_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 3000, 1);
    let mut text = std::fs::read_to_string(&train).unwrap();
    text.push_str("1\tabc\t2\n"); // truncated line with a non-numeric integer
    text.push_str("0\tx\n");
    let p = dir.path().join("mixed.tsv");
    std::fs::write(&p, text).unwrap();
    let summary = dir.path().join("s.json");
    let o = sparta(&[
        "train",
        "--train",
        p.to_str().unwrap(),
        "--batch-size",
        "256",
        "--quiet",
        "--summary-json",
        summary.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(s["bad_lines"], 2);
    assert_eq!(s["train_rows"], 3000);
}

#[test]
fn bad_config_field_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("job.toml");
    std::fs::write(&cfg, "[train]\nepochz = 3\n").unwrap();
    let train = gen(dir.path(), "train.tsv", 100, 1);
    let o = sparta(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--train",
        train.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("epochz"), "{e}");
}

#[test]
fn checkpoints_through_a_file_url_resume_and_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 6000, 1);
    let ckpt = format!("file://{}", dir.path().join("ckpt").display());
    let run = |extra: &[&str], summary: &Path| {
        let mut args = vec![
            "train",
            "--model",
            "wdl",
            "--train",
            train.to_str().unwrap(),
            "--batch-size",
            "500",
            "--threads",
            "1",
            "--quiet",
            "--checkpoint-dir",
            &ckpt,
            "--checkpoint-every-steps",
            "3",
            "--summary-json",
            summary.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = sparta(&args);
        assert!(o.status.success(), "train failed: {}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(summary).unwrap())
            .unwrap()
    };
    // 5 of 12 steps, then resumed from the object-store location to the end.
    let first = run(&["--max-rows", "2500"], &dir.path().join("first.json"));
    assert_eq!(first["train_rows"], 2500);
    let resumed = run(&["--resume", &ckpt], &dir.path().join("resumed.json"));
    assert!(
        resumed["resumed_from"]
            .as_str()
            .unwrap()
            .starts_with("ckpt-"),
        "{resumed}"
    );
    assert_eq!(resumed["train_rows"], 3500, "{resumed}");
    assert_eq!(resumed["samples_trained"], 6000, "{resumed}");
    let o = sparta(&["checkpoint", "inspect", "--json", &ckpt]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["location"].as_str().unwrap().starts_with("file://"));
    let all = report["checkpoints"].as_array().unwrap();
    assert!(
        all.len() >= 3 && all.iter().all(|c| c["valid"] == true),
        "{report}"
    );
    let o = sparta(&["checkpoint", "inspect", "gs://bucket/x"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("s3://bucket"), "{}", stderr(&o));
}

/// `(nice value, name)` of every thread of process `pid` (`/proc/PID/task/*/stat`).
#[cfg(target_os = "linux")]
fn thread_nice_values(pid: u32) -> Vec<(String, i32)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        // After the name: state is field 3, nice field 19.
        let nice = stat[close + 2..]
            .split(' ')
            .nth(19 - 3)
            .unwrap()
            .parse()
            .unwrap();
        out.push((name, nice));
    }
    out.sort();
    out
}

#[cfg(target_os = "linux")]
#[test]
fn train_runs_the_readers_and_the_table_thread_at_pipeline_nice_and_the_dense_threads_at_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 60_000, 1);
    let cfg = dir.path().join("job.toml");
    std::fs::write(&cfg, "[train]\npipeline_nice = 6\n").unwrap();
    let own = thread_nice_values(std::process::id())[0].1;
    let mut c = cmd(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--train",
        train.to_str().unwrap(),
        "--batch-size",
        "256",
        "--threads",
        "2",
        "--reader-threads",
        "2",
        "--quiet",
    ]);
    c.env("RUST_LOG", "warn");
    let p = common::Proc::start(c);
    let pid = p.child.id();
    let fed = (own + 6).min(19);
    // Seen while training: the table's thread exists only during the loop, and each feeding
    // thread lowers its own priority as it starts (until then it reads at `own`): wait for the
    // table's thread and the assembler (alive while batches are left) at `fed`.
    let seen = common::wait_for(
        "the training loop's threads",
        std::time::Duration::from_secs(120),
        || {
            let t = thread_nice_values(pid);
            let at = |n: &str, v: i32| t.iter().any(|(name, nice)| name == n && *nice == v);
            let has = |n: &str| t.iter().any(|(name, _)| name == n);
            (at("sparta-sparse", fed) && at("sparta-assemble", fed) && has("sparta-nn-0"))
                .then_some(t)
        },
    );
    for (name, nice) in &seen {
        let feeding = name == "sparta-sparse"
            || name.starts_with("sparta-parse-")
            || name == "sparta-assemble"
            || name == "sparta-feed";
        if feeding {
            assert_eq!(*nice, fed, "{name}: {seen:?}");
        } else if name.starts_with("sparta-nn-") || name == "sparta" {
            assert_eq!(*nice, own, "{name}: {seen:?}");
        }
    }
    let (ok, log) = p.wait(std::time::Duration::from_secs(300));
    assert!(ok, "{log}");

    // Out of range: refused naming the field.
    std::fs::write(&cfg, "[train]\npipeline_nice = 20\n").unwrap();
    let o = sparta(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--train",
        train.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("train.pipeline_nice"), "{}", stderr(&o));
}
