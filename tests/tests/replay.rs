//! `kvlayout replay`'s four expected outcomes on DeepSeek-V3.2-Exp (issue 3), on a small
//! workload so the debug test stays fast: 8 sessions in 2 prefix groups, 3 turns, 2 layers,
//! batches of 2, 4 decoded tokens per turn, 2 indexer heads, and a device pool of 14 pages.
//! A session ends at 3 x 64 + 3 x (48 + 4) = 348 tokens = 6 pages, a batch needs 2 x 6 = 12 <=
//! 14 pages, and the working set is 2 x 3 prefix + 8 x 3 own = 30 pages > 14, so a session's
//! pages are backed up while the other batches run and loaded back on its next turn.

use kvlayout_core::{MemoryLayout, file};
use kvlayout_models::{IndexK, Model, PoolOptions};
use kvlayout_replay::synthetic::{
    self as replay, HostSource, ReplayInput, ReplayOutcome, ReplayReport, Workload,
};

fn fp8_formula_host() -> HostSource {
    let text = include_str!("../../configs/geometry/host-index-k-fp8-formula.json");
    HostSource::Foreign {
        geometry: file::from_json(text).unwrap(),
        source: "configs/geometry/host-index-k-fp8-formula.json".into(),
    }
}

fn mirror(memory_layout: MemoryLayout) -> HostSource {
    HostSource::Mirror {
        pages: 64,
        memory_layout,
    }
}

fn run(index_k: IndexK, host: HostSource, verify: bool) -> ReplayOutcome {
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
    replay::run(&input, &mut |_, _| {}).unwrap()
}

fn completed(o: ReplayOutcome) -> ReplayReport {
    match o {
        ReplayOutcome::Completed(r) => *r,
        ReplayOutcome::Refused(r) => panic!("pairing refused: {:?}", r.mismatch),
    }
}

/// Checks the transfer counters against the per-page bytes worked by hand.
fn assert_moved(r: &ReplayReport, bytes_per_page_all_layers: u64) {
    assert!(r.backed_up_pages > 0, "{r:?}");
    assert!(r.loaded_pages > 0, "{r:?}");
    assert_eq!(r.loaded_bytes, r.loaded_pages * bytes_per_page_all_layers);
    assert_eq!(
        r.backed_up_bytes,
        r.backed_up_pages * bytes_per_page_all_layers
    );
}

#[test]
fn bf16_index_k_mirrored_host_zero_corrupted() {
    for layout in [
        MemoryLayout::LayerFirst,
        MemoryLayout::PageFirst,
        MemoryLayout::PageFirstDirect,
    ] {
        let r = completed(run(IndexK::Bf16, mirror(layout), true));
        assert_eq!(r.sessions, 8);
        assert_eq!(r.corrupted_sessions, 0, "{r:?}");
        assert_eq!(r.refused_transfers, 0);
        assert_eq!((r.topk_mismatches, r.latent_mismatches), (0, 0));
        // 8 sessions x 3 turns x 4 decoded tokens.
        assert_eq!(r.decode_steps, 96);
        // 2 layers x (64 x 656 kv + 64 x 256 index-K) = 2 x (41984 + 16384) = 116,736 B/page.
        assert_moved(&r, 116_736);
        assert_eq!(r.simulated_layers, 2);
        assert_eq!(r.model_layers, 61);
        assert_eq!(r.formats, ["kv: dsa_mla_fp8", "index_k: index_k_bf16"]);
    }
}

#[test]
fn bf16_index_k_fp8_formula_host_refused_at_pairing() {
    let ReplayOutcome::Refused(r) = run(IndexK::Bf16, fp8_formula_host(), true) else {
        panic!("the fp8-formula host must be refused");
    };
    assert!(
        r.mismatch
            .contains(&"index_k.bytes_per_token: 256, 132".to_string()),
        "{:?}",
        r.mismatch
    );
    assert!(
        r.mismatch
            .contains(&"index_k.page_stride_bytes: 16384, 8448".to_string())
    );
    assert_eq!(r.pairing, "refused");
    // The refusal as `--json` prints it: the fields the issue asks for.
    let v = serde_json::to_value(&r).unwrap();
    for key in [
        "sessions",
        "corrupted_sessions",
        "refused_transfers",
        "loaded_bytes",
    ] {
        assert!(v.get(key).is_some(), "{key} missing from {v}");
    }
}

