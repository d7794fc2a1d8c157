//! Replicated PS shards (`sparta ps --replicas 2`): real processes on loopback, 3 PS + 2
//! workers, async and sync. The job trains as without replicas, and every shard's backup holds
//! the same tables and dense state as its primary at the end (the `Checksum` RPC of each copy).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{cmd, gen_split, json, s, start_ps, Proc};
use sparta_ps::proto::ChecksumRequest;

const TOKEN: &str = "tok";

/// One copy of a shard: (shard, process, primary, tables (name, rows, sum), dense hash).
type ShardCopy = (u32, usize, bool, Vec<(String, u64, u64)>, u64);

fn write_config(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("job.toml");
    std::fs::write(
        &p,
        "[data]\nbatch_size = 128\nreader_threads = 1\n[model]\nhidden = [16]\n\
         [train]\nthreads = 1\n",
    )
    .unwrap();
    p
}

fn free_ports(n: usize) -> Vec<String> {
    let held: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect()
}

/// Checksums of every copy of every shard: `[(shard, process, primary, tables, dense)]`.
fn checksums(addrs: &[String]) -> Vec<ShardCopy> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut out = Vec::new();
        for (p, addr) in addrs.iter().enumerate() {
            let mut c = sparta_ps::replica::peer_client(addr, TOKEN, 64 << 20).unwrap();
            for shard in 0..addrs.len() as u32 {
                if let Ok(r) = c.checksum(ChecksumRequest { shard }).await {
                    let r = r.into_inner();
                    let tables = r.tables.iter().map(|t| (t.name.clone(), t.rows, t.sum));
                    out.push((shard, p, r.primary, tables.collect(), r.dense));
                }
            }
        }
        out
    })
}

/// Runs 3 PS (`replicas` copies of each shard) + 2 workers in `mode` to the end; returns the
/// test AUC and the checksums of every copy (read before the PS processes stop).
fn run(
    dir: &Path,
    train: &Path,
    test: &Path,
    mode: &str,
    replicas: usize,
) -> (f64, Vec<ShardCopy>) {
    let config = write_config(dir);
    let addrs = free_ports(3);
    let peers = addrs.join(",");
    let ps: Vec<Proc> = (0..3)
        .map(|i| {
            let shard = i.to_string();
            let r = replicas.to_string();
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
                s(&config),
                "--listen",
                &addrs[i],
            ];
            if replicas > 1 {
                args.extend(["--replicas", &r, "--peers", &peers]);
            }
            start_ps(&args, Some(TOKEN)).0
        })
        .collect();
    let summary = dir.join(format!("w0-{mode}-{replicas}.json"));
    let workers: Vec<Proc> = (0..2)
        .map(|rank| {
            let mut c = cmd(&["worker", "--rank", &rank.to_string(), "--num-workers", "2"]);
            c.args(["--ps", &peers, "--config", s(&config)])
                .args(["--train", s(train), "--test", s(test)])
                .args(["--epochs", "1", "--quiet"])
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
    let (auc1, sums1) = run(dir.path(), &train, &test, mode, 1);
    let (auc2, sums2) = run(dir.path(), &train, &test, mode, 2);
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
    let o = cmd(&["ps", "--shard", "0", "--num-shards", "2", "--replicas", "3"])
        .args(["--config", s(&config), "--listen", "127.0.0.1:0"])
        .env("SPARTA_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = common::stderr(&o);
    assert!(
        err.contains("--replicas 3") && err.contains("--num-shards 2"),
        "{err}"
    );
    let o = cmd(&["ps", "--shard", "0", "--num-shards", "2", "--replicas", "2"])
        .args(["--config", s(&config), "--listen", "127.0.0.1:0"])
        .env("SPARTA_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = common::stderr(&o);
    assert!(err.contains("--peers"), "{err}");
}

/// The coordinator's view: (failovers, backups dropped, (shard, epoch, primary address)).
type View = (u64, u64, Vec<(u32, u64, String)>);

/// See [`View`].
fn routes(coord: &str) -> View {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = sparta_ps::failover::coordinator_client(coord, TOKEN).unwrap();
        let r = c
            .route(sparta_ps::proto::RouteRequest {})
            .await
            .unwrap()
            .into_inner();
        let shards = r.shards.iter().map(|s| (s.shard, s.epoch, s.addr.clone()));
        (r.failovers, r.dropped_backups, shards.collect())
    })
}

/// The replication sequence number of `shard`'s copy on the PS at `addr` (0 if unreachable).
fn applied(addr: &str, shard: u32) -> u64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = sparta_ps::replica::peer_client(addr, TOKEN, 64 << 20).unwrap();
        c.checksum(ChecksumRequest { shard })
            .await
            .map_or(0, |r| r.into_inner().applied)
    })
}

