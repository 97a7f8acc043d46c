//! Page checksums on a HiCache pairing (`ChecksumMode`): recorded at backup, verified at load;
//! each content-only fault (host page overwritten after backup, short copy, stale destination,
//! a torn backup) and the seed bug with the geometry check off are caught, named and counted.

use kvlayout_core::checksum::page_checksum;
use kvlayout_core::fingerprint::token_hash;
use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};
use kvlayout_pool::checksum::refused_pairs;
use kvlayout_pool::{
    Backend, ChecksumMode, ContentFault, CpuBackend, DevicePool, HiCache, HostPool, KvPool,
    PagePair, TransferError,
};

/// kv: DeepSeek-V3.2 latent, 656 B/token, 64 x 656 = 41,984 B per page; index_k: bf16, 256
/// B/token, 16,384 B per page; 2 layers each, 4 device pages.
fn geometry(index_k: kvlayout_core::TokenLayout, pages: u64) -> PoolGeometry {
    PoolGeometry {
        name: "checksum".into(),
        page_size_tokens: 64,
        pages,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![
            BufferGeometry::new("kv", 2, formats::DSA_MLA_FP8),
            BufferGeometry::new("index_k", 2, index_k),
        ],
    }
}

/// Every device page of every buffer and layer filled with bytes of its own.
fn filled<B: Backend<DeviceMem = kvlayout_pool::CpuMem, HostMem = kvlayout_pool::CpuMem>>(
    backend: B,
    mode: ChecksumMode,
) -> HiCache<B> {
    let device = DevicePool::new_in(backend, geometry(formats::INDEX_K_BF16, 4)).unwrap();
    let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
    let mut cache = HiCache::pair(device, host).unwrap();
    fill(&mut cache, 0);
    cache.set_checksum_mode(mode).unwrap();
    cache
}

fn page_bytes(b: usize, l: u64, p: u64, salt: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ (b as u64 * 7 + l * 13 + p * 29 + salt * 101)) as u8)
        .collect()
}

fn fill<B: Backend>(cache: &mut HiCache<B>, salt: u64) {
    let g = cache.device().geometry().clone();
    for b in 0..2 {
        let len = g.page_geometry(b).unwrap().page_payload_bytes as usize;
        for l in 0..2 {
            for p in 0..4 {
                cache
                    .write_page(b, l, p, &page_bytes(b, l, p, salt, len))
                    .unwrap();
            }
        }
    }
}

#[test]
fn off_by_default_and_a_clean_round_trip_verifies_every_page() {
    let mut cache = filled(CpuBackend, ChecksumMode::Off);
    assert_eq!(cache.checksum_mode(), ChecksumMode::Off);
    cache.backup(&[PagePair::new(1, 5)]).unwrap();
    cache.load(&[PagePair::new(2, 5)]).unwrap();
    assert_eq!(cache.stats().checksummed_pages, 0);

    let mut cache = filled(CpuBackend, ChecksumMode::All);
    cache
        .backup(&[PagePair::new(1, 5), PagePair::new(3, 0)])
        .unwrap();
    // Load both back into other device pages: 2 pages x 2 buffers x 2 layers = 8 payloads.
    fill(&mut cache, 1);
    cache
        .load(&[PagePair::new(0, 5), PagePair::new(2, 0)])
        .unwrap();
    assert_eq!(cache.stats().checksummed_pages, 8);
    assert_eq!(cache.stats().checksum_mismatches, 0);
    // A host page never backed up with a checksum is not verified.
    cache.load(&[PagePair::new(1, 4)]).unwrap();
    assert_eq!(cache.stats().checksummed_pages, 8);
}

