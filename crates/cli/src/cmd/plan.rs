//! `sparta plan`: sizes a PS cluster for a job from costs this code measures now, on this
//! machine: the bytes per row of the job's own tables ([`memory`]), a worker's bytes per
//! sample on the wire counted from the job's reader and dedup on sample data ([`wire`]), and
//! the CPU time per sample of a short embedded training run ([`cpu`]). The rest is
//! arithmetic, each step printed with what it rests on.

mod counts;
mod cpu;
mod memory;
mod wire;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use sparta_core::config::Format;
use sparta_core::features::Features;
use sparta_core::{Job, JobConfig};
use sparta_proto::Compression;

use memory::{ShardBytes, TableBytes, MAX_SAMPLE_ROWS};

/// Memory of a PS machine (or pod) that its `--memory-limit` does not count: the push log,
/// replication queues, gRPC buffers, checkpoint writing, the binary. The figure
/// `deploy/k8s/generate.py` (`HEADROOM_MIB`) and README.md use: a PS gets `--memory-limit`
/// = (memory - this) / copies.
const HEADROOM_MIB: u64 = 4096;

const MIB: u64 = 1 << 20;

/// Flags of `sparta plan`.
#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    /// Job config (default: the default job, Criteo layout, wdl).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Ids (rows) each physical table of the job will hold, `TABLE=COUNT`, comma separated or
    /// repeated; counts as `1000000`, `1e9`, `250M`, `2G` (K, M, G or B, T: powers of 1000).
    /// Tables: the physical ones, `embedding`, `embedding.1`, ... and `wide` (a name the job
    /// lacks is refused with the list of its tables and the logical tables each holds). Every
    /// deep table must be named; `wide`, when not, holds a row for every id of the deep tables
    /// with first-order features (the sum of their counts).
    #[arg(
        long,
        required = true,
        value_delimiter = ',',
        value_name = "TABLE=COUNT",
        value_parser = counts::parse_table_ids
    )]
    pub ids: Vec<(String, u64)>,
    /// Training samples per second the cluster must sustain (`500000`, `2M`, `1.5e6`).
    #[arg(long, value_parser = counts::parse_amount)]
    pub samples_per_sec: f64,
    /// Memory of one machine (or pod) a PS process runs on, e.g. `64GiB` (units as
    /// `sparta ps --memory-limit`).
    #[arg(long, value_parser = super::ps::parse_memory_limit)]
    pub machine_memory: u64,
    /// Cores of one machine a worker runs on (default: this machine's).
    #[arg(long)]
    pub machine_cores: Option<usize>,
    /// Share of a worker machine's core time that goes to training (the rest: waiting on the
    /// shards, gRPC, the OS).
    #[arg(long, default_value_t = 0.7)]
    pub efficiency: f64,
    /// Copies of every shard (`sparta launch --replicas`): each PS process holds this many.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Plan this many PS processes instead of the fewest that hold the tables (the plan says
    /// whether they do).
    #[arg(long = "ps")]
    pub num_ps: Option<usize>,
    /// Sample data in the job's layout (default: rows `sparta gen-data` writes, for a job of
    /// the Criteo layout).
    #[arg(long, num_args = 1..)]
    pub data: Vec<PathBuf>,
    /// Rows of the sample data read for the wire bytes and trained on for the CPU time.
    #[arg(long, default_value_t = 20_000)]
    pub sample_rows: u64,
    /// Embedding values on the wire (as `sparta launch --wire-compression`).
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub wire_compression: Compression,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Bytes in binary units, one decimal (`41.3 GiB`).
pub(crate) fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// A rate in decimal units as network links are sold (`294 MB/s (2.35 Gbit/s)`).
fn human_rate(bytes_per_sec: f64) -> String {
    let (v, unit) = match bytes_per_sec {
        b if b >= 1e9 => (b / 1e9, "GB/s"),
        b if b >= 1e6 => (b / 1e6, "MB/s"),
        b if b >= 1e3 => (b / 1e3, "kB/s"),
        b => (b, "B/s"),
    };
    format!("{v:.3} {unit} ({:.3} Gbit/s)", bytes_per_sec * 8.0 / 1e9)
}

