//! What `sparta launch` does about its own processes (issue 35): it restarts a killed
//! coordinator of replicated shards from its saved map (a PS killed afterwards still fails
//! over), passes the workers' "do not restart" status on, says which shard a frozen PS is,
//! and removes the job folders of launchers killed before they could.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cmd, gen, json, kill9, s, signal, Proc};

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(90);

/// A launch following `dir/in` (files shipped by the test) until `dir/STOP` exists; its
/// temporary folder is `dir/tmp` (TMPDIR), its summary `dir/job.json`.
struct Job {
    dir: PathBuf,
    input: PathBuf,
    tmp: PathBuf,
}

impl Job {
    fn new(dir: &Path) -> Job {
        let (input, tmp) = (dir.join("in"), dir.join("tmp"));
        std::fs::create_dir(&input).unwrap();
        std::fs::create_dir(&tmp).unwrap();
        Job {
            dir: dir.to_path_buf(),
            input,
            tmp,
        }
    }

    /// `sparta launch` with `flags`, following the input directory.
    fn launch(&self, flags: &[&str]) -> Proc {
        self.launch_with(flags, "warn")
    }

    /// [`Job::launch`] with `RUST_LOG` set to `log` (every process inherits it).
    fn launch_with(&self, flags: &[&str], log: &str) -> Proc {
        let mut c = cmd(&["launch"]);
        c.env("RUST_LOG", log);
        c.args(flags)
            .args([
                "--batch-size",
                "128",
                "--threads",
                "1",
                "--reader-threads",
                "1",
            ])
            .args(["--follow", s(&self.input), "--stop-file", s(&self.stop())])
            .args(["--follow-poll-secs", "0.05", "--follow-settle-secs", "0"])
            .args(["--quiet", "--summary-json", s(&self.summary())])
            .env("TMPDIR", &self.tmp);
        Proc::start(c)
    }

    /// Writes `rows` rows as `in/name` the way a shipper does (renamed when complete).
    fn ship(&self, name: &str, rows: u64, seed: u64) {
        let part = gen(&self.dir, &format!(".{name}.part"), rows, seed);
        std::fs::rename(part, self.input.join(name)).unwrap();
    }

    fn stop(&self) -> PathBuf {
        self.dir.join("STOP")
    }

    fn summary(&self) -> PathBuf {
        self.dir.join("job.json")
    }

    /// The launchers' job folders in the temporary directory.
    fn job_folders(&self) -> Vec<PathBuf> {
        job_folders(&self.tmp)
    }
}

fn job_folders(tmp: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("sparta-launch-")
        })
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// The coordinator's saved map, once the launcher's job folder holds one.
fn coordinator_state(job: &Job) -> Option<serde_json::Value> {
    let f = job.job_folders().first()?.join("coordinator.json");
    serde_json::from_str(&std::fs::read_to_string(f).ok()?).ok()
}

/// `kill -9` of the coordinator of `launch --replicas 2`: the launcher says so and restarts
/// it at its address from its saved map; a PS killed afterwards really fails over (the
/// restarted coordinator promotes its backup, the PS rejoins), no rollback, and every row is
/// trained once. Before, nothing noticed the dead coordinator: the PS restarted empty, the
/// workers stalled on it and the job failed.
#[test]
fn a_killed_coordinator_is_restarted_and_a_ps_killed_later_still_fails_over() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new(dir.path());
    job.ship("part-0.tsv", 2_000, 1);
    let mut p = job.launch(&[
        "--ps",
        "2",
        "--workers",
        "1",
        "--replicas",
        "2",
        "--max-restarts",
        "2",
    ]);
    let coord = p.wait_started("coord", None, LIMIT);
    // Every PS heard (their incarnations saved), so a restarted one is recognised as such.
    p.wait_until("the coordinator's map", LIMIT, || {
        let v = coordinator_state(&job)?;
        let procs = v["processes"].as_array()?;
        procs
            .iter()
            .all(|x| x["incarnation"].as_u64() > Some(0))
            .then_some(())
    });
    kill9(coord);
    p.wait_started("coord", Some(coord), LIMIT);
    p.wait_line(LIMIT, |l| {
        (l.starts_with("[coord]") && l.contains("restarted with the shard map")).then_some(())
    });
    let ps1 = p.started_pid("ps1").unwrap();
    kill9(ps1);
    p.wait_started("ps1", Some(ps1), LIMIT);
    // The restarted coordinator fails shard 1 over and the restarted process rejoins.
    p.wait_until("the failover and the rejoin", LIMIT, || {
        let v = coordinator_state(&job)?;
        (v["failovers"] == 1 && v["rejoins"].as_u64() >= Some(1)).then_some(())
    });
    job.ship("part-1.tsv", 2_000, 2);
    std::fs::write(job.stop(), "").unwrap();
    let (ok, log) = p.wait(LIMIT);
    assert!(ok, "{log}");
    assert!(
        log.contains("launch: coord exited with signal: 9")
            && log.contains("restarting the coordinator at its address"),
        "{log}"
    );
    assert!(
        log.contains("launch: ps1 exited with signal: 9") && log.contains("restarting it alone"),
        "{log}"
    );
    let j = json(&job.summary());
    assert_eq!(j["samples_trained"], 4_000, "{j}");
    assert_eq!(j["rollbacks"], 0, "{j}");
    assert_eq!(j["failovers"], 1, "{j}");
    assert_eq!(
        j["restarts"],
        serde_json::json!({"ps": 1, "worker": 0, "coordinator": 1}),
        "{j}"
    );
}

