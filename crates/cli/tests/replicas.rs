//! Replicated PS shards (`sparta ps --replicas 2`): real processes on loopback, 3 PS + 2
//! workers, async and sync. The job trains as without replicas, and every shard's backup holds
//! the same tables and dense state as its primary at the end (the `Checksum` RPC of each copy).

mod common;

use std::path::Path;
use std::time::Duration;

use common::copies::ShardCopy;
use common::partition::Partition;
use common::{cmd, gen_split, json, s, start_ps, Proc};
use sparta_proto::pb::ChecksumRequest;
use sparta_proto::ClientTls;

const TOKEN: &str = "tok";

fn write_config(dir: &Path) -> std::path::PathBuf {
    write_config_with(dir, "")
}

/// The job config, with `train` added to its `[train]` table.
fn write_config_with(dir: &Path, train: &str) -> std::path::PathBuf {
    let p = dir.join("job.toml");
    std::fs::write(
        &p,
        format!(
            "[data]\nbatch_size = 128\nreader_threads = 1\n[model]\nhidden = [16]\n\
             [train]\nthreads = 1\n{train}"
        ),
    )
    .unwrap();
    p
}

/// Checksums of every copy of every shard: `[(shard, process, primary, tables, dense)]`.
fn checksums(addrs: &[String]) -> Vec<ShardCopy> {
    common::copies::checksums(addrs, TOKEN)
}

/// Starts PS process `i` of 3 (shard `i`, 2 workers, `mode`) listening on `listen`, with
/// `extra` flags (replicas and peers, a checkpoint to resume).
fn start_shard(i: usize, mode: &str, config: &Path, listen: &str, extra: &[&str]) -> Proc {
    let shard = i.to_string();
    let mut args = vec![
        "--shard",
        &shard,
        "--num-shards",
        "3",
        "--workers",
        "2",
        "--mode",
        mode,
        "--config",
        s(config),
        "--listen",
        listen,
    ];
    args.extend(extra);
    start_ps(&args, Some(TOKEN)).0
}

/// Runs 3 PS (`replicas` copies of each shard) + 2 workers in `mode` to the end; returns the
/// test AUC and the checksums of every copy (read before the PS processes stop).
fn run(
    dir: &Path,
    train: &Path,
    test: &Path,
    mode: &str,
    replicas: usize,
    epochs: u32,
) -> (f64, Vec<ShardCopy>) {
    let config = write_config(dir);
    let addrs = common::free_ports(3);
    let peers = addrs.join(",");
    let r = replicas.to_string();
    let copies = ["--replicas", &r, "--peers", &peers];
    let extra: &[&str] = if replicas > 1 { &copies } else { &[] };
    let ps: Vec<Proc> = (0..3)
        .map(|i| start_shard(i, mode, &config, &addrs[i], extra))
        .collect();
    let summary = dir.join(format!("w0-{mode}-{replicas}.json"));
    let workers: Vec<Proc> = (0..2)
        .map(|rank| {
            let mut c = cmd(&["worker", "--rank", &rank.to_string(), "--num-workers", "2"]);
            c.args(["--ps", &peers, "--config", s(&config)])
                .args(["--train", s(train), "--test", s(test)])
                .args(["--epochs", &epochs.to_string(), "--quiet"])
                .env("SPARTA_TOKEN", TOKEN);
            if rank == 0 {
                c.args(["--summary-json", s(&summary)]);
            }
            Proc::start(c)
        })
        .collect();
    for w in workers {
        let (ok, log) = w.wait(Duration::from_secs(300));
        assert!(ok, "{log}");
    }
    let sums = checksums(&addrs);
    drop(ps);
    let auc = json(&summary)["test_auc"].as_f64().unwrap();
    (auc, sums)
}

