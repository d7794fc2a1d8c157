//! `sparta forget`: removes given raw feature values (right to erasure) from every table that
//! holds them, on a running PS cluster (`--ps`), or offline in a stopped job's checkpoint
//! directory and serving export directory (embedded or cluster).
//!
//! The ids file holds one value per line: `FEATURE<TAB>VALUE` (a `[[features]]` name, or the
//! column name such as `C3` in a job without `[[features]]`), or a bare `VALUE` meaning every
//! `id`, `bag` and `sequence` feature. Each becomes the (table, key) pairs training gives it
//! ([`sparta_core::forget::keys_of`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use sparta_core::{Job, JobConfig};

use super::flags::TokenFlags;

/// Flags of `sparta forget`.
#[derive(Args, Debug, Clone)]
pub struct ForgetArgs {
    /// Job config (TOML): the same file the PS shards (or the trainer) were given; its
    /// features map each value to its tables and keys (default: with --ps the default job,
    /// offline the config the checkpoint or export was written with).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The values to forget, one a line: FEATURE<TAB>VALUE, or a bare VALUE (every id, bag and
    /// sequence feature); empty lines are skipped.
    #[arg(long)]
    pub ids: PathBuf,
    /// A running cluster: every PS address in shard order, comma separated. Each shard's
    /// primary removes the keys and forwards the removal to its backups.
    #[arg(long, value_delimiter = ',', required_unless_present_any = ["checkpoint_dir", "export_dir"],
          conflicts_with_all = ["checkpoint_dir", "export_dir"])]
    pub ps: Vec<String>,
    /// With --ps: the coordinator of a replicated cluster; requests follow each shard's
    /// primary.
    #[arg(long, requires = "ps")]
    pub coordinator: Option<String>,
    #[command(flatten)]
    pub token: TokenFlags,
    /// With --ps: talk TLS to the PS, trusting this CA certificate (PEM).
    #[arg(long, requires = "ps")]
    pub tls_ca: Option<PathBuf>,
    /// Name the PS certificates must carry (default: the host of each --ps address).
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
    /// Offline (a stopped job, embedded or cluster): a checkpoint directory; its newest valid
    /// checkpoint is loaded, the values removed and the next checkpoint of its chain written
    /// (a resume no longer has them).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Offline (no trainer writing it): a serving export directory; a delta version removing
    /// the values is written on top of its newest version (a running `sparta serve` drops them
    /// at its next poll).
    #[arg(long)]
    pub export_dir: Option<PathBuf>,
    /// Print the counts as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The keys to forget, per physical table (in the job's table order), and how many values
/// the file named.
pub struct Forget {
    /// Keys per physical table, each sorted and distinct.
    pub keys: Vec<Vec<u64>>,
    /// Values read (non-empty lines).
    pub values: usize,
}

/// Reads the ids file `path` and maps each value through `job`'s features. Errors name the
/// file and the line.
pub fn read_ids(job: &Job, path: &Path) -> Result<Forget> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = String::from_utf8(text)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text: {e}", path.display()))?;
    let mut sets = vec![BTreeSet::new(); job.features.physical.len()];
    let mut values = 0;
    for (i, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let (feature, value) = match line.split_once('\t') {
            Some((f, v)) => (Some(f), v),
            None => (None, line),
        };
        let pairs = sparta_core::forget::keys_of(&job.features, feature, value)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        for (t, k) in pairs {
            sets[t].insert(k);
        }
        values += 1;
    }
    Ok(Forget {
        keys: sets.into_iter().map(|s| s.into_iter().collect()).collect(),
        values,
    })
}

/// One place's report: values and keys named, rows removed per table, what was written.
type Report = serde_json::Map<String, serde_json::Value>;

/// `sparta forget`.
pub fn run(a: ForgetArgs) -> Result<()> {
    let cfg = a.config.as_deref().map(JobConfig::from_file).transpose()?;
    if !a.ps.is_empty() {
        let job = cfg.unwrap_or_default().validate()?;
        let forget = read_ids(&job, &a.ids)?;
        let names = table_names(&job);
        let (removed, shards) = forget_on_cluster(&a, &job, &forget)?;
        let mut report = counts(&names, &forget, &removed);
        report.insert(
            "shards".into(),
            shards
                .iter()
                .map(|(s, r)| serde_json::json!({"shard": s, "removed": per_table(&names, r)}))
                .collect::<Vec<_>>()
                .into(),
        );
        let text = vec![(String::from("the cluster"), report.clone())];
        return print_report(&a, report.into(), text);
    }
    let mut done = Vec::new();
    let mut json = serde_json::Map::new();
    if let Some(dir) = &a.checkpoint_dir {
        let (what, report) = forget_in_checkpoint(dir, cfg.as_ref(), &a.ids)
            .with_context(|| format!("forgetting in checkpoint directory {}", dir.display()))?;
        json.insert("checkpoint".into(), report.clone().into());
        done.push((what, report));
    }
    if let Some(dir) = &a.export_dir {
        let (what, report) = forget_in_export(dir, cfg.as_ref(), &a.ids)
            .with_context(|| format!("forgetting in export directory {}", dir.display()))?;
        json.insert("export".into(), report.clone().into());
        done.push((what, report));
    }
    print_report(&a, json.into(), done)
}

