//! `sparta train`: on a list of files, or online on a followed directory with serving exports.

pub(crate) mod online;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sparta_core::config::Format;
use sparta_core::JobConfig;
use sparta_worker::{FollowOptions, RunOptions, Summary, Trainer};

/// Flags of `sparta train`; each overrides the same setting of `--config`.
#[derive(Args, Debug, Clone, Default)]
pub struct TrainArgs {
    /// Job config (TOML); flags override its values.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Model: wdl, deepfm, dcn, dcnv2, dlrm, din, mmoe or esmm.
    #[arg(long)]
    pub model: Option<String>,
    /// An objective, replacing the config's [[tasks]] (repeat for several):
    /// NAME=LABEL[,weight=W][,after=TASK], e.g. --task ctr=label --task
    /// ctcvr=conversion,after=ctr.
    #[arg(long = "task", value_name = "NAME=LABEL[,weight=W][,after=TASK]")]
    pub tasks: Vec<String>,
    /// Training files (plain or gzip), read in order.
    #[arg(
        long,
        num_args = 1..,
        required_unless_present_any = ["follow", "kafka"],
        conflicts_with_all = ["follow", "kafka"]
    )]
    pub train: Vec<PathBuf>,
    /// Train on the files of this directory as a log shipper writes them, in name order,
    /// until --stop-file appears or SIGINT/SIGTERM (dotfiles and *.tmp are ignored; a file is
    /// read once a later one exists or it has not changed for --follow-settle-secs).
    #[arg(long)]
    pub follow: Option<PathBuf>,
    /// Train on the records of a Kafka topic (--topic) from these bootstrap brokers
    /// (host:port, comma separated): one record = one line of the input layout, every
    /// partition, until SIGINT/SIGTERM (or --kafka-drain). Checkpoints save every partition's
    /// next offset: --resume continues at exactly the next record.
    #[arg(
        long,
        value_delimiter = ',',
        requires = "topic",
        conflicts_with = "follow"
    )]
    pub kafka: Vec<String>,
    /// With --kafka: the topic to train on.
    #[arg(long, requires = "kafka")]
    pub topic: Option<String>,
    /// With --kafka: where partitions without a saved offset start: earliest (their first
    /// record kept by the broker) or latest (only records written from now on)
    /// [default: earliest].
    #[arg(long)]
    pub kafka_from: Option<String>,
    /// With --kafka: stop once every partition is read up to the end it had at the start (a
    /// backfill), instead of following the topic.
    #[arg(long)]
    pub kafka_drain: bool,
    /// With --follow: when this file exists, train on the files present, then stop.
    #[arg(long)]
    pub stop_file: Option<PathBuf>,
    /// With --follow: seconds between directory listings [default: 1].
    #[arg(long)]
    pub follow_poll_secs: Option<f64>,
    /// With --follow: the newest file is complete once unchanged for this many seconds
    /// [default: 10].
    #[arg(long)]
    pub follow_settle_secs: Option<f64>,
    /// Write serving exports into this directory (versioned; the first full, then deltas),
    /// at the end of training and as --export-every-steps / --export-every-secs say.
    #[arg(long)]
    pub export_dir: Option<PathBuf>,
    /// Export every K steps while training.
    #[arg(long)]
    pub export_every_steps: Option<u64>,
    /// Export when T seconds passed since the last export (checked after every step, and
    /// while --follow waits for files).
    #[arg(long)]
    pub export_every_secs: Option<f64>,
    /// Store exported weights as half floats.
    #[arg(long)]
    pub export_fp16: bool,
    /// Export only rows pulled at least N times (needs eviction with min_count).
    #[arg(long)]
    pub export_min_count: Option<u32>,
    /// A full export after this many deltas.
    #[arg(long)]
    pub export_full_every: Option<u32>,
    /// Rows to score with the final model (after the final export): see --predict-out.
    #[arg(long, num_args = 1.., requires = "predict_out")]
    pub predict_input: Vec<PathBuf>,
    /// Write one probability per valid row of --predict-input here, in input order.
    #[arg(long, requires = "predict_input")]
    pub predict_out: Option<PathBuf>,
    /// Test files to evaluate on after training.
    #[arg(long, num_args = 1..)]
    pub test: Vec<PathBuf>,
    /// Also evaluate on --test during training, after every this many steps (each recorded
    /// in the summary's `evaluations`).
    #[arg(long, requires = "test", value_parser = clap::value_parser!(u64).range(1..))]
    pub eval_every_steps: Option<u64>,
    /// Also evaluate on --test during training, once this many seconds passed since the last
    /// evaluation.
    #[arg(long, requires = "test")]
    pub eval_every_secs: Option<f64>,
    /// Input layout: criteo or avazu (a custom layout goes in the config's [data.schema]).
    #[arg(long)]
    pub format: Option<String>,
    /// Samples per step.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Passes over the training files.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Compute threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Parser threads (default: one per core).
    #[arg(long)]
    pub reader_threads: Option<usize>,
    /// Arithmetic of the dense GEMMs: f32 (default) or bf16 (mixed precision: operands rounded
    /// to bfloat16, f32 sums and parameters; AMX tiles where the CPU has AMX-BF16).
    #[arg(long)]
    pub precision: Option<sparta_nn::Precision>,
    /// Seed of all initialisers.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Parse all training data into memory first (to time the training loop alone).
    #[arg(long)]
    pub preload: bool,
    /// Stop after this many training rows per epoch.
    #[arg(long)]
    pub max_rows: Option<u64>,
    /// Write checkpoints into this directory.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (default: only at the end of training).
    #[arg(long)]
    pub checkpoint_every_steps: Option<u64>,
    /// Continue from the newest valid checkpoint in this directory (and keep checkpointing
    /// there unless --checkpoint-dir says otherwise). Finding none is an error unless
    /// --resume-if-present is given.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// With --resume: start fresh when the directory is missing or holds no checkpoint at all
    /// (checkpoints that exist but none of which restores stay an error).
    #[arg(long, requires = "resume")]
    pub resume_if_present: bool,
    /// Overlap embedding lookups and pushes with the dense compute (the default for an
    /// embedded job on files; this flag turns it on for --follow, --kafka and cluster workers
    /// too): each batch trains on rows one batch behind, the same in every run.
    #[arg(long, conflicts_with = "exact")]
    pub pipeline: bool,
    /// The sequential loop: every batch trains on rows holding all earlier updates (no
    /// pipeline), so a run resumed after any interruption equals an uninterrupted one bit for
    /// bit.
    #[arg(long)]
    pub exact: bool,
    /// Write the run summary as JSON here.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// No progress bar or progress log lines.
    #[arg(long)]
    pub quiet: bool,
    /// Seconds between progress log lines when stderr is not a terminal (on a terminal: a
    /// bar) [default: 5].
    #[arg(long, conflicts_with = "quiet")]
    pub progress_every_secs: Option<f64>,
    #[command(flatten)]
    pub tensorboard: super::flags::TensorboardFlags,
    /// Serve Prometheus `/metrics` and `/health` here while training (step, samples, loss,
    /// progressive metrics per task, last checkpoint and export, input counters; port 0: a
    /// free one, printed). `sparta launch`: every PS's and worker's metrics, merged into one
    /// exposition with a `process` label (ps0, w1, ...), and `sparta_launch_child_up`.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
}

