//! The token-granular kernel: run lists whose runs all have one length (a token of one layer
//! per run, as HiCache moves a pool of page size 1: 2,048 B for Llama-3.1-8B's K or V in bf16,
//! 1,152 B for a DeepSeek-V3 MLA latent in bf16) go to `copy_runs_uniform`, which lays the
//! 16-byte vectors of [`runs_per_warp`] runs one after the other over each warp's
//! `LOADS_PER_LANE` x 32 load slots, up to `LOADS_PER_LANE` loads in flight per lane before any
//! store, instead of `copy_runs`' warp per run with 4 loads per lane. Any other list (runs of
//! several lengths, unaligned, or longer than 4 KiB) keeps `copy_runs`.
//!
//! Session 8's kernel gave each run a power of two of slots per lane (2 runs of 1,152 B per
//! warp: 144 of 256 slots busy); laying the runs one after the other keeps 216 busy (3 runs).
//! Runs shorter than 128 B keep `copy_runs` (a warp then walks at most 32 runs at a time).

use cudarc::driver::CudaStream;

use super::{Arg, Gpu, LaunchShape};
use crate::copy_runs::{ByteRun, VECTOR_BYTES};
use crate::cuda_source::LOADS_PER_LANE;
use crate::device_memory::GpuBytes;
use crate::error::KernelError;

/// Blocks of 256 threads per SM of the token-granular kernel (its launch bounds let 4 stay
/// resident per SM: 128 KiB in flight per SM).
pub(super) const TOKEN_BLOCKS_PER_SM: u32 = 4;

/// Most vectors of one run `copy_runs_uniform` takes: 8 loads of 32 lanes (4 KiB runs).
const MAX_RUN_VECTORS: u64 = LOADS_PER_LANE * 32;

/// Fewest vectors of one run `copy_runs_uniform` takes (128 B): a warp then copies at most 32
/// runs at a time, and walks a lane's slots at most 4 runs on per load.
const MIN_RUN_VECTORS: u64 = 8;

/// Vectors per run when `runs` can go to `copy_runs_uniform` between buffers at device
/// addresses `bases` (source, destination): every run `len` bytes long, `len` a multiple of 16
/// from 128 to 4,096 (8 to 256 vectors), every offset and both bases 16-byte aligned. `None`
/// otherwise (and for an empty list).
pub(crate) fn uniform_vectors(runs: &[ByteRun], bases: (u64, u64)) -> Option<u64> {
    // The list's uniform length as the chooser's scan finds it (every run fits regions of
    // u64::MAX bytes, so only the length facts are read).
    let (scan, _) = crate::copy_runs::scan_facts(runs, u64::MAX, u64::MAX);
    scan.uniform_len_bytes
        .and_then(|len| vectors_of_uniform(len, bases))
}

/// Vectors per run of `copy_runs_uniform` for a list whose runs all have `len_bytes` and
/// 16-byte aligned offsets ([`crate::copy_runs::RunScan::uniform_len_bytes`]), between buffers
/// at device addresses `bases`: `None` when the length is not a multiple of 16 from 128 to
/// 4,096 or a base is not 16-byte aligned.
pub(crate) fn vectors_of_uniform(len_bytes: u64, bases: (u64, u64)) -> Option<u64> {
    let aligned = |x: u64| x.is_multiple_of(VECTOR_BYTES);
    if len_bytes == 0 || !aligned(len_bytes) || !aligned(bases.0) || !aligned(bases.1) {
        return None;
    }
    let vectors_per_run = len_bytes / VECTOR_BYTES;
    (MIN_RUN_VECTORS..=MAX_RUN_VECTORS)
        .contains(&vectors_per_run)
        .then_some(vectors_per_run)
}

/// Runs a warp of `copy_runs_uniform` copies at a time, for runs of `vectors_per_run` vectors
/// (8 to 256): as many whole runs as its `LOADS_PER_LANE` x 32 load slots hold (1 to 32).
pub(crate) fn runs_per_warp(vectors_per_run: u64) -> u64 {
    (LOADS_PER_LANE * 32 / vectors_per_run.max(1)).max(1)
}

