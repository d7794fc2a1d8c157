//! A PS cluster in this process (real gRPC on loopback): the remote store must read and write
//! exactly what the embedded store does, with one request per shard per step and direction
//! for all tables, and TLS must work (and be required) when configured.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use sparta_core::dedup::{Deduper, UniqueIds};
use sparta_core::{Job, JobConfig, LocalStore, PullInto, PushFrom, SparseStore, TableId};
use sparta_ps::metrics::Rpc;
use sparta_ps::server::{run_blocking, Listening};
use sparta_ps::{ClientConfig, ClientTls, Mode, PsConfig, RemoteStore, ServerTls};
use sparta_table::Table;

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
        workers: 1,
        mode: Mode::Async,
        token: "tok".into(),
        max_message_bytes: 64 << 20,
        tls,
        checkpoint: None,
        barrier_warn: sparta_ps::stall::DEFAULT_WARN_AFTER,
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

/// Pulls and pushes both tables for a few steps; returns every pulled value.
fn train(store: &dyn SparseStore, steps: u64) -> Vec<f32> {
    let (dim, wdim) = (store.dim(TableId::Embedding), store.dim(TableId::Wide));
    let mut dedup = Deduper::new();
    let mut u = UniqueIds::default();
    let mut seen = Vec::new();
    for step in 0..steps {
        dedup.run(&ids(step, 500), store.num_shards(), &mut u);
        let n = u.len();
        let (mut rows, mut wide) = (vec![0.0; n * dim], vec![0.0; n * wdim]);
        store
            .pull(
                &u.keys,
                &u.shard_offsets,
                &mut [
                    PullInto {
                        table: TableId::Embedding,
                        values: &mut rows,
                    },
                    PullInto {
                        table: TableId::Wide,
                        values: &mut wide,
                    },
                ],
                true,
            )
            .unwrap();
        // Keys arrive grouped by shard: compare values key by key in a shard-free order.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| u.keys[i]);
        for &i in &order {
            seen.extend_from_slice(&rows[i * dim..(i + 1) * dim]);
            seen.push(wide[i]);
        }
        let grads: Vec<f32> = rows.iter().map(|v| 0.5 * v + 0.01).collect();
        let wgrads: Vec<f32> = u
            .keys
            .iter()
            .map(|k| (k % 7) as f32 * 0.01 - 0.03)
            .collect();
        store
            .push(
                &u.keys,
                &u.shard_offsets,
                &[
                    PushFrom {
                        table: TableId::Embedding,
                        grads: &grads,
                    },
                    PushFrom {
                        table: TableId::Wide,
                        grads: &wgrads,
                    },
                ],
            )
            .unwrap();
    }
    seen
}

#[test]
fn two_shards_over_grpc_match_the_embedded_store_with_one_request_per_shard() {
    let job = job();
    let addrs = vec![start_shard(&job, 0, 2, None), start_shard(&job, 1, 2, None)];
    let remote = RemoteStore::connect(client(addrs, None), &job).unwrap();
    let local = LocalStore::new(
        Arc::new(Table::new(job.embedding.clone()).unwrap()),
        Some(Arc::new(Table::new(job.wide.clone().unwrap()).unwrap())),
    );
    let steps = 6;
    let a = train(&remote, steps);
    let b = train(&local, steps);
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

#[test]
fn a_buffer_of_the_wrong_size_is_refused_before_sending() {
    let job = job();
    let addrs = vec![start_shard(&job, 0, 1, None)];
    let remote = RemoteStore::connect(client(addrs, None), &job).unwrap();
    let mut rows = vec![0.0; 3];
    let e = remote
        .pull(
            &[1, 2],
            &[0, 2],
            &mut [PullInto {
                table: TableId::Embedding,
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
    assert!(!train(&remote, 2).is_empty());
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
