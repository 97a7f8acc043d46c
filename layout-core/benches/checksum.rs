//! The page checksum (`kvlayout.checksum/v1`) against `memcpy` of the same bytes on one core,
//! and against the peers' checksums measured in the same run: Adler-32 (`adler2`; SGLang's
//! prefill/decode checksum), CRC-64 (`crc64fast`, ECMA-182 with carry-less multiply; Mooncake
//! Store) and xxh3-64 (`xxhash-rust`; LMCache). Figures and command: BENCHMARKS.md, section
//! "Page checksum".
//!
//! Groups, each over the same bytes (pseudo-random, so no function sees a special input):
//! - `one page, hot`: one 64-token page of the DeepSeek-V3.2 latent (`DSA_MLA_FP8`: 656 B/token,
//!   64 x 656 = 41,984 B), the same page every iteration (cache-resident: the hardest case for
//!   the ratio to `memcpy`);
//! - `256 pages, cycling`: 256 such pages (10,747,904 B, past L2) checksummed one page at a
//!   time, against one `memcpy` of the same 256 pages into a second buffer.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvlayout_core::checksum::page_checksum;

const PAGE_BYTES: usize = 64 * 656;

fn bytes(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn peers(c: &mut Criterion, group: &str, pages: usize) {
    let src = bytes(PAGE_BYTES * pages);
    let mut dst = vec![0u8; src.len()];
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(src.len() as u64));
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    g.bench_function("kvlayout checksum", |b| {
        b.iter(|| {
            let mut x = 0u64;
            for (i, page) in black_box(&src).chunks(PAGE_BYTES).enumerate() {
                x ^= page_checksum(0x1234, i as u64, page);
            }
            black_box(x)
        })
    });
    g.bench_function("adler-32", |b| {
        b.iter(|| {
            let mut x = 0u32;
            for page in black_box(&src).chunks(PAGE_BYTES) {
                let mut a = adler2::Adler32::new();
                a.write_slice(page);
                x ^= a.checksum();
            }
            black_box(x)
        })
    });
    g.bench_function("crc-64", |b| {
        b.iter(|| {
            let mut x = 0u64;
            for page in black_box(&src).chunks(PAGE_BYTES) {
                let mut d = crc64fast::Digest::new();
                d.write(page);
                x ^= d.sum64();
            }
            black_box(x)
        })
    });
    g.bench_function("xxh3-64", |b| {
        b.iter(|| {
            let mut x = 0u64;
            for page in black_box(&src).chunks(PAGE_BYTES) {
                x ^= xxhash_rust::xxh3::xxh3_64(page);
            }
            black_box(x)
        })
    });
    g.finish();
}

fn checksum(c: &mut Criterion) {
    peers(c, "one page, hot", 1);
    peers(c, "256 pages, cycling", 256);
}

criterion_group!(benches, checksum);
criterion_main!(benches);
