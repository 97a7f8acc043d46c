//! Checks shared by the CPU references (the index-K quantizer's slot lists, `index_k`): the
//! same checks, in the same order, as a GPU launch makes before it writes.

use crate::error::KernelError;

/// First bad position of two lists of equal length against two limits.
pub(crate) fn check_lists(
    a: &[u64],
    a_limit: u64,
    b: &[u64],
    b_limit: u64,
) -> Result<(), KernelError> {
    let mut first: Option<usize> = None;
    let mut bad_count = 0u64;
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        if x >= a_limit || y >= b_limit {
            bad_count += 1;
            first.get_or_insert(i);
        }
    }
    match first {
        None => Ok(()),
        Some(i) => Err(KernelError::IndexOutOfRange {
            position: i as u64,
            src_index: a[i],
            src_limit: a_limit,
            dst_index: b[i],
            dst_limit: b_limit,
            bad_count,
        }),
    }
}

/// Checks that a buffer of `actual` bytes holds a side needing `expected` bytes.
pub(crate) fn check_len(what: &str, expected: u64, actual: u64) -> Result<(), KernelError> {
    if actual < expected {
        return Err(KernelError::Length {
            what: what.to_string(),
            expected,
            actual,
            unit: "bytes",
        });
    }
    Ok(())
}
