//! Dense-step benchmark (release only):
//! `cargo run --release -p sparta-nn --example dense_bench -- --threads 2`
//!
//! Prints (a) gemm's own f32 peak (`sparta_nn::bench::gemm_peak`) on 1..=threads threads and
//! (b) per model (wdl, deepfm, dcn, dcnv2 full rank, dlrm, din with one sequence of
//! `DIN_MAX_LEN` positions, and two-task mmoe (4 experts, towers [64]) and esmm, also with layer
//! norm + dropout 0.1; F=26, D=16, 13 dense, hidden [512,256,128]) the full dense step (forward +
//! backward + Adam) time per batch, samples/s and achieved GFLOP/s, for
//! threads = 1 and, if asked, `threads` in both parallel modes (shard, gemm).

use std::time::Instant;

use sparta_nn::bench::{self, pseudo};
use sparta_nn::gemm_ops::{matmul_nn, matmul_nt, matmul_tn, Compute};
use sparta_nn::{ModelConfig, ModelKind, ParallelMode, TaskSpec};

struct Args {
    threads: usize,
    batch: usize,
    iters: usize,
}

fn parse() -> Args {
    let mut a = Args {
        threads: 2,
        batch: 4096,
        iters: 10,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let val = v
            .get(i + 1)
            .and_then(|s| s.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("{} needs a number", v[i]));
        match v[i].as_str() {
            "--threads" => a.threads = val,
            "--batch" => a.batch = val,
            "--iters" => a.iters = val,
            other => panic!("unknown flag {other} (use --threads N --batch N --iters N)"),
        }
        i += 2;
    }
    a
}

/// CPU seconds consumed by this process so far (all threads). Unlike wall time it excludes
/// periods where other tenants' processes ran on our cores, so it stays meaningful on a shared
/// machine.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime failed");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Single-threaded GFLOP/s of the wdl step's GEMM shapes (rows = batch).
fn gemm_shapes(rows: usize) {
    let dims = [429usize, 512, 256, 128];
    let time = |f: &mut dyn FnMut()| {
        f();
        let t = Instant::now();
        for _ in 0..5 {
            f();
        }
        t.elapsed().as_secs_f64() / 5.0
    };
    for l in 0..3 {
        let (i, o) = (dims[l], dims[l + 1]);
        let x = pseudo(rows * i, 7);
        let w = pseudo(i * o, 8);
        let mut y = pseudo(rows * o, 9);
        let mut dw = vec![0.0f32; i * o];
        let mut dx = vec![0.0f32; rows * i];
        let fl = 2.0 * (rows * i * o) as f64 / 1e9;
        let p = Compute::SERIAL;
        let fwd = time(&mut || matmul_nn(&mut y, o, &x, i, &w, o, (rows, i, o), false, p));
        let gw = time(&mut || matmul_tn(&mut dw, o, &x, i, &y, o, (i, rows, o), true, p));
        let gx = time(&mut || matmul_nt(&mut dx, i, &y, o, &w, o, (rows, o, i), false, p));
        println!(
            "layer {i}x{o}: fwd XW {:.1} ms ({:.1} GFLOP/s)  dW=X^T dY {:.1} ms ({:.1})  dX=dY W^T {:.1} ms ({:.1})",
            fwd * 1e3,
            fl / fwd,
            gw * 1e3,
            fl / gw,
            gx * 1e3,
            fl / gx
        );
    }
}

/// The benchmarked config of `kind` (two tasks for mmoe and esmm; `extras`: layer norm and
/// dropout 0.1).
fn bench_config(kind: ModelKind, extras: bool) -> ModelConfig {
    let mut cfg = ModelConfig::new(kind, 26, 16, 13);
    if matches!(kind, ModelKind::Mmoe | ModelKind::Esmm) {
        cfg.tasks = ["ctr", "ctcvr"]
            .iter()
            .map(|n| TaskSpec {
                name: n.to_string(),
                weight: 1.0,
            })
            .collect();
        (cfg.layer_norm, cfg.dropout) = (extras, if extras { 0.1 } else { 0.0 });
    }
    cfg
}

fn bench_model(
    cfg: ModelConfig,
    threads: usize,
    parallel: ParallelMode,
    args: &Args,
    peak: &[f64],
) {
    let kind = cfg.kind;
    let extras = if cfg.layer_norm { "+ln+do" } else { "" };
    let cpu0 = cpu_seconds();
    let r = bench::dense_step(
        bench::with_threads(cfg, threads, parallel),
        args.batch,
        args.iters,
    );
    // Warm-up steps included: CPU per step over all of them.
    let cpu_per_step = (cpu_seconds() - cpu0) / (args.iters + 2) as f64;
    println!(
        "{:<13} threads={} mode={:<5} params={:>8} MFLOP/sample={:.3}  step median {:>7.2} ms (min {:>7.2})  {:>9.0} samples/s  {:>6.1} GFLOP/s ({:.0}% of gemm peak)  cpu {:>7.2} ms/step -> {:>6.0} samples/cpu-s",
        format!("{}{extras}", kind.name()),
        threads,
        format!("{parallel:?}").to_lowercase(),
        r.params,
        r.mflop_per_sample,
        r.median_secs * 1e3,
        r.min_secs * 1e3,
        r.samples_per_sec,
        r.gflops,
        100.0 * r.gflops / peak[threads - 1],
        cpu_per_step * 1e3,
        args.batch as f64 / cpu_per_step,
    );
}

fn main() {
    let args = parse();
    println!("== (a) gemm f32 peak (C = A B, best of bench::PEAK_SHAPES)");
    let mut peak = Vec::new();
    for t in 1..=args.threads {
        let (g, (m, k, n)) = bench::gemm_peak(t);
        peak.push(g);
        println!("gemm threads={t}: {g:.1} GFLOP/s (best shape {m}x{k}x{n})");
    }
    println!("== (c) wdl GEMM shapes, 1 thread, {} rows", args.batch);
    gemm_shapes(args.batch);
    println!("== (b) dense step (fwd + bwd + Adam), batch {}", args.batch);
    let configs = [
        ModelKind::Wdl,
        ModelKind::Deepfm,
        ModelKind::Dcn,
        ModelKind::Dcnv2,
        ModelKind::Dlrm,
        ModelKind::Din,
        ModelKind::Mmoe,
        ModelKind::Esmm,
    ]
    .map(|k| bench_config(k, false))
    .into_iter()
    .chain([ModelKind::Mmoe, ModelKind::Esmm].map(|k| bench_config(k, true)));
    for cfg in configs {
        bench_model(cfg.clone(), 1, ParallelMode::Shard, &args, &peak);
        if args.threads > 1 {
            bench_model(cfg.clone(), args.threads, ParallelMode::Shard, &args, &peak);
            bench_model(cfg, args.threads, ParallelMode::Gemm, &args, &peak);
        }
    }
}