/// The job: `cfg` when given, else the one a checkpoint or an export was written with.
fn job_of(cfg: Option<&JobConfig>, saved: &str, what: &str) -> Result<Job> {
    let raw = match cfg {
        Some(c) => c.clone(),
        None => JobConfig::from_toml(saved).with_context(|| format!("the job config of {what}"))?,
    };
    Ok(raw.validate()?)
}

fn table_names(job: &Job) -> Vec<String> {
    job.features
        .physical
        .iter()
        .map(|p| p.config.name.clone())
        .collect()
}

/// The report of one place forgotten in: values and keys named, rows removed per table.
fn counts(names: &[String], forget: &Forget, removed: &[u64]) -> Report {
    let mut m = serde_json::Map::new();
    m.insert("values".into(), forget.values.into());
    m.insert("keys".into(), per_table(names, &lens(&forget.keys)));
    m.insert("removed".into(), per_table(names, removed));
    m.insert("removed_total".into(), removed.iter().sum::<u64>().into());
    m
}

/// Offline: the newest valid checkpoint of `dir` (an embedded job's, or a stopped cluster
/// job's: every shard's part) without the values, written as the next checkpoint of its chain
/// (incremental: the removals as tombstones; full when the chain cannot be extended), with
/// the same step, positions and dense state. Returns what was written and the report.
fn forget_in_checkpoint(
    dir: &Path,
    cfg: Option<&JobConfig>,
    ids: &Path,
) -> Result<(String, Report)> {
    use sparta_checkpoint::{CheckpointError, CheckpointKind, Checkpointer, DenseState};
    let storage = sparta_checkpoint::open_dir(dir)?;
    let restored = sparta_checkpoint::restore_latest(storage.as_ref(), |_, cfg| {
        // A fresh table of the saved config (the store's only handle on it is dropped).
        let store = sparta_core::LocalStore::from_configs(std::slice::from_ref(cfg))?;
        let table = std::sync::Arc::clone(&store.tables()[0]);
        drop(store);
        std::sync::Arc::try_unwrap(table)
            .map_err(|_| sparta_core::CoreError::Config("a restored table is shared".into()))
    })?
    .ok_or_else(|| anyhow::anyhow!("no valid checkpoint in {}", dir.display()))?;
    let what = format!("checkpoint {}", restored.id);
    let job = job_of(cfg, &restored.job_config, &what)?;
    restored
        .check_members(&job.features.members())
        .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    let forget = read_ids(&job, ids)?;
    let names = table_names(&job);
    let ck = Checkpointer::new(
        storage.clone(),
        sparta_checkpoint::RetentionPolicy {
            keep_full: job.raw.train.checkpoint_keep_full,
        },
    )
    .with_members(job.features.members());
    // The chain continues from the restored table versions, so the removals (stamped after
    // them) are the next incremental's tombstones.
    ck.resume(&restored);
    let mut removed = vec![0u64; names.len()];
    for t in &restored.tables {
        let i = names.iter().position(|n| *n == t.name).ok_or_else(|| {
            anyhow::anyhow!("{what} holds table {:?}, which the job has not", t.name)
        })?;
        // A cluster checkpoint's part holds its shard's keys; the others are not there.
        removed[i] += forget.keys[i]
            .iter()
            .filter(|&&k| t.table.remove(k))
            .count() as u64;
    }
    if removed.iter().all(|&n| n == 0) {
        // Nothing held: no new checkpoint.
        return Ok((
            format!("{what} (none held: nothing written)"),
            counts(&names, &forget, &removed),
        ));
    }
    let write = |kind| -> sparta_checkpoint::Result<_> {
        let p = ck.begin(kind)?;
        let id = p.id();
        let written = (|| {
            for t in &restored.tables {
                p.write_table(&t.part, &t.name, &t.table)?;
            }
            for (part, d) in &restored.dense_parts {
                let d = DenseState {
                    params: &d.params,
                    optimizer: &d.optimizer,
                };
                p.write_dense(part, &d)?;
            }
            Ok(())
        })();
        match written {
            Ok(()) => p.commit_with(
                restored.step,
                restored.position.clone(),
                &restored.job_config,
                restored.manifest.cluster.clone(),
            ),
            Err(e) => {
                drop(p);
                if let Err(d) = ck.discard(id) {
                    tracing::warn!("removing the partial checkpoint {id}: {d}");
                }
                Err(e)
            }
        }
    };
    let id = match write(CheckpointKind::Incremental) {
        Err(CheckpointError::NeedFull { reason, .. }) => {
            tracing::info!("writing a full checkpoint instead of an incremental one: {reason}");
            write(CheckpointKind::Full)?
        }
        other => other?,
    };
    let kind = sparta_checkpoint::Manifest::read(storage.as_ref(), id)?.kind;
    let mut report = counts(&names, &forget, &removed);
    report.insert("checkpoint".into(), id.to_string().into());
    report.insert("from".into(), restored.id.to_string().into());
    report.insert(
        "kind".into(),
        serde_json::to_value(kind).unwrap_or_default(),
    );
    Ok((format!("{what} (written as {id})"), report))
}