/// 3 PS with `--replicas 2`, a coordinator and 2 workers in `mode`; PS process 1 (the
/// primary of shard 1) is killed with SIGKILL mid-epoch. Returns the test AUC, the rows the
/// workers trained, the coordinator's view and the checksums of the copies left.
fn run_with_a_kill(
    dir: &Path,
    train: &Path,
    test: &Path,
    mode: &str,
) -> (f64, u64, View, Vec<ShardCopy>) {
    let config = write_config(dir);
    let addrs = free_ports(4);
    let (coord_addr, addrs) = (addrs[3].clone(), addrs[..3].to_vec());
    let peers = addrs.join(",");
    let mut ps: Vec<Option<Proc>> = (0..3)
        .map(|i| {
            let shard = i.to_string();
            let args = [
                "--shard",
                &shard,
                "--num-shards",
                "3",
                "--workers",
                "2",
                "--mode",
                mode,
                "--config",
                s(&config),
                "--listen",
                &addrs[i],
                "--replicas",
                "2",
                "--peers",
                &peers,
            ];
            Some(start_ps(&args, Some(TOKEN)).0)
        })
        .collect();
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
    let workers: Vec<Proc> = (0..2)
        .map(|rank| {
            let mut c = cmd(&["worker", "--rank", &rank.to_string(), "--num-workers", "2"]);
            c.args(["--ps", &peers, "--coordinator", &coord_addr])
                .args(["--config", s(&config)])
                .args(["--train", s(train), "--test", s(test)])
                .args(["--epochs", "1", "--quiet"])
                .args(["--summary-json", s(&summaries[rank])])
                .env("SPARTA_TOKEN", TOKEN);
            Proc::start(c)
        })
        .collect();
    // Mid-epoch: shard 1 has replicated a fair share of the job's changes.
    common::wait_for("shard 1's changes", Duration::from_secs(120), || {
        (applied(&addrs[1], 1) >= 120).then_some(())
    });
    let victim = ps[1].take().unwrap();
    common::kill9(victim.pid());
    drop(victim);
    let mut followed = 0;
    for w in workers {
        let (ok, log) = w.wait(Duration::from_secs(300));
        assert!(ok, "{log}");
        followed += usize::from(log.contains("PS shard 1: its primary is now"));
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
    let rows = summaries
        .iter()
        .map(|p| json(p)["train_rows"].as_u64().unwrap())
        .sum();
    (auc, rows, view, sums)
}

fn a_killed_primary_fails_over(mode: &str, tolerance: f64) {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_split(dir.path(), 20_000, 4_000);
    let (auc_plain, _) = run(dir.path(), &train, &test, mode, 2);
    let (auc, rows, (failovers, dropped, shards), sums) =
        run_with_a_kill(dir.path(), &train, &test, mode);
    eprintln!("{mode}: AUC uninterrupted {auc_plain:.5}, with a failover {auc:.5}");
    assert_eq!(rows, 20_000, "every row trained once");
    assert!(
        (auc - auc_plain).abs() <= tolerance,
        "{mode}: AUC {auc} after a failover vs {auc_plain}"
    );
    // Shard 1 moved to its backup (process 2) at epoch 2; shard 0 lost its backup (process
    // 1) at epoch 2; shard 2 kept both copies.
    assert_eq!((failovers, dropped), (1, 1), "{shards:?}");
    assert_eq!((shards[1].1, shards[2].1), (2, 1), "{shards:?}");
    // Shard 2's primary (process 2) and backup (process 0) still agree; shard 1's new
    // primary is process 2's copy, which holds rows.
    let copy = |shard: u32, p: usize| sums.iter().find(|c| c.0 == shard && c.1 == p).unwrap();
    assert!(copy(1, 2).2, "process 2 is shard 1's primary now");
    assert!(copy(1, 2).3.iter().all(|t| t.1 > 0), "{:?}", copy(1, 2));
    assert_eq!(
        (&copy(2, 2).3, copy(2, 2).4),
        (&copy(2, 0).3, copy(2, 0).4),
        "shard 2's backup differs from its primary"
    );
}

#[test]
fn async_a_killed_primary_fails_over_to_its_backup_without_rollback() {
    a_killed_primary_fails_over("async", 0.01);
}

#[test]
fn sync_a_killed_primary_fails_over_to_its_backup_without_rollback() {
    a_killed_primary_fails_over("sync", 0.005);
}
