//! Key -> shard routing that can move: a key hashes into one of [`SLOTS`] virtual slots (the
//! top [`SLOT_BITS`] bits of its stable mix), and a slot table maps slots to PS shards. A job
//! starts on [`Routing::even`] (contiguous, near-equal runs of slots); a checkpoint records
//! its table ([`Routing::runs`]), so a checkpoint written by N shards can be restored on N'
//! (each new shard reads the slots it now owns from the old parts, [`Routing::sources`]).
//!
//! The routing is identical in every process and across restarts (never an in-process
//! randomised hasher). Checkpoints written before slots existed route by [`Routing::legacy`]
//! (the mixed key scaled onto the shard count); they are read, never written.

use std::sync::Arc;

/// Bits of the mixed key that name its slot.
pub const SLOT_BITS: u32 = 14;
/// Virtual slots: the unit of data a shard owns and a move carries (16384).
pub const SLOTS: usize = 1 << SLOT_BITS;

/// How keys are routed, as cluster manifests record it.
pub const SHARD_MAP: &str = "slot = splitmix64(key) >> 50 (16384 slots); slot -> shard by table";
/// The routing of checkpoints written before slots ([`Routing::legacy`]).
pub const LEGACY_SHARD_MAP: &str = "splitmix64(key) mod num_shards";

/// The slot of `key`.
#[inline]
pub fn slot_of(key: u64) -> usize {
    // Keys carry the field in their top byte, so mix before taking bits.
    (sparta_mix::splitmix64(key) >> (64 - SLOT_BITS)) as usize
}

/// A routing that cannot be built: the text says why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad slot routing: {0}")]
pub struct BadRouting(pub String);

/// Which shard holds each key.
#[derive(Clone, PartialEq, Eq)]
pub struct Routing {
    kind: Kind,
}

/// Short: the kind, the shard count and (a slot table) its runs, never 16384 entries.
impl std::fmt::Debug for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Single => write!(f, "Routing::single"),
            Kind::Legacy(n) => write!(f, "Routing::legacy({n})"),
            Kind::Slots { num_shards, .. } => {
                write!(f, "Routing({num_shards} shards, runs {:?})", self.runs())
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    /// One shard holds every key.
    Single,
    /// `table[slot]` is the slot's shard, of `num_shards`.
    Slots {
        table: Arc<[u16]>,
        num_shards: usize,
    },
    /// The pre-slot map of a checkpoint written by `n` shards.
    Legacy(usize),
}

impl Routing {
    /// Every key on shard 0 (an embedded store, a one-shard cluster).
    pub fn single() -> Routing {
        Routing { kind: Kind::Single }
    }

    /// `num_shards` shards, each owning one contiguous run of `SLOTS / num_shards` slots, give
    /// or take one (slot `s` on shard `s * num_shards / SLOTS`).
    pub fn even(num_shards: usize) -> Routing {
        if num_shards <= 1 {
            return Routing::single();
        }
        assert!(num_shards <= SLOTS, "{num_shards} shards for {SLOTS} slots");
        let table: Vec<u16> = (0..SLOTS)
            .map(|s| (s * num_shards / SLOTS) as u16)
            .collect();
        Routing {
            kind: Kind::Slots {
                table: table.into(),
                num_shards,
            },
        }
    }

    /// The routing of a checkpoint written by `num_shards` shards before slots existed.
    pub fn legacy(num_shards: usize) -> Routing {
        if num_shards <= 1 {
            return Routing::single();
        }
        Routing {
            kind: Kind::Legacy(num_shards),
        }
    }

    /// A slot table over `num_shards` shards: `table[slot]` is the slot's shard.
    pub fn from_table(table: Vec<u16>, num_shards: usize) -> Result<Routing, BadRouting> {
        if table.len() != SLOTS {
            return Err(BadRouting(format!(
                "{} slots, expected {SLOTS}",
                table.len()
            )));
        }
        if num_shards == 0 || num_shards > SLOTS {
            return Err(BadRouting(format!("{num_shards} shards")));
        }
        if let Some((slot, &s)) = table
            .iter()
            .enumerate()
            .find(|(_, &s)| s as usize >= num_shards)
        {
            return Err(BadRouting(format!(
                "slot {slot} on shard {s}, of {num_shards}"
            )));
        }
        if num_shards == 1 {
            return Ok(Routing::single());
        }
        Ok(Routing {
            kind: Kind::Slots {
                table: table.into(),
                num_shards,
            },
        })
    }

