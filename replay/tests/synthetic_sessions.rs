//! The synthetic replay refuses a session count its pools cannot hold, and one whose list
//! cannot be allocated, naming the sessions (the trial: `--sessions 18446744073709551615`
//! panicked with `capacity overflow`, `--sessions 1000000000` aborted allocating 72 GB).

use kvlayout_core::MemoryLayout;
use kvlayout_models::{Model, PoolOptions};
use kvlayout_replay::synthetic::{ReplayInput, Workload, run};
use kvlayout_replay::{HostSource, Param, ReplayError};

/// llama-3.1-8b at one token a page, 1 simulated layer, `device_pages` and `host_pages`.
fn input(workload: Workload, host_pages: u64) -> ReplayInput {
    ReplayInput {
        model: Model::builtin("llama-3.1-8b").unwrap().unwrap(),
        pool: PoolOptions {
            page_size_tokens: 1,
            ..PoolOptions::default()
        },
        host: HostSource::Mirror {
            pages: host_pages,
            memory_layout: MemoryLayout::LayerFirst,
        },
        verify: true,
        workload: Workload {
            layers: 1,
            concurrency: 2,
            ..workload
        },
    }
}

/// The `--sessions` problem of a run that must fail on it.
fn sessions_problem(input: &ReplayInput) -> String {
    match run(input, &mut |_, _| {}) {
        Err(ReplayError::Workload {
            param: Param::Sessions,
            problem,
            defaulted: None,
        }) => problem,
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("{} sessions ran", input.workload.sessions),
    }
}

/// A session of the default workload owns 3 turns x (48 + 8) = 168 tokens past its group's
/// prefix, 168 pages of one token; the 8 groups share 8 x 3 = 24 prefix pages. 400 device +
/// 2000 host pages may hold 14 sessions (14 x 168 + 24 = 2376) but never 15 (2544): every page
/// stays in a pool to the end (host pages are never evicted). (14 stop later on a full host
/// pool, as reloaded pages keep their host pages: the bound is necessary, not sufficient.)
#[test]
fn more_sessions_than_the_pools_hold_are_refused_naming_the_count() {
    let w = |sessions| Workload {
        sessions,
        device_pages: 400,
        ..Workload::default()
    };
    assert_eq!(
        sessions_problem(&input(w(15), 2000)),
        "15 sessions of 168 pages each (plus 24 shared prefix pages) need 2544 pages, more \
         than the device and host pools' 400 + 2000 = 2400 pages (this replay does not evict \
         host pages)"
    );
    // 2^64 - 1 sessions: (2^64 - 1) x 168 + 24 pages, computed past 64 bits, not a panic.
    let p = sessions_problem(&input(w(u64::MAX), 2000));
    assert!(
        p.starts_with(
            "18446744073709551615 sessions of 168 pages each (plus 24 shared prefix pages) \
             need 3099053004383204671344 pages"
        ),
        "{p}"
    );
}

/// Sessions that write nothing (no prefix, prompt or decoded token) need no page, so the
/// pools do not bound them; 2^64 - 1 of them are refused by the top-k bound (there is no token
/// to sample: a run would have divided by zero picking one), not a `capacity overflow` panic
/// allocating their list.
#[test]
fn sessions_that_write_nothing_are_refused_before_their_list_is_allocated() {
    let w = Workload {
        sessions: u64::MAX,
        prefix_pages: 0,
        user_tokens: 0,
        decode_tokens: 0,
        device_pages: 1,
        ..Workload::default()
    };
    assert_eq!(
        problem_of(&input(w, 1), Param::TopK),
        "16 is more than the 0 tokens sampled from (no indexer) at the first decode step \
         (0 prefix + 0 prompt tokens)"
    );
}

/// The error of a run that must fail on `param`.
fn problem_of(input: &ReplayInput, param: Param) -> String {
    match run(input, &mut |_, _| {}) {
        Err(ReplayError::Workload {
            param: p, problem, ..
        }) if p == param => problem,
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("ran"),
    }
}

/// A turn's tokens (prompt + decoded) past u64::MAX are a token-count error, not an overflow
/// panic (the sum was unchecked; a library caller sets both).
#[test]
fn a_turn_of_more_tokens_than_u64_holds_is_refused() {
    let w = Workload {
        user_tokens: u64::MAX,
        decode_tokens: 1,
        device_pages: 400,
        ..Workload::default()
    };
    assert_eq!(
        problem_of(&input(w, 2000), Param::Turns),
        "token count overflows"
    );
}

/// More sessions at once than there are: the message counts the sessions that run together.
/// At one token a page a default session is 3 prefix tokens + 3 turns x (48 + 8) = 171 pages;
/// 3 of them need 513 of 400 device pages, 2 fit (400 / 171).
#[test]
fn a_concurrency_above_the_session_count_says_how_many_run() {
    let w = Workload {
        sessions: 3,
        device_pages: 400,
        ..Workload::default()
    };
    let mut i = input(w, 2000);
    i.workload.concurrency = 5;
    assert_eq!(
        problem_of(&i, Param::Concurrency),
        "5 sessions (all 3 there are) at once need 3 x 171 pages = 513, more than the device \
         pool's 400 pages (--device-pages); at most 2 fit"
    );
}
