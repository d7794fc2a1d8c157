//! `sparta ps`: one parameter-server shard.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sparta_checkpoint::ResumePolicy;
use sparta_core::JobConfig;
use sparta_ps::ckpt::{CheckpointConfig, Resume};
use sparta_ps::server::{run_blocking_with, Listening, StopWhen, Stopped};
use sparta_ps::PsConfig;

use super::flags::{DenseModeFlags, TokenFlags};

/// Flags of `sparta ps`.
#[derive(Args, Debug, Clone)]
pub struct PsArgs {
    /// This shard's index (0-based).
    #[arg(long)]
    pub shard: usize,
    /// Shards in the cluster.
    #[arg(long)]
    pub num_shards: usize,
    /// Shards holding the dense vector, the first ones (default: all --num-shards): the
    /// cluster's count at its start when shards were added while it trained. A shard at or
    /// past it holds no dense slice; started empty, it joins a running cluster and owns no
    /// slot until `sparta scale-ps` tells every shard the new list.
    #[arg(long)]
    pub dense_shards: Option<usize>,
    /// A --shard at or past --num-shards joins the running cluster as a shard added while
    /// training (--num-shards is then the job's starting count, the shards that hold the
    /// dense vector): one pod template serves a PS Job scaled up while the job trains (see
    /// README, "Adding and removing PS shards"). Below it, nothing changes.
    #[arg(long)]
    pub elastic: bool,
    /// gRPC address to listen on (port 0: a free port, printed on stdout).
    #[arg(long, default_value = "0.0.0.0:7070")]
    pub listen: String,
    /// Job config (TOML): tables, model and dense optimizer; the same file as the workers'.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Training workers in the job.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    #[command(flatten)]
    pub dense: DenseModeFlags,
    /// Serve Prometheus `/metrics` and `/health` here.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    #[command(flatten)]
    pub token: TokenFlags,
    /// Largest gRPC message accepted or sent, MiB.
    #[arg(long, default_value_t = 256)]
    pub max_message_mb: usize,
    /// Threads serving requests.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Serve gRPC over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// With --replicas above 1 and --tls-cert: the CA certificate (PEM) the peer PS processes'
    /// certificates are verified with (they talk TLS among themselves too).
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Name the peers' certificates must carry (default: the host of each --peers address).
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
    /// Shared checkpoint directory (default: the job config's `[train] checkpoint_dir`).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Start from the newest checkpoint in this directory whose every file verifies (and keep
    /// checkpointing there). Finding none is an error unless --resume-if-present is given.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// With --resume: start empty when the directory holds no checkpoint at all (what a pod
    /// passes on its first start); checkpoints none of which restores stay an error.
    #[arg(long, requires = "resume", conflicts_with = "resume_id")]
    pub resume_if_present: bool,
    /// With --resume: exactly this checkpoint id (what `sparta launch` passes to every shard).
    #[arg(long, requires = "resume")]
    pub resume_id: Option<u64>,
    /// Exit when no worker or coordinator request has arrived for this many seconds (0:
    /// never), so a PS whose job is gone does not stay up forever. Keep it above the workers'
    /// RPC deadline (300 s): a request waiting at a barrier does not count as activity.
    #[arg(long, default_value_t = sparta_ps::idle::DEFAULT_IDLE_EXIT.as_secs())]
    pub idle_exit_secs: u64,
    /// Exit 0 once worker 0 reports the job over (every worker done, the end-of-job
    /// checkpoint written, the evaluation and table counts read), so a PS run as a Kubernetes
    /// Job ends with the job. A stop by SIGINT/SIGTERM before that then exits 1: only a
    /// finished job ends a shard successfully.
    #[arg(long)]
    pub exit_when_done: bool,
    /// Exit 0 once this shard is left out of the cluster's shards (`sparta scale-ps`
    /// removing it: it switches at a checkpoint round and answers that round first).
    #[arg(long)]
    pub exit_when_retired: bool,
    /// A barrier (sync step, checkpoint) waiting longer than this logs which workers it waits
    /// for, again at this interval, seconds (default: `[train] barrier_warn_secs`, 10).
    #[arg(long)]
    pub barrier_warn_secs: Option<f64>,
    /// Copies of every shard: the primary here and R-1 backups on the next PS processes
    /// (shard s's backups on processes s+1 .. s+R-1, mod --num-shards); a push is answered once
    /// every backup applied it. 1: no backups.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Every PS address in shard order, this one included, comma-separated (needed with
    /// --replicas above 1).
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Memory cap of this shard (`6GiB`, `512MiB`, `2GB`: B, KiB, MiB, GiB, TiB, KB, MB, GB,
    /// TB): past 90 % of it the shard evicts its stalest rows (by last pull) down to 80 %
    /// (default: the job config's `[ps] memory_limit`, none).
    #[arg(long, value_parser = parse_memory_limit)]
    pub memory_limit: Option<u64>,
    /// Test hook, not for production: drop the answer of the Nth push after applying it, as
    /// if the connection broke (`push:N` or `dense_push_pull:N`, `:applying` to drop it while
    /// the push still waits, e.g. at the sync barrier); repeatable. Process tests use it to
    /// check that a worker's retry is not applied twice.
    #[arg(long, hide = true, value_name = "RPC:N[:WHEN]")]
    pub test_drop_answer: Vec<sparta_ps::DropAnswer>,
}

/// Parses `--memory-limit` / `--ps-memory-limit` into bytes.
pub fn parse_memory_limit(s: &str) -> std::result::Result<u64, String> {
    sparta_core::config::parse_bytes(s)
}

/// A shard with a memory cap hands freed memory back to the kernel after a second (mimalloc's
/// own default; `sparta` keeps it by default, see `keep_freed_memory` in main.rs): the
/// buffers of requests, a grown index's old array and the tombstone log's old buffer would
/// otherwise stay resident above the cap. `MIMALLOC_PURGE_DELAY` in the environment still
/// decides when set.
fn purge_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: mi_option_get/mi_option_set read and write one mimalloc option; `sparta ps`
    // calls this before it starts any thread (the runtime comes later), as they require.
    unsafe {
        // -1: `keep_freed_memory` set it, which confirmed the option's position.
        if libmimalloc_sys::mi_option_get(crate::MI_OPTION_PURGE_DELAY) == -1 {
            libmimalloc_sys::mi_option_set(crate::MI_OPTION_PURGE_DELAY, 1000);
        }
    }
}

