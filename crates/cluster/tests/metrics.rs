//! The PS shard's and the worker's `/metrics` over HTTP after known pulls and pushes: the
//! exposition text is parsed line by line (HELP/TYPE lines, names, labels, values) and every
//! value that the traffic fixes is checked, on both sides of the wire.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use sparta_cluster::{ClientConfig, RemoteStore};
use sparta_core::{Job, JobConfig, KeyParts, PullInto, PushFrom, SparseStore, TableId};
use sparta_ps::server::{run_blocking, Listening};
use sparta_ps::{Mode, PsConfig};

const RPCS: [&str; 9] = [
    "info",
    "pull",
    "push",
    "dense_init",
    "dense_push_pull",
    "dense_pull",
    "dense_state",
    "worker_done",
    "checkpoint",
];

fn job() -> Job {
    JobConfig::from_toml("[embedding]\ndim = 8\n[model]\nhidden = [8]\n")
        .unwrap()
        .validate()
        .unwrap()
}

/// Starts a one-shard PS serving metrics on a free port; returns what it listens on.
fn start_shard(job: &Job) -> Listening {
    let cfg = PsConfig {
        shard: 0,
        num_shards: 1,
        dense_shards: None,
        workers: 1,
        mode: Mode::Async,
        token: "tok".into(),
        max_message_bytes: 64 << 20,
        tls: None,
        checkpoint: None,
        barrier_warn: sparta_ps::stall::DEFAULT_WARN_AFTER,
        fault: Default::default(),
        replication: Default::default(),
    };
    let (tx, rx) = mpsc::channel();
    let job = job.clone();
    std::thread::spawn(move || {
        run_blocking(&job, cfg, "127.0.0.1:0", Some("127.0.0.1:0"), 2, |l| {
            tx.send(l.clone()).unwrap();
        })
        .unwrap();
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap()
}

fn client(addr: SocketAddr, token: &str) -> ClientConfig {
    let mut c = ClientConfig::new(vec![addr.to_string()], token.into(), 0, 1);
    c.connect_wait = Duration::from_secs(3);
    c.retries = 0;
    c
}

/// `GET path` over HTTP/1.1; returns (content type, body).
fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let len: usize = header("content-length").expect("a length").parse().unwrap();
    assert_eq!(body.len(), len, "the whole body");
    (header("content-type").unwrap_or_default(), body.to_string())
}

/// One metric family of the exposition: its HELP text, TYPE and samples in order.
#[derive(Debug, Default)]
struct Family {
    help: String,
    kind: String,
    samples: Vec<Sample>,
}

#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// `{a="x",b="y"}` (already without the braces) into a map; values may hold escaped quotes.
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").expect("key=\"value\"");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().expect("a closing quote") {
                (i, '"') => break i,
                (_, '\\') => match chars.next().unwrap().1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        assert!(
            out.insert(key.to_string(), value).is_none(),
            "label {key} twice"
        );
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    out
}

/// Parses the Prometheus text format (0.0.4) strictly: every sample belongs to the family whose
/// HELP and TYPE lines came just before it (a histogram's `_bucket`, `_sum` and `_count` to the
/// histogram), every family is declared once, and every value is a number.
fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            assert!(!families.contains_key(name), "{name} declared twice");
            families.insert(
                name.to_string(),
                Family {
                    help: help.to_string(),
                    ..Family::default()
                },
            );
            current = Some(name.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert_eq!(Some(name), current.as_deref(), "TYPE right after its HELP");
            let f = families.get_mut(name).unwrap();
            assert!(f.kind.is_empty(), "{name}: two TYPE lines");
            f.kind = kind.to_string();
        } else {
            assert!(!line.starts_with('#'), "unknown comment line {line:?}");
            let (series, value) = line.rsplit_once(' ').expect("series value");
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, parse_labels(l.strip_suffix('}').expect("closing brace"))),
                None => (series, BTreeMap::new()),
            };
            let family = current.as_deref().expect("a sample after a HELP line");
            let f = families.get_mut(family).unwrap();
            let own = name == family
                || (f.kind == "histogram"
                    && ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| name.strip_suffix(s) == Some(family)));
            assert!(own, "{name} under the family {family}");
            let value = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or_else(|e| panic!("{line:?}: {e}")),
            };
            f.samples.push(Sample {
                name: name.to_string(),
                labels,
                value,
            });
        }
    }
    families
}

/// The parsed exposition of one process (`role`).
struct Scrape {
    role: &'static str,
    families: BTreeMap<String, Family>,
}

