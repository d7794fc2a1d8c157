//! The real [`Processes`]: PS, worker and coordinator child processes of the `sparta`
//! executable on loopback, their output copied to ours with a `[name]` prefix.
//!
//! Children die with the launcher: each is started with a parent-death signal (SIGKILL on
//! Linux), so even a `kill -9` of the launcher leaves no PS or worker behind. The signal is
//! tied to the thread that spawned the child, so a [`LocalCluster`] must be driven from a
//! thread that lives as long as the cluster (the calling thread of [`crate::launch`]).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use sparta_checkpoint::{
    missing_local_dir, newest_valid, nothing_to_resume, open_dir, CheckpointId, Manifest,
    ResumePolicy,
};

use crate::drive::{Processes, ResumePoint};
use crate::error::LaunchError;
use crate::supervise::{Exit, Kind};

/// How long a PS (or the coordinator) may take to print its address.
const PS_START: Duration = Duration::from_secs(60);

/// What every process of the cluster is started with.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The `sparta` executable.
    pub exe: PathBuf,
    /// PS shards.
    pub num_ps: usize,
    /// Workers.
    pub workers: usize,
    /// The job config file every process reads.
    pub config: PathBuf,
    /// Flags for every PS after the ones the launcher sets (mode, threads, TLS).
    pub ps_args: Vec<OsString>,
    /// Flags for the coordinator after the ones the launcher sets (TLS).
    pub coordinator_args: Vec<OsString>,
    /// Flags for every worker after the ones the launcher sets (input, test, TLS, …).
    pub worker_args: Vec<OsString>,
    /// The shared token (`SPARTA_TOKEN` of every child).
    pub token: String,
    /// The checkpoint dir, when the job checkpoints.
    pub checkpoint_dir: Option<PathBuf>,
    /// Where worker `j` writes its summary.
    pub summaries: Vec<PathBuf>,
    /// Dense mode allreduce: the workers get `--ring` (a free loopback port each, picked
    /// afresh at every start).
    pub ring: bool,
    /// Copies of every PS shard (1: none; else the shards get `--replicas` and `--peers`).
    pub replicas: usize,
    /// Every PS and worker serves its metrics on a loopback port picked at each start, listed
    /// here by process name (`ps0`, `w1`, ...) for the launcher's merged `/metrics`.
    pub metrics: Option<Endpoints>,
    /// Shards added and removed while training (`--scale-ps-at`).
    pub scale: Option<crate::scale::ScalePlan>,
}

/// The metrics endpoints of the running children: `(process, address)`, one per process.
pub type Endpoints = Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A child process and its name.
struct Proc {
    name: String,
    child: Child,
}

/// The cluster's processes.
pub struct LocalCluster {
    layout: Layout,
    stop: Arc<AtomicBool>,
    ps: Vec<Option<Proc>>,
    workers: Vec<Option<Proc>>,
    /// Replicated shards: every PS address (picked at each start), and the coordinator with
    /// its address (kept across its restarts: the workers were told it).
    peers: Vec<String>,
    coordinator: Option<Proc>,
    coordinator_addr: String,
    /// What the next [`Processes::checkpoint`] does without a checkpoint: the user's choice
    /// on the first start, then [`ResumePolicy::IfPresent`] (a restart before the first
    /// checkpoint starts from scratch).
    resume_policy: ResumePolicy,
    /// The PS addresses of the cluster now, in shard order.
    addrs: Vec<String>,
    /// Scaling (`--scale-ps-at`): the next event, the one at work, the PS that leave.
    scaling: Scaling,
}

/// Where the scaling of a launch stands.
#[derive(Default)]
struct Scaling {
    /// The next event of the plan.
    next: usize,
    running: Option<crate::scale::Running>,
    /// PS indexes left out of the cluster (they exit by themselves).
    leaving: Arc<std::sync::Mutex<Vec<usize>>>,
    /// Whether the cluster started at least once (a restart takes the checkpoint's count).
    started: bool,
    /// The events carried out, in order.
    done: Vec<crate::scale::Scaled>,
}

