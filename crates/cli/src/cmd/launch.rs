//! `sparta launch`: a whole PS cluster on this machine (loopback): N PS + M worker child
//! processes of this executable, supervised, their output merged, one job summary.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use super::train::{job_config, TrainArgs};

/// Flags of `sparta launch` (plus every flag of `sparta train`).
#[derive(Args, Debug, Clone)]
pub struct LaunchArgs {
    /// PS shards to start.
    #[arg(long = "ps", default_value_t = 1)]
    pub num_ps: usize,
    /// Workers to start (each trains on a disjoint 1/M of the input).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Dense consistency: async or sync.
    #[arg(long, default_value = "async")]
    pub mode: String,
    /// Bounded staleness K instead of --mode.
    #[arg(long, conflicts_with = "mode")]
    pub staleness: Option<u64>,
    /// Embedding values on the wire: none, fp16 or bf16.
    #[arg(long, default_value = "none")]
    pub wire_compression: String,
    /// Threads serving requests per PS.
    #[arg(long, default_value_t = 2)]
    pub ps_threads: usize,
    /// Training flags, as for `sparta train`.
    #[command(flatten)]
    pub train: TrainArgs,
}

/// A child process and how to name it.
struct Proc {
    name: String,
    child: Child,
}

/// Copies `r` line by line to stdout or stderr with a `[name]` prefix.
fn stream(name: String, r: impl Read + Send + 'static, to_stderr: bool) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if to_stderr {
                eprintln!("[{name}] {line}");
            } else {
                println!("[{name}] {line}");
            }
        }
    });
}

fn random_token() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom for the cluster token")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn stop_all(procs: &mut [Proc]) {
    for p in procs.iter_mut() {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
}

/// Starts PS shard `i` and returns it with its address (read from its first stdout line).
fn start_ps(
    exe: &Path,
    i: usize,
    a: &LaunchArgs,
    config: &Path,
    token: &str,
) -> Result<(Proc, String)> {
    let mut cmd = Command::new(exe);
    cmd.arg("ps")
        .args([
            "--shard",
            &i.to_string(),
            "--num-shards",
            &a.num_ps.to_string(),
        ])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--workers",
            &a.workers.to_string(),
        ])
        .args(["--threads", &a.ps_threads.to_string()])
        .arg("--config")
        .arg(config)
        .env("SPARTA_TOKEN", token)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match a.staleness {
        Some(k) => cmd.args(["--staleness", &k.to_string()]),
        None => cmd.args(["--mode", &a.mode]),
    };
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting PS shard {i}"))?;
    let name = format!("ps{i}");
    stream(name.clone(), child.stderr.take().expect("piped"), true);
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    let n2 = name.clone();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if let Some(addr) = line.split("listening on ").nth(1) {
                let _ = tx.send(addr.trim().to_string());
            }
            println!("[{n2}] {line}");
        }
    });
    let mut proc = Proc { name, child };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(addr) = rx.recv_timeout(Duration::from_millis(50)) {
            return Ok((proc, addr));
        }
        if let Some(st) = proc.child.try_wait()? {
            bail!("PS shard {i} exited before listening ({st}); see its log above");
        }
        if Instant::now() > deadline {
            stop_all(std::slice::from_mut(&mut proc));
            bail!("PS shard {i} did not start listening within 60 s");
        }
    }
}