impl Scrape {
    fn of(addr: SocketAddr, role: &'static str) -> Self {
        let (ctype, body) = http_get(addr, "/metrics");
        assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
        let families = parse(&body);
        for (name, f) in &families {
            assert!(!f.kind.is_empty(), "{name} has no TYPE");
            assert!(
                f.help.ends_with('.') && !f.help.ends_with(".."),
                "{name}: {:?}",
                f.help
            );
            for s in &f.samples {
                assert_eq!(
                    s.labels.get("role").map(String::as_str),
                    Some(role),
                    "{s:?}"
                );
            }
        }
        Self { role, families }
    }

    fn family(&self, name: &str, kind: &str) -> &Family {
        let f = self
            .families
            .get(name)
            .unwrap_or_else(|| panic!("{} has no {name}", self.role));
        assert_eq!(f.kind, kind, "{name}");
        f
    }

    /// The one sample `name` with exactly the labels `role` + `labels`.
    fn value(&self, family: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        want.insert("role".into(), self.role.into());
        let hits: Vec<f64> = self.families[family]
            .samples
            .iter()
            .filter(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
            .collect();
        assert_eq!(hits.len(), 1, "{name} {want:?} in {}", self.role);
        hits[0]
    }

    /// A per-RPC counter or gauge: every kind listed once, in a fixed order.
    fn rpc(&self, name: &str, kind: &str, rpc: &str) -> f64 {
        let f = self.family(name, kind);
        let kinds: Vec<&str> = f.samples.iter().map(|s| s.labels["rpc"].as_str()).collect();
        assert_eq!(kinds, RPCS, "{name}");
        self.value(name, name, &[("rpc", rpc)])
    }

    /// Checks one RPC kind's latency histogram (buckets cumulative, `+Inf` = count); returns
    /// (count, sum).
    fn latency(&self, rpc: &str) -> (f64, f64) {
        let name = "sparta_rpc_latency_seconds";
        let f = self.family(name, "histogram");
        let buckets: Vec<(f64, f64)> = f
            .samples
            .iter()
            .filter(|s| s.name == format!("{name}_bucket") && s.labels["rpc"] == rpc)
            .map(|s| {
                let le = &s.labels["le"];
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, s.value)
            })
            .collect();
        let bounds: Vec<f64> = buckets.iter().map(|b| b.0).collect();
        assert_eq!(
            bounds,
            [
                0.0001,
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.5,
                1.0,
                10.0,
                f64::INFINITY
            ]
        );
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
        let count = self.value(name, &format!("{name}_count"), &[("rpc", rpc)]);
        let sum = self.value(name, &format!("{name}_sum"), &[("rpc", rpc)]);
        assert_eq!(buckets.last().unwrap().1, count, "+Inf bucket = count");
        (count, sum)
    }
}

/// Pulls `keys` (one shard) from the embedding table; returns the values.
fn pull(store: &RemoteStore, keys: &[u64]) -> Vec<f32> {
    let mut values = vec![0.0; keys.len() * store.dim(TableId(0))];
    store
        .pull(
            &KeyParts::single(keys, &[0, keys.len()]),
            &mut [PullInto {
                table: TableId(0),
                classes: u64::MAX,
                values: &mut values,
            }],
            true,
        )
        .unwrap();
    values
}