impl LocalCluster {
    /// A cluster of `layout`, not started; `stop` interrupts a start in progress.
    pub fn new(layout: Layout, stop: Arc<AtomicBool>) -> Self {
        LocalCluster {
            ps: (0..layout.num_ps).map(|_| None).collect(),
            workers: (0..layout.workers).map(|_| None).collect(),
            peers: Vec::new(),
            coordinator: None,
            coordinator_addr: String::new(),
            layout,
            stop,
            resume_policy: ResumePolicy::IfPresent,
            addrs: Vec::new(),
            scaling: Scaling::default(),
        }
    }

    /// What the first start does when `--resume` finds no checkpoint.
    pub fn with_resume_policy(mut self, policy: ResumePolicy) -> Self {
        self.resume_policy = policy;
        self
    }

    /// Stops the PS shards and the coordinator (after the workers finished).
    pub fn stop_ps(&mut self) {
        let mut ps: Vec<Proc> = self
            .ps
            .iter_mut()
            .chain(std::iter::once(&mut self.coordinator))
            .filter_map(Option::take)
            .collect();
        stop_all(&mut ps);
    }

    /// The `--scale-ps-at` events carried out, in order.
    pub fn scaled(&self) -> &[crate::scale::Scaled] {
        &self.scaling.done
    }

    /// Where the coordinator keeps its map (replicated shards).
    pub fn coordinator_state(&self) -> Option<PathBuf> {
        (self.layout.replicas > 1).then(|| self.state_dir().join("coordinator.json"))
    }

    fn state_dir(&self) -> PathBuf {
        self.layout
            .config
            .parent()
            .map_or_else(PathBuf::new, Path::to_path_buf)
    }

    /// Starts the coordinator of replicated shards at `addr` and waits until it listens;
    /// `restore`: from the map it saved (a restart), else from a fresh one.
    fn start_coordinator(&mut self, addr: &str, restore: bool) -> Result<(), LaunchError> {
        let l = &self.layout;
        let state = self.coordinator_state().expect("replicas");
        if !restore {
            // A map of an earlier start is not this one's.
            let _ = std::fs::remove_file(&state);
        }
        let mut cmd = self.command("coordinator");
        cmd.args(["--ps", &self.peers.join(",")])
            .args(["--replicas", &l.replicas.to_string(), "--listen", addr])
            // Shards added while training since the start: the start's count.
            .args(
                (self.peers.len() > l.num_ps)
                    .then(|| ["--dense-shards".to_string(), l.num_ps.to_string()])
                    .into_iter()
                    .flatten(),
            )
            .arg("--state-file")
            .arg(state)
            .args(&l.coordinator_args);
        if restore {
            cmd.arg("--restore");
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| LaunchError::io("starting the coordinator", e))?;
        let name = Kind::Coordinator.label(0);
        say(&format!("launch: started {name} (pid {})", child.id()));
        copy_lines(
            name.clone(),
            child.stderr.take().expect("piped"),
            true,
            |_| {},
        );
        let out = child.stdout.take().expect("piped");
        let mut proc = Proc { name, child };
        proc = self.wait_listening(proc, out, "the coordinator")?.0;
        self.coordinator = Some(proc);
        Ok(())
    }

