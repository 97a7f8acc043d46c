//! Unit tests of the pairing and the transfer path, with private access: pools swapped and
//! routes corrupted inside the crate, which the public API cannot do.

use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, TokenLayout, formats};

use super::*;
use crate::backend::{BackendError, CpuMem, check_runs, copy_runs};
use crate::error::PoolFact;
use crate::shim::CHECKS_COMPILED;

fn index_k(layout: TokenLayout, pages: u64) -> PoolGeometry {
    PoolGeometry {
        name: "unit".into(),
        page_size_tokens: 64,
        pages,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![BufferGeometry::new("index_k", 2, layout)],
    }
}

fn cache() -> HiCache {
    let device = DevicePool::new(index_k(formats::INDEX_K_FP8, 4)).unwrap();
    let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
    HiCache::pair(device, host).unwrap()
}

/// The seed bug through a swapped pool. The public API cannot swap a
/// paired pool (the `compile_fail` examples on [`HiCache`]); inside the crate it can, and
/// the per-transfer identity check refuses the transfer before a byte moves: an fp8
/// index-K device pool (132 B/token) replaced by a bf16 one (256 B/token) of the same page
/// count. With the opt-out feature `unchecked` the check is compiled out and the routes
/// laid for 132 B/token move one page of both layers, 2 x 64 x 132 = 16,896 B, into the
/// 256 B/token pool: what the opt-out gives up, asserted so that both builds are tested.
#[test]
fn a_swapped_device_pool_of_another_geometry_is_refused_by_transfer() {
    let mut c = cache();
    let bf16 = DevicePool::new(index_k(formats::INDEX_K_BF16, 4)).unwrap();
    let (fp8_print, bf16_print) = (c.device.fingerprint(), bf16.fingerprint());
    assert_ne!(fp8_print, bf16_print);
    c.device = bf16;
    let before = c.device().snapshot().unwrap();
    let result = c.load(&[PagePair::new(1, 0)]);
    if CHECKS_COMPILED {
        assert_eq!(
            result,
            Err(TransferError::PoolChanged {
                side: "device",
                fact: PoolFact::Fingerprint,
                paired: fp8_print,
                actual: bf16_print,
            })
        );
        assert_eq!(c.device().snapshot().unwrap(), before);
        assert_eq!(c.stats().refused, 1);
        assert_eq!(
            c.check(Direction::Load, Layers::All, &[PagePair::new(1, 0)]),
            result.map(|_| ())
        );
    } else {
        assert_eq!(result.unwrap().bytes, 2 * 64 * 132);
    }
}

/// A swapped pool, second case: a same-geometry device pool with fewer pages (the fingerprint does
/// not cover `pages`) is refused by the shim's check, naming the page counts — not by the
/// backend. Unchecked, device page 3 passes the page check (the routes say 4 pages): its
/// layer-0 run, at 3 x 8,448 = 25,344, lands inside the 2-page region (2 layers x 2 pages x
/// 8,448 B = 33,792 B: on its layer 1, page 1), and only the layer-1 run, at the routes'
/// 4-page layer step 4 x 8,448 + 25,344 = 59,136, leaves it; the backend checks every run
/// before it copies, so nothing moves here — by luck of the numbers, not by a check.
#[test]
fn a_swapped_device_pool_with_fewer_pages_is_refused_by_the_shim() {
    let mut c = cache();
    c.device = DevicePool::new(index_k(formats::INDEX_K_FP8, 2)).unwrap();
    let pairs = [PagePair::new(3, 0)];
    let err = c.load(&pairs).unwrap_err();
    if CHECKS_COMPILED {
        let want = TransferError::PoolChanged {
            side: "device",
            fact: PoolFact::Pages,
            paired: 4,
            actual: 2,
        };
        assert_eq!(err, want);
        assert_eq!(err.to_string(), "device pool pages: 4 at pairing, 2 now");
        assert_eq!(c.check(Direction::Load, Layers::All, &pairs), Err(want));
    } else {
        assert_eq!(
            err,
            TransferError::Backend(BackendError::OutOfRange {
                side: "device",
                start_bytes: 59_136,
                end_bytes: 67_584,
                len_bytes: 33_792,
            })
        );
    }
    assert_eq!(c.device().snapshot().unwrap(), vec![0u8; 33_792]);
}

