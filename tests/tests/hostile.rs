//! Hostile transfers: page lists with duplicates, pages out of range on either side, empty
//! lists, lists of 10^7 pairs and indices near `u64::MAX`; transfers from several threads on
//! disjoint pages; a backend that fails half way.
//!
//! Every refused transfer is checked to leave both pools byte for byte as they were (whole
//! memories compared), every completed or partial one byte for byte against pools built
//! independently with the expected pages.
//!
//! The pool (per-token sizes worked in tests/src/lib.rs): DeepSeek-V3.2 DSA, 64-token pages, 2 layers,
//! `kv` = dsa_mla_fp8 656 B/token -> 64 x 656 = 41,984 B per page per layer, `index_k` =
//! fp8 128 B values + 4 B scale = 132 B/token -> 64 x 132 = 8,448 B per page per layer. One
//! page of both buffers and both layers: 2 x (41,984 + 8,448) = 100,864 B in 4 runs (one per
//! buffer and layer; the host is `page_first`, so a page of one layer is one run).

use std::sync::Arc;

use kvlayout_core::{MemoryLayout, PoolGeometry, formats};
use kvlayout_pool::{
    Backend, BackendError, ConcurrentHiCache, CpuBackend, CpuMem, DevicePool, Direction, HiCache,
    HostPool, KvPool, Layers, PagePair, TransferError, Transferred,
};
use kvlayout_tests::{fill_pool as fill, page_pattern, snapshots};

const LAYERS: u64 = 2;
const DEVICE_PAGES: u64 = 48;
const HOST_PAGES: u64 = 64;
/// 2 layers x (41,984 + 8,448) B.
const PAIR_BYTES: u64 = 100_864;
/// 2 buffers x 2 layers.
const PAIR_RUNS: u64 = 4;

fn dsa(pages: u64) -> PoolGeometry {
    kvlayout_tests::dsa(formats::INDEX_K_FP8, LAYERS, pages)
}

const DEVICE_TAG: u64 = 1;
const HOST_TAG: u64 = 2;

fn cache_on<B: Backend<DeviceMem = CpuMem, HostMem = CpuMem>>(backend: B) -> HiCache<B> {
    let mut device = DevicePool::new_in(backend, dsa(DEVICE_PAGES)).unwrap();
    fill(&mut device, DEVICE_TAG);
    let mut host = HostPool::mirror_of(&device, HOST_PAGES, MemoryLayout::PageFirst).unwrap();
    fill(&mut host, HOST_TAG);
    HiCache::pair(device, host).unwrap()
}

fn cache() -> HiCache {
    cache_on(CpuBackend)
}

/// Asserts `f` is refused with `want` and moves no byte of either pool.
fn refused<B: Backend>(
    cache: &mut HiCache<B>,
    want: TransferError,
    message: &str,
    f: impl FnOnce(&mut HiCache<B>) -> Result<Transferred, TransferError>,
) {
    let before = snapshots(cache);
    let refused_before = cache.stats().refused;
    let err = f(cache).unwrap_err();
    assert_eq!(err, want);
    assert_eq!(err.to_string(), message);
    assert!(snapshots(cache) == before, "a refused transfer moved bytes");
    assert_eq!(cache.stats().refused, refused_before + 1);
}

/// Expected memories built independently: a device pool and a host pool of the same geometry
/// filled with the initial patterns, then `pages` written: `(side, b, l, page, tag, from)` =
/// page `page` of `side` holds pattern `tag`'s page `from`.
type PageSource = (Direction, usize, u64, u64, u64, u64);

fn expected(pages: &[PageSource]) -> (Vec<u8>, Vec<u8>) {
    let mut device = DevicePool::new(dsa(DEVICE_PAGES)).unwrap();
    fill(&mut device, DEVICE_TAG);
    let mut host = HostPool::mirror_of(&device, HOST_PAGES, MemoryLayout::PageFirst).unwrap();
    fill(&mut host, HOST_TAG);
    let g = dsa(DEVICE_PAGES);
    for &(side, b, l, page, tag, from) in pages {
        let data = page_pattern(tag, &g, b, l, from);
        match side {
            // "Load" = the page is on the device side; "Backup" = on the host side.
            Direction::Load => device.write_page(b, l, page, &data).unwrap(),
            Direction::Backup => host.write_page(b, l, page, &data).unwrap(),
        }
    }
    (device.snapshot().unwrap(), host.snapshot().unwrap())
}

