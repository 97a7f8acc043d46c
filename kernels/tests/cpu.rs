//! CPU tests: the copy plan, the CPU references and the no-driver path. Every expected number is
//! worked by hand in a comment from the layouts (DeepSeek-V3.2: MLA fp8 656 B/token, index-K fp8
//! 128 + 4 B/token, 64-token pages) and the formulas in the module docs.

use half::bf16;
use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};
use kvlayout_kernels::index_k::{
    AMAX_FLOOR, INV_E4M3_MAX, quantize_key, round_scale_ue8m0, scale_for_amax,
};
use kvlayout_kernels::test_data::SplitMix64;
use kvlayout_kernels::{ByteRun, RunOrder, TransferPath, validate_runs};
use kvlayout_kernels::{
    Gpu, IndexKPages, KernelError, ScaleFormat, dequantize_index_k_cpu, driver_present,
    quantize_index_k_cpu,
};

#[test]
fn quantizer_constants_are_deepseeks() {
    assert_eq!(INV_E4M3_MAX, (1.0f64 / 448.0) as f32);
    assert_eq!(INV_E4M3_MAX, 1.0f32 / 448.0);
    assert_eq!(AMAX_FLOOR, 1e-4f32);
    // 2^ceil(log2 x): 0.75 -> 1, 1 -> 1, 0.004464 (2 x 1/448) -> 2^-7 = 0.0078125.
    assert_eq!(round_scale_ue8m0(0.75), 1.0);
    assert_eq!(round_scale_ue8m0(1.0), 1.0);
    assert_eq!(round_scale_ue8m0(2.0 * INV_E4M3_MAX), 0.007_812_5);
}

fn key(values: &[(usize, f32)], fill: f32) -> [bf16; 128] {
    let mut k = [bf16::from_f32(fill); 128];
    for &(i, v) in values {
        k[i] = bf16::from_f32(v);
    }
    k
}

#[test]
fn quantize_key_by_hand_f32_scale() {
    // amax 2.0: scale = 2 x f32(1/448) = 0.0044642859; x / scale:
    // 2.0 -> 447.99998 -> e4m3 448 = 0 1111 110 = 0x7E; 1.0 -> 223.99999 -> 224 = 1.75 x 2^7 =
    // 0 1110 110 = 0x76; -0.5 -> -112 = -1.75 x 2^6 = 1 1101 110 = 0xEE; 0.30078125 (bf16 of 0.3)
    // -> 67.375 -> nearest of 64, 72 is 64 = 0 1101 000 = 0x68; fill 0.0 -> 0x00.
    let k = key(&[(0, 2.0), (1, 1.0), (2, -0.5), (3, 0.3)], 0.0);
    let (q, s) = quantize_key(&k, ScaleFormat::F32);
    assert_eq!(s, 2.0 * INV_E4M3_MAX);
    assert_eq!(&q[..5], &[0x7E, 0x76, 0xEE, 0x68, 0x00]);
    assert!(q[5..].iter().all(|&b| b == 0));
}

#[test]
fn quantize_key_by_hand_ue8m0_scale_and_ties_to_even() {
    // amax 2.0: scale 2^-7; 2.0 -> 256 = 2^8 = 0 1111 000 = 0x78; 1.0 -> 128 = 0x70;
    // 1.0625 -> 136, the midpoint of 128 (mantissa 000) and 144 (001): even -> 128 = 0x70;
    // 1.1875 -> 152, midpoint of 144 (001) and 160 (010): even -> 160 = 0 1110 010 = 0x72;
    // -0.0078125 -> -1 = 1 0111 000 = 0xB8.
    let k = key(
        &[
            (0, 2.0),
            (1, 1.0),
            (2, 1.0625),
            (3, 1.1875),
            (4, -0.0078125),
        ],
        0.0,
    );
    let (q, s) = quantize_key(&k, ScaleFormat::Ue8m0);
    assert_eq!(s, 0.007_812_5);
    assert_eq!(&q[..5], &[0x78, 0x70, 0x70, 0x72, 0xB8]);
}

#[test]
fn all_zero_key_gets_deepseeks_floor_scale_and_zero_values() {
    let (q, s) = quantize_key(&[bf16::ZERO; 128], ScaleFormat::F32);
    assert_eq!(s, 1e-4f32 * INV_E4M3_MAX);
    assert_eq!(q, [0u8; 128]);
    assert_eq!(
        scale_for_amax(0.0, ScaleFormat::F32),
        1e-4f32 * INV_E4M3_MAX
    );
}

#[test]
fn quantize_writes_values_then_scales_at_hand_computed_offsets() {
    // P = 4 tokens, 3 pages, stride 4 x 132 = 528. Slot 5 = page 1, token 1: values at
    // 528 + 1 x 128 = 656, scale at 528 + 4 x 128 + 1 x 4 = 1044.
    let spec = IndexKPages {
        page_size_tokens: 4,
        pages: 3,
        page_stride_bytes: 528,
        base_bytes: 0,
        total_bytes: 3 * 528,
    };
    assert_eq!(spec.values_offset_bytes(5), Ok(656));
    assert_eq!(spec.scale_offset_bytes(5), Ok(1044));
    let k = key(&[(0, 2.0), (1, 1.0)], 0.5);
    let mut cache = vec![0xAAu8; 3 * 528];
    quantize_index_k_cpu(&spec, &k, &[5], &mut cache, ScaleFormat::F32).unwrap();
    // 0.5 -> 112 = 0x6E.
    assert_eq!(&cache[656..660], &[0x7E, 0x76, 0x6E, 0x6E]);
    assert_eq!(cache[656 + 127], 0x6E);
    assert_eq!(&cache[1044..1048], &(2.0 * INV_E4M3_MAX).to_le_bytes());
    let written = 656..784;
    let scale = 1044..1048;
    for (i, &b) in cache.iter().enumerate() {
        if !written.contains(&i) && !scale.contains(&i) {
            assert_eq!(b, 0xAA, "byte {i} was written");
        }
    }
    // Out of range (12 slots): refused, cache unchanged.
    let before = cache.clone();
    let err = quantize_index_k_cpu(&spec, &k, &[12], &mut cache, ScaleFormat::F32).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::IndexOutOfRange {
                position: 0,
                dst_index: 12,
                dst_limit: 12,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(cache, before);
}

#[test]
fn dequantize_round_trips_within_e4m3_precision() {
    let spec = IndexKPages {
        page_size_tokens: 64,
        pages: 4,
        page_stride_bytes: 8448,
        base_bytes: 0,
        total_bytes: 4 * 8448,
    };
    let mut rng = SplitMix64::new(11);
    let keys = rng.keys(200);
    let slots = rng.distinct_below(256, 200);
    let mut cache = rng.bytes(4 * 8448);
    for format in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
        quantize_index_k_cpu(&spec, &keys, &slots, &mut cache, format).unwrap();
        let mut out = vec![0f32; 200 * 128];
        dequantize_index_k_cpu(&spec, &cache, &slots, &mut out).unwrap();
        for (row, back) in keys.chunks(128).zip(out.chunks(128)) {
            let amax = row.iter().fold(0f32, |m, x| m.max(x.to_f32().abs()));
            for (x, y) in row.iter().zip(back) {
                // e4m3 keeps 3 mantissa bits: error at most 2^-4 relative to the value, and
                // subnormals (below 2^-6 x 448-scale) at most 2^-9 x scale; bound both by amax.
                let err = (x.to_f32() - y).abs();
                assert!(err <= amax / 16.0 + 1e-30, "{format:?}: {x} -> {y}");
            }
        }
    }
}

