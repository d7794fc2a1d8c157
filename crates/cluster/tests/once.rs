//! Exactly-once pushes over real gRPC on loopback: a shard whose fault hook applies a push and
//! then drops its answer (as if the connection broke) must not apply the worker's retry again,
//! sparse or dense, in every dense mode, also when the retry arrives while the first attempt
//! still waits at the sync barrier.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sparta_cluster::{ClientConfig, RemoteStore};
use sparta_core::dedup::{Deduper, UniqueIds};
use sparta_core::{DenseStore, Job, JobConfig, PullInto, PushFrom, SparseStore, TableId};
use sparta_proto::metrics::Rpc;
use sparta_proto::Metrics;
use sparta_ps::server::serve;
use sparta_ps::{FaultHook, Mode, PsConfig, Shard};

/// SGD with learning rate 1 everywhere: one application of `g` moves a value by exactly `-g`.
fn job() -> Job {
    JobConfig::from_toml(
        "[embedding]\ndim = 4\noptimizer = { type = \"sgd\", lr = 1.0 }\n\
         [wide]\noptimizer = { type = \"sgd\", lr = 1.0 }\n\
         [model]\nhidden = [4]\noptimizer = { type = \"sgd\", lr = 1.0 }\n",
    )
    .unwrap()
    .validate()
    .unwrap()
}

/// A shard serving on a free loopback port; its metrics handle tells what it answered.
struct Ps {
    addr: String,
    metrics: Arc<Metrics>,
}

/// Starts one shard (of one) for `workers` workers in `mode`, dropping the answers `drops`
/// names (`push:N`, `dense_push_pull:N[:applying]`).
fn start(job: &Job, mode: Mode, workers: usize, drops: &[&str]) -> Ps {
    let cfg = PsConfig {
        shard: 0,
        num_shards: 1,
        dense_shards: None,
        workers,
        mode,
        token: "tok".into(),
        max_message_bytes: 64 << 20,
        tls: None,
        checkpoint: None,
        barrier_warn: sparta_ps::stall::DEFAULT_WARN_AFTER,
        fault: FaultHook::new(drops.iter().map(|d| d.parse().unwrap())),
        replication: Default::default(),
    };
    let metrics = Arc::new(Metrics::new("ps"));
    let shard = Arc::new(Shard::new(job, cfg, Arc::clone(&metrics)).unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap().to_string()).unwrap();
            serve(l, shard, std::future::pending()).await.unwrap();
        });
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    Ps { addr, metrics }
}

fn connect(job: &Job, ps: &Ps, rank: usize, workers: usize) -> RemoteStore {
    let mut c = ClientConfig::new(vec![ps.addr.clone()], "tok".into(), rank, workers);
    c.connect_wait = Duration::from_secs(10);
    // A wrong barrier fails the test instead of hanging it.
    c.rpc_timeout = Duration::from_secs(20);
    RemoteStore::connect(c, job).unwrap()
}

/// Waits (at most 20 s) until `f` holds.
fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() < 1e-5, "{what}: value {i} is {g}, want {w}");
    }
}

/// Rows of `keys` in every table of the job, pulled (created) in shard order.
fn pull(store: &RemoteStore, job: &Job, u: &UniqueIds) -> Vec<Vec<f32>> {
    let parts = u.parts();
    let mut rows: Vec<Vec<f32>> = job
        .features
        .physical
        .iter()
        .map(|p| vec![0.0; parts.total(p.classes) * p.config.dim])
        .collect();
    let mut into: Vec<PullInto<'_>> = rows
        .iter_mut()
        .zip(&job.features.physical)
        .enumerate()
        .map(|(t, (values, p))| PullInto {
            table: TableId(t as u16),
            classes: p.classes,
            values,
        })
        .collect();
    store.pull(&parts, &mut into, true).unwrap();
    rows
}

