//! Device and host pools, HiCache backup/load and the shim: the seed regression (bf16 index-K
//! through every host memory layout, the fp8-formula host refused, fp8 unaffected), refused
//! transfers moving no byte, and every host memory layout round-tripping MHA, MLA and DSA.
//!
//! Every expected size is worked by hand in a comment (per-token sizes: tests/src/lib.rs).

use kvlayout_core::{Attention, BufferGeometry, MemoryLayout, PoolGeometry, formats};
use kvlayout_pool::shim::{self, Side};
use kvlayout_pool::{
    DevicePool, Direction, HiCache, HostPool, KvPool, Layers, PagePair, PairError, PoolError,
    TransferError,
};
use kvlayout_tests::{PAGE_TOKENS, dsa, fill_pool, fp8_formula_host, pattern, pool as geometry};

fn fill(pool: &mut DevicePool) {
    fill_pool(pool, 0);
}

fn page_bytes(pool: &impl KvPool, b: usize, l: u64, p: u64) -> Vec<u8> {
    pool.read_page(b, l, p).unwrap()
}

/// Backs up device pages 0 and 2 to host pages 5 and 1, scribbles over the device pages,
/// loads host 5 -> device 3 and host 1 -> device 0, and checks every byte of every buffer and
/// layer: device 3 holds what device 0 held, device 0 what device 2 held.
fn round_trip(device_geometry: PoolGeometry, host_layout: MemoryLayout) {
    let mut device = DevicePool::new(device_geometry).unwrap();
    fill(&mut device);
    let g = device.geometry().clone();
    let before: Vec<Vec<Vec<Vec<u8>>>> = (0..g.buffers.len())
        .map(|b| {
            (0..g.buffers[b].layers)
                .map(|l| (0..g.pages).map(|p| page_bytes(&device, b, l, p)).collect())
                .collect()
        })
        .collect();
    let host = HostPool::mirror_of(&device, 8, host_layout).unwrap();
    let mut cache = HiCache::pair(device, host).unwrap();
    cache
        .backup(&[PagePair::new(0, 5), PagePair::new(2, 1)])
        .unwrap();
    // The host holds device 0's bytes at host page 5 (read through the host's own layout).
    for (b, pages_by_layer) in before.iter().enumerate() {
        for (l, pages) in pages_by_layer.iter().enumerate() {
            let l = l as u64;
            assert_eq!(page_bytes(cache.host(), b, l, 5), pages[0]);
            assert_eq!(page_bytes(cache.host(), b, l, 1), pages[2]);
        }
    }
    for b in 0..g.buffers.len() {
        let payload = g.page_geometry(b).unwrap().page_payload_bytes as usize;
        for l in 0..g.buffers[b].layers {
            for p in [0, 2, 3] {
                cache.write_page(b, l, p, &vec![0xee; payload]).unwrap();
            }
        }
    }
    // Load layer by layer, as SGLang's layer-wise load does.
    let pairs = [PagePair::new(3, 5), PagePair::new(0, 1)];
    let deepest = g.buffers.iter().map(|b| b.layers).max().unwrap();
    for l in 0..deepest {
        cache.load_layer(l, &pairs).unwrap();
    }
    for (b, pages_by_layer) in before.iter().enumerate() {
        let name = g.buffers[b].name();
        for (l, pages) in pages_by_layer.iter().enumerate() {
            let l = l as u64;
            assert_eq!(
                page_bytes(cache.device(), b, l, 3),
                pages[0],
                "{name} layer {l} via {host_layout}"
            );
            assert_eq!(
                page_bytes(cache.device(), b, l, 0),
                pages[2],
                "{name} layer {l} via {host_layout}"
            );
            assert_eq!(page_bytes(cache.device(), b, l, 1), pages[1]);
        }
    }
}

const NOT_PAGE_HEAD: [MemoryLayout; 3] = [
    MemoryLayout::LayerFirst,
    MemoryLayout::PageFirst,
    MemoryLayout::PageFirstDirect,
];

