//! Properties of `scan_runs` and `in_key_buckets(_into)` on generated lists, against their
//! definitions written out independently here.

use kvlayout_kernels::copy_runs::{ByteRun, scan_runs, validate_runs};
use kvlayout_kernels::device::options::{changed_by_merging, in_key_buckets, in_key_buckets_into};
use kvlayout_kernels::{RunOrder, TransferPath};
use proptest::prelude::*;

/// Offsets and lengths mixing small multiples of 16, odd values and values near u64::MAX.
fn word() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0u64..64).prop_map(|x| x * 16),
        0u64..300,
        (0u64..64).prop_map(|x| u64::MAX - x),
        any::<u64>(),
        Just(0u64),
    ]
}

fn run() -> impl Strategy<Value = ByteRun> {
    (word(), word(), word()).prop_map(|(s, d, l)| ByteRun::new(s, d, l))
}

/// Lists whose neighbours often continue each other (so merging is exercised).
fn runs() -> impl Strategy<Value = Vec<ByteRun>> {
    prop_oneof![
        prop::collection::vec(run(), 0..40),
        (
            prop::collection::vec((0u64..4, 0u64..3, prop::bool::ANY), 0..40),
            word(),
            word()
        )
            .prop_map(|(steps, s0, d0)| {
                let (mut s, mut d) = (s0 % (1 << 40), d0 % (1 << 40));
                steps
                    .into_iter()
                    .map(|(len16, gap16, dst_gap)| {
                        let len = len16 * 16;
                        let r = ByteRun::new(s, d, len);
                        s += len + gap16 * 16;
                        d += len + if dst_gap { 16 } else { 0 };
                        r
                    })
                    .collect()
            }),
    ]
}

fn fits_in(r: &ByteRun, src: u64, dst: u64) -> bool {
    u128::from(r.src_offset_bytes) + u128::from(r.len_bytes) <= u128::from(src)
        && u128::from(r.dst_offset_bytes) + u128::from(r.len_bytes) <= u128::from(dst)
}

/// Expected bucket order: the bucket width is the smallest power of two 2^s with
/// span / 2^s below the target count; a key above the span goes to the span's bucket.
fn expected_buckets(runs: &[ByteRun], key: fn(&ByteRun) -> u64, span: u64) -> Vec<ByteRun> {
    let target = ((runs.len() / 4) as u128).clamp(1, 1024);
    let s = (0u32..=64)
        .find(|&s| (u128::from(span) >> s) < target)
        .unwrap();
    let bucket = |k: u64| (u128::from(k) >> s).min(u128::from(span) >> s);
    let buckets = (u128::from(span) >> s) + 1;
    assert!(buckets <= target, "{buckets} buckets, target {target}");
    let mut v = runs.to_vec();
    v.sort_by_key(|r| bucket(key(r))); // stable: list order inside a bucket
    v
}

