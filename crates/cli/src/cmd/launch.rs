//! `sparta launch`: a whole PS cluster on this machine (loopback). Thin: it checks the flags,
//! turns them into the children's flags and hands the job to [`sparta_launch::launch`] (the
//! supervisor: rollback recovery, children that die with it, the job summary).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use sparta_proto::Compression;

use super::flags::{DenseMode, DenseModeFlags};
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
    #[command(flatten)]
    pub dense: DenseModeFlags,
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
    /// Embedding values on the wire.
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub wire_compression: Compression,
    /// Dense mode allreduce: gradient chunks on the ring (summed in f32).
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub ring_compression: Compression,
    /// Copies of every PS shard: a primary and R-1 backups on other PS processes (see
    /// `sparta ps --replicas`); at most --ps.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
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
    /// Memory cap of every PS shard, e.g. `6GiB` (see `sparta ps --memory-limit`; default:
    /// the job config's `[ps] memory_limit`, none).
    #[arg(long, value_parser = super::ps::parse_memory_limit)]
    pub ps_memory_limit: Option<u64>,
    /// Add or remove PS shards while the job trains: once the workers trained STEP steps
    /// each, the cluster gets N shards (repeat it: `--scale-ps-at 200:3 --scale-ps-at 400:2`).
    /// New shards join and slots (with their rows) move onto them; only shards added this
    /// way leave again (their slots move off first). Each move switches at a checkpoint
    /// round: needs a checkpoint directory; not with --replicas above 1.
    #[arg(long, value_name = "STEP:N")]
    pub scale_ps_at: Vec<sparta_launch::scale::ScaleEvent>,
    /// Training flags, as for `sparta train`.
    #[command(flatten)]
    pub train: TrainArgs,
}

fn random_token() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom for the cluster token")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Flags every PS gets after the ones the launcher sets.
fn ps_args(a: &LaunchArgs) -> Vec<OsString> {
    let mut v = os(&["--threads", &a.ps_threads.to_string()]);
    match a.dense.staleness {
        Some(k) => v.extend(os(&["--staleness", &k.to_string()])),
        None => v.extend(os(&["--mode", a.dense.mode.name()])),
    }
    if let Some(k) = a.dense.backup_workers {
        v.extend(os(&["--backup-workers", &k.to_string()]));
    }
    if let Some(b) = a.ps_memory_limit {
        v.extend(os(&["--memory-limit", &format!("{b}B")]));
    }
    if let (Some(c), Some(k)) = (&a.tls_cert, &a.tls_key) {
        v.extend(["--tls-cert".into(), c.into(), "--tls-key".into(), k.into()]);
        if a.replicas > 1 {
            // The shards' copies talk TLS among themselves, verified with the workers' CA.
            v.extend(tls_ca_args(a));
        }
    }
    v
}

/// `--tls-ca` (and `--tls-domain`) as given, for the processes that verify the shards.
fn tls_ca_args(a: &LaunchArgs) -> Vec<OsString> {
    let mut v = Vec::new();
    if let Some(ca) = &a.tls_ca {
        v.extend(["--tls-ca".into(), ca.into()]);
        if let Some(d) = &a.tls_domain {
            v.extend(os(&["--tls-domain", d]));
        }
    }
    v
}

/// Flags the coordinator of replicated shards gets after the ones the launcher sets: with
/// TLS, it serves the workers' route lookups with the shards' certificate and verifies them.
fn coordinator_args(a: &LaunchArgs) -> Vec<OsString> {
    let mut v = Vec::new();
    if let (Some(c), Some(k)) = (&a.tls_cert, &a.tls_key) {
        v.extend(["--tls-cert".into(), c.into(), "--tls-key".into(), k.into()]);
        v.extend(tls_ca_args(a));
    }
    v
}