#[test]
fn seed_bf16_index_k_round_trips_byte_exact_through_every_host_layout() {
    for layout in NOT_PAGE_HEAD {
        round_trip(dsa(formats::INDEX_K_BF16, 2, 4), layout);
    }
}

#[test]
fn seed_bf16_host_mirror_takes_256_bytes_per_token_from_the_device() {
    let device = DevicePool::new(dsa(formats::INDEX_K_BF16, 2, 4)).unwrap();
    let host = HostPool::mirror_of(&device, 8, MemoryLayout::PageFirst).unwrap();
    let h = host.geometry();
    // index_k: 128 bf16 = 256 B/token, page of 64 = 16384 B (not the fp8 formula's 132 / 8448).
    assert_eq!(h.page_geometry(1).unwrap().bytes_per_token, 256);
    assert_eq!(h.stored_page_bytes(1).unwrap(), 16_384);
    // page_first, buffer regions in order: kv = 8 pages x 2 layers x 64 x 656 (41984) = 671,744;
    // index_k page 5 layer 1 = 671,744 + (5 x 2 + 1) x 16384 = 671,744 + 180,224 = 851,968.
    assert_eq!(h.page_offset_bytes(1, 1, 5).unwrap(), 851_968);
    assert_eq!(host.fingerprint(), device.fingerprint());
    assert!(host.is_mirror());
    // total: 8 x 2 x (41984 + 16384) = 933,888 B.
    assert_eq!(host.len_bytes(), 933_888);
}

#[test]
fn seed_fp8_formula_host_refused_at_pairing_with_the_full_mismatch() {
    let device = DevicePool::new(dsa(formats::INDEX_K_BF16, 61, 2)).unwrap();
    let host = HostPool::from_geometry(fp8_formula_host(4)).unwrap();
    // 4 pages x 61 layers x (41,984 + 8,448) B.
    assert_eq!(host.len_bytes(), 12_305_408);
    let Err(PairError::Mismatch(m)) = HiCache::pair(device, host) else {
        panic!("pairing a bf16 index-K device with the fp8-formula host must be refused");
    };
    let lines: Vec<String> = m.diffs.iter().map(|d| d.to_string()).collect();
    // bf16: 128 x 2 = 256 B/token, 64 x 256 = 16384 B/page; fp8 formula: 128 + 128/128 x 4 =
    // 132 B/token, 64 x 132 = 8448 B/page.
    assert!(
        lines.contains(&"index_k.bytes_per_token: 256, 132".to_string()),
        "{lines:?}"
    );
    assert!(lines.contains(&"index_k.page_stride_bytes: 16384, 8448".to_string()));
    assert!(lines.contains(&"index_k.sections[0].dtype: bf16, f8e4m3".to_string()));
    assert!(
        m.diffs.iter().all(|d| d.field.starts_with("index_k")),
        "{lines:?}"
    );
}

#[test]
fn seed_fp8_index_k_unaffected_with_the_fp8_formula_host() {
    let device = DevicePool::new(dsa(formats::INDEX_K_FP8, 61, 2)).unwrap();
    let mut device = device;
    fill(&mut device);
    let page0_l60 = page_bytes(&device, 1, 60, 0);
    let host = HostPool::from_geometry(fp8_formula_host(4)).unwrap();
    assert!(!host.is_mirror());
    let mut cache = HiCache::pair(device, host).unwrap();
    let plan = cache.backup(&[PagePair::new(0, 3)]).unwrap();
    // 61 layers x (41984 + 8448) = 61 x 50432 = 3,076,352 B.
    assert_eq!(plan.total_bytes(), 3_076_352);
    cache.load(&[PagePair::new(1, 3)]).unwrap();
    assert_eq!(page_bytes(cache.device(), 1, 60, 1), page0_l60);
}

#[test]
fn mha_round_trips_through_every_host_layout_including_page_head() {
    for layout in MemoryLayout::ALL {
        round_trip(geometry(&[("kv", formats::MHA_BF16_8X128)], 3, 4), layout);
        round_trip(geometry(&[("kv", formats::MHA_FP8_8X128)], 3, 4), layout);
    }
}

