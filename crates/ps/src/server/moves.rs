//! A shard's side of slot moves (the protocol: [`crate::moves`]): the receiver's copy passes
//! and switch, the source's reads and its wait for the verdict, and the check that refuses
//! keys of slots a shard does not own.

use sparta_core::Routing;

use super::*;
use crate::moves::{
    moving_slots, remove_slots, Incoming, MoveCounts, Outgoing, Owned, SlotSet, Verdict,
};
use crate::replica::PeerClient;

/// How long a receiving shard waits between copy passes while training goes on.
const PASS_EVERY: Duration = Duration::from_millis(200);
/// Longest a source's round waits for the receiver's verdict before its part fails (the job
/// stops: a receiver that says nothing may have switched).
const VERDICT_WAIT: Duration = Duration::from_secs(600);
/// Tries of the receiver's verdict (250 ms apart) before its part fails.
const VERDICT_TRIES: u32 = 120;
/// The refusal of a read whose removals cannot be told (the source dropped old tombstones):
/// the receiver starts its copy again.
const TRUNCATED: &str = "tombstones dropped:";
/// The refusal of a read whose answer would be larger than the receiver takes: it asks
/// again for fewer slots at a time.
const TOO_BIG: &str = "answer too large:";
/// The start of a refusal of keys whose slot this shard does not own.
pub const NOT_OWNED: &str = "slot not owned:";
/// Rows per replicated message of a switch's rows taken in (bounded messages to backups).
const SWITCH_ROWS_PER_OP: usize = 16 * 1024;

/// The slot-move state of a shard.
pub(super) struct MoveState {
    /// The slot table it routes by.
    pub owned: parking_lot::RwLock<Owned>,
    /// A move into it, held for a whole copy pass.
    pub incoming: tokio::sync::Mutex<Option<Incoming>>,
    /// The runtime its passes run on (set by the first move).
    pub runtime: parking_lot::Mutex<Option<tokio::runtime::Handle>>,
    /// Moves out of it, known from the receivers' first reads, and the last checkpoint
    /// whose round looked at them (a move learnt of later is waited for from the next
    /// round on: what `SlotRows` answers as `armed_after`).
    pub outgoing: parking_lot::Mutex<(Vec<Outgoing>, u64)>,
    /// Receivers' verdicts by (move epoch, checkpoint).
    pub verdicts: parking_lot::Mutex<crate::moves::Verdicts>,
    pub verdict_told: parking_lot::Condvar,
    pub counts: parking_lot::Mutex<MoveCounts>,
    /// The cluster's shards (see [`super::shards`]); locked before `owned` where both are.
    pub shards: parking_lot::Mutex<super::shards::ShardList>,
    /// Told once the shard is left out of the cluster's shards.
    pub retired: tokio::sync::Notify,
    /// A backup copy: the order of a move into the shard its primary took and has not yet
    /// switched (replicated); a promoted copy starts it again.
    pub ordered: parking_lot::Mutex<Option<pb::MoveSlotsRequest>>,
}

impl MoveState {
    /// `joining`: a shard added to a running cluster, waiting to be told its shards.
    pub(super) fn new(epoch: u64, routing: Routing, joining: bool) -> Self {
        MoveState {
            shards: parking_lot::Mutex::new(super::shards::ShardList {
                joining,
                ..Default::default()
            }),
            owned: parking_lot::RwLock::new(Owned { epoch, routing }),
            incoming: tokio::sync::Mutex::new(None),
            runtime: parking_lot::Mutex::new(None),
            outgoing: parking_lot::Mutex::new((Vec::new(), 0)),
            verdicts: parking_lot::Mutex::new(Default::default()),
            verdict_told: parking_lot::Condvar::new(),
            counts: parking_lot::Mutex::new(MoveCounts::default()),
            retired: tokio::sync::Notify::new(),
            ordered: parking_lot::Mutex::new(None),
        }
    }
}