/// A host pool of the same geometry and pages but another region length cannot be built
/// through the API; a region cut short inside the crate is refused naming the lengths:
/// 6 pages x 2 layers x 8,448 B = 101,376 B at pairing.
#[test]
fn a_host_region_of_another_length_is_refused_naming_both_lengths() {
    let mut c = cache();
    c.host.memory_mut().truncate(50_000);
    // Host page 5 (`page_first`) of layer 0 starts at 5 x 2 x 8,448 = 84,480 > 50,000.
    let err = c.backup(&[PagePair::new(0, 5)]).unwrap_err();
    if CHECKS_COMPILED {
        assert_eq!(
            err.to_string(),
            "host pool len_bytes: 101376 at pairing, 50000 now"
        );
    } else {
        assert!(matches!(err, TransferError::Backend(_)), "{err}");
    }
}

/// The per-pair range check through `transfer`: routes corrupted inside the crate (the
/// host base of the buffer shifted by 6 pages x 2 layers x 8,448 = 101,376 B, the whole
/// region) are refused before a byte moves. Host page 0 of layer 1 (`page_first`) then
/// starts at 101,376 + 8,448 = 109,824 and ends at 118,272.
#[test]
fn corrupted_routes_are_refused_by_transfer_before_a_byte_moves() {
    let mut c = cache();
    c.routes.as_mut().unwrap().shift_host_base(0, 101_376);
    let err = c.backup(&[PagePair::new(0, 0)]).unwrap_err();
    if CHECKS_COMPILED {
        assert_eq!(
            err.to_string(),
            "pairs[0] index_k: host range [109824, 118272) outside the 101376-byte host \
             region"
        );
    } else {
        assert!(matches!(err, TransferError::Backend(_)), "{err}");
    }
    assert_eq!(c.host().snapshot().unwrap(), vec![0u8; 101_376]);
}

/// Regression: with the checks compiled out a page out of range used to surface as a bare
/// geometry error ("pages: page 9 out of range (4 pages)"), naming neither the pair nor
/// the side. Index checks are on in every build; this test runs in both (`cargo test -p
/// kvlayout-pool` and `--features unchecked`).
#[test]
fn a_page_out_of_range_names_pair_and_side_with_or_without_the_checks() {
    let mut c = cache();
    let err = c
        .load(&[PagePair::new(0, 0), PagePair::new(9, 1)])
        .unwrap_err();
    assert_eq!(
        err,
        TransferError::PageOutOfRange {
            pair: 1,
            side: "device",
            page: 9,
            pages: 4
        }
    );
    assert_eq!(c.device().snapshot().unwrap(), vec![0u8; 2 * 4 * 8448]);
}

