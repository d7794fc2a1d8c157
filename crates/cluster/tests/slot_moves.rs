//! A slot move between two shards in this process (real gRPC on loopback): the receiver
//! copies the slots' rows, the move switches at a checkpoint round, the worker routes by the
//! new table from the round's answer and reads every row as before, a store that connects
//! later gets the table from the shards, a store still routing by the old table is refused
//! (never served a row of a slot the shard no longer owns), and shards restarted from the
//! round's checkpoint keep the table and the rows. A shard added to the running cluster
//! (`sparta_ps::scaler`) joins at a round and takes its share of the slots, and leaves again.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::step;
use sparta_checkpoint::InputPosition;
use sparta_cluster::rounds::ClusterCheckpoints;
use sparta_cluster::{ClientConfig, RemoteStore};
use sparta_core::{CheckpointHook, Job, JobConfig, SparseStore};
use sparta_nn::Model;
use sparta_ps::ckpt::{CheckpointConfig, Resume};
use sparta_ps::mover::Mover;
use sparta_ps::{FaultHook, Mode, PsConfig};

fn job(dir: &std::path::Path) -> Job {
    job_with(dir, "")
}

/// The job with `embedding` lines added to its `[embedding]` table.
fn job_with(dir: &std::path::Path, embedding: &str) -> Job {
    JobConfig::from_toml(&format!(
        "[embedding]\ndim = 4\n{embedding}[model]\nhidden = [4]\n\
         [train]\ncheckpoint_dir = {:?}\ncheckpoint_every_steps = 10\n",
        dir.to_str().unwrap()
    ))
    .unwrap()
    .validate()
    .unwrap()
}

/// Shard `shard` of 2 for one worker, checkpointing into `dir`.
fn start(job: &Job, dir: &std::path::Path, shard: usize) -> String {
    start_from(job, dir, shard, None, 64 << 20)
}

/// The same, restoring checkpoint `resume` of `dir` first, taking and sending messages of
/// at most `max_message_bytes`.
fn start_from(
    job: &Job,
    dir: &std::path::Path,
    shard: usize,
    resume: Option<u64>,
    max_message_bytes: usize,
) -> String {
    start_as(job, dir, (shard, 2, None), resume, max_message_bytes)
}

/// Shard `shard` of `num_shards` (the first `dense_shards` holding the dense vector).
fn start_as(
    job: &Job,
    dir: &std::path::Path,
    (shard, num_shards, dense_shards): (usize, usize, Option<usize>),
    resume: Option<u64>,
    max_message_bytes: usize,
) -> String {
    let cfg = PsConfig {
        shard,
        num_shards,
        dense_shards,
        workers: 1,
        mode: Mode::Async,
        token: "tok".into(),
        max_message_bytes,
        tls: None,
        checkpoint: Some(CheckpointConfig {
            dir: dir.to_path_buf(),
            resume: resume.map(Resume::At),
            keep_full: 2,
            max_failures: 1,
        }),
        barrier_warn: sparta_ps::stall::DEFAULT_WARN_AFTER,
        fault: FaultHook::default(),
        replication: Default::default(),
    };
    common::serve_shard(job, cfg)
}

fn store(job: &Job, addrs: &[String]) -> Arc<RemoteStore> {
    let mut c = ClientConfig::new(addrs.to_vec(), "tok".into(), 0, 1);
    c.connect_wait = Duration::from_secs(10);
    c.rpc_timeout = Duration::from_secs(20);
    c.retries = 1;
    Arc::new(RemoteStore::connect(c, job).unwrap())
}

/// Worker 0 of 1 on the shards at `addrs`: its store, its model (whose dense vector it offered
/// the shards) and its checkpoint rounds into `dir`.
fn worker(
    job: &Job,
    dir: &std::path::Path,
    addrs: &[String],
) -> (Arc<RemoteStore>, Model, ClusterCheckpoints) {
    let a = store(job, addrs);
    let mut model = Model::new(job.model.clone()).unwrap();
    a.init_dense(model.param_values_mut()).unwrap();
    let hook = ClusterCheckpoints::new(
        Arc::clone(&a),
        0,
        1,
        dir,
        &job.raw.train,
        String::new(),
        "async",
    )
    .unwrap();
    (a, model, hook)
}

/// 4,000 keys spread over the slots, trained 3 steps through `a` (rows made and pushed).
fn trained_keys(a: &RemoteStore, job: &Job) -> Vec<u64> {
    let keys: Vec<u64> = (0..4000u64)
        .map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    for _ in 0..3 {
        step(a, job, &keys, true, true).unwrap();
    }
    keys
}

