//! The CUDA backend through the pools (issue 4, items 4 and 5): device pool in GPU memory, host
//! pool in pinned host memory, every checked transfer by the chooser (copy engines for page runs, the run-list kernel for token runs).
//!
//! Each GPU test is `#[ignore]`d (CI has no GPU) and runs with `--ignored` on the device
//! machine. Without a CUDA driver it prints why it skipped and returns, never panics — unless
//! `KVLAYOUT_REQUIRE_GPU` is set (the device machine's run sets it), where a missing GPU fails
//! the test instead of passing it silently. The same bodies run on the CPU backend as ordinary
//! tests, so the hand-worked offsets and expected errors below are checked on every machine.
//!
//! Method: destinations are poisoned first (every byte 0xA5), sources hold random bytes that
//! are never 0 nor 0xA5; after a transfer every destination page named by a pair must hold its
//! source page, every other destination page (and every layer a one-layer transfer skips) must
//! still be poison, the source must be untouched, and both pools must equal, byte for byte, the
//! pools of the same transfer on the CPU backend.
//!
//! Geometries (fixtures of tests/src/lib.rs, per-token sizes worked there):
//! - DSA (DeepSeek-V3.2): `kv` dsa_mla_fp8 656 B/token -> 64 x 656 = 41,984 B per page per
//!   layer; `index_k` bf16 128 x 2 = 256 B/token -> 64 x 256 = 16,384 B; 2 layers, device 4
//!   pages, host 8 pages. Host region: 8 x 2 x (41,984 + 16,384) = 933,888 B.
//! - MHA bf16 8 heads x 128 (K plane then V plane, 4096 B/token), 3 layers, for `page_head`.

use kvlayout_core::{MemoryLayout, PoolGeometry, file, formats};
use kvlayout_models::{IndexK, Model, PoolOptions};
use kvlayout_pool::backend::{CudaBackend, KernelError};
use kvlayout_pool::{
    Backend, BackendError, CopyRun, CpuBackend, DevicePool, Direction, HiCache, HostPool, KvPool,
    Layers, PagePair, PoolWriter, TransferError,
};
use kvlayout_replay::synthetic::{
    self as replay, HostSource, ReplayInput, ReplayOutcome, Workload,
};

const DEVICE_PAGES: u64 = 4;
const HOST_PAGES: u64 = 8;
const POISON: u8 = 0xA5;

/// The GPU, or `None` (with the reason on stderr) on a machine without one. With
/// `KVLAYOUT_REQUIRE_GPU` set, a missing GPU fails the test.
fn gpu(test: &str) -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            let required = std::env::var_os("KVLAYOUT_REQUIRE_GPU").is_some();
            assert!(
                !required,
                "{test}: KVLAYOUT_REQUIRE_GPU is set but the CUDA backend cannot open GPU 0: {e}"
            );
            let why = match e {
                KernelError::NoDriver => "no CUDA driver on this machine".to_string(),
                e => e.to_string(),
            };
            eprintln!("{test}: skipped ({why})");
            None
        }
    }
}

fn dsa_bf16() -> PoolGeometry {
    kvlayout_tests::dsa(formats::INDEX_K_BF16, 2, DEVICE_PAGES)
}

fn mha() -> PoolGeometry {
    kvlayout_tests::mha_bf16(3, DEVICE_PAGES)
}

/// `n` random bytes (xorshift64*), none of them 0 or [`POISON`].
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8;
            // 1..=254, then skip the poison value: 1..=0xA4, 0xA6..=0xFF.
            let v = v % 254 + 1;
            if v >= POISON { v + 1 } else { v }
        })
        .collect()
}

fn fill_random<P: KvPool>(mut pool: PoolWriter<'_, P>, seed: u64) {
    let n = pool.pool().len_bytes() as usize;
    pool.write_bytes(0, &random_bytes(seed, n)).unwrap();
}

