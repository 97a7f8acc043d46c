//! The CPU reference of the transfer kernel: the same contract, the same checks, in the same
//! order (validate everything, then copy), so a refused copy moves no byte on either backend.

use crate::copy_spec::CopySpec;
use crate::error::{KernelError, Side};

/// Checks two index lists against `spec`: equal lengths, every source index below
/// `spec.src.pages * items_per_page` and every destination index below the destination's
/// limit. On failure reports the first bad position (and how many are bad), as the GPU
/// validation pass does.
pub fn validate_index_lists(
    spec: &CopySpec,
    src_idx: &[u64],
    dst_idx: &[u64],
) -> Result<(), KernelError> {
    if src_idx.len() != dst_idx.len() {
        return Err(KernelError::Length {
            what: "dst index list (must match the src index list)".to_string(),
            expected: src_idx.len() as u64,
            actual: dst_idx.len() as u64,
            unit: "indices",
        });
    }
    let src_limit = spec.index_limit(Side::Src)?;
    let dst_limit = spec.index_limit(Side::Dst)?;
    check_lists(src_idx, src_limit, dst_idx, dst_limit)
}

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

/// Copies item `src_idx[i]` of `src` to item `dst_idx[i]` of `dst` for every position `i` and
/// every layer of `spec.layers`, after checking the spec ([`CopySpec::validate`]), both buffer
/// lengths against `total_bytes` and every index ([`validate_index_lists`]). On any error
/// nothing is written. Destination indices should be distinct: with duplicates the last
/// position wins here, and which one wins on the GPU is unspecified.
pub fn copy_items_cpu(
    spec: &CopySpec,
    src: &[u8],
    dst: &mut [u8],
    src_idx: &[u64],
    dst_idx: &[u64],
) -> Result<(), KernelError> {
    spec.validate()?;
    check_len("src buffer", spec.src.total_bytes, src.len() as u64)?;
    check_len("dst buffer", spec.dst.total_bytes, dst.len() as u64)?;
    validate_index_lists(spec, src_idx, dst_idx)?;
    // Every offset below is in range: validate() bounded the last item of every layer and page
    // by total_bytes, which fits in both slices.
    let n = spec.item_bytes as usize;
    for layer in spec.layers.clone() {
        for (&si, &di) in src_idx.iter().zip(dst_idx) {
            let so = spec.offset_bytes(Side::Src, layer, si)? as usize;
            let d = spec.offset_bytes(Side::Dst, layer, di)? as usize;
            dst[d..d + n].copy_from_slice(&src[so..so + n]);
        }
    }
    Ok(())
}
