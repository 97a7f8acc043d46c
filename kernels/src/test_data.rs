//! Deterministic pseudo-random test data (SplitMix64), shared by the tests and the benchmark so
//! that inputs are never zeros and a failing case can be replayed from its seed.

use half::bf16;
use rand_core::{Rng, SeedableRng};

/// SplitMix64 (Steele, Lea, Flood 2014; `rand_xoshiro`'s implementation) with the helpers the
/// tests and the benchmark draw their data through.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    inner: rand_xoshiro::SplitMix64,
}

impl SplitMix64 {
    /// A generator seeded with `seed` (the state starts at `seed`).
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 {
            inner: rand_xoshiro::SplitMix64::seed_from_u64(seed),
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// A value in `0..n` (`n` at least 1; modulo bias is irrelevant for test data).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Fills `out` with random bytes.
    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill_bytes(&mut v);
        v
    }

    /// `count` distinct values from `0..limit`, in random order (partial Fisher-Yates).
    pub fn distinct_below(&mut self, limit: u64, count: usize) -> Vec<u64> {
        assert!(
            count as u64 <= limit,
            "cannot draw {count} distinct values below {limit}"
        );
        let mut all: Vec<u64> = (0..limit).collect();
        for i in 0..count {
            let j = i + self.below((all.len() - i) as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(count);
        all
    }

    /// A random f32 in `[-1, 1)`.
    pub fn unit_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `tokens` random keys of 128 bf16: each row's values uniform in `[-m, m)` with the row's
    /// magnitude `m = 2^e`, `e` drawn from `-12..=12`, so scales span many binades.
    pub fn keys(&mut self, tokens: usize) -> Vec<bf16> {
        let mut v = Vec::with_capacity(tokens * 128);
        for _ in 0..tokens {
            let e = self.below(25) as i32 - 12;
            let m = 2f32.powi(e);
            for _ in 0..128 {
                v.push(bf16::from_f32(self.unit_f32() * m));
            }
        }
        v
    }
}
