//! Transfer planning ([`kvlayout_core::plan`]) on the DeepSeek-V3.2 pair of issue 24: a
//! tensor-parallel 1 prefill pool to a TP 2 decode pool (MLA latent `DSA_MLA_FP8`, 656 B/token,
//! and index-K `INDEX_K_FP8`, 132 B/token, both replicated; 61 layers; 64-token pages;
//! `layer_first`, 4,096 pages), 64 pages at scattered positions.
//!
//! In the same run:
//! - `page_plan TP1 -> TP1` (the baseline): whole pages between two TP 1 pools;
//! - `token_plan TP1 -> TP2`: the token plan between the TP 1 and TP 2 pools (61 runs per page
//!   and buffer: 64 x 61 x 2 = 7,808 runs);
//! - `token_plan TP1 -> TP2, 64 consecutive pages`: the same, pages 0..64 into 64..128 (61
//!   runs per buffer).
//!
//! Run: `cargo bench -p kvlayout-core --bench plan`. Issue 24's bound: 64 pages planned in
//! under 1 ms (the Python planner took 5-9 s).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use kvlayout_core::formats::{DSA_MLA_FP8, INDEX_K_FP8};
use kvlayout_core::plan::{page_plan, token_plan};
use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, Shard};

const PAGES: u64 = 4096;

fn dsv32(tp: u64, rank: u64) -> PoolGeometry {
    let shard = Shard::replicated(tp, rank);
    PoolGeometry {
        name: format!("DeepSeek-V3.2 TP {tp} rank {rank}"),
        page_size_tokens: 64,
        pages: PAGES,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![
            BufferGeometry::new("kv", 61, DSA_MLA_FP8).with_shard(shard),
            BufferGeometry::new("index_k", 61, INDEX_K_FP8).with_shard(shard),
        ],
    }
}

/// 64 distinct pages, spread over the pool (a multiplicative walk, no two consecutive).
fn scattered(seed: u64) -> Vec<u64> {
    (0..64).map(|i| (seed + i * 997) % PAGES).collect()
}

fn bench(c: &mut Criterion) {
    let (tp1, tp2) = (dsv32(1, 0), dsv32(2, 1));
    let (src, dst) = (scattered(5), scattered(11));
    let plan = token_plan(&tp1, &tp2, &src, &dst).expect("plan");
    assert_eq!(plan.run_count(), 64 * 61 * 2);
    let mut g = c.benchmark_group("64 pages, DeepSeek-V3.2");
    g.bench_function("page_plan TP1 -> TP1 (baseline)", |b| {
        b.iter(|| page_plan(black_box(&tp1), black_box(&tp1), &src, &dst).expect("plan"))
    });
    g.bench_function("token_plan TP1 -> TP2", |b| {
        b.iter(|| token_plan(black_box(&tp1), black_box(&tp2), &src, &dst).expect("plan"))
    });
    let (first, next): (Vec<u64>, Vec<u64>) = ((0..64).collect(), (64..128).collect());
    g.bench_function("token_plan TP1 -> TP2, 64 consecutive pages", |b| {
        b.iter(|| token_plan(black_box(&tp1), black_box(&tp2), &first, &next).expect("plan"))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
