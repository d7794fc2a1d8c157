//! The client side of a slot move (`sparta move-slots`): reads the cluster's newest slot
//! table from its shards, plans which slots move, orders the receiving shard to take them
//! and (asked) waits until the move switched (see [`crate::moves`]).

use std::time::{Duration, Instant};

use sparta_core::Routing;
use sparta_proto::pb;
use sparta_proto::tls::ClientTls;

use crate::error::PsError;
use crate::replica::peer_client;

/// A move ordered: `slots` go from shard `from` to shard `to`, the table after it is of
/// `epoch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovePlan {
    /// The slot table's epoch after the move.
    pub epoch: u64,
    /// The moving slots.
    pub slots: Vec<usize>,
    /// The source shard.
    pub from: usize,
    /// The receiving shard.
    pub to: usize,
    /// The slot table after the move.
    pub after: Routing,
}

/// One shard's slot-move view, from its `Info`.
#[derive(Clone, Debug)]
pub struct ShardView {
    /// Its slot table's epoch.
    pub epoch: u64,
    /// Its slot table.
    pub routing: Routing,
    /// A move into it is under way.
    pub moving_in: bool,
    /// Moves completed into and out of it.
    pub moves_in: u64,
    /// Moves completed out of it.
    pub moves_out: u64,
    /// Its rows, all tables.
    pub rows: u64,
    /// What the last move into it cost.
    pub last_move: crate::moves::LastMove,
}

/// The client of a cluster's shards for moves.
pub struct Mover {
    addrs: Vec<String>,
    token: String,
    tls: Option<ClientTls>,
}

fn failed(m: String) -> PsError {
    PsError::Config(m)
}

impl Mover {
    /// A mover of the cluster whose shards are at `addrs` (in shard order).
    pub fn new(addrs: Vec<String>, token: String, tls: Option<ClientTls>) -> Self {
        Mover { addrs, token, tls }
    }

    /// The shards' addresses, in shard order.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// A client of process `p` (its own shard's copy, whatever its role).
    pub(crate) fn process(&self, p: usize) -> Result<crate::replica::PeerClient, PsError> {
        Ok(peer_client(
            &self.addrs[p],
            &self.token,
            64 << 20,
            self.tls.as_ref(),
        )?)
    }

    /// The process holding shard `i`'s primary copy: its own, unless its `Roles` say
    /// otherwise (a replicated shard failed over to a backup's process), then the process
    /// naming it primary at the highest epoch.
    pub(crate) async fn primary_of(&self, i: usize) -> usize {
        let roles = |p: usize| async move {
            let mut c = self.process(p).ok()?;
            let r = tokio::time::timeout(Duration::from_secs(10), c.roles(pb::RolesRequest {}))
                .await
                .ok()?
                .ok()?;
            Some(r.into_inner().copies)
        };
        let primary = |copies: &[pb::CopyRole]| crate::replica::primary_epoch(copies, i);
        if roles(i).await.as_deref().and_then(primary).is_some() {
            return i;
        }
        let mut best: Option<(u64, usize)> = None;
        for p in (0..self.addrs.len()).filter(|&p| p != i) {
            if let Some(e) = roles(p).await.as_deref().and_then(primary) {
                if best.is_none_or(|(b, _)| e > b) {
                    best = Some((e, p));
                }
            }
        }
        best.map_or(i, |(_, p)| p)
    }

    /// A client of shard `i`'s primary copy (see [`Mover::primary_of`]: its requests name
    /// the shard) and the address of its process.
    pub(crate) async fn client(
        &self,
        i: usize,
    ) -> Result<(crate::replica::PeerClient, String), PsError> {
        let addr = self.addrs[self.primary_of(i).await].clone();
        let c = crate::replica::shard_client(
            &addr,
            &self.token,
            64 << 20,
            i as u32,
            self.tls.as_ref(),
        )?;
        Ok((c, addr))
    }

    /// Shard `i`'s `Info` (at most 30 s), from its primary copy.
    pub(crate) async fn info(&self, i: usize) -> Result<pb::InfoResponse, PsError> {
        let (mut c, addr) = self.client(i).await?;
        let addr = &addr;
        tokio::time::timeout(Duration::from_secs(30), c.info(pb::InfoRequest {}))
            .await
            .map_err(|_| failed(format!("PS at {addr}: no answer within 30 s")))?
            .map_err(|s| failed(format!("PS at {addr}: {}", s.message())))
            .map(tonic::Response::into_inner)
    }

