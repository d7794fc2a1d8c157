//! Replicated shards (`--replicas R`): primary-backup by state. The primary of shard `s` runs
//! on process `s`, its backups on processes `s+1 .. s+R-1` (mod N). Every change of the
//! primary (a push's rows after the push, the dense slice after each change) gets the next
//! sequence number of the shard under the lock that orders it, goes into one queue per
//! backup, and a sender task per backup sends the queue in order, in batches; a backup
//! applies sequence number `n` only after `n - 1` ([`Sequencer`]). A worker's push is answered
//! once every backup acknowledged it ([`crate::replicator::Replicator::wait`]).
//!
//! Why state and not the operation: a backup never sees the pulls that create rows (admission,
//! initialisation) nor the sync barrier that averages dense gradients, so replaying pushes
//! would need all of that replayed too; the rows a push left carry it all, and an upsert
//! of them is idempotent.

use std::time::Duration;

use parking_lot::Mutex;
use sparta_table::{RowMeta, Table};
use tonic::transport::Channel;

use sparta_proto::auth::AddToken;
use sparta_proto::pb;
use sparta_proto::pb::parameter_server_client::ParameterServerClient;
use sparta_proto::ProtoError;

use crate::error::Refusal;
use sparta_proto::tls::ClientTls;
use sparta_proto::wire::{self, Compression};

/// Where the copies of shards live: primary of shard `s` on process `s`, backups on the next
/// `replicas - 1` processes. Shards added while training (at or past `base`, the count the
/// cluster started with) leave the start's placement as it was: a start shard's backups stay
/// on the next processes among the start's (mod `base`), an added shard's go on the next
/// processes among all (mod `num_shards`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Copies of every shard (1: no backups).
    pub replicas: usize,
    /// Processes (= shards).
    pub num_shards: usize,
    /// The shards the cluster started with (`--dense-shards`; `num_shards` without added
    /// shards).
    pub base: usize,
}

impl Placement {
    /// Checks `replicas` against `num_shards` (every copy of a shard on its own process).
    pub fn new(replicas: usize, num_shards: usize) -> Result<Self, Refusal> {
        Self::with_base(replicas, num_shards, num_shards)
    }

    /// [`Placement::new`] of a cluster that started with `base` shards.
    pub fn with_base(replicas: usize, num_shards: usize, base: usize) -> Result<Self, Refusal> {
        if replicas == 0 || replicas > base.min(num_shards) {
            return Err(Refusal::Config(format!(
                "--replicas {replicas} must be between 1 and --num-shards {} (every \
                 copy of a shard lives on its own PS process)",
                base.min(num_shards)
            )));
        }
        Ok(Self {
            replicas,
            num_shards,
            base: base.min(num_shards),
        })
    }

    /// The processes among which shard `s`'s copies go round.
    fn ring(&self, s: usize) -> usize {
        if s < self.base {
            self.base
        } else {
            self.num_shards
        }
    }

    /// The processes holding the backups of shard `s`.
    pub fn backups_of(&self, s: usize) -> Vec<usize> {
        let n = self.ring(s);
        (1..self.replicas).map(|k| (s + k) % n).collect()
    }

    /// The shards whose backups process `p` holds (in shard order).
    pub fn backups_on(&self, p: usize) -> Vec<usize> {
        (0..self.num_shards)
            .filter(|&s| self.backups_of(s).contains(&p))
            .collect()
    }
}

/// The rows of `keys` (those present) of `table` as a backup applies them.
pub fn rows_of(table_id: u32, table: &Table, keys: &[u64]) -> pb::ReplicaRows {
    replica_rows(table_id, table, keys.len(), |add| {
        table.read_raw(keys, |_, k, row, m| add(k, row, m))
    })
}

/// Every row of internal shard `part` of `table` (a rejoining backup's copy, part by part).
pub fn rows_in(table_id: u32, table: &Table, part: usize) -> pb::ReplicaRows {
    replica_rows(table_id, table, 0, |add| table.for_each_row_in(part, add))
}

