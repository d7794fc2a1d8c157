//! Training from a Kafka topic on a real broker (Tansu, Kafka-API compatible, in memory) on
//! loopback: a topic of 3 partitions, `sparta train --kafka` killed with SIGKILL after a
//! checkpoint while a producer writes, resumed: every record trained exactly once; then
//! followed online while a producer writes, with exports picked up by `sparta serve`.
//!
//! Every record carries a unique id in column C26 (its own table), so "exactly once" is
//! checked per record: the rows trained (`samples_trained`, counted once per trained row)
//! equal the records produced AND the C26 table holds as many distinct ids: a record
//! skipped would leave an id missing, a record repeated would make the count exceed it.
//!
//! The broker: see `common::kafka`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::kafka::{self, offsets, records, trained, Broker};
use common::{cmd, gen, json, kill9, s, Proc};

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(180);

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, LIMIT, f)
}

fn produce(broker: &Broker, file: &Path, rate: Option<u32>) -> Proc {
    kafka::produce(broker, "clicks", file, rate)
}

fn produce_all(broker: &Broker, file: &Path) {
    kafka::produce_all(broker, "clicks", file);
}

fn train(broker: &Broker, dir: &Path, extra: &[&str]) -> Proc {
    let mut c = cmd(&[
        "train",
        "--model",
        "wdl",
        "--kafka",
        &broker.addr,
        "--topic",
        "clicks",
    ]);
    c.args([
        "--batch-size",
        "64",
        "--threads",
        "1",
        "--reader-threads",
        "2",
    ])
    .args(["--checkpoint-dir", s(&dir.join("ckpt"))])
    .args(["--checkpoint-every-steps", "10", "--quiet"])
    .args(extra)
    .env("RUST_LOG", "info");
    Proc::start(c)
}

fn model_version(addr: SocketAddr) -> u64 {
    let m = common::http::model(addr).expect("a served model");
    m["version"].as_u64().unwrap()
}

#[test]
fn kill9_resume_trains_every_record_once_then_follows_into_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start();
    broker.create_topic("clicks", 3);
    let (a, b, c, e) = (20_000, 20_000, 3_000, 3_000);
    let part_a = records(d, "a.tsv", 0, a, 1);
    let part_b = records(d, "b.tsv", a, b, 2);
    produce_all(&broker, &part_a);

    // Run 1: trains while a producer writes more; SIGKILL right after its first checkpoint.
    let mut run1 = train(&broker, d, &[]);
    let writer = produce(&broker, &part_b, Some(20_000));
    let ckpt = d.join("ckpt");
    wait_for("a checkpoint of run 1", || {
        (!common::committed(&ckpt).is_empty()).then_some(())
    });
    kill9(run1.pid());
    let (ok, log) = writer.wait(LIMIT);
    assert!(ok, "kafka-produce: {log}");
    let _ = run1.log();

    // Run 2: resumes at the checkpoint's offsets and drains the topic: every record once.
    let json2 = d.join("run2.json");
    let resume = [
        "--resume",
        s(&ckpt),
        "--kafka-drain",
        "--summary-json",
        s(&json2),
    ];
    let (ok, log) = train(&broker, d, &resume).wait(LIMIT);
    assert!(ok, "run 2: {log}");
    let sum2 = json(&json2);
    assert!(
        sum2["train_rows"].as_u64().unwrap() > 0 && sum2["train_rows"].as_u64().unwrap() < a + b,
        "run 1 was killed mid-stream: {}",
        sum2["train_rows"]
    );
    assert_eq!(
        trained(&sum2),
        (a + b, a + b),
        "every record trained exactly once"
    );
    let ends2 = offsets(&sum2);
    assert_eq!(ends2.len(), 3);
    assert_eq!(ends2.iter().map(|(_, o)| *o as u64).sum::<u64>(), a + b);
    assert!(log.contains("kafka: topic clicks partition"), "{log}");

    // Run 3: follows the topic with exports; a server picks them up as records arrive.
    let export = d.join("export");
    let json3 = d.join("run3.json");
    let mut run3 = train(
        &broker,
        d,
        &[
            "--resume",
            s(&ckpt),
            "--export-dir",
            s(&export),
            "--export-every-steps",
            "5",
            "--summary-json",
            s(&json3),
        ],
    );
    produce_all(&broker, &records(d, "c.tsv", a + b, c, 3));
    wait_for("the first export", || {
        export
            .join("v0000000001")
            .join("manifest.json")
            .exists()
            .then_some(())
    });
    let mut srv = cmd(&["serve", "--model", s(&export), "--listen", "127.0.0.1:0"]);
    srv.args(["--poll-ms", "50", "--threads", "1"]);
    let mut server = Proc::start(srv);
    let addr: SocketAddr = server.wait_line(LIMIT, |l| {
        l.trim()
            .strip_prefix("listening on http://")
            .map(|a| a.parse().unwrap())
    });
    let before = model_version(addr);
    produce_all(&broker, &records(d, "e.tsv", a + b + c, e, 4));
    wait_for("the server's version to advance", || {
        (model_version(addr) > before).then_some(())
    });
    // Every record of the topic handed to training (the stream logs when it catches up).
    let total = a + b + c + e;
    let caught_up = format!("kafka: caught up after {total} rows");
    run3.wait_line(LIMIT, |l| l.contains(&caught_up).then_some(()));
    common::signal(run3.pid(), "-TERM");
    let (ok, log) = run3.wait(LIMIT);
    assert!(ok, "run 3: {log}");
    let sum3 = json(&json3);
    assert_eq!(
        trained(&sum3),
        (total, total),
        "every record trained exactly once"
    );
    assert_eq!(
        offsets(&sum3).iter().map(|(_, o)| *o as u64).sum::<u64>(),
        total
    );
    drop(server);
}

