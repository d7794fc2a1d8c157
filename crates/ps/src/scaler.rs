//! Adding shards to a running cluster and removing them (`sparta scale-ps`, `sparta launch
//! --scale-ps-at`), from outside: the client of the shards' `SetShards` and of slot moves
//! ([`crate::mover`]).
//!
//! Adding: the new PS processes start as joining shards (`--shard i --num-shards N'
//! --dense-shards D`: no dense slice, no slot); every shard is told the list of N' shards with
//! the newest slot table (the new ones owning nothing): the new ones switch at once, the
//! others at their next checkpoint round, where every worker learns the list from the round's
//! answers and adds the new shards. Then slots move onto the new shards, one move at a time,
//! until every shard owns an even share.
//!
//! Removing (only shards added while training: the first D hold the dense vector): every
//! slot of the leaving shards moves onto the staying ones, then every shard is told the
//! shorter list; at the next round the workers drop the leaving shards, which then stop
//! (`--exit-when-retired`).

use std::time::{Duration, Instant};

use sparta_core::routing::SLOTS;
use sparta_core::Routing;
use sparta_proto::pb;

use crate::error::PsError;
use crate::mover::Mover;

/// One slot move a scaling made.
#[derive(Clone, Debug, PartialEq)]
pub struct Moved {
    /// The source shard.
    pub from: usize,
    /// The receiving shard.
    pub to: usize,
    /// Slots moved.
    pub slots: usize,
    /// Rows moved (all tables).
    pub rows: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Seconds from its order to its switch.
    pub seconds: f64,
    /// Seconds its switch held the round.
    pub hold_seconds: f64,
}

/// What a scaling did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scaled {
    /// The cluster's shards after it.
    pub addrs: Vec<String>,
    /// The slot table's epoch after it.
    pub epoch: u64,
    /// The moves, in order.
    pub moves: Vec<Moved>,
    /// Seconds it took.
    pub seconds: f64,
}

fn failed(m: String) -> PsError {
    PsError::Config(m)
}

/// Slots shard `i` of `n` owns in an even table.
fn share(i: usize, n: usize) -> usize {
    SLOTS * (i + 1) / n - SLOTS * i / n
}

/// Adds and removes shards of one cluster.
pub struct Scaler {
    mover: Mover,
    /// How long one step (a list switching, a move switching) may take.
    wait: Duration,
}

impl Scaler {
    /// A scaler of the cluster `mover` reaches; `wait`: the longest one step may take (a
    /// step switches at a checkpoint round: minutes where rounds are minutes apart).
    pub fn new(mover: Mover, wait: Duration) -> Self {
        Scaler { mover, wait }
    }

    /// The cluster's shards as this scaler knows them.
    pub fn addrs(&self) -> &[String] {
        self.mover.addrs()
    }

    /// The step clock of shard 0 (every worker's steps, summed).
    pub async fn step(&self) -> Result<u64, PsError> {
        Ok(self.mover.info(0).await?.step)
    }

    /// The newest slot table any shard routes by, and its epoch.
    async fn newest(&self) -> Result<(u64, Routing), PsError> {
        Ok(Mover::newest(&self.mover.views().await?))
    }

    /// Tells shards `to` of `m` the list `addrs` with slot table `table` at `epoch`: each
    /// shard's primary copy, and the process of its own if that one holds a backup now (a
    /// failover moved the primary): it makes the backup copies of added shards it holds.
    async fn tell(
        &self,
        m: &Mover,
        to: impl Iterator<Item = usize>,
        req: &pb::SetShardsRequest,
    ) -> Result<(), PsError> {
        for i in to {
            let (mut c, addr) = m.client(i).await?;
            let told = |s: tonic::Status, addr: &str| {
                failed(format!(
                    "telling shard {i} at {addr} the cluster's shards: {}",
                    s.message()
                ))
            };
            c.set_shards(req.clone())
                .await
                .map_err(|s| told(s, &addr))?;
            if addr != m.addrs()[i] {
                let mut home = m.process(i)?;
                home.set_shards(req.clone())
                    .await
                    .map_err(|s| told(s, &m.addrs()[i]))?;
            }
        }
        Ok(())
    }

