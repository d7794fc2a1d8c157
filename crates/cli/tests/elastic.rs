//! Elastic parameter servers with real processes on loopback: a checkpoint written by 2 PS
//! shards restores on 3 and on 1 (each new shard reads the slots it owns from the old parts,
//! the dense slices re-cut), scores as the 2-shard export of it does, and training goes on
//! from it with every sample trained once; a `sparta launch` job adds a PS shard while it
//! trains and removes it again (`--scale-ps-at`: slots and their rows move onto the new
//! shard and back), with every sample trained once and, with one worker, exactly the model
//! of the job that never scaled; with `--replicas 2` too (the added shard gets a backup on
//! a start process, the coordinator follows the shards, nothing fails over). `sparta
//! gen-data` rows.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::ckpt::{newest, rows_per_part, rows_per_table};
use common::{cmd, committed, count_lines, export_scores, gen_split, json, s, Proc};

const LONG: Duration = Duration::from_secs(300);

/// A sync job of `ps` shards and 2 workers, one epoch, checkpointing every 8 steps; `ckpt`
/// is `["--checkpoint-dir", dir]` or `["--resume", dir]`.
fn launch(ps: usize, train: &Path, test: &Path, ckpt: [&str; 2], summary: &Path) -> String {
    let mut c = cmd(&["launch", "--ps", &ps.to_string(), "--workers", "2"]);
    c.args([
        "--mode",
        "sync",
        "--model",
        "wdl",
        "--batch-size",
        "256",
        "--epochs",
        "1",
    ])
    .args(["--threads", "1", "--reader-threads", "2", "--seed", "7"])
    .args(["--train", s(train), "--test", s(test)])
    .args(ckpt)
    .args(["--checkpoint-every-steps", "8", "--quiet"])
    .args(["--summary-json", s(summary)])
    // The shards' restore and worker 0's checkpoint decisions are logged at info.
    .env("RUST_LOG", "info");
    let (ok, log) = Proc::start(c).wait(LONG);
    assert!(ok, "{log}");
    log
}

/// A copy of checkpoint directory `from` holding its checkpoints up to `last` only.
fn copy_upto(from: &Path, to: &Path, last: &str) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().to_string();
        if name.as_str() > last {
            continue;
        }
        let dst = to.join(&name);
        std::fs::create_dir_all(&dst).unwrap();
        for f in std::fs::read_dir(e.path()).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), dst.join(f.file_name())).unwrap();
        }
    }
}

fn first_rows(src: &Path, n: usize, dst: PathBuf) -> PathBuf {
    let text = std::fs::read_to_string(src).unwrap();
    let lines: Vec<&str> = text.lines().take(n).collect();
    std::fs::write(&dst, lines.join("\n") + "\n").unwrap();
    dst
}

/// What both tests start from: 20,000 generated rows trained by 2 PS shards into `ck2`.
struct TwoShardRun {
    train: PathBuf,
    test: PathBuf,
    /// Training rows.
    rows: u64,
    /// The 2-shard run's checkpoint directory.
    two: PathBuf,
    /// Its summary.
    reference: serde_json::Value,
}

fn two_shard_run(d: &Path) -> TwoShardRun {
    let (train, test) = gen_split(d, 20_000, 4_000);
    let rows = count_lines(&train);
    let two = d.join("ck2");
    let summary = d.join("2.json");
    launch(2, &train, &test, ["--checkpoint-dir", s(&two)], &summary);
    TwoShardRun {
        train,
        test,
        rows,
        two,
        reference: json(&summary),
    }
}