#[test]
fn bf16_index_k_fp8_formula_host_without_verify_corrupts_sessions() {
    let r = completed(run(IndexK::Bf16, fp8_formula_host(), false));
    assert!(r.corrupted_sessions > 0, "{r:?}");
    assert!(r.topk_mismatches > 0);
    // Only sessions that loaded pages from the host are hit (the seed: HiCache on only).
    assert!(
        r.corrupted_sessions <= r.sessions_with_loaded_pages,
        "{r:?}"
    );
    // The kv buffer (656 B on both sides) is copied right: only the indexer is misled.
    assert_eq!(r.latent_mismatches, 0);
    assert_eq!(r.pairing, "unverified (--no-verify)");
    assert!(
        r.mismatch
            .contains(&"index_k.bytes_per_token: 256, 132".to_string())
    );
    // SGLang's kernel copies the host's item: 2 layers x (41984 + 8448) = 100,864 B per page,
    // not the 116,736 a bf16 page holds.
    assert_moved(&r, 100_864);
    assert_eq!(r.host_pages, 4096);
    assert_eq!(r.host_memory_layout, "page_first");
}

#[test]
fn fp8_index_k_zero_corrupted_with_either_host() {
    for host in [fp8_formula_host(), mirror(MemoryLayout::LayerFirst)] {
        let r = completed(run(IndexK::Fp8, host, true));
        assert_eq!(r.corrupted_sessions, 0, "{r:?}");
        assert_eq!(r.refused_transfers, 0);
        // 2 x (41984 + 64 x 132 = 8448) = 100,864 B/page.
        assert_moved(&r, 100_864);
    }
}

#[test]
fn matching_hosts_without_verify_still_zero_corrupted() {
    // The fp8 formula matches the fp8 device: the unchecked kernel copies the right bytes.
    let r = completed(run(IndexK::Fp8, fp8_formula_host(), false));
    assert_eq!(r.corrupted_sessions, 0, "{r:?}");
    assert!(r.mismatch.is_empty());
    // A bf16 mirror copied without checks is right too: the host's item is the device's.
    let r = completed(run(IndexK::Bf16, mirror(MemoryLayout::PageFirst), false));
    assert_eq!(r.corrupted_sessions, 0, "{r:?}");
    assert_moved(&r, 116_736);
}

#[test]
fn replay_is_deterministic() {
    let a = completed(run(IndexK::Bf16, fp8_formula_host(), false));
    let b = completed(run(IndexK::Bf16, fp8_formula_host(), false));
    assert_eq!(a, b);
}

#[test]
fn dense_models_compare_sampled_rows() {
    // Llama-3.1-8B: no indexer; the kv rows (4096 B/layer) of sampled past tokens are compared.
    let input = ReplayInput {
        model: Model::builtin("llama-3.1-8b").unwrap().unwrap(),
        pool: PoolOptions::default(),
        host: mirror(MemoryLayout::PageHead),
        verify: true,
        workload: Workload {
            sessions: 4,
            layers: 1,
            turns: 2,
            prefix_groups: 2,
            concurrency: 1,
            device_pages: 6,
            decode_tokens: 2,
            ..Workload::default()
        },
    };
    let ReplayOutcome::Completed(r) = replay::run(&input, &mut |_, _| {}).unwrap() else {
        panic!("mirror refused");
    };
    assert!(!r.indexer);
    assert_eq!(r.corrupted_sessions, 0);
    // 1 layer x 64 x 4096 = 262,144 B/page.
    assert_moved(&r, 262_144);
}

// ---- Trace replay (issue 13), on a hand-made multi-turn trace small enough for debug runs ----

