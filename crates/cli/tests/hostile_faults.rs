//! Faults a careful user or an attacker meets, on the real binary (issue 18): `--resume`
//! without a checkpoint, a graceful stop of plain `--train` on SIGTERM, a diverging loss, NaN
//! pushed to a PS, a full disk under the checkpoints, read-only checkpoint and export
//! directories, and the messages of OS errors.
//!
//! The full-disk and read-only cases mount a small tmpfs in a private user + mount namespace
//! (`unshare -rm`, util-linux), so they need no root and leave the machine's mounts alone.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{cmd, committed, gen, json, ok, s, sparta, start_ps, stderr, wait_for, Proc, EXE};

fn train_args<'a>(train: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "train",
        "--train",
        s(train),
        "--batch-size",
        "256",
        "--reader-threads",
        "1",
        "--threads",
        "1",
        "--quiet",
    ];
    a.extend_from_slice(extra);
    a
}

/// `--resume` finds nothing: an error naming the directory, unless `--resume-if-present`.
/// Checkpoints that exist but none of which restores (a deleted full base) are an error
/// either way, and `checkpoint inspect` exits 1 on them.
#[test]
fn resume_without_a_restorable_checkpoint_is_an_error_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 3000, 1);
    let missing = dir.path().join("typo");
    let o = sparta(&train_args(&train, &["--resume", s(&missing)]));
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "nothing to resume from in {}: no such directory",
            missing.display()
        )) && err.contains("--resume-if-present"),
        "{err}"
    );
    assert!(
        !missing.exists(),
        "a failed resume must not create the directory"
    );
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = sparta(&train_args(&train, &["--resume", s(&empty)]));
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("holds no checkpoint"), "{err}");

    // Resume if present: a fresh start that checkpoints there.
    let ckpt = dir.path().join("ckpt");
    let summary = dir.path().join("s.json");
    let o = sparta(&train_args(
        &train,
        &[
            "--resume",
            s(&ckpt),
            "--resume-if-present",
            "--checkpoint-every-steps",
            "4",
            "--summary-json",
            s(&summary),
        ],
    ));
    ok(&o, "resume if present");
    let j = json(&summary);
    assert!(j["resumed_from"].is_null(), "{j}");
    let ids = committed(&ckpt);
    assert!(ids.len() >= 2, "{ids:?}");
    let o = sparta(&["checkpoint", "inspect", s(&ckpt)]);
    ok(&o, "inspect of valid checkpoints");

    // The full base of every chain deleted: nothing restores, and nothing starts fresh.
    let report: serde_json::Value =
        serde_json::from_slice(&sparta(&["checkpoint", "inspect", "--json", s(&ckpt)]).stdout)
            .unwrap();
    for c in report["checkpoints"].as_array().unwrap() {
        if c["kind"] == "full" {
            std::fs::remove_dir_all(ckpt.join(c["dir"].as_str().unwrap())).unwrap();
        }
    }
    assert!(!committed(&ckpt).is_empty(), "incrementals remain");
    for flags in [
        &["--resume", s(&ckpt)][..],
        &["--resume", s(&ckpt), "--resume-if-present"],
    ] {
        let o = sparta(&train_args(&train, flags));
        let err = stderr(&o);
        assert!(!o.status.success(), "{flags:?}: {err}");
        assert!(
            err.contains("none can be restored") && err.contains("checkpoint inspect"),
            "{err}"
        );
    }
    let o = sparta(&["checkpoint", "inspect", s(&ckpt)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no restorable checkpoint"),
        "{}",
        stderr(&o)
    );
}

/// The same rules on a cluster: `sparta launch --resume` and `sparta ps --resume`.
#[test]
fn cluster_resume_without_a_checkpoint_is_an_error_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 1000, 8);
    let missing = dir.path().join("typo");
    let launch = |extra: &[&str]| {
        let mut c = cmd(&[
            "launch",
            "--ps",
            "1",
            "--workers",
            "1",
            "--train",
            s(&train),
        ]);
        c.args(["--batch-size", "256", "--quiet", "--resume", s(&missing)])
            .args(extra);
        c.output().unwrap()
    };
    let o = launch(&[]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("no such directory") && err.contains("--resume-if-present"),
        "{err}"
    );
    assert!(
        !missing.exists(),
        "a failed resume must not create the directory"
    );
    let o = launch(&["--resume-if-present"]);
    ok(&o, "launch --resume-if-present on a missing directory");
    assert!(!committed(&missing).is_empty(), "it checkpoints there");
    // A PS shard told to resume from an empty directory refuses to start empty.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = cmd(&["ps", "--shard", "0", "--num-shards", "1", "--workers", "1"])
        .args(["--listen", "127.0.0.1:0", "--resume", s(&empty)])
        .env("SPARTA_TOKEN", "t")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("holds no checkpoint"), "{err}");
}