/// Refuses flags that would have no effect: the follow settings without `--follow`.
fn refuse_unused(a: &TrainArgs) -> Result<()> {
    if a.follow.is_none() {
        let unused = [
            ("--stop-file", a.stop_file.is_some()),
            ("--follow-poll-secs", a.follow_poll_secs.is_some()),
            ("--follow-settle-secs", a.follow_settle_secs.is_some()),
        ];
        if let Some((flag, _)) = unused.iter().find(|(_, set)| *set) {
            anyhow::bail!("{flag} has no effect without --follow");
        }
    }
    if a.kafka.is_empty() {
        let unused = [
            ("--kafka-from", a.kafka_from.is_some()),
            ("--kafka-drain", a.kafka_drain),
        ];
        if let Some((flag, _)) = unused.iter().find(|(_, set)| *set) {
            anyhow::bail!("{flag} has no effect without --kafka");
        }
    }
    Ok(())
}

/// Builds the job config from `--config` plus flag overrides.
pub fn job_config(a: &TrainArgs) -> Result<JobConfig> {
    refuse_unused(a)?;
    let mut cfg = match &a.config {
        Some(p) => JobConfig::from_file(p)?,
        None => JobConfig::default(),
    };
    if let Some(m) = &a.model {
        cfg.model.kind =
            serde_json::from_value(serde_json::Value::String(m.clone())).map_err(|_| {
                anyhow::anyhow!(
                    "--model {m:?}: expected wdl, deepfm, dcn, dcnv2, dlrm, din, mmoe or esmm"
                )
            })?;
    }
    if !a.tasks.is_empty() {
        cfg.tasks = a
            .tasks
            .iter()
            .map(|t| parse_task(t))
            .collect::<Result<_>>()?;
    }
    if let Some(f) = &a.format {
        cfg.data.format = match f.as_str() {
            "criteo" => Format::Criteo,
            "avazu" => Format::Avazu,
            other => anyhow::bail!(
                "--format {other:?}: expected criteo or avazu (custom layouts: [data.schema] in --config)"
            ),
        };
    }
    if let Some(v) = a.batch_size {
        cfg.data.batch_size = v;
    }
    if let Some(v) = a.epochs {
        cfg.train.epochs = v;
    }
    if let Some(v) = a.threads {
        cfg.train.threads = v;
    }
    if let Some(v) = a.reader_threads {
        cfg.data.reader_threads = v;
    }
    if let Some(p) = a.precision {
        cfg.model.precision = p;
    }
    if let Some(v) = a.seed {
        cfg.train.seed = v;
    }
    if a.preload {
        cfg.train.preload = true;
    }
    if a.max_rows.is_some() {
        cfg.train.max_rows = a.max_rows;
    }
    if a.exact {
        cfg.train.pipeline = Some(false);
    }
    if a.pipeline {
        cfg.train.pipeline = Some(true);
    }
    if let Some(d) = a.checkpoint_dir.as_ref().or(a.resume.as_ref()) {
        cfg.train.checkpoint_dir = Some(d.clone());
    }
    if let Some(k) = a.checkpoint_every_steps {
        anyhow::ensure!(
            k > 0,
            "--checkpoint-every-steps 0: expected a number of steps >= 1 (leave the flag out \
             for checkpoints at the end of training only)"
        );
        cfg.train.checkpoint_every_steps = k;
    }
    let e = &mut cfg.export;
    if let Some(d) = &a.export_dir {
        e.dir = Some(d.clone());
    }
    if let Some(k) = a.export_every_steps {
        e.every_steps = k;
    }
    if let Some(t) = a.export_every_secs {
        e.every_secs = t;
    }
    if a.export_fp16 {
        e.fp16 = true;
    }
    if let Some(n) = a.export_min_count {
        e.min_count = n;
    }
    if let Some(n) = a.export_full_every {
        e.full_every = n;
    }
    Ok(cfg)
}