/// The rows of `table` that `visit` hands over (key, full row, metadata) as one message of
/// table `table_id`, with the table's version and clock; `rows` is the expected count
/// (capacity).
pub(crate) fn replica_rows(
    table_id: u32,
    table: &Table,
    rows: usize,
    visit: impl FnOnce(&mut dyn FnMut(u64, &[f32], RowMeta)),
) -> pb::ReplicaRows {
    let stride = table.row_stride();
    let mut ks = Vec::with_capacity(rows);
    let mut values = Vec::with_capacity(rows * stride);
    let mut meta = Vec::with_capacity(rows * 3);
    visit(&mut |k, row, m| {
        ks.push(k);
        values.extend_from_slice(row);
        meta.extend_from_slice(&[m.last_step, m.version, m.count]);
    });
    pb::ReplicaRows {
        table: table_id,
        keys: wire::keys_to_bytes(&ks),
        rows: wire::values_to_bytes(&values, Compression::None),
        meta: meta.iter().flat_map(|v| v.to_le_bytes()).collect(),
        version: table.version(),
        step: table.step(),
        removed: Default::default(),
    }
}

/// Every row of `table` whose key `keep` accepts, as messages of table `table_id` of at most
/// `max_rows` rows each, handed to `emit` in turn (a slot move's rows taken in, sent to the
/// receiver's backups in bounded messages).
pub fn rows_where(
    table_id: u32,
    table: &Table,
    keep: impl Fn(u64) -> bool,
    max_rows: usize,
    mut emit: impl FnMut(pb::ReplicaRows),
) {
    let max_rows = max_rows.max(1);
    let stride = table.row_stride();
    let mut keys: Vec<u64> = Vec::new();
    let mut values: Vec<f32> = Vec::new();
    let mut metas: Vec<RowMeta> = Vec::new();
    // The first `n` collected rows as one message.
    let mut send =
        |keys: &mut Vec<u64>, values: &mut Vec<f32>, metas: &mut Vec<RowMeta>, n: usize| {
            let msg = replica_rows(table_id, table, n, |add| {
                for (i, (&k, &m)) in keys[..n].iter().zip(&metas[..n]).enumerate() {
                    add(k, &values[i * stride..(i + 1) * stride], m);
                }
            });
            keys.drain(..n);
            values.drain(..n * stride);
            metas.drain(..n);
            emit(msg);
        };
    for part in 0..table.num_shards() {
        table.for_each_changed_in(part, None, &keep, |k, row, m| {
            keys.push(k);
            values.extend_from_slice(&row[..stride]);
            metas.push(m);
        });
        while keys.len() >= max_rows {
            send(&mut keys, &mut values, &mut metas, max_rows);
        }
    }
    if !keys.is_empty() {
        let n = keys.len();
        send(&mut keys, &mut values, &mut metas, n);
    }
}

/// The removal of `keys` from `table` (evicted or forgotten on the primary) as a backup
/// applies it, with the table's version and clock.
pub fn removed_rows(table_id: u32, table: &Table, keys: &[u64]) -> pb::ReplicaRows {
    pb::ReplicaRows {
        table: table_id,
        version: table.version(),
        step: table.step(),
        removed: wire::keys_to_bytes(keys),
        ..Default::default()
    }
}

/// Upserts rows sent by [`rows_of`] into `table`, then removes the keys of `removed`
/// ([`removed_rows`]); the table's version and clock then follow the primary's.
pub fn apply_rows(table: &Table, r: &pb::ReplicaRows) -> Result<(), Refusal> {
    upsert_rows(table, r)?;
    for &k in wire::keys_from_bytes(&r.removed)?.iter() {
        table.remove(k);
    }
    Ok(())
}

/// The upsert part of [`apply_rows`].
fn upsert_rows(table: &Table, r: &pb::ReplicaRows) -> Result<(), Refusal> {
    table.raise_version(r.version);
    table.raise_step(r.step);
    let rows = rows_from(r)?;
    for (k, row, m) in &rows {
        table
            .insert_raw(k, row, m)
            .map_err(|e| Refusal::Invalid(format!("replicated row of table {}: {e}", r.table)))?;
    }
    Ok(())
}

/// The rows a [`pb::ReplicaRows`] carries: key, full row, metadata (checked to fit).
pub fn rows_from(r: &pb::ReplicaRows) -> Result<Rows, Refusal> {
    let keys = wire::keys_from_bytes(&r.keys)?.into_owned();
    let n = keys.len();
    if n == 0 {
        return Ok(Rows::default());
    }
    let floats = r.rows.len() / 4;
    if !floats.is_multiple_of(n) || r.meta.len() != n * 12 {
        return Err(Refusal::Invalid(format!(
            "rows of table {}: {} keys, {} row bytes, {} meta bytes do not fit",
            r.table,
            n,
            r.rows.len(),
            r.meta.len()
        )));
    }
    let rows = wire::values_to_vec(&r.rows, Compression::None, floats)?;
    let meta: Vec<u32> = r
        .meta
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    Ok(Rows {
        stride: floats / n,
        keys,
        rows,
        meta,
    })
}

