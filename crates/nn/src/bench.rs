//! Measurements of the dense work, shared by `sparta bench train` and the `dense_bench`
//! example: gemm's own f32 throughput on a set of shapes (the machine's measured GEMM peak) and
//! one model's dense step (forward + backward + optimizer) on synthetic inputs. Wall-clock
//! timing only; callers print.

use std::time::Instant;

use crate::gemm_ops::{matmul_nn, Compute, Precision};
use crate::{Model, ModelBatch, ModelConfig, ParallelMode, SequenceIn, SequenceSpec};

/// Shapes (m, k, n) of `C = A B` whose best throughput is the GEMM peak: a square-ish product
/// and the wide layers of the default MLP at a batch of 4096 rows.
pub const PEAK_SHAPES: [(usize, usize, usize); 4] = [
    (4096, 512, 512),
    (4096, 429, 512),
    (4096, 512, 256),
    (4096, 1024, 1024),
];

/// Positions of the synthetic behaviour sequence a din step attends over.
pub const DIN_MAX_LEN: usize = 20;

/// Deterministic values in [-1, 1).
pub fn pseudo(n: usize, seed: u64) -> Vec<f32> {
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

/// gemm's f32 GFLOP/s for `C = A B` of shape `(m, k, n)` on `threads` threads (best of
/// `reps` timed products after warm-up).
pub fn gemm_gflops(threads: usize, shape: (usize, usize, usize), reps: usize) -> f64 {
    gemm_gflops_at(Precision::F32, threads, shape, reps)
}

/// [`gemm_gflops`] in `precision` (bf16: AMX tiles where the CPU has them).
pub fn gemm_gflops_at(
    precision: Precision,
    threads: usize,
    (m, k, n): (usize, usize, usize),
    reps: usize,
) -> f64 {
    let a = pseudo(m * k, 1);
    let b = pseudo(k * n, 2);
    let mut c = vec![0.0f32; m * n];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .expect("a rayon pool");
    let par = if threads > 1 {
        Compute::rayon(threads)
    } else {
        Compute::SERIAL
    }
    .with_precision(precision);
    let mut run = || pool.install(|| matmul_nn(&mut c, n, &a, k, &b, n, (m, k, n), false, par));
    for _ in 0..3 {
        run();
    }
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        run();
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (m * k * n) as f64 / best / 1e9
}

/// The f32 GEMM peak on `threads` threads: the best of [`PEAK_SHAPES`], with its shape.
pub fn gemm_peak(threads: usize) -> (f64, (usize, usize, usize)) {
    gemm_peak_at(Precision::F32, threads)
}

/// [`gemm_peak`] in `precision`.
pub fn gemm_peak_at(precision: Precision, threads: usize) -> (f64, (usize, usize, usize)) {
    PEAK_SHAPES
        .iter()
        .map(|&s| (gemm_gflops_at(precision, threads, s, 10), s))
        .fold((0.0, PEAK_SHAPES[0]), |a, b| if b.0 > a.0 { b } else { a })
}

/// One model's dense step, timed.
#[derive(Clone, Debug)]
pub struct DenseStep {
    /// Model parameters.
    pub params: usize,
    /// Forward + backward FLOPs per sample, millions.
    pub mflop_per_sample: f64,
    /// Median and fastest step, seconds.
    pub median_secs: f64,
    /// Fastest step, seconds.
    pub min_secs: f64,
    /// Samples per second at the median step.
    pub samples_per_sec: f64,
    /// GFLOP/s at the median step.
    pub gflops: f64,
}

/// Times `iters` dense steps (forward + backward + optimizer) of `cfg` on synthetic inputs
/// of `rows` rows, with the config's threads and parallel mode. A din config attends over one
/// sequence of [`DIN_MAX_LEN`] positions (field 1 against field 0) unless it names its own.
pub fn dense_step(mut cfg: ModelConfig, rows: usize, iters: usize) -> DenseStep {
    if cfg.kind == crate::ModelKind::Din && cfg.sequences.is_empty() {
        cfg.sequences = vec![SequenceSpec {
            field: 1,
            target: 0,
            max_len: DIN_MAX_LEN,
        }];
    }
    let (width, nd, nt) = (cfg.emb_width(), cfg.num_dense, cfg.num_tasks());
    let seq_widths: Vec<usize> = cfg
        .sequences
        .iter()
        .map(|s| s.max_len * cfg.field_width(s.field))
        .collect();
    let mut model = Model::new(cfg).expect("a valid benchmark model");
    let attends = model.attends();
    // Per sequence: its values and lengths spread over 1..=max_len.
    let seq_data: Vec<(Vec<f32>, Vec<u32>)> = if attends {
        seq_widths
            .iter()
            .zip(&model.config().sequences)
            .enumerate()
            .map(|(i, (&w, s))| {
                let lengths = (0..rows).map(|r| (r % s.max_len + 1) as u32).collect();
                (pseudo(rows * w, 7 + i as u64), lengths)
            })
            .collect()
    } else {
        Vec::new()
    };
    let seqs: Vec<SequenceIn> = seq_data
        .iter()
        .map(|(values, lengths)| SequenceIn { values, lengths })
        .collect();
    let mut d_seq_bufs: Vec<Vec<f32>> = seq_data.iter().map(|(v, _)| vec![0.0; v.len()]).collect();
    let mut d_seq: Vec<&mut [f32]> = d_seq_bufs.iter_mut().map(|b| &mut b[..]).collect();
    let emb = pseudo(rows * width, 3);
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
    let mut d_emb = vec![0.0f32; rows * width];
    let mut d_wide = vec![0.0f32; rows];
    for _ in 0..2 {
        model.forward_backward_seq(&batch, &mut d_emb, &mut d_wide, &mut d_seq);
        model.apply_gradients();
    }
    let mut times = Vec::with_capacity(iters.max(1));
    for _ in 0..iters.max(1) {
        let t = Instant::now();
        model.forward_backward_seq(&batch, &mut d_emb, &mut d_wide, &mut d_seq);
        model.apply_gradients();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let flops = model.flops_per_sample();
    DenseStep {
        params: model.num_params(),
        mflop_per_sample: flops / 1e6,
        median_secs: median,
        min_secs: times[0],
        samples_per_sec: rows as f64 / median,
        gflops: flops * rows as f64 / median / 1e9,
    }
}

/// `cfg` with `threads` threads in `mode`.
pub fn with_threads(mut cfg: ModelConfig, threads: usize, mode: ParallelMode) -> ModelConfig {
    cfg.threads = threads;
    cfg.parallel = mode;
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelKind;

    #[test]
    fn a_dense_step_reports_the_models_flops() {
        let cfg = with_threads(
            ModelConfig::new(ModelKind::Wdl, 4, 4, 2),
            1,
            ParallelMode::Shard,
        );
        let want = Model::new(cfg.clone()).unwrap().flops_per_sample() / 1e6;
        let r = dense_step(cfg, 64, 2);
        assert_eq!(r.mflop_per_sample, want);
        assert!(r.median_secs > 0.0 && r.min_secs <= r.median_secs);
        let rel = (r.gflops - r.samples_per_sec * want / 1e3).abs() / r.gflops;
        assert!(rel < 1e-9, "{r:?}");
    }

    #[test]
    fn din_gets_a_sequence_to_attend_over() {
        let cfg = with_threads(
            ModelConfig::new(ModelKind::Din, 3, 4, 1),
            1,
            ParallelMode::Shard,
        );
        let mut with_seq = cfg.clone();
        with_seq.sequences = vec![SequenceSpec {
            field: 1,
            target: 0,
            max_len: DIN_MAX_LEN,
        }];
        let want = Model::new(with_seq).unwrap().flops_per_sample() / 1e6;
        let r = dense_step(cfg, 32, 1);
        assert_eq!(r.mflop_per_sample, want);
    }

    #[test]
    fn gemm_throughput_is_positive_and_finite() {
        let g = gemm_gflops(1, (64, 32, 16), 2);
        assert!(g.is_finite() && g > 0.0);
    }
}