#[test]
fn no_driver_is_a_typed_error_never_a_panic() {
    match Gpu::new(0) {
        Err(KernelError::NoDriver) => assert!(!driver_present()),
        Err(KernelError::Driver { .. }) => assert!(driver_present()),
        Ok(_) => assert!(driver_present()),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn run_lists_are_checked_whole_and_the_first_bad_run_named() {
    // Run 1 ends at byte 13 + 4 = 17 of a 16-byte dst; run 2's offset + len overflows u64.
    let runs = [
        ByteRun::new(0, 4, 4),
        ByteRun::new(0, 13, 4),
        ByteRun::new(u64::MAX, 0, 2),
    ];
    assert_eq!(
        validate_runs(&runs, 32, 16).unwrap_err(),
        KernelError::RunOutOfRange {
            position: 1,
            run: runs[1],
            src_len_bytes: 32,
            dst_len_bytes: 16,
            bad_count: 2,
        }
    );
    // A run ending exactly at both regions' ends fits: 28 + 4 = 32, 12 + 4 = 16.
    assert_eq!(validate_runs(&[ByteRun::new(28, 12, 4)], 32, 16), Ok(()));
}

#[test]
fn ordered_runs_merge_only_neighbours_on_both_sides() {
    // Three 656-byte token runs of one page (src 1000.., dst 5000..) given out of order, an
    // empty run, and a run that continues the source but not the destination.
    let t = |i: u64| ByteRun::new(1000 + i * 656, 5000 + i * 656, 656);
    let runs = [
        t(2),
        t(0),
        ByteRun::new(9, 9, 0),
        t(1),
        ByteRun::new(1000 + 3 * 656, 90_000, 8),
    ];
    let merged = RunOrder::SrcAscending.sorted_and_merged(&runs);
    // 3 x 656 = 1968 bytes from 1000 to 5000; the last run starts a new one (dst 90,000 is not
    // 5000 + 1968 = 6968).
    assert_eq!(
        merged,
        vec![
            ByteRun::new(1000, 5000, 3 * 656),
            ByteRun::new(1000 + 3 * 656, 90_000, 8)
        ]
    );
    // As given: t(2) comes first and continues nothing; t(0) and t(1) are neighbours once the
    // empty run between them is dropped, so they merge.
    assert_eq!(
        RunOrder::AsGiven.sorted_and_merged(&runs),
        vec![
            t(2),
            ByteRun::new(1000, 5000, 2 * 656),
            ByteRun::new(1000 + 3 * 656, 90_000, 8)
        ]
    );
}

/// The SMs the token kernel takes without a carve-out (`SM_BUDGET`, device/options.rs).
const SM_BUDGET: u32 = 8;
/// The blocks (one per SM) the token kernel takes for a token backup, carve-out or not
/// (`TOKEN_BACKUP_BLOCKS`, device/options.rs).
const TOKEN_BACKUP_BLOCKS: u32 = 8;

#[test]
fn the_chooser_sends_page_runs_to_the_copy_engines_and_token_runs_to_the_sm_budget() {
    // DeepSeek-V3.2 page runs: 64 x 656 = 41,984 B and 64 x 132 = 8,448 B (mean 25,216 B).
    let pages = [
        ByteRun::new(0, 0, 41_984),
        ByteRun::new(41_984, 41_984, 8_448),
    ];
    assert_eq!(
        TransferPath::for_runs(&pages),
        TransferPath::CopyEngines { runs: 2 }
    );
    // Token runs of index-K: 128-byte values and 4-byte scales (mean 66 B).
    let tokens = [ByteRun::new(0, 0, 128), ByteRun::new(128, 128, 4)];
    assert_eq!(
        TransferPath::for_runs(&tokens),
        TransferPath::SmKernel {
            max_sms: SM_BUDGET,
            runs: 2
        }
    );
    // The threshold itself: runs of two lengths with a mean of exactly 4,096 B (4,080 + 4,112)
    // go to the copy engines, one byte less (4,080 + 4,111) to the kernel.
    let two = |second: u64| [ByteRun::new(0, 0, 4080), ByteRun::new(8192, 8192, second)];
    let ce = |runs| TransferPath::CopyEngines { runs };
    let sm = |runs| TransferPath::SmKernel {
        max_sms: SM_BUDGET,
        runs,
    };
    assert_eq!(TransferPath::for_runs(&two(4112)), ce(2));
    assert_eq!(TransferPath::for_runs(&two(4111)), sm(2));
    // Runs of one length of 4,096 B at 16-byte offsets (Llama-3.1-8B's K and V of one token
    // and layer together at page size 1: 2 x 8 heads x 128 x 2 B) are token runs the token
    // kernel takes (256 vectors of 16 B, its most): the kernel, not the copy engines (a trial
    // found `replay --model llama-3.1-8b --page-size-tokens 1 --device cuda` on the copy
    // engines). 4,112 B (257 vectors) and 4,096 B at an 8-byte offset it does not take: the
    // copy engines.
    let rows = |len: u64, at: u64| -> Vec<ByteRun> {
        (0..3)
            .map(|i| ByteRun::new(at + i * 3 * 4112, at + i * 5 * 4112, len))
            .collect()
    };
    assert_eq!(TransferPath::for_runs(&rows(4096, 0)), sm(3));
    assert_eq!(TransferPath::for_runs(&rows(4112, 0)), ce(3));
    assert_eq!(TransferPath::for_runs(&rows(4096, 8)), ce(3));
}

#[test]
fn with_a_carveout_loads_of_many_page_runs_and_all_token_runs_go_to_its_sms() {
    use kvlayout_kernels::TransferDirection as D;
    // 64 DeepSeek-V3.2 page runs (MLA 41,984 B and index-K 8,448 B alternating): the fewest
    // runs that use a carve-out.
    let page = |i: u64| ByteRun::new(i * 50_432, i * 50_432, [41_984, 8_448][(i % 2) as usize]);
    let pages: Vec<ByteRun> = (0..64).map(page).collect();
    let sm = |max_sms, runs| TransferPath::SmKernel { max_sms, runs };
    let ce = |runs| TransferPath::CopyEngines { runs };
    // A load on a carve-out of 2: split between the kernel on those 2 SMs and the copy
    // engines; one run fewer: the copy engines.
    assert_eq!(
        TransferPath::choose(&pages, D::Load, Some(2)),
        TransferPath::SplitLoad {
            max_sms: 2,
            runs: 64
        }
    );
    assert_eq!(TransferPath::choose(&pages[..63], D::Load, Some(2)), ce(63));
    // Other directions keep the copy engines, carve-out or not (backups: the next test).
    assert_eq!(TransferPath::choose(&pages, D::Other, Some(2)), ce(64));
    // Without a carve-out: the copy engines, as `for_runs`.
    assert_eq!(TransferPath::choose(&pages, D::Load, None), ce(64));
    assert_eq!(TransferPath::for_runs(&pages), ce(64));
    // Token runs (132-byte index-K tokens: not a multiple of 16, so not the token kernel's):
    // the carve-out's SMs in every direction, else the fixed budget.
    let tokens: Vec<ByteRun> = (0..3)
        .map(|i| ByteRun::new(i * 132, i * 132, 132))
        .collect();
    assert_eq!(TransferPath::choose(&tokens, D::Backup, Some(5)), sm(5, 3));
    // (Three runs are fewer than CARVEOUT_MIN_RUNS = 64: not gathered.)
    assert_eq!(TransferPath::choose(&tokens, D::Load, Some(5)), sm(5, 3));
    assert_eq!(
        TransferPath::choose(&tokens, D::Load, None),
        sm(SM_BUDGET, 3)
    );
    assert_eq!(TransferPath::choose(&tokens, D::Other, Some(5)), sm(5, 3));
    // 64 token runs (2,048 B: Llama-3.1-8B's K of one token and layer at page size 1): a
    // load on the carve-out's kernel; a backup on TOKEN_BACKUP_BLOCKS blocks, never gathered
    // (page runs are), carve-out or not, however many runs.
    let llama: Vec<ByteRun> = (0..64)
        .map(|i| ByteRun::new(i * 2048, i * 4096, 2048))
        .collect();
    assert_eq!(
        TransferPath::choose(&llama, D::Backup, Some(2)),
        sm(TOKEN_BACKUP_BLOCKS, 64)
    );
    assert_eq!(
        TransferPath::choose(&llama[..63], D::Backup, Some(2)),
        sm(TOKEN_BACKUP_BLOCKS, 63)
    );
    assert_eq!(TransferPath::choose(&llama, D::Load, Some(2)), sm(2, 64));
    assert_eq!(
        TransferPath::choose(&llama, D::Backup, None),
        sm(TOKEN_BACKUP_BLOCKS, 64)
    );
    // 64 token runs of 4,096 B (Llama-3.1-8B's K and V together): the same as 2,048 B ones;
    // a load is not split with the copy engines, a backup not gathered.
    let kv_rows: Vec<ByteRun> = (0..64)
        .map(|i| ByteRun::new(i * 4096, i * 8192, 4096))
        .collect();
    assert_eq!(
        TransferPath::choose(&kv_rows, D::Backup, Some(2)),
        sm(TOKEN_BACKUP_BLOCKS, 64)
    );
    assert_eq!(TransferPath::choose(&kv_rows, D::Load, Some(2)), sm(2, 64));
    assert_eq!(
        TransferPath::choose(&kv_rows, D::Load, None),
        sm(SM_BUDGET, 64)
    );
    // A carve-out of 0 SMs is no carve-out.
    assert_eq!(TransferPath::choose(&pages, D::Load, Some(0)), ce(64));
    assert_eq!(
        TransferPath::choose(&tokens, D::Load, Some(0)),
        sm(SM_BUDGET, 3)
    );
}

#[test]
fn merging_never_wraps_a_length() {
    // Two runs that continue each other on both sides but whose lengths sum past u64::MAX
    // (10 + (u64::MAX - 9) = u64::MAX + 1; possible only in an unchecked list): left as two
    // runs, lengths unchanged.
    let runs = [ByteRun::new(0, 0, 10), ByteRun::new(10, 10, u64::MAX - 9)];
    assert_eq!(RunOrder::AsGiven.sorted_and_merged(&runs), runs.to_vec());
    // Exactly fitting: 10 + (u64::MAX - 10) = u64::MAX, merged.
    let fits = [ByteRun::new(0, 0, 10), ByteRun::new(10, 10, u64::MAX - 10)];
    assert_eq!(
        RunOrder::AsGiven.sorted_and_merged(&fits),
        vec![ByteRun::new(0, 0, u64::MAX)]
    );
}

#[test]
fn gpu_handles_can_be_shared_between_threads() {
    // A pool backend holds an Arc<Gpu> and moves buffers between threads.
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Gpu>();
    send_sync::<kvlayout_kernels::DeviceBytes>();
    send_sync::<kvlayout_kernels::PinnedBytes>();
    send_sync::<kvlayout_kernels::DeviceRuns>();
}

/// Review 4: the public `PitchedRun` API from outside the crate: owned groups expand in a
/// plain pipeline (`runs` takes the group by value), and every field reads through a method.
#[test]
fn pitched_groups_expand_from_outside_the_crate() {
    use kvlayout_kernels::{ByteRun, PitchedRun, group_pitched};
    // Four runs of 10 bytes, sources 100 apart, destinations 10 apart: one group.
    let runs: Vec<ByteRun> = (0..4).map(|i| ByteRun::new(i * 100, i * 10, 10)).collect();
    let groups = group_pitched(&runs, u64::MAX);
    assert_eq!(groups.len(), 1);
    let g: PitchedRun = groups[0];
    assert_eq!(
        (g.src_offset_bytes(), g.dst_offset_bytes(), g.len_bytes()),
        (0, 0, 10)
    );
    assert_eq!(
        (g.lines(), g.src_pitch_bytes(), g.dst_pitch_bytes()),
        (4, 100, 10)
    );
    assert_eq!(g.total_bytes(), 40);
    let back: Vec<ByteRun> = groups.into_iter().flat_map(|g| g.runs()).collect();
    assert_eq!(back, runs);
}

#[test]
fn a_gathered_backup_packs_runs_in_host_order_and_copies_out_host_stretches() {
    use kvlayout_kernels::{GatherChunk, plan_gathered_backup};
    let r = ByteRun::new;
    // Slots of 100 bytes, 2 of them. Host order: r0 and r1 continue each other on the host;
    // the empty run is skipped; r4 spans three chunks.
    let runs = [
        r(1000, 0, 60),
        r(5000, 60, 60),
        r(9000, 300, 30),
        r(7000, 330, 0),
        r(2000, 400, 250),
    ];
    let chunk = |slot, gather: Vec<ByteRun>, stretches: Vec<ByteRun>| GatherChunk {
        slot,
        gather,
        stretches,
    };
    let want = vec![
        // Slot 0 (staging 0..100): r0 whole, then the first 40 bytes of r1; one stretch.
        chunk(0, vec![r(1000, 0, 60), r(5000, 60, 40)], vec![r(0, 0, 100)]),
        // Slot 1 (staging 100..200): the rest of r1, r2, the first 50 bytes of r4.
        chunk(
            1,
            vec![r(5040, 100, 20), r(9000, 120, 30), r(2000, 150, 50)],
            vec![r(100, 100, 20), r(120, 300, 30), r(150, 400, 50)],
        ),
        // Slot 0 again, then slot 1: the next 100 and the last 100 bytes of r4.
        chunk(0, vec![r(2050, 0, 100)], vec![r(0, 450, 100)]),
        chunk(1, vec![r(2150, 100, 100)], vec![r(100, 550, 100)]),
    ];
    assert_eq!(plan_gathered_backup(&runs, 100, 2), Some(want));
    // Nothing to move: no chunk.
    assert_eq!(plan_gathered_backup(&[], 100, 2), Some(vec![]));
    // Overlapping host ranges: refused (the copy engines keep them).
    assert_eq!(
        plan_gathered_backup(&[r(0, 0, 10), r(100, 5, 10)], 100, 2),
        None
    );
    // Runs out of host order are packed in list order: two stretches.
    assert_eq!(
        plan_gathered_backup(&[r(0, 100, 10), r(100, 0, 10)], 100, 2),
        Some(vec![chunk(
            0,
            vec![r(0, 0, 10), r(100, 10, 10)],
            vec![r(0, 100, 10), r(10, 0, 10)]
        )])
    );
    // No room: refused.
    assert_eq!(plan_gathered_backup(&runs, 0, 2), None);
    assert_eq!(plan_gathered_backup(&runs, 100, 0), None);
}

#[test]
fn with_a_carveout_backups_of_many_page_runs_are_gathered() {
    use kvlayout_kernels::TransferDirection as D;
    let page = |i: u64| ByteRun::new(i * 50_432, i * 50_432, [41_984, 8_448][(i % 2) as usize]);
    let pages: Vec<ByteRun> = (0..64).map(page).collect();
    assert_eq!(
        TransferPath::choose(&pages, D::Backup, Some(2)),
        TransferPath::GatheredBackup {
            max_sms: 2,
            runs: 64
        }
    );
    // One run fewer, no carve-out, or another direction: the copy engines.
    assert_eq!(
        TransferPath::choose(&pages[..63], D::Backup, Some(2)),
        TransferPath::CopyEngines { runs: 63 }
    );
    assert_eq!(
        TransferPath::choose(&pages, D::Backup, None),
        TransferPath::CopyEngines { runs: 64 }
    );
    assert_eq!(
        TransferPath::choose(&pages, D::Other, Some(2)),
        TransferPath::CopyEngines { runs: 64 }
    );
}

#[test]
fn long_lists_sort_on_several_threads_to_the_same_runs() {
    // 40,000 runs: past the 32,768 from which lists are sorted on several threads.
    let n = 40_000u64;
    let mut rng = SplitMix64::new(77);
    // 40,000 runs of 100 bytes covering [0, 4,000,000) on the source, shuffled; each one's
    // destination is its source + 7: sorted either way, every run continues the one before it
    // on both sides, so the list merges into one run.
    let order = rng.distinct_below(n, n as usize);
    let runs: Vec<ByteRun> = order
        .iter()
        .map(|&i| ByteRun::new(i * 100, i * 100 + 7, 100))
        .collect();
    for o in [RunOrder::SrcAscending, RunOrder::DstAscending] {
        assert_eq!(
            o.sorted_and_merged(&runs),
            vec![ByteRun::new(0, 7, 4_000_000)],
            "{o:?}"
        );
    }
    // Destinations a second permutation: in source order, merged only where two neighbours
    // continue each other on both sides (counted here from a stable single-thread sort).
    let dst_slots = rng.distinct_below(n, n as usize);
    let runs: Vec<ByteRun> = order
        .iter()
        .zip(&dst_slots)
        .map(|(&i, &d)| ByteRun::new(i * 100, d * 100 + 50, 100))
        .collect();
    // Runs left after a stable single-thread sort by `key` and merging neighbours that
    // continue each other on both sides (every run is 100 bytes).
    let merged_len = |key: fn(&ByteRun) -> u64| {
        let mut want = runs.clone();
        want.sort_by_key(key);
        let merges = want
            .windows(2)
            .filter(|w| {
                w[0].src_offset_bytes + 100 == w[1].src_offset_bytes
                    && w[0].dst_offset_bytes + 100 == w[1].dst_offset_bytes
            })
            .count();
        want.len() - merges
    };
    let sorted = RunOrder::SrcAscending.sorted_and_merged(&runs);
    assert_eq!(sorted.len(), merged_len(|r| r.src_offset_bytes));
    assert!(
        sorted
            .windows(2)
            .all(|w| w[0].src_offset_bytes < w[1].src_offset_bytes)
    );
    let bytes: u64 = sorted.iter().map(|r| r.len_bytes).sum();
    assert_eq!(bytes, 100 * runs.len() as u64);
    // The same list in destination order (the two orders differ here: two permutations): the
    // destinations ascend, and the merges are those of a stable sort by destination.
    let by_dst = RunOrder::DstAscending.sorted_and_merged(&runs);
    assert_eq!(by_dst.len(), merged_len(|r| r.dst_offset_bytes));
    assert!(
        by_dst
            .windows(2)
            .all(|w| w[0].dst_offset_bytes < w[1].dst_offset_bytes)
    );
    assert_ne!(by_dst, sorted, "the two orders of this list differ");
}

#[test]
fn gathering_pays_only_when_runs_merge_into_stretches() {
    use kvlayout_kernels::{host_stretches, plan_gathered_backup};
    let r = ByteRun::new;
    let pays = |runs: &[ByteRun]| host_stretches(runs).unwrap().gathering_pays();
    // Two runs continuing each other on the host: one stretch for two runs (pays, 1 x 2 <= 2).
    let merging = [r(0, 0, 10), r(500, 10, 10)];
    let plan = plan_gathered_backup(&merging, 100, 2).unwrap();
    assert_eq!(plan[0].stretches, vec![r(0, 0, 20)]);
    assert!(pays(&merging));
    // Three runs, two stretches (2 x 2 > 3): does not pay.
    let three = [r(0, 0, 10), r(500, 10, 10), r(900, 50, 10)];
    let plan = plan_gathered_backup(&three, 100, 2).unwrap();
    assert_eq!(plan[0].stretches.len(), 2);
    assert!(!pays(&three));
    // A run per stretch (a layer_first host pool: no two runs continue each other): no.
    assert!(!pays(&[r(0, 0, 10), r(500, 20, 10)]));
    // Nothing to move: nothing to lose either.
    assert!(pays(&[]));
}

#[test]
fn a_parallel_sort_keeps_runs_with_equal_keys() {
    // 40,000 runs reading 20,000 sources twice each (two destinations per source): sorted by
    // source on several threads, every run is still there once and the sources ascend.
    let n = 20_000u64;
    let mut rng = SplitMix64::new(5);
    let order = rng.distinct_below(n, n as usize);
    let mut runs = Vec::new();
    for &i in &order {
        runs.push(ByteRun::new(i * 64, i * 64, 64));
        runs.push(ByteRun::new(i * 64, 10_000_000 + i * 64, 64));
    }
    let sorted = RunOrder::SrcAscending.sorted_and_merged(&runs);
    assert!(
        sorted
            .windows(2)
            .all(|w| w[0].src_offset_bytes <= w[1].src_offset_bytes)
    );
    // Same bytes moved: the merged runs cut back into 64-byte pieces are exactly the input
    // (which neighbours merged depends on how equal keys were ordered, not what moves).
    let key = |r: &ByteRun| (r.src_offset_bytes, r.dst_offset_bytes, r.len_bytes);
    let mut got: Vec<_> = sorted
        .iter()
        .flat_map(|r| {
            assert_eq!(r.len_bytes % 64, 0);
            (0..r.len_bytes / 64)
                .map(move |k| (r.src_offset_bytes + 64 * k, r.dst_offset_bytes + 64 * k, 64))
        })
        .collect();
    let mut want: Vec<_> = runs.iter().map(key).collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got.len(), 40_000);
    assert!(got == want);
}

#[test]
fn ascending_blocks_are_put_in_order_block_by_block() {
    use kvlayout_kernels::device::options::sort_ascending_blocks;
    let r = ByteRun::new;
    let key: fn(&ByteRun) -> u64 = |r| r.dst_offset_bytes;
    // Three blocks of 8 runs that do not interleave, given out of order: [200..208), [0..8),
    // [100..108) (destination offsets), each ascending inside.
    let block = |base: u64| (0..8).map(move |i| r(base * 7 + i, base + i, 1));
    let runs: Vec<ByteRun> = block(200).chain(block(0)).chain(block(100)).collect();
    let want: Vec<ByteRun> = block(0).chain(block(100)).chain(block(200)).collect();
    assert_eq!(sort_ascending_blocks(&runs, key), Some(want.clone()));
    assert_eq!(
        RunOrder::DstAscending.sorted_and_merged(&runs),
        // Merged: each block continues itself on the destination only where the source does
        // too (sources base * 7 + i: consecutive inside a block), so one run per block.
        vec![r(0, 0, 8), r(700, 100, 8), r(1400, 200, 8)]
    );
    // Blocks that interleave ([0..8) and [4..12)): not sorted here (the caller sorts).
    let inter: Vec<ByteRun> = block(0).chain((4..12).map(|i| r(500 + i, i, 1))).collect();
    assert_eq!(sort_ascending_blocks(&inter, key), None);
    // Blocks that overlap by their lengths though their first keys are in order ([0..32) of
    // 4-byte runs, then [30..62)): not sorted here either.
    let four = |base: u64| (0..8).map(move |i| r(base + 4 * i, base + 4 * i, 4));
    let overlapping: Vec<ByteRun> = four(30).chain(four(0)).collect();
    assert_eq!(sort_ascending_blocks(&overlapping, key), None);
    // Too many short blocks (every run its own block): none either.
    let shuffled = [r(0, 30, 1), r(0, 20, 1), r(0, 10, 1)];
    assert_eq!(sort_ascending_blocks(&shuffled, key), None);
    // Already sorted: one block, unchanged; empty: empty.
    assert_eq!(sort_ascending_blocks(&want, key), Some(want.clone()));
    assert_eq!(sort_ascending_blocks(&[], key), Some(vec![]));
}

#[test]
fn a_pair_major_backup_sorts_to_the_same_runs_as_a_full_sort() {
    // The pool shim's backup of 1,024 random page pairs from a layer_first device pool to a
    // page_first host pool (61 layers, both buffers), pair by pair: ascending blocks of 61 runs.
    let pool = |m, pages| PoolGeometry {
        name: "t".into(),
        page_size_tokens: 64,
        pages,
        memory_layout: m,
        buffers: vec![
            BufferGeometry::new("kv", 61, formats::DSA_MLA_FP8),
            BufferGeometry::new("index_k", 61, formats::INDEX_K_FP8),
        ],
    };
    let (dev, host) = (
        pool(MemoryLayout::LayerFirst, 2048),
        pool(MemoryLayout::PageFirst, 2048),
    );
    let mut rng = SplitMix64::new(9);
    let dp = rng.distinct_below(2048, 1024);
    let hp = rng.distinct_below(2048, 1024);
    let mut runs = Vec::new();
    for (&d, &h) in dp.iter().zip(&hp) {
        for b in 0..2usize {
            let len = dev.stored_page_bytes(b).unwrap();
            for l in 0..61 {
                runs.push(ByteRun::new(
                    dev.page_offset_bytes(b, l, d).unwrap(),
                    host.page_offset_bytes(b, l, h).unwrap(),
                    len,
                ));
            }
        }
    }
    let mut want = runs.clone();
    want.sort_by_key(|r| r.dst_offset_bytes);
    let key: fn(&ByteRun) -> u64 = |r| r.dst_offset_bytes;
    let got = kvlayout_kernels::device::options::sort_ascending_blocks(&runs, key);
    // (Compared as a bool: 124,928 runs would fill the log.)
    assert!(
        got.as_ref() == Some(&want),
        "block sort differs from a full sort"
    );
    // No two runs continue each other on the device side (layer_first: a page's layers are a
    // layer stride apart), so merging keeps every run: the full sort's list exactly.
    assert!(RunOrder::DstAscending.sorted_and_merged(&runs) == want);
}

#[test]
fn host_stretches_are_counted_in_list_order_and_overlaps_refused() {
    use kvlayout_kernels::{HostStretches, host_stretches};
    let r = ByteRun::new;
    // Three page pairs laid pair by pair (as the pool shim does), host pages 2, 0 and 1 of
    // 1,000 bytes, three 100-byte layers each: 9 runs, 3 stretches, in no host order.
    let mut runs = Vec::new();
    for (i, host_page) in [2u64, 0, 1].into_iter().enumerate() {
        for layer in 0..3u64 {
            runs.push(r(
                layer * 10_000 + i as u64 * 100,
                host_page * 1000 + layer * 100,
                100,
            ));
        }
    }
    let s = host_stretches(&runs).unwrap();
    assert_eq!(
        s,
        HostStretches {
            runs: 9,
            merged_runs: 9,
            stretches: 3,
            bytes: 900
        }
    );
    assert!(s.gathering_pays());
    // The same runs laid layer by layer: no neighbour continues another: 9 stretches.
    let mut by_layer = runs.clone();
    by_layer.sort_by_key(|r| r.src_offset_bytes);
    let s = host_stretches(&by_layer).unwrap();
    assert_eq!((s.runs, s.merged_runs, s.stretches), (9, 9, 9));
    assert!(!s.gathering_pays());
    // Empty runs do not count nor break a stretch.
    let s = host_stretches(&[r(0, 0, 10), r(7, 99, 0), r(50, 10, 10)]).unwrap();
    assert_eq!((s.runs, s.stretches), (2, 1));
    // Overlapping host bytes, far apart in the list: refused; touching ranges are not.
    assert_eq!(
        host_stretches(&[r(0, 0, 100), r(0, 500, 100), r(0, 90, 5)]),
        None
    );
    assert!(host_stretches(&[r(0, 100, 100), r(0, 500, 100), r(0, 0, 100)]).is_some());
    // A host end past u64::MAX: refused.
    assert_eq!(host_stretches(&[r(0, u64::MAX, 2)]), None);
    // Nothing to move pays (nothing to copy either way).
    assert!(host_stretches(&[]).unwrap().gathering_pays());
}

#[test]
fn gathered_chunks_start_small_and_double_up_to_a_slot() {
    use kvlayout_kernels::{GatherChunk, gather_chunks};
    let r = ByteRun::new;
    // One 700-byte run, slots of 400 bytes, 2 of them, a first chunk of 100: chunks of 100,
    // 200, then 400 bytes (the slot), in slots 0, 1, 0.
    let chunks: Vec<GatherChunk> = gather_chunks(&[r(5000, 0, 700)], 400, 2, 100).collect();
    let want = vec![
        GatherChunk {
            slot: 0,
            gather: vec![r(5000, 0, 100)],
            stretches: vec![r(0, 0, 100)],
        },
        GatherChunk {
            slot: 1,
            gather: vec![r(5100, 400, 200)],
            stretches: vec![r(400, 100, 200)],
        },
        GatherChunk {
            slot: 0,
            gather: vec![r(5300, 0, 400)],
            stretches: vec![r(0, 300, 400)],
        },
    ];
    assert_eq!(chunks, want);
    // Leading and trailing empty runs make no chunk; no room makes none.
    let chunks: Vec<GatherChunk> =
        gather_chunks(&[r(1, 1, 0), r(0, 0, 50), r(9, 9, 0)], 400, 2, 100).collect();
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].gather, vec![r(0, 0, 50)]);
    assert_eq!(gather_chunks(&[r(0, 0, 50)], 0, 2, 100).count(), 0);
    assert_eq!(gather_chunks(&[r(0, 0, 50)], 400, 0, 100).count(), 0);
    assert_eq!(gather_chunks(&[r(0, 0, 50)], 400, 2, 0).count(), 0);
    // Many chunks: the doubling stops at the slot and never overflows (chunk 70 and later
    // hold a slot each).
    let n = gather_chunks(&[r(0, 0, 100 * 400)], 400, 3, 1).count();
    // 1 + 2 + ... + 256 = 511 bytes in the first 9 chunks, then 400 per chunk.
    assert_eq!(n, 9 + (40_000 - 511usize).div_ceil(400));
}

