//! The gRPC service over a shard: the 16 RPCs of `ParameterServer` (pulls, pushes, the dense
//! slice, checkpoint rounds, replication, roles), each refusing what its copy must not serve.

use super::*;

/// The gRPC service over a shard.
#[derive(Clone)]
pub struct Service {
    pub(super) shard: Arc<Shard>,
}

#[tonic::async_trait]
impl ParameterServer for Service {
    async fn info(
        &self,
        req: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::Info);
        let s = &shard;
        s.refresh_table_rows();
        let tables = s
            .tables
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let st = t.stats();
                pb::TableInfo {
                    table: i as u32,
                    dim: t.dim() as u32,
                    name: t.config().name.clone(),
                    tag_rows: t.rows_by_tag(),
                    bytes: st.bytes as u64,
                    evicted: sparta_table::EvictReason::ALL
                        .iter()
                        .map(|&r| st.evicted_by.get(r))
                        .collect(),
                    cold_rows: st.cold_rows as u64,
                    disk_bytes: st.disk_bytes,
                }
            })
            .collect();
        let resp = pb::InfoResponse {
            shard: s.cfg.shard as u32,
            num_shards: s.shard_count() as u32,
            tables,
            dense_total: s.dense.total() as u64,
            dense_offset: s.dense.offset() as u64,
            dense_len: s.dense.len() as u64,
            mode: s.cfg.mode.describe(),
            workers: s.cfg.workers as u32,
            rows: s.rows(),
            resident_bytes: sparta_proto::metrics::resident_bytes().unwrap_or(0),
            peak_resident_bytes: sparta_proto::metrics::peak_resident_bytes().unwrap_or(0),
            ..Default::default()
        };
        let mut resp = resp;
        let owned = s.owned();
        resp.routing_epoch = owned.epoch;
        resp.slot_runs = if owned.epoch == 0 {
            Vec::new()
        } else {
            owned.routing.flat_runs()
        };
        let (counts, moving) = s.move_info();
        resp.moving_in = u32::from(moving);
        resp.moves_in = counts.moves_in;
        resp.moves_out = counts.moves_out;
        resp.slots_moved_in = counts.slots_in;
        resp.last_move_rows = counts.last.rows;
        resp.last_move_bytes = counts.last.bytes;
        let micros = |secs: f64| (secs * 1e6) as u64;
        resp.last_move_copy_micros = micros(counts.last.copy_seconds);
        resp.last_move_total_micros = micros(counts.last.total_seconds);
        resp.last_move_switch_micros = micros(counts.last.switch_seconds);
        (resp.shard_addrs, resp.next_shard_addrs) = s.shard_addrs();
        resp.dense_shards = s.cfg.dense_shards.unwrap_or(s.cfg.num_shards) as u32;
        resp.step = s
            .tables
            .iter()
            .map(|t| u64::from(t.step()))
            .max()
            .unwrap_or(0);
        call.finish(true, 0, size(req.get_ref()), size(&resp));
        Ok(Response::new(resp))
    }

    async fn pull(
        &self,
        req: Request<pb::PullRequest>,
    ) -> Result<Response<pb::PullResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::Pull);
        let r = req.into_inner();
        let bytes_in = size(&r);
        let c = Compression::from_proto(r.compression)?;
        let keys = wire::keys_from_bytes(&r.keys)?;
        shard.check_owned(&keys)?;
        let classes = ClassRanges::new(&r.class_offsets, keys.len())?;
        let mut values = Vec::with_capacity(r.tables.len());
        let mut out = Vec::new();
        for spec in &r.tables {
            let table = shard.table(spec.table, spec.dim)?;
            let dim = table.dim();
            out.clear();
            out.resize(classes.count(spec.classes) * dim, 0.0f32);
            let mut at = 0;
            for range in classes.ranges(spec.classes) {
                let (k, n) = (&keys[range.clone()], range.len() * dim);
                if r.create {
                    table.pull(k, &mut out[at..at + n]);
                } else {
                    table.pull_readonly(k, &mut out[at..at + n]);
                }
                at += n;
            }
            values.push(wire::values_to_bytes(&out, c));
        }
        let resp = pb::PullResponse {
            values,
            compression: c.to_proto() as i32,
        };
        call.finish(true, keys.len() as u64, bytes_in, size(&resp));
        Ok(Response::new(resp))
    }

    async fn push(
        &self,
        req: Request<pb::PushRequest>,
    ) -> Result<Response<pb::PushResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::Push);
        let r = req.into_inner();
        let bytes_in = size(&r);
        let c = Compression::from_proto(r.compression)?;
        let nkeys = wire::key_count(&r.keys)?;
        let classes = ClassRanges::new(&r.class_offsets, nkeys)?;
        shard.check_owned(&wire::keys_from_bytes(&r.keys)?)?;
        // Decode and check every table before applying any, so a bad request changes nothing.
        let mut updates = Vec::with_capacity(r.tables.len());
        for (i, t) in r.tables.iter().enumerate() {
            if r.tables[..i].iter().any(|u| u.table == t.table) {
                return Err(Status::invalid_argument(format!(
                    "table {} appears twice in one push",
                    t.table
                )));
            }
            let dim = shard.table(t.table, t.dim)?.dim();
            let grads =
                wire::values_to_vec(&t.grads, c, classes.count(t.classes) * dim).map_err(|e| {
                    Status::invalid_argument(format!("grads of table {}: {e}", t.table))
                })?;
            shard.refuse_non_finite(&grads, || {
                format!(
                    "table {} of this push holds NaN or infinite gradients; nothing of the push \
                     was applied",
                    t.table
                )
            })?;
            updates.push((t.table as usize, t.classes, grads));
        }
        let copy = Arc::clone(&shard);
        let id = r.id;
        // The keys are decoded on the task that applies them (it owns the request).
        let apply = async move {
            let shard = copy;
            let keys = wire::keys_from_bytes(&r.keys)?;
            let classes = ClassRanges::new(&r.class_offsets, keys.len())?;
            let seq = {
                // With backups: one push at a time, so they get the rows in the order of the
                // pushes that left them.
                let rep = shard.replicator();
                let _order = rep.as_ref().map(|_| shard.order.lock());
                for (t, mask, grads) in &updates {
                    let table = &shard.tables[*t];
                    let mut at = 0;
                    for range in classes.ranges(*mask) {
                        let n = range.len() * table.dim();
                        table.push(&keys[range], &grads[at..at + n]);
                        at += n;
                    }
                }
                // The clock and eviction: here, so a repeated push (answered from the push
                // log) advances nothing.
                let mut removed = shard.after_push(r.steps, keys.len());
                rep.as_ref().map(|rep| {
                    let mut tables: Vec<pb::ReplicaRows> = updates
                        .iter()
                        .map(|(t, mask, _)| {
                            let ks: Vec<u64> = classes
                                .ranges(*mask)
                                .into_iter()
                                .flat_map(|range| keys[range].iter().copied())
                                .collect();
                            let mut m = crate::replica::rows_of(*t as u32, &shard.tables[*t], &ks);
                            m.removed = wire::keys_to_bytes(&std::mem::take(&mut removed[*t]));
                            m
                        })
                        .collect();
                    // Tables the push did not write whose clock moved or rows went.
                    for (t, gone) in removed.iter().enumerate() {
                        if updates.iter().all(|(u, _, _)| *u != t)
                            && (r.steps > 0 || !gone.is_empty())
                        {
                            tables.push(crate::replica::removed_rows(
                                t as u32,
                                &shard.tables[t],
                                gone,
                            ));
                        }
                    }
                    rep.submit(pb::ReplicaOp {
                        tables,
                        push: id,
                        ..pb::ReplicaOp::default()
                    })
                })
            };
            shard.refresh_table_rows();
            if let (Some(rep), Some(seq)) = (shard.replicator(), seq) {
                rep.wait(seq).await.map_err(|_| shard.fenced())?;
            }
            Ok(pb::PushResponse {})
        };
        let resp = self
            .once(&shard, Rpc::Push, &shard.pushes, id, apply)
            .await?;
        call.finish(true, nkeys as u64, bytes_in, size(&resp));
        Ok(Response::new(resp))
    }

    async fn dense_init(
        &self,
        req: Request<pb::DenseInitRequest>,
    ) -> Result<Response<pb::DenseResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::DenseInit);
        let r = req.into_inner();
        let values = wire::values_to_vec(&r.values, Compression::None, r.values.len() / 4)
            .map_err(Status::from)?;
        let now = shard.dense.init(r.total, &values).map_err(refusal)?;
        shard.replicated().await?;
        let resp = pb::DenseResponse {
            values: wire::values_to_bytes(&now, Compression::None),
        };
        call.finish(true, now.len() as u64, size(&r), size(&resp));
        Ok(Response::new(resp))
    }

    async fn dense_push_pull(
        &self,
        req: Request<pb::DensePushPullRequest>,
    ) -> Result<Response<pb::DenseResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::DensePushPull);
        let r = req.into_inner();
        let grads = wire::values_to_vec(&r.grads, Compression::None, r.grads.len() / 4)
            .map_err(Status::from)?;
        shard.refuse_non_finite(&grads, || {
            format!(
                "the dense gradients of worker {} at its step {} hold NaN or infinite values; \
                 nothing was applied",
                r.rank, r.step
            )
        })?;
        if r.id.is_some_and(|id| id.rank != r.rank) {
            return Err(Status::invalid_argument(format!(
                "dense push of worker {} carries the push id of worker {}",
                r.rank,
                r.id.map_or(0, |id| id.rank)
            )));
        }
        let bytes_in = size(&r);
        let copy = Arc::clone(&shard);
        let (rank, step, total, id) = (r.rank as usize, r.step, r.total, r.id);
        let apply = async move {
            let shard = copy;
            let now = shard
                .dense
                .push_pull_id(rank, step, total, &grads, id)
                .await
                .map_err(refusal)?;
            shard.replicated().await?;
            shard
                .metrics
                .set_sync_short_steps(shard.dense.short_steps());
            Ok(pb::DenseResponse {
                values: wire::values_to_bytes(&now, Compression::None),
            })
        };
        let resp = self
            .once(&shard, Rpc::DensePushPull, &shard.dense_pushes, r.id, apply)
            .await?;
        call.finish(true, resp.values.len() as u64 / 4, bytes_in, size(&resp));
        Ok(Response::new(resp))
    }

    async fn dense_pull(
        &self,
        req: Request<pb::DensePullRequest>,
    ) -> Result<Response<pb::DenseResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::DensePull);
        let r = req.into_inner();
        let now = shard.dense.pull(r.total).map_err(refusal)?;
        let resp = pb::DenseResponse {
            values: wire::values_to_bytes(&now, Compression::None),
        };
        call.finish(true, now.len() as u64, size(&r), size(&resp));
        Ok(Response::new(resp))
    }

    async fn dense_get_state(
        &self,
        req: Request<pb::DensePullRequest>,
    ) -> Result<Response<pb::DenseState>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::DenseState);
        let r = req.into_inner();
        let (values, opt) = shard.dense.state(r.total).map_err(refusal)?;
        let resp = pb::DenseState {
            values: wire::values_to_bytes(&values, Compression::None),
            slot1: wire::values_to_bytes(&opt.slot1, Compression::None),
            slot2: wire::values_to_bytes(&opt.slot2, Compression::None),
            step: opt.step,
        };
        call.finish(true, values.len() as u64, size(&r), size(&resp));
        Ok(Response::new(resp))
    }

    async fn dense_set_state(
        &self,
        req: Request<pb::DenseSetStateRequest>,
    ) -> Result<Response<pb::DenseSetStateResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::DenseState);
        let r = req.into_inner();
        let st = r
            .state
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("DenseSetState without a state"))?;
        let vec = |b: &[u8], what: &str| {
            wire::values_to_vec(b, Compression::None, b.len() / 4)
                .map_err(|e| Status::invalid_argument(format!("dense state {what}: {e}")))
        };
        let values = vec(&st.values, "values")?;
        let opt = OptimizerState {
            step: st.step,
            slot1: vec(&st.slot1, "slot1")?,
            slot2: vec(&st.slot2, "slot2")?,
        };
        shard.refuse_non_finite(&values, || {
            "the dense values a worker wrote hold NaN or infinite values; nothing was changed"
                .to_string()
        })?;
        shard
            .dense
            .set_state(r.total, &values, opt)
            .map_err(refusal)?;
        shard.replicated().await?;
        let resp = pb::DenseSetStateResponse {};
        call.finish(true, values.len() as u64, size(&r), size(&resp));
        Ok(Response::new(resp))
    }

    async fn worker_done(
        &self,
        req: Request<pb::WorkerDoneRequest>,
    ) -> Result<Response<pb::WorkerDoneResponse>, Status> {
        if req.get_ref().job_over {
            // For the process, whatever copies it holds now (no shard routing, no epoch).
            let s = &self.shard;
            tracing::info!(
                "PS shard {}: worker {} reports the job over",
                s.cfg.shard,
                req.get_ref().rank
            );
            s.job_over.notify_one();
            return Ok(Response::new(pb::WorkerDoneResponse::default()));
        }
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::WorkerDone);
        let r = req.into_inner();
        let d = &shard.dense;
        let mut done = d.worker_done(r.rank as usize).map_err(refusal)?;
        if let Some(t) = &r.tally {
            shard.tallies.lock().insert(r.rank, *t);
        }
        shard.replicated().await?;
        if r.wait_all {
            done = d.wait_all_done(DONE_WAIT).await;
        }
        let (total, tallies) = shard.tallies_total();
        let resp = pb::WorkerDoneResponse {
            done: done as u32,
            workers: d.workers() as u32,
            total: Some(total),
            tallies,
        };
        call.finish(true, 0, size(&r), size(&resp));
        Ok(Response::new(resp))
    }

    async fn checkpoint(
        &self,
        req: Request<pb::CheckpointRequest>,
    ) -> Result<Response<pb::CheckpointResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let call = shard.metrics.start(Rpc::Checkpoint);
        let r = req.into_inner();
        let bytes_in = size(&r);
        let resp = self.checkpoint_impl(&shard, r).await;
        match resp {
            Ok(resp) => {
                call.finish(true, 0, bytes_in, size(&resp));
                Ok(Response::new(resp))
            }
            Err(s) => {
                call.finish(false, 0, bytes_in, 0);
                Err(s)
            }
        }
    }

    async fn origin(
        &self,
        _req: Request<pb::OriginRequest>,
    ) -> Result<Response<pb::OriginResponse>, Status> {
        Ok(Response::new(self.shard.origin))
    }

    async fn replicate(
        &self,
        req: Request<pb::ReplicateRequest>,
    ) -> Result<Response<pb::ReplicateResponse>, Status> {
        let r = req.into_inner();
        let copy = self.copy_of(r.shard)?;
        copy.role
            .accept_replica(r.shard as usize, r.epoch)
            .map_err(Status::from)?;
        let bad = |e: Refusal| Status::failed_precondition(format!("shard {}: {e}", r.shard));
        let applied = if r.snapshot {
            // A joining copy's rows: applied as they come, the numbered changes follow.
            if copy.role.get().role != pb::Role::Joining {
                return Err(bad(Refusal::Invalid(
                    "a copy of the primary, but this copy is not joining".into(),
                )));
            }
            copy.sequencer.reset(r.snapshot_base);
            for op in &r.ops {
                copy.apply_replica(op).map_err(bad)?;
            }
            r.snapshot_base
        } else {
            copy.sequencer
                .run(&r.ops, |o| o.seq, |o| copy.apply_replica(o))
                .map_err(bad)?
        };
        Ok(Response::new(pb::ReplicateResponse { applied }))
    }

    async fn checksum(
        &self,
        req: Request<pb::ChecksumRequest>,
    ) -> Result<Response<pb::ChecksumResponse>, Status> {
        let copy = self.copy_of(req.get_ref().shard)?;
        Ok(Response::new(copy.checksum()))
    }

    async fn roles(
        &self,
        _req: Request<pb::RolesRequest>,
    ) -> Result<Response<pb::RolesResponse>, Status> {
        Ok(Response::new(self.roles_now()))
    }

    async fn reconfigure(
        &self,
        req: Request<pb::ReconfigureRequest>,
    ) -> Result<Response<pb::RolesResponse>, Status> {
        let r = req.into_inner();
        let copy = self.copy_of(r.shard)?;
        copy.reconfigure(&r)?;
        if copy.role.get().role == pb::Role::Primary {
            // Promoted with a move into the shard under way: it starts again here.
            let c = Arc::clone(&copy);
            tokio::spawn(async move { c.restart_ordered_move().await });
        }
        Ok(Response::new(self.roles_now()))
    }

    async fn move_slots(
        &self,
        req: Request<pb::MoveSlotsRequest>,
    ) -> Result<Response<pb::MoveSlotsResponse>, Status> {
        let shard = self.copy_for(&req)?;
        Ok(Response::new(shard.start_move(req.into_inner()).await?))
    }

    async fn slot_rows(
        &self,
        req: Request<pb::SlotRowsRequest>,
    ) -> Result<Response<pb::SlotRowsResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let r = req.into_inner();
        // A scan of table parts: off the async threads.
        let rows = tokio::task::spawn_blocking(move || shard.slot_rows(r))
            .await
            .map_err(|e| Status::internal(format!("reading slot rows: {e}")))??;
        Ok(Response::new(rows))
    }

    async fn move_verdict(
        &self,
        req: Request<pb::MoveVerdictRequest>,
    ) -> Result<Response<pb::MoveVerdictResponse>, Status> {
        self.copy_for(&req)?.record_verdict(req.into_inner());
        Ok(Response::new(pb::MoveVerdictResponse {}))
    }

    async fn set_shards(
        &self,
        req: Request<pb::SetShardsRequest>,
    ) -> Result<Response<pb::SetShardsResponse>, Status> {
        // The copy named (the primary of a shard failed over here), else this process's own
        // (whatever its role: it makes the backup copies of added shards it holds).
        let copy = match header(req.metadata(), SHARD_HEADER) {
            Some(s) => self.copy_of(s as u32)?,
            None => Arc::clone(&self.shard),
        };
        let r = copy.set_shards(req.into_inner()).await?;
        Ok(Response::new(r))
    }

    async fn forget(
        &self,
        req: Request<pb::ForgetRequest>,
    ) -> Result<Response<pb::ForgetResponse>, Status> {
        let shard = self.copy_for(&req)?;
        let r = req.into_inner();
        // Decode and check every table before removing anything.
        let mut lists = Vec::with_capacity(r.tables.len());
        for t in &r.tables {
            if shard.tables.get(t.table as usize).is_none() {
                return Err(Status::invalid_argument(format!(
                    "this PS has no table {} (it holds {}); do `sparta forget` and the PS use \
                     the same job config?",
                    t.table,
                    shard.tables.len()
                )));
            }
            let keys = wire::keys_from_bytes(&t.keys)
                .map_err(|e| Status::invalid_argument(format!("keys of table {}: {e}", t.table)))?;
            lists.push((t.table as usize, keys));
        }
        let (removed, seq) = {
            // With backups: under the order lock, so the removal reaches them in order with
            // the pushes (a row pushed before is removed after, on every copy).
            let rep = shard.replicator();
            let _order = rep.as_ref().map(|_| shard.order.lock());
            let mut removed = Vec::with_capacity(lists.len());
            let mut ops = Vec::with_capacity(lists.len());
            for (t, keys) in &lists {
                let table = &shard.tables[*t];
                let gone: Vec<u64> = keys.iter().copied().filter(|&k| table.remove(k)).collect();
                removed.push(gone.len() as u64);
                if !gone.is_empty() {
                    ops.push(crate::replica::removed_rows(*t as u32, table, &gone));
                }
            }
            let seq = rep.as_ref().filter(|_| !ops.is_empty()).map(|rep| {
                rep.submit(pb::ReplicaOp {
                    tables: ops,
                    ..pb::ReplicaOp::default()
                })
            });
            (removed, seq)
        };
        shard.refresh_table_rows();
        if let (Some(rep), Some(seq)) = (shard.replicator(), seq) {
            rep.wait(seq).await.map_err(|_| shard.fenced())?;
        }
        tracing::info!(
            "PS shard {}: forgot {} row(s) on request ({:?} per table)",
            shard.cfg.shard,
            removed.iter().sum::<u64>(),
            removed
        );
        Ok(Response::new(pb::ForgetResponse {
            shard: shard.cfg.shard as u32,
            removed,
        }))
    }
}

