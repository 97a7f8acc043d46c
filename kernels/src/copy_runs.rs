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
    /// True when the token kernel takes the list (`copy_runs_uniform`, which can be paced):
    /// one length, 128 to 4,096 B, a multiple of 16 at 16-byte offsets (the buffers' bases
    /// must be 16-byte aligned too, which the chooser checks). An empty run makes two lengths.
    pub fn takes_token_kernel(&self) -> bool {
        self.uniform_len_bytes
            .and_then(|len| crate::device::vectors_of_uniform(len, (0, 0)))
            .is_some()
    }

    /// True when the chooser treats the list as page runs (the copy engines' kind of list): a
    /// mean run of at least `COPY_ENGINE_MIN_MEAN_RUN_BYTES` (4,096 B) that the token kernel
    /// does not take. A list of 4,096 B runs of one length is token runs: Llama-3.1-8B's K and
    /// V of one token and layer together at page size 1 (kvlayout's `mha_bf16_8x128`, a vLLM
    /// FlashInfer block of one token), which the copy engines would move at a fixed cost per
    /// run.
    pub fn is_page_runs(&self) -> bool {
        self.mean_at_least(crate::device::options::COPY_ENGINE_MIN_MEAN_RUN_BYTES)
            && !self.takes_token_kernel()
    }

    /// True when the mean run is at least `min_mean_bytes` long (an empty list: never).
    pub fn mean_at_least(&self, min_mean_bytes: u64) -> bool {
        self.runs > 0 && self.total_bytes >= u128::from(min_mean_bytes) * u128::from(self.runs)
    }
}

/// Checks every run of `runs` against a source of `src_len` bytes and a destination of
/// `dst_len` bytes, as [`validate_runs`] does (the same error for the first bad run), and
/// gives the facts of [`RunScan`], all in one pass (lists of 131,072 runs or more in parts of
/// 65,536 on rayon's global thread pool, with the same answer).
pub fn scan_runs(runs: &[ByteRun], src_len: u64, dst_len: u64) -> Result<RunScan, KernelError> {
    let (scan, all_fit) = scan_facts(runs, src_len, dst_len);
    if !all_fit {
        validate_runs(runs, src_len, dst_len)?;
    }
    Ok(scan)
}

/// Lists at least this long are scanned in parts of `SCAN_PART_RUNS` on rayon's threads (a
/// backup of all layers at page size 1 is about a million runs: 3.2 ms on one thread of the
/// build machine, about four times that on the H200's host, time the GPU waits for).
const PARALLEL_SCAN_MIN_RUNS: usize = 1 << 17;
/// Runs of one part of a parallel scan.
const SCAN_PART_RUNS: usize = 1 << 16;

/// What one part of a list says towards its [`RunScan`], the runs before it read as far as
/// merging needs (the run just before the part).
#[derive(Clone, Copy)]
struct PartFacts {
    total_bytes: u128,
    all_fit: bool,
    merges: bool,
    same_len: bool,
    offsets_or: u64,
}

impl PartFacts {
    /// Facts of the part `runs`, `prev` the run before it in the list (`None`: the part starts
    /// the list), every length compared with `first_len` (the list's first run's).
    fn of(
        runs: &[ByteRun],
        prev: Option<&ByteRun>,
        first_len: u64,
        (src_len, dst_len): (u64, u64),
    ) -> PartFacts {
        let mut f = PartFacts {
            total_bytes: 0,
            all_fit: true,
            merges: false,
            same_len: true,
            offsets_or: first_len,
        };
        let mut prev = prev;
        for r in runs {
            f.all_fit &= r.fits(src_len, dst_len);
            f.total_bytes += u128::from(r.len_bytes);
            f.same_len &= r.len_bytes == first_len;
            f.offsets_or |= r.src_offset_bytes | r.dst_offset_bytes;
            f.merges |= r.len_bytes == 0
                || prev.is_some_and(|p| {
                    p.src_offset_bytes.checked_add(p.len_bytes) == Some(r.src_offset_bytes)
                        && p.dst_offset_bytes.checked_add(p.len_bytes) == Some(r.dst_offset_bytes)
                        && p.len_bytes.checked_add(r.len_bytes).is_some()
                });
            prev = Some(r);
        }
        f
    }

    /// The facts of two parts together.
    fn and(self, o: PartFacts) -> PartFacts {
        PartFacts {
            total_bytes: self.total_bytes + o.total_bytes,
            all_fit: self.all_fit && o.all_fit,
            merges: self.merges || o.merges,
            same_len: self.same_len && o.same_len,
            offsets_or: self.offsets_or | o.offsets_or,
        }
    }
}

