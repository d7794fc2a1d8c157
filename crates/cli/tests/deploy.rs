//! What the Kubernetes manifests (deploy/k8s) rely on: `sparta --dry-run`, which
//! scripts/check-k8s.sh runs every container's command line with, and `sparta ps
//! --exit-when-done`, which ends the PS pods (an Indexed Job) with the job.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{cmd, committed, gen, json, ok, s, sparta, start_ps, stderr, Proc};

const LONG: Duration = Duration::from_secs(120);

/// A small job config checkpointing to `ckpt` (every 20 steps).
fn job_toml(dir: &Path, ckpt: &Path) -> std::path::PathBuf {
    let config = dir.join("job.toml");
    let text = format!(
        "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nhidden = [16]\n\
         [train]\nthreads = 1\ncheckpoint_dir = {:?}\ncheckpoint_every_steps = 20\n",
        s(ckpt)
    );
    std::fs::write(&config, text).unwrap();
    config
}

#[test]
fn dry_run_accepts_a_valid_command_reads_its_config_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = job_toml(dir.path(), &dir.path().join("ckpt"));
    let o = sparta(&[
        "--dry-run",
        "ps",
        "--shard=1",
        "--num-shards=2",
        "--workers=3",
        "--config",
        s(&config),
        "--memory-limit=6GiB",
        "--exit-when-done",
    ]);
    ok(&o, "--dry-run ps");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("dry run: sparta ps --shard=1 --num-shards=2 --workers=3 --config"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "config {}: valid (Wdl model, 2 table(s))",
            config.display()
        )),
        "{out}"
    );
    // The flag after the subcommand too; a command that would write a file writes none.
    let data = dir.path().join("data.tsv");
    let o = sparta(&["gen-data", "--rows", "10", "--out", s(&data), "--dry-run"]);
    ok(&o, "gen-data --dry-run");
    assert!(!data.exists(), "a dry run wrote {}", data.display());
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("no --config"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn dry_run_refuses_an_unknown_flag_and_an_invalid_config() {
    let o = sparta(&[
        "--dry-run",
        "ps",
        "--shard=0",
        "--num-shards=1",
        "--shards=2",
    ]);
    assert!(!o.status.success(), "an unknown flag was accepted");
    assert!(
        stderr(&o).contains("unexpected argument '--shards'"),
        "{}",
        stderr(&o)
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("job.toml");
    std::fs::write(&config, "[data]\nbatch_size = 0\n").unwrap();
    let o = sparta(&[
        "--dry-run",
        "worker",
        "--rank=0",
        "--num-workers=1",
        "--ps=ps-0:7070",
        "--train=day0.tsv",
        "--config",
        s(&config),
    ]);
    assert!(!o.status.success(), "an invalid config was accepted");
    assert!(stderr(&o).contains("batch_size = 0"), "{}", stderr(&o));
}

/// `sparta worker` `rank` of 2 on the shards at `ps` through `coordinator`, writing its
/// summary to `out`.
fn worker(
    rank: usize,
    ps: &str,
    coordinator: &str,
    config: &Path,
    data: [&Path; 2],
    out: &Path,
) -> Proc {
    let mut c = cmd(&["worker", "--rank", &rank.to_string(), "--num-workers", "2"]);
    c.args([
        "--ps",
        ps,
        "--coordinator",
        coordinator,
        "--config",
        s(config),
    ])
    .args(["--train", s(data[0]), "--test", s(data[1])])
    .args(["--summary-json", s(out), "--quiet"])
    .env("SPARTA_TOKEN", "tok");
    Proc::start(c)
}

/// The manifests' shape on loopback: 2 shards with 2 copies each and their coordinator, 2
/// workers; the shards run with --exit-when-done.
#[test]
fn exit_when_done_shards_exit_0_once_worker_0_has_written_the_end_of_job_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let config = job_toml(dir.path(), &ckpt);
    let train = gen(dir.path(), "train.tsv", 6000, 1);
    let test = gen(dir.path(), "test.tsv", 1000, 2);
    let addrs = common::free_ports(3);
    let (peers, coordinator) = (addrs[..2].join(","), addrs[2].clone());
    let shards: Vec<Proc> = (0..2)
        .map(|i| {
            let mut c = cmd(&["ps", "--shard", &i.to_string(), "--num-shards", "2"]);
            c.args(["--workers", "2", "--replicas", "2", "--peers", &peers])
                .args(["--config", s(&config), "--listen", &addrs[i]])
                .arg("--exit-when-done")
                .env("SPARTA_TOKEN", "tok")
                .env("RUST_LOG", "info");
            Proc::start(c)
        })
        .collect();
    let mut c = cmd(&["coordinator", "--ps", &peers, "--replicas", "2"]);
    c.args(["--listen", &coordinator])
        .env("SPARTA_TOKEN", "tok");
    let _coordinator = Proc::start(c);
    let (o0, o1) = (dir.path().join("w0.json"), dir.path().join("w1.json"));
    let w1 = worker(1, &peers, &coordinator, &config, [&train, &test], &o1);
    let w0 = worker(0, &peers, &coordinator, &config, [&train, &test], &o0);
    let (ok0, log0) = w0.wait(LONG);
    assert!(ok0, "{log0}");
    // Every shard answered worker 0's word (one that did not is a warning in its log).
    assert!(!log0.contains("that the job is over"), "{log0}");
    let (ok1, log1) = w1.wait(LONG);
    assert!(ok1, "{log1}");
    for (i, p) in shards.into_iter().enumerate() {
        let (st, log) = p.wait_status(LONG);
        assert!(st.success(), "PS {i} ended with {st}:\n{log}");
        assert!(
            log.contains("the job is over (--exit-when-done)"),
            "PS {i}:\n{log}"
        );
    }
    // The shards ended after the end-of-job checkpoint (the newest committed one) and the
    // evaluation, which needed them.
    let j = json(&o0);
    assert_eq!(j["workers_reported"], 2, "{j}");
    assert_eq!(j["train_rows"], 6000, "{j}");
    assert_eq!(j["test_rows"], 1000, "{j}");
    let last = committed(&ckpt)
        .last()
        .cloned()
        .expect("a committed checkpoint");
    assert_eq!(j["last_checkpoint"], last.as_str(), "{j}");
}

#[test]
fn a_signal_before_the_job_is_over_ends_an_exit_when_done_shard_with_failure() {
    let args = ["--shard", "0", "--num-shards", "1"];
    let (with, _) = start_ps(&[&args[..], &["--exit-when-done"]].concat(), Some("tok"));
    let (without, _) = start_ps(&args, Some("tok"));
    common::signal(with.pid(), "-TERM");
    common::signal(without.pid(), "-TERM");
    let (st, log) = with.wait_status(LONG);
    assert_eq!(st.code(), Some(1), "{log}");
    assert!(
        log.contains("stopped by a signal before the job was over (--exit-when-done)"),
        "{log}"
    );
    let (st, log) = without.wait_status(LONG);
    assert!(
        st.success(),
        "without --exit-when-done SIGTERM ends a shard with 0: {log}"
    );
}