fn replicated_matches_unreplicated(mode: &str, tolerance: f64) {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let (auc1, sums1) = run(dir.path(), &train, &test, mode, 1, 1);
    let (auc2, sums2) = run(dir.path(), &train, &test, mode, 2, 1);
    eprintln!("{mode}: AUC R=1 {auc1:.5}, R=2 {auc2:.5}");
    assert!(auc1 > 0.7, "AUC {auc1}");
    assert!(
        (auc1 - auc2).abs() <= tolerance,
        "{mode}: R=2 AUC {auc2} vs R=1 {auc1}"
    );
    // R=1: one copy per shard. R=2: a primary and a backup of each, on the next process.
    assert_eq!(sums1.len(), 3, "{sums1:?}");
    assert_eq!(sums2.len(), 6, "{sums2:?}");
    for shard in 0..3u32 {
        let copies: Vec<_> = sums2.iter().filter(|c| c.0 == shard).collect();
        let primary = copies.iter().find(|c| c.2).expect("a primary");
        let backup = copies.iter().find(|c| !c.2).expect("a backup");
        assert_eq!(primary.1, shard as usize);
        assert_eq!(backup.1, (shard as usize + 1) % 3);
        assert!(
            primary.3.iter().all(|t| t.1 > 0),
            "shard {shard} holds no rows: {primary:?}"
        );
        assert_ne!(primary.4, 0, "shard {shard}: no dense slice");
        assert_eq!(
            (&primary.3, primary.4),
            (&backup.3, backup.4),
            "{mode}: shard {shard}'s backup differs from its primary"
        );
    }
}

#[test]
fn async_backups_equal_their_primaries_and_training_is_unchanged() {
    replicated_matches_unreplicated("async", 0.005);
}

#[test]
fn sync_backups_equal_their_primaries_and_training_is_unchanged() {
    replicated_matches_unreplicated("sync", 0.003);
}

#[test]
fn more_replicas_than_processes_are_refused_naming_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    // `sparta ps` shard 0 of 2 with `flags`: its error (it must fail).
    let refused = |flags: &[&str]| {
        let o = cmd(&["ps", "--shard", "0", "--num-shards", "2"])
            .args(["--config", s(&config), "--listen", "127.0.0.1:0"])
            .args(flags)
            .env("SPARTA_TOKEN", TOKEN)
            .output()
            .unwrap();
        assert!(!o.status.success());
        common::stderr(&o)
    };
    let err = refused(&["--replicas", "3"]);
    assert!(
        err.contains("--replicas 3") && err.contains("--num-shards 2"),
        "{err}"
    );
    let err = refused(&["--replicas", "2"]);
    assert!(err.contains("--peers"), "{err}");
    // TLS copies verify each other: a TLS PS with backups needs the CA.
    let (crt, key) = common::self_signed(dir.path());
    let peers = ["--peers", "127.0.0.1:1,127.0.0.1:2"];
    let tls = ["--tls-cert", s(&crt), "--tls-key", s(&key)];
    let err = refused(&[&["--replicas", "2"][..], &peers, &tls].concat());
    assert!(
        err.contains("--tls-ca") && err.contains("--tls-cert"),
        "{err}"
    );
}

/// The coordinator's view: (failovers, backups dropped, (shard, epoch, primary address)).
type View = (u64, u64, Vec<(u32, u64, String)>);

/// See [`View`].
fn routes(coord: &str) -> View {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = sparta_cluster::store::route::coordinator_client(coord, TOKEN, None).unwrap();
        let r = c
            .route(sparta_proto::pb::RouteRequest {})
            .await
            .unwrap()
            .into_inner();
        let shards = r.shards.iter().map(|s| (s.shard, s.epoch, s.addr.clone()));
        (r.failovers, r.dropped_backups, shards.collect())
    })
}

/// The replication sequence number of `shard`'s copy on the PS at `addr` (0 if unreachable).
fn applied(addr: &str, shard: u32) -> u64 {
    applied_with(addr, shard, None)
}

/// [`applied`] of a PS serving TLS verified with `tls`.
fn applied_with(addr: &str, shard: u32, tls: Option<&ClientTls>) -> u64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = sparta_ps::replica::peer_client(addr, TOKEN, 64 << 20, tls).unwrap();
        c.checksum(ChecksumRequest { shard })
            .await
            .map_or(0, |r| r.into_inner().applied)
    })
}

/// Sends an empty push for `shard` at `epoch` to the PS at `addr`: the error it gets, `None`
/// when it got no answer within `wait` (panics if it is acknowledged).
fn probe_push(addr: &str, shard: u32, epoch: u64, wait: Duration) -> Option<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = sparta_ps::replica::copy_client(addr, TOKEN, (shard, epoch), None).unwrap();
        let push = sparta_proto::pb::PushRequest {
            id: Some(sparta_proto::pb::PushId {
                rank: 0,
                session: 0x5ca1ab1e,
                seq: 1,
            }),
            ..Default::default()
        };
        match tokio::time::timeout(wait, c.push(push)).await {
            Err(_) => None,
            Ok(Ok(_)) => panic!("a write at epoch {epoch} was acknowledged by a deposed primary"),
            Ok(Err(s)) => Some(s.message().to_string()),
        }
    })
}

