//! The dense parameters on the shards: each holds one contiguous slice of the flat vector
//! (`sparta_proto::dense_slice`); the worker cuts its pushes and pulls by those slices.

use std::sync::atomic::Ordering::Relaxed;

use sparta_core::{CoreError, DenseStore};
use sparta_nn::optim::OptimizerState;
use sparta_proto::metrics::Rpc;
use sparta_proto::pb;
use sparta_proto::wire::{self, Compression};
use sparta_proto::WireError;

use super::{transport, RemoteStore};

impl RemoteStore {
    fn dense_slices<'a>(&self, v: &'a [f32]) -> impl Iterator<Item = (usize, &'a [f32])> + 'a {
        let ranges: Vec<(usize, usize)> = self
            .shards()
            .iter()
            .map(|s| (s.dense_offset, s.dense_len))
            .collect();
        ranges
            .into_iter()
            .enumerate()
            .filter(|(_, (_, len))| *len > 0)
            .map(move |(i, (off, len))| (i, &v[off..off + len]))
    }

    fn check_dense_len(&self, n: usize) -> Result<(), CoreError> {
        if n != self.dense_total {
            return Err(CoreError::Training(format!(
                "dense vector of {n} values, the cluster holds {}",
                self.dense_total
            )));
        }
        Ok(())
    }

    fn write_dense(
        &self,
        resps: Vec<(usize, pb::DenseResponse)>,
        params: &mut [f32],
    ) -> Result<(), CoreError> {
        for (i, r) in resps {
            let s = &self.shards()[i];
            wire::values_into(
                &r.values,
                Compression::None,
                &mut params[s.dense_offset..s.dense_offset + s.dense_len],
            )
            .map_err(|e| transport(format!("PS shard {i} at {}: dense reply: {e}", s.addr)))?;
        }
        Ok(())
    }

    /// Offers `params` as the initial dense values (the first worker's offer wins on each
    /// shard) and overwrites them with what the cluster holds.
    pub fn init_dense(&self, params: &mut [f32]) -> Result<(), CoreError> {
        self.check_dense_len(params.len())?;
        let total = self.dense_total as u64;
        let reqs = self
            .dense_slices(params)
            .map(|(i, s)| {
                let r = pb::DenseInitRequest {
                    total,
                    values: wire::values_to_bytes(s, Compression::None),
                };
                (i, r, s.len() as u64)
            })
            .collect();
        let resps = self.fan_out(Rpc::DenseInit, "dense init", reqs, |mut c, r| async move {
            c.dense_init(r).await
        })?;
        self.write_dense(resps, params)
    }

    /// One read request per shard holding part of `params` (checked against the cluster's
    /// dense length).
    fn dense_pull_requests(
        &self,
        params: &[f32],
    ) -> Result<Vec<(usize, pb::DensePullRequest, u64)>, CoreError> {
        self.check_dense_len(params.len())?;
        let total = self.dense_total as u64;
        Ok(self
            .dense_slices(params)
            .map(|(i, s)| (i, pb::DensePullRequest { total }, s.len() as u64))
            .collect())
    }

    /// Reads the current dense values without changing them.
    pub fn pull_dense(&self, params: &mut [f32]) -> Result<(), CoreError> {
        let reqs = self.dense_pull_requests(params)?;
        let resps = self.fan_out(Rpc::DensePull, "dense pull", reqs, |mut c, r| async move {
            c.dense_pull(r).await
        })?;
        self.write_dense(resps, params)
    }

    /// Dense mode allreduce: the cluster's dense values and optimizer state (the whole
    /// vector, assembled from the shards' slices), as a starting worker takes them.
    pub fn dense_state(&self, params: &mut [f32]) -> Result<OptimizerState, CoreError> {
        let reqs = self.dense_pull_requests(params)?;
        let resps = self.fan_out(
            Rpc::DenseState,
            "dense state",
            reqs,
            |mut c, r| async move { c.dense_get_state(r).await },
        )?;
        let mut opt = OptimizerState::default();
        for (i, r) in resps {
            let s = &self.shards()[i];
            let range = s.dense_offset..s.dense_offset + s.dense_len;
            let bad =
                |e: WireError| transport(format!("PS shard {i} at {}: dense state: {e}", s.addr));
            wire::values_into(&r.values, Compression::None, &mut params[range.clone()])
                .map_err(bad)?;
            for (bytes, slot) in [(&r.slot1, &mut opt.slot1), (&r.slot2, &mut opt.slot2)] {
                if !bytes.is_empty() {
                    slot.resize(params.len(), 0.0);
                    wire::values_into(bytes, Compression::None, &mut slot[range.clone()])
                        .map_err(bad)?;
                }
            }
            opt.step = r.step;
        }
        Ok(opt)
    }

    /// Dense mode allreduce: writes this worker's copy of the dense values and optimizer
    /// state to the shards (before a checkpoint, at the end).
    pub fn set_dense_state(&self, params: &[f32], opt: &OptimizerState) -> Result<(), CoreError> {
        self.check_dense_len(params.len())?;
        let total = self.dense_total as u64;
        let slot = |v: &[f32], off: usize, len: usize| {
            if v.is_empty() {
                Default::default()
            } else {
                wire::values_to_bytes(&v[off..off + len], Compression::None)
            }
        };
        let reqs = self
            .dense_slices(params)
            .map(|(i, v)| {
                let s = &self.shards()[i];
                let r = pb::DenseSetStateRequest {
                    total,
                    state: Some(pb::DenseState {
                        values: wire::values_to_bytes(v, Compression::None),
                        slot1: slot(&opt.slot1, s.dense_offset, s.dense_len),
                        slot2: slot(&opt.slot2, s.dense_offset, s.dense_len),
                        step: opt.step,
                    }),
                };
                (i, r, v.len() as u64)
            })
            .collect();
        self.fan_out(
            Rpc::DenseState,
            "dense state",
            reqs,
            |mut c, r| async move { c.dense_set_state(r).await },
        )?;
        Ok(())
    }
}

impl DenseStore for RemoteStore {
    fn push_pull(&self, grads: &[f32], params: &mut [f32]) -> Result<(), CoreError> {
        self.check_dense_len(grads.len())?;
        self.check_dense_len(params.len())?;
        let step = self.step.fetch_add(1, Relaxed);
        let (rank, total) = (self.cfg.rank as u32, self.dense_total as u64);
        let reqs = self
            .dense_slices(grads)
            .map(|(i, g)| {
                let r = super::requests::dense_push_pull(
                    rank,
                    step,
                    total,
                    g,
                    Some(self.push_id(step)),
                );
                (i, r, g.len() as u64)
            })
            .collect();
        let resps = self.fan_out(
            Rpc::DensePushPull,
            "dense push-pull",
            reqs,
            |mut c, r| async move { c.dense_push_pull(r).await },
        )?;
        self.write_dense(resps, params)
    }
}