#[test]
fn a_split_load_gives_the_kernel_the_short_runs_then_long_runs_up_to_its_share() {
    use kvlayout_kernels::{kernel_share_permille, split_load};
    let r = ByteRun::new;
    // Short runs: at most 16,384 B (a bf16 index-K page).
    // Shares: 225 per SM, at most 600 (450 on 2 SMs, the measured best).
    assert_eq!(
        [1, 2, 3, 8].map(kernel_share_permille),
        [225, 450, 600, 600]
    );
    // Four DeepSeek-V3.2 pages of one layer in host order, MLA (41,984 B) then index-K
    // (8,448 B) each: 201,728 B in all; at 450 permille the kernel's target is 90,777 B.
    let runs: Vec<ByteRun> = (0..4u64)
        .flat_map(|p| {
            [
                r(p * 50_432, p * 100_000, 41_984),
                r(p * 50_432 + 41_984, p * 100_000 + 50_000, 8_448),
            ]
        })
        .collect();
    let (kernel, engines) = split_load(&runs, 450);
    // The four index-K runs (33,792 B) and then MLA runs in order until the target: page 0's
    // (75,776 B, short of it) and page 1's (117,760 B); pages 2 and 3's MLA to the engines.
    assert_eq!(
        kernel,
        vec![runs[0], runs[1], runs[2], runs[3], runs[5], runs[7]]
    );
    assert_eq!(engines, vec![runs[4], runs[6]]);
    // Share 0: the short runs only; 1000 (or more): everything to the kernel.
    let (kernel, engines) = split_load(&runs, 0);
    assert_eq!(kernel, vec![runs[1], runs[3], runs[5], runs[7]]);
    assert_eq!(engines, vec![runs[0], runs[2], runs[4], runs[6]]);
    assert_eq!(split_load(&runs, 5000), (runs.clone(), vec![]));
    // Nothing: nothing either side.
    assert_eq!(split_load(&[], 450), (vec![], vec![]));
    // A bf16 index-K page run (64 x 256 = 16,384 B) is short; one byte more is long.
    assert_eq!(
        split_load(&[r(0, 0, 16_384), r(16_384, 16_384, 16_385)], 0),
        (vec![r(0, 0, 16_384)], vec![r(16_384, 16_384, 16_385)])
    );
}

