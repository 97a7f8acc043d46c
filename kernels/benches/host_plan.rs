//! The host's planning of one layer's load by the chooser (`Gpu::enqueue_transfer_runs` before
//! any driver call): the checks against both buffers ([`validate_runs`]), the runs put in host
//! order and merged ([`RunOrder::sorted_and_merged`]), the path chosen
//! ([`TransferPath::choose`]) and the split between the carve-out's kernel and the copy engines
//! ([`split_load`]). Figures and commands: BENCHMARKS.md, section "CPU", "Host planning of a
//! layer's load".
//!
//! Workload: one layer (layer 7 of 61) of a DeepSeek-V3.2 DSA load of 1,024 random pages out of
//! 4,096: per page one MLA run (64 x 656 = 41,984 B) and one index-K run (64 x 132 = 8,448 B),
//! 2,048 runs; host pool `page_first` (a page's 61 layers of both buffers, 3,073,024 B, one
//! after the other), device pool `layer_first`. The baseline, in the same run: sorting the
//! 2,048 host offsets alone as plain `u64`s (`sort_unstable`).
//!
//! Page size 1 ([`page_size_1`]): what the chooser's host path did and does with a token list
//! (BENCHMARKS.md, "GPU at page size 1"): a load's layer call copied as listed before the
//! change, checked for merges without a copy after; a gathered backup planned into fresh
//! vectors per chunk before, into one reused chunk after; baseline in the same run: a plain copy
//! of the list.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use kvlayout_kernels::copy_runs::scan_runs;
use kvlayout_kernels::device::options::{changed_by_merging, in_key_buckets_into};
use kvlayout_kernels::test_data::SplitMix64;
use kvlayout_kernels::{
    ByteRun, GatherChunk, RunOrder, TransferDirection, TransferPath, gather_chunks, host_stretches,
    kernel_share_permille, split_load, validate_runs,
};

const POOL_PAGES: u64 = 4096;
const LOADED_PAGES: usize = 1024;
const LAYERS: u64 = 61;
const LAYER: u64 = 7;
const MLA_PAGE_BYTES: u64 = 64 * 656;
const INDEX_K_PAGE_BYTES: u64 = 64 * 132;

/// The layer's 2,048 runs, listed page by page (MLA, then index-K), pages in random order.
fn layer_runs() -> Vec<ByteRun> {
    let mut rng = SplitMix64::new(7);
    let mut pages: Vec<u64> = (0..POOL_PAGES).collect();
    for i in (1..pages.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        pages.swap(i, j);
    }
    let page_pair_bytes = MLA_PAGE_BYTES + INDEX_K_PAGE_BYTES;
    let host_page_bytes = LAYERS * page_pair_bytes;
    let device_index_k_base_bytes = LAYERS * POOL_PAGES * MLA_PAGE_BYTES;
    let mut runs = Vec::with_capacity(2 * LOADED_PAGES);
    for &p in &pages[..LOADED_PAGES] {
        let host_offset_bytes = p * host_page_bytes + LAYER * page_pair_bytes;
        runs.push(ByteRun {
            src_offset_bytes: host_offset_bytes,
            dst_offset_bytes: (LAYER * POOL_PAGES + p) * MLA_PAGE_BYTES,
            len_bytes: MLA_PAGE_BYTES,
        });
        runs.push(ByteRun {
            src_offset_bytes: host_offset_bytes + MLA_PAGE_BYTES,
            dst_offset_bytes: device_index_k_base_bytes
                + (LAYER * POOL_PAGES + p) * INDEX_K_PAGE_BYTES,
            len_bytes: INDEX_K_PAGE_BYTES,
        });
    }
    runs
}

/// A backup of all 61 layers of the same 1,024 pages, listed buffer by buffer and layer by
/// layer (MLA runs of every layer, then index-K runs): 124,928 runs, which the chooser puts in
/// host order when the plan in list order does not pay (BENCHMARKS.md, "Session 7").
fn backup_runs_buffer_by_buffer() -> Vec<ByteRun> {
    let layer = layer_runs();
    let page_pair_bytes = MLA_PAGE_BYTES + INDEX_K_PAGE_BYTES;
    let mut runs = Vec::with_capacity(layer.len() * LAYERS as usize);
    for buffer in 0..2 {
        for l in 0..LAYERS {
            for r in layer.iter().skip(buffer).step_by(2) {
                // The layer's run moved from layer LAYER to layer l on both sides; a backup
                // goes device -> host.
                let host_offset_bytes =
                    r.src_offset_bytes - LAYER * page_pair_bytes + l * page_pair_bytes;
                let device_offset_bytes = if buffer == 0 {
                    r.dst_offset_bytes - LAYER * POOL_PAGES * MLA_PAGE_BYTES
                        + l * POOL_PAGES * MLA_PAGE_BYTES
                } else {
                    r.dst_offset_bytes - LAYER * POOL_PAGES * INDEX_K_PAGE_BYTES
                        + l * POOL_PAGES * INDEX_K_PAGE_BYTES
                };
                runs.push(ByteRun {
                    src_offset_bytes: device_offset_bytes,
                    dst_offset_bytes: host_offset_bytes,
                    len_bytes: r.len_bytes,
                });
            }
        }
    }
    runs
}