mod trace {
    use kvlayout_core::{MemoryLayout, file};
    use kvlayout_models::{IndexK, Model, PoolOptions};
    use kvlayout_pool::{BackendError, CopyRun, CpuBackend};
    use kvlayout_replay::HostSource;
    use kvlayout_replay::report::TraceReport;
    use kvlayout_replay::schedule::WritePolicy;
    use kvlayout_replay::trace_replay::{self, TraceHost, TraceInput, TraceOutcome};

    /// 4 sessions x 3 turns, one request a second: session `s`, turn `k` sends the blocks
    /// `10 s + 0 ..= 10 s + k` (512 tokens each, `(k + 1) x 512` tokens) and decodes nothing.
    /// With 24 device pages (3 blocks), a session's blocks are evicted (backed up) by the other
    /// sessions before its next turn, which loads them back from the host: turns 1 and 2 of
    /// every session, 8 requests, load from the host (96 host pages hold all 12 blocks).
    pub fn multi_turn_trace() -> String {
        let mut out = String::new();
        let mut t = 0;
        for k in 0..3u64 {
            for s in 0..4u64 {
                let ids: Vec<String> = (0..=k).map(|b| (10 * s + b).to_string()).collect();
                out.push_str(&format!(
                    "{{\"timestamp\": {t}, \"input_length\": {}, \"output_length\": 0, \"hash_ids\": [{}]}}\n",
                    (k + 1) * 512,
                    ids.join(", ")
                ));
                t += 1000;
            }
        }
        out
    }

    fn input(index_k: IndexK, host: TraceHost, verify: bool) -> TraceInput {
        TraceInput {
            model: Model::builtin("deepseek-v3.2-exp").unwrap().unwrap(),
            pool: PoolOptions {
                index_k,
                ..PoolOptions::default()
            },
            device_pages: Some(24),
            host,
            verify,
            layers: 1,
            buffers: None,
            top_k: 16,
            indexer_heads: 8,
            seed: 2026,
            write_policy: WritePolicy::WriteBack,
            prefill_tokens_per_s: 20_000,
            decode_ms_per_token: 20,
            trace_name: "multi-turn".into(),
            checksum: kvlayout_pool::ChecksumMode::Off,
        }
    }

    fn mirror() -> TraceHost {
        TraceHost::Mirror {
            pages: Some(96),
            memory_layout: MemoryLayout::PageFirst,
        }
    }

    fn fp8_formula_host() -> TraceHost {
        let text = include_str!("../../configs/geometry/host-index-k-fp8-formula.json");
        TraceHost::Foreign(HostSource::Foreign {
            geometry: file::from_json(text).unwrap(),
            source: "host-index-k-fp8-formula.json".into(),
        })
    }

    fn run(input: &TraceInput) -> TraceOutcome {
        trace_replay::run_trace(input, multi_turn_trace().as_bytes(), &mut |_| {}).unwrap()
    }

    fn completed(o: TraceOutcome) -> TraceReport {
        match o {
            TraceOutcome::Completed(r) => *r,
            TraceOutcome::Refused(r) => panic!("refused: {:?}", r.mismatch),
        }
    }

