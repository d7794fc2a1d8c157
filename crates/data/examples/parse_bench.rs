//! Release-only parse throughput benchmark.
//!
//! `cargo run --release -p sparta-data --example parse_bench -- [FILE] [THREADS]`
//! (default FILE /work/data/train.tsv, THREADS 1). Reports MB/s and rows/s per core for
//! the bare line parser, the plain-file reader and the gzip reader (on the first 64 MiB).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use sparta_data::{read_batches, BatchBuilder, LineParser, ReaderConfig, Schema};

fn report(what: &str, bytes: u64, rows: u64, secs: f64, cores: usize) {
    let mb = bytes as f64 / 1e6;
    println!(
        "{what:<28} {mb:>8.1} MB {rows:>9} rows {secs:>6.3} s  {:>7.1} MB/s/core  {:>9.0} rows/s/core ({cores} core(s))",
        mb / secs / cores as f64,
        rows as f64 / secs / cores as f64,
    );
}

fn stream(path: PathBuf, threads: usize) -> (u64, u64, f64) {
    let cfg = ReaderConfig {
        threads,
        queue_batches: 2 * threads + 2,
        ..ReaderConfig::new(Schema::criteo())
    };
    let t = Instant::now();
    let mut s = read_batches(&[path], &cfg).expect("open");
    let stats = s.stats();
    for b in s.by_ref() {
        b.expect("batch");
    }
    (stats.bytes(), stats.rows(), t.elapsed().as_secs_f64())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().unwrap_or_else(|| "/work/data/train.tsv".into()));
    let threads: usize = args.next().map_or(1, |t| t.parse().expect("THREADS"));
    let data = std::fs::read(&path).expect("read input");

    // bare parser on one core, data in memory
    let parser = LineParser::new(&Schema::criteo());
    let mut b = BatchBuilder::new(26, 13, 4096);
    let t = Instant::now();
    let mut rows = 0u64;
    for line in data.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
        if parser.parse_line(line, &mut b).is_ok() && b.rows() == 4096 {
            rows += b.take().rows as u64;
        }
    }
    rows += b.take().rows as u64;
    report(
        "line parser (in memory)",
        data.len() as u64,
        rows,
        t.elapsed().as_secs_f64(),
        1,
    );

    let (bytes, rows, secs) = stream(path.clone(), threads);
    report(
        &format!("plain reader, {threads} thr"),
        bytes,
        rows,
        secs,
        threads,
    );

    let cut = data.len().min(64 << 20);
    let cut = data[..cut]
        .iter()
        .rposition(|&c| c == b'\n')
        .map_or(cut, |p| p + 1);
    let dir = std::env::temp_dir().join(format!("sparta-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gz = dir.join("bench.tsv.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::default(),
    );
    enc.write_all(&data[..cut]).unwrap();
    enc.finish().unwrap();
    let (bytes, rows, secs) = stream(gz.clone(), threads);
    // the decompressing feeder thread is the bottleneck: report per feeder core
    report(&format!("gzip reader, {threads} thr"), bytes, rows, secs, 1);
    std::fs::remove_dir_all(&dir).ok();
}