/// Parses `--task NAME=LABEL[,weight=W][,after=TASK]`.
fn parse_task(text: &str) -> Result<sparta_core::config::TaskSection> {
    let bad =
        |why: &str| anyhow::anyhow!("--task {text:?}: {why} (NAME=LABEL[,weight=W][,after=TASK])");
    let mut parts = text.split(',');
    let head = parts.next().unwrap_or_default();
    let (name, label) = head
        .split_once('=')
        .ok_or_else(|| bad("expected NAME=LABEL first"))?;
    if name.is_empty() || label.is_empty() {
        return Err(bad("empty name or label"));
    }
    let mut t = sparta_core::config::TaskSection {
        name: name.to_string(),
        label: Some(label.to_string()),
        weight: 1.0,
        after: None,
    };
    for p in parts {
        match p.split_once('=') {
            Some(("weight", w)) => {
                t.weight = w
                    .parse()
                    .map_err(|_| bad(&format!("weight {w:?} is not a number")))?
            }
            Some(("after", a)) if !a.is_empty() => t.after = Some(a.to_string()),
            _ => return Err(bad(&format!("unknown part {p:?}"))),
        }
    }
    Ok(t)
}

/// A flag of `sparta train` that a PS cluster (`sparta worker`, `sparta launch`) refuses:
/// [`ensure_cluster_online`] refuses it and [`hide_cluster_refused`] leaves it (and the flags
/// that only go with it) out of those commands' `--help`.
pub struct ClusterRefusal {
    /// The flag, as on the command line.
    pub flag: &'static str,
    /// The flags that only go with it (clap refuses them without it), as on the command line.
    pub with: &'static [&'static str],
    /// Whether the flags give it.
    set: fn(&TrainArgs) -> bool,
    /// Why, and what to do instead.
    why: &'static str,
}

