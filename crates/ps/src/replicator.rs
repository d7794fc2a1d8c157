//! The primary's side of a replicated shard: numbers every change (under the lock that
//! ordered it), queues it for every backup, and a sender task per backup sends its queue in
//! order, in batches. A push is answered once every backup *in sync* acknowledged it
//! ([`Replicator::wait`]).
//!
//! A backup joins ([`Replicator::join`]) while training goes on: its queue starts at the
//! change numbered next, its sender first streams a copy of every row and the dense slice
//! (read after that point: a row the queue changes again is overwritten in order), then the
//! queue. It counts as in sync from the moment it acknowledged every change numbered so far,
//! decided under the numbering lock, so no change answered after that misses it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prost::Message;
use sparta_table::Table;
use tokio::sync::{mpsc, watch};

use crate::dense::DenseSlice;
use crate::replica::PeerClient;
use sparta_proto::metrics::Metrics;
use sparta_proto::pb;
use sparta_proto::wire::{self, Compression};

/// The start of a backup's refusal of changes from a primary of an older epoch. The primary
/// keeps retrying: either it was replaced (its backup was promoted: it acknowledges nothing
/// more, and the coordinator deposes it), or its own order of the newer epoch is on its way.
pub const STALE_EPOCH: &str = "stale epoch:";

/// A primary was deposed (the coordinator's order): nothing more it holds may be
/// acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fenced;

const JOINING: u8 = 0;
const IN_SYNC: u8 = 1;
const REMOVED: u8 = 2;

/// The receiving end of a backup's queue.
type Queue = mpsc::UnboundedReceiver<Arc<pb::ReplicaOp>>;

/// Largest request a sender builds.
const BATCH_BYTES: usize = 8 << 20;

/// One backup as its primary sees it.
struct Link {
    proc: usize,
    queue: mpsc::UnboundedSender<Arc<pb::ReplicaOp>>,
    /// The last sequence number it acknowledged.
    acked: AtomicU64,
    /// JOINING (receiving its copy: not waited for), IN_SYNC (waited for) or REMOVED.
    state: AtomicU8,
    /// The epoch its join started (0: a backup from the cluster's start).
    join_epoch: u64,
}

/// What a joining backup is copied from.
#[derive(Clone)]
pub struct Source {
    /// The shard's tables, in table order.
    pub tables: Vec<Arc<Table>>,
    /// The shard's dense slice.
    pub dense: Arc<DenseSlice>,
    /// The checkpoint barrier's state as backups follow it (the last round, the workers that
    /// finished), read when the copy is sent: anything later is numbered after its base.
    pub barrier: Arc<parking_lot::Mutex<pb::ReplicaOp>>,
}

struct Numbering {
    /// The last sequence number assigned.
    last: u64,
    links: Vec<Arc<Link>>,
}

/// Numbers a primary's changes and sends them to its backups.
pub struct Replicator {
    shard: u32,
    /// The epoch the changes are sent at (a backup at a newer one refuses them).
    epoch: AtomicU64,
    /// Deposed: [`Replicator::wait`] fails.
    fenced: AtomicBool,
    numbering: Mutex<Numbering>,
    /// Links made before [`Replicator::start`], with their queues' receiving ends.
    unstarted: Mutex<Vec<(Arc<Link>, Queue)>>,
    /// The last sequence number every backup in sync acknowledged.
    all: watch::Sender<u64>,
}

impl Replicator {
    /// A replicator of shard `shard` at `epoch` whose backups on processes `procs` hold the
    /// same state already (a cluster's start; nothing is sent before
    /// [`Replicator::start`]).
    pub fn new(shard: usize, epoch: u64, procs: Vec<usize>) -> Self {
        let mut links = Vec::new();
        let mut unstarted = Vec::new();
        for proc in procs {
            let (queue, rx) = mpsc::unbounded_channel();
            let link = Arc::new(Link {
                proc,
                queue,
                acked: AtomicU64::new(0),
                state: AtomicU8::new(IN_SYNC),
                join_epoch: 0,
            });
            links.push(Arc::clone(&link));
            unstarted.push((link, rx));
        }
        Self {
            shard: shard as u32,
            epoch: AtomicU64::new(epoch),
            fenced: AtomicBool::new(false),
            numbering: Mutex::new(Numbering { last: 0, links }),
            unstarted: Mutex::new(unstarted),
            all: watch::channel(0).0,
        }
    }

