//! The worker's checkpoint and restart RPCs of [`RemoteStore`].

use std::sync::atomic::Ordering::Relaxed;

use sparta_core::CoreError;

use super::{transport, RemoteStore};
use sparta_proto::metrics::Rpc;
use sparta_proto::pb;

impl RemoteStore {
    /// What each shard reported at connect: its incarnation and the checkpoint it restored.
    pub fn origins(&self) -> Vec<pb::OriginResponse> {
        self.shards().iter().map(|s| s.origin).collect()
    }

    /// The checkpoint every shard restored (`None`: all started empty). Shards that restored
    /// different checkpoints are an error naming them.
    pub fn resumed_from(&self) -> Result<Option<(u64, u64)>, CoreError> {
        let first = &self.shards()[0].origin;
        for (i, s) in self.shards().iter().enumerate() {
            if s.origin.resumed_from != first.resumed_from {
                return Err(transport(format!(
                    "PS shard 0 at {} restored checkpoint {} but shard {i} at {} restored {}: \
                     restart all shards from the same checkpoint (--resume-id)",
                    self.shards()[0].addr,
                    first.resumed_from,
                    s.addr,
                    s.origin.resumed_from
                )));
            }
        }
        Ok((first.resumed_from != 0).then_some((first.resumed_from, first.resumed_step)))
    }

    /// The dense consistency mode shard 0 reports (`async`, `sync`, `staleness K`).
    pub fn mode(&self) -> Result<String, CoreError> {
        let r = self.fan_out(
            Rpc::Info,
            "info",
            vec![(0, pb::InfoRequest {}, 0)],
            |mut c, r| async move { c.info(r).await },
        )?;
        Ok(r.into_iter()
            .next()
            .map(|(_, i)| i.mode)
            .unwrap_or_default())
    }

    /// Sets this worker's step count (the next dense push is for step `step`), when it
    /// continues from a checkpoint.
    pub fn set_step(&self, step: u64) {
        self.step.store(step, Relaxed);
    }

    /// The step of the checkpoint round pending on any shard (other workers wait in it), if
    /// one is: asks every shard without joining.
    pub fn pending_round(&self) -> Result<Option<u64>, CoreError> {
        let req = pb::CheckpointRequest {
            position: Some(pb::WorkerPosition {
                rank: self.cfg.rank as u32,
                ..Default::default()
            }),
            probe: true,
            ..Default::default()
        };
        let resps = self.checkpoint(req)?;
        Ok(resps
            .iter()
            .filter(|r| r.pending)
            .map(|r| r.pending_step)
            .max())
    }

    /// Sends `req` to every shard (the checkpoint barrier); returns their answers in shard
    /// order.
    pub fn checkpoint(
        &self,
        req: pb::CheckpointRequest,
    ) -> Result<Vec<pb::CheckpointResponse>, CoreError> {
        let reqs = (0..self.shards().len())
            .map(|i| (i, req.clone(), 0))
            .collect();
        let mut resps =
            self.fan_out(Rpc::Checkpoint, "checkpoint", reqs, |mut c, r| async move {
                c.checkpoint(r).await
            })?;
        resps.sort_by_key(|(i, _)| *i);
        // A slot move (or a change of the cluster's shards) switches at a round: from the next
        // step on, route by the newest table (and send to the newest shards).
        if let Some((_, r)) = resps.iter().max_by_key(|(_, r)| r.routing_epoch) {
            let finished = resps.first().map_or(&[][..], |(_, r)| &r.workers[..]);
            self.adopt_routing(r.routing_epoch, &r.slot_runs, &r.shard_addrs, finished)?;
        }
        Ok(resps.into_iter().map(|(_, r)| r).collect())
    }
}