/// Embedded: a delta version on top of the newest version of export directory `dir` that
/// removes the values (a running `sparta serve` drops them at its next poll).
fn forget_in_export(dir: &Path, cfg: Option<&JobConfig>, ids: &Path) -> Result<(String, Report)> {
    use sparta_serve::export::{Committer, TableExporter};
    use sparta_serve::{ExportKind, ExportOptions};
    let versions = sparta_serve::list_versions(dir)?;
    let newest = *versions
        .last()
        .ok_or_else(|| anyhow::anyhow!("no export version in {}", dir.display()))?;
    let storage = sparta_checkpoint::LocalDir::new(dir)?;
    let m = sparta_serve::format::read_manifest(&storage, newest)?;
    let snap = sparta_serve::Snapshot::load_latest(dir)?;
    anyhow::ensure!(
        snap.version() == newest,
        "its newest version v{newest} is not on the chain a server loads (that reaches          v{}): write a full version first (`sparta export --checkpoint`)",
        snap.version()
    );
    let what = format!("export v{newest}");
    let job = job_of(cfg, &m.job_config, &what)?;
    let forget = read_ids(&job, ids)?;
    let names = table_names(&job);
    // The keys the served model holds: what the new version removes.
    let present: Vec<Vec<u64>> = names
        .iter()
        .zip(&forget.keys)
        .map(|(name, keys)| match snap.tables().by_name(name) {
            Some(rows) => keys.iter().copied().filter(|&k| rows.contains(k)).collect(),
            None => Vec::new(),
        })
        .collect();
    if present.iter().all(Vec::is_empty) {
        // Nothing served: no new version.
        return Ok((
            format!("{what} (none held: nothing written)"),
            counts(&names, &forget, &lens(&present)),
        ));
    }
    let opts = ExportOptions {
        fp16: m.fp16,
        min_count: m.min_count,
        ..ExportOptions::from(&job.raw.export)
    };
    let mut committer = Committer::open(dir, opts)?;
    committer.continue_after(&m);
    let plan = committer.claim();
    let Some(base) = plan.base else {
        committer.abandon(plan.version);
        anyhow::bail!(
            "a reader asked for a full export ({} exists): write one first (`sparta export \
             --checkpoint`)",
            dir.join(sparta_serve::export::FULL_REQUEST_FILE).display()
        );
    };
    let parts = m.parts.max(1);
    // Each tombstone goes to the part of the shard that held its key (serving merges the
    // parts, so a removal in any part removes the key; this keeps each part's own).
    let routing = sparta_core::Routing::even(parts as usize);
    let written = (|| -> Result<Vec<sparta_serve::format::TableFile>> {
        let mut files = Vec::new();
        for p in 0..parts {
            let part = (m.parts > 1).then_some(p);
            let mine: Vec<_> = m
                .tables
                .iter()
                .filter(|t| t.part == part)
                .cloned()
                .collect();
            // One table per file of this part, each at the version the file is complete
            // up to: the forgotten rows put back and removed are its tombstones.
            let mut configs = Vec::with_capacity(mine.len());
            for f in &mine {
                let i = names.iter().position(|n| *n == f.name).ok_or_else(|| {
                    anyhow::anyhow!("{what} holds table {:?}, which the job has not", f.name)
                })?;
                configs.push((i, job.features.physical[i].config.clone()));
            }
            let store = sparta_core::LocalStore::from_configs(
                &configs.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>(),
            )?;
            for ((f, (i, _)), t) in mine.iter().zip(&configs).zip(store.tables()) {
                t.raise_version(f.table_version);
                let row = vec![0.0f32; t.row_stride()];
                for &k in &present[*i] {
                    if part.is_none() || routing.shard_of(k) == p as usize {
                        t.insert_raw(k, &row, Default::default())?;
                        t.remove(k);
                    }
                }
            }
            let tables: Vec<_> = mine
                .iter()
                .zip(store.tables())
                .map(|(f, t)| (f.name.as_str(), &**t))
                .collect();
            let mut ex = TableExporter::new(dir, opts, part)?;
            ex.set_members(job.features.members());
            ex.resume_at(newest, &mine);
            let (kind, fs) = ex.write(plan.version, &tables, Some(base))?;
            anyhow::ensure!(kind == ExportKind::Delta, "could not write a delta");
            files.extend(fs);
        }
        Ok(files)
    })();
    let files = match written {
        Ok(f) => f,
        Err(e) => {
            committer.abandon(plan.version);
            return Err(e);
        }
    };
    let info = committer.commit(
        plan,
        ExportKind::Delta,
        parts,
        files,
        snap.dense(),
        &m.job_config,
        m.step,
    )?;
    let removed = lens(&present);
    let mut report = counts(&names, &forget, &removed);
    report.insert("export_version".into(), info.version.into());
    report.insert("from".into(), newest.into());
    Ok((format!("{what} (written as v{})", info.version), report))
}

