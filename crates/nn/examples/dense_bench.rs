//! Dense-step benchmark (release only):
//! `cargo run --release -p sparta-nn --example dense_bench -- --threads 2`
//!
//! Prints (a) gemm's own f32 GFLOP/s for a 4096x512x512 product on 1..=threads threads and
//! (b) per model (wdl, deepfm, dcn, dcnv2 full rank, dlrm, din with one sequence of
//! `DIN_MAX_LEN` positions, and two-task mmoe (4 experts, towers [64]) and esmm, also with layer
//! norm + dropout 0.1; F=26, D=16, 13 dense, hidden [512,256,128]) the full dense step (forward +
//! backward + Adam) time per batch, samples/s and achieved GFLOP/s, for
//! threads = 1 and, if asked, `threads` in both parallel modes (shard, gemm).

use std::time::Instant;

use sparta_nn::gemm_ops::{matmul_nn, matmul_nt, matmul_tn, Parallelism};
use sparta_nn::{
    Model, ModelBatch, ModelConfig, ModelKind, ParallelMode, SequenceIn, SequenceSpec, TaskSpec,
};

/// din: positions of its one sequence (field 1, against field 0); lengths spread over 1..=it.
const DIN_MAX_LEN: usize = 20;

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

fn pseudo(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
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

fn gemm_peak(threads: usize) -> f64 {
    let (m, k, n) = (4096, 512, 512);
    let a = pseudo(m * k, 1);
    let b = pseudo(k * n, 2);
    let mut c = vec![0.0f32; m * n];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let par = if threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    let mut run = || pool.install(|| matmul_nn(&mut c, n, &a, k, &b, n, (m, k, n), false, par));
    for _ in 0..3 {
        run();
    }
    let reps = 20;
    let t = Instant::now();
    for _ in 0..reps {
        run();
    }
    let secs = t.elapsed().as_secs_f64() / reps as f64;
    2.0 * (m * k * n) as f64 / secs / 1e9
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
        let p = Parallelism::None;
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
    mut cfg: ModelConfig,
    threads: usize,
    parallel: ParallelMode,
    args: &Args,
    peak: &[f64],
) {
    let (f, d, nd) = (cfg.num_fields, cfg.emb_dim, cfg.num_dense);
    let kind = cfg.kind;
    let extras = if cfg.layer_norm { "+ln+do" } else { "" };
    let nt = cfg.num_tasks();
    cfg.threads = threads;
    cfg.parallel = parallel;
    if kind == ModelKind::Din {
        cfg.sequences = vec![SequenceSpec {
            field: 1,
            target: 0,
            max_len: DIN_MAX_LEN,
        }];
    }
    let mut model = Model::new(cfg).expect("model");
    let rows = args.batch;
    let seq_len = if model.attends() { DIN_MAX_LEN * d } else { 0 };
    let seq_values = pseudo(rows * seq_len, 7);
    let lengths: Vec<u32> = (0..rows).map(|r| (r % DIN_MAX_LEN + 1) as u32).collect();
    let seqs: Vec<SequenceIn> = if model.attends() {
        vec![SequenceIn {
            values: &seq_values,
            lengths: &lengths,
        }]
    } else {
        Vec::new()
    };
    let mut d_seq_buf = vec![0.0f32; rows * seq_len];
    let mut d_seq: Vec<&mut [f32]> = if model.attends() {
        vec![&mut d_seq_buf[..]]
    } else {
        Vec::new()
    };
    let emb = pseudo(rows * f * d, 3);
    let wide = pseudo(rows, 4);
    let dense = pseudo(rows * nd, 5);
    let labels: Vec<f32> = pseudo(rows * nt, 6)
        .iter()
        .map(|&x| (x > 0.5) as u8 as f32)
        .collect();
    let batch = ModelBatch {
        rows,
        emb: &emb,
        wide: &wide,
        dense: &dense,
        labels: &labels,
        weights: &[],
        sequences: &seqs,
    };
    let mut d_emb = vec![0.0f32; rows * f * d];
    let mut d_wide = vec![0.0f32; rows];
    for _ in 0..2 {
        model.forward_backward_seq(&batch, &mut d_emb, &mut d_wide, &mut d_seq);
        model.apply_gradients();
    }
    let mut times = Vec::with_capacity(args.iters);
    let cpu0 = cpu_seconds();
    for _ in 0..args.iters {
        let t = Instant::now();
        model.forward_backward_seq(&batch, &mut d_emb, &mut d_wide, &mut d_seq);
        model.apply_gradients();
        times.push(t.elapsed().as_secs_f64());
    }
    let cpu_per_step = (cpu_seconds() - cpu0) / args.iters as f64;
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    let gflop = model.flops_per_sample() * rows as f64 / 1e9;
    println!(
        "{:<13} threads={} mode={:<5} params={:>8} MFLOP/sample={:.3}  step median {:>7.2} ms (min {:>7.2})  {:>9.0} samples/s  {:>6.1} GFLOP/s ({:.0}% of gemm peak)  cpu {:>7.2} ms/step -> {:>6.0} samples/cpu-s",
        format!("{}{extras}", kind.name()),
        threads,
        format!("{parallel:?}").to_lowercase(),
        model.num_params(),
        model.flops_per_sample() / 1e6,
        med * 1e3,
        times[0] * 1e3,
        rows as f64 / med,
        gflop / med,
        100.0 * gflop / med / peak[threads - 1],
        cpu_per_step * 1e3,
        rows as f64 / cpu_per_step,
    );
}

fn main() {
    let args = parse();
    println!("== (a) gemm f32 4096x512x512 (C = A B)");
    let mut peak = Vec::new();
    for t in 1..=args.threads {
        peak.push(gemm_peak(t));
        println!("gemm threads={t}: {:.1} GFLOP/s", peak[t - 1]);
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
