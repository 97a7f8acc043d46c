//! Fault injection: a CPU backend whose copies fail after a set number of runs, for testing
//! what a transfer reports when the copy engine dies part way (a DMA error, a lost device).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{BackendError, CpuBackend, check_runs, copy_runs};
use crate::plan::{CopyRun, Direction};

/// A [`CpuBackend`] that copies `n_runs` runs in total (over all copies, shared by every clone:
/// the device and host pools of one HiCache count together) and then fails: the copy that
/// would run past the budget copies the runs still allowed, in list order, and returns
/// [`BackendError::Interrupted`] with that count; every later copy copies nothing and fails
/// the same way. Reads and writes of pool bytes never fail.
///
/// Made by [`CpuBackend::failing_after`]. For tests only: a real backend fails where the
/// hardware does.
#[derive(Clone, Debug)]
pub struct FailingCpuBackend {
    runs_left: Arc<AtomicU64>,
}

impl CpuBackend {
    /// A CPU backend whose run copies fail once `n_runs` runs have been copied (see
    /// [`FailingCpuBackend`]).
    pub fn failing_after(n_runs: u64) -> FailingCpuBackend {
        FailingCpuBackend {
            runs_left: Arc::new(AtomicU64::new(n_runs)),
        }
    }
}

impl FailingCpuBackend {
    /// Runs still allowed before the next failure.
    pub fn runs_left(&self) -> u64 {
        self.runs_left.load(Ordering::SeqCst)
    }

    /// Allows `n_runs` more runs (e.g. to repair a torn page after a fault).
    pub fn allow(&self, n_runs: u64) {
        self.runs_left.fetch_add(n_runs, Ordering::SeqCst);
    }

    /// [`copy_runs`] of the runs the budget still allows, then the failure if it ran out.
    fn copy(
        &self,
        direction: Direction,
        src: &[u8],
        dst: &mut [u8],
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        // The same contract as the CPU backend: every run checked before any byte moves.
        check_runs(direction, src.len() as u64, dst.len() as u64, runs)?;
        let total = runs.len() as u64;
        let taken = self
            .runs_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                Some(left.saturating_sub(total))
            })
            .unwrap_or(0)
            .min(total);
        // `taken <= runs.len()`, so it fits a usize.
        copy_runs(direction, src, dst, &runs[..taken as usize])?;
        if taken < total {
            return Err(BackendError::Interrupted {
                completed_runs: taken,
                total_runs: total,
                reason: "injected fault (FailingCpuBackend)".into(),
            });
        }
        Ok(())
    }
}

cpu_backend_but_copies!(FailingCpuBackend, "cpu (failing)");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, CpuMem};

    fn run(src: u64, dst: u64, len: u64) -> CopyRun {
        CopyRun {
            src_offset_bytes: src,
            dst_offset_bytes: dst,
            len_bytes: len,
        }
    }

    #[test]
    fn copies_the_allowed_prefix_then_fails_naming_the_count() {
        let b = CpuBackend::failing_after(2);
        let src = CpuMem::from(&[1u8, 2, 3, 4, 5, 6, 7, 8][..]);
        let mut dst = CpuMem::from(&[0u8; 8][..]);
        // Three runs of 2 bytes; the budget allows two: bytes [0, 4) move, [4, 6) does not.
        let runs = [run(0, 0, 2), run(2, 2, 2), run(4, 4, 2)];
        let err = b.device_to_host(&src, &mut dst, &runs).unwrap_err();
        assert_eq!(
            err,
            BackendError::Interrupted {
                completed_runs: 2,
                total_runs: 3,
                reason: "injected fault (FailingCpuBackend)".into()
            }
        );
        assert_eq!(dst[..], [1, 2, 3, 4, 0, 0, 0, 0]);
        // The budget is spent: the next copy moves nothing.
        let err = b
            .host_to_device(&src, &mut dst, &[run(6, 6, 2)])
            .unwrap_err();
        assert!(matches!(
            err,
            BackendError::Interrupted {
                completed_runs: 0,
                ..
            }
        ));
        assert_eq!(dst[..], [1, 2, 3, 4, 0, 0, 0, 0]);
        b.allow(1);
        b.host_to_device(&src, &mut dst, &[run(6, 6, 2)]).unwrap();
        assert_eq!(dst[..], [1, 2, 3, 4, 0, 0, 7, 8]);
    }
}