#[test]
fn a_two_shard_checkpoint_restores_on_three_and_on_one_with_the_same_export_scores() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let TwoShardRun {
        train,
        test,
        rows,
        two,
        reference,
    } = two_shard_run(d);
    let last = newest(&two);
    assert_eq!(last["cluster"]["num_shards"], 2, "{last}");
    let probe = first_rows(&test, 500, d.join("probe.tsv"));
    let want = export_scores(&two, &probe, &d.join("2.scores"));
    assert_eq!(want.len(), 500);
    for ps in [3usize, 1] {
        // Resumed from the end-of-job checkpoint: nothing left to train, so the new
        // cluster's end-of-job checkpoint holds exactly what it restored.
        let ck = d.join(format!("ck{ps}"));
        copy_upto(&two, &ck, last["dir"].as_str().unwrap());
        let summary = d.join(format!("{ps}.json"));
        let log = launch(ps, &train, &test, ["--resume", s(&ck)], &summary);
        assert!(
            log.contains("was written by 2 shard(s); reading the keys this shard owns from"),
            "{log}"
        );
        let j = json(&summary);
        assert_eq!(j["samples_trained"], rows, "{j}");
        assert_eq!(j["train_rows"], 0, "{j}");
        assert_eq!(j["ps_shards"], ps as u64, "{j}");
        assert_eq!(j["runs"][0]["checkpoint_shards"], 2, "{j}");
        // Every row of every table, once: the new shards hold what the old ones held.
        assert_eq!(j["table_rows"], reference["table_rows"], "{j}");
        let c = newest(&ck);
        assert_eq!(c["cluster"]["num_shards"], ps as u64, "{c}");
        assert_eq!(c["kind"], "full", "{c}");
        assert_eq!(c["valid"], true, "{c}");
        assert_eq!(c["cluster"]["samples_trained"], rows, "{c}");
        let got = export_scores(&ck, &probe, &d.join(format!("{ps}.scores")));
        let worst = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-6, "{ps} PS: scores differ by {worst}");
    }
}

#[test]
fn training_resumed_on_another_shard_count_continues_with_samples_exact() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let TwoShardRun {
        train,
        test,
        rows,
        two,
        reference,
    } = two_shard_run(d);
    let ids = committed(&two);
    assert!(ids.len() >= 4, "{ids:?}");
    // A checkpoint in the middle of the job (an incremental one, on a chain).
    let mid = ids[ids.len() / 2].clone();
    for ps in [3usize, 1] {
        let ck = d.join(format!("ck{ps}"));
        copy_upto(&two, &ck, &mid);
        let summary = d.join(format!("{ps}.json"));
        let log = launch(ps, &train, &test, ["--resume", s(&ck)], &summary);
        assert!(
            log.contains(&format!("launch: using checkpoint {mid}")),
            "{log}"
        );
        assert!(log.contains("the next checkpoint is full"), "{log}");
        let j = json(&summary);
        let at_start = j["runs"][0]["samples_at_start"].as_u64().unwrap();
        assert!(at_start > 0 && at_start < rows, "{j}");
        assert_eq!(j["samples_trained"], rows, "{j}");
        assert_eq!(j["train_rows"], rows - at_start, "{j}");
        let (a, b) = (
            j["test_auc"].as_f64().unwrap(),
            reference["test_auc"].as_f64().unwrap(),
        );
        // Not bit-exact: even on the same 2 shards a resumed sync job's AUC moves by ~1e-4
        // between runs (the workers' gradients of a step are summed in arrival order).
        // 0.003 is what a user would call "the same model" (issue 39's bound for moves).
        assert!((a - b).abs() < 0.003, "{ps} PS: test AUC {a} vs {b}");
        let c = newest(&ck);
        assert_eq!(c["cluster"]["num_shards"], ps as u64, "{c}");
        assert_eq!(c["cluster"]["samples_trained"], rows, "{c}");
    }
}

/// A job of 2 PS shards and `workers` workers (`mode`), batches of 128, one epoch,
/// checkpointing every 8 steps into `ckpt`, with `scale` (`--scale-ps-at` flags).
fn scaled(
    workers: usize,
    mode: &str,
    (train, test): (&Path, &Path),
    ckpt: &Path,
    summary: &Path,
    scale: &[&str],
) -> Proc {
    let mut c = cmd(&["launch", "--ps", "2", "--workers", &workers.to_string()]);
    c.args(["--mode", mode, "--batch-size", "128", "--epochs", "1"])
        .args(["--threads", "1", "--reader-threads", "1"])
        .args(["--seed", "5", "--train", s(train), "--test", s(test)])
        .args(["--checkpoint-dir", s(ckpt), "--checkpoint-every-steps", "8"])
        .args(["--quiet", "--summary-json", s(summary)])
        .args(scale)
        // The shards' switches and the workers' new lists of shards are logged at info.
        .env("RUST_LOG", "info")
        .env("SPARTA_TOKEN", "tok");
    Proc::start(c)
}

