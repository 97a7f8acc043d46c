//! Run-list copies: the form `kvlayout-pool`'s shim already produces (a checked
//! `TransferPlan` flattened to `(src offset, dst offset, length)` runs, one per page of one layer
//! of one buffer, or per segment under `page_head`). The GPU executes such a list with
//! [`crate::Gpu::copy_runs`] (SM kernel), [`crate::Gpu::enqueue_copy_runs_dma`] (copy engines) or
//! [`crate::Gpu::transfer_runs`] (the chooser); the CPU reference is the pool crate's CPU backend
//! (`kvlayout_pool::CpuBackend`), which the GPU tests compare against. Every path checks every
//! run inside both regions first ([`validate_runs`]), so a bad list moves no byte.

use crate::error::KernelError;

/// One contiguous copy: `len_bytes` from `src_offset_bytes` of the source region to
/// `dst_offset_bytes` of the destination region (the fields of `kvlayout_pool::CopyRun`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ByteRun {
    /// Offset in the source region.
    pub src_offset_bytes: u64,
    /// Offset in the destination region.
    pub dst_offset_bytes: u64,
    /// Bytes to copy.
    pub len_bytes: u64,
}

impl ByteRun {
    /// A run.
    pub const fn new(src_offset_bytes: u64, dst_offset_bytes: u64, len_bytes: u64) -> ByteRun {
        ByteRun {
            src_offset_bytes,
            dst_offset_bytes,
            len_bytes,
        }
    }

    /// True when the run lies inside a source of `src_len` bytes and a destination of
    /// `dst_len` bytes (computed without overflow).
    pub const fn fits(&self, src_len: u64, dst_len: u64) -> bool {
        self.src_offset_bytes <= src_len
            && self.len_bytes <= src_len - self.src_offset_bytes
            && self.dst_offset_bytes <= dst_len
            && self.len_bytes <= dst_len - self.dst_offset_bytes
    }
}

/// The first run outside either region, as [`KernelError::RunOutOfRange`].
pub fn validate_runs(runs: &[ByteRun], src_len: u64, dst_len: u64) -> Result<(), KernelError> {
    let mut bad = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.fits(src_len, dst_len));
    match bad.next() {
        None => Ok(()),
        Some((position, run)) => Err(KernelError::RunOutOfRange {
            position: position as u64,
            run: *run,
            src_len_bytes: src_len,
            dst_len_bytes: dst_len,
            bad_count: 1 + bad.count() as u64,
        }),
    }
}