/// Every buffer and layer of host page `host` holding device page `device`'s pattern.
fn backed_up(device: u64, host: u64) -> Vec<PageSource> {
    let mut v = Vec::new();
    for b in 0..2 {
        for l in 0..LAYERS {
            v.push((Direction::Backup, b, l, host, DEVICE_TAG, device));
        }
    }
    v
}

// ---------------------------------------------------------------------------------------
// Duplicates

#[test]
fn a_duplicate_destination_is_refused_naming_both_pairs() {
    let mut c = cache();
    refused(
        &mut c,
        TransferError::DuplicateDestination {
            pair: 2,
            first: 0,
            side: "host",
            page: 3,
        },
        "pairs[2]: host page 3 is already the destination of pairs[0]",
        |c| {
            c.backup(&[
                PagePair::new(0, 3),
                PagePair::new(1, 5),
                PagePair::new(2, 3),
            ])
        },
    );
    refused(
        &mut c,
        TransferError::DuplicateDestination {
            pair: 1,
            first: 0,
            side: "device",
            page: 7,
        },
        "pairs[1]: device page 7 is already the destination of pairs[0]",
        |c| c.load_layer(1, &[PagePair::new(7, 0), PagePair::new(7, 1)]),
    );
}

#[test]
fn a_duplicate_destination_in_a_long_list_names_the_earliest_second_pair() {
    // 40 pairs (past the 32-pair direct search: the sorted search). Device destinations are
    // pages 0..40 except pair 37 repeats page 5 (pairs[5]) and pair 39 repeats page 1: the
    // first pair in list order naming a page already named is 37, first named by pair 5.
    let mut pairs: Vec<PagePair> = (0..40).map(|i| PagePair::new(i, i)).collect();
    pairs[37].device_page = 5;
    pairs[39].device_page = 1;
    let mut c = cache();
    refused(
        &mut c,
        TransferError::DuplicateDestination {
            pair: 37,
            first: 5,
            side: "device",
            page: 5,
        },
        "pairs[37]: device page 5 is already the destination of pairs[5]",
        |c| c.load(&pairs),
    );
}

#[test]
fn the_first_problem_in_list_order_is_reported() {
    let mut c = cache();
    // A duplicate (pair 1) before a page out of range (pair 2): the duplicate.
    refused(
        &mut c,
        TransferError::DuplicateDestination {
            pair: 1,
            first: 0,
            side: "host",
            page: 1,
        },
        "pairs[1]: host page 1 is already the destination of pairs[0]",
        |c| {
            c.backup(&[
                PagePair::new(0, 1),
                PagePair::new(1, 1),
                PagePair::new(2, 99),
            ])
        },
    );
    // A page out of range (pair 1) before a duplicate (pair 2): the range.
    refused(
        &mut c,
        TransferError::PageOutOfRange {
            pair: 1,
            side: "host",
            page: 99,
            pages: 64,
        },
        "pairs[1]: host page 99 out of range (host pool has 64 pages)",
        |c| {
            c.backup(&[
                PagePair::new(0, 1),
                PagePair::new(1, 99),
                PagePair::new(2, 1),
            ])
        },
    );
}

/// Decision (documented on `HiCache::transfer`): duplicate *sources* are allowed, as in
/// SGLang — reading a page twice is safe; writing one twice is the race that is refused.
#[test]
fn duplicate_sources_are_allowed_and_copy_the_same_page_twice() {
    let mut c = cache();
    let done = c
        .backup(&[PagePair::new(2, 10), PagePair::new(2, 11)])
        .unwrap();
    // 2 pairs x 4 runs, 2 x 100,864 = 201,728 B.
    assert_eq!(
        done,
        Transferred {
            direction: Direction::Backup,
            layers: Layers::All,
            pairs: 2,
            runs: 2 * PAIR_RUNS,
            bytes: 201_728,
            verified: true,
        }
    );
    assert_eq!(done.bytes, 2 * PAIR_BYTES);
    // Host page 10 loaded into device pages 0 and 1.
    c.load(&[PagePair::new(0, 10), PagePair::new(1, 10)])
        .unwrap();
    let mut want = backed_up(2, 10);
    want.extend(backed_up(2, 11));
    for d in [0, 1] {
        for b in 0..2 {
            for l in 0..LAYERS {
                want.push((Direction::Load, b, l, d, DEVICE_TAG, 2));
            }
        }
    }
    assert!(snapshots(&c) == expected(&want));
}

