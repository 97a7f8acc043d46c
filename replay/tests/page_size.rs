//! The trace replay refuses a page size its schedule cannot model before it sizes any pool
//! (the trial: `--page-size-tokens 100000` built a 1.7 GB device pool, then was refused).

use kvlayout_core::MemoryLayout;
use kvlayout_models::{IndexK, Model, PoolOptions};
use kvlayout_pool::ChecksumMode;
use kvlayout_replay::schedule::WritePolicy;
use kvlayout_replay::trace_replay::{TraceHost, TraceInput, run_trace};

fn input(page_size_tokens: u64, device_pages: u64) -> TraceInput {
    TraceInput {
        model: Model::builtin("deepseek-v3.2-exp").unwrap().unwrap(),
        pool: PoolOptions {
            index_k: IndexK::Bf16,
            page_size_tokens,
            ..PoolOptions::default()
        },
        device_pages: Some(device_pages),
        host: TraceHost::Mirror {
            pages: Some(64),
            memory_layout: MemoryLayout::PageFirst,
        },
        verify: true,
        layers: 1,
        buffers: None,
        top_k: 16,
        indexer_heads: 8,
        seed: 2026,
        write_policy: WritePolicy::WriteBack,
        prefill_tokens_per_s: 20_000,
        decode_ms_per_token: 20,
        trace_name: "empty".into(),
        checksum: ChecksumMode::Off,
    }
}

/// 100,000 does not divide 512 and 1 gives 512 pages a block (at most 8 are modelled): both are
/// named before the pools are sized, so before the device-page count (0 here, itself refused
/// once the pools are sized) is looked at.
#[test]
fn a_page_size_the_schedule_cannot_model_is_refused_before_the_pools_are_sized() {
    for (page, why) in [
        (
            100_000,
            "100000 does not divide the trace's 512-token blocks",
        ),
        (
            1,
            "1 gives 512 pages per 512-token block; at most 8 are modelled",
        ),
    ] {
        let e = match run_trace(&input(page, 0), &b""[..], &mut |_| {}) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("page size {page} was accepted"),
        };
        assert!(e.contains("page_size_tokens") && e.contains(why), "{e}");
    }
    // A page size it models reaches the pool sizing: the 0 device pages are named.
    let e = match run_trace(&input(64, 0), &b""[..], &mut |_| {}) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("0 device pages were accepted"),
    };
    assert!(
        e.contains("device_pages") && e.contains("must be at least 1, got 0"),
        "{e}"
    );
}