#[test]
fn a_sparse_push_whose_answer_was_lost_is_applied_once() {
    let job = job();
    let ps = start(&job, Mode::Async, 1, &["push:2"]);
    let store = connect(&job, &ps, 0, 1);
    let f = &job.features;
    let mut u = UniqueIds::default();
    let keys: Vec<u64> = (1..=40).collect();
    Deduper::new().run_classed(
        &keys,
        &store.routing(),
        &f.class_of_tag,
        f.num_classes,
        &mut u,
    );
    let before = pull(&store, &job, &u);
    let grads: Vec<Vec<f32>> = before
        .iter()
        .map(|r| (0..r.len()).map(|i| 0.25 + i as f32 * 0.01).collect())
        .collect();
    let from = PushFrom::per_table(&grads, f);
    // Push 1 is answered; push 2 is applied, its answer dropped, and retried by the worker.
    store.push(&u.parts(), &from).unwrap();
    store.push(&u.parts(), &from).unwrap();
    let after = pull(&store, &job, &u);
    for (t, ((b, a), g)) in before.iter().zip(&after).zip(&grads).enumerate() {
        let want: Vec<f32> = b.iter().zip(g).map(|(b, g)| b - 2.0 * g).collect();
        assert_close(a, &want, &format!("table {t} after two pushes (not three)"));
    }
    assert_eq!(ps.metrics.duplicate_pushes(Rpc::Push), 1);
    assert_eq!(
        store.metrics().requests(Rpc::Push),
        3,
        "two pushes, one retry"
    );
    assert!(ps
        .metrics
        .render()
        .contains("sparta_ps_duplicate_pushes_total{role=\"ps\",rpc=\"push\"} 1"));
}

/// One worker pushes dense gradients twice; the first push's answer is dropped (`when`).
fn dense_once(mode: Mode, drop: &str) {
    let job = job();
    let ps = start(&job, mode, 1, &[drop]);
    let store = connect(&job, &ps, 0, 1);
    let n = sparta_nn::Model::new(job.model.clone())
        .unwrap()
        .num_params();
    let mut params: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.5).collect();
    let start = params.clone();
    store.init_dense(&mut params).unwrap();
    assert_eq!(params, start);
    let g: Vec<f32> = (0..n).map(|i| 0.125 + (i % 5) as f32 * 0.25).collect();
    store.push_pull(&g, &mut params).unwrap();
    let once: Vec<f32> = start.iter().zip(&g).map(|(p, g)| p - g).collect();
    assert_close(
        &params,
        &once,
        &format!("{mode:?} {drop}: the answer of the retry"),
    );
    let mut now = vec![0.0; n];
    store.pull_dense(&mut now).unwrap();
    assert_close(
        &now,
        &once,
        &format!("{mode:?} {drop}: the slice after one push"),
    );
    store.push_pull(&g, &mut params).unwrap();
    let twice: Vec<f32> = once.iter().zip(&g).map(|(p, g)| p - g).collect();
    assert_close(
        &params,
        &twice,
        &format!("{mode:?} {drop}: after two pushes"),
    );
    assert_eq!(ps.metrics.duplicate_pushes(Rpc::DensePushPull), 1);
}

#[test]
fn a_dense_push_whose_answer_was_lost_is_applied_once_in_every_mode() {
    for mode in [
        Mode::Async,
        Mode::Staleness(1),
        Mode::Sync { backup: 0 },
        Mode::Sync { backup: 1 },
    ] {
        for drop in ["dense_push_pull:1", "dense_push_pull:1:applying"] {
            dense_once(mode, drop);
        }
    }
}

