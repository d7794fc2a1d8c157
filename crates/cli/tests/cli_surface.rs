//! What the `sparta` binary shows a user around the training itself: `sparta demo` (the
//! README's first command), the help of the cluster commands, the log lines (inputs named,
//! progress, colour) and the job summary worker 0 of a hand-started cluster writes.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::{cmd, count_lines, gen, json, ok, s, sparta, start_ps, stderr, Proc};

const LONG: Duration = Duration::from_secs(120);

/// The value after `key ` in `line` (`AUC 0.7066,` -> 0.7066).
fn number_after(line: &str, key: &str) -> Option<f64> {
    let rest = line.split(&format!("{key} ")).nth(1)?;
    rest.split([',', ' ', ')'])
        .next()?
        .trim_end_matches('%')
        .parse()
        .ok()
}

#[test]
fn demo_prints_auc_logloss_and_samples_per_sec_with_an_auc_well_above_chance() {
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("demo.json");
    let o = sparta(&[
        "demo",
        "--train-rows",
        "30000",
        "--test-rows",
        "4000",
        "--threads",
        "1",
        "--dir",
        s(dir.path()),
        "--summary-json",
        s(&summary),
    ]);
    ok(&o, "demo");
    let out = String::from_utf8_lossy(&o.stdout);
    let model = out
        .lines()
        .find(|l| l.starts_with("model wdl: 30000 train rows"))
        .unwrap_or_else(|| panic!("no model line: {out}"));
    let rate: f64 = model
        .split(" samples/s end to end")
        .next()
        .and_then(|h| h.rsplit('(').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no samples/s in: {model}"));
    assert!(rate > 0.0, "{model}");
    let test = out
        .lines()
        .find(|l| l.starts_with("test: 4000 rows, AUC "))
        .unwrap_or_else(|| panic!("no test line: {out}"));
    let auc = number_after(test, "AUC").unwrap();
    let logloss = number_after(test, "logloss").unwrap();
    assert!(auc > 0.65, "demo AUC {auc}: {test}");
    assert!(
        logloss > 0.0 && logloss < 0.69,
        "demo logloss {logloss}: {test}"
    );
    let j = json(&summary);
    assert!((j["test_auc"].as_f64().unwrap() - auc).abs() < 1e-4, "{j}");
    assert_eq!(j["train_rows"], 30_000, "{j}");
    // The generated files stay in --dir.
    assert_eq!(count_lines(&dir.path().join("train.tsv")), 30_000);
}

/// The long flags of the option lines of a `--help` text (`  -x, --flag <V>  ...`).
fn listed_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|l| {
            let t = l.trim_start();
            let t = t
                .strip_prefix('-')
                .filter(|r| !r.starts_with('-'))
                .map_or(t, |r| r.split_once(", ").map_or(r, |(_, rest)| rest));
            let flag = t.split([' ', '=']).next()?;
            (flag.starts_with("--") && flag.len() > 2).then(|| flag.to_string())
        })
        .collect()
}

/// The flags a cluster command's help says it does not take (the line it prints after the
/// options, written from the list its refusal checks).
fn refused_flags(help: &str) -> Vec<String> {
    let line = help
        .lines()
        .find_map(|l| l.strip_prefix("Not taken by a PS cluster (embedded `sparta train` only): "))
        .unwrap_or_else(|| panic!("no refused flags named in:\n{help}"));
    line.split(", ").map(String::from).collect()
}