/// Every flag of `sparta train` a PS cluster refuses.
pub const CLUSTER_REFUSED: [ClusterRefusal; 1] = [ClusterRefusal {
    flag: "--predict-out",
    with: &["--predict-input"],
    set: |a| a.predict_out.is_some(),
    why: "score the cluster's export with `sparta predict --model EXPORT_DIR`",
}];

/// `c` (`sparta worker` or `sparta launch`) without the refused flags of [`CLUSTER_REFUSED`]
/// in its `--help`, which names them after the options instead. They still parse, so that
/// giving one is refused with the reason.
pub fn hide_cluster_refused(mut c: clap::Command) -> clap::Command {
    let mut names = Vec::new();
    for r in &CLUSTER_REFUSED {
        for flag in std::iter::once(&r.flag).chain(r.with) {
            let id = flag.trim_start_matches("--").replace('-', "_");
            c = c.mut_arg(id, |a| a.hide(true));
            names.push(*flag);
        }
    }
    c.after_help(format!(
        "Not taken by a PS cluster (embedded `sparta train` only): {}",
        names.join(", ")
    ))
}

/// Refuses what a PS cluster (`command`: a worker or the launcher) does not do
/// ([`CLUSTER_REFUSED`]: predictions after training; the pipelined loop on a Kafka topic)
/// and checks the job ([`sparta_cluster::check_job`]: exports without checkpoints; a cluster
/// exports at its checkpoint rounds).
pub fn ensure_cluster_online(a: &TrainArgs, cfg: &JobConfig, command: &str) -> Result<()> {
    if let Some(r) = CLUSTER_REFUSED.iter().find(|r| (r.set)(a)) {
        anyhow::bail!(
            "{} is supported by embedded `sparta train` only, not by `{command}` ({})",
            r.flag,
            r.why
        );
    }
    if !a.kafka.is_empty() && cfg.train.pipeline == Some(true) {
        anyhow::bail!(
            "--pipeline (train.pipeline) with --kafka is not supported by `{command}`: a worker \
             whose partitions are quiet joins the other workers' checkpoint round between \
             batches, which the pipelined loop does not do"
        );
    }
    sparta_cluster::check_job(cfg)?;
    Ok(())
}

fn secs(flag: &str, v: f64) -> Result<Duration> {
    anyhow::ensure!(
        v.is_finite() && v >= 0.0,
        "{flag} {v}: expected a number of seconds >= 0"
    );
    Ok(Duration::from_secs_f64(v))
}

