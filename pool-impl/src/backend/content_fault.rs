//! Content-only fault injection: a CPU backend whose copies report success but leave wrong
//! bytes, the faults only a content check ([`crate::ChecksumMode`]) can show (the geometry is
//! right, every range is in bounds, nothing fails).

use std::sync::{Arc, Mutex};

use super::{BackendError, CpuBackend, check_runs, copy_runs};
use crate::plan::{CopyRun, Direction};

/// A fault that leaves wrong bytes and reports success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFault {
    /// The next backup copies, then its host pages are overwritten (a slot reused by another
    /// request while the page waits on the host): the middle byte of every run is inverted.
    HostOverwrittenAfterBackup,
    /// The next load copies only the first `kept_bytes` of every run (at most the run): the
    /// rest of each destination run keeps its old bytes (the seed bug: 132 of 256 B per token).
    ShortCopy {
        /// Bytes copied of each run.
        kept_bytes: u64,
    },
    /// The next load copies nothing: every destination page keeps what it held (a stale slot).
    StaleDestination,
}

impl ContentFault {
    pub(crate) fn direction(self) -> Direction {
        match self {
            ContentFault::HostOverwrittenAfterBackup => Direction::Backup,
            ContentFault::ShortCopy { .. } | ContentFault::StaleDestination => Direction::Load,
        }
    }

    /// What the fault makes of a copy of `runs`: the runs that do copy (all, each cut to
    /// `kept_bytes`, or none) and the destination byte offsets inverted after the copy (the
    /// middle byte of every non-empty run). Shared by this backend and the concurrent cache's
    /// test hook, so both inject the same bytes.
    pub(crate) fn apply(self, runs: &[CopyRun]) -> (Vec<CopyRun>, Vec<u64>) {
        match self {
            ContentFault::StaleDestination => (Vec::new(), Vec::new()),
            ContentFault::ShortCopy { kept_bytes } => (
                runs.iter()
                    .map(|r| CopyRun {
                        len_bytes: r.len_bytes.min(kept_bytes),
                        ..*r
                    })
                    .collect(),
                Vec::new(),
            ),
            ContentFault::HostOverwrittenAfterBackup => (
                runs.to_vec(),
                runs.iter()
                    .filter(|r| r.len_bytes > 0)
                    .map(|r| r.dst_offset_bytes + r.len_bytes / 2)
                    .collect(),
            ),
        }
    }
}

/// A [`CpuBackend`] with one [`ContentFault`] armed at a time ([`ContentFaultBackend::arm`]),
/// shared by every clone (the device and host pools of one HiCache): it fires on the next copy
/// of its direction, then disarms. Every other copy, read and write is the CPU backend's.
///
/// Made by [`CpuBackend::content_faults`]. For tests only.
#[derive(Clone, Debug, Default)]
pub struct ContentFaultBackend {
    armed: Arc<Mutex<Option<ContentFault>>>,
}

impl CpuBackend {
    /// A CPU backend with content-only faults to arm ([`ContentFaultBackend`]).
    pub fn content_faults() -> ContentFaultBackend {
        ContentFaultBackend::default()
    }
}

impl ContentFaultBackend {
    /// Arms `fault` for the next copy of its direction (replacing one armed before).
    pub fn arm(&self, fault: ContentFault) {
        *self.lock() = Some(fault);
    }

    /// The fault still armed, if any.
    pub fn armed(&self) -> Option<ContentFault> {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ContentFault>> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn copy(
        &self,
        direction: Direction,
        src: &[u8],
        dst: &mut [u8],
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        check_runs(direction, src.len() as u64, dst.len() as u64, runs)?;
        let fault = {
            let mut armed = self.lock();
            match *armed {
                Some(f) if f.direction() == direction => armed.take(),
                _ => None,
            }
        };
        let Some(fault) = fault else {
            return copy_runs(direction, src, dst, runs);
        };
        let (copied, inverted) = fault.apply(runs);
        copy_runs(direction, src, dst, &copied)?;
        for at in inverted {
            // In range: inside a run checked above (both fit a usize: they are slices).
            dst[at as usize] = !dst[at as usize];
        }
        Ok(())
    }
}

cpu_backend_but_copies!(ContentFaultBackend, "cpu (content faults)");

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
    fn each_fault_fires_once_on_its_direction() {
        let b = CpuBackend::content_faults();
        let src = CpuMem::from(&[1u8, 2, 3, 4, 5, 6, 7, 8][..]);
        let mut dst = CpuMem::from(&[0u8; 8][..]);
        // A short copy armed for loads: a backup copies in full and leaves it armed.
        b.arm(ContentFault::ShortCopy { kept_bytes: 1 });
        b.device_to_host(&src, &mut dst, &[run(0, 0, 4)]).unwrap();
        assert_eq!(dst[..], [1, 2, 3, 4, 0, 0, 0, 0]);
        // The load copies 1 byte of each 2-byte run: bytes 5 and 7 land, 6 and 8 do not.
        b.host_to_device(&src, &mut dst, &[run(4, 4, 2), run(6, 6, 2)])
            .unwrap();
        assert_eq!(dst[..], [1, 2, 3, 4, 5, 0, 7, 0]);
        assert_eq!(b.armed(), None);
        b.arm(ContentFault::StaleDestination);
        b.host_to_device(&src, &mut dst, &[run(5, 5, 1)]).unwrap();
        assert_eq!(dst[5], 0);
        // Overwritten after backup: run [0, 4) copied, then byte 0 + 4 / 2 = 2 inverted.
        let mut host = CpuMem::from(&[0u8; 8][..]);
        b.arm(ContentFault::HostOverwrittenAfterBackup);
        b.device_to_host(&src, &mut host, &[run(0, 0, 4)]).unwrap();
        assert_eq!(host[..], [1, 2, !3, 4, 0, 0, 0, 0]);
        // Disarmed: the next copy is exact.
        b.host_to_device(&src, &mut dst, &[run(0, 0, 8)]).unwrap();
        assert_eq!(dst[..], src[..]);
    }
}
