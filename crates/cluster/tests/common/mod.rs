//! Helpers shared by the in-process cluster tests: a shard served on loopback, and one step
//! of pulls and pushes through a store.
#![allow(dead_code)]

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use sparta_core::dedup::{Deduper, UniqueIds};
use sparta_core::{CoreError, Job, PullInto, PushFrom, SparseStore, TableId};
use sparta_proto::Metrics;
use sparta_ps::server::serve;
use sparta_ps::{PsConfig, Shard};

/// Builds the shard of `cfg` for `job` and serves it on a loopback port in a thread of its
/// own (its own runtime); returns the address.
pub fn serve_shard(job: &Job, cfg: PsConfig) -> String {
    let shard = Arc::new(Shard::new(job, cfg, Arc::new(Metrics::new("ps"))).unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap().to_string()).unwrap();
            serve(l, shard, std::future::pending()).await.unwrap();
        });
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap()
}

/// One step through `store`, routed by its own slot table: pulls `keys` (spread over the
/// job's tables by their tags; `create`: rows are made) and, with `push`, pushes
/// `0.5 * value + 0.01` for each value read. Returns every row read as (table, key, value
/// bits), sorted.
#[allow(clippy::type_complexity)]
pub fn step(
    store: &dyn SparseStore,
    job: &Job,
    keys: &[u64],
    create: bool,
    push: bool,
) -> Result<Vec<(usize, u64, Vec<u32>)>, CoreError> {
    let f = &job.features;
    let mut dedup = Deduper::new();
    let mut u = UniqueIds::default();
    dedup.run_classed(
        keys,
        &store.routing(),
        &f.class_of_tag,
        f.num_classes,
        &mut u,
    );
    let parts = u.parts();
    let mut rows: Vec<Vec<f32>> = f
        .physical
        .iter()
        .map(|p| vec![0.0; parts.total(p.classes) * p.config.dim])
        .collect();
    let mut into: Vec<PullInto<'_>> = rows
        .iter_mut()
        .zip(&f.physical)
        .enumerate()
        .map(|(t, (values, p))| PullInto {
            table: TableId(t as u16),
            classes: p.classes,
            values,
        })
        .collect();
    store.pull(&parts, &mut into, create)?;
    let mut seen = Vec::new();
    for (t, p) in f.physical.iter().enumerate() {
        let dim = p.config.dim;
        let mut at = 0;
        for s in 0..parts.num_shards() {
            for r in parts.ranges(s, p.classes) {
                for &k in &parts.keys[r] {
                    let v = rows[t][at * dim..(at + 1) * dim]
                        .iter()
                        .map(|x| x.to_bits());
                    seen.push((t, k, v.collect()));
                    at += 1;
                }
            }
        }
    }
    if push {
        let grads: Vec<Vec<f32>> = rows
            .iter()
            .map(|r| r.iter().map(|v| 0.5 * v + 0.01).collect())
            .collect();
        store.push(&parts, &PushFrom::per_table(&grads, f))?;
    }
    seen.sort();
    Ok(seen)
}
