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

/// Offsets and lengths of a run the token kernel takes are multiples of this many bytes (its
/// 16-byte vectors).
pub(crate) const VECTOR_BYTES: u64 = 16;

/// What the chooser reads from a run list, found in one pass over it ([`scan_runs`]) instead
/// of one pass per question: at page size 1 a layer's load is 16,384 to 32,768 runs and a
/// backup of all layers about a million, and each pass over them is host time the GPU may
/// wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunScan {
    /// Runs in the list.
    pub runs: u64,
    /// Bytes of all runs together (a `u128`: a checked list of `u64` lengths cannot overflow
    /// it).
    pub total_bytes: u128,
    /// Merging neighbours in list order would change the list: an empty run, or a run that
    /// continues the one before it on both sides (the sum of lengths fitting a `u64`); the
    /// answer of [`crate::device::options::changed_by_merging`].
    pub changed_by_merging: bool,
    /// The length every run has, when they all have one and every offset and that length are
    /// multiples of 16 bytes (a non-empty list); `None` otherwise.
    pub uniform_len_bytes: Option<u64>,
}

impl RunScan {
    /// The count and bytes of a list, with nothing known of its merging or lengths.
    pub(crate) const fn counted(runs: u64, total_bytes: u128) -> RunScan {
        RunScan {
            runs,
            total_bytes,
            changed_by_merging: false,
            uniform_len_bytes: None,
        }
    }

    /// True when the mean run is at least `min_mean_bytes` long (an empty list: never).
    pub fn mean_at_least(&self, min_mean_bytes: u64) -> bool {
        self.runs > 0 && self.total_bytes >= u128::from(min_mean_bytes) * u128::from(self.runs)
    }
}

/// Checks every run of `runs` against a source of `src_len` bytes and a destination of
/// `dst_len` bytes, as [`validate_runs`] does (the same error for the first bad run), and
/// gives the facts of [`RunScan`], all in one pass.
pub fn scan_runs(runs: &[ByteRun], src_len: u64, dst_len: u64) -> Result<RunScan, KernelError> {
    let (scan, all_fit) = scan_facts(runs, src_len, dst_len);
    if !all_fit {
        validate_runs(runs, src_len, dst_len)?;
    }
    Ok(scan)
}

/// The facts of [`RunScan`] for any list, and whether every run fits both regions: a list
/// with a run past `u64::MAX` still has its merging answered
/// ([`crate::device::options::changed_by_merging`]).
pub(crate) fn scan_facts(runs: &[ByteRun], src_len: u64, dst_len: u64) -> (RunScan, bool) {
    let first_len = runs.first().map_or(0, |r| r.len_bytes);
    let (mut total_bytes, mut all_fit, mut merges) = (0u128, true, false);
    let (mut same_len, mut offsets_or) = (true, first_len);
    let mut prev: Option<&ByteRun> = None;
    for r in runs {
        all_fit &= r.fits(src_len, dst_len);
        total_bytes += u128::from(r.len_bytes);
        same_len &= r.len_bytes == first_len;
        offsets_or |= r.src_offset_bytes | r.dst_offset_bytes;
        merges |= r.len_bytes == 0
            || prev.is_some_and(|p| {
                p.src_offset_bytes.checked_add(p.len_bytes) == Some(r.src_offset_bytes)
                    && p.dst_offset_bytes.checked_add(p.len_bytes) == Some(r.dst_offset_bytes)
                    && p.len_bytes.checked_add(r.len_bytes).is_some()
            });
        prev = Some(r);
    }
    let uniform = !runs.is_empty() && same_len && offsets_or.is_multiple_of(VECTOR_BYTES);
    let scan = RunScan {
        runs: runs.len() as u64,
        total_bytes,
        changed_by_merging: merges,
        uniform_len_bytes: uniform.then_some(first_len),
    };
    (scan, all_fit)
}

#[cfg(test)]
mod tests {
    use super::{ByteRun, RunScan, scan_runs};
    use crate::device::options::changed_by_merging;
    use crate::error::KernelError;

    #[test]
    fn one_pass_gives_what_the_separate_passes_gave() {
        // Llama-3.1-8B token runs (2,048 B) between unrelated slots; merging, an empty run,
        // unaligned offsets, two lengths, nothing.
        let lists: [&[ByteRun]; 7] = [
            &[ByteRun::new(0, 8192, 2048), ByteRun::new(4096, 0, 2048)],
            &[ByteRun::new(0, 0, 2048), ByteRun::new(2048, 2048, 2048)],
            &[ByteRun::new(0, 8192, 2048), ByteRun::new(64, 64, 0)],
            &[ByteRun::new(8, 0, 2048)],
            &[ByteRun::new(0, 0, 2048), ByteRun::new(4096, 8192, 1024)],
            &[ByteRun::new(0, 0, 1000)],
            &[],
        ];
        // By hand, per list: (total bytes, changed by merging, uniform length).
        let expected: [(u128, bool, Option<u64>); 7] = [
            (4096, false, Some(2048)),
            (4096, true, Some(2048)),
            (2048, true, None),
            (2048, false, None),
            (3072, false, None),
            (1000, false, None),
            (0, false, None),
        ];
        for (runs, (total_bytes, changed, uniform)) in lists.iter().zip(expected) {
            let scan = scan_runs(runs, 1 << 20, 1 << 20).unwrap();
            let want = RunScan {
                runs: runs.len() as u64,
                total_bytes,
                changed_by_merging: changed,
                uniform_len_bytes: uniform,
            };
            assert_eq!(scan, want, "{runs:?}");
            assert_eq!(
                scan.changed_by_merging,
                changed_by_merging(runs),
                "{runs:?}"
            );
        }
        // Mean of the first list: 2,048 B; of nothing: never long.
        let two = scan_runs(lists[0], 1 << 20, 1 << 20).unwrap();
        assert!(two.mean_at_least(2048) && !two.mean_at_least(2049));
        assert!(!scan_runs(&[], 0, 0).unwrap().mean_at_least(0));
    }

    #[test]
    fn a_bad_run_is_named_as_validate_runs_names_it() {
        // Runs 1 and 2 end past a 4,096-byte destination: the first is named, both counted.
        let runs = [
            ByteRun::new(0, 0, 2048),
            ByteRun::new(0, 4096, 16),
            ByteRun::new(0, 2048, 2064),
        ];
        match scan_runs(&runs, 1 << 20, 4096) {
            Err(KernelError::RunOutOfRange {
                position,
                run,
                bad_count,
                ..
            }) => {
                assert_eq!((position, run, bad_count), (1, runs[1], 2));
            }
            other => panic!("{other:?}"),
        }
    }
}