/// The baseline: the keys alone, as plain `u64`s, sorted (`sort_unstable`).
fn sorted_keys(keys: &[u64]) -> Vec<u64> {
    let mut k = keys.to_vec();
    k.sort_unstable();
    k
}

fn host_plan(c: &mut Criterion) {
    let runs = layer_runs();
    let pool_bytes = POOL_PAGES * LAYERS * (MLA_PAGE_BYTES + INDEX_K_PAGE_BYTES);
    let keys: Vec<u64> = runs.iter().map(|r| r.src_offset_bytes).collect();
    let merged = RunOrder::SrcAscending.sorted_and_merged(&runs);
    assert_eq!(merged.len(), runs.len(), "random pages: nothing merges");
    let mut g = c.benchmark_group("one layer's load, 2,048 runs");
    g.bench_function("baseline: sort 2,048 u64 keys", |b| {
        b.iter(|| sorted_keys(black_box(&keys)))
    });
    g.bench_function("validate_runs", |b| {
        b.iter(|| validate_runs(black_box(&runs), pool_bytes, pool_bytes))
    });
    g.bench_function("sorted_and_merged (host order)", |b| {
        b.iter(|| RunOrder::SrcAscending.sorted_and_merged(black_box(&runs)))
    });
    g.bench_function("choose", |b| {
        b.iter(|| TransferPath::choose(black_box(&merged), TransferDirection::Load, Some(2)))
    });
    g.bench_function("split_load (2 SMs)", |b| {
        b.iter(|| split_load(black_box(&merged), kernel_share_permille(2)))
    });
    g.finish();

    let backup = backup_runs_buffer_by_buffer();
    let backup_keys: Vec<u64> = backup.iter().map(|r| r.dst_offset_bytes).collect();
    // In host order a page's 61 layers of both buffers continue each other on the host but
    // not on the device (`layer_first`): nothing merges.
    assert_eq!(
        RunOrder::DstAscending.sorted_and_merged(&backup).len(),
        backup.len()
    );
    let mut g = c.benchmark_group("a backup laid buffer by buffer, 124,928 runs");
    g.sample_size(20);
    g.bench_function("baseline: sort 124,928 u64 keys", |b| {
        b.iter(|| sorted_keys(black_box(&backup_keys)))
    });
    g.bench_function("sorted_and_merged (host order)", |b| {
        b.iter(|| RunOrder::DstAscending.sorted_and_merged(black_box(&backup)))
    });
    g.finish();
}

/// Page size 1 (BENCHMARKS.md, "GPU at page size 1"): Llama-3.1-8B pools of 32,768 one-token
/// pages, K and V buffers of 32 layers, 2,048 B per token, layer and buffer; 16,384 random host
/// slots paired with random device slots. Host `page_first` (per buffer, a slot's 32 layers one
/// after the other: 64 KiB), device `layer_first`. A load's layer call lists each token's K
/// then V run (32,768 runs); the backup lists each token's K layers, then its V layers
/// (1,048,576 runs, 32,768 host stretches of 64 KiB).
const PAGE1_SLOTS: u64 = 32 * 1024;
const PAGE1_TOKENS: usize = 16 * 1024;
const PAGE1_LAYERS: u64 = 32;
const PAGE1_RUN_BYTES: u64 = 2048;

fn page1_runs(load_layer: Option<u64>) -> Vec<ByteRun> {
    let mut rng = SplitMix64::new(25);
    let host_slots = rng.distinct_below(PAGE1_SLOTS, PAGE1_TOKENS);
    let dev_slots = rng.distinct_below(PAGE1_SLOTS, PAGE1_TOKENS);
    let buffer_bytes = PAGE1_SLOTS * PAGE1_LAYERS * PAGE1_RUN_BYTES;
    let host = |b: u64, l: u64, h: u64| b * buffer_bytes + (h * PAGE1_LAYERS + l) * PAGE1_RUN_BYTES;
    let dev = |b: u64, l: u64, d: u64| b * buffer_bytes + (l * PAGE1_SLOTS + d) * PAGE1_RUN_BYTES;
    let mut runs = Vec::new();
    for (&h, &d) in host_slots.iter().zip(&dev_slots) {
        for b in 0..2 {
            match load_layer {
                Some(l) => runs.push(ByteRun::new(host(b, l, h), dev(b, l, d), PAGE1_RUN_BYTES)),
                None => runs.extend(
                    (0..PAGE1_LAYERS)
                        .map(|l| ByteRun::new(dev(b, l, d), host(b, l, h), PAGE1_RUN_BYTES)),
                ),
            }
        }
    }
    runs
}