#[test]
fn mla_and_dsa_round_trip_through_every_host_layout_but_page_head() {
    for layout in NOT_PAGE_HEAD {
        round_trip(geometry(&[("kv", formats::MLA_BF16)], 3, 4), layout);
        round_trip(geometry(&[("kv", formats::MLA_FP8)], 3, 4), layout);
        round_trip(dsa(formats::INDEX_K_FP8, 2, 4), layout);
        round_trip(dsa(formats::INDEX_K_FP4, 2, 4), layout);
    }
}

#[test]
fn page_head_refused_for_mla_buffers() {
    let device = DevicePool::new(dsa(formats::INDEX_K_BF16, 2, 4)).unwrap();
    let err = HostPool::mirror_of(&device, 8, MemoryLayout::PageHead)
        .err()
        .expect("MLA rows are not [heads, dim]");
    let PoolError::Geometry(e) = err else {
        panic!("expected a geometry error, got {err}");
    };
    assert_eq!(e.field, "memory_layout");
    assert!(e.problem.contains("page_head"), "{e}");
}

#[test]
fn page_head_host_places_head_rows_by_hand_worked_offsets() {
    // MHA bf16 8 x 128, 3 layers, host page_head: [page][head][layer][token][head row];
    // head row = k 128 x 2 + v 128 x 2 = 512 B, one head of a page of one layer = 64 x 512 =
    // 32768 B. Host page 1, head 2, layer 1 starts at ((1 x 8 + 2) x 3 + 1) x 32768 = 1,015,808.
    let mut device = DevicePool::new(geometry(&[("kv", formats::MHA_BF16_8X128)], 3, 4)).unwrap();
    fill(&mut device);
    let page = page_bytes(&device, 0, 1, 0);
    let host = HostPool::mirror_of(&device, 2, MemoryLayout::PageHead).unwrap();
    let mut cache = HiCache::pair(device, host).unwrap();
    cache.backup(&[PagePair::new(0, 1)]).unwrap();
    let mut row = vec![0u8; 512];
    cache.host().read_bytes(1_015_808, &mut row).unwrap();
    // Device page (section_major, K plane then V plane): k of token 0 head 2 at 2 x 256 = 512;
    // v of token 0 head 2 at 64 x 2048 + 512 = 131,584.
    assert_eq!(&row[..256], &page[512..768]);
    assert_eq!(&row[256..], &page[131_584..131_840]);
}

fn small_cache() -> HiCache {
    let mut device = DevicePool::new(dsa(formats::INDEX_K_BF16, 2, 4)).unwrap();
    fill(&mut device);
    let mut host = HostPool::mirror_of(&device, 8, MemoryLayout::PageFirst).unwrap();
    let len = host.len_bytes() as usize;
    host.write_bytes(0, &vec![0x5a; len]).unwrap();
    HiCache::pair(device, host).unwrap()
}

use kvlayout_tests::snapshots;

#[test]
fn host_page_out_of_range_refused_and_no_byte_moves() {
    let mut cache = small_cache();
    let before = snapshots(&cache);
    // Pair 0 is valid; pair 1 names host page 8 of 8: nothing may be copied, not even pair 0.
    let err = cache
        .backup(&[PagePair::new(0, 1), PagePair::new(1, 8)])
        .unwrap_err();
    assert_eq!(
        err,
        TransferError::PageOutOfRange {
            pair: 1,
            side: "host",
            page: 8,
            pages: 8
        }
    );
    assert_eq!(
        err.to_string(),
        "pairs[1]: host page 8 out of range (host pool has 8 pages)"
    );
    assert_eq!(snapshots(&cache), before);
    assert_eq!(cache.stats().refused, 1);
    assert_eq!(cache.stats().backed_up_bytes, 0);
}

#[test]
fn device_page_out_of_range_refused_on_load_and_no_byte_moves() {
    let mut cache = small_cache();
    let before = snapshots(&cache);
    let err = cache
        .load(&[PagePair::new(1, 0), PagePair::new(4, 1)])
        .unwrap_err();
    assert_eq!(
        err,
        TransferError::PageOutOfRange {
            pair: 1,
            side: "device",
            page: 4,
            pages: 4
        }
    );
    assert_eq!(snapshots(&cache), before);
}

