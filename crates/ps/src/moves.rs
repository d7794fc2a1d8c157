//! Slot moves between shards while workers train (`sparta move-slots`): the state each side
//! keeps, and the table work (no I/O here; `server::moves` runs the RPCs).
//!
//! # Protocol
//! The receiving shard is given the slot table before and after (`MoveSlots`). It copies the
//! moving slots' rows from the source into *staging* tables while training goes on, in
//! passes: each pass reads, per table and internal part, the rows written after the version
//! the previous pass started at, and the keys removed since ([`Incoming::apply`]: removals
//! first, then the rows). Staged rows serve nothing and are in no checkpoint or export: the
//! slots still belong to the source. At the next checkpoint round after the first complete
//! pass, every worker is blocked in the round (each has finished its pushes to every shard
//! before calling it), so the source is still: the receiver runs a last pass, tells the
//! source (`MoveVerdict`, acknowledged), moves the staged rows into its tables (stamped with
//! its own next version, so its next incremental checkpoint and delta export carry them;
//! their clocks shifted onto its own) and routes by the new table. The source, whose round
//! waits for that verdict, removes the slots' rows (tombstoned: its incremental parts and
//! delta exports record the removals) before writing its part. Both answer the round with the
//! new table at the next epoch; workers route by the newest epoch any shard answers before
//! their next step. A shard refuses pulls and pushes of keys whose slot it does not own once
//! any move happened, so a worker routing by an old table fails loudly, never silently.
//!
//! A death of either side before the switch leaves the slots where they were (a rollback
//! restarts from the last checkpoint, written by the old table); the switch itself happens
//! with nothing in flight.

use std::collections::HashMap;

use sparta_core::routing::{slot_of, SLOTS};
use sparta_core::Routing;
use sparta_table::{RowMeta, Table, TableError};

/// A set of slots, as the wire carries it: bit `s` of byte `s / 8`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotSet {
    bits: Vec<u8>,
}

impl SlotSet {
    /// Bytes of the wire form.
    pub const BYTES: usize = SLOTS / 8;

    /// The set of `slots`.
    pub fn of(slots: impl IntoIterator<Item = usize>) -> Self {
        let mut bits = vec![0u8; Self::BYTES];
        for s in slots {
            bits[s / 8] |= 1 << (s % 8);
        }
        SlotSet { bits }
    }

    /// The set read from its wire form.
    pub fn from_bytes(b: &[u8]) -> Result<Self, String> {
        if b.len() != Self::BYTES {
            return Err(format!(
                "a slot set is {} bytes, got {}",
                Self::BYTES,
                b.len()
            ));
        }
        Ok(SlotSet { bits: b.to_vec() })
    }

    /// The wire form.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bits
    }

    /// Whether slot `slot` is in the set.
    #[inline]
    pub fn contains(&self, slot: usize) -> bool {
        self.bits[slot / 8] >> (slot % 8) & 1 == 1
    }

    /// Whether `key`'s slot is in the set.
    #[inline]
    pub fn holds(&self, key: u64) -> bool {
        self.contains(slot_of(key))
    }

    /// Slots in the set.
    pub fn len(&self) -> usize {
        self.bits.iter().map(|b| b.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slots, ascending.
    pub fn slots(&self) -> Vec<usize> {
        (0..SLOTS).filter(|&s| self.contains(s)).collect()
    }

    /// The set cut in two halves of its slots (a read too large for one answer); `None`
    /// for a single slot.
    pub fn halves(&self) -> Option<(SlotSet, SlotSet)> {
        let mut v = self.pieces(2);
        (v.len() == 2).then(|| {
            let b = v.pop().expect("two");
            (v.pop().expect("two"), b)
        })
    }

    /// The set cut in `k` pieces of (nearly) as many slots each, fewer when it has fewer
    /// than `k` slots (a read whose answer would be about `k` times too large).
    pub fn pieces(&self, k: usize) -> Vec<SlotSet> {
        let slots = self.slots();
        let k = k.clamp(1, slots.len().max(1));
        let per = slots.len().div_ceil(k).max(1);
        slots
            .chunks(per)
            .map(|c| SlotSet::of(c.iter().copied()))
            .collect()
    }
}

/// The slot table a shard routes by: what it owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owned {
    /// 0: the cluster's start (or a re-cut restore); each slot move adds one.
    pub epoch: u64,
    /// The table.
    pub routing: Routing,
}

/// Why a slot move cannot be made as asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("slot move refused: {0}")]
pub struct BadMove(pub String);

