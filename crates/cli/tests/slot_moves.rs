//! Slot moves between running PS shards (`sparta move-slots`), real processes on loopback: a
//! move ordered while a job trains copies the slots' rows to the receiving shard, switches
//! at a checkpoint round, and the job ends exactly as the same job without the move (one
//! worker: every step is deterministic, so "exact" is bit for bit). `sparta gen-data` rows.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::ckpt::{newest, rows_per_part, rows_per_table};
use common::copies::ShardCopy;
use common::{cmd, committed, count_lines, export_scores, gen_split, json, s, Proc};

const LONG: Duration = Duration::from_secs(300);

/// A small job checkpointing every 4 steps into `ckpt`.
fn job(dir: &Path, ckpt: &Path) -> PathBuf {
    let p = dir.join(format!(
        "job-{}.toml",
        ckpt.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(
        &p,
        format!(
            "[data]\nbatch_size = 128\nreader_threads = 1\n[model]\nhidden = [16]\n\
             [train]\nthreads = 1\nseed = 5\ncheckpoint_dir = {:?}\ncheckpoint_every_steps = 4\n",
            ckpt.to_string_lossy()
        ),
    )
    .unwrap();
    p
}

/// When the move is ordered.
#[derive(Clone, Copy, PartialEq)]
enum Move {
    None,
    /// Before the worker starts (its first copy is of empty tables; it switches at the
    /// first round, with the rows the first steps made).
    AtStart,
    /// Once the first checkpoint is committed (rows exist and keep changing while copied).
    AfterFirstCheckpoint,
}

struct Run {
    ckpt: PathBuf,
    summary: serde_json::Value,
    /// The receiving shard's log.
    receiver_log: String,
    /// Replicated: every copy of every shard at the job's end.
    copies: Vec<ShardCopy>,
}

/// 2 PS shards and 1 worker train `train` once; `mv` moves 4096 of shard 0's 8192 slots to
/// shard 1. `replicas` 2: each shard has a backup on the other process (`--replicas 2`).
fn run(dir: &Path, name: &str, train: &Path, test: &Path, mv: Move, replicas: usize) -> Run {
    let ckpt = dir.join(name);
    let config = job(dir, &ckpt);
    // Replicated shards know each other's addresses from the start.
    let listen = if replicas > 1 {
        common::free_ports(2)
    } else {
        vec!["127.0.0.1:0".to_string(); 2]
    };
    let peers = listen.join(",");
    let ps = |shard: usize| {
        let mut c = cmd(&["ps", "--workers", "1", "--shard", &shard.to_string()]);
        c.args(["--num-shards", "2", "--config", s(&config)])
            .args(["--listen", &listen[shard]])
            .env("SPARTA_TOKEN", "tok")
            // The shards log the moves at info.
            .env("RUST_LOG", "info");
        if replicas > 1 {
            // Kept running past the job's end: every copy is checksummed then.
            c.args(["--replicas", &replicas.to_string(), "--peers", &peers]);
        } else {
            c.arg("--exit-when-done");
        }
        let mut p = Proc::start(c);
        let addr = p.wait_line(LONG, |l| {
            l.split("listening on ")
                .nth(1)
                .map(|a| a.trim().to_string())
        });
        (p, addr)
    };
    let (ps0, a0) = ps(0);
    let (mut ps1, a1) = ps(1);
    let addrs = format!("{a0},{a1}");
    if mv == Move::AtStart {
        let out = move_slots(&addrs, "0");
        assert!(out.contains("ordered: 4096 slot(s)"), "{out}");
    }
    let summary = dir.join(format!("{name}.json"));
    let mut c = cmd(&[
        "worker",
        "--rank",
        "0",
        "--num-workers",
        "1",
        "--ps",
        &addrs,
    ]);
    c.args([
        "--config",
        s(&config),
        "--train",
        s(train),
        "--test",
        s(test),
    ])
    .args(["--epochs", "1", "--quiet", "--summary-json", s(&summary)])
    .env("SPARTA_TOKEN", "tok");
    let worker = Proc::start(c);
    if mv == Move::AfterFirstCheckpoint {
        common::wait_for("the first checkpoint", LONG, || {
            (!committed(&ckpt).is_empty()).then_some(())
        });
        let out = move_slots(&addrs, "120");
        assert!(
            out.contains("moved: shard 1 routes by slot table epoch 1"),
            "{out}"
        );
    }
    let (ok, log) = worker.wait(LONG);
    assert!(ok, "{log}");
    let (copies, receiver_log) = if replicas > 1 {
        let copies = common::copies::checksums(&[a0, a1], "tok");
        if mv != Move::None {
            ps1.wait_line(LONG, |l| l.contains("took 4096 slot(s)").then_some(()));
        }
        (copies, ps1.log())
    } else {
        // The shards stop once the job is over (`--exit-when-done`).
        let (ok, receiver_log) = ps1.wait(LONG);
        assert!(ok, "{receiver_log}");
        (Vec::new(), receiver_log)
    };
    drop(ps0);
    Run {
        ckpt,
        summary: json(&summary),
        receiver_log,
        copies,
    }
}

/// `sparta move-slots` of 4096 of shard 0's slots to shard 1 on the PS at `addrs`, waiting
/// `wait` seconds for the switch; its output.
fn move_slots(addrs: &str, wait: &str) -> String {
    let o = cmd(&["move-slots", "--ps", addrs, "--from", "0", "--to", "1"])
        .args(["--slots", "4096", "--wait-secs", wait])
        .env("SPARTA_TOKEN", "tok")
        .output()
        .unwrap();
    common::ok(&o, "move-slots");
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// The PS addresses a `sparta launch` job prints ("launch: PS at A0,A1").
fn ps_addrs(job: &mut Proc) -> String {
    job.wait_line(LONG, |l| {
        l.split("launch: PS at ")
            .nth(1)
            .map(|a| a.trim().to_string())
    })
}

/// The checkpoint id at which the receiver took the slots, and the rows it took (its log
/// line "took 4096 slot(s) (R rows, B bytes copied) from shard 0 at checkpoint C: ...").
fn switch_of(log: &str) -> (u64, u64) {
    let line = log
        .lines()
        .find(|l| l.contains("took 4096 slot(s)"))
        .unwrap_or_else(|| panic!("the receiver took no slots:\n{log}"));
    let num_after = |what: &str| -> u64 {
        let rest = &line[line.find(what).unwrap() + what.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (num_after("at checkpoint "), num_after("slot(s) ("))
}

#[test]
fn a_slot_move_while_training_ends_exactly_as_the_unmoved_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (train, test) = gen_split(d, 30_000, 3_000);
    let rows = count_lines(&train);
    let plain = run(d, "plain", &train, &test, Move::None, 1);
    let plain_scores = export_scores(&plain.ckpt, &test, &d.join("plain.scores"));
    let plain_ckpt = newest(&plain.ckpt);
    for (name, mv, replicas) in [
        ("at-start", Move::AtStart, 1),
        ("mid-run", Move::AfterFirstCheckpoint, 1),
        ("replicated", Move::AfterFirstCheckpoint, 2),
    ] {
        let moved = run(d, name, &train, &test, mv, replicas);
        // Every sample trained once.
        assert_eq!(
            moved.summary["train_rows"], rows,
            "{name}: {}",
            moved.summary
        );
        assert_eq!(moved.summary["train_rows"], plain.summary["train_rows"]);
        // The move switched at a round before the job's end, with rows in it.
        let (at, took) = switch_of(&moved.receiver_log);
        let last = newest(&moved.ckpt);
        assert!(took > 0, "{name}: took {took} rows");
        assert!(
            at < last["id"].as_u64().unwrap(),
            "{name}: switched at checkpoint {at}, the last is {last}"
        );
        // The summary counts the move and the slots each shard ended with.
        let shards = &moved.summary["shard_tables"];
        assert_eq!(
            (
                shards[0]["moves_out"].clone(),
                shards[1]["moves_in"].clone()
            ),
            (1.into(), 1.into()),
            "{name}: {shards}"
        );
        assert_eq!(
            (shards[0]["slots"].clone(), shards[1]["slots"].clone()),
            (4096.into(), 12288.into()),
            "{name}: {shards}"
        );
        // The checkpoint records the new slot table: shard 1 owns 4096 + 8192 slots.
        assert_eq!(last["cluster"]["routing_epoch"], 1, "{name}: {last}");
        assert_eq!(
            last["cluster"]["slot_runs"],
            serde_json::json!([[0, 0], [4096, 1]]),
            "{name}: {last}"
        );
        // Same rows per table as the unmoved run, split otherwise between the shards.
        assert_eq!(rows_per_table(&last), rows_per_table(&plain_ckpt), "{name}");
        assert_ne!(rows_per_part(&last), rows_per_part(&plain_ckpt), "{name}");
        // Exact: the export of the moved run scores every test row as the unmoved run's does.
        let scores = export_scores(&moved.ckpt, &test, &d.join(format!("{name}.scores")));
        assert_eq!(scores.len(), plain_scores.len());
        let differ = scores
            .iter()
            .zip(&plain_scores)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "{name}: {differ} of {} scores differ",
            scores.len()
        );
        assert_eq!(
            moved.summary["test_auc"], plain.summary["test_auc"],
            "{name}"
        );
        if replicas > 1 {
            // Each shard's backup (on the other process) holds what its primary holds: the
            // rows taken in, the rows given away, the dense slice.
            assert_eq!(moved.copies.len(), 4, "{name}: {:?}", moved.copies);
            for shard in 0..2u32 {
                let of = |primary: bool| {
                    moved
                        .copies
                        .iter()
                        .find(|c| c.0 == shard && c.2 == primary)
                        .unwrap_or_else(|| panic!("{name}: shard {shard}: {:?}", moved.copies))
                };
                let (p, b) = (of(true), of(false));
                assert_eq!((p.1, b.1), (shard as usize, 1 - shard as usize));
                assert!(p.3.iter().all(|t| t.1 > 0), "{name}: {p:?}");
                assert_eq!(
                    (&p.3, p.4),
                    (&b.3, b.4),
                    "{name}: shard {shard}'s backup differs from its primary"
                );
            }
        }
    }
}

/// `sparta launch` of 2 PS shards and 1 worker checkpointing into `ckpt` (as [`job`]).
fn launch(dir: &Path, train: &Path, test: &Path, ckpt: &Path, summary: &Path) -> Proc {
    launch_with(dir, train, test, ckpt, summary, &["--workers", "1"])
}

/// The same with `extra` flags (`--workers`, `--mode`; `--log LEVEL`, taken out here: the
/// processes' `RUST_LOG`).
fn launch_with(
    dir: &Path,
    train: &Path,
    test: &Path,
    ckpt: &Path,
    summary: &Path,
    extra: &[&str],
) -> Proc {
    let config = job(dir, ckpt);
    let mut c = cmd(&["launch", "--ps", "2", "--config", s(&config)]);
    let (mut flags, mut log) = (Vec::new(), "warn");
    let mut it = extra.iter();
    while let Some(&f) = it.next() {
        match f {
            "--log" => log = it.next().expect("--log LEVEL"),
            _ => flags.push(f),
        }
    }
    c.env("RUST_LOG", log);
    c.args(flags)
        .args([
            "--train",
            s(train),
            "--test",
            s(test),
            "--epochs",
            "1",
            "--quiet",
        ])
        .args(["--summary-json", s(summary)])
        .env("SPARTA_TOKEN", "tok");
    Proc::start(c)
}

#[test]
fn a_receiving_shard_killed_mid_move_ends_in_a_rollback_or_the_move_with_no_row_lost() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (train, test) = gen_split(d, 30_000, 3_000);
    let rows = count_lines(&train);
    let plain_ckpt = d.join("plain");
    let (ok, log) = launch(d, &train, &test, &plain_ckpt, &d.join("plain.json")).wait(LONG);
    assert!(ok, "{log}");
    let plain = newest(&plain_ckpt);
    let plain_scores = export_scores(&plain_ckpt, &test, &d.join("plain.scores"));
    let ckpt = d.join("killed");
    let summary = d.join("killed.json");
    let mut job = launch(d, &train, &test, &ckpt, &summary);
    let addrs = ps_addrs(&mut job);
    let receiver = job.wait_started("ps1", None, LONG);
    common::wait_for("the first checkpoint", LONG, || {
        (!committed(&ckpt).is_empty()).then_some(())
    });
    move_slots(&addrs, "0");
    // The receiver dies while it copies (or, at the latest, just after the switch).
    common::kill9(receiver);
    let (ok, log) = job.wait(LONG);
    assert!(ok, "{log}");
    let sum = json(&summary);
    assert!(sum["rollbacks"].as_u64().unwrap() >= 1, "{sum}");
    assert_eq!(sum["samples_trained"], rows, "{sum}");
    // No row lost or duplicated, and training as if nothing happened: the same rows per
    // table and the same scores as the run without the move and the kill.
    let last = newest(&ckpt);
    assert_eq!(rows_per_table(&last), rows_per_table(&plain));
    let scores = export_scores(&ckpt, &test, &d.join("killed.scores"));
    let differ = scores
        .iter()
        .zip(&plain_scores)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differ, 0, "{differ} of {} scores differ", scores.len());
}

/// Two workers in sync mode: their pushes to one shard land in either order, so runs differ
/// in the last bits; a move must not change more than that.
#[test]
fn a_slot_move_in_a_two_worker_sync_job_keeps_every_sample_and_row_and_the_auc() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (train, test) = gen_split(d, 30_000, 3_000);
    let rows = count_lines(&train);
    let flags = ["--workers", "2", "--mode", "sync"];
    let plain_ckpt = d.join("plain");
    let plain_sum = d.join("plain.json");
    let (ok, log) = launch_with(d, &train, &test, &plain_ckpt, &plain_sum, &flags).wait(LONG);
    assert!(ok, "{log}");
    let ckpt = d.join("moved");
    let summary = d.join("moved.json");
    let mut job = launch_with(d, &train, &test, &ckpt, &summary, &flags);
    let addrs = ps_addrs(&mut job);
    common::wait_for("the first checkpoint", LONG, || {
        (!committed(&ckpt).is_empty()).then_some(())
    });
    move_slots(&addrs, "120");
    let (ok, log) = job.wait(LONG);
    assert!(ok, "{log}");
    let (plain, moved) = (json(&plain_sum), json(&summary));
    assert_eq!(moved["samples_trained"], rows, "{moved}");
    assert_eq!(moved["rollbacks"], 0, "{moved}");
    let last = newest(&ckpt);
    assert_eq!(last["cluster"]["routing_epoch"], 1, "{last}");
    // The ids seen are the same whatever the order of pushes: the rows are exact.
    assert_eq!(rows_per_table(&last), rows_per_table(&newest(&plain_ckpt)));
    let (a, b) = (
        plain["test_auc"].as_f64().unwrap(),
        moved["test_auc"].as_f64().unwrap(),
    );
    assert!((a - b).abs() <= 0.003, "test AUC {b} moved, {a} unmoved");
}