/// Nanoseconds each warp of a `grid`-block launch of `copy_runs_uniform` waits between the
/// starts of its groups of `group_bytes` so the launch moves at most `rate_bytes_per_us`
/// bytes per microsecond: warps x group bytes per pace. At least 1 (0 would mean unpaced);
/// saturates rather than overflows.
pub(crate) fn pace_ns_per_group(group_bytes: u64, grid: u32, rate_bytes_per_us: u64) -> u64 {
    let warps = u64::from(grid) * u64::from(crate::cuda_source::THREADS_PER_BLOCK / 32);
    let bytes_per_pace = u128::from(group_bytes) * u128::from(warps) * 1000;
    let ns = bytes_per_pace / u128::from(rate_bytes_per_us.max(1));
    u64::try_from(ns).unwrap_or(u64::MAX).max(1)
}

impl Gpu {
    /// Launches the run list of `runs` (already checked against both buffers, or checked by
    /// a validation launch enqueued before on `stream`), whose copy the GPU reads at `list`,
    /// with `copy_runs_uniform` when `vectors_per_run` is given (what [`uniform_vectors`]
    /// gives for the list, or for a list it is part of), else with `copy_runs`.
    ///
    /// # Safety
    /// As [`Gpu::launch_checked_run_list`]; `runs` is the list at `list`; with
    /// `vectors_per_run`, every run is `16 * vectors_per_run` bytes long, at 16-byte aligned
    /// offsets of 16-byte aligned buffers.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn launch_run_list(
        &self,
        stream: &CudaStream,
        list: u64,
        runs: &[ByteRun],
        vectors_per_run: Option<u64>,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let k = self.kernels()?;
        match vectors_per_run {
            Some(vectors_per_run) => {
                // SAFETY: forwarded to the caller; the runs are uniform and aligned.
                unsafe {
                    self.launch_uniform(
                        stream,
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

    /// `copy_runs_uniform` over the `n` runs at `list`, `vectors_per_run` vectors each
    /// (`copy_runs_uniform_paced` when `shape` sets a rate limit; a limit of 0 is
    /// [`KernelError::Spec`], nothing launched).
    ///
    /// # Safety
    /// The list holds `n` uniform runs ([`uniform_vectors`]) readable until the kernel has
    /// run; every run lies inside both buffers, which stay alive and untouched by the CPU
    /// until the stream has finished.
    pub(super) unsafe fn launch_uniform(
        &self,
        stream: &CudaStream,
        (list, n, vectors_per_run): (u64, u64, u64),
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let k = self.kernels()?;
        let group = runs_per_warp(vectors_per_run);
        let threads = n.div_ceil(group) * 32;
        let grid = self.grid(shape, threads);
        let mut args = vec![
            Arg::Word(list),
            Arg::Word(n),
            Arg::Word(vectors_per_run),
            Arg::Word(group),
            Arg::Word(src.device_address()),
            Arg::Word(dst.device_address()),
            Arg::Word(self.err_address()),
        ];
        let (f, call) = match shape.rate_limit_bytes_per_us {
            None => (&k.copy_runs_uniform, "cuLaunchKernel(copy_runs_uniform)"),
            Some(0) => {
                return Err(KernelError::spec(
                    "rate_limit_bytes_per_us",
                    "a rate limit of 0 B/us would never finish the copy (None: no limit)",
                ));
            }
            Some(rate) => {
                let group_bytes = group * vectors_per_run * VECTOR_BYTES;
                args.push(Arg::Word(pace_ns_per_group(group_bytes, grid, rate)));
                (
                    &k.copy_runs_uniform_paced,
                    "cuLaunchKernel(copy_runs_uniform_paced)",
                )
            }
        };
        // SAFETY: arguments match the kernel chosen; the list and buffers as promised.
        unsafe { self.launch_on(stream, f, call, grid, &args) }
    }
}

#[cfg(test)]
mod tests {
    use super::{runs_per_warp, uniform_vectors};
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
        // Runs shorter than 128 B (8 vectors): the warp-per-run kernel; 128 B itself: uniform.
        assert_eq!(uniform_vectors(&[ByteRun::new(0, 0, 112)], (0, 0)), None);
        assert_eq!(uniform_vectors(&[ByteRun::new(0, 0, 128)], (0, 0)), Some(8));
        assert_eq!(uniform_vectors(&[a], (8, 0)), None);
        assert_eq!(uniform_vectors(&[], (0, 0)), None);
        assert_eq!(uniform_vectors(&[ByteRun::new(0, 0, 0)], (0, 0)), None);
        // Runs longer than 4 KiB (256 vectors): the warp-per-run kernel.
        assert_eq!(
            uniform_vectors(&[ByteRun::new(0, 0, 4096)], (0, 0)),
            Some(256)
        );
        assert_eq!(uniform_vectors(&[ByteRun::new(0, 0, 4112)], (0, 0)), None);
    }

    #[test]
    fn the_pace_spreads_the_rate_over_the_launchs_warps() {
        use super::pace_ns_per_group;
        // Llama-3.1-8B backup runs (2,048 B, 2 per group: 4,096 B) on 8 blocks of 8 warps at
        // 44,000 B/us (0.8 of a 55 GB/s link): 64 warps x 4,096 B = 262,144 B per pace,
        // 262,144 / 44,000 us = 5,957.8 ns, rounded down to 5,957.
        assert_eq!(pace_ns_per_group(4096, 8, 44_000), 5957);
        // MLA (1,152 B, 3 per group: 3,456 B) on 4 blocks at the same rate: 32 x 3,456 =
        // 110,592 B, 2,513.45 ns.
        assert_eq!(pace_ns_per_group(3456, 4, 44_000), 2513);
        // Never 0 (unpaced), never an overflow, a rate of 0 read as 1 B/us.
        assert_eq!(pace_ns_per_group(16, 1, u64::MAX), 1);
        assert_eq!(pace_ns_per_group(u64::MAX, u32::MAX, 0), u64::MAX);
    }

    #[test]
    fn a_warp_takes_as_many_whole_runs_as_its_256_slots_hold() {
        // 8 loads x 32 lanes = 256 slots of 16 B. 2,048 B = 128 vectors: 2 runs; 1,152 B (an
        // MLA latent) = 72 vectors: 3 runs (216 slots busy; session 8's kernel took 2); 656 B =
        // 41 vectors: 6 (246 slots); 128 B = 8 vectors: 32 runs; 4,096 B = 256 vectors: 1.
        assert_eq!(runs_per_warp(128), 2);
        assert_eq!(runs_per_warp(72), 3);
        assert_eq!(runs_per_warp(41), 6);
        assert_eq!(runs_per_warp(8), 32);
        assert_eq!(runs_per_warp(256), 1);
    }

    #[test]
    fn the_kernels_slot_walk_covers_each_vector_of_a_warps_runs_once() {
        // The kernel (cuda_source.rs) walks lane l's slots from run l / vpr, vector l % vpr,
        // 32 vectors on per load (`uniform_next`: add 32, then subtract vpr while the vector is
        // past the run, at most 4 times), each slot busy while its run is below the group.
        // Done here as the kernel does it, for every run length it takes: each (run, vector) of
        // the group exactly once, the 4 subtractions always enough, the group as many runs as
        // fit 256 slots.
        for vpr in 8..=256u64 {
            let group = runs_per_warp(vpr);
            assert!(group * vpr <= 256 && (group + 1) * vpr > 256, "vpr {vpr}");
            let mut seen = vec![0u32; (group * vpr) as usize];
            for lane in 0..32u64 {
                let (mut g, mut v) = (lane / vpr, lane % vpr);
                for _load in 0..8 {
                    if g < group {
                        seen[(g * vpr + v) as usize] += 1;
                    }
                    v += 32;
                    for _ in 0..4 {
                        if v >= vpr {
                            v -= vpr;
                            g += 1;
                        }
                    }
                    assert!(v < vpr, "vpr {vpr}: 4 steps fell short");
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "vpr {vpr}");
        }
    }
}