    /// The same, numbering changes after `last` (a promoted backup continues the numbering
    /// of the changes it applied).
    pub fn numbered_after(self, last: u64) -> Self {
        self.numbering.lock().last = last;
        self.all.send_replace(last);
        self
    }

    /// Queues one change, numbered next; call it under the lock that ordered the change.
    /// Returns its sequence number.
    pub fn submit(&self, mut op: pb::ReplicaOp) -> u64 {
        let mut n = self.numbering.lock();
        n.last += 1;
        op.seq = n.last;
        let op = Arc::new(op);
        for l in &n.links {
            if l.state.load(Relaxed) != REMOVED {
                // A closed queue: its sender stopped (taken out, or the process is stopping).
                let _ = l.queue.send(Arc::clone(&op));
            }
        }
        n.last
    }

    /// The last sequence number assigned.
    pub fn assigned(&self) -> u64 {
        self.numbering.lock().last
    }

    /// Waits until every backup in sync acknowledged change `seq`; fails once deposed.
    pub async fn wait(&self, seq: u64) -> Result<(), Fenced> {
        let mut rx = self.all.subscribe();
        let _ = rx
            .wait_for(|a| *a >= seq || self.fenced.load(Relaxed) || self.none_in_sync())
            .await;
        if self.fenced.load(Relaxed) {
            return Err(Fenced);
        }
        Ok(())
    }

    fn none_in_sync(&self) -> bool {
        !self
            .numbering
            .lock()
            .links
            .iter()
            .any(|l| l.state.load(Relaxed) == IN_SYNC)
    }

