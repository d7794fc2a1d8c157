//! Feature ids: 64-bit keys of the embedding tables.
//!
//! An id carries its field in the top 8 bits and a 56-bit xxh3 hash of the raw value
//! bytes in the low bits. The hash uses a fixed seed and xxh3 is a specified algorithm,
//! so ids are stable across processes, machines and crate versions. Low-56 value 0 is
//! reserved for the field's missing id.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the value hash. Changing it changes every id (and invalidates trained tables).
pub const ID_SEED: u64 = 0x5350_4152_5441_4944; // "SPARTAID"

/// Mask of the hash part of an id.
pub const HASH_MASK: u64 = (1 << 56) - 1;

/// Id of `value` in field `field`.
#[inline]
pub fn feature_id(field: u8, value: &[u8]) -> u64 {
    id_of_hash(field, value_hash(value))
}

/// The hash part of the id of `value` (in any field): `1..2^56`.
#[inline]
pub fn value_hash(value: &[u8]) -> u64 {
    let h = xxh3_64_with_seed(value, ID_SEED) & HASH_MASK;
    // 0 is reserved for the missing id; remap the (1 in 2^56) collision to 1.
    if h == 0 {
        1
    } else {
        h
    }
}

/// Id in field `field` of the value whose [`value_hash`] is `hash`.
#[inline]
pub fn id_of_hash(field: u8, hash: u64) -> u64 {
    ((field as u64) << 56) | hash
}

/// Id of a missing (empty) value in field `field`.
#[inline]
pub fn missing_id(field: u8) -> u64 {
    (field as u64) << 56
}

/// Field an id belongs to.
#[inline]
pub fn field_of(id: u64) -> u8 {
    (id >> 56) as u8
}

/// True if `id` is a missing id.
#[inline]
pub fn is_missing(id: u64) -> bool {
    id & HASH_MASK == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_encoding() {
        for f in [0u8, 1, 25, 254, 255] {
            let id = feature_id(f, b"68fd1e64");
            assert_eq!(field_of(id), f);
            assert!(!is_missing(id));
            assert_eq!(field_of(missing_id(f)), f);
            assert!(is_missing(missing_id(f)));
            assert_eq!(missing_id(f), (f as u64) << 56);
            // same value in two fields gives two ids with the same hash part
            assert_eq!(id & HASH_MASK, feature_id(0, b"68fd1e64") & HASH_MASK);
        }
        assert_ne!(feature_id(3, b"a"), feature_id(3, b"b"));
        assert_ne!(feature_id(3, b"a"), feature_id(4, b"a"));
        assert_ne!(feature_id(3, b""), missing_id(3));
    }

    /// Pinned values: if this fails the hash changed and every trained table is invalid.
    #[test]
    fn ids_are_stable() {
        let pinned: [(u8, &[u8], u64); 4] = [
            (0u8, &b"68fd1e64"[..], PIN[0]),
            (1, b"80e26c9b", PIN[1]),
            (25, b"9727dd16", PIN[2]),
            (7, b"", PIN[3]),
        ];
        for (f, v, want) in pinned {
            assert_eq!(feature_id(f, v), want, "field {f} value {v:?}");
        }
    }

    const PIN: [u64; 4] = [
        0x0097_b74a_91d2_1859,
        0x01d1_2c9d_2d80_2ca7,
        0x1945_75b6_1fcf_0a3a,
        0x0779_b8fb_d077_c3cc,
    ];
}