    /// Copies `out` (the stdout of `proc`) and waits for its "listening on ADDR" line; returns
    /// `proc` with the address, or stops it when it exits first, does not start listening
    /// within [`PS_START`], or the launch is interrupted.
    fn wait_listening(
        &self,
        mut proc: Proc,
        out: impl Read + Send + 'static,
        what: &str,
    ) -> Result<(Proc, String), LaunchError> {
        let (tx, rx) = mpsc::channel();
        copy_lines(proc.name.clone(), out, false, move |line| {
            if let Some(addr) = line.split("listening on ").nth(1) {
                // The coordinator says more after its address (`ADDR: 3 PS, …`).
                let addr = addr.split(": ").next().unwrap_or(addr);
                let _ = tx.send(addr.trim().to_string());
            }
        });
        let deadline = Instant::now() + PS_START;
        loop {
            if let Ok(addr) = rx.recv_timeout(Duration::from_millis(50)) {
                return Ok((proc, addr));
            }
            let fail = if let Some(st) = proc
                .child
                .try_wait()
                .map_err(|e| LaunchError::io(format!("watching {what}"), e))?
            {
                LaunchError::Start(format!(
                    "{what} exited before listening ({st}); see its log above"
                ))
            } else if self.stop.load(Ordering::Relaxed) {
                LaunchError::Interrupted
            } else if Instant::now() > deadline {
                LaunchError::Start(format!(
                    "{what} did not start listening within {PS_START:?}"
                ))
            } else {
                continue;
            };
            stop_all(std::slice::from_mut(&mut proc));
            return Err(fail);
        }
    }

    /// With metrics: `--metrics-listen` on a free loopback port for process `name`, recorded
    /// in the endpoints (replacing the address of an earlier start of it).
    fn metrics_args(&self, name: &str) -> Result<Vec<String>, LaunchError> {
        let Some(endpoints) = &self.layout.metrics else {
            return Ok(Vec::new());
        };
        let addr = free_ports(1)?.remove(0);
        let mut list = endpoints.lock().unwrap_or_else(|e| e.into_inner());
        match list.iter_mut().find(|(n, _)| n == name) {
            Some(e) => e.1 = addr.clone(),
            None => list.push((name.to_string(), addr.clone())),
        }
        Ok(vec!["--metrics-listen".into(), addr])
    }

    fn command(&self, role: &str) -> Command {
        let mut cmd = Command::new(&self.layout.exe);
        cmd.arg(role)
            .env("SPARTA_TOKEN", &self.layout.token)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_parent(&mut cmd);
        cmd
    }

    /// Starts PS shard `i` of `n` and returns it with its address (read from its stdout).
    /// Past the launch's `--ps` count (shards added while training) the first `--ps` shards
    /// hold the dense vector.
    fn start_ps(
        &self,
        i: usize,
        n: usize,
        resume: Option<&ResumePoint>,
        peers: &[String],
    ) -> Result<(Proc, String), LaunchError> {
        let l = &self.layout;
        let mut cmd = self.command("ps");
        cmd.args(["--shard", &i.to_string(), "--num-shards", &n.to_string()]);
        if n > l.num_ps {
            cmd.args(["--dense-shards", &l.num_ps.to_string()]);
        }
        if l.scale.is_some() {
            cmd.arg("--exit-when-retired");
        }
        cmd.args([
            "--listen",
            peers.get(i).map_or("127.0.0.1:0", String::as_str),
            "--workers",
            &l.workers.to_string(),
        ])
        .arg("--config")
        .arg(&l.config);
        if let (Some(r), Some(dir)) = (resume, &l.checkpoint_dir) {
            cmd.arg("--resume")
                .arg(dir)
                .args(["--resume-id", &r.id.to_string()]);
        }
        if l.replicas > 1 {
            cmd.args([
                "--replicas",
                &l.replicas.to_string(),
                "--peers",
                &peers.join(","),
            ]);
        }
        cmd.args(&l.ps_args);
        let name = Kind::Ps.label(i);
        cmd.args(self.metrics_args(&name)?);
        let mut child = cmd
            .spawn()
            .map_err(|e| LaunchError::io(format!("starting PS shard {i}"), e))?;
        say(&format!("launch: started {name} (pid {})", child.id()));
        let err = child.stderr.take().expect("piped");
        let out = child.stdout.take().expect("piped");
        copy_lines(name.clone(), err, true, |_| {});
        self.wait_listening(Proc { name, child }, out, &format!("PS shard {i}"))
    }

