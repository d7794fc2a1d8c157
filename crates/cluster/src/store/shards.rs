//! The cluster's shards as a worker knows them: each shard's `Info` checked against the job,
//! and the list replaced when it changes at a checkpoint round (shards added or removed
//! while training: `sparta scale-ps`). Every worker learns the new list from the same
//! round's answers, so all of them switch between the same two steps.

use std::sync::Arc;

use sparta_core::{CoreError, Routing};
use sparta_proto::auth::AddToken;
use sparta_proto::metrics::Rpc;
use sparta_proto::pb;

use super::{RemoteStore, ShardClient};

impl RemoteStore {
    /// Checks shard `i`'s `Info` (of a cluster of `n` shards) against this worker's job;
    /// returns its dense slice (offset, length).
    pub(super) fn check_info(
        &self,
        i: usize,
        n: usize,
        info: &pb::InfoResponse,
    ) -> Result<(usize, usize), String> {
        if info.shard as usize != i || info.num_shards as usize != n {
            return Err(format!(
                "it is shard {} of {}, but --ps lists it as shard {i} of {n} (list the addresses in shard order)",
                info.shard, info.num_shards
            ));
        }
        if info.workers as usize != self.cfg.num_workers {
            return Err(format!(
                "it expects {} worker(s) but --num-workers is {}",
                info.workers, self.cfg.num_workers
            ));
        }
        if info.dense_total as usize != self.dense_total {
            return Err(format!(
                "it holds a dense vector of {} values, this worker's model has {} (different job configs?)",
                info.dense_total, self.dense_total
            ));
        }
        if info.tables.len() != self.dims.len() {
            return Err(format!(
                "it holds {} tables, this worker's job has {} (different job configs?)",
                info.tables.len(),
                self.dims.len()
            ));
        }
        for (t, (want, name)) in self.dims.iter().zip(&self.names).enumerate() {
            let have = info.tables.iter().find(|x| x.table as usize == t);
            match have {
                Some(x) if x.dim as usize == *want && x.name == *name => {}
                Some(x) => {
                    return Err(format!(
                        "its table {t} is {:?} of dim {}, this worker's job has {name:?} of dim {want} (different job configs?)",
                        x.name, x.dim
                    ))
                }
                None => {
                    return Err(format!(
                        "it has no table {t} ({name:?}) (different job configs?)"
                    ))
                }
            }
        }
        // The first `dense_shards` shards hold the dense vector (the count of the cluster's
        // start); a shard added while training holds none.
        let dense_shards = match info.dense_shards as usize {
            0 => n,
            d => d,
        };
        let (off, len) = if i < dense_shards {
            sparta_proto::dense_slice(self.dense_total, i, dense_shards)
        } else {
            (self.dense_total, 0)
        };
        if info.dense_offset as usize != off || info.dense_len as usize != len {
            return Err("its dense slice differs from this worker's split".into());
        }
        Ok((off, len))
    }

    /// Routes by the slot table of `epoch` (flattened `runs`) if it is newer than the one
    /// this store routes by (a shard's answer after a slot move, or after the cluster's
    /// shards changed: `addrs`, empty when they did not). Added shards are connected and
    /// checked, and told which workers already finished (`finished`: their positions, from
    /// the round's answers), so their barriers do not wait for those; removed ones (at the
    /// end) are dropped.
    pub(crate) fn adopt_routing(
        &self,
        epoch: u64,
        runs: &[u32],
        addrs: &[String],
        finished: &[pb::WorkerPosition],
    ) -> Result<(), CoreError> {
        if epoch <= self.routing.read().0 {
            return Ok(());
        }
        let now = self.shards();
        let n = if addrs.is_empty() {
            now.len()
        } else {
            addrs.len()
        };
        let next = Routing::from_flat_runs(runs, n)
            .map_err(|e| CoreError::Config(format!("the slot table of epoch {epoch}: {e}")))?;
        if n != now.len() {
            let mut shards: Vec<ShardClient> = now.iter().take(n).cloned().collect();
            for (i, addr) in addrs.iter().enumerate().skip(now.len()) {
                shards.push(self.join_shard(i, n, addr, finished)?);
            }
            for (i, (s, a)) in now.iter().zip(addrs).enumerate() {
                if s.addr != *a {
                    tracing::warn!(
                        "PS shard {i}: this worker reaches it at {}, the cluster's list says {a}",
                        s.addr
                    );
                }
            }
            if n < now.len() {
                self.routes.truncate(n);
            }
            for s in shards.iter().skip(now.len()) {
                self.routes
                    .push_fixed(s.addr.clone(), s.client.clone(), s.token.clone());
            }
            tracing::info!(
                "the cluster has {n} PS shard(s) from now on (was {}): {}",
                now.len(),
                shards
                    .iter()
                    .map(|s| s.addr.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            *self.shards.write() = Arc::new(shards);
        }
        tracing::info!(
            "routing by the slot table of epoch {epoch} (slots per shard {:?})",
            next.slots_per_shard()
        );
        *self.routing.write() = (epoch, next);
        Ok(())
    }

    /// Connects to shard `i` (of `n`) at `addr`, added while training: checks its `Info`
    /// (it holds no dense slice) and remembers its incarnation; tells it the workers that
    /// `finished`.
    fn join_shard(
        &self,
        i: usize,
        n: usize,
        addr: &str,
        finished: &[pb::WorkerPosition],
    ) -> Result<ShardClient, CoreError> {
        let bad = |m: String| CoreError::Config(format!("PS shard {i} at {addr} (added): {m}"));
        let token = AddToken::new(&self.cfg.token).map_err(|e| CoreError::Config(e.to_string()))?;
        // With a coordinator, requests name the shard's copy (as the start's shards' do).
        let token = match self.cfg.coordinator {
            Some(_) => token.for_copy(i as u32, 0),
            None => token.for_shard(),
        };
        let client = {
            let _g = self.rt.enter();
            (self.connect)(addr, token.clone()).map_err(|e| bad(e.to_string()))?
        };
        let info = self
            .rt
            .block_on(client.clone().info(pb::InfoRequest {}))
            .map_err(|s| bad(format!("info: {}", s.message())))?
            .into_inner();
        let (dense_offset, dense_len) = self.check_info(i, n, &info).map_err(bad)?;
        if dense_len != 0 {
            return Err(bad(
                "a shard added while training must hold no dense slice".into()
            ));
        }
        let origin = self
            .rt
            .block_on(client.clone().origin(pb::OriginRequest {}))
            .map_err(|s| bad(format!("origin: {}", s.message())))?
            .into_inner();
        token.expect_incarnation(origin.incarnation);
        for w in finished.iter().filter(|w| w.done) {
            // Its final position, as the other shards recorded it: this shard's checkpoint
            // barrier does not wait for it.
            let req = pb::CheckpointRequest {
                position: Some(w.clone()),
                leaving: true,
                ..Default::default()
            };
            let m = self.metrics.start(Rpc::Checkpoint);
            self.rt
                .block_on(client.clone().checkpoint(req))
                .map_err(|s| {
                    bad(format!(
                        "telling it worker {} finished: {}",
                        w.rank,
                        s.message()
                    ))
                })?;
            m.finish(true, 0, 0, 0);
        }
        Ok(ShardClient {
            addr: addr.to_string(),
            client,
            token,
            dense_offset,
            dense_len,
            origin,
            unsent_steps: Arc::default(),
        })
    }
}