#[test]
fn the_gather_list_bound_holds_every_piece_a_plan_makes() {
    use kvlayout_kernels::{gather_chunks, host_stretches};
    let mut rng = SplitMix64::new(4242);
    // Random lists of 1-300 runs of 0-5,000 bytes at disjoint host offsets, in a random order,
    // planned with slots of 1-20,000 bytes and first chunks of 1 byte to past the slot.
    for case in 0..300 {
        let n = 1 + rng.below(300) as usize;
        let mut host_at = 0u64;
        let mut runs: Vec<ByteRun> = (0..n)
            .map(|i| {
                let len = rng.below(5_001);
                let r = ByteRun::new(i as u64 * 10_000, host_at, len);
                host_at += len + rng.below(3);
                r
            })
            .collect();
        let order = rng.distinct_below(n as u64, n);
        runs = order.iter().map(|&i| runs[i as usize]).collect();
        let slot_bytes = 1 + rng.below(20_000);
        let first_chunk_bytes = 1 + rng.below(2 * slot_bytes);
        let s = host_stretches(&runs).unwrap();
        assert_eq!(s.bytes, runs.iter().map(|r| r.len_bytes).sum::<u64>());
        let pieces: u64 = gather_chunks(&runs, slot_bytes, 3, first_chunk_bytes)
            .map(|c| c.gather.len() as u64)
            .sum();
        let bound = s.max_gather_pieces(slot_bytes, first_chunk_bytes);
        assert!(
            pieces <= bound,
            "case {case}: {pieces} pieces > bound {bound} (slot {slot_bytes}, first {first_chunk_bytes})"
        );
    }
    // By hand: 10 runs of 100 bytes, slots of 300, a first chunk of 100: chunks of 100, 200,
    // 300, 300, 100 bytes (4 boundaries, each on a run boundary here: 10 pieces); the bound
    // is 10 runs + 3 full slots (1,000 / 300) + 2 ramp chunks (300 / 100 = 3: 2 bits) + 1.
    let runs: Vec<ByteRun> = (0..10u64)
        .map(|i| ByteRun::new(i * 100, i * 100, 100))
        .collect();
    let s = host_stretches(&runs).unwrap();
    assert_eq!(s.max_gather_pieces(300, 100), 16);
    assert_eq!(gather_chunks(&runs, 300, 2, 100).count(), 5);
}