/// A memory limit as `--memory-limit` reads it: GiB when whole, else MiB.
fn limit_flag(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 30) {
        format!("{}GiB", bytes >> 30)
    } else {
        format!("{}MiB", bytes / MIB)
    }
}

/// The memory limit of one copy of a shard on a machine of `machine` bytes holding `replicas`
/// copies: what `deploy/k8s/generate.py` writes for a pod of that memory.
fn memory_limit(machine: u64, replicas: usize) -> Result<u64> {
    let mib = machine / MIB;
    if mib <= HEADROOM_MIB {
        bail!(
            "--machine-memory {}: a PS needs {HEADROOM_MIB} MiB outside its memory cap (push \
             log, gRPC buffers, checkpoint writing); give it more",
            human_bytes(machine)
        );
    }
    Ok((mib - HEADROOM_MIB) / replicas as u64 * MIB)
}

/// The count of rows of each physical table (in `Features::physical` order) and whether it
/// was given (else derived: the wide table).
fn table_ids(f: &Features, given: &[(String, u64)]) -> Result<Vec<(u64, bool)>> {
    let names: Vec<&str> = f.physical.iter().map(|p| p.config.name.as_str()).collect();
    let listing = || {
        f.physical
            .iter()
            .map(|p| {
                let members: Vec<&str> = p
                    .members
                    .iter()
                    .map(|&i| f.tables[i].name.as_str())
                    .collect();
                format!("{} (rows of {})", p.config.name, members.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut ids = vec![None; names.len()];
    for (name, n) in given {
        let Some(i) = names.iter().position(|x| x == name) else {
            bail!(
                "--ids {name}: the job has no physical table {name:?}; its tables: {}",
                listing()
            );
        };
        if ids[i].replace(*n).is_some() {
            bail!("--ids names {name} twice");
        }
    }
    let mut out = Vec::with_capacity(names.len());
    let mut wide_ids = 0u64;
    for (i, p) in f.physical.iter().enumerate() {
        if Some(i) == f.wide_table {
            continue;
        }
        let Some(n) = ids[i] else {
            bail!(
                "--ids names no count for table {}: name every deep table of the job: {}",
                p.config.name,
                listing()
            );
        };
        if p.members.iter().any(|&m| f.tables[m].wide) {
            wide_ids = wide_ids.saturating_add(n);
        }
        out.push((n, true));
    }
    if let Some(w) = f.wide_table {
        out.insert(w, ids[w].map_or((wide_ids, false), |n| (n, true)));
    }
    Ok(out)
}

/// The job the plan measures: the config's, reading `sample_rows` rows once, writing nothing
/// (no checkpoints, no exports), with a cluster worker's loop (no pipeline unless asked for).
fn plan_job(a: &PlanArgs) -> Result<Job> {
    let mut cfg = match &a.config {
        Some(p) => JobConfig::from_file(p)?,
        None => JobConfig::default(),
    };
    cfg.train.epochs = 1;
    cfg.train.max_rows = Some(a.sample_rows);
    cfg.train.checkpoint_dir = None;
    cfg.train.preload = false;
    cfg.train.pipeline = Some(cfg.train.pipeline.unwrap_or(false));
    cfg.export.dir = None;
    Ok(cfg.validate()?)
}

/// What the plan measured and decided.
struct Plan {
    ids: Vec<(u64, bool)>,
    tables: Vec<TableBytes>,
    dense_params: usize,
    ps: usize,
    fits: bool,
    shard: ShardBytes,
    limit: u64,
    budget: u64,
    wire: wire::WireBytes,
    cpu: cpu::CpuCost,
    cores: usize,
    workers: usize,
    data: String,
}

/// Measures every table at `rows[t]` rows.
fn measure_tables(job: &Job, rows: &[u64]) -> Result<Vec<TableBytes>> {
    let f = &job.features;
    f.physical
        .iter()
        .zip(rows)
        .map(|(p, &n)| {
            let tags: Vec<u8> = p.members.iter().map(|&i| f.tables[i].tag).collect();
            memory::measure_table(&p.config, &tags, n)
                .with_context(|| format!("measuring table {}", p.config.name))
        })
        .collect()
}

/// The PS count (the fewest that hold the tables, or `--ps`) and the tables measured at the
/// rows one shard holds (at most [`MAX_SAMPLE_ROWS`]): a shard's fixed costs weigh more on a
/// small part, so the measure follows the count until both agree.
fn size_ps(
    a: &PlanArgs,
    job: &Job,
    ids: &[u64],
    dense_params: usize,
    budget: u64,
) -> Result<(usize, Vec<TableBytes>)> {
    let mut rows: Vec<u64> = ids.iter().map(|&n| n.clamp(1, MAX_SAMPLE_ROWS)).collect();
    let mut tables = measure_tables(job, &rows)?;
    let mut ps = 1;
    for _ in 0..6 {
        ps = match a.num_ps {
            Some(n) => n,
            None => memory::fewest_shards(ids, &tables, dense_params, budget)?,
        }
        .max(a.replicas);
        let want: Vec<u64> = memory::shard_bytes(ids, &tables, dense_params, ps)
            .rows
            .into_iter()
            .map(|r| r.clamp(1, MAX_SAMPLE_ROWS))
            .collect();
        if want == rows {
            break;
        }
        rows = want;
        tables = measure_tables(job, &rows)?;
    }
    Ok((ps, tables))
}

fn make_plan(a: &PlanArgs, job: &Job, tmp: &std::path::Path) -> Result<Plan> {
    let f = &job.features;
    let ids = table_ids(f, &a.ids)?;
    let counts: Vec<u64> = ids.iter().map(|&(n, _)| n).collect();
    let dense_params = sparta_nn::Model::new(job.model.clone())?.num_params();
    let limit = memory_limit(a.machine_memory, a.replicas)?;
    let budget = (limit as f64 * sparta_ps::server::CAP_HIGH) as u64;
    tracing::info!("plan: measuring the job's tables");
    let (ps, tables) = size_ps(a, job, &counts, dense_params, budget)?;
    let shard = memory::shard_bytes(&counts, &tables, dense_params, ps);
    let (paths, data) = if a.data.is_empty() {
        if job.raw.data.format != Format::Criteo {
            bail!(
                "the job reads {} data: pass sample rows of it with --data (`sparta gen-data` \
                 writes the Criteo layout, or the rich profile's for examples/rich.toml)",
                json!(job.raw.data.format).as_str().unwrap_or("other")
            );
        }
        let p = tmp.join("sample.tsv");
        super::gen_data::write(&super::gen_data::GenDataArgs {
            rows: a.sample_rows,
            seed: 1,
            model_seed: 20261129,
            vocab_scale: 1.0,
            profile: super::gen_data::Profile::Criteo,
            oracle: None,
            out: p.clone(),
        })?;
        (
            vec![p],
            format!(
                "{} rows of `sparta gen-data --seed 1` (Criteo layout)",
                a.sample_rows
            ),
        )
    } else {
        let names: Vec<String> = a.data.iter().map(|p| p.display().to_string()).collect();
        (a.data.clone(), names.join(", "))
    };
    tracing::info!("plan: reading the sample data for the wire bytes");
    let wire = wire::measure_wire(job, &paths, ps, a.wire_compression, dense_params)?;
    tracing::info!("plan: training on the sample data for the CPU time");
    let cpu = cpu::measure_cpu(job.clone(), &paths)?;
    let cores = a
        .machine_cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let workers =
        ((a.samples_per_sec * cpu.per_sample()) / (cores as f64 * a.efficiency)).ceil() as usize;
    Ok(Plan {
        ids,
        tables,
        dense_params,
        ps,
        fits: shard.total() <= budget,
        shard,
        limit,
        budget,
        wire,
        cpu,
        cores,
        workers: workers.max(1),
        data: if a.data.is_empty() {
            data
        } else {
            format!("{data} (first {} rows)", a.sample_rows)
        },
    })
}

/// The two command lines that start the planned cluster.
fn commands(a: &PlanArgs, p: &Plan) -> (String, String) {
    let mut launch = format!(
        "sparta launch --ps {} --workers {} --ps-memory-limit {}",
        p.ps,
        p.workers,
        limit_flag(p.limit)
    );
    if a.replicas > 1 {
        launch.push_str(&format!(" --replicas {}", a.replicas));
    }
    if a.wire_compression != Compression::None {
        launch.push_str(&format!(
            " --wire-compression {}",
            a.wire_compression.name()
        ));
    }
    if let Some(c) = &a.config {
        launch.push_str(&format!(" --config {}", c.display()));
    }
    launch.push_str(" --train FILE...");
    let k8s = format!(
        "python3 deploy/k8s/generate.py --ps {} --workers {} --replicas {} --out \
         deploy/k8s/overlays/plan",
        p.ps, p.workers, a.replicas
    );
    (launch, k8s)
}

fn to_json(a: &PlanArgs, job: &Job, p: &Plan) -> Value {
    let f = &job.features;
    let s = a.samples_per_sec;
    let per_sample = p.wire.sparse_per_sample + p.wire.dense_per_sample;
    let tables: Vec<Value> = f
        .physical
        .iter()
        .enumerate()
        .map(|(t, phys)| {
            let (ids, given) = p.ids[t];
            json!({
                "name": phys.config.name,
                "ids": ids,
                "ids_given": given,
                "dim": phys.config.dim,
                "measured_rows": p.tables[t].rows,
                "bytes_per_row": p.tables[t].bytes_per_row,
                "payload_bytes_per_row": p.tables[t].payload_bytes_per_row,
                "total_bytes": (ids as f64 * p.tables[t].bytes_per_row).ceil() as u64,
                "reserve_bytes_per_shard": p.tables[t].reserve_bytes,
                "rows_per_shard": p.shard.rows[t],
                "bytes_per_shard": p.shard.table_bytes[t],
                "rows_per_sample": p.wire.table_rows_per_sample[t],
            })
        })
        .collect();
    let (launch, k8s) = commands(a, p);
    json!({
        "config": a.config.as_ref().map(|c| c.display().to_string()),
        "model": job.model.kind,
        "batch_size": job.raw.data.batch_size,
        "measured_on": super::bench_train::machine(),
        "machine": {"memory_bytes": a.machine_memory, "cores": p.cores},
        "tables": tables,
        "dense": {
            "params": p.dense_params,
            "bytes_per_param": sparta_ps::server::DENSE_BYTES_PER_PARAM,
        },
        "ps": {
            "count": p.ps,
            "replicas": a.replicas,
            "fits": p.fits,
            "memory_limit_bytes": p.limit,
            "memory_limit": limit_flag(p.limit),
            "headroom_bytes": HEADROOM_MIB * MIB,
            "cap_high": sparta_ps::server::CAP_HIGH,
            "budget_bytes": p.budget,
            "shard_bytes": p.shard.total(),
            "shard_table_bytes": p.shard.table_bytes.iter().sum::<u64>(),
            "shard_reserve_bytes": p.shard.reserve_bytes,
            "shard_dense_bytes": p.shard.dense_bytes,
            "process_bytes": p.shard.total() * a.replicas as u64,
        },
        "wire": {
            "data": p.data,
            "rows": p.wire.rows,
            "steps": p.wire.steps,
            "compression": a.wire_compression.name(),
            "ids_per_sample": p.wire.ids_per_sample,
            "sparse_bytes_per_sample": p.wire.sparse_per_sample,
            "dense_bytes_per_step": p.wire.dense_per_step,
            "dense_bytes_per_sample": p.wire.dense_per_sample,
            "bytes_per_sample": per_sample,
        },
        "network": {
            "samples_per_sec": s,
            "total_bytes_per_sec": s * per_sample,
            "per_ps_bytes_per_sec": s * per_sample / p.ps as f64,
            "per_worker_bytes_per_sec": s * per_sample / p.workers as f64,
        },
        "workers": {
            "count": p.workers,
            "cpu_seconds_per_sample": p.cpu.per_sample(),
            "measured_rows": p.cpu.rows,
            "measured_cpu_seconds": p.cpu.cpu_seconds,
            "measured_wall_seconds": p.cpu.wall_seconds,
            "measured_threads": p.cpu.threads,
            "measured_utilisation": p.cpu.utilisation(),
            "machine_cores": p.cores,
            "efficiency": a.efficiency,
        },
        "commands": {"launch": launch, "k8s": k8s},
    })
}

fn print_human(a: &PlanArgs, job: &Job, p: &Plan) {
    let f = &job.features;
    let machine = super::bench_train::machine();
    let s = a.samples_per_sec;
    println!(
        "plan for {} ({}, batch {}): measured on {} core(s) of {}",
        a.config
            .as_ref()
            .map_or("the default job".into(), |c| c.display().to_string()),
        json!(job.model.kind).as_str().unwrap_or("?"),
        job.raw.data.batch_size,
        machine["cores"],
        machine["cpu"].as_str().unwrap_or("an unknown CPU")
    );
    println!(
        "memory   bytes per row measured: each table built as the job builds it (its optimizer \
         state, row metadata), filled with rows, Table::stats (rows, index, slabs)"
    );
    for (t, phys) in f.physical.iter().enumerate() {
        let (ids, given) = p.ids[t];
        let m = &p.tables[t];
        println!(
            "  {:<14} {:>14} ids x {:>6.1} B = {:>10} ({}payload {} B a row; measured on {} rows)",
            phys.config.name,
            ids,
            m.bytes_per_row,
            human_bytes((ids as f64 * m.bytes_per_row) as u64),
            if given {
                String::new()
            } else {
                "the deep tables' wide ids; ".into()
            },
            m.payload_bytes_per_row,
            m.rows
        );
    }
    println!(
        "  {:<14} {:>14} params x {} B = {:>7} (value, gradient, optimizer moments), split over the PS",
        "dense",
        p.dense_params,
        sparta_ps::server::DENSE_BYTES_PER_PARAM,
        human_bytes(p.dense_params as u64 * sparta_ps::server::DENSE_BYTES_PER_PARAM)
    );
    println!(
        "PS       {}{}: a shard holds {} (rows {} + tombstone reserve {} + dense {}), {} 90 % \
         of its --memory-limit {} (over it the cap evicts); limit = ({} machine - {} MiB \
         outside the cap) / {} cop{}",
        p.ps,
        if a.num_ps.is_some() { " (--ps)" } else { "" },
        human_bytes(p.shard.total()),
        human_bytes(p.shard.table_bytes.iter().sum()),
        human_bytes(p.shard.reserve_bytes),
        human_bytes(p.shard.dense_bytes),
        if p.fits { "under" } else { "OVER" },
        limit_flag(p.limit),
        human_bytes(a.machine_memory),
        HEADROOM_MIB,
        a.replicas,
        if a.replicas == 1 { "y" } else { "ies" }
    );
    let rows: Vec<String> = f
        .physical
        .iter()
        .zip(&p.wire.table_rows_per_sample)
        .map(|(t, r)| format!("{} {r:.1} x {} values", t.config.name, t.config.dim))
        .collect();
    println!(
        "wire     {:.0} B per sample: sparse {:.0} ({:.1} distinct ids per sample of {}, each \
         its 8-byte key and its rows ({}) both ways, {}; + framing) + dense {:.0} ({} \
         f32 parameters out and back per step of {})",
        p.wire.sparse_per_sample + p.wire.dense_per_sample,
        p.wire.sparse_per_sample,
        p.wire.ids_per_sample,
        p.data,
        rows.join(", "),
        match a.wire_compression {
            Compression::None => "4 B a value".to_string(),
            c => format!("{} B a value ({})", c.value_bytes(), c.name()),
        },
        p.wire.dense_per_sample,
        p.dense_params,
        job.raw.data.batch_size
    );
    let per = p.wire.sparse_per_sample + p.wire.dense_per_sample;
    println!(
        "network  at {s} samples/s: {} in all; per PS link {}, per worker link {} (in + out)",
        human_rate(s * per),
        human_rate(s * per / p.ps as f64),
        human_rate(s * per / p.workers as f64)
    );
    println!(
        "workers  {}: {:.3e} CPU-s per sample (an embedded run of {} rows: {:.2} CPU-s in \
         {:.2} s on {} thread(s), the tables' work included) x {s} samples/s / ({} cores x {} \
         efficiency) = {:.2}",
        p.workers,
        p.cpu.per_sample(),
        p.cpu.rows,
        p.cpu.cpu_seconds,
        p.cpu.wall_seconds,
        p.cpu.threads,
        p.cores,
        a.efficiency,
        s * p.cpu.per_sample() / (p.cores as f64 * a.efficiency)
    );
    let (launch, k8s) = commands(a, p);
    println!("launch   {launch}");
    println!(
        "k8s      {k8s} (generate.py writes each PS's --memory-limit from the PS container's \
         memory limit in deploy/k8s/base/ps.yaml, less {HEADROOM_MIB} MiB: set that to {}Mi)",
        a.machine_memory / MIB
    );
}

/// `sparta plan`.
pub fn run(a: PlanArgs) -> Result<()> {
    if !(a.efficiency > 0.0 && a.efficiency <= 1.0) {
        bail!("--efficiency {} must be in (0, 1]", a.efficiency);
    }
    if a.replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    if let Some(n) = a.num_ps {
        if n < a.replicas || n > sparta_core::routing::SLOTS {
            bail!(
                "--ps {n} must be between --replicas {} and {} (one routing slot per shard)",
                a.replicas,
                sparta_core::routing::SLOTS
            );
        }
    }
    if a.machine_cores == Some(0) || a.sample_rows == 0 {
        bail!("--machine-cores and --sample-rows must be at least 1");
    }
    let job = plan_job(&a)?;
    let tmp = tempfile::tempdir().context("a temporary directory for the sample data")?;
    let plan = make_plan(&a, &job, tmp.path())?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&a, &job, &plan))?
        );
    } else {
        print_human(&a, &job, &plan);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headroom_is_the_one_deploy_k8s_keeps() {
        let script = include_str!("../../../../deploy/k8s/generate.py");
        assert!(
            script.contains(&format!("\nHEADROOM_MIB = {HEADROOM_MIB}\n")),
            "deploy/k8s/generate.py keeps another headroom than sparta plan"
        );
    }

    #[test]
    fn the_limit_is_the_machine_less_the_headroom_split_over_the_copies() {
        assert_eq!(memory_limit(16 << 30, 1).unwrap(), 12 << 30);
        assert_eq!(memory_limit(16 << 30, 2).unwrap(), 6 << 30);
        assert_eq!(limit_flag(6 << 30), "6GiB");
        assert_eq!(limit_flag(memory_limit(10 << 30, 4).unwrap()), "1536MiB");
        assert!(memory_limit(4 << 30, 1).is_err());
    }

    fn job(toml: &str) -> Job {
        JobConfig::from_toml(toml).unwrap().validate().unwrap()
    }

    #[test]
    fn every_deep_table_needs_a_count_and_wide_defaults_to_the_wide_ones() {
        let j = job("");
        let f = &j.features;
        let names: Vec<&str> = f.physical.iter().map(|p| p.config.name.as_str()).collect();
        assert_eq!(names, ["embedding", "wide"]);
        let ids = table_ids(f, &[("embedding".into(), 500)]).unwrap();
        assert_eq!(ids, [(500, true), (500, false)]);
        let ids = table_ids(f, &[("wide".into(), 7), ("embedding".into(), 500)]).unwrap();
        assert_eq!(ids, [(500, true), (7, true)]);
        let e = table_ids(f, &[("wide".into(), 7)]).unwrap_err().to_string();
        assert!(e.contains("embedding (rows of C1, C2"), "{e}");
        let e = table_ids(f, &[("item".into(), 7)]).unwrap_err().to_string();
        assert!(e.contains("no physical table \"item\""), "{e}");
        let e = table_ids(f, &[("embedding".into(), 1), ("embedding".into(), 2)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn a_model_without_a_wide_part_has_no_wide_table_to_name() {
        let j = job("[model]\nkind = \"dcnv2\"\nhidden = [8]\n");
        let ids = table_ids(&j.features, &[("embedding".into(), 9)]).unwrap();
        assert_eq!(ids, [(9, true)]);
    }
}