    fn start_worker(
        &self,
        j: usize,
        addrs: &[String],
        ring: &[String],
        coordinator: Option<&str>,
    ) -> Result<Proc, LaunchError> {
        let l = &self.layout;
        let _ = std::fs::remove_file(&l.summaries[j]);
        let mut cmd = self.command("worker");
        cmd.args([
            "--rank",
            &j.to_string(),
            "--num-workers",
            &l.workers.to_string(),
        ])
        .args(["--ps", &addrs.join(",")]);
        if !ring.is_empty() {
            cmd.args(["--ring", &ring.join(",")]);
        }
        if let Some(c) = coordinator {
            cmd.args(["--coordinator", c]);
        }
        cmd.arg("--config")
            .arg(&l.config)
            .arg("--summary-json")
            .arg(&l.summaries[j])
            .args(&l.worker_args);
        let name = Kind::Worker.label(j);
        cmd.args(self.metrics_args(&name)?);
        let mut child = cmd
            .spawn()
            .map_err(|e| LaunchError::io(format!("starting worker {j}"), e))?;
        say(&format!("launch: started {name} (pid {})", child.id()));
        copy_lines(
            name.clone(),
            child.stdout.take().expect("piped"),
            false,
            |_| {},
        );
        copy_lines(
            name.clone(),
            child.stderr.take().expect("piped"),
            true,
            |_| {},
        );
        Ok(Proc { name, child })
    }
}

impl Processes for LocalCluster {
    fn start(&mut self, resume: Option<&ResumePoint>) -> Result<(), LaunchError> {
        let mut addrs = Vec::new();
        // With scaling, a restart takes the count of the checkpoint it restores (shards
        // added or removed since are not in it); the first start takes `--ps`.
        let n = match resume {
            Some(r) if self.layout.scale.is_some() && self.scaling.started && r.shards > 0 => {
                r.shards as usize
            }
            _ => self.layout.num_ps,
        };
        self.scaling.started = true;
        self.scaling.running = None;
        self.scaling
            .leaving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.ps = (0..n).map(|_| None).collect();
        // Replicas: every shard must know every address before it starts.
        self.peers = if self.layout.replicas > 1 {
            free_ports(n)?
        } else {
            Vec::new()
        };
        for i in 0..n {
            let (p, addr) = self.start_ps(i, n, resume, &self.peers)?;
            self.ps[i] = Some(p);
            addrs.push(addr);
        }
        self.addrs = addrs.clone();
        // What `sparta move-slots --ps` (and a hand-run worker) takes.
        say(&format!("launch: PS at {}", addrs.join(",")));
        let coordinator = if self.layout.replicas > 1 {
            self.coordinator_addr = free_ports(1)?.remove(0);
            let addr = self.coordinator_addr.clone();
            self.start_coordinator(&addr, false)?;
            Some(addr)
        } else {
            None
        };
        let ring = if self.layout.ring {
            free_ports(self.layout.workers)?
        } else {
            Vec::new()
        };
        for j in 0..self.layout.workers {
            let p = self.start_worker(j, &addrs, &ring, coordinator.as_deref())?;
            self.workers[j] = Some(p);
        }
        Ok(())
    }

    fn restart_ps(&mut self, i: usize) -> Result<(), LaunchError> {
        let (p, _) = self.start_ps(i, self.ps.len(), None, &self.peers)?;
        self.ps[i] = Some(p);
        Ok(())
    }

    fn restart_coordinator(&mut self) -> Result<(), LaunchError> {
        let addr = self.coordinator_addr.clone();
        self.start_coordinator(&addr, true)
    }