/// A fault in the second chunk of a transfer: the first chunk's pairs and the second
/// chunk's completed pairs are reported moved, the rest untouched.
///
/// MHA bf16 8 heads x 128 (`section_major`: the K plane, then the V plane, each
/// 64 x 8 x 256 B) onto a `page_head` host (`[page][head][layer][token][K_h V_h]`, rows of
/// 2 x 256 = 512 B): no two pieces are contiguous on both sides, so a page of one layer is
/// 8 heads x 64 tokens x 2 sections = 1024 runs, and a chunk of 65,536 runs holds 64
/// pairs. 70 pairs = 71,680 runs: chunk 1 = pairs 0..64, chunk 2 = pairs 64..70 (6,144
/// runs). A budget of 65,536 + 2 x 1,024 + 100 = 67,684 runs: pairs 0..66 move, pair 66
/// moves its first 100 runs (head 0, tokens 0..50, K and V: the first 50 x 512 = 25,600 B
/// of the host page), pairs 67..70 nothing.
#[test]
fn a_fault_in_a_later_chunk_reports_every_pair_moved_before_it() {
    use crate::backend::FailingCpuBackend;
    let g = |m| PoolGeometry {
        name: "mha".into(),
        page_size_tokens: 64,
        pages: 70,
        memory_layout: m,
        buffers: vec![BufferGeometry::new("kv", 1, formats::MHA_BF16_8X128)],
    };
    let page_bytes = 262_144usize; // 64 tokens x 4096 B
    let make = |backend: FailingCpuBackend| {
        let mut device = DevicePool::new_in(backend.clone(), g(MemoryLayout::LayerFirst)).unwrap();
        let fill: Vec<u8> = (0..70 * page_bytes).map(|i| (i % 251) as u8 + 1).collect();
        device.write_bytes(0, &fill).unwrap();
        let host = HostPool::from_geometry_in(backend, g(MemoryLayout::PageHead)).unwrap();
        HiCache::pair(device, host).unwrap()
    };
    let pairs: Vec<PagePair> = (0..70).map(|p| PagePair::new(p, p)).collect();
    let mut full = make(CpuBackend::failing_after(u64::MAX));
    assert_eq!(
        full.dry_run(Direction::Backup, Layers::All, &pairs)
            .unwrap()
            .runs,
        71_680
    );
    full.backup(&pairs).unwrap();
    let want = full.host().snapshot().unwrap();

    let mut c = make(CpuBackend::failing_after(67_684));
    let err = c.backup(&pairs).unwrap_err();
    let TransferError::Interrupted {
        moved_pairs,
        torn_pair,
        moved_runs,
        source,
    } = err
    else {
        panic!("{err}")
    };
    assert_eq!(moved_pairs, pairs[..66]);
    assert_eq!(torn_pair, Some(PagePair::new(66, 66)));
    assert_eq!(moved_runs, 67_684);
    assert!(matches!(
        source,
        BackendError::Interrupted {
            completed_runs: 2_148,
            total_runs: 6_144,
            ..
        }
    ));
    let got = c.host().snapshot().unwrap();
    let page = |m: &[u8], p: usize| m[p * page_bytes..(p + 1) * page_bytes].to_vec();
    for p in 0..66 {
        assert!(page(&got, p) == page(&want, p), "host page {p}");
    }
    let torn = page(&got, 66);
    assert!(torn[..25_600] == page(&want, 66)[..25_600]);
    assert!(torn[25_600..].iter().all(|&b| b == 0));
    assert!(got[67 * page_bytes..].iter().all(|&b| b == 0));
}

/// Regression: an empty list used to count as a backup call in the stats, which count
/// calls that moved data.
#[test]
fn an_empty_list_is_not_counted() {
    let mut c = cache();
    assert_eq!(c.backup(&[]).unwrap().bytes, 0);
    assert_eq!(c.stats(), TransferStats::default());
    // One page of both layers of fp8 index-K: 2 x 64 x 132 = 16,896 B.
    assert_eq!(c.backup(&[PagePair::new(1, 5)]).unwrap().bytes, 16_896);
    assert_eq!((c.stats().backups, c.stats().backed_up_bytes), (1, 16_896));
}

// ---- The enqueue / complete split (issue 11, item 4) ----

/// A cache of 4 device and 6 host pages (fp8 index-K, 2 layers: 64 x 132 = 8,448 B per page
/// per layer) with every device byte `1 + i % 251` and every host byte 0.
fn filled_cache<B: Backend>(backend: B) -> HiCache<B> {
    let device = DevicePool::new_in(backend, index_k(formats::INDEX_K_FP8, 4)).unwrap();
    let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
    let mut c = HiCache::pair(device, host).unwrap();
    let len = c.device().len_bytes() as usize;
    let bytes: Vec<u8> = (0..len).map(|i| 1 + (i % 251) as u8).collect();
    c.device_writer().write_bytes(0, &bytes).unwrap();
    c
}

fn both(c: &HiCache<impl Backend>) -> (Vec<u8>, Vec<u8>) {
    (c.device().snapshot().unwrap(), c.host().snapshot().unwrap())
}

const PAGE_LAYER_BYTES: u64 = 64 * 132;