    #[test]
    fn mirrored_host_zero_corrupted_with_host_hits() {
        let r = completed(run(&input(IndexK::Bf16, mirror(), true)));
        assert_eq!(r.requests, 12);
        assert_eq!(r.corrupted_requests, 0, "{r:?}");
        // Turns 1 and 2 of the 4 sessions load their earlier blocks back.
        assert_eq!(r.requests_with_host_hits, 8, "{r:?}");
        assert_eq!(r.host_hit_share, 8.0 / 12.0);
        // Prompt tokens: 4 x (512 + 1024 + 1536) = 12,288. Turn k computes one new block:
        // 4 x 3 x 512 = 6,144 tokens; the k earlier blocks, 4 x (1 + 2) x 512 = 6,144 tokens,
        // come from the device or the host (its 96 pages hold all 12 blocks: none is lost).
        assert_eq!(r.prompt_tokens, 12_288);
        assert_eq!(r.recomputed_tokens, 6_144);
        assert_eq!(r.device_tokens + r.host_tokens, 6_144);
        assert!(r.host_tokens > 0);
        // One layer of the bf16 index-K buffer moves: 64 x 256 = 16,384 B per page.
        assert_eq!(r.loaded_bytes, r.pages.loaded_pages * 16_384);
        assert_eq!(r.backed_up_bytes, r.pages.backed_up_pages * 16_384);
        assert_eq!(r.pages.loaded_pages * 64, r.host_tokens);
        // The per-minute series adds up (all 12 requests arrive in minute 0).
        assert_eq!(r.per_minute.len(), 1);
        assert_eq!(r.per_minute[0].requests, 12);
        assert_eq!(r.per_minute[0].requests_with_host_hits, 8);
        let v = serde_json::to_value(&r).unwrap();
        for key in [
            "requests",
            "requests_with_host_hits",
            "corrupted_requests",
            "device_pages",
            "host_pages",
        ] {
            assert!(v.get(key).is_some(), "{key} missing");
        }
        assert_eq!((r.device_pages, r.host_pages), (24, 96));
    }