/// Flags every worker gets after the ones the launcher sets.
fn worker_args(a: &LaunchArgs) -> Vec<OsString> {
    let mut v = os(&["--wire-compression", a.wire_compression.name()]);
    if a.ring_compression != Compression::None {
        v.extend(os(&["--ring-compression", a.ring_compression.name()]));
    }
    if let (Some(c), Some(k), true) = (
        &a.tls_cert,
        &a.tls_key,
        a.dense.mode == DenseMode::Allreduce,
    ) {
        // TLS on the ring too: each worker serves its link with the shards' certificate.
        v.extend([
            "--ring-tls-cert".into(),
            c.into(),
            "--ring-tls-key".into(),
            k.into(),
        ]);
    }
    if !a.train.kafka.is_empty() {
        // Every worker reads its partitions of the topic (p % workers == rank).
        v.push("--kafka".into());
        v.push(a.train.kafka.join(",").into());
        if let Some(t) = &a.train.topic {
            v.extend(os(&["--topic", t]));
        }
        if let Some(f) = &a.train.kafka_from {
            v.extend(os(&["--kafka-from", f]));
        }
        if a.train.kafka_drain {
            v.push("--kafka-drain".into());
        }
    } else if let Some(dir) = &a.train.follow {
        // Every worker follows the directory and reads its share of each file.
        v.extend(["--follow".into(), dir.into()]);
        if let Some(f) = &a.train.stop_file {
            v.extend(["--stop-file".into(), f.into()]);
        }
        if let Some(t) = a.train.follow_poll_secs {
            v.extend(os(&["--follow-poll-secs", &t.to_string()]));
        }
        if let Some(t) = a.train.follow_settle_secs {
            v.extend(os(&["--follow-settle-secs", &t.to_string()]));
        }
    } else {
        v.push("--train".into());
        v.extend(a.train.train.iter().map(OsString::from));
    }
    if !a.train.test.is_empty() {
        v.push("--test".into());
        v.extend(a.train.test.iter().map(OsString::from));
    }
    if let Some(k) = a.train.eval_every_steps {
        v.extend(os(&["--eval-every-steps", &k.to_string()]));
    }
    if let Some(t) = a.train.eval_every_secs {
        v.extend(os(&["--eval-every-secs", &t.to_string()]));
    }
    if a.train.quiet {
        v.push("--quiet".into());
    }
    if let Some(t) = a.train.progress_every_secs {
        v.extend(os(&["--progress-every-secs", &t.to_string()]));
    }
    if let Some(s) = a.ps_retry_secs {
        v.extend(os(&["--ps-retry-secs", &s.to_string()]));
    }
    // Every worker writes its own run, DIR/worker-<rank>.
    v.extend(a.train.tensorboard.forward());
    v.extend(tls_ca_args(a));
    v
}

/// Serves on `addr` the metrics of every child in `endpoints`, fetched at each scrape and
/// merged (each sample labelled with its `process`), with `sparta_launch_child_up` saying
/// which answered. Returns the runtime serving them (drop it to stop).
fn serve_children_metrics(
    addr: &str,
    endpoints: &sparta_launch::local::Endpoints,
) -> Result<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sparta-launch-metrics")
        .enable_all()
        .build()
        .context("starting the metrics runtime")?;
    let endpoints = std::sync::Arc::clone(endpoints);
    let render = move || {
        let children = endpoints.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut texts = Vec::new();
        let mut up = String::from(
            "# HELP sparta_launch_child_up Whether the child process answered this scrape \
             (1) or not (0: starting, restarting or gone).\n\
             # TYPE sparta_launch_child_up gauge\n",
        );
        for (process, addr) in children {
            let text = addr
                .parse()
                .ok()
                .and_then(|a| sparta_proto::exposition::fetch(a, SCRAPE_TIMEOUT).ok());
            up.push_str(&format!(
                "sparta_launch_child_up{{process=\"{process}\"}} {}\n",
                u8::from(text.is_some())
            ));
            if let Some(t) = text {
                texts.push((process, t));
            }
        }
        let merged = sparta_proto::exposition::merge(&texts);
        match merged.strip_suffix("# EOF\n") {
            Some(body) => format!("{body}{up}# EOF\n"),
            None => merged + &up,
        }
    };
    let bound = rt.block_on(sparta_proto::metrics::serve_exposition(
        addr,
        std::sync::Arc::new(render),
    ))?;
    println!("sparta launch metrics on http://{bound}/metrics (every PS and worker, merged)");
    Ok(rt)
}

