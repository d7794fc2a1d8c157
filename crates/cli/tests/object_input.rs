//! Training input in object storage (issue 15) on a real S3-compatible server (`moto_server`
//! on loopback, one per test; see `common::s3`): the same training as from local files (plain,
//! gzip and Parquet), kill -9 mid-epoch and resume exact (input in S3; checkpoints in S3 too),
//! each compared with an uninterrupted run, an outage of the server mid-epoch (training
//! waits, retries and goes on with nothing lost or repeated), following a prefix, a missing
//! checkpoint bucket named, and the leftovers of an uncommitted checkpoint removed.

mod common;

use std::path::Path;
use std::time::Duration;

use common::s3::{aws_env, request, Moto, Proxy};
use common::{cmd, committed, gen, json, kill9, s, Proc};

const LONG: Duration = Duration::from_secs(180);

fn gzip(src: &Path, dst: &Path) {
    use std::io::Write;
    let data = std::fs::read(src).unwrap();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&data).unwrap();
    std::fs::write(dst, enc.finish().unwrap()).unwrap();
}

/// `sparta train` on `inputs` (local paths or URLs) against `endpoint`, one thread, fixed
/// seed; returns the summary.
fn train(
    endpoint: &str,
    inputs: &[&str],
    test: &Path,
    out: &Path,
    extra: &[&str],
) -> serde_json::Value {
    let mut c = cmd(&["train", "--model", "wdl", "--threads", "1", "--seed", "7"]);
    c.arg("--train").args(inputs);
    c.args(["--test", s(test), "--batch-size", "256", "--quiet"])
        .args(["--summary-json", s(out)])
        .args(extra);
    aws_env(&mut c, endpoint);
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(ok, "{log}");
    json(out)
}

fn same_training(a: &serde_json::Value, b: &serde_json::Value) {
    for k in [
        "train_rows",
        "samples_trained",
        "train_loss",
        "test_auc",
        "test_logloss",
        "steps",
    ] {
        assert_eq!(a[k], b[k], "{k}: {a} vs {b}");
    }
}

#[test]
fn training_from_s3_equals_training_from_local_files() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    moto.create_bucket("clicks");
    let a = gen(dir.path(), "day-1.tsv", 3000, 1);
    let b_plain = gen(dir.path(), "day-2.tsv", 2000, 2);
    let b = dir.path().join("day-2.tsv.gz");
    gzip(&b_plain, &b);
    let test = gen(dir.path(), "test.tsv", 1000, 3);
    moto.put("clicks", "logs/day-1.tsv", &std::fs::read(&a).unwrap());
    moto.put("clicks", "logs/day-2.tsv.gz", &std::fs::read(&b).unwrap());
    // Not an input: another prefix and a temporary object.
    moto.put("clicks", "other/x.tsv", b"garbage\n");
    moto.put("clicks", "logs/day-3.tsv.tmp", b"garbage\n");
    let ep = moto.endpoint();
    let local = train(
        &ep,
        &[s(&a), s(&b)],
        &test,
        &dir.path().join("l.json"),
        &["--epochs", "2"],
    );
    let remote = train(
        &ep,
        &["s3://clicks/logs/"],
        &test,
        &dir.path().join("r.json"),
        &["--epochs", "2"],
    );
    same_training(&local, &remote);
    assert_eq!(remote["train_rows"], 10_000, "{remote}");
    let input = &remote["input"];
    // The gzip object is fetched as stored (compressed), each epoch.
    let stored = std::fs::metadata(&a).unwrap().len() + std::fs::metadata(&b).unwrap().len();
    assert!(
        input["source_bytes"].as_u64().unwrap() >= 2 * stored,
        "{input}"
    );
    assert_eq!(local["input"]["source_bytes"], 0, "{local}");
    // A glob and single objects name the same inputs.
    let glob = train(
        &ep,
        &["s3://clicks/logs/day-*.tsv*"],
        &test,
        &dir.path().join("g.json"),
        &["--epochs", "2"],
    );
    same_training(&local, &glob);
    // Parquet read from the store (footer and column chunks by ranged GETs) trains as the
    // same file on local disk, and as the text it came from.
    let pq = dir.path().join("day-1.parquet");
    common::ok(
        &common::sparta(&[
            "convert",
            "--input",
            s(&a),
            "--out",
            s(&pq),
            "--row-group-rows",
            "700",
        ]),
        "convert",
    );
    moto.put("clicks", "pq/day-1.parquet", &std::fs::read(&pq).unwrap());
    let text_one = train(&ep, &[s(&a)], &test, &dir.path().join("t1.json"), &[]);
    let pq_local = train(&ep, &[s(&pq)], &test, &dir.path().join("pl.json"), &[]);
    let pq_remote = train(
        &ep,
        &["s3://clicks/pq/"],
        &test,
        &dir.path().join("pr.json"),
        &[],
    );
    same_training(&text_one, &pq_local);
    same_training(&pq_local, &pq_remote);
    let fetched = pq_remote["input"]["source_bytes"].as_u64().unwrap();
    assert!(
        fetched > 0 && fetched <= 2 * std::fs::metadata(&pq).unwrap().len(),
        "{pq_remote}"
    );
    // Missing objects and buckets are named.
    let mut c = cmd(&["train", "--train", "s3://clicks/nothing/", "--quiet"]);
    aws_env(&mut c, &ep);
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(!ok && log.contains("s3://clicks/nothing/"), "{log}");
}

