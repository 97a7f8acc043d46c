//! The split of a load between the model's SM carve-out and the copy engines (the device half
//! is `Gpu::enqueue_transfer_runs`, [`crate::TransferPath::SplitLoad`]). Both read host memory
//! over the same PCIe link at once: the copy engines pay a fixed cost per run and the run-list
//! kernel on a few SMs cannot keep enough reads in flight, so each alone stops short of the
//! link. Measured on the H200 next to a bf16 GEMM carved out by 2 SMs, 1,024 and 4,096 random
//! DeepSeek-V3.2 pages x 61 layers loaded layer by layer (BENCHMARKS.md, "Session 5"; a bench
//! kernel of 2 blocks of 1,024 threads, lists on the device before the window), as fractions of
//! pinned memcpy alone / next to the GEMM, and the GEMM's slowdown:
//!
//! | the kernel's share of the bytes | 1,024 pages | 4,096 pages |
//! |---|---|---|
//! | all (the kernel alone) | 0.915 / 0.878, +2.0% | 0.921 / 0.872, +3.4% |
//! | the short runs only (index-K, 16.8%) | 0.976 / 0.834, +1.3% | 0.981 / 0.893, -2.1% |
//! | 30% | 0.969 / 0.861, +1.2% | 0.954 / 0.889, +1.9% |
//! | 45% | 0.960 / 0.890, +2.8% | 0.955 / 0.898, +2.8% |
//! | 60% | 0.938 / 0.877, +2.5% | 0.946 / 0.888, +0.8% |
//!
//! Through the chooser (45%, `SPLIT_KERNEL_BLOCKS_PER_SM`, the kernel reading its run list
//! from pinned host memory): 0.945-0.957 alone and 0.907-0.911 next to the GEMM, GEMM -1.1% to
//! +3.0%, against 0.67-0.78 on the copy engines alone next to it. (GEMM figures against the
//! loop's own GEMMs outside the window; against a control loop with no transfer, session 6 read
//! +4.2% to +6.8% at 1,024 pages where pinned memcpy of the same bytes read +1.0% to +5.4%
//! (1.4 to 5.6 points more): the GEMM runs at the power cap. A 30% share (0.867, GEMM +3.4%
//! against memcpy's +3.3%) and 2 blocks per SM with 8 loads in flight per lane (+1.2 / +0.2
//! points over memcpy) stayed within that spread; cache-streaming stores did not help;
//! BENCHMARKS.md "Session 6".)

use crate::copy_runs::ByteRun;

/// Blocks of 256 threads per SM of the kernel's part (half an H200 SM's threads): with 8, a
/// full SM's worth, the GEMM next to the load was slowed +1.4% to +7.9% (16 measurements);
/// with 4, -1.1% to +3.0% (12) at the same rate; with 2 the load fell to 0.78 of memcpy
/// (BENCHMARKS.md, "Session 5").
pub(crate) const SPLIT_KERNEL_BLOCKS_PER_SM: u32 = 4;

/// Runs of at most this many bytes always go to the kernel: the copy engines move an 8,448-byte
/// fp8 index-K page run at 0.25-0.29 of memcpy, a 41,984-byte MLA run at 0.96-0.98 (alone); a
/// bf16 index-K page run is 64 x 256 = 16,384 bytes, short too (not measured in the split).
pub(crate) const SPLIT_SHORT_RUN_BYTES: u64 = 16 * 1024;

/// Thousandths of a load's bytes the kernel takes on a carve-out of `sms` SMs: 450 on 2 SMs
/// (the measured best, module docs), in proportion to the SMs below that, at most 600 above
/// (not measured: the kernel's rate grows with its SMs, the link's does not).
pub fn kernel_share_permille(sms: u32) -> u64 {
    (225 * u64::from(sms)).min(600)
}

/// `runs` (a load's merged runs, in the order they are to be walked) split into the kernel's
/// list and the copy engines' list: every run of at most `SPLIT_SHORT_RUN_BYTES`, then
/// longer runs in list order until the kernel holds `kernel_permille` thousandths of the
/// bytes, go to the kernel; the other runs to the copy engines. Both lists keep list order;
/// together they hold every run of `runs` once. `kernel_permille` above 1000 counts as 1000.
pub fn split_load(runs: &[ByteRun], kernel_permille: u64) -> (Vec<ByteRun>, Vec<ByteRun>) {
    let total_bytes: u128 = runs.iter().map(|r| u128::from(r.len_bytes)).sum();
    let target_bytes: u128 = total_bytes * u128::from(kernel_permille.min(1000)) / 1000;
    let mut kernel_bytes: u128 = runs
        .iter()
        .filter(|r| r.len_bytes <= SPLIT_SHORT_RUN_BYTES)
        .map(|r| u128::from(r.len_bytes))
        .sum();
    let (mut kernel, mut engines) = (Vec::new(), Vec::new());
    for &r in runs {
        if r.len_bytes <= SPLIT_SHORT_RUN_BYTES {
            kernel.push(r);
        } else if kernel_bytes < target_bytes {
            kernel_bytes += u128::from(r.len_bytes);
            kernel.push(r);
        } else {
            engines.push(r);
        }
    }
    (kernel, engines)
}