/// How long one child's `/metrics` may take to answer a scrape of the launcher's.
const SCRAPE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `--scale-ps-at`: steps rising, never below `--ps` (the shards of the start hold the dense
/// vector and stay), checkpoints on.
fn check_scaling(a: &LaunchArgs, checkpoints: bool) -> Result<()> {
    if a.scale_ps_at.is_empty() {
        return Ok(());
    }
    if !checkpoints {
        bail!(
            "--scale-ps-at needs a checkpoint directory (--checkpoint-dir): shards join, leave \
             and take slots at checkpoint rounds"
        );
    }
    let mut step = 0;
    for e in &a.scale_ps_at {
        if e.step <= step && step > 0 || e.step == 0 {
            bail!(
                "--scale-ps-at steps must rise and be above 0 ({}:{})",
                e.step,
                e.shards
            );
        }
        if e.shards < a.num_ps {
            bail!(
                "--scale-ps-at {}:{}: the {} shards of the start hold the dense vector and stay; \
                 only shards added while training leave (resume a checkpoint with fewer --ps \
                 instead)",
                e.step,
                e.shards,
                a.num_ps
            );
        }
        step = e.step;
    }
    Ok(())
}

/// `sparta launch`.
pub fn run(a: LaunchArgs) -> Result<()> {
    if a.replicas == 0 || a.replicas > a.num_ps {
        anyhow::bail!(
            "--replicas {} must be between 1 and --ps {} (every copy of a shard lives on its own \
             PS process)",
            a.replicas,
            a.num_ps
        );
    }
    if a.num_ps == 0 || a.workers == 0 {
        bail!("--ps and --workers must be at least 1");
    }
    let cfg = job_config(&a.train)?;
    cfg.validate()?;
    check_scaling(&a, cfg.train.checkpoint_dir.is_some())?;
    a.dense.resolve(cfg.train.backup_workers, a.workers)?;
    super::train::ensure_cluster_online(&a.train, &cfg, "sparta launch")?;
    let online = a.train.follow.is_some() || !a.train.kafka.is_empty();
    if online && a.dense.staleness.is_none() && a.dense.mode == DenseMode::Allreduce {
        bail!(
            "--mode allreduce steps every worker together, which online input (--follow, \
             --kafka) does not: a worker waiting for data would hold the ring; use --mode \
             async or sync"
        );
    }
    // The workers get the Kafka flags as given: check them here, before anything starts.
    super::train::kafka_options(&a.train, &std::sync::Arc::default())?;
    let token = match std::env::var("SPARTA_TOKEN") {
        Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
        _ => random_token()?,
    };
    let scale = match a.scale_ps_at.is_empty() {
        true => None,
        false => Some(sparta_launch::scale::ScalePlan {
            events: a.scale_ps_at.clone(),
            ops: std::sync::Arc::new(super::scale_ps::RpcScaleOps {
                token: token.clone(),
                tls: sparta_proto::ClientTls::from_flag(a.tls_ca.as_deref(), a.tls_domain.clone())?,
                step_wait: std::time::Duration::from_secs(600),
            }),
        }),
    };
    let spec = sparta_launch::Spec {
        exe: std::env::current_exe().context("locating this executable")?,
        num_ps: a.num_ps,
        workers: a.workers,
        job_toml: toml::to_string(&cfg).context("writing the job config")?,
        ps_args: ps_args(&a),
        coordinator_args: coordinator_args(&a),
        worker_args: worker_args(&a),
        token,
        checkpoint_dir: cfg.train.checkpoint_dir.clone(),
        resume: a
            .train
            .resume
            .is_some()
            .then(|| super::train::resume_policy(&a.train)),
        max_restarts: a.max_restarts,
        ring: a.dense.staleness.is_none() && a.dense.mode == DenseMode::Allreduce,
        replicas: a.replicas,
        metrics: a.train.metrics_listen.as_ref().map(|_| Default::default()),
        scale,
    };
    // Kept until the job summary is written.
    let _metrics = match (&a.train.metrics_listen, &spec.metrics) {
        (Some(addr), Some(endpoints)) => Some(serve_children_metrics(addr, endpoints)?),
        _ => None,
    };
    let job = sparta_launch::launch(&spec)?;
    if let Some(path) = &a.train.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&job)? + "\n")
            .with_context(|| format!("writing summary to {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "job: {} PS, {} worker(s), {} train rows in {:.2}s ({:.0} samples/s), {} samples trained, \
         restarts ps {} worker {}, rollbacks {}, test AUC {}",
        a.num_ps,
        a.workers,
        job["train_rows"],
        job["job_wall_seconds"].as_f64().unwrap_or(0.0),
        job["train_samples_per_sec"].as_f64().unwrap_or(0.0),
        job["samples_trained"],
        job["restarts"]["ps"],
        job["restarts"]["worker"],
        job["rollbacks"],
        job["test_auc"]
    );
    if a.replicas > 1 {
        let _ = writeln!(
            out,
            "replicas {}: failovers {}, rejoins {}, backups dropped {}",
            a.replicas, job["failovers"], job["rejoins"], job["dropped_backups"]
        );
    }
    let _ = out.flush();
    Ok(())
}
