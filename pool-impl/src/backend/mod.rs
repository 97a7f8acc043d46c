//! Memory backends: where a pool's bytes live and how a checked [`TransferPlan`] is executed.
//!
//! The shim ([`crate::shim`]) computes every byte offset from the pools' geometries and checks
//! the whole plan before a backend sees it; a backend only allocates, reads, writes and copies
//! runs. The CPU backend ([`CpuBackend`], a page-aligned [`CpuMem`] per pool) is the embedded default; a CUDA
//! backend (device memory, pinned host memory) fits behind the same trait and executes the same
//! plans.
//!
//! [`TransferPlan`]: crate::plan::TransferPlan

/// `Backend` for a test backend that is the CPU backend but for its run copies: allocation,
/// reads and writes delegate to [`CpuBackend`]; `device_to_host` / `host_to_device` call the
/// type's own `copy(direction, src, dst, runs)`. One definition for the fault backends
/// ([`FailingCpuBackend`], [`ContentFaultBackend`]).
macro_rules! cpu_backend_but_copies {
    ($ty:ty, $name:literal) => {
        // SAFETY: as the CPU backend: copies finish before the call returns; the default
        // `wait` and `shares_waits_with`.
        unsafe impl $crate::backend::Backend for $ty {
            type DeviceMem = $crate::backend::CpuMem;
            type HostMem = $crate::backend::CpuMem;

            fn name(&self) -> &'static str {
                $name
            }

            fn alloc_device(
                &self,
                len_bytes: u64,
            ) -> Result<$crate::backend::CpuMem, $crate::backend::BackendError> {
                $crate::backend::CpuBackend.alloc_device(len_bytes)
            }

            fn alloc_host(
                &self,
                len_bytes: u64,
            ) -> Result<$crate::backend::CpuMem, $crate::backend::BackendError> {
                $crate::backend::CpuBackend.alloc_host(len_bytes)
            }

            fn read_device(
                &self,
                mem: &$crate::backend::CpuMem,
                offset: u64,
                out: &mut [u8],
            ) -> Result<(), $crate::backend::BackendError> {
                $crate::backend::CpuBackend.read_device(mem, offset, out)
            }

            fn write_device(
                &self,
                mem: &mut $crate::backend::CpuMem,
                offset: u64,
                data: &[u8],
            ) -> Result<(), $crate::backend::BackendError> {
                $crate::backend::CpuBackend.write_device(mem, offset, data)
            }

            fn read_host(
                &self,
                mem: &$crate::backend::CpuMem,
                offset: u64,
                out: &mut [u8],
            ) -> Result<(), $crate::backend::BackendError> {
                $crate::backend::CpuBackend.read_host(mem, offset, out)
            }

            fn write_host(
                &self,
                mem: &mut $crate::backend::CpuMem,
                offset: u64,
                data: &[u8],
            ) -> Result<(), $crate::backend::BackendError> {
                $crate::backend::CpuBackend.write_host(mem, offset, data)
            }

            fn device_to_host(
                &self,
                src: &$crate::backend::CpuMem,
                dst: &mut $crate::backend::CpuMem,
                runs: &[$crate::plan::CopyRun],
            ) -> Result<(), $crate::backend::BackendError> {
                self.copy($crate::plan::Direction::Backup, src, dst, runs)
            }

            fn host_to_device(
                &self,
                src: &$crate::backend::CpuMem,
                dst: &mut $crate::backend::CpuMem,
                runs: &[$crate::plan::CopyRun],
            ) -> Result<(), $crate::backend::BackendError> {
                self.copy($crate::plan::Direction::Load, src, dst, runs)
            }
        }
    };
}

mod content_fault;
mod cpu;
mod cpu_mem;
#[cfg(feature = "cuda")]
mod cuda;
mod fault;

pub use content_fault::{ContentFault, ContentFaultBackend};
pub use cpu::{CpuBackend, copy_runs};
pub use cpu_mem::{CPU_MEM_ALIGN_BYTES, CpuMem};
#[cfg(feature = "cuda")]
pub use cuda::{CudaBackend, CudaDeviceMem, CudaHostMem, KernelError};
pub use fault::FailingCpuBackend;

use crate::plan::{CopyRun, Direction};

/// A pool's memory region as a backend holds it.
pub trait Memory {
    /// Length of the region in bytes.
    fn len_bytes(&self) -> u64;
}

/// For backends of one's own (tests' recording backends, say) that hold plain vectors.
impl Memory for Vec<u8> {
    fn len_bytes(&self) -> u64 {
        self.len() as u64
    }
}