#[test]
fn gather_chunks_stop_for_good_at_an_offset_past_u64_max() {
    use kvlayout_kernels::gather_chunks;
    let r = ByteRun::new;
    // Review finding: with slots of u64::MAX bytes the second slot's base overflows; the
    // iterator used to skip that chunk's pieces and carry on with the next run.
    let runs = [r(0, 0, 1), r(10, 1, 1), r(20, 2, 1)];
    let mut it = gather_chunks(&runs, u64::MAX, 2, 1);
    assert!(it.next().is_some());
    assert_eq!(it.next(), None);
    assert_eq!(it.next(), None);
    // A piece whose device end would wrap: no chunk (it used to plan a wrapping piece).
    assert_eq!(
        gather_chunks(&[r(u64::MAX - 1, 0, 4)], 100, 2, 100).count(),
        0
    );
    // Ending exactly at u64::MAX is fine.
    assert_eq!(
        gather_chunks(&[r(u64::MAX - 4, 0, 4)], 100, 2, 100).count(),
        1
    );
}

#[test]
fn gathering_pays_on_runs_counted_after_merging() {
    use kvlayout_kernels::host_stretches;
    let r = ByteRun::new;
    // Review finding: 64 runs of 1 MiB continuing each other on both sides are one run for
    // the copy engines; one stretch for one merged run does not pay.
    let runs: Vec<ByteRun> = (0..64u64).map(|i| r(i << 20, i << 20, 1 << 20)).collect();
    let s = host_stretches(&runs).unwrap();
    assert_eq!((s.runs, s.merged_runs, s.stretches), (64, 1, 1));
    assert!(!s.gathering_pays());
    // The same host stretch from scattered device pages: 64 merged runs, one stretch: pays.
    let runs: Vec<ByteRun> = (0..64u64)
        .map(|i| r((63 - i) << 21, i << 20, 1 << 20))
        .collect();
    let s = host_stretches(&runs).unwrap();
    assert_eq!((s.runs, s.merged_runs, s.stretches), (64, 64, 1));
    assert!(s.gathering_pays());
    // Empty runs neither count nor break a merge.
    let s = host_stretches(&[r(0, 0, 10), r(5, 5, 0), r(10, 10, 10)]).unwrap();
    assert_eq!((s.runs, s.merged_runs, s.stretches), (2, 1, 1));
    // A device end past u64::MAX: refused.
    assert_eq!(host_stretches(&[r(u64::MAX - 1, 0, 4)]), None);
}

