//! `sparta launch`: a whole PS cluster on this machine (loopback): N PS + M worker child
//! processes of this executable, supervised, their output merged, one job summary. With
//! checkpoints, a process that dies is recovered from by a coordinated rollback (see
//! [`super::supervise`]): every process restarts from the newest valid checkpoint.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use sparta_checkpoint::{newest_valid, open_dir, CheckpointId, Manifest};

use super::supervise::{Action, Kind, Policy, Supervisor};
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
    /// Sync mode: a step goes on without the K slowest workers, whose gradients join the next
    /// step (default: the job config's `train.backup_workers`).
    #[arg(long)]
    pub backup_workers: Option<usize>,
    /// Serve the PS shards' gRPC over TLS with this certificate chain (PEM); needs --tls-key
    /// and --tls-ca (the workers verify the shards with it).
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA certificate (PEM) the workers verify the shards' certificate with.
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Name the workers expect in the shards' certificate (default: the address, 127.0.0.1).
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
    /// Embedding values on the wire: none, fp16 or bf16.
    #[arg(long, default_value = "none")]
    pub wire_compression: String,
    /// Threads serving requests per PS.
    #[arg(long, default_value_t = 2)]
    pub ps_threads: usize,
    /// Process failures recovered from (with --checkpoint-dir) before the job gives up.
    #[arg(long, default_value_t = 3)]
    pub max_restarts: u32,
    /// How long workers retry an unreachable PS before failing, seconds (default: the job
    /// config's `[train] ps_retry_secs`).
    #[arg(long)]
    pub ps_retry_secs: Option<u64>,
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
        tracing::debug!("stopping {}", p.name);
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
}

/// The cluster's processes and how to start them.
struct Cluster<'a> {
    a: &'a LaunchArgs,
    exe: PathBuf,
    config: PathBuf,
    token: String,
    ckpt_dir: Option<PathBuf>,
    ps: Vec<Option<Proc>>,
    workers: Vec<Option<Proc>>,
    summaries: Vec<PathBuf>,
}