/// The unscaled job the scaled ones are held to, on 30,000 generated rows (test 3,000).
struct Unscaled {
    train: PathBuf,
    test: PathBuf,
    /// Training rows.
    rows: u64,
    /// Its checkpoint directory.
    ckpt: PathBuf,
    /// Its summary.
    summary: serde_json::Value,
}

/// Makes the data in `d` and runs the job of `workers` workers (`mode`) without scaling.
fn unscaled(d: &Path, workers: usize, mode: &str) -> Unscaled {
    let (train, test) = gen_split(d, 30_000, 3_000);
    let rows = count_lines(&train);
    let ckpt = d.join("plain");
    let data = (train.as_path(), test.as_path());
    let (ok, log) = scaled(workers, mode, data, &ckpt, &d.join("plain.json"), &[]).wait(LONG);
    assert!(ok, "{log}");
    Unscaled {
        summary: json(&d.join("plain.json")),
        train,
        test,
        rows,
        ckpt,
    }
}

/// Scores of the 3,000 test rows by the export of the newest checkpoint in `ckpt`, and how
/// many of them differ (bit for bit) from `want`.
fn differing(ckpt: &Path, test: &Path, out: &Path, want: &[f32]) -> usize {
    let got = export_scores(ckpt, test, out);
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count()
}

/// Once the launch `job` added shard 2, kills its PS (-9) after a checkpoint in `ckpt` whose
/// part of the new shard holds rows.
fn kill_added_after_its_checkpoint(job: &mut Proc, ckpt: &Path) {
    let added = job.wait_started("ps2", None, LONG);
    job.wait_line(LONG, |l| {
        l.contains("launch: the cluster has 3 PS").then_some(())
    });
    common::wait_for("a checkpoint of the 3 shards", LONG, || {
        let c = newest(ckpt);
        rows_per_part(&c)
            .iter()
            .any(|(_, part, n)| part == "ps-2" && *n > 0)
            .then_some(())
    });
    common::kill9(added);
}

/// The scaling events a launch summary lists: (step, shards before, shards after).
fn scaling_events(j: &serde_json::Value) -> Vec<(u64, u64, u64)> {
    j["ps_scaling"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let n = |k: &str| e[k].as_u64().unwrap();
            (n("step"), n("from"), n("to"))
        })
        .collect()
}

/// What the one-worker job scaled 2 -> 3 (step 40) -> 2 (step 140) into `d/name` (summary
/// `d/name.json`, launch log `log`) must show: shard 2 added, a third of the slots moved
/// onto it and back, the shard left and exited by itself, no rollback, both events in the
/// summary, 2 shards of 8192 slots at the end, and the export scoring `test` bit for bit as
/// the unscaled job's (`want`).
fn scaled_exactly(d: &Path, name: &str, test: &Path, log: &str, want: &[f32]) {
    let ckpt = d.join(name);
    for line in [
        "launch: the cluster has 3 PS from step 40 on",
        "moved 2731 slot(s)",
        "launch: ps2 left the cluster (exit status: 0)",
        "launch: the cluster has 2 PS from step 140 on",
        "the cluster has 3 PS shard(s) from now on (was 2)",
        "the cluster has 2 PS shard(s) from now on (was 3)",
    ] {
        assert!(log.contains(line), "{name}: no {line:?} in:\n{log}");
    }
    let j = json(&d.join(format!("{name}.json")));
    assert_eq!(j["rollbacks"], 0, "{name}: {j}");
    // The summary lists both events carried out.
    let events = scaling_events(&j);
    assert_eq!(events, [(40, 2, 3), (140, 3, 2)], "{name}: {j}");
    let shards = j["shard_tables"].as_array().unwrap();
    assert_eq!(shards.len(), 2, "{name}: {j}");
    for s in shards {
        // Each gave a third of its slots to shard 2 and took them (and shard 2's) back.
        assert_eq!(
            (&s["slots"], &s["moves_in"], &s["moves_out"]),
            (&8192.into(), &1.into(), &1.into()),
            "{name}: {j}"
        );
    }
    let last = newest(&ckpt);
    assert_eq!(last["cluster"]["num_shards"], 2, "{name}: {last}");
    let differ = differing(&ckpt, test, &d.join(format!("{name}.scores")), want);
    assert_eq!(
        differ,
        0,
        "{name}: {differ} of {} scores differ",
        want.len()
    );
}