/// The follow options of the flags; `stop` ends following gracefully (SIGINT/SIGTERM).
pub fn follow_options(a: &TrainArgs, stop: &Arc<AtomicBool>) -> Result<Option<FollowOptions>> {
    let Some(dir) = &a.follow else {
        return Ok(None);
    };
    let poll = secs("--follow-poll-secs", a.follow_poll_secs.unwrap_or(1.0))?;
    anyhow::ensure!(!poll.is_zero(), "--follow-poll-secs must be above 0");
    let stop = Arc::clone(stop);
    Ok(Some(FollowOptions {
        poll,
        settle: secs("--follow-settle-secs", a.follow_settle_secs.unwrap_or(10.0))?,
        stop_file: a.stop_file.clone(),
        stop,
        ..FollowOptions::new(dir)
    }))
}

/// The Kafka options of the flags (`None` without `--kafka`); `stop` ends training gracefully.
pub fn kafka_options(
    a: &TrainArgs,
    stop: &Arc<AtomicBool>,
) -> Result<Option<sparta_worker::KafkaOptions>> {
    use sparta_data::kafka::StartAt;
    if a.kafka.is_empty() {
        return Ok(None);
    }
    let from = match a.kafka_from.as_deref() {
        None | Some("earliest") => StartAt::Earliest,
        Some("latest") => StartAt::Latest,
        Some(other) => anyhow::bail!("--kafka-from {other:?}: expected earliest or latest"),
    };
    let brokers: Vec<String> = a.kafka.iter().map(|b| b.trim().to_string()).collect();
    if let Some(b) = brokers.iter().find(|b| !b.contains(':')) {
        anyhow::bail!("--kafka {b:?}: expected host:port");
    }
    Ok(Some(sparta_worker::KafkaOptions {
        brokers,
        topic: a.topic.clone().context("--kafka needs --topic")?,
        from,
        drain: a.kafka_drain,
        stop: Arc::clone(stop),
        // Set by a cluster worker from its PS mode; an embedded job reads every partition.
        idle_without_partitions: false,
    }))
}

/// What `--resume` does without a checkpoint to restore.
pub fn resume_policy(a: &TrainArgs) -> sparta_checkpoint::ResumePolicy {
    if a.resume_if_present {
        sparta_checkpoint::ResumePolicy::IfPresent
    } else {
        sparta_checkpoint::ResumePolicy::Required
    }
}

/// The training inputs as the log names them: `3 file(s)`, and with object URLs the objects
/// each one names (a prefix or a glob: several), listed once for the line:
/// `5 file(s) (s3://b/logs/: 4 objects)`. A URL that cannot be listed (the reader then says
/// why) leaves the count open: `2 input(s) (s3://b/logs/)`.
pub fn describe_inputs(paths: &[PathBuf]) -> String {
    use sparta_data::object::{ObjectClient, ObjectOptions};
    let urls: Vec<&PathBuf> = paths.iter().filter(|p| sparta_data::is_url(p)).collect();
    if urls.is_empty() {
        return format!("{} file(s)", paths.len());
    }
    let client = ObjectOptions::from_env().and_then(ObjectClient::new).ok();
    let mut files = Some(paths.len() - urls.len());
    let mut notes = Vec::with_capacity(urls.len());
    for url in urls {
        match client.as_ref().map(|c| c.expand(url)) {
            Some(Ok(objects)) => {
                files = files.map(|f| f + objects.len());
                let s = if objects.len() == 1 { "" } else { "s" };
                notes.push(format!("{}: {} object{s}", url.display(), objects.len()));
            }
            _ => {
                files = None;
                notes.push(url.display().to_string());
            }
        }
    }
    match files {
        Some(n) => format!("{n} file(s) ({})", notes.join(", ")),
        None => format!("{} input(s) ({})", paths.len(), notes.join(", ")),
    }
}