#[test]
fn kafka_flags_are_checked_before_anything_runs() {
    let refused = |args: &[&str], expect: &str| {
        let o = common::sparta(args);
        let err = common::stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(expect), "{args:?}: {err}");
    };
    refused(&["train", "--kafka", "127.0.0.1:9092"], "--topic");
    refused(
        &["train", "--train", "x.tsv", "--kafka-drain"],
        "--kafka-drain has no effect without --kafka",
    );
    refused(
        &[
            "train",
            "--kafka",
            "127.0.0.1:9092",
            "--topic",
            "t",
            "--train",
            "x.tsv",
        ],
        "cannot be used with",
    );
    refused(
        &[
            "train",
            "--kafka",
            "127.0.0.1:9092",
            "--topic",
            "t",
            "--kafka-from",
            "middle",
        ],
        "--kafka-from \"middle\": expected earliest or latest",
    );
    refused(
        &["train", "--kafka", "localhost", "--topic", "t"],
        "expected host:port",
    );
    // A cluster reads a topic, but not where it cannot work, saying why.
    refused(
        &[
            "worker",
            "--rank",
            "0",
            "--num-workers",
            "1",
            "--ps",
            "127.0.0.1:1",
            "--kafka",
            "127.0.0.1:9092",
            "--topic",
            "t",
            "--pipeline",
        ],
        "--pipeline (train.pipeline) with --kafka is not supported by `sparta worker`: a worker \
         whose partitions are quiet joins the other workers' checkpoint round",
    );
    refused(
        &[
            "launch",
            "--mode",
            "allreduce",
            "--kafka",
            "127.0.0.1:9092",
            "--topic",
            "t",
        ],
        "--mode allreduce steps every worker together, which online input (--follow, --kafka) \
         does not",
    );
    refused(
        &[
            "launch",
            "--kafka",
            "127.0.0.1:9092",
            "--topic",
            "t",
            "--kafka-from",
            "middle",
        ],
        "--kafka-from \"middle\": expected earliest or latest",
    );
}

#[test]
fn a_missing_topic_is_a_clear_error() {
    let broker = Broker::start();
    let o = common::sparta(&["train", "--kafka", &broker.addr, "--topic", "nope"]);
    assert!(!o.status.success());
    let err = common::stderr(&o);
    assert!(err.contains("--topic nope: no such topic"), "{err}");
}

#[test]
fn a_followed_topic_stopped_by_sigterm_reports_stopped_early() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start();
    broker.create_topic("clicks", 1);
    let rows = 300;
    produce_all(&broker, &gen(d, "a.tsv", rows, 1));
    let summary = d.join("run.json");
    let mut run = train(&broker, d, &["--summary-json", s(&summary)]);
    let caught_up = format!("kafka: caught up after {rows} rows");
    run.wait_line(LIMIT, |l| l.contains(&caught_up).then_some(()));
    common::signal(run.pid(), "-TERM");
    let (ok, log) = run.wait(LIMIT);
    assert!(ok, "train: {log}");
    let sum = json(&summary);
    assert_eq!(sum["stopped_early"], true, "{sum}");
    assert_eq!(sum["samples_trained"], rows, "{sum}");
}