/// How many times too large a read's answer is by its refusal (`TOO_BIG about N bytes ...`),
/// with a margin: the rows are not spread evenly over the slots.
fn too_big_by(message: &str, max_bytes: u64) -> Option<usize> {
    let rest = message
        .strip_prefix(TOO_BIG)?
        .trim_start()
        .strip_prefix("about ")?;
    let bytes: u64 = rest.split(' ').next()?.parse().ok()?;
    Some((bytes.div_ceil(max_bytes.max(1)) as usize + 1).max(2))
}

fn precondition(m: impl std::fmt::Display) -> Status {
    Status::failed_precondition(m.to_string())
}

impl Shard {
    /// The slot table this shard routes by.
    pub(super) fn owned(&self) -> Owned {
        self.moves.owned.read().clone()
    }

    /// Sets the routing gauges (epoch, slots owned) after the slot table changed (not per
    /// push: counting the slots walks the whole table).
    pub(super) fn routing_changed(&self) {
        let shards = self.shard_count() as u64;
        let o = self.moves.owned.read();
        let mine = o.routing.slots_per_shard().get(self.cfg.shard).copied();
        self.metrics
            .set_routing(o.epoch, mine.unwrap_or_default() as u64, shards);
    }

    /// Refuses `keys` when one's slot is not this shard's (checked once any move happened:
    /// a worker routing by an old table must fail, never create rows here).
    pub(super) fn check_owned(&self, keys: &[u64]) -> Result<(), Status> {
        let o = self.moves.owned.read();
        if o.epoch == 0 {
            return Ok(());
        }
        let me = self.cfg.shard;
        match keys.iter().find(|&&k| o.routing.shard_of(k) != me) {
            None => Ok(()),
            Some(&k) => Err(precondition(format!(
                "{NOT_OWNED} key {k:#x} is in slot {} of shard {} by the slot table of epoch {}, \
                 not of this shard {me}: the worker routes by an older table",
                sparta_core::routing::slot_of(k),
                o.routing.shard_of(k),
                o.epoch
            ))),
        }
    }

    /// The slot-move counts and whether a move into this shard is under way.
    pub(super) fn move_info(&self) -> (MoveCounts, bool) {
        let moving = self.moves.incoming.try_lock().map_or(true, |g| g.is_some());
        (*self.moves.counts.lock(), moving)
    }