/// Decoded rows of a [`pb::ReplicaRows`]; iterate for `(key, full row, metadata)`.
#[derive(Default)]
pub struct Rows {
    stride: usize,
    keys: Vec<u64>,
    rows: Vec<f32>,
    meta: Vec<u32>,
}

impl Rows {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether none are held.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl<'a> IntoIterator for &'a Rows {
    type Item = (u64, &'a [f32], RowMeta);
    type IntoIter = Box<dyn Iterator<Item = Self::Item> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.keys.iter().enumerate().map(move |(i, &k)| {
            let m = RowMeta {
                last_step: self.meta[i * 3],
                version: self.meta[i * 3 + 1],
                count: self.meta[i * 3 + 2],
            };
            (k, &self.rows[i * self.stride..(i + 1) * self.stride], m)
        }))
    }
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
        mut apply: impl FnMut(&T) -> Result<(), Refusal>,
    ) -> Result<u64, Refusal> {
        let mut applied = self.applied.lock();
        for op in ops {
            let s = seq(op);
            if s <= *applied {
                continue;
            }
            if s != *applied + 1 {
                return Err(Refusal::Invalid(format!(
                    "replicated change {s} arrived after change {}: changes {}..{s} are missing",
                    *applied,
                    *applied + 1
                )));
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

    /// A rejoining backup: the primary's changes continue after `base`.
    pub fn reset(&self, base: u64) {
        *self.applied.lock() = base;
    }
}

/// A gRPC client of a peer PS process.
pub type PeerClient =
    ParameterServerClient<tonic::service::interceptor::InterceptedService<Channel, AddToken>>;

/// The epoch at which a `Roles` answer's `copies` name shard `shard`'s copy primary, if they
/// do: how movers and receivers find where a failed-over shard's primary is now (the copy
/// named primary at the highest epoch, over every process's answer).
pub(crate) fn primary_epoch(copies: &[pb::CopyRole], shard: usize) -> Option<u64> {
    copies
        .iter()
        .filter(|c| c.shard as usize == shard && c.role == pb::Role::Primary as i32)
        .map(|c| c.epoch)
        .max()
}

/// Connects (lazily) to a peer PS at `addr` (over TLS verified with `tls`, else plain gRPC;
/// must run inside a tokio runtime).
pub fn peer_client(
    addr: &str,
    token: &str,
    max: usize,
    tls: Option<&ClientTls>,
) -> Result<PeerClient, ProtoError> {
    let token = AddToken::new(token)?;
    client_with(addr, token, max, tls)
}

/// [`peer_client`] whose requests are for the primary copy of `shard` at `addr` (any epoch):
/// a slot move's reads and verdict, where a process may hold copies of several shards.
pub fn shard_client(
    addr: &str,
    token: &str,
    max: usize,
    shard: u32,
    tls: Option<&ClientTls>,
) -> Result<PeerClient, ProtoError> {
    let token = AddToken::new(token)?;
    client_with(addr, token.for_copy(shard, 0), max, tls)
}

/// [`peer_client`] whose requests are for `shard`'s copy at `addr`, naming `epoch` as a
/// worker's would (a probe of fencing).
pub fn copy_client(
    addr: &str,
    token: &str,
    (shard, epoch): (u32, u64),
    tls: Option<&ClientTls>,
) -> Result<PeerClient, ProtoError> {
    let token = AddToken::new(token)?;
    client_with(addr, token.for_copy(shard, epoch), 64 << 20, tls)
}

fn client_with(
    addr: &str,
    token: AddToken,
    max: usize,
    tls: Option<&ClientTls>,
) -> Result<PeerClient, ProtoError> {
    let ep = sparta_proto::tls::endpoint(addr, tls, "--peers")?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true);
    Ok(
        ParameterServerClient::with_interceptor(ep.connect_lazy(), token)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn primary_epoch_names_the_shards_primary_copy_only() {
        let copy = |shard: u32, role: pb::Role, epoch: u64| pb::CopyRole {
            shard,
            role: role as i32,
            epoch,
            ..pb::CopyRole::default()
        };
        let copies = [
            copy(0, pb::Role::Primary, 1),
            copy(1, pb::Role::Backup, 4),
            copy(2, pb::Role::Primary, 3),
        ];
        assert_eq!(super::primary_epoch(&copies, 0), Some(1));
        assert_eq!(super::primary_epoch(&copies, 1), None, "a backup copy");
        assert_eq!(super::primary_epoch(&copies, 2), Some(3));
        assert_eq!(super::primary_epoch(&copies, 3), None, "no copy");
    }

    use super::*;

    #[test]
    fn added_shards_leave_the_start_placement_as_it_was() {
        // Started with 2 shards, 3 now: shard 1's backup stays on process 0, the added
        // shard 2's goes on process 0 too; process 2 holds no backup.
        let p = Placement::with_base(2, 3, 2).unwrap();
        assert_eq!(
            (p.backups_of(0), p.backups_of(1), p.backups_of(2)),
            (vec![1], vec![0], vec![0])
        );
        assert_eq!(p.backups_on(0), vec![1, 2]);
        assert_eq!(p.backups_on(1), vec![0]);
        assert!(p.backups_on(2).is_empty());
        // 2 -> 4: the added shards' backups go round all four processes.
        let p = Placement::with_base(2, 4, 2).unwrap();
        assert_eq!((p.backups_of(2), p.backups_of(3)), (vec![3], vec![0]));
        assert_eq!(p.backups_on(3), vec![2]);
        // Without added shards, the start's placement.
        assert_eq!(
            Placement::with_base(2, 3, 3).unwrap(),
            Placement::new(2, 3).unwrap()
        );
        assert!(Placement::with_base(3, 4, 2).is_err());
    }

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
        let e = Placement::new(4, 3).unwrap_err().to_string();
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
        let e = s
            .run(&[6u64], |x| *x, |_| panic!("applied"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("changes 5..6 are missing"), "{e}");
        assert_eq!(s.applied(), 4);
        // A failed apply leaves the change to be sent again.
        assert!(s
            .run(&[5u64], |x| *x, |_| Err(Refusal::Invalid("bad".into())))
            .is_err());
        assert_eq!(s.applied(), 4);
    }

    #[test]
    fn rows_copied_and_removed_on_a_backup_give_the_same_checksum() {
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
        apply_rows(&backup, &rows_of(0, &primary, &keys[..1])).unwrap();
        // Removed on the primary (evicted, forgotten): forwarded, removed on the backup.
        let gone = [3u64, 77, 150, 1_000_000];
        for k in &gone {
            primary.remove(*k);
        }
        assert_ne!(table_checksum(&primary), table_checksum(&backup));
        apply_rows(&backup, &removed_rows(0, &primary, &gone)).unwrap();
        assert_eq!(table_checksum(&primary), table_checksum(&backup));
        assert_eq!(table_checksum(&backup).0, 196);
        assert!(!backup.contains(77));
    }

    /// A backup's table version and clock follow its primary's, so once promoted it stamps
    /// its writes after every replicated row: an incremental checkpoint counted from the
    /// primary's version at the last checkpoint holds exactly the rows written since.
    #[test]
    fn a_promoted_copy_stamps_its_writes_after_the_replicated_ones() {
        let cfg = sparta_table::TableConfig {
            dim: 2,
            ..sparta_table::TableConfig::default()
        };
        let primary = Table::new(cfg.clone()).unwrap();
        let backup = Table::new(cfg).unwrap();
        let keys: Vec<u64> = (1..50).collect();
        let mut out = vec![0.0; keys.len() * 2];
        let grads = vec![0.5; keys.len() * 2];
        for _ in 0..3 {
            primary.advance_step();
            primary.pull(&keys, &mut out);
            primary.push(&keys, &grads);
        }
        apply_rows(&backup, &rows_of(0, &primary, &keys)).unwrap();
        assert_eq!(backup.version(), primary.version());
        assert_eq!(backup.step(), primary.step());
        // The checkpoint cursor: the primary's version at the barrier.
        let at_checkpoint = primary.version();
        assert!(backup.changed_since(at_checkpoint).keys.is_empty());
        // Promoted: the next push is stamped after the replicated rows.
        backup.pull(&keys[..3], &mut out[..6]);
        backup.push(&keys[..3], &grads[..6]);
        let mut changed = backup.changed_since(at_checkpoint).keys;
        changed.sort_unstable();
        assert_eq!(changed, keys[..3]);
        // An older message (a rejoin's copy part sent before later changes) does not move
        // them back.
        let stale = pb::ReplicaRows {
            version: 1,
            step: 1,
            ..rows_of(0, &primary, &keys[..0])
        };
        apply_rows(&backup, &stale).unwrap();
        assert_eq!(backup.version(), at_checkpoint + 1);
        assert_eq!(backup.step(), primary.step());
    }
}
