//! Checksums through the concurrent path (issue 23): each content-only fault, injected into
//! the shared-region copy, is refused by content at the load, naming buffer, layer, pages and
//! both values, and counted; backups and loads from several threads verify.

use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};

use super::*;
use crate::checksum::refused_pairs;
use crate::{ContentFault, DevicePool, HostPool};

/// index_k, bf16: 64 x 256 = 16,384 B per page per layer; 2 layers, 4 device pages, 6 host
/// pages (page_first).
const PAGE_LAYER_BYTES: usize = 64 * 256;

/// Device page `p`, layer `l` filled with `page_bytes(l, p, salt)`; checksums on every page.
fn shared(salt: u8) -> ConcurrentHiCache {
    let g = PoolGeometry {
        name: "concurrent checksum".into(),
        page_size_tokens: 64,
        pages: 4,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![BufferGeometry::new("index_k", 2, formats::INDEX_K_BF16)],
    };
    let device = DevicePool::new(g).unwrap();
    let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
    let mut cache = HiCache::pair(device, host).unwrap();
    cache.set_checksum_mode(ChecksumMode::All).unwrap();
    let c = ConcurrentHiCache::new(cache).unwrap();
    assert_eq!(c.checksum_mode(), ChecksumMode::All);
    for l in 0..2 {
        for p in 0..4 {
            c.write_device_page(0, l, p, &page_bytes(l, p, salt))
                .unwrap();
        }
    }
    c
}

fn page_bytes(l: u64, p: u64, salt: u8) -> Vec<u8> {
    (0..PAGE_LAYER_BYTES)
        .map(|i| (i as u8).wrapping_mul(3) ^ (l as u8 * 17 + p as u8 * 41 + salt))
        .collect()
}

/// The checksum kvlayout.checksum/v1 gives a page payload of index_k layer `l` (the core's
/// reference function, seeded from the geometry).
fn sum(c: &ConcurrentHiCache, l: u64, bytes: &[u8]) -> u64 {
    let key = c.device_geometry().page_checksum_key(0, l).unwrap();
    kvlayout_core::checksum::page_checksum(key.token_fingerprint, key.layer_id, bytes)
}

/// Backs device pages 1 and 2 up to host pages 4 and 5 (with `fault` armed for the backup,
/// if it is one), writes salt 9 into device pages 0 and 3, arms `fault` if it is a load's, and
/// loads host pages 4 and 5 into device pages 0 and 3.
fn round_trip(
    fault: Option<ContentFault>,
) -> (ConcurrentHiCache, Result<Transferred, TransferError>) {
    let c = shared(0);
    if let Some(f @ ContentFault::HostOverwrittenAfterBackup) = fault {
        c.arm(f);
    }
    c.backup(&[PagePair::new(1, 4), PagePair::new(2, 5)])
        .unwrap();
    for l in 0..2 {
        for p in [0, 3] {
            c.write_device_page(0, l, p, &page_bytes(l, p, 9)).unwrap();
        }
    }
    if let Some(f) = fault.filter(|f| f.direction() == Direction::Load) {
        c.arm(f);
    }
    let r = c.load(&[PagePair::new(0, 4), PagePair::new(3, 5)]);
    (c, r)
}