/// `sparta ps`.
pub fn run(a: PsArgs) -> Result<()> {
    let mut cfg = match &a.config {
        Some(p) => JobConfig::from_file(p)?,
        None => JobConfig::default(),
    };
    if let Some(b) = a.memory_limit {
        cfg.ps.memory_limit = Some(format!("{b}B"));
    }
    let job = cfg.validate()?;
    if job.raw.ps.memory_limit_bytes()?.is_some() {
        purge_freed_memory();
    }
    let token = a.token.load()?;
    let dir = a
        .checkpoint_dir
        .clone()
        .or_else(|| a.resume.clone())
        .or_else(|| job.raw.train.checkpoint_dir.clone());
    // A shard joining a running cluster (`--elastic` past the starting count) starts empty:
    // the slots it will own move onto it while the job trains.
    let joining = a.elastic && a.shard >= a.num_shards;
    if joining && a.resume.is_some() {
        tracing::warn!(
            "PS shard {} joins the running cluster of {} starting shards (--elastic): it starts \
             empty, --resume is not used",
            a.shard,
            a.num_shards
        );
    }
    let checkpoint = dir.map(|dir| CheckpointConfig {
        dir,
        resume: a
            .resume
            .as_ref()
            .filter(|_| !joining)
            .map(|_| match a.resume_id {
                Some(id) => Resume::At(id),
                None if a.resume_if_present => Resume::Newest(ResumePolicy::IfPresent),
                None => Resume::Newest(ResumePolicy::Required),
            }),
        keep_full: job.raw.train.checkpoint_keep_full,
        max_failures: job.raw.train.checkpoint_max_failures,
    });
    let barrier_warn = a
        .barrier_warn_secs
        .unwrap_or(job.raw.train.barrier_warn_secs);
    if barrier_warn.is_nan() || barrier_warn <= 0.0 {
        anyhow::bail!("--barrier-warn-secs must be above 0");
    }
    let (num_shards, dense_shards) = if joining {
        (a.shard + 1, Some(a.num_shards))
    } else {
        (a.num_shards, a.dense_shards)
    };
    let ps = PsConfig {
        shard: a.shard,
        num_shards,
        dense_shards,
        workers: a.workers,
        mode: a.dense.resolve(job.raw.train.backup_workers, a.workers)?,
        token,
        max_message_bytes: a.max_message_mb << 20,
        tls: sparta_proto::ServerTls::from_flags(a.tls_cert.as_deref(), a.tls_key.as_deref())?,
        checkpoint,
        barrier_warn: std::time::Duration::from_secs_f64(barrier_warn),
        fault: sparta_ps::FaultHook::new(a.test_drop_answer.iter().copied()),
        replication: sparta_ps::server::Replication {
            replicas: a.replicas,
            peers: if joining && a.replicas > 1 {
                peers_up_to(&a.peers, num_shards)?
            } else {
                a.peers.clone()
            },
            tls: sparta_proto::ClientTls::from_flag(a.tls_ca.as_deref(), a.tls_domain.clone())?,
        },
    };
    let desc = ps.mode.describe();
    let stop_when = StopWhen {
        idle: (a.idle_exit_secs > 0).then(|| Duration::from_secs(a.idle_exit_secs)),
        job_over: a.exit_when_done,
        retired: a.exit_when_retired,
    };
    let stopped = run_blocking_with(
        &job,
        ps,
        &a.listen,
        a.metrics_listen.as_deref(),
        a.threads,
        stop_when,
        |l: &Listening| {
            // `sparta launch` reads this line to learn the port.
            println!("sparta ps shard {} listening on {}", a.shard, l.addr);
            if let Some(m) = l.metrics {
                println!("sparta ps shard {} metrics on http://{m}/metrics", a.shard);
            }
            let _ = std::io::stdout().flush();
            tracing::info!(
                "PS shard {} of {}: {} worker(s), mode {desc}",
                a.shard,
                a.num_shards,
                a.workers
            );
        },
    )
    .with_context(|| format!("PS shard {}", a.shard))?;
    match stopped {
        Stopped::JobOver => {
            tracing::info!("PS shard {}: the job is over (--exit-when-done)", a.shard);
            Ok(())
        }
        Stopped::Retired => {
            tracing::info!(
                "PS shard {}: left out of the cluster's shards (--exit-when-retired)",
                a.shard
            );
            Ok(())
        }
        Stopped::Interrupted if a.exit_when_done => anyhow::bail!(
            "PS shard {}: stopped by a signal before the job was over (--exit-when-done)",
            a.shard
        ),
        Stopped::Interrupted => Ok(()),
        Stopped::Idle(idle) => anyhow::bail!(
            "PS shard {}: no worker or coordinator request for {:.0} s (--idle-exit-secs {}): \
             exiting",
            a.shard,
            idle.as_secs_f64(),
            a.idle_exit_secs
        ),
    }
}