    fn exited(&mut self) -> Result<Vec<Exit>, LaunchError> {
        let mut out = Vec::new();
        if let Some(p) = &mut self.coordinator {
            let st = p
                .child
                .try_wait()
                .map_err(|e| LaunchError::io("watching the coordinator", e))?;
            if let Some(st) = st {
                self.coordinator = None;
                out.push(Exit {
                    kind: Kind::Coordinator,
                    index: 0,
                    success: st.success(),
                    status: st.to_string(),
                    job_failed: false,
                });
            }
        }
        let leaving = self
            .scaling
            .leaving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (kind, procs) in [(Kind::Ps, &mut self.ps), (Kind::Worker, &mut self.workers)] {
            for (index, slot) in procs.iter_mut().enumerate() {
                let Some(p) = slot else { continue };
                let st = p
                    .child
                    .try_wait()
                    .map_err(|e| LaunchError::io(format!("watching {}", p.name), e))?;
                if let Some(st) = st {
                    if kind == Kind::Ps && leaving.contains(&index) {
                        // Left out of the cluster: it stops at its last round.
                        say(&format!("launch: {} left the cluster ({st})", p.name));
                        *slot = None;
                        continue;
                    }
                    *slot = None;
                    out.push(Exit {
                        kind,
                        index,
                        success: st.success(),
                        status: st.to_string(),
                        job_failed: st.code() == Some(crate::EXIT_JOB_FAILED),
                    });
                }
            }
        }
        Ok(out)
    }

    fn stop(&mut self) {
        let mut all: Vec<Proc> = self
            .workers
            .iter_mut()
            .chain(self.ps.iter_mut())
            .chain(std::iter::once(&mut self.coordinator))
            .filter_map(Option::take)
            .collect();
        stop_all(&mut all);
    }

    fn checkpoint(&mut self) -> Result<Option<ResumePoint>, LaunchError> {
        match &self.layout.checkpoint_dir {
            Some(dir) => {
                let policy = std::mem::replace(&mut self.resume_policy, ResumePolicy::IfPresent);
                choose_checkpoint(dir, policy)
            }
            None => Ok(None),
        }
    }

    fn say(&mut self, line: &str) {
        say(line);
    }

    fn tick(&mut self) -> Result<(), LaunchError> {
        let Some(plan) = self.layout.scale.clone() else {
            return Ok(());
        };
        if self.scaling.running.is_none() {
            let Some(&event) = plan.events.get(self.scaling.next) else {
                return Ok(());
            };
            if event.shards == self.addrs.len() {
                say(&format!(
                    "launch: the cluster has {} PS already (--scale-ps-at {}:{})",
                    event.shards, event.step, event.shards
                ));
                self.scaling.next += 1;
                return Ok(());
            }
            let r = crate::scale::run(
                Arc::clone(&plan.ops),
                event,
                self.addrs.clone(),
                self.layout.workers,
                Arc::clone(&self.scaling.leaving),
            )
            .map_err(|e| LaunchError::io("starting the scaling thread", e))?;
            self.scaling.running = Some(r);
        }
        let Some(r) = &self.scaling.running else {
            return Ok(());
        };
        let event = r.event;
        let msgs: Vec<crate::scale::Msg> = r.rx.try_iter().collect();
        for m in msgs {
            match m {
                crate::scale::Msg::Say(line) => say(&format!("launch: scale: {line}")),
                crate::scale::Msg::Start { from, to } => {
                    say(&format!(
                        "launch: step {} reached: adding PS {from}..{} (--scale-ps-at {}:{to})",
                        event.step,
                        to - 1,
                        event.step
                    ));
                    let mut added = Vec::new();
                    // Replicas: the added PS know every address, the start's included.
                    let peers = if self.layout.replicas > 1 {
                        let mut p = self.peers.clone();
                        p.extend(free_ports(to - from)?);
                        p
                    } else {
                        Vec::new()
                    };
                    for i in from..to {
                        let (p, addr) = self.start_ps(i, to, None, &peers)?;
                        if self.ps.len() <= i {
                            self.ps.resize_with(i + 1, || None);
                        }
                        self.ps[i] = Some(p);
                        added.push(addr);
                    }
                    if self.layout.replicas > 1 {
                        // A PS or coordinator restarted from now on gets them all.
                        self.peers = peers;
                    }
                    if let Some(r) = &self.scaling.running {
                        let _ = r.started.send(Ok(added));
                    }
                }
                crate::scale::Msg::Done(Ok(addrs), seconds) => {
                    say(&format!(
                        "launch: the cluster has {} PS from step {} on ({seconds:.1} s): {}",
                        addrs.len(),
                        event.step,
                        addrs.join(",")
                    ));
                    self.scaling.done.push(crate::scale::Scaled {
                        step: event.step,
                        from: self.addrs.len(),
                        to: addrs.len(),
                        seconds,
                    });
                    if self.layout.replicas > 1 {
                        self.peers.truncate(addrs.len());
                    }
                    self.addrs = addrs;
                    self.scaling.running = None;
                    self.scaling.next += 1;
                }
                crate::scale::Msg::Done(Err(e), _) => {
                    return Err(LaunchError::Failed(format!(
                        "--scale-ps-at {}:{} failed: {e}",
                        event.step, event.shards
                    )));
                }
            }
        }
        Ok(())
    }