#[test]
fn a_host_page_overwritten_after_backup_is_refused_naming_buffer_layer_pages_and_values() {
    let mut cache = filled(CpuBackend::content_faults(), ChecksumMode::All);
    let faults = cache.device().backend().clone();
    cache.backup(&[PagePair::new(3, 2)]).unwrap();
    faults.arm(ContentFault::HostOverwrittenAfterBackup);
    cache.backup(&[PagePair::new(1, 4)]).unwrap();
    fill(&mut cache, 1);
    let err = cache
        .load(&[PagePair::new(0, 2), PagePair::new(2, 4)])
        .unwrap_err();
    let TransferError::ChecksumMismatch {
        transferred,
        checksummed_pages,
        mismatches,
    } = &err
    else {
        panic!("{err}");
    };
    // The copy ran: 2 pairs x 2 layers x (41,984 + 16,384) B.
    assert_eq!(transferred.bytes, 2 * 2 * (41_984 + 16_384));
    // Host page 4 (every run of it overwritten: both buffers, both layers) is refused; host
    // page 2 verified. 2 pairs x 2 buffers x 2 layers payloads checksummed, 4 mismatching.
    assert_eq!(*checksummed_pages, 8);
    assert_eq!(mismatches.len(), 4);
    assert_eq!(refused_pairs(mismatches), [PagePair::new(2, 4)]);
    let g = cache.device().geometry().clone();
    let first = &mismatches[0];
    assert_eq!(
        (
            first.buffer.as_str(),
            first.layer,
            first.host_page,
            first.device_page
        ),
        ("kv", 0, 4, 2)
    );
    // What was recorded is the device page's checksum at backup, recomputed here.
    let backed_up = page_bytes(0, 0, 1, 0, 41_984);
    assert_eq!(
        first.recorded,
        page_checksum(token_hash(&g.buffers[0], 64), 0, &backed_up)
    );
    let text = err.to_string();
    for want in [
        "checksum mismatch",
        "buffer kv layer 0",
        "host page 4 -> device page 2",
        &format!("{:#018x}", first.recorded),
        &format!("{:#018x}", first.loaded),
    ] {
        assert!(text.contains(want), "{want:?} not in {text}");
    }
    let stats = cache.stats();
    assert_eq!((stats.checksummed_pages, stats.checksum_mismatches), (8, 4));
    // The load moved its bytes: counted as a load, not a refusal.
    assert_eq!((stats.loads, stats.refused), (1, 0));
}

