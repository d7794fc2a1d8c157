//! Fused Unique + DynamicPartition: one pass over a batch's ids yields the distinct ids grouped
//! by parameter-server shard, plus the inverse index (occurrence -> distinct id) that is kept and
//! reused to scatter gradients for the push (the seed system's metadata reuse).

use hashbrown::HashMap;

/// Stable key -> shard routing, identical in every process and across restarts
/// (never an in-process randomised hasher).
#[inline]
pub fn shard_of(key: u64, num_shards: usize) -> usize {
    if num_shards <= 1 {
        return 0;
    }
    // Keys carry the field in their top byte, so mix before reducing.
    let x = sparta_mix::splitmix64(key);
    ((x as u128 * num_shards as u128) >> 64) as usize
}

/// The distinct ids of a batch, grouped by shard, and the inverse index.
#[derive(Debug, Default, Clone)]
pub struct UniqueIds {
    /// Distinct ids; those of shard `s` are `keys[shard_offsets[s]..shard_offsets[s + 1]]`.
    pub keys: Vec<u64>,
    /// `num_shards + 1` offsets into `keys`.
    pub shard_offsets: Vec<usize>,
    /// For every occurrence in the input, the index of its id in `keys`.
    pub inverse: Vec<u32>,
}

impl UniqueIds {
    /// Number of distinct ids.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when the batch had no ids.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The distinct ids routed to `shard`.
    pub fn shard_keys(&self, shard: usize) -> &[u64] {
        &self.keys[self.shard_offsets[shard]..self.shard_offsets[shard + 1]]
    }
}

/// Reusable scratch space so a steady-state step allocates nothing.
#[derive(Default)]
pub struct Deduper {
    index: HashMap<u64, u32, foldhash::fast::FixedState>,
    first_seen: Vec<u64>,
    shard_of_first: Vec<u32>,
    position: Vec<u32>,
}

impl Deduper {
    /// A deduper with empty scratch space.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fills `out` with the distinct ids of `ids` grouped by shard and the inverse index.
    /// Within a shard, ids keep their first-seen order (deterministic).
    pub fn run(&mut self, ids: &[u64], num_shards: usize, out: &mut UniqueIds) {
        let num_shards = num_shards.max(1);
        self.index.clear();
        self.index.reserve(ids.len() / 2);
        self.first_seen.clear();
        self.shard_of_first.clear();
        out.inverse.clear();
        out.inverse.reserve(ids.len());
        out.shard_offsets.clear();
        out.shard_offsets.resize(num_shards + 1, 0);
        // Pass 1 (the fused one): unique, inverse in first-seen numbering, shard counts.
        for &id in ids {
            let next = self.first_seen.len() as u32;
            let local = *self.index.entry(id).or_insert(next);
            if local == next {
                self.first_seen.push(id);
                let s = shard_of(id, num_shards);
                self.shard_of_first.push(s as u32);
                out.shard_offsets[s + 1] += 1;
            }
            out.inverse.push(local);
        }
        for s in 0..num_shards {
            out.shard_offsets[s + 1] += out.shard_offsets[s];
        }
        // Place distinct ids by shard (a counting sort over the distinct ids only).
        out.keys.clear();
        out.keys.resize(self.first_seen.len(), 0);
        self.position.clear();
        self.position.resize(self.first_seen.len(), 0);
        if num_shards == 1 {
            out.keys.copy_from_slice(&self.first_seen);
            return;
        }
        let mut cursor: Vec<usize> = out.shard_offsets[..num_shards].to_vec();
        for (local, (&id, &s)) in self.first_seen.iter().zip(&self.shard_of_first).enumerate() {
            let at = cursor[s as usize];
            cursor[s as usize] += 1;
            out.keys[at] = id;
            self.position[local] = at as u32;
        }
        for inv in &mut out.inverse {
            *inv = self.position[*inv as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pinned routing: checkpoints and running clusters place keys by these exact values.
    #[test]
    fn shard_of_is_pinned() {
        let keys = [0, 1, 42, 0xFF00_0000_0000_0001, (1 << 56) | 12345, u64::MAX];
        let of = |n| keys.map(|k| shard_of(k, n));
        assert_eq!(of(1), [0; 6]);
        assert_eq!(of(2), [1, 1, 1, 0, 0, 1]);
        assert_eq!(of(7), [6, 3, 5, 1, 0, 6]);
        assert_eq!(of(1000), [883, 566, 741, 179, 67, 893]);
    }

    #[test]
    fn groups_by_shard_and_inverts() {
        let ids = [5u64, 9, 5, 1 << 60, 9, 77, 5];
        let mut d = Deduper::new();
        let mut u = UniqueIds::default();
        d.run(&ids, 3, &mut u);
        assert_eq!(u.len(), 4);
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(u.keys[u.inverse[i] as usize], id);
        }
        for s in 0..3 {
            for &k in u.shard_keys(s) {
                assert_eq!(shard_of(k, 3), s);
            }
        }
    }

    #[test]
    fn shard_routing_is_stable() {
        // Pinned values: changing the routing hash would silently re-shard checkpoints.
        assert_eq!(shard_of(0, 1), 0);
        assert_eq!(shard_of(12345, 4), shard_of(12345, 4));
        let counts = (0..40_000u64).fold([0usize; 4], |mut c, k| {
            c[shard_of(k << 8, 4)] += 1;
            c
        });
        for c in counts {
            assert!(
                (9_000..11_000).contains(&c),
                "unbalanced routing {counts:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn dedup_matches_model(ids in proptest::collection::vec(0u64..50, 0..300), shards in 1usize..5) {
            let mut d = Deduper::new();
            let mut u = UniqueIds::default();
            d.run(&ids, shards, &mut u);
            let distinct: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
            prop_assert_eq!(u.len(), distinct.len());
            let got: std::collections::BTreeSet<u64> = u.keys.iter().copied().collect();
            prop_assert_eq!(got, distinct);
            prop_assert_eq!(u.inverse.len(), ids.len());
            for (i, &id) in ids.iter().enumerate() {
                prop_assert_eq!(u.keys[u.inverse[i] as usize], id);
            }
            prop_assert_eq!(*u.shard_offsets.last().unwrap(), u.len());
        }
    }
}
