//! The benchmark runs end to end on a tiny workload and reports sane numbers.
use sparta_table::bench::{run_table_bench, BenchConfig, Zipf};

#[test]
fn tiny_bench_runs_all_structures() {
    let cfg = BenchConfig {
        keys: 20_000,
        dim: 4,
        threads: 2,
        batch: 256,
        batches_per_thread: 3,
        ..BenchConfig::default()
    };
    let r = run_table_bench(&cfg);
    assert_eq!(r.results.len(), 6);
    for s in &r.results {
        assert!(
            s.pull_per_sec > 0.0 && s.push_per_sec > 0.0 && s.mixed_per_sec > 0.0,
            "{s:?}"
        );
        assert_eq!(s.payload_bytes_per_row, 8 + 4 * 8);
    }
    assert_eq!(r.table_stats.rows, 20_000);
    assert_eq!(r.mixed_speedup_vs_best_baseline.len(), 2);
    let json = serde_json::to_string(&r).unwrap();
    assert!(json.contains("\"mixed_per_sec\""));
}

#[test]
fn zipf_is_skewed_and_in_range() {
    let z = Zipf::new(1000, 1.1);
    let mut counts = vec![0u32; 1000];
    for i in 0..100_000 {
        let r = z.sample(i as f64 / 100_000.0) as usize;
        counts[r] += 1;
    }
    assert!(counts[0] > counts[10] && counts[10] > counts[500]);
    assert!(counts[0] > 5_000);
}