/// `sparta launch`.
pub fn run(a: LaunchArgs) -> Result<()> {
    if a.num_ps == 0 || a.workers == 0 {
        bail!("--ps and --workers must be at least 1");
    }
    let cfg = job_config(&a.train)?;
    cfg.validate()?;
    super::train::ensure_no_online(&a.train, &cfg, "sparta launch")?;
    let dir = tempfile::tempdir().context("creating a temporary folder")?;
    let config = dir.path().join("job.toml");
    std::fs::write(
        &config,
        toml::to_string(&cfg).context("writing the job config")?,
    )
    .context("writing the job config")?;
    let token = match std::env::var("SPARTA_TOKEN") {
        Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
        _ => random_token()?,
    };
    let exe = std::env::current_exe().context("locating this executable")?;
    let mut procs: Vec<Proc> = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..a.num_ps {
        match start_ps(&exe, i, &a, &config, &token) {
            Ok((p, addr)) => {
                procs.push(p);
                addrs.push(addr);
            }
            Err(e) => {
                stop_all(&mut procs);
                return Err(e);
            }
        }
    }
    let start = Instant::now();
    let mut summaries = Vec::new();
    for j in 0..a.workers {
        let summary = dir.path().join(format!("worker{j}.json"));
        let mut cmd = Command::new(&exe);
        cmd.arg("worker")
            .args([
                "--rank",
                &j.to_string(),
                "--num-workers",
                &a.workers.to_string(),
            ])
            .args(["--ps", &addrs.join(",")])
            .args(["--wire-compression", &a.wire_compression])
            .arg("--config")
            .arg(&config)
            .arg("--train")
            .args(&a.train.train)
            .arg("--summary-json")
            .arg(&summary)
            .env("SPARTA_TOKEN", &token)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !a.train.test.is_empty() {
            cmd.arg("--test").args(&a.train.test);
        }
        if a.train.quiet {
            cmd.arg("--quiet");
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut procs);
                return Err(e).context(format!("starting worker {j}"));
            }
        };
        let name = format!("w{j}");
        stream(name.clone(), child.stdout.take().expect("piped"), false);
        stream(name.clone(), child.stderr.take().expect("piped"), true);
        procs.push(Proc { name, child });
        summaries.push(summary);
    }
    let n_ps = a.num_ps;
    let mut finished = vec![false; procs.len()];
    loop {
        for (k, p) in procs.iter_mut().enumerate() {
            if finished[k] {
                continue;
            }
            if let Some(st) = p.child.try_wait()? {
                finished[k] = true;
                if k < n_ps || !st.success() {
                    let who = p.name.clone();
                    stop_all(&mut procs);
                    bail!("{who} exited with {st} while the job was running; stopped the other processes (see the [{who}] lines above)");
                }
            }
        }
        if finished[n_ps..].iter().all(|f| *f) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop_all(&mut procs[..n_ps]);
    let wall = start.elapsed().as_secs_f64();
    let job = merge(&summaries, wall)?;
    if let Some(path) = &a.train.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&job)? + "\n")
            .with_context(|| format!("writing summary to {}", path.display()))?;
    }
    println!(
        "job: {} PS, {} worker(s), {} train rows in {:.2}s ({:.0} samples/s), test AUC {}",
        a.num_ps,
        a.workers,
        job["train_rows"],
        wall,
        job["train_samples_per_sec"].as_f64().unwrap_or(0.0),
        job["test_auc"]
    );
    let _ = std::io::stdout().flush();
    Ok(())
}

/// One job summary: worker 0's (it evaluated), with rows, steps and throughput over all workers.
fn merge(paths: &[PathBuf], wall: f64) -> Result<serde_json::Value> {
    let mut all = Vec::new();
    for p in paths {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        all.push(serde_json::from_str::<serde_json::Value>(&text)?);
    }
    let sum = |k: &str| {
        all.iter()
            .map(|v| v[k].as_f64().unwrap_or(0.0))
            .sum::<f64>()
    };
    let mut job = all[0].clone();
    let rows = sum("train_rows");
    let train_secs = all
        .iter()
        .map(|v| v["train_seconds"].as_f64().unwrap_or(0.0))
        .fold(0.0, f64::max);
    job["train_rows"] = (rows as u64).into();
    job["steps"] = (sum("steps") as u64).into();
    job["train_seconds"] = train_secs.into();
    job["train_samples_per_sec"] = (rows / train_secs.max(1e-9)).into();
    job["loop_samples_per_sec"] = sum("loop_samples_per_sec").into();
    job["job_wall_seconds"] = wall.into();
    let bytes: f64 = all
        .iter()
        .map(|v| {
            v["wire"]["bytes_sent"].as_f64().unwrap_or(0.0)
                + v["wire"]["bytes_received"].as_f64().unwrap_or(0.0)
        })
        .sum();
    job["wire"]["bytes_per_sample"] = (bytes / rows.max(1.0)).into();
    job["per_worker"] = serde_json::Value::Array(all);
    Ok(job)
}