/// SIGTERM during plain `--train`: the step finishes, the final checkpoint and the summary are
/// written, exit 0; `--resume` then trains exactly the rest.
#[test]
fn sigterm_stops_plain_training_with_a_final_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let rows = 20_000u64;
    let epochs = 10u64;
    let train = gen(dir.path(), "train.tsv", rows, 2);
    let ckpt = dir.path().join("ckpt");
    let (first, second) = (
        dir.path().join("first.json"),
        dir.path().join("second.json"),
    );
    let epochs_s = epochs.to_string();
    let common = [
        "--epochs",
        epochs_s.as_str(),
        "--checkpoint-every-steps",
        "200",
    ];
    let mut a = train_args(&train, &common);
    a.extend(["--checkpoint-dir", s(&ckpt), "--summary-json", s(&first)]);
    let p = Proc::start(cmd(&a));
    wait_for("a first checkpoint", Duration::from_secs(120), || {
        (!committed(&ckpt).is_empty()).then_some(())
    });
    common::signal(p.pid(), "-TERM");
    let (ok_exit, log) = p.wait(Duration::from_secs(60));
    assert!(ok_exit, "SIGTERM must end training with exit 0:\n{log}");
    let j = json(&first);
    assert_eq!(j["stopped_early"], true, "{j}");
    let done = j["samples_trained"].as_u64().unwrap();
    assert!(done > 0 && done < rows * epochs, "{j}");
    assert_eq!(j["input_position"]["rows_consumed"], done, "{j}");
    // The final checkpoint is the newest and holds exactly the rows trained.
    let last = committed(&ckpt).last().cloned().unwrap();
    assert_eq!(j["last_checkpoint"], last.as_str(), "{j}");

    let mut a = train_args(&train, &common);
    a.extend(["--resume", s(&ckpt), "--summary-json", s(&second)]);
    let o = sparta(&a);
    ok(&o, "resume after SIGTERM");
    let j = json(&second);
    assert_eq!(j["resumed_from"], last.as_str(), "{j}");
    assert_eq!(j["stopped_early"], false, "{j}");
    assert_eq!(j["samples_trained"], rows * epochs, "{j}");
    assert_eq!(j["train_rows"], rows * epochs - done, "{j}");
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A loss that turns NaN stops training with an error naming the step and the last good
/// checkpoint; nothing of the diverged state is saved, so the checkpoint resumes cleanly.
#[test]
fn a_diverging_loss_stops_training_and_keeps_the_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 12_000, 3);
    let ckpt = dir.path().join("ckpt");
    let job = |lr: &str| {
        format!(
            "[model]\nhidden = [16]\noptimizer = {{ type = \"sgd\", lr = {lr} }}\n[train]\n\
             checkpoint_every_steps = 5\n"
        )
    };
    let sane = write(dir.path(), "sane.toml", &job("0.05"));
    let wild = write(dir.path(), "wild.toml", &job("1e35"));
    let o = sparta(&train_args(
        &train,
        &[
            "--config",
            s(&sane),
            "--max-rows",
            "3000",
            "--checkpoint-dir",
            s(&ckpt),
        ],
    ));
    ok(&o, "first part");
    let good = committed(&ckpt);
    let last_good = good.last().cloned().unwrap();
    // The learning rate explodes: NaN within a couple of steps.
    let o = sparta(&train_args(
        &train,
        &["--config", s(&wild), "--resume", s(&ckpt)],
    ));
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("training diverged: step ")
            && err.contains("the loss is NaN")
            && err.contains(&format!("the last good checkpoint is {last_good}")),
        "{err}"
    );
    assert_eq!(committed(&ckpt), good, "no checkpoint after the divergence");
    let summary = dir.path().join("s.json");
    let o = sparta(&train_args(
        &train,
        &[
            "--config",
            s(&sane),
            "--resume",
            s(&ckpt),
            "--summary-json",
            s(&summary),
        ],
    ));
    ok(&o, "resume from the last good checkpoint");
    let j = json(&summary);
    assert!(j["train_loss"].as_f64().unwrap().is_finite(), "{j}");
    assert_eq!(j["samples_trained"], 12_000, "{j}");
}