fn sorted(mut v: Vec<ByteRun>) -> Vec<ByteRun> {
    v.sort_by_key(|r| (r.src_offset_bytes, r.dst_offset_bytes, r.len_bytes));
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn scan_agrees_with_the_separate_passes(runs in runs(), src in word(), dst in word()) {
        let scan = scan_runs(&runs, src, dst);
        let valid = validate_runs(&runs, src, dst);
        prop_assert_eq!(valid.is_ok(), runs.iter().all(|r| fits_in(r, src, dst)));
        match (&scan, &valid) {
            (Ok(_), Ok(())) => {}
            (Err(a), Err(b)) => prop_assert_eq!(format!("{a:?}"), format!("{b:?}")),
            _ => prop_assert!(false, "scan {:?} validate {:?}", scan, valid),
        }
        // Facts on regions every run fits (when the runs fit u64 at all).
        if let Ok(scan) = scan_runs(&runs, u64::MAX, u64::MAX) {
            let total: u128 = runs.iter().map(|r| u128::from(r.len_bytes)).sum();
            prop_assert_eq!(scan.total_bytes, total);
            prop_assert_eq!(scan.runs, runs.len() as u64);
            let merged = RunOrder::AsGiven.sorted_and_merged(&runs);
            prop_assert_eq!(scan.changed_by_merging, merged != runs);
            prop_assert_eq!(scan.mean_at_least(4096), TransferPath::mean_is_long(&runs));
            let uniform = runs.first().map(|f| f.len_bytes).filter(|&l| {
                runs.iter().all(|r| {
                    r.len_bytes == l
                        && r.src_offset_bytes % 16 == 0
                        && r.dst_offset_bytes % 16 == 0
                }) && l % 16 == 0
            });
            prop_assert_eq!(scan.uniform_len_bytes, uniform);
        }
        // changed_by_merging is what AsGiven merging does, for any list.
        let merged = RunOrder::AsGiven.sorted_and_merged(&runs);
        prop_assert_eq!(changed_by_merging(&runs), merged != runs, "{:?}", runs);
    }

    #[test]
    fn buckets_are_a_stable_bucket_sort(runs in runs(), span in word(), by_src in any::<bool>()) {
        let key: fn(&ByteRun) -> u64 = if by_src {
            |r| r.src_offset_bytes
        } else {
            |r| r.dst_offset_bytes
        };
        let (mut out, mut starts) = (vec![ByteRun::new(1, 2, 3); 5], vec![7usize; 3]);
        in_key_buckets_into(&runs, (key, span), &mut out, &mut starts);
        prop_assert_eq!(sorted(out.clone()), sorted(runs.clone()));
        prop_assert_eq!(&out, &expected_buckets(&runs, key, span));
        let got = in_key_buckets(&runs, key);
        let max = runs.iter().map(key).max().unwrap_or(0);
        prop_assert_eq!(&got, &expected_buckets(&runs, key, max));
    }
}

#[test]
fn one_run_zero_span_all_same_key_and_a_huge_list() {
    let key: fn(&ByteRun) -> u64 = |r| r.src_offset_bytes;
    let (mut out, mut starts) = (Vec::new(), Vec::new());
    // Span 0, keys above it: one bucket, list order.
    let runs: Vec<ByteRun> = (0..100u64).map(|i| ByteRun::new(1000 - i, i, 16)).collect();
    in_key_buckets_into(&runs, (key, 0), &mut out, &mut starts);
    assert_eq!(out, runs);
    // Span u64::MAX, 4,096 runs: 1,024 buckets of 2^54 bytes: everything below 2^54 in one.
    in_key_buckets_into(&runs, (key, u64::MAX), &mut out, &mut starts);
    assert_eq!(out, runs);
    // All runs the same key: list order.
    let same: Vec<ByteRun> = (0..5000u64)
        .map(|i| ByteRun::new(4096, i * 16, 16))
        .collect();
    in_key_buckets_into(&same, (key, 1 << 20), &mut out, &mut starts);
    assert_eq!(out, same);
    // A million runs in reverse key order, span = largest key: 1,024 buckets of width
    // 2^s, ascending by bucket.
    let n = 1u64 << 20;
    let big: Vec<ByteRun> = (0..n)
        .map(|i| ByteRun::new((n - 1 - i) * 16, i * 16, 16))
        .collect();
    in_key_buckets_into(&big, (key, (n - 1) * 16), &mut out, &mut starts);
    assert!(starts.len() <= 1025, "{}", starts.len());
    // span 16 * (2^20 - 1) < 2^24; 1,024 buckets of 2^14 B = 1,024 runs each.
    for (i, r) in out.iter().enumerate() {
        let bucket = i as u64 / 1024;
        assert_eq!(r.src_offset_bytes >> 14, bucket);
    }
    // scan_runs of a million runs: bytes, no merge (they run backwards on the source).
    let scan = scan_runs(&big, n * 16, n * 16).unwrap();
    assert_eq!(scan.total_bytes, u128::from(n) * 16);
    assert!(!scan.changed_by_merging);
    assert_eq!(scan.uniform_len_bytes, Some(16));
    // One run at the very top of a u64::MAX region.
    let top = [ByteRun::new(u64::MAX - 16, u64::MAX - 16, 16)];
    let scan = scan_runs(&top, u64::MAX, u64::MAX).unwrap();
    assert_eq!(
        scan.uniform_len_bytes, None,
        "u64::MAX - 16 is not a multiple of 16"
    );
    assert_eq!(scan.total_bytes, 16);
}