// ---------------------------------------------------------------------------------------
// Out of range, either side; indices and layers near u64::MAX

#[test]
fn pages_out_of_range_name_the_pair_the_side_and_the_page_count() {
    let mut c = cache();
    refused(
        &mut c,
        TransferError::PageOutOfRange {
            pair: 1,
            side: "device",
            page: 48,
            pages: 48,
        },
        "pairs[1]: device page 48 out of range (device pool has 48 pages)",
        |c| c.backup(&[PagePair::new(0, 0), PagePair::new(48, 1)]),
    );
    refused(
        &mut c,
        TransferError::PageOutOfRange {
            pair: 0,
            side: "host",
            page: 64,
            pages: 64,
        },
        "pairs[0]: host page 64 out of range (host pool has 64 pages)",
        |c| c.load(&[PagePair::new(0, 64)]),
    );
}

#[test]
fn indices_near_u64_max_are_refused_without_wrapping() {
    let mut c = cache();
    // u64::MAX x 41,984 would wrap to a small offset; it must be refused on the index.
    refused(
        &mut c,
        TransferError::PageOutOfRange {
            pair: 0,
            side: "host",
            page: u64::MAX,
            pages: 64,
        },
        "pairs[0]: host page 18446744073709551615 out of range (host pool has 64 pages)",
        |c| c.backup(&[PagePair::new(0, u64::MAX)]),
    );
    refused(
        &mut c,
        TransferError::PageOutOfRange {
            pair: 0,
            side: "device",
            page: u64::MAX - 1,
            pages: 48,
        },
        "pairs[0]: device page 18446744073709551614 out of range (device pool has 48 pages)",
        |c| c.load_layer(0, &[PagePair::new(u64::MAX - 1, 0)]),
    );
    refused(
        &mut c,
        TransferError::Layer {
            layer: u64::MAX,
            layers: 2,
        },
        "layer 18446744073709551615 out of range (the deepest buffer has 2 layers)",
        |c| c.backup_layer(u64::MAX, &[PagePair::new(0, 0)]),
    );
    // The inspection path (the full plan) refuses the same way.
    let err = c
        .plan(
            Direction::Backup,
            Layers::All,
            &[PagePair::new(u64::MAX, 0)],
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pairs[0]: device page 18446744073709551615 out of range (device pool has 48 pages)"
    );
}

// ---------------------------------------------------------------------------------------
// Empty lists

/// Decision: an empty list is a no-op that moves 0 bytes and is not counted, not an error;
/// a bad layer is still refused (it is a bad request whatever the list).
#[test]
fn an_empty_list_is_a_no_op_moving_zero_bytes() {
    let mut c = cache();
    let before = snapshots(&c);
    let done = c.backup(&[]).unwrap();
    assert_eq!(
        done,
        Transferred {
            direction: Direction::Backup,
            layers: Layers::All,
            pairs: 0,
            runs: 0,
            bytes: 0,
            verified: true,
        }
    );
    assert_eq!(c.load_layer(1, &[]).unwrap().bytes, 0);
    assert!(snapshots(&c) == before);
    assert_eq!(c.stats(), Default::default());
    refused(
        &mut c,
        TransferError::Layer {
            layer: 2,
            layers: 2,
        },
        "layer 2 out of range (the deepest buffer has 2 layers)",
        |c| c.load_layer(2, &[]),
    );
}

// ---------------------------------------------------------------------------------------
// Huge lengths

