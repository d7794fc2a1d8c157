//! Checkpoint benchmark: write and restore speed of a full checkpoint of a dim-16 Adagrad
//! table, and the size of an incremental checkpoint after 1 % of the rows changed.
//!
//! `cargo run --release -p sparta-checkpoint --example ckpt_bench -- [ROWS] [DIR] [CODEC]`
//! (defaults: 10,000,000 rows, a temporary directory, `zstd`; CODEC is `zstd`, `zstd-plain`
//! (no byte shuffle) or `none`). Files are not `fsync`ed, so the
//! numbers measure the format and the pipeline, not the disk's durability cost.

use std::sync::Arc;
use std::time::Instant;

use sparta_checkpoint::{
    restore_latest, CheckpointState, Checkpointer, Compression, InputPosition, LocalDir,
    RetentionPolicy, Storage, WriteOptions,
};
use sparta_table::{Initializer, Optimizer, Table, TableConfig};

fn state(t: &Table) -> CheckpointState<'_> {
    CheckpointState {
        tables: vec![("emb", t)],
        dense: None,
        step: 1,
        position: InputPosition::default(),
        job_config: "bench",
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rows: usize = args.next().map_or(Ok(10_000_000), |s| s.parse())?;
    let tmp = tempfile::tempdir()?;
    let dir = args
        .next()
        .filter(|d| d != "-")
        .map_or_else(|| tmp.path().to_path_buf(), Into::into);
    let codec = args.next().unwrap_or_else(|| "zstd".into());
    let opts = WriteOptions {
        compression: match codec.as_str() {
            "none" => Compression::None,
            "zstd" | "zstd-plain" => Compression::Zstd { level: 1 },
            other => return Err(format!("unknown codec {other}").into()),
        },
        shuffle: codec == "zstd",
        ..WriteOptions::default()
    };
    let cfg = TableConfig {
        name: "emb".into(),
        dim: 16,
        optimizer: Optimizer::Adagrad {
            lr: 0.05,
            initial_accumulator: 0.1,
            eps: 1e-8,
        },
        init: Initializer::Normal {
            mean: 0.0,
            std: 0.05,
        },
        initial_capacity: rows,
        ..TableConfig::default()
    };
    let table = Table::new(cfg.clone())?;
    let t0 = Instant::now();
    let batch = 8192;
    let mut grads = vec![0f32; batch * 16];
    let mut out = vec![0f32; batch * 16];
    let key =
        |i: usize| ((i as u64 % 26) << 56) | (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 8;
    for start in (0..rows).step_by(batch) {
        let keys: Vec<u64> = (start..(start + batch).min(rows)).map(key).collect();
        let n = keys.len();
        table.pull(&keys, &mut out[..n * 16]);
        for (j, g) in grads[..n * 16].iter_mut().enumerate() {
            *g = ((start * 16 + j) as f32 * 0.618).sin() * 0.1;
        }
        table.push(&keys, &grads[..n * 16]);
    }
    println!(
        "filled {} rows (dim 16, Adagrad: 32 floats/row) in {:.2?}",
        table.len(),
        t0.elapsed()
    );

    let storage = Arc::new(LocalDir::new(&dir)?.with_sync(false));
    let ck =
        Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 }).with_options(opts);
    let raw_mb = rows as f64 * (8.0 + 12.0 + 128.0) / 1e6;
    let t0 = Instant::now();
    let full = ck.write_full(&state(&table))?;
    let w = t0.elapsed().as_secs_f64();
    let full_bytes: u64 = storage
        .list(&format!("{}/", full.dir()))?
        .iter()
        .map(|b| b.size)
        .sum();
    println!(
        "full write:   {:.2} s  {:.2} M rows/s  {:.0} MB/s raw  {:.0} MB/s file; {:.1} MB on disk ({:.1} % of {:.1} MB raw)",
        w, rows as f64 / w / 1e6, raw_mb / w, full_bytes as f64 / 1e6 / w, full_bytes as f64 / 1e6,
        100.0 * full_bytes as f64 / 1e6 / raw_mb, raw_mb
    );

    // Change 1 % of the rows.
    let changed = rows / 100;
    let t0 = Instant::now();
    for start in (0..changed).step_by(batch) {
        let keys: Vec<u64> = (start..(start + batch).min(changed))
            .map(|i| key(i * 100 + 7))
            .collect();
        let n = keys.len();
        table.pull(&keys, &mut out[..n * 16]);
        table.push(&keys, &grads[..n * 16]);
    }
    let touch = t0.elapsed();
    let t0 = Instant::now();
    let inc = ck.write_incremental(&state(&table))?;
    let wi = t0.elapsed().as_secs_f64();
    let inc_bytes: u64 = storage
        .list(&format!("{}/", inc.dir()))?
        .iter()
        .map(|b| b.size)
        .sum();
    println!(
        "incremental after {changed} rows changed ({touch:.2?} to change): write {wi:.2} s, {:.2} MB = {:.2} % of the full checkpoint",
        inc_bytes as f64 / 1e6, 100.0 * inc_bytes as f64 / full_bytes as f64
    );
    drop(table);

    let t0 = Instant::now();
    let r = restore_latest(&*storage, |_, c: &TableConfig| Table::new(c.clone()))?
        .ok_or("nothing to restore")?;
    let rt = t0.elapsed().as_secs_f64();
    let n = r.table("emb").map_or(0, |t| t.len());
    println!(
        "restore full + incremental: {:.2} s  {:.2} M rows/s  {:.0} MB/s raw  {:.0} MB/s file ({n} rows)",
        rt, rows as f64 / rt / 1e6, raw_mb / rt, (full_bytes + inc_bytes) as f64 / 1e6 / rt
    );
    Ok(())
}
