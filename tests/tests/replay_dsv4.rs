//! `kvlayout replay --model deepseek-v4-flash` (issue 21 part 3): the trace schedule pages every
//! buffer of SGLang's DeepSeek-V4 pool at its 256-token page, and the seed's pair (bf16 index-K
//! device, host sized by the fp8 formula) is refused, or corrupts requests with `--no-verify`.
//!
//! The trace: three requests of 1,024 prompt tokens (two 512-token blocks = 4 pages of 256) and
//! 8 decoded tokens, 10 s apart (each done in 1,024 / 20,000 s + 8 x 20 ms < 1 s); a device pool
//! of 6 pages. Request 1 caches blocks 1, 2 (4 pages) and holds 1 private page for its
//! (1,024 + 8) / 256 -> 5th page. Request 2 (blocks 3, 4) needs 5 pages with 2 free: block 2,
//! then block 1 (least recently used leaves) are backed up to the host and freed (4 pages).
//! Request 3 asks for blocks 1, 2 again: 4 pages to load + 1 private with 2 free, so blocks 4
//! and 3 go to the host (4 more pages) and blocks 1, 2 are loaded back: 4 pages, 1,024 tokens
//! from the host. Backups 8 pages, loads 4 pages.

use kvlayout_core::{MemoryLayout, file};
use kvlayout_models::{IndexK, Model, PoolOptions};
use kvlayout_replay::HostSource;
use kvlayout_replay::schedule::WritePolicy;
use kvlayout_replay::trace_replay::{
    DSV4_FLASH_KV_BUDGET_BYTES, TraceHost, TraceInput, TraceOutcome, kv_budget_bytes, run_trace,
};

const TRACE: &str = concat!(
    r#"{"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]}"#,
    "\n",
    r#"{"timestamp": 10000, "input_length": 1024, "output_length": 8, "hash_ids": [3, 4]}"#,
    "\n",
    r#"{"timestamp": 20000, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]}"#,
    "\n",
);

/// Every buffer of the V4 pool, in SGLang's order.
const ALL: [&str; 7] = [
    "swa",
    "c4_kv",
    "c4_index_k",
    "c128_kv",
    "c4_state",
    "c4_index_state",
    "c128_state",
];

fn v4() -> Model {
    Model::builtin("deepseek-v4-flash").unwrap().unwrap()
}

fn input(index_k: IndexK, host: TraceHost, verify: bool, buffers: &[&str]) -> TraceInput {
    TraceInput {
        model: v4(),
        pool: PoolOptions {
            index_k,
            page_size_tokens: 256,
            ..PoolOptions::default()
        },
        device_pages: Some(6),
        host,
        verify,
        layers: 1,
        buffers: Some(buffers.iter().map(|b| b.to_string()).collect()),
        top_k: 16,
        indexer_heads: 8,
        seed: 2026,
        write_policy: WritePolicy::WriteBack,
        prefill_tokens_per_s: 20_000,
        decode_ms_per_token: 20,
        trace_name: "three requests".into(),
        checksum: kvlayout_pool::ChecksumMode::Off,
    }
}

fn mirror() -> TraceHost {
    TraceHost::Mirror {
        pages: Some(16),
        memory_layout: MemoryLayout::PageFirst,
    }
}

#[test]
fn every_v4_buffer_is_paged_and_moved_whole() {
    let r = match run_trace(
        &input(IndexK::Fp8, mirror(), true, &ALL),
        TRACE.as_bytes(),
        &mut |_| {},
    )
    .unwrap()
    {
        TraceOutcome::Completed(r) => r,
        TraceOutcome::Refused(r) => panic!("{:?}", r.mismatch),
    };
    assert_eq!(r.page_size_tokens, 256);
    assert_eq!(r.requests, 3);
    assert_eq!(r.host_tokens, 1_024);
    assert_eq!(r.pages.loaded_pages, 4);
    assert_eq!(r.pages.backed_up_pages, 8);
    assert_eq!(r.corrupted_requests, 0);
    // Layer 0 of each buffer, one page (models/tests/deepseek_v4.rs): swa 149,760 + c4_kv
    // 37,440 + c4_index_k 8,448 + c128_kv 1,728 + c4_state 65,536 + c4_index_state 16,384 +
    // the c128_state slot 524,288 = 803,584 B: compressed rows counted per R tokens (64 rows
    // of c4, 2 of c128, 8 ring rows), the state slot moved whole.
    let page = 149_760 + 37_440 + 8_448 + 1_728 + 65_536 + 16_384 + 524_288;
    assert_eq!(page, 803_584);
    assert_eq!(r.loaded_bytes, 4 * page);
    assert_eq!(r.backed_up_bytes, 8 * page);
}