#[test]
fn ten_million_pairs_are_refused_before_any_work_on_the_list() {
    // 10^7 pairs for a 64-page host: some host page is named twice (pigeonhole), so the list
    // is refused on its length alone, before it is scanned or any run is allocated (a plan
    // would hold 4 x 10^7 runs x 24 B = 960 MB).
    let pairs = vec![PagePair::new(0, 0); 10_000_000];
    let mut c = cache();
    refused(
        &mut c,
        TransferError::TooManyPairs {
            pairs: 10_000_000,
            side: "host",
            pages: 64,
        },
        "10000000 pairs for a host pool of 64 pages: a destination page would be named twice",
        |c| c.backup(&pairs),
    );
    refused(
        &mut c,
        TransferError::TooManyPairs {
            pairs: 10_000_000,
            side: "device",
            pages: 48,
        },
        "10000000 pairs for a device pool of 48 pages: a destination page would be named twice",
        |c| c.load_layer(1, &pairs),
    );
    let err = c.plan(Direction::Backup, Layers::All, &pairs).unwrap_err();
    assert!(matches!(err, TransferError::TooManyPairs { pages: 64, .. }));
    // The unverified (legacy) path is bounded the same way.
    let (d, h) = c.into_parts();
    let mut legacy = HiCache::pair_unverified(d, h);
    let before = snapshots(&legacy);
    let err = legacy.backup(&pairs).unwrap_err();
    assert!(matches!(err, TransferError::TooManyPairs { pages: 64, .. }));
    assert!(snapshots(&legacy) == before);
}

#[test]
fn the_unverified_path_refuses_an_overflowing_index_instead_of_wrapping() {
    // The legacy plan (SGLang's unchecked kernel) addresses device page p at
    // layer base + p x item bytes: u64::MAX x 41,984 overflows and must be an error, not a
    // wrapped offset that lands inside the pool.
    let (d, h) = cache().into_parts();
    let mut legacy = HiCache::pair_unverified(d, h);
    let before = snapshots(&legacy);
    let err = legacy.backup(&[PagePair::new(u64::MAX, 0)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "geometry: transfer plan: overflow computing a run offset"
    );
    assert!(snapshots(&legacy) == before);
}

#[test]
fn a_list_as_long_as_the_destination_pool_is_accepted() {
    // 64 pairs onto all 64 host pages (device pages p % 48: sources repeat, destinations do
    // not): 64 x 100,864 = 6,455,296 B in 64 x 4 = 256 runs.
    let pairs: Vec<PagePair> = (0..64).map(|p| PagePair::new(p % 48, p)).collect();
    let mut c = cache();
    let done = c.backup(&pairs).unwrap();
    assert_eq!((done.pairs, done.runs, done.bytes), (64, 256, 6_455_296));
    let want: Vec<PageSource> = (0..64).flat_map(|p| backed_up(p % 48, p)).collect();
    assert!(snapshots(&c) == expected(&want));
    // One more pair is one too many.
    let mut longer = pairs.clone();
    longer.push(PagePair::new(0, 0));
    refused(
        &mut c,
        TransferError::TooManyPairs {
            pairs: 65,
            side: "host",
            pages: 64,
        },
        "65 pairs for a host pool of 64 pages: a destination page would be named twice",
        |c| c.backup(&longer),
    );
}

// ---------------------------------------------------------------------------------------
// Concurrency

const THREADS: u64 = 4;
const ROUNDS: u64 = 12;
const MODEL_TAG: u64 = 100;

/// Thread `t` owns device pages `t + 4k` (k < 12) and host pages `t + 4k` (k < 16):
/// sources S = device {t, t+4, t+8, t+12}, load destinations T = device {16+t, ..., 28+t},
/// model pages M = device {32+t, ..., 44+t}, backup destinations H = host {t, ..., 12+t}.
fn s(t: u64, k: u64) -> u64 {
    t + 4 * k
}
fn tp(t: u64, k: u64) -> u64 {
    16 + t + 4 * k
}
fn m(t: u64, k: u64) -> u64 {
    32 + t + 4 * k
}

#[test]
fn threads_on_disjoint_pages_lose_and_tear_no_page() {
    let shared = Arc::new(ConcurrentHiCache::new(cache()).unwrap());
    let g = dsa(DEVICE_PAGES);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let c = Arc::clone(&shared);
            let g = &g;
            scope.spawn(move || {
                for r in 0..ROUNDS {
                    // Backup, one call per pair: S[k] -> H[(k + r) % 4].
                    for k in 0..4 {
                        c.backup(&[PagePair::new(s(t, k), s(t, (k + r) % 4))])
                            .unwrap();
                    }
                    // Layer-wise load of all four host pages: H[k] -> T[k].
                    let pairs: Vec<PagePair> =
                        (0..4).map(|k| PagePair::new(tp(t, k), s(t, k))).collect();
                    for l in 0..LAYERS {
                        c.load_layer(l, &pairs).unwrap();
                    }
                    // The model writes its pages: pattern MODEL_TAG + r.
                    for k in 0..4 {
                        for b in 0..2 {
                            for l in 0..LAYERS {
                                let data = page_pattern(MODEL_TAG + r, g, b, l, m(t, k));
                                c.write_device_page(b, l, m(t, k), &data).unwrap();
                            }
                        }
                    }
                }
            });
        }
    });
    let c = Arc::try_unwrap(shared).ok().unwrap().into_inner();
    // After the last round (r = 11): H[j] holds S[k] with (k + 11) % 4 = j, k = (j + 1) % 4;
    // T[j] holds H[j]; M[k] holds MODEL_TAG + 11; every other page its initial pattern.
    let last = ROUNDS - 1;
    let mut want = Vec::new();
    for t in 0..THREADS {
        for j in 0..4 {
            let k = (j + 4 - last % 4) % 4;
            want.extend(backed_up(s(t, k), s(t, j)));
            for b in 0..2 {
                for l in 0..LAYERS {
                    want.push((Direction::Load, b, l, tp(t, j), DEVICE_TAG, s(t, k)));
                    want.push((Direction::Load, b, l, m(t, j), MODEL_TAG + last, m(t, j)));
                }
            }
        }
    }
    assert!(snapshots(&c) == expected(&want), "a page was lost or torn");
    // 4 threads x 12 rounds x 4 backups; loads: 4 x 12 x 2 layer calls, pages counted on
    // layer 0 only: 4 x 12 x 4.
    let st = c.stats();
    assert_eq!(
        (st.backups, st.loads, st.loaded_pages, st.refused),
        (192, 96, 192, 0)
    );
    // 192 backups x 100,864 B.
    assert_eq!(st.backed_up_bytes, 192 * PAIR_BYTES);
}