impl Service {
    /// Every copy this process holds, with its role.
    fn roles_now(&self) -> pb::RolesResponse {
        let backups = self.shard.backups.read().clone();
        let copies = std::iter::once(&self.shard)
            .chain(&backups)
            .map(|c| {
                let r = c.role.get();
                let (in_sync, joining) = c.replicator().map(|r| r.backups()).unwrap_or_default();
                let procs = |v: Vec<usize>| v.into_iter().map(|p| p as u32).collect();
                pb::CopyRole {
                    shard: c.cfg.shard as u32,
                    epoch: r.epoch,
                    role: r.role as i32,
                    in_sync: procs(in_sync),
                    joining: procs(joining),
                }
            })
            .collect();
        let (shard_addrs, next_shard_addrs) = self.shard.shard_addrs();
        let cfg = &self.shard.cfg;
        pb::RolesResponse {
            incarnation: self.shard.origin.incarnation,
            copies,
            shard_addrs,
            next_shard_addrs,
            start_shards: cfg.dense_shards.unwrap_or(cfg.num_shards) as u32,
        }
    }

    /// The copy a worker's request is for (`x-sparta-shard`, default this process's own
    /// shard), checked to be the shard's primary at the epoch it names (`x-sparta-epoch`).
    fn copy_for<T>(&self, req: &Request<T>) -> Result<Arc<Shard>, Status> {
        let meta = req.metadata();
        let s = &self.shard;
        let want = header(meta, SHARD_HEADER).map_or(s.cfg.shard, |v| v as usize);
        let copy = if want == s.cfg.shard {
            Arc::clone(s)
        } else {
            s.backup_of(want).ok_or_else(|| {
                Status::failed_precondition(format!(
                    "{} this PS (shard {}) holds no copy of shard {want}",
                    sparta_proto::headers::NOT_PRIMARY,
                    s.cfg.shard
                ))
            })?
        };
        copy.serving(header(meta, EPOCH_HEADER).unwrap_or(0))?;
        Ok(copy)
    }