/// A push of NaN or infinite gradients (sparse or dense) with a valid token is refused by the
/// PS: an error the worker reports as a divergence, nothing applied, a metric counted.
#[test]
fn a_ps_refuses_non_finite_gradients() {
    use sparta_core::{JobConfig, KeyParts, PullInto, PushFrom, SparseStore, TableId};
    let (mut ps, addr) = start_ps(
        &[
            "--shard",
            "0",
            "--num-shards",
            "1",
            "--workers",
            "1",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        Some("tok"),
    );
    let metrics = ps.wait_line(Duration::from_secs(30), |l| {
        l.split("metrics on http://")
            .nth(1)
            .map(|a| a.trim().trim_end_matches("/metrics").to_string())
    });
    let job = JobConfig::default().validate().unwrap();
    let mut cc = sparta_cluster::ClientConfig::new(vec![addr], "tok".into(), 0, 1);
    cc.retries = 0;
    let store = sparta_cluster::RemoteStore::connect(cc, &job).unwrap();
    let dim = job.features.physical[0].config.dim;
    let keys = [7u64, 8];
    let parts = KeyParts::single(&keys, &[0, 2]);
    let pull = |store: &sparta_cluster::RemoteStore| {
        let mut values = vec![0.0f32; 2 * dim];
        store
            .pull(
                &parts,
                &mut [PullInto {
                    table: TableId(0),
                    classes: u64::MAX,
                    values: &mut values,
                }],
                true,
            )
            .unwrap();
        values
    };
    let before = pull(&store);
    for bad in [f32::NAN, f32::INFINITY] {
        let mut grads = vec![0.1f32; 2 * dim];
        grads[dim + 3] = bad;
        let e = store
            .push(
                &parts,
                &[PushFrom {
                    table: TableId(0),
                    classes: u64::MAX,
                    grads: &grads,
                }],
            )
            .unwrap_err();
        assert!(
            matches!(e, sparta_core::CoreError::Diverged(_))
                && e.to_string().contains("non-finite"),
            "{e}"
        );
    }
    assert_eq!(pull(&store), before, "a refused push changed rows");
    let num_params = sparta_worker::Trainer::embedded(job.clone())
        .unwrap()
        .model()
        .num_params();
    let mut params = vec![0.0f32; num_params];
    store.init_dense(&mut params).unwrap();
    let before_dense = params.clone();
    let mut grads = vec![0.0f32; params.len()];
    grads[0] = f32::NEG_INFINITY;
    let e = sparta_core::DenseStore::push_pull(&store, &grads, &mut params).unwrap_err();
    assert!(e.to_string().contains("non-finite"), "{e}");
    assert_eq!(params, before_dense);
    // A finite push is applied as before.
    let grads = vec![0.1f32; 2 * dim];
    store
        .push(
            &parts,
            &[PushFrom {
                table: TableId(0),
                classes: u64::MAX,
                grads: &grads,
            }],
        )
        .unwrap();
    assert_ne!(pull(&store), before);
    let (code, text) = common::http::http(
        metrics.parse().unwrap(),
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(code, 200);
    assert!(
        text.lines()
            .any(|l| l.starts_with("sparta_push_non_finite_total") && l.ends_with(" 3")),
        "{text}"
    );
}

/// Runs `script` (sh) in a private user + mount namespace with `$1` = `dir` and `$2` = the
/// `sparta` binary; the script mounts what it needs under `dir`.
fn in_namespace(dir: &Path, script: &str) -> Output {
    let probe = Command::new("unshare").args(["-rm", "true"]).status();
    assert!(
        probe.is_ok_and(|s| s.success()),
        "these tests need `unshare -rm` (util-linux, user namespaces enabled)"
    );
    Command::new("unshare")
        .args(["-rm", "sh", "-c", script, "sh", s(dir), EXE])
        .env("RUST_LOG", "warn")
        .env_remove("SPARTA_TOKEN")
        .output()
        .unwrap()
}

/// Bytes of the regular files under `dir`.
fn du(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        n += if m.is_dir() { du(&e.path()) } else { m.len() };
    }
    n
}

/// The disk fills under the checkpoints: each failed attempt is removed, directory and all,
/// the job stops non-zero after its retries, and the previous checkpoint stays valid.
#[test]
fn a_full_disk_leaves_no_partial_checkpoint_behind() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 8000, 4);
    let config = write(
        dir.path(),
        "job.toml",
        "[train]\ncheckpoint_full_every = 1\ncheckpoint_max_failures = 3\n",
    );
    // The size of the first checkpoint, measured on the real disk: the tmpfs holds it and
    // half as much again, so the second (full, at least as big) cannot fit beside it.
    let probe = dir.path().join("probe");
    let o = sparta(&train_args(
        &train,
        &[
            "--config",
            s(&config),
            "--max-rows",
            "1280",
            "--checkpoint-dir",
            s(&probe),
        ],
    ));
    ok(&o, "probe run");
    let size = du(&probe) * 3 / 2 + (64 << 10);
    let script = format!(
        "mkdir -p \"$1/small\" && mount -t tmpfs -o size={size} tmpfs \"$1/small\" || exit 90\n\
         \"$2\" train --config {config} --train {train} --batch-size 256 --reader-threads 1 \
         --threads 1 --quiet --checkpoint-dir \"$1/small/ck\" --checkpoint-every-steps 5\n\
         echo \"train-exit=$?\"\n\
         find \"$1/small/ck\" | sort\n\
         \"$2\" checkpoint inspect \"$1/small/ck\" >/dev/null; echo \"inspect-exit=$?\"\n",
        config = s(&config),
        train = s(&train),
    );
    let o = in_namespace(dir.path(), &script);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), stderr(&o));
    // 3: a job-level failure (a restart from the last checkpoint would not fix a full disk).
    assert!(out.contains("train-exit=3"), "{out}\n{err}");
    assert!(
        err.contains("No space left on device") && err.contains("failed 3 times in a row"),
        "{err}"
    );
    let ck = dir.path().join("small/ck");
    let entries: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{}/", ck.display())))
        .filter(|e| !e.contains('/'))
        .collect();
    assert_eq!(
        entries,
        ["ckpt-0000000000000001"],
        "only the committed checkpoint may remain:\n{out}"
    );
    assert!(out.contains("inspect-exit=0"), "{out}");
}

