//! CPU tests of the staged transfer path's host half ([`kvlayout_kernels::staging`]): the chunk
//! plan worked by hand, and whole staged loads and backups (plan, host gather or scatter, the
//! device half stood in for by the pool crate's CPU run copy on the chunk's device runs) against
//! the pool crate's CPU run copy of the original runs, bit for bit.

use kvlayout_kernels::ByteRun;
use kvlayout_kernels::staging::{
    STAGING_ALIGN_BYTES, StagedChunk, StagedDirection, StagedPiece, device_runs,
    gather_into_staging, plan_staged_chunks, scatter_from_staging, split_runs,
};
use kvlayout_kernels::test_data::SplitMix64;
use kvlayout_pool::backend::copy_runs;
use kvlayout_pool::{CopyRun, Direction};

fn piece(host: u64, device: u64, staging: u64, len: u64) -> StagedPiece {
    StagedPiece {
        host_offset_bytes: host,
        device_offset_bytes: device,
        staging_offset_bytes: staging,
        len_bytes: len,
    }
}

/// `dst` after `runs` copy `src` into it, by the pool crate's CPU run copy (its CPU backend's).
fn cpu_copy(src: &[u8], dst: &mut [u8], runs: &[ByteRun]) {
    let runs: Vec<CopyRun> = runs
        .iter()
        .map(|r| CopyRun {
            src_offset_bytes: r.src_offset_bytes,
            dst_offset_bytes: r.dst_offset_bytes,
            len_bytes: r.len_bytes,
        })
        .collect();
    copy_runs(Direction::Load, src, dst, &runs).unwrap();
}

#[test]
fn chunks_are_planned_in_host_order_aligned_and_split() {
    // Load (src = host). Chunks of 64 B. Sorted by host offset: (0 -> 50, 40 B), (100 -> 0,
    // 10 B), (200 -> 300, 100 B).
    let runs = [
        ByteRun::new(100, 0, 10),
        ByteRun::new(0, 50, 40),
        ByteRun::new(200, 300, 100),
        ByteRun::new(7, 7, 0),
    ];
    let chunks = plan_staged_chunks(&runs, StagedDirection::Load, 64, 8).unwrap();
    // Chunk 0: the 40 B run at staging 0; the 10 B run at 40 rounded up to 16: 48, ends at 58.
    // The 100 B run is longer than a chunk: split at the chunk ends, 64 B then 36 B; the empty
    // run moves nothing and is dropped.
    let want = vec![
        StagedChunk {
            pieces: vec![piece(0, 50, 0, 40), piece(100, 0, 48, 10)],
            used_bytes: 58,
        },
        StagedChunk {
            pieces: vec![piece(200, 300, 0, 64)],
            used_bytes: 64,
        },
        StagedChunk {
            pieces: vec![piece(264, 364, 0, 36)],
            used_bytes: 36,
        },
    ];
    assert_eq!(chunks, want);
    assert_eq!(STAGING_ALIGN_BYTES, 16);
    // As device runs: a load's scatter reads staging (src) and writes the device pool (dst).
    assert_eq!(
        device_runs(&chunks[0], StagedDirection::Load),
        vec![ByteRun::new(0, 50, 40), ByteRun::new(48, 0, 10)]
    );

    // A run that fits a fresh chunk but not the rest of this one starts a new chunk: 40 B at
    // 0, then 30 B would start at 48 with 16 B left.
    let runs = [ByteRun::new(0, 0, 40), ByteRun::new(40, 40, 30)];
    let chunks = plan_staged_chunks(&runs, StagedDirection::Load, 64, 8).unwrap();
    assert_eq!(chunks.len(), 2);
    assert_eq!(chunks[1].pieces, vec![piece(40, 40, 0, 30)]);

    // At most `max_pieces` pieces per chunk: 3 runs of 4 B, 2 per chunk -> 2 chunks.
    let runs = [
        ByteRun::new(0, 0, 4),
        ByteRun::new(4, 4, 4),
        ByteRun::new(8, 8, 4),
    ];
    let chunks = plan_staged_chunks(&runs, StagedDirection::Load, 64, 2).unwrap();
    assert_eq!(
        chunks.iter().map(|c| c.pieces.len()).collect::<Vec<_>>(),
        vec![2, 1]
    );

    // Backup (dst = host): sorted by the destination, the device offset is the source.
    let runs = [ByteRun::new(500, 32, 8), ByteRun::new(600, 0, 8)];
    let chunks = plan_staged_chunks(&runs, StagedDirection::Backup, 64, 8).unwrap();
    assert_eq!(
        chunks[0].pieces,
        vec![piece(0, 600, 0, 8), piece(32, 500, 16, 8)]
    );
    assert_eq!(
        device_runs(&chunks[0], StagedDirection::Backup),
        vec![ByteRun::new(600, 0, 8), ByteRun::new(500, 16, 8)]
    );
}

