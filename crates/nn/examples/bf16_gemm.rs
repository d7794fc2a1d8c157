//! The bf16 kernels against f32 on one thread (BENCHMARKS.md, "bf16 without AMX"): the rate of
//! `VDPBF16PS` and of f32 FMAs on this core, then GFLOP/s of `C = A B` (best of 5 after 2
//! warm-ups) in f32, as the rounded fallback runs it (operands rounded to bf16, then the f32
//! GEMM), and on the AVX-512 BF16 dot products where the CPU has them.
//!
//! `cargo run --release -p sparta-nn --example bf16_gemm`

#![cfg_attr(not(target_arch = "x86_64"), allow(unused))]

use std::time::Instant;

#[cfg(target_arch = "x86_64")]
use sparta_nn::amx::Operand;
use sparta_nn::epilogue::Epilogue;
use sparta_nn::gemm_ops::{bf16_kernel, matmul_nn, round_bf16, Compute};

/// Seconds of the fastest of 5 runs of `f`, after 2 warm-ups.
fn best(mut f: impl FnMut()) -> f64 {
    for _ in 0..2 {
        f();
    }
    (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("the bf16 kernels are x86-64 only");
}

#[cfg(target_arch = "x86_64")]
fn main() {
    println!("bf16 kernel chosen here: {}", bf16_kernel().name());
    match sparta_nn::dpbf16::flop_rates() {
        Some((dot, fma)) => {
            println!("one core, GFLOP/s: VDPBF16PS {dot:.1}, VFMADD {fma:.1}")
        }
        None => println!("no AVX-512 BF16 here: the dot-product column is left out"),
    }
    let dots = sparta_nn::dpbf16::available();
    for (m, k, n) in [
        (4096, 512, 512),
        (4096, 429, 512),
        (4096, 512, 256),
        (4096, 1024, 1024),
        (4096, 221, 400),
        (4096, 400, 400),
    ] {
        let a = sparta_nn::bench::pseudo(m * k, 1);
        let b = sparta_nn::bench::pseudo(k * n, 2);
        let mut c = vec![0f32; m * n];
        let gflop = 2.0 * (m * k * n) as f64 / 1e9;
        let f32s = best(|| matmul_nn(&mut c, n, &a, k, &b, n, (m, k, n), false, Compute::SERIAL));
        let rounded = best(|| {
            let a16: Vec<f32> = a.iter().map(|&x| round_bf16(x)).collect();
            let b16: Vec<f32> = b.iter().map(|&x| round_bf16(x)).collect();
            matmul_nn(
                &mut c,
                n,
                &a16,
                k,
                &b16,
                n,
                (m, k, n),
                false,
                Compute::SERIAL,
            )
        });
        let mut line = format!(
            "{m}x{k}x{n}, 1 thread, GFLOP/s: f32 {:.1}, rounded + f32 GEMM {:.1}",
            gflop / f32s,
            gflop / rounded
        );
        if dots {
            let d = best(|| {
                let lhs = Operand {
                    data: &a,
                    rs: k,
                    cs: 1,
                };
                let rhs = Operand {
                    data: &b,
                    rs: n,
                    cs: 1,
                };
                sparta_nn::dpbf16::gemm(&mut c, n, lhs, rhs, (m, k, n), false, Epilogue::None, 1)
            });
            line += &format!(", VDPBF16PS {:.1}", gflop / d);
        }
        println!("{line}");
    }
}