/// An error of a memory backend. A refused copy ([`BackendError::OutOfRange`]) moved no byte:
/// every backend checks every run before copying any. [`BackendError::Interrupted`] says how
/// many runs of the list were copied in full before the failure. A [`BackendError::Driver`]
/// error of the CUDA backend after its checks (a driver call failing part way through the
/// several calls one transfer takes: batches and 2D copies, or a copy failing while it runs)
/// may leave the destination partly written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The region could not be allocated.
    #[error("cannot allocate {len_bytes} bytes of {side} memory: {reason}")]
    Alloc {
        /// `device` or `host`.
        side: &'static str,
        /// Requested length in bytes.
        len_bytes: u64,
        /// Why (allocator or driver message).
        reason: String,
    },
    /// A read, write or copy run reaches outside a region.
    #[error("{side} range [{start_bytes}, {end_bytes}) outside the {len_bytes}-byte {side} region")]
    OutOfRange {
        /// `device` or `host`.
        side: &'static str,
        /// First byte of the range.
        start_bytes: u64,
        /// One past the last byte (saturated on overflow).
        end_bytes: u64,
        /// Length of the region.
        len_bytes: u64,
    },
    /// A driver error (CUDA backends).
    #[error("{0}")]
    Driver(String),
    /// The copy failed part way: runs `0..completed_runs` of the list were copied in full, no
    /// byte of any later run was written (fault injection: [`FailingCpuBackend`]).
    #[error("interrupted after {completed_runs} of {total_runs} runs: {reason}")]
    Interrupted {
        /// Runs copied in full, a prefix of the list.
        completed_runs: u64,
        /// Runs in the list.
        total_runs: u64,
        /// Why (driver message, or the injected fault).
        reason: String,
    },
}

/// Allocation, byte access and run copies for device and host pool memory.
///
/// Generic rather than object-safe: pools are `DevicePool<B>` / `HostPool<B>` with `B` chosen
/// at build time (`CpuBackend` by default; a CUDA backend behind the `cuda` feature).
///
/// # Safety
/// [`crate::HiCache`] frees and hands out pool memory, from safe code, on the word of these
/// methods; an implementation must keep it:
/// - [`Backend::wait`] returns only when no copy enqueued on this backend or its clones (by
///   [`Backend::enqueue_device_to_host`] / [`Backend::enqueue_host_to_device`]) can still read
///   or write memory, and it must not call back into the cache that called it (the cache
///   holds a lock across the wait);
/// - [`Backend::shares_waits_with`] returns true only when a wait on `self` also covers every
///   copy enqueued on `other`, and when copies enqueued on the two run in the order they were
///   enqueued (one queue).
///
/// Implementations whose enqueue copies before it returns (the default) and whose `wait` does
/// nothing (the default) keep both by construction.
pub unsafe trait Backend: Clone {
    /// Device pool memory (CPU: `Vec<u8>`; CUDA: device allocation).
    type DeviceMem: Memory;
    /// Host pool memory (CPU: `Vec<u8>`; CUDA: pinned host allocation).
    type HostMem: Memory;