#[test]
fn a_host_page_written_after_backup_is_refused() {
    let mut cache = filled(CpuBackend, ChecksumMode::All);
    cache.backup(&[PagePair::new(1, 3)]).unwrap();
    // Another request's bytes land in host page 3, index_k layer 1 (a reused slot).
    cache
        .host_writer()
        .write_page_bytes(1, 1, 3, 100, &[0xAB; 8])
        .unwrap();
    let err = cache.load(&[PagePair::new(0, 3)]).unwrap_err();
    let TransferError::ChecksumMismatch { mismatches, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(mismatches.len(), 1);
    assert_eq!(
        (mismatches[0].buffer.as_str(), mismatches[0].layer),
        ("index_k", 1)
    );
}

#[test]
fn a_short_copy_and_a_stale_destination_are_refused() {
    let mut cache = filled(CpuBackend::content_faults(), ChecksumMode::All);
    let faults = cache.device().backend().clone();
    cache
        .backup(&[PagePair::new(1, 0), PagePair::new(2, 1)])
        .unwrap();
    fill(&mut cache, 1);
    // The seed bug's copy: 132 of each run's bytes (a page_first host run is one page of one
    // layer, so every payload of the pair is short).
    faults.arm(ContentFault::ShortCopy { kept_bytes: 132 });
    let err = cache.load(&[PagePair::new(3, 0)]).unwrap_err();
    assert!(
        matches!(&err, TransferError::ChecksumMismatch { mismatches, .. } if mismatches.len() == 4),
        "{err}"
    );
    // The device pages keep their own (salt 1) bytes: nothing copied.
    faults.arm(ContentFault::StaleDestination);
    let err = cache.load(&[PagePair::new(0, 1)]).unwrap_err();
    assert!(
        matches!(&err, TransferError::ChecksumMismatch { mismatches, .. } if mismatches.len() == 4),
        "{err}"
    );
    // A clean load of the same pairs verifies.
    cache
        .load(&[PagePair::new(3, 0), PagePair::new(0, 1)])
        .unwrap();
    let s = cache.stats();
    assert_eq!((s.checksummed_pages, s.checksum_mismatches), (4 + 4 + 8, 8));
}

#[test]
fn a_torn_backup_is_caught_at_load() {
    // A backup of one pair is 2 buffers x 2 layers = 4 runs (a page_first host: one run per
    // page of a layer), executed kv layer 0, kv layer 1, index_k layer 0, index_k layer 1;
    // a budget of 2 runs tears it after kv's two.
    let device = DevicePool::new_in(
        CpuBackend::failing_after(2),
        geometry(formats::INDEX_K_BF16, 4),
    )
    .unwrap();
    let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
    let mut cache = HiCache::pair(device, host).unwrap();
    let faults = cache.device().backend().clone();
    fill(&mut cache, 0);
    cache.set_checksum_mode(ChecksumMode::All).unwrap();
    let err = cache.backup(&[PagePair::new(1, 5)]).unwrap_err();
    assert!(
        matches!(err, TransferError::Interrupted { moved_runs: 2, .. }),
        "{err}"
    );
    faults.allow(100);
    let err = cache.load(&[PagePair::new(3, 5)]).unwrap_err();
    let TransferError::ChecksumMismatch { mismatches, .. } = &err else {
        panic!("{err}");
    };
    // kv's two payloads moved and verify; index_k's two did not move.
    assert_eq!(mismatches.len(), 2);
    assert!(mismatches.iter().all(|m| m.buffer == "index_k"), "{err}");
}

#[test]
fn sampled_checksums_cover_host_pages_that_are_multiples_of_n() {
    let mut cache = filled(CpuBackend, ChecksumMode::Sampled(2.try_into().unwrap()));
    cache
        .backup(&[
            PagePair::new(0, 0),
            PagePair::new(1, 1),
            PagePair::new(2, 2),
            PagePair::new(3, 3),
        ])
        .unwrap();
    cache
        .host_writer()
        .write_page_bytes(0, 0, 1, 0, &[1; 4])
        .unwrap();
    // Host page 1 is not sampled: its corruption passes; pages 0 and 2: 2 x 4 payloads.
    cache
        .load(&[
            PagePair::new(3, 0),
            PagePair::new(2, 1),
            PagePair::new(1, 2),
        ])
        .unwrap();
    assert_eq!(cache.stats().checksummed_pages, 8);
}

#[test]
fn a_one_layer_load_verifies_that_layer() {
    let mut cache = filled(CpuBackend, ChecksumMode::All);
    cache.backup(&[PagePair::new(1, 3)]).unwrap();
    cache
        .host_writer()
        .write_page_bytes(0, 1, 3, 0, &[9; 4])
        .unwrap();
    // Layer 0 of both buffers verifies: 2 payloads.
    cache.load_layer(0, &[PagePair::new(2, 3)]).unwrap();
    assert_eq!(cache.stats().checksummed_pages, 2);
    let err = cache.load_layer(1, &[PagePair::new(2, 3)]).unwrap_err();
    assert!(err.to_string().contains("buffer kv layer 1"), "{err}");
}

/// The seed bug with the geometry check off: a bf16 index-K device pool (256 B/token) paired
/// unverified with a host pool built by the fp8 formula (132 B/token); every load moves 132 of
/// the 256 bytes per token. The checksum of the device page at backup does not match the
/// device page after the load: every loaded index_k page is refused by content.
#[test]
fn the_seed_bug_is_caught_by_content_with_the_geometry_check_off() {
    let device = DevicePool::new(geometry(formats::INDEX_K_BF16, 4)).unwrap();
    let host = HostPool::from_geometry(geometry(formats::INDEX_K_FP8, 6)).unwrap();
    let mut cache = HiCache::pair_unverified(device, host);
    fill(&mut cache, 0);
    cache.set_checksum_mode(ChecksumMode::All).unwrap();
    cache
        .backup(&[PagePair::new(1, 2), PagePair::new(2, 3)])
        .unwrap();
    fill(&mut cache, 1);
    let err = cache
        .load(&[PagePair::new(0, 2), PagePair::new(3, 3)])
        .unwrap_err();
    let TransferError::ChecksumMismatch { mismatches, .. } = &err else {
        panic!("{err}");
    };
    // index_k: 2 pages x 2 layers refused; kv (same layout both sides) verifies.
    assert_eq!(mismatches.len(), 4);
    assert!(mismatches.iter().all(|m| m.buffer == "index_k"), "{err}");
    assert_eq!(
        refused_pairs(mismatches),
        [PagePair::new(0, 2), PagePair::new(3, 3)]
    );
}

/// A pairing with the geometry check off ([`HiCache::pair_unverified`]) on compatible pools
/// over the content-fault backend (device bf16 index-K and its mirror).
fn unverified<B: Backend<DeviceMem = kvlayout_pool::CpuMem, HostMem = kvlayout_pool::CpuMem>>(
    backend: B,
) -> HiCache<B> {
    let device = DevicePool::new_in(backend, geometry(formats::INDEX_K_BF16, 4)).unwrap();
    let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
    let mut cache = HiCache::pair_unverified(device, host);
    fill(&mut cache, 0);
    cache.set_checksum_mode(ChecksumMode::All).unwrap();
    cache
}

/// A stale slot and a short copy with the geometry check off: the content check alone refuses
/// every payload of the pair (2 buffers x 2 layers).
#[test]
fn a_stale_slot_and_a_short_copy_are_caught_by_content_with_the_geometry_check_off() {
    let mut cache = unverified(CpuBackend::content_faults());
    let faults = cache.device().backend().clone();
    cache.backup(&[PagePair::new(1, 0)]).unwrap();
    fill(&mut cache, 1);
    for fault in [
        ContentFault::StaleDestination,
        ContentFault::ShortCopy { kept_bytes: 132 },
    ] {
        faults.arm(fault);
        let err = cache.load(&[PagePair::new(2, 0)]).unwrap_err();
        let TransferError::ChecksumMismatch { mismatches, .. } = &err else {
            panic!("{fault:?}: {err}");
        };
        assert_eq!(mismatches.len(), 4, "{fault:?}: {err}");
        assert_eq!(refused_pairs(mismatches), [PagePair::new(2, 0)]);
    }
    let s = cache.stats();
    assert_eq!((s.checksummed_pages, s.checksum_mismatches), (8, 8));
}

/// A torn backup with the geometry check off (reported as a backend error, not
/// `Interrupted`): still recorded, so the load of its host page is refused for the runs that
/// did not move. Regression: an unverified pairing's torn backup was not recorded, and a host
/// page never backed up before was then loaded unverified.
#[test]
fn a_torn_backup_is_caught_by_content_with_the_geometry_check_off() {
    let mut cache = unverified(CpuBackend::failing_after(2));
    let faults = cache.device().backend().clone();
    // The legacy plan runs kv layer 0, kv layer 1, index_k layer 0, index_k layer 1; 2 runs
    // move, index_k's two do not.
    let err = cache.backup(&[PagePair::new(1, 5)]).unwrap_err();
    assert!(matches!(err, TransferError::Backend(_)), "{err}");
    faults.allow(100);
    let err = cache.load(&[PagePair::new(3, 5)]).unwrap_err();
    let TransferError::ChecksumMismatch { mismatches, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(mismatches.len(), 2);
    assert!(mismatches.iter().all(|m| m.buffer == "index_k"), "{err}");
}
