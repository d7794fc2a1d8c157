//! A PS cluster in this process (real gRPC on loopback): the remote store must read and write
//! exactly what the embedded store does, with one request per shard per step and direction
//! for all tables, and TLS must work (and be required) when configured.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use sparta_cluster::{ClientConfig, RemoteStore};
use sparta_core::dedup::{Deduper, UniqueIds};
use sparta_core::{Job, JobConfig, KeyParts, LocalStore, PullInto, SparseStore, TableId};
use sparta_proto::metrics::Rpc;
use sparta_proto::{ClientTls, ServerTls};
use sparta_ps::server::{run_blocking, Listening};
use sparta_ps::{Mode, PsConfig};

fn job() -> Job {
    JobConfig::from_toml("[embedding]\ndim = 8\n[model]\nhidden = [8]\n")
        .unwrap()
        .validate()
        .unwrap()
}

/// Starts shard `shard` of `n` in a background thread; returns its address.
fn start_shard(job: &Job, shard: usize, n: usize, tls: Option<ServerTls>) -> String {
    let cfg = PsConfig {
        shard,
        num_shards: n,
        dense_shards: None,
        workers: 1,
        mode: Mode::Async,
        token: "tok".into(),
        max_message_bytes: 64 << 20,
        tls,
        checkpoint: None,
        barrier_warn: sparta_ps::stall::DEFAULT_WARN_AFTER,
        fault: Default::default(),
        replication: Default::default(),
    };
    let (tx, rx) = mpsc::channel();
    let job = job.clone();
    std::thread::spawn(move || {
        run_blocking(&job, cfg, "127.0.0.1:0", None, 2, |l: &Listening| {
            tx.send(l.addr.to_string()).unwrap();
        })
        .unwrap();
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap()
}

fn client(addrs: Vec<String>, tls: Option<ClientTls>) -> ClientConfig {
    let mut c = ClientConfig::new(addrs, "tok".into(), 0, 1);
    c.tls = tls;
    c.connect_wait = Duration::from_secs(3);
    c.retries = 1;
    c
}

/// Deterministic pseudo-random ids with repeats (a Zipf-ish mix of hot and cold ids).
fn ids(step: u64, n: usize) -> Vec<u64> {
    let mut x = step.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(3) {
                x % 16
            } else {
                x % 5000
            }
        })
        .collect()
}

/// A job with feature columns: tables of two dims (two physical tables), one without wide
/// weights, so keys fall into several classes.
fn classed_job() -> Job {
    JobConfig::from_toml(
        r#"
[data]
format = "custom"
[data.schema]
columns = [
  { name = "label", kind = "label" },
  { name = "a", kind = "sparse" },
  { name = "b", kind = "sparse" },
  { name = "c", kind = "multi_sparse", separator = "|" },
]
[model]
hidden = [8]
[[tables]]
name = "ta"
dim = 4
[[tables]]
name = "tb"
dim = 8
[[tables]]
name = "tc"
dim = 8
[[features]]
name = "a"
kind = "id"
table = "ta"
[[features]]
name = "b"
kind = "id"
table = "tb"
wide = false
[[features]]
name = "c"
kind = "bag"
table = "tc"
"#,
    )
    .unwrap()
    .validate()
    .unwrap()
}

/// Pulls and pushes every table of the job for a few steps; returns every pulled value.
fn train(store: &dyn SparseStore, job: &Job, steps: u64) -> Vec<f32> {
    let tags = job.features.tables.len() as u64;
    let mut seen = Vec::new();
    for step in 0..steps {
        // Spread the ids over every table's key space.
        let keys: Vec<u64> = ids(step, 500)
            .into_iter()
            .map(|x| ((x % tags) << 56) | x)
            .collect();
        // Values table by table, each table's rows in key order (shard-free).
        let rows = common::step(store, job, &keys, true, true).unwrap();
        seen.extend(rows.into_iter().flat_map(|(_, _, v)| v).map(f32::from_bits));
    }
    seen
}

#[test]
fn tables_of_several_dims_and_classes_over_grpc_match_the_embedded_store() {
    let job = classed_job();
    assert_eq!(
        job.features.physical.len(),
        3,
        "{:?}",
        job.features.physical
    );
    let addrs = vec![start_shard(&job, 0, 2, None), start_shard(&job, 1, 2, None)];
    let remote = RemoteStore::connect(client(addrs, None), &job).unwrap();
    let local = LocalStore::from_configs(&job.features.table_configs()).unwrap();
    let a = train(&remote, &job, 4);
    let b = train(&local, &job, 4);
    assert_eq!(a.len(), b.len());
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert_eq!(remote.table_rows(), local.table_rows());
    // Table b has no wide feature: its keys have no wide rows.
    let wide = local.by_name("wide").unwrap();
    let tb_tag = job.features.table("tb").unwrap().tag as u64;
    let deep = local.by_name("embedding.1").unwrap();
    assert!(!deep.is_empty());
    assert!(!local
        .tables()
        .iter()
        .any(|t| t.config().name == "embedding.2"));
    let mut k = Vec::new();
    wide.for_each_row(|key, _, _| k.push(key));
    assert!(!k.is_empty() && k.iter().all(|key| key >> 56 != tb_tag));
    let m = remote.metrics();
    assert_eq!(m.requests(Rpc::Pull), 2 * 4);
}