    fn sleep(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The checkpoint to restart from: the newest whose every file verifies (invalid ones are
/// reported and skipped), or `None` (start from scratch) when `policy` allows it (see
/// [`nothing_to_resume`]).
pub fn choose_checkpoint(
    dir: &Path,
    policy: ResumePolicy,
) -> Result<Option<ResumePoint>, LaunchError> {
    if missing_local_dir(&dir.to_string_lossy(), policy)? {
        return Ok(None);
    }
    let storage = open_dir(dir)?;
    let Some(id) = newest_valid(storage.as_ref())? else {
        nothing_to_resume(storage.as_ref(), policy)?;
        say(&format!(
            "launch: no valid checkpoint in {}: starting from scratch",
            dir.display()
        ));
        return Ok(None);
    };
    let m = Manifest::read(storage.as_ref(), id)?;
    let Some(cluster) = m.cluster else {
        return Err(LaunchError::Start(format!(
            "{id} in {} was written by an embedded job, not a PS cluster: resume it with \
             `sparta train --resume`",
            dir.display()
        )));
    };
    say(&format!(
        "launch: using checkpoint {id} (step {}, {} samples trained, {} PS shard(s))",
        m.step, cluster.samples_trained, cluster.num_shards
    ));
    let CheckpointId(n) = id;
    Ok(Some(ResumePoint {
        id: n,
        name: id.to_string(),
        samples: cluster.samples_trained,
        shards: cluster.num_shards,
    }))
}

/// One line to stdout; a closed stdout (the reader went away) is not an error worth dying of.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Copies `r` line by line to stdout or stderr with a `[name]` prefix, handing each line to
/// `seen` first. Ends at EOF; write errors (our own output closed) are ignored.
fn copy_lines(
    name: String,
    r: impl Read + Send + 'static,
    to_stderr: bool,
    mut seen: impl FnMut(&str) + Send + 'static,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            seen(&line);
            let _ = if to_stderr {
                writeln!(std::io::stderr().lock(), "[{name}] {line}")
            } else {
                let mut out = std::io::stdout().lock();
                writeln!(out, "[{name}] {line}").and_then(|()| out.flush())
            };
        }
    });
}

/// `n` loopback addresses with ports free now (probed, then released for the children to
/// bind; below the ephemeral range, so no outgoing connection takes one in between; another
/// process binding one makes that child fail to start, a failure like any other).
fn free_ports(n: usize) -> Result<Vec<String>, LaunchError> {
    crate::ports::free_loopback(n, crate::ports::random_seed())
        .map_err(|e| LaunchError::io("picking free loopback ports", e))
}

fn stop_all(procs: &mut [Proc]) {
    for p in procs.iter_mut() {
        tracing::debug!("stopping {}", p.name);
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
}

/// Makes the child get SIGKILL when the launcher's spawning thread dies, however it dies.
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe functions may be called: prctl and getppid are plain system calls,
    // and the error path builds an io::Error from an errno value without allocating.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before the prctl: then nothing would ever signal us.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Elsewhere the children are stopped by the launcher only (no parent-death signal).
#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}