    /// `MoveSlots`: starts copying the slots that move to this shard (a task of its own
    /// runs the passes until the move switches at a round).
    pub(super) async fn start_move(
        self: &Arc<Self>,
        r: pb::MoveSlotsRequest,
    ) -> Result<pb::MoveSlotsResponse, Status> {
        if self.ckpt.is_none() {
            return Err(precondition(
                "slot moves switch at checkpoint rounds: give the job a checkpoint directory",
            ));
        }
        let n = self.shard_count();
        let bad = |e: sparta_core::routing::BadRouting| Status::invalid_argument(e.to_string());
        let before = Routing::from_flat_runs(&r.from_runs, n).map_err(bad)?;
        let after = Routing::from_flat_runs(&r.runs, n).map_err(bad)?;
        if r.epoch != r.from_epoch + 1 {
            return Err(Status::invalid_argument(format!(
                "a move from the slot table of epoch {} makes epoch {}, not {}",
                r.from_epoch,
                r.from_epoch + 1,
                r.epoch
            )));
        }
        if self.moves.shards.lock().next.is_some() {
            return Err(precondition(
                "the cluster's shards change at the next round: order the move after it",
            ));
        }
        let me = self.cfg.shard;
        let order = r.clone();
        let slots = moving_slots(&before, &after, r.source as usize, me)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut incoming = self.moves.incoming.lock().await;
        if let Some(i) = incoming.as_ref() {
            if i.epoch == r.epoch && i.routing == after {
                // The same order again (a retried call).
                return Ok(pb::MoveSlotsResponse {
                    slots: i.slots.len() as u32,
                });
            }
            return Err(precondition(format!(
                "a move into this shard (epoch {}) is under way",
                i.epoch
            )));
        }
        {
            // Planned on the newest table: this shard's own slots must be the same in it (a
            // shard that took no part in the last moves still routes by an older epoch).
            let mut owned = self.moves.owned.write();
            if owned.epoch > r.from_epoch {
                return Err(precondition(format!(
                    "this shard routes by the slot table of epoch {}, newer than the move's {}",
                    owned.epoch, r.from_epoch
                )));
            }
            let mine = |t: &Routing, s: usize| t.shard_of_slot(s) == Some(me);
            if let Some(s) = (0..sparta_core::routing::SLOTS)
                .find(|&s| mine(&owned.routing, s) != mine(&before, s))
            {
                return Err(precondition(format!(
                    "slot {s}: this shard's slot table (epoch {}) and the move's (epoch {}) \
                     disagree about it",
                    owned.epoch, r.from_epoch
                )));
            }
            *owned = Owned {
                epoch: r.from_epoch,
                routing: before,
            };
        }
        self.routing_changed();
        let count = slots.len() as u32;
        let inc = Incoming::new(
            r.epoch,
            after,
            r.source as usize,
            r.source_addr.clone(),
            slots,
            &self.tables,
        )
        .map_err(|e| Status::internal(format!("staging tables: {e}")))?;
        *incoming = Some(inc);
        drop(incoming);
        // The backups keep the order: a copy promoted before the switch starts it again.
        if let Some(rep) = self.replicator() {
            rep.submit(pb::ReplicaOp {
                move_order: Some(order),
                ..pb::ReplicaOp::default()
            });
        }
        *self.moves.runtime.lock() = Some(tokio::runtime::Handle::current());
        tracing::info!(
            "PS shard {me}: taking {count} slot(s) from shard {} at {} (slot table epoch {})",
            r.source,
            r.source_addr,
            r.epoch
        );
        let shard = Arc::clone(self);
        tokio::spawn(async move { shard.copy_passes(r.epoch).await });
        self.replicated().await?;
        Ok(pb::MoveSlotsResponse { slots: count })
    }

    /// A client of the move's source.
    /// Its requests name the source's shard (any epoch): with `--replicas`, the process at
    /// `addr` holds copies of several shards.
    fn source_client(&self, addr: &str, source: usize) -> Result<PeerClient, Status> {
        crate::replica::shard_client(
            addr,
            &self.cfg.token,
            self.cfg.max_message_bytes,
            source as u32,
            self.cfg.replication.tls.as_ref(),
        )
        .map_err(|e| precondition(format!("the move's source at {addr}: {e}")))
    }

    /// Copy passes of move `epoch` every [`PASS_EVERY`] until it switched.
    async fn copy_passes(self: Arc<Self>, epoch: u64) {
        let mut client = None;
        loop {
            {
                let mut g = self.moves.incoming.lock().await;
                let Some(inc) = g.as_mut().filter(|i| i.epoch == epoch) else {
                    return;
                };
                if client.is_none() {
                    client = match self.source_client(&inc.source_addr, inc.source) {
                        Ok(c) => Some(c),
                        Err(e) => {
                            tracing::warn!("PS shard {}: {}", self.cfg.shard, e.message());
                            None
                        }
                    };
                }
                if let Some(c) = client.as_mut() {
                    if let Err(e) = self.copy_pass(inc, c).await {
                        tracing::warn!(
                            "PS shard {}: copying slots from shard {}: {} (tried again)",
                            self.cfg.shard,
                            inc.source,
                            e.message()
                        );
                        // Its primary may have failed over to another process.
                        if self.follow_source(inc).await {
                            client = None;
                        }
                    }
                }
            }
            tokio::time::sleep(PASS_EVERY).await;
        }
    }

