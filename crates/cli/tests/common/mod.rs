//! Helpers shared by the process tests: run the real `sparta` binary, make data with
//! `sparta gen-data`, start and watch long-running processes, wait on conditions with a
//! deadline (never a fixed sleep before an assertion).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

pub mod ckpt;
pub mod copies;
pub mod http;
pub mod kafka;
pub mod partition;
pub mod s3;

pub const EXE: &str = env!("CARGO_BIN_EXE_sparta");

/// A `sparta` command with quiet logs and no inherited token (cluster or serving).
/// The training flags of the cluster and model tests (less `--model`): batches of 256, 2
/// epochs, one compute and one reader thread, seed 7.
pub const TRAIN_FLAGS: [&str; 10] = [
    "--batch-size",
    "256",
    "--epochs",
    "2",
    "--threads",
    "1",
    "--reader-threads",
    "1",
    "--seed",
    "7",
];

/// `n` loopback addresses free now for processes that bind them later: below the kernel's
/// ephemeral range (where any outgoing connection on the host may take a port released by a
/// bind-to-0 probe), each call of this test process scanning its own window of the range.
pub fn free_ports(n: usize) -> Vec<String> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let window = NEXT.fetch_add(64, Ordering::Relaxed);
    let seed = u64::from(std::process::id()).wrapping_mul(1_009) + window;
    sparta_launch::ports::free_loopback(n, seed).expect("free loopback ports")
}

/// A throwaway self-signed certificate for `localhost` and its key, written to `dir` as
/// `ps.crt` and `ps.key` (PEM): the certificate is its own CA.
pub fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (crt, key) = (dir.join("ps.crt"), dir.join("ps.key"));
    std::fs::write(&crt, c.cert.pem()).unwrap();
    std::fs::write(&key, c.key_pair.serialize_pem()).unwrap();
    (crt, key)
}

/// One free loopback port (see [`free_ports`]).
pub fn free_port() -> u16 {
    let addr = free_ports(1).remove(0);
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

pub fn cmd(args: &[&str]) -> Command {
    let mut c = Command::new(EXE);
    c.args(args)
        .env("RUST_LOG", "warn")
        .env_remove("SPARTA_TOKEN")
        .env_remove("SPARTA_SERVE_TOKEN");
    c
}

/// Runs `sparta args` to the end.
pub fn sparta(args: &[&str]) -> Output {
    cmd(args).output().expect("run sparta")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts that `o` succeeded, with its stderr in the message.
pub fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what} failed: {}", stderr(o));
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `rows` synthetic click-log rows (`sparta gen-data`, small vocabulary) in `dir/name`.
pub fn gen(dir: &Path, name: &str, rows: u64, seed: u64) -> PathBuf {
    let p = dir.join(name);
    let o = sparta(&[
        "gen-data",
        "--rows",
        &rows.to_string(),
        "--seed",
        &seed.to_string(),
        "--vocab-scale",
        "0.01",
        "--out",
        s(&p),
    ]);
    ok(&o, "gen-data");
    p
}

/// Reads a JSON file.
pub fn json(p: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `limit`; panics naming `what`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running process whose stdout and stderr lines are collected; killed when dropped.
pub struct Proc {
    pub child: Child,
    lines: Receiver<String>,
    /// Every line read so far (stdout and stderr interleaved as they arrived).
    pub seen: Vec<String>,
}

impl Proc {
    pub fn start(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sparta");
        let (tx, rx) = mpsc::channel();
        for r in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(r).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Proc {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Takes the lines that arrived since the last call into `seen`.
    pub fn drain(&mut self) {
        self.seen.extend(self.lines.try_iter());
    }

    pub fn log(&mut self) -> String {
        self.drain();
        self.seen.join("\n")
    }

    /// Waits until a line satisfies `f` (returning its value); panics if the process ends
    /// first or after `limit`.
    pub fn wait_line<T>(&mut self, limit: Duration, mut f: impl FnMut(&str) -> Option<T>) -> T {
        let t = Instant::now();
        let mut checked = 0;
        loop {
            self.drain();
            for l in &self.seen[checked..] {
                if let Some(v) = f(l) {
                    return v;
                }
            }
            checked = self.seen.len();
            if let Some(st) = self.child.try_wait().unwrap() {
                // Lines written just before the exit may still be in the pipe.
                if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(500)) {
                    self.seen.push(l);
                    continue;
                }
                panic!(
                    "process ended ({st}) before the line awaited:\n{}",
                    self.log()
                );
            }
            assert!(
                t.elapsed() < limit,
                "line not seen in {limit:?}:\n{}",
                self.log()
            );
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(20)) {
                self.seen.push(l);
            }
        }
    }

    /// Polls `f` every 20 ms until it returns `Some`; panics with the log if the process ends
    /// first or after `limit` (naming `what`).
    pub fn wait_until<T>(
        &mut self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut() -> Option<T>,
    ) -> T {
        let t = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("process ended ({st}) before {what}:\n{}", self.log());
            }
            assert!(
                t.elapsed() < limit,
                "timed out after {limit:?} waiting for {what}:\n{}",
                self.log()
            );
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(20)) {
                self.seen.push(l);
            }
        }
    }

    /// The pid `sparta launch` printed for its newest start of `name` (`ps1`, `w0`):
    /// "launch: started NAME (pid N)".
    pub fn started_pid(&mut self, name: &str) -> Option<u32> {
        self.drain();
        let tag = format!("launch: started {name} (pid ");
        self.seen
            .iter()
            .rev()
            .find_map(|l| l.split(&tag).nth(1))
            .map(|p| p.trim_end_matches(')').parse().unwrap())
    }

    /// Waits until `sparta launch` has started `name` with a pid other than `old`.
    pub fn wait_started(&mut self, name: &str, old: Option<u32>, limit: Duration) -> u32 {
        let t = Instant::now();
        loop {
            if let Some(pid) = self.started_pid(name).filter(|p| Some(*p) != old) {
                return pid;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!(
                    "process ended ({st}) before starting {name}:\n{}",
                    self.log()
                );
            }
            assert!(
                t.elapsed() < limit,
                "{name} not (re)started in {limit:?}:\n{}",
                self.log()
            );
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(20)) {
                self.seen.push(l);
            }
        }
    }

    /// Waits for the exit (at most `limit`, then kills it and panics); returns success and
    /// the whole log.
    pub fn wait(self, limit: Duration) -> (bool, String) {
        let (st, log) = self.wait_status(limit);
        (st.success(), log)
    }

    /// [`Proc::wait`] with the exit status.
    pub fn wait_status(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let t = Instant::now();
        let st = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if t.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("still running after {limit:?}:\n{}", self.log());
            }
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(50)) {
                self.seen.push(l);
            }
        };
        // The reader threads end at EOF once every holder of the pipes is gone.
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(l) => self.seen.push(l),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        (st, self.seen.join("\n"))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `sparta ps` with `args` (and `--listen 127.0.0.1:0` unless given); returns it
/// once it listens, with its address.
pub fn start_ps(args: &[&str], token: Option<&str>) -> (Proc, String) {
    let mut c = cmd(&["ps"]);
    c.args(args);
    if !args.contains(&"--listen") {
        c.args(["--listen", "127.0.0.1:0"]);
    }
    if let Some(t) = token {
        c.env("SPARTA_TOKEN", t);
    }
    let mut p = Proc::start(c);
    let addr = p.wait_line(Duration::from_secs(60), |l| {
        l.split("listening on ")
            .nth(1)
            .map(|a| a.trim().to_string())
    });
    (p, addr)
}