fn page_size_1(c: &mut Criterion) {
    let layer = page1_runs(Some(7));
    assert!(!changed_by_merging(&layer), "random slots: nothing merges");
    let mut g = c.benchmark_group("page size 1, one layer's load, 32,768 runs");
    g.bench_function("baseline: copy the list (Vec clone)", |b| {
        b.iter(|| black_box(&layer).to_vec())
    });
    g.bench_function("before: merged as listed (a copy)", |b| {
        b.iter(|| RunOrder::AsGiven.sorted_and_merged(black_box(&layer)))
    });
    g.bench_function("after: changed_by_merging (no copy)", |b| {
        b.iter(|| changed_by_merging(black_box(&layer)))
    });
    g.finish();

    let backup = page1_runs(None);
    let stretches = host_stretches(&backup).expect("no overlap");
    assert_eq!(stretches.stretches, 32 * 1024);
    let (slot_bytes, slots, first_bytes) = (64 << 20, 4, 8 << 20);
    let mut g = c.benchmark_group("page size 1, gathered backup plan, 1,048,576 runs");
    g.sample_size(10);
    g.bench_function("baseline: copy the list (Vec clone)", |b| {
        b.iter(|| black_box(&backup).to_vec())
    });
    g.bench_function("host_stretches", |b| {
        b.iter(|| host_stretches(black_box(&backup)))
    });
    g.bench_function("before: gather_chunks, fresh vectors per chunk", |b| {
        b.iter(|| {
            gather_chunks(black_box(&backup), slot_bytes, slots, first_bytes)
                .map(|c| c.gather.len())
                .sum::<usize>()
        })
    });
    let mut chunk = GatherChunk::default();
    g.bench_function("after: next_into one reused chunk", |b| {
        b.iter(|| {
            let mut planner = gather_chunks(black_box(&backup), slot_bytes, slots, first_bytes);
            let mut pieces = 0;
            while planner.next_into(&mut chunk) {
                pieces += chunk.gather.len();
            }
            pieces
        })
    });
    g.finish();
}

/// The chooser's checks of a token list before its path is chosen: before, one pass per
/// question (the bounds, merging in list order, the mean length twice, the uniform length);
/// after, [`scan_runs`] answering all of them in one pass. Both lists of [`page1_runs`].
fn chooser_checks(c: &mut Criterion) {
    let lists = [
        ("one layer's load, 32,768 runs", page1_runs(Some(7))),
        ("backup of all layers, 1,048,576 runs", page1_runs(None)),
    ];
    let bytes = PAGE1_SLOTS * PAGE1_LAYERS * PAGE1_RUN_BYTES * 2;
    for (name, runs) in &lists {
        let mut g = c.benchmark_group(format!("page size 1, the chooser's checks, {name}"));
        g.sample_size(10);
        g.bench_function("before: a pass per question", |b| {
            b.iter(|| {
                let runs = black_box(&runs[..]);
                validate_runs(runs, bytes, bytes).expect("inside");
                let changed = changed_by_merging(runs);
                let long = TransferPath::mean_is_long(runs) || TransferPath::mean_is_long(runs);
                let len = runs[0].len_bytes;
                let uniform = runs.iter().all(|r| {
                    r.len_bytes == len
                        && r.src_offset_bytes.is_multiple_of(16)
                        && r.dst_offset_bytes.is_multiple_of(16)
                });
                (changed, long, uniform)
            })
        });
        g.bench_function("after: scan_runs, one pass", |b| {
            b.iter(|| scan_runs(black_box(&runs[..]), bytes, bytes).expect("inside"))
        });
        // Host order: the chooser's bucketed order against a comparison sort of a copy.
        let key = if name.starts_with("one layer") {
            |r: &ByteRun| r.src_offset_bytes
        } else {
            |r: &ByteRun| r.dst_offset_bytes
        };
        let (mut out, mut starts) = (Vec::new(), Vec::new());
        g.bench_function("host order: in_key_buckets_into, buffers reused", |b| {
            b.iter(|| {
                in_key_buckets_into(black_box(&runs[..]), (key, bytes), &mut out, &mut starts)
            })
        });
        g.bench_function("host order baseline: copy + sort_unstable_by_key", |b| {
            b.iter(|| {
                let mut v = black_box(&runs[..]).to_vec();
                v.sort_unstable_by_key(key);
                v
            })
        });
        g.finish();
    }
}

criterion_group!(benches, host_plan, page_size_1, chooser_checks);
criterion_main!(benches);