#[test]
fn two_shards_over_grpc_match_the_embedded_store_with_one_request_per_shard() {
    let job = job();
    let addrs = vec![start_shard(&job, 0, 2, None), start_shard(&job, 1, 2, None)];
    let remote = RemoteStore::connect(client(addrs, None), &job).unwrap();
    let local = LocalStore::from_configs(&job.features.table_configs()).unwrap();
    let steps = 6;
    let a = train(&remote, &job, steps);
    let b = train(&local, &job, steps);
    assert_eq!(a.len(), b.len());
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "the cluster must read exactly what the embedded store reads"
    );
    assert_eq!(remote.table_rows(), local.table_rows());
    // Both tables in one message: one pull and one push per shard per step.
    let m = remote.metrics();
    assert_eq!(m.requests(Rpc::Pull), 2 * steps);
    assert_eq!(m.requests(Rpc::Push), 2 * steps);
}

/// The keys of step `step` of [`train`], deduplicated as the store routes them.
fn step_keys(store: &dyn SparseStore, job: &Job, step: u64, out: &mut UniqueIds) {
    let f = &job.features;
    let tags = f.tables.len() as u64;
    let keys: Vec<u64> = ids(step, 500)
        .into_iter()
        .map(|x| ((x % tags) << 56) | x)
        .collect();
    Deduper::new().run_classed(&keys, &store.routing(), &f.class_of_tag, f.num_classes, out);
}

#[test]
fn the_predicted_step_bytes_are_what_the_store_counts_on_the_wire() {
    use sparta_cluster::report::{dense_step_bytes, sparse_step_bytes};
    use sparta_core::DenseStore;
    use sparta_proto::wire::Compression;

    let job = classed_job();
    let addrs = vec![start_shard(&job, 0, 2, None), start_shard(&job, 1, 2, None)];
    let remote = RemoteStore::connect(client(addrs, None), &job).unwrap();
    let steps = 3;
    train(&remote, &job, steps);
    let mut u = UniqueIds::default();
    let predicted: u64 = (0..steps)
        .map(|step| {
            step_keys(&remote, &job, step, &mut u);
            sparse_step_bytes(&job.features, &u.parts(), Compression::None)
        })
        .sum();
    let m = remote.metrics();
    let counted = m.bytes(Rpc::Pull) + m.bytes(Rpc::Push);
    // Exact but for the varints of the push ids: the session is random (the prediction takes
    // the longest, 10 bytes) and the sequence numbers count up from 0 (a 0 is not sent).
    let pushes = m.requests(Rpc::Push);
    assert!(
        counted <= predicted && predicted - counted <= 8 * pushes,
        "predicted {predicted}, counted {counted} over {pushes} pushes"
    );

    // Dense: one push-pull per shard per step, its slice both ways (the step and push id
    // varints as above).
    let total = sparta_nn::Model::new(job.model.clone())
        .unwrap()
        .num_params();
    let mut params = vec![0.0f32; total];
    remote.init_dense(&mut params).unwrap();
    let grads = vec![0.01f32; total];
    for _ in 0..steps {
        remote.push_pull(&grads, &mut params).unwrap();
    }
    let counted = remote.metrics().bytes(Rpc::DensePushPull);
    let predicted = steps * dense_step_bytes(total, 2);
    let calls = remote.metrics().requests(Rpc::DensePushPull);
    assert!(
        counted <= predicted && predicted - counted <= 8 * calls,
        "dense: predicted {predicted}, counted {counted} over {calls} calls"
    );
}

#[test]
fn a_buffer_of_the_wrong_size_is_refused_before_sending() {
    let job = job();
    let addrs = vec![start_shard(&job, 0, 1, None)];
    let remote = RemoteStore::connect(client(addrs, None), &job).unwrap();
    let mut rows = vec![0.0; 3];
    let e = remote
        .pull(
            &KeyParts::single(&[1, 2], &[0, 2]),
            &mut [PullInto {
                table: TableId(0),
                classes: u64::MAX,
                values: &mut rows,
            }],
            true,
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("3 values for 2 keys of dim 8"),
        "{e}"
    );
    assert_eq!(remote.metrics().requests(Rpc::Pull), 0);
}

/// A self-signed certificate for `localhost` (the CA is the certificate itself).
fn self_signed() -> (ServerTls, Vec<u8>) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = c.cert.pem().into_bytes();
    let tls = ServerTls {
        cert_pem: cert.clone(),
        key_pem: c.key_pair.serialize_pem().into_bytes(),
    };
    (tls, cert)
}

#[test]
fn tls_works_with_the_right_ca_and_is_required_when_on() {
    let job = job();
    let (tls, ca) = self_signed();
    let addr = start_shard(&job, 0, 1, Some(tls));
    let trusted = ClientTls {
        ca_pem: ca,
        domain: Some("localhost".into()),
    };
    let remote = RemoteStore::connect(client(vec![addr.clone()], Some(trusted)), &job).unwrap();
    assert!(!train(&remote, &job, 2).is_empty());
    assert!(remote.table_rows() > 0);

    // A plain-text worker cannot talk to a TLS shard.
    let Err(e) = RemoteStore::connect(client(vec![addr.clone()], None), &job) else {
        panic!("a plain worker reached a TLS shard");
    };
    eprintln!("plain worker vs TLS shard: {e}");
    assert!(e.to_string().contains(&addr), "{e}");
    assert!(e.to_string().contains("--tls-ca"), "{e}");

    // A worker trusting another CA refuses the shard's certificate.
    let (_, other_ca) = self_signed();
    let untrusted = ClientTls {
        ca_pem: other_ca,
        domain: Some("localhost".into()),
    };
    let Err(e) = RemoteStore::connect(client(vec![addr], Some(untrusted)), &job) else {
        panic!("an untrusted certificate was accepted");
    };
    eprintln!("worker trusting another CA: {e}");
    assert!(e.to_string().contains("TLS handshake failed"), "{e}");
}