#[test]
fn a_retry_while_the_first_push_waits_at_the_sync_barrier_waits_for_it() {
    let job = job();
    // The first dense push (worker 0's) is dropped at once, while it waits for worker 1.
    let ps = start(
        &job,
        Mode::Sync { backup: 0 },
        2,
        &["dense_push_pull:1:applying"],
    );
    let w0 = Arc::new(connect(&job, &ps, 0, 2));
    let w1 = Arc::new(connect(&job, &ps, 1, 2));
    let n = sparta_nn::Model::new(job.model.clone())
        .unwrap()
        .num_params();
    let start: Vec<f32> = (0..n).map(|i| (i % 3) as f32).collect();
    let mut p0 = start.clone();
    let mut p1 = vec![9.0; n];
    w0.init_dense(&mut p0).unwrap();
    w1.init_dense(&mut p1).unwrap();
    assert_eq!(p1, start, "the first offer wins");
    let g0: Vec<f32> = (0..n).map(|i| 1.0 + (i % 4) as f32).collect();
    let g1: Vec<f32> = (0..n).map(|i| 0.5 * (i % 2) as f32).collect();
    let step = |p: &[f32], a: &[f32], b: &[f32]| -> Vec<f32> {
        p.iter()
            .zip(a.iter().zip(b))
            .map(|(p, (a, b))| p - (a + b) / 2.0)
            .collect()
    };
    let first = {
        let (w0, g0, mut p) = (Arc::clone(&w0), g0.clone(), p0.clone());
        std::thread::spawn(move || w0.push_pull(&g0, &mut p).map(|()| p))
    };
    // Worker 0's retry reached the shard while its first attempt waits for worker 1.
    until("worker 0's retry", || {
        ps.metrics.duplicate_pushes(Rpc::DensePushPull) == 1
    });
    assert!(!first.is_finished(), "the step must wait for worker 1");
    w1.push_pull(&g1, &mut p1).unwrap();
    let p0 = first.join().unwrap().unwrap();
    let want = step(&start, &g0, &g1);
    assert_close(&p0, &want, "worker 0 after step 0");
    assert_close(&p1, &want, "worker 1 after step 0");
    // The next step proceeds, both gradients applied once.
    let second = {
        let (w0, g0, mut p) = (Arc::clone(&w0), g0.clone(), p0.clone());
        std::thread::spawn(move || w0.push_pull(&g0, &mut p).map(|()| p))
    };
    w1.push_pull(&g1, &mut p1).unwrap();
    let p0 = second.join().unwrap().unwrap();
    let want = step(&want, &g0, &g1);
    assert_close(&p0, &want, "worker 0 after step 1");
    assert_close(&p1, &want, "worker 1 after step 1");
    assert_eq!(ps.metrics.duplicate_pushes(Rpc::DensePushPull), 1);
    assert_eq!(w0.metrics().requests(Rpc::DensePushPull), 3);
}

#[test]
fn a_stale_push_id_is_refused_and_a_new_worker_session_starts_over() {
    let job = job();
    let ps = start(&job, Mode::Async, 1, &[]);
    let n = sparta_nn::Model::new(job.model.clone())
        .unwrap()
        .num_params();
    let mut params = vec![0.0; n];
    let g = vec![1.0; n];
    let a = connect(&job, &ps, 0, 1);
    a.init_dense(&mut params).unwrap();
    a.set_step(5);
    a.push_pull(&g, &mut params).unwrap();
    // The same store going back to an older step is a stale push: refused, nothing applied.
    a.set_step(3);
    let e = a.push_pull(&g, &mut params).unwrap_err().to_string();
    assert!(
        e.contains("FailedPrecondition")
            && e.contains("push 3 of worker 0")
            && e.contains("push 5"),
        "{e}"
    );
    let mut now = vec![0.0; n];
    a.pull_dense(&mut now).unwrap();
    assert_close(&now, &vec![-1.0; n], "one push applied");
    // A restarted worker (a new store) counts its steps from 0 again.
    let b = connect(&job, &ps, 0, 1);
    b.push_pull(&g, &mut params).unwrap();
    assert_close(&params, &vec![-2.0; n], "the new session's push");
    assert_eq!(ps.metrics.duplicate_pushes(Rpc::DensePushPull), 0);
}
