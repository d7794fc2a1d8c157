//! Parquet input end to end with the real binary: `sparta gen-data` -> `sparta convert` ->
//! `sparta train` gives the same summary as training on the text (same batches, same
//! numbers), and `sparta train --follow` trains Parquet files as they are shipped.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cmd, gen, json, ok, s, sparta, Proc};

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(120);

/// `sparta convert` of `text` into `out`.
fn convert(text: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec!["convert", "--input", s(text), "--out", s(out)];
    args.extend_from_slice(extra);
    let o = sparta(&args);
    ok(&o, "convert");
}

fn train(train: &Path, test: &Path, summary: &Path) -> serde_json::Value {
    let o = sparta(&[
        "train",
        "--model",
        "wdl",
        "--train",
        s(train),
        "--test",
        s(test),
        "--batch-size",
        "256",
        "--threads",
        "1",
        "--reader-threads",
        "2",
        "--quiet",
        "--summary-json",
        s(summary),
    ]);
    ok(&o, "train");
    json(summary)
}

#[test]
fn training_on_the_converted_file_gives_the_text_summary() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = gen(dir.path(), "train.tsv", 5000, 1);
    let test = gen(dir.path(), "test.tsv", 1500, 2);
    let zstd = dir.path().join("train.parquet");
    convert(&tsv, &zstd, &["--row-group-rows", "1200"]);
    let snappy = dir.path().join("train-snappy.parquet");
    convert(
        &tsv,
        &snappy,
        &["--compression", "snappy", "--row-group-rows", "700"],
    );
    let want = train(&tsv, &test, &dir.path().join("tsv.json"));
    for pq in [&zstd, &snappy] {
        let got = train(pq, &test, &dir.path().join("pq.json"));
        for key in [
            "train_rows",
            "test_rows",
            "bad_lines",
            "test_auc",
            "test_logloss",
        ] {
            assert_eq!(got[key], want[key], "{key} of {}: {got}", pq.display());
        }
    }
    assert_eq!(want["train_rows"], 5000);

    // A bad flag value names the flag and what was expected.
    let o = sparta(&[
        "convert",
        "--input",
        s(&tsv),
        "--out",
        s(&zstd),
        "--compression",
        "lz5",
    ]);
    assert!(!o.status.success());
    let e = common::stderr(&o);
    assert!(e.contains("--compression") && e.contains("zstd"), "{e}");
}

/// Converts `rows` synthetic rows into `dir/name` as a shipper does: written elsewhere,
/// renamed in when complete.
fn ship(staging: &Path, dir: &Path, name: &str, rows: u64, seed: u64) -> PathBuf {
    let tsv = gen(staging, &format!("{name}.tsv"), rows, seed);
    let tmp = staging.join(name);
    convert(&tsv, &tmp, &["--row-group-rows", "300"]);
    let p = dir.join(name);
    std::fs::rename(&tmp, &p).unwrap();
    p
}

#[test]
fn follow_trains_parquet_files_as_they_arrive() {
    let dir = tempfile::tempdir().unwrap();
    let (input, staging) = (dir.path().join("in"), dir.path().join("staging"));
    std::fs::create_dir(&input).unwrap();
    std::fs::create_dir(&staging).unwrap();
    let stop = dir.path().join("STOP");
    let summary = dir.path().join("summary.json");
    let mut c = cmd(&["train", "--model", "wdl", "--follow", s(&input)]);
    c.args(["--stop-file", s(&stop)])
        .args(["--follow-poll-secs", "0.05", "--follow-settle-secs", "0"])
        .args([
            "--batch-size",
            "200",
            "--threads",
            "1",
            "--reader-threads",
            "2",
        ])
        .args(["--summary-json", s(&summary), "--quiet"])
        .env("RUST_LOG", "info");
    let mut trainer = Proc::start(c);
    ship(&staging, &input, "2024-05-01T00.parquet", 1000, 1);
    trainer.wait_line(LIMIT, |l| {
        l.contains("reading 2024-05-01T00.parquet").then_some(())
    });
    ship(&staging, &input, "2024-05-01T01.parquet", 700, 2);
    trainer.wait_line(LIMIT, |l| {
        l.contains("reading 2024-05-01T01.parquet").then_some(())
    });
    std::fs::write(&stop, b"").unwrap();
    let (ok, log) = trainer.wait(LIMIT);
    assert!(ok, "train --follow failed:\n{log}");
    let sum = json(&summary);
    assert_eq!(sum["train_rows"], 1700, "{sum}");
    assert_eq!(sum["bad_lines"], 0, "{sum}");
}
