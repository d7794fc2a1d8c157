//! What a slot move costs (issue 39's benchmark): two PS shards in this process (real gRPC on
//! loopback), one worker training on a table of `--rows` rows; once it trains, every slot of
//! shard 0 but one moves to shard 1 while the worker goes on. Prints the rows and bytes
//! copied, the time to the first complete copy and to the switch, how long the switch held
//! its checkpoint round, and the worker's step times before, during and at the move.
//!
//! `--replicas 2`: each shard has a backup in the other one (the switch's rows and removals
//! reach the backups before the round is answered).
//!
//! `cargo run --release -p sparta-cluster --example slot_move -- [--rows 20000000]
//! [--batch 4096] [--dim 16] [--replicas 1]`

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sparta_checkpoint::InputPosition;
use sparta_cluster::rounds::ClusterCheckpoints;
use sparta_cluster::{ClientConfig, RemoteStore};
use sparta_core::dedup::{Deduper, UniqueIds};
use sparta_core::{CheckpointHook, Job, JobConfig, PullInto, PushFrom, SparseStore, TableId};
use sparta_nn::Model;
use sparta_proto::Metrics;
use sparta_ps::ckpt::CheckpointConfig;
use sparta_ps::mover::Mover;
use sparta_ps::server::serve;
use sparta_ps::{FaultHook, Mode, PsConfig, Shard};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// Starts shard `shard` of 2 on `listener`; `replicas` copies of each (peers `addrs`).
fn start(
    job: &Job,
    dir: &std::path::Path,
    shard: usize,
    listener: std::net::TcpListener,
    (replicas, addrs): (usize, &[String]),
) {
    let cfg = PsConfig {
        shard,
        num_shards: 2,
        dense_shards: None,
        workers: 1,
        mode: Mode::Async,
        token: "tok".into(),
        max_message_bytes: 1 << 30,
        tls: None,
        checkpoint: Some(CheckpointConfig {
            dir: dir.to_path_buf(),
            resume: None,
            keep_full: 1,
            max_failures: 1,
        }),
        barrier_warn: sparta_ps::stall::DEFAULT_WARN_AFTER,
        fault: FaultHook::default(),
        replication: sparta_ps::server::Replication {
            replicas,
            peers: if replicas > 1 {
                addrs.to_vec()
            } else {
                Vec::new()
            },
            tls: None,
        },
    };
    let shard = Arc::new(Shard::new(job, cfg, Arc::new(Metrics::new("ps"))).unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let listener = listener;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            listener.set_nonblocking(true).unwrap();
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            tx.send(()).unwrap();
            serve(l, shard, std::future::pending()).await.unwrap();
        });
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap()
}

/// One step: pull `keys` (creating rows) and push a gradient for each.
fn step(store: &dyn SparseStore, job: &Job, keys: &[u64], push: bool) {
    let f = &job.features;
    let mut dedup = Deduper::new();
    let mut u = UniqueIds::default();
    dedup.run_classed(
        keys,
        &store.routing(),
        &f.class_of_tag,
        f.num_classes,
        &mut u,
    );
    let parts = u.parts();
    let mut rows: Vec<Vec<f32>> = f
        .physical
        .iter()
        .map(|p| vec![0.0; parts.total(p.classes) * p.config.dim])
        .collect();
    let mut into: Vec<PullInto<'_>> = rows
        .iter_mut()
        .zip(&f.physical)
        .enumerate()
        .map(|(t, (values, p))| PullInto {
            table: TableId(t as u16),
            classes: p.classes,
            values,
        })
        .collect();
    store.pull(&parts, &mut into, true).unwrap();
    if push {
        let grads: Vec<Vec<f32>> = rows
            .iter()
            .map(|r| r.iter().map(|v| 0.01 - 0.1 * v).collect())
            .collect();
        store.push(&parts, &PushFrom::per_table(&grads, f)).unwrap();
    }
}

/// Key `i` of the table (tag 0: the top byte clear).
fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 8
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p) as usize]
}

