//! `kvlayout replay`'s four expected outcomes on DeepSeek-V3.2-Exp (issue 3), on a small
//! workload so the debug test stays fast: 8 sessions in 2 prefix groups, 3 turns, 2 layers,
//! batches of 2, 4 decoded tokens per turn, 2 indexer heads, and a device pool of 14 pages.
//! A session ends at 3 x 64 + 3 x (48 + 4) = 348 tokens = 6 pages, a batch needs 2 x 6 = 12 <=
//! 14 pages, and the working set is 2 x 3 prefix + 8 x 3 own = 30 pages > 14, so a session's
//! pages are backed up while the other batches run and loaded back on its next turn.

use kvlayout_core::{MemoryLayout, file};
use kvlayout_models::{IndexK, Model, PoolOptions};
use kvlayout_pool::replay::{self, HostSource, ReplayInput, ReplayOutcome, ReplayReport, Workload};

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
    assert!(r.pages_backed_up > 0, "{r:?}");
    assert!(r.pages_loaded > 0, "{r:?}");
    assert_eq!(r.bytes_loaded, r.pages_loaded * bytes_per_page_all_layers);
    assert_eq!(
        r.bytes_backed_up,
        r.pages_backed_up * bytes_per_page_all_layers
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
        "bytes_loaded",
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
