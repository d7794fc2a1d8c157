//! Release-only reader benchmark: wall and CPU time of `read_batches` over a file.
//!
//! `cargo run --release -p sparta-data --example read_bench -- [FILE] [THREADS] [REPS]`
//! (default /work/data/train.tsv, 2 threads, 5 repetitions). CPU time is the whole process's
//! user + system time (from `/proc/self/stat`, Linux only), which is less disturbed than wall
//! time when other work shares the machine. Prints the best of the repetitions.

use std::path::PathBuf;
use std::time::Instant;

use sparta_data::{read_batches, ReaderConfig, Schema};

/// User + system CPU seconds of this process so far (0 where `/proc` is missing).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|s| s.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    ticks / 100.0 // USER_HZ is 100 on Linux
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().unwrap_or_else(|| "/work/data/train.tsv".into()));
    let threads: usize = args.next().map_or(2, |t| t.parse().expect("THREADS"));
    let reps: usize = args.next().map_or(5, |t| t.parse().expect("REPS"));
    let cfg = ReaderConfig {
        threads,
        queue_batches: 2 * threads + 2,
        ..ReaderConfig::new(Schema::criteo())
    };
    let (mut best_wall, mut best_cpu) = (f64::MAX, f64::MAX);
    let (mut rows, mut bytes) = (0, 0);
    for _ in 0..reps {
        let (t, c) = (Instant::now(), cpu_seconds());
        let mut s = read_batches(std::slice::from_ref(&path), &cfg).expect("open");
        for b in s.by_ref() {
            std::hint::black_box(b.expect("batch"));
        }
        best_wall = best_wall.min(t.elapsed().as_secs_f64());
        best_cpu = best_cpu.min(cpu_seconds() - c);
        let st = s.stats().snapshot();
        (rows, bytes) = (st.rows, st.bytes);
    }
    println!(
        "{threads} thr: {rows} rows {:.1} MB  best wall {best_wall:.3} s ({:.0} rows/s)  best cpu {best_cpu:.2} s ({:.0} rows/cpu-s)",
        bytes as f64 / 1e6,
        rows as f64 / best_wall,
        rows as f64 / best_cpu,
    );
}
