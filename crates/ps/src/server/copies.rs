//! The replication side of a shard's copies: a primary's forwarding of its changes and its
//! backups' links, a backup's application of them, the coordinator's orders (roles, epochs,
//! joins) and the checks that fence a copy that is not the primary.

use std::sync::Arc;

use tonic::Status;

use super::Shard;
use crate::error::{PsError, Refusal};
use crate::once::{Admit, PushId};
use crate::replicator::{Replicator, Source};
use crate::role::Transition;
use sparta_nn::optim::OptimizerState;
use sparta_proto::pb;
use sparta_proto::wire::{self, Compression};

impl Shard {
    /// Sends every change of the dense slice to this copy's backups while it is a primary
    /// with a replicator.
    pub(super) fn forward_dense_changes(&self) {
        let cell = Arc::clone(&self.replicator);
        self.dense.on_change(Box::new(move |values, opt, ids| {
            if let Some(to) = cell.read().as_ref() {
                to.submit(pb::ReplicaOp {
                    dense_pushes: ids.to_vec(),
                    dense: Some(pb::DenseState {
                        values: wire::values_to_bytes(values, Compression::None),
                        slot1: wire::values_to_bytes(&opt.slot1, Compression::None),
                        slot2: wire::values_to_bytes(&opt.slot2, Compression::None),
                        step: opt.step,
                    }),
                    ..pb::ReplicaOp::default()
                });
            }
        }));
    }

    /// Starts sending this primary's changes to its backups (inside the tokio runtime).
    pub(super) fn start_replication(&self) -> Result<(), PsError> {
        let Some(rep) = self.replicator() else {
            return Ok(());
        };
        // Check every address first: a bad one fails the start.
        for p in self
            .cfg
            .placement()
            .map_err(PsError::from)?
            .backups_of(self.cfg.shard)
        {
            self.peer(p).map_err(PsError::from)?;
        }
        rep.start(|p| self.peer(p).ok(), Arc::clone(&self.process_metrics));
        Ok(())
    }

    /// The address and a client of PS process `p` (`--peers`).
    pub(super) fn peer(&self, p: usize) -> Result<(String, crate::replica::PeerClient), Refusal> {
        let addr = self
            .cfg
            .replication
            .peers
            .get(p)
            .cloned()
            .ok_or_else(|| Refusal::Config(format!("no PS process {p} in --peers")))?;
        let c = crate::replica::peer_client(
            &addr,
            &self.cfg.token,
            self.cfg.max_message_bytes,
            self.cfg.replication.tls.as_ref(),
        )
        .map_err(|e| Refusal::Config(e.to_string()))?;
        Ok((addr, c))
    }

    /// Drops every row and resets the replication numbering: a copy about to receive a
    /// fresh copy of its primary.
    pub(super) fn clear_for_copy(&self) {
        for t in &self.tables {
            t.clear();
        }
        self.sequencer.reset(0);
    }

    /// Waits until every backup holds the changes made so far (no-op without backups).
    pub(super) async fn replicated(&self) -> Result<(), Status> {
        match self.replicator() {
            Some(rep) => rep.wait(rep.assigned()).await.map_err(|_| self.fenced()),
            None => Ok(()),
        }
    }

    /// The replicator of a primary with backups.
    pub(super) fn replicator(&self) -> Option<Arc<Replicator>> {
        self.replicator.read().clone()
    }

    /// The refusal of a write this copy applied but may not acknowledge: it was deposed.
    pub(super) fn fenced(&self) -> Status {
        Status::failed_precondition(format!(
            "{} this copy of shard {} was deposed before its backups acknowledged the change",
            sparta_proto::headers::NOT_PRIMARY,
            self.cfg.shard
        ))
    }

    /// Checks that this copy may serve a worker's request naming `epoch` (0: any).
    pub(super) fn serving(&self, epoch: u64) -> Result<(), Status> {
        self.role.serve(self.cfg.shard, epoch).map_err(Status::from)
    }