fn help(sub: &str) -> String {
    let o = sparta(&[sub, "--help"]);
    ok(&o, &format!("{sub} --help"));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn launch_and_worker_help_list_no_flag_they_refuse() {
    let train = listed_flags(&help("train"));
    for sub in ["launch", "worker"] {
        let text = help(sub);
        let refused = refused_flags(&text);
        for f in ["--predict-out", "--predict-input"] {
            assert!(refused.iter().any(|r| r == f), "{sub}: {f} not named");
        }
        let listed = listed_flags(&text);
        // A cluster reads a Kafka topic too (each worker its partitions).
        for f in ["--train", "--test", "--kafka", "--topic", "--kafka-drain"] {
            assert!(
                listed.contains(f),
                "`sparta {sub} --help` lacks {f}:\n{text}"
            );
        }
        for f in &refused {
            assert!(train.contains(f), "{f} is not a flag of `sparta train`");
            assert!(
                !listed.contains(f),
                "`sparta {sub} --help` lists {f}:\n{text}"
            );
        }
    }
}

#[test]
fn a_flag_left_out_of_the_cluster_help_is_still_refused_with_the_reason() {
    let o = sparta(&[
        "launch",
        "--train",
        "x.tsv",
        "--predict-input",
        "x.tsv",
        "--predict-out",
        "p.txt",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(
            "--predict-out is supported by embedded `sparta train` only, not by `sparta launch`"
        ),
        "{err}"
    );
}

#[test]
fn log_lines_piped_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let data = gen(dir.path(), "train.tsv", 1000, 1);
    let o = cmd(&["train", "--train", s(&data), "--threads", "1", "--quiet"])
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    ok(&o, "train");
    let err = stderr(&o);
    assert!(err.contains("training wdl on 1 file(s)"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "escape codes in a piped log: {err:?}"
    );
}

/// `(percent, samples)` of a progress log line (`train 41.3% 8192 samples, ...`).
fn progress_line(l: &str) -> Option<(f64, u64)> {
    let rest = l.split(" train ").nth(1)?;
    let (pct, rest) = rest.split_once("% ")?;
    let samples = rest.split_once(" samples,")?.0;
    Some((pct.parse().ok()?, samples.parse().ok()?))
}

#[test]
fn the_progress_percentage_tracks_the_rows_trained_not_the_rows_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let rows = 30_000u64;
    let data = gen(dir.path(), "train.tsv", rows, 1);
    let mut c = cmd(&["train", "--train", s(&data), "--threads", "1"]);
    c.args(["--reader-threads", "2", "--batch-size", "128"])
        .args(["--progress-every-secs", "0.05"])
        .env("RUST_LOG", "info");
    let (okay, log) = Proc::start(c).wait(LONG);
    assert!(okay, "{log}");
    let lines: Vec<(f64, u64)> = log.lines().filter_map(progress_line).collect();
    assert!(lines.len() >= 3, "too few progress lines: {log}");
    for (pct, samples) in &lines {
        let trained = 100.0 * *samples as f64 / rows as f64;
        // One batch of 128 rows (the pipeline's) is 0.4 % of the file.
        assert!(
            (pct - trained).abs() < 2.0,
            "progress {pct}% with {samples} of {rows} rows trained ({trained:.1}%): {lines:?}"
        );
    }
}

#[test]
fn the_log_counts_the_objects_an_s3_prefix_names() {
    let dir = tempfile::tempdir().unwrap();
    let moto = common::s3::Moto::start();
    moto.create_bucket("clicks");
    for i in 0..4 {
        let p = gen(dir.path(), &format!("part-{i}.tsv"), 200, i);
        moto.put(
            "clicks",
            &format!("logs/part-{i}.tsv"),
            &std::fs::read(&p).unwrap(),
        );
    }
    let local = gen(dir.path(), "local.tsv", 200, 9);
    let mut c = cmd(&["train", "--train", "s3://clicks/logs/", s(&local)]);
    c.args(["--threads", "1", "--quiet"])
        .env("RUST_LOG", "info");
    common::s3::aws_env(&mut c, &moto.endpoint());
    let (okay, log) = Proc::start(c).wait(LONG);
    assert!(okay, "{log}");
    assert!(
        log.contains("training wdl on 5 file(s) (s3://clicks/logs/: 4 objects), batch"),
        "{log}"
    );
}

/// `sparta worker` `rank` of 2 on `addr`, writing its summary to `out` (and progress lines
/// every 20 ms).
fn worker(rank: usize, addr: &str, config: &Path, train: &Path, test: &Path, out: &Path) -> Proc {
    let mut c = cmd(&["worker", "--rank", &rank.to_string(), "--num-workers", "2"]);
    c.args(["--ps", addr, "--config", s(config), "--train", s(train)])
        .args(["--test", s(test), "--summary-json", s(out)])
        .args(["--progress-every-secs", "0.02"])
        .env("SPARTA_TOKEN", "tok")
        .env("RUST_LOG", "info");
    Proc::start(c)
}

#[test]
fn a_hand_started_clusters_worker_0_writes_the_job_totals_and_a_worker_shows_progress_of_its_part()
{
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("job.toml");
    std::fs::write(
        &config,
        "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nhidden = [16]\n[train]\nthreads = 1\n",
    )
    .unwrap();
    let train = gen(dir.path(), "train.tsv", 6000, 1);
    let test = gen(dir.path(), "test.tsv", 1000, 2);
    let args = ["--workers", "2", "--shard", "0", "--num-shards", "1"];
    let (_ps, addr) = start_ps(
        &[&args[..], &["--config", s(&config)]].concat(),
        Some("tok"),
    );
    let (o0, o1) = (dir.path().join("w0.json"), dir.path().join("w1.json"));
    let w1 = worker(1, &addr, &config, &train, &test, &o1);
    let w0 = worker(0, &addr, &config, &train, &test, &o0);
    let (ok0, log0) = w0.wait(LONG);
    assert!(ok0, "{log0}");
    let (ok1, log1) = w1.wait(LONG);
    assert!(ok1, "{log1}");
    let (j0, j1) = (json(&o0), json(&o1));
    let own = &j0["worker"];
    assert!(
        own["train_rows"].as_u64().unwrap() > 0 && j1["train_rows"].as_u64().unwrap() > 0,
        "both workers train: {j0} {j1}"
    );
    assert_eq!(j0["train_rows"], 6000, "{j0}");
    assert_eq!(j0["samples_trained"], 6000, "{j0}");
    let sum = |k: &str| own[k].as_u64().unwrap() + j1[k].as_u64().unwrap();
    assert_eq!(j0["train_rows"], sum("train_rows"), "{j0} {j1}");
    assert_eq!(j0["steps"], sum("steps"), "{j0} {j1}");
    assert_eq!(j0["workers_reported"], 2, "{j0}");
    assert_eq!(j0["test_rows"], 1000, "{j0}");
    // Worker 1 writes its own figures.
    assert!(j1.get("workers_reported").is_none(), "{j1}");
    assert_eq!(j1["rank"], 1, "{j1}");
    // Its progress is of its own half of the input.
    let rows = j1["train_rows"].as_u64().unwrap();
    let lines: Vec<(f64, u64)> = log1.lines().filter_map(progress_line).collect();
    assert!(!lines.is_empty(), "no progress lines: {log1}");
    for (pct, samples) in &lines {
        let trained = 100.0 * *samples as f64 / rows as f64;
        // One batch of 64 rows is 2.1 % of the part.
        assert!(
            (pct - trained).abs() < 3.0,
            "worker 1 progress {pct}% with {samples} of its {rows} rows trained: {lines:?}"
        );
    }
}