/// Keys under `prefix` in `bucket` (one ListObjectsV2 page: the tests keep fewer than 1000).
fn s3_keys(moto: &Moto, bucket: &str, prefix: &str) -> Vec<String> {
    let (code, body) = request(
        moto.addr,
        "GET",
        &format!("/{bucket}?list-type=2&prefix={prefix}"),
        &[],
    );
    assert_eq!(code, 200, "list {bucket}/{prefix}: {body}");
    body.split("<Key>")
        .skip(1)
        .filter_map(|k| k.split("</Key>").next())
        .map(str::to_string)
        .collect()
}

/// Committed checkpoints (their manifests) under `prefix` in `bucket`.
fn s3_committed(moto: &Moto, bucket: &str, prefix: &str) -> Vec<String> {
    s3_keys(moto, bucket, prefix)
        .into_iter()
        .filter(|k| k.ends_with("/manifest.ckpt"))
        .collect()
}

/// What an exact resume must reproduce of the uninterrupted run: every sample trained once,
/// the same model (its test metrics, bit for bit).
fn same_model(reference: &serde_json::Value, resumed: &serde_json::Value) {
    for k in ["samples_trained", "test_auc", "test_logloss", "test_rows"] {
        assert_eq!(reference[k], resumed[k], "{k}: {reference} vs {resumed}");
    }
}

#[test]
fn kill9_mid_epoch_and_resume_from_s3_input_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    moto.create_bucket("clicks");
    let (rows, epochs) = (16_000u64, 2u64);
    let a = gen(dir.path(), "a.tsv", rows / 2, 11);
    let b = gen(dir.path(), "b.tsv", rows / 2, 12);
    moto.put("clicks", "in/a.tsv", &std::fs::read(&a).unwrap());
    moto.put("clicks", "in/b.tsv", &std::fs::read(&b).unwrap());
    let test = gen(dir.path(), "test.tsv", 1000, 13);
    let ckpt = dir.path().join("ckpt");
    let args = |c: &mut std::process::Command, ckpt: &Path| {
        c.args([
            "--train",
            "s3://clicks/in/",
            "--epochs",
            &epochs.to_string(),
            "--batch-size",
            "128",
            "--exact",
            "--test",
            s(&test),
        ])
        .args(["--threads", "1", "--quiet", "--checkpoint-dir", s(ckpt)])
        .args(["--checkpoint-every-steps", "20"]);
        aws_env(c, &moto.endpoint());
    };
    // The uninterrupted run.
    let reference = dir.path().join("reference.json");
    let mut c = cmd(&["train", "--model", "wdl"]);
    args(&mut c, &dir.path().join("ref-ckpt"));
    c.args(["--summary-json", s(&reference)]);
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(ok, "{log}");
    let reference = json(&reference);
    assert_eq!(reference["samples_trained"], epochs * rows, "{reference}");
    let mut c = cmd(&["train", "--model", "wdl"]);
    args(&mut c, &ckpt);
    let job = Proc::start(c);
    common::wait_for("2 committed checkpoints", LONG, || {
        (committed(&ckpt).len() >= 2).then_some(())
    });
    kill9(job.pid());
    drop(job);
    let out = dir.path().join("resumed.json");
    let mut c = cmd(&["train", "--model", "wdl", "--resume", s(&ckpt)]);
    args(&mut c, &ckpt);
    c.args(["--summary-json", s(&out)]);
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(ok, "{log}");
    let j = json(&out);
    let resumed = j["train_rows"].as_u64().unwrap();
    assert!(
        resumed > 0 && resumed < epochs * rows,
        "not a resume mid-run: {j}"
    );
    same_model(&reference, &j);
    assert!(
        j["resumed_from"].as_str().unwrap().starts_with("ckpt-"),
        "{j}"
    );
}

