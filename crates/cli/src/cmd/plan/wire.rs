//! Wire bytes per sample: the sample data read by the job's reader in batches of its batch
//! size, each batch's ids deduplicated and grouped by shard as a worker's step does
//! (`Deduper::run_classed` on the routing of the planned PS count), and the requests and
//! answers of that step counted as a worker's metrics count them
//! (`sparta_cluster::report::{sparse_step_bytes, dense_step_bytes}`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use sparta_core::dedup::{Deduper, UniqueIds};
use sparta_core::{Job, Routing};
use sparta_proto::wire::Compression;

/// A worker's traffic, measured on the sample data.
#[derive(Clone, Debug)]
pub struct WireBytes {
    /// Rows read.
    pub rows: u64,
    /// Batches (steps) they made.
    pub steps: u64,
    /// Distinct ids per sample, over all tables (each pulled and pushed once per step).
    pub ids_per_sample: f64,
    /// Per physical table: the rows per sample it serves (the distinct ids of the classes it
    /// holds rows of).
    pub table_rows_per_sample: Vec<f64>,
    /// Sparse bytes per sample: every step's pulls and pushes over the rows read.
    pub sparse_per_sample: f64,
    /// Dense bytes of one step (a push-pull with every shard).
    pub dense_per_step: u64,
    /// Dense bytes per sample: one step's over the batch size (full batches).
    pub dense_per_sample: f64,
}

/// Reads `paths` with `job`'s reader (its batch size and row limit) and counts a worker's
/// bytes on a cluster of `ps` shards with values encoded as `compression`.
pub fn measure_wire(
    job: &Job,
    paths: &[PathBuf],
    ps: usize,
    compression: Compression,
    dense_params: usize,
) -> Result<WireBytes> {
    let f = &job.features;
    let routing = Routing::even(ps);
    let mut dedup = Deduper::new();
    let mut unique = UniqueIds::default();
    let (mut rows, mut steps, mut ids, mut sparse) = (0u64, 0u64, 0u64, 0u64);
    let mut table_rows = vec![0u64; f.physical.len()];
    let stream =
        sparta_data::read_batches(paths, &job.reader).context("reading the sample data")?;
    for batch in stream {
        let batch = batch.context("reading the sample data")?;
        if batch.rows == 0 {
            continue;
        }
        dedup.run_classed(
            &batch.ids,
            &routing,
            &f.class_of_tag,
            f.num_classes,
            &mut unique,
        );
        let parts = unique.parts();
        for (n, p) in table_rows.iter_mut().zip(&f.physical) {
            *n += parts.total(p.classes) as u64;
        }
        ids += unique.len() as u64;
        sparse += sparta_cluster::report::sparse_step_bytes(f, &parts, compression);
        rows += batch.rows as u64;
        steps += 1;
    }
    anyhow::ensure!(rows > 0, "the sample data holds no row");
    let per = |x: u64| x as f64 / rows as f64;
    let dense_per_step = sparta_cluster::report::dense_step_bytes(dense_params, ps);
    Ok(WireBytes {
        rows,
        steps,
        ids_per_sample: per(ids),
        table_rows_per_sample: table_rows.into_iter().map(per).collect(),
        sparse_per_sample: per(sparse),
        dense_per_step,
        dense_per_sample: dense_per_step as f64 / job.raw.data.batch_size.max(1) as f64,
    })
}
