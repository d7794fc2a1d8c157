//! The cluster's shards as a shard knows them (`SetShards`): the PS addresses in shard order
//! once shards were added or removed while training, the list told for the next round, and
//! whether this shard still waits to join. A shard of the cluster switches at its next
//! checkpoint round (every worker is blocked in it, so every worker learns the new list from
//! that round's answers, all at once); a shard joining owns no slot and nobody sends it
//! anything, so it switches at once.

use sparta_core::Routing;

use super::*;
use crate::moves::Owned;

/// A list of shards and its slot table, told for a later round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct NextShards {
    pub epoch: u64,
    pub routing: Routing,
    pub addrs: Vec<String>,
}

/// What a shard knows of the cluster's shards.
#[derive(Debug, Default)]
pub(super) struct ShardList {
    /// The addresses at the slot table this shard routes by (empty: the start's `--ps`).
    pub addrs: Vec<String>,
    /// Told, switched at the next round.
    pub next: Option<NextShards>,
    /// Started to join a running cluster and not yet told its shards.
    pub joining: bool,
    /// No longer one of the cluster's shards (its list left it out): nothing is routed here.
    pub retired: bool,
}

fn precondition(m: impl std::fmt::Display) -> Status {
    Status::failed_precondition(m.to_string())
}

impl Shard {
    /// Shards in the cluster by the slot table this shard routes by.
    pub(super) fn shard_count(&self) -> usize {
        let list = self.moves.shards.lock();
        if list.addrs.is_empty() {
            self.cfg.num_shards
        } else {
            list.addrs.len()
        }
    }

    /// The addresses of the cluster's shards once they changed, and those told for the next
    /// round (`Info`).
    pub(super) fn shard_addrs(&self) -> (Vec<String>, Vec<String>) {
        let list = self.moves.shards.lock();
        (
            list.addrs.clone(),
            list.next
                .as_ref()
                .map(|n| n.addrs.clone())
                .unwrap_or_default(),
        )
    }

    /// Whether this shard was left out of the cluster's shards (it may stop).
    pub fn retired(&self) -> bool {
        self.moves.shards.lock().retired
    }

    /// `SetShards`: the cluster's shards from slot table `epoch` on. Checked against what
    /// this shard owns: its slots stay its own, a shard left out owns none and holds no
    /// dense slice, and no slot move may be under way here.
    pub(super) async fn set_shards(
        &self,
        r: pb::SetShardsRequest,
    ) -> Result<pb::SetShardsResponse, Status> {
        if self.ckpt.is_none() {
            return Err(precondition(
                "the cluster's shards change at checkpoint rounds: give the job a checkpoint \
                 directory",
            ));
        }
        let n = r.shard_addrs.len();
        if n == 0 {
            return Err(Status::invalid_argument("a cluster of no shards"));
        }
        let routing = Routing::from_flat_runs(&r.runs, n)
            .map_err(|e| Status::invalid_argument(format!("the slot table: {e}")))?;
        let me = self.cfg.shard;
        if self.role.get().role != pb::Role::Primary {
            // A process whose own shard failed over elsewhere (its primary there is told
            // too): only the backup copies of added shards it holds.
            if !self.main {
                return Err(precondition(format!(
                    "this copy of shard {me} is not its primary"
                )));
            }
            let told = NextShards {
                epoch: r.epoch,
                routing,
                addrs: r.shard_addrs.clone(),
            };
            self.make_added_backups(&told, self.shard_count())?;
            return Ok(pb::SetShardsResponse { applied: true });
        }
        let incoming = self.moves.incoming.lock().await;
        if incoming.is_some() || !self.moves.outgoing.lock().0.is_empty() {
            return Err(precondition(
                "a slot move into or out of this shard is under way: change the cluster's shards \
                 after it switched",
            ));
        }
        let mut list = self.moves.shards.lock();
        let mut owned = self.moves.owned.write();
        let told = NextShards {
            epoch: r.epoch,
            routing: routing.clone(),
            addrs: r.shard_addrs.clone(),
        };
        if r.now && me >= n && list.next.as_ref() == Some(&told) {
            // Removed, and every staying shard switched at a round this one already answered:
            // no worker sends it anything any more.
            drop((owned, list, incoming));
            self.settle_shards(0);
            return Ok(pb::SetShardsResponse { applied: true });
        }
        if list.next.as_ref() == Some(&told) || (owned.epoch == r.epoch && list.addrs == told.addrs)
        {
            // The same call again.
            return Ok(pb::SetShardsResponse {
                applied: list.next.is_none(),
            });
        }
        if r.epoch <= owned.epoch {
            return Err(precondition(format!(
                "this shard routes by the slot table of epoch {}, not older than the one told \
                 ({})",
                owned.epoch, r.epoch
            )));
        }
        if me >= n && !self.dense.is_empty() {
            return Err(precondition(format!(
                "shard {me} holds a slice of the dense vector: only a shard added while training \
                 can be removed"
            )));
        }
        if !list.joining {
            let mine = |t: &Routing, s: usize| t.shard_of_slot(s) == Some(me);
            if let Some(s) = (0..sparta_core::routing::SLOTS)
                .find(|&s| mine(&owned.routing, s) != mine(&routing, s))
            {
                return Err(precondition(format!(
                    "slot {s}: this shard's slot table (epoch {}) and the one told (epoch {}) \
                     disagree about it (move slots off a shard before removing it)",
                    owned.epoch, r.epoch
                )));
            }
        }
        if list.joining {
            if me >= n {
                return Err(Status::invalid_argument(format!(
                    "shard {me} joins, but the list told has {n} shard(s)"
                )));
            }
            *owned = Owned {
                epoch: r.epoch,
                routing,
            };
            list.addrs = told.addrs;
            list.joining = false;
            drop((owned, list, incoming));
            self.routing_changed();
            tracing::info!(
                "PS shard {me}: joined the cluster's {n} shard(s) (slot table epoch {})",
                r.epoch
            );
            return Ok(pb::SetShardsResponse { applied: true });
        }
        if self.main {
            let now = if list.addrs.is_empty() {
                self.cfg.num_shards
            } else {
                list.addrs.len()
            };
            self.make_added_backups(&told, now)?;
        }
        tracing::info!(
            "PS shard {me}: the cluster's shards become {} at the next round (slot table epoch {})",
            told.addrs.join(","),
            r.epoch
        );
        list.next = Some(told);
        Ok(pb::SetShardsResponse { applied: false })
    }