#[test]
fn enqueue_then_complete_moves_what_transfer_moves() {
    let pairs = [PagePair::new(3, 5), PagePair::new(0, 1)];
    let back = [PagePair::new(2, 5), PagePair::new(1, 1)];
    let mut sync = filled_cache(CpuBackend);
    let mut split = filled_cache(CpuBackend);
    let a = sync.backup(&pairs).unwrap();
    let b = split
        .enqueue(Direction::Backup, Layers::All, &pairs)
        .unwrap();
    assert_eq!(a, b);
    // 2 pairs x 2 layers x 8,448 B.
    assert_eq!(b.bytes, 2 * 2 * PAGE_LAYER_BYTES);
    let a = sync.load_layer(1, &back).unwrap();
    let b = split
        .enqueue(Direction::Load, Layers::One(1), &back)
        .unwrap();
    assert_eq!(a, b);
    split.complete().unwrap();
    assert_eq!(both(&sync), both(&split));
    assert_eq!(sync.stats(), split.stats());
    // Device page 2, layer 1 now holds what device page 3, layer 1 held (layer_first:
    // layer 1 page p at (4 + p) x 8,448), read from the pool independently of the routes.
    let (device, _) = both(&split);
    let at = |p: u64| ((4 + p) * PAGE_LAYER_BYTES) as usize;
    let n = PAGE_LAYER_BYTES as usize;
    let want: Vec<u8> = (at(3)..at(3) + n).map(|i| 1 + (i % 251) as u8).collect();
    assert_eq!(device[at(2)..at(2) + n], want[..]);
}

#[test]
fn a_refused_enqueue_leaves_both_pools_untouched_and_errs_as_transfer() {
    let mut sync = filled_cache(CpuBackend);
    let mut split = filled_cache(CpuBackend);
    let before = both(&split);
    // Host page 6 of 6 is out of range; the destination page 1 twice is refused too.
    for pairs in [
        vec![PagePair::new(0, 0), PagePair::new(1, 6)],
        vec![PagePair::new(0, 1), PagePair::new(2, 1)],
    ] {
        let want = sync.backup(&pairs).unwrap_err();
        let got = split
            .enqueue(Direction::Backup, Layers::All, &pairs)
            .unwrap_err();
        assert_eq!(got.to_string(), want.to_string());
        split.complete().unwrap();
        assert_eq!(both(&split), before);
    }
    let err = split
        .enqueue(Direction::Load, Layers::One(2), &[PagePair::new(0, 0)])
        .unwrap_err();
    assert!(
        matches!(
            err,
            TransferError::Layer {
                layer: 2,
                layers: 2
            }
        ),
        "{err}"
    );
    assert_eq!(both(&split), before);
    assert_eq!(split.stats().refused, 3);
    assert_eq!(
        split.stats(),
        TransferStats {
            refused: 3,
            ..sync.stats()
        }
    );
}

#[test]
fn a_failing_backend_reports_an_enqueue_as_a_transfer_and_moves_nothing() {
    // A budget of 0 runs: the first copy fails before moving a byte.
    let mut sync = filled_cache(CpuBackend::failing_after(0));
    let mut split = filled_cache(CpuBackend::failing_after(0));
    let before = both(&split);
    let pairs = [PagePair::new(1, 2)];
    let want = sync.backup(&pairs).unwrap_err();
    let got = split
        .enqueue(Direction::Backup, Layers::All, &pairs)
        .unwrap_err();
    assert_eq!(got, want);
    assert!(
        matches!(got, TransferError::Interrupted { moved_runs: 0, ref moved_pairs, .. } if moved_pairs.is_empty()),
        "{got}"
    );
    split.complete().unwrap();
    assert_eq!(both(&split), before);
    assert_eq!(split.stats().interrupted, 1);
}

#[test]
fn enqueue_needs_a_checked_pairing() {
    let device = DevicePool::new(index_k(formats::INDEX_K_FP8, 4)).unwrap();
    let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
    let mut c = HiCache::pair_unverified(device, host);
    let err = c
        .enqueue(Direction::Load, Layers::All, &[PagePair::new(0, 0)])
        .unwrap_err();
    assert!(matches!(err, TransferError::Unsupported { .. }), "{err}");
}