#[test]
fn an_outage_of_the_store_mid_epoch_is_waited_out_with_nothing_lost() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    moto.create_bucket("clicks");
    let a = gen(dir.path(), "a.tsv", 30_000, 21);
    let test = gen(dir.path(), "test.tsv", 1000, 22);
    moto.put("clicks", "in/a.tsv", &std::fs::read(&a).unwrap());
    let size = std::fs::metadata(&a).unwrap().len();
    // Small blocks and one ahead: reading is still going on when the store goes away after
    // a third of the object has been served.
    let small = ["--epochs", "1"];
    let clean = train(
        &moto.endpoint(),
        &["s3://clicks/in/a.tsv"],
        &test,
        &dir.path().join("c.json"),
        &small,
    );
    let proxy = Proxy::start(moto.addr, size / 3, Duration::from_secs(3));
    let mut c = cmd(&["train", "--model", "wdl", "--threads", "1", "--seed", "7"]);
    c.args([
        "--train",
        "s3://clicks/in/a.tsv",
        "--test",
        s(&test),
        "--batch-size",
        "256",
    ])
    .args(["--quiet", "--epochs", "1"])
    .args(["--summary-json", s(&dir.path().join("o.json"))])
    .env("SPARTA_OBJECT_BLOCK_BYTES", "65536")
    .env("SPARTA_OBJECT_READ_AHEAD", "1");
    aws_env(&mut c, &proxy.endpoint());
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(ok, "{log}");
    let out = json(&dir.path().join("o.json"));
    assert_eq!(proxy.outages.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(
        out["input"]["source_retries"].as_u64().unwrap() >= 1,
        "{out}"
    );
    assert!(
        out["input"]["source_wait_seconds"].as_f64().unwrap() >= 1.0,
        "{out}"
    );
    same_training(&clean, &out);
}

#[test]
fn following_an_s3_prefix_trains_objects_as_they_arrive() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    moto.create_bucket("stream");
    let parts: Vec<_> = (0..3)
        .map(|i| gen(dir.path(), &format!("p{i}.tsv"), 1500, 30 + i))
        .collect();
    moto.put(
        "stream",
        "hourly/00.tsv",
        &std::fs::read(&parts[0]).unwrap(),
    );
    let stop = dir.path().join("stop");
    let out = dir.path().join("f.json");
    let mut c = cmd(&[
        "train",
        "--model",
        "wdl",
        "--threads",
        "1",
        "--batch-size",
        "100",
    ]);
    c.args(["--follow", "s3://stream/hourly/", "--stop-file", s(&stop)])
        .args(["--follow-poll-secs", "0.1", "--summary-json", s(&out)]);
    aws_env(&mut c, &moto.endpoint());
    c.env("RUST_LOG", "sparta_data=info,warn");
    let mut job = Proc::start(c);
    // The first object is read before the next ones exist; they are picked up as they come.
    job.wait_line(LONG, |l| l.contains("reading 00.tsv").then_some(()));
    moto.put(
        "stream",
        "hourly/01.tsv",
        &std::fs::read(&parts[1]).unwrap(),
    );
    job.wait_line(LONG, |l| l.contains("reading 01.tsv").then_some(()));
    moto.put(
        "stream",
        "hourly/02.tsv",
        &std::fs::read(&parts[2]).unwrap(),
    );
    job.wait_line(LONG, |l| l.contains("reading 02.tsv").then_some(()));
    std::fs::write(&stop, b"").unwrap();
    let (ok, log) = job.wait(LONG);
    assert!(ok, "{log}");
    let j = json(&out);
    assert_eq!(j["train_rows"], 4500, "{j}");
    assert_eq!(j["input_position"]["file"], "02.tsv", "{j}");
}