    /// The coordinator's order for this copy (see [`RoleCell::change`]). A primary also
    /// gets its backups (taken out if missing) and the copies to start copying to.
    pub(super) fn reconfigure(&self, r: &pb::ReconfigureRequest) -> Result<(), Status> {
        let role = pb::Role::try_from(r.role)
            .map_err(|_| Status::invalid_argument(format!("unknown role {}", r.role)))?;
        let shard = self.cfg.shard;
        let list = |v: &[u32]| v.iter().map(|&b| b as usize).collect::<Vec<_>>();
        let (backups, joining) = (list(&r.backups), list(&r.joining));
        if role == pb::Role::Primary {
            // A primary keeps a subset of the backups it replicates to (in sync or joining);
            // a new one joins first.
            let (in_sync, joined) = self.replicator().map(|r| r.backups()).unwrap_or_default();
            if let Some(b) = backups
                .iter()
                .find(|b| !in_sync.contains(b) && !joined.contains(b))
            {
                return Err(Status::failed_precondition(format!(
                    "shard {shard}: process {b} holds no copy this primary replicates to \
                     (a new backup must join first)"
                )));
            }
        }
        let t = self
            .role
            .change(shard, r.epoch, role)
            .map_err(Status::from)?;
        match t {
            Transition::Promoted => {
                let rep = Replicator::new(shard, r.epoch, vec![])
                    .numbered_after(self.sequencer.applied());
                *self.replicator.write() = Some(Arc::new(rep));
                tracing::warn!(
                    "PS: this backup copy of shard {shard} is now its primary (epoch {}, {} \
                     replicated changes applied)",
                    r.epoch,
                    self.sequencer.applied()
                );
            }
            Transition::Deposed => {
                if let Some(rep) = self.replicator.write().take() {
                    rep.fence();
                }
                tracing::warn!(
                    "PS: this copy of shard {shard} was deposed (epoch {})",
                    r.epoch
                )
            }
            Transition::Joining => {
                if let Some(rep) = self.replicator.write().take() {
                    rep.fence();
                }
                self.clear_for_copy();
                tracing::warn!(
                    "PS: this copy of shard {shard} rejoins as a backup (epoch {}): its state \
                     is dropped for a fresh copy of the primary",
                    r.epoch
                );
            }
            Transition::Joined => tracing::info!(
                "PS: this copy of shard {shard} caught up: a backup again (epoch {})",
                r.epoch
            ),
            Transition::Renewed | Transition::Unchanged => {}
        }
        if role == pb::Role::Primary {
            if let Some(rep) = self.replicator() {
                let keep: Vec<usize> = backups.iter().chain(&joining).copied().collect();
                rep.reconfigure(r.epoch, &keep);
                for &p in &joining {
                    let (addr, client) = self.peer(p).map_err(Status::from)?;
                    let source = Source {
                        tables: self.tables.clone(),
                        dense: Arc::clone(&self.dense),
                        barrier: Arc::clone(&self.ckpt_answer),
                    };
                    let metrics = Arc::clone(&self.process_metrics);
                    rep.join(p, r.join_epoch, addr, client, source, metrics);
                }
            }
        }
        Ok(())
    }

    /// Keeps checkpoint round `step`'s answer (once per round; `order` when the part was
    /// written, `export` when an export part was too) and, on a primary with backups, sends
    /// it to them before the workers get it.
    pub(super) async fn round_answered(
        &self,
        step: u64,
        answer: &pb::CheckpointResponse,
        order: Option<sparta_proto::ckpt::Order>,
        export: Option<pb::ExportOrder>,
    ) -> Result<(), Status> {
        let op = {
            let mut last = self.ckpt_answer.lock();
            if last.checkpoint.is_some() && last.checkpoint_step == step {
                None
            } else {
                *last = pb::ReplicaOp {
                    checkpoint: Some(answer.clone()),
                    checkpoint_step: step,
                    checkpoint_id: order.map_or(0, |o| o.id.0),
                    checkpoint_base: order.map_or(0, |o| o.base.0),
                    export,
                    left: std::mem::take(&mut last.left),
                    ..pb::ReplicaOp::default()
                };
                Some(last.clone())
            }
        };
        if let (Some(op), Some(rep)) = (op, self.replicator()) {
            rep.submit(op);
        }
        self.replicated().await
    }