#[test]
fn staged_writes_and_reads_are_checked_before_a_byte_moves() {
    let mut c = filled_cache(CpuBackend);
    let before = both(&c);
    let staging = CpuMem::from(&vec![9u8; 2 * PAGE_LAYER_BYTES as usize][..]);
    // Device page 3, layer 0 from the staging's second page (layer_first: at 3 x 8,448).
    let runs = crate::page_copy_runs(c.device().geometry(), 0, 0, 3, PAGE_LAYER_BYTES).unwrap();
    assert_eq!(
        runs,
        [CopyRun {
            src_offset_bytes: PAGE_LAYER_BYTES,
            dst_offset_bytes: 3 * PAGE_LAYER_BYTES,
            len_bytes: PAGE_LAYER_BYTES,
        }]
    );
    // One run past the staging's end: refused, nothing written.
    let bad = [
        runs[0],
        CopyRun {
            src_offset_bytes: PAGE_LAYER_BYTES + 1,
            ..runs[0]
        },
    ];
    let err = c.write_device_runs(&staging, &bad).unwrap_err();
    assert_eq!(
        err,
        BackendError::OutOfRange {
            side: "host",
            start_bytes: PAGE_LAYER_BYTES + 1,
            end_bytes: 2 * PAGE_LAYER_BYTES + 1,
            len_bytes: 2 * PAGE_LAYER_BYTES,
        }
    );
    assert_eq!(both(&c), before);
    c.write_device_runs(&staging, &runs).unwrap();
    assert_eq!(
        c.device().read_page(0, 0, 3).unwrap(),
        vec![9; PAGE_LAYER_BYTES as usize]
    );
    // Read it back through a run list; a run past the device region is refused first.
    let mut out = CpuMem::from(&vec![0u8; PAGE_LAYER_BYTES as usize][..]);
    let back = [CopyRun {
        src_offset_bytes: 3 * PAGE_LAYER_BYTES,
        dst_offset_bytes: 0,
        len_bytes: PAGE_LAYER_BYTES,
    }];
    let past = CopyRun {
        src_offset_bytes: 8 * PAGE_LAYER_BYTES,
        ..back[0]
    };
    let err = c.read_device_runs(&mut out, &[past]).unwrap_err();
    assert!(
        matches!(err, BackendError::OutOfRange { side: "device", .. }),
        "{err}"
    );
    assert_eq!(out[..], vec![0; PAGE_LAYER_BYTES as usize]);
    c.read_device_runs(&mut out, &back).unwrap();
    assert_eq!(out[..], vec![9; PAGE_LAYER_BYTES as usize]);
}

/// Regression (hostile review, session 8): `TransferStats::add` panicked in debug (wrapped in
/// release) when a public counter was near `u64::MAX`.
#[test]
fn stats_add_saturates_every_counter() {
    let mut a = TransferStats {
        backups: u64::MAX,
        loads: u64::MAX - 1,
        refused: u64::MAX,
        ..TransferStats::default()
    };
    a.add(TransferStats {
        backups: 1,
        loads: 5,
        refused: 2,
        interrupted: 3,
        ..TransferStats::default()
    });
    assert_eq!(
        (a.backups, a.loads, a.refused, a.interrupted),
        (u64::MAX, u64::MAX, u64::MAX, 3)
    );
}

// ---- Checksums on enqueued transfers (issue 23): verified at the wait, not at enqueue ----

/// A CPU backend whose enqueued copies run only when waited for (released): an enqueue checks
/// its runs and queues them; [`Backend::wait`] copies every queued list, in order. So a test
/// sees whether an enqueue waited (`waits`) and whether its copy ran (`queued`). `stale_next`
/// drops the next queued load at the release (its destination keeps its old bytes: a stale
/// slot).
#[derive(Clone, Default)]
struct Gated(std::sync::Arc<Mutex<GatedState>>);

#[derive(Default)]
struct GatedState {
    /// (direction, source address and length, destination address and length, runs).
    queued: Vec<(Direction, usize, usize, usize, usize, Vec<CopyRun>)>,
    waits: u64,
    stale_next: bool,
}

impl Gated {
    fn state(&self) -> std::sync::MutexGuard<'_, GatedState> {
        self.0.lock().unwrap()
    }

    fn queue(
        &self,
        direction: Direction,
        src: &CpuMem,
        dst: &mut CpuMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        check_runs(direction, src.len() as u64, dst.len() as u64, runs)?;
        let entry = (
            direction,
            src.as_ptr() as usize,
            src.len(),
            dst.as_mut_ptr() as usize,
            dst.len(),
            runs.to_vec(),
        );
        self.state().queued.push(entry);
        Ok(())
    }

    fn waits(&self) -> u64 {
        self.state().waits
    }

    fn queued(&self) -> usize {
        self.state().queued.len()
    }
}