/// The facts of [`RunScan`] for any list, and whether every run fits both regions: a list
/// with a run past `u64::MAX` still has its merging answered
/// ([`crate::device::options::changed_by_merging`]). Lists of at least
/// `PARALLEL_SCAN_MIN_RUNS` runs are read in parts on rayon's threads (the same answer).
pub(crate) fn scan_facts(runs: &[ByteRun], src_len: u64, dst_len: u64) -> (RunScan, bool) {
    use rayon::prelude::*;
    let first_len = runs.first().map_or(0, |r| r.len_bytes);
    let lens = (src_len, dst_len);
    let f = if runs.len() >= PARALLEL_SCAN_MIN_RUNS {
        runs.par_chunks(SCAN_PART_RUNS)
            .enumerate()
            .map(|(i, part)| {
                let prev = (i * SCAN_PART_RUNS).checked_sub(1).map(|at| &runs[at]);
                PartFacts::of(part, prev, first_len, lens)
            })
            .reduce_with(PartFacts::and)
            .unwrap_or_else(|| PartFacts::of(&[], None, first_len, lens))
    } else {
        PartFacts::of(runs, None, first_len, lens)
    };
    let uniform = !runs.is_empty() && f.same_len && f.offsets_or.is_multiple_of(VECTOR_BYTES);
    let scan = RunScan {
        runs: runs.len() as u64,
        total_bytes: f.total_bytes,
        changed_by_merging: f.merges,
        uniform_len_bytes: uniform.then_some(first_len),
    };
    (scan, f.all_fit)
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
    fn a_long_list_scanned_in_parts_answers_as_one_pass() {
        use super::{PARALLEL_SCAN_MIN_RUNS, SCAN_PART_RUNS};
        // 3 parts and a bit: MLA token runs (1,152 B) from device slot i to host slot 2i, so no
        // run continues the one before it on the host side.
        let n = 3 * SCAN_PART_RUNS + 100;
        assert!(n >= PARALLEL_SCAN_MIN_RUNS);
        let run = |i: u64| ByteRun::new(i * 1152, 2 * i * 1152, 1152);
        let base: Vec<ByteRun> = (0..n as u64).map(run).collect();
        let region = 2 * n as u64 * 1152;
        let scan = scan_runs(&base, region, region).unwrap();
        // By hand: n runs of 1,152 B, no merge, uniform 1,152 (72 x 16).
        assert_eq!(scan.runs, n as u64);
        assert_eq!(scan.total_bytes, n as u128 * 1152);
        assert!(!scan.changed_by_merging);
        assert_eq!(scan.uniform_len_bytes, Some(1152));
        // The first run of part 2 continues the last of part 1 on both sides: a merge seen
        // only across the parts' boundary.
        let mut across = base.clone();
        let at = 2 * SCAN_PART_RUNS;
        let p = across[at - 1];
        across[at] = ByteRun::new(p.src_offset_bytes + 1152, p.dst_offset_bytes + 1152, 1152);
        assert!(
            scan_runs(&across, region, region)
                .unwrap()
                .changed_by_merging
        );
        // One run of another length in the last part: not uniform; one offset off by 8 in a
        // middle part: not uniform either.
        let mut other_len = base.clone();
        other_len[n - 1].len_bytes = 1024;
        let s = scan_runs(&other_len, region, region).unwrap();
        assert_eq!(
            (s.uniform_len_bytes, s.total_bytes),
            (None, n as u128 * 1152 - 128)
        );
        let mut unaligned = base.clone();
        unaligned[SCAN_PART_RUNS + 5].dst_offset_bytes += 8;
        assert_eq!(
            scan_runs(&unaligned, region, region)
                .unwrap()
                .uniform_len_bytes,
            None
        );
        // Bad runs in parts 3 and 1: the first by position is named, both counted.
        let mut bad = base.clone();
        bad[3 * SCAN_PART_RUNS + 1].dst_offset_bytes = region;
        bad[SCAN_PART_RUNS - 1].src_offset_bytes = region;
        match scan_runs(&bad, region, region) {
            Err(KernelError::RunOutOfRange {
                position,
                bad_count,
                ..
            }) => assert_eq!((position, bad_count), (SCAN_PART_RUNS as u64 - 1, 2)),
            other => panic!("{other:?}"),
        }
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