    /// A worker finished training (its final position): its backups record it too before
    /// it is answered, so no round of a promoted copy waits for it.
    pub(super) async fn worker_left(&self, pos: Option<&pb::WorkerPosition>) -> Result<(), Status> {
        if let Some(pos) = pos {
            self.record_left(pos);
            if let Some(rep) = self.replicator() {
                rep.submit(pb::ReplicaOp {
                    left: vec![pos.clone()],
                    ..pb::ReplicaOp::default()
                });
            }
        }
        self.replicated().await
    }

    /// Keeps worker `pos.rank`'s final position among those that left.
    fn record_left(&self, pos: &pb::WorkerPosition) {
        let mut st = self.ckpt_answer.lock();
        st.left.retain(|w| w.rank != pos.rank);
        st.left.push(pos.clone());
    }

    /// Applies one change its primary sent to this backup copy.
    pub(super) fn apply_replica(&self, op: &pb::ReplicaOp) -> Result<(), Refusal> {
        if let Some(answer) = &op.checkpoint {
            self.follow_round(op, answer)?;
        }
        for w in &op.left {
            self.record_left(w);
            if let Some(ck) = &self.ckpt {
                ck.barrier.mark_left(&sparta_proto::ckpt::worker_state(w));
            }
        }
        for rows in &op.tables {
            let t = self.tables.get(rows.table as usize).ok_or_else(|| {
                Refusal::Invalid(format!(
                    "replicated rows of table {}: this PS has {} tables (same job config?)",
                    rows.table,
                    self.tables.len()
                ))
            })?;
            crate::replica::apply_rows(t, rows)?;
        }
        // A slot move's switch: the slots given away, the slot table after it.
        if !op.slots_removed.is_empty() {
            let slots = crate::moves::SlotSet::from_bytes(&op.slots_removed)
                .map_err(|e| Refusal::Invalid(format!("replicated slots removed: {e}")))?;
            crate::moves::remove_slots(&self.tables, &slots);
        }
        self.follow_routing(op.routing_epoch, &op.slot_runs, &[])?;
        if !op.slots_removed.is_empty() || op.routing_epoch > 0 {
            self.refresh_table_rows();
        }
        if let Some(order) = &op.move_order {
            *self.moves.ordered.lock() = Some(order.clone());
        }
        let id_of = |id: &pb::PushId| PushId {
            rank: id.rank,
            session: id.session,
            seq: id.seq,
        };
        if let Some(id) = &op.push {
            if let Ok(Admit::Apply(t)) = self.pushes.admit(id_of(id)) {
                t.finish(Ok(pb::PushResponse {}));
            }
        }
        if let Some(d) = &op.dense {
            let vec = |b: &[u8]| wire::values_to_vec(b, Compression::None, b.len() / 4);
            let opt = OptimizerState {
                step: d.step,
                slot1: vec(&d.slot1)?,
                slot2: vec(&d.slot2)?,
            };
            self.dense
                .set_state(self.dense.total() as u64, &vec(&d.values)?, opt)
                .map_err(|e| Refusal::Invalid(format!("replicated dense slice: {e:?}")))?;
            // A retry of a push this change applied is answered with the slice after it.
            for id in &op.dense_pushes {
                if let Ok(Admit::Apply(t)) = self.dense_pushes.admit(id_of(id)) {
                    t.finish(Ok(pb::DenseResponse {
                        values: d.values.clone(),
                    }));
                }
            }
        }
        Ok(())
    }

