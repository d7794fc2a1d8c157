//! Recovery of a PS cluster with real processes on loopback: `sparta launch` with checkpoints,
//! `kill -9` of a PS and then of a worker mid-job, a truncated checkpoint file. Real Criteo
//! rows (first 80% train, rest test); skipped when the sample is absent.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_sparta");

fn criteo_sample() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/criteo/criteo_kaggle_sample.tsv");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} not found", p.display());
        None
    }
}

/// Writes the first 80% and last 20% of the sample's lines; returns them and the train rows.
fn split(dir: &Path, src: &Path) -> (PathBuf, PathBuf, u64) {
    let text = std::fs::read_to_string(src).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let cut = lines.len() * 8 / 10;
    let train = dir.join("train.tsv");
    let test = dir.join("test.tsv");
    std::fs::write(&train, lines[..cut].join("\n") + "\n").unwrap();
    std::fs::write(&test, lines[cut..].join("\n") + "\n").unwrap();
    (train, test, cut as u64)
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

const EPOCHS: u64 = 2;

/// A 2 PS + 2 worker sync job checkpointing every 4 steps into `ckpt`.
fn launch(train: &Path, test: &Path, ckpt: &Path, summary: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(EXE);
    c.args(["launch", "--ps", "2", "--workers", "2", "--mode", "sync"])
        .args(["--model", "wdl", "--batch-size", "256", "--epochs"])
        .arg(EPOCHS.to_string())
        .args(["--threads", "1", "--reader-threads", "2", "--seed", "7"])
        .arg("--train")
        .arg(train)
        .arg("--test")
        .arg(test)
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .args([
            "--checkpoint-every-steps",
            "4",
            "--quiet",
            "--max-restarts",
            "4",
        ])
        .args(["--ps-retry-secs", "20"])
        .arg("--summary-json")
        .arg(summary)
        .args(extra)
        .env("RUST_LOG", "warn")
        .env_remove("SPARTA_TOKEN");
    c
}

/// Committed checkpoints (those with a manifest) in `dir`, sorted.
fn committed(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().join("manifest.ckpt").exists())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A running `sparta launch` whose stdout lines are collected.
struct Running {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        for r in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(r).lines() {
                    let Ok(line) = line else { break };
                    let _ = tx.send(line);
                }
            });
        }
        Running {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    fn drain(&mut self) {
        self.seen.extend(self.lines.try_iter());
    }

    /// The pid of the newest start of process `name` (`ps1`, `w0`).
    fn pid(&mut self, name: &str) -> u32 {
        self.drain();
        let tag = format!("launch: started {name} (pid ");
        let line = self
            .seen
            .iter()
            .rev()
            .find_map(|l| l.split(&tag).nth(1))
            .unwrap_or_else(|| panic!("no start of {name} in\n{}", self.seen.join("\n")));
        line.trim_end_matches(')').parse().unwrap()
    }

    /// Waits until `dir` holds more than `n` committed checkpoints; returns them.
    fn wait_checkpoints(&mut self, dir: &Path, n: usize) -> Vec<String> {
        let t = Instant::now();
        loop {
            let c = committed(dir);
            if c.len() > n {
                return c;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                self.drain();
                panic!(
                    "launch ended ({st}) before checkpoint {}:\n{}",
                    n + 1,
                    self.seen.join("\n")
                );
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "no checkpoint in 120 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `name` runs with a pid other than `old`; returns the new pid.
    fn wait_restart(&mut self, name: &str, old: u32) -> u32 {
        let t = Instant::now();
        loop {
            self.drain();
            let tag = format!("launch: started {name} (pid ");
            if let Some(pid) = self.seen.iter().rev().find_map(|l| l.split(&tag).nth(1)) {
                let pid: u32 = pid.trim_end_matches(')').parse().unwrap();
                if pid != old {
                    return pid;
                }
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{name} was not restarted:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait(mut self) -> (bool, String) {
        let st = self.child.wait().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        self.drain();
        (st.success(), self.seen.join("\n"))
    }
}

fn kill9(pid: u32) {
    let st = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -9 {pid}");
}

#[test]
fn killed_ps_and_worker_are_recovered_without_losing_a_sample() {
    let Some(src) = criteo_sample() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (train, test, rows) = split(dir.path(), &src);
    // Uninterrupted reference run (same data, same config, checkpoints on).
    let (ref_ckpt, ref_json) = (dir.path().join("ref-ckpt"), dir.path().join("ref.json"));
    let (ok, log) = Running::start(launch(&train, &test, &ref_ckpt, &ref_json, &[])).wait();
    assert!(ok, "{log}");
    let r = json(&ref_json);
    assert_eq!(r["samples_trained"], rows * EPOCHS, "{r}");
    assert_eq!(r["restarts"], serde_json::json!({"ps": 0, "worker": 0}));
    // The end-of-job checkpoint holds the whole job: every worker finished, every sample.
    let o = Command::new(EXE)
        .args(["checkpoint", "inspect", "--json"])
        .arg(&ref_ckpt)
        .output()
        .unwrap();
    assert!(o.status.success());
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let last = report["checkpoints"].as_array().unwrap().last().unwrap();
    assert_eq!(last["valid"], true, "{last}");
    assert_eq!(report["restorable"], last["id"], "{report}");
    assert_eq!(last["cluster"]["workers_done"], 2, "{last}");
    assert_eq!(last["cluster"]["samples_trained"], rows * EPOCHS, "{last}");
    assert_eq!(r["last_checkpoint"], last["dir"], "{r}");

    // The same job, killed twice.
    let (ckpt, out) = (dir.path().join("ckpt"), dir.path().join("job.json"));
    let mut job = Running::start(launch(&train, &test, &ckpt, &out, &[]));
    job.wait_checkpoints(&ckpt, 1);
    let (ps1, w1_before) = (job.pid("ps1"), job.pid("w1"));
    kill9(ps1);
    // Restarted from a checkpoint: once the new cluster commits a checkpoint, kill a worker.
    job.wait_restart("ps1", ps1);
    let w1 = job.wait_restart("w1", w1_before);
    let restarted = committed(&ckpt).len();
    job.wait_checkpoints(&ckpt, restarted);
    kill9(w1);
    let (ok, log) = job.wait();
    assert!(ok, "{log}");
    assert!(
        log.contains("ps1 exited with signal: 9") && log.contains("w1 exited with signal: 9"),
        "{log}"
    );
    assert!(log.contains("launch: using checkpoint ckpt-"), "{log}");
    let j = json(&out);
    eprintln!(
        "uninterrupted: AUC {}, {} samples; killed twice: AUC {}, {} samples, resumed from {}",
        r["test_auc"], r["samples_trained"], j["test_auc"], j["samples_trained"], j["resumed_from"]
    );
    assert_eq!(
        j["restarts"],
        serde_json::json!({"ps": 1, "worker": 1}),
        "{j}"
    );
    assert_eq!(j["rollbacks"], 2);
    // Every training row of every epoch trained exactly once in the final model's lineage.
    assert_eq!(j["samples_trained"], rows * EPOCHS, "{j}");
    assert!(
        j["resumed_from"].as_str().unwrap().starts_with("ckpt-"),
        "{j}"
    );
    let (ra, ja) = (
        r["test_auc"].as_f64().unwrap(),
        j["test_auc"].as_f64().unwrap(),
    );
    assert!(ra > 0.7, "reference AUC {ra}");
    assert!(
        (ra - ja).abs() < 0.003,
        "AUC {ja} after two kills vs {ra} uninterrupted"
    );
}

#[test]
fn a_truncated_checkpoint_is_skipped_for_the_previous_one() {
    let Some(src) = criteo_sample() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (train, test, rows) = split(dir.path(), &src);
    let (ckpt, first) = (dir.path().join("ckpt"), dir.path().join("first.json"));
    let (ok, log) = Running::start(launch(&train, &test, &ckpt, &first, &[])).wait();
    assert!(ok, "{log}");
    let ids = committed(&ckpt);
    assert!(ids.len() >= 2, "{ids:?}");
    let (prev, newest) = (&ids[ids.len() - 2], &ids[ids.len() - 1]);
    // Cut the newest checkpoint's embedding part of shard 1 in half.
    let part = ckpt.join(newest).join("table-embedding.ps-1.rows");
    let len = std::fs::metadata(&part).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&part)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let resumed = dir.path().join("resumed.json");
    let (ok, log) = Running::start(launch(
        &train,
        &test,
        &ckpt,
        &resumed,
        &["--resume", ckpt.to_str().unwrap()],
    ))
    .wait();
    assert!(ok, "{log}");
    assert!(
        log.contains("skipping checkpoint")
            && log.contains(newest.as_str())
            && log.contains("truncated"),
        "{log}"
    );
    assert!(
        log.contains(&format!("launch: using checkpoint {prev}")),
        "{log}"
    );
    let j = json(&resumed);
    assert_eq!(j["resumed_from"], prev.as_str(), "{j}");
    assert_eq!(j["samples_trained"], rows * EPOCHS, "{j}");
    // A PS of a 3-shard cluster refuses a 2-shard checkpoint's part.
    let o = Command::new(EXE)
        .args(["ps", "--shard", "0", "--num-shards", "3", "--workers", "2"])
        .args(["--listen", "127.0.0.1:0", "--resume"])
        .arg(&ckpt)
        .env("SPARTA_TOKEN", "t")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("written by 2 PS shard(s), this cluster has 3"),
        "{err}"
    );
}

/// Starts `sparta ps` (1 shard, 1 worker) on `listen`; returns it and its address.
fn start_ps(listen: &str, config: &Path) -> (Child, String) {
    let mut child = Command::new(EXE)
        .args(["ps", "--shard", "0", "--num-shards", "1", "--workers", "1"])
        .args(["--listen", listen])
        .arg("--config")
        .arg(config)
        .env("SPARTA_TOKEN", "tok")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    for line in out.lines() {
        if let Some(a) = line.unwrap().split("listening on ").nth(1) {
            return (child, a.trim().to_string());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("ps exited without listening");
}

#[test]
fn a_worker_does_not_continue_on_a_ps_that_restarted_under_it() {
    let Some(src) = criteo_sample() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("job.toml");
    std::fs::write(
        &config,
        "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nhidden = [16]\n[train]\nthreads = 1\n",
    )
    .unwrap();
    let (mut ps, addr) = start_ps("127.0.0.1:0", &config);
    let mut worker = Command::new(EXE)
        .args(["worker", "--rank", "0", "--num-workers", "1", "--ps", &addr])
        .arg("--config")
        .arg(&config)
        .arg("--train")
        .arg(&src)
        .args(["--epochs", "1000", "--ps-retry-secs", "30"])
        .env("SPARTA_TOKEN", "tok")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let err = BufReader::new(worker.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in err.lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    assert!(
        rx.iter().any(|l| l.contains("worker 0 of 1")),
        "the worker never started"
    );
    std::thread::sleep(Duration::from_millis(300));
    ps.kill().unwrap();
    let _ = ps.wait();
    // A new, empty PS on the same address: the worker must not push into it.
    let (mut ps2, _) = start_ps(&addr, &config);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = worker.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = worker.kill();
            let _ = ps2.kill();
            panic!("the worker kept going on a restarted PS");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = ps2.kill();
    let _ = ps2.wait();
    let log: Vec<String> = rx.try_iter().collect();
    let log = log.join("\n");
    assert!(!status.success());
    assert!(
        log.contains(&format!(
            "PS shard 0 at {addr} restarted while this worker was waiting"
        )),
        "{log}"
    );
}
