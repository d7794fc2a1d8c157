//! Bounded tables on a shard: after every applied push the shard's clock advances by the steps
//! the workers trained since their previous push, tables with eviction are scanned
//! incrementally (as the embedded trainer does after every step), and a shard with a memory
//! cap (`--memory-limit`, `[ps] memory_limit`) over 90 % of it evicts its stalest rows down to
//! 80 %. The keys removed go to the backups in the push's replication op.

use sparta_table::{EVICT_SCAN_MIN, EVICT_SCAN_PER_KEY};

use super::Shard;

/// Share of the cap above which a shard evicts its stalest rows (the high-water mark): what
/// `sparta plan` keeps a shard's rows under.
pub const CAP_HIGH: f64 = 0.9;
/// Share of the cap a shard evicts down to (the low-water mark).
pub const CAP_LOW: f64 = 0.8;
/// Bytes the cap counts per dense parameter of a shard's slice: value, pending gradient and
/// two optimizer moments (an upper bound).
pub const DENSE_BYTES_PER_PARAM: u64 = 16;

impl Shard {
    /// Advances every table's clock by `steps`, evicts on tables with eviction (a window of
    /// `EVICT_SCAN_PER_KEY` slots per key of the push, at least `EVICT_SCAN_MIN`) and, over
    /// the memory cap, the stalest rows. Returns the keys removed, per table. Runs inside a
    /// push's apply (once per push id), under the replication order lock when there are
    /// backups.
    pub(super) fn after_push(&self, steps: u32, keys: usize) -> Vec<Vec<u64>> {
        let window = (keys * EVICT_SCAN_PER_KEY).max(EVICT_SCAN_MIN);
        let mut removed = vec![Vec::new(); self.tables.len()];
        for (t, out) in self.tables.iter().zip(&mut removed) {
            if steps > 0 {
                t.advance_steps(steps);
            }
            if t.config().eviction.is_some() {
                t.evict_collect(window, out);
            }
        }
        if let Some(limit) = self.memory_limit {
            self.enforce_cap(limit, &mut removed);
        }
        removed
    }

    /// Bytes of the dense slice a shard holds: [`DENSE_BYTES_PER_PARAM`] per parameter.
    fn dense_bytes(&self) -> u64 {
        self.dense.len() as u64 * DENSE_BYTES_PER_PARAM
    }

    /// What the memory cap counts: every table's bytes less its free slots
    /// ([`sparta_table::Table::used_bytes`]) plus the dense slice.
    pub fn used_bytes(&self) -> u64 {
        self.tables
            .iter()
            .map(|t| t.used_bytes() as u64)
            .sum::<u64>()
            + self.dense_bytes()
    }