    /// Short name for reports (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// A zeroed device region of `len_bytes`.
    ///
    /// # Errors
    ///
    /// [`BackendError::Alloc`] when the region cannot be allocated; a driver error
    /// ([`BackendError::Driver`]) from a GPU backend.
    fn alloc_device(&self, len_bytes: u64) -> Result<Self::DeviceMem, BackendError>;
    /// A zeroed host region of `len_bytes`.
    ///
    /// # Errors
    ///
    /// As [`Backend::alloc_device`].
    fn alloc_host(&self, len_bytes: u64) -> Result<Self::HostMem, BackendError>;
    /// Copies `out.len()` bytes at `offset_bytes` of a device region into `out`.
    ///
    /// # Errors
    ///
    /// [`BackendError::OutOfRange`] when `[offset_bytes, offset_bytes + out.len())` is not inside
    /// the region; a driver error from a GPU backend.
    fn read_device(
        &self,
        mem: &Self::DeviceMem,
        offset_bytes: u64,
        out: &mut [u8],
    ) -> Result<(), BackendError>;
    /// Writes `data` at `offset_bytes` of a device region.
    ///
    /// # Errors
    ///
    /// As [`Backend::read_device`], for `data`'s range.
    fn write_device(
        &self,
        mem: &mut Self::DeviceMem,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), BackendError>;
    /// Copies `out.len()` bytes at `offset_bytes` of a host region into `out`.
    ///
    /// # Errors
    ///
    /// As [`Backend::read_device`].
    fn read_host(
        &self,
        mem: &Self::HostMem,
        offset_bytes: u64,
        out: &mut [u8],
    ) -> Result<(), BackendError>;
    /// Writes `data` at `offset_bytes` of a host region.
    ///
    /// # Errors
    ///
    /// As [`Backend::write_device`].
    fn write_host(
        &self,
        mem: &mut Self::HostMem,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), BackendError>;
    /// Backup: copies every run from device (`src_offset_bytes`) to host (`dst_offset_bytes`),
    /// in list order. Checks every run first; on a refusal no byte is moved; see
    /// [`BackendError`] for [`BackendError::Interrupted`] (a prefix of the runs moved) and for
    /// driver errors after the checks.
    ///
    /// # Errors
    ///
    /// [`BackendError::OutOfRange`] for the first run outside either region (no byte moved);
    /// [`BackendError::Interrupted`] or [`BackendError::Driver`] after the checks, as
    /// [`BackendError`] describes.
    fn device_to_host(
        &self,
        src: &Self::DeviceMem,
        dst: &mut Self::HostMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError>;
    /// Load: copies every run from host (`src_offset_bytes`) to device (`dst_offset_bytes`),
    /// in list order. Checks every run first; on a refusal no byte is moved; see
    /// [`BackendError`] for [`BackendError::Interrupted`] (a prefix of the runs moved) and for
    /// driver errors after the checks.
    ///
    /// # Errors
    ///
    /// As [`Backend::device_to_host`].
    fn host_to_device(
        &self,
        src: &Self::HostMem,
        dst: &mut Self::DeviceMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError>;

    /// [`Backend::device_to_host`] without the wait: checks every run and starts the copy;
    /// [`Backend::wait`] completes it. Errors found before the copy starts are returned here,
    /// with the same meaning as [`Backend::device_to_host`]'s (on a refusal no byte moves);
    /// a failure while copying is reported by [`Backend::wait`]. The default copies before it
    /// returns (the CPU backends).
    ///
    /// # Safety
    /// `src` and `dst` must stay alive, and must be neither read nor written by the CPU, until
    /// [`Backend::wait`] returns (the copy may still be reading and writing them).
    ///
    /// # Errors
    ///
    /// As [`Backend::device_to_host`]'s checks, found before the copy starts (no byte moves).
    unsafe fn enqueue_device_to_host(
        &self,
        src: &Self::DeviceMem,
        dst: &mut Self::HostMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        self.device_to_host(src, dst, runs)
    }

    /// [`Backend::host_to_device`] without the wait (see
    /// [`Backend::enqueue_device_to_host`]).
    ///
    /// # Safety
    /// As [`Backend::enqueue_device_to_host`].
    ///
    /// # Errors
    ///
    /// As [`Backend::enqueue_device_to_host`].
    unsafe fn enqueue_host_to_device(
        &self,
        src: &Self::HostMem,
        dst: &mut Self::DeviceMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        self.host_to_device(src, dst, runs)
    }

    /// Waits until every copy enqueued on this backend (and its clones) has finished. The
    /// default has nothing to wait for. Must not panic and must not call back into the cache
    /// (trait-level `# Safety`).
    ///
    /// # Errors
    ///
    /// The first copy that failed while running ([`BackendError::Driver`], or
    /// [`BackendError::OutOfRange`] for a run the device refused); bytes of copies enqueued
    /// since the last wait may then have moved in part.
    fn wait(&self) -> Result<(), BackendError> {
        Ok(())
    }
    /// True when [`Backend::wait`] on `self` also waits for every copy enqueued on `other`, and
    /// copies enqueued on the two run in enqueue order (one queue: clones of one CUDA backend
    /// share its stream), so a caller holding both waits once and need not wait between them.
    /// The default says no: waiting on each, and between them, is always correct.
    fn shares_waits_with(&self, other: &Self) -> bool {
        let _ = other;
        false
    }
}

/// `[start, start + len)` inside a region of `region_bytes`, or [`BackendError::OutOfRange`].
///
/// # Errors
///
/// [`BackendError::OutOfRange`] when the range reaches past `region_bytes` (its end computed
/// without overflow).
#[inline]
pub fn check_range(
    side: &'static str,
    start_bytes: u64,
    len_bytes: u64,
    region_bytes: u64,
) -> Result<(), BackendError> {
    match start_bytes.checked_add(len_bytes) {
        Some(end) if end <= region_bytes => Ok(()),
        end => Err(out_of_range(side, start_bytes, end, region_bytes)),
    }
}

/// Every run inside a source of `src_len_bytes` and a destination of `dst_len_bytes`, or
/// [`BackendError::OutOfRange`] for the first run, in list order, that is not (its source range
/// checked before its destination range; sides named by `direction`).
///
/// # Errors
///
/// [`BackendError::OutOfRange`] for the first run, in list order, outside its source or
/// destination.
#[inline]
pub fn check_runs(
    direction: Direction,
    src_len_bytes: u64,
    dst_len_bytes: u64,
    runs: &[CopyRun],
) -> Result<(), BackendError> {
    let (src_side, dst_side) = (direction.source(), direction.destination());
    for r in runs {
        check_range(src_side, r.src_offset_bytes, r.len_bytes, src_len_bytes)?;
        check_range(dst_side, r.dst_offset_bytes, r.len_bytes, dst_len_bytes)?;
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn out_of_range(
    side: &'static str,
    start_bytes: u64,
    end: Option<u64>,
    region_bytes: u64,
) -> BackendError {
    BackendError::OutOfRange {
        side,
        start_bytes,
        end_bytes: end.unwrap_or(u64::MAX),
        len_bytes: region_bytes,
    }
}
