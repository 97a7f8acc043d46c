//! GPU tests: the kernels against their CPU references on a real device. Ignored by default (CI
//! has no GPU); run on the device machine with `--ignored --test-threads 1`.
//!
//! Every test poisons its outputs with random bytes first, draws random inputs (never zeros),
//! compares whole buffers (so a stray write anywhere fails), and checks that out-of-range
//! indices are refused with both sides unchanged.

use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};
use kvlayout_kernels::test_data::SplitMix64;
use kvlayout_kernels::{
    ByteRun, CopyEngineHint, CopyEngineOptions, DeviceBytes, Gpu, GpuBytes, KernelError,
    LaunchShape, PinnedBytes, RunOrder, TransferPath, group_pitched,
};

/// The SMs the token kernel takes without a carve-out (`SM_BUDGET`, device/options.rs).
const SM_BUDGET: u32 = 8;
/// The blocks the token kernel takes for a token backup (`TOKEN_BACKUP_BLOCKS`,
/// device/options.rs).
const TOKEN_BACKUP_BLOCKS: u32 = 8;
/// Most streams of a copy-engine transfer (`MAX_COPY_ENGINE_LANES`, device/options.rs).
const MAX_COPY_ENGINE_LANES: usize = 8;
/// Fewest lines of a 2D copy (`MIN_PITCHED_LINES`, device/options.rs).
const MIN_PITCHED_LINES: u64 = 8;
/// Fewest runs that use a carve-out (`CARVEOUT_MIN_RUNS`, device/options.rs).
const CARVEOUT_MIN_RUNS: u64 = 64;
/// The run ring: 8 slots of 32,768 runs (device/run_ring.rs).
const RUN_RING_SLOTS: usize = 8;
const RUN_RING_SLOT_RUNS: usize = 32 * 1024;
/// Bytes of a gathered backup's staging slot, 64 MiB (device/gathered.rs).
const GATHER_SLOT_BYTES: u64 = 64 << 20;
/// Short runs of a split load: at most 16,384 B (split_load.rs).
const SPLIT_SHORT_RUN_BYTES: u64 = 16_384;
use kvlayout_pool::backend::copy_runs;
use kvlayout_pool::{CopyRun, Direction};

const LAYERS: u64 = 3;
const HOST_PAGES: u64 = 24;
const DEVICE_PAGES: u64 = 16;

/// DeepSeek-V3.2's pool at page size 64: `kv` (656 B/token, token_major) and `index_k` (fp8,
/// 132 B/token, section_major), three layers.
fn pool(memory_layout: MemoryLayout, pages: u64) -> PoolGeometry {
    pool_of(memory_layout, pages, LAYERS)
}

/// [`pool`] with `layers` layers.
fn pool_of(memory_layout: MemoryLayout, pages: u64, layers: u64) -> PoolGeometry {
    PoolGeometry {
        name: format!("test {memory_layout}"),
        page_size_tokens: 64,
        pages,
        memory_layout,
        buffers: vec![
            BufferGeometry::new("kv", layers, formats::DSA_MLA_FP8),
            BufferGeometry::new("index_k", layers, formats::INDEX_K_FP8),
        ],
    }
}

fn gpu() -> Gpu {
    Gpu::new(0).expect("a GPU (these tests run with --ignored on the device machine)")
}

enum Buf {
    Dev(DeviceBytes),
    Pin(PinnedBytes),
}