    /// Over `CAP_HIGH` of `limit`: evicts the stalest rows of every table (in proportion to
    /// the bytes of its rows) until the shard is back at `CAP_LOW`. One push at a time does
    /// it; the others go on.
    fn enforce_cap(&self, limit: u64, removed: &mut [Vec<u64>]) {
        let Some(_one) = self.capping.try_lock() else {
            return;
        };
        let used = self.used_bytes();
        if (used as f64) <= limit as f64 * CAP_HIGH {
            return;
        }
        let need = used as f64 - limit as f64 * CAP_LOW;
        let row_bytes: Vec<f64> = self
            .tables
            .iter()
            .map(|t| (t.len() * t.row_bytes()) as f64)
            .collect();
        let total: f64 = row_bytes.iter().sum();
        if total <= 0.0 {
            return;
        }
        let mut gone = 0;
        for ((t, out), rb) in self.tables.iter().zip(removed.iter_mut()).zip(&row_bytes) {
            let rows = (need * rb / total / t.row_bytes() as f64).ceil() as usize;
            gone += t.evict_stalest(rows.min(t.len()), out);
        }
        tracing::info!(
            "PS shard {}: {:.1} MiB used of a {:.1} MiB memory limit: evicted the {gone} \
             stalest rows",
            self.cfg.shard,
            used as f64 / (1u64 << 20) as f64,
            limit as f64 / (1u64 << 20) as f64
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sparta_core::JobConfig;
    use sparta_proto::metrics::Metrics;
    use sparta_proto::pb;
    use sparta_proto::pb::parameter_server_server::ParameterServer;
    use sparta_proto::wire::{self, Compression};
    use tonic::Request;

    use super::super::{PsConfig, Service, Shard};
    use crate::dense::Mode;

    fn shard(extra: &str) -> Arc<Shard> {
        let job = JobConfig::from_toml(&format!(
            "[embedding]\ndim = 2\neviction = {{ max_idle_steps = 3 }}\n{extra}[model]\nkind = \
             \"deepfm\"\nhidden = [4]\n"
        ))
        .unwrap()
        .validate()
        .unwrap();
        let cfg = PsConfig {
            shard: 0,
            num_shards: 1,
            dense_shards: None,
            workers: 1,
            mode: Mode::Async,
            token: "t".into(),
            max_message_bytes: 1 << 20,
            tls: None,
            checkpoint: None,
            barrier_warn: crate::stall::DEFAULT_WARN_AFTER,
            fault: Default::default(),
            replication: Default::default(),
        };
        Arc::new(Shard::new(&job, cfg, Arc::new(Metrics::new("ps"))).unwrap())
    }

    fn push(keys: &[u64], steps: u32, seq: u64) -> pb::PushRequest {
        pb::PushRequest {
            keys: wire::keys_to_bytes(keys),
            tables: vec![pb::TableGrads {
                table: 0,
                dim: 2,
                grads: wire::values_to_bytes(&vec![0.5; keys.len() * 2], Compression::None),
                classes: 0,
            }],
            compression: Compression::None.to_proto() as i32,
            class_offsets: vec![],
            id: Some(pb::PushId {
                rank: 0,
                session: 9,
                seq,
            }),
            steps,
        }
    }

    #[tokio::test]
    async fn a_retried_push_does_not_advance_the_clock_twice() {
        let s = shard("");
        let svc = Service {
            shard: Arc::clone(&s),
        };
        svc.push(Request::new(push(&[1, 2], 2, 0))).await.unwrap();
        assert_eq!(s.tables[0].step(), 2);
        // The same push id again (its answer was lost): answered, not applied.
        svc.push(Request::new(push(&[1, 2], 2, 0))).await.unwrap();
        assert_eq!(s.tables[0].step(), 2, "the retry advanced the clock");
        svc.push(Request::new(push(&[1, 2], 3, 1))).await.unwrap();
        assert_eq!(
            s.tables.iter().map(|t| t.step()).collect::<Vec<_>>(),
            [5, 5]
        );
    }

    #[tokio::test]
    async fn pushes_evict_idle_rows_and_count_admission_applies_on_shards() {
        let s = shard("admission = { type = \"count\", min_count = 2 }\n");
        let svc = Service {
            shard: Arc::clone(&s),
        };
        let t = &s.tables[0];
        let pull = |keys: &[u64]| pb::PullRequest {
            keys: wire::keys_to_bytes(keys),
            tables: vec![pb::TableSpec {
                table: 0,
                dim: 2,
                classes: 0,
            }],
            create: true,
            ..Default::default()
        };
        // Admission by count: the first sighting (a pull with create) makes no row.
        svc.pull(Request::new(pull(&[1, 2]))).await.unwrap();
        assert!(!t.contains(1) && !t.contains(2));
        svc.pull(Request::new(pull(&[1, 2]))).await.unwrap();
        assert!(t.contains(1) && t.contains(2));
        // Key 1 stays in use; key 2 idles past max_idle_steps = 3 and the push evicts it.
        for seq in 0..5 {
            svc.pull(Request::new(pull(&[1]))).await.unwrap();
            svc.push(Request::new(push(&[1], 1, seq))).await.unwrap();
        }
        assert!(t.contains(1));
        assert!(!t.contains(2), "key 2 idle for 5 steps is evicted");
        assert_eq!(t.evictions().idle_steps, 1);
        let m = s.metrics().render();
        assert!(
            m.contains(
                "sparta_evicted_rows_total{role=\"ps\",table=\"embedding\",reason=\"idle_steps\"} 1"
            ),
            "{m}"
        );
    }
}
