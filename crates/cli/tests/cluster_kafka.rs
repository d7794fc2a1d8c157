//! A Kafka topic read by a PS cluster, on a real broker (Tansu) on loopback: every worker
//! reads its partitions (partition p goes to worker p mod M), every worker's offsets ride
//! the cluster checkpoint, so drains, kill -9 of a worker and of a PS (plain and with
//! `--replicas 2`), a resume with another worker count and more workers than partitions
//! (sync: the idle worker leaves; async: it stays and joins the checkpoint rounds) all train
//! every record exactly once; a followed topic is exported and served, and each worker's lag
//! metrics fall to zero once the producer stops.
//!
//! Every record carries a unique id in column C26 (its own table), so "exactly once" is
//! checked per record: the rows trained (`samples_trained`) equal the records produced AND
//! the C26 table holds as many distinct ids (a record skipped leaves an id missing, a record
//! trained twice makes the row count exceed the ids).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::kafka::{offsets, produce, produce_all, records, trained, Broker};
use common::{cmd, committed, json, kill9, s, signal, start_ps, Proc};

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(240);

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, LIMIT, f)
}

/// A small wdl job (one compute and one reader thread, batches of 64), checkpoints in
/// `dir/ckpt` every `every` steps, with `extra` TOML appended.
fn job(dir: &Path, every: u64, extra: &str) -> PathBuf {
    let p = dir.join("job.toml");
    std::fs::write(
        &p,
        format!(
            "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nkind = \"wdl\"\n\
             hidden = [16]\n[train]\nthreads = 1\ncheckpoint_dir = {:?}\n\
             checkpoint_every_steps = {every}\n{extra}",
            s(&dir.join("ckpt"))
        ),
    )
    .unwrap();
    p
}

/// `sparta launch` of `workers` workers on topic `clicks` with the job of `job` (its summary
/// in `summary`), `extra` flags added.
fn launch(broker: &Broker, config: &Path, workers: u32, summary: &Path, extra: &[&str]) -> Proc {
    let mut c = cmd(&["launch", "--workers", &workers.to_string()]);
    c.args(["--config", s(config), "--kafka", &broker.addr])
        .args(["--topic", "clicks", "--quiet", "--max-restarts", "4"])
        .args(["--summary-json", s(summary)])
        .args(extra)
        .env("RUST_LOG", "info,rskafka=warn");
    Proc::start(c)
}

fn newest(ckpt: &Path) -> Option<String> {
    committed(ckpt).pop()
}

/// Waits for a checkpoint committed after `after` (any, when `None`).
fn checkpoint_after(job: &mut Proc, ckpt: &Path, after: Option<&str>) -> String {
    job.wait_until("a new checkpoint", LIMIT, || {
        newest(ckpt).filter(|n| after.is_none_or(|a| n.as_str() > a))
    })
}

#[test]
fn two_workers_drain_a_topic_exactly_then_one_worker_resumes_from_their_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start();
    broker.create_topic("clicks", 4);
    let (a, b) = (4_000, 2_000);
    produce_all(&broker, "clicks", &records(d, "a.tsv", 0, a, 1));
    let config = job(d, 10, "");

    // 2 PS, 2 workers: each drains its two partitions (p mod 2), every record once.
    let sum1 = d.join("run1.json");
    let (ok, log) = launch(&broker, &config, 2, &sum1, &["--ps", "2", "--kafka-drain"]).wait(LIMIT);
    assert!(ok, "run 1: {log}");
    let j1 = json(&sum1);
    assert_eq!(
        trained(&j1),
        (a, a),
        "every record trained exactly once: {j1}"
    );
    // The producer wrote 250 records to each partition in turn: 1000 each. Worker 0 read
    // partitions 0 and 2 to their ends.
    assert_eq!(
        offsets(&j1),
        [(0, 1_000), (2, 1_000)],
        "{}",
        j1["input_position"]
    );
    assert!(
        log.contains("kafka: topic clicks partition 1 from offset 0 to 1000"),
        "{log}"
    );

    // More records, and one worker: it continues every partition where the two stopped.
    produce_all(&broker, "clicks", &records(d, "b.tsv", a, b, 2));
    let sum2 = d.join("run2.json");
    let ckpt = d.join("ckpt");
    let resume = ["--ps", "2", "--kafka-drain", "--resume", s(&ckpt)];
    let (ok, log) = launch(&broker, &config, 1, &sum2, &resume).wait(LIMIT);
    assert!(ok, "run 2: {log}");
    let j2 = json(&sum2);
    assert_eq!(
        trained(&j2),
        (a + b, a + b),
        "every record trained exactly once: {j2}"
    );
    assert_eq!(j2["train_rows"], b, "only the new records: {j2}");
    let ends = offsets(&j2);
    assert_eq!(
        ends.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert_eq!(ends.iter().map(|(_, o)| *o as u64).sum::<u64>(), a + b);
    for p in 0..4 {
        let from = format!("kafka: topic clicks partition {p} from offset 1000 to 1500");
        assert!(log.contains(&from), "{from}:\n{log}");
    }
}