/// The slots that move from `source` to `to` between `before` and `after`: every slot whose
/// shard changes must go from `source` to `to` (one pair per move).
pub fn moving_slots(
    before: &Routing,
    after: &Routing,
    source: usize,
    to: usize,
) -> Result<SlotSet, BadMove> {
    if source == to {
        return Err(BadMove(format!("shard {to} cannot move slots to itself")));
    }
    let mut slots = Vec::new();
    for s in 0..SLOTS {
        let (b, a) = (before.shard_of_slot(s), after.shard_of_slot(s));
        let (Some(b), Some(a)) = (b, a) else {
            return Err(BadMove("a pre-slot routing moves no slots".into()));
        };
        if a == b {
            continue;
        }
        if b != source || a != to {
            return Err(BadMove(format!(
                "slot {s} goes from shard {b} to shard {a}; this move takes slots from shard \
                 {source} to shard {to} only"
            )));
        }
        slots.push(s);
    }
    if slots.is_empty() {
        return Err(BadMove("the new slot table moves no slot".into()));
    }
    Ok(SlotSet::of(slots))
}

/// A move into this shard, from its start to its switch.
pub struct Incoming {
    /// The move's epoch (the new table's).
    pub epoch: u64,
    /// The table after the move.
    pub routing: Routing,
    /// The shard the slots come from, and its address.
    pub source: usize,
    /// The source's address.
    pub source_addr: String,
    /// The moving slots.
    pub slots: SlotSet,
    /// The rows copied so far, one staging table per table of the shard.
    pub staging: Vec<Table>,
    /// Per table: the source's version the next pass reads after (`None`: every row).
    pub since: Vec<Option<u64>>,
    /// Per table: the source's clock at the last pass.
    pub source_step: Vec<u32>,
    /// Complete passes so far (the move can switch after the first).
    pub passes: u64,
    /// The source waits for a verdict at rounds after this checkpoint id only (its answer to
    /// the first read; `None` before it).
    pub armed_after: Option<u64>,
    /// When the move was ordered.
    pub started: std::time::Instant,
    /// Time from the order to the first complete copy.
    pub first_copy: Option<std::time::Duration>,
    /// Bytes of every read's answer so far.
    pub bytes: u64,
    /// The moving slots in the groups one read asks for (one group until an answer would
    /// be too large).
    pub groups: Vec<SlotSet>,
}

impl Incoming {
    /// A move of `slots` from `source` into a shard whose tables are `tables` (their
    /// staging twins are made from their configs).
    pub fn new(
        epoch: u64,
        routing: Routing,
        source: usize,
        source_addr: String,
        slots: SlotSet,
        tables: &[std::sync::Arc<Table>],
    ) -> Result<Self, TableError> {
        let staging = tables
            .iter()
            .map(|t| Table::new(t.config().clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Incoming {
            epoch,
            routing,
            source,
            source_addr,
            groups: vec![slots.clone()],
            slots,
            since: vec![None; staging.len()],
            source_step: vec![0; staging.len()],
            staging,
            passes: 0,
            armed_after: None,
            started: std::time::Instant::now(),
            first_copy: None,
            bytes: 0,
        })
    }

    /// Whether the move may switch at the round of checkpoint `checkpoint`: a first complete
    /// copy exists and the source waits for the verdict at that round.
    pub fn ready_at(&self, checkpoint: u64) -> bool {
        self.passes > 0 && self.armed_after.is_some_and(|a| checkpoint > a)
    }

    /// Applies what one read of table `table` returned: `removed` first, then the rows (a
    /// key removed and written again since the last pass appears in both). Rows outside
    /// the moving slots are refused (a source answering for other slots is a bug).
    pub fn apply<R: AsRef<[f32]>>(
        &self,
        table: usize,
        removed: &[u64],
        rows: impl IntoIterator<Item = (u64, R, RowMeta)>,
    ) -> Result<(), BadMove> {
        let t = self
            .staging
            .get(table)
            .ok_or_else(|| BadMove(format!("no table {table}")))?;
        for &k in removed {
            t.remove(k);
        }
        for (k, row, meta) in rows {
            if !self.slots.holds(k) {
                return Err(BadMove(format!(
                    "the source sent key {k:#x} of slot {}, which does not move",
                    slot_of(k)
                )));
            }
            t.insert_raw(k, row.as_ref(), meta)
                .map_err(|e| BadMove(format!("staging a row: {e}")))?;
        }
        Ok(())
    }

    /// Moves every staged row into `tables` (the shard's own): each stamped with its
    /// table's next version, its clock shifted from the source's onto the table's. Returns
    /// the rows moved.
    pub fn merge_into(&self, tables: &[std::sync::Arc<Table>]) -> Result<u64, TableError> {
        let mut moved = 0;
        for (i, (staged, live)) in self.staging.iter().zip(tables).enumerate() {
            let version = (live.version() + 1).min(u32::MAX as u64) as u32;
            let now = i64::from(live.step());
            let shift = now - i64::from(self.source_step[i]);
            moved += live.absorb(staged, |m| RowMeta {
                last_step: (i64::from(m.last_step) + shift).clamp(0, now) as u32,
                version,
                count: m.count,
            })?;
        }
        Ok(moved)
    }
}

/// Removes from `tables` every row whose key is in `slots` (the source after a switch),
/// recorded as tombstones. Returns the rows removed.
pub fn remove_slots(tables: &[std::sync::Arc<Table>], slots: &SlotSet) -> u64 {
    tables
        .iter()
        .map(|t| t.remove_where(|k| slots.holds(k)))
        .sum()
}

/// A move out of this shard, as the source knows it (from the receiver's first read).
#[derive(Clone, Debug)]
pub struct Outgoing {
    /// The move's epoch.
    pub epoch: u64,
    /// The receiving shard.
    pub to: usize,
    /// The moving slots.
    pub slots: SlotSet,
    /// The last checkpoint whose round had looked at the moves out when this one became
    /// known: its verdict is waited for at later rounds only.
    pub armed_after: u64,
}

/// What the receiver said at a round: whether the move switched, and the table after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The move switched at the round.
    pub switched: bool,
    /// The table after the move (meaningful when switched).
    pub runs: Vec<u32>,
}

