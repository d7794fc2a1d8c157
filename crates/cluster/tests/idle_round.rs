//! A worker waiting for input joins the checkpoint round the other workers wait in, over real
//! gRPC on loopback: worker 0 enters the round after step 10 while worker 1 is at step 3 with
//! nothing to train; worker 1's probe finds the round, it joins at step 10, the round
//! completes and the manifest holds both workers' Kafka offsets. A worker that does not join
//! when idle (files) is never told of a round.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sparta_checkpoint::{open_dir, InputPosition, Manifest};
use sparta_cluster::rounds::ClusterCheckpoints;
use sparta_cluster::{ClientConfig, RemoteStore};
use sparta_core::{CheckpointHook, Job, JobConfig};
use sparta_nn::Model;
use sparta_ps::ckpt::CheckpointConfig;
use sparta_ps::{FaultHook, Mode, PsConfig};

fn job(dir: &std::path::Path) -> Job {
    JobConfig::from_toml(&format!(
        "[embedding]\ndim = 4\n[model]\nhidden = [4]\n\
         [train]\ncheckpoint_dir = {:?}\ncheckpoint_every_steps = 10\n",
        dir.to_str().unwrap()
    ))
    .unwrap()
    .validate()
    .unwrap()
}

/// One shard (of one) for two async workers, checkpointing into `dir`.
fn start(job: &Job, dir: &std::path::Path) -> String {
    let cfg = PsConfig {
        shard: 0,
        num_shards: 1,
        dense_shards: None,
        workers: 2,
        mode: Mode::Async,
        token: "tok".into(),
        max_message_bytes: 64 << 20,
        tls: None,
        checkpoint: Some(CheckpointConfig {
            dir: dir.to_path_buf(),
            resume: None,
            keep_full: 2,
            max_failures: 1,
        }),
        barrier_warn: sparta_ps::stall::DEFAULT_WARN_AFTER,
        fault: FaultHook::default(),
        replication: Default::default(),
    };
    common::serve_shard(job, cfg)
}

/// Worker `rank`'s store and checkpoint hook (joining rounds when idle if `join`).
fn worker(job: &Job, addr: &str, rank: usize, join: bool) -> (Model, ClusterCheckpoints) {
    let mut c = ClientConfig::new(vec![addr.to_string()], "tok".into(), rank, 2);
    c.connect_wait = Duration::from_secs(10);
    c.rpc_timeout = Duration::from_secs(20);
    let store = Arc::new(RemoteStore::connect(c, job).unwrap());
    let mut model = Model::new(job.model.clone()).unwrap();
    store.init_dense(model.param_values_mut()).unwrap();
    let dir = job.raw.train.checkpoint_dir.clone().unwrap();
    let hook =
        ClusterCheckpoints::new(store, rank, 2, &dir, &job.raw.train, String::new(), "async")
            .unwrap();
    (model, if join { hook.joining_when_idle() } else { hook })
}

fn kafka(rows: u64, offsets: &[(i32, i64)]) -> InputPosition {
    InputPosition {
        rows_consumed: rows,
        topic: "clicks".into(),
        kafka: offsets.to_vec(),
        ..InputPosition::default()
    }
}

#[test]
fn an_idle_worker_joins_the_round_the_others_wait_in_with_its_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path());
    let addr = start(&job, dir.path());
    let (m0, mut w0) = worker(&job, &addr, 0, true);
    let (m1, mut w1) = worker(&job, &addr, 1, true);
    let (_, mut files) = worker(&job, &addr, 1, false);
    // No round pending: nothing to join.
    assert_eq!(w1.pending_round(3).unwrap(), None);
    let round = std::thread::spawn(move || w0.write(10, kafka(640, &[(0, 320), (2, 320)]), &m0));
    let deadline = Instant::now() + Duration::from_secs(20);
    let step = loop {
        if let Some(s) = w1.pending_round(3).unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "worker 0's round never showed");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(step, 10);
    // A worker that does not join when idle is not even told.
    assert_eq!(files.pending_round(3).unwrap(), None);
    // A round at or before the worker's own step is no round to join.
    assert_eq!(w1.pending_round(10).unwrap(), None);
    assert_eq!(
        w1.write(10, kafka(192, &[(1, 96), (3, 96)]), &m1).unwrap(),
        None
    );
    let id = round
        .join()
        .unwrap()
        .unwrap()
        .expect("worker 0 committed the checkpoint");
    let storage = open_dir(dir.path()).unwrap();
    let n: u64 = id.trim_start_matches("ckpt-").parse().unwrap();
    let m = Manifest::read(storage.as_ref(), sparta_checkpoint::CheckpointId(n)).unwrap();
    let workers = m.cluster.unwrap().workers;
    let saved: Vec<_> = workers
        .iter()
        .map(|w| (w.rank, w.step, w.position.clone()))
        .collect();
    assert_eq!(
        saved,
        [
            (0, 10, kafka(640, &[(0, 320), (2, 320)])),
            (1, 10, kafka(192, &[(1, 96), (3, 96)]))
        ]
    );
}