fn mismatches(
    r: Result<Transferred, TransferError>,
) -> (Transferred, u64, Vec<crate::PageMismatch>) {
    match r {
        Err(TransferError::ChecksumMismatch {
            transferred,
            checksummed_pages,
            mismatches,
        }) => (transferred, checksummed_pages, mismatches),
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
}

#[test]
fn a_clean_round_trip_verifies_every_page_and_keeps_the_table_across_into_inner() {
    let (c, r) = round_trip(None);
    // 2 pairs x 2 layers x 16,384 B.
    assert_eq!(r.unwrap().bytes, 2 * 2 * PAGE_LAYER_BYTES as u64);
    let s = c.stats();
    assert_eq!((s.checksummed_pages, s.checksum_mismatches), (4, 0));
    // The table goes back to the cache: a load there verifies against it.
    let mut cache = c.into_inner();
    assert_eq!(cache.checksum_mode(), ChecksumMode::All);
    cache.load(&[PagePair::new(1, 5)]).unwrap();
    assert_eq!(cache.stats().checksummed_pages, 4 + 2);
}

#[test]
fn a_stale_destination_through_the_concurrent_path_is_refused_naming_the_pages() {
    let (c, r) = round_trip(Some(ContentFault::StaleDestination));
    let (transferred, checked, m) = mismatches(r);
    assert_eq!(transferred.bytes, 2 * 2 * PAGE_LAYER_BYTES as u64);
    // Every payload of both pairs kept its salt-9 bytes: 4 of 4 mismatch.
    assert_eq!((checked, m.len()), (4, 4));
    assert_eq!(
        refused_pairs(&m),
        [PagePair::new(0, 4), PagePair::new(3, 5)]
    );
    let first = &m[0];
    assert_eq!(
        (
            first.buffer.as_str(),
            first.layer,
            first.host_page,
            first.device_page
        ),
        ("index_k", 0, 4, 0)
    );
    // Recorded: device page 1's bytes at backup; loaded: device page 0's own salt-9 bytes.
    assert_eq!(first.recorded, sum(&c, 0, &page_bytes(0, 1, 0)));
    assert_eq!(first.loaded, sum(&c, 0, &page_bytes(0, 0, 9)));
    let s = c.stats();
    assert_eq!(
        (s.checksummed_pages, s.checksum_mismatches, s.loads),
        (4, 4, 1)
    );
}

#[test]
fn a_short_copy_of_132_bytes_per_run_through_the_concurrent_path_is_refused() {
    // The seed bug's copy: 132 of each run's bytes (a page_first host run is one page of one
    // layer).
    let (c, r) = round_trip(Some(ContentFault::ShortCopy { kept_bytes: 132 }));
    let (_, checked, m) = mismatches(r);
    assert_eq!((checked, m.len()), (4, 4));
    // Device page 0, layer 0 after the load: 132 bytes of device page 1's, then its own.
    let mut loaded = page_bytes(0, 1, 0)[..132].to_vec();
    loaded.extend_from_slice(&page_bytes(0, 0, 9)[132..]);
    assert_eq!(m[0].loaded, sum(&c, 0, &loaded));
}

#[test]
fn a_host_page_overwritten_after_a_concurrent_backup_is_refused_at_load() {
    let (c, r) = round_trip(Some(ContentFault::HostOverwrittenAfterBackup));
    let (_, checked, m) = mismatches(r);
    assert_eq!((checked, m.len()), (4, 4));
    // Byte 16,384 / 2 = 8,192 of device page 1, layer 0 inverted in the host copy.
    let mut loaded = page_bytes(0, 1, 0);
    loaded[PAGE_LAYER_BYTES / 2] = !loaded[PAGE_LAYER_BYTES / 2];
    assert_eq!(
        (m[0].recorded, m[0].loaded),
        (sum(&c, 0, &page_bytes(0, 1, 0)), sum(&c, 0, &loaded))
    );
}

#[test]
fn concurrent_backups_and_loads_on_disjoint_pages_verify() {
    let c = shared(0);
    c.backup(&[PagePair::new(0, 0), PagePair::new(1, 1)])
        .unwrap();
    std::thread::scope(|s| {
        // Loads of host pages 0 and 1 into device pages 2 and 3 while device pages 0 and 1
        // are backed up to host pages 4 and 5.
        s.spawn(|| {
            for _ in 0..20 {
                c.load(&[PagePair::new(2, 0), PagePair::new(3, 1)]).unwrap();
            }
        });
        s.spawn(|| {
            for _ in 0..20 {
                c.backup(&[PagePair::new(0, 4), PagePair::new(1, 5)])
                    .unwrap();
            }
        });
    });
    // 20 loads x 2 pairs x 2 layers.
    let s = c.stats();
    assert_eq!((s.checksummed_pages, s.checksum_mismatches), (80, 0));
    // Host page 4 was backed up with checksums: it verifies into device page 3.
    c.load(&[PagePair::new(3, 4)]).unwrap();
    assert_eq!(c.stats().checksummed_pages, 82);
}

#[test]
fn set_checksum_mode_off_stops_checksums() {
    let mut c = shared(0);
    c.set_checksum_mode(ChecksumMode::Off).unwrap();
    c.backup(&[PagePair::new(0, 0)]).unwrap();
    c.load(&[PagePair::new(1, 0)]).unwrap();
    assert_eq!(c.stats().checksummed_pages, 0);
}
