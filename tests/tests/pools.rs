//! Device and host pools, HiCache backup/load and the shim: the seed regression (bf16 index-K
//! through every host memory layout, the fp8-formula host refused, fp8 unaffected), refused
//! transfers moving no byte, and every host memory layout round-tripping MHA, MLA and DSA.
//!
//! Every expected size is worked by hand in a comment from DESIGN-facts.md.

use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, TokenLayout, file, formats};
use kvlayout_pool::shim::{self, Side};
use kvlayout_pool::{
    DevicePool, Direction, HiCache, HostPool, KvPool, Layers, PagePair, PairError, PoolError,
    TransferError,
};

const PAGE_TOKENS: u64 = 64;

fn geometry(buffers: &[(&'static str, TokenLayout)], layers: u64, pages: u64) -> PoolGeometry {
    PoolGeometry {
        name: "test device".into(),
        page_size_tokens: PAGE_TOKENS,
        pages,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: buffers
            .iter()
            .map(|(n, l)| BufferGeometry::new(*n, layers, l.clone()))
            .collect(),
    }
}

/// DeepSeek-V3.2 DSA pool: `kv` 656 B/token + `index_k` (bf16 256 / fp8 132 B/token).
fn dsa(index_k: TokenLayout, layers: u64, pages: u64) -> PoolGeometry {
    geometry(
        &[("kv", formats::DSA_MLA_FP8), ("index_k", index_k)],
        layers,
        pages,
    )
}

/// A byte pattern unique to (buffer, layer, page, byte), never zero.
fn pattern(b: usize, l: u64, p: u64, i: usize) -> u8 {
    (((b as u64 * 131 + l * 31 + p * 7 + i as u64 * 13) % 251) + 1) as u8
}

fn fill(pool: &mut DevicePool) {
    let g = pool.geometry().clone();
    for (b, buf) in g.buffers.iter().enumerate() {
        let payload = g.page_geometry(b).unwrap().page_payload_bytes as usize;
        for l in 0..buf.layers {
            for p in 0..g.pages {
                let data: Vec<u8> = (0..payload).map(|i| pattern(b, l, p, i)).collect();
                pool.write_page(b, l, p, &data).unwrap();
            }
        }
    }
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
                cache
                    .device_mut()
                    .write_page(b, l, p, &vec![0xee; payload])
                    .unwrap();
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

/// The seed's host geometry (shared case 00 b.json), with its page count cut to 4 so the test
/// allocates 4 x 61 x (41984 + 8448) = 12,305,408 B instead of 4096 pages' 12.6 GB (pages are
/// not compared).
fn fp8_formula_host() -> PoolGeometry {
    let text = include_str!("../../configs/geometry/host-index-k-fp8-formula.json");
    let mut g = file::from_json(text).unwrap();
    assert_eq!(g.pages, 4096);
    g.pages = 4;
    g
}

#[test]
fn seed_fp8_formula_host_refused_at_pairing_with_the_full_mismatch() {
    let device = DevicePool::new(dsa(formats::INDEX_K_BF16, 61, 2)).unwrap();
    let host = HostPool::from_geometry(fp8_formula_host()).unwrap();
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
    let host = HostPool::from_geometry(fp8_formula_host()).unwrap();
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

fn snapshots(cache: &HiCache) -> (Vec<u8>, Vec<u8>) {
    (
        cache.device().snapshot().unwrap(),
        cache.host().snapshot().unwrap(),
    )
}

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
    assert_eq!(cache.stats().bytes_backed_up, 0);
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

#[test]
fn shim_refuses_different_geometries_before_each_transfer() {
    let bf16 = dsa(formats::INDEX_K_BF16, 2, 4);
    let fp8 = dsa(formats::INDEX_K_FP8, 2, 4);
    let (fb, ff) = (bf16.fingerprint().unwrap(), fp8.fingerprint().unwrap());
    let side = |g, fingerprint| Side {
        geometry: g,
        fingerprint,
        len_bytes: u64::MAX,
    };
    let err = shim::checked_plan(
        Direction::Load,
        side(&bf16, fb),
        side(&fp8, ff),
        Layers::All,
        &[PagePair::new(0, 0)],
    )
    .unwrap_err();
    assert_eq!(
        err,
        TransferError::Fingerprint {
            device: fb,
            host: ff
        }
    );
    // Even with a forged equal fingerprint, the per-buffer check names the field and both
    // values: 256 vs 132 bytes per token.
    let err = shim::check_geometry(side(&bf16, fb), side(&fp8, fb)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "index_k.bytes_per_token: device 256, host 132"
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
    let data: Vec<u8> = (0..16_384).map(|i| pattern(0, 1, 2, i)).collect();
    device.pool_mut().write_page(0, 1, 2, &data).unwrap();
    let host = TypedHostPool::mirror_of(&device, 8, MemoryLayout::PageFirstDirect).unwrap();
    // 8 pages x 2 layers x 16384 B.
    assert_eq!(host.pool().len_bytes(), 262_144);
    let mut cache = TypedHiCache::pair(device, host);
    cache.cache().backup(&[PagePair::new(2, 7)]).unwrap();
    cache.cache().load(&[PagePair::new(0, 7)]).unwrap();
    assert_eq!(cache.cache().device().read_page(0, 1, 0).unwrap(), data);
}
