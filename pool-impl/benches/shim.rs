//! The shim's cost against the transfer it guards (the checks listed in `kvlayout_pool::shim`).
//! Figures and commands: BENCHMARKS.md, section "CPU".
//!
//! Groups `one page, one layer: ...`: a backup of one page of one layer (layer 2 of 4) of
//! - index-K fp8 (`INDEX_K_FP8`: 128 B e4m3 + 4 B f32 scale = 132 B/token; 64 x 132 = 8,448 B),
//! - the DeepSeek-V3.2 latent (`DSA_MLA_FP8`: 656 B/token; 64 x 656 = 41,984 B),
//!
//! from a `layer_first` device pool to a `page_first` host mirror, one run. In each group, in
//! the same run:
//! - `memcpy`: `copy_from_slice` of the same bytes between two plain buffers of the pools'
//!   sizes, at the run's offsets (the baseline);
//! - `backend copy`: [`CpuBackend::device_to_host`] of the same run on the same buffers;
//! - `check`: [`HiCache::check`], the per-transfer checks on the request alone;
//! - `dry run`: [`HiCache::dry_run`], checks + runs laid from the routes + their ranges;
//! - `transfer`: [`HiCache::backup_layer`], the whole checked transfer on the pools;
//!
//! each "hot" (the same page every iteration: the copy is cache-resident, the hardest case
//! for the ratio) and, for `memcpy` and `transfer`, "cycling" through every page of the pools
//! (16.9 MB and 21.5 MB per pool: past L2). Build with and without the opt-out feature
//! `unchecked` to measure what the identity and range checks add.
//!
//! Group `32 pages x 4 layers`: the inspection path (the full checked plan) vs the legacy
//! plan, and a whole backup of a DeepSeek-V3.2 pool (32 x 4 x (41,984 + 16,384) = 7,471,104 B).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, TokenLayout, formats};
use kvlayout_pool::{
    Backend, CopyRun, CpuBackend, CpuMem, DevicePool, Direction, HiCache, HostPool, KvPool, Layers,
    PagePair,
};

const LAYERS: u64 = 4;
const LAYER: u64 = 2;

fn one_buffer_cache(name: &'static str, layout: TokenLayout, pages: u64) -> HiCache {
    let device = DevicePool::new(PoolGeometry {
        name: "bench".into(),
        page_size_tokens: 64,
        pages,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![BufferGeometry::new(name, LAYERS, layout)],
    })
    .expect("device pool");
    let host = HostPool::mirror_of(&device, pages, MemoryLayout::PageFirst).expect("host pool");
    HiCache::pair(device, host).expect("mirror pairs")
}

fn the_run(cache: &HiCache, pair: PagePair) -> CopyRun {
    let plan = cache
        .plan(Direction::Backup, Layers::One(LAYER), &[pair])
        .expect("plan");
    let runs = plan.flat_runs();
    assert_eq!(runs.len(), 1);
    runs[0]
}