// SAFETY: `wait` runs every queued copy before it returns and calls nothing of the cache; the
// queued regions stay alive and untouched until then (the enqueue contract); a wait on one
// clone runs the copies queued on every clone, in enqueue order.
unsafe impl Backend for Gated {
    type DeviceMem = CpuMem;
    type HostMem = CpuMem;
    fn name(&self) -> &'static str {
        "cpu (gated)"
    }
    fn alloc_device(&self, len_bytes: u64) -> Result<CpuMem, BackendError> {
        CpuBackend.alloc_device(len_bytes)
    }
    fn alloc_host(&self, len_bytes: u64) -> Result<CpuMem, BackendError> {
        CpuBackend.alloc_host(len_bytes)
    }
    fn read_device(&self, mem: &CpuMem, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        CpuBackend.read_device(mem, offset, out)
    }
    fn write_device(&self, mem: &mut CpuMem, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        CpuBackend.write_device(mem, offset, data)
    }
    fn read_host(&self, mem: &CpuMem, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        CpuBackend.read_host(mem, offset, out)
    }
    fn write_host(&self, mem: &mut CpuMem, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        CpuBackend.write_host(mem, offset, data)
    }
    fn device_to_host(
        &self,
        src: &CpuMem,
        dst: &mut CpuMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        CpuBackend.device_to_host(src, dst, runs)
    }
    fn host_to_device(
        &self,
        src: &CpuMem,
        dst: &mut CpuMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        CpuBackend.host_to_device(src, dst, runs)
    }
    unsafe fn enqueue_device_to_host(
        &self,
        src: &CpuMem,
        dst: &mut CpuMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        self.queue(Direction::Backup, src, dst, runs)
    }
    unsafe fn enqueue_host_to_device(
        &self,
        src: &CpuMem,
        dst: &mut CpuMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        self.queue(Direction::Load, src, dst, runs)
    }
    fn wait(&self) -> Result<(), BackendError> {
        let mut state = self.state();
        state.waits += 1;
        for (direction, src, src_len, dst, dst_len, runs) in std::mem::take(&mut state.queued) {
            if direction == Direction::Load && std::mem::take(&mut state.stale_next) {
                continue;
            }
            // SAFETY: the regions outlive the wait and nothing else touches them until it
            // returns (the enqueue contract); the runs were checked against both lengths.
            let (src, dst) = unsafe {
                (
                    std::slice::from_raw_parts(src as *const u8, src_len),
                    std::slice::from_raw_parts_mut(dst as *mut u8, dst_len),
                )
            };
            copy_runs(direction, src, dst, &runs)?;
        }
        Ok(())
    }
}

/// The gated cache of `filled_cache` (device bytes `1 + i % 251`, host zero), checksums on
/// every page, device pages 0..4 backed up to host pages 0..4 (waited for), then device pages
/// 0 and 1 overwritten with 7s (so a load's bytes show).
fn gated_cache() -> (HiCache<Gated>, Gated) {
    let gated = Gated::default();
    let mut c = filled_cache(gated.clone());
    c.set_checksum_mode(ChecksumMode::All).unwrap();
    let pairs: Vec<PagePair> = (0..4).map(|p| PagePair::new(p, p)).collect();
    c.backup(&pairs).unwrap();
    for layer in 0..2 {
        for page in 0..2 {
            c.write_page(0, layer, page, &[7; PAGE_LAYER_BYTES as usize])
                .unwrap();
        }
    }
    (c, gated)
}

#[test]
fn an_enqueued_load_with_checksums_does_not_wait_at_enqueue_and_verifies_at_complete() {
    let (mut c, gated) = gated_cache();
    let waits = gated.waits();
    // Host pages 2 and 3 (device pages 2 and 3's bytes) into device pages 0 and 1.
    let pairs = [PagePair::new(0, 2), PagePair::new(1, 3)];
    let moved = c.enqueue(Direction::Load, Layers::All, &pairs).unwrap();
    assert_eq!(moved.bytes, 2 * 2 * PAGE_LAYER_BYTES);
    // Not blocked: no wait, the copy still queued, nothing verified yet.
    assert_eq!((gated.waits(), gated.queued()), (waits, 1));
    assert_eq!(c.stats().checksummed_pages, 0);
    c.complete().unwrap();
    assert_eq!(gated.queued(), 0);
    // 2 pages x 1 buffer x 2 layers verified, after the copy.
    let s = c.stats();
    assert_eq!((s.checksummed_pages, s.checksum_mismatches), (4, 0));
    // Device page 0, layer 0 holds device page 2's original bytes (layer_first: at 2 x 8,448).
    let at = 2 * PAGE_LAYER_BYTES as usize;
    let want: Vec<u8> = (at..at + PAGE_LAYER_BYTES as usize)
        .map(|i| 1 + (i % 251) as u8)
        .collect();
    assert_eq!(c.device().read_page(0, 0, 0).unwrap(), want);
}