fn lens(keys: &[Vec<u64>]) -> Vec<u64> {
    keys.iter().map(|k| k.len() as u64).collect()
}

fn per_table(names: &[String], counts: &[u64]) -> serde_json::Value {
    names
        .iter()
        .zip(counts)
        .map(|(n, c)| (n.clone(), serde_json::Value::from(*c)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Prints `json` with `--json`, else one line per place of `done`.
fn print_report(
    a: &ForgetArgs,
    json: serde_json::Value,
    done: Vec<(String, Report)>,
) -> Result<()> {
    if a.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    for (what, r) in done {
        let tables: Vec<String> = r["removed"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(n, c)| format!("{n} {c}"))
            .collect();
        println!(
            "forgot {} row(s) from {what}: {}",
            r["removed_total"],
            tables.join(", ")
        );
    }
    Ok(())
}

/// Rows removed per table, by shard.
type PerShard = Vec<(usize, Vec<u64>)>;

/// Sends the keys to every shard's primary; returns the rows removed per table, summed over
/// the shards, and per shard.
fn forget_on_cluster(a: &ForgetArgs, job: &Job, forget: &Forget) -> Result<(Vec<u64>, PerShard)> {
    let token = a.token.load()?;
    let tls = sparta_proto::ClientTls::from_flag(a.tls_ca.as_deref(), a.tls_domain.clone())?;
    let workers = cluster_workers(&a.ps, &token, tls.as_ref())?;
    let mut c = sparta_cluster::ClientConfig::new(a.ps.clone(), token, 0, workers);
    c.coordinator = a.coordinator.clone();
    c.tls = tls;
    c.retry_wait = std::time::Duration::from_secs(job.raw.train.ps_retry_secs);
    let store = sparta_cluster::RemoteStore::connect(c, job)?;
    let shards = store.forget(&forget.keys)?;
    let mut removed = vec![0u64; forget.keys.len()];
    for (_, r) in &shards {
        for (t, n) in r.iter().enumerate() {
            removed[t] += n;
        }
    }
    Ok((removed, shards))
}

/// The workers the cluster's shards were started for (the first `--ps` address that answers
/// `Info` says): the client checks every shard against it as a worker's does.
fn cluster_workers(
    addrs: &[String],
    token: &str,
    tls: Option<&sparta_proto::ClientTls>,
) -> Result<usize> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mut errors = Vec::new();
    for addr in addrs {
        let answer = rt.block_on(async {
            let mut c = sparta_ps::replica::peer_client(addr, token, 64 << 20, tls)?;
            let info = tokio::time::timeout(
                std::time::Duration::from_secs(30),
                c.info(sparta_proto::pb::InfoRequest {}),
            )
            .await
            .map_err(|_| anyhow::anyhow!("no answer within 30 s"))??;
            anyhow::Ok(info.into_inner().workers as usize)
        });
        match answer {
            Ok(w) => return Ok(w.max(1)),
            Err(e) => errors.push(format!("PS at {addr}: {e}")),
        }
    }
    anyhow::bail!("no PS answered: {}", errors.join("; "))
}