/// `--replicas 2` (a coordinator, each shard's backup on the other process): the receiving
/// shard's primary is killed while it copies. Its backup, promoted, knows the move's order
/// and copies the slots again; the move completes, the killed PS is restarted alone and
/// rejoins, and nothing rolls back. One worker, but not bit for bit: rows a pull created on
/// the killed primary and no push changed yet were never replicated, and are created again
/// (the failover tests' case), so the bound is the AUC bound.
#[test]
fn a_replicated_receiving_shard_killed_mid_move_fails_over_with_no_rollback_and_no_row_lost() {
    replicated_kill_mid_move("ps1");
}

/// The same with the move's *source* killed (process 0: shard 0's primary, and the
/// receiver's backup): shard 0 fails over onto process 1, where the receiver finds it
/// (`Roles`) and copies on.
#[test]
fn a_replicated_source_shard_killed_mid_move_fails_over_with_no_rollback_and_no_row_lost() {
    replicated_kill_mid_move("ps0");
}

/// A replicated 2-PS launch job moving 4096 of shard 0's slots to shard 1 after its first
/// checkpoint, PS `victim` killed -9 right after the order: no rollback, the move completed,
/// every sample trained once, the rows and AUC of the same job unmoved.
fn replicated_kill_mid_move(victim: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (train, test) = gen_split(d, 30_000, 3_000);
    let rows = count_lines(&train);
    let flags = ["--workers", "1", "--replicas", "2"];
    let plain_ckpt = d.join("plain");
    let plain_sum = d.join("plain.json");
    let (ok, log) = launch_with(d, &train, &test, &plain_ckpt, &plain_sum, &flags).wait(LONG);
    assert!(ok, "{log}");
    let ckpt = d.join("killed");
    let summary = d.join("killed.json");
    // The shards log the moves at info.
    let logged = [&flags[..], &["--log", "info"]].concat();
    let mut job = launch_with(d, &train, &test, &ckpt, &summary, &logged);
    let addrs = ps_addrs(&mut job);
    let killed = job.wait_started(victim, None, LONG);
    common::wait_for("the first checkpoint", LONG, || {
        (!committed(&ckpt).is_empty()).then_some(())
    });
    move_slots(&addrs, "0");
    common::kill9(killed);
    let (ok, log) = job.wait(LONG);
    assert!(ok, "{log}");
    // Shard 1 took the slots: its primary, or (the receiver killed while it copied) the
    // copy promoted on process 0; a source killed meanwhile was followed to process 1.
    let took = log
        .lines()
        .filter(|l| l.contains("PS shard 1: took 4096 slot(s)") || l.contains("is now at"))
        .collect::<Vec<_>>();
    assert!(
        took.iter().any(|l| l.contains("took 4096")),
        "shard 1 took no slots:\n{log}"
    );
    eprintln!("{}", took.join("\n"));
    let (plain, killed) = (json(&plain_sum), json(&summary));
    assert_eq!(killed["rollbacks"], 0, "{killed}");
    assert!(killed["failovers"].as_u64().unwrap() >= 1, "{killed}");
    assert_eq!(killed["samples_trained"], rows, "{killed}");
    // The move completed on the promoted copy: the last checkpoint routes by it.
    let last = newest(&ckpt);
    assert_eq!(last["cluster"]["routing_epoch"], 1, "{last}");
    assert_eq!(
        last["cluster"]["slot_runs"],
        serde_json::json!([[0, 0], [4096, 1]]),
        "{last}"
    );
    // No row lost or duplicated: the same rows per table as the run without move and kill.
    assert_eq!(rows_per_table(&last), rows_per_table(&newest(&plain_ckpt)));
    let (a, b) = (
        plain["test_auc"].as_f64().unwrap(),
        killed["test_auc"].as_f64().unwrap(),
    );
    eprintln!("test AUC {b} killed mid-move, {a} plain");
    assert!(
        (a - b).abs() <= 0.003,
        "test AUC {b} killed mid-move, {a} plain"
    );
}