#[test]
fn a_stale_enqueued_load_is_reported_at_complete_naming_its_pages_and_counted() {
    let (mut c, gated) = gated_cache();
    let waits = gated.waits();
    gated.state().stale_next = true;
    let pairs = [PagePair::new(1, 3)];
    c.enqueue(Direction::Load, Layers::All, &pairs).unwrap();
    assert_eq!((gated.waits(), gated.queued()), (waits, 1));
    let err = c.complete().unwrap_err();
    let TransferError::ChecksumMismatch {
        transferred,
        checksummed_pages,
        mismatches,
    } = &err
    else {
        panic!("{err}");
    };
    // The load moved (enqueued) 1 pair x 2 layers; both layers' payloads mismatch: device
    // page 1 kept its 7s.
    assert_eq!(transferred.bytes, 2 * PAGE_LAYER_BYTES);
    assert_eq!(*checksummed_pages, 2);
    assert_eq!(crate::checksum::refused_pairs(mismatches), pairs);
    let m = &mismatches[0];
    assert_eq!(
        (m.buffer.as_str(), m.layer, m.host_page, m.device_page),
        ("index_k", 0, 3, 1)
    );
    let key = c.device().geometry().page_checksum_key(0, 0).unwrap();
    assert_eq!(
        m.loaded,
        key.checksum(&[7; PAGE_LAYER_BYTES as usize]).unwrap()
    );
    let at = 3 * PAGE_LAYER_BYTES as usize;
    let backed_up: Vec<u8> = (at..at + PAGE_LAYER_BYTES as usize)
        .map(|i| 1 + (i % 251) as u8)
        .collect();
    assert_eq!(m.recorded, key.checksum(&backed_up).unwrap());
    let s = c.stats();
    assert_eq!(
        (s.checksummed_pages, s.checksum_mismatches, s.loads),
        (2, 2, 1)
    );
    // Reported once.
    c.complete().unwrap();
}

#[test]
fn an_enqueued_backup_with_checksums_records_at_the_wait() {
    let (mut c, gated) = gated_cache();
    let waits = gated.waits();
    // Device page 0 (7s) backed up to host page 5, enqueued: not waited for.
    c.enqueue(Direction::Backup, Layers::All, &[PagePair::new(0, 5)])
        .unwrap();
    assert_eq!((gated.waits(), gated.queued()), (waits, 1));
    c.complete().unwrap();
    // Loaded back into device page 3: verifies against the 7s' checksum recorded at the wait.
    c.load(&[PagePair::new(3, 5)]).unwrap();
    assert_eq!(c.stats().checksummed_pages, 2);
    assert_eq!(
        c.device().read_page(0, 1, 3).unwrap(),
        vec![7; PAGE_LAYER_BYTES as usize]
    );
}

#[test]
fn an_enqueued_load_into_a_page_still_to_verify_waits_for_it_first() {
    let (mut c, gated) = gated_cache();
    let waits = gated.waits();
    c.enqueue(Direction::Load, Layers::All, &[PagePair::new(0, 2)])
        .unwrap();
    // Another device page: no wait.
    c.enqueue(Direction::Load, Layers::All, &[PagePair::new(1, 3)])
        .unwrap();
    assert_eq!((gated.waits(), gated.queued()), (waits, 2));
    // Device page 0 again: the first two are waited for and verified before it is enqueued
    // (else the first load's verification would read this one's bytes).
    c.enqueue(Direction::Load, Layers::All, &[PagePair::new(0, 3)])
        .unwrap();
    assert!(gated.waits() > waits);
    assert_eq!(gated.queued(), 1);
    assert_eq!(c.stats().checksummed_pages, 4);
    c.complete().unwrap();
    assert_eq!(c.stats().checksummed_pages, 6);
}