    /// The routing a cluster manifest records: its `shard_map` name, shard count and slot
    /// runs ([`Routing::runs`]; empty for a legacy map).
    pub fn from_manifest(
        shard_map: &str,
        num_shards: usize,
        runs: &[[u32; 2]],
    ) -> Result<Routing, BadRouting> {
        match shard_map {
            LEGACY_SHARD_MAP => Ok(Routing::legacy(num_shards)),
            SHARD_MAP if num_shards <= 1 => Ok(Routing::single()),
            SHARD_MAP => Routing::from_runs(runs, num_shards),
            other => Err(BadRouting(format!(
                "keys routed by `{other}`; this build reads `{SHARD_MAP}` and `{LEGACY_SHARD_MAP}`"
            ))),
        }
    }

    /// The table from its runs: `[first slot, shard]` pairs in slot order, the first at 0.
    pub fn from_runs(runs: &[[u32; 2]], num_shards: usize) -> Result<Routing, BadRouting> {
        if runs.first().is_none_or(|r| r[0] != 0) {
            return Err(BadRouting("the slot runs do not start at slot 0".into()));
        }
        let mut table = Vec::with_capacity(SLOTS);
        for (i, r) in runs.iter().enumerate() {
            let end = runs.get(i + 1).map_or(SLOTS as u32, |n| n[0]);
            if end <= r[0] || end as usize > SLOTS {
                return Err(BadRouting(format!("slot run {i} ({r:?}) is out of order")));
            }
            let shard = u16::try_from(r[1]).map_err(|_| BadRouting(format!("shard {}", r[1])))?;
            table.resize(end as usize, shard);
        }
        Routing::from_table(table, num_shards)
    }

    /// Shards keys are routed to.
    pub fn num_shards(&self) -> usize {
        match &self.kind {
            Kind::Single => 1,
            Kind::Slots { num_shards, .. } => *num_shards,
            Kind::Legacy(n) => *n,
        }
    }

    /// The shard of `key`.
    #[inline]
    pub fn shard_of(&self, key: u64) -> usize {
        match &self.kind {
            Kind::Single => 0,
            Kind::Slots { table, .. } => table[slot_of(key)] as usize,
            Kind::Legacy(n) => {
                let x = sparta_mix::splitmix64(key);
                ((x as u128 * *n as u128) >> 64) as usize
            }
        }
    }

