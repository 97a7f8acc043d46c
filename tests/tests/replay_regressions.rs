//! Regressions from the new-user review of `kvlayout replay` (notes F2, F4, F12; F11's exit
//! code is tested on the binary in cli-tests/replay.rs), on the
//! small workload of tests/tests/replay.rs (8 sessions, 2 layers, device pool of 14 pages).

use kvlayout_core::file;
use kvlayout_models::{IndexK, Model, PoolOptions};
use kvlayout_pool::replay::{self, HostSource, ReplayInput, ReplayOutcome, ReplayReport, Workload};

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

/// F2: with top-k past every context (348 tokens at most), every past token is selected on
/// both sides, so the truncated index-K cannot change what attention reads: 0 corrupted.
/// Before, an order change inside the selected set counted as corruption (80 of 80).
#[test]
fn top_k_is_compared_as_a_set() {
    let r = completed(replay::run(&input(100_000, 2), &mut |_, _| {}).unwrap());
    assert_eq!(r.topk_mismatches, 0, "{r:?}");
    assert_eq!(r.corrupted_sessions, 0);
    // The same run at top-16 still catches the seed bug.
    let r = completed(replay::run(&input(16, 2), &mut |_, _| {}).unwrap());
    assert!(r.corrupted_sessions > 0, "{r:?}");
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