fn poison<P: KvPool>(mut pool: PoolWriter<'_, P>) {
    let n = pool.pool().len_bytes() as usize;
    pool.write_bytes(0, &vec![POISON; n]).unwrap();
}

/// One host layout to test, with a hand-worked anchor: `len` bytes at `host_offset` of the
/// host region are bytes `page_offset..page_offset + len` of the canonical page (buffer,
/// layer) stored in host page `host_page`.
struct Case {
    device: PoolGeometry,
    layout: MemoryLayout,
    anchor: Anchor,
}

struct Anchor {
    buffer: usize,
    layer: u64,
    host_page: u64,
    host_offset: u64,
    page_offset: usize,
    len: usize,
}

fn cases() -> Vec<Case> {
    // index_k (buffer 1), layer 1, host page 5; the first 256 B (token 0) of the page.
    let index_k_page5_layer1 = |host_offset| Anchor {
        buffer: 1,
        layer: 1,
        host_page: 5,
        host_offset,
        page_offset: 0,
        len: 256,
    };
    vec![
        // layer_first [buffer][layer][page]: kv = 2 x 8 x 41,984 = 671,744 B; index_k layer 1
        // page 5 = 671,744 + (1 x 8 + 5) x 16,384 = 671,744 + 212,992 = 884,736.
        Case {
            device: dsa_bf16(),
            layout: MemoryLayout::LayerFirst,
            anchor: index_k_page5_layer1(884_736),
        },
        // page_first [buffer][page][layer]: 671,744 + (5 x 2 + 1) x 16,384 = 851,968.
        Case {
            device: dsa_bf16(),
            layout: MemoryLayout::PageFirst,
            anchor: index_k_page5_layer1(851_968),
        },
        // page_first_direct [page][buffer][layer]: a page of both buffers and layers is
        // 2 x 41,984 + 2 x 16,384 = 116,736 B; page 5, past kv's 2 layers, layer 1 of index_k:
        // 5 x 116,736 + 2 x 41,984 + 16,384 = 583,680 + 83,968 + 16,384 = 684,032.
        Case {
            device: dsa_bf16(),
            layout: MemoryLayout::PageFirstDirect,
            anchor: index_k_page5_layer1(684_032),
        },
        // page_head [page][head][layer][token][head row]: head row = k 256 + v 256 = 512 B, one
        // head of one page of one layer = 64 x 512 = 32,768 B. Page 1, head 2, layer 1 at
        // ((1 x 8 + 2) x 3 + 1) x 32,768 = 1,015,808: token 0's k row of head 2, which sits in
        // the canonical page (K plane, 8 x 256 = 2048 B per token) at 2 x 256 = 512.
        Case {
            device: mha(),
            layout: MemoryLayout::PageHead,
            anchor: Anchor {
                buffer: 0,
                layer: 1,
                host_page: 1,
                host_offset: 1_015_808,
                page_offset: 512,
                len: 256,
            },
        },
    ]
}

/// (device page, host page): host page 1 and 5 (the anchors' pages) are both destinations of a
/// backup and sources of a load; device page 3 goes to / comes from both anchors in turn.
const PAIRS: [PagePair; 3] = [
    PagePair::new(3, 5),
    PagePair::new(0, 1),
    PagePair::new(2, 6),
];

fn cache_on<B: Backend>(backend: B, case: &Case) -> HiCache<B> {
    let device = DevicePool::new_in(backend, case.device.clone()).unwrap();
    let host = HostPool::mirror_of(&device, HOST_PAGES, case.layout).unwrap();
    HiCache::pair(device, host).unwrap()
}

fn snapshots<B: Backend>(cache: &HiCache<B>) -> (Vec<u8>, Vec<u8>) {
    (
        cache.device().snapshot().unwrap(),
        cache.host().snapshot().unwrap(),
    )
}

fn moved(layers: Layers, l: u64) -> bool {
    match layers {
        Layers::All => true,
        Layers::One(one) => one == l,
    }
}