/// A worker that stops with status 3 (the documented "job-level failure, do not restart":
/// here checkpoints that cannot be written) makes `sparta launch` exit 3 too, not 1.
#[test]
fn launch_exits_with_the_workers_do_not_restart_status() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 1_500, 3);
    let ckpt = dir.path().join("ckpt");
    // Checkpoint 2 cannot be written: a directory sits where its PS file goes.
    let blocked = ckpt.join(format!("ckpt-{:016}", 2));
    std::fs::create_dir_all(blocked.join("table-embedding.ps-0.rows").join("blocker")).unwrap();
    let config = dir.path().join("job.toml");
    std::fs::write(
        &config,
        format!(
            "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nhidden = [8]\n[train]\n\
             threads = 1\ncheckpoint_dir = {:?}\ncheckpoint_every_steps = 4\n\
             checkpoint_max_failures = 1\n",
            s(&ckpt)
        ),
    )
    .unwrap();
    let mut c = cmd(&["launch", "--ps", "1", "--workers", "1"]);
    c.args(["--config", s(&config), "--train", s(&train), "--quiet"])
        .args(["--max-restarts", "3"]);
    let (st, log) = Proc::start(c).wait_status(LIMIT);
    assert!(
        log.contains("stopped the job for a reason a rollback would not fix"),
        "{log}"
    );
    assert_eq!(st.code(), Some(3), "{log}");
}

/// `SIGSTOP` of a PS of `launch --ps 2 --workers 1` (no replicas) mid-job: the worker's
/// calls to it wait, and the log says so naming the shard and its address while it lasts
/// (`[train] barrier_warn_secs`); after `SIGCONT` the job finishes with every row trained.
#[test]
fn a_frozen_ps_is_named_in_the_log_and_the_job_finishes_after_it_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new(dir.path());
    let config = dir.path().join("job.toml");
    std::fs::write(&config, "[train]\nbarrier_warn_secs = 0.5\n").unwrap();
    job.ship("part-0.tsv", 1_000, 1);
    let mut p = job.launch_with(
        &["--ps", "2", "--workers", "1", "--config", s(&config)],
        // The worker says when it is connected and follows the directory.
        "warn,sparta_worker::trainer::follow=info",
    );
    let ps1_addr = p.wait_line(LIMIT, |l| {
        l.strip_prefix("[ps1] sparta ps shard 1 listening on ")
            .map(|a| a.trim().to_string())
    });
    p.wait_line(LIMIT, |l| {
        (l.starts_with("[w0]") && l.contains("following")).then_some(())
    });
    let ps1 = p.started_pid("ps1").unwrap();
    signal(ps1, "-STOP");
    // The next file's pulls and pushes (if not the first's) reach the stopped shard and wait.
    job.ship("part-1.tsv", 1_000, 2);
    let warning = format!("PS shard 1 at {ps1_addr}: no answer to ");
    p.wait_line(LIMIT, |l| {
        (l.starts_with("[w0]") && l.contains(&warning)).then_some(())
    });
    signal(ps1, "-CONT");
    p.wait_line(LIMIT, |l| {
        (l.contains(&format!("PS shard 1 at {ps1_addr}: ")) && l.contains("ended after"))
            .then_some(())
    });
    std::fs::write(job.stop(), "").unwrap();
    let (ok, log) = p.wait(LIMIT);
    assert!(ok, "{log}");
    assert!(
        !log.contains("PS shard 0 at"),
        "only the stopped shard is named: {log}"
    );
    let j = json(&job.summary());
    assert_eq!(j["samples_trained"], 2_000, "{j}");
    assert_eq!(
        j["restarts"],
        serde_json::json!({"ps": 0, "worker": 0}),
        "{j}"
    );
}

/// A launcher killed with `kill -9` leaves its job folder (nothing ran to remove it); the
/// next launch removes it, and keeps the folders of launchers still running.
#[test]
fn the_job_folder_of_a_killed_launcher_is_removed_by_the_next_launch() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new(dir.path());
    let mut first = job.launch(&["--ps", "1", "--workers", "1"]);
    first.wait_started("w0", None, LIMIT);
    kill9(first.pid());
    let _ = first.child.wait();
    let left = job.job_folders();
    assert_eq!(left.len(), 1, "{left:?}");
    // A folder of a launcher that still runs (this test's process stands for it).
    let running = job.tmp.join("sparta-launch-running");
    std::fs::create_dir(&running).unwrap();
    std::fs::write(running.join("launcher.pid"), std::process::id().to_string()).unwrap();
    job.ship("part-0.tsv", 500, 1);
    std::fs::write(job.stop(), "").unwrap();
    let (ok, log) = job.launch(&["--ps", "1", "--workers", "1"]).wait(LIMIT);
    assert!(ok, "{log}");
    assert_eq!(job.job_folders(), vec![running], "{log}");
}