/// Regression (hostile review, session 8): `IndexKPages::for_pool_layer` took the pool's page
/// size, not the buffer's own (geometry v2), so a 128-token index-K buffer in a 64-token pool
/// had its scales written at 64 x 128 = 8,192 B into page 0: over token 64's values.
#[test]
fn index_k_spec_takes_the_buffers_own_page_size() {
    let g = PoolGeometry {
        name: "v2".into(),
        page_size_tokens: 64,
        pages: 2,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![
            BufferGeometry::new("index_k", 1, formats::INDEX_K_FP8).with_page_size_tokens(128),
        ],
    };
    let spec = IndexKPages::for_pool_layer(&g, 0, 0).unwrap();
    // 128 tokens x 132 B = 16,896 B per page; 2 pages.
    assert_eq!(spec.page_size_tokens, 128);
    assert_eq!(spec.page_stride_bytes, 16_896);
    // slot 100 = page 0, token 100: values at 100 x 128 = 12,800, scale at 128 x 128 + 100 x 4
    assert_eq!(spec.values_offset_bytes(100), Ok(12_800));
    assert_eq!(spec.scale_offset_bytes(100), Ok(16_384 + 400));
    let k = key(&[(0, 2.0)], 0.5);
    let mut cache = vec![0u8; 2 * 16_896];
    quantize_index_k_cpu(&spec, &k, &[0], &mut cache, ScaleFormat::F32).unwrap();
    // token 64's values (64 x 128 = 8,192..8,320) stay untouched; token 0's scale at 16,384
    assert!(cache[8_192..8_320].iter().all(|&b| b == 0));
    assert_eq!(&cache[16_384..16_388], &(2.0 * INV_E4M3_MAX).to_le_bytes());
}