/// Trains, evaluates, prints and writes the summary.
pub fn train_and_report(a: &TrainArgs) -> Result<Summary> {
    let job = job_config(a)?.validate()?;
    match &a.follow {
        None if !a.kafka.is_empty() => tracing::info!(
            "training {} on Kafka topic {} at {}, batch {}, {} thread(s)",
            job.model.kind.name(),
            a.topic.as_deref().unwrap_or_default(),
            a.kafka.join(","),
            job.reader.batch_size,
            job.threads
        ),
        Some(dir) => tracing::info!(
            "training {} on the files of {}, batch {}, {} thread(s)",
            job.model.kind.name(),
            dir.display(),
            job.reader.batch_size,
            job.threads
        ),
        None => tracing::info!(
            "training {} on {}, batch {}, {} thread(s)",
            job.model.kind.name(),
            describe_inputs(&a.train),
            job.reader.batch_size,
            job.threads
        ),
    }
    let export = job.raw.export.clone();
    let job_members = job.features.members();
    let mut trainer = match &a.resume {
        Some(dir) => Trainer::embedded_resume(job, dir, resume_policy(a))?,
        None => Trainer::embedded(job)?,
    };
    trainer.set_progress(crate::progress::for_stderr(a.progress_every_secs)?);
    // SIGINT/SIGTERM: finish the step, write the final checkpoint, exports and summary, exit
    // 0 (on files or following a directory); a second signal aborts.
    let stop = crate::signals::stop_on_signals()?;
    trainer.stop_on(Arc::clone(&stop));
    if export.dir.is_some() {
        trainer.add_hook(Box::new(online::ExportHook::open(&export, job_members)?))?;
    }
    if let Some(hook) = a.tensorboard.hook(None)? {
        trainer.add_hook(hook)?;
    }
    // Kept until the summary is written: a scraper reads the final figures meanwhile.
    let _metrics = match &a.metrics_listen {
        Some(addr) => {
            let m = sparta_cluster::live_metrics::serve_embedded(&mut trainer, addr)?;
            println!("sparta train metrics on http://{}/metrics", m.addr);
            Some(m)
        }
        None => None,
    };
    let opts = RunOptions {
        train: a.train.clone(),
        test: a.test.clone(),
        progress: !a.quiet,
        follow: follow_options(a, &stop)?,
        eval_every_steps: a.eval_every_steps.unwrap_or(0),
        eval_every_secs: a.eval_every_secs.unwrap_or(0.0),
    };
    let summary = match kafka_options(a, &stop)? {
        Some(k) => trainer.run_kafka(&k, &opts)?,
        None => trainer.run(&opts)?,
    };
    print_summary(&summary);
    if let Some(out) = &a.predict_out {
        let reader = sparta_data::ReaderConfig {
            threads: 1,
            epochs: 1,
            max_rows: None,
            ..trainer.job().reader.clone()
        };
        let (_, probs, bad) = trainer.predict_files(&a.predict_input, &reader)?;
        let names = trainer.job().model.task_names();
        online::write_predictions(out, &probs, names.len())?;
        println!(
            "predictions: {} rows scored with the final model into {} ({}; {bad} malformed lines \
             skipped)",
            probs.len() / names.len(),
            out.display(),
            names.join("\t")
        );
    }
    if let Some(path) = &a.summary_json {
        let text = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("writing summary to {}", path.display()))?;
    }
    Ok(summary)
}