#[test]
fn ps_and_worker_metrics_over_http_count_the_traffic_exactly() {
    let job = job();
    let ps = start_shard(&job);
    let maddr = ps.metrics.expect("the shard serves metrics");
    let (_, health) = http_get(maddr, "/health");
    assert_eq!(health, "ok\n");

    let store = RemoteStore::connect(client(ps.addr, "tok"), &job).unwrap();
    let waddr = store.serve_metrics("127.0.0.1:0").unwrap();
    let first: Vec<u64> = vec![1, 2, 3];
    let second: Vec<u64> = (100..110).collect();
    pull(&store, &first);
    let values = pull(&store, &second);
    let grads: Vec<f32> = values.iter().map(|v| v * 0.5 + 0.01).collect();
    store
        .push(
            &KeyParts::single(&second, &[0, second.len()]),
            &[PushFrom {
                table: TableId(0),
                classes: u64::MAX,
                grads: &grads,
            }],
        )
        .unwrap();
    // The worker's reader skipped 2 bad files and 1 late one (raised, never lowered).
    store.metrics().set_input_files(2, 1);
    store.metrics().set_input_files(1, 0);
    // A client with the wrong token is refused by the shard's token check, not by a handler.
    assert!(RemoteStore::connect(client(ps.addr, "wrong"), &job).is_err());

    let p = Scrape::of(maddr, "ps");
    // Rows per logical table: the 13 keys (tag 0) are rows of table C1 (and of the wide table).
    assert_eq!(
        p.value("sparta_table_rows", "sparta_table_rows", &[("table", "C1")]),
        13.0
    );
    assert_eq!(
        p.value("sparta_table_rows", "sparta_table_rows", &[("table", "C2")]),
        0.0
    );
    let w = Scrape::of(waddr, "worker");
    for s in [&p, &w] {
        assert_eq!(s.rpc("sparta_rpc_requests_total", "counter", "pull"), 2.0);
        assert_eq!(s.rpc("sparta_rpc_requests_total", "counter", "push"), 1.0);
        assert_eq!(s.rpc("sparta_rpc_rows_total", "counter", "pull"), 13.0);
        assert_eq!(s.rpc("sparta_rpc_rows_total", "counter", "push"), 10.0);
        for rpc in RPCS {
            assert_eq!(s.rpc("sparta_rpc_errors_total", "counter", rpc), 0.0);
            assert_eq!(s.rpc("sparta_rpc_in_flight", "gauge", rpc), 0.0);
            let (count, sum) = s.latency(rpc);
            let requests = s.rpc("sparta_rpc_requests_total", "counter", rpc);
            assert_eq!(count, requests, "{rpc}: every request finished");
            assert!(sum >= 0.0 && (count > 0.0 || sum == 0.0), "{rpc}: {sum}");
        }
        for (rpc, n) in [
            ("dense_init", 0.0),
            ("dense_pull", 0.0),
            ("checkpoint", 0.0),
        ] {
            assert_eq!(s.rpc("sparta_rpc_requests_total", "counter", rpc), n);
        }
        assert!(s.latency("pull").1 > 0.0);
        let uptime = s.family("sparta_uptime_seconds", "gauge");
        assert_eq!(uptime.samples.len(), 1);
        assert!(uptime.samples[0].value > 0.0);
        assert_eq!(
            s.value(
                "sparta_sync_short_steps_total",
                "sparta_sync_short_steps_total",
                &[]
            ),
            0.0
        );
        s.family("sparta_sync_short_steps_total", "counter");
        for barrier in ["sync", "checkpoint"] {
            let l = [("barrier", barrier)];
            s.family("sparta_barrier_waiting_workers", "gauge");
            s.family("sparta_barrier_slow_waits_total", "counter");
            let waiting = "sparta_barrier_waiting_workers";
            assert_eq!(s.value(waiting, waiting, &l), 0.0);
            let slow = "sparta_barrier_slow_waits_total";
            assert_eq!(s.value(slow, slow, &l), 0.0);
        }
    }
    // What one side sent the other received (protobuf bodies + gRPC framing).
    for rpc in RPCS {
        let (ps_in, ps_out, w_in, w_out) = (
            p.rpc("sparta_rpc_bytes_in_total", "counter", rpc),
            p.rpc("sparta_rpc_bytes_out_total", "counter", rpc),
            w.rpc("sparta_rpc_bytes_in_total", "counter", rpc),
            w.rpc("sparta_rpc_bytes_out_total", "counter", rpc),
        );
        if rpc == "info" {
            // The shard handled the good client's cluster check at connect, which the client
            // does not measure; the refused client's never reached the handler.
            assert_eq!(p.rpc("sparta_rpc_requests_total", "counter", rpc), 1.0);
            assert_eq!(w.rpc("sparta_rpc_requests_total", "counter", rpc), 0.0);
            assert!(ps_in > 0.0 && ps_out > 0.0 && w_in == 0.0 && w_out == 0.0);
            continue;
        }
        assert_eq!((ps_in, ps_out), (w_out, w_in), "{rpc}");
    }
    assert!(p.rpc("sparta_rpc_bytes_in_total", "counter", "push") > 10.0 * 8.0 * 2.0);
    let auth = "sparta_auth_failures_total";
    p.family(auth, "counter");
    assert!(
        p.value(auth, auth, &[]) >= 1.0,
        "the wrong token was refused"
    );
    assert_eq!(w.value(auth, auth, &[]), 0.0);
    for (name, want) in [
        ("sparta_input_bad_files_total", 2.0),
        ("sparta_input_late_files_skipped_total", 1.0),
    ] {
        w.family(name, "counter");
        assert_eq!(w.value(name, name, &[]), want, "{name}");
        assert!(!p.families.contains_key(name), "{name} is a worker metric");
    }
}