#[test]
fn gather_chunks_planned_into_one_reused_chunk_match_the_iterator() {
    use kvlayout_kernels::{GatherChunk, gather_chunks};
    // 40 token runs of 1,152 B (an MLA latent) into slots of 4,096 B with a first chunk of
    // 1,024 B: chunks of at most 1,024, 2,048, then 4,096 B, runs cut at their edges. The same
    // plan into one reused chunk (cleared each time) as from the iterator, chunk by chunk.
    let runs: Vec<ByteRun> = (0..40u64)
        .map(|i| ByteRun::new(i * 4096, (39 - i) * 1152, 1152))
        .collect();
    let expected: Vec<_> = gather_chunks(&runs, 4096, 3, 1024).collect();
    let mut planner = gather_chunks(&runs, 4096, 3, 1024);
    let mut chunk = GatherChunk::default();
    let mut got = Vec::new();
    while planner.next_into(&mut chunk) {
        got.push(chunk.clone());
    }
    assert_eq!(got, expected);
    // 40 x 1,152 = 46,080 B: 1,024 + 2,048 + 4,096 x 10 = 44,032, then 2,048 B: 1 + 1 + 10
    // + 1 = 13 chunks.
    assert_eq!(got.len(), 13);
    let bytes: u64 = got
        .iter()
        .flat_map(|c| &c.gather)
        .map(|r| r.len_bytes)
        .sum();
    assert_eq!(bytes, 46_080);
    // Fused: nothing more, and the chunk left as the last one planned.
    assert!(!planner.next_into(&mut chunk));
}