fn main() {
    let rows = arg("--rows", 20_000_000);
    let batch = arg("--batch", 4096) as usize;
    let dim = arg("--dim", 16);
    let replicas = arg("--replicas", 1) as usize;
    let dir = tempfile::tempdir().unwrap();
    // No wide table: one physical table of `dim` (Adagrad), checkpoints every 25 steps,
    // incremental (a full one every 1000).
    let job = JobConfig::from_toml(&format!(
        "[[tables]]\nname = \"t\"\ndim = {dim}\n[[features]]\nname = \"C1\"\nkind = \"id\"\n\
         table = \"t\"\nwide = false\n[model]\nhidden = [8]\n[train]\ncheckpoint_dir = {:?}\n\
         checkpoint_every_steps = 25\ncheckpoint_full_every = 1000\n",
        dir.path().to_str().unwrap()
    ))
    .unwrap()
    .validate()
    .unwrap();
    let listeners: Vec<std::net::TcpListener> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect();
    for (i, l) in listeners.into_iter().enumerate() {
        start(&job, dir.path(), i, l, (replicas, &addrs));
    }
    let mut c = ClientConfig::new(addrs.clone(), "tok".into(), 0, 1);
    c.rpc_timeout = Duration::from_secs(600);
    c.max_message_bytes = 1 << 30;
    let store = Arc::new(RemoteStore::connect(c, &job).unwrap());
    let mut model = Model::new(job.model.clone()).unwrap();
    store.init_dense(model.param_values_mut()).unwrap();
    let mut hook = ClusterCheckpoints::new(
        Arc::clone(&store),
        0,
        1,
        dir.path(),
        &job.raw.train,
        String::new(),
        "async",
    )
    .unwrap();
    let t = Instant::now();
    let fill = 1 << 18;
    for start in (0..rows).step_by(fill) {
        let keys: Vec<u64> = (start..(start + fill as u64).min(rows)).map(key).collect();
        step(store.as_ref(), &job, &keys, false);
    }
    println!("filled {rows} rows in {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    hook.write(25, InputPosition::default(), &model).unwrap();
    println!(
        "first (full) checkpoint: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mover = Mover::new(addrs.clone(), "tok".into(), None);
    let mut x = 1u64;
    let mut next_keys = || -> Vec<u64> {
        (0..batch)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                key(x % rows)
            })
            .collect()
    };
    // Steps and rounds before the move, then with the move under way, until it switched.
    let (mut before, mut during, mut rounds_before, mut rounds_during) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut s = 25u64;
    let mut ordered = None;
    let (switch_round, moved_at_step) = loop {
        let keys = next_keys();
        let t = Instant::now();
        step(store.as_ref(), &job, &keys, true);
        let dt = t.elapsed().as_secs_f64() * 1e3;
        s += 1;
        if ordered.is_none() {
            &mut before
        } else {
            &mut during
        }
        .push(dt);
        if s.is_multiple_of(25) {
            let epoch = store.routing_epoch();
            let t = Instant::now();
            hook.write(s, InputPosition::default(), &model).unwrap();
            let dt = t.elapsed().as_secs_f64() * 1e3;
            if store.routing_epoch() > epoch {
                break (dt, s);
            }
            if ordered.is_none() {
                &mut rounds_before
            } else {
                &mut rounds_during
            }
            .push(dt);
        }
        if s == 250 {
            let views = rt.block_on(mover.views()).unwrap();
            let owned = views[0].routing.slots_per_shard()[0];
            let plan = rt.block_on(mover.order(0, 1, owned - 1)).unwrap();
            println!(
                "ordered at step {s}: {} slots of shard 0 ({} rows on it, {} on shard 1)",
                plan.slots.len(),
                views[0].rows,
                views[1].rows
            );
            ordered = Some(Instant::now());
        }
    };
    let views = rt.block_on(mover.views()).unwrap();
    let m = views[1].last_move;
    println!(
        "switched at step {moved_at_step}, {:.1} s after the order: {} rows, {:.0} MB copied \
         ({:.0} B/row), first complete copy after {:.2} s, the switch held its round {:.2} s",
        ordered.unwrap().elapsed().as_secs_f64(),
        m.rows,
        m.bytes as f64 / 1e6,
        m.bytes as f64 / m.rows.max(1) as f64,
        m.copy_seconds,
        m.switch_seconds
    );
    println!(
        "rows now: shard 0 {}, shard 1 {}",
        views[0].rows, views[1].rows
    );
    println!(
        "step ms (batch {batch}): before the move p50 {:.2} p99 {:.2} max {:.2} ({} steps); \
         while copying p50 {:.2} p99 {:.2} max {:.2} ({} steps)",
        pct(&mut before.clone(), 0.5),
        pct(&mut before.clone(), 0.99),
        pct(&mut before, 1.0),
        before.len(),
        pct(&mut during.clone(), 0.5),
        pct(&mut during.clone(), 0.99),
        pct(&mut during.clone(), 1.0),
        during.len()
    );
    println!(
        "checkpoint round ms (incremental): before the move median {:.1} (of {}), while \
         copying median {:.1} (of {}), the round that switched {:.1}",
        pct(&mut rounds_before, 0.5),
        rounds_before.len(),
        if rounds_during.is_empty() {
            f64::NAN
        } else {
            pct(&mut rounds_during, 0.5)
        },
        rounds_during.len(),
        switch_round
    );
}