    /// The name manifests record for this map.
    pub fn shard_map(&self) -> &'static str {
        match self.kind {
            Kind::Legacy(_) => LEGACY_SHARD_MAP,
            _ => SHARD_MAP,
        }
    }

    /// The slot table as `[first slot, shard]` runs (what a manifest records; one run for a
    /// single shard, none for a legacy map).
    pub fn runs(&self) -> Vec<[u32; 2]> {
        match &self.kind {
            Kind::Single => vec![[0, 0]],
            Kind::Legacy(_) => Vec::new(),
            Kind::Slots { table, .. } => {
                let mut runs: Vec<[u32; 2]> = Vec::new();
                for (slot, &s) in table.iter().enumerate() {
                    if runs.last().is_none_or(|r| r[1] != s as u32) {
                        runs.push([slot as u32, s as u32]);
                    }
                }
                runs
            }
        }
    }

    /// The shard of slot `slot` (`None` for a legacy map, which routes keys, not slots).
    pub fn shard_of_slot(&self, slot: usize) -> Option<usize> {
        match &self.kind {
            Kind::Single => Some(0),
            Kind::Slots { table, .. } => table.get(slot).map(|&s| s as usize),
            Kind::Legacy(_) => None,
        }
    }

    /// The same table with every slot of `slots` on shard `to` (a slot move), over
    /// `num_shards` shards (at least this routing's count).
    pub fn with_slots_on(
        &self,
        slots: &[usize],
        to: usize,
        num_shards: usize,
    ) -> Result<Routing, BadRouting> {
        if num_shards < self.num_shards() || to >= num_shards {
            return Err(BadRouting(format!(
                "shard {to} of {num_shards} (the routing has {})",
                self.num_shards()
            )));
        }
        let mut table: Vec<u16> = match &self.kind {
            Kind::Single => vec![0; SLOTS],
            Kind::Slots { table, .. } => table.to_vec(),
            Kind::Legacy(_) => {
                return Err(BadRouting(
                    "a pre-slot map moves no slots (restore it on a slot map first)".into(),
                ))
            }
        };
        for &s in slots {
            *table
                .get_mut(s)
                .ok_or_else(|| BadRouting(format!("slot {s} of {SLOTS}")))? = to as u16;
        }
        Routing::from_table(table, num_shards)
    }

    /// [`Routing::runs`] flattened (`first slot, shard, first slot, shard, ...`: the wire's
    /// form).
    pub fn flat_runs(&self) -> Vec<u32> {
        self.runs().into_iter().flatten().collect()
    }

    /// The routing of flattened runs over `num_shards` shards (empty: [`Routing::even`]).
    pub fn from_flat_runs(flat: &[u32], num_shards: usize) -> Result<Routing, BadRouting> {
        if flat.is_empty() {
            return Ok(Routing::even(num_shards));
        }
        if flat.len() % 2 != 0 {
            return Err(BadRouting(format!(
                "{} numbers are not runs of pairs",
                flat.len()
            )));
        }
        let runs: Vec<[u32; 2]> = flat.chunks_exact(2).map(|c| [c[0], c[1]]).collect();
        Routing::from_runs(&runs, num_shards)
    }

    /// Slots owned by each shard (a legacy map owns no whole slots: empty counts).
    pub fn slots_per_shard(&self) -> Vec<usize> {
        let mut n = vec![0; self.num_shards()];
        match &self.kind {
            Kind::Single => n[0] = SLOTS,
            Kind::Legacy(_) => n.clear(),
            Kind::Slots { table, .. } => table.iter().for_each(|&s| n[s as usize] += 1),
        }
        n
    }

    /// The shards of this routing (an old layout) that may hold keys `new` routes to
    /// `shard`: what a shard of `new` reads when it restores a checkpoint of this layout.
    /// Every shard when either side does not route by slots.
    pub fn sources(&self, new: &Routing, shard: usize) -> Vec<usize> {
        let (Kind::Slots { table: old, .. }, Kind::Slots { table: now, .. }) =
            (&self.kind, &new.kind)
        else {
            return (0..self.num_shards()).collect();
        };
        let mut from: Vec<usize> = old
            .iter()
            .zip(now.iter())
            .filter(|(_, &n)| n as usize == shard)
            .map(|(&o, _)| o as usize)
            .collect();
        from.sort_unstable();
        from.dedup();
        from
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pinned slots: checkpoints and running clusters place keys by these exact values.
    #[test]
    fn slot_of_is_pinned() {
        let keys = [0, 1, 42, 0xFF00_0000_0000_0001, (1 << 56) | 12345, u64::MAX];
        assert_eq!(keys.map(slot_of), [14472, 9282, 12149, 2937, 1104, 14646]);
        let three = Routing::even(3);
        assert_eq!(keys.map(|k| three.shard_of(k)), [2, 1, 2, 0, 0, 2]);
    }

    #[test]
    fn the_legacy_map_is_the_pre_slot_routing() {
        let keys = [0, 1, 42, 0xFF00_0000_0000_0001, (1 << 56) | 12345, u64::MAX];
        let of = |n| keys.map(|k| Routing::legacy(n).shard_of(k));
        assert_eq!(of(1), [0; 6]);
        assert_eq!(of(2), [1, 1, 1, 0, 0, 1]);
        assert_eq!(of(7), [6, 3, 5, 1, 0, 6]);
        assert_eq!(of(1000), [883, 566, 741, 179, 67, 893]);
    }

    #[test]
    fn a_slot_move_changes_only_the_moved_slots_and_round_trips_as_flat_runs() {
        let two = Routing::even(2);
        let moved = two.with_slots_on(&[0, 1, 9000], 1, 2).unwrap();
        for slot in 0..SLOTS {
            let want = if [0, 1, 9000].contains(&slot) {
                1
            } else {
                two.shard_of_slot(slot).unwrap()
            };
            assert_eq!(moved.shard_of_slot(slot), Some(want), "slot {slot}");
        }
        assert_eq!(
            Routing::from_flat_runs(&moved.flat_runs(), 2).unwrap(),
            moved
        );
        assert_eq!(Routing::from_flat_runs(&[], 3).unwrap(), Routing::even(3));
        // Onto a new shard: the count grows.
        let three = two.with_slots_on(&[5], 2, 3).unwrap();
        assert_eq!(three.num_shards(), 3);
        assert_eq!(three.slots_per_shard(), vec![8191, 8192, 1]);
        assert!(two.with_slots_on(&[SLOTS], 1, 2).is_err());
        assert!(two.with_slots_on(&[1], 2, 2).is_err());
        assert!(Routing::from_flat_runs(&[0], 2).is_err());
    }

    #[test]
    fn even_routing_balances_keys() {
        let r = Routing::even(4);
        let counts = (0..40_000u64).fold([0usize; 4], |mut c, k| {
            c[r.shard_of(k << 8)] += 1;
            c
        });
        for c in counts {
            assert!(
                (9_000..11_000).contains(&c),
                "unbalanced routing {counts:?}"
            );
        }
    }

    #[test]
    fn even_routing_gives_contiguous_near_equal_runs() {
        for n in [1usize, 2, 3, 5, 7, 16, 1000] {
            let r = Routing::even(n);
            assert_eq!(r.num_shards(), n);
            let per = r.slots_per_shard();
            let (lo, hi) = (per.iter().min().unwrap(), per.iter().max().unwrap());
            assert!(hi - lo <= 1, "{n}: {per:?}");
            assert_eq!(per.iter().sum::<usize>(), SLOTS);
            assert_eq!(r.runs().len(), n, "{n}");
        }
    }

    #[test]
    fn sources_are_the_old_shards_owning_a_slot_the_new_shard_owns() {
        let (two, three) = (Routing::even(2), Routing::even(3));
        assert_eq!(two.sources(&three, 0), vec![0]);
        assert_eq!(two.sources(&three, 1), vec![0, 1]);
        assert_eq!(two.sources(&three, 2), vec![1]);
        assert_eq!(three.sources(&Routing::single(), 0), vec![0, 1, 2]);
        assert_eq!(Routing::legacy(2).sources(&three, 2), vec![0, 1]);
        assert_eq!(Routing::single().sources(&two, 1), vec![0]);
    }

    #[test]
    fn bad_tables_and_runs_are_refused() {
        assert!(Routing::from_table(vec![0; 10], 1).is_err());
        assert!(Routing::from_table(vec![3; SLOTS], 3).is_err());
        assert!(Routing::from_runs(&[[1, 0]], 1).is_err());
        assert!(Routing::from_runs(&[[0, 0], [0, 1]], 2).is_err());
        assert!(Routing::from_manifest("mod 7", 2, &[]).is_err());
        assert_eq!(
            Routing::from_manifest(LEGACY_SHARD_MAP, 3, &[]).unwrap(),
            Routing::legacy(3)
        );
    }

    proptest! {
        /// A table survives its runs, and routes every key to the shard of its slot.
        #[test]
        fn a_slot_table_survives_its_runs(
            n in 1usize..40,
            moves in proptest::collection::vec((0usize..SLOTS, 0usize..40), 0..50),
            keys in proptest::collection::vec(any::<u64>(), 1..50),
        ) {
            let mut table: Vec<u16> = (0..SLOTS).map(|s| (s * n / SLOTS) as u16).collect();
            for (slot, to) in moves {
                table[slot] = (to % n) as u16;
            }
            let r = Routing::from_table(table.clone(), n).unwrap();
            let back = Routing::from_manifest(r.shard_map(), n, &r.runs()).unwrap();
            prop_assert_eq!(&back, &r);
            for k in keys {
                prop_assert_eq!(r.shard_of(k), if n == 1 { 0 } else { table[slot_of(k)] as usize });
            }
        }
    }
}