/// `--elastic --replicas`: the peers of a shard joining past the start's list, named as the
/// start's are (`sparta-ps-0.sparta-ps:7070, sparta-ps-1...`: the pods of an Indexed Job or a
/// StatefulSet), up to `n` addresses; a list as long already is kept.
fn peers_up_to(peers: &[String], n: usize) -> anyhow::Result<Vec<String>> {
    if peers.len() >= n {
        return Ok(peers.to_vec());
    }
    let pattern = || {
        anyhow::anyhow!(
            "--elastic --replicas: this shard joins as shard {} but --peers lists {} address(es) \
             that do not follow one pattern with the index in it (as sparta-ps-0.sparta-ps:7070,\
             sparta-ps-1.sparta-ps:7070): list every PS address, this one's included",
            n - 1,
            peers.len()
        )
    };
    let [a, b, ..] = peers else {
        return Err(pattern());
    };
    // The index is where the first two differ: "…0…" and "…1…".
    let pre = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let digits = |s: &str| s[pre..].bytes().take_while(u8::is_ascii_digit).count();
    let prefix = &a[..pre.min(a.len())];
    let suffix = &a[(pre + digits(a)).min(a.len())..];
    let named = |i: usize| format!("{prefix}{i}{suffix}");
    if !peers.iter().enumerate().all(|(i, p)| *p == named(i)) {
        return Err(pattern());
    }
    Ok((0..n).map(named).collect())
}

#[cfg(test)]
mod peer_tests {
    use super::peers_up_to;

    #[test]
    fn a_joining_shard_names_its_peers_by_the_pattern_of_the_start_list() {
        let start: Vec<String> = (0..3)
            .map(|i| format!("sparta-ps-{i}.sparta-ps:7070"))
            .collect();
        let got = peers_up_to(&start, 5).unwrap();
        assert_eq!(got[3], "sparta-ps-3.sparta-ps:7070");
        assert_eq!(got[4], "sparta-ps-4.sparta-ps:7070");
        assert_eq!(&got[..3], &start[..]);
        // Two-digit indices.
        let start: Vec<String> = (0..12).map(|i| format!("ps{i}:70")).collect();
        assert_eq!(peers_up_to(&start, 13).unwrap()[12], "ps12:70");
        // A list long enough is kept; one without a pattern is refused naming the flag.
        assert_eq!(peers_up_to(&start, 12).unwrap(), start);
        let odd = vec!["a:1".to_string(), "b:2".to_string()];
        let e = peers_up_to(&odd, 3).unwrap_err().to_string();
        assert!(e.contains("--peers") && e.contains("shard 2"), "{e}");
        assert!(peers_up_to(&["x:1".to_string()], 2).is_err());
    }
}
