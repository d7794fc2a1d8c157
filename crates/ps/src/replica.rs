//! Replicated shards (`--replicas R`): primary-backup by state. The primary of shard `s` runs
//! on process `s`, its backups on processes `s+1 .. s+R-1` (mod N). Every change of the
//! primary (a push's rows after the push, the dense slice after each change) gets the next
//! sequence number of the shard under the lock that orders it, goes into one queue per
//! backup, and a sender task per backup sends the queue in order, in batches; a backup
//! applies sequence number `n` only after `n - 1` ([`Sequencer`]). A worker's push is answered
//! once every backup acknowledged it ([`Replicator::wait`]).
//!
//! Why state and not the operation: a backup never sees the pulls that create rows (admission,
//! initialisation) nor the sync barrier that averages dense gradients, so replaying pushes
//! would need all of that replayed too; the rows a push left carry it all, and an upsert
//! of them is idempotent.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prost::Message;
use sparta_table::{RowMeta, Table};
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;

use crate::auth::AddToken;
use crate::metrics::Metrics;
use crate::proto::parameter_server_client::ParameterServerClient;
use crate::proto::{self as pb};
use crate::wire::{self, Compression};

/// Where the copies of shards live: primary of shard `s` on process `s`, backups on the next
/// `replicas - 1` processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Copies of every shard (1: no backups).
    pub replicas: usize,
    /// Processes (= shards).
    pub num_shards: usize,
}

impl Placement {
    /// Checks `replicas` against `num_shards` (every copy of a shard on its own process).
    pub fn new(replicas: usize, num_shards: usize) -> Result<Self, String> {
        if replicas == 0 || replicas > num_shards {
            return Err(format!(
                "--replicas {replicas} must be between 1 and --num-shards {num_shards} (every \
                 copy of a shard lives on its own PS process)"
            ));
        }
        Ok(Self {
            replicas,
            num_shards,
        })
    }

    /// The processes holding the backups of shard `s`.
    pub fn backups_of(&self, s: usize) -> Vec<usize> {
        (1..self.replicas)
            .map(|k| (s + k) % self.num_shards)
            .collect()
    }

    /// The shards whose backups process `p` holds.
    pub fn backups_on(&self, p: usize) -> Vec<usize> {
        (1..self.replicas)
            .map(|k| (p + self.num_shards - k) % self.num_shards)
            .collect()
    }
}

