//! Deterministic values from keys: SplitMix64 (Steele, Lea, Flood 2014; `rand_xoshiro`'s
//! implementation, the generator of the kernels' test data too) used as a stateless hash:
//! `mix(z)` is the first output of a generator seeded with `z`.

use rand_core::{Rng, SeedableRng};
use rand_xoshiro::SplitMix64;

/// The first SplitMix64 output for seed `z`: a 64-bit mix of `z`.
pub fn mix(z: u64) -> u64 {
    SplitMix64::seed_from_u64(z).next_u64()
}

/// The top 24 bits of `h` as an f32 in `[-1, 1)` (the same map as the kernels' test data
/// `SplitMix64::unit_f32`).
pub fn unit(h: u64) -> f32 {
    ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_is_splitmix64_of_the_seed() {
        // SplitMix64 from seed 0: state 0x9e3779b97f4a7c15, first output 0xe220a8397b1dcdaf
        // (the reference value of Vigna's splitmix64.c for seed 0).
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn unit_spans_minus_one_to_one() {
        assert_eq!(unit(0), -1.0);
        // All 24 bits set: (2^24 - 1) / 2^24 * 2 - 1 = 1 - 2^-23.
        assert_eq!(unit(u64::MAX), 1.0 - 2f32.powi(-23));
    }
}