impl Cluster<'_> {
    /// Starts every PS (from checkpoint `resume` if given), then every worker.
    fn start(&mut self, resume: Option<CheckpointId>) -> Result<()> {
        let mut addrs = Vec::new();
        for i in 0..self.a.num_ps {
            let (p, addr) = self.start_ps(i, resume)?;
            self.ps[i] = Some(p);
            addrs.push(addr);
        }
        for j in 0..self.a.workers {
            let _ = std::fs::remove_file(&self.summaries[j]);
            let p = self.start_worker(j, &addrs)?;
            self.workers[j] = Some(p);
        }
        Ok(())
    }

    /// Starts PS shard `i` and returns it with its address (read from its first stdout line).
    fn start_ps(&self, i: usize, resume: Option<CheckpointId>) -> Result<(Proc, String)> {
        let a = self.a;
        let mut cmd = Command::new(&self.exe);
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
            .arg(&self.config)
            .env("SPARTA_TOKEN", &self.token)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match a.staleness {
            Some(k) => cmd.args(["--staleness", &k.to_string()]),
            None => cmd.args(["--mode", &a.mode]),
        };
        if let Some(k) = a.backup_workers {
            cmd.args(["--backup-workers", &k.to_string()]);
        }
        if let (Some(c), Some(k)) = (&a.tls_cert, &a.tls_key) {
            cmd.arg("--tls-cert").arg(c).arg("--tls-key").arg(k);
        }
        if let (Some(id), Some(dir)) = (resume, &self.ckpt_dir) {
            cmd.arg("--resume")
                .arg(dir)
                .args(["--resume-id", &id.0.to_string()]);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting PS shard {i}"))?;
        let name = Kind::Ps.label(i);
        println!("launch: started {name} (pid {})", child.id());
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

    fn start_worker(&self, j: usize, addrs: &[String]) -> Result<Proc> {
        let a = self.a;
        let mut cmd = Command::new(&self.exe);
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
            .arg(&self.config)
            .arg("--train")
            .args(&a.train.train)
            .arg("--summary-json")
            .arg(&self.summaries[j])
            .env("SPARTA_TOKEN", &self.token)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !a.train.test.is_empty() {
            cmd.arg("--test").args(&a.train.test);
        }
        if a.train.quiet {
            cmd.arg("--quiet");
        }
        if let Some(s) = a.ps_retry_secs {
            cmd.args(["--ps-retry-secs", &s.to_string()]);
        }
        if let Some(ca) = &a.tls_ca {
            cmd.arg("--tls-ca").arg(ca);
            if let Some(d) = &a.tls_domain {
                cmd.args(["--tls-domain", d]);
            }
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting worker {j}"))?;
        let name = Kind::Worker.label(j);
        println!("launch: started {name} (pid {})", child.id());
        stream(name.clone(), child.stdout.take().expect("piped"), false);
        stream(name.clone(), child.stderr.take().expect("piped"), true);
        Ok(Proc { name, child })
    }

    /// The next process found exited, if any (its slot is emptied).
    fn poll(&mut self) -> Result<Option<(Kind, usize, ExitStatus)>> {
        for (kind, procs) in [(Kind::Ps, &mut self.ps), (Kind::Worker, &mut self.workers)] {
            for (i, slot) in procs.iter_mut().enumerate() {
                if let Some(p) = slot {
                    if let Some(st) = p.child.try_wait()? {
                        *slot = None;
                        return Ok(Some((kind, i, st)));
                    }
                }
            }
        }
        Ok(None)
    }

    fn stop_ps(&mut self) {
        let mut ps: Vec<Proc> = self.ps.iter_mut().filter_map(Option::take).collect();
        stop_all(&mut ps);
    }

    fn stop(&mut self) {
        let mut all: Vec<Proc> = self
            .workers
            .iter_mut()
            .chain(self.ps.iter_mut())
            .filter_map(Option::take)
            .collect();
        stop_all(&mut all);
    }
}

/// The checkpoint to restart from: the newest whose every file verifies (invalid ones are
/// reported and skipped), or `None` (start from scratch).
fn choose_checkpoint(dir: &Path) -> Result<Option<CheckpointId>> {
    let storage = open_dir(dir)?;
    let id = newest_valid(storage.as_ref())?;
    match id {
        Some(id) => {
            let m = Manifest::read(storage.as_ref(), id)?;
            anyhow::ensure!(
                m.cluster.is_some(),
                "{id} in {} was written by an embedded job, not a PS cluster: resume it with \
                 `sparta train --resume`",
                dir.display()
            );
            println!(
                "launch: using checkpoint {id} (step {}, {} samples trained)",
                m.step,
                m.cluster.map_or(0, |c| c.samples_trained)
            );
        }
        None => println!(
            "launch: no valid checkpoint in {}: starting from scratch",
            dir.display()
        ),
    }
    Ok(id)
}

/// `sparta launch`.
pub fn run(a: LaunchArgs) -> Result<()> {
    if a.num_ps == 0 || a.workers == 0 {
        bail!("--ps and --workers must be at least 1");
    }
    let cfg = job_config(&a.train)?;
    cfg.validate()?;
    super::ps::mode(
        &a.mode,
        a.staleness,
        a.backup_workers,
        cfg.train.backup_workers,
        a.workers,
    )?;
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
    let ckpt_dir = cfg.train.checkpoint_dir.clone();
    let mut cluster = Cluster {
        a: &a,
        exe: std::env::current_exe().context("locating this executable")?,
        config,
        token,
        ckpt_dir: ckpt_dir.clone(),
        ps: (0..a.num_ps).map(|_| None).collect(),
        workers: (0..a.workers).map(|_| None).collect(),
        summaries: (0..a.workers)
            .map(|j| dir.path().join(format!("worker{j}.json")))
            .collect(),
    };
    let mut sup = Supervisor::new(
        Policy {
            recover: ckpt_dir.is_some(),
            max_restarts: a.max_restarts,
        },
        a.workers,
    );
    let resume = match (&a.train.resume, &ckpt_dir) {
        (Some(_), Some(d)) => choose_checkpoint(d)?,
        _ => None,
    };
    let start = Instant::now();
    if let Err(e) = cluster.start(resume) {
        cluster.stop();
        return Err(e);
    }
    loop {
        let Some((kind, i, st)) = cluster.poll()? else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        match sup.on_exit(kind, i, st.success(), &st.to_string()) {
            Action::Continue => {}
            Action::Finish => break,
            Action::Fail(m) => {
                cluster.stop();
                bail!("{m}; stopped the other processes");
            }
            Action::Rollback { reason, delay } => {
                println!(
                    "launch: {reason}; stopping the cluster and restarting it from the newest \
                     valid checkpoint in {delay:?}"
                );
                cluster.stop();
                std::thread::sleep(delay);
                let d = ckpt_dir
                    .as_deref()
                    .expect("recovery needs a checkpoint dir");
                let resume = choose_checkpoint(d)?;
                if let Err(e) = cluster.start(resume) {
                    cluster.stop();
                    return Err(e.context("restarting the cluster"));
                }
            }
        }
    }
    cluster.stop_ps();
    let wall = start.elapsed().as_secs_f64();
    let mut job = merge(&cluster.summaries, wall)?;
    let r = sup.restarts();
    job["restarts"] = serde_json::json!({ "ps": r.ps, "worker": r.worker });
    job["rollbacks"] = sup.rollbacks().into();
    if let Some(path) = &a.train.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&job)? + "\n")
            .with_context(|| format!("writing summary to {}", path.display()))?;
    }
    println!(
        "job: {} PS, {} worker(s), {} train rows in {:.2}s ({:.0} samples/s), {} samples trained, restarts ps {} worker {}, test AUC {}",
        a.num_ps,
        a.workers,
        job["train_rows"],
        wall,
        job["train_samples_per_sec"].as_f64().unwrap_or(0.0),
        job["samples_trained"],
        r.ps,
        r.worker,
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
    job["samples_trained"] = (sum("samples_trained") as u64).into();
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
