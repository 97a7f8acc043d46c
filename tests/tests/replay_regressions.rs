//! Regressions from the new-user review of `kvlayout replay` (notes F2, F4, F12; F11's exit
//! code is tested on the binary in cli/tests/replay.rs), on the
//! small workload of tests/tests/replay.rs (8 sessions, 2 layers, device pool of 14 pages).

use kvlayout_core::file;
use kvlayout_models::{IndexK, Model, PoolOptions};
use kvlayout_replay::synthetic::{
    self as replay, HostSource, ReplayInput, ReplayOutcome, ReplayReport, Workload,
};

const FP8_FORMULA_HOST: &str = include_str!("../../configs/geometry/host-index-k-fp8-formula.json");

fn input(top_k: usize, layers: u64) -> ReplayInput {
    ReplayInput {
        model: Model::builtin("deepseek-v3.2-exp").unwrap().unwrap(),
        pool: PoolOptions {
            index_k: IndexK::Bf16,
            ..PoolOptions::default()
        },
        host: HostSource::Foreign {
            geometry: file::from_json(FP8_FORMULA_HOST).unwrap(),
            source: "fp8-formula host".into(),
        },
        verify: false,
        workload: Workload {
            sessions: 8,
            layers,
            turns: 3,
            prefix_groups: 2,
            concurrency: 2,
            device_pages: 14,
            decode_tokens: 4,
            indexer_heads: 2,
            top_k,
            ..Workload::default()
        },
    }
}

fn completed(o: ReplayOutcome) -> ReplayReport {
    match o {
        ReplayOutcome::Completed(r) => *r,
        ReplayOutcome::Refused(r) => panic!("refused: {:?}", r.mismatch),
    }
}

/// F2: top-k is compared as a set (an order change inside the selected set reads the same
/// tokens). At a top-k equal to the first decode step's context, 3 x 64 prefix + 48 prompt =
/// 240 tokens, the first step of every turn-0 session selects every token on both sides; the
/// run still catches the seed bug at top-16.
#[test]
fn top_k_is_compared_as_a_set() {
    let r = completed(replay::run(&input(16, 2), &mut |_, _| {}).unwrap());
    assert!(r.corrupted_sessions > 0, "{r:?}");
    let r = completed(replay::run(&input(240, 2), &mut |_, _| {}).unwrap());
    assert_eq!(r.decode_steps, 96);
}

/// Issue 12: a top-k larger than the tokens it picks from is refused naming `top_k` (the
/// library's parameter; the CLI names it `--top-k`). Before, `--top-k 100000` selected
/// everything and checked nothing.
#[test]
fn top_k_past_the_first_context_is_refused() {
    let e = replay::run(&input(241, 2), &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("workload: top_k: 241 is more than the 240 tokens the indexer picks from"),
        "{e}"
    );
}

/// Issue 12: a batch larger than the device pool names `concurrency` (`--concurrency` in the
/// CLI). A session ends at
/// 3 x 64 + 3 x (48 + 4) = 348 tokens = ceil(348 / 64) = 6 pages; 3 at once need 18 > 14.
#[test]
fn concurrency_past_the_pool_names_concurrency() {
    let mut i = input(16, 2);
    i.workload.concurrency = 3;
    let e = replay::run(&i, &mut |_, _| {}).unwrap_err().to_string();
    assert!(
        e.contains("workload: concurrency: 3 sessions at once need 3 x 6 pages = 18, more than the device pool's 14 pages"),
        "{e}"
    );
}

/// F4: the fingerprints printed are those of the pools as declared (61 layers), the values
/// `check` and `describe` print, not of the 2 simulated layers.
#[test]
fn fingerprints_are_of_the_declared_pools() {
    let r = completed(replay::run(&input(16, 2), &mut |_, _| {}).unwrap());
    let host = file::from_json(FP8_FORMULA_HOST)
        .unwrap()
        .fingerprint()
        .unwrap();
    assert_eq!(r.host_fingerprint, format!("{host:#018x}"));
    let device = Model::builtin("deepseek-v3.2-exp")
        .unwrap()
        .unwrap()
        .pool(&PoolOptions {
            index_k: IndexK::Bf16,
            ..PoolOptions::default()
        })
        .unwrap()
        .geometry
        .fingerprint()
        .unwrap();
    assert_eq!(r.device_fingerprint, format!("{device:#018x}"));
}

/// F12: more simulated layers than the model has is an error, not a silent clamp.
#[test]
fn too_many_layers_is_an_error() {
    let e = replay::run(&input(16, 62), &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("62 simulated layers, but the model has 61"),
        "{e}"
    );
}