#[test]
fn a_move_switches_at_a_round_a_restart_keeps_it_and_a_worker_on_the_old_table_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path());
    let addrs = vec![start(&job, dir.path(), 0), start(&job, dir.path(), 1)];
    let (a, model, mut hook) = worker(&job, dir.path(), &addrs);
    let keys = trained_keys(&a, &job);
    let before = step(a.as_ref(), &job, &keys, false, false).unwrap();
    let stale = store(&job, &addrs);
    assert_eq!(stale.routing_epoch(), 0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mover = Mover::new(addrs.clone(), "tok".into(), None);
    let rows_before: Vec<u64> = rt
        .block_on(mover.views())
        .unwrap()
        .iter()
        .map(|v| v.rows)
        .collect();
    let plan = rt.block_on(mover.order(0, 1, 2048)).unwrap();
    assert_eq!((plan.epoch, plan.slots.len()), (1, 2048));
    // Rounds until the move switched at one (after the receiver's first copy).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut s = 0;
    while a.routing_epoch() == 0 {
        assert!(Instant::now() < deadline, "the move never switched");
        s += 10;
        hook.write(s, InputPosition::default(), &model).unwrap();
    }
    assert_eq!(a.routing(), plan.after);
    // Every row reads as it did, from its new shard.
    assert_eq!(step(a.as_ref(), &job, &keys, false, false).unwrap(), before);
    let views = rt.block_on(mover.views()).unwrap();
    let moved: u64 = rows_before[0] - views[0].rows;
    assert!(moved > 0, "{rows_before:?} -> {views:?}");
    assert_eq!(views[1].rows, rows_before[1] + moved);
    assert_eq!((views[1].moves_in, views[0].moves_out), (1, 1));
    // A store connecting now routes by the new table.
    assert_eq!(store(&job, &addrs).routing_epoch(), 1);
    // A store on the old table is refused by the shard that gave the slots away.
    let e = step(stale.as_ref(), &job, &keys, true, false).unwrap_err();
    assert!(e.to_string().contains("slot not owned"), "{e}");
    // Training goes on on the new table, and the next round's checkpoint records it.
    step(a.as_ref(), &job, &keys, true, true).unwrap();
    let id = hook
        .write(s + 10, InputPosition::default(), &model)
        .unwrap()
        .expect("a checkpoint");
    let storage = sparta_checkpoint::open_dir(dir.path()).unwrap();
    let n: u64 = id.trim_start_matches("ckpt-").parse().unwrap();
    let m = sparta_checkpoint::Manifest::read(storage.as_ref(), sparta_checkpoint::CheckpointId(n))
        .unwrap();
    let c = m.cluster.unwrap();
    assert_eq!(c.routing_epoch, 1);
    assert_eq!(c.slot_runs, plan.after.runs());
    // Shards restarted from that checkpoint keep the moved table: a worker connecting to
    // them routes by it and reads every row as it was.
    let now = step(a.as_ref(), &job, &keys, false, false).unwrap();
    let again: Vec<String> = (0..2)
        .map(|i| start_from(&job, dir.path(), i, Some(n), 64 << 20))
        .collect();
    let b = store(&job, &again);
    assert_eq!((b.routing_epoch(), b.routing()), (1, plan.after.clone()));
    assert_eq!(step(b.as_ref(), &job, &keys, false, false).unwrap(), now);
}

/// Parts whose moving rows do not fit in one answer (messages of at most 64 KiB here, answers
/// of at most 16 KiB; 4 parts a table, each with about 130 KiB of moving rows): the receiver
/// asks for fewer slots at a time, and the move completes with every row.
#[test]
fn a_move_whose_parts_exceed_one_answer_completes_with_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let job = job_with(dir.path(), "shards = 4\n");
    let small = 64 << 10;
    let addrs: Vec<String> = (0..2)
        .map(|i| start_from(&job, dir.path(), i, None, small))
        .collect();
    let (a, model, mut hook) = worker(&job, dir.path(), &addrs);
    // Keys of the first feature (tag 0): every one has a row in both tables.
    let keys: Vec<u64> = (0..40_000u64)
        .map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 8)
        .collect();
    // Requests of 400 keys fit in 64 KiB.
    for chunk in keys.chunks(400) {
        step(a.as_ref(), &job, chunk, true, true).unwrap();
    }
    let read = |s: &RemoteStore| -> Vec<(usize, u64, Vec<u32>)> {
        let mut all: Vec<_> = keys
            .chunks(400)
            .flat_map(|c| step(s, &job, c, false, false).unwrap())
            .collect();
        all.sort();
        all
    };
    let before = read(a.as_ref());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mover = Mover::new(addrs.clone(), "tok".into(), None);
    rt.block_on(mover.order(0, 1, 4096)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut s = 0;
    while a.routing_epoch() == 0 {
        assert!(Instant::now() < deadline, "the move never switched");
        s += 10;
        hook.write(s, InputPosition::default(), &model).unwrap();
    }
    assert_eq!(read(a.as_ref()), before);
    let m = rt.block_on(mover.views()).unwrap()[1].last_move;
    // About 10,000 rows of each table: more than its 4 parts' answers of 16 KiB hold.
    assert!(m.rows > 15_000 && m.bytes > 2 * 4 * (16 << 10), "{m:?}");
}