/// Sends `signal` (`-9`, `-STOP`, `-CONT`, `-TERM`) to `pid`.
pub fn signal(pid: u32, signal: &str) {
    let st = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill {signal} {pid}");
}

pub fn kill9(pid: u32) {
    signal(pid, "-9");
}

/// Whether process `pid` still exists (a zombie counts as gone).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// Committed checkpoints (those with a manifest) in `dir`, sorted.
pub fn committed(dir: &Path) -> Vec<String> {
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

/// `sparta gen-data` train and test files (`train.tsv`, `test.tsv`) in `dir`.
pub fn gen_split(dir: &Path, train_rows: u64, test_rows: u64) -> (PathBuf, PathBuf) {
    (
        gen(dir, "train.tsv", train_rows, 1),
        gen(dir, "test.tsv", test_rows, 2),
    )
}

/// The real Criteo sample, when this checkout sits next to `shared/data` (for extra,
/// `#[ignore]`d cases; says "skipped" and returns `None` when absent).
pub fn criteo_sample() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/criteo/criteo_kaggle_sample.tsv");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipped: {} not found", p.display());
        None
    }
}

/// Writes the first 80% and last 20% of `src`'s lines to `dir/train.tsv` and `dir/test.tsv`.
pub fn split_file(dir: &Path, src: &Path) -> (PathBuf, PathBuf) {
    let text = std::fs::read_to_string(src).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let cut = lines.len() * 8 / 10;
    let train = dir.join("train.tsv");
    let test = dir.join("test.tsv");
    std::fs::write(&train, lines[..cut].join("\n") + "\n").unwrap();
    std::fs::write(&test, lines[cut..].join("\n") + "\n").unwrap();
    (train, test)
}

/// Lines of a text file.
pub fn count_lines(p: &Path) -> u64 {
    std::fs::read_to_string(p).unwrap().lines().count() as u64
}

/// The manifests (as JSON) of the complete, verified export versions in `dir`, by version; none
/// while `dir` does not exist.
pub fn export_manifests(dir: &Path) -> Vec<serde_json::Value> {
    let Ok(versions) = sparta_serve::list_versions(dir) else {
        return Vec::new();
    };
    let Ok(storage) = sparta_checkpoint::LocalDir::new(dir) else {
        return Vec::new();
    };
    versions
        .into_iter()
        .filter_map(|v| sparta_serve::format::read_manifest(&storage, v).ok())
        .map(|m| serde_json::to_value(m).unwrap())
        .collect()
}