    /// This process's copy (primary or backup) of shard `shard`.
    fn copy_of(&self, shard: u32) -> Result<Arc<Shard>, Status> {
        let s = &self.shard;
        if s.cfg.shard == shard as usize {
            return Ok(Arc::clone(s));
        }
        s.backup_of(shard as usize).ok_or_else(|| {
            Status::not_found(format!(
                "this PS (shard {}) holds no copy of shard {shard}",
                s.cfg.shard
            ))
        })
    }

    /// Applies a push once per push id: a new id is applied (on a task of its own, so a
    /// broken connection cannot stop it halfway, e.g. while it waits at the sync barrier) and
    /// its answer kept in `log`; a repeat (the worker's retry) waits for and gets that answer,
    /// counted as a duplicate. Without an id (an old client) it is applied on every attempt.
    /// The fault hook may drop the answer after (or while) applying.
    async fn once<R>(
        &self,
        shard: &Shard,
        rpc: Rpc,
        log: &PushLog<R, Status>,
        id: Option<pb::PushId>,
        apply: impl Future<Output = Result<R, Status>> + Send + 'static,
    ) -> Result<R, Status>
    where
        R: Clone + Send + Sync + 'static,
    {
        let fault = &shard.cfg.fault;
        let Some(id) = id else {
            let r = apply.await?;
            return match fault.on_apply(rpc) {
                Some(_) => Err(dropped(rpc)),
                None => Ok(r),
            };
        };
        let id = PushId {
            rank: id.rank,
            session: id.session,
            seq: id.seq,
        };
        let ticket = match log.admit(id) {
            Ok(Admit::Apply(t)) => t,
            Ok(Admit::Repeat(first)) => {
                shard.metrics.duplicate_push(rpc);
                tracing::debug!("{rpc:?} {id:?} repeated: answered with its first answer");
                return first.outcome().await.unwrap_or_else(|| {
                    Err(Status::aborted(format!(
                        "push {} of worker {} (session {:#018x}): its first attempt stopped \
                         unfinished on this PS; whether it was applied is unknown",
                        id.seq, id.rank, id.session
                    )))
                });
            }
            Err(e @ Refused::Rank { .. }) => return Err(Status::invalid_argument(e.to_string())),
            Err(e) => return Err(Status::failed_precondition(e.to_string())),
        };
        let when = fault.on_apply(rpc);
        let task = tokio::spawn(async move {
            let r = apply.await;
            ticket.finish(r.clone());
            r
        });
        if when == Some(When::Applying) {
            return Err(dropped(rpc));
        }
        let r = task
            .await
            .map_err(|e| Status::internal(format!("applying {rpc:?} {id:?} failed: {e}")))??;
        match when {
            Some(_) => Err(dropped(rpc)),
            None => Ok(r),
        }
    }