/// The rejoins the coordinator counted.
fn rejoins(coord: &str) -> u64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = sparta_cluster::store::route::coordinator_client(coord, TOKEN, None).unwrap();
        c.route(sparta_proto::pb::RouteRequest {})
            .await
            .map_or(0, |r| r.into_inner().rejoins)
    })
}

/// What [`run_with_kills`] saw: test AUC, rows trained, the coordinator's view, the
/// checksums of the copies left, worker 0's log.
struct Killed {
    auc: f64,
    rows: u64,
    view: View,
    sums: Vec<ShardCopy>,
    log0: String,
}

/// What happens to PS process 1 (the primary of shard 1) mid-epoch.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// SIGKILL; then restarted (its copies rejoin as backups while training goes on), and
    /// process 0 (the primary of shard 0, whose backup is the rejoined copy) killed in turn.
    KillRejoinKill,
    /// Cut off from every other process (a partition: what they send it is held, not
    /// refused) while it keeps running and reaching the others, until its shard failed over;
    /// a write at its old epoch sent around the cut must not be acknowledged; then healed,
    /// it must refuse that epoch and rejoin.
    CutOff,
}

/// 3 PS with `--replicas 2`, a coordinator and 2 workers in `mode` for `epochs`, with
/// `fault` done to PS process 1 mid-epoch; `train_config` is added to the job's `[train]`.
fn run_with_kills(
    dir: &Path,
    (train, test): (&Path, &Path),
    mode: &str,
    epochs: u32,
    fault: Fault,
    train_config: &str,
) -> Killed {
    let config = write_config_with(dir, train_config);
    let addrs = common::free_ports(4);
    let (coord_addr, addrs) = (addrs[3].clone(), addrs[..3].to_vec());
    // Where the others reach each PS (process 1 through a partition proxy when it is to be
    // cut off); the test itself reaches every process directly.
    let partition = (fault == Fault::CutOff).then(|| Partition::new(&addrs[1]));
    let mut seen = addrs.clone();
    if let Some(p) = &partition {
        seen[1] = p.addr().to_string();
    }
    let peers = seen.join(",");
    let start = |i: usize| {
        let extra = ["--replicas", "2", "--peers", &peers];
        Some(start_shard(i, mode, &config, &addrs[i], &extra))
    };
    let mut ps: Vec<Option<Proc>> = (0..3).map(start).collect();
    let mut coord = cmd(&["coordinator", "--ps", &peers, "--replicas", "2"]);
    coord
        .args(["--listen", &coord_addr, "--dead-after-ms", "800"])
        .env("SPARTA_TOKEN", TOKEN);
    let mut coord = Proc::start(coord);
    coord.wait_line(Duration::from_secs(30), |l| {
        l.contains("coordinator listening").then_some(())
    });
    let summaries: Vec<_> = (0..2)
        .map(|r| dir.join(format!("kill-{mode}-w{r}.json")))
        .collect();
    let mut workers: Vec<Proc> = (0..2)
        .map(|rank| {
            let mut c = cmd(&["worker", "--rank", &rank.to_string(), "--num-workers", "2"]);
            c.args(["--ps", &peers, "--coordinator", &coord_addr])
                .args(["--config", s(&config)])
                .args(["--train", s(train), "--test", s(test)])
                .args(["--epochs", &epochs.to_string(), "--quiet"])
                .args(["--summary-json", s(&summaries[rank])])
                .env("SPARTA_TOKEN", TOKEN);
            Proc::start(c)
        })
        .collect();
    // Mid-epoch: shard 1 has replicated a fair share of the job's changes.
    common::wait_for("shard 1's changes", Duration::from_secs(120), || {
        (applied(&addrs[1], 1) >= 120).then_some(())
    });
    if let Some(partition) = &partition {
        partition.cut();
        common::wait_for("shard 1's failover", Duration::from_secs(60), || {
            (routes(&coord_addr).0 >= 1).then_some(())
        });
        let changes = applied(&addrs[2], 1);
        let t = std::time::Instant::now();
        while applied(&addrs[2], 1) < changes + 30 {
            if t.elapsed() > Duration::from_secs(60) {
                let logs: Vec<String> = workers.iter_mut().map(|w| w.log()).collect();
                panic!(
                    "no training on the new primary ({changes} -> {}): coordinator:\n{}\nworkers:\n{}",
                    applied(&addrs[2], 1),
                    coord.log(),
                    logs.join("\n----\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Cut off, it still believes it is shard 1's primary at epoch 1: a write at that
        // epoch from someone who still reaches it is applied there but never acknowledged
        // (its backup, now the primary at epoch 2, refuses its changes).
        let held = probe_push(&addrs[1], 1, 1, Duration::from_secs(3));
        assert!(
            held.as_ref().is_none_or(|e| e.contains("not the primary")),
            "{held:?}"
        );
        partition.heal();
        // Heard again, it is deposed: the same write is refused, then it rejoins.
        let refused = probe_push(&addrs[1], 1, 1, Duration::from_secs(60))
            .expect("the probe push was neither answered nor refused");
        assert!(refused.contains("not the primary"), "{refused}");
        common::wait_for("process 1's rejoin", Duration::from_secs(120), || {
            (rejoins(&coord_addr) >= 2).then_some(())
        });
    } else {
        let victim = ps[1].take().unwrap();
        common::kill9(victim.pid());
        drop(victim);
    }
    if fault == Fault::KillRejoinKill {
        // Restarted as a StatefulSet would: the same flags, the same address.
        common::wait_for("shard 1's failover", Duration::from_secs(60), || {
            (routes(&coord_addr).0 >= 1).then_some(())
        });
        ps[1] = start(1);
        // Both of its copies (shard 1's and shard 0's) copy their primary and catch up.
        common::wait_for("process 1's rejoin", Duration::from_secs(120), || {
            (rejoins(&coord_addr) >= 2).then_some(())
        });
        let changes = applied(&addrs[2], 1);
        common::wait_for("training after the rejoin", Duration::from_secs(60), || {
            (applied(&addrs[2], 1) >= changes + 30).then_some(())
        });
        let victim = ps[0].take().unwrap();
        common::kill9(victim.pid());
        drop(victim);
    }
    let mut followed = 0;
    let mut logs = Vec::new();
    for w in workers {
        let (ok, log) = w.wait(Duration::from_secs(300));
        assert!(ok, "{log}");
        followed += usize::from(log.contains("PS shard 1: its primary is now"));
        logs.push(log);
    }
    assert!(
        followed > 0,
        "no worker followed shard 1 to its new primary"
    );
    let view = routes(&coord_addr);
    let sums = checksums(&addrs);
    drop(ps);
    drop(coord);
    let auc = json(&summaries[0])["test_auc"].as_f64().unwrap();
    // Rank 0's summary carries the job's totals (every worker's report to shard 0); a copy
    // of shard 0 that missed a report would show in `workers_reported`.
    let j0 = json(&summaries[0]);
    assert_eq!(j0["workers_reported"], j0["workers"], "{j0}");
    let rows = j0["train_rows"].as_u64().unwrap();
    Killed {
        auc,
        rows,
        view,
        sums,
        log0: logs.swap_remove(0),
    }
}

/// The checksums of `shard`'s copy on process `p`.
fn copy_of(sums: &[ShardCopy], shard: u32, p: usize) -> &ShardCopy {
    sums.iter()
        .find(|c| c.0 == shard && c.1 == p)
        .unwrap_or_else(|| panic!("no copy of shard {shard} on process {p}: {sums:?}"))
}

/// Kill, rejoin while training, kill another primary, with a checkpoint round every 3 steps
/// (incremental after the first), in `mode`: two failovers, no rollback, every row trained
/// once, test AUC within `tolerance` of an uninterrupted run, no round lost to a failover (a
/// round a dead primary held is finished by its promoted copy, which continues the
/// incremental chain, the rejoined one included), the rejoined copy equal to its primary at
/// the end, and the last checkpoint restoring exactly the tables and dense state the
/// primaries ended with.
fn two_failovers_and_a_rejoin(mode: &str, tolerance: f64) {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let (auc_plain, _) = run(dir.path(), &train, &test, mode, 2, 2);
    let (ckpt, export) = (dir.path().join("ckpt"), dir.path().join("export"));
    let rounds = format!(
        "checkpoint_dir = {:?}\ncheckpoint_every_steps = 3\ncheckpoint_full_every = 1000\n\
         checkpoint_keep_full = 1000\n[export]\ndir = {:?}\nevery_steps = 3\n\
         full_every = 1000\nkeep_full = 1000\n",
        ckpt.to_str().unwrap(),
        export.to_str().unwrap()
    );
    let k = run_with_kills(
        dir.path(),
        (&train, &test),
        mode,
        2,
        Fault::KillRejoinKill,
        &rounds,
    );
    let (failovers, _, shards) = &k.view;
    eprintln!(
        "{mode}: AUC uninterrupted {auc_plain:.5}, with 2 failovers and a rejoin {:.5}",
        k.auc
    );
    assert_eq!(k.rows, 40_000, "every row of 2 epochs trained once");
    assert!(
        (k.auc - auc_plain).abs() <= tolerance,
        "{mode}: AUC {} after 2 failovers vs {auc_plain}",
        k.auc
    );
    // Process 0 was the primary of shard 0 (its backup: the rejoined process 1) and of
    // nothing else; its death moved shard 0 to process 1.
    assert_eq!(*failovers, 2, "{shards:?}");
    let sums = &k.sums;
    assert!(
        copy_of(sums, 0, 1).2,
        "the rejoined process 1 is shard 0's primary"
    );
    // Shard 1: primary process 2, backup the rejoined process 1: equal.
    let (p, b) = (copy_of(sums, 1, 2), copy_of(sums, 1, 1));
    assert!(p.2 && !b.2, "{p:?} {b:?}");
    assert!(p.3.iter().all(|t| t.1 > 0));
    assert_eq!(
        (&p.3, p.4),
        (&b.3, b.4),
        "the rejoined backup of shard 1 differs"
    );
    // Every round was written: none skipped (an incremental part a promoted copy could
    // not write), none lost.
    assert!(
        !k.log0.contains("not written"),
        "a checkpoint round was not written:\n{}",
        k.log0
    );
    // ~26 rounds per epoch (79 steps of each worker, a round every 3) and the last one.
    let committed = common::committed(&ckpt).len();
    assert!(committed >= 45, "{committed} rounds committed:\n{}", k.log0);
    // Serving exports rode every round: one full version, then deltas only (a promoted
    // copy continues its primary's), none abandoned.
    let kinds: Vec<String> = common::export_manifests(&export)
        .iter()
        .map(|m| m["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(kinds.len() >= 45, "{} export versions", kinds.len());
    assert_eq!(kinds[0], "full");
    assert!(kinds[1..].iter().all(|k| k == "delta"), "{kinds:?}");
    // The chain of deltas, written by whichever copy was primary, scores as the export of
    // the last checkpoint does.
    let from_ckpt = dir.path().join("from-ckpt");
    common::ok(
        &common::sparta(&["export", "--checkpoint", s(&ckpt), "--out", s(&from_ckpt)]),
        "export --checkpoint",
    );
    let served = common::predict_file(&export, &test, &dir.path().join("a.txt")).1;
    let restored = common::predict_file(&from_ckpt, &test, &dir.path().join("b.txt")).1;
    assert_eq!(served.len(), 4_000);
    for (i, (a, b)) in served.iter().zip(&restored).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6,
            "row {i}: export chain {a}, checkpoint {b}"
        );
    }
    // The chain (one full checkpoint, then incrementals, written by whichever copy was
    // primary) restores what the primaries ended with.
    let addrs = common::free_ports(3);
    let config = write_config(dir.path());
    let restored: Vec<Proc> = (0..3)
        .map(|i| start_shard(i, mode, &config, &addrs[i], &["--resume", s(&ckpt)]))
        .collect();
    let again = checksums(&addrs);
    drop(restored);
    for shard in 0..3u32 {
        let live = sums.iter().find(|c| c.0 == shard && c.2).unwrap();
        let back = again.iter().find(|c| c.0 == shard && c.2).unwrap();
        assert_eq!(
            (&live.3, live.4),
            (&back.3, back.4),
            "shard {shard}: the last checkpoint restores other tables than its primary had"
        );
    }
}

#[test]
fn async_two_failovers_and_a_rejoin_lose_nothing_and_roll_nothing_back() {
    two_failovers_and_a_rejoin("async", 0.003);
}

#[test]
fn sync_two_failovers_and_a_rejoin_lose_nothing_and_roll_nothing_back() {
    two_failovers_and_a_rejoin("sync", 0.003);
}

/// No split brain: a primary cut off from every other process (a partition proxy in front of
/// its port) keeps running but is deposed while the workers go on with its backup; a write
/// at its old epoch is never acknowledged, during the cut or after; healed, it rejoins as a
/// backup, and the job trains every row once, the rejoined copy equal to its primary at the
/// end (nothing it held back lost or applied twice).
#[test]
fn a_cut_off_primary_is_deposed_refuses_its_old_epoch_and_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let k = run_with_kills(dir.path(), (&train, &test), "async", 3, Fault::CutOff, "");
    let (failovers, _, shards) = &k.view;
    assert_eq!(k.rows, 60_000, "every row of 3 epochs trained once");
    assert!(k.auc > 0.7, "AUC {}", k.auc);
    assert_eq!(*failovers, 1, "{shards:?}");
    let sums = &k.sums;
    // Shard 1: primary process 2, backup the healed and rejoined process 1: equal.
    let (p, b) = (copy_of(sums, 1, 2), copy_of(sums, 1, 1));
    assert!(p.2 && !b.2, "{p:?} {b:?}");
    assert_eq!(
        (&p.3, p.4),
        (&b.3, b.4),
        "the rejoined backup of shard 1 differs"
    );
    // Shard 0 (primary process 0) took process 1 back as its backup too.
    let (p, b) = (copy_of(sums, 0, 0), copy_of(sums, 0, 1));
    assert_eq!(
        (&p.3, p.4),
        (&b.3, b.4),
        "the rejoined backup of shard 0 differs"
    );
}

/// `sparta launch --replicas 2` over TLS with a checkpoint round every 5 steps: a PS killed
/// mid-job is restarted alone (its shards failed over; it rejoins as a backup) with no
/// rollback, the checkpoint rounds go on (a round the dead primary held is finished by its
/// promoted copy), every sample trained once. Every link is TLS (worker to PS and to the
/// coordinator, PS to PS, coordinator to PS), with a throwaway self-signed certificate.
#[test]
fn launch_over_tls_restarts_a_killed_ps_alone_with_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let out = dir.path().join("job.json");
    let ckpt = dir.path().join("ckpt");
    let (crt, key) = common::self_signed(dir.path());
    let tls = ClientTls::from_file(&crt, Some("localhost".into())).unwrap();
    let mut c = cmd(&["launch", "--ps", "3", "--workers", "2", "--replicas", "2"]);
    c.args([
        "--tls-cert",
        s(&crt),
        "--tls-key",
        s(&key),
        "--tls-ca",
        s(&crt),
    ])
    .args(["--tls-domain", "localhost"]);
    c.args(["--model", "wdl", "--batch-size", "128", "--epochs", "3"])
        .args(["--threads", "1", "--reader-threads", "1"])
        .args([
            "--checkpoint-dir",
            s(&ckpt),
            "--checkpoint-every-steps",
            "5",
        ])
        .args(["--train", s(&train), "--test", s(&test)])
        .args(["--quiet", "--summary-json", s(&out)])
        .env("SPARTA_TOKEN", TOKEN);
    let mut job = Proc::start(c);
    let ps1_addr = job.wait_line(Duration::from_secs(120), |l| {
        l.strip_prefix("[ps1] sparta ps shard 1 listening on ")
            .map(|a| a.trim().to_string())
    });
    // Mid-job: shard 1 has replicated a fair share of the job's changes.
    job.wait_until("shard 1's changes", Duration::from_secs(120), || {
        (applied_with(&ps1_addr, 1, Some(&tls)) >= 120).then_some(())
    });
    assert_eq!(
        applied(&ps1_addr, 1),
        0,
        "plain gRPC read a PS that serves TLS"
    );
    let ps1 = job.started_pid("ps1").unwrap();
    common::kill9(ps1);
    job.wait_started("ps1", Some(ps1), Duration::from_secs(60));
    let (ok, log) = job.wait(Duration::from_secs(300));
    assert!(ok, "{log}");
    assert!(log.contains("restarting it alone"), "{log}");
    assert!(!log.contains("not written"), "a round was lost:\n{log}");
    let j = json(&out);
    eprintln!("launch --replicas 2 with a kill: {j}");
    assert_eq!(j["rollbacks"], 0, "{j}");
    assert_eq!(j["failovers"], 1, "{j}");
    assert_eq!(j["restarts"]["ps"], 1, "{j}");
    assert_eq!(j["samples_trained"], 60_000, "{j}");
    assert!(j["test_auc"].as_f64().unwrap() > 0.7, "{j}");
}

/// A worker's pull creates rows on shard 1's primary (process 1), which dies (kill -9)
/// before the batch's push: the backup never saw those rows (a pull is not replicated), so
/// the push, sent to the promoted backup (process 2) after another request found it there,
/// first pulls its keys there (the created rows start from the initializer's value for
/// their key, as on the dead primary).
/// With SGD at lr 1 every row of every shard ends exactly at pulled value minus gradient:
/// no update of a fresh id is lost to the failover.
#[test]
fn a_push_after_a_failover_updates_the_rows_its_pull_created_on_the_dead_primary() {
    use sparta_core::dedup::{Deduper, UniqueIds};
    use sparta_core::{JobConfig, PullInto, PushFrom, SparseStore, TableId};

    let dir = tempfile::tempdir().unwrap();
    let toml = "[embedding]\ndim = 4\noptimizer = { type = \"sgd\", lr = 1.0 }\n\
                [wide]\noptimizer = { type = \"sgd\", lr = 1.0 }\n\
                [model]\nhidden = [4]\noptimizer = { type = \"sgd\", lr = 1.0 }\n";
    let config = dir.path().join("job.toml");
    std::fs::write(&config, toml).unwrap();
    let job = JobConfig::from_toml(toml).unwrap().validate().unwrap();
    let addrs = common::free_ports(4);
    let (coord_addr, addrs) = (addrs[3].clone(), addrs[..3].to_vec());
    let peers = addrs.join(",");
    let extra = ["--replicas", "2", "--peers", &peers];
    let mut ps: Vec<Option<Proc>> = (0..3)
        .map(|i| Some(start_shard(i, "async", &config, &addrs[i], &extra)))
        .collect();
    let mut coord = cmd(&["coordinator", "--ps", &peers, "--replicas", "2"]);
    coord
        .args(["--listen", &coord_addr, "--dead-after-ms", "800"])
        .env("SPARTA_TOKEN", TOKEN);
    let mut coord = Proc::start(coord);
    coord.wait_line(Duration::from_secs(30), |l| {
        l.contains("coordinator listening").then_some(())
    });
    let mut cfg = sparta_cluster::ClientConfig::new(addrs.clone(), TOKEN.into(), 0, 2);
    cfg.coordinator = Some(coord_addr.clone());
    cfg.connect_wait = Duration::from_secs(30);
    let store = sparta_cluster::RemoteStore::connect(cfg, &job).unwrap();

    let f = &job.features;
    let mut u = UniqueIds::default();
    let keys: Vec<u64> = (1..=300).collect();
    Deduper::new().run_classed(
        &keys,
        &store.routing(),
        &f.class_of_tag,
        f.num_classes,
        &mut u,
    );
    let parts = u.parts();
    assert!(
        (0..3).all(|i| !parts.shard_range(i).is_empty()),
        "every shard holds some of the keys"
    );
    let pull = |create: bool| -> Vec<Vec<f32>> {
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
        store.pull(&parts, &mut into, create).unwrap();
        rows
    };
    let before = pull(true);
    let victim = ps[1].take().unwrap();
    common::kill9(victim.pid());
    drop(victim);
    // Another request finds the new primary first (as a dense step's does between a
    // worker's pull and its push): the push goes straight there.
    assert!(store.table_rows() > 0);
    let grads: Vec<Vec<f32>> = before
        .iter()
        .map(|r| (0..r.len()).map(|i| 0.5 + (i % 7) as f32 * 0.125).collect())
        .collect();
    store.push(&parts, &PushFrom::per_table(&grads, f)).unwrap();
    assert_eq!(routes(&coord_addr).0, 1, "shard 1 failed over once");
    let after = pull(false);
    for (t, ((b, a), g)) in before.iter().zip(&after).zip(&grads).enumerate() {
        for (i, ((b, a), g)) in b.iter().zip(a).zip(g).enumerate() {
            assert_eq!(*a, b - g, "table {t}, value {i}: pulled {b}, pushed {g}");
        }
    }
    drop(ps);
    drop(coord);
}