#[test]
fn kill9_with_checkpoints_in_s3_and_resume_from_s3_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    moto.create_bucket("models");
    let rows = 10_000u64;
    let train_file = gen(dir.path(), "train.tsv", rows, 41);
    let test = gen(dir.path(), "test.tsv", 1000, 42);
    let args = |c: &mut std::process::Command, ckpt: &str| {
        c.args([
            "--train",
            s(&train_file),
            "--test",
            s(&test),
            "--epochs",
            "2",
        ])
        .args([
            "--batch-size",
            "128",
            "--threads",
            "1",
            "--exact",
            "--quiet",
        ])
        .args(["--checkpoint-dir", ckpt, "--checkpoint-every-steps", "20"]);
        aws_env(c, &moto.endpoint());
    };
    let reference = dir.path().join("reference.json");
    let mut c = cmd(&["train", "--model", "wdl"]);
    args(&mut c, "s3://models/reference");
    c.args(["--summary-json", s(&reference)]);
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(ok, "{log}");
    let reference = json(&reference);
    assert_eq!(reference["samples_trained"], 2 * rows, "{reference}");
    assert!(!s3_committed(&moto, "models", "reference/").is_empty());
    // The same job, killed once two checkpoints are committed in the bucket.
    let mut c = cmd(&["train", "--model", "wdl"]);
    args(&mut c, "s3://models/run");
    let job = Proc::start(c);
    common::wait_for("2 committed checkpoints in s3://models/run", LONG, || {
        (s3_committed(&moto, "models", "run/").len() >= 2).then_some(())
    });
    kill9(job.pid());
    drop(job);
    let out = dir.path().join("resumed.json");
    let mut c = cmd(&["train", "--model", "wdl", "--resume", "s3://models/run"]);
    args(&mut c, "s3://models/run");
    c.args(["--summary-json", s(&out)]);
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(ok, "{log}");
    let j = json(&out);
    let resumed = j["train_rows"].as_u64().unwrap();
    assert!(
        resumed > 0 && resumed < 2 * rows,
        "not a resume mid-run: {j}"
    );
    assert!(
        j["resumed_from"].as_str().unwrap().starts_with("ckpt-"),
        "{j}"
    );
    same_model(&reference, &j);
}

#[test]
fn a_checkpoint_bucket_that_does_not_exist_is_named_with_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    let tr = gen(dir.path(), "train.tsv", 300, 1);
    let mut c = cmd(&["train", "--model", "wdl", "--train", s(&tr), "--quiet"]);
    c.args(["--checkpoint-dir", "s3://no-such-bucket/ckpt"]);
    aws_env(&mut c, &moto.endpoint());
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(!ok, "{log}");
    assert!(log.contains("s3://no-such-bucket/ckpt"), "{log}");
    assert!(
        log.contains("the bucket `no-such-bucket` does not exist"),
        "{log}"
    );
    assert!(!log.contains("write-probe"), "{log}");
}

#[test]
fn leftovers_of_an_uncommitted_checkpoint_in_s3_are_removed_by_the_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    moto.create_bucket("models");
    let tr = gen(dir.path(), "train.tsv", 2000, 1);
    // What a write interrupted before its commit leaves: part objects, no manifest.
    let partial = "run/ckpt-0000000000000001/table-embedding.ps-0.rows";
    moto.put("models", partial, b"partial");
    moto.put(
        "models",
        "run/ckpt-0000000000000001/dense.worker-0.bin",
        b"partial",
    );
    let mut c = cmd(&["train", "--model", "wdl", "--train", s(&tr), "--quiet"]);
    c.args(["--batch-size", "128", "--threads", "1"]).args([
        "--checkpoint-dir",
        "s3://models/run",
        "--checkpoint-every-steps",
        "5",
    ]);
    aws_env(&mut c, &moto.endpoint());
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(ok, "{log}");
    let keys = s3_keys(&moto, "models", "run/");
    assert!(
        !keys
            .iter()
            .any(|k| k.starts_with("run/ckpt-0000000000000001/")),
        "{keys:?}"
    );
    assert!(
        !s3_committed(&moto, "models", "run/").is_empty(),
        "{keys:?}"
    );
}