#[test]
fn conflicting_transfers_are_refused_or_serialized_never_torn() {
    // Two threads back up device pages 0 and 1 alternately into host page 0 while a third
    // loads host page 0 into device page 2, all started together: each call either completes
    // or is refused as Busy (nothing moved); host page 0 and device page 2 end whole copies of
    // one source page. (Whether a conflict happens in a given run is up to the scheduler; the
    // claim protocol itself is model-checked under every interleaving with `loom` in
    // kvlayout-pool's `claim` module: RUSTFLAGS="--cfg loom" cargo test -p kvlayout-pool
    // --release loom.)
    let shared = ConcurrentHiCache::new(cache()).unwrap();
    let start = std::sync::Barrier::new(3);
    std::thread::scope(|scope| {
        for src in [0u64, 1] {
            let (c, start) = (&shared, &start);
            scope.spawn(move || {
                start.wait();
                for _ in 0..1000 {
                    match c.backup(&[PagePair::new(src, 0)]) {
                        Ok(_) | Err(TransferError::Busy { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
        let (c, start) = (&shared, &start);
        scope.spawn(move || {
            start.wait();
            for _ in 0..1000 {
                match c.load(&[PagePair::new(2, 0)]) {
                    Ok(_) | Err(TransferError::Busy { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        });
    });
    let calls = shared.stats();
    assert_eq!(calls.backups + calls.loads + calls.refused, 3000);
    let c = shared.into_inner();
    let host0: Vec<Vec<u8>> = (0..2)
        .flat_map(|b| (0..LAYERS).map(move |l| (b, l)))
        .map(|(b, l)| c.host().read_page(b, l, 0).unwrap())
        .collect();
    let whole = |tag, p| -> Vec<Vec<u8>> {
        let g = dsa(DEVICE_PAGES);
        (0..2)
            .flat_map(|b| (0..LAYERS).map(move |l| (b, l)))
            .map(|(b, l)| page_pattern(tag, &g, b, l, p))
            .collect()
    };
    let candidates = [
        whole(HOST_TAG, 0),
        whole(DEVICE_TAG, 0),
        whole(DEVICE_TAG, 1),
    ];
    assert!(candidates.contains(&host0), "host page 0 is torn");
    let dev2: Vec<Vec<u8>> = (0..2)
        .flat_map(|b| (0..LAYERS).map(move |l| (b, l)))
        .map(|(b, l)| c.device().read_page(b, l, 2).unwrap())
        .collect();
    assert!(
        candidates.contains(&dev2) || dev2 == whole(DEVICE_TAG, 2),
        "device page 2 is torn"
    );
}

#[test]
fn an_unverified_cache_cannot_be_shared() {
    let c = cache();
    let (d, h) = c.into_parts();
    let err = ConcurrentHiCache::new(HiCache::pair_unverified(d, h))
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "mode: an unverified pairing cannot be shared (its transfers are not confined to the \
         pages they name); pair with HiCache::pair"
    );
}

// ---------------------------------------------------------------------------------------
// Fault injection

#[test]
fn a_backup_failing_half_way_reports_the_pairs_moved_and_leaves_the_rest_untouched() {
    // Runs execute pair by pair, 4 per pair (kv l0, kv l1, index_k l0, index_k l1). A budget of
    // 10 runs over 4 pairs (16 runs): pairs 0 and 1 move in full (8 runs), pair 2 moves its
    // 2 kv runs and not its index_k runs, pair 3 nothing.
    let backend = CpuBackend::failing_after(10);
    let mut c = cache_on(backend.clone());
    let pairs = [
        PagePair::new(0, 1),
        PagePair::new(1, 2),
        PagePair::new(2, 3),
        PagePair::new(3, 4),
    ];
    let err = c.backup(&pairs).unwrap_err();
    assert_eq!(
        err,
        TransferError::Interrupted {
            moved_pairs: vec![PagePair::new(0, 1), PagePair::new(1, 2)],
            torn_pair: Some(PagePair::new(2, 3)),
            moved_runs: 10,
            source: BackendError::Interrupted {
                completed_runs: 10,
                total_runs: 16,
                reason: "injected fault (FailingCpuBackend)".into(),
            },
        }
    );
    assert_eq!(
        err.to_string(),
        "interrupted after 2 pair(s) moved in full, pair (device 2, host 3) torn: \
         interrupted after 10 of 16 runs: injected fault (FailingCpuBackend)"
    );
    let mut want = backed_up(0, 1);
    want.extend(backed_up(1, 2));
    // Pair 2: kv (buffer 0) layers 0 and 1 only.
    want.push((Direction::Backup, 0, 0, 3, DEVICE_TAG, 2));
    want.push((Direction::Backup, 0, 1, 3, DEVICE_TAG, 2));
    assert!(snapshots(&c) == expected(&want));
    assert_eq!((c.stats().interrupted, c.stats().backups), (1, 0));
    // Repaired: the torn and the untouched pairs again.
    backend.allow(8);
    c.backup(&pairs[2..]).unwrap();
    let mut want = backed_up(0, 1);
    want.extend(backed_up(1, 2));
    want.extend(backed_up(2, 3));
    want.extend(backed_up(3, 4));
    assert!(snapshots(&c) == expected(&want));
}

#[test]
fn a_load_failing_on_a_pair_boundary_tears_nothing() {
    // 8 runs allowed, 3 pairs (12 runs): pairs 0 and 1 in full, no torn pair, pair 2 untouched.
    let mut c = cache_on(CpuBackend::failing_after(8));
    let pairs = [
        PagePair::new(5, 0),
        PagePair::new(6, 1),
        PagePair::new(7, 2),
    ];
    let err = c.load(&pairs).unwrap_err();
    let TransferError::Interrupted {
        moved_pairs,
        torn_pair,
        moved_runs,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(
        (moved_pairs.as_slice(), *torn_pair, *moved_runs),
        (&pairs[..2], None, 8)
    );
    let mut want = Vec::new();
    for (d, h) in [(5, 0), (6, 1)] {
        for b in 0..2 {
            for l in 0..LAYERS {
                want.push((Direction::Load, b, l, d, HOST_TAG, h));
            }
        }
    }
    assert!(snapshots(&c) == expected(&want));
}

#[test]
fn a_failure_before_the_first_run_moves_nothing() {
    let mut c = cache_on(CpuBackend::failing_after(0));
    let before = snapshots(&c);
    let err = c.backup_layer(1, &[PagePair::new(0, 0)]).unwrap_err();
    let TransferError::Interrupted {
        moved_pairs,
        torn_pair,
        moved_runs,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert!(moved_pairs.is_empty() && torn_pair.is_none() && *moved_runs == 0);
    assert!(snapshots(&c) == before);
}
