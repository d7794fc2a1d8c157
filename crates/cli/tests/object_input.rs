//! Training input in object storage (issue 15) on a real S3-compatible server (`moto_server`
//! on loopback, one per test; see `common::s3`): the same training as from local files (plain,
//! gzip and Parquet), kill -9 mid-epoch and resume exact, an outage of the server mid-epoch (training
//! waits, retries and goes on with nothing lost or repeated), and following a prefix.

mod common;

use std::path::Path;
use std::time::Duration;

use common::s3::{aws_env, Moto, Proxy};
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

#[test]
fn kill9_mid_epoch_and_resume_from_s3_input_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    moto.create_bucket("clicks");
    let rows = 40_000u64;
    let a = gen(dir.path(), "a.tsv", rows / 2, 11);
    let b = gen(dir.path(), "b.tsv", rows / 2, 12);
    moto.put("clicks", "in/a.tsv", &std::fs::read(&a).unwrap());
    moto.put("clicks", "in/b.tsv", &std::fs::read(&b).unwrap());
    let ckpt = dir.path().join("ckpt");
    let args = |c: &mut std::process::Command| {
        c.args([
            "--train",
            "s3://clicks/in/",
            "--epochs",
            "3",
            "--batch-size",
            "128",
        ])
        .args(["--threads", "1", "--quiet", "--checkpoint-dir", s(&ckpt)])
        .args(["--checkpoint-every-steps", "40"]);
        aws_env(c, &moto.endpoint());
    };
    let mut c = cmd(&["train", "--model", "wdl"]);
    args(&mut c);
    let job = Proc::start(c);
    common::wait_for("2 committed checkpoints", LONG, || {
        (committed(&ckpt).len() >= 2).then_some(())
    });
    kill9(job.pid());
    drop(job);
    let out = dir.path().join("resumed.json");
    let mut c = cmd(&["train", "--model", "wdl", "--resume", s(&ckpt)]);
    args(&mut c);
    c.args(["--summary-json", s(&out)]);
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(ok, "{log}");
    let j = json(&out);
    assert_eq!(j["samples_trained"], 3 * rows, "{j}");
    let resumed = j["train_rows"].as_u64().unwrap();
    assert!(resumed < 3 * rows, "the resume re-read everything: {j}");
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