    /// The epoch changes are sent at.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Relaxed)
    }

    /// From now on changes go out at `epoch`, only to the backups on processes `keep` (in
    /// sync or joining); the others are no longer sent to nor waited for.
    pub fn reconfigure(&self, epoch: u64, keep: &[usize]) {
        self.epoch.fetch_max(epoch, Relaxed);
        for l in &self.numbering.lock().links {
            if !keep.contains(&l.proc) {
                l.state.store(REMOVED, Relaxed);
            }
        }
        self.recompute();
    }

    /// Backups by state: (in sync, joining).
    pub fn backups(&self) -> (Vec<usize>, Vec<usize>) {
        let n = self.numbering.lock();
        let of = |s: u8| {
            n.links
                .iter()
                .filter(|l| l.state.load(Relaxed) == s)
                .map(|l| l.proc)
                .collect()
        };
        (of(IN_SYNC), of(JOINING))
    }

    /// Deposed: every wait fails from now on, nothing more is sent.
    pub fn fence(&self) {
        self.fenced.store(true, Relaxed);
        self.all.send_modify(|_| {});
    }

    /// Deposed?
    pub fn fenced(&self) -> bool {
        self.fenced.load(Relaxed)
    }

    /// Publishes the last change every backup in sync acknowledged.
    fn recompute(&self) {
        let n = self.numbering.lock();
        let all = n
            .links
            .iter()
            .filter(|l| l.state.load(Relaxed) == IN_SYNC)
            .map(|l| l.acked.load(Relaxed))
            .min()
            .unwrap_or(n.last);
        drop(n);
        self.all.send_modify(|a| *a = (*a).max(all));
    }

    /// Starts one sender task per backup made by [`Replicator::new`] (`peers`: each one's
    /// address and client, by process); call once, inside a tokio runtime.
    pub fn start(
        self: &Arc<Self>,
        peers: impl Fn(usize) -> Option<(String, PeerClient)>,
        metrics: Arc<Metrics>,
    ) {
        for (link, rx) in std::mem::take(&mut *self.unstarted.lock()) {
            let Some((addr, client)) = peers(link.proc) else {
                continue;
            };
            let me = Arc::clone(self);
            let metrics = Arc::clone(&metrics);
            tokio::spawn(async move { me.send_loop(link, addr, client, rx, None, metrics).await });
        }
    }

    /// Adds the copy on process `proc` as a joining backup of the join started at
    /// `join_epoch`: its sender streams a copy of `source`, then every change numbered from
    /// now on. Inside a tokio runtime. The same join ordered again is left alone; any other
    /// link to `proc` (an earlier incarnation's) is taken out.
    pub fn join(
        self: &Arc<Self>,
        proc: usize,
        join_epoch: u64,
        addr: String,
        client: PeerClient,
        source: Source,
        metrics: Arc<Metrics>,
    ) {
        let (queue, rx) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            proc,
            queue,
            acked: AtomicU64::new(0),
            state: AtomicU8::new(JOINING),
            join_epoch,
        });
        let base = {
            let mut n = self.numbering.lock();
            let live = |l: &&Arc<Link>| l.proc == proc && l.state.load(Relaxed) != REMOVED;
            if n.links
                .iter()
                .filter(live)
                .any(|l| l.join_epoch == join_epoch)
            {
                return;
            }
            for l in n.links.iter().filter(live) {
                l.state.store(REMOVED, Relaxed);
            }
            n.links.retain(|l| l.state.load(Relaxed) != REMOVED);
            n.links.push(Arc::clone(&link));
            n.last
        };
        self.recompute();
        link.acked.store(base, Relaxed);
        tracing::info!(
            "PS shard {}: copying the shard to the joining backup at {addr} (changes continue \
             after {base})",
            self.shard
        );
        let me = Arc::clone(self);
        tokio::spawn(async move {
            me.send_loop(link, addr, client, rx, Some((source, base)), metrics)
                .await
        });
    }

    /// Sends one request until the backup acknowledges it; `false` once the link is taken
    /// out or this primary deposed (nothing more to send).
    async fn send(
        &self,
        link: &Link,
        addr: &str,
        client: &mut PeerClient,
        mut req: pb::ReplicateRequest,
        metrics: &Metrics,
    ) -> bool {
        let size = req.encoded_len() as u64 + sparta_proto::metrics::GRPC_FRAME_BYTES;
        let mut attempt = 0u32;
        loop {
            if link.state.load(Relaxed) == REMOVED || self.fenced() {
                return false;
            }
            req.epoch = self.epoch();
            let start = Instant::now();
            match client.replicate(req.clone()).await {
                Ok(_) => {
                    metrics.replicated(req.ops.len() as u64, size, start.elapsed().as_secs_f64());
                    return true;
                }
                Err(s) => {
                    attempt += 1;
                    if attempt == 1 || attempt.is_multiple_of(50) {
                        tracing::warn!(
                            "PS shard {}: replicating to the backup at {addr} failed ({attempt} \
                             attempt(s)): {}; retrying",
                            self.shard,
                            s.message()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Streams a copy of `source` to a joining backup: every table part by part, then the
    /// dense slice, each request telling it the numbered changes continue after `base`.
    async fn copy_to(
        &self,
        link: &Link,
        addr: &str,
        client: &mut PeerClient,
        (source, base): (Source, u64),
        metrics: &Metrics,
    ) -> bool {
        let started = Instant::now();
        let request = |ops| pb::ReplicateRequest {
            shard: self.shard,
            ops,
            epoch: 0,
            snapshot: true,
            snapshot_base: base,
        };
        let (mut rows, mut ops, mut bytes) = (0u64, Vec::new(), 0usize);
        for (t, table) in source.tables.iter().enumerate() {
            for part in 0..table.num_shards() {
                let r = crate::replica::rows_in(t as u32, table, part);
                rows += (r.keys.len() / 8) as u64;
                bytes += r.rows.len() + r.keys.len() + r.meta.len();
                ops.push(pb::ReplicaOp {
                    tables: vec![r],
                    ..pb::ReplicaOp::default()
                });
                if bytes >= BATCH_BYTES {
                    let req = request(std::mem::take(&mut ops));
                    if !self.send(link, addr, client, req, metrics).await {
                        return false;
                    }
                    bytes = 0;
                }
            }
        }
        let dense = source.dense.snapshot().map(|(values, opt)| pb::DenseState {
            values: wire::values_to_bytes(&values, Compression::None),
            slot1: wire::values_to_bytes(&opt.slot1, Compression::None),
            slot2: wire::values_to_bytes(&opt.slot2, Compression::None),
            step: opt.step,
        });
        ops.push(pb::ReplicaOp {
            dense,
            ..pb::ReplicaOp::default()
        });
        ops.push(source.barrier.lock().clone());
        if !self.send(link, addr, client, request(ops), metrics).await {
            return false;
        }
        tracing::info!(
            "PS shard {}: copied {rows} rows and the dense slice to {addr} in {:.2} s",
            self.shard,
            started.elapsed().as_secs_f64()
        );
        metrics.rejoin_copied(rows, started.elapsed().as_secs_f64());
        true
    }

    /// Sends one backup its copy (a joining one) and then its queue, in order, in batches,
    /// each retried until acknowledged, until the backup is taken out
    /// ([`Replicator::reconfigure`], the coordinator's order once it found it dead) or this
    /// primary is deposed.
    async fn send_loop(
        &self,
        link: Arc<Link>,
        addr: String,
        mut client: PeerClient,
        mut rx: Queue,
        copy: Option<(Source, u64)>,
        metrics: Arc<Metrics>,
    ) {
        if let Some(copy) = copy {
            if !self
                .copy_to(&link, &addr, &mut client, copy, &metrics)
                .await
            {
                return;
            }
            self.catch_up(&link);
        }
        while let Some(first) = rx.recv().await {
            if link.state.load(Relaxed) == REMOVED || self.fenced() {
                return;
            }
            let mut bytes = first.encoded_len();
            let mut ops = vec![(*first).clone()];
            while bytes < BATCH_BYTES {
                match rx.try_recv() {
                    Ok(op) => {
                        bytes += op.encoded_len();
                        ops.push((*op).clone());
                    }
                    Err(_) => break,
                }
            }
            let last = ops.last().map_or(0, |o| o.seq);
            let req = pb::ReplicateRequest {
                shard: self.shard,
                ops,
                epoch: self.epoch(),
                snapshot: false,
                snapshot_base: 0,
            };
            if !self.send(&link, &addr, &mut client, req, &metrics).await {
                return;
            }
            link.acked.store(last, Relaxed);
            self.catch_up(&link);
            self.recompute();
        }
    }

    /// A joining backup that acknowledged every change numbered so far is in sync from now
    /// on (decided under the numbering lock: no change is numbered in between).
    fn catch_up(&self, link: &Link) {
        if link.state.load(Relaxed) != JOINING {
            return;
        }
        let n = self.numbering.lock();
        if link.acked.load(Relaxed) >= n.last {
            link.state.store(IN_SYNC, Relaxed);
            tracing::info!(
                "PS shard {}: the backup on process {} caught up (change {})",
                self.shard,
                link.proc,
                n.last
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn changes_are_numbered_and_queued_in_submit_order() {
        let r = Arc::new(Replicator::new(0, 1, vec![1, 2]));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let r = Arc::clone(&r);
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        r.submit(pb::ReplicaOp::default());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(r.assigned(), 400);
        let mut rxs = std::mem::take(&mut *r.unstarted.lock());
        for (_, rx) in &mut rxs {
            let seqs: Vec<u64> = (0..400).map(|_| rx.try_recv().unwrap().seq).collect();
            assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
        }
    }

    #[tokio::test]
    async fn waits_end_with_every_backup_in_sync_acked_or_when_fenced() {
        let r = Arc::new(Replicator::new(0, 1, vec![1, 2]));
        let s = r.submit(pb::ReplicaOp::default());
        let links: Vec<_> = r.numbering.lock().links.clone();
        links[0].acked.store(s, Relaxed);
        r.recompute();
        let w = tokio::time::timeout(Duration::from_millis(50), r.wait(s)).await;
        assert!(w.is_err(), "backup 2 has not acknowledged");
        // Backup 2 taken out: the wait ends.
        r.reconfigure(2, &[1]);
        assert_eq!(r.wait(s).await, Ok(()));
        assert_eq!(r.epoch(), 2);
        assert_eq!(r.backups(), (vec![1], vec![]));
        let s = r.submit(pb::ReplicaOp::default());
        r.fence();
        assert_eq!(r.wait(s).await, Err(Fenced));
    }

    #[test]
    fn a_joining_backup_is_in_sync_once_it_acked_everything_numbered() {
        let r = Replicator::new(0, 1, vec![]);
        r.submit(pb::ReplicaOp::default());
        let (queue, _rx) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            proc: 1,
            queue,
            acked: AtomicU64::new(1),
            state: AtomicU8::new(JOINING),
            join_epoch: 2,
        });
        r.numbering.lock().links.push(Arc::clone(&link));
        assert_eq!(r.backups(), (vec![], vec![1]));
        r.submit(pb::ReplicaOp::default());
        r.catch_up(&link);
        assert_eq!(r.backups(), (vec![], vec![1]), "change 2 not acknowledged");
        link.acked.store(2, Relaxed);
        r.catch_up(&link);
        assert_eq!(r.backups(), (vec![1], vec![]));
    }
}