#[test]
fn duplicate_destination_pages_refused() {
    let mut cache = small_cache();
    let before = snapshots(&cache);
    let err = cache
        .backup(&[PagePair::new(0, 3), PagePair::new(1, 3)])
        .unwrap_err();
    assert_eq!(
        err,
        TransferError::DuplicateDestination {
            pair: 1,
            first: 0,
            side: "host",
            page: 3
        }
    );
    let err = cache
        .load_layer(0, &[PagePair::new(2, 0), PagePair::new(2, 1)])
        .unwrap_err();
    assert_eq!(
        err,
        TransferError::DuplicateDestination {
            pair: 1,
            first: 0,
            side: "device",
            page: 2
        }
    );
    assert_eq!(snapshots(&cache), before);
    // Two sources to distinct destinations are fine: one device page backed up twice.
    cache
        .backup(&[PagePair::new(0, 3), PagePair::new(0, 4)])
        .unwrap();
}

#[test]
fn layer_out_of_range_refused() {
    let mut cache = small_cache();
    let before = snapshots(&cache);
    let err = cache.load_layer(2, &[PagePair::new(0, 0)]).unwrap_err();
    assert_eq!(
        err,
        TransferError::Layer {
            layer: 2,
            layers: 2
        }
    );
    assert_eq!(snapshots(&cache), before);
}

/// The inspection path ([`HiCache::plan`] -> `shim::checked_plan`) compares the geometries
/// field by field. Transfers compare them once, at pairing (seed tests above), and before each
/// transfer re-check that the pools are the paired ones (fingerprint, pages, region length:
/// unit-tested through `transfer` in kvlayout-pool's `hicache` module, since a paired pool
/// cannot be swapped through the public API).
#[test]
fn checked_plan_refuses_different_geometries_naming_the_field() {
    let bf16 = dsa(formats::INDEX_K_BF16, 2, 4);
    let fp8 = dsa(formats::INDEX_K_FP8, 2, 4);
    let side = |g| Side {
        geometry: g,
        len_bytes: u64::MAX,
    };
    let err = shim::checked_plan(
        Direction::Load,
        side(&bf16),
        side(&fp8),
        Layers::All,
        &[PagePair::new(0, 0)],
    )
    .unwrap_err();
    let TransferError::Mismatch(m) = &err else {
        panic!("{err}")
    };
    // bf16 128 x 2 = 256 B/token, fp8 128 + 4 = 132 B/token; pages of 64 tokens.
    assert!(m.names("index_k.bytes_per_token"), "{err}");
    assert!(
        m.lines()
            .contains(&"index_k.page_stride_bytes: 16384, 8448".to_string()),
        "{err}"
    );
}

#[test]
fn unverified_transfer_uses_the_host_item_size_on_both_sides_like_sglang() {
    // Device bf16 index-K (16384 B/page), host sized by the fp8 formula (8448 B/page).
    let device = DevicePool::new(dsa(formats::INDEX_K_BF16, 2, 4)).unwrap();
    let mut hg = dsa(formats::INDEX_K_FP8, 2, 4);
    hg.memory_layout = MemoryLayout::PageFirst;
    let host = HostPool::from_geometry(hg).unwrap();
    let cache = HiCache::pair_unverified(device, host);
    let plan = cache
        .plan(Direction::Load, Layers::One(0), &[PagePair::new(1, 0)])
        .unwrap();
    let ik = &plan.buffers[1];
    assert_eq!(ik.buffer, "index_k");
    assert_eq!(ik.item_bytes, 8448);
    // Device index_k region starts after kv: 2 layers x 4 pages x 41984 = 335,872; SGLang's
    // kernel puts device page 1 at 335,872 + 1 x 8448 = 344,320 (the page really starts at
    // 335,872 + 16384 = 352,256) and copies 8448 of its 16384 bytes.
    assert_eq!(ik.runs.len(), 1);
    assert_eq!(ik.runs[0].dst_offset_bytes, 344_320);
    assert_eq!(ik.runs[0].len_bytes, 8448);
    assert!(!plan.verified);
}