/// `sparta predict --model MODEL --input INPUT --out OUT`, which must succeed; returns its
/// output (for the warnings on stderr) and the probabilities it wrote.
pub fn predict_file(model: &Path, input: &Path, out: &Path) -> (Output, Vec<f32>) {
    let o = sparta(&[
        "predict",
        "--model",
        s(model),
        "--input",
        s(input),
        "--out",
        s(out),
    ]);
    ok(&o, "predict");
    let probs = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    (o, probs)
}

/// The scores of `rows` by a full export (`sparta export --checkpoint`) of the newest
/// checkpoint in `ckpt`, written beside `out`.
pub fn export_scores(ckpt: &Path, rows: &Path, out: &Path) -> Vec<f32> {
    let export = out.with_extension("export");
    ok(
        &sparta(&["export", "--checkpoint", s(ckpt), "--out", s(&export)]),
        "export",
    );
    predict_file(&export, rows, out).1
}

/// The rows of `train` in the order a 2-worker sync cluster with batches of `batch` trains
/// them: worker 0 reads the lines starting in the first half of the bytes, worker 1 the rest,
/// and each sync step averages one batch of each. Written to `out`.
pub fn cluster_order(train: &Path, batch: usize, out: &Path) {
    let text = std::fs::read(train).unwrap();
    let mid = text.len() / 2;
    let mut parts: [Vec<&[u8]>; 2] = [Vec::new(), Vec::new()];
    let mut start = 0;
    for line in text.split_inclusive(|&b| b == b'\n') {
        parts[usize::from(start >= mid)].push(line);
        start += line.len();
    }
    let mut w = Vec::with_capacity(text.len());
    let (a, b) = (parts[0].chunks(batch), parts[1].chunks(batch));
    let (mut a, mut b) = (a.peekable(), b.peekable());
    while a.peek().is_some() || b.peek().is_some() {
        for chunk in [a.next(), b.next()].into_iter().flatten() {
            chunk.iter().for_each(|l| w.extend_from_slice(l));
        }
    }
    std::fs::write(out, w).unwrap();
}

/// A `sparta serve` of `model` polling its directory every `poll_ms` (killed on drop) and its
/// address, once it listens (within `limit`).
pub fn serve(model: &Path, poll_ms: u64, limit: Duration) -> (Proc, std::net::SocketAddr) {
    let mut c = cmd(&["serve", "--model", s(model), "--listen", "127.0.0.1:0"]);
    c.args(["--poll-ms", &poll_ms.to_string(), "--threads", "2"]);
    let mut p = Proc::start(c);
    let addr = p.wait_line(limit, |l| {
        l.trim()
            .strip_prefix("listening on http://")
            .map(|a| a.parse().unwrap())
    });
    (p, addr)
}

/// The example job for the rich profile (shipped in the repository).
pub fn rich_toml() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rich.toml")
}

/// `rows` rows of `sparta gen-data --profile rich` in `dir/name`.
pub fn gen_rich(dir: &Path, name: &str, rows: u64, seed: u64) -> PathBuf {
    let p = dir.join(name);
    let (rows, seed) = (rows.to_string(), seed.to_string());
    let o = sparta(&[
        "gen-data",
        "--profile",
        "rich",
        "--rows",
        &rows,
        "--seed",
        &seed,
        "--out",
        s(&p),
    ]);
    ok(&o, "gen-data --profile rich");
    p
}

/// A `sparta train --follow input` of wdl (info log) polling every 50 ms with no settle time,
/// batches of 200 on one thread and one reader thread; `extra` flags added.
pub fn train_follow(input: &Path, extra: &[&str]) -> Proc {
    let mut c = cmd(&["train", "--model", "wdl", "--follow", s(input), "--quiet"]);
    c.args(["--follow-poll-secs", "0.05", "--follow-settle-secs", "0"])
        .args(["--batch-size", "200", "--threads", "1"])
        .args(["--reader-threads", "1"])
        .args(extra)
        .env("RUST_LOG", "info");
    Proc::start(c)
}

/// The scores the trainer itself gives `rows` (one per line, in order) from the embedded
/// checkpoint in `ckpt` (its job config restored with it): what exports and `sparta predict`
/// are compared against. No line of `rows` may be malformed.
pub fn trainer_scores(ckpt: &Path, rows: &Path) -> Vec<f32> {
    let restored = sparta_worker::checkpointing::restore(ckpt)
        .unwrap()
        .unwrap();
    let job = sparta_worker::JobConfig::from_toml(&restored.job_config)
        .unwrap()
        .validate()
        .unwrap();
    let reader = sparta_data::ReaderConfig {
        threads: 1,
        epochs: 1,
        max_rows: None,
        ..job.reader.clone()
    };
    let mut trainer = sparta_worker::Trainer::embedded_resume(
        job,
        ckpt,
        sparta_checkpoint::ResumePolicy::Required,
    )
    .unwrap();
    let (_, scores, bad) = trainer
        .predict_files(&[rows.to_path_buf()], &reader)
        .unwrap();
    assert_eq!(bad, 0, "malformed lines in {}", rows.display());
    scores
}