/// One worker: every step is deterministic, so "exactly" is bit for bit. The scaled job
/// adds shard 2 at step 40 (a third of every shard's slots move onto it) and removes it at
/// step 140 (its slots move back, then it leaves and exits), once without replicas and once
/// with `--replicas 2`; the killed job adds it, then a
/// kill -9 of it after a checkpoint that holds its part rolls the job back onto the 3 shards
/// of that checkpoint (the first 2 holding the dense vector).
#[test]
fn a_job_scaled_2_to_3_to_2_ps_and_one_whose_added_ps_is_killed_end_exactly_as_the_unscaled_job() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Unscaled {
        train,
        test,
        rows,
        ckpt: plain_ckpt,
        summary: plain,
    } = unscaled(d, 1, "async");
    let data = (train.as_path(), test.as_path());
    let plain_last = newest(&plain_ckpt);
    let want = export_scores(&plain_ckpt, &test, &d.join("plain.scores"));

    let flags = ["--scale-ps-at", "40:3", "--scale-ps-at", "140:2"];
    for replicas in [1, 2] {
        let name = format!("scaled-r{replicas}");
        let ckpt = d.join(&name);
        let summary = d.join(format!("{name}.json"));
        let r = replicas.to_string();
        let with = [&flags[..], &["--replicas", &r]].concat();
        let (ok, log) = scaled(1, "async", data, &ckpt, &summary, &with).wait(LONG);
        assert!(ok, "{log}");
        scaled_exactly(d, &name, &test, &log, &want);
        let j = json(&summary);
        assert_eq!(j["samples_trained"], rows, "{j}");
        assert_eq!(j["test_auc"], plain["test_auc"], "{j}");
        assert_eq!(rows_per_table(&newest(&ckpt)), rows_per_table(&plain_last));
        if replicas > 1 {
            // The added shard had a backup, on process 0 (the placement after), which the
            // coordinator knew of; nothing failed over.
            for line in [
                "PS shard 0: holds a backup copy of the added shard 2",
                "coordinator: shard 2 added: its primary on process 2, backups on [0]",
                "coordinator: shard(s) 2..2 left the cluster with their processes",
            ] {
                assert!(log.contains(line), "no {line:?} in:\n{log}");
            }
            assert_eq!(j["failovers"], 0, "{j}");
        }
    }

    let ckpt = d.join("killed");
    let summary = d.join("killed.json");
    let mut job = scaled(1, "async", data, &ckpt, &summary, &flags[..2]);
    kill_added_after_its_checkpoint(&mut job, &ckpt);
    let (ok, log) = job.wait(LONG);
    assert!(ok, "{log}");
    let j = json(&summary);
    assert_eq!(j["rollbacks"], 1, "{j}");
    assert_eq!(j["samples_trained"], rows, "{j}");
    assert_eq!(j["ps_shards"], 3, "{j}");
    assert_eq!(j["runs"][1]["checkpoint_shards"], 3, "{j}");
    let last = newest(&ckpt);
    assert_eq!(last["cluster"]["num_shards"], 3, "{last}");
    assert_eq!(last["cluster"]["dense_shards"], 2, "{last}");
    assert_eq!(rows_per_table(&last), rows_per_table(&plain_last));
    assert_eq!(j["test_auc"], plain["test_auc"], "{j}");
    let differ = differing(&ckpt, &test, &d.join("killed.scores"), &want);
    assert_eq!(
        differ,
        0,
        "killed: {differ} of {} scores differ",
        want.len()
    );
}