#[test]
fn token_backups_the_token_kernel_takes_are_paced_and_others_keep_the_earlier_paths() {
    use kvlayout_kernels::TransferDirection as D;
    let sm = |max_sms, runs| TransferPath::SmKernel { max_sms, runs };
    // DeepSeek-V3.2 at page size 1: a token's 656 B MLA row and 132 B index-K row in one list
    // (two lengths: the token kernel cannot take it, so it cannot be paced). 64 runs on a
    // carve-out of 2: gathered, as before session 12; 63: the run-list kernel on the carve-out;
    // no carve-out: the run-list kernel on SM_BUDGET SMs.
    let dsa: Vec<ByteRun> = (0..64u64)
        .map(|i| {
            let len = if i % 2 == 0 { 656 } else { 132 };
            ByteRun::new(i * 1000, i * 2000, len)
        })
        .collect();
    assert_eq!(
        TransferPath::choose(&dsa, D::Backup, Some(2)),
        TransferPath::GatheredBackup {
            max_sms: 2,
            runs: 64
        }
    );
    assert_eq!(
        TransferPath::choose(&dsa[..63], D::Backup, Some(2)),
        sm(2, 63)
    );
    assert_eq!(
        TransferPath::choose(&dsa, D::Backup, None),
        sm(SM_BUDGET, 64)
    );
    // One length the token kernel takes: 128 B (8 vectors) up to 4,096 B (256), multiples of
    // 16 at 16-byte offsets: TOKEN_BACKUP_BLOCKS, carve-out or not.
    for len in [128u64, 656, 1152, 2048, 4080, 4096] {
        let runs: Vec<ByteRun> = (0..64u64)
            .map(|i| ByteRun::new(i * 8192, i * 16_384, len))
            .collect();
        for carveout in [None, Some(2)] {
            assert_eq!(
                TransferPath::choose(&runs, D::Backup, carveout),
                sm(TOKEN_BACKUP_BLOCKS, 64),
                "{len} B, carve-out {carveout:?}"
            );
        }
    }
    // 112 B (under 128), 1,000 B (not a multiple of 16), 1,152 B at an offset of 8: not the
    // token kernel's; 4,112 B runs (257 vectors, past its 256) are page runs.
    for (len, offset) in [(112u64, 0u64), (1000, 0), (1152, 8)] {
        let runs: Vec<ByteRun> = (0..64u64)
            .map(|i| ByteRun::new(offset + i * 8192, i * 16_384, len))
            .collect();
        assert_eq!(
            TransferPath::choose(&runs, D::Backup, Some(2)),
            TransferPath::GatheredBackup {
                max_sms: 2,
                runs: 64
            },
            "{len} B at {offset}"
        );
        assert_eq!(
            TransferPath::choose(&runs, D::Backup, None),
            sm(SM_BUDGET, 64),
            "{len} B at {offset}"
        );
    }
    let pages: Vec<ByteRun> = (0..64u64)
        .map(|i| ByteRun::new(i * 8192, i * 16_384, 4112))
        .collect();
    assert_eq!(
        TransferPath::choose(&pages, D::Backup, None),
        TransferPath::CopyEngines { runs: 64 }
    );
}