#[test]
fn the_seeds_pair_on_v4_geometry_is_refused_or_corrupts() {
    // configs/geometry/host-v4-c4-index-k-fp8-formula.json: the V4 pool with its C4 index-K
    // sized by the fp8 formula, 128 + 128 // 128 x 4 = 132 B a row (64 rows: 8,448 B a page),
    // against a bf16 device's 128 x 2 = 256 B (16,384 B a page).
    let host = || {
        let text = include_str!("../../configs/geometry/host-v4-c4-index-k-fp8-formula.json");
        TraceHost::Foreign(HostSource::Foreign {
            geometry: file::from_json(text).unwrap(),
            source: "configs/geometry/host-v4-c4-index-k-fp8-formula.json".into(),
        })
    };
    let refused = run_trace(
        &input(IndexK::Bf16, host(), true, &["c4_index_k"]),
        TRACE.as_bytes(),
        &mut |_| {},
    )
    .unwrap();
    let TraceOutcome::Refused(r) = refused else {
        panic!("the pairing must be refused");
    };
    assert_eq!(r.requests, 0);
    assert!(
        r.mismatch
            .iter()
            .any(|m| m.contains("c4_index_k.page_stride_bytes: 16384, 8448")),
        "{:?}",
        r.mismatch
    );
    assert!(
        r.mismatch
            .iter()
            .any(|m| m.contains("256 B per 4 tokens, 132 B per 4 tokens")),
        "{:?}",
        r.mismatch
    );
    // --no-verify: the host's 8,448-B item size on both sides; the one request that loads
    // (request 3, 4 pages) reads index-K rows that are not the ones it wrote.
    let TraceOutcome::Completed(r) = run_trace(
        &input(IndexK::Bf16, host(), false, &["c4_index_k"]),
        TRACE.as_bytes(),
        &mut |_| {},
    )
    .unwrap() else {
        panic!("unverified pools pair");
    };
    assert_eq!(r.pages.loaded_pages, 4);
    assert_eq!(r.corrupted_requests, 1);
    // The same with an fp8 device (132 B both sides): nothing corrupted.
    let TraceOutcome::Completed(r) = run_trace(
        &input(IndexK::Fp8, host(), true, &["c4_index_k"]),
        TRACE.as_bytes(),
        &mut |_| {},
    )
    .unwrap() else {
        panic!("an fp8 device pairs with the fp8-formula host");
    };
    assert_eq!((r.pages.loaded_pages, r.corrupted_requests), (4, 0));
}

#[test]
fn the_default_capacity_is_the_stated_h200_budget() {
    // 0.90 x 141 GB - 20 GB = 106.9 GB; / 19,643,968 B per 256-token page over all layers
    // (43 x 149,760 + 21 x 37,440 + 21 x 8,448 + 20 x 1,728 + 21 x 65,536 + 21 x 16,384 +
    // 20 x 524,288) = 5,441 pages (5,441 x 19,643,968 = 106,882,829,888 <= 106.9 GB <
    // 5,442 x 19,643,968 = 106,902,473,856).
    assert_eq!(DSV4_FLASH_KV_BUDGET_BYTES, 106_900_000_000);
    assert_eq!(kv_budget_bytes(&v4()), 106_900_000_000);
    let per_page = 43 * 149_760
        + 21 * 37_440
        + 21 * 8_448
        + 20 * 1_728
        + 21 * 65_536
        + 21 * 16_384
        + 20 * 524_288;
    assert_eq!(per_page, 19_643_968);
    let g = v4()
        .pool(&PoolOptions {
            pages: 1,
            page_size_tokens: 256,
            ..PoolOptions::default()
        })
        .unwrap()
        .geometry;
    assert_eq!(g.total_bytes().unwrap(), per_page);
    let mut one = input(IndexK::Fp8, mirror(), true, &["c4_index_k"]);
    one.device_pages = None;
    one.host = TraceHost::Mirror {
        pages: Some(16),
        memory_layout: MemoryLayout::LayerFirst,
    };
    let TraceOutcome::Completed(r) = run_trace(&one, TRACE.as_bytes(), &mut |_| {}).unwrap() else {
        panic!("mirror pairs");
    };
    assert_eq!(r.device_pages, 5_441);
    assert!(
        r.device_pages_source.contains("106900000000") && r.device_pages_source.contains("V4"),
        "{}",
        r.device_pages_source
    );
}

#[test]
fn the_synthetic_workload_refuses_v4_by_buffer_name() {
    use kvlayout_replay::synthetic::{self, ReplayInput, Workload};
    let e = synthetic::run(
        &ReplayInput {
            model: v4(),
            pool: PoolOptions {
                page_size_tokens: 256,
                ..PoolOptions::default()
            },
            host: HostSource::Mirror {
                pages: 64,
                memory_layout: MemoryLayout::LayerFirst,
            },
            verify: true,
            workload: Workload::default(),
        },
        &mut |_, _| {},
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("buffer `swa`") && e.contains("sliding window"),
        "{e}"
    );
}