impl Buf {
    fn new(gpu: &Gpu, pinned: bool, bytes: &[u8]) -> Buf {
        if pinned {
            let mut p = gpu.alloc_pinned(bytes.len()).unwrap();
            p.as_mut_slice().copy_from_slice(bytes);
            Buf::Pin(p)
        } else {
            Buf::Dev(gpu.upload(bytes).unwrap())
        }
    }
    fn read(&self, gpu: &Gpu) -> Vec<u8> {
        match self {
            Buf::Dev(d) => gpu.read(d).unwrap(),
            Buf::Pin(p) => p.as_slice().to_vec(),
        }
    }
    fn bytes(&self) -> &dyn GpuBytes {
        match self {
            Buf::Dev(d) => d,
            Buf::Pin(p) => p,
        }
    }
    fn bytes_mut(&mut self) -> &mut dyn GpuBytes {
        match self {
            Buf::Dev(d) => d,
            Buf::Pin(p) => p,
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_reports_arch_and_compiles() {
    let gpu = gpu();
    gpu.compile().unwrap();
    println!(
        "device: {} SMs, {} ({})",
        gpu.sm_count(),
        gpu.arch(),
        gpu.context().name().unwrap()
    );
    assert!(gpu.sm_count() > 0);
}

/// Runs as the pool shim plans them (one per page of one layer of one buffer, offsets from
/// `PoolGeometry::page_offset_bytes`), plus unaligned runs that force 8-, 4- and 1-byte accesses;
/// both directions; a run past the end refused with both sides unchanged; and a list longer than
/// the 4,096 runs a copy launch checks itself (validation launch).
#[test]
#[ignore = "needs a CUDA GPU"]
fn run_lists_match_cpu_reference() {
    let gpu = gpu();
    let host = pool(MemoryLayout::PageFirst, HOST_PAGES);
    let device = pool(MemoryLayout::LayerFirst, DEVICE_PAGES);
    let mut rng = SplitMix64::new(500);
    for h2d in [true, false] {
        let (src_pool, dst_pool) = if h2d {
            (&host, &device)
        } else {
            (&device, &host)
        };
        let src_pages = rng.distinct_below(src_pool.pages, 9);
        let dst_pages = rng.distinct_below(dst_pool.pages, 9);
        let mut runs = Vec::new();
        for b in 0..2usize {
            let len = src_pool.stored_page_bytes(b).unwrap();
            for layer in 0..LAYERS {
                for (&sp, &dp) in src_pages.iter().zip(&dst_pages) {
                    runs.push(ByteRun::new(
                        src_pool.page_offset_bytes(b, layer, sp).unwrap(),
                        dst_pool.page_offset_bytes(b, layer, dp).unwrap(),
                        len,
                    ));
                }
            }
        }
        // Unaligned runs (8-, 4-, 1-byte paths, and a zero-length run) into layer 0 of a kv
        // page no page run writes (destination ranges must not overlap).
        let free = (0..dst_pool.pages)
            .find(|p| !dst_pages.contains(p))
            .unwrap();
        let base = dst_pool.page_offset_bytes(0, 0, free).unwrap();
        runs.push(ByteRun::new(8, base + 24, 1000));
        runs.push(ByteRun::new(4, base + 2004, 12));
        runs.push(ByteRun::new(3, base + 3001, 333));
        runs.push(ByteRun::new(77, base + 5000, 0));
        let src_bytes = rng.bytes(src_pool.total_bytes().unwrap() as usize);
        let poison = rng.bytes(dst_pool.total_bytes().unwrap() as usize);
        let src = Buf::new(&gpu, h2d, &src_bytes);
        let mut dst = Buf::new(&gpu, !h2d, &poison);
        let expect = cpu_reference(&src_bytes, &poison, &runs);
        for order in [
            RunOrder::DstAscending,
            RunOrder::SrcAscending,
            RunOrder::AsGiven,
        ] {
            dst = Buf::new(&gpu, !h2d, &poison);
            let gruns = gpu.upload_runs(&runs, order).unwrap();
            gpu.copy_runs(src.bytes(), dst.bytes_mut(), &gruns, LaunchShape::default())
                .unwrap();
            let got = dst.read(&gpu);
            let first_diff = got.iter().zip(&expect).position(|(a, b)| a != b);
            assert!(
                first_diff.is_none(),
                "h2d={h2d} {order:?}: first differing byte at {first_diff:?}"
            );
        }

        // One byte too far on the destination: refused, nothing moves.
        let dst_len = dst_pool.total_bytes().unwrap();
        let mut bad = runs.clone();
        bad[5] = ByteRun::new(0, dst_len - 10, 11);
        // Sorted on the device, the error still names the position in the list as given.
        let gbad = gpu.upload_runs(&bad, RunOrder::DstAscending).unwrap();
        let before = dst.read(&gpu);
        let err = gpu
            .copy_runs(src.bytes(), dst.bytes_mut(), &gbad, LaunchShape::default())
            .unwrap_err();
        assert_eq!(
            err,
            KernelError::RunOutOfRange {
                position: 5,
                run: bad[5],
                src_len_bytes: src_pool.total_bytes().unwrap(),
                dst_len_bytes: dst_len,
                bad_count: 1,
            }
        );
        assert!(
            dst.read(&gpu) == before,
            "h2d={h2d}: a refused run list changed dst"
        );
        assert!(
            src.read(&gpu) == src_bytes,
            "h2d={h2d}: a refused run list changed src"
        );
    }

    // 5000 runs of 40 bytes (validation launch), then one overflowing run among them.
    let src_bytes = rng.bytes(400_000);
    let poison = rng.bytes(400_000);
    let runs: Vec<ByteRun> = rng
        .distinct_below(10_000, 5000)
        .into_iter()
        .zip(rng.distinct_below(10_000, 5000))
        .map(|(s, d)| ByteRun::new(s * 40, d * 40, 40))
        .collect();
    let src = gpu.upload(&src_bytes).unwrap();
    let mut dst = gpu.upload(&poison).unwrap();
    gpu.copy_runs(
        &src,
        &mut dst,
        &gpu.upload_runs(&runs, RunOrder::AsGiven).unwrap(),
        LaunchShape::default(),
    )
    .unwrap();
    let expect = cpu_reference(&src_bytes, &poison, &runs);
    assert!(gpu.read(&dst).unwrap() == expect);
    let mut bad = runs.clone();
    bad[4321] = ByteRun::new(u64::MAX - 8, 0, 40); // offset + len overflows u64
    let err = gpu
        .copy_runs(
            &src,
            &mut dst,
            &gpu.upload_runs(&bad, RunOrder::SrcAscending).unwrap(),
            LaunchShape::default(),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::RunOutOfRange {
                position: 4321,
                bad_count: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(gpu.read(&dst).unwrap() == expect);
}

/// `dst` after `runs` copy `src` into it, by THE CPU run copy: the pool crate's CPU backend's.
fn cpu_reference(src: &[u8], dst: &[u8], runs: &[ByteRun]) -> Vec<u8> {
    let runs: Vec<CopyRun> = runs
        .iter()
        .map(|r| CopyRun {
            src_offset_bytes: r.src_offset_bytes,
            dst_offset_bytes: r.dst_offset_bytes,
            len_bytes: r.len_bytes,
        })
        .collect();
    let mut out = dst.to_vec();
    copy_runs(Direction::Load, src, &mut out, &runs).unwrap();
    out
}

/// Page runs of DeepSeek-V3.2's pools (both buffers, every layer) between random pages, the
/// MLA runs of the first pair split into 656-byte token runs (neighbours the copy engines'
/// path merges again), and unaligned and empty runs into a page nothing else writes.
fn mixed_runs(
    rng: &mut SplitMix64,
    src_pool: &PoolGeometry,
    dst_pool: &PoolGeometry,
) -> Vec<ByteRun> {
    let src_pages = rng.distinct_below(src_pool.pages, 9);
    let dst_pages = rng.distinct_below(dst_pool.pages, 9);
    let mut runs = Vec::new();
    for b in 0..2usize {
        let len = src_pool.stored_page_bytes(b).unwrap();
        for layer in 0..LAYERS {
            for (i, (&sp, &dp)) in src_pages.iter().zip(&dst_pages).enumerate() {
                let (s, d) = (
                    src_pool.page_offset_bytes(b, layer, sp).unwrap(),
                    dst_pool.page_offset_bytes(b, layer, dp).unwrap(),
                );
                if b == 0 && i == 0 {
                    // 64 tokens of 656 B = 41,984 B, the page.
                    for t in 0..64 {
                        runs.push(ByteRun::new(s + t * 656, d + t * 656, 656));
                    }
                } else {
                    runs.push(ByteRun::new(s, d, len));
                }
            }
        }
    }
    let free = (0..dst_pool.pages)
        .find(|p| !dst_pages.contains(p))
        .unwrap();
    let base = dst_pool.page_offset_bytes(0, 0, free).unwrap();
    runs.push(ByteRun::new(8, base + 24, 1000));
    runs.push(ByteRun::new(4, base + 2004, 12));
    runs.push(ByteRun::new(3, base + 3001, 333));
    runs.push(ByteRun::new(77, base + 5000, 0));
    runs
}

/// The copy engines' path (`cuMemcpyBatchAsync`, both hints, every order) and the chooser
/// (`transfer_runs`) against the pool crate's CPU backend, bit for bit, both directions; a
/// bad run refused by each with the exact error and both sides unchanged; the chooser sends
/// page runs to the copy engines and 40-byte runs to the SM kernel under the SM budget.
#[test]
#[ignore = "needs a CUDA GPU"]
fn copy_engines_and_the_chooser_match_the_pool_cpu_backend() {
    let gpu = gpu();
    let host = pool(MemoryLayout::PageFirst, HOST_PAGES);
    let device = pool(MemoryLayout::LayerFirst, DEVICE_PAGES);
    let mut rng = SplitMix64::new(501);
    for h2d in [true, false] {
        let (src_pool, dst_pool) = if h2d {
            (&host, &device)
        } else {
            (&device, &host)
        };
        let runs = mixed_runs(&mut rng, src_pool, dst_pool);
        let src_bytes = rng.bytes(src_pool.total_bytes().unwrap() as usize);
        let poison = rng.bytes(dst_pool.total_bytes().unwrap() as usize);
        let src = Buf::new(&gpu, h2d, &src_bytes);
        let expect = cpu_reference(&src_bytes, &poison, &runs);
        let orders = [
            RunOrder::AsGiven,
            RunOrder::SrcAscending,
            RunOrder::DstAscending,
        ];
        for order in orders {
            // Every layer of a page_first host page is a pitched group in host order (3 lines:
            // under MIN_PITCHED_LINES, so batched here; pitched_groups_match_the_pool_cpu_backend
            // moves 10- and 12-line groups as 2D copies).
            let groups = group_pitched(&order.sorted_and_merged(&runs), gpu.max_pitch_bytes());
            // (Device order walks the pages of one layer: random pitches, no group.)
            let host_order = if h2d {
                RunOrder::SrcAscending
            } else {
                RunOrder::DstAscending
            };
            if order == host_order {
                assert!(
                    groups.iter().any(|g| g.lines() == LAYERS),
                    "{order:?}: no group of every layer of a page"
                );
            }
            // One stream, one call, all batched; 3 streams, 2D groups; every stream, 7 runs per
            // call, 2D groups; one stream, 2D groups.
            for (hint, lanes, runs_per_call, pitched) in [
                (CopyEngineHint::Default, 1, 1 << 14, false),
                (CopyEngineHint::PreferOverlapWithCompute, 3, 1 << 14, true),
                (CopyEngineHint::Default, MAX_COPY_ENGINE_LANES, 7, true),
                (CopyEngineHint::PreferOverlapWithCompute, 1, 1 << 14, true),
            ] {
                let opts = CopyEngineOptions {
                    order,
                    hint,
                    lanes,
                    runs_per_call,
                    pitched,
                };
                let mut dst = Buf::new(&gpu, !h2d, &poison);
                // SAFETY: finish() waits before src and dst are touched or dropped.
                unsafe { gpu.enqueue_copy_runs_dma(src.bytes(), dst.bytes_mut(), &runs, opts) }
                    .unwrap();
                gpu.finish().unwrap();
                let got = dst.read(&gpu);
                let first_diff = got.iter().zip(&expect).position(|(a, b)| a != b);
                assert!(
                    first_diff.is_none(),
                    "dma h2d={h2d} {opts:?}: byte {first_diff:?}"
                );
            }
            let mut dst = Buf::new(&gpu, !h2d, &poison);
            let path = gpu
                .transfer_runs(src.bytes(), dst.bytes_mut(), &runs, order)
                .unwrap();
            assert!(matches!(path, TransferPath::CopyEngines { .. }), "{path:?}");
            assert!(dst.read(&gpu) == expect, "chooser h2d={h2d} {order:?}");
        }
        // A run one byte past the destination: refused by both, naming its position.
        let dst_len = dst_pool.total_bytes().unwrap();
        let mut bad = runs.clone();
        bad[7] = ByteRun::new(0, dst_len - 10, 11);
        let want = KernelError::RunOutOfRange {
            position: 7,
            run: bad[7],
            src_len_bytes: src_pool.total_bytes().unwrap(),
            dst_len_bytes: dst_len,
            bad_count: 1,
        };
        let mut dst = Buf::new(&gpu, !h2d, &poison);
        // SAFETY: as above.
        let err = unsafe {
            gpu.enqueue_copy_runs_dma(
                src.bytes(),
                dst.bytes_mut(),
                &bad,
                CopyEngineOptions {
                    lanes: 2,
                    ..CopyEngineOptions::chosen(RunOrder::AsGiven)
                },
            )
        }
        .unwrap_err();
        assert_eq!(err, want);
        let err = gpu
            .transfer_runs(src.bytes(), dst.bytes_mut(), &bad, RunOrder::SrcAscending)
            .unwrap_err();
        assert_eq!(err, want);
        gpu.finish().unwrap();
        assert!(
            dst.read(&gpu) == poison,
            "h2d={h2d}: a refused list changed dst"
        );
        assert!(
            src.read(&gpu) == src_bytes,
            "h2d={h2d}: a refused list changed src"
        );
    }

    // Token-granular: 5000 runs of 40 bytes between random slots (mean 40 B < the copy
    // engines' threshold): the SM kernel under the SM budget, bit for bit.
    let src_bytes = rng.bytes(400_000);
    let poison = rng.bytes(400_000);
    let runs: Vec<ByteRun> = rng
        .distinct_below(10_000, 5000)
        .into_iter()
        .zip(rng.distinct_below(10_000, 5000))
        .map(|(s, d)| ByteRun::new(s * 40, d * 40, 40))
        .collect();
    let src = gpu.upload(&src_bytes).unwrap();
    let mut dst = gpu.upload(&poison).unwrap();
    let path = gpu
        .transfer_runs(&src, &mut dst, &runs, RunOrder::DstAscending)
        .unwrap();
    assert_eq!(
        path,
        TransferPath::SmKernel {
            max_sms: SM_BUDGET,
            runs: 5000
        }
    );
    let expect = cpu_reference(&src_bytes, &poison, &runs);
    assert!(gpu.read(&dst).unwrap() == expect);
    // The same 5000 runs on the copy engines split over streams (one per 1024 runs, rounded
    // up: 5 streams of 1000 runs), 300 runs per call.
    let mut dst = gpu.upload(&poison).unwrap();
    let opts = CopyEngineOptions {
        lanes: MAX_COPY_ENGINE_LANES,
        runs_per_call: 300,
        ..CopyEngineOptions::chosen(RunOrder::DstAscending)
    };
    // SAFETY: finish() waits before src and dst are touched or dropped.
    let merged = unsafe { gpu.enqueue_copy_runs_dma(&src, &mut dst, &runs, opts) }.unwrap();
    gpu.finish().unwrap();
    assert!(merged <= 5000);
    assert!(gpu.read(&dst).unwrap() == expect);
}

/// Pitched groups as 2D copies, bit for bit against the pool crate's CPU backend: a backup of
/// all 12 layers of 5 random pages (host order: per page and buffer, 12 lines at the device's
/// layer stride) and a load of one layer of 10 consecutive pages (10 lines at the host's page
/// stride), through the chooser and the copy-engine call with and without grouping.
#[test]
#[ignore = "needs a CUDA GPU"]
fn pitched_groups_match_the_pool_cpu_backend() {
    let gpu = gpu();
    let layers = 12;
    let host = pool_of(MemoryLayout::PageFirst, 20, layers);
    let device = pool_of(MemoryLayout::LayerFirst, 16, layers);
    let mut rng = SplitMix64::new(907);
    let backup_pages = rng.distinct_below(16, 5);
    let host_pages = rng.distinct_below(20, 5);
    let mut backup = Vec::new();
    for b in 0..2usize {
        let len = device.stored_page_bytes(b).unwrap();
        for (&d, &h) in backup_pages.iter().zip(&host_pages) {
            for layer in 0..layers {
                backup.push(ByteRun::new(
                    device.page_offset_bytes(b, layer, d).unwrap(),
                    host.page_offset_bytes(b, layer, h).unwrap(),
                    len,
                ));
            }
        }
    }
    let mut load = Vec::new();
    for b in 0..2usize {
        let len = host.stored_page_bytes(b).unwrap();
        for p in 0..10 {
            load.push(ByteRun::new(
                host.page_offset_bytes(b, 7, 4 + p).unwrap(),
                device.page_offset_bytes(b, 7, 3 + p).unwrap(),
                len,
            ));
        }
    }
    for (h2d, runs, order) in [
        (false, &backup, RunOrder::DstAscending),
        (true, &load, RunOrder::SrcAscending),
    ] {
        let (src_pool, dst_pool) = if h2d {
            (&host, &device)
        } else {
            (&device, &host)
        };
        let groups = group_pitched(&order.sorted_and_merged(runs), gpu.max_pitch_bytes());
        let long = groups
            .iter()
            .filter(|g| g.lines() >= MIN_PITCHED_LINES)
            .count();
        assert_eq!(long, if h2d { 2 } else { 10 }, "h2d={h2d}: 2D groups");
        let src_bytes = rng.bytes(src_pool.total_bytes().unwrap() as usize);
        let poison = rng.bytes(dst_pool.total_bytes().unwrap() as usize);
        let src = Buf::new(&gpu, h2d, &src_bytes);
        let expect = cpu_reference(&src_bytes, &poison, runs);
        let mut dst = Buf::new(&gpu, !h2d, &poison);
        let path = gpu
            .transfer_runs(src.bytes(), dst.bytes_mut(), runs, order)
            .unwrap();
        assert!(matches!(path, TransferPath::CopyEngines { .. }), "{path:?}");
        assert!(dst.read(&gpu) == expect, "chooser h2d={h2d}");
        // (Lists this short stay on one stream whatever `lanes` says: lanes are covered by the
        // 5,000-run list of copy_engines_and_the_chooser_match_the_pool_cpu_backend.)
        for (pitched, lanes) in [(true, 1), (false, 1)] {
            let opts = CopyEngineOptions {
                pitched,
                lanes,
                ..CopyEngineOptions::chosen(order)
            };
            let mut dst = Buf::new(&gpu, !h2d, &poison);
            // SAFETY: finish() waits before src and dst are touched or dropped.
            unsafe { gpu.enqueue_copy_runs_dma(src.bytes(), dst.bytes_mut(), runs, opts) }.unwrap();
            gpu.finish().unwrap();
            assert!(dst.read(&gpu) == expect, "h2d={h2d} {opts:?}");
        }
    }
}

/// Every page of `pages` of the device-side pool (both buffers, every layer) against distinct
/// random pages of the other side.
fn all_page_runs(
    rng: &mut SplitMix64,
    src_pool: &PoolGeometry,
    dst_pool: &PoolGeometry,
    pages: u64,
) -> Vec<ByteRun> {
    all_page_runs_of(rng, src_pool, dst_pool, pages, LAYERS)
}

/// [`all_page_runs`] for pools of `layers` layers.
fn all_page_runs_of(
    rng: &mut SplitMix64,
    src_pool: &PoolGeometry,
    dst_pool: &PoolGeometry,
    pages: u64,
    layers: u64,
) -> Vec<ByteRun> {
    let src_pages = rng.distinct_below(src_pool.pages, pages as usize);
    let dst_pages = rng.distinct_below(dst_pool.pages, pages as usize);
    let mut runs = Vec::new();
    for b in 0..2usize {
        let len = src_pool.stored_page_bytes(b).unwrap();
        for layer in 0..layers {
            for (&sp, &dp) in src_pages.iter().zip(&dst_pages) {
                runs.push(ByteRun::new(
                    src_pool.page_offset_bytes(b, layer, sp).unwrap(),
                    dst_pool.page_offset_bytes(b, layer, dp).unwrap(),
                    len,
                ));
            }
        }
    }
    runs
}

/// The staged path (host threads, one copy per chunk, device scatter or gather), and the
/// chooser (copy engines) on the same runs, against the pool crate's CPU backend, bit for bit, both directions:
/// 400 pages x 3 layers x (41,984 + 8,448) B = 60,518,400 B, four chunks of 16 MiB, then a
/// second call of mixed runs (unaligned, token runs) that wraps the ring of 4 slots; a bad run
/// refused with the exact error and both sides unchanged.
#[test]
#[ignore = "needs a CUDA GPU"]
fn staged_path_matches_the_pool_cpu_backend() {
    let gpu = gpu();
    let host = pool(MemoryLayout::PageFirst, 512);
    let device = pool(MemoryLayout::LayerFirst, 400);
    let mut rng = SplitMix64::new(808);
    for h2d in [true, false] {
        let (src_pool, dst_pool) = if h2d {
            (&host, &device)
        } else {
            (&device, &host)
        };
        let runs_a = all_page_runs(&mut rng, src_pool, dst_pool, 400);
        let runs_b = mixed_runs(&mut rng, src_pool, dst_pool);
        let src_bytes = rng.bytes(src_pool.total_bytes().unwrap() as usize);
        let poison = rng.bytes(dst_pool.total_bytes().unwrap() as usize);
        let src = Buf::new(&gpu, h2d, &src_bytes);
        let expect_a = cpu_reference(&src_bytes, &poison, &runs_a);
        let expect_ab = cpu_reference(&src_bytes, &expect_a, &runs_b);

        let mut dst = Buf::new(&gpu, !h2d, &poison);
        // SAFETY: finish() waits before src and dst are touched or dropped; nothing enqueued
        // earlier writes src.
        let chunks = unsafe { gpu.enqueue_staged_runs(src.bytes(), dst.bytes_mut(), &runs_a) };
        // 60,518,400 B over 16,777,216 B chunks: 4 (3.6, rounded up; pages do not straddle).
        assert_eq!(chunks.unwrap(), 4);
        // SAFETY: as above.
        unsafe { gpu.enqueue_staged_runs(src.bytes(), dst.bytes_mut(), &runs_b) }.unwrap();
        gpu.finish().unwrap();
        let got = dst.read(&gpu);
        let first_diff = got.iter().zip(&expect_ab).position(|(a, b)| a != b);
        assert!(
            first_diff.is_none(),
            "staged h2d={h2d}: byte {first_diff:?}"
        );

        let order = if h2d {
            RunOrder::SrcAscending
        } else {
            RunOrder::DstAscending
        };
        let mut dst = Buf::new(&gpu, !h2d, &poison);
        let path = gpu
            .transfer_runs(src.bytes(), dst.bytes_mut(), &runs_a, order)
            .unwrap();
        // The chooser keeps page runs on the copy engines (the staged path lost there).
        assert!(matches!(path, TransferPath::CopyEngines { .. }), "{path:?}");
        assert!(dst.read(&gpu) == expect_a, "chooser h2d={h2d}");

        // A run one byte past the destination: refused, naming its position; nothing moved.
        let dst_len = dst_pool.total_bytes().unwrap();
        let mut bad = runs_a.clone();
        bad[900] = ByteRun::new(0, dst_len - 10, 11);
        let want = KernelError::RunOutOfRange {
            position: 900,
            run: bad[900],
            src_len_bytes: src_pool.total_bytes().unwrap(),
            dst_len_bytes: dst_len,
            bad_count: 1,
        };
        let mut dst = Buf::new(&gpu, !h2d, &poison);
        // SAFETY: as above.
        let err = unsafe { gpu.enqueue_staged_runs(src.bytes(), dst.bytes_mut(), &bad) };
        assert_eq!(err.unwrap_err(), want);
        let err = gpu.transfer_runs(src.bytes(), dst.bytes_mut(), &bad, order);
        assert_eq!(err.unwrap_err(), want);
        gpu.finish().unwrap();
        assert!(
            dst.read(&gpu) == poison,
            "h2d={h2d}: a refused list changed dst"
        );
        assert!(
            src.read(&gpu) == src_bytes,
            "h2d={h2d}: a refused list changed src"
        );
    }
}

/// Sub-range reads and writes of device memory (what a pool backend's read_device and
/// write_device do), with out-of-range requests refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn device_sub_range_reads_and_writes() {
    let gpu = gpu();
    let mut rng = SplitMix64::new(9);
    let start = rng.bytes(1000);
    let mut d = gpu.upload(&start).unwrap();
    let patch = rng.bytes(37);
    gpu.write_at(&mut d, 501, &patch).unwrap();
    let mut expect = start.clone();
    expect[501..538].copy_from_slice(&patch);
    assert!(gpu.read(&d).unwrap() == expect);
    let mut out = vec![0u8; 100];
    gpu.read_at(&d, 450, &mut out).unwrap();
    assert_eq!(&out[..], &expect[450..550]);
    // 990 + 11 = 1001 > 1000: refused, nothing written.
    assert!(matches!(
        gpu.write_at(&mut d, 990, &[1u8; 11]),
        Err(KernelError::Length {
            expected: 1001,
            actual: 1000,
            ..
        })
    ));
    assert!(gpu.read_at(&d, u64::MAX, &mut out).is_err());
    assert!(gpu.read(&d).unwrap() == expect);
    let z = gpu.alloc_pinned_zeroed(4096).unwrap();
    assert!(z.as_slice().iter().all(|&b| b == 0));
}

/// The chooser with the model's SM carve-out set (`Gpu::set_model_carveout_sms`), against the
/// pool crate's CPU backend, bit for bit: a load of 100 random pages x 3 layers x 2 buffers
/// (600 page runs, over CARVEOUT_MIN_RUNS) goes to the run-list kernel on the carve-out, the
/// backup of the same runs is gathered, 2 runs stay on the copy engines both ways; two
/// gathered backups of 100 pages x 61 layers (five 64 MiB chunks each, back to back);
/// overlapping host ranges not gathered; 140,000 token runs
/// (9 launches of at most RUN_RING_SLOT_RUNS runs: the ring of 8 slots wraps inside one call)
/// on the carve-out, called 3 times; 20 lists enqueued without waiting behind a long transfer
/// (the ring wraps while the GPU is busy); a bad run refused with the exact error and nothing
/// moved; a carve-out of every SM refused naming `sms` and both counts; an empty list.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_carveout_chooser_and_its_run_ring_match_the_pool_cpu_backend() {
    let gpu = gpu();
    assert_eq!(gpu.model_carveout_sms(), None);
    // A carve-out of every SM leaves the model none: refused naming the field and both counts.
    let all = gpu.sm_count();
    let err = gpu.set_model_carveout_sms(all).unwrap_err();
    match &err {
        KernelError::Spec { field, problem } => {
            assert_eq!(field, "sms");
            assert!(problem.contains(&format!("{all} SMs")), "{problem}");
            assert!(
                problem.contains(&format!("carve-out of {all}")),
                "{problem}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(gpu.set_model_carveout_sms(all + 1).is_err());
    assert_eq!(gpu.model_carveout_sms(), None);
    gpu.set_model_carveout_sms(2).unwrap();
    assert_eq!(gpu.model_carveout_sms(), Some(2));

    let host = pool(MemoryLayout::PageFirst, 256);
    let device = pool(MemoryLayout::LayerFirst, 128);
    let mut rng = SplitMix64::new(1201);
    for h2d in [true, false] {
        let (src_pool, dst_pool) = if h2d {
            (&host, &device)
        } else {
            (&device, &host)
        };
        let runs = all_page_runs(&mut rng, src_pool, dst_pool, 100);
        assert_eq!(runs.len(), 600);
        assert!(runs.len() as u64 >= CARVEOUT_MIN_RUNS);
        let src_bytes = rng.bytes(src_pool.total_bytes().unwrap() as usize);
        let poison = rng.bytes(dst_pool.total_bytes().unwrap() as usize);
        let src = Buf::new(&gpu, h2d, &src_bytes);
        let order = if h2d {
            RunOrder::SrcAscending
        } else {
            RunOrder::DstAscending
        };
        let mut dst = Buf::new(&gpu, !h2d, &poison);
        let path = gpu
            .transfer_runs(src.bytes(), dst.bytes_mut(), &runs, order)
            .unwrap();
        // Random pages: no two runs continue each other on both sides, all 600 stay.
        if h2d {
            assert_eq!(
                path,
                TransferPath::SplitLoad {
                    max_sms: 2,
                    runs: 600
                }
            );
        } else {
            assert_eq!(
                path,
                TransferPath::GatheredBackup {
                    max_sms: 2,
                    runs: 600
                }
            );
        }
        let expect = cpu_reference(&src_bytes, &poison, &runs);
        assert!(dst.read(&gpu) == expect, "carve-out chooser h2d={h2d}");
        // Two runs: the copy engines, both ways.
        let mut dst = Buf::new(&gpu, !h2d, &poison);
        let path = gpu
            .transfer_runs(src.bytes(), dst.bytes_mut(), &runs[..2], order)
            .unwrap();
        assert!(matches!(path, TransferPath::CopyEngines { .. }), "{path:?}");
        assert!(dst.read(&gpu) == cpu_reference(&src_bytes, &poison, &runs[..2]));
        if h2d {
            // A split load whose runs are all short (index-K pages only: nothing left for the
            // copy engines; this divided by zero once) or all long (MLA only: the kernel takes
            // long runs up to its share).
            for short in [true, false] {
                let part: Vec<ByteRun> = runs
                    .iter()
                    .copied()
                    .filter(|r| (r.len_bytes <= SPLIT_SHORT_RUN_BYTES) == short)
                    .collect();
                assert_eq!(part.len(), 300);
                let mut dst = Buf::new(&gpu, false, &poison);
                let path = gpu
                    .transfer_runs(src.bytes(), dst.bytes_mut(), &part, order)
                    .unwrap();
                assert_eq!(
                    path,
                    TransferPath::SplitLoad {
                        max_sms: 2,
                        runs: 300
                    }
                );
                let expect = cpu_reference(&src_bytes, &poison, &part);
                assert!(dst.read(&gpu) == expect, "split load, short={short}");
            }
        }
        // A run one byte past the destination: refused before anything moves.
        let dst_len = dst_pool.total_bytes().unwrap();
        let mut bad = runs.clone();
        bad[300] = ByteRun::new(0, dst_len - 10, 11);
        let mut dst = Buf::new(&gpu, !h2d, &poison);
        let err = gpu
            .transfer_runs(src.bytes(), dst.bytes_mut(), &bad, order)
            .unwrap_err();
        assert_eq!(
            err,
            KernelError::RunOutOfRange {
                position: 300,
                run: bad[300],
                src_len_bytes: src_pool.total_bytes().unwrap(),
                dst_len_bytes: dst_len,
                bad_count: 1,
            }
        );
        assert!(
            dst.read(&gpu) == poison,
            "h2d={h2d}: a refused list moved bytes"
        );
    }

    // A gathered backup of 160 random pages x 61 layers x 2 buffers (492,216,320 B = 469.4 MiB:
    // ten chunks of 8, 16, 32, 6 x 64 and 29.4 MiB, so every slot is used two or three times),
    // bit for bit; three times, each call enqueued right behind the one before (its slots'
    // events, and a list buffer still being read: each call takes one of its own). The first
    // two lists are laid buffer by buffer and layer by layer (the list order does not pay:
    // planned in host order), the third page pair by page pair, as the pool shim lays them
    // (planned as listed).
    let layers = 61u64;
    let device = pool_of(MemoryLayout::LayerFirst, 160, layers);
    let host = pool_of(MemoryLayout::PageFirst, 200, layers);
    let src_bytes = rng.bytes(device.total_bytes().unwrap() as usize);
    let src = Buf::new(&gpu, false, &src_bytes);
    let poison = rng.bytes(host.total_bytes().unwrap() as usize);
    let mut dst = Buf::new(&gpu, true, &poison);
    let mut expect = poison.clone();
    for call in 0..3 {
        let mut runs = all_page_runs_of(&mut rng, &device, &host, 160, layers);
        if call == 2 {
            // Page pair by page pair: each pair's buffer-0 layers, then its buffer-1 layers
            // (the runs are listed buffer, layer, pair: 160 pairs per layer, 61 layers per
            // buffer).
            let at = |i: usize| (i % 160, i / (160 * 61), (i / 160) % 61);
            let mut order: Vec<usize> = (0..runs.len()).collect();
            order.sort_by_key(|&i| at(i));
            runs = order.into_iter().map(|i| runs[i]).collect();
        }
        let total_bytes: u64 = runs.iter().map(|r| r.len_bytes).sum();
        assert_eq!(total_bytes, 160 * 61 * (41_984 + 8_448));
        assert!(total_bytes > 7 * GATHER_SLOT_BYTES);
        // SAFETY: finish() below waits before src and dst are read, changed or dropped.
        let path = unsafe {
            gpu.enqueue_transfer_runs(src.bytes(), dst.bytes_mut(), &runs, RunOrder::DstAscending)
        }
        .unwrap();
        assert_eq!(
            path,
            TransferPath::GatheredBackup {
                max_sms: 2,
                runs: 19_520
            },
            "call {call}"
        );
        expect = cpu_reference(&src_bytes, &expect, &runs);
    }
    assert!(dst.read(&gpu) == expect, "gathered backups, 61 layers");
    // Two runs writing overlapping host bytes: not gathered (the copy engines' path).
    let overlapping: Vec<ByteRun> = (0..64)
        .map(|i| ByteRun::new(i * 41_984, 1000 + i * 41_000, 41_984))
        .collect();
    let mut dst = Buf::new(&gpu, true, &poison);
    let path = gpu
        .transfer_runs(
            src.bytes(),
            dst.bytes_mut(),
            &overlapping,
            RunOrder::DstAscending,
        )
        .unwrap();
    assert_eq!(path, TransferPath::CopyEngines { runs: 64 });

    // Token-granular: 280,000 runs of 40 bytes between random slots, on the carve-out's 3 SMs.
    gpu.set_model_carveout_sms(3).unwrap();
    let n = 280_000usize;
    assert!(n > RUN_RING_SLOTS * RUN_RING_SLOT_RUNS);
    let src_bytes = rng.bytes(400_000 * 40);
    let src = gpu.upload(&src_bytes).unwrap();
    for call in 0..3 {
        let runs: Vec<ByteRun> = rng
            .distinct_below(400_000, n)
            .into_iter()
            .zip(rng.distinct_below(400_000, n))
            .map(|(s, d)| ByteRun::new(s * 40, d * 40, 40))
            .collect();
        let poison = rng.bytes(400_000 * 40);
        let mut dst = gpu.upload(&poison).unwrap();
        let path = gpu
            .transfer_runs(&src, &mut dst, &runs, RunOrder::AsGiven)
            .unwrap();
        assert_eq!(
            path,
            TransferPath::SmKernel {
                max_sms: 3,
                runs: n as u64
            },
            "call {call}"
        );
        let expect = cpu_reference(&src_bytes, &poison, &runs);
        assert!(gpu.read(&dst).unwrap() == expect, "token runs, call {call}");
    }

    // Queued without waiting behind a long transfer (the 280,000 token runs again): 20 lists of
    // 1,000 runs, one slot each, into disjoint parts of one buffer. The host wraps the ring of
    // 8 slots while the GPU is still busy with the first transfer, so each slot must be
    // rewritten only after its event; a slot rewritten early would copy another list's runs.
    let long_runs: Vec<ByteRun> = rng
        .distinct_below(400_000, n)
        .into_iter()
        .zip(rng.distinct_below(400_000, n))
        .map(|(s, d)| ByteRun::new(s * 40, d * 40, 40))
        .collect();
    let mut long_dst = gpu.upload(&rng.bytes(400_000 * 40)).unwrap();
    let part_bytes = 1000 * 40;
    let poison = rng.bytes(20 * part_bytes as usize);
    let mut dst = gpu.upload(&poison).unwrap();
    let mut all_runs = Vec::new();
    // SAFETY: finish() below waits before any buffer is read, changed or dropped.
    unsafe {
        gpu.enqueue_transfer_runs(&src, &mut long_dst, &long_runs, RunOrder::AsGiven)
            .unwrap();
        for list in 0..20u64 {
            let runs: Vec<ByteRun> = rng
                .distinct_below(400_000, 1000)
                .into_iter()
                .zip(rng.distinct_below(1000, 1000))
                .map(|(s, d)| ByteRun::new(s * 40, list * part_bytes + d * 40, 40))
                .collect();
            let path = gpu
                .enqueue_transfer_runs(&src, &mut dst, &runs, RunOrder::AsGiven)
                .unwrap();
            assert_eq!(
                path,
                TransferPath::SmKernel {
                    max_sms: 3,
                    runs: 1000
                }
            );
            all_runs.extend(runs);
        }
    }
    gpu.finish().unwrap();
    let expect = cpu_reference(&src_bytes, &poison, &all_runs);
    assert!(
        gpu.read(&dst).unwrap() == expect,
        "lists queued behind a long transfer"
    );

    // Nothing to move: nothing enqueued, reported as no copy-engine runs.
    let path = gpu
        .transfer_runs(&src, &mut dst, &[ByteRun::new(8, 8, 0)], RunOrder::AsGiven)
        .unwrap();
    assert_eq!(path, TransferPath::CopyEngines { runs: 0 });
    gpu.set_model_carveout_sms(0).unwrap();
    assert_eq!(gpu.model_carveout_sms(), None);
}

/// A pool of page size 1: Llama-3.1-8B-like (`llama`: K and V buffers of 8 x 128 bf16, 2,048
/// B per token and layer each, `layers` layers) or DeepSeek-V3 MLA (one buffer of 576 bf16,
/// 1,152 B), `tokens` slots.
fn page1_pool(llama: bool, memory_layout: MemoryLayout, tokens: u64, layers: u64) -> PoolGeometry {
    let buffers = if llama {
        ["k", "v"]
            .map(|name| {
                let layout =
                    formats::single(name, kvlayout_core::Dtype::Bf16, vec![8, 128]).unwrap();
                BufferGeometry::new(name, layers, layout)
            })
            .to_vec()
    } else {
        vec![BufferGeometry::new("kv", layers, formats::MLA_BF16)]
    };
    PoolGeometry {
        name: format!("page size 1 {memory_layout}"),
        page_size_tokens: 1,
        pages: tokens,
        memory_layout,
        buffers,
    }
}

/// Token runs between random slots: per layer of `layers` (one list each, a load's), or one
/// list of all layers laid token by token, each buffer's layers in turn (a backup's, as the
/// pool shim lays it).
fn page1_runs(
    rng: &mut SplitMix64,
    src: &PoolGeometry,
    dst: &PoolGeometry,
    tokens: usize,
    per_layer: bool,
) -> Vec<Vec<ByteRun>> {
    let (s_slots, d_slots) = (
        rng.distinct_below(src.pages, tokens),
        rng.distinct_below(dst.pages, tokens),
    );
    let layers = src.buffers[0].layers;
    let run = |b: usize, layer: u64, s: u64, d: u64| {
        ByteRun::new(
            src.page_offset_bytes(b, layer, s).unwrap(),
            dst.page_offset_bytes(b, layer, d).unwrap(),
            src.stored_page_bytes(b).unwrap(),
        )
    };
    let buffers = src.buffers.len();
    if per_layer {
        (0..layers)
            .map(|layer| {
                let mut runs = Vec::new();
                for (&s, &d) in s_slots.iter().zip(&d_slots) {
                    for b in 0..buffers {
                        runs.push(run(b, layer, s, d));
                    }
                }
                runs
            })
            .collect()
    } else {
        let mut runs = Vec::new();
        for (&s, &d) in s_slots.iter().zip(&d_slots) {
            for b in 0..buffers {
                for layer in 0..layers {
                    runs.push(run(b, layer, s, d));
                }
            }
        }
        vec![runs]
    }
}

/// Page size 1 (token-granular runs of one length: 2,048 B for Llama's K or V, 1,152 B for an
/// MLA latent) through the chooser, without and with a carve-out, against the pool crate's
/// CPU backend bit for bit: loads layer by layer go to the token kernel (`copy_runs_uniform`)
/// on `SM_BUDGET` SMs or on the carve-out; a backup of all layers (18,300 runs of 1,152 B
/// for MLA) on `TOKEN_BACKUP_BLOCKS` blocks, carve-out or not. A list with one run past the end is refused with both sides unchanged.
#[test]
#[ignore = "needs a CUDA GPU"]
fn page_size_1_token_runs_match_the_pool_cpu_backend() {
    let gpu = gpu();
    let mut rng = SplitMix64::new(2501);
    for carveout in [None, Some(2u32)] {
        if let Some(k) = carveout {
            gpu.set_model_carveout_sms(k).unwrap();
        }
        for (llama, layers) in [(true, 4u64), (false, 61)] {
            let host = page1_pool(llama, MemoryLayout::PageFirst, 700, layers);
            let device = page1_pool(llama, MemoryLayout::LayerFirst, 500, layers);
            for h2d in [true, false] {
                let (sp, dp) = if h2d {
                    (&host, &device)
                } else {
                    (&device, &host)
                };
                let src_bytes = rng.bytes(sp.total_bytes().unwrap() as usize);
                let poison = rng.bytes(dp.total_bytes().unwrap() as usize);
                let src = Buf::new(&gpu, h2d, &src_bytes);
                let mut dst = Buf::new(&gpu, !h2d, &poison);
                let order = if h2d {
                    RunOrder::SrcAscending
                } else {
                    RunOrder::DstAscending
                };
                let lists = page1_runs(&mut rng, sp, dp, 300, h2d);
                let mut expect = poison.clone();
                for runs in &lists {
                    let path = gpu
                        .transfer_runs(src.bytes(), dst.bytes_mut(), runs, order)
                        .unwrap();
                    let n = runs.len() as u64;
                    // 300 tokens x 2 buffers per layer (Llama), 300 x 61 layers (MLA backup).
                    assert_eq!(
                        n,
                        if h2d {
                            300 * sp.buffers.len() as u64
                        } else {
                            300 * sp.buffers.len() as u64 * layers
                        }
                    );
                    let expected_path = match (carveout, h2d) {
                        (None, true) => TransferPath::SmKernel {
                            max_sms: SM_BUDGET,
                            runs: n,
                        },
                        (Some(k), true) => TransferPath::SmKernel {
                            max_sms: k,
                            runs: n,
                        },
                        // A backup: the token kernel on a few blocks, carve-out or not.
                        (_, false) => TransferPath::SmKernel {
                            max_sms: TOKEN_BACKUP_BLOCKS,
                            runs: n,
                        },
                    };
                    assert_eq!(path, expected_path, "llama={llama} h2d={h2d}");
                    expect = cpu_reference(&src_bytes, &expect, runs);
                }
                assert!(
                    dst.read(&gpu) == expect,
                    "page size 1, llama={llama}, h2d={h2d}, carve-out {carveout:?}"
                );
                // The same runs uploaded (the token kernel behind a validation launch): the
                // first list again onto fresh poison, bit for bit; with one run past the end,
                // refused (named at its position in the list as given), nothing moved.
                if carveout.is_none() {
                    let mut again = Buf::new(&gpu, !h2d, &poison);
                    let shape = LaunchShape {
                        blocks_per_sm: 4,
                        ..LaunchShape::sm_budget(2)
                    };
                    let uploaded = gpu.upload_runs(&lists[0], order).unwrap();
                    gpu.copy_runs(src.bytes(), again.bytes_mut(), &uploaded, shape)
                        .unwrap();
                    let want = cpu_reference(&src_bytes, &poison, &lists[0]);
                    assert!(
                        again.read(&gpu) == want,
                        "uploaded, llama={llama} h2d={h2d}"
                    );
                    let mut bad = lists[0].clone();
                    bad[3] = ByteRun::new(0, dp.total_bytes().unwrap(), bad[3].len_bytes);
                    let uploaded = gpu.upload_runs(&bad, order).unwrap();
                    let err = gpu
                        .copy_runs(src.bytes(), again.bytes_mut(), &uploaded, shape)
                        .unwrap_err();
                    assert!(
                        matches!(err, KernelError::RunOutOfRange { position: 3, .. }),
                        "{err:?}"
                    );
                    assert!(
                        again.read(&gpu) == want,
                        "a refused uploaded list moved bytes"
                    );
                }
                // One run past the destination's end: refused, nothing moved.
                let dst_len = dp.total_bytes().unwrap();
                let mut bad = lists[0].clone();
                bad[7] = ByteRun::new(0, dst_len - 16, 2048.min(bad[7].len_bytes));
                let before = dst.read(&gpu);
                let err = gpu
                    .transfer_runs(src.bytes(), dst.bytes_mut(), &bad, order)
                    .unwrap_err();
                assert!(
                    matches!(err, KernelError::RunOutOfRange { position: 7, .. }),
                    "{err:?}"
                );
                assert!(dst.read(&gpu) == before, "a refused list moved bytes");
            }
        }
    }
}

/// The token kernel (`copy_runs_uniform`) on lists of one run
/// length from 128 B to 4 KiB (8 to 256 vectors: 32 down to 1 run per warp, 1,152 B with
/// idle slots) between random 16-byte-aligned slots, both ways, bit for bit against the CPU
/// reference; 1,001 runs, not a multiple of any group, so the last group is cut short.
#[test]
#[ignore = "needs a CUDA GPU"]
fn uniform_run_lists_of_every_group_size_match_the_cpu_reference() {
    let gpu = gpu();
    let mut rng = SplitMix64::new(909);
    let region_bytes = 8 << 20;
    for len in [128u64, 144, 656, 1152, 2048, 4096] {
        let slots = region_bytes / 4096;
        let (s, d) = (
            rng.distinct_below(slots, 1001),
            rng.distinct_below(slots, 1001),
        );
        let runs: Vec<ByteRun> = s
            .iter()
            .zip(&d)
            .map(|(&a, &b)| ByteRun::new(a * 4096, b * 4096, len))
            .collect();
        for h2d in [true, false] {
            {
                let src_bytes = rng.bytes(region_bytes as usize);
                let poison = rng.bytes(region_bytes as usize);
                let src = Buf::new(&gpu, h2d, &src_bytes);
                let mut dst = Buf::new(&gpu, !h2d, &poison);
                let uploaded = gpu.upload_runs(&runs, RunOrder::AsGiven).unwrap();
                let shape = LaunchShape {
                    blocks_per_sm: 4,
                    ..LaunchShape::sm_budget(2)
                };
                gpu.copy_runs(src.bytes(), dst.bytes_mut(), &uploaded, shape)
                    .unwrap();
                assert!(
                    dst.read(&gpu) == cpu_reference(&src_bytes, &poison, &runs),
                    "len {len} h2d {h2d}"
                );
            }
        }
    }
}

/// The host link is measured once (the same figure after), within what PCIe can carry (an H200
/// on PCIe 5.0 x16: about 55,000 MB/s; anything from 1 GB/s to 1 TB/s is accepted here, the
/// figure itself is the benchmark's); a backup share of 0 is refused naming `permille`, and
/// token backups on a carve-out paced to a tenth of the link still move every byte.
/// Backs `runs` up from `src` (device memory holding `src_bytes`) into pinned host memory
/// poisoned with `poison`, through the chooser; asserts every byte of the host buffer is what the
/// CPU reference makes of it and returns the path the chooser took.
fn backup_checked(
    gpu: &Gpu,
    src: &Buf,
    src_bytes: &[u8],
    poison: &[u8],
    runs: &[ByteRun],
) -> TransferPath {
    let mut dst = Buf::new(gpu, true, poison);
    let path = gpu
        .transfer_runs(src.bytes(), dst.bytes_mut(), runs, RunOrder::DstAscending)
        .unwrap();
    assert!(
        dst.read(gpu) == cpu_reference(src_bytes, poison, runs),
        "{path:?}"
    );
    path
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_host_link_is_measured_once_and_paced_backups_move_every_byte() {
    let gpu = gpu();
    let rate = gpu.host_link_bytes_per_us().unwrap();
    assert!((1_000..1_000_000).contains(&rate), "{rate} MB/s");
    assert_eq!(gpu.host_link_bytes_per_us().unwrap(), rate);
    match gpu.set_backup_link_share_permille(0) {
        Err(KernelError::Spec { field, .. }) => assert_eq!(field, "permille"),
        other => panic!("{other:?}"),
    }
    gpu.set_model_carveout_sms(2).unwrap();
    gpu.set_backup_link_share_permille(100).unwrap();
    // 5,000 MLA token runs (1,152 B) from random device slots to random host slots.
    let mut rng = SplitMix64::new(77);
    let src_bytes = rng.bytes(8000 * 1152);
    let poison = rng.bytes(9000 * 1152);
    let runs: Vec<ByteRun> = rng
        .distinct_below(8000, 5000)
        .into_iter()
        .zip(rng.distinct_below(9000, 5000))
        .map(|(s, d)| ByteRun::new(s * 1152, d * 1152, 1152))
        .collect();
    let src = Buf::new(&gpu, false, &src_bytes);
    let path = backup_checked(&gpu, &src, &src_bytes, &poison, &runs);
    assert_eq!(
        path,
        TransferPath::SmKernel {
            max_sms: TOKEN_BACKUP_BLOCKS,
            runs: 5000
        }
    );
    // DeepSeek-V3.2 token rows (656 B MLA and 132 B index-K in one list: two lengths, not the
    // token kernel's, so not paced), laid as the pool shim lays them: a token's rows one after
    // the other on the host (one 788 B host stretch per token), apart on the device. Gathered
    // on the carve-out, every byte as the CPU moves it.
    let dsa: Vec<ByteRun> = rng
        .distinct_below(8000, 300)
        .into_iter()
        .zip(rng.distinct_below(9000, 300))
        .flat_map(|(s, d)| {
            [
                ByteRun::new(s * 1152, d * 1152, 656),
                ByteRun::new(s * 1152 + 800, d * 1152 + 656, 132),
            ]
        })
        .collect();
    let path = backup_checked(&gpu, &src, &src_bytes, &poison, &dsa);
    assert!(
        matches!(path, TransferPath::GatheredBackup { max_sms: 2, .. }),
        "{path:?}"
    );
    // The same rows to random host slots (each row its own host stretch: gathering does not
    // pay): the run-list kernel on the carve-out, not the copy engines (0.008 of memcpy for
    // token runs).
    let scattered: Vec<ByteRun> = dsa
        .iter()
        .zip(rng.distinct_below(9000, dsa.len()))
        .map(|(r, d)| ByteRun::new(r.src_offset_bytes, d * 1152, r.len_bytes))
        .collect();
    let path = backup_checked(&gpu, &src, &src_bytes, &poison, &scattered);
    assert_eq!(
        path,
        TransferPath::SmKernel {
            max_sms: 2,
            runs: 600
        }
    );
    // MLA rows on even slots, and one row on the odd slots right after the first row's on
    // both sides (merged with it: a 2,304 B run among 1,152 B ones, two lengths): moved as
    // listed, on the paced kernel.
    let mut joined: Vec<ByteRun> = rng
        .distinct_below(4000, 2500)
        .into_iter()
        .zip(rng.distinct_below(4500, 2500))
        .map(|(s, d)| ByteRun::new(s * 2 * 1152, d * 2 * 1152, 1152))
        .collect();
    let first = joined[0];
    joined.insert(
        1,
        ByteRun::new(
            first.src_offset_bytes + 1152,
            first.dst_offset_bytes + 1152,
            1152,
        ),
    );
    let path = backup_checked(&gpu, &src, &src_bytes, &poison, &joined);
    assert_eq!(
        path,
        TransferPath::SmKernel {
            max_sms: TOKEN_BACKUP_BLOCKS,
            runs: joined.len() as u64
        }
    );
    // 2,000 runs of 4,096 B (Llama-3.1-8B's K and V of one token and layer together at page
    // size 1): token runs, paced on the token kernel, not the copy engines; and a load of
    // them from the host on the carve-out's kernel.
    let kv_rows: Vec<ByteRun> = rng
        .distinct_below(8000 * 1152 / 4096, 2000)
        .into_iter()
        .zip(rng.distinct_below(9000 * 1152 / 4096, 2000))
        .map(|(s, d)| ByteRun::new(s * 4096, d * 4096, 4096))
        .collect();
    let path = backup_checked(&gpu, &src, &src_bytes, &poison, &kv_rows);
    assert_eq!(
        path,
        TransferPath::SmKernel {
            max_sms: TOKEN_BACKUP_BLOCKS,
            runs: 2000
        }
    );
    let host_src = Buf::new(&gpu, true, &src_bytes);
    let mut dev_dst = Buf::new(&gpu, false, &poison);
    let path = gpu
        .transfer_runs(
            host_src.bytes(),
            dev_dst.bytes_mut(),
            &kv_rows,
            RunOrder::AsGiven,
        )
        .unwrap();
    assert_eq!(
        path,
        TransferPath::SmKernel {
            max_sms: 2,
            runs: 2000
        }
    );
    assert!(dev_dst.read(&gpu) == cpu_reference(&src_bytes, &poison, &kv_rows));
    // A rate limit of 0 B/us is refused by name, nothing copied.
    let list = gpu.upload_runs(&runs, RunOrder::AsGiven).unwrap();
    let mut dst = Buf::new(&gpu, true, &poison);
    let shape = LaunchShape {
        rate_limit_bytes_per_us: Some(0),
        ..LaunchShape::sm_budget(2)
    };
    match gpu.copy_runs(src.bytes(), dst.bytes_mut(), &list, shape) {
        Err(KernelError::Spec { field, .. }) => assert_eq!(field, "rate_limit_bytes_per_us"),
        other => panic!("{other:?}"),
    }
    assert!(dst.read(&gpu) == poison);
}