/// Rounds of `hook` (after pull-only steps of `keys` through `a`) until `done` yields.
fn rounds_until<T>(
    hook: &mut ClusterCheckpoints,
    model: &Model,
    at: &mut u64,
    a: &RemoteStore,
    job: &Job,
    keys: &[u64],
    done: &std::sync::mpsc::Receiver<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(v) = done.try_recv() {
            return v;
        }
        assert!(Instant::now() < deadline, "the scaling never finished");
        step(a, job, keys, false, false).unwrap();
        *at += 10;
        hook.write(*at, InputPosition::default(), model).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_shard_added_at_a_round_takes_its_share_and_leaves_again_and_owners_of_slots_or_dense_cannot_leave(
) {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path());
    let mut addrs = vec![start(&job, dir.path(), 0), start(&job, dir.path(), 1)];
    let (a, model, mut hook) = worker(&job, dir.path(), &addrs);
    let keys = trained_keys(&a, &job);
    let before = step(a.as_ref(), &job, &keys, false, false).unwrap();
    let joining = start_as(&job, dir.path(), (2, 3, Some(2)), None, 64 << 20);
    let mover = Mover::new(addrs.clone(), "tok".into(), None);
    let scaler = std::sync::Arc::new(std::sync::Mutex::new(sparta_ps::scaler::Scaler::new(
        mover,
        Duration::from_secs(30),
    )));
    let run = |f: Box<dyn FnOnce() -> Result<sparta_ps::scaler::Scaled, String> + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()).unwrap());
        rx
    };
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let s = Arc::clone(&scaler);
    let added = joining.clone();
    let grown = run(Box::new(move || {
        let mut s = s.lock().unwrap();
        rt().block_on(s.grow(&[added], &|_| {}))
            .map_err(|e| e.to_string())
    }));
    let mut at = 0;
    let grown = rounds_until(&mut hook, &model, &mut at, &a, &job, &keys, &grown).unwrap();
    addrs.push(joining.clone());
    assert_eq!(grown.addrs, addrs);
    assert_eq!(grown.moves.len(), 2, "{grown:?}");
    assert_eq!(a.num_shards(), 3);
    // The new shard owns its even share, taken from both; every row reads as before.
    assert_eq!(a.routing().slots_per_shard(), vec![5461, 5461, 5462]);
    assert_eq!(step(a.as_ref(), &job, &keys, false, false).unwrap(), before);
    // A worker connecting now lists the 3 shards; one listing the 2 of the start is told.
    assert_eq!(store(&job, &addrs).routing(), a.routing());
    let mut c = ClientConfig::new(addrs[..2].to_vec(), "tok".into(), 0, 1);
    c.connect_wait = Duration::from_secs(10);
    let e = RemoteStore::connect(c, &job).err().expect("refused");
    assert!(e.to_string().contains("of 3"), "{e}");
    // Removing a shard that owns slots, or one that holds the dense vector, is refused.
    let views = rt()
        .block_on(Mover::new(addrs.clone(), "tok".into(), None).views())
        .unwrap();
    let epoch = views.iter().map(|v| v.epoch).max().unwrap();
    let refused = |keep: usize, runs: Vec<u32>| -> String {
        let req = sparta_proto::pb::SetShardsRequest {
            epoch: epoch + 1,
            runs,
            shard_addrs: addrs[..keep].to_vec(),
            now: false,
        };
        rt().block_on(async {
            let mut c =
                sparta_ps::replica::peer_client(&addrs[keep], "tok", 64 << 20, None).unwrap();
            c.set_shards(req).await.unwrap_err().message().to_string()
        })
    };
    let two = sparta_core::Routing::even(2).flat_runs();
    assert!(refused(2, two).contains("disagree"));
    let one = sparta_core::Routing::even(1).flat_runs();
    assert!(refused(1, one).contains("dense"));
    // Taken away again: its slots move back, then the shorter list; the rows read as before.
    let s = Arc::clone(&scaler);
    let shrunk = run(Box::new(move || {
        let mut s = s.lock().unwrap();
        rt().block_on(s.shrink(2, &|gone| assert_eq!(gone, &[2]), &|_| {}))
            .map_err(|e| e.to_string())
    }));
    let shrunk = rounds_until(&mut hook, &model, &mut at, &a, &job, &keys, &shrunk).unwrap();
    assert_eq!(shrunk.addrs, addrs[..2].to_vec());
    assert_eq!(a.num_shards(), 2);
    assert_eq!(a.routing().slots_per_shard(), vec![8192, 8192]);
    assert_eq!(step(a.as_ref(), &job, &keys, false, false).unwrap(), before);
}