/// Read-only checkpoint and export directories stop the job before its first step (not at the
/// first checkpoint, or after training when the export would be lost).
#[test]
fn unwritable_checkpoint_and_export_directories_are_found_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 3000, 5);
    for flag in ["--checkpoint-dir", "--export-dir"] {
        let script = format!(
            "mkdir -p \"$1/ro\" && mount -t tmpfs tmpfs \"$1/ro\" && mkdir \"$1/ro/out\" && \
             mount -o remount,ro \"$1/ro\" || exit 90\n\
             exec \"$2\" train --train {train} --batch-size 256 --quiet {flag} \"$1/ro/out\"\n",
            train = s(&train),
        );
        let o = in_namespace(dir.path(), &script);
        let (out, err) = (String::from_utf8_lossy(&o.stdout), stderr(&o));
        assert_eq!(o.status.code(), Some(1), "{flag}: {out}\n{err}");
        assert!(err.contains("Read-only file system"), "{flag}: {err}");
        assert!(
            !out.contains("train rows in"),
            "{flag}: trained first:\n{out}"
        );
    }
}

/// OS errors are printed once, and a directory that cannot be created says so (not "not
/// found").
#[test]
fn os_errors_are_reported_once_and_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 500, 6);
    let under_file = train.join("ckpt");
    for (flag, path, says) in [
        (
            "--checkpoint-dir",
            under_file.as_path(),
            "Not a directory (os error 20)",
        ),
        (
            "--checkpoint-dir",
            Path::new("/proc/ckpt"),
            "No such file or directory (os error 2)",
        ),
        (
            "--export-dir",
            Path::new("/proc/exp"),
            "No such file or directory (os error 2)",
        ),
    ] {
        let o = sparta(&train_args(&train, &[flag, s(path)]));
        let err = stderr(&o);
        assert!(!o.status.success(), "{err}");
        assert!(
            err.contains(&format!(
                "cannot create the directory {}: {says}",
                path.display()
            )),
            "{err}"
        );
        assert_eq!(err.matches("os error").count(), 1, "{err}");
    }
}

/// A second signal while the first one's graceful stop is under way aborts at once (130).
#[test]
fn a_second_signal_aborts_plain_training() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 20_000, 7);
    let ckpt = dir.path().join("ckpt");
    let a = train_args(
        &train,
        &[
            "--epochs",
            "1000",
            "--checkpoint-dir",
            s(&ckpt),
            "--checkpoint-every-steps",
            "20",
        ],
    );
    let p = Proc::start(cmd(&a));
    wait_for("a first checkpoint", Duration::from_secs(120), || {
        (!committed(&ckpt).is_empty()).then_some(())
    });
    // Back to back (one shell, microseconds apart): the second arrives long before the step,
    // the final checkpoint (with its fsyncs) and the summary could be done.
    let st = Command::new("sh")
        .args(["-c", "kill -TERM $0 && kill -INT $0", &p.pid().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let (st, log) = p.wait_status(Duration::from_secs(60));
    assert_eq!(st.code(), Some(130), "{log}");
    assert!(log.contains("aborted"), "{log}");
}