/// A `page_unified` host (SGLang 0.5.23 `mem_cache/pool_host/page_unified.py`: `kv_buffer`
/// `(page_num, head_group_num, layer_num, 2, page_size, heads_per_group, head_dim)`) mirrors a
/// `layer_first` device pool of K and V (4 heads x 2 bf16, 3 layers, 2-token pages): after a
/// backup, K[page p, head h, layer l, token t] sits at SGLang's C-order offset
/// `192 p + 96 (h / 2) + 32 l + 8 t + 4 (h % 2)` (V 16 B further; a page is 2 groups x 3
/// layers x 2 x 2 tokens x 8 B), and loading the host pages back into other device pages
/// restores every byte.
#[test]
fn page_unified_host_backs_up_at_sglangs_offsets_and_loads_back() {
    let side = |name: &'static str| TokenLayout {
        arrangement: kvlayout_core::Arrangement::TokenMajor,
        sections: vec![kvlayout_core::Section::owned(
            name,
            kvlayout_core::Dtype::Bf16,
            vec![4, 2],
        )]
        .into(),
        page_align_bytes: None,
        page_stride_bytes: None,
    };
    let device_g = PoolGeometry {
        name: "mha".into(),
        page_size_tokens: 2,
        pages: 6,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![
            BufferGeometry::new("k", 3, side("k")),
            BufferGeometry::new("v", 3, side("v")),
        ],
    };
    let mut device = DevicePool::new(device_g).unwrap();
    // Device: per buffer [layer][page][token][head][dim], 16 B a token, 32 B a page.
    let total = 2 * 3 * 6 * 32;
    let fill: Vec<u8> = (0..total).map(|i| (i % 251) as u8 + 1).collect();
    device.write_bytes(0, &fill).unwrap();
    let unified = MemoryLayout::PageUnified { heads_per_group: 2 };
    let host = HostPool::mirror_of(&device, 5, unified).unwrap();
    let mut c = HiCache::pair(device, host).unwrap();
    let pairs = [
        PagePair::new(0, 4),
        PagePair::new(1, 0),
        PagePair::new(2, 2),
    ];
    c.backup(&pairs).unwrap();
    let host_bytes = c.host().snapshot().unwrap();
    assert_eq!(host_bytes.len(), 5 * 192);
    let dev = |b: usize, l: usize, p: usize, t: usize, h: usize| {
        b * 3 * 6 * 32 + (l * 6 + p) * 32 + t * 16 + h * 4
    };
    for pair in &pairs {
        let (dp, hp) = (pair.device_page as usize, pair.host_page as usize);
        for (b, kv) in [(0usize, 0usize), (1, 16)] {
            for l in 0..3 {
                for t in 0..2 {
                    for h in 0..4 {
                        let at = 192 * hp + 96 * (h / 2) + 32 * l + kv + 8 * t + 4 * (h % 2);
                        let from = dev(b, l, dp, t, h);
                        assert_eq!(
                            host_bytes[at..at + 4],
                            fill[from..from + 4],
                            "b{b} l{l} t{t} h{h}"
                        );
                    }
                }
            }
        }
    }
    // Host pages 1 and 3 were never written.
    assert!(host_bytes[192..2 * 192].iter().all(|&x| x == 0));
    assert!(host_bytes[3 * 192..4 * 192].iter().all(|&x| x == 0));
    // Back into device pages 3, 4, 5: each equals its source page in every layer of K and V.
    c.load(&[
        PagePair::new(3, 4),
        PagePair::new(4, 0),
        PagePair::new(5, 2),
    ])
    .unwrap();
    let back = c.device().snapshot().unwrap();
    for (src, dst) in [(0usize, 3usize), (1, 4), (2, 5)] {
        for b in 0..2 {
            for l in 0..3 {
                let (s, d) = (dev(b, l, src, 0, 0), dev(b, l, dst, 0, 0));
                assert_eq!(back[d..d + 32], fill[s..s + 32], "b{b} l{l} {src} -> {dst}");
            }
        }
    }
}