/// Run 1 follows the topic while a producer writes; a worker is killed (-9) after a
/// checkpoint, then a PS after a checkpoint of the recovered cluster; then every worker is
/// stopped with SIGTERM. Run 2 resumes and drains the topic. Every record is trained exactly
/// once across both (`samples_trained`), and every record's unique C26 id is in the table
/// (with `--replicas 2` the PS kill is a failover: the pushes in flight are sent again at the
/// promoted copies, which first create the rows the dead primary's pulls had created).
fn kill9_of_a_worker_then_of_a_ps_trains_every_record_once(replicas: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start();
    broker.create_topic("clicks", 4);
    let n = 6_000;
    let config = job(d, 10, "");
    let ckpt = d.join("ckpt");
    let writer = produce(&broker, "clicks", &records(d, "a.tsv", 0, n, 1), Some(500));
    let sum1 = d.join("run1.json");
    let flags = ["--ps", "2", "--replicas", replicas];
    let mut run1 = launch(&broker, &config, 2, &sum1, &flags);

    checkpoint_after(&mut run1, &ckpt, None);
    let w1 = run1.started_pid("w1").unwrap();
    kill9(w1);
    // No checkpoint commits without worker 1: the newest now is the one to roll back to.
    let before = newest(&ckpt).unwrap();
    run1.wait_started("w1", Some(w1), LIMIT);
    checkpoint_after(&mut run1, &ckpt, Some(&before));
    let ps1 = run1.started_pid("ps1").unwrap();
    kill9(ps1);
    let before = newest(&ckpt).unwrap();
    run1.wait_started("ps1", Some(ps1), LIMIT);
    checkpoint_after(&mut run1, &ckpt, Some(&before));
    for w in ["w0", "w1"] {
        signal(run1.started_pid(w).unwrap(), "-TERM");
    }
    let (ok, log) = run1.wait(LIMIT);
    assert!(ok, "run 1: {log}");
    let j1 = json(&sum1);
    let restarts = &j1["restarts"];
    assert_eq!(
        (&restarts["ps"], &restarts["worker"]),
        (&1.into(), &1.into()),
        "{j1}"
    );
    let (ids, rows) = trained(&j1);
    assert!(rows > 0, "{j1}");
    assert!(
        ids == rows,
        "no record trained twice or skipped by run 1 ({ids} ids, {rows} rows): {j1}"
    );

    let (ok, log) = writer.wait(LIMIT);
    assert!(ok, "kafka-produce: {log}");
    let sum2 = d.join("run2.json");
    let resume = ["--ps", "2", "--kafka-drain", "--resume", s(&ckpt)];
    let (ok, log) = launch(&broker, &config, 2, &sum2, &resume).wait(LIMIT);
    assert!(ok, "run 2: {log}");
    let j2 = json(&sum2);
    let (ids, rows) = trained(&j2);
    eprintln!("--replicas {replicas}: {rows} rows trained, {ids} ids of {n}");
    assert_eq!(rows, n, "every record trained exactly once: {j2}");
    assert_eq!(ids, n, "every record's id in the table: {j2}");
}

#[test]
fn kill9_of_a_worker_then_of_a_ps_mid_stream_trains_every_record_once() {
    kill9_of_a_worker_then_of_a_ps_trains_every_record_once("1");
}

#[test]
fn kill9_of_a_worker_then_of_a_ps_with_replicas_trains_every_record_once() {
    kill9_of_a_worker_then_of_a_ps_trains_every_record_once("2");
}

#[test]
fn three_sync_workers_on_two_partitions_finish_a_drain_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start();
    broker.create_topic("clicks", 2);
    let n = 3_000;
    produce_all(&broker, "clicks", &records(d, "a.tsv", 0, n, 1));
    let config = job(d, 10, "");
    let sum = d.join("job.json");
    let flags = ["--ps", "2", "--mode", "sync", "--kafka-drain"];
    let (ok, log) = launch(&broker, &config, 3, &sum, &flags).wait(LIMIT);
    assert!(ok, "{log}");
    let j = json(&sum);
    assert_eq!(
        trained(&j),
        (n, n),
        "every record trained exactly once: {j}"
    );
    assert!(
        log.contains("worker 2 of 3: no partition of topic clicks is this worker's"),
        "{log}"
    );
}

/// The newest committed checkpoint's manifest in `ckpt`.
fn newest_manifest(ckpt: &Path) -> Option<sparta_checkpoint::Manifest> {
    let name = newest(ckpt)?;
    let id = name.trim_start_matches("ckpt-").parse().ok()?;
    let storage = sparta_checkpoint::LocalDir::new(ckpt).ok()?;
    sparta_checkpoint::Manifest::read(&storage, sparta_checkpoint::CheckpointId(id)).ok()
}

