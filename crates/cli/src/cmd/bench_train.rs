//! `sparta bench train`: for each model, the dense step alone and the whole training loop
//! (reading, parsing, lookups, dense, pushes) on generated data, in samples/s, GFLOP/s and
//! the share of this machine's measured GEMM peak, as one JSON object any machine can be
//! compared by.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Value};
use sparta_nn::{bench, ParallelMode, Precision};

use crate::cmd::gen_data::{self, GenDataArgs, Profile};
use crate::cmd::train::{job_config, TrainArgs};

/// The job of the rich profile (feature columns, sequences, a conversion label).
const RICH_TOML: &str = include_str!("../../../../examples/rich.toml");

/// Models measured by default: every kind.
const MODELS: [&str; 8] = [
    "wdl", "deepfm", "dcn", "dcnv2", "dlrm", "din", "mmoe", "esmm",
];

/// Flags of `sparta bench train`.
#[derive(Args, Debug, Clone)]
pub struct TrainBenchArgs {
    /// Models to measure (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = MODELS.map(String::from))]
    pub models: Vec<String>,
    /// Training rows of the generated data (one epoch); din, mmoe and esmm train on the rich
    /// profile (behaviour sequences, a conversion label), the others on the Criteo layout.
    #[arg(long, default_value_t = 300_000)]
    pub rows: u64,
    /// Test rows (the AUC is reported next to the speed).
    #[arg(long, default_value_t = 50_000)]
    pub test_rows: u64,
    /// Samples per step.
    #[arg(long, default_value_t = 4096)]
    pub batch_size: usize,
    /// Compute threads (default: one per core); the dense step is also timed on 1 thread.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Timed dense steps per model and thread count.
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Where the generated data goes (kept; reused when the files exist). Default: a
    /// temporary directory, removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Train with the sequential loop instead of the default pipeline.
    #[arg(long)]
    pub exact: bool,
    /// Arithmetic of the dense GEMMs (as `sparta train --precision`): the peaks are measured in
    /// the same precision.
    #[arg(long, default_value = "f32")]
    pub precision: Precision,
    /// Also write the JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs the benchmark and prints one JSON object.
pub fn run(a: TrainBenchArgs) -> Result<()> {
    for m in &a.models {
        anyhow::ensure!(
            MODELS.contains(&m.as_str()),
            "--models {m:?}: expected some of {}",
            MODELS.join(",")
        );
    }
    anyhow::ensure!(
        a.rows > 0 && a.test_rows > 0,
        "--rows and --test-rows must be > 0"
    );
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let tmp;
    let dir = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d.clone()
        }
        None => {
            tmp = tempfile::tempdir().context("a temporary directory")?;
            tmp.path().to_path_buf()
        }
    };
    let mut peaks = Vec::new();
    for t in 1..=threads {
        let (g, (m, k, n)) = bench::gemm_peak_at(a.precision, t);
        eprintln!(
            "{} gemm peak on {t} thread(s): {g:.1} GFLOP/s ({m}x{k}x{n})",
            a.precision.name()
        );
        peaks.push(json!({"threads": t, "gflops": g, "shape": [m, k, n]}));
    }
    let peak_1 = peaks[0]["gflops"].as_f64().unwrap_or(f64::NAN);
    let peak_t = peaks[threads - 1]["gflops"].as_f64().unwrap_or(f64::NAN);
    let mut models = Vec::new();
    for m in &a.models {
        let r = bench_model(&a, m, &dir, threads, peak_1, peak_t)
            .with_context(|| format!("benchmarking {m}"))?;
        eprintln!("{m}: {r}");
        models.push(r);
    }
    let out = json!({
        "machine": machine(),
        "threads": threads,
        "batch_size": a.batch_size,
        "rows": a.rows,
        "pipeline": !a.exact,
        "precision": a.precision.name(),
        "bf16_tiles": sparta_nn::gemm_ops::bf16_tiles(),
        "bf16_kernel": sparta_nn::gemm_ops::bf16_kernel().name(),
        "gemm_peak": peaks,
        "models": models,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    let text = serde_json::to_string_pretty(&out)?;
    println!("{text}");
    if let Some(p) = &a.out {
        std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// The generated data (and job) a model trains on: (train, test, config).
fn data_for(
    a: &TrainBenchArgs,
    model: &str,
    dir: &Path,
) -> Result<(PathBuf, PathBuf, Option<PathBuf>)> {
    let rich = matches!(model, "din" | "mmoe" | "esmm");
    let name = if rich { "rich" } else { "criteo" };
    let train = dir.join(format!("{name}-train-{}.tsv", a.rows));
    let test = dir.join(format!("{name}-test-{}.tsv", a.test_rows));
    for (path, rows, seed) in [(&train, a.rows, 1), (&test, a.test_rows, 2)] {
        if path.exists() {
            continue;
        }
        // The same rows `sparta gen-data` writes (its default model seed and vocabulary).
        gen_data::write(&GenDataArgs {
            rows,
            seed,
            model_seed: 20261129,
            vocab_scale: 1.0,
            profile: if rich { Profile::Rich } else { Profile::Criteo },
            oracle: None,
            out: path.clone(),
        })?;
    }
    let config = if rich {
        let p = dir.join("rich.toml");
        std::fs::write(&p, RICH_TOML).with_context(|| format!("writing {}", p.display()))?;
        Some(p)
    } else {
        None
    };
    Ok((train, test, config))
}

/// One model: the dense step alone on 1 and `threads` threads, then the training loop.
fn bench_model(
    a: &TrainBenchArgs,
    model: &str,
    dir: &Path,
    threads: usize,
    peak_1: f64,
    peak_t: f64,
) -> Result<Value> {
    let (train, test, config) = data_for(a, model, dir)?;
    let tasks = match model {
        "mmoe" => vec!["ctr=label".into(), "ctcvr=conversion".into()],
        "esmm" => vec!["ctr=label".into(), "ctcvr=conversion,after=ctr".into()],
        _ => Vec::new(),
    };
    let args = TrainArgs {
        config,
        model: Some(model.into()),
        tasks,
        train: vec![train],
        test: vec![test],
        batch_size: Some(a.batch_size),
        threads: Some(threads),
        exact: a.exact,
        precision: Some(a.precision),
        quiet: true,
        ..TrainArgs::default()
    };
    // The dense step of exactly the model the loop trains.
    let job = job_config(&args)?.validate()?;
    eprintln!("{model}: dense step alone, then {} training rows", a.rows);
    let step = |t: usize| {
        let cfg = bench::with_threads(job.model.clone(), t, ParallelMode::Shard);
        bench::dense_step(cfg, a.batch_size, a.iters)
    };
    let one = step(1);
    let many = if threads > 1 {
        step(threads)
    } else {
        one.clone()
    };
    let s = sparta_worker::Trainer::embedded(job)?.run(&sparta_worker::RunOptions {
        train: args.train.clone(),
        test: args.test.clone(),
        progress: false,
        follow: None,
        ..Default::default()
    })?;
    let flops = one.mflop_per_sample * 1e6;
    let loop_gflops = flops * s.train_samples_per_sec / 1e9;
    let tasks: Value = if s.test_tasks.is_empty() {
        json!({"auc": s.test_auc})
    } else {
        serde_json::to_value(&s.test_tasks)?
    };
    Ok(json!({
        "model": model,
        "params": one.params,
        "mflop_per_sample": one.mflop_per_sample,
        "dense_step": {
            "threads_1": {
                "samples_per_sec": one.samples_per_sec,
                "gflops": one.gflops,
                "pct_of_peak": 100.0 * one.gflops / peak_1,
            },
            "threads_n": {
                "threads": threads,
                "samples_per_sec": many.samples_per_sec,
                "gflops": many.gflops,
                "pct_of_peak": 100.0 * many.gflops / peak_t,
            },
            "speedup_n_over_1": many.samples_per_sec / one.samples_per_sec,
        },
        "training_loop": {
            "samples_per_sec": s.train_samples_per_sec,
            "loop_samples_per_sec": s.loop_samples_per_sec,
            "gflops": loop_gflops,
            "pct_of_peak": 100.0 * loop_gflops / peak_t,
            "dense_stage_gflops": s.dense_gflops,
            "dense_stage_pct_of_peak": 100.0 * s.dense_gflops / peak_t,
            "train_seconds": s.train_seconds,
            "stage_seconds": s.stage_seconds,
            "pipeline": s.pipeline,
            "rows": s.train_rows,
        },
        "test": tasks,
    }))
}

/// CPU model, cores and the vector extensions that matter for the GEMMs.
pub(crate) fn machine() -> Value {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let flags = field("flags").unwrap_or_default();
    let has: Vec<&str> = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"]
        .into_iter()
        .filter(|f| flags.split_whitespace().any(|x| x == *f))
        .collect();
    json!({
        "cpu": field("model name"),
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "features": has,
    })
}