#[test]
fn bad_plans_are_refused_by_name() {
    let runs = [ByteRun::new(0, 0, 8)];
    let err = plan_staged_chunks(&runs, StagedDirection::Load, 8, 4).unwrap_err();
    assert!(err.to_string().contains("chunk_bytes"), "{err}");
    let err = plan_staged_chunks(&runs, StagedDirection::Load, 64, 0).unwrap_err();
    assert!(err.to_string().contains("max_pieces"), "{err}");
    // Two backup runs writing host bytes 10..20 and 15..25: the host threads write pieces in
    // parallel, so this is refused (a load may read overlapping host bytes).
    let runs = [ByteRun::new(0, 10, 10), ByteRun::new(100, 15, 10)];
    let err = plan_staged_chunks(&runs, StagedDirection::Backup, 64, 4).unwrap_err();
    assert!(err.to_string().contains("overlap"), "{err}");
    assert!(plan_staged_chunks(&runs, StagedDirection::Load, 64, 4).is_ok());
    // A piece outside the staging buffer or the host pool: a length error, nothing written.
    let chunk = StagedChunk {
        pieces: vec![piece(0, 0, 0, 8), piece(8, 8, 60, 8)],
        used_bytes: 68,
    };
    let mut staging = vec![0xAAu8; 64];
    assert!(gather_into_staging(&[1u8; 32], &chunk, &mut staging).is_err());
    let mut host = vec![0xBBu8; 32];
    assert!(scatter_from_staging(&staging, &chunk, &mut host).is_err());
    assert!(host.iter().all(|&b| b == 0xBB));
}

/// `count` page runs of random lengths (1 to `page_bytes`) between distinct random pages.
fn random_runs(rng: &mut SplitMix64, page_bytes: u64, pages: u64, count: usize) -> Vec<ByteRun> {
    let a = rng.distinct_below(pages, count);
    let b = rng.distinct_below(pages, count);
    a.into_iter()
        .zip(b)
        .map(|(s, d)| {
            let len = 1 + rng.below(page_bytes);
            let skew = rng.below(page_bytes - len + 1);
            ByteRun::new(s * page_bytes + skew, d * page_bytes, len)
        })
        .collect()
}

#[test]
fn staged_loads_and_backups_match_the_pool_cpu_copy_bit_for_bit() {
    let mut rng = SplitMix64::new(77);
    // Pages of 12,000 B (not a multiple of 16), chunks of 4096 B (runs longer than a chunk are
    // split), at most 5 pieces a chunk.
    let (page_bytes, pages) = (12_000u64, 64u64);
    let pool_bytes = (page_bytes * pages) as usize;
    let chunk_bytes = 4096u64;
    for direction in [StagedDirection::Load, StagedDirection::Backup] {
        for count in [1usize, 7, 40] {
            let runs = random_runs(&mut rng, page_bytes, pages, count);
            let src = rng.bytes(pool_bytes);
            let poison = rng.bytes(pool_bytes);
            let mut want = poison.clone();
            cpu_copy(&src, &mut want, &runs);

            let chunks = plan_staged_chunks(&runs, direction, chunk_bytes, 5).unwrap();
            assert!(chunks.iter().all(|c| c.used_bytes <= chunk_bytes));
            let mut got = poison.clone();
            for chunk in &chunks {
                let mut staging = rng.bytes(chunk_bytes as usize);
                match direction {
                    StagedDirection::Load => {
                        // Host gather, then the device scatter (stood in for on the CPU).
                        gather_into_staging(&src, chunk, &mut staging).unwrap();
                        cpu_copy(&staging, &mut got, &device_runs(chunk, direction));
                    }
                    StagedDirection::Backup => {
                        // The device gather (stood in for on the CPU), then host scatter.
                        cpu_copy(&src, &mut staging, &device_runs(chunk, direction));
                        scatter_from_staging(&staging, chunk, &mut got).unwrap();
                    }
                }
            }
            let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
            assert!(
                first_diff.is_none(),
                "{direction:?} {count} runs: byte {first_diff:?}"
            );
        }
    }
}

#[test]
fn device_runs_are_cut_for_warps() {
    // 10,000 B in pieces of 4096: 4096, 4096, 1808 (10,000 - 2 x 4096); a 100 B run stays.
    let runs = [ByteRun::new(16, 32, 10_000), ByteRun::new(0, 0, 100)];
    assert_eq!(
        split_runs(&runs, 4096),
        vec![
            ByteRun::new(16, 32, 4096),
            ByteRun::new(16 + 4096, 32 + 4096, 4096),
            ByteRun::new(16 + 8192, 32 + 8192, 1808),
            ByteRun::new(0, 0, 100),
        ]
    );
    assert_eq!(split_runs(&runs, 0), runs.to_vec());
}