    /// The newest slot table any of `views` routes by, with its epoch.
    pub fn newest(views: &[ShardView]) -> (u64, Routing) {
        let v = views
            .iter()
            .max_by_key(|v| v.epoch)
            .expect("a cluster has a shard");
        (v.epoch, v.routing.clone())
    }

    /// The same cluster's client at other addresses (its shards changed).
    pub fn with_addrs(&self, addrs: Vec<String>) -> Self {
        Mover {
            addrs,
            token: self.token.clone(),
            tls: self.tls.clone(),
        }
    }

    /// Every shard's view, in shard order.
    pub async fn views(&self) -> Result<Vec<ShardView>, PsError> {
        let n = self.addrs.len();
        let mut out = Vec::with_capacity(n);
        for (i, addr) in self.addrs.iter().enumerate() {
            let info = self.info(i).await?;
            if info.shard as usize != i || info.num_shards as usize != n {
                return Err(failed(format!(
                    "PS at {addr} is shard {} of {}, but is listed as shard {i} of {n} (list the \
                     addresses in shard order)",
                    info.shard, info.num_shards
                )));
            }
            let routing = Routing::from_flat_runs(&info.slot_runs, n)
                .map_err(|e| failed(format!("PS at {addr}: {e}")))?;
            out.push(ShardView {
                epoch: info.routing_epoch,
                routing,
                moving_in: info.moving_in != 0,
                moves_in: info.moves_in,
                moves_out: info.moves_out,
                rows: info.rows,
                last_move: crate::moves::LastMove {
                    rows: info.last_move_rows,
                    bytes: info.last_move_bytes,
                    copy_seconds: info.last_move_copy_micros as f64 / 1e6,
                    total_seconds: info.last_move_total_micros as f64 / 1e6,
                    switch_seconds: info.last_move_switch_micros as f64 / 1e6,
                },
            });
        }
        Ok(out)
    }

    /// Plans a move of `count` slots of shard `from` (its highest-numbered ones) to shard
    /// `to` on the newest slot table any shard routes by, and orders it.
    pub async fn order(&self, from: usize, to: usize, count: usize) -> Result<MovePlan, PsError> {
        let n = self.addrs.len();
        if from >= n || to >= n || from == to {
            return Err(failed(format!(
                "a move from shard {from} to shard {to} on a cluster of {n} shard(s)"
            )));
        }
        let views = self.views().await?;
        if let Some(i) = views.iter().position(|v| v.moving_in) {
            return Err(failed(format!(
                "shard {i} is taking slots already: wait until that move switched"
            )));
        }
        let (from_epoch, before) = Self::newest(&views);
        let owned: Vec<usize> = (0..sparta_core::routing::SLOTS)
            .filter(|&s| before.shard_of_slot(s) == Some(from))
            .collect();
        // All of them: the shard is then removed from the cluster (`crate::scaler`).
        if count == 0 || count > owned.len() {
            return Err(failed(format!(
                "shard {from} owns {} slot(s): move between 1 and {} of them",
                owned.len(),
                owned.len()
            )));
        }
        let slots = owned[owned.len() - count..].to_vec();
        let after = before
            .with_slots_on(&slots, to, n)
            .map_err(|e| failed(e.to_string()))?;
        let epoch = from_epoch + 1;
        let (mut c, at) = self.client(to).await?;
        let source_addr = self.addrs[self.primary_of(from).await].clone();
        c.move_slots(pb::MoveSlotsRequest {
            from_epoch,
            from_runs: before.flat_runs(),
            epoch,
            runs: after.flat_runs(),
            source: from as u32,
            source_addr,
        })
        .await
        .map_err(|s| failed(format!("shard {to} at {at}: {}", s.message())))?;
        Ok(MovePlan {
            epoch,
            slots,
            from,
            to,
            after,
        })
    }

    /// Waits until the receiver of `plan` routes by its table (the move switched at a
    /// checkpoint round), asking every 200 ms, at most `limit`.
    pub async fn wait(&self, plan: &MovePlan, limit: Duration) -> Result<ShardView, PsError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(info) = self.info(plan.to).await {
                if info.routing_epoch >= plan.epoch {
                    let views = self.views().await?;
                    return Ok(views[plan.to].clone());
                }
            }
            if Instant::now() >= deadline {
                return Err(failed(format!(
                    "shard {} has not taken the slots within {limit:?} (a move switches at the \
                     next checkpoint round after its first copy: is the job training and \
                     checkpointing?)",
                    plan.to
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