    /// A backup follows its primary's checkpoint round `op` (answered with `answer`): a
    /// repeated call for it is answered the same once promoted, the barrier waits for the
    /// same workers, and a written round moves the incremental chain on. The rows stand as
    /// they were at the barrier (the round is numbered after every push before it and
    /// before every push after), and carry the primary's versions, so the part entries'
    /// versions are this copy's cursors too.
    fn follow_round(
        &self,
        op: &pb::ReplicaOp,
        answer: &pb::CheckpointResponse,
    ) -> Result<(), Refusal> {
        {
            let mut last = self.ckpt_answer.lock();
            *last = pb::ReplicaOp {
                seq: 0,
                tables: Vec::new(),
                dense: None,
                push: None,
                dense_pushes: Vec::new(),
                left: std::mem::take(&mut last.left),
                ..op.clone()
            };
        }
        // The slot table after the round (a joining copy learns it here).
        self.follow_routing(answer.routing_epoch, &answer.slot_runs, &answer.shard_addrs)?;
        let Some(ck) = &self.ckpt else {
            return Ok(());
        };
        let workers: Vec<_> = answer
            .workers
            .iter()
            .map(sparta_proto::ckpt::worker_state)
            .collect();
        ck.barrier.follow(&workers);
        if answer.written && op.checkpoint_id != 0 {
            let parts: Vec<sparta_checkpoint::PartEntry> = serde_json::from_str(&answer.parts_json)
                .map_err(|e| Refusal::Invalid(format!("checkpoint round's parts: {e}")))?;
            self.raise_versions(parts.iter().filter_map(|p| match &p.content {
                sparta_checkpoint::PartContent::Table { table, version, .. } => {
                    Some((table.as_str(), *version))
                }
                _ => None,
            }));
            ck.writer.resume_parts(
                sparta_checkpoint::CheckpointId(op.checkpoint_base),
                sparta_checkpoint::CheckpointId(op.checkpoint_id),
                &parts,
            );
        }
        if let Some(e) = op
            .export
            .as_ref()
            .filter(|_| answer.export_error.is_empty())
        {
            let files: Vec<sparta_export::TableFile> = serde_json::from_str(&answer.export_json)
                .map_err(|err| {
                    Refusal::Invalid(format!("checkpoint round's export files: {err}"))
                })?;
            // The primary closed its tables' versions for the export: this copy's later
            // writes must be stamped after them too.
            self.raise_versions(files.iter().map(|f| (f.name.as_str(), f.table_version)));
            let mut slot = self.exporter_for(e)?;
            let (_, _, ex) = slot.as_mut().expect("set by exporter_for");
            ex.resume_at(e.version, &files);
        }
        Ok(())
    }

    /// Moves each named table's version forward to at least the given one.
    fn raise_versions<'a>(&self, versions: impl Iterator<Item = (&'a str, u64)>) {
        for (name, v) in versions {
            if let Some(t) = self.tables.iter().find(|t| t.config().name == name) {
                t.raise_version(v);
            }
        }
    }

    /// Checksums of this copy's tables and dense slice.
    pub(super) fn checksum(&self) -> pb::ChecksumResponse {
        let tables = self
            .tables
            .iter()
            .map(|t| {
                let (rows, sum) = crate::replica::table_checksum(t);
                pb::TableChecksum {
                    name: t.config().name.clone(),
                    rows,
                    sum,
                }
            })
            .collect();
        let dense = self.dense.snapshot().map_or(0, |(v, opt)| {
            let h = crate::replica::hash_floats(opt.step, &v);
            let h = crate::replica::hash_floats(h, &opt.slot1);
            crate::replica::hash_floats(h, &opt.slot2)
        });
        let applied = match self.replicator() {
            Some(r) => r.assigned(),
            None => self.sequencer.applied(),
        };
        pb::ChecksumResponse {
            shard: self.cfg.shard as u32,
            primary: self.role.get().role == pb::Role::Primary,
            tables,
            dense,
            applied,
        }
    }
}