    /// Replicated: the backups of added shards this process holds by the placement after
    /// `told`, made now, empty (nothing is routed to an added shard before the round).
    /// Copies of shards that left earlier stayed (their primary's last round may have
    /// reached them after this shard's): a shard added again gets a fresh one.
    /// `now`: the cluster's shards before `told`.
    fn make_added_backups(&self, told: &NextShards, now: usize) -> Result<(), Status> {
        if told.addrs.len() > now {
            self.backups.write().retain(|b| b.cfg.shard < now);
        }
        for c in self.added_backups(told)? {
            self.backups.write().push(Arc::new(c));
        }
        Ok(())
    }

    /// The backup copies of shards added by `told` that this process must hold (with
    /// `--replicas`, see [`crate::replica::Placement`]) and does not yet.
    fn added_backups(&self, told: &NextShards) -> Result<Vec<Shard>, Status> {
        let r = &self.cfg.replication;
        if r.replicas < 2 {
            return Ok(Vec::new());
        }
        let n = told.addrs.len();
        let base = self.cfg.dense_shards.unwrap_or(self.cfg.num_shards);
        let placement = crate::replica::Placement::with_base(r.replicas, n, base)
            .map_err(|e| precondition(e.to_string()))?;
        let mut made = Vec::new();
        for s in placement.backups_on(self.cfg.shard) {
            if s < base || self.backup_of(s).is_some() {
                continue;
            }
            let mut c = self.cfg.clone();
            c.shard = s;
            c.num_shards = n;
            c.dense_shards = Some(base);
            c.replication.peers = told.addrs.clone();
            if let Some(ck) = &mut c.checkpoint {
                // Added after the checkpoint this process started from: nothing to restore.
                ck.resume = None;
            }
            let copy = self
                .backup_copy(c)
                .map_err(|e| Status::internal(format!("a backup copy of shard {s}: {e}")))?;
            {
                let mut list = copy.moves.shards.lock();
                list.addrs = told.addrs.clone();
                list.joining = false;
            }
            *copy.moves.owned.write() = Owned {
                epoch: told.epoch,
                routing: told.routing.clone(),
            };
            tracing::info!(
                "PS shard {}: holds a backup copy of the added shard {s}",
                self.cfg.shard
            );
            made.push(copy);
        }
        Ok(made)
    }

    /// At a checkpoint round, before the part is written: switches to the shards told.
    pub(super) fn settle_shards(&self, checkpoint: u64) {
        let mut list = self.moves.shards.lock();
        let Some(next) = list.next.take() else {
            return;
        };
        let mut owned = self.moves.owned.write();
        if next.epoch <= owned.epoch {
            tracing::warn!(
                "PS shard {}: the cluster's shards told for slot table epoch {} are older than \
                 the table it routes by (epoch {}): left",
                self.cfg.shard,
                next.epoch,
                owned.epoch
            );
            return;
        }
        let n = next.addrs.len();
        *owned = Owned {
            epoch: next.epoch,
            routing: next.routing,
        };
        list.addrs = next.addrs;
        list.retired = self.cfg.shard >= n;
        let retired = list.retired;
        drop((owned, list));
        self.routing_changed();
        if retired {
            // The round's answers are in flight: a stop now (`--exit-when-retired`) answers
            // them first.
            self.moves.retired.notify_one();
            tracing::info!(
                "PS shard {}: left out of the cluster's {n} shard(s) at checkpoint {checkpoint} \
                 (slot table epoch {}): nothing is routed here any more",
                self.cfg.shard,
                next.epoch
            );
        } else {
            tracing::info!(
                "PS shard {}: the cluster has {n} shard(s) from checkpoint {checkpoint} on (slot \
                 table epoch {})",
                self.cfg.shard,
                next.epoch
            );
        }
    }
}
