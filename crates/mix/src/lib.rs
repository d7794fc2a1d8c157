//! SplitMix64 (Steele, Lea and Flood), written once for every crate that needs a stable,
//! platform-independent 64-bit mix: key -> shard routing, parameter initialisers, per-row
//! random streams and the synthetic data generator. Outputs are part of the product's contract
//! (saved checkpoints, generated data sets): never change a constant here.

/// The golden-ratio increment of the SplitMix64 state.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output finaliser (Stafford's "Mix13"): a full avalanche of all 64 bits.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Advances a SplitMix64 state and returns its next output.
#[inline]
pub fn splitmix64_next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(GOLDEN_GAMMA);
    mix64(*state)
}

/// Stateless SplitMix64 hash of `x`: the first output of a generator whose state is `x`.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GOLDEN_GAMMA))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference outputs of SplitMix64 seeded with 0 (as in Vigna's `splitmix64.c`).
    #[test]
    fn reference_stream_from_zero() {
        let mut s = 0;
        let got: Vec<u64> = (0..3).map(|_| splitmix64_next(&mut s)).collect();
        assert_eq!(
            got,
            [
                0xe220_a839_7b1d_cdaf,
                0x6e78_9e6a_a1b9_65f4,
                0x06c4_5d18_8009_454f
            ]
        );
        assert_eq!(s, GOLDEN_GAMMA.wrapping_mul(3));
    }

    #[test]
    fn stateless_hash_is_the_first_output() {
        for x in [0, 1, 42, u64::MAX] {
            let mut s = x;
            assert_eq!(splitmix64(x), splitmix64_next(&mut s));
        }
        assert_eq!(mix64(0), 0);
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
    }
}
