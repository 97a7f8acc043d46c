//! Deterministic values from keys: SplitMix64 (Steele, Lea, Flood 2014; the same generator as
//! the kernels' test data, written here so the replay needs no CUDA crate) used as a stateless
//! hash: `mix(z)` is the first output of a generator seeded with `z`.

/// SplitMix64: a 64-bit state, one multiply-xorshift output per step.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The first SplitMix64 output for seed `z`: a 64-bit mix of `z`.
pub fn mix(z: u64) -> u64 {
    SplitMix64::new(z).next_u64()
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