    /// Waits until shards `which` of `m` route by slot table `epoch` or newer.
    async fn switched(
        &self,
        m: &Mover,
        which: std::ops::Range<usize>,
        epoch: u64,
    ) -> Result<(), PsError> {
        let deadline = Instant::now() + self.wait;
        for i in which {
            loop {
                let info = m.info(i).await?;
                if info.routing_epoch >= epoch && info.next_shard_addrs.is_empty() {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(failed(format!(
                        "shard {i} at {} has not switched to the new list of shards within \
                         {:?} (it switches at the next checkpoint round: is the job training \
                         and checkpointing?)",
                        m.addrs()[i],
                        self.wait
                    )));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// One move of `count` slots from `from` to `to`, waited for.
    async fn move_slots(&self, from: usize, to: usize, count: usize) -> Result<Moved, PsError> {
        let t = Instant::now();
        let plan = self.mover.order(from, to, count).await?;
        let view = self.mover.wait(&plan, self.wait).await?;
        Ok(Moved {
            from,
            to,
            slots: count,
            rows: view.last_move.rows,
            bytes: view.last_move.bytes,
            seconds: t.elapsed().as_secs_f64(),
            hold_seconds: view.last_move.switch_seconds,
        })
    }

    /// Adds the shards at `added` (started joining: see the module's docs), then moves slots
    /// onto them until every shard owns an even share. `say` hears of every step.
    pub async fn grow(
        &mut self,
        added: &[String],
        say: &(dyn Fn(&str) + Sync),
    ) -> Result<Scaled, PsError> {
        let t = Instant::now();
        let n = self.mover.addrs().len();
        let all: Vec<String> = self.mover.addrs().iter().chain(added).cloned().collect();
        let n2 = all.len();
        if added.is_empty() {
            return Err(failed("no shard to add".into()));
        }
        let (epoch, table) = self.newest().await?;
        let table = table
            .with_slots_on(&[], 0, n2)
            .map_err(|e| failed(e.to_string()))?;
        let epoch = epoch + 1;
        let req = pb::SetShardsRequest {
            epoch,
            runs: table.flat_runs(),
            shard_addrs: all.clone(),
            now: false,
        };
        let wide = self.mover.with_addrs(all.clone());
        // The new ones first (they switch at once: nobody sends them anything yet), then
        // the others (at their next round).
        self.tell(&wide, n..n2, &req).await?;
        self.tell(&wide, 0..n, &req).await?;
        say(&format!(
            "told every shard the cluster's {n2} shards (slot table epoch {epoch}); they switch \
             at the next checkpoint round"
        ));
        self.switched(&wide, 0..n, epoch).await?;
        say(&format!(
            "the cluster has {n2} shards; moving slots onto the new ones"
        ));
        self.mover = wide;
        let mut moves = Vec::new();
        for j in n..n2 {
            loop {
                let (_, table) = self.newest().await?;
                let have = table.slots_per_shard();
                let need = share(j, n2).saturating_sub(have[j]);
                if need == 0 {
                    break;
                }
                // From the shard with the most slots above its share.
                let excess = |i: usize| have[i] as i64 - share(i, n2) as i64;
                let from = (0..n2)
                    .filter(|&i| i != j)
                    .max_by_key(|&i| excess(i))
                    .expect("two shards at least");
                let count = need.min(excess(from).max(1) as usize);
                let m = self.move_slots(from, j, count).await?;
                say(&format!(
                    "moved {} slot(s) ({} rows, {} bytes) from shard {from} to shard {j} in \
                     {:.1} s (the switch held its round {:.2} s)",
                    m.slots, m.rows, m.bytes, m.seconds, m.hold_seconds
                ));
                moves.push(m);
            }
        }
        let (epoch, _) = self.newest().await?;
        Ok(Scaled {
            addrs: all,
            epoch,
            moves,
            seconds: t.elapsed().as_secs_f64(),
        })
    }

    /// Removes the shards past the first `keep`: moves their slots onto the others (evenly),
    /// then tells every shard the shorter list. `leaving` is called with the indexes of the
    /// shards that will stop, before they are told (they stop at their next round).
    pub async fn shrink(
        &mut self,
        keep: usize,
        leaving: &(dyn Fn(&[usize]) + Sync),
        say: &(dyn Fn(&str) + Sync),
    ) -> Result<Scaled, PsError> {
        let t = Instant::now();
        let n = self.mover.addrs().len();
        if keep == 0 || keep >= n {
            return Err(failed(format!(
                "keep between 1 and {} of the cluster's {n} shards",
                n.saturating_sub(1)
            )));
        }
        for i in keep..n {
            let info = self.mover.info(i).await?;
            if info.dense_len > 0 {
                return Err(failed(format!(
                    "shard {i} holds a slice of the dense vector (the shards of the job's start \
                     do): only shards added while training can be removed; resume the job's \
                     checkpoint on fewer shards instead"
                )));
            }
        }
        let mut moves = Vec::new();
        for j in keep..n {
            loop {
                let (_, table) = self.newest().await?;
                let have = table.slots_per_shard();
                if have[j] == 0 {
                    break;
                }
                // Onto the staying shard the furthest below its share of `keep`.
                let to = (0..keep)
                    .min_by_key(|&i| have[i] as i64 - share(i, keep) as i64)
                    .expect("keep >= 1");
                let room = share(to, keep).saturating_sub(have[to]).max(1);
                let count = if (keep..n).map(|i| have[i]).sum::<usize>() <= room {
                    have[j]
                } else {
                    have[j].min(room)
                };
                let m = self.move_slots(j, to, count).await?;
                say(&format!(
                    "moved {} slot(s) ({} rows, {} bytes) from shard {j} to shard {to} in {:.1} \
                     s (the switch held its round {:.2} s)",
                    m.slots, m.rows, m.bytes, m.seconds, m.hold_seconds
                ));
                moves.push(m);
            }
        }
        let (epoch, table) = self.newest().await?;
        let table = Routing::from_flat_runs(&table.flat_runs(), keep)
            .map_err(|e| failed(format!("the slot table after the moves: {e}")))?;
        let epoch = epoch + 1;
        let kept: Vec<String> = self.mover.addrs()[..keep].to_vec();
        let req = pb::SetShardsRequest {
            epoch,
            runs: table.flat_runs(),
            shard_addrs: kept.clone(),
            now: false,
        };
        let gone: Vec<usize> = (keep..n).collect();
        leaving(&gone);
        // The leaving ones first: each switches (and stops) at the round where the workers
        // drop it, or (told too late for it) once the staying ones switched.
        self.tell(&self.mover, keep..n, &req).await?;
        self.tell(&self.mover, 0..keep, &req).await?;
        say(&format!(
            "told every shard the cluster's {keep} shards (slot table epoch {epoch}); shards \
             {gone:?} stop at the next checkpoint round"
        ));
        self.switched(&self.mover, 0..keep, epoch).await?;
        let now = pb::SetShardsRequest { now: true, ..req };
        for i in keep..n {
            // Gone already (it stopped at its round) or still waiting for a round the workers
            // no longer take it into.
            if let Ok((mut c, _)) = self.mover.client(i).await {
                let _ = c.set_shards(now.clone()).await;
            }
        }
        self.mover = self.mover.with_addrs(kept.clone());
        Ok(Scaled {
            addrs: kept,
            epoch,
            moves,
            seconds: t.elapsed().as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shares of `n` shards add up to every slot, and differ by one at most.
    #[test]
    fn shares_cover_every_slot_once_evenly() {
        for n in 1..9 {
            let shares: Vec<usize> = (0..n).map(|i| share(i, n)).collect();
            assert_eq!(shares.iter().sum::<usize>(), SLOTS, "{n} shards");
            let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            assert!(hi - lo <= 1, "{n} shards: {shares:?}");
        }
    }
}