    async fn checkpoint_impl(
        &self,
        shard: &Arc<Shard>,
        r: pb::CheckpointRequest,
    ) -> Result<pb::CheckpointResponse, Status> {
        let ck = shard.ckpt.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "this PS has no checkpoint directory: give every process the same job config \
                 with [train] checkpoint_dir (or sparta ps --checkpoint-dir)",
            )
        })?;
        if r.probe {
            // Which round is pending: a worker waiting for input joins it (records nothing).
            let pending = ck.barrier.waiting_for().map(|(step, _)| step);
            return Ok(pb::CheckpointResponse {
                pending: pending.is_some(),
                pending_step: pending.unwrap_or(0),
                ..Default::default()
            });
        }
        // A repeat of a completed round's call is answered as the round was.
        let round = r
            .position
            .as_ref()
            .filter(|_| !r.leaving && !r.last)
            .map(|p| p.step);
        if let Some(step) = round {
            let done = shard.ckpt_answer.lock().clone();
            if let Some(answer) = done.checkpoint.filter(|_| done.checkpoint_step == step) {
                if ck.barrier.waiting_for().is_none_or(|(s, _)| s != step) {
                    return Ok(answer);
                }
            }
        }
        let copy = Arc::clone(shard);
        let write: PartWriter = Arc::new(move |order, export| copy.write_part(order, export));
        let outcome = ck.barrier.arrive(&r, write).await.map_err(Status::from)?;
        let mut answer = Self::checkpoint_answer(&outcome);
        // The slot table after the round (a slot move switches at one).
        let owned = shard.owned();
        if owned.epoch > 0 {
            answer.routing_epoch = owned.epoch;
            answer.slot_runs = owned.routing.flat_runs();
            answer.shard_addrs = shard.shard_addrs().0;
        }
        if let Some(step) = round {
            let (order, export) = match &*outcome {
                Outcome::Written { part, .. } => (
                    Some(part.order),
                    part.export_order
                        .clone()
                        .filter(|_| matches!(part.export, Some(Ok(_)))),
                ),
                _ => (None, None),
            };
            shard.round_answered(step, &answer, order, export).await?;
        } else if r.leaving {
            shard.worker_left(r.position.as_ref()).await?;
        }
        Ok(answer)
    }

    /// What a worker is told of a checkpoint round's outcome.
    fn checkpoint_answer(outcome: &Outcome) -> pb::CheckpointResponse {
        match outcome {
            Outcome::Written { part, workers } => {
                let (export_json, export_error, export_dense) = match &part.export {
                    None => Default::default(),
                    Some(Ok(e)) => (
                        serde_json::to_string(&e.files).unwrap_or_default(),
                        String::new(),
                        wire::values_to_bytes(&e.dense, Compression::None),
                    ),
                    Some(Err(why)) => (String::new(), why.to_string(), Default::default()),
                };
                pb::CheckpointResponse {
                    written: true,
                    failed: false,
                    reason: String::new(),
                    parts_json: serde_json::to_string(&part.parts).unwrap_or_default(),
                    tables_json: serde_json::to_string(&part.tables).unwrap_or_default(),
                    workers: workers.iter().map(worker_position).collect(),
                    export_json,
                    export_error,
                    export_dense,
                    ..Default::default()
                }
            }
            Outcome::Skipped(why) => pb::CheckpointResponse {
                written: false,
                reason: why.clone(),
                ..Default::default()
            },
            Outcome::Failed(why) => pb::CheckpointResponse {
                written: false,
                failed: true,
                reason: why.clone(),
                ..Default::default()
            },
        }
    }
}