#[test]
fn an_async_worker_without_partitions_joins_the_checkpoint_rounds_until_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start();
    broker.create_topic("clicks", 2);
    let n = 3_000;
    let config = job(d, 5, "");
    let ckpt = d.join("ckpt");
    let writer = produce(
        &broker,
        "clicks",
        &records(d, "a.tsv", 0, n, 1),
        Some(1_000),
    );
    let sum = d.join("job.json");
    let mut run = launch(&broker, &config, 3, &sum, &["--ps", "1"]);
    run.wait_line(LIMIT, |l| {
        l.contains("worker 2 of 3: no partition of topic clicks is this worker's")
            .then_some(())
    });
    // Worker 2 trains nothing, yet rounds go on: it stands in them at the round's step.
    let joined = run.wait_until("a round worker 2 joined", LIMIT, || {
        let m = newest_manifest(&ckpt)?;
        let w2 = m.cluster?.workers.into_iter().find(|w| w.rank == 2)?;
        (w2.step >= 10 && !w2.done).then_some(w2)
    });
    assert_eq!(joined.position.rows_consumed, 0, "{joined:?}");
    assert!(joined.position.kafka.is_empty(), "{joined:?}");
    let (ok, log) = writer.wait(LIMIT);
    assert!(ok, "kafka-produce: {log}");
    for w in ["w0", "w1", "w2"] {
        signal(run.started_pid(w).unwrap(), "-TERM");
    }
    let (ok, log) = run.wait(LIMIT);
    assert!(ok, "{log}");
    let (ids, rows) = trained(&json(&sum));
    assert!(rows > 0 && ids == rows, "{ids} ids, {rows} rows");
}

/// The Prometheus text of a worker's `/metrics`.
fn metrics(addr: SocketAddr) -> String {
    let req = "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    common::http::http(addr, req).1
}

/// The values of the lines of metric `name` (any labels) in a Prometheus text.
fn values(text: &str, name: &str) -> Vec<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

#[test]
fn a_followed_topic_is_served_as_it_trains_and_the_lag_falls_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start();
    broker.create_topic("clicks", 4);
    let n = 5_000;
    let export = d.join("export");
    let config = job(
        d,
        5,
        &format!("[export]\ndir = {:?}\nkeep_full = 100\n", s(&export)),
    );
    let args = [
        "--shard",
        "0",
        "--num-shards",
        "1",
        "--workers",
        "2",
        "--config",
        s(&config),
    ];
    let (_ps, addr) = start_ps(&args, Some("tok"));
    let mut workers = Vec::new();
    let mut urls = Vec::new();
    for rank in ["0", "1"] {
        let mut c = cmd(&[
            "worker",
            "--rank",
            rank,
            "--num-workers",
            "2",
            "--ps",
            &addr,
        ]);
        c.args(["--config", s(&config), "--kafka", &broker.addr])
            .args(["--topic", "clicks", "--quiet"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(["--summary-json", s(&d.join(format!("w{rank}.json")))])
            .env("SPARTA_TOKEN", "tok")
            .env("RUST_LOG", "info,rskafka=warn");
        let mut w = Proc::start(c);
        let url: SocketAddr = w.wait_line(LIMIT, |l| {
            l.split("metrics on http://")
                .nth(1)
                .map(|a| a.trim_end_matches("/metrics").parse().unwrap())
        });
        workers.push(w);
        urls.push(url);
    }
    let writer = produce(
        &broker,
        "clicks",
        &records(d, "a.tsv", 0, n, 1),
        Some(1_000),
    );
    wait_for("the first export", || {
        (!common::export_manifests(&export).is_empty()).then_some(())
    });
    let (_server, srv) = common::serve(&export, 50, LIMIT);
    let version = || common::http::model(srv).map(|m| m["version"].as_u64().unwrap());
    let first = wait_for("a served model", version);
    wait_for("the served version to advance while records arrive", || {
        version().filter(|&v| v > first)
    });
    let (ok, log) = writer.wait(LIMIT);
    assert!(ok, "kafka-produce: {log}");
    // Every record handed to training: each partition's lag is 0, the records add up.
    wait_for("every worker's lag to fall to zero", || {
        let texts: Vec<String> = urls.iter().map(|&u| metrics(u)).collect();
        let lags: Vec<f64> = texts
            .iter()
            .flat_map(|t| values(t, "sparta_kafka_lag_records"))
            .collect();
        let records: f64 = texts
            .iter()
            .flat_map(|t| values(t, "sparta_kafka_records_total"))
            .sum();
        (lags.len() == 4 && lags.iter().all(|&l| l == 0.0) && records == n as f64).then_some(())
    });
    for w in &workers {
        signal(w.pid(), "-TERM");
    }
    for w in workers {
        let (ok, log) = w.wait(LIMIT);
        assert!(ok, "worker: {log}");
    }
    let j = json(&d.join("w0.json"));
    assert_eq!(
        trained(&j),
        (n, n),
        "every record trained exactly once: {j}"
    );
}