/// Poisons the destination, randomizes the source, runs one transfer and checks it page by
/// page; returns both pools' bytes afterwards.
fn transfer_case<B: Backend>(
    backend: B,
    case: &Case,
    direction: Direction,
    layers: Layers,
) -> (Vec<u8>, Vec<u8>) {
    let mut cache = cache_on(backend, case);
    let seed = 7 + u64::from(case.layout.code());
    match direction {
        Direction::Backup => {
            fill_random(cache.device_writer(), seed);
            poison(cache.host_writer());
        }
        Direction::Load => {
            fill_random(cache.host_writer(), seed);
            poison(cache.device_writer());
        }
    }
    let (device_before, host_before) = snapshots(&cache);
    let done = match (direction, layers) {
        (Direction::Backup, Layers::All) => cache.backup(&PAIRS),
        (Direction::Backup, Layers::One(l)) => cache.backup_layer(l, &PAIRS),
        (Direction::Load, Layers::All) => cache.load(&PAIRS),
        (Direction::Load, Layers::One(l)) => cache.load_layer(l, &PAIRS),
    }
    .unwrap();
    assert_eq!(done.pairs, 3);
    let g = cache.device().geometry().clone();
    for (b, buf) in g.buffers.iter().enumerate() {
        let payload = g.page_geometry(b).unwrap().page_payload_bytes as usize;
        for l in 0..buf.layers {
            let (dst_pages, src_is_device) = match direction {
                Direction::Backup => (HOST_PAGES, true),
                Direction::Load => (DEVICE_PAGES, false),
            };
            for dst in 0..dst_pages {
                let got = match direction {
                    Direction::Backup => cache.host().read_page(b, l, dst).unwrap(),
                    Direction::Load => cache.device().read_page(b, l, dst).unwrap(),
                };
                let pair = PAIRS.iter().find(|p| match direction {
                    Direction::Backup => p.host_page == dst,
                    Direction::Load => p.device_page == dst,
                });
                let want = match pair {
                    Some(p) if moved(layers, l) => {
                        if src_is_device {
                            cache.device().read_page(b, l, p.device_page).unwrap()
                        } else {
                            cache.host().read_page(b, l, p.host_page).unwrap()
                        }
                    }
                    _ => vec![POISON; payload],
                };
                assert!(
                    got == want,
                    "{:?} {direction:?} {layers:?}: buffer {b} layer {l} destination page {dst}",
                    case.layout
                );
            }
        }
    }
    let (device_after, host_after) = snapshots(&cache);
    // The source is untouched.
    match direction {
        Direction::Backup => assert!(device_after == device_before),
        Direction::Load => assert!(host_after == host_before),
    }
    // The hand-worked anchor: host bytes at the worked offset are the canonical page's.
    let a = &case.anchor;
    if moved(layers, a.layer) {
        let mut at_offset = vec![0u8; a.len];
        cache
            .host()
            .read_bytes(a.host_offset, &mut at_offset)
            .unwrap();
        let canonical = cache
            .host()
            .read_page(a.buffer, a.layer, a.host_page)
            .unwrap();
        assert_eq!(
            at_offset,
            canonical[a.page_offset..a.page_offset + a.len],
            "{:?}: anchor at host byte {}",
            case.layout,
            a.host_offset
        );
        assert!(at_offset.iter().all(|&v| v != POISON && v != 0));
        // The device page paired with the anchor's host page holds the same bytes.
        let pair = PAIRS.iter().find(|p| p.host_page == a.host_page).unwrap();
        let device_page = cache
            .device()
            .read_page(a.buffer, a.layer, pair.device_page)
            .unwrap();
        assert_eq!(at_offset, device_page[a.page_offset..a.page_offset + a.len]);
    }
    (device_after, host_after)
}