#[test]
fn typed_pools_pair_and_round_trip() {
    use kvlayout_core::formats::IndexKBf16;
    use kvlayout_pool::{TypedDevicePool, TypedHiCache, TypedHostPool};
    let mut device = TypedDevicePool::<IndexKBf16>::new(2, 4, PAGE_TOKENS).unwrap();
    let data: Vec<u8> = (0..16_384).map(|i| pattern(0, 0, 1, 2, i)).collect();
    device.writer().write_page(0, 1, 2, &data).unwrap();
    let host = TypedHostPool::mirror_of(&device, 8, MemoryLayout::PageFirstDirect).unwrap();
    // 8 pages x 2 layers x 16384 B.
    assert_eq!(host.pool().len_bytes(), 262_144);
    let mut cache = TypedHiCache::pair(device, host).unwrap();
    cache.backup(&[PagePair::new(2, 7)]).unwrap();
    // Written through the pairing's handle: the host copy is overwritten on load.
    cache
        .device_writer()
        .write_page(0, 1, 0, &vec![0xee; 16_384])
        .unwrap();
    cache.load(&[PagePair::new(0, 7)]).unwrap();
    assert_eq!(cache.cache().device().read_page(0, 1, 0).unwrap(), data);
}

// ---------------------------------------------------------------------------------------
// Geometry v2 (issue 8, item 5): per-buffer page sizes, windows and state slots.

/// A hybrid pool in the shape of gpt-oss (full + sliding-window layers) and Qwen3-Next (a
/// recurrent state per request), 2 layers:
/// - `full`: MHA bf16 8 x 128 (K and V, 2 x 8 x 128 x 2 = 4,096 B/token), the pool's 64-token
///   pages: 64 x 4,096 = 262,144 B per page;
/// - `swa`: the same layout, a 128-token window, its own 16-token pages: 16 x 4,096 = 65,536 B;
/// - `state`: one slot per request (a page is one slot) holding an MLA bf16 row, 512 + 64 bf16
///   = 1,152 B.
///
/// One pair of both layers: 2 x (262,144 + 65,536 + 1,152) = 657,664 B in 6 runs.
fn hybrid(layer_ids: bool) -> PoolGeometry {
    let mut full = BufferGeometry::new("full", 2, formats::MHA_BF16_8X128);
    let mut swa = BufferGeometry::new("swa", 2, formats::MHA_BF16_8X128)
        .with_page_size_tokens(16)
        .with_attention(Attention::SlidingWindow { window_tokens: 128 });
    if layer_ids {
        full = full.with_layer_ids(vec![1, 3]);
        swa = swa.with_layer_ids(vec![0, 2]);
    }
    let state = BufferGeometry::new("state", 2, formats::MLA_BF16).with_attention(Attention::State);
    let mut g = geometry(&[], 2, 4);
    g.buffers = vec![full, swa, state];
    g
}

#[test]
fn v2_hybrid_pool_round_trips_through_every_host_layout_but_page_head() {
    let g = hybrid(false);
    assert_eq!(g.stored_page_bytes(0).unwrap(), 262_144);
    assert_eq!(g.stored_page_bytes(1).unwrap(), 65_536);
    assert_eq!(g.stored_page_bytes(2).unwrap(), 1_152);
    for layout in NOT_PAGE_HEAD {
        round_trip(hybrid(false), layout);
    }
}

#[test]
fn v2_a_pair_moves_each_buffer_at_its_page_size_and_state_as_whole_slots() {
    let mut device = DevicePool::new(hybrid(false)).unwrap();
    fill(&mut device);
    let slot = device.read_page(2, 1, 3).unwrap();
    let host = HostPool::mirror_of(&device, 8, MemoryLayout::PageFirst).unwrap();
    let mut cache = HiCache::pair(device, host).unwrap();
    let done = cache.backup(&[PagePair::new(3, 6)]).unwrap();
    assert_eq!((done.runs, done.bytes), (6, 657_664));
    assert_eq!(cache.host().read_page(2, 1, 6).unwrap(), slot);
    // One layer: 262,144 + 65,536 + 1,152 = 328,832 B in 3 runs.
    let done = cache.load_layer(1, &[PagePair::new(0, 6)]).unwrap();
    assert_eq!((done.runs, done.bytes), (3, 328_832));
    assert_eq!(cache.device().read_page(2, 1, 0).unwrap(), slot);
    // A state slot holds one token: token 1 of it does not exist.
    let row = [0u8; 1_024];
    let rope = [0u8; 128];
    assert!(cache.write_token(2, 0, 0, 1, &[&row, &rope]).is_err());
    cache.write_token(2, 0, 0, 0, &[&row, &rope]).unwrap();
}

