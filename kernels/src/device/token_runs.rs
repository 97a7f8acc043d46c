//! The token-granular kernel: run lists whose runs all have one length (a token of one layer
//! per run, as HiCache moves a pool of page size 1: 2,048 B for Llama-3.1-8B's K or V in bf16,
//! 1,152 B for a DeepSeek-V3 MLA latent in bf16) go to `copy_runs_uniform`, which spreads the
//! list's 16-byte vectors over every thread of the grid with [`FLAT_UNROLL`] loads in flight
//! per thread, instead of a warp per run (`copy_runs`, whose lanes idle on runs that are not a
//! multiple of 512 B and which has one run's bytes in flight per warp). Any other list keeps
//! `copy_runs`.

use cudarc::driver::{CudaFunction, CudaStream};

use super::{Arg, Gpu, LaunchShape};
use crate::copy_runs::ByteRun;
use crate::cuda_source::FLAT_UNROLL;
use crate::device_memory::GpuBytes;
use crate::error::KernelError;

/// Blocks of 256 threads per SM of the token-granular kernel (its launch bounds let 4 stay
/// resident per SM: 128 KiB in flight per SM).
pub(super) const TOKEN_BLOCKS_PER_SM: u32 = 4;

/// Bytes of one vector of `copy_runs_uniform`.
const VECTOR_BYTES: u64 = 16;

/// Most vectors one `copy_runs_uniform` launch indexes (its thread arithmetic is 32-bit).
const MAX_UNIFORM_VECTORS: u64 = 1 << 31;

/// Vectors per run when `runs` can go to `copy_runs_uniform` between buffers at device
/// addresses `bases` (source, destination): every run `len` bytes long, `len` a non-zero
/// multiple of 16, every offset and both bases 16-byte aligned, at most 2^31 vectors in all.
/// `None` otherwise (and for an empty list).
pub(crate) fn uniform_vectors(runs: &[ByteRun], bases: (u64, u64)) -> Option<u64> {
    let len = runs.first()?.len_bytes;
    let aligned = |x: u64| x.is_multiple_of(VECTOR_BYTES);
    if len == 0 || !aligned(len) || !aligned(bases.0) || !aligned(bases.1) {
        return None;
    }
    let all = runs
        .iter()
        .all(|r| r.len_bytes == len && aligned(r.src_offset_bytes) && aligned(r.dst_offset_bytes));
    let vectors_per_run = len / VECTOR_BYTES;
    let total = vectors_per_run.checked_mul(runs.len() as u64)?;
    (all && total <= MAX_UNIFORM_VECTORS).then_some(vectors_per_run)
}

impl Gpu {
    /// Launches the run list of `runs` (already checked against both buffers, or checked by
    /// a validation launch enqueued before on `stream`), whose copy the GPU reads at `list`,
    /// with `copy_runs_uniform` when [`uniform_vectors`] allows it, else with `copy_runs`.
    ///
    /// # Safety
    /// As [`Gpu::launch_checked_run_list`]; `runs` is the list at `list`.
    pub(super) unsafe fn launch_run_list(
        &self,
        stream: &CudaStream,
        list: u64,
        runs: &[ByteRun],
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let k = self.kernels()?;
        match uniform_vectors(runs, (src.device_address(), dst.device_address())) {
            Some(vectors_per_run) => {
                // SAFETY: forwarded to the caller; the runs are uniform and aligned.
                unsafe {
                    self.launch_uniform(
                        stream,
                        &k.copy_runs_uniform,
                        (list, runs.len() as u64, vectors_per_run),
                        src,
                        dst,
                        shape,
                    )
                }
            }
            // SAFETY: forwarded to the caller.
            None => unsafe {
                self.launch_checked_run_list(
                    stream,
                    &k.copy_runs,
                    (list, runs.len()),
                    src,
                    dst,
                    shape,
                )
            },
        }
    }

    /// `copy_runs_uniform` over the `n` runs at `list`, `vectors_per_run` vectors each.
    ///
    /// # Safety
    /// The list holds `n` uniform runs ([`uniform_vectors`]) readable until the kernel has
    /// run; every run lies inside both buffers, which stay alive and untouched by the CPU
    /// until the stream has finished.
    pub(super) unsafe fn launch_uniform(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        (list, n, vectors_per_run): (u64, u64, u64),
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let threads = (n * vectors_per_run).div_ceil(FLAT_UNROLL);
        let args = [
            Arg::Word(list),
            Arg::Word(n),
            Arg::Word(vectors_per_run),
            Arg::Word(src.device_address()),
            Arg::Word(dst.device_address()),
            Arg::Word(self.err_address()),
        ];
        // SAFETY: arguments match copy_runs_uniform; the list and buffers as promised.
        unsafe {
            self.launch_on(
                stream,
                f,
                "cuLaunchKernel(copy_runs_uniform)",
                self.grid(shape, threads),
                &args,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::uniform_vectors;
    use crate::copy_runs::ByteRun;

    #[test]
    fn uniform_lists_of_aligned_runs_give_their_vectors_per_run() {
        // Llama-3.1-8B K or V of one token, bf16: 8 heads x 128 x 2 B = 2,048 B = 128 vectors.
        let runs = [
            ByteRun::new(0, 4096, 2048),
            ByteRun::new(65_536, 2048, 2048),
        ];
        assert_eq!(uniform_vectors(&runs, (1 << 20, 2 << 20)), Some(128));
        // An MLA latent, bf16: (512 + 64) x 2 B = 1,152 B = 72 vectors.
        assert_eq!(
            uniform_vectors(&[ByteRun::new(1152, 0, 1152)], (0, 0)),
            Some(72)
        );
    }

    #[test]
    fn mixed_unaligned_or_empty_lists_keep_the_warp_per_run_kernel() {
        let a = ByteRun::new(0, 0, 2048);
        // Two lengths (an index-K token's 128 B values and 4 B scale).
        assert_eq!(
            uniform_vectors(&[a, ByteRun::new(2048, 2048, 1024)], (0, 0)),
            None
        );
        // DeepSeek-V3.2's fp8 MLA token, 656 B = 41 vectors: at offset 656 = 41 x 16 aligned,
        // at 664 (41.5 vectors) not.
        assert_eq!(
            uniform_vectors(&[ByteRun::new(656, 0, 656)], (0, 0)),
            Some(41)
        );
        assert_eq!(uniform_vectors(&[ByteRun::new(664, 0, 656)], (0, 0)), None);
        // A length that is not a multiple of 16 (132 B), an unaligned base, nothing.
        assert_eq!(uniform_vectors(&[ByteRun::new(0, 0, 132)], (0, 0)), None);
        assert_eq!(uniform_vectors(&[a], (8, 0)), None);
        assert_eq!(uniform_vectors(&[], (0, 0)), None);
        assert_eq!(uniform_vectors(&[ByteRun::new(0, 0, 0)], (0, 0)), None);
        // More than 2^31 vectors in one launch: 2^20 runs of 2^15 vectors (512 KiB) each.
        let long = vec![ByteRun::new(0, 0, 1 << 19); 1 << 12];
        assert_eq!(uniform_vectors(&long, (0, 0)), Some(1 << 15));
        let too_long = vec![ByteRun::new(0, 0, 1 << 19); (1 << 16) + 1];
        assert_eq!(uniform_vectors(&too_long, (0, 0)), None);
    }
}