/// The rows of `keys` (those present) of `table` as a backup applies them.
pub fn rows_of(table_id: u32, table: &Table, keys: &[u64]) -> pb::ReplicaRows {
    let mut ks = Vec::with_capacity(keys.len());
    let mut rows = Vec::with_capacity(keys.len() * table.row_stride());
    let mut meta = Vec::with_capacity(keys.len() * 3);
    table.read_raw(keys, |_, k, row, m| {
        ks.push(k);
        rows.extend_from_slice(row);
        meta.extend_from_slice(&[m.last_step, m.version, m.count]);
    });
    pb::ReplicaRows {
        table: table_id,
        keys: wire::keys_to_bytes(&ks),
        rows: wire::values_to_bytes(&rows, Compression::None),
        meta: meta.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Upserts rows sent by [`rows_of`] into `table`.
pub fn apply_rows(table: &Table, r: &pb::ReplicaRows) -> Result<(), String> {
    let keys = wire::keys_from_bytes(&r.keys)?;
    let n = keys.len();
    if n == 0 {
        return Ok(());
    }
    let floats = r.rows.len() / 4;
    if !floats.is_multiple_of(n) || r.meta.len() != n * 12 {
        return Err(format!(
            "replicated rows of table {}: {} keys, {} row bytes, {} meta bytes do not fit",
            r.table,
            n,
            r.rows.len(),
            r.meta.len()
        ));
    }
    let rows = wire::values_to_vec(&r.rows, Compression::None, floats)?;
    let stride = floats / n;
    let meta: Vec<u32> = r
        .meta
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    for (i, &k) in keys.iter().enumerate() {
        let m = RowMeta {
            last_step: meta[i * 3],
            version: meta[i * 3 + 1],
            count: meta[i * 3 + 2],
        };
        table
            .insert_raw(k, &rows[i * stride..(i + 1) * stride], m)
            .map_err(|e| format!("replicated row of table {}: {e}", r.table))?;
    }
    Ok(())
}

/// An order-independent checksum of a table's rows (key, weights and optimizer state):
/// `(rows, wrapping sum of a hash per row)`.
pub fn table_checksum(table: &Table) -> (u64, u64) {
    let (mut n, mut sum) = (0u64, 0u64);
    table.for_each_row(|k, row, _| {
        n += 1;
        sum = sum.wrapping_add(hash_floats(sparta_table::mix64(k), row));
    });
    (n, sum)
}

/// A hash of `values` in order, seeded with `h`.
pub fn hash_floats(mut h: u64, values: &[f32]) -> u64 {
    for v in values {
        h = sparta_table::mix64(h ^ u64::from(v.to_bits()));
    }
    h
}

/// Backup side: the last sequence number applied of one shard.
#[derive(Default)]
pub struct Sequencer {
    applied: Mutex<u64>,
}

impl Sequencer {
    /// Applies the ops in order with `apply`: one already applied (a resent batch) is
    /// skipped, a gap refused. Returns the last sequence number applied.
    pub fn run<T>(
        &self,
        ops: &[T],
        seq: impl Fn(&T) -> u64,
        mut apply: impl FnMut(&T) -> Result<(), String>,
    ) -> Result<u64, String> {
        let mut applied = self.applied.lock();
        for op in ops {
            let s = seq(op);
            if s <= *applied {
                continue;
            }
            if s != *applied + 1 {
                return Err(format!(
                    "replicated change {s} arrived after change {}: changes {}..{s} are missing",
                    *applied,
                    *applied + 1
                ));
            }
            apply(op)?;
            *applied = s;
        }
        Ok(*applied)
    }

    /// The last sequence number applied.
    pub fn applied(&self) -> u64 {
        *self.applied.lock()
    }
}

/// A gRPC client of a peer PS process.
pub type PeerClient =
    ParameterServerClient<tonic::service::interceptor::InterceptedService<Channel, AddToken>>;

/// Connects (lazily) to a peer PS at `addr` (plain gRPC; must run inside a tokio runtime).
pub fn peer_client(addr: &str, token: &str, max: usize) -> Result<PeerClient, String> {
    let uri = match addr.split_once("://") {
        Some((_, rest)) => format!("http://{rest}"),
        None => format!("http://{addr}"),
    };
    let ep = tonic::transport::Endpoint::from_shared(uri)
        .map_err(|e| format!("--peers address {addr:?}: {e}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true);
    let token = AddToken::new(token).map_err(|e| e.to_string())?;
    Ok(
        ParameterServerClient::with_interceptor(ep.connect_lazy(), token)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
    )
}

/// The start of a backup's refusal of changes from a primary of an older epoch: the primary
/// was deposed.
pub const STALE_EPOCH: &str = "stale epoch:";

/// A primary learnt it was deposed (a backup refused its changes at a newer epoch, or the
/// coordinator said so): nothing more it holds may be acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fenced;

/// Primary side: numbers the shard's changes and sends them to every backup in order.
pub struct Replicator {
    shard: u32,
    /// The epoch the changes are sent at (a backup at a newer one refuses them).
    epoch: AtomicU64,
    /// Process index of each backup (in `--peers` order).
    procs: Vec<usize>,
    /// Per backup: still one (a backup taken out is no longer waited for).
    active: Vec<AtomicBool>,
    /// Deposed: [`Replicator::wait`] fails.
    fenced: AtomicBool,
    /// The last sequence number assigned; held while the change is queued.
    seq: Mutex<u64>,
    queues: Vec<mpsc::UnboundedSender<Arc<pb::ReplicaOp>>>,
    receivers: Mutex<Vec<mpsc::UnboundedReceiver<Arc<pb::ReplicaOp>>>>,
    /// Per backup: the last sequence number it acknowledged.
    acked: Vec<AtomicU64>,
    /// The last sequence number every backup acknowledged.
    all: watch::Sender<u64>,
}

impl Replicator {
    /// A replicator of shard `shard` to the backups on processes `procs` (nothing is sent
    /// before [`Replicator::start`]).
    pub fn new(shard: usize, procs: Vec<usize>) -> Self {
        let backups = procs.len();
        let (queues, receivers) = (0..backups).map(|_| mpsc::unbounded_channel()).unzip();
        Self {
            shard: shard as u32,
            epoch: AtomicU64::new(1),
            active: (0..backups).map(|_| AtomicBool::new(true)).collect(),
            procs,
            fenced: AtomicBool::new(false),
            seq: Mutex::new(0),
            queues,
            receivers: Mutex::new(receivers),
            acked: (0..backups).map(|_| AtomicU64::new(0)).collect(),
            all: watch::channel(0).0,
        }
    }

    /// Queues one change, numbered next; call it under the lock that ordered the change.
    /// Returns its sequence number.
    pub fn submit(&self, mut op: pb::ReplicaOp) -> u64 {
        let mut seq = self.seq.lock();
        *seq += 1;
        op.seq = *seq;
        let op = Arc::new(op);
        for q in &self.queues {
            // A closed queue: the process is stopping.
            let _ = q.send(Arc::clone(&op));
        }
        *seq
    }

    /// The last sequence number assigned.
    pub fn assigned(&self) -> u64 {
        *self.seq.lock()
    }

    /// Waits until every backup acknowledged change `seq`; fails once deposed.
    pub async fn wait(&self, seq: u64) -> Result<(), Fenced> {
        let mut rx = self.all.subscribe();
        let none = || !self.active.iter().any(|a| a.load(Relaxed));
        let _ = rx
            .wait_for(|a| *a >= seq || self.fenced.load(Relaxed) || none())
            .await;
        if self.fenced.load(Relaxed) {
            return Err(Fenced);
        }
        Ok(())
    }

    /// The epoch changes are sent at.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Relaxed)
    }

    /// From now on changes go out at `epoch`, to the backups on processes `keep` only (the
    /// others are no longer sent to nor waited for).
    pub fn reconfigure(&self, epoch: u64, keep: &[usize]) {
        self.epoch.fetch_max(epoch, Relaxed);
        for (i, p) in self.procs.iter().enumerate() {
            if !keep.contains(p) {
                self.active[i].store(false, Relaxed);
            }
        }
        self.recompute();
    }

    /// The processes of the backups still replicated to.
    pub fn backups(&self) -> Vec<usize> {
        self.procs
            .iter()
            .zip(&self.active)
            .filter(|(_, a)| a.load(Relaxed))
            .map(|(p, _)| *p)
            .collect()
    }

    /// Deposed: every wait fails from now on.
    pub fn fence(&self) {
        self.fenced.store(true, Relaxed);
        self.all.send_modify(|_| {});
    }

    /// Deposed?
    pub fn fenced(&self) -> bool {
        self.fenced.load(Relaxed)
    }

    /// Publishes the last change every active backup acknowledged.
    fn recompute(&self) {
        let assigned = self.assigned();
        let all = self
            .acked
            .iter()
            .zip(&self.active)
            .filter(|(_, a)| a.load(Relaxed))
            .map(|(x, _)| x.load(Relaxed))
            .min()
            .unwrap_or(assigned);
        self.all.send_modify(|a| *a = (*a).max(all));
    }

    /// Starts one sender task per backup (`peers[i]` is backup `i`); call once, inside a
    /// tokio runtime.
    pub fn start(self: &Arc<Self>, peers: Vec<(String, PeerClient)>, metrics: Arc<Metrics>) {
        let receivers = std::mem::take(&mut *self.receivers.lock());
        for (i, (rx, (addr, client))) in receivers.into_iter().zip(peers).enumerate() {
            let me = Arc::clone(self);
            let metrics = Arc::clone(&metrics);
            tokio::spawn(async move { me.send_loop(i, addr, client, rx, metrics).await });
        }
    }

    /// Sends backup `i`'s queue in order, in batches, retrying a batch until it is
    /// acknowledged, the backup is taken out ([`Replicator::reconfigure`], the coordinator's
    /// order once it found the backup dead) or this primary is deposed.
    async fn send_loop(
        &self,
        i: usize,
        addr: String,
        mut client: PeerClient,
        mut rx: mpsc::UnboundedReceiver<Arc<pb::ReplicaOp>>,
        metrics: Arc<Metrics>,
    ) {
        const BATCH_BYTES: usize = 8 << 20;
        while let Some(first) = rx.recv().await {
            if !self.active[i].load(Relaxed) || self.fenced() {
                // Taken out (or deposed): its queue is drained, nothing sent.
                continue;
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
            let mut req = pb::ReplicateRequest {
                shard: self.shard,
                ops,
                epoch: self.epoch(),
            };
            let last = req.ops.last().map_or(0, |o| o.seq);
            let size = req.encoded_len() as u64 + crate::metrics::GRPC_FRAME_BYTES;
            let mut attempt = 0u32;
            loop {
                if !self.active[i].load(Relaxed) || self.fenced() {
                    break;
                }
                req.epoch = self.epoch();
                let start = Instant::now();
                match client.replicate(req.clone()).await {
                    Ok(_) => {
                        metrics.replicated(
                            req.ops.len() as u64,
                            size,
                            start.elapsed().as_secs_f64(),
                        );
                        break;
                    }
                    Err(s) if s.message().starts_with(STALE_EPOCH) => {
                        tracing::warn!(
                            "PS shard {}: the backup at {addr} refused changes at epoch {}: {}; \
                             this copy was deposed and acknowledges nothing more",
                            self.shard,
                            req.epoch,
                            s.message()
                        );
                        self.fence();
                        break;
                    }
                    Err(s) => {
                        attempt += 1;
                        if attempt == 1 || attempt.is_multiple_of(50) {
                            tracing::warn!(
                                "PS shard {}: replicating changes up to {last} to the backup at \
                                 {addr} failed ({attempt} attempt(s)): {}; retrying",
                                self.shard,
                                s.message()
                            );
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            if self.active[i].load(Relaxed) && !self.fenced() {
                self.acked[i].store(last, Relaxed);
                self.recompute();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backups_follow_the_primary_and_every_process_hosts_r_minus_1() {
        let p = Placement::new(2, 3).unwrap();
        assert_eq!(p.backups_of(0), vec![1]);
        assert_eq!(p.backups_of(2), vec![0]);
        assert_eq!(p.backups_on(0), vec![2]);
        let p = Placement::new(3, 4).unwrap();
        for s in 0..4 {
            for b in p.backups_of(s) {
                assert!(p.backups_on(b).contains(&s), "shard {s} on {b}");
                assert_ne!(b, s);
            }
            assert_eq!(p.backups_on(s).len(), 2);
        }
        assert!(Placement::new(1, 1).unwrap().backups_of(0).is_empty());
        let e = Placement::new(4, 3).unwrap_err();
        assert!(
            e.contains("--replicas 4") && e.contains("--num-shards 3"),
            "{e}"
        );
    }

    #[test]
    fn a_backup_applies_in_order_skips_repeats_and_refuses_gaps() {
        let s = Sequencer::default();
        let mut seen = Vec::new();
        let r = s.run(
            &[1u64, 2, 3],
            |x| *x,
            |x| {
                seen.push(*x);
                Ok(())
            },
        );
        assert_eq!(r, Ok(3));
        // A batch resent after a lost answer: only the new change is applied.
        assert_eq!(
            s.run(
                &[2u64, 3, 4],
                |x| *x,
                |x| {
                    seen.push(*x);
                    Ok(())
                }
            ),
            Ok(4)
        );
        assert_eq!(seen, vec![1, 2, 3, 4]);
        let e = s.run(&[6u64], |x| *x, |_| panic!("applied")).unwrap_err();
        assert!(e.contains("changes 5..6 are missing"), "{e}");
        assert_eq!(s.applied(), 4);
        // A failed apply leaves the change to be sent again.
        assert!(s.run(&[5u64], |x| *x, |_| Err("bad".into())).is_err());
        assert_eq!(s.applied(), 4);
    }

    #[tokio::test]
    async fn changes_are_numbered_and_queued_in_submit_order() {
        let r = Arc::new(Replicator::new(0, vec![1, 2]));
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
        let mut rxs = std::mem::take(&mut *r.receivers.lock());
        for rx in &mut rxs {
            let seqs: Vec<u64> = (0..400).map(|_| rx.try_recv().unwrap().seq).collect();
            assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
        }
    }

    #[test]
    fn rows_copied_to_a_backup_give_the_same_checksum() {
        let cfg = |name: &str| sparta_table::TableConfig {
            name: name.into(),
            dim: 4,
            optimizer: sparta_table::Optimizer::Adagrad {
                lr: 0.1,
                initial_accumulator: 0.1,
                eps: 1e-8,
            },
            ..sparta_table::TableConfig::default()
        };
        let primary = Table::new(cfg("p")).unwrap();
        let backup = Table::new(cfg("b")).unwrap();
        let keys: Vec<u64> = (1..200).collect();
        let mut out = vec![0.0; keys.len() * 4];
        primary.pull(&keys, &mut out);
        let grads: Vec<f32> = (0..keys.len() * 4).map(|i| (i % 7) as f32 * 0.1).collect();
        primary.push(&keys, &grads);
        assert_ne!(table_checksum(&primary), table_checksum(&backup));
        // Sent in two batches, in reverse order of keys: the sum does not care.
        let rev: Vec<u64> = keys.iter().rev().copied().collect();
        apply_rows(&backup, &rows_of(0, &primary, &rev[..50])).unwrap();
        apply_rows(&backup, &rows_of(0, &primary, &rev[50..])).unwrap();
        assert_eq!(table_checksum(&primary), table_checksum(&backup));
        assert_eq!(table_checksum(&backup).0, 199);
        // Another push on the primary only: the checksums differ again.
        primary.push(&keys[..1], &grads[..4]);
        assert_ne!(table_checksum(&primary), table_checksum(&backup));
    }
}