const DIRECTIONS: [Direction; 2] = [Direction::Backup, Direction::Load];
const LAYER_SETS: [Layers; 2] = [Layers::All, Layers::One(1)];

fn every_layout_and_direction<B: Backend>(backend: B, reference: Option<CpuBackend>) {
    for case in cases() {
        for direction in DIRECTIONS {
            for layers in LAYER_SETS {
                let got = transfer_case(backend.clone(), &case, direction, layers);
                if let Some(cpu) = reference {
                    let want = transfer_case(cpu, &case, direction, layers);
                    assert!(
                        got == want,
                        "{:?} {direction:?} {layers:?}: pools differ from the CPU backend's",
                        case.layout
                    );
                }
            }
        }
    }
}

#[test]
fn cpu_every_host_layout_and_direction_poisoned_random_hand_anchored() {
    every_layout_and_direction(CpuBackend, None);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored on the device machine"]
fn gpu_every_host_layout_and_direction_matches_the_cpu_backend() {
    let Some(cuda) = gpu("gpu_every_host_layout_and_direction_matches_the_cpu_backend") else {
        return;
    };
    every_layout_and_direction(cuda, Some(CpuBackend));
}

/// Out-of-range pages on either side, in either direction, after valid pairs: refused with the
/// shim's error, and both pools byte for byte as they were.
fn out_of_range_refused<B: Backend>(backend: B) {
    let case = &cases()[1]; // DSA, host page_first: device 4 pages, host 8.
    let mut cache = cache_on(backend, case);
    fill_random(cache.device_writer(), 11);
    fill_random(cache.host_writer(), 12);
    let before = snapshots(&cache);
    let attempts: [(Direction, Vec<PagePair>, TransferError); 4] = [
        // Pair 1 names host page 8 of 8 (pages 0..=7).
        (
            Direction::Backup,
            vec![PagePair::new(0, 1), PagePair::new(1, 8)],
            TransferError::PageOutOfRange {
                pair: 1,
                side: "host",
                page: 8,
                pages: 8,
            },
        ),
        // Device page 4 of 4.
        (
            Direction::Backup,
            vec![PagePair::new(2, 2), PagePair::new(4, 3)],
            TransferError::PageOutOfRange {
                pair: 1,
                side: "device",
                page: 4,
                pages: 4,
            },
        ),
        // A load onto device page u64::MAX.
        (
            Direction::Load,
            vec![PagePair::new(1, 1), PagePair::new(u64::MAX, 2)],
            TransferError::PageOutOfRange {
                pair: 1,
                side: "device",
                page: u64::MAX,
                pages: 4,
            },
        ),
        // A load from host page 9.
        (
            Direction::Load,
            vec![
                PagePair::new(0, 0),
                PagePair::new(1, 1),
                PagePair::new(2, 9),
            ],
            TransferError::PageOutOfRange {
                pair: 2,
                side: "host",
                page: 9,
                pages: 8,
            },
        ),
    ];
    for (direction, pairs, want) in attempts {
        for layers in LAYER_SETS {
            let err = match (direction, layers) {
                (Direction::Backup, Layers::All) => cache.backup(&pairs),
                (Direction::Backup, Layers::One(l)) => cache.backup_layer(l, &pairs),
                (Direction::Load, Layers::All) => cache.load(&pairs),
                (Direction::Load, Layers::One(l)) => cache.load_layer(l, &pairs),
            }
            .unwrap_err();
            assert_eq!(err, want, "{direction:?} {layers:?} {pairs:?}");
            assert!(
                snapshots(&cache) == before,
                "{direction:?} {layers:?}: a refused transfer changed a pool"
            );
        }
    }
    // A layer past the pool's 2 layers is refused too, moving nothing.
    let layer_2 = TransferError::Layer {
        layer: 2,
        layers: 2,
    };
    assert_eq!(
        cache.load_layer(2, &[PagePair::new(0, 0)]),
        Err(layer_2.clone())
    );
    assert_eq!(cache.backup_layer(2, &[PagePair::new(0, 0)]), Err(layer_2));
    assert!(snapshots(&cache) == before);
}

#[test]
fn cpu_out_of_range_pages_refused_with_both_pools_unchanged() {
    out_of_range_refused(CpuBackend);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored on the device machine"]
fn gpu_out_of_range_pages_refused_with_both_pools_unchanged() {
    let Some(cuda) = gpu("gpu_out_of_range_pages_refused_with_both_pools_unchanged") else {
        return;
    };
    out_of_range_refused(cuda);
}

/// Runs handed straight to the backend (no shim): the backend's own check refuses a list with
/// one bad run and moves nothing. On the GPU this is the copy kernel's check: in the copy
/// launch for up to 4096 runs, in a separate validation launch above that.
fn bad_runs_refused<B: Backend>(backend: B) {
    // 5000 blocks of 16 B = 80,000 B per side.
    const BLOCKS: u64 = 5000;
    const LEN: u64 = BLOCKS * 16;
    let mut device = backend.alloc_device(LEN).unwrap();
    let mut host = backend.alloc_host(LEN).unwrap();
    let src = random_bytes(21, LEN as usize);
    backend.write_device(&mut device, 0, &src).unwrap();
    backend
        .write_host(&mut host, 0, &vec![POISON; LEN as usize])
        .unwrap();
    let read_host = |host: &B::HostMem| {
        let mut out = vec![0u8; LEN as usize];
        backend.read_host(host, 0, &mut out).unwrap();
        out
    };
    // Block i of the device to block 4999 - i of the host (5000 runs: validation launch).
    let reversed: Vec<CopyRun> = (0..BLOCKS)
        .map(|i| CopyRun {
            src_offset_bytes: i * 16,
            dst_offset_bytes: (BLOCKS - 1 - i) * 16,
            len_bytes: 16,
        })
        .collect();
    let mut bad = reversed.clone();
    // The last run's destination 79,992 + 16 = 80,008 > 80,000.
    bad[4999].dst_offset_bytes = 79_992;
    assert_eq!(
        backend
            .device_to_host(&device, &mut host, &bad)
            .unwrap_err(),
        BackendError::OutOfRange {
            side: "host",
            start_bytes: 79_992,
            end_bytes: 80_008,
            len_bytes: 80_000
        }
    );
    assert!(read_host(&host) == vec![POISON; LEN as usize]);
    // Two runs (checked inside the copy launch); the second reads device bytes 79,990..80,006.
    let short = [
        CopyRun {
            src_offset_bytes: 0,
            dst_offset_bytes: 0,
            len_bytes: 16,
        },
        CopyRun {
            src_offset_bytes: 79_990,
            dst_offset_bytes: 16,
            len_bytes: 16,
        },
    ];
    assert_eq!(
        backend
            .device_to_host(&device, &mut host, &short)
            .unwrap_err(),
        BackendError::OutOfRange {
            side: "device",
            start_bytes: 79_990,
            end_bytes: 80_006,
            len_bytes: 80_000
        }
    );
    assert!(read_host(&host) == vec![POISON; LEN as usize]);
    // The good list: host block j holds device block 4999 - j.
    backend
        .device_to_host(&device, &mut host, &reversed)
        .unwrap();
    let got = read_host(&host);
    for j in [0usize, 1, 2500, 4999] {
        let i = 4999 - j;
        assert_eq!(
            got[j * 16..j * 16 + 16],
            src[i * 16..i * 16 + 16],
            "block {j}"
        );
    }
    for j in 0..BLOCKS as usize {
        let i = BLOCKS as usize - 1 - j;
        assert!(got[j * 16..j * 16 + 16] == src[i * 16..i * 16 + 16]);
    }
    // And back: a load with a bad source run (host 80,000 + 1) moves nothing on the device.
    let mut device2 = backend.alloc_device(LEN).unwrap();
    backend
        .write_device(&mut device2, 0, &vec![POISON; LEN as usize])
        .unwrap();
    let load_bad = [CopyRun {
        src_offset_bytes: 80_000,
        dst_offset_bytes: 0,
        len_bytes: 1,
    }];
    assert_eq!(
        backend
            .host_to_device(&host, &mut device2, &load_bad)
            .unwrap_err(),
        BackendError::OutOfRange {
            side: "host",
            start_bytes: 80_000,
            end_bytes: 80_001,
            len_bytes: 80_000
        }
    );
    let mut dev_bytes = vec![0u8; LEN as usize];
    backend.read_device(&device2, 0, &mut dev_bytes).unwrap();
    assert!(dev_bytes == vec![POISON; LEN as usize]);
    // The good reversed list loaded back restores the original device bytes.
    let back: Vec<CopyRun> = reversed
        .iter()
        .map(|r| CopyRun {
            src_offset_bytes: r.dst_offset_bytes,
            dst_offset_bytes: r.src_offset_bytes,
            len_bytes: r.len_bytes,
        })
        .collect();
    backend.host_to_device(&host, &mut device2, &back).unwrap();
    backend.read_device(&device2, 0, &mut dev_bytes).unwrap();
    assert!(dev_bytes == src);
}

#[test]
fn cpu_backend_refuses_a_bad_run_list_and_moves_nothing() {
    bad_runs_refused(CpuBackend);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored on the device machine"]
fn gpu_kernel_refuses_a_bad_run_list_and_moves_nothing() {
    let Some(cuda) = gpu("gpu_kernel_refuses_a_bad_run_list_and_moves_nothing") else {
        return;
    };
    bad_runs_refused(cuda);
}

fn fp8_formula_host() -> HostSource {
    let text = include_str!("../../configs/geometry/host-index-k-fp8-formula.json");
    HostSource::Foreign {
        geometry: file::from_json(text).unwrap(),
        source: "configs/geometry/host-index-k-fp8-formula.json".into(),
    }
}

/// `tests/replay.rs`'s small workload (8 sessions, 2 layers, 14 device pages).
fn replay_on<B: Backend>(
    backend: B,
    index_k: IndexK,
    host: HostSource,
    verify: bool,
) -> ReplayOutcome {
    let input = ReplayInput {
        model: Model::builtin("deepseek-v3.2-exp").unwrap().unwrap(),
        pool: PoolOptions {
            index_k,
            ..PoolOptions::default()
        },
        host,
        verify,
        workload: Workload {
            sessions: 8,
            layers: 2,
            turns: 3,
            prefix_groups: 2,
            concurrency: 2,
            device_pages: 14,
            decode_tokens: 4,
            indexer_heads: 2,
            ..Workload::default()
        },
    };
    replay::run_with(backend, &input, &mut |_, _| {}).unwrap()
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored on the device machine"]
fn gpu_replay_gives_the_four_expected_outcomes_and_the_cpu_report() {
    let Some(cuda) = gpu("gpu_replay_gives_the_four_expected_outcomes_and_the_cpu_report") else {
        return;
    };
    let mirror = || HostSource::Mirror {
        pages: 64,
        memory_layout: MemoryLayout::PageFirst,
    };
    let runs = [
        (IndexK::Bf16, mirror(), true),
        (IndexK::Bf16, fp8_formula_host(), true),
        (IndexK::Bf16, fp8_formula_host(), false),
        (IndexK::Fp8, mirror(), true),
        (IndexK::Fp8, fp8_formula_host(), true),
    ];
    for (i, (index_k, host, verify)) in runs.into_iter().enumerate() {
        let on_gpu = replay_on(cuda.clone(), index_k, host.clone(), verify);
        let on_cpu = replay_on(CpuBackend, index_k, host, verify);
        match (on_gpu, on_cpu) {
            (ReplayOutcome::Completed(g), ReplayOutcome::Completed(c)) => {
                assert_eq!(g, c, "run {i}: the GPU report differs from the CPU's");
                assert!(
                    g.loaded_pages > 0 && g.backed_up_pages > 0,
                    "run {i}: {g:?}"
                );
                // Run 2: the seed bug (bf16 device, fp8-formula host, no checks) corrupts.
                if i == 2 {
                    assert!(g.corrupted_sessions > 0, "{g:?}");
                } else {
                    assert_eq!(g.corrupted_sessions, 0, "run {i}: {g:?}");
                }
            }
            (ReplayOutcome::Refused(g), ReplayOutcome::Refused(c)) => {
                assert_eq!(
                    i, 1,
                    "only the checked bf16 / fp8-formula pairing is refused"
                );
                assert_eq!(g.mismatch, c.mismatch);
                assert!(
                    g.mismatch
                        .contains(&"index_k.page_stride_bytes: 16384, 8448".to_string()),
                    "{:?}",
                    g.mismatch
                );
            }
            (g, c) => panic!("run {i}: GPU {g:?} but CPU {c:?}"),
        }
    }
}

/// Every case: a backup of [`PAIRS`] and a one-layer load back, enqueued and completed once
/// ([`HiCache::enqueue`], [`HiCache::complete`]), leave both pools as the same transfers made
/// one at a time with waits on the CPU backend; a refused enqueue leaves both pools untouched.
fn enqueued_transfers<B: Backend>(backend: B) {
    let load = [PagePair::new(1, 5), PagePair::new(2, 1)];
    for case in cases() {
        let mut split = cache_on(backend.clone(), &case);
        let mut sync = cache_on(CpuBackend, &case);
        fill_random(split.device_writer(), 11);
        fill_random(sync.device_writer(), 11);
        let a = split
            .enqueue(Direction::Backup, Layers::All, &PAIRS)
            .unwrap();
        let b = split
            .enqueue(Direction::Load, Layers::One(1), &load)
            .unwrap();
        assert_eq!(a, sync.backup(&PAIRS).unwrap());
        assert_eq!(b, sync.load_layer(1, &load).unwrap());
        split.complete().unwrap();
        assert_eq!(snapshots(&split), snapshots(&sync), "{:?}", case.layout);
        let before = snapshots(&split);
        let err = split
            .enqueue(
                Direction::Load,
                Layers::All,
                &[PagePair::new(DEVICE_PAGES, 0)],
            )
            .unwrap_err();
        assert!(matches!(err, TransferError::PageOutOfRange { .. }), "{err}");
        split.complete().unwrap();
        assert_eq!(snapshots(&split), before);
    }
}

#[test]
fn cpu_enqueued_transfers_match_waited_ones() {
    enqueued_transfers(CpuBackend);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored on the device machine"]
fn gpu_enqueued_transfers_match_the_cpu_backend() {
    if let Some(cuda) = gpu("gpu_enqueued_transfers_match_the_cpu_backend") {
        enqueued_transfers(cuda);
    }
}

/// Clones of one CUDA backend share one stream, so a paired cache waits once for both pools;
/// two backends opened apart (two streams) do not, and it waits on each (review 3).
#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored on the device machine"]
fn gpu_clones_share_waits_and_separate_backends_do_not() {
    use kvlayout_pool::Backend;
    let (Some(a), Some(b)) = (
        gpu("gpu_clones_share_waits_and_separate_backends_do_not"),
        gpu("gpu_clones_share_waits_and_separate_backends_do_not"),
    ) else {
        return;
    };
    assert!(a.shares_waits_with(&a.clone()));
    assert!(!a.shares_waits_with(&b));
}

/// A pool of page size 1 (SGLang's default for FlashAttention-3 and FlashInfer): K and V
/// buffers of 8 heads x 128 bf16 (2 x 8 x 128 x 2 = 2 x 2,048 B per token and layer), 4
/// layers, `pages` one-token pages, `layer_first` (the device pool).
fn page1() -> PoolGeometry {
    let kv = |name: &'static str| {
        let layout = formats::single(name, kvlayout_core::Dtype::Bf16, vec![8, 128]).unwrap();
        kvlayout_core::BufferGeometry::new(name, 4, layout)
    };
    PoolGeometry {
        name: "page size 1".into(),
        page_size_tokens: 1,
        pages: 500,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![kv("k"), kv("v")],
    }
}

/// 300 pairs of distinct random device (of 500) and host (of 800) pages.
fn page1_pairs() -> Vec<PagePair> {
    let mut device: Vec<u64> = (0..500).collect();
    let mut host: Vec<u64> = (0..800).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |n: usize| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) % n as u64) as usize
    };
    for i in (1..device.len()).rev() {
        device.swap(i, next(i + 1));
    }
    for i in (1..host.len()).rev() {
        host.swap(i, next(i + 1));
    }
    (0..300)
        .map(|i| PagePair::new(device[i], host[i]))
        .collect()
}

/// Page size 1 through the pools: a load layer by layer and a backup of all layers (2,048 B
/// token runs: the token kernel, paced on a carve-out) on `backend`; both pools after
/// each step.
fn page1_transfers<B: Backend>(backend: B) -> Vec<(Vec<u8>, Vec<u8>)> {
    let device = DevicePool::new_in(backend, page1()).unwrap();
    let host = HostPool::mirror_of(&device, 800, MemoryLayout::PageFirst).unwrap();
    let mut cache = HiCache::pair(device, host).unwrap();
    fill_random(cache.host_writer(), 25);
    poison(cache.device_writer());
    let pairs = page1_pairs();
    let mut steps = Vec::new();
    for layer in 0..4 {
        assert_eq!(cache.load_layer(layer, &pairs).unwrap().pairs, 300);
        steps.push(snapshots(&cache));
    }
    // Back up every layer to other host pages (the pairs' host pages shifted by one page).
    fill_random(cache.device_writer(), 26);
    poison(cache.host_writer());
    let back: Vec<PagePair> = pairs
        .iter()
        .map(|p| PagePair::new(p.device_page, (p.host_page + 1) % 800))
        .collect();
    assert_eq!(cache.backup(&back).unwrap().pairs, 300);
    steps.push(snapshots(&cache));
    steps
}

#[test]
fn cpu_page_size_1_loads_and_backups_move_every_token() {
    let steps = page1_transfers(CpuBackend);
    // After the last layer's load, device page d of layer l holds host page h's bytes for each
    // pair (host page_first: page h, layer l of buffer k at (h x 4 + l) x 2,048).
    let (device, host) = &steps[3];
    let p = page1_pairs()[0];
    let g = page1();
    for (b, l) in [(0usize, 0u64), (1, 3)] {
        let d = g.page_offset_bytes(b, l, p.device_page).unwrap() as usize;
        let buffer_base = b * 800 * 4 * 2048;
        let h = buffer_base + ((p.host_page * 4 + l) * 2048) as usize;
        assert_eq!(device[d..d + 2048], host[h..h + 2048]);
        assert!(device[d..d + 2048].iter().all(|&v| v != POISON));
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored on the device machine"]
fn gpu_page_size_1_loads_and_backups_match_the_cpu_backend() {
    let Some(cuda) = gpu("gpu_page_size_1_loads_and_backups_match_the_cpu_backend") else {
        return;
    };
    let want = page1_transfers(CpuBackend);
    assert!(page1_transfers(cuda.clone()) == want, "no carve-out");
    cuda.gpu().set_model_carveout_sms(2).unwrap();
    assert!(page1_transfers(cuda.clone()) == want, "carve-out of 2 SMs");
    cuda.gpu().set_model_carveout_sms(0).unwrap();
}