    /// One pass: every table's rows of the moving slots written after the last pass, and the
    /// keys removed since. A source that dropped old tombstones makes the copy start again.
    async fn copy_pass(&self, inc: &mut Incoming, client: &mut PeerClient) -> Result<(), Status> {
        // An answer at most a quarter of the largest message: room for the gRPC framing,
        // and reads of a huge part come in several answers (the slots halved until each
        // fits; the split is kept for later passes).
        let max_bytes = (self.cfg.max_message_bytes / 4) as u64;
        for t in 0..inc.staging.len() {
            let since = inc.since[t];
            let mut next = None;
            let mut queue: std::collections::VecDeque<SlotSet> = inc.groups.drain(..).collect();
            let mut done = Vec::with_capacity(queue.len());
            'group: while let Some(group) = queue.pop_front() {
                // Every part of the table in one read.
                {
                    let req = pb::SlotRowsRequest {
                        epoch: inc.epoch,
                        to_shard: self.cfg.shard as u32,
                        slots: group.as_bytes().to_vec().into(),
                        table: t as u32,
                        part: 0,
                        since: since.unwrap_or(0),
                        removed: since.is_some(),
                        max_bytes,
                        every_part: true,
                    };
                    let resp = match client.slot_rows(req).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            inc.bytes += prost::Message::encoded_len(&r) as u64;
                            inc.armed_after.get_or_insert(r.armed_after);
                            r.rows.unwrap_or_default()
                        }
                        Err(s) if s.message().starts_with(TOO_BIG) => {
                            // Asked again in as many pieces as the source's estimate says
                            // (halves without one).
                            let k = too_big_by(s.message(), max_bytes).unwrap_or(2);
                            let pieces = group.pieces(k);
                            if pieces.len() < 2 {
                                inc.groups = done.into_iter().chain([group]).chain(queue).collect();
                                return Err(s);
                            }
                            for p in pieces.into_iter().rev() {
                                queue.push_front(p);
                            }
                            continue 'group;
                        }
                        Err(s) if s.message().starts_with(TRUNCATED) => {
                            tracing::warn!(
                                "PS shard {}: {}; copying the slots again",
                                self.cfg.shard,
                                s.message()
                            );
                            let fresh = Incoming::new(
                                inc.epoch,
                                inc.routing.clone(),
                                inc.source,
                                inc.source_addr.clone(),
                                inc.slots.clone(),
                                &self.tables,
                            )
                            .map_err(|e| Status::internal(e.to_string()))?;
                            *inc = Incoming {
                                armed_after: inc.armed_after,
                                started: inc.started,
                                bytes: inc.bytes,
                                ..fresh
                            };
                            return Err(s);
                        }
                        Err(s) => {
                            inc.groups = done.into_iter().chain([group]).chain(queue).collect();
                            return Err(s);
                        }
                    };
                    next.get_or_insert(resp.version);
                    let removed = wire::keys_from_bytes(&resp.removed)?;
                    let rows = crate::replica::rows_from(&resp).map_err(Status::from)?;
                    inc.apply(t, &removed, &rows)
                        .map_err(|e| Status::internal(e.to_string()))?;
                    inc.source_step[t] = resp.step;
                }
                done.push(group);
            }
            inc.groups = done;
            inc.since[t] = next;
        }
        inc.passes += 1;
        inc.first_copy.get_or_insert(inc.started.elapsed());
        Ok(())
    }

    /// `SlotRows` (the source): the rows of the moving slots of one table part written after
    /// a version, and (asked) the keys removed since; records the move as outgoing.
    pub(super) fn slot_rows(&self, r: pb::SlotRowsRequest) -> Result<pb::SlotRowsResponse, Status> {
        let slots = SlotSet::from_bytes(&r.slots).map_err(Status::invalid_argument)?;
        let me = self.cfg.shard;
        {
            let owned = self.moves.owned.read();
            if let Some(s) = slots
                .slots()
                .into_iter()
                .find(|&s| owned.routing.shard_of_slot(s) != Some(me))
            {
                return Err(precondition(format!(
                    "slot {s} is not this shard's (shard {me}, slot table epoch {})",
                    owned.epoch
                )));
            }
        }
        let n = self.shard_count();
        if r.to_shard as usize == me || r.to_shard as usize >= n {
            return Err(Status::invalid_argument(format!(
                "a move to shard {} of {n}",
                r.to_shard
            )));
        }
        let armed_after = {
            let mut guard = self.moves.outgoing.lock();
            let (out, looked_at) = &mut *guard;
            if !out.iter().any(|o| o.epoch == r.epoch) {
                tracing::info!(
                    "PS shard {me}: shard {} copies {} slot(s) of this shard (slot table epoch {})",
                    r.to_shard,
                    slots.len(),
                    r.epoch
                );
                out.push(Outgoing {
                    epoch: r.epoch,
                    to: r.to_shard as usize,
                    slots: slots.clone(),
                    armed_after: *looked_at,
                });
            }
            out.iter()
                .find(|o| o.epoch == r.epoch)
                .map_or(*looked_at, |o| o.armed_after)
        };
        let table = self
            .tables
            .get(r.table as usize)
            .ok_or_else(|| Status::invalid_argument(format!("this PS has no table {}", r.table)))?;
        if !r.every_part && r.part as usize >= table.num_shards() {
            return Err(Status::invalid_argument(format!(
                "table {} has {} parts, asked for part {}",
                r.table,
                table.num_shards(),
                r.part
            )));
        }
        // Read before the rows: a row written while they are read is sent again next pass.
        let version = table.version();
        let removed = if r.removed {
            let (keys, truncated) = table.removed_since(r.since);
            if truncated {
                return Err(precondition(format!(
                    "{TRUNCATED} table {} no longer knows every key removed after version {}",
                    r.table, r.since
                )));
            }
            keys.into_iter().filter(|&k| slots.holds(k)).collect()
        } else {
            Vec::new()
        };
        let since = (r.since > 0).then_some(r.since);
        let parts = if r.every_part {
            0..table.num_shards()
        } else {
            r.part as usize..r.part as usize + 1
        };
        // Stops reading once the answer is too large, with an estimate of the whole (the
        // receiver asks again for that many times fewer slots at a time).
        let row_bytes = (8 + 12 + 4 * table.row_stride()) as u64;
        let (nparts, mut read, mut over) = (parts.len() as u64, 0u64, None);
        let mut rows = crate::replica::replica_rows(r.table, table, 0, |add| {
            for (i, part) in parts.enumerate() {
                table.for_each_changed_in(
                    part,
                    since,
                    |k| slots.holds(k),
                    |k, row, m| {
                        read += 1;
                        add(k, row, m)
                    },
                );
                if r.max_bytes > 0 && read * row_bytes > r.max_bytes {
                    over = Some(read * row_bytes * nparts / (i as u64 + 1));
                    return;
                }
            }
        });
        rows.version = version;
        rows.removed = wire::keys_to_bytes(&removed);
        let bytes = over.unwrap_or_else(|| prost::Message::encoded_len(&rows) as u64);
        if r.max_bytes > 0 && bytes > r.max_bytes {
            return Err(Status::resource_exhausted(format!(
                "{TOO_BIG} about {bytes} bytes of rows of {} slot(s) in table {}, the \
                 receiver takes {}",
                slots.len(),
                r.table,
                r.max_bytes
            )));
        }
        Ok(pb::SlotRowsResponse {
            rows: Some(rows),
            armed_after,
        })
    }

    /// `MoveVerdict` (the source): records the receiver's word for a round.
    pub(super) fn record_verdict(&self, r: pb::MoveVerdictRequest) {
        self.moves.verdicts.lock().insert(
            (r.epoch, r.checkpoint),
            Verdict {
                switched: r.switched,
                runs: r.runs,
            },
        );
        self.moves.verdict_told.notify_all();
    }

    /// At a checkpoint round, before the part is written (every worker is blocked in the
    /// round): settles the moves out of and into this shard.
    pub(super) fn settle_moves(&self, checkpoint: u64) -> Result<(), PartFailure> {
        self.settle_shards(checkpoint);
        self.settle_outgoing(checkpoint)?;
        self.settle_incoming(checkpoint)
    }

    /// The source: waits for each receiver's verdict; a switched move's rows are removed
    /// and the new table routes.
    fn settle_outgoing(&self, checkpoint: u64) -> Result<(), PartFailure> {
        let moves = {
            // Under the lock a receiver's first read takes: a move it learns of after this
            // is waited for from the next round on.
            let mut guard = self.moves.outgoing.lock();
            guard.1 = guard.1.max(checkpoint);
            guard.0.clone()
        };
        for o in moves.into_iter().filter(|o| checkpoint > o.armed_after) {
            let deadline = Instant::now() + VERDICT_WAIT;
            let verdict = {
                let mut v = self.moves.verdicts.lock();
                loop {
                    if let Some(x) = v.remove(&(o.epoch, checkpoint)) {
                        break x;
                    }
                    if self
                        .moves
                        .verdict_told
                        .wait_until(&mut v, deadline)
                        .timed_out()
                    {
                        return Err(PartFailure::Failed(format!(
                            "shard {} (receiving {} slot(s) of this shard, slot table epoch {}) \
                             said nothing at checkpoint {checkpoint} in {VERDICT_WAIT:?}",
                            o.to,
                            o.slots.len(),
                            o.epoch
                        )));
                    }
                }
            };
            if !verdict.switched {
                continue;
            }
            let routing = Routing::from_flat_runs(&verdict.runs, self.shard_count())
                .map_err(|e| PartFailure::Failed(e.to_string()))?;
            let t = Instant::now();
            let removed = remove_slots(&self.tables, &o.slots);
            *self.moves.owned.write() = Owned {
                epoch: o.epoch,
                routing,
            };
            self.routing_changed();
            // The backups do the same (the round's answer waits for them).
            if let Some(rep) = self.replicator() {
                rep.submit(pb::ReplicaOp {
                    slots_removed: o.slots.as_bytes().to_vec().into(),
                    routing_epoch: o.epoch,
                    slot_runs: verdict.runs.clone(),
                    ..pb::ReplicaOp::default()
                });
            }
            self.moves.outgoing.lock().0.retain(|x| x.epoch != o.epoch);
            self.moves.counts.lock().moves_out += 1;
            self.metrics.slot_move("out", o.slots.len() as u64, removed);
            self.refresh_table_rows();
            tracing::info!(
                "PS shard {}: gave {} slot(s) ({removed} rows, removed in {:.3} s) to shard {} \
                 at checkpoint {checkpoint} (slot table epoch {})",
                self.cfg.shard,
                o.slots.len(),
                t.elapsed().as_secs_f64(),
                o.to,
                o.epoch
            );
        }
        // Verdicts of this round and before that nobody waited for (moves not yet armed).
        self.moves
            .verdicts
            .lock()
            .retain(|&(_, c), _| c > checkpoint);
        Ok(())
    }

    /// The receiver: after a first complete copy, a last pass (the source is still), the
    /// verdict to the source (acknowledged), the staged rows into this shard's tables and
    /// the new table; before it, a "not yet" verdict.
    fn settle_incoming(&self, checkpoint: u64) -> Result<(), PartFailure> {
        let Some(rt) = self.moves.runtime.lock().clone() else {
            return Ok(());
        };
        rt.block_on(async {
            let mut g = self.moves.incoming.lock().await;
            let Some(inc) = g.as_mut() else {
                return Ok(());
            };
            let started = Instant::now();
            let mut client = self
                .source_client(&inc.source_addr, inc.source)
                .map_err(|s| PartFailure::Failed(s.message().to_string()))?;
            let switched = inc.ready_at(checkpoint)
                && match self.copy_pass(inc, &mut client).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(
                            "PS shard {}: the last copy pass at checkpoint {checkpoint} failed: \
                             {} (the move waits for a later round)",
                            self.cfg.shard,
                            e.message()
                        );
                        false
                    }
                };
            let last_pass = started.elapsed();
            // A switch is taken in (and held by every backup) before the source hears of it:
            // once told, the source drops the rows.
            let rows = if switched {
                let rows = inc
                    .merge_into(&self.tables)
                    .map_err(|e| PartFailure::Failed(format!("taking the moved rows: {e}")))?;
                *self.moves.owned.write() = Owned {
                    epoch: inc.epoch,
                    routing: inc.routing.clone(),
                };
                self.routing_changed();
                self.replicate_taken(inc).await?;
                rows
            } else {
                0
            };
            let verdict = pb::MoveVerdictRequest {
                epoch: inc.epoch,
                checkpoint,
                switched,
                runs: inc.routing.flat_runs(),
            };
            let mut tries = 0;
            while let Err(e) = client.move_verdict(verdict.clone()).await {
                tries += 1;
                // A "not yet" may go to where the source is now; a switch already taken in
                // may not (the new primary never armed for it): the round fails instead, and
                // the job rolls back.
                if !switched && tries % 4 == 0 && self.follow_source(inc).await {
                    client = self
                        .source_client(&inc.source_addr, inc.source)
                        .map_err(|s| PartFailure::Failed(s.message().to_string()))?;
                }
                if tries >= VERDICT_TRIES {
                    return Err(PartFailure::Failed(format!(
                        "the move's source (shard {} at {}) did not take the verdict at \
                         checkpoint {checkpoint}: {}",
                        inc.source,
                        inc.source_addr,
                        e.message()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            if !switched {
                return Ok(());
            }
            let last = crate::moves::LastMove {
                rows,
                bytes: inc.bytes,
                copy_seconds: inc.first_copy.unwrap_or_default().as_secs_f64(),
                total_seconds: inc.started.elapsed().as_secs_f64(),
                switch_seconds: started.elapsed().as_secs_f64(),
            };
            {
                let mut c = self.moves.counts.lock();
                c.moves_in += 1;
                c.slots_in += inc.slots.len() as u64;
                c.last = last;
            }
            self.metrics.slot_move("in", inc.slots.len() as u64, rows);
            tracing::info!(
                "PS shard {}: took {} slot(s) ({rows} rows, {} bytes copied) from shard {} at \
                 checkpoint {checkpoint}: first copy after {:.3} s, switched {:.3} s after the \
                 order, holding the round {:.3} s (the last pass {:.3} s) (slot table epoch {})",
                self.cfg.shard,
                inc.slots.len(),
                inc.bytes,
                inc.source,
                last.copy_seconds,
                last.total_seconds,
                last.switch_seconds,
                last_pass.as_secs_f64(),
                inc.epoch
            );
            *g = None;
            drop(g);
            self.refresh_table_rows();
            Ok(())
        })
    }

    /// With replicas: asks every PS process where the source's primary copy is now (the
    /// copy `Roles` names primary at the highest epoch) and moves the copy passes there.
    /// Returns whether it moved.
    async fn follow_source(&self, inc: &mut Incoming) -> bool {
        if self.cfg.replication.replicas < 2 {
            return false;
        }
        let addrs = {
            let list = self.moves.shards.lock();
            if list.addrs.is_empty() {
                self.cfg.replication.peers.clone()
            } else {
                list.addrs.clone()
            }
        };
        let mut best: Option<(u64, String)> = None;
        for addr in &addrs {
            let Ok(mut c) = self.source_client(addr, inc.source) else {
                continue;
            };
            let ask = c.roles(pb::RolesRequest {});
            let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(5), ask).await else {
                continue;
            };
            let copies = r.into_inner().copies;
            if let Some(epoch) = crate::replica::primary_epoch(&copies, inc.source) {
                if best.as_ref().is_none_or(|(e, _)| epoch > *e) {
                    best = Some((epoch, addr.clone()));
                }
            }
        }
        match best {
            Some((epoch, addr)) if addr != inc.source_addr => {
                tracing::warn!(
                    "PS shard {}: the move's source, shard {}, is now at {addr} (epoch {epoch}; \
                     was {})",
                    self.cfg.shard,
                    inc.source,
                    inc.source_addr
                );
                // Copied again from the new primary, and armed by its word: its rows and
                // its rounds are not the old one's (a switch must come at a round the new
                // source waits for the verdict at).
                match Incoming::new(
                    inc.epoch,
                    inc.routing.clone(),
                    inc.source,
                    addr,
                    inc.slots.clone(),
                    &self.tables,
                ) {
                    Ok(fresh) => {
                        *inc = Incoming {
                            started: inc.started,
                            bytes: inc.bytes,
                            ..fresh
                        };
                        true
                    }
                    Err(e) => {
                        tracing::warn!("PS shard {}: staging tables: {e}", self.cfg.shard);
                        false
                    }
                }
            }
            _ => false,
        }
    }

    /// A primary with backups sends them the rows a switch took in and the new slot table,
    /// and waits until every backup applied them.
    async fn replicate_taken(&self, inc: &Incoming) -> Result<(), PartFailure> {
        let Some(rep) = self.replicator() else {
            return Ok(());
        };
        for (t, table) in self.tables.iter().enumerate() {
            crate::replica::rows_where(
                t as u32,
                table,
                |k| inc.slots.holds(k),
                SWITCH_ROWS_PER_OP,
                |rows| {
                    rep.submit(pb::ReplicaOp {
                        tables: vec![rows],
                        ..pb::ReplicaOp::default()
                    });
                },
            );
        }
        rep.submit(pb::ReplicaOp {
            routing_epoch: inc.epoch,
            slot_runs: inc.routing.flat_runs(),
            ..pb::ReplicaOp::default()
        });
        self.replicated().await.map_err(|s| {
            PartFailure::Failed(format!(
                "the backups did not take the moved rows: {}",
                s.message()
            ))
        })
    }

    /// A backup copy takes its primary's slot table of `epoch` (a switch, or a round's
    /// answer, with the cluster's shards when they changed: `addrs`) when newer than its
    /// own; an order of a move it completes is dropped.
    pub(super) fn follow_routing(
        &self,
        epoch: u64,
        runs: &[u32],
        addrs: &[String],
    ) -> Result<(), Refusal> {
        if epoch == 0 || epoch <= self.moves.owned.read().epoch {
            return Ok(());
        }
        if !addrs.is_empty() {
            let mut list = self.moves.shards.lock();
            list.addrs = addrs.to_vec();
            let retired = self.cfg.shard >= addrs.len();
            if retired && !list.retired && self.main {
                // This process's own shard left the cluster (its primary was elsewhere).
                self.moves.retired.notify_one();
            }
            list.retired = retired;
            list.next = None;
        }
        let routing = Routing::from_flat_runs(runs, self.shard_count())
            .map_err(|e| Refusal::Invalid(format!("replicated slot table: {e}")))?;
        *self.moves.owned.write() = Owned { epoch, routing };
        {
            let mut o = self.moves.ordered.lock();
            if o.as_ref().is_some_and(|m| m.epoch <= epoch) {
                *o = None;
            }
        }
        self.routing_changed();
        Ok(())
    }

    /// A copy just promoted: the move into its shard its old primary had started and not
    /// switched starts again here (copied afresh from the source).
    pub(super) async fn restart_ordered_move(self: &Arc<Self>) {
        let Some(order) = self.moves.ordered.lock().take() else {
            return;
        };
        if self.owned().epoch >= order.epoch {
            return;
        }
        match self.start_move(order).await {
            Ok(r) => tracing::info!(
                "PS shard {}: promoted with a move under way: copying its {} slot(s) again",
                self.cfg.shard,
                r.slots
            ),
            Err(e) => tracing::warn!(
                "PS shard {}: the move its old primary had started cannot start again: {}",
                self.cfg.shard,
                e.message()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_for_size_says_how_many_pieces_to_ask_for() {
        let m = format!(
            "{TOO_BIG} about 1000 bytes of rows of 8 slot(s) in table 0, the receiver takes 300"
        );
        // 1000 / 300 -> 4, one more for rows spread unevenly.
        assert_eq!(too_big_by(&m, 300), Some(5));
        assert_eq!(
            too_big_by(&format!("{TOO_BIG} about 301 bytes"), 300),
            Some(3)
        );
        assert_eq!(too_big_by("something else", 300), None);
        assert_eq!(too_big_by(&format!("{TOO_BIG} 1000 bytes"), 300), None);
    }
}