/// Two workers in sync mode: their pushes to a shard land in either order, so runs differ
/// by float rounding; what must hold is every sample trained once, no rollback, the same
/// rows per table (the ids seen do not depend on the order) and the AUC within 0.003
/// (issue 39's bound).
#[test]
fn a_two_worker_sync_job_scaled_2_to_3_to_2_ps_keeps_every_sample_and_row_and_the_auc() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Unscaled {
        train,
        test,
        rows,
        ckpt: plain_ckpt,
        summary: plain,
    } = unscaled(d, 2, "sync");
    let data = (train.as_path(), test.as_path());
    let flags = ["--scale-ps-at", "25:3", "--scale-ps-at", "70:2"];
    for replicas in [1, 2] {
        let name = format!("scaled-r{replicas}");
        let (ckpt, summary) = (d.join(&name), d.join(format!("{name}.json")));
        let r = replicas.to_string();
        let with = [&flags[..], &["--replicas", &r]].concat();
        let (ok, log) = scaled(2, "sync", data, &ckpt, &summary, &with).wait(LONG);
        assert!(ok, "{log}");
        assert!(
            log.contains("launch: ps2 left the cluster (exit status: 0)"),
            "{name}: {log}"
        );
        let j = json(&summary);
        assert_eq!(j["samples_trained"], rows, "{name}: {j}");
        assert_eq!(j["rollbacks"], 0, "{name}: {j}");
        assert_eq!(
            j["shard_tables"].as_array().unwrap().len(),
            2,
            "{name}: {j}"
        );
        if replicas > 1 {
            assert_eq!(j["failovers"], 0, "{name}: {j}");
        }
        assert_eq!(
            rows_per_table(&newest(&ckpt)),
            rows_per_table(&newest(&plain_ckpt)),
            "{name}"
        );
        let (a, b) = (
            plain["test_auc"].as_f64().unwrap(),
            j["test_auc"].as_f64().unwrap(),
        );
        assert!(
            (a - b).abs() <= 0.003,
            "{name}: test AUC {b} scaled, {a} unscaled"
        );
    }
}

/// `--replicas 2`, one worker: the added PS is killed -9 after a checkpoint holding its rows.
/// Its shard fails over to its backup on process 0 (no rollback), the launcher restarts the
/// PS, which rejoins as that shard's backup; removing the shard then moves its slots off its
/// primary where it is now (`Roles`), and the job ends with every sample trained once, the
/// unscaled job's rows per table and its AUC within 0.003 (not bit for bit: rows a pull
/// created on the killed primary and no push changed yet were never replicated, and are
/// created again).
#[test]
fn a_replicated_job_whose_added_ps_is_killed_fails_over_and_still_scales_back_with_no_row_lost() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Unscaled {
        train,
        test,
        rows,
        ckpt: plain_ckpt,
        summary: plain,
    } = unscaled(d, 1, "async");
    let data = (train.as_path(), test.as_path());
    let ckpt = d.join("killed");
    let summary = d.join("killed.json");
    let flags = [
        "--scale-ps-at",
        "40:3",
        "--scale-ps-at",
        "140:2",
        "--replicas",
        "2",
    ];
    let mut job = scaled(1, "async", data, &ckpt, &summary, &flags);
    kill_added_after_its_checkpoint(&mut job, &ckpt);
    let (ok, log) = job.wait(LONG);
    assert!(ok, "{log}");
    let j = json(&summary);
    assert_eq!(j["rollbacks"], 0, "{j}");
    assert!(j["failovers"].as_u64().unwrap() >= 1, "{j}");
    assert_eq!(j["samples_trained"], rows, "{j}");
    let events = scaling_events(&j);
    assert_eq!(events, [(40, 2, 3), (140, 3, 2)], "{j}");
    let last = newest(&ckpt);
    assert_eq!(last["cluster"]["num_shards"], 2, "{last}");
    assert_eq!(rows_per_table(&last), rows_per_table(&newest(&plain_ckpt)));
    let (a, b) = (
        plain["test_auc"].as_f64().unwrap(),
        j["test_auc"].as_f64().unwrap(),
    );
    assert!((a - b).abs() <= 0.003, "test AUC {b} killed, {a} unscaled");
}