/// Verdicts by (move epoch, checkpoint id).
pub type Verdicts = HashMap<(u64, u64), Verdict>;

/// What the last move into a shard cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LastMove {
    /// Rows taken in.
    pub rows: u64,
    /// Bytes of every read's answer.
    pub bytes: u64,
    /// Seconds from the order to the first complete copy.
    pub copy_seconds: f64,
    /// Seconds from the order to the switch.
    pub total_seconds: f64,
    /// Seconds the switch held its round (the last pass, the staged rows taken in).
    pub switch_seconds: f64,
}

/// Counts of moves, for `Info` (`/metrics` counts them as they happen).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MoveCounts {
    /// Moves completed into this shard.
    pub moves_in: u64,
    /// Moves completed out of this shard.
    pub moves_out: u64,
    /// Slots taken in.
    pub slots_in: u64,
    /// The last move into the shard.
    pub last: LastMove,
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparta_table::TableConfig;
    use std::sync::Arc;

    fn table() -> Arc<Table> {
        Arc::new(
            Table::new(TableConfig {
                dim: 4,
                ..TableConfig::default()
            })
            .unwrap(),
        )
    }

    #[test]
    fn a_slot_set_round_trips_its_wire_form() {
        let s = SlotSet::of([0, 7, 8, 16383]);
        assert_eq!(s.len(), 4);
        assert!(s.contains(7) && s.contains(16383) && !s.contains(1));
        assert_eq!(SlotSet::from_bytes(s.as_bytes()).unwrap(), s);
        assert_eq!(s.slots(), vec![0, 7, 8, 16383]);
        assert!(SlotSet::from_bytes(&[0; 3]).is_err());
        let (a, b) = s.halves().unwrap();
        assert_eq!((a.slots(), b.slots()), (vec![0, 7], vec![8, 16383]));
        assert!(SlotSet::of([5]).halves().is_none());
        // Pieces of nearly as many slots each, every slot in one.
        let s = SlotSet::of(0..10);
        let p = s.pieces(3);
        let sizes: Vec<usize> = p.iter().map(SlotSet::len).collect();
        assert_eq!(sizes, vec![4, 4, 2]);
        let all: Vec<usize> = p.iter().flat_map(SlotSet::slots).collect();
        assert_eq!(all, s.slots());
        assert_eq!(SlotSet::of([5]).pieces(4).len(), 1);
        assert_eq!(s.pieces(50).len(), 10);
    }

    #[test]
    fn a_move_is_the_slots_that_change_from_one_source_to_one_receiver() {
        let two = Routing::even(2);
        let after = two.with_slots_on(&[1, 2, 3], 1, 2).unwrap();
        assert_eq!(
            moving_slots(&two, &after, 0, 1).unwrap().slots(),
            vec![1, 2, 3]
        );
        assert!(moving_slots(&two, &after, 1, 0).is_err());
        assert!(moving_slots(&two, &two, 0, 1).is_err());
        let three = Routing::even(3);
        let mixed = three
            .with_slots_on(&[0], 2, 3)
            .unwrap()
            .with_slots_on(&[16383], 1, 3)
            .unwrap();
        assert!(moving_slots(&three, &mixed, 0, 2).is_err());
    }

    /// Copy passes against a source that keeps changing, then a last pass: the staged rows
    /// are exactly the source's rows of the slots, and merging them moves them bit for bit
    /// (weights, state, count), stamped after the receiver's version.
    #[test]
    fn passes_then_a_last_pass_stage_exactly_the_sources_rows_and_merge_them() {
        let source = table();
        let keys: Vec<u64> = (0..2000u64)
            .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let mut out = vec![0.0; keys.len() * 4];
        source.pull(&keys, &mut out);
        let slots = SlotSet::of((0..SLOTS).filter(|s| s % 3 == 0));
        let receiver = vec![table()];
        let mut inc =
            Incoming::new(1, Routing::even(2), 0, "a".into(), slots.clone(), &receiver).unwrap();
        let pass = |inc: &mut Incoming| {
            let since = inc.since[0];
            let version = source.version();
            let removed = since.map(|v| source.removed_since(v).0).unwrap_or_default();
            let removed: Vec<u64> = removed.into_iter().filter(|&k| slots.holds(k)).collect();
            let mut rows = Vec::new();
            for part in 0..source.num_shards() {
                source.for_each_changed_in(
                    part,
                    since,
                    |k| slots.holds(k),
                    |k, r, m| rows.push((k, r.to_vec(), m)),
                );
            }
            inc.apply(0, &removed, rows).unwrap();
            inc.since[0] = Some(version);
            inc.source_step[0] = source.step();
            inc.passes += 1;
        };
        pass(&mut inc);
        // Training goes on: pushes, a removal, a key removed and created again, new keys.
        source.bump_version();
        source.push(&keys[..500], &vec![0.25; 2000]);
        source.bump_version();
        for &k in &keys[500..560] {
            source.remove(k);
        }
        let again = &keys[500..510];
        let mut o = vec![0.0; again.len() * 4];
        source.pull(again, &mut o);
        source.push(again, &[-1.0; 40]);
        let fresh: Vec<u64> = (5000..5100u64).map(|k| k * 7919).collect();
        let mut o = vec![0.0; fresh.len() * 4];
        source.pull(&fresh, &mut o);
        source.bump_version();
        pass(&mut inc);
        assert!(!inc.ready_at(7), "the source's word is missing");
        inc.armed_after = Some(6);
        assert!(inc.ready_at(7) && !inc.ready_at(6));
        // The staged rows are the source's rows of the slots, bit for bit.
        let rows_of = |t: &Table| {
            let mut v = Vec::new();
            t.for_each_row(|k, r, m| {
                if slots.holds(k) {
                    v.push((k, r.to_vec(), m.count));
                }
            });
            v.sort_by_key(|r| r.0);
            v
        };
        let want = rows_of(&source);
        assert!(want.len() > 500, "{} rows", want.len());
        assert_eq!(rows_of(&inc.staging[0]), want);
        let before = receiver[0].version();
        assert_eq!(inc.merge_into(&receiver).unwrap(), want.len() as u64);
        assert_eq!(rows_of(&receiver[0]), want);
        receiver[0].for_each_row(|_, _, m| assert_eq!(m.version as u64, before + 1));
        // The source gives them away, tombstoned.
        let v = source.version();
        let shared = vec![Arc::clone(&source)];
        assert_eq!(remove_slots(&shared, &slots), want.len() as u64);
        assert_eq!(source.removed_since(v).0.len(), want.len());
        source.for_each_row(|k, _, _| assert!(!slots.holds(k)));
    }

    #[test]
    fn rows_of_slots_that_do_not_move_are_refused() {
        let receiver = vec![table()];
        let inc = Incoming::new(
            1,
            Routing::even(2),
            0,
            "a".into(),
            SlotSet::of([]),
            &receiver,
        )
        .unwrap();
        let e = inc
            .apply(0, &[], [(42u64, vec![0.0; 8], RowMeta::default())])
            .unwrap_err();
        assert!(e.to_string().contains("does not move"), "{e}");
    }
}