    /// `--checksum all` on the mirrored host: every loaded page verifies (one layer of one
    /// buffer, index_k, moves: one payload per loaded page), none mismatches.
    #[test]
    fn checksums_verify_every_load_of_a_mirrored_host() {
        let mut i = input(IndexK::Bf16, mirror(), true);
        i.checksum = kvlayout_pool::ChecksumMode::All;
        let r = completed(run(&i));
        assert_eq!(r.corrupted_requests, 0);
        assert!(r.pages.loaded_pages > 0);
        assert_eq!(r.checksummed_pages, r.pages.loaded_pages);
        assert_eq!((r.checksum_mismatches, r.checksum_mismatched_loads), (0, 0));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["checksummed_pages"], r.pages.loaded_pages);
        assert_eq!(v["checksum_mismatches"], 0);
    }

    /// The seed's host file with the shim off (`--no-verify`) and `--checksum all`: every
    /// request the indexer finds corrupted also had a load whose checksums mismatched, and
    /// no other: content catches what the geometry check would have.
    #[test]
    fn checksums_catch_every_corrupted_request_of_the_seed_host_unverified() {
        let mut i = input(IndexK::Bf16, fp8_formula_host(), false);
        i.checksum = kvlayout_pool::ChecksumMode::All;
        let r = completed(run(&i));
        assert!(r.corrupted_requests > 0, "{r:?}");
        assert_eq!(r.checksum_mismatched_loads, r.corrupted_requests);
        assert!(r.checksum_mismatches > 0 && r.checksum_mismatches <= r.checksummed_pages);
        let first = r.first_checksum_mismatch.as_deref().unwrap();
        assert!(first.contains("buffer index_k layer 0"), "{first}");
        // The same run without checksums corrupts the same requests.
        let mut off = i.clone();
        off.checksum = kvlayout_pool::ChecksumMode::Off;
        let plain = completed(run(&off));
        assert_eq!(plain.corrupted_requests, r.corrupted_requests);
        assert_eq!(plain.checksummed_pages, 0);
    }

    #[test]
    fn kv_buffer_too_moves_when_asked() {
        let mut i = input(IndexK::Bf16, mirror(), true);
        i.buffers = Some(vec!["index_k".into(), "kv".into()]);
        let r = completed(run(&i));
        assert_eq!(r.corrupted_requests, 0);
        // 64 x (256 + 656) = 58,368 B per page and layer.
        assert_eq!(r.loaded_bytes, r.pages.loaded_pages * 58_368);
    }

    #[test]
    fn seed_host_is_refused_at_pairing() {
        let TraceOutcome::Refused(r) = run(&input(IndexK::Bf16, fp8_formula_host(), true)) else {
            panic!("the fp8-formula host must be refused");
        };
        assert!(
            r.mismatch
                .contains(&"index_k.bytes_per_token: 256, 132".to_string())
        );
        assert_eq!((r.requests, r.corrupted_requests), (0, 0));
    }

    /// The overlap (loads and backups enqueued, computed pages copied in batches) changes when
    /// bytes move, never what moves: the report is the same with it on and off, and holds the
    /// values the tests above derive (8 requests load from the host; the checked mirror
    /// corrupts none, the unverified seed host corrupts some of those 8 only).
    #[test]
    fn overlap_on_and_off_give_the_same_report() {
        let on_off = |input: &TraceInput| {
            let reports = [true, false].map(|overlap| {
                let trace = multi_turn_trace();
                let o = trace_replay::run_trace_overlapped(
                    kvlayout_pool::CpuBackend,
                    input,
                    overlap,
                    trace.as_bytes(),
                    &mut |_| {},
                )
                .unwrap();
                completed(o)
            });
            let [on, off] = reports;
            assert_eq!(on, off);
            on
        };
        let clean = on_off(&input(IndexK::Bf16, mirror(), true));
        assert_eq!(
            (clean.requests_with_host_hits, clean.corrupted_requests),
            (8, 0)
        );
        assert_eq!(clean.pages.refused_transfers, 0);
        assert!(clean.pages.loaded_pages > 0 && clean.pages.backed_up_pages > 0);
        let seed = on_off(&input(IndexK::Bf16, fp8_formula_host(), false));
        assert!(seed.corrupted_requests > 0, "{seed:?}");
        assert!(seed.corrupted_requests <= seed.requests_with_host_hits);
        // 12 blocks of 8 pages never fill the seed host's 4,096 pages: nothing dropped.
        assert_eq!(seed.pages.dropped_pages, 0);
    }

    #[test]
    fn seed_host_unverified_corrupts_only_requests_that_loaded() {
        let r = completed(run(&input(IndexK::Bf16, fp8_formula_host(), false)));
        assert!(r.corrupted_requests > 0, "{r:?}");
        assert!(r.corrupted_requests <= r.requests_with_host_hits, "{r:?}");
        // The host item is the fp8 formula's: 64 x 132 = 8,448 B per page copied.
        assert_eq!(r.loaded_bytes, r.pages.loaded_pages * 8_448);
        assert_eq!(r.host_pages, 4096);
    }

    #[test]
    fn fp8_index_k_is_clean_with_either_host() {
        for host in [fp8_formula_host(), mirror()] {
            let r = completed(run(&input(IndexK::Fp8, host, true)));
            assert_eq!(r.corrupted_requests, 0, "{r:?}");
            assert_eq!(r.requests_with_host_hits, 8);
            // 64 x 132 = 8,448 B per page.
            assert_eq!(r.loaded_bytes, r.pages.loaded_pages * 8_448);
        }
    }

    #[test]
    fn trace_replay_is_deterministic() {
        let a = completed(run(&input(IndexK::Bf16, fp8_formula_host(), false)));
        let b = completed(run(&input(IndexK::Bf16, fp8_formula_host(), false)));
        assert_eq!(a, b);
    }

    #[test]
    fn a_bad_line_names_line_and_field() {
        let mut text = multi_turn_trace();
        text.push_str(
            "{\"timestamp\": 1, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [1]}\n",
        );
        let e = trace_replay::run_trace(
            &input(IndexK::Bf16, mirror(), true),
            text.as_bytes(),
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "trace line 13: timestamp: 1 goes back (the previous line's is 11000)"
        );
    }

    /// The CPU backend, except that the first wait after an enqueued copy reports that the
    /// copy failed while running (what a GPU stream error looks like to the replay).
    #[derive(Clone, Default)]
    struct WaitFails {
        enqueued: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    // SAFETY: copies finish at once (the CPU backend's); `wait` only reports the injected
    // failure.
    unsafe impl kvlayout_pool::Backend for WaitFails {
        type DeviceMem = kvlayout_pool::CpuMem;
        type HostMem = kvlayout_pool::CpuMem;
        fn name(&self) -> &'static str {
            "wait-fails"
        }
        fn alloc_device(&self, n: u64) -> Result<kvlayout_pool::CpuMem, BackendError> {
            CpuBackend.alloc_device(n)
        }
        fn alloc_host(&self, n: u64) -> Result<kvlayout_pool::CpuMem, BackendError> {
            CpuBackend.alloc_host(n)
        }
        fn read_device(
            &self,
            m: &kvlayout_pool::CpuMem,
            o: u64,
            out: &mut [u8],
        ) -> Result<(), BackendError> {
            CpuBackend.read_device(m, o, out)
        }
        fn write_device(
            &self,
            m: &mut kvlayout_pool::CpuMem,
            o: u64,
            d: &[u8],
        ) -> Result<(), BackendError> {
            CpuBackend.write_device(m, o, d)
        }
        fn read_host(
            &self,
            m: &kvlayout_pool::CpuMem,
            o: u64,
            out: &mut [u8],
        ) -> Result<(), BackendError> {
            CpuBackend.read_host(m, o, out)
        }
        fn write_host(
            &self,
            m: &mut kvlayout_pool::CpuMem,
            o: u64,
            d: &[u8],
        ) -> Result<(), BackendError> {
            CpuBackend.write_host(m, o, d)
        }
        fn device_to_host(
            &self,
            s: &kvlayout_pool::CpuMem,
            d: &mut kvlayout_pool::CpuMem,
            r: &[CopyRun],
        ) -> Result<(), BackendError> {
            CpuBackend.device_to_host(s, d, r)
        }
        fn host_to_device(
            &self,
            s: &kvlayout_pool::CpuMem,
            d: &mut kvlayout_pool::CpuMem,
            r: &[CopyRun],
        ) -> Result<(), BackendError> {
            CpuBackend.host_to_device(s, d, r)
        }
        unsafe fn enqueue_device_to_host(
            &self,
            s: &kvlayout_pool::CpuMem,
            d: &mut kvlayout_pool::CpuMem,
            r: &[CopyRun],
        ) -> Result<(), BackendError> {
            self.enqueued
                .store(true, std::sync::atomic::Ordering::SeqCst);
            CpuBackend.device_to_host(s, d, r)
        }
        unsafe fn enqueue_host_to_device(
            &self,
            s: &kvlayout_pool::CpuMem,
            d: &mut kvlayout_pool::CpuMem,
            r: &[CopyRun],
        ) -> Result<(), BackendError> {
            self.enqueued
                .store(true, std::sync::atomic::Ordering::SeqCst);
            CpuBackend.host_to_device(s, d, r)
        }
        fn wait(&self) -> Result<(), BackendError> {
            if self
                .enqueued
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                return Err(BackendError::Driver(
                    "injected: a copy failed while running".into(),
                ));
            }
            Ok(())
        }
    }

    /// Review 3: in the overlapped replay a copy that failed while running was charged to the
    /// next transfer as a refusal (or, found at a flush, stopped the run). It now stops the
    /// replay as a pool error wherever it is found, naming the failure.
    #[test]
    fn a_copy_that_fails_while_running_stops_the_overlapped_replay() {
        let e = trace_replay::run_trace_overlapped(
            WaitFails::default(),
            &input(IndexK::Bf16, mirror(), true),
            true,
            multi_turn_trace().as_bytes(),
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("pool: ") && e.contains("injected: a copy failed while running"),
            "{e}"
        );
    }

    /// A failure that a plain read's wait found (which does not report it) is reported once by
    /// `copy_failure`, so the replay stops on it before it enqueues more; the enqueue after it
    /// is not charged with it.
    #[test]
    fn a_failure_found_by_a_read_is_reported_once_by_copy_failure() {
        use kvlayout_core::{BufferGeometry, PoolGeometry, formats};
        use kvlayout_pool::{DevicePool, Direction, HiCache, HostPool, KvPool, Layers, PagePair};
        let geometry = PoolGeometry {
            name: "wait-fails".into(),
            page_size_tokens: 64,
            pages: 4,
            memory_layout: MemoryLayout::LayerFirst,
            buffers: vec![BufferGeometry::new("index_k", 2, formats::INDEX_K_FP8)],
        };
        let device = DevicePool::new_in(WaitFails::default(), geometry).unwrap();
        let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
        let mut cache = HiCache::pair(device, host).unwrap();
        let pairs = [PagePair::new(1, 0)];
        cache.enqueue(Direction::Load, Layers::All, &pairs).unwrap();
        let mut out = [0u8; 8];
        cache.device().read_bytes(0, &mut out).unwrap(); // waits; keeps the failure
        let e = cache.copy_failure().unwrap_err().to_string();
        assert!(e.contains("injected: a copy failed while running"), "{e}");
        assert!(cache.copy_failure().is_ok(), "reported once");
        cache.enqueue(Direction::Load, Layers::All, &pairs).unwrap();
    }

    /// Review 3: a timestamp of u64::MAX made the per-minute series allocate 17 PB and abort.
    /// Time now runs from the first request (epoch timestamps replay the same as from 0: review 4
    /// found the schedule still ran on absolute ones), and a span over 31 days is refused
    /// naming the field.
    #[test]
    fn trace_minutes_count_from_the_first_request_and_the_span_is_bounded() {
        let line = |ms: u64| {
            format!(
                "{{\"timestamp\": {ms}, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [1]}}\n"
            )
        };
        let epoch = 1_700_000_000_000u64;
        // Two requests 61 s apart: minutes 0 and 1 since the first.
        let text = line(epoch) + &line(epoch + 61_000);
        let r_epoch = completed(
            trace_replay::run_trace(
                &input(IndexK::Bf16, mirror(), true),
                text.as_bytes(),
                &mut |_| {},
            )
            .unwrap(),
        );
        assert_eq!(r_epoch.per_minute.len(), 2);
        assert_eq!(
            (
                r_epoch.per_minute[0].requests,
                r_epoch.per_minute[1].requests
            ),
            (1, 1)
        );
        // One request alone at u64::MAX: a span of 0.
        let r = completed(
            trace_replay::run_trace(
                &input(IndexK::Bf16, mirror(), true),
                line(u64::MAX).as_bytes(),
                &mut |_| {},
            )
            .unwrap(),
        );
        assert_eq!(r.per_minute.len(), 1);
        // The same two requests from 0 give the same report.
        let from_zero = completed(
            trace_replay::run_trace(
                &input(IndexK::Bf16, mirror(), true),
                (line(0) + &line(61_000)).as_bytes(),
                &mut |_| {},
            )
            .unwrap(),
        );
        assert_eq!(from_zero, r_epoch);
        // 31 days = 2,678,400,000 ms; one more ms is refused.
        let text = line(5) + &line(5 + 2_678_400_001);
        let e = trace_replay::run_trace(
            &input(IndexK::Bf16, mirror(), true),
            text.as_bytes(),
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "trace line 2: timestamp: 2678400006 ms is 2678400001 ms after the first request's \
             (5 ms), more than the 2678400000 ms (31 days) a trace may span"
        );
    }

    #[test]
    fn default_capacities_are_the_h200_arithmetic() {
        // 0.90 x 141 GB - 86.25 GB = 40.65 GB; bf16 index-K: 61 x (656 + 256) = 55,632 B per
        // token, x 64 = 3,560,448 B per page: 40,650,000,000 / 3,560,448 = 11,417 pages.
        assert_eq!(trace_replay::KV_BUDGET_BYTES, 40_650_000_000);
        assert_eq!(
            trace_replay::default_device_pages(61 * (656 + 256) * 64),
            11_417
        );
        // fp8 index-K: 61 x (656 + 132) = 48,068 B per token: 13,213 pages.
        assert_eq!(
            trace_replay::default_device_pages(61 * (656 + 132) * 64),
            13_213
        );
    }
}