/// The human-readable end-of-run report.
pub fn print_summary(s: &Summary) {
    println!(
        "model {}: {} train rows in {:.2}s ({:.0} samples/s end to end, {:.0} samples/s training loop, dense {:.1} GFLOP/s)",
        s.model, s.train_rows, s.train_seconds, s.train_samples_per_sec, s.loop_samples_per_sec, s.dense_gflops
    );
    println!(
        "stages: read {:.2}s pull {:.2}s dense {:.2}s push {:.2}s | {} table rows, peak RSS {:.0} MiB, {} bad lines",
        s.stage_seconds.read,
        s.stage_seconds.pull,
        s.stage_seconds.dense,
        s.stage_seconds.push,
        s.table_rows,
        s.peak_rss_bytes as f64 / (1 << 20) as f64,
        s.bad_lines
    );
    if let Some(slow) = s.slowest_steps.first() {
        let list: Vec<String> = s
            .slowest_steps
            .iter()
            .map(|w| format!("#{} {:.2}s", w.step, w.seconds))
            .collect();
        println!(
            "steps: median {:.1} ms, slowest {} (the longest at {:.1}s into training)",
            s.step_seconds_median * 1e3,
            list.join(", "),
            slow.at_seconds
        );
    }
    if s.evicted_rows > 0 {
        println!("eviction: {} rows evicted while training", s.evicted_rows);
    }
    if s.stopped_early {
        println!(
            "stopped on a signal after {} samples ({}): --resume continues at the next row",
            s.samples_trained,
            s.last_checkpoint
                .as_deref()
                .map_or("no checkpoint directory".to_string(), |c| format!(
                    "final checkpoint {c}"
                ))
        );
    }
    if let Some(p) = s.input_position.as_ref().filter(|p| !p.file.is_empty()) {
        println!(
            "input position: {} rows; next line at byte {} of {}",
            p.rows_consumed, p.byte_offset, p.file
        );
    }
    if let Some(p) = s.input_position.as_ref().filter(|p| !p.topic.is_empty()) {
        let next: Vec<String> = p.kafka.iter().map(|(q, o)| format!("{q}@{o}")).collect();
        println!(
            "input position: {} rows; topic {} next offsets (partition@offset) {}",
            p.rows_consumed,
            p.topic,
            next.join(" ")
        );
    }
    println!(
        "input: {:.1} MiB read, {:.0} records/s",
        s.input.text_bytes as f64 / (1 << 20) as f64,
        s.input.rows_per_sec
    );
    if let Some(e) = &s.exports {
        println!(
            "exports: {} version(s) into {} ({} full), last v{}, {:.2}s exporting",
            e.count,
            e.dir,
            e.full,
            e.last_version.map_or("-".into(), |v| v.to_string()),
            e.seconds
        );
    }
    if let (Some(auc), Some(ll)) = (s.test_auc, s.test_logloss) {
        println!(
            "test: {} rows, AUC {:.4}, logloss {:.4}, positive rate {:.4}, calibration {:.3}",
            s.test_rows,
            auc,
            ll,
            s.test_positive_rate.unwrap_or(f64::NAN),
            s.test_calibration.unwrap_or(f64::NAN)
        );
        if let (Some(g), Some(n)) = (s.test_gauc, s.test_gauc_groups) {
            println!("test: GAUC {g:.4} over {n} groups with both classes");
        }
    }
    for (name, t) in &s.test_tasks {
        println!(
            "test {name}: AUC {:.4}, logloss {:.4}, positive rate {:.4}, calibration {:.3}{}",
            t.auc,
            t.logloss,
            t.positive_rate,
            t.calibration,
            t.gauc.map_or(String::new(), |g| format!(", GAUC {g:.4}"))
        );
    }
    if !s.evaluations.is_empty() {
        println!("evaluations during training: {}", s.evaluations.len());
    }
    if let Some(p) = &s.progressive {
        for t in &p.tasks {
            println!(
                "progressive {}: window of {} rows AUC {:.4} logloss {:.4} calibration {:.3}; \
                 all {} rows AUC {:.4} logloss {:.4}",
                t.task,
                t.window.rows,
                t.window.auc,
                t.window.logloss,
                t.window.calibration,
                t.cumulative.rows,
                t.cumulative.auc,
                t.cumulative.logloss
            );
        }
    }
}

/// `sparta train`.
pub fn run(a: TrainArgs) -> Result<()> {
    train_and_report(&a).map(|_| ())
}