fn one_page(c: &mut Criterion, label: &str, name: &'static str, layout: TokenLayout, pages: u64) {
    let mut cache = one_buffer_cache(name, layout, pages);
    let page_bytes = cache
        .device()
        .geometry()
        .stored_page_bytes(0)
        .expect("page");
    // Write every byte of the device pool (a calloc'd pool never written reads the shared
    // zero page, which is always cached) and touch every host page: one backup of every page,
    // every layer.
    let fill: Vec<u8> = (0..cache.device().memory().len())
        .map(|i| (i % 251) as u8 + 1)
        .collect();
    cache.device_writer().write_bytes(0, &fill).expect("fill");
    let all: Vec<PagePair> = (0..pages).map(|p| PagePair::new(p, p)).collect();
    cache.backup(&all).expect("warm backup");
    let hot = PagePair::new(3, 5);
    let cycle: Vec<PagePair> = (0..pages)
        .map(|i| PagePair::new(i, (i * 7 + 1) % pages))
        .collect();
    let cycle_runs: Vec<CopyRun> = cycle.iter().map(|&p| the_run(&cache, p)).collect();
    let run = the_run(&cache, hot);
    assert_eq!(run.len_bytes, page_bytes);

    let src_bytes: Vec<u8> = (0..cache.device().memory().len())
        .map(|i| i as u8)
        .collect();
    // Regions as the backend allocates them (page-aligned), so memcpy and the backend copy
    // move the same aligned bytes.
    let src = CpuMem::from(&src_bytes[..]);
    let mut dst = CpuMem::from(&vec![1u8; cache.host().memory().len()][..]);

    let mut g = c.benchmark_group(format!("one page, one layer: {label}"));
    g.throughput(Throughput::Bytes(page_bytes));
    g.bench_function("memcpy (hot)", |b| {
        b.iter(|| {
            let r = black_box(run);
            let (s, d, n) = (
                r.src_offset_bytes as usize,
                r.dst_offset_bytes as usize,
                r.len_bytes as usize,
            );
            dst[d..d + n].copy_from_slice(&src[s..s + n]);
        })
    });
    g.bench_function("backend copy (hot)", |b| {
        b.iter(|| {
            CpuBackend
                .device_to_host(&src, &mut dst, black_box(std::slice::from_ref(&run)))
                .expect("copy")
        })
    });
    g.bench_function("check (hot)", |b| {
        b.iter(|| {
            cache
                .check(Direction::Backup, Layers::One(LAYER), black_box(&[hot]))
                .expect("check")
        })
    });
    g.bench_function("dry run (hot)", |b| {
        b.iter(|| {
            cache
                .dry_run(Direction::Backup, Layers::One(LAYER), black_box(&[hot]))
                .expect("dry run")
        })
    });
    g.bench_function("transfer (hot)", |b| {
        b.iter(|| {
            cache
                .backup_layer(LAYER, black_box(&[hot]))
                .expect("backup")
        })
    });
    let mut i = 0usize;
    g.bench_function("memcpy (cycling)", |b| {
        b.iter(|| {
            let r = cycle_runs[i];
            i = (i + 1) % cycle_runs.len();
            let (s, d, n) = (
                r.src_offset_bytes as usize,
                r.dst_offset_bytes as usize,
                r.len_bytes as usize,
            );
            dst[d..d + n].copy_from_slice(&src[s..s + n]);
        })
    });
    let mut i = 0usize;
    g.bench_function("transfer (cycling)", |b| {
        b.iter(|| {
            let p = cycle[i];
            i = (i + 1) % cycle.len();
            cache.backup_layer(LAYER, &[p]).expect("backup")
        })
    });
    g.finish();
}

fn one_page_of_one_layer(c: &mut Criterion) {
    // 4 layers x 512 pages x 8,448 B = 17,301,504 B per pool.
    one_page(
        c,
        "index-K fp8 (8448 B)",
        "index_k",
        formats::INDEX_K_FP8,
        512,
    );
    // 4 layers x 128 pages x 41,984 B = 21,495,808 B per pool.
    one_page(
        c,
        "DSA latent fp8 (41984 B)",
        "kv",
        formats::DSA_MLA_FP8,
        128,
    );
}

fn dsa_cache(checked: bool) -> HiCache {
    let device = DevicePool::new(PoolGeometry {
        name: "bench".into(),
        page_size_tokens: 64,
        pages: 128,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![
            BufferGeometry::new("kv", 4, formats::DSA_MLA_FP8),
            BufferGeometry::new("index_k", 4, formats::INDEX_K_BF16),
        ],
    })
    .expect("device pool");
    let host = HostPool::mirror_of(&device, 256, MemoryLayout::PageFirst).expect("host pool");
    if checked {
        HiCache::pair(device, host).expect("mirror pairs")
    } else {
        HiCache::pair_unverified(device, host)
    }
}

fn many_pages(c: &mut Criterion) {
    let pairs: Vec<PagePair> = (0..32).map(|p| PagePair::new(p * 3, 200 - p)).collect();
    let mut checked = dsa_cache(true);
    let legacy = dsa_cache(false);
    let mut g = c.benchmark_group("32 pages x 4 layers");
    g.bench_function("checked plan (inspection path)", |b| {
        b.iter(|| {
            checked
                .plan(Direction::Backup, Layers::All, &pairs)
                .expect("plan")
        })
    });
    g.bench_function("legacy plan", |b| {
        b.iter(|| {
            legacy
                .plan(Direction::Backup, Layers::All, &pairs)
                .expect("plan")
        })
    });
    g.throughput(Throughput::Bytes(7_471_104));
    g.bench_function("checked backup (7.5 MB)", |b| {
        b.iter(|| checked.backup(&pairs).expect("backup"))
    });
    g.finish();
}

criterion_group!(benches, one_page_of_one_layer, many_pages);
criterion_main!(benches);