/// With `layer_ids`, a one-layer transfer names a model layer: `full` serves model layers 1
/// and 3, `swa` 0 and 2, `state` (no ids) indices 0 and 1. Model layer 3 is `full`'s second
/// layer alone: one run of 262,144 B; model layer 0 is `swa`'s first and the state slot's
/// first: 65,536 + 1,152 B in 2 runs. A layer no buffer serves moves nothing.
#[test]
fn v2_one_layer_transfers_name_model_layers_where_buffers_give_layer_ids() {
    let mut device = DevicePool::new(hybrid(true)).unwrap();
    fill(&mut device);
    let full_second = device.read_page(0, 1, 0).unwrap();
    let swa_first = device.read_page(1, 0, 0).unwrap();
    let host = HostPool::mirror_of(&device, 8, MemoryLayout::PageFirst).unwrap();
    let mut cache = HiCache::pair(device, host).unwrap();
    let done = cache.backup_layer(3, &[PagePair::new(0, 5)]).unwrap();
    assert_eq!((done.runs, done.bytes), (1, 262_144));
    assert_eq!(cache.host().read_page(0, 1, 5).unwrap(), full_second);
    let done = cache.backup_layer(0, &[PagePair::new(0, 6)]).unwrap();
    assert_eq!((done.runs, done.bytes), (2, 65_536 + 1_152));
    assert_eq!(cache.host().read_page(1, 0, 6).unwrap(), swa_first);
    let before = kvlayout_tests::snapshots(&cache);
    let err = cache.load_layer(4, &[PagePair::new(0, 0)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "layer 4: no buffer serves model layer 4 (the buffers' layer_ids cover 4 layers, 0..=3)"
    );
    assert!(kvlayout_tests::snapshots(&cache) == before);
    assert_eq!(cache.backup(&[PagePair::new(1, 2)]).unwrap().bytes, 657_664);
}

/// `layer_ids` given on one side only are not compared (level `pool`), so the pools pair even
/// though their fingerprints differ; transfers check each pool against its own pairing-time
/// fingerprint, not one side against the other.
#[test]
fn v2_layer_ids_on_one_side_pair_and_transfer_all_layers() {
    let device = DevicePool::new(hybrid(true)).unwrap();
    let mut hg = hybrid(false);
    hg.memory_layout = MemoryLayout::PageFirstDirect;
    let host = HostPool::from_geometry(hg).unwrap();
    assert_ne!(device.fingerprint(), host.fingerprint());
    let mut cache = HiCache::pair(device, host).unwrap();
    assert_eq!(cache.backup(&[PagePair::new(0, 0)]).unwrap().bytes, 657_664);
}

/// Overflowing offsets through a pool: a pool holds only a validated geometry, so a layer count whose
/// byte offsets overflow (`page_head` MHA 8 x 128, 2^61 layers: 2^61 x 64 x 4,096 B is past
/// u64) is refused when the pool is built, never laid out with wrapped offsets.
#[test]
fn a_pool_refuses_a_geometry_whose_offsets_overflow() {
    let mut g = kvlayout_tests::mha_bf16(1 << 61, 2);
    let err = DevicePool::new(g.clone()).err().expect("overflow refused");
    let PoolError::Geometry(e) = &err else {
        panic!("{err}")
    };
    assert!(e.problem.contains("overflow"), "{err}");
    g.memory_layout = MemoryLayout::PageHead;
    assert!(matches!(
        HostPool::from_geometry(g),
        Err(PoolError::Geometry(_))
    ));
}
